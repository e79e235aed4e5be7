//! Agents made from agents, from the shell: `adf clone` (a copy with a
//! fresh identity and a `clone` attestation naming its source),
//! `adf template save` (an agent without history, keys or secrets, with
//! locks) and `adf new --template`. The source is only read; a refused or
//! failed command leaves no file behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use serde_json::json;

use super::output::Out;
use crate::store::StoreError;
use crate::store::create::NewAgent;
use crate::store::derive::{self, ChildSpec, CloneOptions, Template};

#[derive(Debug, Clone, Subcommand)]
pub enum TemplateCmd {
    /// Save an agent as a template: config (secrets removed), files, local
    /// tables and meta; no loop, inbox, outbox, logs, tasks, timers, keys,
    /// secrets or attestations.
    Save {
        /// The agent to save from (only read).
        src: PathBuf,
        /// The template file to write (must not exist).
        template: PathBuf,
        /// Lock a config path in every child (repeatable): `tools.NAME` or
        /// `triggers.NAME` locks that item, any other path (model.model_id,
        /// tools, security.level) joins `locked_fields`.
        #[arg(long = "lock", value_name = "PATH")]
        lock: Vec<String>,
    },
}

/// The error as one line naming its file: as it is when it names one of
/// `paths`, else prefixed with the first.
fn at(paths: &[&Path], e: StoreError) -> anyhow::Error {
    let msg = e.to_string();
    if paths.iter().any(|p| msg.contains(&p.display().to_string())) {
        return anyhow::anyhow!(msg);
    }
    let first = paths.first().map(|p| p.display().to_string()).unwrap_or_default();
    anyhow::anyhow!("{first}: {msg}")
}

fn install() -> anyhow::Result<Arc<crate::identity::install::Install>> {
    crate::identity::install::current().map_err(anyhow::Error::msg)
}

/// `adf clone SRC DST`.
pub fn clone(out: &Out, src: &Path, dst: &Path, opts: CloneOptions) -> anyhow::Result<()> {
    let inst = install()?;
    let made = derive::clone_file(src, dst, opts, Some(&inst)).map_err(|e| at(&[src, dst], e))?;
    // The owner made it: the daemon may start it without a review.
    crate::review::mark_reviewed(&made.id).map_err(anyhow::Error::msg)?;
    if out.json {
        return out.json(&json!({
            "path": made.path, "source": made.source, "id": made.id, "name": made.name,
            "did": made.did, "source_did": made.source_did,
            "history": opts.history, "files": opts.files, "tables": opts.tables,
        }));
    }
    out.line(format!("cloned {} to {}", src.display(), dst.display()))?;
    out.line(format!("  name    {}", made.name))?;
    out.line(format!("  id      {}", made.id))?;
    out.line(format!("  did     {}", made.did.unwrap_or_default()))?;
    out.line(format!("  source  {}", made.source_did.unwrap_or_else(|| "(no DID)".into())))
}

/// `adf fork SRC --at S<seq> DST`.
pub fn fork(out: &Out, src: &Path, at_row: &str, dst: &Path) -> anyhow::Result<()> {
    let seq = crate::store::fork::parse_seq(at_row).map_err(anyhow::Error::msg)?;
    let inst = install()?;
    let made = crate::store::fork::fork_file(src, dst, seq, Some(&inst)).map_err(|e| at(&[src, dst], e))?;
    crate::review::mark_reviewed(&made.id).map_err(anyhow::Error::msg)?;
    if out.json {
        return out.json(&json!({
            "path": made.path, "source": made.source, "at": seq, "id": made.id, "name": made.name,
            "did": made.did, "source_did": made.source_did,
        }));
    }
    out.line(format!("forked {} at S{seq} into {}: its loop ends there", src.display(), dst.display()))?;
    out.line(format!("  did     {}", made.did.unwrap_or_default()))?;
    out.line(format!("  go on   adf chat {} \"…\"", dst.display()))
}

/// `adf diff A B`.
pub fn diff(out: &Out, a: &Path, b: &Path) -> anyhow::Result<u8> {
    let sa = super::output::open_for_read(a)?;
    let sb = super::output::open_for_read(b)?;
    let d = crate::store::compare::diff(&sa, &sb).map_err(|e| at(&[a, b], e))?;
    super::output::close(sa)?;
    super::output::close(sb)?;
    if out.json {
        out.json(&d)?;
    } else if d.is_empty() {
        out.line("no differences (config, files, meta, tables, loop)")?;
    } else {
        let text = crate::store::compare::render(&d, &a.display().to_string(), &b.display().to_string());
        out.line(text.trim_end())?;
    }
    // As diff(1): 0 alike, 1 different.
    Ok(u8::from(!d.is_empty()))
}

/// `adf template save SRC TEMPLATE`.
pub fn template(out: &Out, cmd: TemplateCmd) -> anyhow::Result<()> {
    let TemplateCmd::Save { src, template, lock } = cmd;
    let made =
        derive::save_template(&src, &template, &lock).map_err(|e| at(&[src.as_path(), template.as_path()], e))?;
    if out.json {
        return out.json(&json!({
            "path": made.path, "source": made.source, "id": made.id, "name": made.name,
            "locked_fields": made.locked_fields, "locks": lock,
        }));
    }
    out.line(format!("saved {} as template {}", src.display(), template.display()))?;
    out.line(format!("  locked  {}", if lock.is_empty() { "(nothing)".into() } else { lock.join(", ") }))
}

/// `adf new DST --template TEMPLATE` (with `adf new`'s other options).
pub struct FromTemplate<'a> {
    pub name: Option<&'a str>,
    pub handle: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
    pub description: Option<&'a str>,
}

pub fn new_from_template(out: &Out, path: &Path, template: &Path, o: FromTemplate<'_>) -> anyhow::Result<()> {
    let tpl = Template::load(template).map_err(|e| at(&[template], e))?;
    let spec = ChildSpec {
        new: NewAgent {
            seal_to: Some(install()?),
            name: o.name,
            handle: o.handle,
            description: o.description,
            icon: None,
            provider: o.provider,
            model: o.model,
        },
        template: Some(&tpl),
        ..Default::default()
    };
    let created = derive::create_child(path, &spec).map_err(|e| at(&[path, template], e))?;
    crate::review::mark_reviewed(&created.id).map_err(anyhow::Error::msg)?;
    if out.json {
        let mut v = serde_json::to_value(&created)?;
        v["template"] = json!(template);
        return out.json(&v);
    }
    out.line(format!("created {} from template {}", created.path.display(), template.display()))?;
    out.line(format!("  name    {}", created.name))?;
    out.line(format!("  handle  {}", created.handle))?;
    out.line(format!("  did     {}", created.did))
}
