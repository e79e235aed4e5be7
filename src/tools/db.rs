//! `db_query` and `db_execute` (tools.md §3), on the store's SQL guard.

use serde_json::{Value, json};

use super::{Ctx, ToolOutput};
use crate::protocol::kind;
use crate::store::Caller;

fn params(input: &Value) -> Vec<Value> {
    input.get("params").and_then(Value::as_array).cloned().unwrap_or_default()
}

pub fn query(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let sql = input["sql"].as_str().unwrap_or_default();
    let p = params(input);
    match ctx.store.db_query(sql, &p, ctx.full && ctx.from_code) {
        Ok(out) => {
            (ctx.emit)(kind::DB_READ, json!({"sql": sql, "params": p, "row_count": out.total}));
            ToolOutput::ok(out.render())
        }
        Err(e) => e.into(),
    }
}

pub fn execute(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let sql = input["sql"].as_str().unwrap_or_default();
    let p = params(input);
    let authorized = matches!(ctx.caller, Caller::Agent { authorized: true, .. });
    match ctx.store.db_execute(sql, &p, authorized) {
        Ok(n) => {
            (ctx.emit)(kind::DB_WRITE, json!({"sql": sql, "params": p, "changes": n}));
            ToolOutput::ok(json!({"changes": n}).to_string())
        }
        Err(e) => e.into(),
    }
}
