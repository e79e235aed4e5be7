//! Structured data in the shell: `jq` (the jaq interpreter, jq's own
//! language and standard library) and `sqlite3` on the agent's own
//! database through the SQL guard — a statement SQLite itself reports as
//! read-only runs as `db_query`, anything else needs `db_execute` and is
//! gated as that tool before it runs.

use std::fmt::Write as _;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data, unwrap_valr};
use jaq_json::Val;
use serde_json::{Value, json};

use super::text::getopt;
use super::{Out, Sh, fail, ok};
use crate::protocol::kind;
use crate::runtime::executor::Executor;

/// `jq [-r] [-c] [-s] [-n] [-e] [--arg K V] [--argjson K JSON] FILTER [FILE…]`,
/// run where it is called (yq, tests).
pub(super) fn jq(args: &[String], stdin: &str, read: impl FnMut(&str) -> Result<String, String>) -> Out {
    match JqJob::new(args, stdin, read) {
        Ok(job) => job.run().0,
        Err(out) => out,
    }
}

/// A `jq` call with its input read and nothing borrowed.
pub(super) struct JqJob {
    filter: String,
    input: String,
    /// (name, value, whether the value is JSON: `--argjson`).
    vars: Vec<(String, String, bool)>,
    raw: bool,
    compact: bool,
    slurp: bool,
    null_input: bool,
    join: bool,
    exit_status: bool,
}

impl JqJob {
    /// The call's options and input (files read through `read`), or the
    /// error that stops it before it runs.
    pub(super) fn new(
        args: &[String],
        stdin: &str,
        mut read: impl FnMut(&str) -> Result<String, String>,
    ) -> Result<Self, Out> {
        // --arg/--argjson take two values: pull them out first.
        let mut vars = Vec::new();
        let mut rest: Vec<String> = Vec::new();
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "--arg" | "--argjson" => {
                    let (Some(k), Some(v)) = (args.get(i + 1), args.get(i + 2)) else {
                        return Err(fail(2, format!("jq: {} needs a name and a value", args[i])));
                    };
                    vars.push((k.clone(), v.clone(), args[i] == "--argjson"));
                    i += 3;
                }
                _ => {
                    rest.push(args[i].clone());
                    i += 1;
                }
            }
        }
        let o = getopt("jq", &rest, "").map_err(|e| fail(2, e))?;
        let mut pos = o.pos.clone();
        if pos.is_empty() {
            return Err(fail(2, "usage: jq [-r] [-c] [-s] [-n] [--arg K V] FILTER [FILE…]"));
        }
        let filter = pos.remove(0);
        let mut input = String::new();
        if pos.is_empty() {
            input.push_str(stdin);
        } else {
            for p in &pos {
                input.push_str(&read(p).map_err(|e| fail(2, format!("jq: {e}")))?);
            }
        }
        Ok(JqJob {
            filter,
            input,
            vars,
            raw: o.has("r") || o.has("raw-output") || o.has("j"),
            compact: o.has("c") || o.has("compact-output"),
            slurp: o.has("s") || o.has("slurp"),
            null_input: o.has("n") || o.has("null-input"),
            join: o.has("j"),
            exit_status: o.has("e"),
        })
    }

    /// Run on a blocking thread (a megabyte of JSON is tens of milliseconds
    /// of work the runtime's other tasks should not wait behind); the
    /// answer comes back before the values are freed, since freeing a
    /// parsed megabyte costs as much as parsing it and nothing waits for it.
    pub(super) async fn run_off_runtime(self) -> Out {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return self.run().0 };
        let (tx, rx) = tokio::sync::oneshot::channel();
        rt.spawn_blocking(move || {
            let (out, values) = self.run();
            let _ = tx.send(out);
            drop(values);
        });
        rx.await.unwrap_or_else(|_| fail(5, "jq: error: the filter stopped before it answered"))
    }

    /// The output, and the values made on the way (for the caller to free
    /// when it likes).
    fn run(self) -> (Out, Vec<Val>) {
        let mut vars = Vec::with_capacity(self.vars.len());
        for (k, v, is_json) in self.vars {
            let val = if is_json {
                match jaq_json::read::parse_single(v.as_bytes()) {
                    Ok(x) => x,
                    Err(e) => return (fail(2, format!("jq: --argjson {k}: not JSON: {e}")), Vec::new()),
                }
            } else {
                Val::utf8_str(v.into_bytes())
            };
            vars.push((k, val));
        }
        let mut kept = Vec::new();
        let vals = match run_jq(&self.filter, &self.input, &vars, self.slurp, self.null_input, &mut kept) {
            Ok(vals) => vals,
            Err(e) => return (fail(if e.starts_with("jq: error") { 5 } else { 3 }, e), kept),
        };
        let pretty = jaq_json::write::Pp { indent: Some("  ".to_string()), sep_space: true, ..Default::default() };
        let mut s = String::new();
        let mut last_truthy = true;
        for v in &vals {
            last_truthy = !matches!(v, Val::Null | Val::Bool(false));
            match v {
                Val::TStr(b) if self.raw => s.push_str(&String::from_utf8_lossy(b)),
                _ if self.compact => {
                    let _ = write!(s, "{v}");
                }
                _ => {
                    let mut buf = Vec::new();
                    match jaq_json::write::write(&mut buf, &pretty, 0, v) {
                        Ok(()) => s.push_str(&String::from_utf8_lossy(&buf)),
                        Err(_) => {
                            let _ = write!(s, "{v}");
                        }
                    }
                }
            }
            if !self.join {
                s.push('\n');
            }
        }
        let code = if self.exit_status && (vals.is_empty() || !last_truthy) { 1 } else { 0 };
        kept.extend(vals);
        (Out { code, stdout: s, stderr: String::new() }, kept)
    }
}

type JqFilter = jaq_core::Filter<data::JustLut<Val>>;

/// Compiled filters by source and variable names: loading jq's standard
/// library is most of a short filter's cost, and agents repeat filters.
static FILTERS: std::sync::Mutex<Vec<CachedFilter>> = std::sync::Mutex::new(Vec::new());
/// (source, variable names, compiled filter).
type CachedFilter = (String, Vec<String>, std::sync::Arc<JqFilter>);
const FILTERS_KEPT: usize = 32;

fn compile_jq(src: &str, names: &[String]) -> Result<std::sync::Arc<JqFilter>, String> {
    if let Ok(c) = FILTERS.lock()
        && let Some((_, _, f)) = c.iter().find(|(s, n, _)| s == src && n == names)
    {
        return Ok(f.clone());
    }
    let defs = jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs());
    let funs = jaq_core::funs().chain(jaq_std::funs()).chain(jaq_json::funs());
    let loader = Loader::new(defs);
    let arena = Arena::default();
    let modules = loader
        .load(&arena, File { code: src, path: () })
        .map_err(|errs| format!("jq: cannot parse the filter {src:?}: {}", short(&format!("{errs:?}"))))?;
    let filter = Compiler::default()
        .with_funs(funs)
        .with_global_vars(names.iter().map(String::as_str))
        .compile(modules)
        .map_err(|errs| format!("jq: cannot compile the filter {src:?}: {}", short(&format!("{errs:?}"))))?;
    let filter = std::sync::Arc::new(filter);
    if let Ok(mut c) = FILTERS.lock() {
        if c.len() == FILTERS_KEPT {
            c.remove(0);
        }
        c.push((src.to_string(), names.to_vec(), filter.clone()));
    }
    Ok(filter)
}

/// Run a filter over the inputs; `kept` holds a reference to each input,
/// so the last one is dropped where the caller chooses.
fn run_jq(
    src: &str,
    input: &str,
    vars: &[(String, Val)],
    slurp: bool,
    null_input: bool,
    kept: &mut Vec<Val>,
) -> Result<Vec<Val>, String> {
    let names: Vec<String> = vars.iter().map(|(k, _)| format!("${k}")).collect();
    let filter = compile_jq(src, &names)?;
    let mut inputs: Vec<Val> = Vec::new();
    if !null_input {
        for v in jaq_json::read::parse_many(input.as_bytes()) {
            match v {
                Ok(v) => inputs.push(v),
                Err(e) => {
                    kept.append(&mut inputs);
                    return Err(format!("jq: input is not JSON: {e}"));
                }
            }
        }
        if slurp {
            inputs = vec![inputs.into_iter().collect::<Val>()];
        }
    } else {
        inputs.push(Val::Null);
    }
    let mut out = Vec::new();
    for v in inputs {
        kept.push(v.clone());
        let ctx = Ctx::<data::JustLut<Val>>::new(&filter.lut, Vars::new(vars.iter().map(|(_, v)| v.clone())));
        for r in filter.id.run((ctx, v)).map(unwrap_valr) {
            match r {
                Ok(x) => out.push(x),
                Err(e) => {
                    kept.append(&mut out);
                    return Err(format!("jq: error: {e}"));
                }
            }
            if out.len() > 1_000_000 {
                kept.append(&mut out);
                return Err("jq: error: more than a million results".into());
            }
        }
    }
    Ok(out)
}

fn short(s: &str) -> String {
    if s.chars().count() > 300 { format!("{}…", s.chars().take(300).collect::<String>()) } else { s.to_string() }
}

impl Executor {
    /// `sqlite3 [-json|-csv|-header|-list] [DB] ['SQL']` (SQL from stdin
    /// when absent); `.tables` and `.schema [TABLE]` as the CLI has them.
    pub(super) async fn sqlite3(&mut self, sh: &mut Sh, args: &[String], stdin: String) -> Out {
        let flags: Vec<&String> = args.iter().filter(|a| a.starts_with('-')).collect();
        let mut pos: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        if pos.len() > 1
            || pos.first().is_some_and(|p| {
                p.ends_with(".db") || p.ends_with(".sqlite") || p.ends_with(".adf") || p.as_str() == ":memory:"
            })
        {
            // The database is always the agent's own.
            pos.remove(0);
        }
        let sql = pos.first().map(|s| s.to_string()).unwrap_or(stdin).trim().to_string();
        if sql.is_empty() {
            return fail(1, "sqlite3: no SQL given (as an argument or on stdin)");
        }
        let mode = if flags.iter().any(|f| f.as_str() == "-json") {
            "json"
        } else if flags.iter().any(|f| f.as_str() == "-csv") {
            "csv"
        } else {
            "list"
        };
        let header = flags.iter().any(|f| f.as_str() == "-header")
            || mode == "csv" && !flags.iter().any(|f| f.as_str() == "-noheader");
        let sql = match sql.as_str() {
            ".tables" => "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'local\\_%' ESCAPE '\\' ORDER BY name".to_string(),
            s if s.starts_with(".schema") => {
                let t = s.trim_start_matches(".schema").trim().replace('\'', "''");
                if t.is_empty() {
                    "SELECT sql FROM sqlite_master WHERE name LIKE 'local\\_%' ESCAPE '\\' AND sql IS NOT NULL ORDER BY name".to_string()
                } else {
                    format!("SELECT sql FROM sqlite_master WHERE name = '{t}' AND sql IS NOT NULL")
                }
            }
            s if s.starts_with('.') => return fail(1, format!("sqlite3: {s}: only .tables and .schema are supported")),
            s => s.trim_end_matches(';').to_string(),
        };
        // SQLite says whether the statement writes.
        let readonly = match self.store.conn().prepare(&sql) {
            Ok(stmt) => stmt.readonly(),
            Err(e) => return fail(1, format!("sqlite3: {e}")),
        };
        if !readonly {
            if let Err(e) = self.shell_gate(sh, &["db_execute"]).await {
                return e;
            }
            return match self.shell_tool_call(sh, "db_execute", json!({"sql": sql})).await {
                Ok(_) => ok(""),
                Err(e) => fail(1, format!("sqlite3: {e}")),
            };
        }
        let q = match self.store.db_query(&sql, &[], sh.full) {
            Ok(q) => q,
            Err(e) => return fail(1, format!("sqlite3: {e}")),
        };
        self.emit(kind::DB_READ, "agent:shell", json!({"sql": sql, "params": [], "row_count": q.total}));
        let cell = |v: &Value| match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut s = String::new();
        match mode {
            "json" => {
                s = serde_json::to_string(&q.rows).unwrap_or_default();
                s.push('\n');
            }
            _ => {
                let sep = if mode == "csv" { "," } else { "|" };
                let quote = |t: String| {
                    if mode == "csv" && t.contains([',', '"', '\n']) {
                        format!("\"{}\"", t.replace('"', "\"\""))
                    } else {
                        t
                    }
                };
                if header && let Some(first) = q.rows.first() {
                    let _ = writeln!(s, "{}", first.keys().cloned().map(quote).collect::<Vec<_>>().join(sep));
                }
                for r in &q.rows {
                    let _ = writeln!(s, "{}", r.values().map(|v| quote(cell(v))).collect::<Vec<_>>().join(sep));
                }
            }
        }
        if q.truncated {
            sh.truncated = true;
            let _ = writeln!(s, "[truncated: {} of {} rows shown; add LIMIT/OFFSET]", q.rows.len(), q.total);
        }
        ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jqs(args: &[&str], input: &str) -> Out {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        jq(&args, input, |p| Err(format!("{p}: No such file")))
    }

    #[test]
    fn jq_filters_raw_compact_slurp_args() {
        assert_eq!(jqs(&["-c", ".a"], r#"{"a":[1,2]}"#).stdout, "[1,2]\n");
        assert_eq!(jqs(&[".a"], r#"{"a":[1,2]}"#).stdout, "[\n  1,\n  2\n]\n");
        // Printed as jq prints: two spaces, a space after the colon.
        assert_eq!(
            jqs(&["."], r#"{"a":{"b":"x"},"c":[]}"#).stdout,
            "{\n  \"a\": {\n    \"b\": \"x\"\n  },\n  \"c\": []\n}\n"
        );
        // A second run of the same filter is served compiled.
        assert_eq!(jqs(&[".a"], r#"{"a":3}"#).stdout, "3\n");
        assert_eq!(jqs(&["-r", ".[] | .name"], r#"[{"name":"x"},{"name":"y"}]"#).stdout, "x\ny\n");
        assert_eq!(jqs(&["-c", "map(select(. > 1))"], "[1,2,3]").stdout, "[2,3]\n");
        assert_eq!(jqs(&["-s", "-c", "add"], "1 2 3").stdout, "6\n");
        assert_eq!(jqs(&["-n", "-r", "--arg", "who", "you", r#""hi \($who)""#], "").stdout, "hi you\n");
        assert_eq!(jqs(&["-c", "keys"], r#"{"b":1,"a":2}"#).stdout, "[\"a\",\"b\"]\n");
        let bad = jqs(&[".a |||"], "{}");
        assert_eq!(bad.code, 3);
        assert!(bad.stderr.contains("cannot parse"));
        assert_eq!(jqs(&["."], "{nope").code, 3);
        assert_eq!(jqs(&["error(\"boom\")"], "1").code, 5);
    }
}
