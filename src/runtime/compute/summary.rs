//! What the owner sees of an agent's compute (the app's `:compute` panel,
//! `GET /agents/{id}/compute`): its targets, its browser mode, what runs
//! now in the process that hosts it, its last commands (read from its
//! `compute` log rows) and its newest screenshot.

use serde_json::{Value, json};

use crate::store::files::FileEntry;

/// Commands the panel lists at most.
const SHOWN: usize = 50;

/// The panel's content from what any source can read: the agent's config,
/// its logs (newest first) and its files; `live` from the runtime when the
/// app hosts the agent (null otherwise).
/// `settings` and `engine` (does one run here; unknown counts as yes) make
/// the targets the ones `resolve` would take.
pub fn view(
    cfg: &Value,
    settings: &super::Settings,
    engine: bool,
    logs: &[Value],
    files: &[FileEntry],
    live: Value,
) -> Value {
    let c = &cfg["compute"];
    let targets = super::available(cfg, settings, engine);
    let mut rows: Vec<&Value> = logs.iter().filter(|l| l["origin"] == "compute" && l["event"] == "exec").collect();
    // Newest first, whatever order the source gave.
    rows.sort_by_key(|l| std::cmp::Reverse(l["created_at"].as_i64().unwrap_or(0)));
    let commands: Vec<Value> = rows
        .into_iter()
        .take(SHOWN)
        .map(|l| {
            let m = l["message"].as_str().unwrap_or_default();
            // "<target>: exit <code> in <ms> ms: <command>" or "<target>: failed: <why>"
            let (target, rest) = m.split_once(": ").unwrap_or(("?", m));
            let (code, ms, command) = match rest.strip_prefix("exit ").and_then(|r| r.split_once(" in ")) {
                Some((code, r)) => {
                    let (ms, cmd) = r.split_once(" ms: ").unwrap_or((r, ""));
                    (json!(code.parse::<i64>().ok()), json!(ms.parse::<u64>().ok()), cmd.to_string())
                }
                None => (Value::Null, Value::Null, rest.to_string()),
            };
            json!({"at": l["created_at"], "target": target, "exit_code": code, "ms": ms, "command": command})
        })
        .collect();
    let shot = files
        .iter()
        .filter(|f| f.path.starts_with("screenshots/") && f.path.ends_with(".png"))
        .max_by(|a, b| a.updated_at.cmp(&b.updated_at).then_with(|| a.path.cmp(&b.path)));
    json!({
        "enabled": c["enabled"] == true,
        "targets": targets,
        "default_target": c["default_target"],
        "browser": if c["enabled"] != true { "off" } else if c["browser"] == false { "headless" } else { "visible" },
        "live": live,
        "commands": commands,
        "screenshot": shot.map(|f| json!({"path": f.path, "bytes": f.size, "at": f.updated_at})),
    })
}

/// What runs now for an agent this process hosts.
pub fn live(agent_id: &str) -> Value {
    use super::{browser, display};
    let d = display::get(agent_id);
    json!({
        "browser": browser::get(agent_id).map(|s| if s.visible { "open (visible)" } else { "open (headless)" }),
        "display": d.as_ref().map(|d| d.number),
        "vnc_port": d.as_ref().and_then(|d| d.vnc_now().map(|v| v.port)),
        "containers": super::containers::get().states(agent_id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_reads_targets_commands_and_the_newest_screenshot() {
        let cfg = json!({"compute": {"enabled": true, "host_access": true, "default_target": "host"}});
        let logs = vec![
            json!({"origin": "compute", "event": "exec", "created_at": 2, "message": "host: exit 124 in 1000 ms: sleep 9"}),
            json!({"origin": "compute", "event": "exec", "created_at": 1, "message": "isolated: exit 0 in 12 ms: ls -la: x"}),
            json!({"origin": "compute", "event": "exec", "created_at": 0, "message": "shared: failed: no engine"}),
            json!({"origin": "compute", "event": "transfer", "created_at": 0, "message": "vfs -> host"}),
        ];
        let file = |p: &str, at: &str| FileEntry {
            path: p.into(),
            size: 10,
            mime_type: None,
            protection: crate::store::files::Protection::None,
            authorized: false,
            created_at: at.into(),
            updated_at: at.into(),
        };
        let files =
            [file("screenshots/a.png", "2026-01-01"), file("screenshots/b.png", "2026-02-01"), file("b.txt", "2027")];
        let on = crate::runtime::compute::Settings {
            host: crate::runtime::compute::HostPolicy { enabled: true, programs: vec![] },
            ..Default::default()
        };
        let v = view(&cfg, &on, true, &logs, &files, Value::Null);
        assert_eq!(
            view(&cfg, &Default::default(), false, &logs, &files, Value::Null)["targets"],
            json!([]),
            "no engine, host off"
        );
        assert_eq!(v["targets"], json!(["isolated", "shared", "host"]));
        assert_eq!(v["browser"], "visible");
        assert_eq!(v["commands"].as_array().unwrap().len(), 3);
        assert_eq!(
            v["commands"][0],
            json!({"at": 2, "target": "host", "exit_code": 124, "ms": 1000, "command": "sleep 9"})
        );
        let mut reversed = logs.clone();
        reversed.reverse();
        assert_eq!(
            view(&cfg, &on, true, &reversed, &files, Value::Null)["commands"][0]["at"],
            2,
            "newest first either way"
        );
        assert_eq!(v["commands"][1]["command"], "ls -la: x");
        assert_eq!(v["commands"][2]["exit_code"], Value::Null);
        assert_eq!(v["screenshot"]["path"], "screenshots/b.png");
    }
}
