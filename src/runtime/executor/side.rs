//! Side loops in the executor (runtime.md §12). One executor runs every
//! loop of its agent, one turn at a time: a side loop's turn swaps that
//! loop's session (rows read, transcript, prompt, checkpoint in progress)
//! in for the main loop's, runs the ordinary turn machinery against the
//! loop's own rows, and swaps back. What differs is derived once per
//! config revision: the config a side loop sees has its model and
//! compaction threshold, its tool declarations cut down to its allowlist ∩
//! the agent's enabled set (never a forbidden or restricted tool, so the
//! gate refuses the rest as "not enabled"), and the loop's goal closes its
//! system prompt. Its checkpoints stay in memory (the file's checkpoint
//! key belongs to `main`), and its state is the loop's status, never the
//! agent's.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{CachedConfig, Executor, PromptCache, Session, TurnEnd};
use crate::protocol::kind;
use crate::runtime::inject::InjectQueue;
use crate::runtime::prompt;
use crate::store::StoreError;
use crate::store::config::AgentConfig;
use crate::store::loops::{self, LoopDef, LoopMode, LoopSpec};
use crate::tools::ToolOutput;

/// The side loop whose turn is running.
pub(crate) struct Side {
    pub(crate) def: LoopDef,
    /// Its derived config, for the main config revision it came from.
    cfg: Option<(u64, Arc<CachedConfig>)>,
    status: String,
}

/// What a loop keeps between its turns; the executor's fields hold the
/// running loop's, the rest wait here.
#[derive(Default)]
pub(crate) struct LoopState {
    session: Option<Session>,
    transcript: prompt::Transcript,
    prompt: Option<PromptCache>,
    context_hash: Option<u64>,
    last_dynamic: Option<String>,
    warned: u8,
    flush_done: bool,
    inject: InjectQueue,
    cp: Option<Value>,
    cp_pending: bool,
    cp_final: bool,
    current: Option<(String, i64, String)>,
}

/// Loops waiting to run, and the executor's stash of the others' state.
#[derive(Default)]
pub(crate) struct Loops {
    pub(crate) side: Option<Side>,
    main: Option<LoopState>,
    states: HashMap<String, LoopState>,
    /// Loops a `loop_send` with `wake` asked to run: (loop, event type).
    pub(crate) wakes: Vec<String>,
    /// The loop-mail revision last drained for each loop.
    mail_rev: HashMap<String, u64>,
    /// The running side turn stopped at a budget.
    pub(crate) budget_hit: bool,
}

impl Executor {
    /// The running side loop's name (`None`: `main`).
    pub(crate) fn side_name(&self) -> Option<&str> {
        self.loops.side.as_ref().map(|s| s.def.name.as_str())
    }

    fn swap_state(&mut self, st: &mut LoopState) {
        std::mem::swap(&mut self.session, &mut st.session);
        std::mem::swap(&mut self.transcript, &mut st.transcript);
        std::mem::swap(&mut self.prompt, &mut st.prompt);
        std::mem::swap(&mut self.context_hash, &mut st.context_hash);
        std::mem::swap(&mut self.last_dynamic, &mut st.last_dynamic);
        std::mem::swap(&mut self.warned, &mut st.warned);
        std::mem::swap(&mut self.flush_done, &mut st.flush_done);
        std::mem::swap(&mut self.inject, &mut st.inject);
        std::mem::swap(&mut self.cp, &mut st.cp);
        std::mem::swap(&mut self.cp_pending, &mut st.cp_pending);
        std::mem::swap(&mut self.cp_final, &mut st.cp_final);
        std::mem::swap(&mut self.current, &mut st.current);
    }

    fn enter_side(&mut self, def: LoopDef) {
        self.leave_side();
        let mut st = self.loops.states.remove(&def.name).unwrap_or_default();
        self.swap_state(&mut st);
        self.loops.main = Some(st);
        self.loops.side = Some(Side { def, cfg: None, status: "idle".into() });
    }

    /// Back to `main` (idempotent: the actor calls it after any turn, so
    /// a side turn dropped half-way never leaves its state in place).
    pub fn leave_side(&mut self) {
        let Some(side) = self.loops.side.take() else { return };
        let Some(mut main) = self.loops.main.take() else { return };
        self.swap_state(&mut main);
        self.loops.states.insert(side.def.name, main);
    }

    /// Delete a side loop (its stream archived) and what is kept of it.
    pub fn delete_loop(&mut self, name: &str) -> Result<usize, StoreError> {
        let n = self.store.loop_delete(name)?;
        self.loops.states.remove(name);
        Ok(n)
    }

    /// The loops a `loop_send` asked to wake since the last call.
    pub fn take_loop_wakes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.loops.wakes)
    }

    /// Forget what the loops keep in memory (a park, a deleted loop).
    pub(crate) fn drop_loop_states(&mut self) {
        self.loops.states.clear();
    }

    /// Run one turn of side loop `name`: `text` goes in first (an owner's
    /// message), else the turn starts from its waiting mail.
    pub async fn side_turn(&mut self, name: &str, text: Option<&str>, event_type: &str) -> Result<TurnEnd, StoreError> {
        let Some(def) = self.store.loop_get(name)? else {
            return Err(StoreError::Missing(format!("no loop named {name:?}")));
        };
        if def.status == "paused" {
            return Err(StoreError::Invalid(format!("loop {name:?} is paused; resume it first")));
        }
        if text.is_none() && self.store.loop_mail_waiting(name)? == 0 {
            // Woken for mail a turn of it already read: nothing to do.
            return Ok(TurnEnd::Completed { text: String::new() });
        }
        // A `lint` loop's scheduled run starts from the built-in checks.
        let linted;
        let text = if event_type == "schedule" && def.template.as_deref() == Some("lint") {
            linted = self.scheduled_lint(name, text.unwrap_or("[Scheduled run]"))?;
            Some(linted.as_str())
        } else {
            text
        };
        self.enter_side(def);
        // The owner's `/compact` and `/clear` act on this loop.
        use crate::runtime::slash::{Slash, parse};
        let end = match (event_type, text.map(parse)) {
            ("chat", Some(Slash::Compact(keep))) => self.owner_compact(keep).await,
            ("chat", Some(Slash::Clear)) => {
                self.clear_loop_as_owner().map(|()| TurnEnd::Completed { text: String::new() })
            }
            _ => self.turn_with(text, event_type, &[]).await,
        };
        let status = match &end {
            Ok(TurnEnd::Failed { .. }) | Err(_) => "error",
            _ => "idle",
        };
        self.set_side_status(status);
        if std::mem::take(&mut self.loops.budget_hit) {
            // Paused until the owner raises its budget and resumes it.
            let next = self.loops.side.as_ref().and_then(|s| s.def.next_run_at);
            self.store.loop_set_status(name, "paused", next)?;
            self.loops_changed(name, "paused");
        }
        self.leave_side();
        end
    }

    /// Run the built-in memory linter for loop `name`'s scheduled run:
    /// the owner is told in the log (a warning when it found something)
    /// and on the bus, and the loop's turn opens with the report, so the
    /// model judges what only it can (which side of a contradiction holds).
    fn scheduled_lint(&mut self, name: &str, head: &str) -> Result<String, StoreError> {
        let report = self.store.memory_lint(crate::store::lint::LintOptions::default())?;
        let summary = report.summary();
        let level = if report.is_clean() { "info" } else { "warn" };
        self.log(level, "memory_lint", "lint", &format!("loop {name}: {summary}"))?;
        self.emit(
            kind::LOOP_MEMORY_LINTED,
            "system:executor",
            json!({"loop": name, "summary": summary, "counts": report.counts, "findings": report.findings.len()}),
        );
        Ok(format!(
            "{head}\n\nThe built-in memory lint ran first; its report:\n\n{}\nCheck each finding (memory_cite \
             resolves a citation), fix what you can, and write the report with your judgement to mind/lint.md.",
            report.markdown()
        ))
    }

    /// A state set during a side turn is the loop's status: published as
    /// `loop.state.changed`, stored with the loop when the turn ends.
    pub(crate) fn set_side_status(&mut self, state: &str) -> bool {
        let Some(side) = self.loops.side.as_mut() else { return false };
        let status = match state {
            "active" => "active",
            "error" => "error",
            _ => "idle",
        };
        if side.status != status {
            side.status = status.to_string();
            let name = side.def.name.clone();
            let next = side.def.next_run_at;
            if status != "active" {
                let _ = self.store.loop_set_status(&name, status, next);
            }
            self.emit(kind::LOOP_STATE_CHANGED, "system:executor", json!({"loop": name, "state": status}));
        }
        true
    }

    /// The config a side loop sees (see the module note), derived once per
    /// main config revision.
    pub(super) fn side_config(&mut self, main: Arc<CachedConfig>) -> Arc<CachedConfig> {
        let Some(side) = self.loops.side.as_mut() else { return main };
        if let Some((rev, c)) = &side.cfg
            && *rev == main.rev
        {
            return c.clone();
        }
        let value = side_value(&main.value, &side.def);
        let typed = AgentConfig::from_value(&value).unwrap_or_default();
        let allowed: std::collections::HashSet<String> =
            typed.effective_tools().0.into_iter().filter(|d| d.is_enabled()).map(|d| d.name).collect();
        let tools: Vec<_> = main.tools.iter().filter(|t| allowed.contains(&t.name)).cloned().collect();
        let c = Arc::new(CachedConfig::new(main.rev, value, typed, tools));
        side.cfg = Some((main.rev, c.clone()));
        c
    }

    /// The section that closes a side loop's system prompt.
    pub(crate) fn side_prompt(&self) -> Option<String> {
        self.loops.side.as_ref().map(|s| prompt_section(&s.def))
    }

    /// Append what other loops sent to the running loop, at this model
    /// boundary. Read only when the mail table changed since last time.
    pub(crate) fn drain_loop_mail(&mut self) -> Result<(), StoreError> {
        let rev = self.store.rev(crate::store::revs::Table::LoopMail);
        let name = self.side_name().unwrap_or("main").to_string();
        if self.loops.mail_rev.get(&name) == Some(&rev) {
            return Ok(());
        }
        let mail = self.store.loop_mail_take(&name)?;
        for m in &mail {
            self.user_text(&format!("[Message from loop {}]\n{}", m.sender, m.text))?;
        }
        // Taking the mail changed the table: remember the revision after.
        let rev = self.store.rev(crate::store::revs::Table::LoopMail);
        self.loops.mail_rev.insert(name, rev);
        Ok(())
    }

    /// Side loops due to run on their schedule by `now`; their next run is
    /// set as they are taken.
    pub fn due_loops(&mut self, now: i64) -> Vec<String> {
        let Ok(list) = self.store.loops_list() else { return Vec::new() };
        let mut due = Vec::new();
        for d in list {
            let Some(at) = d.next_run_at else { continue };
            if at > now || d.status == "paused" || d.mode != LoopMode::Scheduled {
                continue;
            }
            let next = d.schedule.as_deref().and_then(|s| loops::next_run(s, now).ok());
            if self.store.loop_set_status(&d.name, &d.status, next).is_ok() {
                due.push(d.name);
            }
        }
        due
    }

    /// The earliest scheduled run of any side loop (for a parked agent).
    pub(crate) fn next_loop_run(&self) -> Option<i64> {
        let list = self.store.loops_list().ok()?;
        list.iter()
            .filter(|d| d.status != "paused" && d.mode == LoopMode::Scheduled)
            .filter_map(|d| d.next_run_at)
            .min()
    }

    /// `loop_send`, `loop_list` and `loop_manage`.
    pub(crate) fn loop_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        match name {
            "loop_send" => self.loop_send(input),
            "loop_list" => self.loop_list(),
            "loop_manage" => self.loop_manage(input),
            _ => ToolOutput::err(format!("Unknown tool: {name}")),
        }
    }

    fn loop_send(&mut self, input: &Value) -> ToolOutput {
        let target = input["loop"].as_str().unwrap_or("");
        let message = input["message"].as_str().unwrap_or("");
        let me = self.side_name().unwrap_or("main").to_string();
        if target == me {
            return ToolOutput::err(format!("loop_send: \"{target}\" is this loop; send to another one"));
        }
        if target != "main" {
            match self.store.loop_get(target) {
                Ok(Some(_)) => {}
                Ok(None) => return ToolOutput::err(format!("loop_send: no loop named \"{target}\" (see loop_list)")),
                Err(e) => return e.into(),
            }
        }
        if let Err(e) = self.store.loop_mail_put(target, &me, message) {
            return e.into();
        }
        let wake = input["wake"].as_bool().unwrap_or(false);
        if wake && !self.loops.wakes.iter().any(|w| w == target) {
            self.loops.wakes.push(target.to_string());
        }
        self.emit(kind::LOOP_MESSAGE_SENT, "system:executor", json!({"from": me, "loop": target, "wake": wake}));
        ToolOutput::ok(format!(
            "Delivered to loop \"{target}\" at its next model boundary{}.",
            if wake { "; it has been woken" } else { "" }
        ))
    }

    fn loop_list(&mut self) -> ToolOutput {
        let list = match self.store.loops_list() {
            Ok(l) => l,
            Err(e) => return e.into(),
        };
        let waiting: HashMap<String, i64> = self.store.loop_mail_counts().unwrap_or_default().into_iter().collect();
        let mut out = vec![
            json!({"name": "main", "mode": "main", "status": self.state, "waiting": waiting.get("main").copied().unwrap_or(0)}),
        ];
        for d in list {
            let mut v = loops::to_json(&d);
            v["waiting"] = json!(waiting.get(&d.name).copied().unwrap_or(0));
            out.push(v);
        }
        ToolOutput::json(&json!({"loops": out}))
    }

    fn loop_manage(&mut self, input: &Value) -> ToolOutput {
        if let Some(me) = self.side_name() {
            return ToolOutput::err(format!("loop_manage is for the main loop only; side loop \"{me}\" cannot use it"));
        }
        let action = input["action"].as_str().unwrap_or("");
        let name = input["name"].as_str().unwrap_or("");
        let spec = match spec_from(input) {
            Ok(s) => s,
            Err(e) => return ToolOutput::err(e),
        };
        let result = match action {
            "create" => self.store.loop_create(name, &spec).map(|d| json!({"created": loops::to_json(&d)})),
            "update" => self.store.loop_update(name, &spec).map(|d| json!({"updated": loops::to_json(&d)})),
            "delete" => self.delete_loop(name).map(|n| json!({"deleted": name, "archived_rows": n})),
            other => return ToolOutput::err(format!("loop_manage: unknown action {other:?} (create, update, delete)")),
        };
        match result {
            Ok(v) => {
                self.loops_changed(name, action);
                ToolOutput::json(&v)
            }
            Err(e) => e.into(),
        }
    }

    /// Say on the bus that a loop was made, changed or deleted (the app
    /// reads its loops again).
    pub fn loops_changed(&mut self, name: &str, change: &str) {
        self.emit(kind::LOOP_STATE_CHANGED, "system:executor", json!({"loop": name, "state": change}));
    }
}

/// The config a side loop sees (see the module note): its model and
/// threshold, tools outside its allowlist or never allowed switched off,
/// not autonomous (a continuous loop turns again from the actor).
pub fn side_value(main: &Value, def: &LoopDef) -> Value {
    let mut value = main.clone();
    if let Some(tools) = value.get_mut("tools").and_then(Value::as_array_mut) {
        for t in tools.iter_mut() {
            let name = t["name"].as_str().unwrap_or("").to_string();
            let enabled = t["enabled"].as_bool().unwrap_or(false);
            let restricted = t["restricted"].as_bool().unwrap_or(false) || crate::tools::always_asks(&name);
            if !loops::allowed(def, &name, enabled, restricted) {
                t["enabled"] = json!(false);
            }
        }
    }
    if let Some(m) = &def.model {
        value["model"]["model_id"] = json!(m);
    }
    if let Some(t) = def.compact_threshold {
        value["context"]["compact_threshold"] = json!(t);
    }
    value["autonomous"] = json!(false);
    if value.get("loop_mode").is_some() {
        value["loop_mode"] = json!("interactive");
    }
    value
}

/// The section that closes a side loop's system prompt.
pub fn prompt_section(def: &LoopDef) -> String {
    let goal = if def.goal.trim().is_empty() { "(no goal set)" } else { def.goal.trim() };
    format!(
        "# Side loop: {}\n\nYou are the side loop \"{}\" of this agent, working beside its main conversation. \
         You share its files, memory and identity, not its conversation. Your goal:\n\n{goal}\n\n\
         Report to the main loop with loop_send({{\"loop\": \"main\", \"message\": …}}) when you have \
         something it needs; end your turn when your work for now is done.",
        def.name, def.name
    )
}

/// A loop spec from `loop_manage`'s (or the API's) input, a template's
/// defaults under what the input sets.
pub fn spec_from(input: &Value) -> Result<LoopSpec, String> {
    let mut spec = match input["template"].as_str() {
        Some(t) => crate::runtime::loop_templates::spec(t)?,
        None => LoopSpec::default(),
    };
    if let Some(g) = input["goal"].as_str() {
        spec.goal = Some(g.to_string());
    }
    if let Some(t) = input.get("tools").and_then(Value::as_array) {
        spec.tools = Some(t.iter().filter_map(Value::as_str).map(str::to_string).collect());
    }
    if let Some(m) = input["model"].as_str() {
        spec.model = Some(m.to_string());
    }
    if let Some(c) = input["compact_threshold"].as_u64() {
        spec.compact_threshold = Some(c);
    }
    match input.get("max_turns") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| format!("max_turns {v}: a whole number of turns, 1 to 1000"))?;
            spec.max_turns = Some(loops::check_max_turns(n)?);
        }
    }
    if let Some(m) = input["mode"].as_str() {
        spec.mode =
            Some(LoopMode::parse(m).ok_or_else(|| format!("mode {m:?}: use reactive, scheduled or continuous"))?);
    }
    // `null` removes a loop's budget on update.
    if let Some(b) = input.get("budget") {
        spec.budget = Some(b.clone());
    }
    if let Some(s) = input["schedule"].as_str() {
        spec.schedule = Some(s.to_string());
        if spec.mode.is_none() {
            spec.mode = Some(LoopMode::Scheduled);
        }
    }
    Ok(spec)
}

/// Whether the config enables `loop_manage`.
pub(crate) fn manages_loops(cfg: &Value) -> bool {
    cfg["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["name"] == "loop_manage" && t["enabled"] == json!(true)))
}

/// Declare `loop_send`, `loop_list`, `memory_cite` and `memory_lint` (enabled) in a config that has
/// side loops (or may make them) and does not declare them itself.
pub(crate) fn declare_loop_tools(cfg: &mut Value) {
    let Some(tools) = cfg.get_mut("tools").and_then(Value::as_array_mut) else { return };
    for name in ["loop_send", "loop_list", "memory_cite", "memory_lint"] {
        if !tools.iter().any(|t| t["name"] == name) {
            tools.push(crate::store::defaults::tool_declaration(name, true, true, false));
        }
    }
}
