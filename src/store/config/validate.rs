//! Validating a config document (format.md §7.1): every problem as a dotted
//! path and what is wrong there. A write is refused only for problems it
//! introduces (`new_issues`), so a file the reference wrote with a quirk the
//! owner never touched stays writable.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

/// The parts of a budget (`limits.budget`, a loop's budget): dollars are
/// numbers, tokens whole numbers, both at least 0; nothing else.
fn budget_issues(v: &mut V, cfg: &Value, ptr: &str) {
    let dotted = ptr.trim_start_matches('/').replace('/', ".");
    if let Some(Value::Object(b)) = cfg.pointer(ptr) {
        for key in b.keys() {
            match key.as_str() {
                "usd_day" | "usd_total" => v.number(cfg, &format!("{ptr}/{key}"), 0.0, 1e12, false, false),
                "tokens_day" | "tokens_total" => v.number(cfg, &format!("{ptr}/{key}"), 0.0, 1e15, false, true),
                other => v.push(
                    &format!("{dotted}.{other}"),
                    "is not a budget: use usd_day, usd_total, tokens_day or tokens_total",
                ),
            }
        }
    }
}

/// One validation problem: a dotted path and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Issue {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The top-level sections a config may have.
pub const TOP_LEVEL: &[&str] = &[
    "adf_version",
    "id",
    "name",
    "description",
    "icon",
    "handle",
    "reply_to",
    "card",
    "state",
    "start_in_state",
    "autonomous",
    "loop_mode",
    "autostart",
    "model",
    "instructions",
    "include_base_prompt",
    "context",
    "tools",
    "triggers",
    "security",
    "limits",
    "recovery",
    "messaging",
    "audit",
    "code_execution",
    "sandbox",
    "compute",
    "logging",
    "adapters",
    "serving",
    "ws_connections",
    "stream_bind",
    "stream_bindings",
    "umbilical_taps",
    "umbilical",
    "providers",
    "mcp",
    "locked_fields",
    "metadata",
    "loops",
];

pub const TRIGGER_TYPES: &[&str] = &[
    "on_inbox",
    "on_outbox",
    "on_file_change",
    "on_chat",
    "on_timer",
    "on_tool_call",
    "on_task_create",
    "on_task_complete",
    "on_logs",
    "on_llm_call",
    "on_startup",
];

const FILTER_KEYS: &[&str] =
    &["source", "sender", "to", "watch", "include_self", "tools", "status", "level", "origin", "event", "provider"];
const LEVELS: &[&str] = &["debug", "info", "warn", "error"];

struct V {
    issues: Vec<Issue>,
}

impl V {
    fn push(&mut self, path: &str, msg: impl Into<String>) {
        self.issues.push(Issue { path: path.to_string(), message: msg.into() });
    }
    fn string(&mut self, cfg: &Value, ptr: &str, min: usize, max: usize) {
        if let Some(v) = cfg.pointer(ptr) {
            match v.as_str() {
                Some(s) if s.chars().count() < min => {
                    self.push(&dotted(ptr), format!("must be at least {min} character(s)"))
                }
                Some(s) if s.chars().count() > max => {
                    self.push(&dotted(ptr), format!("must be at most {max} characters"))
                }
                Some(_) => {}
                None => self.push(&dotted(ptr), "must be a string"),
            }
        }
    }
    fn boolean(&mut self, cfg: &Value, ptr: &str) {
        if let Some(v) = cfg.pointer(ptr)
            && !v.is_boolean()
        {
            self.push(&dotted(ptr), "must be true or false");
        }
    }
    fn one_of(&mut self, cfg: &Value, ptr: &str, allowed: &[&str]) {
        if let Some(v) = cfg.pointer(ptr)
            && !v.as_str().is_some_and(|s| allowed.contains(&s))
        {
            self.push(&dotted(ptr), format!("must be one of {}", allowed.join(", ")));
        }
    }
    fn number(&mut self, cfg: &Value, ptr: &str, min: f64, max: f64, nullable: bool, integer: bool) {
        if let Some(v) = cfg.pointer(ptr) {
            if v.is_null() && nullable {
                return;
            }
            let ok = match v.as_f64() {
                Some(n) => n >= min && n <= max && (!integer || v.is_i64() || v.is_u64()),
                None => false,
            };
            if !ok {
                let kind = if integer { "an integer" } else { "a number" };
                let null = if nullable { " or null" } else { "" };
                self.push(&dotted(ptr), format!("must be {kind} between {min} and {max}{null}"));
            }
        }
    }
    fn object(&mut self, cfg: &Value, ptr: &str, required: bool) -> bool {
        match cfg.pointer(ptr) {
            Some(Value::Object(_)) => true,
            Some(_) => {
                self.push(&dotted(ptr), "must be an object");
                false
            }
            None => {
                if required {
                    self.push(&dotted(ptr), "is required");
                }
                false
            }
        }
    }
    fn string_list(&mut self, cfg: &Value, ptr: &str) {
        if let Some(v) = cfg.pointer(ptr)
            && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        {
            self.push(&dotted(ptr), "must be a list of strings");
        }
    }
}

fn dotted(ptr: &str) -> String {
    ptr.trim_start_matches('/').replace('/', ".")
}

/// Every schema issue of a config document.
pub fn validate(cfg: &Value) -> Vec<Issue> {
    let mut v = V { issues: Vec::new() };
    if !cfg.is_object() {
        v.push("", "config must be a JSON object");
        return v.issues;
    }
    if cfg.get("adf_version").and_then(Value::as_str) != Some("0.2") {
        v.push("adf_version", "must be \"0.2\"");
    }
    v.string(cfg, "/name", 1, 100);
    if cfg.get("name").is_none() {
        v.push("name", "is required");
    }
    v.string(cfg, "/description", 0, 2000);
    v.string(cfg, "/id", 1, 200);
    if let Some(h) = cfg.get("handle") {
        let ok = h.as_str().is_some_and(|s| {
            s.len() <= 64
                && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
        if !ok {
            v.push("handle", "must match ^[a-z0-9][a-z0-9-]*$ and be at most 64 characters");
        }
    }
    v.one_of(cfg, "/state", &["active", "idle", "hibernate", "suspended", "off"]);
    v.one_of(cfg, "/start_in_state", &["active", "idle", "hibernate"]);
    v.one_of(cfg, "/loop_mode", &["interactive", "autonomous"]);
    v.boolean(cfg, "/autonomous");
    v.boolean(cfg, "/autostart");
    v.boolean(cfg, "/include_base_prompt");
    // The reference's own files carry an empty one, and it accepts them.
    v.string(cfg, "/instructions", 0, usize::MAX);
    if cfg.get("instructions").is_none() {
        v.push("instructions", "is required");
    }
    if v.object(cfg, "/model", true) {
        // Empty: no provider chosen yet (a new agent). Whether a named one
        // exists depends on the install's accounts: `adf config check`.
        v.string(cfg, "/model/provider", 0, 200);
        if cfg.pointer("/model/provider").is_none() {
            v.push("model.provider", "is required");
        }
        v.string(cfg, "/model/model_id", 0, 500);
        v.number(cfg, "/model/temperature", 0.0, 2.0, true, false);
        v.number(cfg, "/model/max_tokens", 1.0, 1e12, true, true);
        v.number(cfg, "/model/top_p", 0.0, 1.0, true, false);
        v.boolean(cfg, "/model/vision");
        v.one_of(cfg, "/model/reasoning/effort", &["minimal", "low", "medium", "high", "xhigh"]);
        v.one_of(cfg, "/model/reasoning/summary", &["auto", "concise", "detailed"]);
    }
    if v.object(cfg, "/context", true) {
        v.number(cfg, "/context/compact_threshold", 0.0, 1e12, true, true);
    }
    validate_tools(&mut v, cfg);
    validate_triggers(&mut v, cfg);
    if v.object(cfg, "/security", true) {
        v.boolean(cfg, "/security/allow_unsigned");
        v.number(cfg, "/security/level", 0.0, 3.0, false, true);
        v.boolean(cfg, "/security/allow_local_fetch");
        v.boolean(cfg, "/security/require_middleware_authorization");
        if let Some(Value::Object(tp)) = cfg.pointer("/security/table_protections") {
            for (t, p) in tp {
                if !p.as_str().is_some_and(|s| ["none", "append_only", "authorized"].contains(&s)) {
                    v.push(&format!("security.table_protections.{t}"), "must be one of none, append_only, authorized");
                }
            }
        }
    }
    if v.object(cfg, "/limits", true)
        && let Some(Value::Object(limits)) = cfg.get("limits")
    {
        for key in limits.keys() {
            let nullable = key == "max_active_turns";
            if key.ends_with("_ms")
                || key.ends_with("_bytes")
                || key.ends_with("_tokens")
                || key.ends_with("_chars")
                || key.ends_with("_turns")
            {
                v.number(cfg, &format!("/limits/{key}"), 0.0, 1e15, nullable, true);
            }
        }
        // `null` is no budget.
        if cfg.pointer("/limits/budget").is_some_and(|b| !b.is_null()) && v.object(cfg, "/limits/budget", false) {
            budget_issues(&mut v, cfg, "/limits/budget");
        }
    }
    if v.object(cfg, "/messaging", true) {
        v.boolean(cfg, "/messaging/receive");
        v.one_of(cfg, "/messaging/mode", &["proactive", "respond_only", "listen_only"]);
        v.one_of(cfg, "/messaging/visibility", &["off", "directory", "localhost", "lan", "public"]);
        v.string_list(cfg, "/messaging/allow_list");
        v.string_list(cfg, "/messaging/block_list");
    }
    if v.object(cfg, "/code_execution", false)
        && let Some(Value::Object(ce)) = cfg.get("code_execution")
    {
        for (k, val) in ce {
            if k == "restricted_methods" {
                v.string_list(cfg, "/code_execution/restricted_methods");
            } else if k != "packages" && !val.is_boolean() {
                v.push(&format!("code_execution.{k}"), "must be true or false");
            }
        }
    }
    if v.object(cfg, "/logging", false) {
        v.one_of(cfg, "/logging/default_level", LEVELS);
        v.number(cfg, "/logging/max_rows", 0.0, 1e15, true, true);
        if let Some(Value::Array(rules)) = cfg.pointer("/logging/rules") {
            for (i, _) in rules.iter().enumerate() {
                v.string(cfg, &format!("/logging/rules/{i}/origin"), 1, 500);
                v.one_of(cfg, &format!("/logging/rules/{i}/min_level"), LEVELS);
            }
        }
    }
    if let Some(Value::Array(api)) = cfg.pointer("/serving/api") {
        for (i, r) in api.iter().enumerate() {
            let p = format!("/serving/api/{i}");
            v.one_of(cfg, &format!("{p}/method"), &["GET", "POST", "PUT", "PATCH", "DELETE", "WS"]);
            if !r.get("lambda").is_some_and(Value::is_string) {
                v.push(&dotted(&format!("{p}/lambda")), "is required (file:function)");
            }
            let first = r
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim_start_matches('/')
                .split('/')
                .next()
                .unwrap_or("");
            if ["inbox", "card", "health"].contains(&first) {
                v.push(&dotted(&format!("{p}/path")), format!("first segment \"{first}\" is reserved"));
            }
        }
    }
    v.string_list(cfg, "/locked_fields");
    if v.object(cfg, "/metadata", true) {
        v.string(cfg, "/metadata/created_at", 1, 100);
        v.string(cfg, "/metadata/updated_at", 1, 100);
    }
    v.issues
}

fn validate_tools(v: &mut V, cfg: &Value) {
    match cfg.get("tools") {
        None => v.push("tools", "is required"),
        Some(Value::Array(tools)) => {
            for (i, t) in tools.iter().enumerate() {
                let p = format!("/tools/{i}");
                if !t.is_object() {
                    v.push(&dotted(&p), "must be an object");
                    continue;
                }
                v.string(cfg, &format!("{p}/name"), 1, 200);
                if t.get("name").is_none() {
                    v.push(&dotted(&format!("{p}/name")), "is required");
                }
                for flag in ["enabled", "visible", "restricted", "locked"] {
                    v.boolean(cfg, &format!("{p}/{flag}"));
                }
            }
        }
        Some(_) => v.push("tools", "must be a list"),
    }
}

fn validate_triggers(v: &mut V, cfg: &Value) {
    let Some(triggers) = cfg.get("triggers") else {
        v.push("triggers", "is required");
        return;
    };
    let Some(triggers) = triggers.as_object() else {
        v.push("triggers", "must be an object");
        return;
    };
    for (ty, t) in triggers {
        let p = format!("triggers.{ty}");
        if !TRIGGER_TYPES.contains(&ty.as_str()) {
            v.push(&p, format!("unknown trigger type (expected one of {})", TRIGGER_TYPES.join(", ")));
            continue;
        }
        if !t.get("enabled").is_some_and(Value::is_boolean) {
            v.push(&format!("{p}.enabled"), "must be true or false");
        }
        let Some(targets) = t.get("targets").and_then(Value::as_array) else {
            v.push(&format!("{p}.targets"), "must be a list");
            continue;
        };
        for (i, tg) in targets.iter().enumerate() {
            let tp = format!("{p}.targets.{i}");
            let scope = tg.get("scope").and_then(Value::as_str);
            if !matches!(scope, Some("system") | Some("agent")) {
                v.push(&format!("{tp}.scope"), "must be system or agent");
            }
            let timing = ["debounce_ms", "interval_ms", "batch_ms"].iter().filter(|k| tg.get(**k).is_some()).count();
            if timing > 1 {
                v.push(&tp, "at most one of debounce_ms, interval_ms, batch_ms");
            }
            if tg.get("batch_count").is_some() && tg.get("batch_ms").is_none() {
                v.push(&format!("{tp}.batch_count"), "requires batch_ms");
            }
            if scope == Some("agent") {
                for k in ["lambda", "command", "warm"] {
                    if tg.get(k).is_some() {
                        v.push(&format!("{tp}.{k}"), "only allowed on system scope");
                    }
                }
            }
            if tg.get("lambda").is_some() && tg.get("command").is_some() {
                v.push(&tp, "lambda and command are mutually exclusive");
            }
            if let Some(filter) = tg.get("filter") {
                match filter.as_object() {
                    Some(f) => {
                        for k in f.keys().filter(|k| !FILTER_KEYS.contains(&k.as_str())) {
                            v.push(&format!("{tp}.filter.{k}"), "unknown filter key");
                        }
                    }
                    None => v.push(&format!("{tp}.filter"), "must be an object"),
                }
            }
        }
    }
}

/// Normalise array indices so that issues are compared by shape.
fn shape(issue: &Issue) -> (String, String) {
    let path = issue
        .path
        .split('.')
        .map(|seg| if seg.chars().all(|c| c.is_ascii_digit()) && !seg.is_empty() { "[]" } else { seg })
        .collect::<Vec<_>>()
        .join(".");
    (path, issue.message.clone())
}

/// The issues `after` has that `before` did not.
pub fn new_issues(before: &Value, after: &Value) -> Vec<Issue> {
    let old: BTreeSet<_> = validate(before).iter().map(shape).collect();
    validate(after).into_iter().filter(|i| !old.contains(&shape(i))).collect()
}
