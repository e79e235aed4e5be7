//! What a new agent is born with: the seeded documents, the default tool
//! declarations and triggers, and the config document in the exact key order
//! the reference's create path writes (format.md §7.2, §7.4, §8, §9).

use serde_json::{Value, json};

/// The README stub: `# <name>`, blank, `Created: <date>`, status line.
pub fn readme(name: &str, date: &str) -> String {
    format!("# {name}\n\nCreated: {date}\nStatus: New agent, self-configuring.\n")
}

/// The working-memory index: heading, one intro line, `## Always`, `## Pages`.
pub const MIND_MD: &str = "# Mind\n\
\n\
The index of what I keep in mind. It is read on every turn, so it stays short; longer notes live in pages under `mind/`.\n\
\n\
## Always\n\
\n\
<!-- Rules that hold on every turn, one line each with the reason. Who I work for and what we are doing now. -->\n\
\n\
## Pages\n\
\n\
<!-- One line per page: - [title](adf-file://mind/page.md) — what it holds -->\n";

/// The mind change log: heading plus one comment on the entry format.
pub const MIND_LOG_MD: &str = "# Mind Log\n\
\n\
<!-- Newest entry first; entries are added at the top and never rewritten. Format: ## [YYYY-MM-DD] ingest|update|lint | title -->\n";

/// The default voice: `# Soul`, intro, `## Voice`, `## Taboos`, `## Exemplars`, `## Origin`.
pub const SOUL_MD: &str = "# Soul\n\
\n\
Voice comes from concrete rules and real samples of writing, not from adjectives. Every new agent starts with this same text; replace it to sound like someone in particular.\n\
\n\
## Voice\n\
\n\
- Plain and direct: say the thing, then stop.\n\
- Disagree openly when something looks wrong, and offer the fix.\n\
- Say \"I don't know\" rather than guess; when I get something wrong, say what and how it was fixed.\n\
\n\
## Taboos\n\
\n\
- No flattery, no apologies as openers, no summaries of what was just said.\n\
\n\
## Exemplars\n\
\n\
<!-- Two or three short samples that sound like me. -->\n\
\n\
## Origin\n\
\n\
<!-- Where I come from and who I work for; filled in as it happens. -->\n";

/// The seeded files of a new agent, in creation order.
pub fn seeded_files(name: &str, date: &str) -> [(&'static str, String); 4] {
    [
        ("README.md", readme(name, date)),
        ("mind.md", MIND_MD.to_string()),
        ("mind/log.md", MIND_LOG_MD.to_string()),
        ("soul.md", SOUL_MD.to_string()),
    ]
}

/// `DEFAULT_TOOLS` of format.md §8: (name, enabled, visible, restricted).
pub const DEFAULT_TOOLS: &[(&str, bool, bool, bool)] = &[
    ("fs_read", true, true, false),
    ("fs_write", true, true, false),
    ("fs_list", true, true, false),
    ("fs_delete", false, false, false),
    ("msg_send", true, true, false),
    ("agent_discover", true, true, false),
    ("msg_list", true, true, false),
    ("msg_read", true, true, false),
    ("msg_update", true, true, false),
    ("chat_info", true, false, false),
    ("sys_code", true, true, false),
    ("sys_lambda", true, true, false),
    ("sys_set_timer", true, true, false),
    ("sys_list_timers", true, true, false),
    ("sys_delete_timer", true, true, false),
    ("sys_get_config", true, true, false),
    ("sys_update_config", true, true, true),
    ("sys_create_adf", false, false, true),
    ("db_query", true, true, false),
    ("db_execute", false, false, false),
    ("loop_compact", false, false, false),
    ("loop_clear", false, false, false),
    ("msg_delete", false, false, false),
    ("say", true, true, false),
    ("ask", true, true, false),
    ("sys_set_state", true, true, false),
    ("sys_get_meta", true, true, false),
    ("sys_set_meta", true, true, false),
    ("sys_delete_meta", true, true, false),
    ("sys_fetch", true, true, false),
    ("adf_shell", false, false, false),
    ("ws_connect", false, false, false),
    ("ws_disconnect", false, false, false),
    ("ws_connections", false, false, false),
    ("ws_send", false, false, false),
    ("stream_bind", false, false, false),
    ("stream_unbind", false, false, false),
    ("stream_bindings", false, false, false),
    ("fs_transfer", false, false, false),
    ("compute_exec", false, false, true),
    ("mcp_install", false, false, false),
    ("mcp_restart", false, false, false),
    ("mcp_uninstall", false, false, false),
];

pub fn tool_declaration(name: &str, enabled: bool, visible: bool, restricted: bool) -> Value {
    let mut t = json!({ "name": name, "enabled": enabled, "visible": visible });
    if restricted {
        t["restricted"] = Value::Bool(true);
    }
    t
}

pub fn default_tools() -> Value {
    Value::Array(DEFAULT_TOOLS.iter().map(|&(n, e, v, r)| tool_declaration(n, e, v, r)).collect())
}

/// The eleven trigger types with their `AGENT_DEFAULTS` (format.md §7.4).
pub fn default_triggers() -> Value {
    json!({
        "on_inbox": { "enabled": true, "targets": [{ "scope": "agent" }] },
        "on_outbox": { "enabled": false, "targets": [] },
        "on_file_change": { "enabled": true, "targets": [
            { "scope": "agent", "filter": { "watch": "README.*" }, "debounce_ms": 2000 }
        ] },
        "on_chat": { "enabled": true, "targets": [{ "scope": "agent" }] },
        "on_timer": { "enabled": true, "targets": [{ "scope": "system" }, { "scope": "agent" }] },
        "on_tool_call": { "enabled": false, "targets": [] },
        "on_task_create": { "enabled": false, "targets": [] },
        "on_task_complete": { "enabled": true, "targets": [{ "scope": "agent" }] },
        "on_logs": { "enabled": false, "targets": [] },
        "on_llm_call": { "enabled": false, "targets": [] },
        "on_startup": { "enabled": false, "targets": [] }
    })
}

/// Options for a new agent's config.
#[derive(Debug, Clone, Default)]
pub struct ConfigSeed<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub description: &'a str,
    pub icon: &'a str,
    pub handle: Option<&'a str>,
    pub provider: &'a str,
    pub model_id: &'a str,
    pub now: &'a str,
}

/// The config document of a new agent, keys in the reference's order.
pub fn new_config(seed: &ConfigSeed<'_>) -> Value {
    let mut top = serde_json::Map::new();
    top.insert("adf_version".into(), json!(super::schema::ADF_FORMAT_VERSION));
    top.insert("id".into(), json!(seed.id));
    top.insert("name".into(), json!(seed.name));
    top.insert("description".into(), json!(seed.description));
    top.insert("icon".into(), json!(seed.icon));
    if let Some(h) = seed.handle {
        top.insert("handle".into(), json!(h));
    }
    let rest = json!({
        "state": "active",
        "autonomous": false,
        "autostart": false,
        "model": { "provider": seed.provider, "model_id": seed.model_id, "temperature": 0.7, "max_tokens": 4096, "vision": false },
        "instructions": "",
        "context": {
            "audit": { "loop": true, "inbox": false, "outbox": false, "files": false },
            "dynamic_instructions": { "inbox_hints": true, "context_warning": true, "idle_reminder": true, "mesh_updates": true }
        },
        "tools": default_tools(),
        "triggers": default_triggers(),
        "security": { "allow_unsigned": true, "level": 1 },
        "limits": {
            "execution_timeout_ms": 60000,
            "max_file_read_tokens": 30000,
            "max_file_write_bytes": 5000000,
            "max_tool_result_tokens": 16000,
            "max_tool_result_preview_chars": 5000,
            "max_active_turns": null,
            "max_image_size_bytes": 5242880,
            "max_audio_size_bytes": 10485760,
            "max_video_size_bytes": 20971520
        },
        "messaging": { "receive": true, "mode": "proactive", "visibility": "localhost", "inbox_mode": true },
        "audit": { "loop": true, "inbox": false, "outbox": false, "files": false },
        "code_execution": {
            "model_invoke": true, "sys_lambda": true, "task_resolve": true, "loop_inject": true,
            "identity_status": true, "get_identity": true, "set_identity": true, "emit_event": true,
            "attestation_list": true, "attestation_add": true, "attestation_issue": true,
            "network": false, "restricted_methods": ["attestation_issue"]
        },
        "compute": { "enabled": false },
        "logging": { "default_level": "info", "rules": [], "max_rows": 10000 },
        "mcp": { "servers": [] },
        "adapters": {},
        "serving": { "shared": { "enabled": false, "patterns": [] }, "public": { "enabled": false }, "api": [] },
        "ws_connections": [],
        "providers": [],
        "locked_fields": [],
        "card": { "endpoints": {} },
        "metadata": { "created_at": seed.now, "updated_at": seed.now }
    });
    if let Value::Object(rest) = rest {
        top.extend(rest);
    }
    Value::Object(top)
}

/// Icons a new agent may be given when none is asked for.
pub const ICONS: &[&str] = &["🦊", "🐺", "🦉", "🐙", "🦀", "🐝", "🦜", "🐢", "🔬", "🛰", "🧭", "🪴"];
