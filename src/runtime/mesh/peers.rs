//! The peer table (messaging.md §13): every other runtime this one knows,
//! from three sources in one list, each row tagged with where it came from
//! (`mdns`, `manual`, `tailnet`), the runtime's id and DID once it answered,
//! and when it was last seen. One runtime reached by two sources is listed
//! under both but routed through one: mDNS wins, then a manual entry, then
//! the tailnet sweep (the better route is only passed over while it is
//! known to be dead). Delivery and `agent_discover` read [`PeerTable::routes`];
//! `adf peers` and `GET /peers` read [`PeerTable::list`].

use serde::Serialize;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    /// The peer runtime's mesh base URL (`http://host:port`).
    pub url: String,
    /// `mdns`, `manual` or `tailnet`.
    pub source: &'static str,
    /// The runtime's id, once it answered (`/ping` or its mDNS TXT record).
    pub runtime_id: Option<String>,
    pub runtime_did: Option<String>,
    /// The machine's name where the source gives one (the tailnet's host
    /// name, the manual entry as written).
    pub host: Option<String>,
    /// When it last answered or announced itself (ms since the epoch).
    pub last_seen: Option<i64>,
    /// Why the last probe failed, while it keeps failing.
    pub error: Option<String>,
    /// It signed a fresh nonce with the key of the DID it names (`None`:
    /// not asked, or it sent no proof).
    pub did_proven: Option<bool>,
}

/// Lower is preferred (mDNS wins).
fn rank(source: &str) -> u8 {
    match source {
        "mdns" => 0,
        "manual" => 1,
        _ => 2,
    }
}

/// What a source learnt about one URL.
#[derive(Debug, Clone, Default)]
pub struct Sighting<'a> {
    pub runtime_id: Option<&'a str>,
    pub runtime_did: Option<&'a str>,
    pub host: Option<&'a str>,
    pub at: Option<i64>,
    pub did_proven: Option<bool>,
}

#[derive(Debug, Default)]
pub struct PeerTable {
    rows: Vec<Peer>,
}

impl PeerTable {
    /// A row for `url` from `source`, or what it learnt added to the row
    /// that source already has for it. Another source's row for the same
    /// URL is left as it is (each source keeps its own row).
    pub fn upsert(&mut self, url: &str, source: &'static str, seen: Sighting<'_>) {
        let url = url.trim_end_matches('/');
        let row = match self.rows.iter_mut().find(|p| p.url == url && p.source == source) {
            Some(r) => r,
            None => {
                self.rows.push(Peer {
                    url: url.to_string(),
                    source,
                    runtime_id: None,
                    runtime_did: None,
                    host: None,
                    last_seen: None,
                    error: None,
                    did_proven: None,
                });
                let last = self.rows.len() - 1;
                &mut self.rows[last]
            }
        };
        if let Some(id) = seen.runtime_id {
            row.runtime_id = Some(id.to_string());
        }
        if let Some(d) = seen.runtime_did {
            row.runtime_did = Some(d.to_string());
        }
        if let Some(h) = seen.host {
            row.host = Some(h.to_string());
        }
        if seen.at.is_some() {
            row.last_seen = seen.at;
            row.error = None;
        }
        if seen.did_proven.is_some() {
            row.did_proven = seen.did_proven;
        }
    }

    /// The last probe of `source`'s row for `url` failed.
    pub fn failed(&mut self, url: &str, source: &str, why: &str) {
        if let Some(r) = self.rows.iter_mut().find(|p| p.url == url && p.source == source) {
            r.error = Some(why.to_string());
        }
    }

    /// Forget `source`'s row for `url`.
    pub fn remove(&mut self, url: &str, source: &str) {
        self.rows.retain(|p| !(p.url == url && p.source == source));
    }

    /// Forget the rows of `source` that name `runtime_id`.
    pub fn expire(&mut self, runtime_id: &str, source: &str) {
        self.rows.retain(|p| !(p.source == source && p.runtime_id.as_deref() == Some(runtime_id)));
    }

    /// Every row, in the order they were found.
    pub fn list(&self) -> Vec<Peer> {
        self.rows.clone()
    }

    /// The row that carries traffic to the runtime of `row`, when another
    /// one does: for the same runtime (or the same URL), a row that
    /// answers where this one fails, else one of a better source.
    pub fn shadowed_by(&self, row: &Peer) -> Option<&Peer> {
        let key = |p: &Peer| (p.error.is_some(), rank(p.source), p.url.clone());
        self.rows.iter().filter(|o| !std::ptr::eq(*o, row)).find(|o| {
            (o.url == row.url || (o.runtime_id.is_some() && o.runtime_id == row.runtime_id)) && key(o) < key(row)
        })
    }

    /// One route per runtime: `(url, source)` of every row no better row
    /// shadows (a manual entry that never answered is still tried).
    pub fn routes(&self) -> Vec<(String, &'static str)> {
        self.rows.iter().filter(|r| self.shadowed_by(r).is_none()).map(|r| (r.url.clone(), r.source)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(id: &str, at: i64) -> Sighting<'_> {
        Sighting { runtime_id: Some(id), at: Some(at), ..Default::default() }
    }

    #[test]
    fn mdns_wins_a_runtime_found_twice_and_each_source_keeps_its_row() {
        let mut t = PeerTable::default();
        t.upsert("http://100.64.0.2:7295/", "tailnet", seen("r1", 1));
        t.upsert("http://10.0.0.2:7295", "manual", seen("r1", 2));
        assert_eq!(t.routes(), vec![("http://10.0.0.2:7295".to_string(), "manual")]);
        t.upsert("http://192.168.1.2:7295", "mdns", seen("r1", 3));
        assert_eq!(t.routes(), vec![("http://192.168.1.2:7295".to_string(), "mdns")]);
        assert_eq!(t.list().len(), 3, "each source's row is listed");
        // The mDNS route dies: the next best carries the traffic.
        t.failed("http://192.168.1.2:7295", "mdns", "connection refused");
        assert_eq!(t.routes(), vec![("http://10.0.0.2:7295".to_string(), "manual")]);
        // Another runtime is its own route.
        t.upsert("http://100.64.0.3:7295", "tailnet", seen("r2", 4));
        assert_eq!(t.routes().len(), 2);
        t.expire("r2", "tailnet");
        t.expire("r1", "mdns");
        assert_eq!(t.list().len(), 2, "expire takes only that source's rows");
    }

    #[test]
    fn a_manual_entry_that_never_answered_is_still_a_route_and_says_why() {
        let mut t = PeerTable::default();
        t.upsert("http://box:7295", "manual", Sighting { host: Some("box"), ..Default::default() });
        t.failed("http://box:7295", "manual", "timed out");
        assert_eq!(t.routes(), vec![("http://box:7295".to_string(), "manual")]);
        assert_eq!(t.list()[0].error.as_deref(), Some("timed out"));
        // An answer clears the error and records who answered.
        t.upsert("http://box:7295", "manual", seen("r9", 5));
        let row = &t.list()[0];
        assert_eq!((row.error.as_ref(), row.runtime_id.as_deref(), row.last_seen), (None, Some("r9"), Some(5)));
        assert_eq!(row.host.as_deref(), Some("box"));
        t.remove("http://box:7295", "manual");
        assert!(t.list().is_empty());
    }

    #[test]
    fn the_same_url_from_two_sources_is_one_route() {
        let mut t = PeerTable::default();
        t.upsert("http://h:1", "manual", Sighting::default());
        t.upsert("http://h:1", "mdns", Sighting::default());
        assert_eq!(t.routes(), vec![("http://h:1".to_string(), "mdns")]);
    }
}
