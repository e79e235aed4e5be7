//! `adf loops …`: an agent's side loops from the shell. Changes to a file
//! a daemon or the app holds go through its API (`/agents/{id}/loops`).

use reqwest::Method;
use serde_json::{Value, json};

use super::held::{Target, open_for_write};
use super::output::{Out, at, close, open_for_read};
use super::{LoopFields, LoopsCmd};
use crate::store::loops::{self, LoopDef};

fn row(d: &Value) -> Vec<String> {
    let s = |k: &str| d[k].as_str().unwrap_or("").to_string();
    let next = d["next_run_at"]
        .as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "-".into());
    let goal: String = s("goal").chars().take(60).collect();
    // A continuous loop's mode says the turns it takes a wake.
    let mode = match d["turn_limit"].as_u64() {
        Some(n) if d["mode"] == "continuous" => format!("continuous ({n} turns)"),
        _ => s("mode"),
    };
    vec![s("name"), mode, s("status"), d["schedule"].as_str().unwrap_or("-").to_string(), next, goal]
}

fn show(out: &Out, defs: Vec<Value>) -> anyhow::Result<()> {
    if out.json {
        return out.json(&json!({"loops": defs}));
    }
    let rows: Vec<Vec<String>> = defs.iter().map(row).collect();
    out.table(&["LOOP", "MODE", "STATUS", "SCHEDULE", "NEXT RUN", "GOAL"], &rows)
}

fn one(out: &Out, d: &Value, verb: &str) -> anyhow::Result<()> {
    if out.json { out.json(d) } else { out.line(format!("{verb} loop {}", d["name"].as_str().unwrap_or(""))) }
}

/// The fields `new` and `set` give, as the API's JSON input.
fn input(f: LoopFields, template: Option<String>, mut input: Value) -> Value {
    let texts =
        [("template", template), ("goal", f.goal), ("model", f.model), ("mode", f.mode), ("schedule", f.schedule)];
    for (k, v) in texts {
        if let Some(v) = v {
            input[k] = json!(v);
        }
    }
    if let Some(t) = f.tools {
        input["tools"] = json!(t);
    }
    if let Some(c) = f.compact_threshold {
        input["compact_threshold"] = json!(c);
    }
    if let Some(n) = f.max_turns {
        input["max_turns"] = json!(n);
    }
    input
}

/// Make or change a loop: in this process on a free file, else through
/// the process that holds it (`method` on `segments` with `input`).
fn write_loop(
    path: &std::path::Path,
    local: impl FnOnce(&mut crate::store::Store) -> Result<LoopDef, crate::store::StoreError>,
    method: Method,
    segments: &[&str],
    input: &Value,
) -> anyhow::Result<Value> {
    Ok(match open_for_write(path)? {
        Target::Local(mut store) => {
            let d = local(&mut store).map_err(|e| at(path, e))?;
            close(store)?;
            loops::to_json(&d)
        }
        Target::Held(via) => via.call(method, segments, &[], Some(input))?["loop"].clone(),
    })
}

pub fn run(out: &Out, cmd: LoopsCmd) -> anyhow::Result<()> {
    match cmd {
        LoopsCmd::Ls { path } => {
            let store = open_for_read(&path)?;
            let list = store.loops_list().map_err(|e| at(&path, e))?;
            let state = store.config_value().ok().and_then(|c| c["state"].as_str().map(str::to_string));
            close(store)?;
            let mut defs =
                vec![json!({"name": "main", "mode": "main", "status": state.unwrap_or_else(|| "idle".into()),
                "goal": "the agent's own conversation"})];
            defs.extend(list.iter().map(loops::to_json));
            show(out, defs)
        }
        LoopsCmd::Templates => {
            if out.json {
                let v: Vec<Value> = crate::runtime::loop_templates::TEMPLATES
                    .iter()
                    .map(|(n, d)| json!({"name": n, "summary": d}))
                    .collect();
                return out.json(&v);
            }
            let rows: Vec<Vec<String>> = crate::runtime::loop_templates::TEMPLATES
                .iter()
                .map(|(n, d)| vec![n.to_string(), d.to_string()])
                .collect();
            out.table(&["TEMPLATE", "WHAT IT DOES"], &rows)
        }
        LoopsCmd::Budget { path, name, budget } => {
            let b: Value = serde_json::from_str(&budget).map_err(|e| {
                anyhow::anyhow!("{}: the budget is not JSON: {e} (e.g. '{{\"usd_day\": 1}}')", path.display())
            })?;
            let input = json!({"budget": b});
            let spec = crate::store::loops::LoopSpec { budget: Some(b), ..Default::default() };
            let d = write_loop(&path, |s| s.loop_update(&name, &spec), Method::PATCH, &["loops", &name], &input)?;
            if out.json { out.json(&d) } else { out.line(format!("loop {name}: budget {}", d["budget"])) }
        }
        LoopsCmd::Set { path, name, fields } => {
            let input = input(fields, None, json!({}));
            if input.as_object().is_some_and(|o| o.is_empty()) {
                anyhow::bail!(
                    "{}: nothing to change: give --goal, --tools, --model, --mode, --schedule, --compact-threshold \
                     or --max-turns",
                    path.display()
                );
            }
            let spec = crate::runtime::executor::side::spec_from(&input)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let d = write_loop(&path, |s| s.loop_update(&name, &spec), Method::PATCH, &["loops", &name], &input)?;
            one(out, &d, "changed")
        }
        LoopsCmd::New { path, name, template, fields, budget } => {
            let mut input = input(fields, template, json!({"name": name}));
            if let Some(b) = budget {
                input["budget"] = serde_json::from_str(&b).map_err(|e| {
                    anyhow::anyhow!("{}: --budget is not JSON: {e} (e.g. '{{\"usd_day\": 1}}')", path.display())
                })?;
            }
            let spec = crate::runtime::executor::side::spec_from(&input)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let d = write_loop(&path, |s| s.loop_create(&name, &spec), Method::POST, &["loops"], &input)?;
            one(out, &d, "created")
        }
        LoopsCmd::Rm { path, name } => {
            let n = match open_for_write(&path)? {
                Target::Local(mut store) => {
                    let n = store.loop_delete(&name).map_err(|e| at(&path, e))?;
                    close(store)?;
                    n as u64
                }
                Target::Held(via) => {
                    via.call(Method::DELETE, &["loops", &name], &[], None)?["archivedRows"].as_u64().unwrap_or(0)
                }
            };
            if out.json {
                out.json(&json!({"deleted": name, "archived_rows": n}))
            } else {
                out.line(format!("deleted loop {name} ({n} rows archived to adf_audit as loop:{name})"))
            }
        }
        LoopsCmd::Pause { path, name } => set_status(out, &path, &name, "paused"),
        LoopsCmd::Resume { path, name } => set_status(out, &path, &name, "idle"),
        LoopsCmd::Show { path, name } => {
            let store = open_for_read(&path)?;
            let def: Option<LoopDef> = store.loop_get(&name).map_err(|e| at(&path, e))?;
            if def.is_none() {
                close(store)?;
                anyhow::bail!("{}: no loop named {name:?} (see `adf loops ls {}`)", path.display(), path.display());
            }
            let rows = store.side_rows(&name).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                return out.json(&json!({"loop": name, "rows": rows}));
            }
            for r in rows {
                out.line(format!("[S{}] {}: {}", r.seq, r.role, render(&r.content)))?;
            }
            Ok(())
        }
    }
}

/// `adf lint FILE [--stale-days N]`: the memory linter, exit 1 when it
/// found something (as `diff` does on a difference).
pub fn lint(out: &Out, path: &std::path::Path, stale_days: u32) -> anyhow::Result<u8> {
    let store = open_for_read(path)?;
    let report = store.memory_lint(crate::store::lint::LintOptions { stale_days });
    close(store)?;
    let report = report.map_err(|e| at(path, e))?;
    if out.json {
        out.json(&report)?;
    } else {
        out.line(report.summary())?;
        for f in &report.findings {
            let place = f.line.map(|l| format!("{}:{l}", f.page)).unwrap_or_else(|| f.page.clone());
            out.line(format!("{place}: {}: {}", f.kind.replace('_', " "), f.detail))?;
        }
    }
    Ok(if report.is_clean() { 0 } else { 1 })
}

/// `adf context FILE [--loop NAME]`.
pub fn context(out: &Out, path: &std::path::Path, loop_name: Option<&str>) -> anyhow::Result<()> {
    let store = open_for_read(path)?;
    let cfg = store.config_value().ok();
    // What a self-hosted model's server says its window is (2 s at most;
    // hosted APIs are not asked).
    let probed = cfg.as_ref().and_then(|c| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(crate::providers::windows::probe(c))
    });
    let overrides = crate::providers::windows::overrides();
    let gauge =
        crate::runtime::context::measure(&store, loop_name.filter(|l| *l != "main"), overrides.as_ref(), probed);
    close(store)?;
    let g = gauge.map_err(|e| at(path, e))?;
    if out.json {
        return out.json(&g);
    }
    let n = |v: u64| {
        let s = v.to_string();
        let mut o = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                o.push(',');
            }
            o.push(c);
        }
        o
    };
    use crate::providers::windows::Source;
    let model = if g.model.is_empty() { "(no model)" } else { g.model.as_str() };
    let head = match (g.window, g.window_source, g.percent) {
        (Some(w), Some(src), Some(p)) => {
            let src = match src {
                Source::Config => "the agent's model.context_window",
                Source::Settings => "settings.json",
                Source::Provider => "the model's server",
                Source::Table => "adf's table",
            };
            format!("{} · {model} · {} / {} tokens ({p:.1}%) · window from {src}", g.loop_name, n(g.estimated), n(w))
        }
        _ => format!(
            "{} · {model} · {} tokens · window unknown (set model_windows in settings.json or model.context_window)",
            g.loop_name,
            n(g.estimated)
        ),
    };
    out.line(format!("{head} · compacts at {}", n(g.compact_threshold)))?;
    if let Some(p) = g.percent {
        out.line(gauge_bar(p, 40))?;
    }
    if let Some(r) = g.reported_last_call {
        out.line(format!("last call: {} input tokens reported by the provider", n(r)))?;
    }
    let rows: Vec<Vec<String>> = g
        .parts
        .iter()
        .map(|p| {
            let share = if g.estimated == 0 { 0.0 } else { p.tokens as f64 * 100.0 / g.estimated as f64 };
            vec![p.kind.to_string(), p.name.clone(), n(p.tokens), format!("{share:.1}%")]
        })
        .collect();
    out.table(&["KIND", "WHAT", "TOKENS", "SHARE"], &rows)
}

/// `[██████░░░░]` for a percentage.
pub fn gauge_bar(percent: f64, width: usize) -> String {
    let full = ((percent.clamp(0.0, 100.0) / 100.0) * width as f64).round() as usize;
    format!("[{}{}]", "█".repeat(full), "░".repeat(width - full))
}

/// `adf cite FILE S123`.
pub fn cite(out: &Out, path: &std::path::Path, citation: &str) -> anyhow::Result<()> {
    let seq = crate::store::cite::parse(citation).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let store = open_for_read(path)?;
    let found = store.cite(seq);
    close(store)?;
    let c = found.map_err(|e| at(path, e))?;
    if out.json {
        return out.json(&c);
    }
    let when = chrono::DateTime::from_timestamp_millis(c.row.created_at)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    let whence = match c.audit_id {
        Some(id) => format!("audit #{id}"),
        None => "live".into(),
    };
    out.line(format!("S{} · loop {} · {} · {} · {when}", c.seq, c.loop_name, c.row.role, whence))?;
    out.line(render(&c.row.content))
}

fn render(content: &Value) -> String {
    content
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| match b["type"].as_str() {
                    Some("text") => b["text"].as_str().unwrap_or("").to_string(),
                    Some("tool_use") => format!("▸ {} {}", b["name"].as_str().unwrap_or(""), b["input"]),
                    Some("tool_result") => format!("  ↳ {}", b["content"].as_str().unwrap_or("")),
                    _ => String::new(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| content.to_string())
}

fn set_status(out: &Out, path: &std::path::Path, name: &str, status: &str) -> anyhow::Result<()> {
    let d = match open_for_write(path)? {
        Target::Local(mut store) => {
            let def = store.loop_get(name).map_err(|e| at(path, e))?;
            let Some(def) = def else {
                close(store)?;
                anyhow::bail!("{}: no loop named {name:?}", path.display());
            };
            store.loop_set_status(name, status, def.next_run_at).map_err(|e| at(path, e))?;
            let d = store.loop_get(name).map_err(|e| at(path, e))?;
            close(store)?;
            d.map(|d| loops::to_json(&d)).unwrap_or(Value::Null)
        }
        Target::Held(via) => {
            via.call(Method::PATCH, &["loops", name], &[], Some(&json!({"status": status})))?["loop"].clone()
        }
    };
    one(out, &d, if status == "paused" { "paused" } else { "resumed" })
}
