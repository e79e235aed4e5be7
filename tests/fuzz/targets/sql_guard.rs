//! The SQL guard on a real agent file: any statement through `db_query` and
//! `db_execute` (as authorized code) is answered or refused; no answer
//! ever carries a secret of the protected tables, and they never change.
#![no_main]

use std::hash::Hasher;
use std::sync::{Mutex, OnceLock};

use adf::store::{NewAgent, Store};
use libfuzzer_sys::fuzz_target;

const SECRET: &str = "FUZZ-SECRET-5e1d";

struct Fixture {
    store: Store,
    digest: u64,
    _dir: tempfile::TempDir,
}

/// The checks compare fingerprints, never text holding the secret:
/// libFuzzer learns the operands of every comparison in instrumented code,
/// and a `contains(SECRET)` taught it the secret, which it then wrote into
/// statements whose syntax errors quote them back (a false leak).
fn fingerprint(b: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(b);
    h.finish()
}

/// Whether a text holds the secret anywhere.
fn mentions_secret(text: &str) -> bool {
    static WANT: OnceLock<u64> = OnceLock::new();
    let want = *WANT.get_or_init(|| fingerprint(SECRET.as_bytes()));
    text.as_bytes().windows(SECRET.len()).any(|w| fingerprint(w) == want)
}

fn digest(s: &Store) -> u64 {
    let mut out = String::new();
    for t in ["adf_meta", "adf_config", "adf_identity"] {
        let (_, rows) = s.owner_query(&format!("SELECT * FROM {t}")).expect("owner read");
        out.push_str(&serde_json::to_string(&rows).unwrap_or_default());
    }
    fingerprint(out.as_bytes())
}

fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fuzz.adf");
        let (s, _) = Store::create(&path, &NewAgent::default()).expect("create");
        s.close().expect("close");
        {
            let c = rusqlite::Connection::open(&path).expect("raw");
            c.execute("INSERT INTO adf_meta(key, value, protection) VALUES ('x_secret', ?1, 'none')", [SECRET])
                .expect("plant");
            c.execute(
                "INSERT INTO adf_identity(purpose, value, encryption_algo, code_access) VALUES ('x:secret', CAST(?1 AS BLOB), 'plain', 0)",
                [SECRET],
            )
            .expect("plant");
            c.execute_batch("CREATE TABLE local_notes(t TEXT); INSERT INTO local_notes VALUES ('hello');")
                .expect("table");
        }
        let mut store = Store::open(&path).expect("open");
        // The session's first write takes the clean-close marker out of
        // adf_meta (by design): make it before the protected tables are
        // fingerprinted.
        store.db_execute("INSERT INTO local_notes VALUES ('warm')", &[], false).expect("warm-up write");
        let digest = digest(&store);
        Mutex::new(Fixture { store, digest, _dir: dir })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else { return };
    // A statement that spells the secret gets it quoted back in its error.
    if mentions_secret(sql) {
        return;
    }
    let mut f = fixture().lock().unwrap_or_else(|p| p.into_inner());
    let q = match f.store.db_query(sql, &[], true) {
        Ok(out) => out.render(),
        Err(e) => e.to_string(),
    };
    assert!(!mentions_secret(&q), "db_query leaked: {sql:?}");
    let x = match f.store.db_execute(sql, &[], true) {
        Ok(n) => n.to_string(),
        Err(e) => e.to_string(),
    };
    assert!(!mentions_secret(&x), "db_execute leaked: {sql:?}");
    let now = digest(&f.store);
    assert!(now == f.digest, "a protected table changed: {sql:?}");
});
