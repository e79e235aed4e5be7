//! The agent's config document (`adf_config.config_json`). The stored JSON
//! stays the source of truth, so fields this version does not know round-trip
//! untouched and key order is kept; `AgentConfig` is the typed view the rest of
//! the program reads. Writes are validated, rejecting only violations that the
//! write introduces (format.md §7.1), and mirror name/handle into meta.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

mod validate;

pub use validate::{Issue, TOP_LEVEL, TRIGGER_TYPES, new_issues, validate};

use super::access::{Caller, Denial, DenialKind};
use super::error::{Ctx, Result, StoreError};
use super::meta::MetaProtection;
use super::{Store, now_iso};

// ---------------------------------------------------------------------------
// The typed view. Every struct keeps unknown keys in `extra`.

fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adf_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icon: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_in_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autonomous: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loop_mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autostart: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_base_prompt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolDeclaration>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_execution: Option<CodeExecution>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked_fields: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Option<f64>>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<Option<u64>>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Option::is_none")]
    pub top_p: Option<Option<f64>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolDeclaration {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visible: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restricted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ToolDeclaration {
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(false)
    }
    pub fn is_visible(&self) -> bool {
        self.visible.unwrap_or(false)
    }
    pub fn is_restricted(&self) -> bool {
        self.restricted.unwrap_or(false)
    }
    pub fn is_locked(&self) -> bool {
        self.locked.unwrap_or(false)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_file_read_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_file_write_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tool_result_tokens: Option<u64>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Option::is_none")]
    pub max_active_turns: Option<Option<u64>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeExecution {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restricted_methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl AgentConfig {
    pub fn from_value(v: &Value) -> std::result::Result<Self, String> {
        AgentConfig::deserialize(v).map_err(|e| e.to_string())
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// `limits.max_file_write_bytes` (default 5 000 000).
    pub fn max_file_write_bytes(&self) -> u64 {
        self.limits.as_ref().and_then(|l| l.max_file_write_bytes).unwrap_or(super::files::DEFAULT_MAX_WRITE)
    }

    /// `code_execution.restricted_methods`: absent ⇒ `["attestation_issue"]`,
    /// an explicit list replaces the default.
    pub fn restricted_methods(&self) -> Vec<String> {
        self.code_execution
            .as_ref()
            .and_then(|c| c.restricted_methods.clone())
            .unwrap_or_else(|| vec!["attestation_issue".to_string()])
    }

    /// Tool declarations with duplicates collapsed: first wins, `restricted`
    /// and `locked` are sticky-true. Also returns the duplicated names.
    pub fn effective_tools(&self) -> (Vec<ToolDeclaration>, Vec<String>) {
        let mut out: Vec<ToolDeclaration> = Vec::new();
        let mut dups = Vec::new();
        for t in self.tools.iter().flatten() {
            match out.iter_mut().find(|o| o.name == t.name) {
                Some(first) => {
                    dups.push(t.name.clone());
                    if t.is_restricted() {
                        first.restricted = Some(true);
                    }
                    if t.is_locked() {
                        first.locked = Some(true);
                    }
                }
                None => out.push(t.clone()),
            }
        }
        (out, dups)
    }

    /// The effective declaration of one tool, if declared.
    pub fn tool(&self, name: &str) -> Option<ToolDeclaration> {
        self.effective_tools().0.into_iter().find(|t| t.name == name)
    }
}

/// Whether an audit category is on (`context.audit.X` or top-level `audit.X`).
pub fn audit_enabled(cfg: &Value, what: &str) -> bool {
    let at = |p: String| cfg.pointer(&p).and_then(Value::as_bool).unwrap_or(false);
    at(format!("/context/audit/{what}")) || at(format!("/audit/{what}"))
}

// ---------------------------------------------------------------------------
// Dotted paths.

/// Resolve a dotted path; in arrays, a non-numeric segment selects the
/// element whose `name` (or `id`) equals it.
pub fn get_path<'a>(cfg: &'a Value, dotted: &str) -> Option<&'a Value> {
    let mut cur = cfg;
    for seg in dotted.split('.').filter(|s| !s.is_empty()) {
        cur = match cur {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => match seg.parse::<usize>() {
                Ok(i) => a.get(i)?,
                Err(_) => a.iter().find(|e| named(e, seg))?,
            },
            _ => return None,
        };
    }
    Some(cur)
}

fn named(e: &Value, seg: &str) -> bool {
    e.get("name").and_then(Value::as_str) == Some(seg) || e.get("id").and_then(Value::as_str) == Some(seg)
}

/// Set a value at a dotted path, creating intermediate objects. The first
/// segment must be a known top-level section.
pub fn set_path(cfg: &mut Value, dotted: &str, value: Value) -> Result<()> {
    let segs: Vec<&str> = dotted.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(StoreError::Invalid(format!("invalid config path \"{dotted}\"")));
    }
    if !TOP_LEVEL.contains(&segs[0]) {
        return Err(StoreError::Invalid(format!(
            "unknown config section \"{}\" in \"{dotted}\" (known: {})",
            segs[0],
            TOP_LEVEL.join(", ")
        )));
    }
    let mut cur = cfg;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let here = segs[..=i].join(".");
        cur = match cur {
            Value::Object(m) => {
                if last {
                    m.insert(seg.to_string(), value);
                    return Ok(());
                }
                m.entry(seg.to_string()).or_insert_with(|| Value::Object(Map::new()))
            }
            Value::Array(a) => {
                let idx = match seg.parse::<usize>() {
                    Ok(i) if i < a.len() => i,
                    Ok(i) if i == a.len() && last => {
                        a.push(value);
                        return Ok(());
                    }
                    Ok(i) => return Err(StoreError::Invalid(format!("index {i} is out of range at \"{here}\""))),
                    Err(_) => a
                        .iter()
                        .position(|e| named(e, seg))
                        .ok_or_else(|| StoreError::Invalid(format!("no element named \"{seg}\" at \"{here}\"")))?,
                };
                if last {
                    a[idx] = value;
                    return Ok(());
                }
                &mut a[idx]
            }
            _ => return Err(StoreError::Invalid(format!("\"{}\" is not an object or list", segs[..i].join(".")))),
        };
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Agent write policy (sys_update_config rules 2–4 and 8).

/// Why an agent's config write is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigRefusal {
    /// A hard error with no approval path.
    Hard(String),
    /// A lock a human may override once.
    Lock(Denial),
}

const HINT: &str = " Use sys_get_config to see the current configuration.";

/// Check an agent's write to `path` against the owner-only fields, the
/// guard-system paths and the locks.
pub fn agent_write_policy(cfg: &Value, path: &str) -> std::result::Result<(), ConfigRefusal> {
    let segs: Vec<&str> = path.split('.').collect();
    if segs.iter().any(|s| *s == "locked" || *s == "locked_fields") {
        return Err(ConfigRefusal::Hard(format!("Cannot modify locking configuration.{HINT}")));
    }
    if segs.iter().any(|s| *s == "restricted" || *s == "restricted_methods") {
        return Err(ConfigRefusal::Hard(format!("Cannot modify restriction configuration.{HINT}")));
    }
    if ["adf_version", "id", "metadata", "locked_fields", "providers"].contains(&segs[0]) {
        return Err(ConfigRefusal::Hard(format!("Cannot modify \"{}\": it is owner-only.{HINT}", segs[0])));
    }
    let guard = path == "security"
        || path == "security.allow_unsigned"
        || path == "security.require_middleware_authorization"
        || path.starts_with("security.middleware")
        || path.starts_with("security.fetch_middleware");
    if guard {
        return Err(ConfigRefusal::Hard(format!(
            "Cannot modify \"{path}\": security guard settings are changed by the owner only.{HINT}"
        )));
    }
    let mut locks: Vec<String> = vec!["security.allow_local_fetch".into(), "stream_bind".into()];
    if let Some(Value::Array(lf)) = cfg.get("locked_fields") {
        locks.extend(lf.iter().filter_map(Value::as_str).map(str::to_string));
    }
    let covered =
        |lock: &str| path == lock || path.starts_with(&format!("{lock}.")) || lock.starts_with(&format!("{path}."));
    if let Some(lock) = locks.iter().find(|l| covered(l)) {
        return Err(ConfigRefusal::Lock(Denial::new(
            DenialKind::ConfigLock,
            path,
            "locked",
            format!("Cannot modify \"{path}\": it is locked ({lock}).{HINT}"),
        )));
    }
    // An item with `locked: true` anywhere along the path.
    let mut cur = cfg;
    for seg in &segs {
        match get_path(cur, seg) {
            Some(next) => {
                if next.get("locked").and_then(Value::as_bool) == Some(true) {
                    return Err(ConfigRefusal::Lock(Denial::new(
                        DenialKind::ConfigLock,
                        path,
                        "locked",
                        format!("Cannot modify \"{path}\": the item is locked.{HINT}"),
                    )));
                }
                cur = next;
            }
            None => break,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Load-time patches (format.md §7.1).

/// Apply the reference's load-time patches; true when anything changed.
pub fn load_patches(cfg: &mut Value, meta_handle: Option<&str>) -> bool {
    let mut changed = false;
    let Some(obj) = cfg.as_object_mut() else { return false };
    if !obj.contains_key("handle")
        && let Some(h) = meta_handle.filter(|h| !h.is_empty())
    {
        obj.insert("handle".into(), Value::String(h.into()));
        changed = true;
    }
    if let Some(Value::Array(tools)) = obj.get_mut("tools") {
        for t in tools.iter_mut().filter_map(Value::as_object_mut) {
            if t.get("name").and_then(Value::as_str) == Some("msg_list_agents") {
                t.insert("name".into(), Value::String("agent_discover".into()));
                changed = true;
            }
            if !t.contains_key("visible") {
                let en = t.get("enabled").and_then(Value::as_bool).unwrap_or(false);
                t.insert("visible".into(), Value::Bool(en));
                changed = true;
            }
        }
        for &(name, e, vis, r) in super::defaults::DEFAULT_TOOLS {
            if !tools.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(name)) {
                tools.push(super::defaults::tool_declaration(name, e, vis, r));
                changed = true;
            }
        }
    }
    changed
}

// ---------------------------------------------------------------------------
// Store operations.

impl Store {
    /// The raw config document.
    pub fn config_value(&self) -> Result<Value> {
        self.with_config(Value::clone)
    }

    /// `f` on the config, without copying it: the cached document, else
    /// the file's, which is then cached.
    pub fn with_config<R>(&self, f: impl FnOnce(&Value) -> R) -> Result<R> {
        self.drop_stale_config();
        if let Some(v) = self.config_cache.borrow().as_ref() {
            return Ok(f(v));
        }
        let v = self.read_config()?;
        let out = f(&v);
        // Read-only handles share the file with a writer: never cache there.
        if !self.is_read_only() {
            *self.config_cache.borrow_mut() = Some(v);
        }
        Ok(out)
    }

    fn read_config(&self) -> Result<Value> {
        let bytes: Option<Vec<u8>> = self
            .conn()
            .query_row("SELECT CAST(config_json AS BLOB) FROM adf_config WHERE id = 1", [], |r| r.get(0))
            .optional()
            .at(self.path())?;
        let bytes =
            bytes.ok_or_else(|| StoreError::Invalid(format!("{}: adf_config has no row", self.path().display())))?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            // A damaged byte inside a string still leaves a usable config.
            Err(_) => String::from_utf8_lossy(&bytes),
        };
        serde_json::from_str(&text).map_err(|e| {
            let bad = std::str::from_utf8(&bytes).err().map(|u| format!(", invalid UTF-8 at byte {}", u.valid_up_to()));
            StoreError::Invalid(format!(
                "{}: adf_config row 1 (config_json) is not valid JSON: {e}{}",
                self.path().display(),
                bad.unwrap_or_default()
            ))
        })
    }

    /// The typed config.
    pub fn config(&self) -> Result<AgentConfig> {
        let v = self.config_value()?;
        AgentConfig::from_value(&v)
            .map_err(|e| StoreError::Invalid(format!("{}: config does not fit the schema: {e}", self.path().display())))
    }

    /// Replace the whole document, rejecting only newly introduced issues.
    /// Stamps `metadata.updated_at` and mirrors name/handle/updated_at into meta.
    pub fn config_replace(&mut self, mut next: Value) -> Result<()> {
        let before = self.config_value()?;
        let fresh = new_issues(&before, &next);
        if !fresh.is_empty() {
            let list = fresh.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            return Err(StoreError::Invalid(format!("invalid config: {list}")));
        }
        let now = now_iso();
        if let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("updated_at".into(), Value::String(now.clone()));
        }
        let file = self.path().to_path_buf();
        self.config_cache.borrow_mut().take();
        self.config_rev.set(self.config_rev.get() + 1);
        self.write(|tx| write_config(tx, &next, &now).at(&file))?;
        *self.config_cache.borrow_mut() = Some(next);
        Ok(())
    }

    /// Changes whenever the config is written through this store or
    /// another connection of this process committed.
    pub fn config_rev(&self) -> u64 {
        self.drop_stale_config();
        self.config_rev.get()
    }

    /// Forget the cached config when another connection (a sibling)
    /// committed since it was read.
    fn drop_stale_config(&self) {
        let Ok(v) = self.view.data_version(self.conn()) else { return };
        if v != self.data_version.get() {
            self.data_version.set(v);
            self.config_cache.borrow_mut().take();
            self.config_rev.set(self.config_rev.get() + 1);
        }
    }

    /// Set one dotted path as the given caller.
    pub fn config_set(&mut self, caller: Caller, path: &str, value: Value) -> Result<()> {
        let mut cfg = self.config_value()?;
        if caller != Caller::Owner
            && let Err(refusal) = agent_write_policy(&cfg, path)
        {
            match refusal {
                ConfigRefusal::Hard(msg) => return Err(StoreError::Invalid(msg)),
                // Config locks (allow_local_fetch, stream_bind) are the
                // owner's: only the owner's approved override passes, not
                // authorized code on its own.
                ConfigRefusal::Lock(d) if !matches!(caller, Caller::Agent { override_approved: true, .. }) => {
                    return Err(StoreError::Denied(d));
                }
                ConfigRefusal::Lock(_) => {}
            }
        }
        set_path(&mut cfg, path, value)?;
        self.config_replace(cfg)
    }
}

/// Write the document and its meta mirrors (used by create and writes).
pub(crate) fn write_config(conn: &rusqlite::Connection, cfg: &Value, now: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO adf_config(id, config_json, updated_at) VALUES (1, ?1, ?2)",
        params![serde_json::to_string(cfg).unwrap_or_default(), now],
    )?;
    if let Some(name) = cfg.get("name").and_then(Value::as_str) {
        Store::meta_put_system(conn, "adf_name", name, MetaProtection::None)?;
    }
    if let Some(handle) = cfg.get("handle").and_then(Value::as_str) {
        Store::meta_put_system(conn, "adf_handle", handle, MetaProtection::None)?;
    }
    Store::meta_put_system(conn, "adf_updated_at", now, MetaProtection::None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fresh() -> Value {
        super::super::defaults::new_config(&super::super::defaults::ConfigSeed {
            id: "abcdefghijkl",
            name: "t",
            now: "2026-01-01T00:00:00.000Z",
            ..Default::default()
        })
    }

    #[test]
    fn a_fresh_config_is_valid() {
        assert_eq!(validate(&fresh()), Vec::new());
    }

    #[test]
    fn only_new_issues_are_rejected() {
        let before = fresh();
        let mut after = before.clone();
        set_path(&mut after, "description", json!("still fine")).unwrap();
        assert!(new_issues(&before, &after).is_empty());
        set_path(&mut after, "model.temperature", json!(3)).unwrap();
        let n = new_issues(&before, &after);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].path, "model.temperature");
    }

    #[test]
    fn named_segments_select_array_elements() {
        let mut cfg = fresh();
        set_path(&mut cfg, "tools.fs_delete.enabled", json!(true)).unwrap();
        assert_eq!(get_path(&cfg, "tools.fs_delete.enabled"), Some(&json!(true)));
        assert_eq!(get_path(&cfg, "tools.3.name"), Some(&json!("fs_delete")));
        assert!(set_path(&mut cfg, "tools.nope.enabled", json!(true)).is_err());
        assert!(set_path(&mut cfg, "bogus.x", json!(1)).is_err());
    }

    #[test]
    fn restricted_methods_default_and_replace() {
        let mut v = fresh();
        v["code_execution"].as_object_mut().unwrap().remove("restricted_methods");
        assert_eq!(AgentConfig::from_value(&v).unwrap().restricted_methods(), ["attestation_issue"]);
        v["code_execution"]["restricted_methods"] = json!(["model_invoke"]);
        assert_eq!(AgentConfig::from_value(&v).unwrap().restricted_methods(), ["model_invoke"]);
        v["code_execution"]["restricted_methods"] = json!([]);
        assert!(AgentConfig::from_value(&v).unwrap().restricted_methods().is_empty());
    }

    #[test]
    fn duplicate_tools_first_wins_sticky_flags() {
        let mut v = fresh();
        v["tools"] = json!([
            {"name": "fs_read", "enabled": true, "visible": true},
            {"name": "fs_read", "enabled": false, "visible": false, "restricted": true, "locked": true},
            {"name": "db_query", "enabled": true, "restricted": true},
            {"name": "db_query", "enabled": false, "restricted": false}
        ]);
        let cfg = AgentConfig::from_value(&v).unwrap();
        let (tools, dups) = cfg.effective_tools();
        assert_eq!(tools.len(), 2);
        assert!(tools[0].is_enabled() && tools[0].is_restricted() && tools[0].is_locked());
        assert!(tools[1].is_enabled() && tools[1].is_restricted());
        assert_eq!(dups, ["fs_read", "db_query"]);
    }

    #[test]
    fn agent_policy_hard_errors_and_locks() {
        let cfg = fresh();
        for p in [
            "locked_fields",
            "tools.fs_read.restricted",
            "code_execution.restricted_methods",
            "tools.fs_read.locked",
            "adf_version",
            "id",
            "metadata.created_at",
            "providers",
            "security",
            "security.allow_unsigned",
            "security.require_middleware_authorization",
            "security.middleware.inbox",
            "security.fetch_middleware",
        ] {
            assert!(matches!(agent_write_policy(&cfg, p), Err(ConfigRefusal::Hard(_))), "{p}");
        }
        for p in ["security.allow_local_fetch", "stream_bind", "stream_bind.allow_tcp_bind"] {
            match agent_write_policy(&cfg, p) {
                Err(ConfigRefusal::Lock(d)) => assert_eq!(d.kind, DenialKind::ConfigLock),
                other => panic!("{p}: {other:?}"),
            }
        }
        assert!(agent_write_policy(&cfg, "description").is_ok());
        let mut locked = cfg.clone();
        locked["locked_fields"] = json!(["model.model_id"]);
        assert!(matches!(agent_write_policy(&locked, "model.model_id"), Err(ConfigRefusal::Lock(_))));
        assert!(matches!(agent_write_policy(&locked, "model"), Err(ConfigRefusal::Lock(_))));
        locked["tools"][0]["locked"] = json!(true);
        assert!(matches!(agent_write_policy(&locked, "tools.fs_read.enabled"), Err(ConfigRefusal::Lock(_))));
    }

    #[test]
    fn load_patches_backfill() {
        let mut v = json!({"tools": [{"name": "msg_list_agents", "enabled": true}]});
        assert!(load_patches(&mut v, Some("h")));
        assert_eq!(v["handle"], "h");
        assert_eq!(v["tools"][0]["name"], "agent_discover");
        assert_eq!(v["tools"][0]["visible"], true);
        assert_eq!(v["tools"].as_array().unwrap().len(), super::super::defaults::DEFAULT_TOOLS.len());
        assert!(!load_patches(&mut v, Some("h")));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                (-1e6f64..1e6).prop_map(Value::from),
                "[ -~]{0,12}".prop_map(Value::String),
            ]
        }

        fn json() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn unknown_key() -> impl Strategy<Value = String> {
            "x_[a-z]{1,8}"
        }

        prop_compose! {
            fn config()(
                top in prop::collection::btree_map(unknown_key(), json(), 0..3),
                model_extra in prop::collection::btree_map(unknown_key(), json(), 0..3),
                tool_extra in prop::collection::btree_map(unknown_key(), json(), 0..2),
                temp in prop::option::of(0.0f64..2.0),
                max_turns in prop::option::of(0u64..1000),
                name in "[a-zA-Z0-9 ]{1,20}",
                enabled in any::<bool>(),
            ) -> Value {
                let mut v = fresh();
                v["name"] = json!(name);
                for (k, x) in top { v[k.as_str()] = x; }
                for (k, x) in model_extra { v["model"][k.as_str()] = x; }
                for (k, x) in tool_extra { v["tools"][0][k.as_str()] = x; }
                v["model"]["temperature"] = temp.map(Value::from).unwrap_or(Value::Null);
                v["limits"]["max_active_turns"] = max_turns.map(Value::from).unwrap_or(Value::Null);
                v["tools"][1]["enabled"] = json!(enabled);
                v
            }
        }

        fn collect_unknown(v: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
            if let Value::Object(m) = v {
                for (k, x) in m {
                    let p = format!("{prefix}/{k}");
                    if k.starts_with("x_") {
                        out.push((p, x.clone()));
                    } else {
                        collect_unknown(x, &p, out);
                    }
                }
            } else if let Value::Array(a) = v {
                for (i, x) in a.iter().enumerate() {
                    collect_unknown(x, &format!("{prefix}/{i}"), out);
                }
            }
        }

        proptest! {
            #[test]
            fn parse_serialise_parse_is_identity(v in config()) {
                let first = AgentConfig::from_value(&v).unwrap();
                let again = first.to_value();
                let second = AgentConfig::from_value(&again).unwrap();
                prop_assert_eq!(&first, &second);
                // Unknown keys survive, with their values.
                let mut unknown = Vec::new();
                collect_unknown(&v, "", &mut unknown);
                for (ptr, x) in unknown {
                    prop_assert_eq!(again.pointer(&ptr), Some(&x), "lost {}", ptr);
                }
                // Known nullable fields keep their null.
                prop_assert_eq!(again.pointer("/limits/max_active_turns"), v.pointer("/limits/max_active_turns"));
                prop_assert_eq!(again.pointer("/model/temperature"), v.pointer("/model/temperature"));
            }

            #[test]
            fn stored_text_round_trips(v in config()) {
                let text = serde_json::to_string(&v).unwrap();
                let back: Value = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(serde_json::to_string(&back).unwrap(), text);
            }

            #[test]
            fn set_then_get(v in config(), x in json()) {
                let mut v = v;
                set_path(&mut v, "model.x_probe", x.clone()).unwrap();
                prop_assert_eq!(get_path(&v, "model.x_probe"), Some(&x));
            }
        }
    }
}
