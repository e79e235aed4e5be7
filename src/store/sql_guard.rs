//! The SQL guard of `db_query` and `db_execute` (runtime.md §8.6): what an
//! agent (or the owner's `adf sql`) may read and write with raw SQL. Checks
//! run on a sanitised copy; the caller's original text is what executes.

use rusqlite::types::{ToSqlOutput, Value as Sql};
use serde_json::{Map, Value};

use super::Store;
use super::error::{Result, StoreError};
use super::sql_enforce::{Enforced, Policy};

/// Row cap of `db_query` results shown to the model.
pub const MAX_ROWS: usize = 500;

/// Rows past this many bytes of values are counted, not kept.
pub const MAX_RESULT_BYTES: usize = 32 << 20;

fn value_size(v: &Sql) -> usize {
    match v {
        Sql::Text(t) => t.len(),
        Sql::Blob(b) => b.len() * 4 / 3,
        _ => 8,
    }
}

pub(crate) const READ_TABLES: &[&str] = &[
    "adf_loop",
    "adf_inbox",
    "adf_outbox",
    "adf_timers",
    "adf_files",
    "adf_audit",
    "adf_logs",
    "adf_tasks",
    "local_",
    "sqlite_master",
];
const WRITE_WORDS: &[&str] =
    &["insert", "update", "delete", "replace", "drop", "create", "alter", "attach", "detach", "vacuum", "reindex"];

fn refuse(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(msg.into())
}

/// Reject any `;` but a trailing one, even inside literals or comments.
fn single_statement(sql: &str) -> Result<&str> {
    let t = sql.trim();
    let body = t.strip_suffix(';').unwrap_or(t);
    if body.contains(';') {
        return Err(refuse("Multi-statement SQL is not allowed."));
    }
    if body.trim().is_empty() {
        return Err(refuse("SQL is empty."));
    }
    Ok(body)
}

/// Lower-case, strip comments, blank out `'…'` literals; `"…"` identifiers
/// are kept.
pub fn sanitize(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut it = sql.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '-' if it.peek() == Some(&'-') => {
                for c in it.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if it.peek() == Some(&'*') => {
                it.next();
                let mut prev = ' ';
                for c in it.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
                out.push(' ');
            }
            '\'' => {
                // Skip to the closing quote; '' is an escaped quote.
                loop {
                    match it.next() {
                        Some('\'') if it.peek() == Some(&'\'') => {
                            it.next();
                        }
                        Some('\'') | None => break,
                        Some(_) => {}
                    }
                }
                out.push_str("''");
            }
            c => out.extend(c.to_lowercase()),
        }
    }
    out
}

fn words(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty())
}

fn has_word(s: &str, w: &str) -> bool {
    words(s).any(|x| x == w)
}

/// Check a read query.
pub fn check_query(sql: &str) -> Result<()> {
    let body = single_statement(sql)?;
    let first = body.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    if !["select", "with", "explain"].contains(&first.as_str()) {
        return Err(refuse("Only read queries (SELECT/WITH/EXPLAIN) are allowed. Use db_execute for writes."));
    }
    let s = sanitize(body);
    if first == "with" && WRITE_WORDS.iter().any(|w| has_word(&s, w)) {
        return Err(refuse("WITH statements that modify data are not allowed in db_query. Use db_execute."));
    }
    if s.contains("adf_meta") || s.contains("adf_config") || s.contains("adf_identity") {
        return Err(refuse("Access to adf_meta, adf_config, and adf_identity is not allowed in db_query."));
    }
    if s.contains("pragma_") {
        return Err(refuse("PRAGMA table-valued functions are not allowed in db_query."));
    }
    if has_word(&s, "from") && !READ_TABLES.iter().any(|t| s.contains(t)) {
        return Err(refuse(format!(
            "Query must reference an allowed table ({}*).",
            READ_TABLES.join(", ").replace("local_, ", "local_*, ").trim_end_matches('*')
        )));
    }
    Ok(())
}

/// What a write statement does and to which table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTarget {
    pub verb: &'static str,
    pub table: String,
}

fn unquote(ident: &str) -> String {
    let t = ident.trim_end_matches(['(', ',']);
    let t = t.split('(').next().unwrap_or(t);
    t.trim_matches(|c| c == '"' || c == '`' || c == '[' || c == ']').to_string()
}

/// Check a write statement against the verbs, the `adf_` ban, the `local_`
/// prefix and the table protections.
pub fn check_execute(sql: &str, protections: &Map<String, Value>, authorized: bool) -> Result<WriteTarget> {
    let body = single_statement(sql)?;
    let s = sanitize(body);
    let toks: Vec<&str> = s.split_whitespace().collect();
    let first = toks.first().copied().unwrap_or("");
    let verb: &'static str = match first {
        "select" | "with" | "explain" => return Err(refuse("Use db_query for SELECT statements.")),
        "insert" => "insert",
        "update" => "update",
        "delete" => "delete",
        "create" => "create",
        "drop" => "drop",
        _ => return Err(refuse("Only INSERT, UPDATE, DELETE, CREATE TABLE, and DROP TABLE statements are allowed.")),
    };
    if s.contains("adf_") {
        return Err(refuse(
            "Cannot modify adf_* system tables. They are managed by the runtime; use the dedicated tools.",
        ));
    }
    let skip = |from: usize, words: &[&str]| {
        let mut i = from;
        while toks.get(i).is_some_and(|t| words.contains(t)) {
            i += 1;
        }
        i
    };
    let table_at = match verb {
        "insert" => {
            let into = toks.iter().position(|t| *t == "into").unwrap_or(toks.len());
            into + 1
        }
        "update" => skip(1, &["or", "rollback", "abort", "replace", "fail", "ignore"]),
        "delete" => skip(1, &["from"]),
        "create" => {
            let i = skip(1, &["temp", "temporary", "virtual"]);
            if toks.get(i) != Some(&"table") {
                return Err(refuse(
                    "Only INSERT, UPDATE, DELETE, CREATE TABLE, and DROP TABLE statements are allowed.",
                ));
            }
            skip(i + 1, &["if", "not", "exists"])
        }
        _ => {
            if toks.get(1) != Some(&"table") {
                return Err(refuse(
                    "Only INSERT, UPDATE, DELETE, CREATE TABLE, and DROP TABLE statements are allowed.",
                ));
            }
            skip(2, &["if", "exists"])
        }
    };
    let table = toks.get(table_at).map(|t| unquote(t)).unwrap_or_default();
    let table = table.strip_prefix("main.").unwrap_or(&table).to_string();
    if !table.starts_with("local_") {
        return Err(refuse(match verb {
            "create" => "CREATE TABLE must use the local_ prefix (e.g. local_notes).",
            "drop" => "DROP TABLE is only allowed on local_* tables.",
            _ => "Write operations are only allowed on local_* tables.",
        }));
    }
    match protections.get(&table).and_then(Value::as_str) {
        Some("append_only") if matches!(verb, "update" | "delete" | "drop") => {
            return Err(refuse(format!("Cannot {verb} \"{table}\": table is append-only.")));
        }
        Some("authorized") if verb != "create" && !authorized => {
            return Err(refuse(format!("Cannot write to \"{table}\": requires authorized code.")));
        }
        _ => {}
    }
    Ok(WriteTarget { verb, table })
}

/// The rows of a query, capped unless `full`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueryOutput {
    pub rows: Vec<Map<String, Value>>,
    pub total: usize,
    pub truncated: bool,
}

impl QueryOutput {
    /// The tool's text: pretty JSON, plus the truncation footer.
    pub fn render(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.rows).unwrap_or_else(|_| "[]".into());
        if self.truncated {
            s.push_str(&format!("\n--- TRUNCATED at {MAX_ROWS} rows (query returned {} rows) ---", self.total));
        }
        s
    }
}

fn bind(v: &Value) -> Sql {
    match v {
        Value::Null => Sql::Null,
        Value::Bool(b) => Sql::Integer(*b as i64),
        Value::Number(n) => n.as_i64().map(Sql::Integer).unwrap_or_else(|| Sql::Real(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => Sql::Text(s.clone()),
        other => Sql::Text(other.to_string()),
    }
}

struct Param(Sql);
impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    StoreError::Invalid(format!("SQL error: {e}"))
}

impl Store {
    /// Run a guarded read query.
    pub fn db_query(&self, sql: &str, params: &[Value], full: bool) -> Result<QueryOutput> {
        check_query(sql)?;
        let guard = Enforced::install(self.conn(), Policy::query())?;
        let mut stmt = self.conn().prepare(sql).map_err(|e| guard.error(e))?;
        if !stmt.readonly() {
            return Err(refuse("Only read queries (SELECT/WITH/EXPLAIN) are allowed. Use db_execute for writes."));
        }
        let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
        let ps: Vec<Param> = params.iter().map(|v| Param(bind(v))).collect();
        let mut rows = stmt.query(rusqlite::params_from_iter(ps.iter())).map_err(|e| guard.error(e))?;
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut bytes = 0usize;
        while let Some(r) = rows.next().map_err(|e| guard.error(e))? {
            total += 1;
            if (!full && out.len() >= MAX_ROWS) || bytes > MAX_RESULT_BYTES {
                continue;
            }
            let mut m = Map::with_capacity(names.len());
            for (i, n) in names.iter().enumerate() {
                let v: Sql = r.get(i).map_err(sql_error)?;
                bytes += value_size(&v);
                m.insert(n.clone(), to_json(v));
            }
            out.push(m);
        }
        Ok(QueryOutput { truncated: total > out.len(), rows: out, total })
    }

    /// A read of the owner's (the daemon's table and inbox views): no guard
    /// on table names, but read-only statements only. Returns the column
    /// names and the rows as objects.
    pub fn owner_query(&self, sql: &str) -> Result<(Vec<String>, Vec<Value>)> {
        let mut stmt = self.conn().prepare(sql).map_err(sql_error)?;
        if !stmt.readonly() {
            return Err(refuse("Only read queries are allowed here."));
        }
        let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
        let mut rows = stmt.query([]).map_err(sql_error)?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(sql_error)? {
            let mut m = Map::with_capacity(names.len());
            for (i, n) in names.iter().enumerate() {
                let v: Sql = r.get(i).map_err(sql_error)?;
                m.insert(n.clone(), to_json(v));
            }
            out.push(Value::Object(m));
        }
        Ok((names, out))
    }

    /// Run a guarded write; returns the number of changed rows.
    pub fn db_execute(&mut self, sql: &str, params: &[Value], authorized: bool) -> Result<usize> {
        self.writable()?;
        let protections = self
            .config_value()
            .ok()
            .and_then(|c| c.pointer("/security/table_protections").and_then(Value::as_object).cloned())
            .unwrap_or_default();
        check_execute(sql, &protections, authorized)?;
        let ps: Vec<Param> = params.iter().map(|v| Param(bind(v))).collect();
        self.write(|tx| {
            let guard = Enforced::install(tx, Policy::execute(protections, authorized))?;
            let mut stmt = tx.prepare(sql).map_err(|e| guard.error(e))?;
            stmt.execute(rusqlite::params_from_iter(ps.iter())).map_err(|e| guard.error(e))
        })
    }
}

fn to_json(v: Sql) -> Value {
    use base64::Engine;
    match v {
        Sql::Null => Value::Null,
        Sql::Integer(i) => Value::from(i),
        Sql::Real(f) => serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null),
        Sql::Text(s) => Value::String(s),
        Sql::Blob(b) => Value::String(format!("base64:{}", base64::engine::general_purpose::STANDARD.encode(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_guard() {
        assert!(check_query("SELECT * FROM adf_loop").is_ok());
        assert!(check_query("select 1;").is_ok());
        assert!(check_query("select 1 + 1").is_ok());
        assert!(check_query("SELECT * FROM local_notes WHERE x = 'a;b'").is_err());
        assert!(check_query("SELECT 1; SELECT 2").is_err());
        assert!(check_query("SELECT * FROM adf_meta").is_err());
        assert!(check_query("SELECT * FROM adf_loop WHERE 'adf_meta' = 'x'").is_ok());
        assert!(check_query("SELECT * FROM adf_config").is_err());
        assert!(check_query("SELECT * FROM \"adf_identity\"").is_err());
        assert!(check_query("SELECT * FROM pragma_table_info('adf_loop')").is_err());
        assert!(check_query("SELECT * FROM other").is_err());
        assert!(check_query("DELETE FROM local_x").is_err());
        assert!(check_query("WITH x AS (SELECT 1) DELETE FROM local_x").is_err());
        assert!(check_query("WITH x AS (SELECT created_at FROM adf_loop) SELECT * FROM x").is_ok());
        assert!(check_query("select * from adf_files -- adf_meta\n").is_ok());
    }

    #[test]
    fn execute_guard() {
        let none = Map::new();
        let ok = |s: &str| check_execute(s, &none, false).unwrap();
        assert_eq!(ok("CREATE TABLE local_notes (id INTEGER, t TEXT)").table, "local_notes");
        assert_eq!(ok("create virtual table if not exists local_v using vec0(embedding float[3])").table, "local_v");
        assert_eq!(ok("INSERT INTO \"local_notes\"(t) VALUES ('x')").table, "local_notes");
        assert_eq!(ok("insert or replace into [local_notes] values (1, 'x')").table, "local_notes");
        assert_eq!(ok("UPDATE local_notes SET t = 'y'").verb, "update");
        assert_eq!(ok("DELETE FROM `local_notes`").verb, "delete");
        assert_eq!(ok("DROP TABLE IF EXISTS local_notes").verb, "drop");
        for bad in [
            "SELECT 1",
            "INSERT INTO adf_logs(message, created_at) VALUES ('x', 1)",
            "UPDATE local_x SET a = (SELECT value FROM adf_meta)",
            "CREATE TABLE notes (x)",
            "DROP TABLE notes",
            "DELETE FROM notes",
            "CREATE INDEX i ON local_x(a)",
            "ALTER TABLE local_x ADD COLUMN y",
            "INSERT INTO local_x VALUES (1); DROP TABLE local_x",
        ] {
            assert!(check_execute(bad, &none, false).is_err(), "{bad}");
        }
        let mut prot = Map::new();
        prot.insert("local_log".into(), Value::String("append_only".into()));
        prot.insert("local_secret".into(), Value::String("authorized".into()));
        assert!(check_execute("INSERT INTO local_log VALUES (1)", &prot, false).is_ok());
        let e = check_execute("DELETE FROM local_log", &prot, false).unwrap_err();
        assert_eq!(e.to_string(), "Cannot delete \"local_log\": table is append-only.");
        assert!(check_execute("INSERT INTO local_secret VALUES (1)", &prot, false).is_err());
        assert!(check_execute("INSERT INTO local_secret VALUES (1)", &prot, true).is_ok());
        assert!(check_execute("CREATE TABLE local_secret (a)", &prot, false).is_ok());
    }

    #[test]
    fn sanitize_strips_literals_and_comments() {
        assert_eq!(sanitize("SELECT 'It''s' /* c */ FROM X -- t\n"), "select ''   from x \n");
    }
}
