//! Where the app reads agents from: their files directly (read-only
//! connections beside the in-process runtime's writers), or a daemon's
//! control API when the app is attached to one. The app's state machine
//! sees only this trait, so both look the same on screen.

use std::collections::HashMap;

use base64::Engine;
use serde_json::Value;

use crate::client::Client;
use crate::runtime::fleet::AgentInfo;
use crate::store::Store;
use crate::store::files::{FileEntry, Protection};
use crate::store::loop_rows::LoopRow;
use crate::store::tasks::Task;

pub trait Source: Send {
    /// Start reading these agents (new ones opened, others kept).
    fn open(&mut self, agents: &[AgentInfo]);
    fn config(&self, id: &str) -> Option<Value>;
    fn loop_after(&self, id: &str, seq: i64) -> Vec<LoopRow>;
    fn inbox_unread(&self, id: &str) -> u64;
    fn tasks(&self, id: &str, status: &str) -> Vec<Task>;
    fn files(&self, id: &str) -> Vec<FileEntry>;
    fn file_stat(&self, id: &str, path: &str) -> Option<FileEntry>;
    /// A file's text, or `None` when it is missing or not text.
    fn file_text(&self, id: &str, path: &str) -> Option<String>;
    /// A file's bytes, whatever it holds (a screenshot for the compute panel).
    fn file_bytes(&self, id: &str, path: &str) -> Option<Vec<u8>>;
    /// Inbox rows, newest first (at most 200).
    fn inbox(&self, id: &str) -> Vec<Value>;
    /// The agent's MCP servers with their live status (the runtime knows
    /// it, not the file: read through the control API).
    fn mcp(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// The agent's skills index (`{skills, invalid}`).
    fn skills(&self, _id: &str) -> Value {
        Value::Null
    }
    /// The mesh server's base URL, where served agents are (`None`: not
    /// running, or unknown here).
    fn mesh_url(&self) -> Option<String> {
        None
    }
    /// The agent's side loops (their definitions and status).
    fn loops(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// A side loop's rows after `seq`.
    fn side_after(&self, _id: &str, _name: &str, _seq: i64) -> Vec<LoopRow> {
        Vec::new()
    }
    /// The context gauge of a loop (`None`: main), as `adf context --json`.
    fn context(&self, _id: &str, _lp: Option<&str>) -> Value {
        Value::Null
    }
    /// The agent's budgets and what they spent (`adf usage`'s `budgets`).
    fn budgets(&self, _id: &str) -> Vec<crate::runtime::budget::BudgetUse> {
        Vec::new()
    }
    /// Why an agent is awake or stuck (`adf why --json`).
    fn why(&self, _id: &str) -> Value {
        Value::Null
    }
    /// An agent's newest log rows, oldest first.
    fn logs(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// An agent's tasks, newest first (every status).
    fn task_rows(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// An agent's live grants.
    fn grants(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// How the agent's channel adapters are doing.
    fn channels(&self, _id: &str) -> Vec<Value> {
        Vec::new()
    }
    /// Whether agents are read when first shown rather than all at once
    /// (their source is far away and they are many).
    fn lazy(&self) -> bool {
        false
    }
    /// The compute panel: read from the agent's config, logs and files.
    fn compute(&self, id: &str) -> Value {
        let cfg = self.config(id).unwrap_or_default();
        let s = crate::runtime::compute::Settings::load();
        let engine = crate::runtime::compute::engine::cached_ok().unwrap_or(true);
        crate::runtime::compute::summary::view(&cfg, &s, engine, &self.logs(id), &self.files(id), Value::Null)
    }
    /// What this app's token may do (in-process: everything).
    fn role(&self) -> crate::daemon::roles::Role {
        crate::daemon::roles::Role::Owner
    }
    /// The fleet's budget with what the fleet spent (none set: `None`), and
    /// what went wrong with the usage ledger, once. This process's own
    /// ledger by default.
    fn fleet(&self) -> (Option<crate::runtime::budget::BudgetUse>, Option<String>) {
        let Some(l) = crate::ledger::global() else { return (None, None) };
        let budget = l.settings().1.map(|budget| crate::runtime::budget::BudgetUse {
            scope: crate::runtime::budget::FLEET.into(),
            budget,
            spent: l.fleet_spent(),
        });
        (budget, l.take_notice())
    }
}

/// The agents' files, read directly; the app's own control API for what
/// only the runtime knows.
#[derive(Default)]
pub struct Local {
    readers: HashMap<String, Store>,
    pub api: Option<Remote>,
}

impl Local {
    /// Files read directly, live state through the app's own API.
    pub fn with_api(client: Client) -> Local {
        Local { readers: HashMap::new(), api: Some(Remote::new(client)) }
    }
}

impl Source for Local {
    fn open(&mut self, agents: &[AgentInfo]) {
        for a in agents {
            if !self.readers.contains_key(&a.id)
                && let Ok(s) = Store::open_read_only(&a.path)
            {
                self.readers.insert(a.id.clone(), s);
            }
        }
    }
    fn config(&self, id: &str) -> Option<Value> {
        self.readers.get(id)?.config_value().ok()
    }
    fn loop_after(&self, id: &str, seq: i64) -> Vec<LoopRow> {
        self.readers.get(id).and_then(|s| s.loop_rows_after(seq).ok()).unwrap_or_default()
    }
    fn inbox_unread(&self, id: &str) -> u64 {
        self.readers.get(id).and_then(|s| s.inbox_unread().ok()).unwrap_or(0)
    }
    fn tasks(&self, id: &str, status: &str) -> Vec<Task> {
        self.readers.get(id).and_then(|s| s.task_list(Some(status)).ok()).unwrap_or_default()
    }
    fn files(&self, id: &str) -> Vec<FileEntry> {
        self.readers.get(id).and_then(|s| s.file_list("").ok()).unwrap_or_default()
    }
    fn file_stat(&self, id: &str, path: &str) -> Option<FileEntry> {
        self.readers.get(id)?.file_stat(path).ok().flatten()
    }
    fn file_text(&self, id: &str, path: &str) -> Option<String> {
        self.readers.get(id)?.file_read_text(path).ok()
    }
    fn file_bytes(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        self.readers.get(id)?.file_read(path).ok().map(|(_, b)| b)
    }
    fn inbox(&self, id: &str) -> Vec<Value> {
        let rows = self.readers.get(id).and_then(|s| s.inbox_list(None, Some(200)).ok()).unwrap_or_default();
        rows.into_iter().map(Value::Object).collect()
    }
    fn mcp(&self, id: &str) -> Vec<Value> {
        self.api.as_ref().map(|a| a.mcp(id)).unwrap_or_default()
    }
    fn loops(&self, id: &str) -> Vec<Value> {
        let list = self.readers.get(id).and_then(|s| s.loops_list().ok()).unwrap_or_default();
        list.iter().map(crate::store::loops::to_json).collect()
    }
    fn side_after(&self, id: &str, name: &str, seq: i64) -> Vec<LoopRow> {
        self.readers.get(id).and_then(|s| s.side_rows_after(name, seq).ok()).unwrap_or_default()
    }
    fn context(&self, id: &str, lp: Option<&str>) -> Value {
        self.readers.get(id).map(|s| super::context::measure(s, lp)).unwrap_or(Value::Null)
    }
    fn budgets(&self, id: &str) -> Vec<crate::runtime::budget::BudgetUse> {
        self.readers.get(id).and_then(|s| crate::runtime::budget::in_use(s).ok()).unwrap_or_default()
    }
    fn why(&self, id: &str) -> Value {
        // The app's own API knows the live state; the file, the rest.
        if let Some(v) = self.api.as_ref().and_then(|a| a.get(&["agents", id, "why"], &[])) {
            return v;
        }
        self.readers.get(id).and_then(|s| crate::runtime::why::explain(s, None).ok()).unwrap_or(Value::Null)
    }
    fn logs(&self, id: &str) -> Vec<Value> {
        let q = crate::store::logs::LogQuery { level: None, origin: None, after: 0, limit: 200 };
        let rows = self.readers.get(id).and_then(|s| s.log_list(&q).ok()).unwrap_or_default();
        rows.into_iter().filter_map(|r| serde_json::to_value(r).ok()).collect()
    }
    fn channels(&self, id: &str) -> Vec<Value> {
        self.api.as_ref().map(|a| Source::channels(a, id)).unwrap_or_default()
    }
    fn compute(&self, id: &str) -> Value {
        let cfg = self.config(id).unwrap_or_default();
        let q = crate::store::logs::LogQuery { level: None, origin: Some("compute"), after: 0, limit: 200 };
        let logs: Vec<Value> = self
            .readers
            .get(id)
            .and_then(|s| s.log_list(&q).ok())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        let s = crate::runtime::compute::Settings::load();
        let engine = crate::runtime::compute::engine::cached_ok().unwrap_or(true);
        // This process runs the agent: what runs now is known here.
        let live = crate::runtime::compute::summary::live(id);
        crate::runtime::compute::summary::view(&cfg, &s, engine, &logs, &self.files(id), live)
    }
    fn mesh_url(&self) -> Option<String> {
        self.api.as_ref().and_then(Source::mesh_url)
    }
    fn grants(&self, id: &str) -> Vec<Value> {
        let list = self.readers.get(id).and_then(|s| s.grant_list(false).ok()).unwrap_or_default();
        list.into_iter().filter_map(|g| serde_json::to_value(g).ok()).collect()
    }
    fn task_rows(&self, id: &str) -> Vec<Value> {
        let mut list = self.readers.get(id).and_then(|s| s.task_list(None).ok()).unwrap_or_default();
        list.sort_by_key(|t| std::cmp::Reverse(t.created_at));
        list.truncate(200);
        list.into_iter().filter_map(|t| serde_json::to_value(t).ok()).collect()
    }
    fn skills(&self, id: &str) -> Value {
        let Some(s) = self.readers.get(id) else { return Value::Null };
        let cfg = s.config_value().unwrap_or_default();
        let index = crate::knowledge::skills::index(s, Some(&crate::knowledge::skills::fleet_root()), &cfg);
        serde_json::to_value(index).unwrap_or_default()
    }
}

/// A daemon's control API. Calls block the calling worker briefly (they are
/// loopback round-trips of a few rows), never the other tasks.
pub struct Remote {
    pub client: Client,
    /// How long one read may take before it counts as unanswered.
    limit: std::time::Duration,
}

impl Remote {
    pub fn new(client: Client) -> Remote {
        Remote { client, limit: std::time::Duration::from_secs(30) }
    }

    fn get(&self, segments: &[&str], query: &[(&str, &str)]) -> Option<Value> {
        let url = self.client.url(segments, query).ok()?;
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return None;
        }
        let call = tokio::time::timeout(self.limit, self.client.call(reqwest::Method::GET, url, None));
        tokio::task::block_in_place(|| handle.block_on(call)).ok()?.ok()
    }
}

/// Several daemons (`hosts.rs`): each read goes to its agent's host, with
/// the agent's id there; a host that is down answers nothing at once, so
/// no frame waits on it.
pub struct Multi {
    hosts: Vec<(std::sync::Arc<super::hosts::Host>, Remote)>,
}

impl Multi {
    pub fn new(hosts: &super::hosts::Hosts) -> Multi {
        let hosts = hosts
            .hosts
            .iter()
            .filter_map(|h| {
                let client = h.client().ok()?.clone();
                Some((h.clone(), Remote { client, limit: super::hosts::CALL_LIMIT }))
            })
            .collect();
        Multi { hosts }
    }

    /// `f` on the agent's host with its id there; the default when the
    /// key names no host or its host is down.
    fn at<T: Default>(&self, key: &str, f: impl FnOnce(&Remote, &str) -> T) -> T {
        let Some((id, host)) = super::hosts::split(key) else { return T::default() };
        match self.hosts.iter().find(|(h, _)| h.name == host) {
            Some((h, r)) if h.status().connected => f(r, id),
            _ => T::default(),
        }
    }

    fn up(&self) -> impl Iterator<Item = &(std::sync::Arc<super::hosts::Host>, Remote)> {
        self.hosts.iter().filter(|(h, _)| h.status().connected)
    }
}

impl Source for Multi {
    fn open(&mut self, _agents: &[AgentInfo]) {}
    fn lazy(&self) -> bool {
        true
    }
    fn config(&self, id: &str) -> Option<Value> {
        self.at(id, |r, id| r.config(id))
    }
    fn loop_after(&self, id: &str, seq: i64) -> Vec<LoopRow> {
        self.at(id, |r, id| r.loop_after(id, seq))
    }
    fn inbox_unread(&self, id: &str) -> u64 {
        self.at(id, |r, id| r.inbox_unread(id))
    }
    fn tasks(&self, id: &str, status: &str) -> Vec<Task> {
        self.at(id, |r, id| r.tasks(id, status))
    }
    fn files(&self, id: &str) -> Vec<FileEntry> {
        self.at(id, |r, id| r.files(id))
    }
    fn file_stat(&self, id: &str, path: &str) -> Option<FileEntry> {
        self.at(id, |r, id| r.file_stat(id, path))
    }
    fn file_text(&self, id: &str, path: &str) -> Option<String> {
        self.at(id, |r, id| r.file_text(id, path))
    }
    fn file_bytes(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        self.at(id, |r, id| r.file_bytes(id, path))
    }
    fn inbox(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.inbox(id))
    }
    fn mcp(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.mcp(id))
    }
    fn skills(&self, id: &str) -> Value {
        self.at(id, |r, id| r.skills(id))
    }
    fn loops(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.loops(id))
    }
    fn side_after(&self, id: &str, name: &str, seq: i64) -> Vec<LoopRow> {
        self.at(id, |r, id| r.side_after(id, name, seq))
    }
    fn context(&self, id: &str, lp: Option<&str>) -> Value {
        self.at(id, |r, id| r.context(id, lp))
    }
    fn budgets(&self, id: &str) -> Vec<crate::runtime::budget::BudgetUse> {
        self.at(id, |r, id| r.budgets(id))
    }
    fn why(&self, id: &str) -> Value {
        self.at(id, |r, id| r.why(id))
    }
    fn logs(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.logs(id))
    }
    fn task_rows(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.task_rows(id))
    }
    fn grants(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.grants(id))
    }
    fn channels(&self, id: &str) -> Vec<Value> {
        self.at(id, |r, id| r.channels(id))
    }
    fn compute(&self, id: &str) -> Value {
        self.at(id, |r, id| r.compute(id))
    }
    /// The least any host's token may do: an action shows only where
    /// every host allows it.
    fn role(&self) -> crate::daemon::roles::Role {
        self.up().map(|(_, r)| r.role()).min().unwrap_or(crate::daemon::roles::Role::Observer)
    }
    /// The tightest fleet budget of any host, named.
    fn fleet(&self) -> (Option<crate::runtime::budget::BudgetUse>, Option<String>) {
        let mut best: Option<(f64, crate::runtime::budget::BudgetUse)> = None;
        let mut notices = Vec::new();
        // Every host at once.
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return (None, None) };
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return (None, None);
        }
        let asks = self.up().map(|(h, r)| async move {
            let url = r.client.url(&["usage"], &[("since", "today")]).ok()?;
            let call = r.client.call(reqwest::Method::GET, url, None);
            Some((h, fleet_of(&tokio::time::timeout(r.limit, call).await.ok()?.ok()?)))
        });
        let all = tokio::task::block_in_place(|| handle.block_on(futures_util::future::join_all(asks)));
        for (h, (b, n)) in all.into_iter().flatten() {
            if let Some(n) = n {
                notices.push(format!("{}: {n}", h.name));
            }
            if let Some(b) = b {
                let f = b.tightest().map(|(_, f)| f).unwrap_or(0.0);
                if best.as_ref().is_none_or(|(g, _)| f > *g) {
                    best = Some((f, b));
                }
            }
        }
        (best.map(|(_, b)| b), (!notices.is_empty()).then(|| notices.join("; ")))
    }
}

fn file_entry(v: &Value) -> Option<FileEntry> {
    Some(FileEntry {
        path: v["path"].as_str()?.to_string(),
        size: v["size"].as_u64().unwrap_or(0),
        mime_type: v["mime_type"].as_str().map(str::to_string),
        protection: Protection::parse(v["protection"].as_str().unwrap_or("none")).unwrap_or(Protection::None),
        authorized: v["authorized"].as_bool().unwrap_or(false),
        created_at: v["created_at"].as_str().unwrap_or("").to_string(),
        updated_at: v["updated_at"].as_str().unwrap_or("").to_string(),
    })
}

/// Loop rows as the control API answers them.
fn rows(v: &Value) -> Vec<LoopRow> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    Some(LoopRow {
                        seq: r["seq"].as_i64()?,
                        role: r["role"].as_str()?.to_string(),
                        content: r["content"].clone(),
                        model: r["model"].as_str().map(str::to_string),
                        tokens: Some(r["tokens"].clone()).filter(|t| !t.is_null()),
                        created_at: r["created_at"].as_i64().unwrap_or(0),
                        ord: r["ord"].as_i64(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn task(v: &Value) -> Option<Task> {
    Some(Task {
        id: v["id"].as_str()?.to_string(),
        tool: v["tool"].as_str().unwrap_or("").to_string(),
        args: v["args"].clone(),
        status: v["status"].as_str().unwrap_or("").to_string(),
        result: v["result"].as_str().map(str::to_string),
        error: v["error"].as_str().map(str::to_string),
        created_at: v["created_at"].as_i64().unwrap_or(0),
        completed_at: v["completed_at"].as_i64(),
        origin: v["origin"].as_str().map(str::to_string),
        requires_authorization: v["requires_authorization"].as_bool().unwrap_or(false),
        executor_managed: v["executor_managed"].as_bool().unwrap_or(false),
        approval_meta: Some(v["approval_meta"].clone()).filter(|m| !m.is_null()),
    })
}

impl Source for Remote {
    fn open(&mut self, _agents: &[AgentInfo]) {}
    fn config(&self, id: &str) -> Option<Value> {
        self.get(&["agents", id, "config"], &[]).map(|v| v["config"].clone())
    }
    fn loop_after(&self, id: &str, seq: i64) -> Vec<LoopRow> {
        let after = seq.to_string();
        let Some(v) = self.get(&["agents", id, "loop"], &[("after", &after)]) else { return Vec::new() };
        rows(&v["entries"])
    }
    fn loops(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "loops"], &[]).and_then(|v| v["loops"].as_array().cloned()).unwrap_or_default()
    }
    fn context(&self, id: &str, lp: Option<&str>) -> Value {
        self.get(&["agents", id, "context"], &[("loop", lp.unwrap_or("main"))]).unwrap_or_default()
    }
    fn budgets(&self, id: &str) -> Vec<crate::runtime::budget::BudgetUse> {
        self.get(&["agents", id, "budgets"], &[])
            .and_then(|v| serde_json::from_value(v["budgets"].clone()).ok())
            .unwrap_or_default()
    }
    fn why(&self, id: &str) -> Value {
        self.get(&["agents", id, "why"], &[]).unwrap_or(Value::Null)
    }
    fn logs(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "logs"], &[("limit", "200")])
            .and_then(|v| v["logs"].as_array().cloned())
            .unwrap_or_default()
    }
    fn grants(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "grants"], &[]).and_then(|v| v["grants"].as_array().cloned()).unwrap_or_default()
    }
    fn channels(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "adapters"], &[]).and_then(|v| v["adapters"].as_array().cloned()).unwrap_or_default()
    }
    fn compute(&self, id: &str) -> Value {
        self.get(&["agents", id, "compute"], &[]).map(|v| v["compute"].clone()).unwrap_or_default()
    }
    fn task_rows(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "tasks"], &[("limit", "200")])
            .and_then(|v| v["tasks"].as_array().cloned())
            .unwrap_or_default()
    }
    fn role(&self) -> crate::daemon::roles::Role {
        self.get(&["whoami"], &[])
            .and_then(|v| serde_json::from_value(v["role"].clone()).ok())
            .unwrap_or(crate::daemon::roles::Role::Observer)
    }
    fn mesh_url(&self) -> Option<String> {
        self.get(&["whoami"], &[]).and_then(|v| v["mesh"].as_str().map(str::to_string))
    }
    fn fleet(&self) -> (Option<crate::runtime::budget::BudgetUse>, Option<String>) {
        let Some(v) = self.get(&["usage"], &[("since", "today")]) else { return (None, None) };
        fleet_of(&v)
    }
    fn side_after(&self, id: &str, name: &str, seq: i64) -> Vec<LoopRow> {
        let after = seq.to_string();
        let Some(v) = self.get(&["agents", id, "loops", name, "chat"], &[("after", &after)]) else { return Vec::new() };
        rows(&v["rows"])
    }
    fn inbox_unread(&self, id: &str) -> u64 {
        self.get(&["agents", id, "inbox"], &[("status", "unread")])
            .and_then(|v| v["messages"].as_array().map(|a| a.len() as u64))
            .unwrap_or(0)
    }
    fn tasks(&self, id: &str, status: &str) -> Vec<Task> {
        self.get(&["agents", id, "tasks"], &[("status", status)])
            .and_then(|v| v["tasks"].as_array().map(|a| a.iter().filter_map(task).collect()))
            .unwrap_or_default()
    }
    fn files(&self, id: &str) -> Vec<FileEntry> {
        self.get(&["agents", id, "files"], &[])
            .and_then(|v| v["files"].as_array().map(|a| a.iter().filter_map(file_entry).collect()))
            .unwrap_or_default()
    }
    fn file_stat(&self, id: &str, path: &str) -> Option<FileEntry> {
        self.files(id).into_iter().find(|f| f.path == path)
    }
    fn inbox(&self, id: &str) -> Vec<Value> {
        let mut rows =
            self.get(&["agents", id, "inbox"], &[]).and_then(|v| v["messages"].as_array().cloned()).unwrap_or_default();
        rows.reverse();
        rows.truncate(200);
        rows
    }
    fn mcp(&self, id: &str) -> Vec<Value> {
        self.get(&["agents", id, "mcp"], &[]).and_then(|v| v["servers"].as_array().cloned()).unwrap_or_default()
    }
    fn skills(&self, id: &str) -> Value {
        self.get(&["agents", id, "skills"], &[]).unwrap_or_default()
    }
    fn file_text(&self, id: &str, path: &str) -> Option<String> {
        String::from_utf8(self.file_bytes(id, path)?).ok()
    }
    fn file_bytes(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let v = self.get(&["agents", id, "files", "content"], &[("path", path)])?;
        match v["content"].as_str() {
            Some(t) => Some(t.as_bytes().to_vec()),
            None => base64::engine::general_purpose::STANDARD.decode(v["content_base64"].as_str()?).ok(),
        }
    }
}

/// The fleet budget with what it spent, from a daemon's `/usage`.
fn fleet_of(v: &Value) -> (Option<crate::runtime::budget::BudgetUse>, Option<String>) {
    let budget = serde_json::from_value::<crate::runtime::budget::Budget>(v["fleet"]["budget"].clone()).ok();
    let spent = serde_json::from_value(v["fleet"]["spent"].clone()).unwrap_or_default();
    let fleet = budget.map(|budget| crate::runtime::budget::BudgetUse {
        scope: crate::runtime::budget::FLEET.into(),
        budget,
        spent,
    });
    (fleet, v["notice"].as_str().map(str::to_string))
}
