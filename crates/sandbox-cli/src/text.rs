//! Text for a terminal: long lines split at word boundaries, with a hanging indent.

/// How wide the reports' lines are at most.
pub const WIDTH: usize = 100;

/// The words of `text`: split at spaces outside parentheses, so a call pattern
/// (`chmod(mode & S_ISUID)`) is never split.
fn words(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ' ' if depth == 0 => {
                words.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    words.push(&text[start..]);
    words.retain(|w| !w.is_empty());
    words
}

/// `text` split into lines of at most `width` characters (a word longer than that stands on
/// a line of its own; spaces inside parentheses do not split), the first starting with
/// `first`, the others with `rest`; each line ends with a newline.
pub fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in words(text) {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_split_at_words_with_a_hanging_indent() {
        let text = "seccomp: one two three four five six seven";
        assert_eq!(
            wrap(text, 20, "  - ", "      "),
            "  - seccomp: one two\n      three four\n      five six seven\n"
        );
        assert_eq!(wrap("short", 20, "> ", "  "), "> short\n");
        let long = "x".repeat(30);
        assert_eq!(wrap(&long, 20, "", ""), format!("{long}\n"));
        for line in wrap(&"word ".repeat(50), 40, "  ", "    ").lines() {
            assert!(line.chars().count() <= 40, "{line}");
        }
        assert_eq!(
            wrap(
                "chmod(mode & S_ISUID), fchmod(mode & S_ISGID): why",
                30,
                "",
                "  "
            ),
            "chmod(mode & S_ISUID),\n  fchmod(mode & S_ISGID): why\n"
        );
    }
}
