//! `adf chat PATH MESSAGE`: one turn in-process. The reply streams to
//! stdout (JSON lines of events with `--json`); approvals and asks are put
//! to the terminal when stdin is one, otherwise the command exits with
//! status 3 and the task stays pending in the file.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::json;

use super::output::{Out, at, open};
use crate::providers::{ModelEvent, accounts};
use crate::runtime::bus::{Bus, Filter, Item};
use crate::runtime::executor::{Absent, ApprovalRequest, Decision, Executor, Owner, TurnEnd};

/// Exit status when the turn waits on the owner.
pub const EXIT_AWAITING_OWNER: u8 = 3;

/// The owner at this terminal.
struct Terminal;

fn prompt(text: String) -> BoxFuture<'static, Option<String>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(move || {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{text}");
            let _ = err.flush();
            let mut line = String::new();
            match std::io::stdin().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line.trim_end_matches(['\n', '\r']).to_string()),
            }
        })
        .await
        .ok()
        .flatten()
    })
}

/// One key from the terminal, without waiting for enter (raw mode for the
/// one read). Enter alone is skipped; ctrl-c or end of input is `None`.
fn key(text: String) -> BoxFuture<'static, Option<char>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{text}");
            let _ = err.flush();
            let raw = crossterm::terminal::enable_raw_mode().is_ok();
            let mut byte = [0u8; 1];
            let got = loop {
                match std::io::stdin().lock().read(&mut byte) {
                    Ok(1) if matches!(byte[0], b'\r' | b'\n') => continue,
                    Ok(1) if byte[0] == 3 || byte[0] == 4 => break None,
                    Ok(1) => break Some(byte[0] as char),
                    _ => break None,
                }
            };
            if raw {
                let _ = crossterm::terminal::disable_raw_mode();
            }
            let _ = writeln!(err, "{}", got.map(String::from).unwrap_or_default());
            got
        })
        .await
        .ok()
        .flatten()
    })
}

impl Owner for Terminal {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        Box::pin(async move {
            let why = req.justification.as_deref().map(|j| format!("\n  reason: {j}")).unwrap_or_default();
            let what = match &req.denial {
                Some(d) => format!("override of {} ({})", d.target, d.description),
                None => "restricted tool".into(),
            };
            let text = format!(
                "\n⚠ approval needed: {} — {what}\n  input: {}{why}\n  [a] approve once  [A] approve always  [r] reject: ",
                req.tool,
                serde_json::to_string(&req.input).unwrap_or_default()
            );
            loop {
                match key(text.clone()).await {
                    None => return Decision::Defer,
                    Some('a') => return Decision::Approve { always: false },
                    Some('A') => return Decision::Approve { always: true },
                    Some('r') => {
                        let feedback = prompt("  feedback for the model (optional): ".into())
                            .await
                            .filter(|f| !f.trim().is_empty());
                        return Decision::Deny { feedback };
                    }
                    Some(_) => continue,
                }
            }
        })
    }

    fn answer<'a>(&'a self, _task: &'a str, question: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let mut text = format!("\n? {question}\n> ");
            loop {
                match prompt(std::mem::replace(&mut text, "> ".into())).await {
                    // An empty line is no answer (often the enter after a key).
                    Some(a) if a.trim().is_empty() => continue,
                    other => return other,
                }
            }
        })
    }
}

/// What `drive` runs.
pub enum Work<'a> {
    /// A new turn with the owner's message.
    Chat(&'a str),
    /// `/compact [what to keep]`.
    Compact(Option<&'a str>),
    /// `/clear`.
    Clear,
    /// The owner's message to a side loop: (loop, message).
    LoopChat(&'a str, &'a str),
    /// Answer the approval a paused turn waits on, and let it go on.
    Resolve { task_id: &'a str, decision: Decision },
}

pub fn run(out: &Out, path: &Path, message: &str, loop_name: &str) -> anyhow::Result<u8> {
    if loop_name != "main" {
        let store = super::output::open_for_read(path)?;
        let found = store.loop_get(loop_name).map_err(|e| at(path, e))?;
        super::output::close(store)?;
        match found {
            None => anyhow::bail!(
                "{}: no loop named \"{loop_name}\" (see `adf loops ls {}`; make one with `adf loops new`)",
                path.display(),
                path.display()
            ),
            Some(d) if d.status == "paused" => anyhow::bail!(
                "{}: loop \"{loop_name}\" is paused; `adf loops resume {} {loop_name}` first",
                path.display(),
                path.display()
            ),
            Some(_) => return drive(out, path, Work::LoopChat(loop_name, message)),
        }
    }
    use crate::runtime::slash::{self, Slash};
    match slash::parse(message) {
        Slash::Help => {
            let store = super::output::open_for_read(path)?;
            let cfg = store.config_value().unwrap_or_default();
            let index = crate::knowledge::skills::index(&store, Some(&crate::knowledge::skills::fleet_root()), &cfg);
            let skills: Vec<(String, String)> =
                index.active().map(|s| (s.name.clone(), s.description.clone())).collect();
            super::output::close(store)?;
            if out.json {
                let cmds: Vec<_> = slash::COMMANDS.iter().map(|(c, d)| json!({"command": c, "does": d})).collect();
                let skills: Vec<_> = skills.iter().map(|(n, d)| json!({"skill": n, "description": d})).collect();
                out.json(&json!({"commands": cmds, "skills": skills}))?;
            } else {
                print!("{}", slash::help(&skills));
            }
            Ok(0)
        }
        Slash::Compact(keep) => drive(out, path, Work::Compact(keep)),
        Slash::Clear => drive(out, path, Work::Clear),
        Slash::State(_) => anyhow::bail!(
            "{}: {message} sets the state of a running agent, and this file is not running here; \
             load it in the app or a daemon (`adf daemon`), then `adf chat NAME {message}`",
            path.display()
        ),
        Slash::Other(word) => {
            let store = super::output::open_for_read(path)?;
            let cfg = store.config_value().unwrap_or_default();
            let index = crate::knowledge::skills::index(&store, Some(&crate::knowledge::skills::fleet_root()), &cfg);
            let is_skill = index.find(word).is_some();
            super::output::close(store)?;
            if !is_skill {
                eprintln!("adf: {}", slash::unknown_notice(word));
            }
            drive(out, path, Work::Chat(message))
        }
        Slash::Text => drive(out, path, Work::Chat(message)),
    }
}

/// Run one piece of work on an agent file in-process, streaming as `chat`.
pub fn drive(out: &Out, path: &Path, work: Work<'_>) -> anyhow::Result<u8> {
    let mut store = open(path)?;
    for w in store.warnings() {
        eprintln!("adf: warning: {w}");
    }
    // The same resolution as the daemon's: the agent's own sealed key
    // (opened by this install) first, its providers[] entry, the accounts.
    if let Ok(Some(inst)) = crate::identity::install::load(&crate::paths::config_dir()) {
        store.unlock(&inst).map_err(|e| at(path, e))?;
    }
    let cfg = store.config_value().map_err(|e| at(path, e))?;
    let settings = accounts::load().map_err(|e| anyhow::anyhow!(e))?;
    let (provider, _) = accounts::resolve_for(&crate::runtime::fleet::config_for_factory(&store, &cfg), &settings)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if cfg.pointer("/model/model_id").and_then(|v| v.as_str()).unwrap_or("").is_empty() {
        anyhow::bail!(
            "{}: no model is set: run `adf config set {} model.model_id MODEL`",
            path.display(),
            path.display()
        );
    }
    let owner: Arc<dyn Owner> = if std::io::stdin().is_terminal() { Arc::new(Terminal) } else { Arc::new(Absent) };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let bus = Bus::new();
    let json_mode = out.json;
    let mut ex = Executor::new(store, provider, bus.clone(), owner).map_err(|e| at(path, e))?;
    ex.set_prices(crate::providers::prices::from_settings(&settings));
    let agent_id = ex.agent_id().to_string();
    ex.on_delta(move |e| {
        let mut o = std::io::stdout().lock();
        match (json_mode, e) {
            (false, ModelEvent::TextDelta(t)) => {
                let _ = o.write_all(t.as_bytes());
                let _ = o.flush();
            }
            (true, ModelEvent::TextDelta(t) | ModelEvent::ReasoningDelta(t)) => {
                let k = if matches!(e, ModelEvent::TextDelta(_)) { "text" } else { "thinking" };
                let line = json!({"seq": 0, "event_type": "turn.delta", "timestamp": crate::store::now_ms(),
                    "source": "agent", "agent_id": agent_id, "payload": {"kind": k, "text": t}});
                let _ = writeln!(o, "{line}");
            }
            _ => {}
        }
    });
    let mut sub = bus.subscribe(None, Filter::default());
    let budget_stopped = std::rc::Rc::new(std::cell::Cell::new(false));
    let stopped = budget_stopped.clone();
    let print = move |item: Item| {
        let Item::Event(e) = item else { return };
        if json_mode {
            let _ = writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&e.event).unwrap_or_default());
        } else if e.event.event_type == "tool.started" {
            let p = &e.event.payload;
            let args: String = p["input"].to_string().chars().take(100).collect();
            let _ = writeln!(std::io::stderr().lock(), "\n▸ {} {args}", p["name"].as_str().unwrap_or(""));
        } else if e.event.event_type == "loop.compacted" {
            let p = &e.event.payload;
            let _ = writeln!(
                std::io::stderr().lock(),
                "loop compacted ({}); about {} tokens now",
                p["reason"].as_str().unwrap_or(""),
                p["new_token_count"]
            );
        } else if e.event.event_type == "suspend.requested" && e.event.payload["reason"] == "budget" {
            stopped.set(true);
            let _ = writeln!(std::io::stderr().lock(), "\n{}", e.event.payload["message"].as_str().unwrap_or(""));
        } else if e.event.event_type == "loop.cleared" {
            let _ = writeln!(std::io::stderr().lock(), "loop cleared");
        } else if e.event.event_type == "tool.failed" {
            let r: String = e.event.payload["result"].as_str().unwrap_or("").chars().take(200).collect();
            let _ = writeln!(std::io::stderr().lock(), "  ✗ {r}");
        }
    };
    let mut signaled: Option<&'static str> = None;
    let end = rt.block_on(async {
        ex.recover()?;
        // A hangup (the SSH connection dropped), a kill or ctrl-c ends the
        // turn cleanly: checkpointed as interrupted, the file closed with
        // its marker, no sidecar left.
        let mut stop = crate::runtime::signals::Stops::new();
        let end = {
            let turn = async {
                match work {
                    Work::Chat(message) => ex.chat(message).await,
                    Work::LoopChat(name, message) => ex.side_turn(name, Some(message), "chat").await,
                    Work::Compact(keep) => ex.owner_compact(keep).await,
                    Work::Clear => ex.clear_loop_as_owner().map(|()| TurnEnd::Completed { text: String::new() }),
                    Work::Resolve { task_id, decision } => ex.resume_paused(task_id, decision).await,
                }
            };
            tokio::pin!(turn);
            loop {
                tokio::select! {
                    biased;
                    sig = stop.next() => {
                        if sig == "SIGHUP" {
                            crate::runtime::signals::detach_from_terminal();
                        }
                        signaled = Some(sig);
                        break None;
                    }
                    end = &mut turn => {
                        while let Some(item) = sub.try_next() {
                            print(item);
                        }
                        break Some(end);
                    }
                    Some(item) = sub.next() => print(item),
                }
            }
        };
        match end {
            Some(end) => end,
            None => {
                ex.interrupted(&format!("signal_{}", signaled.unwrap_or("")), "idle");
                Ok(TurnEnd::State { state: "idle".into() })
            }
        }
    });
    // What the turn started in containers stops with this process.
    let me = ex.agent_id().to_string();
    rt.block_on(async {
        let c = crate::runtime::compute::containers::get();
        crate::runtime::compute::release(&me);
        c.settle().await;
    });
    if let Some(sig) = signaled {
        // A prompt may still be reading the terminal: do not wait for it.
        rt.shutdown_background();
        let store = ex.store;
        super::output::close(store)?;
        eprintln!("\nadf: {}: {sig}: the turn was interrupted and the file closed cleanly", path.display());
        return Ok(match sig {
            "SIGINT" => 130,
            "SIGHUP" => 129,
            _ => 143,
        });
    }
    let store = ex.store;
    let end = end.map_err(|e| at(path, e));
    super::output::close(store)?;
    match end? {
        TurnEnd::Completed { .. } | TurnEnd::State { .. } => {
            if !json_mode {
                println!();
            }
            Ok(0)
        }
        TurnEnd::AwaitingOwner { task_id } => {
            eprintln!(
                "\nadf: {}: waiting for the owner on task {task_id}; it stays pending in the file",
                path.display()
            );
            Ok(EXIT_AWAITING_OWNER)
        }
        TurnEnd::Suspended => {
            // A budget says so in the loop (printed as it happened).
            if !budget_stopped.get() {
                eprintln!("\nadf: {}: suspended after limits.max_active_turns model calls", path.display());
            }
            Ok(EXIT_AWAITING_OWNER)
        }
        TurnEnd::Failed { error, state } => anyhow::bail!("{}: {error} (agent is now {state})", path.display()),
    }
}
