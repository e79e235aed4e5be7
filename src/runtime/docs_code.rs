//! The document methods of the `adf` proxy, so agent code reads office
//! files without installing anything: `doc_text`, `doc_table`, `zip_list`,
//! `zip_extract`, `yaml_parse`, `yaml_stringify`. Files come from the
//! agent's own filesystem (`adf_files`), never the host; extracted files go
//! back into it through `fs_write`, so protections, size limits and
//! `file.written` events apply as to any write from code. Parsing runs on
//! a blocking thread: a large PDF must not stall the executor's runtime.

use base64::Engine;
use serde_json::{Value, json};

use super::code::CodeCx;
use super::executor::Executor;
use crate::docs::{self, DocError};
use crate::sandbox::CallError;
use crate::store::Caller;
use crate::tools::{self, Ctx};

/// The proxy methods this file serves.
pub const DOC_METHODS: &[&str] = &["doc_text", "doc_table", "zip_list", "zip_extract", "yaml_parse", "yaml_stringify"];

fn err(code: &str, message: impl Into<String>) -> CallError {
    CallError::new(code, message)
}

fn doc_err(e: DocError) -> CallError {
    err(e.code(), e.to_string())
}

fn arg<'a>(args: &'a Value, name: &str, method: &str) -> Result<&'a str, CallError> {
    args.get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| err("INVALID_INPUT", format!("adf.{method} needs \"{name}\" (a string)")))
}

/// Run a parser off the async runtime.
async fn parse<T: Send + 'static>(f: impl FnOnce() -> Result<T, DocError> + Send + 'static) -> Result<T, CallError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(doc_err),
        Err(e) => Err(err("INTERNAL_ERROR", format!("the document reader stopped: {e}"))),
    }
}

impl Executor {
    /// One of the agent's files, refused above `docs::MAX_INPUT` before
    /// it is read.
    fn doc_bytes(&self, path: &str) -> Result<Vec<u8>, CallError> {
        let missing = || err("NOT_FOUND", format!("File \"{path}\" not found in workspace files"));
        let stat = self.store.file_stat(path).map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
        let entry = stat.ok_or_else(missing)?;
        if entry.size > docs::MAX_INPUT as u64 {
            return Err(doc_err(DocError::TooLarge { path: path.into(), size: entry.size as usize }));
        }
        self.store.file_read(path).map(|(_, b)| b).map_err(|_| missing())
    }

    pub(crate) async fn doc_method(&mut self, cx: &CodeCx, method: &str, args: &Value) -> Result<Value, CallError> {
        match method {
            "doc_text" => {
                let path = arg(args, "path", method)?.to_string();
                let bytes = self.doc_bytes(&path)?;
                Ok(Value::String(parse(move || docs::to_text(&path, &bytes)).await?))
            }
            "doc_table" => {
                let path = arg(args, "path", method)?.to_string();
                let sheet = args.get("sheet").and_then(Value::as_str).map(str::to_string);
                let bytes = self.doc_bytes(&path)?;
                let sheets = parse(move || docs::table(&path, &bytes, sheet.as_deref())).await?;
                serde_json::to_value(sheets).map_err(|e| err("INTERNAL_ERROR", e.to_string()))
            }
            "zip_list" => {
                let path = arg(args, "path", method)?.to_string();
                let bytes = self.doc_bytes(&path)?;
                let list = parse(move || docs::zip_list(&path, &bytes)).await?;
                serde_json::to_value(list).map_err(|e| err("INTERNAL_ERROR", e.to_string()))
            }
            "zip_extract" => self.zip_extract_into(cx, args).await,
            "yaml_parse" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("").to_string();
                parse(move || docs::yaml_to_json(&text)).await
            }
            "yaml_stringify" => {
                let value = args.get("value").cloned().unwrap_or(Value::Null);
                Ok(Value::String(docs::json_to_yaml(&value).map_err(doc_err)?))
            }
            _ => Err(err("NOT_FOUND", format!("Unknown method: {method}"))),
        }
    }

    /// `adf.zip_extract({path, dest})`: every file of the archive written
    /// to `dest/<its path>` as the calling code; the paths written.
    async fn zip_extract_into(&mut self, cx: &CodeCx, args: &Value) -> Result<Value, CallError> {
        let path = arg(args, "path", "zip_extract")?.to_string();
        let dest = arg(args, "dest", "zip_extract")?.trim_end_matches('/').to_string();
        crate::store::files::validate_path(&dest).map_err(|e| err("INVALID_INPUT", e.to_string()))?;
        let bytes = self.doc_bytes(&path)?;
        let files = parse(move || docs::zip_extract(&path, &bytes, &docs::ZipLimits::default())).await?;
        let targets: Vec<String> = files.iter().map(|(name, _)| format!("{dest}/{name}")).collect();
        for t in &targets {
            crate::store::files::validate_path(t).map_err(|e| err("INVALID_INPUT", e.to_string()))?;
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut written = Vec::new();
        for (target, (_, data)) in targets.into_iter().zip(files) {
            let input = json!({"mode": "write", "path": target, "content": b64.encode(&data), "encoding": "base64",
                "mime_type": crate::store::mime::for_path(&target)});
            let mut events: Vec<(&'static str, Value)> = Vec::new();
            let out = {
                let mut emit = |k: &'static str, v: Value| events.push((k, v));
                let caller = Caller::Agent { authorized: cx.authorized, override_approved: false };
                let mut ctx = Ctx { store: &mut self.store, caller, from_code: true, full: false, emit: &mut emit };
                tools::execute_guarded(&mut ctx, "fs_write", &input)
            };
            for (k, v) in events {
                self.emit(k, &cx.source, v);
            }
            if out.is_error {
                let done = if written.is_empty() {
                    String::new()
                } else {
                    format!(" (already written: {})", written.join(", "))
                };
                let code = if out.denial.is_some() { "PROTECTION_DENIED" } else { "TOOL_ERROR" };
                return Err(err(code, format!("{target}: {}{done}", out.content)));
            }
            written.push(target);
        }
        Ok(json!(written))
    }
}
