//! `adf files …`: the agent's virtual filesystem from the shell. The owner
//! goes through the same protection rules as the agent (no bypass), but may
//! change protection.

use std::io::{Read, Write};

use anyhow::Context;
use serde_json::json;

use super::FilesCmd;
use super::held::{Target, open_for_write};
use super::output::{self, Out, at, close, open_for_read};
use crate::store::Caller;
use crate::store::files::{Protection, WriteOptions};

pub fn run(out: &Out, cmd: FilesCmd) -> anyhow::Result<()> {
    match cmd {
        // Handled before: the daemon's view of an agent.
        FilesCmd::Agent(_) => Ok(()),
        FilesCmd::Ls { path, prefix } => {
            let store = open_for_read(&path)?;
            let files = store.file_list(prefix.as_deref().unwrap_or("")).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                return out.json(&files);
            }
            let rows: Vec<Vec<String>> = files
                .iter()
                .map(|f| {
                    vec![
                        f.protection.as_str().to_string(),
                        output::size(f.size),
                        f.mime_type.clone().unwrap_or_else(|| "-".into()),
                        if f.authorized { "authorized".into() } else { String::new() },
                        f.path.clone(),
                    ]
                })
                .collect();
            out.table(&["PROTECTION", "SIZE", "MIME", "", "PATH"], &rows)
        }
        FilesCmd::Cat { path, file } => {
            let store = open_for_read(&path)?;
            let mut stdout = std::io::stdout().lock();
            store.file_read_to(&file, &mut stdout).map_err(|e| at(&path, e))?;
            stdout.flush()?;
            close(store)
        }
        FilesCmd::Put { path, file, local, mime, protection } => {
            let protection = protection.as_deref().map(Protection::parse).transpose().map_err(|e| at(&path, e))?;
            let opts = WriteOptions { mime_type: mime.as_deref(), protection, max_bytes: None };
            // Read the input before opening the agent, so a bad LOCAL changes nothing.
            let mut input = match local.as_deref().filter(|l| l.as_os_str() != "-") {
                Some(local) => {
                    let f = std::fs::File::open(local).with_context(|| format!("{}: cannot read", local.display()))?;
                    let meta = f.metadata().with_context(|| format!("{}: cannot stat", local.display()))?;
                    if meta.is_file() {
                        Input::File(f, meta.len())
                    } else {
                        // A pipe, FIFO or device (`<(cmd)`): no length until it ends.
                        let mut buf = Vec::new();
                        let mut f = f;
                        f.read_to_end(&mut buf).with_context(|| format!("{}: cannot read", local.display()))?;
                        Input::Bytes(buf)
                    }
                }
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin().lock().read_to_end(&mut buf).context("reading stdin")?;
                    Input::Bytes(buf)
                }
            };
            let entry = match open_for_write(&path)? {
                Target::Local(mut store) => {
                    let e = match &mut input {
                        Input::File(f, len) => store.file_write_stream(Caller::Owner, &file, f, *len, &opts),
                        Input::Bytes(b) => store.file_write(Caller::Owner, &file, b, &opts),
                    }
                    .map_err(|e| at(&path, e))?;
                    close(store)?;
                    serde_json::to_value(e)?
                }
                Target::Held(via) => {
                    use base64::Engine;
                    let bytes = input.into_bytes()?;
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    via.call(
                        reqwest::Method::PUT,
                        &["files", "content"],
                        &[("path", file.as_str())],
                        Some(&json!({"content_base64": b64, "mime_type": mime})),
                    )?;
                    if let Some(p) = protection {
                        via.call(
                            reqwest::Method::PATCH,
                            &["files", "protection"],
                            &[],
                            Some(&json!({"path": file, "protection": p.as_str()})),
                        )?;
                    }
                    let v = via.call(reqwest::Method::GET, &["files"], &[], None)?;
                    v["files"]
                        .as_array()
                        .and_then(|a| a.iter().find(|f| f["path"] == file.as_str()).cloned())
                        .ok_or_else(|| anyhow::anyhow!("{}: {file} was written, but is not listed", path.display()))?
                }
            };
            if out.json {
                out.json(&entry)
            } else {
                let size = entry["size"].as_u64().unwrap_or(0);
                out.line(format!("wrote {} ({})", entry["path"].as_str().unwrap_or(&file), output::size(size)))
            }
        }
        FilesCmd::Rm { path, file } => {
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.file_delete(Caller::Owner, &file).map_err(|e| at(&path, e))?;
                    close(store)?;
                }
                Target::Held(via) => {
                    via.call(reqwest::Method::DELETE, &["files", "content"], &[("path", file.as_str())], None)?;
                }
            }
            if out.json { out.json(&json!({"deleted": file})) } else { out.line(format!("deleted {file}")) }
        }
        FilesCmd::Protect { path, file, level } => {
            let level = Protection::parse(&level).map_err(|e| at(&path, e))?;
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.file_set_protection(Caller::Owner, &file, level).map_err(|e| at(&path, e))?;
                    close(store)?;
                }
                Target::Held(via) => {
                    let body = json!({"path": file, "protection": level.as_str()});
                    via.call(reqwest::Method::PATCH, &["files", "protection"], &[], Some(&body))?;
                }
            }
            if out.json {
                out.json(&json!({"path": file, "protection": level}))
            } else {
                out.line(format!("{file}: {}", level.as_str()))
            }
        }
        FilesCmd::Authorize { path, file, off } => {
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.file_set_authorized(&file, !off).map_err(|e| at(&path, e))?;
                    close(store)?;
                }
                Target::Held(via) => {
                    let body = json!({"path": file, "authorized": !off});
                    via.call(reqwest::Method::PATCH, &["files", "authorized"], &[], Some(&body))?;
                }
            }
            if out.json {
                out.json(&json!({"path": file, "authorized": !off}))
            } else {
                out.line(format!("{file}: {}", if off { "not authorized" } else { "authorized" }))
            }
        }
        FilesCmd::Mv { path, from, to } => {
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.file_rename(Caller::Owner, &from, &to).map_err(|e| at(&path, e))?;
                    close(store)?;
                }
                Target::Held(via) => {
                    let body = json!({"oldPath": from, "newPath": to});
                    via.call(reqwest::Method::POST, &["files", "rename"], &[], Some(&body))?;
                }
            }
            if out.json { out.json(&json!({"from": from, "to": to})) } else { out.line(format!("{from} -> {to}")) }
        }
    }
}

/// What `files put` writes: a regular file streamed by its length, or
/// bytes read whole (stdin, a pipe).
enum Input {
    File(std::fs::File, u64),
    Bytes(Vec<u8>),
}

impl Input {
    fn into_bytes(self) -> anyhow::Result<Vec<u8>> {
        match self {
            Input::Bytes(b) => Ok(b),
            Input::File(mut f, len) => {
                let mut b = Vec::with_capacity(len as usize);
                f.read_to_end(&mut b)?;
                Ok(b)
            }
        }
    }
}
