//! Side loops (issue 18, runtime.md §12): up to 16 named loops beside
//! `main`, each with its own goal, tools, model and stream, all sharing the
//! file. The reference (schema 28) knows one loop, `adf_loop`, and must keep
//! seeing exactly `main` there, so side-loop rows live in adf's own
//! `adfrs_loop_rows`, and the loops themselves in `adfrs_loops`. The tables
//! are made by the first loop created: a file without side loops stays as it
//! was. Sequence numbers are one space: a side row takes its `seq` from
//! `adf_loop`'s AUTOINCREMENT counter (`sqlite_sequence`), so no seq is ever
//! used twice across loops and `[S<seq>]` citations stay unambiguous.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{Ctx, Result, StoreError, no_such_column, no_such_table, opt_text_lossy, text_lossy};
use super::loop_rows::{LoopRow, NewLoopRow};
use super::{Store, now_ms};

/// Side loops an agent may have beside `main`.
pub const MAX_SIDE_LOOPS: usize = 16;

/// Turns a continuous loop takes on one wake when it sets no `max_turns`.
pub const DEFAULT_MAX_TURNS: u32 = 20;
/// The most a loop may set: a runaway loop is stopped by this or its budget.
pub const MAX_TURNS_LIMIT: u32 = 1_000;

/// Tools a side loop never gets, whatever its allowlist says (besides every
/// restricted tool): it attenuates the agent, never escalates it.
pub const FORBIDDEN: &[&str] = &["sys_update_config", "loop_manage", "sys_create_adf"];

const DDL: &str = "
CREATE TABLE IF NOT EXISTS adfrs_loops (
  name TEXT PRIMARY KEY,
  goal TEXT NOT NULL DEFAULT '',
  tools TEXT,
  model TEXT,
  compact_threshold INTEGER,
  mode TEXT NOT NULL DEFAULT 'reactive',
  schedule TEXT,
  template TEXT,
  budget TEXT,
  max_turns INTEGER,
  status TEXT NOT NULL DEFAULT 'idle',
  next_run_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS adfrs_loop_rows (
  seq INTEGER PRIMARY KEY,
  loop TEXT NOT NULL,
  role TEXT NOT NULL,
  content_json TEXT NOT NULL,
  model TEXT,
  tokens TEXT,
  created_at INTEGER NOT NULL,
  ord INTEGER
);
CREATE INDEX IF NOT EXISTS idx_adfrs_loop_rows_loop ON adfrs_loop_rows(loop, seq);
CREATE TABLE IF NOT EXISTS adfrs_loop_mail (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  loop TEXT NOT NULL,
  sender TEXT NOT NULL,
  text TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
";

/// How a side loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LoopMode {
    /// Runs when sent a message (`loop_send` with wake, a chat).
    #[default]
    Reactive,
    /// Runs on its schedule (a cron expression or `every <duration>`).
    Scheduled,
    /// Keeps turning, up to its turn limit, each time it is woken.
    Continuous,
}

impl LoopMode {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "reactive" => Self::Reactive,
            "scheduled" => Self::Scheduled,
            "continuous" => Self::Continuous,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reactive => "reactive",
            Self::Scheduled => "scheduled",
            Self::Continuous => "continuous",
        }
    }
}

/// One side loop as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopDef {
    pub name: String,
    pub goal: String,
    /// The allowlist; `None` is every tool the agent has (still less the
    /// forbidden and restricted ones).
    pub tools: Option<Vec<String>>,
    pub model: Option<String>,
    pub compact_threshold: Option<u64>,
    pub mode: LoopMode,
    pub schedule: Option<String>,
    pub template: Option<String>,
    /// Its own budget (`limits.budget`'s shape), on top of the agent's.
    pub budget: Option<Value>,
    /// Turns a continuous loop takes on one wake (`None`: the default, 20).
    pub max_turns: Option<u32>,
    /// `idle`, `active`, `paused` or `error`.
    pub status: String,
    pub next_run_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What `loop_create`/`loop_update` set (absent fields keep their value).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LoopSpec {
    pub goal: Option<String>,
    pub tools: Option<Vec<String>>,
    pub model: Option<String>,
    pub compact_threshold: Option<u64>,
    pub mode: Option<LoopMode>,
    pub schedule: Option<String>,
    pub template: Option<String>,
    pub budget: Option<Value>,
    /// `Some(0)` on update clears it back to the default.
    pub max_turns: Option<u32>,
}

/// A message waiting for a loop's next model boundary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopMail {
    pub id: i64,
    pub sender: String,
    pub text: String,
    pub created_at: i64,
}

/// Check a loop name: 1–32 of `a-z 0-9 _ -`, starting with a letter, and
/// not `main`.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        return Err(format!(
            "loop name {name:?} is not valid: use 1 to 32 of a-z, 0-9, _ and -, starting with a letter"
        ));
    }
    if name == "main" {
        return Err("\"main\" is the agent's own loop; a side loop needs another name".into());
    }
    Ok(())
}

/// A schedule's next run after `after` (ms): a cron expression, or
/// `every <n><s|m|h|d>`.
pub fn next_run(schedule: &str, after: i64) -> std::result::Result<i64, String> {
    let s = schedule.trim();
    if let Some(rest) = s.strip_prefix("every ").or_else(|| s.strip_prefix("@every ")) {
        return parse_every(rest.trim()).map(|ms| after + ms);
    }
    crate::tools::timers::next_cron(s, after)
}

fn parse_every(s: &str) -> std::result::Result<i64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: i64 = n.parse().map_err(|_| format!("\"every {s}\": expected a number then s, m, h or d (every 30m)"))?;
    let ms = match unit.trim() {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("\"every {s}\": the unit is s, m, h or d (every 30m)")),
    };
    if n <= 0 || n.checked_mul(ms).is_none_or(|v| v < 10_000) {
        return Err(format!("\"every {s}\": runs must be at least 10 s apart"));
    }
    Ok(n * ms)
}

fn def_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LoopDef> {
    let tools: Option<String> = r.get(2)?;
    Ok(LoopDef {
        name: text_lossy(r, 0)?,
        goal: text_lossy(r, 1)?,
        tools: tools.and_then(|t| serde_json::from_str(&t).ok()),
        model: opt_text_lossy(r, 3)?,
        compact_threshold: r.get::<_, Option<i64>>(4)?.map(|v| v.max(0) as u64),
        mode: LoopMode::parse(&text_lossy(r, 5)?).unwrap_or_default(),
        schedule: opt_text_lossy(r, 6)?,
        template: opt_text_lossy(r, 7)?,
        budget: opt_text_lossy(r, 8)?.and_then(|b| serde_json::from_str(&b).ok()),
        status: text_lossy(r, 9)?,
        next_run_at: r.get(10)?,
        created_at: r.get(11)?,
        updated_at: r.get(12)?,
        max_turns: r.get::<_, Option<i64>>(13)?.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0),
    })
}

const DEF_COLUMNS: &str = "name, goal, tools, model, compact_threshold, mode, schedule, template, budget, status, \
                           next_run_at, created_at, updated_at, max_turns";
/// Columns added to `adfrs_loops` after its first version, added to an
/// older file's table by the first write that needs them.
const ADDED_COLUMNS: &[(&str, &str)] = &[("budget", "budget TEXT"), ("max_turns", "max_turns INTEGER")];

fn add_missing_columns(tx: &Connection) -> rusqlite::Result<()> {
    let have = super::schema::table_columns(tx, "adfrs_loops")?;
    for (col, def) in ADDED_COLUMNS {
        if !have.iter().any(|c| c.eq_ignore_ascii_case(col)) {
            tx.execute_batch(&format!("ALTER TABLE adfrs_loops ADD COLUMN {def}"))?;
        }
    }
    Ok(())
}

/// `DEF_COLUMNS` for a table an older adf made: a column it lacks reads
/// as NULL (unset) until a write adds it.
fn def_columns_of(conn: &Connection) -> rusqlite::Result<String> {
    let have = super::schema::table_columns(conn, "adfrs_loops")?;
    let cols: Vec<&str> = DEF_COLUMNS
        .split(',')
        .map(str::trim)
        .map(|c| if have.iter().any(|h| h.eq_ignore_ascii_case(c)) { c } else { "NULL" })
        .collect();
    Ok(cols.join(", "))
}

/// Check a `max_turns`: 1 to `MAX_TURNS_LIMIT` (0 clears it on update).
pub fn check_max_turns(n: u64) -> std::result::Result<u32, String> {
    u32::try_from(n).ok().filter(|n| *n <= MAX_TURNS_LIMIT).ok_or_else(|| {
        format!(
            "max_turns {n}: a loop takes 1 to {MAX_TURNS_LIMIT} turns a wake (0 sets the default, {DEFAULT_MAX_TURNS})"
        )
    })
}

impl LoopDef {
    /// Turns this loop takes on one wake when continuous.
    pub fn turn_limit(&self) -> u32 {
        self.max_turns.unwrap_or(DEFAULT_MAX_TURNS)
    }
}

/// The next seq of the shared space, taken from `adf_loop`'s counter (one
/// more than any seq ever used by any loop), inside the caller's write.
fn take_seq(tx: &Connection) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO sqlite_sequence(name, seq) SELECT 'adf_loop', 0
         WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'adf_loop')",
        [],
    )?;
    tx.query_row(
        "UPDATE sqlite_sequence SET seq = max(seq,
            (SELECT COALESCE(MAX(seq), 0) FROM adf_loop),
            (SELECT COALESCE(MAX(seq), 0) FROM adfrs_loop_rows)) + 1
         WHERE name = 'adf_loop' RETURNING seq",
        [],
        |r| r.get(0),
    )
}

fn insert_row(tx: &Connection, name: &str, row: &NewLoopRow<'_>, created_at: i64) -> rusqlite::Result<i64> {
    let seq = take_seq(tx)?;
    tx.prepare_cached(
        "INSERT INTO adfrs_loop_rows(seq, loop, role, content_json, model, tokens, created_at, ord)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        seq,
        name,
        row.role,
        serde_json::to_string(row.content).unwrap_or_else(|_| "[]".into()),
        row.model,
        row.tokens.map(|t| t.to_string()),
        created_at,
        row.ord
    ])?;
    Ok(seq)
}

impl Store {
    /// The side loops, by name (none when the file never had one).
    pub fn loops_list(&self) -> Result<Vec<LoopDef>> {
        let sql = format!("SELECT {DEF_COLUMNS} FROM adfrs_loops ORDER BY name");
        let mut stmt = match self.conn().prepare_cached(&sql) {
            Ok(s) => s,
            Err(e) if no_such_table(&e) => return Ok(Vec::new()),
            Err(e) if no_such_column(&e) => {
                let cols = def_columns_of(self.conn()).at(self.path())?;
                self.conn().prepare_cached(&format!("SELECT {cols} FROM adfrs_loops ORDER BY name")).at(self.path())?
            }
            Err(e) => return Err(e).at(self.path()),
        };
        stmt.query_map([], def_from_row).at(self.path())?.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }

    /// One side loop.
    pub fn loop_get(&self, name: &str) -> Result<Option<LoopDef>> {
        let sql = format!("SELECT {DEF_COLUMNS} FROM adfrs_loops WHERE name = ?1");
        match self.conn().query_row(&sql, [name], def_from_row).optional() {
            Ok(d) => Ok(d),
            Err(e) if no_such_table(&e) => Ok(None),
            Err(e) if no_such_column(&e) => {
                let cols = def_columns_of(self.conn()).at(self.path())?;
                let sql = format!("SELECT {cols} FROM adfrs_loops WHERE name = ?1");
                self.conn().query_row(&sql, [name], def_from_row).optional().at(self.path())
            }
            Err(e) => Err(e).at(self.path()),
        }
    }

    /// Create a side loop. Refused past `MAX_SIDE_LOOPS`, for a name in
    /// use or not valid, a bad schedule, or a scheduled loop without one.
    pub fn loop_create(&mut self, name: &str, spec: &LoopSpec) -> Result<LoopDef> {
        if name == "main" {
            return Err(StoreError::Conflict(
                "\"main\" is the agent's own loop; a side loop needs another name".into(),
            ));
        }
        check_name(name).map_err(StoreError::Invalid)?;
        check_budget(spec.budget.as_ref())?;
        if let Some(n) = spec.max_turns {
            check_max_turns(u64::from(n)).map_err(StoreError::Invalid)?;
        }
        let mode = spec.mode.unwrap_or_default();
        let now = now_ms();
        let next = first_run(mode, spec.schedule.as_deref(), now)?;
        let path = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute_batch(DDL).at(&path)?;
            add_missing_columns(tx).at(&path)?;
            let n: i64 = tx.query_row("SELECT COUNT(*) FROM adfrs_loops", [], |r| r.get(0)).at(&path)?;
            let exists: bool = tx
                .query_row("SELECT 1 FROM adfrs_loops WHERE name = ?1", [name], |_| Ok(true))
                .optional()
                .at(&path)?
                .unwrap_or(false);
            if exists {
                return Err(StoreError::Conflict(format!("a loop named {name:?} already exists")));
            }
            if n as usize >= MAX_SIDE_LOOPS {
                return Err(StoreError::Conflict(format!(
                    "an agent has at most {MAX_SIDE_LOOPS} side loops; delete one first"
                )));
            }
            tx.execute(
                "INSERT INTO adfrs_loops(name, goal, tools, model, compact_threshold, mode, schedule, template,
                   budget, max_turns, status, next_run_at, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?11, ?12, 'idle', ?9, ?10, ?10)",
                params![
                    name,
                    spec.goal.as_deref().unwrap_or(""),
                    spec.tools.as_ref().map(|t| serde_json::to_string(t).unwrap_or_default()),
                    spec.model,
                    spec.compact_threshold.map(|v| v as i64),
                    mode.as_str(),
                    spec.schedule,
                    spec.template,
                    next,
                    now,
                    spec.budget.as_ref().filter(|b| !b.is_null()).map(Value::to_string),
                    spec.max_turns.filter(|n| *n > 0).map(i64::from)
                ],
            )
            .at(&path)?;
            Ok(())
        })?;
        self.loop_get(name)?.ok_or_else(|| StoreError::Invalid(format!("loop {name:?} vanished after its creation")))
    }

    /// Change a side loop's definition (absent fields keep their value).
    pub fn loop_update(&mut self, name: &str, spec: &LoopSpec) -> Result<LoopDef> {
        check_budget(spec.budget.as_ref())?;
        if let Some(n) = spec.max_turns {
            check_max_turns(u64::from(n)).map_err(StoreError::Invalid)?;
        }
        let Some(mut d) = self.loop_get(name)? else {
            return Err(StoreError::Missing(format!("no loop named {name:?}")));
        };
        if let Some(g) = &spec.goal {
            d.goal = g.clone();
        }
        if spec.tools.is_some() {
            d.tools = spec.tools.clone();
        }
        if spec.model.is_some() {
            d.model = spec.model.clone().filter(|m| !m.is_empty());
        }
        if spec.compact_threshold.is_some() {
            d.compact_threshold = spec.compact_threshold;
        }
        if spec.schedule.is_some() {
            d.schedule = spec.schedule.clone().filter(|s| !s.is_empty());
        }
        if let Some(m) = spec.mode {
            d.mode = m;
        }
        if let Some(b) = &spec.budget {
            d.budget = Some(b.clone()).filter(|b| !b.is_null());
        }
        if let Some(n) = spec.max_turns {
            d.max_turns = Some(n).filter(|n| *n > 0);
        }
        let now = now_ms();
        let next = first_run(d.mode, d.schedule.as_deref(), now)?;
        let path = self.path().to_path_buf();
        self.write(|tx| {
            add_missing_columns(tx).at(&path)?;
            tx.execute(
                "UPDATE adfrs_loops SET goal = ?2, tools = ?3, model = ?4, compact_threshold = ?5, mode = ?6,
                   schedule = ?7, next_run_at = ?8, updated_at = ?9, budget = ?10, max_turns = ?11 WHERE name = ?1",
                params![
                    name,
                    d.goal,
                    d.tools.as_ref().map(|t| serde_json::to_string(t).unwrap_or_default()),
                    d.model,
                    d.compact_threshold.map(|v| v as i64),
                    d.mode.as_str(),
                    d.schedule,
                    next,
                    now,
                    d.budget.as_ref().map(Value::to_string),
                    d.max_turns.map(i64::from)
                ],
            )
            .at(&path)
            .map(|_| ())
        })?;
        self.loop_get(name)?.ok_or_else(|| StoreError::Missing(format!("no loop named {name:?}")))
    }

    /// Set a loop's status and next scheduled run.
    pub fn loop_set_status(&mut self, name: &str, status: &str, next_run_at: Option<i64>) -> Result<()> {
        let path = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute(
                "UPDATE adfrs_loops SET status = ?2, next_run_at = ?3, updated_at = ?4 WHERE name = ?1",
                params![name, status, next_run_at, now_ms()],
            )
            .at(&path)
            .map(|_| ())
        })
    }

    /// Delete a side loop: its whole stream goes to the audit archive
    /// (source `loop:<name>`) in the same transaction that removes it, with
    /// its definition and undelivered mail. Returns the rows archived.
    pub fn loop_delete(&mut self, name: &str) -> Result<usize> {
        if self.loop_get(name)?.is_none() {
            return Err(StoreError::Missing(format!("no loop named {name:?}")));
        }
        let rows = self.side_rows(name)?;
        let path = self.path().to_path_buf();
        let source = format!("loop:{name}");
        self.write(|tx| {
            if let (Some(start), Some(end)) = (rows.first().map(|r| r.seq), rows.iter().map(|r| r.seq).max()) {
                let json = serde_json::to_vec(&rows).unwrap_or_default();
                super::audit::append_json(tx, &source, super::audit::Address::Seqs { start, end }, rows.len(), &json)
                    .at(&path)?;
            }
            for sql in [
                "DELETE FROM adfrs_loop_rows WHERE loop = ?1",
                "DELETE FROM adfrs_loop_mail WHERE loop = ?1",
                "DELETE FROM adfrs_loops WHERE name = ?1",
            ] {
                tx.execute(sql, [name]).at(&path)?;
            }
            Ok(rows.len())
        })
    }

    /// A side loop's rows in loop order.
    pub fn side_rows(&self, name: &str) -> Result<Vec<LoopRow>> {
        self.side_query(
            &format!(
                "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adfrs_loop_rows
                 WHERE loop = ?1 ORDER BY {}",
                super::loop_rows::ORDER
            ),
            params![name],
        )
    }

    /// A side loop's rows appended after `seq`, in order.
    pub fn side_rows_after(&self, name: &str, seq: i64) -> Result<Vec<LoopRow>> {
        self.side_query(
            &format!(
                "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adfrs_loop_rows
                 WHERE loop = ?1 AND seq > ?2 ORDER BY {}",
                super::loop_rows::ORDER
            ),
            params![name, seq],
        )
    }

    fn side_query(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<LoopRow>> {
        let mut stmt = match self.conn().prepare_cached(sql) {
            Ok(s) => s,
            Err(e) if no_such_table(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e).at(self.path()),
        };
        stmt.query_map(args, super::loop_rows::row_from)
            .at(self.path())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(self.path())
    }

    /// Append a row to a side loop.
    pub fn side_append_row(&mut self, name: &str, row: &NewLoopRow<'_>) -> Result<LoopRow> {
        let created_at = now_ms();
        let path = self.path().to_path_buf();
        let seq = self.write(|tx| insert_row(tx, name, row, created_at).at(&path))?;
        Ok(row.stored(seq, created_at))
    }

    /// `loop_replace` for a side loop: remove rows (archived first, source
    /// `loop:<name>`) and optionally insert one, in one transaction.
    pub fn side_replace(
        &mut self,
        name: &str,
        remove: &[LoopRow],
        archive: bool,
        insert: Option<&NewLoopRow<'_>>,
    ) -> Result<Option<i64>> {
        let archived = (archive && !remove.is_empty()).then(|| serde_json::to_vec(remove).unwrap_or_default());
        let path = self.path().to_path_buf();
        let source = format!("loop:{name}");
        self.write(|tx| {
            if let (Some(json), Some(start), Some(end)) =
                (&archived, remove.iter().map(|r| r.seq).min(), remove.iter().map(|r| r.seq).max())
            {
                super::audit::append_json(tx, &source, super::audit::Address::Seqs { start, end }, remove.len(), json)
                    .at(&path)?;
            }
            let mut del = tx.prepare_cached("DELETE FROM adfrs_loop_rows WHERE seq = ?1 AND loop = ?2").at(&path)?;
            for r in remove {
                del.execute(params![r.seq, name]).at(&path)?;
            }
            match insert {
                Some(row) => insert_row(tx, name, row, now_ms()).map(Some).at(&path),
                None => Ok(None),
            }
        })
    }

    /// Queue a message for a loop's next model boundary (`main` included).
    pub fn loop_mail_put(&mut self, target: &str, sender: &str, text: &str) -> Result<i64> {
        let path = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute_batch(DDL).at(&path)?;
            tx.execute(
                "INSERT INTO adfrs_loop_mail(loop, sender, text, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![target, sender, text, now_ms()],
            )
            .at(&path)?;
            Ok(tx.last_insert_rowid())
        })
    }

    /// How many messages wait for a loop.
    pub fn loop_mail_waiting(&self, target: &str) -> Result<i64> {
        match self.conn().query_row("SELECT COUNT(*) FROM adfrs_loop_mail WHERE loop = ?1", [target], |r| r.get(0)) {
            Ok(n) => Ok(n),
            Err(e) if no_such_table(&e) => Ok(0),
            Err(e) => Err(e).at(self.path()),
        }
    }

    /// Take (and remove) what waits for a loop, oldest first.
    pub fn loop_mail_take(&mut self, target: &str) -> Result<Vec<LoopMail>> {
        if self.loop_mail_waiting(target)? == 0 {
            return Ok(Vec::new());
        }
        let path = self.path().to_path_buf();
        self.write(|tx| {
            let mut stmt = tx
                .prepare("DELETE FROM adfrs_loop_mail WHERE loop = ?1 RETURNING id, sender, text, created_at")
                .at(&path)?;
            let mut mail = stmt
                .query_map([target], |r| {
                    Ok(LoopMail { id: r.get(0)?, sender: r.get(1)?, text: r.get(2)?, created_at: r.get(3)? })
                })
                .at(&path)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .at(&path)?;
            mail.sort_by_key(|m| m.id);
            Ok(mail)
        })
    }

    /// How many messages wait for each loop.
    pub fn loop_mail_counts(&self) -> Result<Vec<(String, i64)>> {
        let mut stmt = match self
            .conn()
            .prepare_cached("SELECT loop, COUNT(*) FROM adfrs_loop_mail GROUP BY loop ORDER BY loop")
        {
            Ok(s) => s,
            Err(e) if no_such_table(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e).at(self.path()),
        };
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .at(self.path())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(self.path())
    }
}

/// A loop's budget has `limits.budget`'s shape.
fn check_budget(b: Option<&Value>) -> Result<()> {
    let Some(b) = b.filter(|b| !b.is_null()) else { return Ok(()) };
    crate::runtime::budget::parse(b, "the loop's budget").map(|_| ()).map_err(StoreError::Invalid)
}

/// The first scheduled run of a loop (scheduled mode only; the others
/// have none).
fn first_run(mode: LoopMode, schedule: Option<&str>, now: i64) -> Result<Option<i64>> {
    match (mode, schedule) {
        (LoopMode::Scheduled, None) => Err(StoreError::Invalid(
            "a scheduled loop needs a schedule: a cron expression (\"0 * * * *\") or \"every 30m\"".into(),
        )),
        (_, Some(s)) => {
            next_run(s, now).map(|t| (mode == LoopMode::Scheduled).then_some(t)).map_err(StoreError::Invalid)
        }
        _ => Ok(None),
    }
}

/// The tools a side loop may use: its allowlist ∩ what the agent has
/// enabled, less the forbidden and the restricted ones.
pub fn allowed(def: &LoopDef, name: &str, enabled: bool, restricted: bool) -> bool {
    enabled
        && !restricted
        && !FORBIDDEN.contains(&name)
        && def.tools.as_ref().is_none_or(|list| list.iter().any(|t| t == name))
}

/// The loop definition as the JSON the CLI and API show.
/// `turn_limit` is what a continuous loop takes a wake, set or default.
pub fn to_json(def: &LoopDef) -> Value {
    let mut v = serde_json::to_value(def).unwrap_or(Value::Null);
    v["turn_limit"] = Value::from(def.turn_limit());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_schedules_and_the_allowlist() {
        assert!(check_name("research").is_ok());
        assert!(check_name("main").is_err());
        assert!(check_name("Bad").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(33)).is_err());
        assert_eq!(next_run("every 30m", 1000).unwrap(), 1000 + 1_800_000);
        assert!(next_run("every 5s", 0).is_err(), "too often");
        assert!(next_run("every 3x", 0).is_err());
        assert!(next_run("0 * * * *", 0).unwrap() > 0);
        assert!(next_run("not cron", 0).is_err());
        assert_eq!(check_max_turns(5), Ok(5));
        for bad in [1_001, u64::from(u32::MAX) + 1] {
            assert!(check_max_turns(bad).unwrap_err().contains("1 to 1000"), "{bad}");
        }
        let mut d = LoopDef {
            name: "r".into(),
            goal: String::new(),
            tools: Some(vec!["fs_read".into(), "sys_update_config".into()]),
            model: None,
            compact_threshold: None,
            mode: LoopMode::Reactive,
            schedule: None,
            template: None,
            budget: None,
            max_turns: None,
            status: "idle".into(),
            next_run_at: None,
            created_at: 0,
            updated_at: 0,
        };
        assert!(allowed(&d, "fs_read", true, false));
        assert!(!allowed(&d, "fs_read", false, false), "never more than the agent has");
        assert!(!allowed(&d, "fs_write", true, false), "not on the allowlist");
        assert!(!allowed(&d, "sys_update_config", true, false), "forbidden whatever the list says");
        d.tools = None;
        assert!(allowed(&d, "fs_write", true, false));
        assert!(!allowed(&d, "db_execute", true, true), "restricted tools never");
        assert!(!allowed(&d, "loop_manage", true, false));
    }

    #[test]
    fn a_table_made_before_max_turns_reads_and_takes_it_on_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::create(dir.path().join("a.adf"), &crate::store::NewAgent::default()).unwrap();
        store.loop_create("old", &LoopSpec::default()).unwrap();
        // The table as an earlier adf made it: no max_turns column.
        store.conn().execute_batch("ALTER TABLE adfrs_loops DROP COLUMN max_turns").unwrap();
        let d = store.loop_get("old").unwrap().unwrap();
        assert_eq!((d.max_turns, d.turn_limit()), (None, DEFAULT_MAX_TURNS));
        assert_eq!(store.loops_list().unwrap().len(), 1);
        let spec = LoopSpec { max_turns: Some(7), ..Default::default() };
        assert_eq!(store.loop_update("old", &spec).unwrap().turn_limit(), 7);
        store.loop_create("new", &spec).unwrap();
        assert_eq!(store.loop_get("new").unwrap().unwrap().max_turns, Some(7));
    }
}
