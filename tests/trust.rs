//! Headless trust (issue 19): the owner lets a daemon on another machine
//! open chosen agents' credentials by its trust key, and takes it back.
//! Two installs (two config folders) stand for the two machines.

mod common;

use common::*;

fn with_stdin(home: &std::path::Path, cwd: &std::path::Path, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .current_dir(cwd)
        .env("ADF_HOME", home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_trusted_runtime_opens_the_credentials_until_revoked() {
    let dir = tmp();
    let d = dir.path();
    let (owner, headless) = (d.join("owner-home"), d.join("headless-home"));
    ok(&adf_home(&owner, d, &["new", "a.adf"]));
    ok(&with_stdin(&owner, d, &["credentials", "set", "a.adf", "provider:openai:apiKey"], b"sk-secret\n"));
    let key = json(&adf_home(&headless, d, &["trust", "key", "--json"]));
    let (key, runtime) = (key["key"].as_str().unwrap().to_string(), key["runtime_did"].as_str().unwrap().to_string());
    let creds =
        |home: &std::path::Path| json(&adf_home(home, d, &["credentials", "ls", "a.adf", "--json"]))["states"].clone();
    assert_eq!(creds(&headless)["credentials"], "foreign", "not yet");
    // A key that does not parse changes nothing.
    let before = snapshot(&d.join("a.adf"));
    fails(&adf_home(&owner, d, &["trust", "grant", "--key", "adf-runtime:garbage", "a.adf"]), &["not a trust key"]);
    assert_eq!(snapshot(&d.join("a.adf")), before);
    ok(&adf_home(&owner, d, &["trust", "grant", "--key", &key, "a.adf"]));
    let st = creds(&headless);
    assert_eq!(st["credentials"], "unlocked", "{st}");
    assert_eq!(st["identity"], "foreign", "the agent's own key is never shared");
    let ls = json(&adf_home(&owner, d, &["trust", "ls", "a.adf", "--json"]));
    assert!(ls["runtimes"].as_array().unwrap().iter().any(|r| r == &serde_json::json!(runtime)), "{ls}");
    ok(&adf_home(&owner, d, &["trust", "revoke", "--runtime", &runtime, "a.adf"]));
    assert_eq!(creds(&headless)["credentials"], "foreign", "revoked");
    fails(&adf_home(&owner, d, &["trust", "revoke", "--runtime", &runtime, "a.adf"]), &["had no access"]);
    let audit = ok(&adf_home(&owner, d, &["logs", "a.adf", "--origin", "trust"]));
    assert!(audit.contains("runtime_trusted") && audit.contains("runtime_revoked"), "{audit}");
}
