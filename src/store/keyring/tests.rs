//! The lazy unlock: a fleet's load leaves envelopes waiting and the first
//! read of a secret opens them, once, whichever connection asks.

use super::*;
use crate::identity::install;
use crate::store::NewAgent;
use crate::store::create::create_file;

/// A file sealed to a fresh install, holding one credential, with its DEKs
/// forgotten (as a new process would start).
fn sealed() -> (tempfile::TempDir, PathBuf, std::sync::Arc<Install>) {
    let dir = tempfile::tempdir().unwrap();
    let (inst, _) = install::load_or_create(&dir.path().join("config")).unwrap();
    let path = dir.path().join("a.adf");
    create_file(&path, &NewAgent { seal_to: Some(inst.clone()), ..Default::default() }).unwrap();
    let mut store = Store::open(&path).unwrap();
    store.secret_set("provider:x:apiKey", b"k1", false).unwrap();
    store.lock_envelopes();
    store.close().unwrap();
    (dir, path, inst)
}

fn waiting(store: &Store) -> [bool; 2] {
    [is_pending(store.canonical_path(), IDENTITY), is_pending(store.canonical_path(), CREDENTIALS)]
}

fn opened(store: &Store) -> [bool; 2] {
    [kept(store.canonical_path(), IDENTITY).is_some(), kept(store.canonical_path(), CREDENTIALS).is_some()]
}

#[test]
fn a_lazy_unlock_opens_each_envelope_at_its_first_read() {
    let (_dir, path, inst) = sealed();
    let mut store = Store::open(&path).unwrap();
    assert_eq!(store.unlock_lazily(&inst).unwrap(), [EnvState::Unlocked, EnvState::Unlocked]);
    assert_eq!((waiting(&store), opened(&store)), ([true, true], [false, false]), "no key agreed yet");
    assert_eq!(store.secret_get("provider:x:apiKey").unwrap().unwrap(), b"k1");
    assert_eq!((waiting(&store), opened(&store)), ([true, false], [false, true]), "only the credentials opened");
    assert!(store.signing_key().unwrap().is_some());
    assert_eq!((waiting(&store), opened(&store)), ([false, false], [true, true]));
    // Forgetting the keys forgets what waited too.
    store.unlock_lazily(&inst).unwrap();
    store.lock_envelopes();
    assert_eq!((waiting(&store), opened(&store)), ([false, false], [false, false]));
    assert_eq!(store.envelope(CREDENTIALS).unwrap().state, EnvState::Foreign);
    // The eager unlock opens both now.
    store.unlock(&inst).unwrap();
    assert_eq!((waiting(&store), opened(&store)), ([false, false], [true, true]));
    store.close().unwrap();
}

#[test]
fn connections_reading_at_once_open_a_waiting_envelope_once_and_all_get_it() {
    let (_dir, path, inst) = sealed();
    let mut store = Store::open(&path).unwrap();
    store.unlock_lazily(&inst).unwrap();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || Store::sibling(&path).unwrap().secret_get("provider:x:apiKey").unwrap())
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap(), b"k1");
    }
    assert_eq!(waiting(&store), [true, false]);
    store.close().unwrap();
}

/// Rewrite the envelope's key slots of `kind` so they no longer open.
fn spoil(store: &mut Store, name: &'static str, kind: &str) {
    let mut d = store.descriptor(name).unwrap().unwrap();
    for s in &mut d.slots {
        let of_kind = s.kind() == kind;
        if let Slot::Owner(k) | Slot::Runtime(k) = s
            && of_kind
        {
            // Another first character: still base64, no longer the wrapped key.
            let first = if k.wrapped_dek.starts_with('A') { "B" } else { "A" };
            k.wrapped_dek.replace_range(..1, first);
        }
    }
    let path = store.path().to_path_buf();
    store.write(|tx| put_descriptor(tx, name, &d).at(&path)).unwrap();
}

#[test]
fn a_waiting_slot_that_no_longer_opens_falls_back_to_the_owner_then_reads_as_foreign() {
    let (_dir, path, inst) = sealed();
    let mut store = Store::open(&path).unwrap();
    spoil(&mut store, CREDENTIALS, "runtime");
    // The runtime slot still names this install: it waits, and the owner's
    // slot (the phrase is on this machine) opens it at the read.
    store.unlock_lazily(&inst).unwrap();
    assert_eq!(waiting(&store), [true, true]);
    assert_eq!(store.secret_get("provider:x:apiKey").unwrap().unwrap(), b"k1");
    // Neither slot opens: the read fails with what to do, nothing changes.
    spoil(&mut store, CREDENTIALS, "owner");
    store.lock_envelopes();
    let before = store.descriptor(CREDENTIALS).unwrap();
    assert_eq!(store.unlock_lazily(&inst).unwrap()[1], EnvState::Unlocked, "it looks openable until tried");
    let err = store.secret_get("provider:x:apiKey").unwrap_err().to_string();
    assert!(err.contains("credentials envelope is foreign") && err.contains("adf claim"), "{err}");
    assert_eq!(store.envelope(CREDENTIALS).unwrap().state, EnvState::Foreign);
    assert_eq!(store.descriptor(CREDENTIALS).unwrap(), before);
    assert!(store.signing_key().unwrap().is_some(), "the identity envelope is untouched");
    store.close().unwrap();
}
