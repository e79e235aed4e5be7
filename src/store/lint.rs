//! The built-in memory linter (issue 18): the checks over an agent's memory
//! pages (`mind.md` and `mind/*.md`) that need no model. Citations that
//! resolve to nothing, links to pages that do not exist, pages no link from
//! the index reaches, pages left unchanged while the agent kept working,
//! and facts stated twice with different values. Markdown is read with
//! pulldown-cmark, so a citation or a `key: value` line inside code or an
//! HTML comment is not taken for one. The `lint` template loop runs this on
//! its schedule and judges what only a model can; `adf lint` and the
//! `memory_lint` tool run it on demand.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::LazyLock;

use pulldown_cmark::{Event, LinkType, Options, Parser, Tag};
use regex::Regex;
use serde::Serialize;

use super::Store;
use super::error::{Result, StoreError};

/// The memory index, read on every turn.
pub const INDEX: &str = "mind.md";
/// The append-only change log: checked for citations only.
pub const LOG: &str = "mind/log.md";
/// Where the lint loop writes its report: quotes the other pages, so it is
/// not linted itself.
pub const REPORT: &str = "mind/lint.md";
/// A page unchanged this many days while the agent kept working is stale.
pub const DEFAULT_STALE_DAYS: u32 = 30;

/// What a lint run checks against.
#[derive(Debug, Clone, Copy)]
pub struct LintOptions {
    pub stale_days: u32,
}

impl Default for LintOptions {
    fn default() -> Self {
        Self { stale_days: DEFAULT_STALE_DAYS }
    }
}

/// One thing the linter found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// `dangling_citation`, `broken_link`, `orphan_page`, `stale_page` or
    /// `contradiction`.
    pub kind: &'static str,
    pub page: String,
    /// 1-based; absent for a finding about a whole page.
    pub line: Option<usize>,
    pub detail: String,
}

/// A lint run's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LintReport {
    pub pages: usize,
    pub citations: usize,
    pub links: usize,
    pub facts: usize,
    /// Findings per kind.
    pub counts: BTreeMap<&'static str, usize>,
    pub findings: Vec<Finding>,
}

impl LintReport {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// One line: how many of what, or that memory is clean.
    pub fn summary(&self) -> String {
        if self.is_clean() {
            return format!("memory lint: {} pages, {} citations, clean", self.pages, self.citations);
        }
        let kinds: Vec<String> = self.counts.iter().map(|(k, n)| format!("{n} {}", k.replace('_', " "))).collect();
        format!("memory lint: {} pages, {} citations: {}", self.pages, self.citations, kinds.join(", "))
    }

    /// The report as Markdown (what the lint loop is handed and may keep).
    pub fn markdown(&self) -> String {
        let mut s = format!("# Memory lint\n\n{}\n", self.summary());
        for f in &self.findings {
            let at = f.line.map(|l| format!("{}:{l}", f.page)).unwrap_or_else(|| f.page.clone());
            s.push_str(&format!("\n- **{}** {at}: {}", f.kind.replace('_', " "), f.detail));
        }
        s.push('\n');
        s
    }
}

/// A page as read for linting.
struct Page {
    path: String,
    text: String,
    updated_ms: Option<i64>,
    /// Byte ranges of code and HTML, where nothing is a citation or fact.
    skip: Vec<Range<usize>>,
    /// (target path, line) of each internal link.
    links: Vec<(String, usize)>,
    /// (subject, key, value as written, line) of each `key: value` line.
    facts: Vec<(String, String, String, usize)>,
}

static CITATION: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal pattern
    Regex::new(r"\[(S\d+(?:\s*[,;]\s*S\d+)*)\]").unwrap()
});
static SEQ: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)]
    Regex::new(r"S(\d+)").unwrap()
});
/// `- key: value`, `**key**: value`, `key: value` on one line.
static FACT: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)]
    Regex::new(r"^\s*(?:[-*+]\s+)?(?:\*\*|__)?([^:\[\]()`*_\n]{2,40}?)(?:\*\*|__)?\s*:\s+(\S.*)$").unwrap()
});

fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1
}

fn normal(s: &str) -> String {
    let s = CITATION.replace_all(s, "");
    let words: Vec<String> = s
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    words.join(" ")
}

/// Where a link in `page` points, as a file path, when it is the agent's
/// own file (`adf-file://x`, or a path relative to the page's folder).
fn link_target(page: &str, dest: &str) -> Option<String> {
    let dest = dest.split(['#', '?']).next().unwrap_or("");
    if dest.is_empty() {
        return None;
    }
    if let Some(abs) = dest.strip_prefix("adf-file://") {
        return Some(abs.trim_start_matches('/').to_string());
    }
    if dest.contains("://") || dest.starts_with("mailto:") || dest.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = match page.rsplit_once('/') {
        Some((dir, _)) => dir.split('/').collect(),
        None => Vec::new(),
    };
    for seg in dest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// Where `[[topic]]` points: a memory page by name (`mind/topic.md`), or
/// a path from the root when it names a folder (`[[notes/plan]]`).
fn wiki_target(dest: &str) -> String {
    let dest = dest.split(['#', '|']).next().unwrap_or("").trim().trim_start_matches('/');
    let file = if dest.ends_with(".md") { dest.to_string() } else { format!("{dest}.md") };
    if file.contains('/') { file } else { format!("mind/{file}") }
}

fn read_page(path: String, text: String, updated_ms: Option<i64>) -> Page {
    let mut skip = Vec::new();
    let mut links = Vec::new();
    let mut facts = Vec::new();
    for (ev, range) in Parser::new_ext(&text, Options::ENABLE_TABLES | Options::ENABLE_WIKILINKS).into_offset_iter() {
        match ev {
            Event::Code(_) | Event::Html(_) | Event::InlineHtml(_) => skip.push(range),
            Event::Start(Tag::CodeBlock(_)) => skip.push(range),
            Event::Start(Tag::Link { link_type: LinkType::WikiLink { .. }, dest_url, .. }) => {
                links.push((wiki_target(&dest_url), line_of(&text, range.start)));
            }
            Event::Start(Tag::Link { dest_url, .. }) => {
                if let Some(t) = link_target(&path, &dest_url) {
                    links.push((t, line_of(&text, range.start)));
                }
            }
            _ => {}
        }
    }
    // Facts are read line by line outside code, under the nearest heading
    // (the page's own name before any).
    let stem = path.rsplit('/').next().unwrap_or(&path).trim_end_matches(".md").replace(['-', '_'], " ");
    let mut subject = normal(&stem);
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        if skip.iter().any(|r| r.contains(&start)) {
            continue;
        }
        let l = line.trim_end();
        if let Some(h) = l.trim_start().strip_prefix('#') {
            let h = normal(h.trim_start_matches('#'));
            if !h.is_empty() {
                subject = h;
            }
            continue;
        }
        if let Some(c) = FACT.captures(l) {
            let key = normal(&c[1]);
            let value = c[2].trim().to_string();
            if key.chars().any(char::is_alphabetic) && !normal(&value).is_empty() && !c[2].starts_with("//") {
                facts.push((subject.clone(), key, value, line_of(&text, start)));
            }
        }
    }
    Page { path, text, updated_ms, skip, links, facts }
}

/// (page, value as written, line) of one statement of a fact.
type Said<'a> = (&'a str, &'a str, usize);

fn iso_ms(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp_millis())
}

impl Store {
    /// Lint the agent's memory pages (see the module note). Reads only.
    pub fn memory_lint(&self, opts: LintOptions) -> Result<LintReport> {
        let mut pages = Vec::new();
        let mut entries = self.file_list("mind/")?;
        if let Some(index) = self.file_stat(INDEX)? {
            entries.insert(0, index);
        }
        for e in entries {
            if !e.path.ends_with(".md") || e.path == REPORT || !(e.path == INDEX || e.path.starts_with("mind/")) {
                continue;
            }
            let text = match self.file_read_text(&e.path) {
                Ok(t) => t,
                Err(StoreError::Missing(_)) => continue,
                Err(e) => return Err(e),
            };
            pages.push(read_page(e.path.clone(), text, iso_ms(&e.updated_at)));
        }
        let mut report = LintReport { pages: pages.len(), ..Default::default() };
        let mut findings = Vec::new();

        // Citations: each seq resolved once.
        let mut resolved: HashMap<i64, bool> = HashMap::new();
        for p in &pages {
            for m in CITATION.captures_iter(&p.text) {
                let Some(whole) = m.get(0) else { continue };
                if p.skip.iter().any(|r| r.contains(&whole.start())) {
                    continue;
                }
                for s in SEQ.captures_iter(&m[1]) {
                    report.citations += 1;
                    let Ok(seq) = s[1].parse::<i64>() else { continue };
                    let found = match resolved.get(&seq) {
                        Some(f) => *f,
                        None => {
                            let f = match self.cite(seq) {
                                Ok(_) => true,
                                Err(StoreError::Missing(_)) => false,
                                Err(e) => return Err(e),
                            };
                            resolved.insert(seq, f);
                            f
                        }
                    };
                    if !found {
                        findings.push(Finding {
                            kind: "dangling_citation",
                            page: p.path.clone(),
                            line: Some(line_of(&p.text, whole.start())),
                            detail: format!("[S{seq}] resolves to no loop row and no audit entry"),
                        });
                    }
                }
            }
        }

        // Links, and which pages the index reaches.
        let known: HashSet<&str> = pages.iter().map(|p| p.path.as_str()).collect();
        let by_path: HashMap<&str, &Page> = pages.iter().map(|p| (p.path.as_str(), p)).collect();
        for p in &pages {
            for (target, line) in &p.links {
                report.links += 1;
                if !known.contains(target.as_str()) && target != REPORT && self.file_stat(target)?.is_none() {
                    findings.push(Finding {
                        kind: "broken_link",
                        page: p.path.clone(),
                        line: Some(*line),
                        detail: format!("links to {target}, which does not exist"),
                    });
                }
            }
        }
        let mut reached: HashSet<&str> = HashSet::new();
        let mut queue: VecDeque<&str> = VecDeque::new();
        if known.contains(INDEX) {
            reached.insert(INDEX);
            queue.push_back(INDEX);
        }
        while let Some(at) = queue.pop_front() {
            for (t, _) in by_path.get(at).map(|p| p.links.as_slice()).unwrap_or(&[]) {
                if let Some(k) = known.get(t.as_str())
                    && reached.insert(k)
                {
                    queue.push_back(k);
                }
            }
        }
        for p in &pages {
            if p.path != INDEX && p.path != LOG && !reached.contains(p.path.as_str()) {
                findings.push(Finding {
                    kind: "orphan_page",
                    page: p.path.clone(),
                    line: None,
                    detail: if known.contains(INDEX) {
                        "no link from mind.md reaches it: add it to the index".into()
                    } else {
                        "there is no mind.md index to link it from".into()
                    },
                });
            }
        }

        // Stale: unchanged for `stale_days` before the agent's latest work.
        if let Some(active) = self.latest_activity_ms()? {
            let window = i64::from(opts.stale_days) * 86_400_000;
            for p in pages.iter().filter(|p| p.path != LOG) {
                if let Some(at) = p.updated_ms
                    && active - at > window
                {
                    findings.push(Finding {
                        kind: "stale_page",
                        page: p.path.clone(),
                        line: None,
                        detail: format!(
                            "unchanged for {} days while the agent kept working (stale after {})",
                            (active - at + 43_200_000) / 86_400_000,
                            opts.stale_days
                        ),
                    });
                }
            }
        }

        // Contradictions: one subject's key given different values.
        let mut seen: BTreeMap<(String, String), Vec<Said<'_>>> = BTreeMap::new();
        for p in pages.iter().filter(|p| p.path != LOG) {
            for (subject, key, value, line) in &p.facts {
                report.facts += 1;
                seen.entry((subject.clone(), key.clone())).or_default().push((&p.path, value, *line));
            }
        }
        for ((subject, key), says) in &seen {
            let Some(first) = says.first() else { continue };
            let values: HashSet<String> = says.iter().map(|(_, v, _)| normal(v)).collect();
            if values.len() < 2 {
                continue;
            }
            let all: Vec<String> = says.iter().map(|(p, v, l)| format!("{p}:{l} says {:?}", v)).collect();
            findings.push(Finding {
                kind: "contradiction",
                page: first.0.to_string(),
                line: Some(first.2),
                detail: format!("{subject} / {key}: {}", all.join("; ")),
            });
        }

        for f in &findings {
            *report.counts.entry(f.kind).or_insert(0) += 1;
        }
        report.findings = findings;
        Ok(report)
    }

    /// When any loop last took a row (ms), if ever.
    fn latest_activity_ms(&self) -> Result<Option<i64>> {
        use super::error::Ctx;
        let main: Option<i64> =
            self.conn().query_row("SELECT MAX(created_at) FROM adf_loop", [], |r| r.get(0)).at(self.path())?;
        let side: Option<i64> =
            match self.conn().query_row("SELECT MAX(created_at) FROM adfrs_loop_rows", [], |r| r.get(0)) {
                Ok(v) => v,
                Err(e) if super::error::no_such_table(&e) => None,
                Err(e) => return Err(e).at(self.path()),
            };
        Ok(main.max(side))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_from_the_page_folder_and_adf_file_urls() {
        assert_eq!(link_target("mind.md", "mind/a.md").as_deref(), Some("mind/a.md"));
        assert_eq!(link_target("mind/b.md", "a.md#x").as_deref(), Some("mind/a.md"));
        assert_eq!(link_target("mind/b.md", "../notes.md").as_deref(), Some("notes.md"));
        assert_eq!(link_target("mind.md", "adf-file://mind/c.md").as_deref(), Some("mind/c.md"));
        assert_eq!(link_target("mind.md", "../../x.md"), None, "above the root is no file");
        assert_eq!(link_target("mind.md", "https://example.com/a.md"), None);
        assert_eq!(link_target("mind.md", "#top"), None);
        assert_eq!(wiki_target("people"), "mind/people.md");
        assert_eq!(wiki_target("people.md#alice"), "mind/people.md");
        assert_eq!(wiki_target("notes/plan"), "notes/plan.md");
        let p = read_page("mind.md".into(), "- [[people]] and [[gone|the old page]]\n".into(), None);
        let targets: Vec<&str> = p.links.iter().map(|l| l.0.as_str()).collect();
        assert_eq!(targets, ["mind/people.md", "mind/gone.md"]);
    }

    #[test]
    fn facts_and_citations_outside_code_only() {
        let text = "# Alice\n\n- **Email**: a@example.com [S3]\n- Lives in: Paris\n\n```\nkey: value [S9]\n```\n\
                    <!-- note: ignore [S8] -->\n`code: [S7]`\n- 10:00 a time, not a fact\n";
        let p = read_page("mind/people.md".into(), text.into(), None);
        let facts: Vec<(&str, &str)> = p.facts.iter().map(|f| (f.1.as_str(), f.2.as_str())).collect();
        assert_eq!(facts, [("email", "a@example.com [S3]"), ("lives in", "Paris")]);
        assert!(p.facts.iter().all(|f| f.0 == "alice"));
        let cited: Vec<usize> = CITATION
            .find_iter(&p.text)
            .filter(|m| !p.skip.iter().any(|r| r.contains(&m.start())))
            .map(|m| line_of(&p.text, m.start()))
            .collect();
        assert_eq!(cited, [3], "the code block, the comment and the code span hold no citation");
    }
}
