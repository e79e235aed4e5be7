//! `fs_read`, `fs_write`, `fs_list`, `fs_delete` (tools.md §2).

use base64::Engine;
use serde_json::{Value, json};

use super::{Ctx, ToolOutput};
use crate::protocol::kind;
use crate::store::files::{DEFAULT_MAX_WRITE, Edit, FileEntry, Protection, WriteOptions};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn s<'a>(input: &'a Value, k: &str) -> Option<&'a str> {
    input.get(k).and_then(Value::as_str)
}

fn meta_json(e: &FileEntry, content: Value, special: bool) -> Value {
    if special {
        json!({"path": e.path, "content": content, "mime_type": "text/markdown", "size": e.size,
               "protection": "no_delete", "authorized": e.authorized, "created_at": null, "updated_at": null})
    } else {
        json!({"path": e.path, "content": content, "mime_type": e.mime_type, "size": e.size,
               "protection": e.protection, "authorized": e.authorized, "created_at": e.created_at, "updated_at": e.updated_at})
    }
}

pub fn read(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let path = s(input, "path").unwrap_or_default();
    let (e, bytes) = match ctx.store.file_read(path) {
        Ok(x) => x,
        Err(err) => return err.into(),
    };
    (ctx.emit)(kind::FILE_READ, json!({"path": path, "bytes": bytes.len()}));
    let special = matches!(path, "README.md" | "document.md" | "mind.md");
    let content = if e.is_text() || special {
        let text = String::from_utf8_lossy(&bytes);
        let start = input.get("start_line").and_then(Value::as_u64);
        let end = input.get("end_line").and_then(Value::as_u64);
        if start.is_some() || end.is_some() {
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let from = start.unwrap_or(1) as usize;
            let to = end.map(|e| e as usize).unwrap_or(lines.len()).min(lines.len());
            if from > lines.len().max(1) || from > to.max(1) {
                return ToolOutput::err(format!(
                    "Line range {from}-{to} is outside \"{path}\" ({} lines).",
                    lines.len()
                ));
            }
            Value::String(lines[from - 1..to].concat())
        } else {
            Value::String(text.into_owned())
        }
    } else if ctx.from_code {
        Value::String(B64.encode(&bytes))
    } else {
        Value::Null
    };
    ToolOutput::json(&meta_json(&e, content, special))
}

/// Files up to this size keep their old text for the change's diff.
pub const DIFF_SOURCE_MAX: u64 = 256 * 1024;

pub fn write(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let path = s(input, "path").unwrap_or_default();
    let mode = s(input, "mode").unwrap_or("write");
    let max = ctx.store.config().map(|c| c.max_file_write_bytes()).unwrap_or(DEFAULT_MAX_WRITE);
    let before = ctx.store.file_stat(path).ok().flatten();
    let existed = before.is_some();
    // The old text, for the change's diff (small text files only).
    let before_text = before
        .as_ref()
        .filter(|e| e.size <= DIFF_SOURCE_MAX && e.is_text())
        .and_then(|_| ctx.store.file_read(path).ok())
        .and_then(|(_, b)| String::from_utf8(b).ok());
    let protected = before.is_some_and(|e| e.protection == Protection::ReadOnly);
    let caller = ctx.caller;
    let result = match mode {
        "write" => {
            let Some(content) = s(input, "content") else {
                return ToolOutput::err("content is required for mode \"write\".");
            };
            let protection = s(input, "protection").and_then(|p| Protection::parse(p).ok());
            if s(input, "encoding") == Some("base64") {
                let bytes = match B64.decode(content.trim()) {
                    Ok(b) => b,
                    Err(e) => return ToolOutput::err(format!("content is not valid base64: {e}")),
                };
                let opts = WriteOptions { mime_type: s(input, "mime_type"), protection, max_bytes: None };
                ctx.store
                    .file_write(caller, path, &bytes, &opts)
                    .map(|e| (e.size, format!("Successfully wrote \"{path}\" ({} bytes, binary)", bytes.len())))
            } else {
                let opts = WriteOptions { mime_type: s(input, "mime_type"), protection, max_bytes: Some(max) };
                ctx.store.file_write(caller, path, content.as_bytes(), &opts).map(|e| {
                    (e.size, format!("Successfully wrote \"{path}\" ({} characters)", content.chars().count()))
                })
            }
        }
        "append" => {
            let Some(content) = s(input, "content") else {
                return ToolOutput::err("content is required for mode \"append\".");
            };
            ctx.store
                .file_append(caller, path, content, Some(max))
                .map(|e| (e.size, format!("Appended {} characters to \"{path}\"", content.chars().count())))
        }
        _ => {
            let edits: Vec<Edit<'_>> = match input.get("edits").and_then(Value::as_array) {
                Some(list) => list
                    .iter()
                    .map(|e| Edit {
                        old_text: e["old_text"].as_str().unwrap_or(""),
                        new_text: e["new_text"].as_str().unwrap_or(""),
                        replace_all: e["replace_all"].as_bool().unwrap_or(false),
                    })
                    .collect(),
                None => match (s(input, "old_text"), s(input, "new_text")) {
                    (Some(o), Some(n)) => {
                        vec![Edit {
                            old_text: o,
                            new_text: n,
                            replace_all: input["replace_all"].as_bool().unwrap_or(false),
                        }]
                    }
                    _ => return ToolOutput::err("mode \"edit\" needs old_text and new_text, or edits."),
                },
            };
            ctx.store.file_edit(caller, path, &edits, Some(max)).and_then(|k| {
                let size = ctx.store.file_stat(path)?.map(|e| e.size).unwrap_or(0);
                Ok((size, format!("Edited {path} ({k} replacement(s)).")))
            })
        }
    };
    match result {
        Ok((size, text)) => {
            let operation = if existed { "modified" } else { "created" };
            let mut ev = json!({"path": path, "bytes": size, "operation": operation});
            if let Some(t) = before_text {
                // Taken off by the executor before the event is published.
                ev["_before"] = json!(t);
            }
            (ctx.emit)(kind::FILE_WRITTEN, ev);
            ToolOutput::ok(ctx.marked(protected, text))
        }
        Err(e) => e.into(),
    }
}

pub fn list(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    match ctx.store.file_list(s(input, "prefix").unwrap_or("")) {
        Ok(files) => ToolOutput::json(&Value::Array(
            files
                .iter()
                .map(|f| {
                    json!({"path": f.path, "size": f.size, "mime_type": f.mime_type, "protection": f.protection,
                           "created_at": f.created_at, "updated_at": f.updated_at})
                })
                .collect(),
        )),
        Err(e) => e.into(),
    }
}

pub fn delete(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let path = s(input, "path").unwrap_or_default();
    let protected = ctx.store.file_stat(path).ok().flatten().is_some_and(|e| e.protection != Protection::None);
    match ctx.store.file_delete(ctx.caller, path) {
        Ok(()) => {
            (ctx.emit)(kind::FILE_DELETED, json!({"path": path}));
            ToolOutput::ok(ctx.marked(protected, format!("Deleted \"{path}\".")))
        }
        Err(e) => e.into(),
    }
}
