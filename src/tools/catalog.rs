//! Tool names, descriptions and input schemas (tools.md). Parameter names
//! are part of the file contract: they are stored in loop rows and lambdas.

use serde_json::{Value, json};

pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: fn() -> Value,
}

macro_rules! tool {
    ($name:literal, $desc:literal, $schema:tt) => {
        ToolDef { name: $name, description: $desc, schema: || json!($schema) }
    };
}

static CATALOG: &[ToolDef] = &[
    tool!("msg_send", "Send a signed message to another agent: by DID or local handle (recipient), by delivery URL (address), or as a reply (parent_id = an inbox message id).", {
        "type": "object",
        "properties": {
            "recipient": {"type": "string", "description": "DID, local handle, or adapter address type:id"},
            "address": {"type": "string", "description": "Delivery URL (mesh inbox)"},
            "content": {"type": "string", "minLength": 1},
            "content_type": {"type": "string"},
            "subject": {"type": "string"},
            "thread_id": {"type": "string"},
            "parent_id": {"type": "string", "description": "Inbox message id being replied to"},
            "attachments": {"type": "array", "items": {"type": "string"}, "description": "File paths to attach"},
            "meta": {"type": "object"},
            "message_meta": {"type": "object"}
        },
        "required": ["content"]
    }),
    tool!("msg_read", "Read inbox messages (newest first); reading unread messages marks them read.", {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["unread", "read", "archived"], "default": "unread"},
            "limit": {"type": "number"},
            "include_original": {"type": "boolean", "default": false}
        }
    }),
    tool!("msg_list", "Count inbox messages by status.", {"type": "object", "properties": {}}),
    tool!("msg_update", "Mark inbox messages read or archived, or delete archived ones.", {
        "type": "object",
        "properties": {
            "message_ids": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "status": {"type": "string", "enum": ["read", "archived", "delete"]}
        },
        "required": ["message_ids", "status"]
    }),
    tool!("msg_delete", "Delete inbox or outbox messages matching a filter.", {
        "type": "object",
        "properties": {
            "source": {"type": "string", "enum": ["inbox", "outbox"]},
            "filter": {"type": "object"}
        },
        "required": ["source", "filter"]
    }),
    tool!("agent_discover", "List the agents you can reach (their cards): on this runtime, or also on known hosts.", {
        "type": "object",
        "properties": {
            "scope": {"type": "string", "enum": ["local", "all"], "default": "local"},
            "visibility": {"type": "array", "items": {"type": "string", "enum": ["directory", "localhost", "lan", "public", "off"]}},
            "handle": {"type": "string"},
            "description": {"type": "string"},
            "include_subdirectories": {"type": "boolean", "default": true}
        }
    }),
    tool!("fs_read", "Read a file of your virtual filesystem (optionally a line range of a text file).", {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Exact file path, e.g. notes/today.md"},
            "start_line": {"type": "integer", "exclusiveMinimum": 0},
            "end_line": {"type": "integer", "exclusiveMinimum": 0}
        },
        "required": ["path"]
    }),
    tool!("fs_write", "Write, append to, or edit a file. mode=write replaces the content, append adds to the end, edit replaces exact text (old_text must occur once unless replace_all; edits[] applies several edits atomically).", {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["write", "edit", "append"]},
            "path": {"type": "string", "minLength": 1},
            "content": {"type": "string"},
            "old_text": {"type": "string", "minLength": 1},
            "new_text": {"type": "string"},
            "replace_all": {"type": "boolean"},
            "edits": {"type": "array", "items": {"type": "object", "properties": {
                "old_text": {"type": "string", "minLength": 1},
                "new_text": {"type": "string"},
                "replace_all": {"type": "boolean"}
            }, "required": ["old_text", "new_text"]}},
            "protection": {"type": "string", "enum": ["read_only", "no_delete", "none"]},
            "encoding": {"type": "string", "enum": ["utf8", "base64"]},
            "mime_type": {"type": "string"}
        },
        "required": ["mode", "path"]
    }),
    tool!("fs_list", "List files, optionally only those whose path starts with prefix.", {
        "type": "object",
        "properties": {"prefix": {"type": "string"}}
    }),
    tool!("fs_delete", "Delete a file (protected files cannot be deleted).", {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}},
        "required": ["path"]
    }),
    tool!("db_query", "Run a read-only SQL query (SELECT/WITH/EXPLAIN) on your local_* tables and the readable adf_* tables.", {
        "type": "object",
        "properties": {"sql": {"type": "string", "minLength": 1}, "params": {"type": "array"}},
        "required": ["sql"]
    }),
    tool!("db_execute", "Run one INSERT, UPDATE, DELETE, CREATE TABLE or DROP TABLE statement on a local_* table.", {
        "type": "object",
        "properties": {"sql": {"type": "string", "minLength": 1}, "params": {"type": "array"}},
        "required": ["sql"]
    }),
    tool!("sys_get_meta", "Read one metadata key, or list all keys.", {
        "type": "object",
        "properties": {"key": {"type": "string"}}
    }),
    tool!("sys_set_meta", "Set a metadata key to a value, or add delta to a numeric key atomically.", {
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 1},
            "value": {"type": "string"},
            "delta": {"type": "number"},
            "protection": {"type": "string", "enum": ["none", "readonly", "increment"]}
        },
        "required": ["key"],
        "oneOf": [{"required": ["value"]}, {"required": ["delta"]}]
    }),
    tool!("sys_delete_meta", "Delete a metadata key.", {
        "type": "object",
        "properties": {"key": {"type": "string", "minLength": 1}},
        "required": ["key"]
    }),
    tool!("sys_get_config", "Read your configuration (secrets redacted), or one section of it.", {
        "type": "object",
        "properties": {"section": {"type": "string", "enum": ["config", "card", "provider_status", "tools", "limits"]}}
    }),
    tool!("sys_update_config", "Change your configuration at a dot path (e.g. tools.fs_delete.enabled).", {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "value": {},
            "action": {"type": "string", "enum": ["set", "append", "remove"]},
            "index": {"type": "integer", "minimum": 0}
        },
        "required": ["path"]
    }),
    tool!("sys_set_state", "Set your state: idle (rest until something happens), hibernate (only timers wake you) or off. Ends the turn.", {
        "type": "object",
        "properties": {"state": {"type": "string", "enum": ["idle", "hibernate", "off"]}},
        "required": ["state"]
    }),
    tool!("sys_set_timer", "Set a timer: once at a time, after a delay, every interval, or on a cron schedule (times in epoch ms).", {
        "type": "object",
        "properties": {
            "schedule": {"type": "object", "properties": {
                "type": {"type": "string", "enum": ["once", "delay", "interval", "cron"]},
                "at": {"type": "integer", "exclusiveMinimum": 0},
                "delay_ms": {"type": "integer", "exclusiveMinimum": 0},
                "every_ms": {"type": "integer", "exclusiveMinimum": 0},
                "start_at": {"type": "integer", "exclusiveMinimum": 0},
                "end_at": {"type": "integer", "exclusiveMinimum": 0},
                "max_runs": {"type": "integer", "exclusiveMinimum": 0},
                "cron": {"type": "string", "minLength": 1}
            }, "required": ["type"]},
            "payload": {"type": "string"},
            "scope": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": ["system", "agent"]}},
            "lambda": {"type": "string"},
            "warm": {"type": "boolean"},
            "locked": {"type": "boolean"}
        },
        "required": ["schedule"]
    }),
    tool!("sys_list_timers", "List your timers.", {
        "type": "object",
        "properties": {"include_expired": {"type": "boolean"}}
    }),
    tool!("sys_delete_timer", "Delete a timer by id.", {
        "type": "object",
        "properties": {"id": {"type": "integer", "exclusiveMinimum": 0}},
        "required": ["id"]
    }),
    tool!("loop_compact", "Summarise your conversation so far into a briefing and continue from it.", {
        "type": "object",
        "properties": {"instructions": {"type": "string"}}
    }),
    tool!("loop_clear", "Clear your conversation loop (archived first when loop audit is on).", {
        "type": "object",
        "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}}
    }),
    tool!("loop_send", "Send a message to another loop of this agent (main or a side loop); it arrives at that loop's next model boundary. wake=true also starts its turn.", {
        "type": "object",
        "properties": {
            "loop": {"type": "string", "minLength": 1, "description": "main, or a side loop's name (see loop_list)"},
            "message": {"type": "string", "minLength": 1},
            "wake": {"type": "boolean", "default": false}
        },
        "required": ["loop", "message"]
    }),
    tool!("memory_cite", "Resolve a [S<seq>] citation to the original loop row it names: from the live loop (main or a side loop) or, after compaction, from the audit archive.", {
        "type": "object",
        "properties": {"citation": {"type": "string", "description": "S123, [S123] or 123"}},
        "required": ["citation"]
    }),
    tool!("memory_lint", "Check the memory pages (mind.md and mind/*.md): [S<seq>] citations that resolve to nothing, links to missing pages, pages no link from mind.md reaches, pages unchanged for stale_days while the agent kept working, and one subject's key: value stated with different values.", {
        "type": "object",
        "properties": {"stale_days": {"type": "integer", "minimum": 1, "maximum": 36500, "default": 30}}
    }),
    tool!("loop_list", "List this agent's loops (main and its side loops) with their mode, schedule, status and waiting messages.", {
        "type": "object",
        "properties": {}
    }),
    tool!("loop_manage", "Create, update or delete a side loop (main loop only). A template (memory, researcher, critic, reflector, lint) gives the goal, tools and schedule; the other fields override it. Deleting archives the loop's stream.", {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["create", "update", "delete"]},
            "name": {"type": "string", "minLength": 1, "maxLength": 32},
            "goal": {"type": "string"},
            "tools": {"type": "array", "items": {"type": "string"}},
            "model": {"type": "string"},
            "compact_threshold": {"type": "integer", "minimum": 1000},
            "mode": {"type": "string", "enum": ["reactive", "scheduled", "continuous"]},
            "schedule": {"type": "string", "description": "A cron expression (0 * * * *) or every <n>s|m|h|d"},
            "max_turns": {"type": "integer", "minimum": 0, "maximum": 1000, "description": "Turns a continuous loop takes on one wake (default 20; 0 restores it)"},
            "template": {"type": "string"}
        },
        "required": ["action", "name"]
    }),
    tool!("respond", "Reply to your principal; in interactive mode this ends the turn.", {
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"]
    }),
    tool!("say", "Tell your principal about progress without ending the turn.", {
        "type": "object",
        "properties": {"message": {"type": "string", "minLength": 1}},
        "required": ["message"]
    }),
    tool!("ask", "Ask your principal a question and wait for the answer.", {
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1}},
        "required": ["question"]
    }),
    tool!("sys_code", "Run JavaScript in a sandbox (the body of an async function: await and return work, a lone expression is the result). Call your tools as await adf.tool_name({...}). No network except adf.sys_fetch.", {
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 1},
            "timeout": {"type": "integer", "minimum": 1000},
            "clear_state": {"type": "boolean", "description": "false keeps variables from the previous sys_code call"}
        },
        "required": ["code"]
    }),
    tool!("sys_lambda", "Call an exported function of a JavaScript or TypeScript file of yours (source \"path/file.ts:fn\", default fn main) with one args object.", {
        "type": "object",
        "properties": {
            "source": {"type": "string", "minLength": 1},
            "args": {"type": "object"},
            "timeout": {"type": "integer", "minimum": 1000}
        },
        "required": ["source"]
    }),
    tool!("sys_fetch", "Make an HTTP request. Private, loopback and metadata addresses are refused unless your owner allows local fetch.", {
        "type": "object",
        "properties": {
            "url": {"type": "string", "minLength": 1},
            "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 60000}
        },
        "required": ["url"]
    }),
    tool!("adf_shell", "Run a shell command line over your own files and tools (a virtual shell: cat ls grep sed jq sqlite3 curl … and adf <tool> '<json>'; pipes, &&, ||, redirects, $VAR, $(…), heredocs, globs). `help` lists the commands. The result is JSON {exit_code, stdout, stderr}.", {
        "type": "object",
        "properties": {"command": {"type": "string", "minLength": 1}},
        "required": ["command"]
    }),
    tool!("sys_create_adf", "Create a new agent file (a child of yours), optionally from a template .adf among your files, with files copied from yours and config overrides.", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "location": {"type": "string", "description": "Folder, relative to yours or absolute"},
            "template": {"type": "string", "description": "Path of a .adf file among your files"},
            "files": {"type": "array", "items": {"type": "object", "properties": {
                "parent_path": {"type": "string", "minLength": 1},
                "child_path": {"type": "string", "minLength": 1}
            }, "required": ["parent_path", "child_path"]}},
            "description": {"type": "string"},
            "instructions": {"type": "string"},
            "icon": {"type": "string"},
            "handle": {"type": "string"},
            "autonomous": {"type": "boolean"},
            "autostart": {"type": "boolean"},
            "start_in_state": {"type": "string", "enum": ["active", "idle", "hibernate"]},
            "model": {"type": "object"},
            "context": {"type": "object"},
            "tools": {"type": "array"},
            "triggers": {"type": "object"},
            "security": {"type": "object"},
            "limits": {"type": "object"},
            "messaging": {"type": "object"},
            "audit": {"type": "object"},
            "code_execution": {"type": "object"},
            "logging": {"type": "object"},
            "mcp": {"type": "object"},
            "adapters": {"type": "object"},
            "serving": {"type": "object"},
            "providers": {"type": "array"},
            "ws_connections": {"type": "array"},
            "locked_fields": {"type": "array", "items": {"type": "string"}},
            "card": {"type": "object"},
            "metadata": {"type": "object"}
        },
        "required": ["name"]
    }),
    tool!("fs_transfer", "Copy a file or folder between your files (vfs) and a compute workspace (isolated, shared, host).", {
        "type": "object",
        "properties": {
            "from": {"type": "string", "enum": ["vfs", "isolated", "shared", "host"]},
            "to": {"type": "string", "enum": ["vfs", "isolated", "shared", "host"]},
            "path": {"type": "string", "minLength": 1},
            "save_as": {"type": "string"}
        },
        "required": ["from", "to", "path"]
    }),
    tool!("adapter_setup", "Switch a channel on for yourself with a bot token (email: the account's password) you were given (the owner approves it once; the secret is sealed and never shown again). WhatsApp takes no token: the channel shows the owner a QR code to scan with the phone.", {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["telegram", "email", "slack", "discord", "whatsapp"]},
            "token": {"type": "string", "minLength": 1, "description": "required except for whatsapp"},
            "app_token": {"type": "string", "description": "slack: the app-level token (xapp-…) for Socket Mode; token is the bot token (xoxb-…)"},
            "address": {"type": "string", "description": "email: your address; the provider's servers are guessed from it"},
            "username": {"type": "string", "description": "email: the login, when it is not the address"},
            "imap": {"type": "string", "description": "email: imaps://host:port (TLS) or imap://host:port (STARTTLS)"},
            "smtp": {"type": "string", "description": "email: smtps://host:port (TLS) or smtp://host:port (STARTTLS)"},
            "dm": {"type": "string", "enum": ["all", "allowlist", "none"]},
            "groups": {"type": "string", "enum": ["all", "mention", "none"]},
            "allow_from": {"type": "array", "items": {"type": "string"}},
            "api_url": {"type": "string"}
        },
        "required": ["type"]
    }),
    tool!("chat_info", "Describe a chat of a connected channel adapter: title, description, participants.", {
        "type": "object",
        "properties": {
            "adapter": {"type": "string", "minLength": 1},
            "chat_id": {"type": "string", "minLength": 1},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100}
        },
        "required": ["adapter", "chat_id"]
    }),
    tool!("compute_exec", "Run a command in a compute environment (a container or the host).", {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "timeout_ms": {"type": "integer", "exclusiveMinimum": 0, "maximum": 120000},
            "target": {"type": "string"}
        },
        "required": ["command"]
    }),
    tool!("browser", "Drive your web browser (Chromium, with a profile of your own): open a page, click or type into an element (CSS selector), read its text, take a screenshot, go back, hand it to your owner for a login (takeover), close it (your profile is then sealed into your credentials).", {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["open", "click", "type", "read", "screenshot", "back", "takeover", "close"]},
            "url": {"type": "string", "description": "open: an http or https URL"},
            "selector": {"type": "string", "description": "click, type, read: a CSS selector (read: the whole page without one)"},
            "text": {"type": "string", "description": "type: what to type"},
            "submit": {"type": "boolean", "description": "type: press Enter after"},
            "full_page": {"type": "boolean", "description": "screenshot: the whole page, not only the window"},
            "reason": {"type": "string", "description": "takeover: why the owner is needed"},
            "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 120000}
        },
        "required": ["action"]
    }),
    tool!("desktop", "Use your desktop (an X display of 1280x800 your owner can watch): take a screenshot, click, move, scroll, type, press keys (xdotool names such as ctrl+l Return), read or set the clipboard, or get a VNC address for your owner (watch). Programs you start with compute_exec on the host appear on it.", {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["screenshot", "click", "double_click", "move", "scroll", "type", "key", "clipboard_get", "clipboard_set", "cursor", "watch"]},
            "x": {"type": "integer", "minimum": 0, "maximum": 1279},
            "y": {"type": "integer", "minimum": 0, "maximum": 799},
            "button": {"type": "string", "enum": ["left", "middle", "right"]},
            "direction": {"type": "string", "enum": ["up", "down"]},
            "amount": {"type": "integer", "minimum": 1, "maximum": 50},
            "text": {"type": "string"},
            "keys": {"type": "string"}
        },
        "required": ["action"]
    }),
    tool!("ws_connect", "Open a WebSocket connection (a configured one by id, or a URL).", {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "url": {"type": "string"},
            "did": {"type": "string"},
            "lambda": {"type": "string"},
            "persist": {"type": "boolean"},
            "auto_reconnect": {"type": "boolean"},
            "reconnect_delay_ms": {"type": "integer"},
            "keepalive_interval_ms": {"type": "integer"}
        }
    }),
    tool!("ws_disconnect", "Close a WebSocket connection.", {
        "type": "object",
        "properties": {"connection_id": {"type": "string"}, "id": {"type": "string"}}
    }),
    tool!("ws_connections", "List open WebSocket connections.", {
        "type": "object",
        "properties": {"direction": {"type": "string", "enum": ["inbound", "outbound"]}}
    }),
    tool!("ws_send", "Send data on a WebSocket connection.", {
        "type": "object",
        "properties": {
            "connection_id": {"type": "string"},
            "data": {"type": "string"},
            "binary": {"type": "boolean"}
        },
        "required": ["connection_id", "data"]
    }),
    tool!("stream_bind", "Bind two stream endpoints so bytes flow between them.", {
        "type": "object",
        "properties": {
            "a": {"type": "object"},
            "b": {"type": "object"},
            "bidirectional": {"type": "boolean"},
            "options": {"type": "object"}
        },
        "required": ["a", "b"]
    }),
    tool!("stream_unbind", "Remove a stream binding.", {
        "type": "object",
        "properties": {"binding_id": {"type": "string"}},
        "required": ["binding_id"]
    }),
    tool!("stream_bindings", "List stream bindings.", {"type": "object", "properties": {}}),
    tool!("mcp_install", "Install and connect an MCP server; its tools become yours (approval-gated).", {
        "type": "object",
        "properties": {
            "package": {"type": "string"},
            "type": {"type": "string", "enum": ["npm", "pypi", "custom", "http"]},
            "url": {"type": "string"},
            "name": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
            "host": {"type": "boolean"},
            "env_keys": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "header_env": {"type": "array"},
            "bearer_token_env_var": {"type": "string"},
            "auth": {"type": "boolean"},
            "auth_args": {"type": "array", "items": {"type": "string"}}
        }
    }),
    tool!("mcp_restart", "Reconnect an MCP server and rediscover its tools.", {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1}},
        "required": ["name"]
    }),
    tool!("mcp_uninstall", "Remove an MCP server and its tools.", {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1}},
        "required": ["name"]
    }),
];

pub fn catalog() -> &'static [ToolDef] {
    CATALOG
}

pub fn def(name: &str) -> Option<&'static ToolDef> {
    CATALOG.iter().find(|d| d.name == name)
}
