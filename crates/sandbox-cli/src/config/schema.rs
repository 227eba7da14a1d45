//! `sandbox config schema`: the configuration's JSON Schema, derived from the types in
//! [`super`]. A copy is committed as `crates/sandbox-cli/schema/config-schema.json`, which the
//! NixOS and home-manager modules read to build their typed `settings` option; the tests below
//! keep the copy equal to this output and check both sides against one table of cases.

use schemars::generate::SchemaSettings;

use super::Config;

/// The schema as pretty JSON with a trailing newline (the committed file's exact bytes).
pub fn json() -> serde_json::Result<String> {
    let schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<Config>();
    // Through `Serialize`, not the inner value: schemars orders the keywords for reading.
    let mut text = serde_json::to_string_pretty(&schema)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use serde_json::Value;

    fn schema_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("schema")
    }

    #[test]
    fn the_committed_schema_is_the_cli_schema() {
        // The Nix modules are generated from the committed copy; a change to the types that
        // is not copied there would make the modules accept or refuse the wrong settings.
        let path = schema_dir().join("config-schema.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == super::json().unwrap(),
            "{} is stale; regenerate it with\n  cargo run -p sandbox-cli -- config schema > {}",
            path.display(),
            path.display()
        );
    }

    /// The cases the Nix module check also evaluates (tests/nix-eval/modules.nix): each is a
    /// settings value and whether the CLI (and therefore the module) accepts it.
    #[test]
    fn the_cli_decides_every_shared_case_as_recorded() {
        let path = schema_dir().join("config-cases.json");
        let cases: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(cases.len() >= 20, "{} cases", cases.len());
        let mut wrong = Vec::new();
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            let expected = case["valid"].as_bool().unwrap();
            let text = serde_yaml::to_string(&case["settings"]).unwrap();
            let verdict = super::super::parse(&text, Path::new("case.yaml"));
            if verdict.is_ok() != expected {
                wrong.push(format!(
                    "{name}: expected valid={expected}, got {verdict:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn every_key_is_nullable_and_unknown_keys_are_refused() {
        let schema: Value = serde_json::from_str(&super::json().unwrap()).unwrap();
        fn walk(schema: &Value, node: &Value, at: &str, seen: &mut usize) {
            let node = match node.get("$ref").and_then(Value::as_str) {
                Some(r) => &schema["$defs"][r.trim_start_matches("#/$defs/")],
                None => node,
            };
            if let Some(props) = node.get("properties").and_then(Value::as_object) {
                assert_eq!(node["additionalProperties"], Value::Bool(false), "{at}");
                for (key, prop) in props {
                    *seen += 1;
                    let text = prop.to_string();
                    assert!(
                        text.contains("\"null\""),
                        "{at}.{key} is not nullable: {text}"
                    );
                    let inner = prop
                        .get("anyOf")
                        .and_then(|a| a.as_array()?.first().cloned())
                        .unwrap_or_else(|| prop.clone());
                    walk(schema, &inner, &format!("{at}.{key}"), seen);
                }
            }
        }
        let mut seen = 0;
        walk(&schema, &schema, "settings", &mut seen);
        assert!(seen >= 20, "{seen} keys");
    }
}
