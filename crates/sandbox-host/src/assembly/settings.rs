//! An agent's JSON settings file with a profile's settings added where it sets nothing
//! (`sandbox_policy::agents::CredentialDefaults`): the text of the run's private copy.
//! Settings files may hold comments (Gemini CLI strips `//` and `/* */` before parsing), so
//! they are dropped first; the copy is written back as plain JSON.

use serde_json::Value;

/// `host` (the host's file, if any) with `defaults` merged under it: every key of `defaults`
/// the file does not set, at any depth. `None` when the host's file is not a JSON object
/// (the caller then leaves it as it is).
pub fn with_defaults(host: Option<&[u8]>, defaults: &Value) -> Option<Vec<u8>> {
    let mut settings = match host {
        None => Value::Object(Default::default()),
        Some(bytes) => {
            let text = std::str::from_utf8(bytes).ok()?;
            let text = without_comments(text);
            if text.trim().is_empty() {
                Value::Object(Default::default())
            } else {
                serde_json::from_str(&text).ok()?
            }
        }
    };
    if !settings.is_object() {
        return None;
    }
    merge_under(&mut settings, defaults);
    let mut out = serde_json::to_vec_pretty(&settings).ok()?;
    out.push(b'\n');
    Some(out)
}

/// Adds to `target` each key of `defaults` it lacks; objects on both sides are merged the
/// same way, any other value of `target` is kept.
fn merge_under(target: &mut Value, defaults: &Value) {
    let (Value::Object(target), Value::Object(defaults)) = (target, defaults) else {
        return;
    };
    for (key, value) in defaults {
        match target.get_mut(key) {
            Some(existing) => merge_under(existing, value),
            None => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

/// `text` without `//` and `/* */` comments outside strings.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(bytes: Option<Vec<u8>>) -> Value {
        serde_json::from_slice(&bytes.unwrap()).unwrap()
    }

    #[test]
    fn the_defaults_fill_what_the_file_does_not_set_and_the_users_choice_wins() {
        let defaults = json!({"security": {"auth": {"selectedType": "gemini-api-key"}}});
        // No file: the defaults alone.
        assert_eq!(parsed(with_defaults(None, &defaults)), defaults);
        // A file with comments and other settings keeps them, and gets the default.
        let host = br#"{
            // MCP servers
            "mcpServers": {"demo": {"command": "a // not a comment", "args": ["/*x*/"]}},
            /* the login */ "security": {"folderTrust": {"enabled": true}}
        }"#;
        assert_eq!(
            parsed(with_defaults(Some(host), &defaults)),
            json!({
                "mcpServers": {"demo": {"command": "a // not a comment", "args": ["/*x*/"]}},
                "security": {"folderTrust": {"enabled": true},
                             "auth": {"selectedType": "gemini-api-key"}}
            })
        );
        // A method the user chose stays.
        let chosen = br#"{"security": {"auth": {"selectedType": "oauth-personal"}}}"#;
        assert_eq!(
            parsed(with_defaults(Some(chosen), &defaults)),
            json!({"security": {"auth": {"selectedType": "oauth-personal"}}})
        );
        // Not JSON, or not an object: left alone.
        assert_eq!(with_defaults(Some(b"{oops"), &defaults), None);
        assert_eq!(with_defaults(Some(b"[1]"), &defaults), None);
        assert_eq!(parsed(with_defaults(Some(b"  \n"), &defaults)), defaults);
    }
}
