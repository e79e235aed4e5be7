//! `adf diff A.adf B.adf` (issue 19): what differs between two agents, as
//! documents: config values by JSON path, files (a unified diff for text),
//! meta, tables (rows and columns of the agent's own; counts of the rest)
//! and the main loop (the rows both share, then what each has on its own).
//! Two files are compared read-only; nothing is written to either.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Store;
use super::error::Result;

/// One value that differs (absent on a side: `None`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub path: String,
    pub a: Option<Value>,
    pub b: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileChange {
    pub path: String,
    /// `added` (only in B), `removed` (only in A) or `changed`.
    pub status: &'static str,
    pub size_a: Option<u64>,
    pub size_b: Option<u64>,
    /// A unified diff, for text on both sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableChange {
    pub name: String,
    pub rows_a: Option<i64>,
    pub rows_b: Option<i64>,
    /// Its columns differ (or it is only on one side).
    pub schema_changed: bool,
}

/// A loop row in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Brief {
    pub seq: i64,
    pub role: String,
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoopDiff {
    /// Rows alike on both sides from the start (same role and content).
    pub shared: usize,
    pub only_a: Vec<Brief>,
    pub only_b: Vec<Brief>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Diff {
    pub config: Vec<Change>,
    pub files: Vec<FileChange>,
    pub meta: Vec<Change>,
    pub tables: Vec<TableChange>,
    #[serde(rename = "loop")]
    pub loop_: LoopDiff,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.config.is_empty()
            && self.files.is_empty()
            && self.meta.is_empty()
            && self.tables.is_empty()
            && self.loop_.only_a.is_empty()
            && self.loop_.only_b.is_empty()
    }
}

/// Config every change touches: noise in a comparison.
const VOLATILE_CONFIG: &[&str] = &["metadata.updated_at"];

/// Meta every write touches: noise in a comparison.
const VOLATILE_META: &[&str] = &["adf_updated_at", "adf_clean_close"];

/// Leaves of `v` by JSON path (`model.model_id`, `tools[3].enabled`).
fn leaves(v: &Value, at: String, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                leaves(x, if at.is_empty() { k.clone() } else { format!("{at}.{k}") }, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{at}[{i}]"), out);
            }
        }
        _ => {
            out.insert(at, v.clone());
        }
    }
}

fn changes(a: BTreeMap<String, Value>, mut b: BTreeMap<String, Value>) -> Vec<Change> {
    let mut out = Vec::new();
    for (k, va) in a {
        match b.remove(&k) {
            Some(vb) if vb == va => {}
            vb => out.push(Change { path: k, a: Some(va), b: vb }),
        }
    }
    out.extend(b.into_iter().map(|(k, vb)| Change { path: k, a: None, b: Some(vb) }));
    out.sort_by(|x, y| x.path.cmp(&y.path));
    out
}

fn text_of(content: &Value) -> String {
    let blocks = content.as_array().cloned().unwrap_or_default();
    let s: Vec<String> = blocks
        .iter()
        .map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().unwrap_or("").to_string(),
            Some("tool_use") => format!("→ {}", b["name"].as_str().unwrap_or("")),
            Some("tool_result") => "← result".to_string(),
            Some(t) => format!("[{t}]"),
            None => String::new(),
        })
        .collect();
    let s = s.join(" ").replace('\n', " ");
    if s.chars().count() > 100 { format!("{}…", s.chars().take(99).collect::<String>()) } else { s }
}

fn columns(s: &Store, table: &str) -> Vec<(String, String)> {
    let q = format!("SELECT name, type FROM pragma_table_info('{}')", table.replace('\'', "''"));
    s.conn()
        .prepare(&q)
        .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .unwrap_or_default()
}

/// Compare two agent files.
pub fn diff(a: &Store, b: &Store) -> Result<Diff> {
    let mut d = Diff::default();
    let (mut ca, mut cb) = (BTreeMap::new(), BTreeMap::new());
    leaves(&a.config_value()?, String::new(), &mut ca);
    leaves(&b.config_value()?, String::new(), &mut cb);
    for k in VOLATILE_CONFIG {
        ca.remove(*k);
        cb.remove(*k);
    }
    d.config = changes(ca, cb);

    let fa: BTreeMap<String, _> = a.file_list("")?.into_iter().map(|f| (f.path.clone(), f)).collect();
    let fb: BTreeMap<String, _> = b.file_list("")?.into_iter().map(|f| (f.path.clone(), f)).collect();
    for (path, x) in &fa {
        match fb.get(path) {
            None => d.files.push(FileChange {
                path: path.clone(),
                status: "removed",
                size_a: Some(x.size),
                size_b: None,
                diff: None,
            }),
            Some(y) => {
                let (_, ba) = a.file_read(path)?;
                let (_, bb) = b.file_read(path)?;
                if ba == bb {
                    continue;
                }
                let text = match (std::str::from_utf8(&ba), std::str::from_utf8(&bb)) {
                    (Ok(ta), Ok(tb)) if x.is_text() || y.is_text() => Some(
                        similar::TextDiff::from_lines(ta, tb)
                            .unified_diff()
                            .context_radius(3)
                            .header(&format!("a/{path}"), &format!("b/{path}"))
                            .to_string(),
                    ),
                    _ => None,
                };
                d.files.push(FileChange {
                    path: path.clone(),
                    status: "changed",
                    size_a: Some(x.size),
                    size_b: Some(y.size),
                    diff: text,
                });
            }
        }
    }
    for (path, y) in &fb {
        if !fa.contains_key(path) {
            d.files.push(FileChange {
                path: path.clone(),
                status: "added",
                size_a: None,
                size_b: Some(y.size),
                diff: None,
            });
        }
    }

    let meta = |s: &Store| -> Result<BTreeMap<String, Value>> {
        Ok(s.meta_list()?
            .into_iter()
            .filter(|m| !VOLATILE_META.contains(&m.key.as_str()))
            .map(|m| (m.key, Value::String(m.value)))
            .collect())
    };
    d.meta = changes(meta(a)?, meta(b)?);

    let ta: BTreeMap<String, i64> = a.tables()?.into_iter().map(|t| (t.name, t.rows)).collect();
    let tb: BTreeMap<String, i64> = b.tables()?.into_iter().map(|t| (t.name, t.rows)).collect();
    let names: std::collections::BTreeSet<&String> = ta.keys().chain(tb.keys()).collect();
    for name in names {
        // The loop is compared row by row below; logs and the like differ
        // on every run, so only the agent's own tables and presence count.
        if name == "adf_loop" || name == "adfrs_loop_rows" || name == "adfrs_spend" {
            continue;
        }
        let (ra, rb) = (ta.get(name).copied(), tb.get(name).copied());
        let own = name.starts_with("local_");
        let schema_changed = ra.is_none() || rb.is_none() || (own && columns(a, name) != columns(b, name));
        if schema_changed || (own && ra != rb) {
            d.tables.push(TableChange { name: name.clone(), rows_a: ra, rows_b: rb, schema_changed });
        }
    }

    let (la, lb) = (a.loop_rows(None)?, b.loop_rows(None)?);
    let shared = la.iter().zip(lb.iter()).take_while(|(x, y)| x.role == y.role && x.content == y.content).count();
    let brief = |r: &super::loop_rows::LoopRow| Brief { seq: r.seq, role: r.role.clone(), text: text_of(&r.content) };
    d.loop_ = LoopDiff {
        shared,
        only_a: la[shared..].iter().map(brief).collect(),
        only_b: lb[shared..].iter().map(brief).collect(),
    };
    Ok(d)
}

/// The diff as `git diff` shows one: sections, `-` for A, `+` for B.
pub fn render(d: &Diff, a: &str, b: &str) -> String {
    let mut out = String::new();
    let val = |v: &Option<Value>| v.as_ref().map(|v| v.to_string()).unwrap_or_default();
    if !d.config.is_empty() {
        out.push_str(&format!("--- a/config ({a})\n+++ b/config ({b})\n"));
        for c in &d.config {
            if c.a.is_some() {
                out.push_str(&format!("-{}: {}\n", c.path, val(&c.a)));
            }
            if c.b.is_some() {
                out.push_str(&format!("+{}: {}\n", c.path, val(&c.b)));
            }
        }
    }
    for f in &d.files {
        match (f.status, &f.diff) {
            ("removed", _) => {
                out.push_str(&format!("--- a/{}\n+++ /dev/null ({} bytes)\n", f.path, f.size_a.unwrap_or(0)))
            }
            ("added", _) => {
                out.push_str(&format!("--- /dev/null\n+++ b/{} ({} bytes)\n", f.path, f.size_b.unwrap_or(0)))
            }
            (_, Some(text)) => out.push_str(text),
            _ => out.push_str(&format!(
                "Binary files a/{} and b/{} differ ({} → {} bytes)\n",
                f.path,
                f.path,
                f.size_a.unwrap_or(0),
                f.size_b.unwrap_or(0)
            )),
        }
    }
    if !d.meta.is_empty() {
        out.push_str("--- a/meta\n+++ b/meta\n");
        for c in &d.meta {
            if c.a.is_some() {
                out.push_str(&format!("-{} = {}\n", c.path, val(&c.a)));
            }
            if c.b.is_some() {
                out.push_str(&format!("+{} = {}\n", c.path, val(&c.b)));
            }
        }
    }
    if !d.tables.is_empty() {
        out.push_str("--- a/tables\n+++ b/tables\n");
        let n = |r: Option<i64>| r.map(|r| format!("{r} rows")).unwrap_or_else(|| "absent".into());
        for t in &d.tables {
            let cols =
                if t.schema_changed && t.rows_a.is_some() && t.rows_b.is_some() { ", columns differ" } else { "" };
            out.push_str(&format!(" {}: {} → {}{cols}\n", t.name, n(t.rows_a), n(t.rows_b)));
        }
    }
    let l = &d.loop_;
    if !l.only_a.is_empty() || !l.only_b.is_empty() {
        out.push_str(&format!("--- a/loop\n+++ b/loop\n@@ {} rows alike, then @@\n", l.shared));
        for r in &l.only_a {
            out.push_str(&format!("-S{} {}: {}\n", r.seq, r.role, r.text));
        }
        for r in &l.only_b {
            out.push_str(&format!("+S{} {}: {}\n", r.seq, r.role, r.text));
        }
    }
    out
}
