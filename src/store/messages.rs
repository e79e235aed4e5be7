//! The inbox and outbox tables (format.md §3.4–3.5): rows in, rows out,
//! statuses, counts and filtered deletes. Rows travel as JSON objects keyed
//! by column; objects and arrays are stored as JSON text.

use rusqlite::types::Value as Sql;
use rusqlite::{OptionalExtension, params_from_iter};
use serde_json::{Map, Value, json};

use super::Store;
use super::error::{Ctx, Result, StoreError};

/// Which way a message went, for its audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbox,
    Outbox,
}

pub const INBOX_COLUMNS: [&str; 24] = [
    "id",
    "message_id",
    "from",
    "to",
    "reply_to",
    "network",
    "thread_id",
    "parent_id",
    "subject",
    "content",
    "content_type",
    "attachments",
    "meta",
    "sender_alias",
    "recipient_alias",
    "owner",
    "card",
    "return_path",
    "source",
    "source_context",
    "sent_at",
    "received_at",
    "status",
    "original_message",
];

pub const OUTBOX_COLUMNS: [&str; 24] = [
    "id",
    "message_id",
    "from",
    "to",
    "address",
    "reply_to",
    "network",
    "thread_id",
    "parent_id",
    "subject",
    "content",
    "content_type",
    "attachments",
    "meta",
    "sender_alias",
    "recipient_alias",
    "owner",
    "card",
    "return_path",
    "status_code",
    "created_at",
    "delivered_at",
    "status",
    "original_message",
];

fn to_sql(v: Option<&Value>) -> Sql {
    match v {
        None | Some(Value::Null) => Sql::Null,
        Some(Value::String(s)) => Sql::Text(s.clone()),
        Some(Value::Bool(b)) => Sql::Integer(*b as i64),
        Some(Value::Number(n)) => n.as_i64().map(Sql::Integer).unwrap_or_else(|| Sql::Real(n.as_f64().unwrap_or(0.0))),
        Some(other) => Sql::Text(other.to_string()),
    }
}

fn from_sql(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef as R;
    match v {
        R::Null => Value::Null,
        R::Integer(i) => json!(i),
        R::Real(f) => json!(f),
        R::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        R::Blob(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
    }
}

fn quoted(cols: &[&str]) -> String {
    cols.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ")
}

/// Which statuses a table allows.
fn check_status(table: &str, status: &str) -> Result<()> {
    let ok = match table {
        "adf_inbox" => ["unread", "read", "archived"].contains(&status),
        _ => ["pending", "sent", "delivered", "failed"].contains(&status),
    };
    if ok { Ok(()) } else { Err(StoreError::Invalid(format!("{table}: unknown status \"{status}\""))) }
}

impl Store {
    fn insert_row(&mut self, table: &'static str, cols: &[&str], row: &Map<String, Value>) -> Result<String> {
        let mut row = row.clone();
        let id = match row.get("id").and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None => {
                let id = super::create::nanoid(10);
                row.insert("id".into(), id.clone().into());
                id
            }
        };
        let present: Vec<&str> = cols.iter().copied().filter(|c| row.get(*c).is_some_and(|v| !v.is_null())).collect();
        let marks = (1..=present.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let sql = format!("INSERT INTO {table}({}) VALUES ({marks})", quoted(&present));
        let values: Vec<Sql> = present.iter().map(|c| to_sql(row.get(*c))).collect();
        let path = self.path().to_path_buf();
        self.write(|tx| tx.execute(&sql, params_from_iter(values)).map(|_| ()).at(&path))?;
        Ok(id)
    }

    fn rows(&self, sql: &str, params: &[Sql]) -> Result<Vec<Map<String, Value>>> {
        let mut st = self.conn().prepare(sql).at(self.path())?;
        let names: Vec<String> = st.column_names().map(|s| s.to_string()).collect();
        let mut out = Vec::new();
        let mut rows = st.query(params_from_iter(params.iter())).at(self.path())?;
        while let Some(r) = rows.next().at(self.path())? {
            let mut m = Map::new();
            for (i, n) in names.iter().enumerate() {
                m.insert(n.clone(), from_sql(r.get_ref(i).at(self.path())?));
            }
            out.push(m);
        }
        Ok(out)
    }

    /// Insert an inbox row (`id` minted when absent); returns its id.
    pub fn inbox_insert(&mut self, row: &Map<String, Value>) -> Result<String> {
        self.insert_row("adf_inbox", &INBOX_COLUMNS, row)
    }

    /// Insert an outbox row; returns its id.
    pub fn outbox_insert(&mut self, row: &Map<String, Value>) -> Result<String> {
        self.insert_row("adf_outbox", &OUTBOX_COLUMNS, row)
    }

    /// Whether the agent archives messages going this way (`audit.inbox` /
    /// `audit.outbox`, format.md §3.8): callers check before building the
    /// archived form, which can carry whole attachments.
    pub fn audit_on(&self, direction: Direction) -> bool {
        let what = match direction {
            Direction::Inbox => "inbox",
            Direction::Outbox => "outbox",
        };
        self.config_value().is_ok_and(|c| super::config::audit_enabled(&c, what))
    }

    /// Archive one whole message: `inbox_message` at arrival, before its
    /// attachments are imported; `outbox_message` at send.
    pub fn audit_message(&mut self, direction: Direction, message: &Value) -> Result<()> {
        let source = match direction {
            Direction::Inbox => "inbox_message",
            Direction::Outbox => "outbox_message",
        };
        let id = message["id"].as_str().unwrap_or_default();
        let json = serde_json::to_vec(message).unwrap_or_default();
        let file = self.path().to_path_buf();
        self.write(|tx| super::audit::append_json(tx, source, super::audit::Address::Ref(id), 1, &json).at(&file))?;
        Ok(())
    }

    /// An outbox row reached its outcome (`delivered` or `failed`).
    pub fn outbox_finish(&mut self, id: &str, status: &str, code: Option<u16>) -> Result<()> {
        check_status("adf_outbox", status)?;
        let path = self.path().to_path_buf();
        let now = super::now_ms();
        let delivered = (status == "delivered").then_some(now);
        self.write(|tx| {
            tx.execute(
                "UPDATE adf_outbox SET status = ?2, status_code = ?3, delivered_at = ?4 WHERE id = ?1",
                rusqlite::params![id, status, code, delivered],
            )
            .map(|_| ())
            .at(&path)
        })
    }

    /// A message with this ALF id from this sender is already in the inbox.
    pub fn inbox_has(&self, message_id: &str, from: &str) -> Result<bool> {
        let n: Option<i64> = self
            .conn()
            .query_row(
                "SELECT 1 FROM adf_inbox WHERE message_id = ?1 AND \"from\" = ?2 LIMIT 1",
                [message_id, from],
                |r| r.get(0),
            )
            .optional()
            .at(self.path())?;
        Ok(n.is_some())
    }

    /// When the newest message of a network was sent (ms), for a channel's
    /// catch-up.
    pub fn inbox_latest_sent(&self, network: &str) -> Result<Option<i64>> {
        let n: Option<i64> = self
            .conn()
            .query_row("SELECT max(sent_at) FROM adf_inbox WHERE network = ?1", [network], |r| r.get(0))
            .at(self.path())?;
        Ok(n)
    }

    /// The chats (`from` addresses) a network's messages came from, for a
    /// channel's catch-up.
    pub fn inbox_chats(&self, network: &str) -> Result<Vec<String>> {
        let mut st = self
            .conn()
            .prepare("SELECT DISTINCT \"from\" FROM adf_inbox WHERE network = ?1 AND \"from\" IS NOT NULL")
            .at(self.path())?;
        let rows = st.query_map([network], |r| r.get::<_, String>(0)).at(self.path())?;
        rows.collect::<std::result::Result<Vec<_>, _>>().at(self.path())
    }

    pub fn inbox_get(&self, id: &str) -> Result<Option<Map<String, Value>>> {
        Ok(self.rows("SELECT * FROM adf_inbox WHERE id = ?1", &[Sql::Text(id.into())])?.pop())
    }

    /// Inbox rows of a status, newest first.
    pub fn inbox_list(&self, status: Option<&str>, limit: Option<usize>) -> Result<Vec<Map<String, Value>>> {
        let lim = limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
        match status {
            Some(s) => {
                check_status("adf_inbox", s)?;
                self.rows(
                    &format!("SELECT * FROM adf_inbox WHERE status = ?1 ORDER BY received_at DESC, rowid DESC{lim}"),
                    &[Sql::Text(s.into())],
                )
            }
            None => self.rows(&format!("SELECT * FROM adf_inbox ORDER BY received_at DESC, rowid DESC{lim}"), &[]),
        }
    }

    /// Outbox rows, newest first.
    pub fn outbox_list(&self, limit: Option<usize>) -> Result<Vec<Map<String, Value>>> {
        let lim = limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
        self.rows(&format!("SELECT * FROM adf_outbox ORDER BY created_at DESC, rowid DESC{lim}"), &[])
    }

    /// Set inbox rows' status; returns how many changed.
    pub fn inbox_set_status(&mut self, ids: &[String], status: &str) -> Result<usize> {
        check_status("adf_inbox", status)?;
        let path = self.path().to_path_buf();
        self.write(|tx| {
            let mut n = 0;
            for id in ids {
                n += tx.execute("UPDATE adf_inbox SET status = ?2 WHERE id = ?1", [id.as_str(), status]).at(&path)?;
            }
            Ok(n)
        })
    }

    /// Delete one archived inbox row; `Ok(false)` if it is not archived.
    pub fn inbox_delete_archived(&mut self, id: &str) -> Result<bool> {
        let path = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("DELETE FROM adf_inbox WHERE id = ?1 AND status = 'archived'", [id]).map(|n| n > 0).at(&path)
        })
    }

    /// Delete by filter (`msg_delete`): `clauses` are validated column
    /// conditions built by the caller.
    pub(crate) fn messages_delete(&mut self, table: &'static str, clauses: &[(&str, Sql)]) -> Result<usize> {
        let cond = clauses.iter().enumerate().map(|(i, (c, _))| c.replace('?', &format!("?{}", i + 1)));
        let sql = format!("DELETE FROM {table} WHERE {}", cond.collect::<Vec<_>>().join(" AND "));
        let values: Vec<Sql> = clauses.iter().map(|(_, v)| v.clone()).collect();
        let path = self.path().to_path_buf();
        self.write(|tx| tx.execute(&sql, params_from_iter(values)).at(&path))
    }

    /// `{unread, read, archived, total, unread_by_sender}`.
    pub fn inbox_counts(&self) -> Result<Value> {
        let mut st =
            self.conn().prepare_cached("SELECT status, count(*) FROM adf_inbox GROUP BY status").at(self.path())?;
        let mut counts = json!({"unread": 0, "read": 0, "archived": 0, "total": 0});
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).at(self.path())?;
        let mut total = 0;
        for r in rows {
            let (s, n) = r.at(self.path())?;
            total += n;
            counts[s] = json!(n);
        }
        counts["total"] = json!(total);
        let mut by = Map::new();
        let mut st = self
            .conn()
            .prepare_cached(
                "SELECT coalesce(sender_alias, \"from\"), count(*) FROM adf_inbox WHERE status = 'unread' GROUP BY 1",
            )
            .at(self.path())?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).at(self.path())?;
        for r in rows {
            let (s, n) = r.at(self.path())?;
            by.insert(s, json!(n));
        }
        counts["unread_by_sender"] = Value::Object(by);
        Ok(counts)
    }
}
