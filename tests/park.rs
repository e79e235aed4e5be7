//! Idle agents cost almost nothing (issue 17): a parked store closes its
//! SQLite connection but keeps the file (lock, marker, registration), opens
//! again on the next use; a parked agent's tick reads no file until a timer
//! is due or another connection wrote; WAL checkpoints wait for the actor
//! between turns instead of landing inside a turn's commit.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::files::WriteOptions;
use adf::store::revs::Table;
use adf::store::timers::{NewTimer, Schedule};
use adf::store::{Caller, NewAgent, Store};
use common::*;

fn new_file(dir: &Path) -> PathBuf {
    let path = dir.join("a.adf");
    let (s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    s.close().unwrap();
    path
}

fn side(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The WAL a park begins: its header and two frames of a 4 KiB page.
const PARK_WAL: u64 = 32 + 2 * (24 + 4096);

/// The WAL's header (magic, checkpoint sequence, salts, checksum): a WAL
/// begun again gets a new one.
fn wal_header(path: &Path) -> Vec<u8> {
    std::fs::read(side(path, "-wal")).unwrap()[..32].to_vec()
}

/// Whether the file at `path` (read only) has the meta key `key`.
fn meta_key(path: &Path, key: &str) -> bool {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row("SELECT count(*) FROM adf_meta WHERE key = ?1", [key], |r| r.get::<_, i64>(0)).unwrap() == 1
}

fn marker(path: &Path) -> bool {
    meta_key(path, "adf_clean_close")
}

#[test]
fn a_parked_store_gives_back_its_connection_and_opens_again_on_use() {
    let dir = tmp();
    let path = new_file(dir.path());
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"one", &WriteOptions::default()).unwrap();
    assert!(!marker(&path), "a writing session has taken the clean-close marker");
    let files = s.rev(Table::Files);

    assert!(s.park().unwrap());
    assert!(s.is_parked());
    assert!(!s.park().unwrap(), "parking twice is a no-op");
    let len = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).ok();
    assert_eq!(len(side(&path, "-wal")), Some(PARK_WAL), "the WAL is kept, checkpointed into the file and begun again");
    assert!(side(&path, "-shm").exists(), "its index is kept");
    {
        // The file alone is the whole agent: a copy of it without the WAL.
        let copy = dir.path().join("copy.adf");
        std::fs::copy(&path, &copy).unwrap();
        let c = rusqlite::Connection::open_with_flags(&copy, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let n: i64 = c.query_row("SELECT count(*) FROM adf_files WHERE path = 'notes.md'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "the copy holds the write");
        assert!(marker(&copy), "and the clean-close marker");
        let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(ok, "ok");
    }
    let header = wal_header(&path);
    assert!(side(&path, ".lock").exists(), "the writer lock is kept");
    {
        // Another reader sees everything through the kept index.
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let n: i64 = c.query_row("SELECT count(*) FROM adf_files WHERE path = 'notes.md'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }
    assert!(marker(&path), "parked means cleanly closed: a crash now costs no full integrity check");
    assert!(Store::open(&path).is_err(), "the file is still held by this store");

    // The next use opens it again, whatever the call, with the WAL the
    // park kept (the same file: not made again).
    use std::os::unix::fs::MetadataExt;
    let wal_inode = std::fs::metadata(side(&path, "-wal")).unwrap().ino();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "one");
    assert!(!s.is_parked());
    assert_ne!(s.rev(Table::Files), files, "revisions move on across a park");
    s.file_write(Caller::Owner, "notes.md", b"two", &WriteOptions::default()).unwrap();
    assert!(!marker(&path), "the first write after a park takes the marker again");
    assert_eq!(std::fs::metadata(side(&path, "-wal")).unwrap().ino(), wal_inode, "the kept WAL took the write");
    assert!(len(side(&path, "-wal")).unwrap() > PARK_WAL, "appended after the park's frames");
    assert_eq!(
        wal_header(&path),
        header,
        "the WAL was not begun again: the woken write wrote (and synced) no new header"
    );

    // A sibling of a parked file works, and closing a parked store
    // releases the file.
    assert!(s.park().unwrap());
    let mut sib = Store::sibling(&path).unwrap();
    sib.file_write(Caller::Owner, "other.md", b"x", &WriteOptions::default()).unwrap();
    sib.close().unwrap();
    s.close().unwrap();
    assert!(!side(&path, ".lock").exists());
    let s = Store::open(&path).unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "two");
    assert_eq!(s.file_read_text("other.md").unwrap(), "x");
    assert_eq!(
        s.integrity_check(),
        adf::store::IntegrityCheck::Skipped,
        "closed cleanly: {:?}",
        std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>()
    );
}

#[test]
fn closing_a_parked_store_no_one_wrote_to_leaves_the_file_alone() {
    // A daemon stopping closes every parked agent: a file no one wrote to
    // since it parked keeps its bytes (no marker rewritten); it is opened
    // only so SQLite folds back the park's frames (the bytes already in the
    // file) and removes the WAL and index the park kept.
    let dir = tmp();
    let path = new_file(dir.path());
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"one", &WriteOptions::default()).unwrap();
    assert!(s.park().unwrap());
    assert!(s.parked_untouched());
    let before = std::fs::read(&path).unwrap();
    s.close().unwrap();
    assert!(std::fs::read(&path).unwrap() == before, "the file's bytes did not change");
    for s in ["-wal", "-shm", ".lock"] {
        assert!(!side(&path, s).exists(), "{s} left behind");
    }
    assert!(marker(&path));

    // A sibling's write is seen, and the marker it took goes back.
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"two", &WriteOptions::default()).unwrap();
    assert!(s.park().unwrap());
    let mut sib = Store::sibling(&path).unwrap();
    sib.file_write(Caller::Owner, "other.md", b"x", &WriteOptions::default()).unwrap();
    sib.close().unwrap();
    assert!(!s.parked_untouched(), "a sibling's commit changes the file's signature");
    s.close().unwrap();
    assert!(marker(&path), "the marker the sibling took is back");
}

#[tokio::test]
async fn a_parked_agent_is_quiet_until_a_timer_is_due_or_the_file_changes() {
    let dir = tmp();
    let path = new_file(dir.path());
    let mut s = Store::open(&path).unwrap();
    let now = adf::store::now_ms();
    s.timer_insert(&NewTimer {
        schedule: &Schedule::Once { at: now + 60_000 },
        next_wake_at: now + 60_000,
        payload: Some("later"),
        scope: Some(&["agent"]),
        lambda: None,
        warm: false,
        locked: false,
    })
    .unwrap();
    let provider = Arc::new(Scripted::new([Reply::Text("hi".into())]));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    assert!(!ex.parked_and_quiet(now), "not parked yet");
    ex.chat("hello").await.unwrap();
    assert!(ex.is_loaded());
    assert!(ex.park());
    assert!(!ex.is_loaded(), "the turn's caches went with it");
    assert!(ex.parked_and_quiet(now));
    assert!(!ex.parked_and_quiet(now + 60_000), "the timer is due");

    // Another connection's write wakes it (a message landing through the
    // mailbox's sibling connection, say).
    let mut sib = Store::sibling(&path).unwrap();
    sib.file_write(Caller::Owner, "inbox-note.md", b"x", &WriteOptions::default()).unwrap();
    assert!(!ex.parked_and_quiet(now));
    drop(sib);

    // A turn on a parked agent opens the file again and sees everything.
    ex.chat("again").await.unwrap();
    assert!(!ex.store.is_parked());
    let texts: Vec<String> = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .filter(|r| !adf::runtime::prompt::is_context_row(r))
        .map(|r| r.content[0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(texts, ["hello", "hi", "again", "(script exhausted)"]);
    let cp = ex.store.meta_get("adf_runtime_turn_checkpoint").unwrap().unwrap().value;
    assert!(cp.contains("\"status\":\"completed\""), "{cp}");
}

#[tokio::test]
async fn checkpoints_wait_for_the_actor_instead_of_a_commit() {
    let dir = tmp();
    let path = new_file(dir.path());
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let mut ex = Executor::new(Store::open(&path).unwrap(), provider, Bus::new(), Arc::new(Absent)).unwrap();
    let mut turns = 0;
    while !ex.store.checkpoint_due() {
        ex.chat("tick").await.unwrap();
        turns += 1;
        assert!(turns < 2000, "the WAL never reached the checkpoint threshold");
    }
    // No commit checkpointed on its own: the WAL holds every frame.
    let wal = std::fs::metadata(side(&path, "-wal")).unwrap().len();
    assert!(wal >= 1000 * 4096, "WAL of {wal} bytes after {turns} turns");
    let before = wal_header(&path);
    let user_version = || -> i64 {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
    };
    let version = user_version();
    assert!(ex.store.checkpoint_if_due().unwrap());
    assert!(!ex.store.checkpoint_due());
    assert!(!ex.store.checkpoint_if_due().unwrap(), "nothing due right after");
    // The checkpoint folded the whole WAL in and began its next generation
    // at once (a new header, synced here), with one frame that changes
    // nothing a reader sees: the next turn's commit appends to it instead
    // of writing and syncing a header inside the turn.
    let begun = wal_header(&path);
    assert_ne!(begun, before, "the next generation began with the checkpoint");
    assert_eq!(user_version(), version);
    ex.chat("after the checkpoint").await.unwrap();
    assert_eq!(wal_header(&path), begun, "the turn appended to the generation begun between turns");
    // The checkpointed pages are in the main file: a reader without the
    // WAL sees the turns.
    let c = rusqlite::Connection::open_with_flags(
        format!("file:{}?immutable=1", path.display()),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let rows: i64 = c.query_row("SELECT count(*) FROM adf_loop", [], |r| r.get(0)).unwrap();
    assert!(rows >= 2 * turns as i64, "{rows} rows for {turns} turns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_writes_between_turns_checkpoint_too() {
    use adf::runtime::agent::{AgentCommand, OwnerWork};
    let dir = tmp();
    let path = new_file(dir.path());
    let provider = Arc::new(Scripted::new([]));
    let ex = Executor::new(Store::open(&path).unwrap(), provider, Bus::new(), Arc::new(Absent)).unwrap();
    // A tick an hour apart: its first tick parks the agent at once, and no
    // park (which empties the WAL) comes during the writes.
    let tick = std::time::Duration::from_secs(3600);
    let (agent, task) = adf::runtime::agent::spawn_with_tick(ex, adf::runtime::agent::waiting_owner(), tick);
    let wal = side(&path, "-wal");
    let (mut most, writes) = (0, 2500);
    for i in 0..writes {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = OwnerWork(Box::new(move |ex: &mut Executor| {
            let body = format!("note {i}");
            let r = ex.store.file_write(
                Caller::Owner,
                &format!("notes/{}.md", i % 8),
                body.as_bytes(),
                &WriteOptions::default(),
            );
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
        }));
        assert!(agent.send(AgentCommand::With(work)));
        rx.await.unwrap().unwrap();
        most = most.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    // Each write is a commit of a few frames: without a checkpoint between
    // them the WAL would hold all of them (over 2 frames a write).
    let frame = 4096 + 24;
    assert!(most <= 1100 * frame, "the WAL grew to {most} bytes over {writes} owner writes");
    drop(agent);
    let ex = task.await.unwrap();
    for n in 0..8 {
        let last = (0..writes).rev().find(|i| i % 8 == n).unwrap();
        let (_, body) = ex.store.file_read(&format!("notes/{n}.md")).unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), format!("note {last}"));
    }
}

#[test]
fn a_held_read_sees_one_snapshot_and_a_write_ends_it() {
    // A load's reads share one read transaction (`begin_reading`): they
    // see the file as it was when the first ran, a write inside ends it,
    // and parking or closing with one open loses nothing.
    let dir = tmp();
    let path = new_file(dir.path());
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"one", &WriteOptions::default()).unwrap();
    s.begin_reading().unwrap();
    s.begin_reading().unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "one");
    let mut sib = Store::sibling(&path).unwrap();
    sib.file_write(Caller::Owner, "notes.md", b"two", &WriteOptions::default()).unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "one", "the held read sees its snapshot");
    s.end_reading();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "two", "let go, the next read sees the sibling's write");

    // A write inside a held read ends it and commits.
    s.begin_reading().unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "two");
    s.file_write(Caller::Owner, "notes.md", b"three", &WriteOptions::default()).unwrap();
    sib.file_write(Caller::Owner, "other.md", b"x", &WriteOptions::default()).unwrap();
    assert_eq!(s.file_read_text("other.md").unwrap(), "x", "no read is held after the write");
    drop(sib);

    // Parked and closed with a read held: the file is whole and clean.
    s.begin_reading().unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "three");
    assert!(s.park().unwrap());
    assert_eq!(
        std::fs::metadata(side(&path, "-wal")).unwrap().len(),
        PARK_WAL,
        "the kept WAL holds the park's frames only"
    );
    s.begin_reading().unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "three");
    s.close().unwrap();
    assert!(!side(&path, "-wal").exists() && !side(&path, "-shm").exists(), "closed: no sidecars");
    let s = Store::open(&path).unwrap();
    assert_eq!(s.integrity_check(), adf::store::IntegrityCheck::Skipped, "closed cleanly");
    assert_eq!(s.file_read_text("other.md").unwrap(), "x");
    assert!(marker(&path));
}

#[cfg(unix)]
#[test]
fn a_file_opened_through_a_link_is_known_by_its_real_path() {
    // The process keeps its open files, envelope keys and pending numbers
    // by the path resolved once at open: a sibling named by the real path
    // finds a store opened through a symlinked folder, and a second open
    // by either name is refused while it is held.
    let dir = tmp();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let path = new_file(&real);
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    let linked = dir.path().join("link/a.adf");
    let mut s = Store::open(&linked).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"one", &WriteOptions::default()).unwrap();
    let sib = Store::sibling(&path).expect("the real path names the store opened through the link");
    assert_eq!(sib.file_read_text("notes.md").unwrap(), "one");
    assert!(Store::open(&path).is_err() && Store::open(&linked).is_err());
    drop(sib);
    s.close().unwrap();
    assert!(Store::sibling(&path).is_err(), "closed: nothing is open here any more");
    Store::open(&path).unwrap().close().unwrap();
}

/// A runtime killed while its agents are parked (fault): each file is
/// whole and marked closed beside the emptied WAL and index the park
/// kept; the next open checks it quickly and uses them, and a clean close
/// removes them.
#[test]
fn a_runtime_killed_while_parked_leaves_whole_files() {
    let dir = tmp();
    let home = dir.path();
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    let path = new_file(&fleet);
    let (child, _, _) = spawn_daemon(home, &["--no-mesh"], &[]);
    let mut daemon = KillOnDrop(child);
    // Loaded (its start writes), then parked within a quiet tick or two.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let written = || {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        c.query_row("SELECT count(*) FROM adf_meta WHERE key = 'runtime_umbilical_next_seq'", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
            == 1
    };
    // The start's write took the marker; the park put it back.
    let parked = || {
        written()
            && marker(&path)
            && side(&path, "-shm").exists()
            && std::fs::metadata(side(&path, "-wal")).is_ok_and(|m| m.len() == PARK_WAL)
    };
    while !parked() {
        assert!(std::time::Instant::now() < deadline, "the agent did not park");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    assert!(side(&path, "-wal").exists() && side(&path, ".lock").exists(), "killed: the sidecars stay");

    let s = Store::open(&path).unwrap();
    // The marker is there (parked means closed cleanly); the sidecars
    // beside it ask for SQLite's quick check (format.md §2.1), which passes.
    assert_eq!(s.integrity_check(), adf::store::IntegrityCheck::Quick);
    assert!(s.meta_get("runtime_umbilical_next_seq").unwrap().is_some(), "the load's write is in the file");
    s.close().unwrap();
    for suffix in ["-wal", "-shm", ".lock"] {
        assert!(!side(&path, suffix).exists(), "{suffix} left after a clean close");
    }
}

/// Whether the file at `path` has the meta key `key`, and what SQLite's
/// integrity check says of it.
fn meta_has(path: &Path, key: &str) -> (bool, String) {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    (meta_key(path, key), ok)
}

/// Add a meta row `key` to a file no store holds.
fn put_meta(path: &Path, key: &str) {
    rusqlite::Connection::open(path)
        .unwrap()
        .execute("INSERT INTO adf_meta(key, value, protection) VALUES (?1, '1', 'none')", [key])
        .unwrap();
}

#[test]
fn a_parked_file_written_over_or_moved_away_gets_no_stale_frame() {
    // The park's WAL frames are a page of the file as it parked (the one
    // with its meta rows). A copy put in the file's place while it is
    // parked must not get that page laid over its own, nor a file made
    // where a parked one was moved away from.
    let dir = tmp();
    let path = new_file(dir.path());
    let other = dir.path().join("b.adf");
    let (o, _) = Store::create(&other, &NewAgent::default()).unwrap();
    o.close().unwrap();
    put_meta(&other, "theirs");

    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "mine.md", b"one", &WriteOptions::default()).unwrap();
    assert!(s.park().unwrap());
    std::fs::copy(&other, &path).unwrap();
    assert!(!s.parked_untouched());
    assert!(s.file_read_text("mine.md").is_err(), "the wake reads the file that is there now");
    s.close().unwrap();
    assert_eq!(meta_has(&path, "theirs"), (true, "ok".into()), "the copy's pages are its own");

    // Moved away while parked: the moved file is whole, and a new file at
    // the old place opens without the old one's page.
    let path = dir.path().join("c.adf");
    let (c, _) = Store::create(&path, &NewAgent::default()).unwrap();
    c.close().unwrap();
    put_meta(&path, "mine");
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "mine.md", b"one", &WriteOptions::default()).unwrap();
    assert!(s.park().unwrap());
    let moved = dir.path().join("moved.adf");
    std::fs::rename(&path, &moved).unwrap();
    assert!(s.close().is_err(), "the file it held is gone");
    for suffix in ["-wal", "-shm", ".lock"] {
        assert!(!side(&path, suffix).exists(), "{suffix} left where the file was");
    }
    assert_eq!(meta_has(&moved, "mine"), (true, "ok".into()), "the moved file is whole alone");
    let (n, _) = Store::create(&path, &NewAgent::default()).unwrap();
    n.close().unwrap();
    assert_eq!(meta_has(&path, "mine"), (false, "ok".into()), "the new file's pages are its own");
}

#[test]
fn a_parked_file_whose_wal_a_sibling_holds_keeps_it() {
    // The file's times move without its WAL's (here a `chmod`) while a
    // sibling of this process has the WAL open: the WAL is the sibling's
    // too, and the woken store must share it, not remove it.
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    let path = new_file(dir.path());
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "notes.md", b"one", &WriteOptions::default()).unwrap();
    let mut sib = Store::sibling(&path).unwrap();
    assert_eq!(sib.file_read_text("notes.md").unwrap(), "one");
    assert!(s.park().unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!s.parked_untouched());
    assert_eq!(s.file_read_text("notes.md").unwrap(), "one");
    assert!(side(&path, "-wal").exists(), "the WAL the sibling holds is kept");
    sib.file_write(Caller::Owner, "notes.md", b"two", &WriteOptions::default()).unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "two", "both write through one WAL");
    sib.close().unwrap();
    s.close().unwrap();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.file_read_text("notes.md").unwrap(), "two");
}
