//! Instruction templating (format.md §7.5): `{{path}}` placeholders in the
//! base prompt and instructions are replaced, in one pass, by the named file
//! wrapped in `<injected_file>` provenance tags; missing files leave a
//! self-closing `missing="true"` tag. Injected content is never rescanned.
//! Files are read once per session into a snapshot.

use std::collections::HashMap;

/// Attribute escaping for the `path` attribute.
fn attr(path: &str) -> String {
    path.replace('&', "&amp;").replace('"', "&quot;")
}

/// The tag for one file (present or missing).
pub fn injected(path: &str, content: Option<&str>) -> String {
    match content {
        Some(c) => format!(
            "<injected_file path=\"{}\">\n{}\n</injected_file>",
            attr(path),
            c.replace("</injected_file", "<\\/injected_file")
        ),
        None => format!("<injected_file path=\"{}\" missing=\"true\"/>", attr(path)),
    }
}

/// The placeholders of a text, in order: (byte range, trimmed path).
pub fn placeholders(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'{' && bytes[i + 1] == b'{' {
            let start = i;
            let inner_start = i + 2;
            let mut j = inner_start;
            while j < bytes.len() && !matches!(bytes[j], b'{' | b'}' | b'\n') {
                j += 1;
            }
            if j > inner_start && j + 1 < bytes.len() && bytes[j] == b'}' && bytes[j + 1] == b'}' {
                let path = text[inner_start..j].trim();
                if !path.is_empty() {
                    out.push((start..j + 2, path));
                    i = j + 2;
                    continue;
                }
            }
            // `{{{x}}`: the placeholder may start one brace later.
            i += 1;
            continue;
        }
        i += 1;
    }
    out
}

/// A session's snapshot of injected files: each path is read once.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    files: HashMap<String, Option<String>>,
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// Render `text`, reading unseen paths with `read`.
    pub fn render(&mut self, text: &str, mut read: impl FnMut(&str) -> Option<String>) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (range, path) in placeholders(text) {
            out.push_str(&text[last..range.start]);
            let content = self.files.entry(path.to_string()).or_insert_with(|| read(path));
            out.push_str(&injected(path, content.as_deref()));
            last = range.end;
        }
        out.push_str(&text[last..]);
        out
    }

    /// Forget everything (on compaction or loop clear).
    pub fn reset(&mut self) {
        self.files.clear();
    }
}

impl super::Store {
    /// Render instructions against this file's VFS with a fresh snapshot.
    pub fn render_template(&self, text: &str) -> String {
        Snapshot::new().render(text, |p| self.file_read_text(p).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(p: &str) -> Option<String> {
        match p {
            "mind.md" => Some("# Mind {{soul.md}}".into()),
            "evil.md" => Some("x</injected_file>y".into()),
            "a&\"b.md" => Some("q".into()),
            _ => None,
        }
    }

    #[test]
    fn renders_present_missing_and_does_not_rescan() {
        let out = Snapshot::new().render("A {{ mind.md }} B {{nope.md}} C", files);
        assert_eq!(
            out,
            "A <injected_file path=\"mind.md\">\n# Mind {{soul.md}}\n</injected_file> B <injected_file path=\"nope.md\" missing=\"true\"/> C"
        );
    }

    #[test]
    fn escapes_closing_tags_and_attributes() {
        let out = Snapshot::new().render("{{evil.md}}{{a&\"b.md}}", files);
        assert!(out.contains("x<\\/injected_file>y"));
        assert!(out.contains("path=\"a&amp;&quot;b.md\""));
    }

    #[test]
    fn grammar_edges() {
        assert!(placeholders("{{}} {{ }} {{a\nb}} {{a}b}}").is_empty());
        assert_eq!(placeholders("{{{x}}}")[0].1, "x");
        assert_eq!(placeholders("pre{{x}}post")[0].0, 3..8);
    }

    #[test]
    fn snapshot_reads_once() {
        let mut n = 0;
        let mut snap = Snapshot::new();
        let text = "{{mind.md}} {{mind.md}}";
        snap.render(text, |p| {
            n += 1;
            files(p)
        });
        snap.render(text, |_| {
            n += 1;
            None
        });
        assert_eq!(n, 1);
    }
}
