//! [`Code`]: an indenting text buffer, and the doc-comment sanitizer.
//!
//! Generated files are `include!`d, so rustfmt never sees them: the generator indents by itself
//! (4 spaces a level, as rustfmt would) and keeps lines short where it can.

use std::fmt::Write as _;

/// Text being generated, with the current indentation.
#[derive(Debug, Default)]
pub(crate) struct Code {
    out: String,
    level: usize,
}

impl Code {
    pub(crate) fn new() -> Self {
        Code::default()
    }

    /// Writes one line at the current indentation (an empty line has no trailing spaces).
    pub(crate) fn line(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if !text.is_empty() {
            for _ in 0..self.level {
                self.out.push_str("    ");
            }
            self.out.push_str(text);
        }
        self.out.push('\n');
    }

    /// Writes `text` (a line ending in `{`) and indents.
    pub(crate) fn open(&mut self, text: impl AsRef<str>) {
        self.line(text);
        self.level += 1;
    }

    /// Dedents and writes `text` (a line starting with `}`).
    pub(crate) fn close(&mut self, text: impl AsRef<str>) {
        self.level -= 1;
        self.line(text);
    }

    /// Writes `///` doc lines for generated `text`, wrapping lines to keep within 100 columns.
    pub(crate) fn doc(&mut self, text: &str) {
        let width = 100usize.saturating_sub(self.level * 4 + 4).max(40);
        for l in text.lines() {
            let mut line = String::new();
            for word in l.split(' ') {
                if !line.is_empty() && line.len() + 1 + word.len() > width {
                    self.line(format!("/// {line}"));
                    line.clear();
                }
                if !line.is_empty() {
                    line.push(' ');
                }
                line.push_str(word);
            }
            if line.is_empty() {
                self.line("///");
            } else {
                self.line(format!("/// {line}"));
            }
        }
    }

    /// Writes `///` doc lines for `text` (a sanitized proto comment) as they are.
    pub(crate) fn doc_verbatim(&mut self, text: &str) {
        for l in text.lines() {
            if l.is_empty() {
                self.line("///");
            } else {
                self.line(format!("/// {l}"));
            }
        }
    }

    /// A blank line, unless the previous line opened a block or was blank.
    pub(crate) fn blank(&mut self) {
        if !(self.out.is_empty() || self.out.ends_with("{\n") || self.out.ends_with("\n\n")) {
            self.out.push('\n');
        }
    }

    pub(crate) fn into_string(self) -> String {
        self.out
    }
}

/// Turns a proto comment into Markdown that rustdoc renders as the author meant and that never
/// becomes a doctest or a rustdoc warning:
///
/// * the common indentation (protoc keeps the space after `//`) is removed;
/// * a comment with lines indented by 4 or more spaces or a tab (which Markdown would turn into
///   a Rust code block, i.e. a failing doctest) is wrapped whole in a `text` fence;
/// * code fences without a language become `text` fences, for the same reason;
/// * outside code, `[`, `]`, `<` and `>` are escaped (no broken intra-doc links, no stray HTML
///   tags) and bare `http(s)://` URLs are wrapped in `<...>`.
pub(crate) fn sanitize_comment(comment: &str) -> String {
    let lines: Vec<&str> = comment.trim_end().lines().map(str::trim_end).collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches(' ').len())
        .min()
        .unwrap_or(0);
    let lines: Vec<&str> = lines
        .iter()
        .map(|l| if l.len() >= indent { &l[indent..] } else { "" })
        .collect();
    // Leading and trailing blank lines carry nothing.
    let first = lines
        .iter()
        .position(|l| !l.is_empty())
        .unwrap_or(lines.len());
    let last = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(first, |i| i + 1);
    let lines = &lines[first..last];

    let code_like = lines
        .iter()
        .any(|l| l.starts_with("    ") || l.starts_with('\t'));
    let mut out = String::new();
    if code_like {
        out.push_str("```text\n");
        for l in lines {
            out.push_str(&l.replace("```", "'''"));
            out.push('\n');
        }
        out.push_str("```\n");
        return out;
    }
    let mut in_fence = false;
    for l in lines {
        let trimmed = l.trim_start();
        if trimmed.starts_with("```") {
            if !in_fence && trimmed.trim_start_matches('`').trim().is_empty() {
                out.push_str("```text");
            } else {
                out.push_str(l);
            }
            in_fence = !in_fence;
        } else if in_fence {
            out.push_str(l);
        } else {
            out.push_str(&escape_markdown_line(l));
        }
        out.push('\n');
    }
    if in_fence {
        out.push_str("```\n");
    }
    out
}

/// Escapes one line of prose (see [`sanitize_comment`]); text inside `` `code` `` spans is left
/// alone.
fn escape_markdown_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            // An autolink `<https://...>` is already fine Markdown: keep it whole.
            if c == '<' && bare_url_len(&rest[1..], "").is_some() {
                if let Some(end) = rest.find('>') {
                    out.push_str(&rest[..=end]);
                    rest = &rest[end + 1..];
                    continue;
                }
            }
            if let Some(url_len) = bare_url_len(rest, &out) {
                let _ = write!(out, "<{}>", &rest[..url_len]);
                rest = &rest[url_len..];
                continue;
            }
            if matches!(c, '[' | ']' | '<' | '>') {
                out.push('\\');
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The length of the URL at the start of `rest` if one starts there (after a non-word
/// character), up to the next space or closing bracket, without trailing punctuation.
fn bare_url_len(rest: &str, before: &str) -> Option<usize> {
    if !(rest.starts_with("http://") || rest.starts_with("https://")) {
        return None;
    }
    if before.ends_with(|c: char| c.is_alphanumeric() || c == '<' || c == '(') {
        return None;
    }
    let end = rest
        .find(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | ')' | ']' | '"' | '`'))
        .unwrap_or(rest.len());
    let url = rest[..end].trim_end_matches(['.', ',', ';', ':', '!', '?', '\'']);
    Some(url.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indents_and_blank_lines() {
        let mut c = Code::new();
        c.open("mod a {");
        c.blank();
        c.line("fn f() {}");
        c.blank();
        c.blank();
        c.line("");
        c.close("}");
        assert_eq!(c.into_string(), "mod a {\n    fn f() {}\n\n\n}\n");
    }

    #[test]
    fn generated_docs_wrap() {
        let mut c = Code::new();
        c.doc(&format!("{} end\n\nnext", "word ".repeat(30).trim_end()));
        let out = c.into_string();
        assert!(out.lines().all(|l| l.len() <= 100), "{out}");
        assert!(out.ends_with(" end\n///\n/// next\n"), "{out}");
        let words: Vec<&str> = out.split_whitespace().filter(|w| *w != "///").collect();
        assert_eq!(words.len(), 32);
    }

    #[test]
    fn comments_lose_common_indent_and_escape_brackets() {
        assert_eq!(
            sanitize_comment(" The [thing] is <b>.\n See x[i].\n"),
            "The \\[thing\\] is \\<b\\>.\nSee x\\[i\\].\n"
        );
        assert_eq!(
            sanitize_comment(" in `a[0] <b>` code"),
            "in `a[0] <b>` code\n"
        );
        assert_eq!(sanitize_comment("\n\n one\n\n"), "one\n");
    }

    #[test]
    fn indented_blocks_are_fenced_as_text() {
        let got = sanitize_comment(" Example:\n     let x = [1];\n");
        assert_eq!(got, "```text\nExample:\n    let x = [1];\n```\n");
    }

    #[test]
    fn untyped_fences_become_text() {
        let got = sanitize_comment(" a\n ```\n x[0]\n ```\n ```cpp\n y\n ```");
        assert_eq!(got, "a\n```text\nx[0]\n```\n```cpp\ny\n```\n");
        // An unclosed fence is closed.
        assert_eq!(sanitize_comment("```\nx"), "```text\nx\n```\n");
    }

    #[test]
    fn bare_urls_are_wrapped() {
        assert_eq!(
            sanitize_comment("See https://perfetto.dev/docs. Or <https://x.y>."),
            "See <https://perfetto.dev/docs>. Or <https://x.y>.\n"
        );
    }
}
