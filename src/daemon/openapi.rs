//! `GET /openapi.json`: the OpenAPI 3 document of the control API, built
//! from one table of the routes the router serves (a test walks the table
//! against a live daemon, so the two cannot drift apart).

use serde_json::{Map, Value, json};

/// (method, path, summary, request body required).
pub const ROUTES: &[(&str, &str, &str, bool)] = &[
    ("get", "/health", "Liveness (no token needed)", false),
    ("get", "/openapi.json", "This document", false),
    ("get", "/events", "Server-sent events: the fleet's event stream (agentId, since, types)", false),
    ("get", "/agents", "Loaded agents", false),
    ("post", "/agents/load", "Load an agent file ({filePath})", true),
    ("get", "/agents/review", "What a file would do unattended (filePath), and whether it is reviewed", false),
    ("post", "/agents/review/accept", "Record the owner's review of a file ({filePath})", true),
    ("get", "/agents/{id}", "An agent and its config", false),
    ("get", "/agents/{id}/status", "An agent's live status", false),
    ("post", "/agents/{id}/start", "Start an agent (load it again if it is off, lift a suspension)", false),
    ("post", "/agents/{id}/stop", "Stop and unload an agent", false),
    ("post", "/agents/{id}/unload", "Stop and unload an agent", false),
    ("post", "/agents/{id}/abort", "Abort the running turn", false),
    ("post", "/agents/{id}/state", "Set the live state ({state}: idle, hibernate, off)", true),
    ("post", "/agents/{id}/chat", "Send the owner's message ({text}); 202 with a turn id", true),
    ("get", "/agents/{id}/chat", "The tail of the loop for a chat view (limit)", false),
    ("delete", "/agents/{id}/chat", "Clear the loop", false),
    ("get", "/agents/{id}/config", "The config document", false),
    ("put", "/agents/{id}/config", "Replace the config document (validated)", true),
    ("get", "/agents/{id}/document", "README.md", false),
    ("put", "/agents/{id}/document", "Write README.md ({content})", true),
    ("get", "/agents/{id}/mind", "mind.md", false),
    ("put", "/agents/{id}/mind", "Write mind.md ({content})", true),
    ("get", "/agents/{id}/loop", "Loop rows (limit, offset; default the last page; or after=SEQ)", false),
    ("get", "/agents/{id}/usage", "Tokens and cost from the loop", false),
    ("get", "/agents/{id}/files", "Files", false),
    ("get", "/agents/{id}/files/content", "One file (path)", false),
    ("put", "/agents/{id}/files/content", "Write a file (path; {content} or {content_base64})", true),
    ("delete", "/agents/{id}/files/content", "Delete a file (path)", false),
    ("post", "/agents/{id}/files/rename", "Rename a file ({oldPath, newPath})", true),
    ("patch", "/agents/{id}/files/protection", "Set a file's protection ({path, protection})", true),
    ("get", "/agents/{id}/meta", "Meta entries", false),
    ("put", "/agents/{id}/meta/{key}", "Set a meta entry ({value, protection?})", true),
    ("delete", "/agents/{id}/meta/{key}", "Delete a meta entry", false),
    ("get", "/agents/{id}/tables", "Tables with row counts", false),
    ("get", "/agents/{id}/tables/{table}", "Rows of a local_* table or adf_audit (limit, offset)", false),
    ("get", "/agents/{id}/inbox", "Inbox (status)", false),
    ("get", "/agents/{id}/outbox", "Outbox (status)", false),
    ("get", "/agents/{id}/timers", "Timers", false),
    (
        "post",
        "/agents/{id}/timers",
        "Set a timer ({mode, at|delay_ms|every_ms|cron, …}; scope defaults to agent)",
        true,
    ),
    ("delete", "/agents/{id}/timers/{timer}", "Delete a timer", false),
    ("get", "/agents/{id}/tasks", "Tasks (status, limit)", false),
    ("get", "/agents/{id}/tasks/{task}", "One task", false),
    ("post", "/agents/{id}/tasks/{task}/resolve", "Approve or deny a pending task ({action, reason?, always?})", true),
    ("get", "/agents/{id}/asks", "Pending asks", false),
    ("post", "/agents/{id}/asks/{request}/respond", "Answer an ask ({answer})", true),
    ("get", "/runtime", "The runtime: agents, states, event cursor", false),
    ("get", "/runtime/providers", "Providers, as metadata (never keys)", false),
    ("get", "/runtime/usage", "Usage of every agent", false),
    ("get", "/diagnostics", "Uptime, pid and agents", false),
];

pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, summary, body) in ROUTES {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "404": {"$ref": "#/components/responses/Error"}
            }
        });
        if *path == "/health" {
            op["security"] = json!([]);
        }
        if *path == "/events" {
            op["responses"]["200"] = json!({"description": "An SSE stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}});
        }
        if *body {
            op["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": {"type": "object"}}}});
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = op;
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "adf daemon control API", "version": env!("CARGO_PKG_VERSION")},
        "servers": [{"url": "http://127.0.0.1:7385"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "required": ["error"],
                "properties": {"error": {"type": "string"}, "code": {"type": "string"}}}},
            "responses": {"Error": {"description": "What was wrong",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}
        },
        "paths": paths
    })
}
