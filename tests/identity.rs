//! Identity through the real binary and files on disk: the reference's
//! sealed key stays sealed, envelopes open by runtime slot, owner slot
//! (after `identity restore`) and share password, claim re-keys a foreign
//! file, the legacy password format converts, attestations (points 49–51).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

fn run(home: &Path, cwd: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .current_dir(cwd)
        .env("ADF_HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn inspect(home: &Path, file: &Path) -> Value {
    json(&run(home, file.parent().unwrap(), &["inspect", file.to_str().unwrap(), "--json"], ""))
}

fn states(v: &Value) -> (String, String) {
    let s = |i: usize| v["envelopes"][i]["state"].as_str().unwrap().to_string();
    (s(0), s(1))
}

#[test]
fn the_reference_sealed_key_stays_sealed_and_inspect_says_where() {
    let dir = tmp();
    let file = fixture_copy(dir.path(), "fresh.adf");
    let before = snapshot(&file);
    let home = dir.path().join("home");
    let v = inspect(&home, &file);
    assert_eq!(v["signing_key"]["storage"], "sealed");
    assert_eq!(v["signing_key"]["envelope"], "identity");
    assert_eq!(v["signing_key"]["locked"], true);
    assert_eq!(states(&v), ("foreign".into(), "foreign".into()));
    let text = ok(&run(&home, dir.path(), &["inspect", "fresh.adf"], ""));
    assert!(text.contains("sealed in the `identity` envelope, locked"), "{text}");
    assert_eq!(snapshot(&file), before, "inspect writes nothing");
    // Without the owner's keys nothing opens it, through the library too.
    let store = adf::store::Store::open(&file).unwrap();
    assert!(store.signing_key().unwrap().is_none());
    let err = store.secret_get("crypto:signing:private_key").unwrap_err().to_string();
    assert!(err.contains("identity envelope is foreign"), "{err}");
}

#[test]
fn share_password_then_claim_on_another_install() {
    let dir = tmp();
    let (h1, h2) = (dir.path().join("h1"), dir.path().join("h2"));
    let d = dir.path();
    let created = json(&run(&h1, d, &["new", "a.adf", "--json"], ""));
    let did = created["did"].as_str().unwrap().to_string();
    ok(&run(&h1, d, &["credentials", "set", "a.adf", "provider:anthropic:apiKey"], "sk-secret-value\n"));
    // A short password is refused and changes nothing.
    let before = snapshot(&d.join("a.adf"));
    fails(&run(&h1, d, &["password", "set", "a.adf"], "short\n"), &["at least 8"]);
    assert_eq!(snapshot(&d.join("a.adf")), before);
    ok(&run(&h1, d, &["password", "set", "a.adf"], "correct horse\n"));
    let bytes = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!bytes.windows(15).any(|w| w == b"sk-secret-value"), "the secret is sealed on disk");

    // Another install: the identity is foreign, the credentials locked.
    assert_eq!(states(&inspect(&h2, &d.join("a.adf"))), ("foreign".into(), "locked".into()));
    let ls = json(&run(&h2, d, &["credentials", "ls", "a.adf", "--json"], ""));
    assert_eq!(ls["states"]["credentials"], "locked");
    fails(&run(&h2, d, &["unlock", "a.adf"], "wrong password\n"), &["wrong password"]);
    let u = json(&run(&h2, d, &["unlock", "a.adf", "--json"], "correct horse\n"));
    assert_eq!(u["states"]["credentials"], "unlocked");
    assert_eq!(u["states"]["identity"], "foreign");
    // Adopted: from now on this install opens the credentials silently.
    assert_eq!(states(&inspect(&h2, &d.join("a.adf"))).1, "unlocked");

    let c = json(&run(&h2, d, &["claim", "a.adf", "--yes", "--json"], ""));
    let new = c["did"].as_str().unwrap();
    assert_ne!(new, did);
    assert!(new.starts_with("did:key:z6Mk"));
    assert_eq!(c["previous_did"], did.as_str());
    let v = inspect(&h2, &d.join("a.adf"));
    assert_eq!(states(&v), ("unlocked".into(), "unlocked".into()));
    let meta: Vec<Value> = v["meta"].as_array().unwrap().clone();
    let history = meta.iter().find(|m| m["key"] == "adf_did_history").unwrap();
    assert_eq!(history["value"], format!("[\"{did}\"]"));
    let atts = json(&run(&h2, d, &["attest", "ls", "a.adf", "--json"], ""));
    let clone = atts.as_array().unwrap().iter().find(|a| a["role"] == "clone").unwrap();
    assert_eq!(clone["scope"], did.as_str());
    assert_eq!(clone["subject"], new);
    // The first install no longer opens the identity (it has a new owner).
    assert_eq!(states(&inspect(&h1, &d.join("a.adf"))).0, "foreign");
    // Claiming again is refused: it is already ours.
    fails(&run(&h2, d, &["claim", "a.adf", "--yes"], ""), &["nothing to claim"]);
}

#[test]
fn restoring_the_phrase_opens_files_by_the_owner_slot() {
    let dir = tmp();
    let d = dir.path();
    let (h1, h3) = (d.join("h1"), d.join("h3"));
    ok(&run(&h1, d, &["new", "b.adf"], ""));
    let shown = json(&run(&h1, d, &["identity", "show", "--phrase", "--yes", "--json"], ""));
    let phrase = shown["phrase"].as_str().unwrap();
    assert_eq!(phrase.split(' ').count(), 12);
    // Without --yes and without a terminal, the phrase is not printed.
    let out = run(&h1, d, &["identity", "show", "--phrase", "--json"], "");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(phrase));
    // A new machine with the same phrase: same owner, another runtime.
    let r = json(&run(&h3, d, &["identity", "restore", "--json"], &format!("{phrase}\n")));
    assert_eq!(r["owner_did"], shown["owner_did"]);
    assert_ne!(r["runtime_did"], shown["runtime_did"]);
    fails(&run(&h3, d, &["identity", "restore"], "not a phrase\n"), &["BIP-39"]);
    let v = inspect(&h3, &d.join("b.adf"));
    assert_eq!(states(&v), ("unlocked".into(), "unlocked".into()));
    assert_eq!(v["envelopes"][0]["slots"].as_array().unwrap().len(), 2, "inspect adds nothing");
    ok(&run(&h3, d, &["unlock", "b.adf"], ""));
    let v = inspect(&h3, &d.join("b.adf"));
    assert_eq!(v["envelopes"][0]["slots"].as_array().unwrap().len(), 3, "a runtime slot for this install");
}

#[test]
fn the_legacy_password_format_opens_and_converts() {
    use aes_gcm::aead::{Aead, KeyInit};
    let dir = tmp();
    let d = dir.path();
    let home = d.join("h");
    // A plain-key file rewritten into the legacy whole-file password format.
    let path = d.join("old.adf");
    let created = adf::store::create::create_file(&path, &Default::default()).unwrap();
    let salt = [0x42u8; 32];
    let salt_hex: String = salt.iter().map(|b| format!("{b:02x}")).collect();
    let mut key = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha2::Sha512>(b"old secret", &salt, 100_000, &mut key);
    let cipher = aes_gcm::Aes256Gcm::new(&key.into());
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        let rows: Vec<(String, Vec<u8>)> = c
            .prepare("SELECT purpose, value FROM adf_identity")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut all = rows;
        all.push(("mcp:github:TOKEN".into(), b"ghp_legacy".to_vec()));
        for (purpose, value) in all {
            let iv = [7u8; 12];
            let ct = cipher.encrypt(&iv.into(), value.as_slice()).unwrap();
            c.execute(
                "INSERT OR REPLACE INTO adf_identity(purpose, value, encryption_algo, salt, kdf_params, code_access)
                 VALUES (?1, ?2, 'aes-256-gcm', ?3, '{\"iterations\":100000,\"digest\":\"sha512\",\"keyLength\":32}', 0)",
                rusqlite::params![purpose, ct, iv.to_vec()],
            )
            .unwrap();
        }
        c.execute("INSERT INTO adf_identity(purpose, value) VALUES ('crypto:kdf:salt', ?1)", [salt_hex.as_bytes()])
            .unwrap();
    }
    assert_eq!(inspect(&home, &path)["signing_key"]["storage"], "legacy-password");
    fails(&run(&home, d, &["unlock", "old.adf"], "not it\n"), &["wrong password"]);
    assert_eq!(inspect(&home, &path)["signing_key"]["storage"], "legacy-password", "a wrong password changes nothing");
    ok(&run(&home, d, &["unlock", "old.adf"], "old secret\n"));
    let v = inspect(&home, &path);
    assert_eq!(v["signing_key"]["storage"], "sealed");
    assert_eq!(states(&v), ("unlocked".into(), "unlocked".into()));
    let purposes: Vec<&str> =
        v["identity"].as_array().unwrap().iter().map(|r| r["purpose"].as_str().unwrap()).collect();
    assert!(!purposes.iter().any(|p| p.starts_with("crypto:kdf:")), "{purposes:?}");
    // Same key, same DID; the credential moved into the envelope; the old
    // password still opens the credentials (it became their password slot).
    let mut store = adf::store::Store::open(&path).unwrap();
    assert!(store.signing_key().unwrap().is_none(), "sealed now: this test process has no key yet");
    let inst = adf::identity::install::load(&home.join("config")).unwrap().unwrap();
    store.unlock(&inst).unwrap();
    let key = store.signing_key().unwrap().unwrap();
    assert_eq!(adf::store::identity::did_key(&key.verifying_key()), created.did);
    assert_eq!(store.secret_get("mcp:github:TOKEN").unwrap().unwrap(), b"ghp_legacy");
    store.lock_envelopes();
    assert!(store.envelope("credentials").unwrap().slots.iter().any(|s| s == "password"));
    store.close().unwrap();
}

#[test]
fn attestations_issue_add_verify() {
    let dir = tmp();
    let d = dir.path();
    let h = d.join("h");
    let a = json(&run(&h, d, &["new", "a.adf", "--json"], ""));
    let b = json(&run(&h, d, &["new", "b.adf", "--json"], ""));
    let b_did = b["did"].as_str().unwrap();
    fails(&run(&h, d, &["attest", "issue", "a.adf", "--subject", b_did, "--role", "owner"], ""), &["reserved"]);
    let att: Value = serde_json::from_str(&ok(&run(
        &h,
        d,
        &["attest", "issue", "a.adf", "--subject", b_did, "--role", "reviewer", "--scope", "docs"],
        "",
    )))
    .unwrap();
    assert_eq!(att["issuer"], a["did"]);
    std::fs::write(d.join("att.json"), att.to_string()).unwrap();
    ok(&run(&h, d, &["attest", "verify", "att.json", "--subject", b_did], ""));
    // About someone else: refused, nothing stored.
    fails(&run(&h, d, &["attest", "add", "a.adf", "att.json"], ""), &["subject"]);
    assert_eq!(ok(&run(&h, d, &["attest", "add", "b.adf", "att.json"], "")).trim(), "attestation stored");
    assert_eq!(ok(&run(&h, d, &["attest", "add", "b.adf", "att.json"], "")).trim(), "already stored");
    let mut t = att.clone();
    t["scope"] = "everything".into();
    std::fs::write(d.join("bad.json"), t.to_string()).unwrap();
    let out = run(&h, d, &["attest", "verify", "bad.json"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("INVALID"));
    let list = json(&run(&h, d, &["attest", "ls", "b.adf", "--json"], ""));
    let roles: Vec<&str> = list.as_array().unwrap().iter().map(|a| a["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["owner", "operator", "reviewer"]);
}

#[test]
fn bench_crypto_runs_and_reports_each_figure() {
    let dir = tmp();
    let v = json(&run(&dir.path().join("h"), dir.path(), &["bench", "crypto", "--iterations", "10", "--json"], ""));
    for k in
        ["sign_p50_us", "verify_p50_us", "seal_p50_us", "open_p50_us", "slot_unwrap_p50_us", "runtime_stall_max_ms"]
    {
        assert!(v[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {v}");
    }
    assert_eq!(v["password_unlock_ms"].as_array().unwrap().len(), 3);
}

/// A daemon leaves a file's envelopes waiting at the load and opens them at
/// the first read: the agent's own sealed provider key (which wins over the
/// environment's) still reaches its provider.
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_loaded_agent_opens_its_sealed_key_when_it_needs_it() {
    use common::fake_provider::*;
    let dir = tmp();
    let home = dir.path().join("home");
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["with my key"], 1, 1))]).await;
    ok(&run(&home, &fleet, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], ""));
    ok(&run(&home, &fleet, &["credentials", "set", "a.adf", "provider:anthropic:apiKey"], "sk-agent-own\n"));
    let base = fake.base_url.clone();
    let (mut child, url, token) = tokio::task::spawn_blocking(move || {
        spawn_daemon(&home, &["--no-mesh"], &[("ANTHROPIC_API_KEY", "env-key"), ("ANTHROPIC_BASE_URL", &base)])
    })
    .await
    .unwrap();
    let r = adf::providers::http_client()
        .post(format!("{url}/agents/a/chat"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fake.requests().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the agent never called its provider");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (h, _) = fake.requests()[0].clone();
    assert_eq!(h["x-api-key"], "sk-agent-own");
    let _ = child.kill();
    let _ = child.wait();
}
