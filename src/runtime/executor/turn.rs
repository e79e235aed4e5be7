//! The turn loop (runtime.md §2): a turn's checkpoint and first row, then
//! model calls (with backoff retries for transient failures) and tool
//! calls, gated and answered in one row each step, until the model answers
//! in plain text, the agent changes state, or something fails.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::events::{EVENT_TEXT, event_preview};
use super::gate::{Gate, limit, read_guard, strip_reserved};
use super::request::CachedConfig;
use super::{Executor, TurnEnd, clip, media, usage_json};
use crate::protocol::kind;
use crate::providers::{ErrorKind, ModelEvent, ModelRequest, ProviderError, Response};
use crate::runtime::prompt;
use crate::store::StoreError;
use crate::tools;

impl Executor {
    pub(super) async fn turn(&mut self, text: Option<&str>, event_type: &str) -> Result<TurnEnd, StoreError> {
        self.turn_with(text, event_type, &[]).await
    }

    pub(super) async fn turn_with(
        &mut self,
        text: Option<&str>,
        event_type: &str,
        resume_calls: &[Value],
    ) -> Result<TurnEnd, StoreError> {
        if resume_calls.is_empty() {
            self.settle_dangling()?;
        }
        self.knowledge_checked = false;
        let turn_id = self.next_turn_id.take().unwrap_or_else(|| format!("turn_{}", crate::store::create::nanoid(10)));
        let now = crate::store::now_ms();
        let cp = json!({"id": turn_id, "status": "in_progress", "started_at": now, "updated_at": now,
            "event_type": event_type, "scope": "agent", "replay": "not_attempted"});
        self.current = Some((turn_id.clone(), now, event_type.to_string()));
        self.cp_final = false;
        match text {
            // The checkpoint goes in with the turn's first row: one commit.
            Some(text) => {
                self.cp = Some(cp);
                self.cp_pending = true;
                self.user_text(text)?;
            }
            None => self.checkpoint(&cp),
        }
        self.set_state("active");
        let end = self.run_loop(&turn_id, resume_calls).await;
        self.store.hold_view(false);
        self.current = None;
        let end = match end {
            Ok(e) => e,
            Err(e) => {
                self.finish_checkpoint(&turn_id, now, event_type, "failed", Some("turn_error"));
                self.set_state("error");
                let _ = self.log("error", "executor", "turn_error", &e.to_string());
                return Err(e);
            }
        };
        let (status, reason, state) = match &end {
            TurnEnd::Completed { .. } => ("completed", None, "idle".to_string()),
            TurnEnd::State { state } => ("completed", None, state.clone()),
            TurnEnd::AwaitingOwner { .. } => ("awaiting_owner", None, "idle".to_string()),
            TurnEnd::Suspended => ("interrupted", Some("suspended"), "suspended".to_string()),
            TurnEnd::Failed { state, .. } => ("failed", Some("provider_error"), state.to_string()),
        };
        if !std::mem::take(&mut self.cp_final) {
            self.finish_checkpoint(&turn_id, now, event_type, status, reason);
        }
        let content = match &end {
            TurnEnd::Completed { text } => text.clone(),
            _ => String::new(),
        };
        self.emit(
            kind::TURN_COMPLETED,
            &format!("agent:{turn_id}"),
            json!({"filePath": self.store.path().display().to_string(), "content": content, "targetState": state}),
        );
        self.set_state(&state);
        Ok(end)
    }

    pub(super) async fn run_loop(&mut self, turn_id: &str, resume_calls: &[Value]) -> Result<TurnEnd, StoreError> {
        let source = format!("agent:{turn_id}");
        let mut active_turns: u64 = 0;
        let mut narration = 0;
        let mut image_recovery = false;
        if !resume_calls.is_empty() {
            let cached = self.config()?;
            if let Some(e) = self.answer(resume_calls, &cached, &source).await? {
                return Ok(e);
            }
        }
        loop {
            // Let other agents run between steps once this task has used
            // its share of the scheduler's budget (the SQLite work here is
            // short but never awaits). A plain yield on every step made an
            // instant turn wait for the scheduler to come round, often on
            // another thread.
            tokio::task::consume_budget().await;
            // The reads up to the model call share one answer to "did
            // another connection commit?" (`Store::hold_view`); a
            // compaction lets go of it before it waits on its model.
            self.store.hold_view(true);
            let cached = self.config()?;
            let (cfg, typed) = (&cached.value, &cached.typed);
            let max_turns = typed.limits.as_ref().and_then(|l| l.max_active_turns).flatten();
            if let Some(max) = max_turns
                && active_turns >= max
            {
                self.emit(kind::SUSPEND_REQUESTED, &source, json!({"reason": "max_active_turns"}));
                return Ok(TurnEnd::Suspended);
            }
            active_turns += 1;
            self.compaction_check(cfg, &source).await?;
            let request = self.request(&cached);
            self.store.hold_view(false);
            let request = request?;
            if let Some(over) = self.over_budget(&cached, &request)? {
                return self.budget_stop(&over, &source);
            }
            let model_id = request.model.clone();
            let response = match self.call(cfg, request, &source).await {
                Ok(r) => r,
                // A provider that cannot take the images: once a turn, send
                // the conversation again without them (runtime.md §1.4).
                Err(e) if e.kind == ErrorKind::Structural && self.transcript.has_media() && !image_recovery => {
                    image_recovery = true;
                    self.log("warn", "executor", "turn_error", &clip(&e.to_string(), 300))?;
                    self.transcript.strip_media();
                    self.user_text(&media::recovery_notice(&e.message))?;
                    continue;
                }
                Err(e) if image_recovery && e.kind != ErrorKind::Auth => {
                    self.log("warn", "executor", "image_recovery_followup_error", &clip(&e.to_string(), 300))?;
                    self.user_text(&media::recovery_failed_notice(&e.message))?;
                    return Ok(TurnEnd::Failed { error: e.to_string(), state: "idle" });
                }
                Err(e) => {
                    let state = match e.kind {
                        ErrorKind::Transient => "idle",
                        _ => "error",
                    };
                    let event = if e.kind == ErrorKind::Auth {
                        "provider_credentials_invalid"
                    } else if state == "idle" {
                        "provider_error"
                    } else {
                        "turn_error"
                    };
                    let level = if state == "idle" { "warn" } else { "error" };
                    self.log(level, "executor", event, &e.to_string())?;
                    return Ok(TurnEnd::Failed { error: e.to_string(), state });
                }
            };
            self.settle_spend(cfg, &model_id, &response.usage, "turn")?;
            let tokens = usage_json(&response.usage);
            let model = typed.model.as_ref().and_then(|m| m.model_id.clone()).unwrap_or_default();
            let calls: Vec<Value> = response.tool_calls().cloned().collect();
            let text = response.text();
            let content = Value::Array(response.content);
            if calls.is_empty() && !prompt::is_autonomous(cfg) {
                // The turn ends with this row: its closing checkpoint goes
                // in the same commit.
                let cp = self.closing_checkpoint("completed", None);
                let closed = cp.is_some();
                self.append_cp("assistant", &content, Some(&model), Some(&tokens), cp)?;
                self.cp_final = closed;
                return Ok(TurnEnd::Completed { text });
            }
            let cp = self.touched_checkpoint();
            self.append_cp("assistant", &content, Some(&model), Some(&tokens), cp)?;
            if calls.is_empty() {
                narration += 1;
                if narration >= 4 {
                    self.log("warn", "executor", "narration_loop_break", "4 replies in a row without a tool call")?;
                    return Ok(TurnEnd::Completed { text });
                }
                let nudge = if narration == 1 {
                    "[Continue working autonomously according to your instructions. Control your state with sys_set_state().]"
                } else {
                    "[You replied without calling a tool again. Call a tool to make progress, or yield with sys_set_state(\"idle\").]"
                };
                self.user_text(nudge)?;
                continue;
            }
            narration = 0;
            if let Some(e) = self.answer(&calls, &cached, &source).await? {
                return Ok(e);
            }
        }
    }

    /// Run one assistant step's tool calls in order and answer them in one
    /// row; `Some` when the turn ends here (a state, `respond`, a pause, an
    /// emptied loop).
    pub(super) async fn answer(
        &mut self,
        calls: &[Value],
        cached: &CachedConfig,
        source: &str,
    ) -> Result<Option<TurnEnd>, StoreError> {
        let (cfg, typed) = (&cached.value, &cached.typed);
        let mut results = Vec::new();
        let mut signals = Vec::new();
        let mut end: Option<TurnEnd> = None;
        let mut media = Vec::new();
        for call in calls {
            let id = call["id"].as_str().unwrap_or("").to_string();
            let name = call["name"].as_str().unwrap_or("").to_string();
            let input = call["input"].clone();
            self.emit(kind::TOOL_STARTED, source, json!({"name": name, "id": id, "input": event_preview(&input)}));
            let out = match self.gate_and_run(cfg, typed, &id, &name, &input, source).await? {
                Gate::Done(out) => out,
                Gate::Paused(task_id) => {
                    if !results.is_empty() {
                        self.append("user", &Value::Array(results), None, None)?;
                    }
                    return Ok(Some(TurnEnd::AwaitingOwner { task_id }));
                }
            };
            let mut out = out;
            if name == "sys_fetch" && !out.is_error {
                self.keep_fetched_media(&input, &mut out).await;
            }
            // What the raw result showed, before the guards rewrite it.
            if !out.is_error {
                let m = self.media_for(cfg, &name, &out.content);
                if !m.is_empty() {
                    media.push((id.clone(), m));
                }
            }
            let mut out = limit(typed, &name, read_guard(typed, &name, &input, out));
            if let Some(sig) = out.signal.take() {
                signals.push(sig);
            }
            let ty = if out.is_error { kind::TOOL_FAILED } else { kind::TOOL_COMPLETED };
            self.emit(
                ty,
                source,
                json!({"name": name, "id": id, "result": clip(&out.content, EVENT_TEXT), "isError": out.is_error}),
            );
            self.trigger(
                crate::runtime::triggers::TriggerEvent {
                    ty: "tool_call",
                    source: source.to_string(),
                    data: json!({"toolName": name, "args": strip_reserved(&input), "origin": "agent", "isError": out.is_error}),
                },
                false,
            );
            let mut block = json!({"type": "tool_result", "tool_use_id": id, "content": out.content});
            if out.is_error {
                block["is_error"] = json!(true);
            }
            results.push(block);
            if let Some(s) = out.target_state {
                end = Some(TurnEnd::State { state: s });
            } else if out.end_turn && end.is_none() {
                end = Some(TurnEnd::Completed { text: input["message"].as_str().unwrap_or("").to_string() });
            }
        }
        let cp = self.touched_checkpoint();
        self.append_cp("user", &Value::Array(results), None, None, cp)?;
        for (id, blocks) in media {
            self.transcript.attach_media(&id, blocks);
        }
        // Background calls of a bare executor (no fleet to run them on).
        self.finish_async_calls().await;
        for signal in signals {
            match signal {
                tools::Signal::Compact { instructions } => {
                    self.compact(cfg, instructions.as_deref(), 2, "voluntary loop_compact".into(), source).await?;
                }
                tools::Signal::Clear { start, end: stop } => {
                    if self.clear(cfg, start, stop, source)? {
                        // An empty loop has nothing left to answer.
                        return Ok(Some(TurnEnd::Completed { text: String::new() }));
                    }
                }
            }
        }
        Ok(end)
    }

    /// One model call, with backoff retries for transient failures
    /// (`recovery`: 5 attempts, 15 s doubling, capped at 300 s, ±20 %).
    pub(super) async fn call(
        &mut self,
        cfg: &Value,
        req: ModelRequest,
        source: &str,
    ) -> Result<Response, ProviderError> {
        let r = |k: &str, d: u64| cfg["recovery"][k].as_u64().unwrap_or(d);
        let auto = cfg["recovery"]["auto_retry"].as_bool().unwrap_or(true);
        let (max_attempts, base, max_delay) =
            (r("max_attempts", 5), r("base_delay_ms", 15_000), r("max_delay_ms", 300_000));
        let mut attempt = 0u64;
        loop {
            attempt += 1;
            let started = Instant::now();
            let mut on_delta = self.on_delta.take();
            let provider = self.provider.clone();
            let result = match provider.stream(req.clone()).await {
                Ok(stream) => {
                    let deltas = self.stream_deltas;
                    crate::providers::collect(stream, provider.id(), |e| {
                        if let Some(f) = on_delta.as_mut() {
                            f(e);
                        }
                        if let ModelEvent::TextDelta(t) = e {
                            self.partial.push_str(t);
                        }
                        if deltas {
                            let (k, text) = match e {
                                ModelEvent::TextDelta(t) => ("text", t),
                                ModelEvent::ReasoningDelta(t) => ("thinking", t),
                                _ => return,
                            };
                            self.emit(kind::TURN_DELTA, source, json!({"kind": k, "text": text}));
                        }
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            self.on_delta = on_delta;
            self.partial.clear();
            let ms = started.elapsed().as_millis() as u64;
            match result {
                Ok(resp) => {
                    let mut payload = json!({
                        "provider": self.provider.id(), "model": req.model,
                        "input_tokens": resp.usage.input, "output_tokens": resp.usage.output,
                        "cache_read_tokens": resp.usage.cache_read, "cache_write_tokens": resp.usage.cache_write,
                        "reasoning_tokens": resp.usage.reasoning, "duration_ms": ms,
                        "stop_reason": resp.stop_reason, "call_source": "turn"});
                    if let Some((c, from)) =
                        crate::providers::prices::priced(&self.price_list(), &req.model, &resp.usage)
                    {
                        payload["cost_usd"] = json!(c);
                        payload["cost_source"] = json!(from);
                    }
                    self.emit(kind::LLM_COMPLETED, source, payload);
                    return Ok(resp);
                }
                Err(e) => {
                    self.emit(
                        kind::LLM_FAILED,
                        source,
                        json!({"provider": self.provider.id(), "model": req.model,
                        "duration_ms": ms, "stop_reason": "error", "error": e.message, "call_source": "turn"}),
                    );
                    if e.kind != ErrorKind::Transient || !auto || attempt >= max_attempts {
                        return Err(e);
                    }
                    let exp = base.saturating_mul(1u64 << (attempt - 1).min(20)).min(max_delay);
                    let jitter = 0.8 + rand::random::<f64>() * 0.4;
                    let mut delay = (exp as f64 * jitter) as u64;
                    if let Some(ra) = e.retry_after {
                        delay = delay.max(ra.as_millis() as u64).min(max_delay);
                    }
                    let _ = self.log(
                        "warn",
                        "executor",
                        "provider_error",
                        &format!("{e} (retry {attempt}/{max_attempts} in {delay} ms)"),
                    );
                    self.emit(
                        kind::PROVIDER_RETRY_SCHEDULED,
                        source,
                        json!({"attempt": attempt, "max_attempts": max_attempts,
                        "delay_ms": delay, "next_retry_at": crate::store::now_ms() + delay as i64}),
                    );
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    self.emit(
                        kind::PROVIDER_RETRY_STARTED,
                        source,
                        json!({"attempt": attempt + 1, "max_attempts": max_attempts}),
                    );
                }
            }
        }
    }

    /// Tokens in context: the last call's input + output, else an estimate.
    pub(super) fn token_count(&mut self) -> Result<u64, StoreError> {
        let s = self.session()?;
        Ok(s.last_tokens.unwrap_or(s.chars / 4))
    }
}
