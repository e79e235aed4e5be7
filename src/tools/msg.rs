//! The inbox tools that need only the file (tools.md §4): `msg_list`,
//! `msg_read`, `msg_update`, `msg_delete`. `msg_send` and `agent_discover`
//! reach other agents and run in the executor (`runtime::mesh`).

use rusqlite::types::Value as Sql;
use serde_json::{Value, json};

use super::{Ctx, ToolOutput};

pub fn list(ctx: &mut Ctx<'_>) -> ToolOutput {
    match ctx.store.inbox_counts() {
        Ok(c) => ToolOutput::ok(format!(
            "Inbox: {} unread, {} read, {} archived, {} total.",
            c["unread"], c["read"], c["archived"], c["total"]
        )),
        Err(e) => e.into(),
    }
}

pub fn read(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let status = input["status"].as_str().unwrap_or("unread");
    let limit = input["limit"].as_u64().map(|l| l as usize);
    let rows = match ctx.store.inbox_list(Some(status), limit) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    if rows.is_empty() {
        return ToolOutput::ok(format!("No {status} messages in inbox."));
    }
    if status == "unread" {
        let ids: Vec<String> = rows.iter().filter_map(|r| r["id"].as_str().map(str::to_string)).collect();
        if let Err(e) = ctx.store.inbox_set_status(&ids, "read") {
            return e.into();
        }
    }
    let include_original = input["include_original"].as_bool().unwrap_or(false);
    let out: Vec<Value> = rows
        .into_iter()
        .map(|mut r| {
            if !include_original {
                r.remove("original_message");
            }
            for k in ["meta", "attachments", "source_context"] {
                if let Some(parsed) = r.get(k).and_then(Value::as_str).and_then(|s| serde_json::from_str(s).ok()) {
                    r.insert(k.into(), parsed);
                }
            }
            if status == "unread" {
                r.insert("status".into(), "read".into());
            }
            Value::Object(r)
        })
        .collect();
    ToolOutput::json(&Value::Array(out))
}

pub fn update(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let ids: Vec<String> = match &input["message_ids"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    };
    if ids.is_empty() {
        return ToolOutput::err("message_ids must name at least one message");
    }
    let status = input["status"].as_str().unwrap_or("");
    let mut results = Vec::new();
    let mut failed = 0;
    for id in &ids {
        let row = match ctx.store.inbox_get(id) {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        let outcome = match (row, status) {
            (None, _) => Err(format!("no message {id}")),
            (Some(r), "delete") if r["status"] != "archived" => {
                Err(format!("{id} is {}; only archived messages can be deleted", r["status"].as_str().unwrap_or("?")))
            }
            (Some(_), "delete") => {
                ctx.store.inbox_delete_archived(id).map(|_| "deleted".to_string()).map_err(|e| e.to_string())
            }
            (Some(_), s) => ctx
                .store
                .inbox_set_status(std::slice::from_ref(id), s)
                .map(|_| s.to_string())
                .map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(s) => results.push(json!({"id": id, "success": true, "status": s})),
            Err(e) => {
                failed += 1;
                results.push(json!({"id": id, "success": false, "error": e}));
            }
        }
    }
    let mut out = ToolOutput::json(&json!({"results": results}));
    out.is_error = failed == ids.len();
    out
}

pub fn delete(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let source = input["source"].as_str().unwrap_or("");
    let Some(filter) = input["filter"].as_object() else { return ToolOutput::err("filter must be an object") };
    let (table, allowed): (&'static str, &[&str]) = match source {
        "inbox" => ("adf_inbox", &["status", "from", "source", "before", "thread_id"]),
        "outbox" => ("adf_outbox", &["status", "before", "thread_id"]),
        _ => return ToolOutput::err("source must be inbox or outbox"),
    };
    let mut clauses: Vec<(&str, Sql)> = Vec::new();
    for (k, v) in filter {
        if v.is_null() || v.as_str() == Some("") {
            continue;
        }
        if !allowed.contains(&k.as_str()) {
            return ToolOutput::err(format!("filter field \"{k}\" is not supported for the {source}"));
        }
        let clause = match k.as_str() {
            "status" => "status = ?",
            "from" => "\"from\" = ?",
            "source" => "source = ?",
            "thread_id" => "thread_id = ?",
            _ if source == "inbox" => "received_at < ?",
            _ => "created_at < ?",
        };
        let value = match (k.as_str(), v) {
            ("before", Value::Number(n)) => Sql::Integer(n.as_i64().unwrap_or(0)),
            ("before", _) => return ToolOutput::err("filter.before is epoch milliseconds"),
            (_, Value::String(s)) => Sql::Text(s.clone()),
            _ => return ToolOutput::err(format!("filter.{k} must be a string")),
        };
        clauses.push((clause, value));
    }
    if clauses.is_empty() {
        return ToolOutput::err("filter needs at least one non-empty field");
    }
    match ctx.store.messages_delete(table, &clauses) {
        Ok(0) => ToolOutput::ok(format!("No {source} messages matched the filter.")),
        Ok(n) => ToolOutput::ok(format!("Deleted {n} {source} messages.")),
        Err(e) => e.into(),
    }
}
