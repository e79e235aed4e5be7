//! The CLI's daemon commands (spec/daemon.md §7): each one route of the
//! control API, printed as a table or text for people and as the raw JSON
//! body with `--json`. Agents are named by id, handle or name.

use reqwest::Method;
use serde_json::{Value, json};

use super::output::Out;
use crate::client::Client;

/// One daemon command.
#[derive(Debug, Clone)]
pub enum Remote {
    Agents,
    Status(String),
    Start(String),
    Stop(String),
    Abort(String),
    Runtime(Option<String>),
    Providers,
    Usage(Option<String>),
    Config(String),
    Files(String),
    File(String, String),
    Inbox(String),
    Outbox(String),
    Timers(String),
    Tasks(String),
    Task(String, String),
    Approve(String, String, bool),
    Deny(String, String, Option<String>),
    Asks(String),
    Answer(String, String, String),
    Events(Option<String>),
    /// Agent, message, and whether to follow the turn to its end.
    Chat(String, String, bool),
    /// A message to a side loop: (agent, loop, text, wait).
    LoopChat(String, String, String, bool),
    /// Agent and the `/trigger` request body.
    Trigger(String, Value),
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `agents/<id>/<rest…>` as path segments.
fn at<'a>(id: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["agents", id];
    v.extend_from_slice(rest);
    v
}

fn iso(v: &Value) -> String {
    v.as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| s(v))
}

/// Key: value lines of an object.
fn kv(out: &Out, v: &Value) -> anyhow::Result<()> {
    if let Some(o) = v.as_object() {
        for (k, x) in o {
            out.line(format!("{k}: {}", s(x)))?;
        }
    }
    Ok(())
}

fn messages(out: &Out, v: &Value) -> anyhow::Result<()> {
    out.table(
        &["ID", "FROM/TO", "STATUS", "CONTENT"],
        &each(&v["messages"], |x| {
            let who = if x["from"].is_null() { s(&x["to"]) } else { s(&x["from"]) };
            let content: String = s(&x["content"]).chars().take(60).collect();
            vec![s(&x["id"]), who, s(&x["status"]), content]
        }),
    )
}

/// Open the event stream (from `since`, for one agent id when given).
use crate::client::{Frames, open_stream};

/// Agent names by id, for lines people read.
async fn names(c: &Client) -> std::collections::HashMap<String, String> {
    let v = c.get(&["agents"]).await.unwrap_or(Value::Null);
    v.as_array()
        .map(|a| a.iter().filter_map(|x| Some((x["id"].as_str()?.to_string(), s(&x["name"])))).collect())
        .unwrap_or_default()
}

/// `adf events [A]`: follow the stream, one line per event (the frame's
/// data with `--json`), until interrupted.
async fn follow(out: &Out, c: &Client, agent: Option<String>) -> anyhow::Result<u8> {
    let mut names = names(c).await;
    let mut frames = Frames::new(open_stream(c, agent.as_deref(), None).await?);
    while let Some(data) = frames.next().await? {
        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        if out.json {
            out.line(&data)?;
        } else if let Some(e) = v.get("event") {
            let t = chrono::DateTime::from_timestamp_millis(e["timestamp"].as_i64().unwrap_or(0))
                .map(|d| d.format("%H:%M:%S%.3f").to_string())
                .unwrap_or_default();
            let id = s(&e["agent_id"]);
            if e["event_type"] == "agent.loaded" || (!names.contains_key(&id) && id != "-") {
                names = self::names(c).await;
            }
            let who = match names.get(&id) {
                Some(n) => format!("{n} ({id})"),
                None => id,
            };
            out.line(format!("{t}  {:<22} {:<26} {}", s(&e["event_type"]), who, e["payload"]))?;
        } else {
            out.line(format!("gap: {data}"))?;
        }
    }
    Ok(0)
}

/// `adf chat NAME MESSAGE` through the daemon: the turn's reply streams to
/// stdout as the model writes it (tool calls on stderr; every event as a
/// JSON line with `--json`), as the in-process `adf chat` does. The stream
/// is opened before the message is sent, from the daemon's current cursor,
/// and the turn is told apart by the id this client chose for it.
async fn chat(out: &Out, c: &Client, agent: &str, lp: Option<&str>, text: &str, wait: bool) -> anyhow::Result<u8> {
    use std::io::Write;
    let status = c.get(&at(agent, &["status"])).await?;
    let id = status["agentId"].as_str().or(status["id"].as_str()).unwrap_or(agent).to_string();
    let name = status["name"].as_str().filter(|n| !n.is_empty()).unwrap_or(agent).to_string();
    if status["state"] == "off" {
        anyhow::bail!("{name} is off; start it with `adf start {name}`");
    }
    let turn = format!("turn_{}", crate::store::create::nanoid(12));
    let route: Vec<&str> = match lp {
        Some(l) => vec!["loops", l, "chat"],
        None => vec!["chat"],
    };
    if !wait {
        let v = c.post(&at(&id, &route), &json!({"text": text, "turnId": turn})).await?;
        return if out.json { out.json(&v).map(|()| 0) } else { out.line(s(&v["turnId"])).map(|()| 0) };
    }
    let cursor = c.get(&["runtime"]).await?["eventCursor"].as_u64();
    let mut frames = Frames::new(open_stream(c, Some(&id), cursor).await?);
    c.post(&at(&id, &route), &json!({"text": text, "turnId": turn})).await?;
    let source = format!("agent:{turn}");
    let mut wrote_text = false;
    let mut last_error: Option<String> = None;
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(600), frames.next()).await;
        let data = match next {
            Ok(Ok(Some(d))) => d,
            Ok(Ok(None)) => anyhow::bail!("the daemon closed the event stream before {name}'s turn ended"),
            Ok(Err(e)) => return Err(e),
            Err(_) => anyhow::bail!("no word from {name}'s turn for 10 minutes; follow it with `adf events {name}`"),
        };
        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        let e = &v["event"];
        if e["source"].as_str() != Some(source.as_str()) {
            continue;
        }
        if out.json {
            out.line(e.to_string())?;
        }
        let p = &e["payload"];
        match e["event_type"].as_str().unwrap_or("") {
            "turn.delta" if !out.json && p["kind"] == "text" => {
                let mut o = std::io::stdout().lock();
                o.write_all(p["text"].as_str().unwrap_or("").as_bytes())?;
                o.flush()?;
                wrote_text = true;
            }
            "tool.started" if !out.json => {
                let args: String = p["input"].to_string().chars().take(100).collect();
                eprintln!("\n> {} {args}", p["name"].as_str().unwrap_or(""));
            }
            "tool.failed" if !out.json => {
                let r: String = p["result"].as_str().unwrap_or("").chars().take(200).collect();
                eprintln!("  x {r}");
            }
            "llm.failed" => last_error = p["error"].as_str().map(str::to_string),
            "hil.requested" | "ask.requested" => {
                let task = s(&p["task_id"]);
                let task = if task == "-" { s(&p["request_id"]) } else { task };
                if !out.json {
                    eprintln!(
                        "\n{name} waits for you on task {task}: `adf approve {name} {task}`, `adf deny {name} {task}`, or answer in the app"
                    );
                }
                return Ok(super::chat::EXIT_AWAITING_OWNER);
            }
            "turn.completed" => {
                if wrote_text && !out.json {
                    println!();
                }
                let state = p["targetState"].as_str().unwrap_or("");
                if state == "error" {
                    anyhow::bail!(
                        "{name}'s turn failed: {} ({name} is now in error)",
                        last_error.unwrap_or_else(|| "see `adf events`".into())
                    );
                }
                return Ok(0);
            }
            _ => {}
        }
    }
}

/// One table row per element of a JSON list.
fn each(list: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array().map(|a| a.iter().map(row).collect()).unwrap_or_default()
}

/// Rows of the named fields of each element.
fn rows(list: &Value, cols: &[&str]) -> Vec<Vec<String>> {
    each(list, |x| cols.iter().map(|c| s(&x[*c])).collect())
}

/// How a command prints its answer for people.
type Printer<'a> = Box<dyn Fn(&Value) -> anyhow::Result<()> + 'a>;

pub fn run(out: &Out, url: Option<&str>, cmd: Remote) -> anyhow::Result<u8> {
    let client = Client::find(url);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(exec(out, &client, cmd))
}

async fn exec(out: &Out, c: &Client, cmd: Remote) -> anyhow::Result<u8> {
    let (v, print): (Value, Printer) = match cmd {
        Remote::Agents => (
            c.get(&["agents"]).await?,
            Box::new(|v| {
                out.table(
                    &["ID", "NAME", "HANDLE", "STATE", "FILE"],
                    &rows(v, &["id", "name", "handle", "state", "filePath"]),
                )
            }),
        ),
        Remote::Status(id) => (c.get(&at(&id, &["status"])).await?, Box::new(|v| kv(out, v))),
        Remote::Start(id) => (c.post(&at(&id, &["start"]), &json!({})).await?, Box::new(|_| out.line("started"))),
        Remote::Stop(id) => {
            (c.post(&at(&id, &["stop"]), &json!({})).await?, Box::new(|_| out.line("stopped and unloaded")))
        }
        Remote::Abort(id) => (c.post(&at(&id, &["abort"]), &json!({})).await?, Box::new(|_| out.line("turn aborted"))),
        Remote::Runtime(None) => (
            c.get(&["runtime"]).await?,
            Box::new(|v| {
                out.line(format!(
                    "pid {}  up {} s  event cursor {}",
                    s(&v["pid"]),
                    v["uptime_ms"].as_u64().unwrap_or(0) / 1000,
                    s(&v["eventCursor"])
                ))?;
                out.table(
                    &["ID", "NAME", "STATE", "PROVIDER"],
                    &each(&v["agents"], |x| {
                        vec![
                            s(&x["id"]),
                            s(&x["name"]),
                            s(&x["state"]),
                            if x["provider_configured"] == true { "ok".into() } else { "not connected".into() },
                        ]
                    }),
                )
            }),
        ),
        Remote::Runtime(Some(id)) => (c.get(&at(&id, &["status"])).await?, Box::new(|v| kv(out, v))),
        Remote::Providers => (
            c.get(&["runtime", "providers"]).await?,
            Box::new(|v| {
                out.table(
                    &["ID", "TYPE", "BASE URL", "KEY"],
                    &each(&v["providers"], |x| {
                        vec![
                            s(&x["id"]),
                            s(&x["type"]),
                            s(&x["baseUrl"]),
                            if x["hasKey"] == true { s(&x["keySource"]) } else { "none".into() },
                        ]
                    }),
                )
            }),
        ),
        Remote::Usage(None) => (
            c.get(&["runtime", "usage"]).await?,
            Box::new(|v| {
                out.table(
                    &["AGENT", "CALLS", "INPUT", "OUTPUT", "COST $"],
                    &each(&v["agents"], |x| {
                        vec![
                            s(&x["agentId"]),
                            s(&x["totals"]["calls"]),
                            s(&x["totals"]["input_tokens"]),
                            s(&x["totals"]["output_tokens"]),
                            format!("{:.4}", x["totals"]["cost_usd"].as_f64().unwrap_or(0.0)),
                        ]
                    }),
                )
            }),
        ),
        Remote::Usage(Some(id)) => (
            c.get(&at(&id, &["usage"])).await?,
            Box::new(|v| {
                let by = v["byModel"].as_object().cloned().unwrap_or_default();
                out.table(
                    &["MODEL", "CALLS", "INPUT", "OUTPUT", "COST $"],
                    &by.iter()
                        .map(|(m, x)| {
                            vec![
                                m.clone(),
                                s(&x["calls"]),
                                s(&x["input_tokens"]),
                                s(&x["output_tokens"]),
                                x["cost_usd"].as_f64().map(|c| format!("{c:.4}")).unwrap_or_else(|| "-".into()),
                            ]
                        })
                        .collect::<Vec<_>>(),
                )
            }),
        ),
        Remote::Config(id) => {
            (c.get(&at(&id, &["config"])).await?, Box::new(|v| out.line(serde_json::to_string_pretty(&v["config"])?)))
        }
        Remote::Files(id) => (
            c.get(&at(&id, &["files"])).await?,
            Box::new(|v| {
                out.table(
                    &["PATH", "SIZE", "MIME", "PROTECTION"],
                    &rows(&v["files"], &["path", "size", "mime_type", "protection"]),
                )
            }),
        ),
        Remote::File(id, path) => {
            let u = c.url(&at(&id, &["files", "content"]), &[("path", &path)])?;
            (
                c.call(Method::GET, u, None).await?,
                Box::new(|v| match v["content"].as_str() {
                    Some(t) => {
                        use std::io::Write;
                        let mut o = std::io::stdout();
                        o.write_all(t.as_bytes())?;
                        Ok(o.flush()?)
                    }
                    None => out.line(s(&v["content_base64"])),
                }),
            )
        }
        Remote::Inbox(id) => (c.get(&at(&id, &["inbox"])).await?, Box::new(|v| messages(out, v))),
        Remote::Outbox(id) => (c.get(&at(&id, &["outbox"])).await?, Box::new(|v| messages(out, v))),
        Remote::Timers(id) => (
            c.get(&at(&id, &["timers"])).await?,
            Box::new(|v| {
                out.table(
                    &["ID", "SCHEDULE", "NEXT WAKE", "RUNS", "SCOPE"],
                    &each(&v["timers"], |x| {
                        vec![
                            s(&x["id"]),
                            s(&x["schedule"]),
                            iso(&x["next_wake_at"]),
                            s(&x["run_count"]),
                            s(&x["scope"]),
                        ]
                    }),
                )
            }),
        ),
        Remote::Tasks(id) => (
            c.get(&at(&id, &["tasks"])).await?,
            Box::new(|v| {
                out.table(
                    &["ID", "TOOL", "STATUS", "CREATED", "ORIGIN"],
                    &each(&v["tasks"], |x| {
                        vec![s(&x["id"]), s(&x["tool"]), s(&x["status"]), iso(&x["created_at"]), s(&x["origin"])]
                    }),
                )
            }),
        ),
        Remote::Task(id, task) => (c.get(&at(&id, &["tasks", &task])).await?, Box::new(|v| kv(out, &v["task"]))),
        Remote::Approve(id, task, always) => (
            c.post(&at(&id, &["tasks", &task, "resolve"]), &json!({"action": "approve", "always": always})).await?,
            Box::new(|_| out.line("approved")),
        ),
        Remote::Deny(id, task, reason) => (
            c.post(&at(&id, &["tasks", &task, "resolve"]), &json!({"action": "deny", "reason": reason})).await?,
            Box::new(|_| out.line("denied")),
        ),
        Remote::Asks(id) => (
            c.get(&at(&id, &["asks"])).await?,
            Box::new(|v| out.table(&["REQUEST", "QUESTION"], &rows(&v["asks"], &["requestId", "question"]))),
        ),
        Remote::Answer(id, req, text) => (
            c.post(&at(&id, &["asks", &req, "respond"]), &json!({"answer": text})).await?,
            Box::new(|_| out.line("answered")),
        ),
        Remote::Chat(id, text, wait) => return chat(out, c, &id, None, &text, wait).await,
        Remote::LoopChat(id, lp, text, wait) => return chat(out, c, &id, Some(&lp), &text, wait).await,
        Remote::Trigger(id, req) => (
            c.post(&at(&id, &["trigger"]), &req).await?,
            Box::new(|v| out.line(format!("accepted ({})", s(&v["turnId"])))),
        ),
        Remote::Events(agent) => return follow(out, c, agent).await,
    };
    if out.json {
        out.json(&v)?
    } else {
        print(&v)?
    }
    Ok(0)
}
