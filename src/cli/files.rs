//! `adf files …`: the agent's virtual filesystem from the shell. The owner
//! goes through the same protection rules as the agent (no bypass), but may
//! change protection.

use std::io::{Read, Write};

use anyhow::Context;
use serde_json::json;

use super::FilesCmd;
use super::output::{self, Out, at, close, open, open_for_read};
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
            let mut store;
            let entry = match local.as_deref().filter(|l| l.as_os_str() != "-") {
                Some(local) => {
                    let mut f =
                        std::fs::File::open(local).with_context(|| format!("{}: cannot read", local.display()))?;
                    let meta = f.metadata().with_context(|| format!("{}: cannot stat", local.display()))?;
                    if meta.is_file() {
                        store = open(&path)?;
                        store
                            .file_write_stream(Caller::Owner, &file, &mut f, meta.len(), &opts)
                            .map_err(|e| at(&path, e))?
                    } else {
                        // A pipe, FIFO or device (`<(cmd)`): no length until it ends.
                        let mut buf = Vec::new();
                        f.read_to_end(&mut buf).with_context(|| format!("{}: cannot read", local.display()))?;
                        store = open(&path)?;
                        store.file_write(Caller::Owner, &file, &buf, &opts).map_err(|e| at(&path, e))?
                    }
                }
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin().lock().read_to_end(&mut buf).context("reading stdin")?;
                    store = open(&path)?;
                    store.file_write(Caller::Owner, &file, &buf, &opts).map_err(|e| at(&path, e))?
                }
            };
            close(store)?;
            if out.json {
                out.json(&entry)
            } else {
                out.line(format!("wrote {} ({})", entry.path, output::size(entry.size)))
            }
        }
        FilesCmd::Rm { path, file } => {
            let mut store = open(&path)?;
            store.file_delete(Caller::Owner, &file).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json { out.json(&json!({"deleted": file})) } else { out.line(format!("deleted {file}")) }
        }
        FilesCmd::Protect { path, file, level } => {
            let level = Protection::parse(&level).map_err(|e| at(&path, e))?;
            let mut store = open(&path)?;
            store.file_set_protection(Caller::Owner, &file, level).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                out.json(&json!({"path": file, "protection": level}))
            } else {
                out.line(format!("{file}: {}", level.as_str()))
            }
        }
        FilesCmd::Authorize { path, file, off } => {
            let mut store = open(&path)?;
            store.file_set_authorized(&file, !off).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                out.json(&json!({"path": file, "authorized": !off}))
            } else {
                out.line(format!("{file}: {}", if off { "not authorized" } else { "authorized" }))
            }
        }
        FilesCmd::Mv { path, from, to } => {
            let mut store = open(&path)?;
            store.file_rename(Caller::Owner, &from, &to).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json { out.json(&json!({"from": from, "to": to})) } else { out.line(format!("{from} -> {to}")) }
        }
    }
}
