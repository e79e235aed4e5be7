//! Scoped, time-boxed grants (issue 19): the owner approves a restricted
//! tool for this agent ahead of time, for the next N minutes, or only for
//! calls whose arguments match a pattern (a path under a folder, a URL on a
//! host), or both. A call a live grant covers runs without asking; every
//! grant made, used and revoked is written to `adf_logs` (origin `grant`),
//! the agent's audit trail. Kept in `adfrs_grants`, made by the first
//! grant.
//!
//! Patterns are matched by structure, never as text: a path is compared
//! component by component (`notes` covers `notes/a.md`, not `notes2/`, and
//! no `..` passes), a host through the URL parser (`*.example.com` covers
//! `a.example.com`, not `example.com.evil`).

use rusqlite::params;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{Ctx, Result, StoreError, no_such_table};
use super::{Store, now_ms};

const DDL: &str = "CREATE TABLE IF NOT EXISTS adfrs_grants (
  id TEXT PRIMARY KEY,
  tool TEXT NOT NULL,
  path TEXT,
  host TEXT,
  expires_at INTEGER,
  note TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  uses INTEGER NOT NULL DEFAULT 0,
  last_used_at INTEGER
)";

/// One grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub tool: String,
    /// Calls whose `path` argument is this folder or under it.
    pub path: Option<String>,
    /// Calls whose `url` argument is on this host (`*.x` for subdomains).
    pub host: Option<String>,
    /// Unix ms after which it no longer applies (`None`: until revoked).
    pub expires_at: Option<i64>,
    pub note: String,
    pub created_at: i64,
    pub uses: i64,
    pub last_used_at: Option<i64>,
}

/// What the owner asks for.
#[derive(Debug, Clone, Default)]
pub struct NewGrant {
    pub tool: String,
    pub path: Option<String>,
    pub host: Option<String>,
    /// How long it lasts, in ms.
    pub for_ms: Option<i64>,
    pub note: String,
}

/// "30m", "2h", "1d", "90s" as milliseconds (at most 30 days).
pub fn parse_duration(s: &str) -> std::result::Result<i64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration: use a number and s, m, h or d (\"30m\", \"2h\")");
    let unit = t.chars().last().ok_or_else(bad)?;
    let n: i64 = t[..t.len() - unit.len_utf8()].parse().map_err(|_| bad())?;
    let ms = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return Err(bad()),
    };
    if n <= 0 {
        return Err(format!("{s:?}: a grant lasts a positive time"));
    }
    let total = n.checked_mul(ms).ok_or_else(bad)?;
    if total > 30 * 86_400_000 {
        return Err(format!("{s:?} is longer than 30 days: a grant is a short exception, not a policy"));
    }
    Ok(total)
}

/// A path pattern's components: relative, no `.` or `..`, not empty.
fn path_parts(p: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = p.trim_start_matches('/').split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if parts.is_empty() || parts.contains(&"..") { None } else { Some(parts) }
}

/// A host pattern: a host name the URL parser accepts, or `*.` and one.
fn check_host(h: &str) -> std::result::Result<String, String> {
    let lower = h.trim().to_ascii_lowercase();
    let bare = lower.strip_prefix("*.").unwrap_or(&lower);
    match url::Host::parse(bare) {
        Ok(url::Host::Domain(d)) if !d.is_empty() && !d.contains('*') => Ok(lower),
        Ok(url::Host::Ipv4(_) | url::Host::Ipv6(_)) if bare == lower => Ok(lower),
        _ => Err(format!("{h:?} is not a host: use a name (api.example.com), *.example.com or an IP address")),
    }
}

impl NewGrant {
    /// Check the patterns; a grant must narrow something (a time, a path
    /// or a host: one with none is "always", which `approve --always` is).
    pub fn check(mut self) -> std::result::Result<NewGrant, String> {
        if self.tool.trim().is_empty() {
            return Err("a grant names a tool".into());
        }
        if let Some(p) = &self.path {
            let parts = path_parts(p).ok_or_else(|| {
                format!("{p:?} is not a path pattern: a folder or file of the agent, without . or .. (notes/, data/in)")
            })?;
            self.path = Some(parts.join("/"));
        }
        if let Some(h) = &self.host {
            self.host = Some(check_host(h)?);
        }
        if self.path.is_none() && self.host.is_none() && self.for_ms.is_none() {
            return Err("a grant needs --for, --path or --host (approving a tool for good is approve --always)".into());
        }
        Ok(self)
    }
}

impl Grant {
    /// Does this grant cover a call of `tool` with `input` at `now`?
    pub fn covers(&self, tool: &str, input: &Value, now: i64) -> bool {
        if self.tool != tool || self.expires_at.is_some_and(|e| now >= e) {
            return false;
        }
        if let Some(p) = &self.path {
            let Some(want) = path_parts(p) else { return false };
            let Some(got) = input.get("path").and_then(Value::as_str).and_then(path_parts) else { return false };
            if got.len() < want.len() || got[..want.len()] != want[..] {
                return false;
            }
        }
        if let Some(h) = &self.host {
            let Some(host) = input
                .get("url")
                .and_then(Value::as_str)
                .and_then(|u| url::Url::parse(u).ok())
                .and_then(|u| u.host_str().map(|h| h.trim_end_matches('.').to_ascii_lowercase()))
            else {
                return false;
            };
            let ok = match h.strip_prefix("*.") {
                Some(base) => {
                    host.len() > base.len() && host.ends_with(base) && host[..host.len() - base.len()].ends_with('.')
                }
                None => &host == h,
            };
            if !ok {
                return false;
            }
        }
        true
    }

    fn describe(&self) -> String {
        let mut s = self.tool.clone();
        if let Some(p) = &self.path {
            s.push_str(&format!(" under {p}/"));
        }
        if let Some(h) = &self.host {
            s.push_str(&format!(" on {h}"));
        }
        if let Some(e) = self.expires_at.and_then(chrono::DateTime::from_timestamp_millis) {
            s.push_str(&format!(" until {}", e.format("%Y-%m-%d %H:%M UTC")));
        }
        s
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Grant> {
    Ok(Grant {
        id: r.get(0)?,
        tool: r.get(1)?,
        path: r.get(2)?,
        host: r.get(3)?,
        expires_at: r.get(4)?,
        note: r.get(5)?,
        created_at: r.get(6)?,
        uses: r.get(7)?,
        last_used_at: r.get(8)?,
    })
}

const COLS: &str = "id, tool, path, host, expires_at, note, created_at, uses, last_used_at";

impl Store {
    /// Add a grant (checked) and say so in the audit trail.
    pub fn grant_add(&mut self, g: NewGrant) -> Result<Grant> {
        let g = g.check().map_err(StoreError::Invalid)?;
        let now = now_ms();
        let grant = Grant {
            id: format!("g_{}", super::create::nanoid(8)),
            tool: g.tool,
            path: g.path,
            host: g.host,
            expires_at: g.for_ms.map(|ms| now + ms),
            note: g.note,
            created_at: now,
            uses: 0,
            last_used_at: None,
        };
        let path = self.path().to_path_buf();
        let gr = grant.clone();
        self.write(move |c| {
            c.execute_batch(DDL).at(&path)?;
            c.execute(
                &format!("INSERT INTO adfrs_grants({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, NULL)"),
                params![gr.id, gr.tool, gr.path, gr.host, gr.expires_at, gr.note, gr.created_at],
            )
            .at(&path)?;
            Ok(())
        })?;
        self.log("info", "grant", "grant_added", &format!("{}: {}", grant.id, grant.describe()))?;
        Ok(grant)
    }

    /// The grants, newest first; expired ones only with `all`.
    pub fn grant_list(&self, all: bool) -> Result<Vec<Grant>> {
        let sql = format!(
            "SELECT {COLS} FROM adfrs_grants WHERE ?1 OR expires_at IS NULL OR expires_at > ?2 ORDER BY created_at DESC"
        );
        let mut st = match self.conn().prepare_cached(&sql) {
            Ok(st) => st,
            Err(e) if no_such_table(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e).at(self.path()),
        };
        st.query_map(params![all, now_ms()], row).at(self.path())?.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }

    /// Revoke a grant; false when there is none.
    pub fn grant_remove(&mut self, id: &str) -> Result<bool> {
        let Some(g) = self.grant_list(true)?.into_iter().find(|g| g.id == id) else { return Ok(false) };
        let path = self.path().to_path_buf();
        let gid = id.to_string();
        self.write(move |c| c.execute("DELETE FROM adfrs_grants WHERE id = ?1", [gid]).at(&path).map(|_| ()))?;
        self.log("info", "grant", "grant_removed", &format!("{id}: {} (used {} times)", g.describe(), g.uses))?;
        Ok(true)
    }

    /// The live grant covering this call, counted as used and logged.
    pub fn grant_use(&mut self, tool: &str, input: &Value) -> Result<Option<Grant>> {
        let now = now_ms();
        let Some(g) = self.grant_list(false)?.into_iter().find(|g| g.covers(tool, input, now)) else { return Ok(None) };
        let path = self.path().to_path_buf();
        let gid = g.id.clone();
        self.write(move |c| {
            c.execute("UPDATE adfrs_grants SET uses = uses + 1, last_used_at = ?2 WHERE id = ?1", params![gid, now])
                .at(&path)
                .map(|_| ())
        })?;
        self.log("info", "grant", "grant_used", &format!("{}: {} approved by {}", tool, g.id, g.describe()))?;
        Ok(Some(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grant(path: Option<&str>, host: Option<&str>, expires_at: Option<i64>) -> Grant {
        Grant {
            id: "g".into(),
            tool: "t".into(),
            path: path.map(Into::into),
            host: host.map(Into::into),
            expires_at,
            note: String::new(),
            created_at: 0,
            uses: 0,
            last_used_at: None,
        }
    }

    #[test]
    fn paths_match_by_component_and_never_through_dot_dot() {
        let g = grant(Some("notes"), None, None);
        assert!(g.covers("t", &json!({"path": "notes/a.md"}), 0));
        assert!(g.covers("t", &json!({"path": "/notes/sub/b.md"}), 0));
        assert!(g.covers("t", &json!({"path": "notes"}), 0));
        assert!(!g.covers("t", &json!({"path": "notes2/a.md"}), 0));
        assert!(!g.covers("t", &json!({"path": "notes/../secrets.md"}), 0));
        assert!(!g.covers("t", &json!({"path": "other.md"}), 0));
        assert!(!g.covers("t", &json!({}), 0), "no path argument, no match");
        assert!(!g.covers("u", &json!({"path": "notes/a.md"}), 0), "another tool");
    }

    #[test]
    fn hosts_match_through_the_url_parser() {
        let g = grant(None, Some("api.example.com"), None);
        assert!(g.covers("t", &json!({"url": "https://API.example.com/v1"}), 0));
        assert!(!g.covers("t", &json!({"url": "https://api.example.com.evil.net/"}), 0));
        assert!(!g.covers("t", &json!({"url": "https://evil.net/?u=https://api.example.com"}), 0));
        assert!(!g.covers("t", &json!({"url": "https://user@evil.net@api.example.com.x/"}), 0));
        let w = grant(None, Some("*.example.com"), None);
        assert!(w.covers("t", &json!({"url": "https://a.b.example.com/"}), 0));
        assert!(!w.covers("t", &json!({"url": "https://example.com/"}), 0));
        assert!(!w.covers("t", &json!({"url": "https://badexample.com/"}), 0));
    }

    #[test]
    fn a_grant_ends_when_its_time_is_up() {
        let g = grant(None, None, Some(1_000));
        assert!(g.covers("t", &json!({}), 999));
        assert!(!g.covers("t", &json!({}), 1_000));
    }

    #[test]
    fn patterns_and_durations_that_do_not_parse_are_refused() {
        let ng = |path: Option<&str>, host: Option<&str>, for_ms| NewGrant {
            tool: "t".into(),
            path: path.map(Into::into),
            host: host.map(Into::into),
            for_ms,
            note: String::new(),
        };
        assert!(ng(Some("../x"), None, None).check().unwrap_err().contains("not a path pattern"));
        assert!(ng(Some("/"), None, None).check().is_err());
        assert!(ng(None, Some("exa mple.com"), None).check().unwrap_err().contains("not a host"));
        assert!(ng(None, Some("*.*.com"), None).check().is_err());
        assert!(ng(None, None, None).check().unwrap_err().contains("--for, --path or --host"));
        assert_eq!(ng(Some("./notes/"), None, None).check().unwrap().path.as_deref(), Some("notes"));
        assert_eq!(parse_duration("30m"), Ok(1_800_000));
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        for bad in ["", "m", "30", "-5m", "0m", "5w", "31d", "99999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
