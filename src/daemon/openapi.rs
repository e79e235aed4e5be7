//! `GET /openapi.json`: the OpenAPI 3 document of the control API, built
//! from one table of the routes the router serves (a test walks the table
//! against a live daemon, so the two cannot drift apart).

use serde_json::{Map, Value, json};

/// One route: method, path, summary, query parameters
/// (`name:type` with a `!` suffix when required) and the request body's
/// fields (same notation; `none` for no body).
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub query: &'static [&'static str],
    pub body: Option<&'static [&'static str]>,
}

const fn r(method: &'static str, path: &'static str, summary: &'static str) -> Route {
    Route { method, path, summary, query: &[], body: None }
}

const fn q(mut r: Route, query: &'static [&'static str]) -> Route {
    r.query = query;
    r
}

const fn b(mut r: Route, body: &'static [&'static str]) -> Route {
    r.body = Some(body);
    r
}

pub const ROUTES: &[Route] = &[
    r("get", "/health", "Liveness (no token needed)"),
    r("get", "/openapi.json", "This document"),
    r(
        "get",
        "/whoami",
        "The role of this request's token (owner, approver or observer), the mesh server's URL and the runtime's id and DID",
    ),
    q(
        r(
            "get",
            "/peers",
            "Other runtimes found by mDNS, the tailnet sweep and manual entries (refresh=true sweeps first)",
        ),
        &["refresh:boolean"],
    ),
    q(
        r("get", "/events", "Server-sent events: the fleet's event stream"),
        &["agentId:string", "since:integer", "types:string"],
    ),
    q(r("get", "/agents/{id}/events", "Server-sent events of one agent"), &["since:integer", "types:string"]),
    r("get", "/agents", "Loaded agents"),
    b(r("post", "/agents/load", "Load an agent file"), &["filePath:path!"]),
    q(
        r("post", "/agents/import", "Take in a whole agent file (the body, raw), start it here (adf move)"),
        &["name:adfname!"],
    ),
    r("get", "/agents/forwards", "Agents that moved to another host, whose messages are relayed there"),
    b(
        r(
            "post",
            "/agents/forwards",
            "Relay an agent's messages to its new host (adf move); its old file is kept as .moved",
        ),
        &["handle:handle!", "did:didkey!", "to:inboxurl!", "filePath:string"],
    ),
    q(r("get", "/agents/review", "What a file would do unattended, and whether it is reviewed"), &["filePath:path!"]),
    b(r("post", "/agents/review/accept", "Record the owner's review of a file"), &["filePath:path!"]),
    r("get", "/agents/{id}", "An agent and its config"),
    r("get", "/agents/{id}/status", "An agent's live status"),
    r("post", "/agents/{id}/start", "Start an agent (load it again if it is off, lift a suspension)"),
    r("post", "/agents/{id}/stop", "Stop and unload an agent"),
    r("post", "/agents/{id}/unload", "Stop and unload an agent"),
    r("post", "/agents/{id}/abort", "Abort the running turn"),
    b(r("post", "/agents/{id}/state", "Set the live state"), &["state:idle|hibernate|off!"]),
    b(
        r(
            "post",
            "/agents/{id}/chat",
            "Send the owner's message; 202 with the id of its turn (the client's turnId if given)",
        ),
        &["text:text!", "turnId:turnid"],
    ),
    b(
        r(
            "post",
            "/agents/{id}/trigger",
            "Put an event straight into the agent, past its trigger config; 202 with a trigger id",
        ),
        &["event:event!", "scope:agent|system", "lambda:string", "command:string", "warm:boolean"],
    ),
    q(r("get", "/agents/{id}/chat", "The tail of the loop for a chat view"), &["limit:integer"]),
    r("delete", "/agents/{id}/chat", "Clear the loop"),
    r("get", "/agents/{id}/config", "The config document"),
    b(r("put", "/agents/{id}/config", "Replace the config document (validated: 400 names what is wrong)"), &[]),
    r("get", "/agents/{id}/document", "README.md"),
    b(r("put", "/agents/{id}/document", "Write README.md"), &["content:string!"]),
    r("get", "/agents/{id}/mind", "mind.md"),
    b(r("put", "/agents/{id}/mind", "Write mind.md"), &["content:string!"]),
    q(
        r("get", "/agents/{id}/loop", "Loop rows (the last page by default, or the rows after a seq)"),
        &["limit:integer", "offset:integer", "after:integer"],
    ),
    r("get", "/agents/{id}/usage", "Tokens and cost from the loop"),
    r("get", "/agents/{id}/files", "Files"),
    q(r("get", "/agents/{id}/files/content", "One file"), &["path:path!"]),
    q(
        b(
            r("put", "/agents/{id}/files/content", "Write a file (content, or content_base64)"),
            &["content:string!", "mime_type:string"],
        ),
        &["path:path!"],
    ),
    q(r("delete", "/agents/{id}/files/content", "Delete a file"), &["path:path!"]),
    b(r("post", "/agents/{id}/files/rename", "Rename a file"), &["oldPath:path!", "newPath:path!"]),
    b(
        r("patch", "/agents/{id}/files/protection", "Set a file's protection"),
        &["path:path!", "protection:none|read_only|no_delete!"],
    ),
    b(
        r("patch", "/agents/{id}/files/authorized", "Mark a file as authorized code"),
        &["path:path!", "authorized:boolean!"],
    ),
    r("get", "/agents/{id}/meta", "Meta entries"),
    b(
        r("put", "/agents/{id}/meta/{key}", "Set a meta entry"),
        &["value:string!", "protection:none|readonly|increment"],
    ),
    r("delete", "/agents/{id}/meta/{key}", "Delete a meta entry"),
    r("get", "/agents/{id}/tables", "Tables with row counts"),
    q(
        r("get", "/agents/{id}/tables/{table}", "Rows of a local_* table or adf_audit"),
        &["limit:integer", "offset:integer"],
    ),
    q(r("get", "/agents/{id}/inbox", "Inbox"), &["status:string"]),
    q(r("get", "/agents/{id}/outbox", "Outbox"), &["status:string"]),
    r("get", "/agents/{id}/timers", "Timers"),
    b(
        r("post", "/agents/{id}/timers", "Set a timer (scope defaults to agent)"),
        &[
            "mode:once_at|once_delay|interval|cron!",
            "at:integer",
            "delay_ms:integer",
            "every_ms:integer",
            "cron:string",
        ],
    ),
    r("delete", "/agents/{id}/timers/{timer}", "Delete a timer"),
    r("get", "/agents/{id}/loops", "Side loops with their mode, schedule, status and waiting mail"),
    b(
        r("post", "/agents/{id}/loops", "Create a side loop (a template fills goal, tools and schedule)"),
        &[
            "name:loopname!",
            "template:template",
            "goal:string",
            "model:string",
            "mode:reactive|continuous",
            "schedule:every",
            "compact_threshold:integer",
            "max_turns:turns",
        ],
    ),
    b(
        r("patch", "/agents/{id}/loops/{name}", "Change a side loop; status paused|idle pauses or resumes it"),
        &[
            "goal:string",
            "model:string",
            "mode:reactive|continuous",
            "schedule:every",
            "status:paused|idle",
            "max_turns:turns",
        ],
    ),
    r("delete", "/agents/{id}/loops/{name}", "Delete a side loop (its stream is archived to audit)"),
    b(
        r("post", "/agents/{id}/loops/{name}/chat", "Send the owner's message to a side loop"),
        &["text:text!", "turnId:turnid"],
    ),
    q(r("get", "/agents/{id}/loops/{name}/chat", "A side loop's rows"), &["after:integer"]),
    q(
        r("get", "/agents/{id}/loops/{name}/events", "Server-sent events of one loop (main: the untagged ones)"),
        &["since:integer", "types:string"],
    ),
    q(
        r("get", "/agents/{id}/logs", "Log rows, oldest first: a level and up, one origin, after an id"),
        &["level:debug|info|warn|error", "origin:string", "after:integer", "limit:integer"],
    ),
    r("get", "/attention", "Every agent's approvals and asks waiting on the owner, each with its agentId"),
    q(
        r("get", "/usage", "The app-wide usage ledger grouped by day, provider, model or agent, and the fleet budget"),
        &["by:day|provider|model|agent", "since:day"],
    ),
    q(r("get", "/agents/{id}/grants", "Scoped, time-boxed grants (with all=true, the expired too)"), &["all:boolean"]),
    b(
        r(
            "post",
            "/agents/{id}/grants",
            "Grant a restricted tool ahead of time: for a while, under a folder, on a host",
        ),
        &["tool:text!", "for:duration", "path:grantpath", "host:granthost", "note:string"],
    ),
    r("delete", "/agents/{id}/grants/{grant}", "Revoke a grant"),
    r("get", "/agents/{id}/adapters", "The agent's channel adapters: state, account, counts, last error"),
    r(
        "get",
        "/agents/{id}/compute",
        "Where the agent's commands run, its browser and desktop now, its last commands and newest screenshot",
    ),
    b(
        r(
            "post",
            "/agents/{id}/adapters",
            "Connect a channel: the token sealed in the agent's credentials, never answered back",
        ),
        &[
            "type:telegram|discord!",
            "token:text!",
            "dm:all|allowlist|none",
            "groups:all|mention|none",
            "allow_from:strlist",
            "api_url:httpurl",
        ],
    ),
    r("delete", "/agents/{id}/adapters/{kind}", "Disconnect a channel: its config and its sealed credentials go"),
    r("get", "/agents/{id}/why", "Why the agent is awake or stuck: last turn, what it waits on, next wake"),
    r("get", "/agents/{id}/budgets", "Budgets of the agent and its loops, with what they spent"),
    q(r("get", "/agents/{id}/context", "The context gauge: window, fill and what takes the space"), &["loop:string"]),
    q(r("get", "/agents/{id}/tasks", "Tasks"), &["status:string", "limit:integer"]),
    r("get", "/agents/{id}/tasks/{task}", "One task"),
    b(
        r("post", "/agents/{id}/tasks/{task}/resolve", "Approve or deny a pending task"),
        &["action:approve|deny!", "reason:string", "always:boolean"],
    ),
    r("get", "/agents/{id}/asks", "Pending asks"),
    b(r("post", "/agents/{id}/asks/{request}/respond", "Answer an ask"), &["answer:string!"]),
    r("get", "/agents/{id}/mcp", "MCP servers with live status, credentials by name and tools"),
    b(
        r("post", "/agents/{id}/mcp", "Add an MCP server (connected first; env and header values sealed)"),
        &[
            "name:string!",
            "command:string",
            "args:strlist",
            "url:string",
            "env:strmap",
            "headers:strmap",
            "connect:boolean",
        ],
    ),
    r("delete", "/agents/{id}/mcp/{name}", "Remove an MCP server, its tools and credentials"),
    r("post", "/agents/{id}/mcp/{name}/restart", "Connect an MCP server again and rediscover its tools"),
    b(
        r("put", "/agents/{id}/mcp/{name}/oauth", "Seal a finished OAuth sign-in for an HTTP MCP server"),
        &["oauth:string!"],
    ),
    b(
        r("patch", "/agents/{id}/mcp/{name}/tools/{tool}", "Change an MCP tool's flags"),
        &["enabled:boolean", "visible:boolean", "restricted:boolean"],
    ),
    b(
        r("post", "/agents/{id}/messages", "Send an ALF message as the agent, without a turn"),
        &["recipient:text!", "content:text!", "subject:string", "thread_id:string", "parent_id:string"],
    ),
    r("get", "/agents/{id}/skills", "Skills (the fleet's and the agent's), muted, invalid with the reason"),
    r("get", "/runtime", "The runtime: agents, states, event cursor"),
    r("get", "/runtime/providers", "Providers, as metadata (never keys)"),
    r("get", "/runtime/usage", "Usage of every agent"),
    r("get", "/diagnostics", "Uptime, pid and agents"),
];

/// A field in `name:type[!]` notation as (name, schema, required).
fn field(spec: &str) -> (String, Value, bool) {
    let required = spec.ends_with('!');
    let spec = spec.trim_end_matches('!');
    let (name, ty) = spec.split_once(':').unwrap_or((spec, "string"));
    let schema = match ty {
        "integer" => json!({"type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991u64}),
        "path" => json!({"type": "string", "minLength": 1}),
        "handle" => json!({"type": "string", "pattern": super::moves::HANDLE}),
        "didkey" => json!({"type": "string", "pattern": super::moves::DID_KEY}),
        "inboxurl" => json!({"type": "string", "pattern": super::moves::INBOX_URL}),
        "adfname" => json!({"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,119}\\.adf$"}),
        "boolean" => json!({"type": "boolean"}),
        "turns" => json!({"type": "integer", "minimum": 0, "maximum": crate::store::loops::MAX_TURNS_LIMIT}),
        // Non-empty text with something besides spaces.
        "text" => json!({"type": "string", "pattern": "\\S"}),
        "string" => json!({"type": "string"}),
        "strlist" => json!({"type": "array", "items": {"type": "string"}}),
        "strmap" => json!({"type": "object", "additionalProperties": {"type": "string"}}),
        "turnid" => json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}),
        // A side loop's name, and a schedule of `every N(m|h|d)` (the route
        // also takes cron expressions: `adf loops new --schedule`).
        "loopname" => json!({"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}$"}),
        "every" => json!({"type": "string", "pattern": "^every [1-9][0-9]{0,3}[mhd]$"}),
        // A grant's reach (`store::grants`): a time, a folder, a host.
        "duration" => {
            json!({"type": "string", "pattern": "^([1-9][0-9]{0,3}[sm]|[1-9][0-9]?h|[1-9]d|[12][0-9]d|30d)$"})
        }
        "grantpath" => json!({"type": "string",
            "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}(/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}){0,7}/?$"}),
        "granthost" => json!({"type": "string",
            // A name whose last label starts with a letter (a numeric one
            // reads as an IPv4 address, which the route also takes).
            "pattern": "^(\\*\\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.){0,5}[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"}),
        "httpurl" => {
            json!({"type": "string", "pattern": "^https?://[a-z0-9.-]{1,63}(:[1-9][0-9]{0,3})?(/[A-Za-z0-9._~/-]*)?$"})
        }
        "day" => {
            json!({"type": "string", "pattern": "^(today|[0-9]{1,4}d|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))$"})
        }
        "template" => {
            json!({"type": "string", "enum": crate::runtime::loop_templates::TEMPLATES.iter().map(|(n, _)| *n).collect::<Vec<_>>()})
        }
        // `data` may be left out only for startup (spec: daemon, /trigger).
        "event" => json!({"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": crate::daemon::inject::EVENT_TYPES},
            "data": {},
            "source": {"type": "string"}
        }, "anyOf": [
            {"required": ["data"]},
            {"properties": {"type": {"type": "string", "enum": ["startup"]}}}
        ]}),
        choices => json!({"type": "string", "enum": choices.split('|').collect::<Vec<_>>()}),
    };
    (name.to_string(), schema, required)
}

fn path_param(name: &str) -> Value {
    let schema = match name {
        "timer" => json!({"type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991u64}),
        "table" => json!({"type": "string", "pattern": "^(local_[A-Za-z0-9_]+|adf_audit)$"}),
        _ => json!({"type": "string"}),
    };
    json!({"name": name, "in": "path", "required": true, "schema": schema})
}

pub fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let mut params: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(path_param)
            .collect();
        for spec in route.query {
            let (name, schema, required) = field(spec);
            params.push(json!({"name": name, "in": "query", "required": required, "schema": schema}));
        }
        let mut op = json!({
            "summary": route.summary,
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "403": {"$ref": "#/components/responses/Error"},
                "404": {"$ref": "#/components/responses/Error"},
                "409": {"$ref": "#/components/responses/Error"},
                "500": {"$ref": "#/components/responses/Error"}
            }
        });
        if route.path == "/health" {
            op["security"] = json!([]);
        }
        if route.path.ends_with("/events") {
            op["responses"]["200"] = json!({"description": "An SSE stream of `{cursor, event}` frames",
                "content": {"text/event-stream": {}}});
        }
        if route.method == "post" && (route.path.ends_with("/chat") || route.path.ends_with("/trigger")) {
            op["responses"]["202"] =
                json!({"description": "Accepted", "content": {"application/json": {"schema": {}}}});
        }
        if (route.path.ends_with("/mcp") || route.path.ends_with("/messages")) && route.method == "post" {
            op["responses"]["422"] = json!({"$ref": "#/components/responses/Error"});
        }
        if let Some(fields) = route.body {
            let mut props = Map::new();
            let mut required = Vec::new();
            for spec in fields.iter() {
                let (name, schema, req) = field(spec);
                if req {
                    required.push(name.clone());
                }
                props.insert(name, schema);
            }
            let mut schema = json!({"type": "object", "properties": props});
            if !required.is_empty() {
                schema["required"] = json!(required);
            }
            if route.method == "patch" {
                schema["minProperties"] = json!(1);
            }
            // A grant narrows something: a time, a folder or a host.
            if route.path.ends_with("/grants") {
                schema["anyOf"] = json!([{"required": ["for"]}, {"required": ["path"]}, {"required": ["host"]}]);
            }
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema}}});
            // The body is read before the route runs (`body.rs`).
            op["responses"]["408"] = json!({"$ref": "#/components/responses/Error"});
            op["responses"]["413"] = json!({"$ref": "#/components/responses/Error"});
        }
        if route.path == super::moves::IMPORT {
            op["requestBody"] = json!({"required": true, "content": {"application/octet-stream":
                {"schema": {"type": "string", "format": "binary"}}}});
            op["responses"]["408"] = json!({"$ref": "#/components/responses/Error"});
            op["responses"]["413"] = json!({"$ref": "#/components/responses/Error"});
        }
        let entry = paths.entry(route.path.to_string()).or_insert_with(|| json!({}));
        entry[route.method] = op;
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
