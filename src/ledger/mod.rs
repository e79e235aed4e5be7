//! The app-wide usage ledger (runtime.md §13, issue 19): every model call
//! any agent of this install makes (turns, compactions, `model_invoke`),
//! with its tokens and cost, in `usage.db` in the data folder, outside the
//! agent files. It answers `adf usage --by day|provider|model|agent`,
//! stays right across compaction (the file's rows are summarised away; the
//! ledger keeps every call), and holds what the fleet spent for the fleet
//! budget (`budget` in settings.json).
//!
//! Recording never blocks a turn: calls go over a channel to one writer
//! thread that commits them in batches. The fleet's spend is kept in memory
//! (what this process recorded, plus what the file said at the last
//! refresh) so a budget check costs a lock, not a query.

pub mod bench;
pub mod db;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crate::providers::Usage;
use crate::providers::prices::Prices;
use crate::runtime::budget::Budget;
use crate::store::spend::Spent;

pub use db::{By, LedgerError, Row};

/// How long what the fleet spent (as other processes add to it) is trusted.
const REFRESH: Duration = Duration::from_secs(2);

/// One model call.
#[derive(Debug, Clone, Default)]
pub struct Entry {
    pub ts_ms: i64,
    pub agent_id: String,
    pub agent: String,
    pub file: String,
    pub loop_name: String,
    pub provider: String,
    pub model: String,
    /// `turn`, `compaction` or `model_invoke`.
    pub call_source: &'static str,
    pub usage: Usage,
    /// The cost and where it came from (`provider` or the price list).
    pub cost: Option<(f64, &'static str)>,
}

impl Entry {
    pub fn tokens(&self) -> u64 {
        self.usage.total()
    }
}

/// The UTC day of a time in milliseconds.
pub fn day_of(ts_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ts_ms).unwrap_or_default().format("%Y-%m-%d").to_string()
}

enum Msg {
    Entry(Box<Entry>),
    Flush(mpsc::SyncSender<()>),
}

/// The fleet's spend as last known.
#[derive(Default)]
struct FleetSpend {
    day: String,
    spent: Spent,
    at: Option<Instant>,
    /// Calls recorded by this process (a refresh that raced one keeps the
    /// in-memory figure).
    recorded: u64,
    /// Worst cases reserved by calls in flight: (usd, tokens).
    reserved: (f64, u64),
}

/// A call's worst case held against the fleet budget until the call is
/// settled (or given up): dropped, it is released.
pub struct Reservation {
    ledger: Arc<Ledger>,
    usd: f64,
    tokens: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut f = lock(&self.ledger.fleet);
        f.reserved.0 = (f.reserved.0 - self.usd).max(0.0);
        f.reserved.1 = f.reserved.1.saturating_sub(self.tokens);
    }
}

/// The settings the ledger prices calls and checks the fleet budget with,
/// read again when settings.json changes.
#[derive(Default)]
struct FromSettings {
    prices: Arc<Prices>,
    budget: Option<Budget>,
    stamp: Option<SystemTime>,
    checked: Option<Instant>,
}

/// The ledger of one install.
pub struct Ledger {
    path: PathBuf,
    settings_path: Option<PathBuf>,
    tx: Mutex<Option<Sender<Msg>>>,
    fleet: Mutex<FleetSpend>,
    settings: Mutex<FromSettings>,
    notice: Arc<Mutex<Option<String>>>,
    /// A reading connection kept between reads, with the file it is on.
    reader: Mutex<Option<(u64, rusqlite::Connection)>>,
}

/// Which file is at `path` (its inode): a ledger moved aside and started
/// again is another file.
fn file_id(path: &Path) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        0
    }
}

static GLOBAL: OnceLock<Arc<Ledger>> = OnceLock::new();

/// Turn the install's ledger on for this process (the binary does; library
/// users and tests that do not call this record nothing).
pub fn enable() -> Arc<Ledger> {
    GLOBAL
        .get_or_init(|| {
            Arc::new(Ledger::new(
                crate::paths::data_dir().join("usage.db"),
                Some(crate::providers::accounts::settings_path()),
            ))
        })
        .clone()
}

/// The install's ledger, when this process turned it on.
pub fn global() -> Option<Arc<Ledger>> {
    GLOBAL.get().cloned()
}

/// Wait (a few seconds at most) until what was recorded is written.
pub fn flush() {
    if let Some(l) = global() {
        l.flush();
    }
}

impl Ledger {
    /// A ledger at `path` that reads prices and the fleet budget from
    /// `settings` (none: no prices, no fleet budget).
    pub fn new(path: PathBuf, settings: Option<PathBuf>) -> Ledger {
        Ledger {
            path,
            settings_path: settings,
            tx: Mutex::new(None),
            fleet: Mutex::new(FleetSpend::default()),
            settings: Mutex::new(FromSettings::default()),
            notice: Arc::new(Mutex::new(None)),
            reader: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record one call: counted in the fleet's spend at once, written by
    /// the writer thread soon after.
    pub fn record(&self, e: Entry) {
        {
            let mut f = lock(&self.fleet);
            let day = day_of(e.ts_ms);
            if f.day != day {
                // A new day: today's figures start again.
                f.day = day;
                f.spent.usd_day = 0.0;
                f.spent.tokens_day = 0;
            }
            let usd = e.cost.map(|c| c.0).unwrap_or(0.0);
            let t = e.tokens();
            f.recorded += 1;
            f.spent.usd_day += usd;
            f.spent.usd_total += usd;
            f.spent.tokens_day += t;
            f.spent.tokens_total += t;
        }
        let mut tx = lock(&self.tx);
        if tx.is_none() {
            *tx = Some(self.spawn_writer());
        }
        if let Some(t) = tx.as_ref()
            && t.send(Msg::Entry(Box::new(e))).is_err()
        {
            // The writer is gone (it could not open the file): say so once
            // and keep the turn going.
            *tx = None;
        }
    }

    /// Wait until everything recorded so far is committed (5 s at most).
    pub fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        let sent = lock(&self.tx).as_ref().is_some_and(|t| t.send(Msg::Flush(done)).is_ok());
        if sent {
            let _ = wait.recv_timeout(Duration::from_secs(5));
        }
    }

    fn spawn_writer(&self) -> Sender<Msg> {
        let (tx, rx) = mpsc::channel();
        let path = self.path.clone();
        let notice = self.notice.clone();
        let spawned = std::thread::Builder::new().name("adf-ledger".into()).spawn(move || writer(&path, rx, &notice));
        if let Err(e) = spawned {
            *lock(&self.notice) = Some(format!("usage ledger {}: no writer thread: {e}", self.path.display()));
        }
        tx
    }

    /// What went wrong with the ledger file, once (a corrupt file moved
    /// aside, a ledger that cannot be written).
    pub fn take_notice(&self) -> Option<String> {
        lock(&self.notice).take()
    }

    /// What the whole fleet spent today and in total, as of at most
    /// `REFRESH` ago (plus everything this process recorded since).
    pub fn fleet_spent(&self) -> Spent {
        let stale = lock(&self.fleet).at.is_none_or(|t| t.elapsed() > REFRESH);
        if stale {
            self.refresh();
        }
        lock(&self.fleet).spent
    }

    /// Check a call's worst case (`usd`: `None` when the model has no
    /// price) against the fleet's budget with what the fleet spent and
    /// what calls in flight reserved, and hold it until the call settles.
    /// One lock for the check and the hold: two agents calling at once
    /// cannot both pass on the same headroom.
    pub fn reserve(
        self: &Arc<Self>,
        budget: &Budget,
        usd: Option<f64>,
        tokens: u64,
    ) -> Result<Reservation, crate::runtime::budget::Exceeded> {
        let stale = lock(&self.fleet).at.is_none_or(|t| t.elapsed() > REFRESH);
        if stale {
            self.refresh();
        }
        let mut f = lock(&self.fleet);
        let mut seen = f.spent;
        seen.usd_day += f.reserved.0;
        seen.usd_total += f.reserved.0;
        seen.tokens_day += f.reserved.1;
        seen.tokens_total += f.reserved.1;
        crate::runtime::budget::check(crate::runtime::budget::FLEET, budget, &seen, usd, tokens)?;
        let usd = usd.unwrap_or(0.0);
        f.reserved.0 += usd;
        f.reserved.1 += tokens;
        drop(f);
        Ok(Reservation { ledger: self.clone(), usd, tokens })
    }

    /// Read the fleet's spend from the file again.
    fn refresh(&self) {
        let day = crate::store::spend::today();
        let read = || -> Result<_, LedgerError> { self.read(|c| db::totals(c, &day)) };
        // Flush first: what this process recorded is then in the file, and
        // the file's figure replaces the in-memory one without losing it
        // (unless a call was recorded meanwhile: then next time).
        let before = lock(&self.fleet).recorded;
        self.flush();
        let got = read();
        let mut f = lock(&self.fleet);
        f.at = Some(Instant::now());
        if f.recorded != before {
            f.at = None;
            return;
        }
        match got {
            Ok(Some((ud, td, ut, tt))) => {
                f.day = day;
                f.spent = Spent { usd_day: ud, tokens_day: td, usd_total: ut, tokens_total: tt };
            }
            Ok(None) => {}
            Err(e) => *lock(&self.notice) = Some(e.to_string()),
        }
    }

    /// The owner's price list and the fleet budget, from settings.json as
    /// it is now (read again at most every `REFRESH`, when it changed).
    pub fn settings(&self) -> (Arc<Prices>, Option<Budget>) {
        let mut s = lock(&self.settings);
        if s.checked.is_none_or(|t| t.elapsed() > REFRESH) {
            s.checked = Some(Instant::now());
            let stamp = self.settings_path.as_ref().and_then(|p| std::fs::metadata(p).ok()?.modified().ok());
            if stamp != s.stamp || s.stamp.is_none() {
                s.stamp = stamp;
                if let Some(p) = &self.settings_path {
                    let v: serde_json::Value =
                        std::fs::read_to_string(p).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
                    let settings: crate::providers::accounts::Settings =
                        serde_json::from_value(v.clone()).unwrap_or_default();
                    s.prices = Arc::new(crate::providers::prices::from_settings(&settings));
                    s.budget = v.get("budget").and_then(Budget::from_value);
                }
            }
        }
        (s.prices.clone(), s.budget)
    }

    /// Set the price list and the fleet budget by hand (tests, benches).
    pub fn set_settings(&self, prices: Prices, budget: Option<Budget>) {
        let mut s = lock(&self.settings);
        s.prices = Arc::new(prices);
        s.budget = budget;
        s.checked = Some(Instant::now() + Duration::from_secs(3600 * 24 * 365));
    }

    /// A report of the ledger (an empty one when no call was recorded).
    pub fn report(&self, by: By, since: Option<&str>) -> Result<Vec<Row>, LedgerError> {
        self.flush();
        Ok(self.read(|c| db::report(c, by, since))?.unwrap_or_default())
    }

    /// Run a read on the ledger's reading connection, opened once (`None`:
    /// no ledger yet). A file replaced since (moved aside) is opened anew.
    fn read<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>) -> Result<Option<T>, LedgerError> {
        if !self.path.exists() {
            return Ok(None);
        }
        let mut reader = lock(&self.reader);
        let stamp = file_id(&self.path);
        if reader.as_ref().is_none_or(|(id, _)| *id != stamp) {
            let o = db::open(&self.path)?;
            if let Some(m) = o.moved {
                *lock(&self.notice) = Some(m);
            }
            *reader = Some((file_id(&self.path), o.conn));
        }
        let Some((_, conn)) = reader.as_ref() else { return Ok(None) };
        f(conn).map(Some).map_err(|source| LedgerError::Sqlite { path: self.path.display().to_string(), source })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer thread: open once, then commit whatever has arrived in one
/// transaction each time.
fn writer(path: &Path, rx: Receiver<Msg>, notice: &Mutex<Option<String>>) {
    let mut conn = None;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        let mut waiters = Vec::new();
        let mut take = |m: Msg| match m {
            Msg::Entry(e) => batch.push(*e),
            Msg::Flush(w) => waiters.push(w),
        };
        take(first);
        while let Ok(m) = rx.try_recv() {
            take(m);
        }
        if !batch.is_empty() {
            if conn.is_none() {
                match db::open(path) {
                    Ok(o) => {
                        if let Some(m) = o.moved {
                            *lock(notice) = Some(m);
                        }
                        conn = Some(o.conn);
                    }
                    Err(e) => *lock(notice) = Some(e.to_string()),
                }
            }
            if let Some(c) = conn.as_mut()
                && let Err(e) = db::write(c, &batch)
            {
                *lock(notice) =
                    Some(format!("usage ledger {}: {e}; {} call(s) not recorded", path.display(), batch.len()));
                // Open again next time (the file may have been replaced).
                conn = None;
            }
        }
        for w in waiters {
            let _ = w.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(agent: &str, model: &str, ts_ms: i64, cost: Option<f64>) -> Entry {
        Entry {
            ts_ms,
            agent_id: agent.into(),
            agent: format!("name-{agent}"),
            file: format!("/f/{agent}.adf"),
            loop_name: "main".into(),
            provider: "p".into(),
            model: model.into(),
            call_source: "turn",
            usage: Usage { input: 100, output: 10, cache_read: Some(5), ..Default::default() },
            cost: cost.map(|c| (c, "provider")),
        }
    }

    const DAY1: i64 = 1_767_225_600_000; // 2026-01-01
    const DAY2: i64 = DAY1 + 86_400_000;

    #[test]
    fn reports_group_by_day_provider_model_and_agent_and_since_filters_days() {
        let dir = tempfile::tempdir().unwrap();
        let l = Ledger::new(dir.path().join("usage.db"), None);
        l.record(entry("a", "m1", DAY1, Some(0.5)));
        l.record(entry("a", "m2", DAY2, Some(0.25)));
        l.record(entry("b", "m1", DAY2, None));
        let days = l.report(By::Day, None).unwrap();
        assert_eq!(
            days.iter().map(|r| (r.key.as_str(), r.calls)).collect::<Vec<_>>(),
            [("2026-01-01", 1), ("2026-01-02", 2)]
        );
        assert_eq!(days[1].cost_usd, 0.25);
        assert_eq!(days[1].unpriced_calls, 1);
        assert_eq!(days[1].tokens(), 230);
        let agents = l.report(By::Agent, None).unwrap();
        assert_eq!(agents[0].key, "a");
        assert_eq!(agents[0].name.as_deref(), Some("name-a"));
        assert_eq!(agents[0].cost_usd, 0.75);
        let models = l.report(By::Model, Some("2026-01-02")).unwrap();
        assert_eq!(models.iter().map(|r| (r.key.as_str(), r.calls)).collect::<Vec<_>>(), [("m2", 1), ("m1", 1)]);
        assert_eq!(l.report(By::Provider, None).unwrap()[0].calls, 3);
    }

    #[test]
    fn two_ledgers_on_one_file_add_up_and_never_overwrite_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.db");
        let (a, b) = (Ledger::new(path.clone(), None), Ledger::new(path, None));
        for i in 0..50 {
            a.record(entry("a", "m", DAY1 + i, Some(0.01)));
            b.record(entry("b", "m", DAY1 + i, Some(0.01)));
        }
        a.flush();
        b.flush();
        let days = a.report(By::Day, None).unwrap();
        assert_eq!(days[0].calls, 100);
        assert!((days[0].cost_usd - 1.0).abs() < 1e-9);
    }

    #[test]
    fn fleet_spend_counts_at_once_and_is_read_back_by_another_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.db");
        let a = Ledger::new(path.clone(), None);
        let now = chrono::Utc::now().timestamp_millis();
        a.record(entry("a", "m", now, Some(1.5)));
        let s = a.fleet_spent();
        assert_eq!((s.usd_day, s.tokens_day), (1.5, 115));
        // Another process starting later sees it in the file.
        let b = Ledger::new(path, None);
        assert_eq!(b.fleet_spent().usd_total, 1.5);
    }

    #[test]
    fn reservations_hold_headroom_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let l = Arc::new(Ledger::new(dir.path().join("usage.db"), None));
        let b = Budget { tokens_day: Some(1_000), ..Default::default() };
        let first = l.reserve(&b, None, 600).unwrap();
        let e = l.reserve(&b, None, 600).map(|_| ()).unwrap_err();
        assert_eq!((e.which, e.spent), ("tokens_day", 600.0), "the first call's worst case is held");
        drop(first);
        assert!(l.reserve(&b, None, 600).is_ok(), "released");
    }

    #[test]
    fn a_corrupt_ledger_is_moved_aside_never_deleted_and_a_notice_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.db");
        std::fs::write(&path, b"this is not a sqlite database, it is forty-odd bytes of junk").unwrap();
        let l = Ledger::new(path.clone(), None);
        l.record(entry("a", "m", DAY1, Some(1.0)));
        assert_eq!(l.report(By::Day, None).unwrap()[0].calls, 1);
        let notice = l.take_notice().expect("a notice");
        assert!(notice.contains("corrupt") && notice.contains("moved aside"), "{notice}");
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert!(std::fs::read(aside[0].path()).unwrap().starts_with(b"this is not a sqlite"));
    }
}
