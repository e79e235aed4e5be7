//! What the app drives: the fleet in-process, a daemon it attached to, or
//! several daemons at once (`hosts.rs`: agents keyed `ID@HOST`, each call
//! routed to its host). All take the same protocol commands and give the
//! same event stream, so the app's state machine cannot tell them apart.
//! Quitting an attached app leaves the daemons' agents running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::client::Client;
use crate::protocol::{Command, Envelope};
use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::runtime::bus::{Filter, Item, Subscription};
use crate::runtime::fleet::AgentInfo;

pub enum Backend {
    /// The fleet in this process, served to the CLI on a loopback port.
    Local(crate::daemon::local::LocalApi),
    Remote(Client),
    /// Several daemons (`adf --remote a --remote b`).
    Multi(super::hosts::Hosts),
}

/// Where runtime events come from.
pub enum Feed {
    Local(Subscription),
    Remote(mpsc::UnboundedReceiver<Envelope>),
}

impl Feed {
    pub async fn next(&mut self) -> Option<Envelope> {
        match self {
            Feed::Local(sub) => loop {
                match sub.next().await? {
                    Item::Event(e) => return Some(e.event.clone()),
                    _ => continue,
                }
            },
            Feed::Remote(rx) => rx.recv().await,
        }
    }
}

fn api(e: crate::client::ClientError) -> anyhow::Error {
    anyhow::anyhow!(e)
}

impl Backend {
    /// A client of the control API that runs this agent (the app's own,
    /// or its daemon's) and the agent's id there.
    pub fn api_for<'a>(&self, agent: &'a str) -> anyhow::Result<(Client, &'a str)> {
        match self {
            Backend::Local(l) => Ok((Client::new(&l.url), agent)),
            Backend::Remote(c) => Ok((c.clone(), agent)),
            Backend::Multi(h) => {
                let (host, id) = h.route(agent)?;
                Ok((host.client()?.clone(), id))
            }
        }
    }

    /// The loaded agents and the folder they are grouped under.
    pub async fn agents(&self) -> anyhow::Result<(Vec<AgentInfo>, PathBuf)> {
        match self {
            Backend::Local(l) => Ok((l.fleet().await.list(), l.shared.fleet_dir.clone())),
            Backend::Remote(c) => {
                let list = c.get(&["agents"]).await.map_err(api)?;
                let rt = c.get(&["runtime"]).await.map_err(api)?;
                let infos = list
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| {
                                Some(AgentInfo {
                                    id: x["id"].as_str()?.to_string(),
                                    name: x["name"].as_str().unwrap_or("").to_string(),
                                    handle: x["handle"].as_str().unwrap_or("").to_string(),
                                    path: PathBuf::from(x["filePath"].as_str().unwrap_or("")),
                                })
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok((infos, PathBuf::from(rt["fleetDir"].as_str().unwrap_or(""))))
            }
            // Grouped by host: each path starts with its host's name.
            Backend::Multi(h) => Ok((h.agents().await.into_iter().map(|(a, _)| a).collect(), PathBuf::new())),
        }
    }

    /// The event feed, starting now.
    pub async fn feed(&self) -> anyhow::Result<Feed> {
        match self {
            Backend::Local(l) => Ok(Feed::Local(l.shared.bus.subscribe(None, Filter::default()))),
            Backend::Remote(c) => {
                let rt = c.get(&["runtime"]).await.map_err(api)?;
                let since = rt["eventCursor"].as_u64().unwrap_or(0);
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(follow(c.clone(), since, tx));
                Ok(Feed::Remote(rx))
            }
            Backend::Multi(h) => Ok(Feed::Remote(h.feed())),
        }
    }

    /// Agents whose identity belongs to another owner (local fleets).
    pub async fn foreign(&self) -> Vec<String> {
        match self {
            Backend::Local(l) => l.fleet().await.foreign().iter().cloned().collect(),
            Backend::Remote(_) | Backend::Multi(_) => Vec::new(),
        }
    }

    /// Open an agent's credentials with a password: scrypt on a blocking
    /// thread over a second connection to the file, so neither the app nor
    /// the agent waits; the opened key is shared with the agent's own
    /// connection.
    pub async fn unlock(&mut self, agent: &str, password: String) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                let f = l.fleet().await;
                let id = f.resolve(agent).map_err(anyhow::Error::msg)?;
                let path = f
                    .list()
                    .into_iter()
                    .find(|a| a.id == id)
                    .map(|a| a.path)
                    .ok_or_else(|| anyhow::anyhow!("{agent}: not loaded"))?;
                drop(f);
                let inst = crate::identity::install::current().map_err(anyhow::Error::msg)?;
                let opened = tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
                    let mut s = crate::store::Store::sibling(&path)?;
                    let ok = s.unlock_password(&password, &inst)?;
                    s.close()?;
                    Ok(ok)
                })
                .await??;
                anyhow::ensure!(opened, "wrong password");
                Ok(())
            }
            Backend::Remote(_) | Backend::Multi(_) => {
                anyhow::bail!("unlock it on the daemon's machine: `adf unlock PATH`")
            }
        }
    }

    /// Claim a foreign agent: its new DID.
    pub async fn claim(&mut self, agent: &str) -> anyhow::Result<String> {
        match self {
            Backend::Local(l) => l.fleet().await.claim(agent).await.map_err(anyhow::Error::msg),
            Backend::Remote(_) | Backend::Multi(_) => {
                anyhow::bail!("claim it on the daemon's machine: `adf claim PATH` (then reload it)")
            }
        }
    }

    /// Agents loaded without a working provider: id → why.
    pub async fn unconfigured(&self) -> HashMap<String, String> {
        match self {
            Backend::Local(l) => l.fleet().await.unconfigured().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Backend::Remote(c) => unconfigured_at(c, None).await,
            Backend::Multi(h) => {
                let all = h.hosts.iter().filter(|x| x.status().connected).filter_map(|x| Some((x.client().ok()?, x)));
                let maps = futures_util::future::join_all(all.map(|(c, x)| unconfigured_at(c, Some(&x.name)))).await;
                maps.into_iter().flatten().collect()
            }
        }
    }

    /// Replace an agent's config as the owner (validated by the store:
    /// only issues the old document did not have refuse it), then load the
    /// agent again so its name, provider and model take effect.
    pub async fn write_config(&mut self, agent: &str, config: Value) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let work = OwnerWork(Box::new(move |ex| {
                    let _ = tx.send(ex.store.config_replace(config).map_err(|e| e.to_string()));
                }));
                l.fleet().await.send(agent, AgentCommand::With(work)).map_err(anyhow::Error::msg)?;
                rx.await.map_err(|_| anyhow::anyhow!("{agent}: the agent has stopped"))?.map_err(anyhow::Error::msg)?;
                l.fleet().await.reload(agent).await.map_err(anyhow::Error::msg)?;
            }
            Backend::Remote(_) | Backend::Multi(_) => {
                let (c, agent) = self.api_for(agent)?;
                let url = c.url(&["agents", agent, "config"], &[]).map_err(api)?;
                c.call(reqwest::Method::PUT, url, Some(&config)).await.map_err(api)?;
            }
        }
        Ok(())
    }

    pub async fn command(&mut self, cmd: Command) -> anyhow::Result<()> {
        let c = match self {
            Backend::Local(l) => {
                let mut f = l.fleet().await;
                return match cmd {
                    Command::Start { agent } => f.start(&agent).await.map_err(anyhow::Error::msg),
                    other => f.command(other).map_err(anyhow::Error::msg),
                };
            }
            Backend::Remote(c) => c.clone(),
            Backend::Multi(h) => {
                if matches!(cmd, Command::EmergencyStop) {
                    // Every host it can reach; the others are named.
                    let mut failed = Vec::new();
                    for x in &h.hosts {
                        let Ok(c) = x.client() else { continue };
                        if let Err(e) = Box::pin(remote_command(c, Command::EmergencyStop)).await {
                            failed.push(format!("{}: {e}", x.name));
                        }
                    }
                    anyhow::ensure!(failed.is_empty(), "not every host stopped: {}", failed.join("; "));
                    return Ok(());
                }
                let mut cmd = cmd;
                let key = command_agent(&mut cmd).map(|a| a.clone()).unwrap_or_default();
                let (host, id) = h.route(&key)?;
                if let Some(a) = command_agent(&mut cmd) {
                    *a = id.to_string();
                }
                return remote_command(host.client()?, cmd).await;
            }
        };
        remote_command(&c, cmd).await
    }

    /// Write a file as the owner: through the agent's actor, or the API.
    pub async fn write_file(&self, agent: &str, path: &str, content: String) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let p = path.to_string();
                let work = OwnerWork(Box::new(move |ex| {
                    let r = ex.owner_write(&p, content.as_bytes());
                    let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
                }));
                l.fleet().await.send(agent, AgentCommand::With(work)).map_err(anyhow::Error::msg)?;
                rx.await
                    .map_err(|_| anyhow::anyhow!("{agent}: the agent stopped before writing {path}"))?
                    .map_err(anyhow::Error::msg)
            }
            Backend::Remote(_) | Backend::Multi(_) => {
                let (c, agent) = self.api_for(agent)?;
                let url = c.url(&["agents", agent, "files", "content"], &[("path", path)]).map_err(api)?;
                c.call(reqwest::Method::PUT, url, Some(&json!({"content": content}))).await.map_err(api)?;
                Ok(())
            }
        }
    }

    /// Load a newly created agent file.
    pub async fn load(&mut self, path: &Path) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => l.fleet().await.load(path).map(|_| ()).map_err(anyhow::Error::msg),
            Backend::Remote(c) => {
                c.post(&["agents", "load"], &json!({"filePath": path})).await.map_err(api)?;
                Ok(())
            }
            Backend::Multi(_) => anyhow::bail!(
                "the app is attached to several hosts: create the agent on one (adf --remote NAME new FILE), or move one there (adf move AGENT --to NAME)"
            ),
        }
    }

    /// Load every agent again (new provider settings taken up).
    pub async fn reload_all(&mut self) -> anyhow::Result<()> {
        let (agents, _) = self.agents().await?;
        match self {
            Backend::Local(l) => {
                let mut f = l.fleet().await;
                for a in agents {
                    f.reload(&a.id).await.map_err(anyhow::Error::msg)?;
                }
            }
            Backend::Remote(c) => {
                for a in agents {
                    c.post(&["agents", &a.id, "stop"], &json!({})).await.map_err(api)?;
                    c.post(&["agents", "load"], &json!({"filePath": a.path})).await.map_err(api)?;
                }
            }
            // A daemon's provider settings are its own machine's.
            Backend::Multi(_) => {}
        }
        Ok(())
    }

    /// In-process: stop the agents and close their files. Attached: leave
    /// the daemon's agents running.
    pub async fn shutdown(self) {
        if let Backend::Local(l) = self
            && let Some(f) = l.stop().await
        {
            for e in f.shutdown().await {
                eprintln!("adf: {e}");
            }
        }
    }
}

/// A protocol command sent to a daemon's control API.
async fn remote_command(c: &Client, cmd: Command) -> anyhow::Result<()> {
    let ag = |a: &str, rest: &[&str]| {
        let mut v = vec!["agents".to_string(), a.to_string()];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let (path, body): (Vec<String>, Value) = match cmd {
        Command::SendChat { agent, r#loop, text } if r#loop != "main" => {
            (ag(&agent, &["loops", &r#loop, "chat"]), json!({"text": text}))
        }
        Command::SendChat { agent, text, .. } => (ag(&agent, &["chat"]), json!({"text": text})),
        Command::Interrupt { agent } => (ag(&agent, &["abort"]), json!({})),
        Command::Approve { agent, task_id, always } => {
            (ag(&agent, &["tasks", &task_id, "resolve"]), json!({"action": "approve", "always": always}))
        }
        Command::Deny { agent, task_id, feedback } => {
            (ag(&agent, &["tasks", &task_id, "resolve"]), json!({"action": "deny", "reason": feedback}))
        }
        Command::Answer { agent, request_id, text } => {
            (ag(&agent, &["asks", &request_id, "respond"]), json!({"answer": text}))
        }
        Command::Start { agent } => (ag(&agent, &["start"]), json!({})),
        Command::Stop { agent } => (ag(&agent, &["state"]), json!({"state": "off"})),
        Command::SetState { agent, state } => (ag(&agent, &["state"]), json!({"state": state})),
        Command::EmergencyStop => {
            let list = c.get(&["agents"]).await.map_err(api)?;
            for id in list.as_array().into_iter().flatten().filter_map(|a| a["id"].as_str()) {
                c.post(&["agents", id, "state"], &json!({"state": "off"})).await.map_err(api)?;
            }
            return Ok(());
        }
    };
    let segs: Vec<&str> = path.iter().map(String::as_str).collect();
    c.post(&segs, &body).await.map_err(api)?;
    Ok(())
}

/// The protocol command's agent, where it names one.
fn command_agent(cmd: &mut Command) -> Option<&mut String> {
    match cmd {
        Command::SendChat { agent, .. }
        | Command::Interrupt { agent }
        | Command::Approve { agent, .. }
        | Command::Deny { agent, .. }
        | Command::Answer { agent, .. }
        | Command::Start { agent }
        | Command::Stop { agent }
        | Command::SetState { agent, .. } => Some(agent),
        Command::EmergencyStop => None,
    }
}

/// Agents a daemon loaded without a working provider (keyed for `host`).
async fn unconfigured_at(c: &Client, host: Option<&str>) -> HashMap<String, String> {
    let Ok(rt) = c.get(&["runtime"]).await else { return HashMap::new() };
    rt["agents"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|a| a["provider_configured"] == false)
        .filter_map(|a| {
            let id = a["id"].as_str()?;
            let id = host.map(|h| super::hosts::key(id, h)).unwrap_or_else(|| id.to_string());
            Some((id, "no model provider is set on the daemon".to_string()))
        })
        .collect()
}

/// Follow a daemon's event stream into a channel, reconnecting with
/// `Last-Event-ID` so nothing is lost across a drop.
async fn follow(c: Client, mut since: u64, tx: mpsc::UnboundedSender<Envelope>) {
    use futures_util::StreamExt;
    loop {
        let Ok(url) = c.url(&["events"], &[]) else { return };
        let resp = c.request(reqwest::Method::GET, url).header("last-event-id", since.to_string()).send().await;
        if let Ok(resp) = resp
            && resp.status().is_success()
        {
            let mut stream = resp.bytes_stream();
            let mut buf = String::new();
            while let Some(Ok(chunk)) = stream.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
                    if let Some(cur) = v["cursor"].as_u64() {
                        since = cur;
                    }
                    if let Ok(e) = serde_json::from_value::<Envelope>(v["event"].clone())
                        && tx.send(e).is_err()
                    {
                        return;
                    }
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
