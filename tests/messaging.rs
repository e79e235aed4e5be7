//! Messaging and identity inside one fleet, in process: the msg_* tools
//! from a model's turn and from code, inbox and outbox middleware, outbox
//! outcomes (conformance 47), the identity methods of the `adf` proxy
//! (points 50, 51), and what ingress keeps (point 45).

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::fleet::{Fleet, ProviderFactory};
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use base64::Engine;
use common::*;
use serde_json::{Value, json};

/// Each agent answers from its own script, picked by its name.
fn factory(scripts: Vec<(&'static str, Vec<Reply>)>) -> ProviderFactory {
    let scripts: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<Reply>>>> =
        Arc::new(std::sync::Mutex::new(scripts.into_iter().map(|(n, r)| (n.to_string(), r)).collect()));
    Arc::new(move |cfg| {
        let name = cfg["name"].as_str().unwrap_or("").to_string();
        let replies = scripts.lock().unwrap().remove(&name).unwrap_or_default();
        Ok(Arc::new(Scripted::new(replies).with_fallback(|_| Reply::Text("ok".into())))
            as Arc<dyn adf::providers::Provider>)
    })
}

fn create(dir: &std::path::Path, name: &str, cfg: &[(&str, Value)]) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.adf"));
    let (mut s, _) = Store::create(
        &path,
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    s.config_set(Caller::Owner, "security.level", json!(2)).unwrap();
    for (k, v) in cfg {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    s.close().unwrap();
    path
}

async fn turn(fleet: &mut Fleet, bus: &Arc<Bus>, agent: &str, text: &str) {
    let id = fleet.resolve(agent).unwrap();
    let mut sub = bus.subscribe(None, Filter { agent_id: Some(id), types: vec!["turn.completed".into()] });
    fleet
        .command(adf::protocol::Command::SendChat { agent: agent.into(), r#loop: "main".into(), text: text.into() })
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(item) = sub.next().await {
            if let Item::Event(e) = item
                && e.event.event_type == "turn.completed"
            {
                return;
            }
        }
    })
    .await
    .expect("the turn ends");
}

/// Tool results of an agent's loop, read through a second connection.
fn results(path: &std::path::Path) -> Vec<String> {
    let s = Store::open_read_only(path).unwrap();
    s.loop_rows(None)
        .unwrap()
        .iter()
        .flat_map(|r| r.content.as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].as_str().unwrap_or("").trim_start_matches("Result: ").to_string())
        .collect()
}

fn rows(path: &std::path::Path, sql: &str) -> Vec<Value> {
    let s = Store::open_read_only(path).unwrap();
    let (_, rows) = s.owner_query(sql).unwrap();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_middleware_and_outbox_outcomes_in_one_fleet() {
    let dir = tmp();
    let d = dir.path();
    // a archives what it sends, b what it accepts (both spellings of the
    // audit switch).
    let a = create(d, "a", &[("audit.outbox", json!(true))]);
    // b uppercases what arrives and refuses anything mentioning "spam".
    let b = create(
        d,
        "b",
        &[
            ("security.middleware", json!({"inbox": [{"lambda": "mw.js:inbox"}]})),
            ("triggers.on_inbox.enabled", json!(false)),
            ("context.audit.inbox", json!(true)),
        ],
    );
    {
        let mut s = Store::open(&b).unwrap();
        let code = "export function inbox({data}) {\n\
            if (String(data.payload.content).includes('spam')) return {reject: {code: 451, reason: 'no spam'}};\n\
            data.payload.content = String(data.payload.content).toUpperCase();\n\
            return {data};\n}\n";
        s.file_write(Caller::Owner, "mw.js", code.as_bytes(), &WriteOptions::default()).unwrap();
        s.file_set_authorized("mw.js", true).unwrap();
        s.file_write(Caller::Owner, "report.txt", b"quarterly numbers", &WriteOptions::default()).unwrap();
        s.close().unwrap();
    }
    {
        let mut s = Store::open(&a).unwrap();
        s.file_write(Caller::Owner, "report.txt", b"quarterly numbers", &WriteOptions::default()).unwrap();
        s.close().unwrap();
    }
    let send = |input: Value| Reply::Tools(vec![("msg_send".to_string(), input)]);
    let nowhere = adf::store::identity::AgentKeys::from_seed(&[9u8; 32]).unwrap().did;
    let bus = Bus::new();
    let f = factory(vec![(
        "a",
        vec![
            send(json!({"recipient": "b", "content": "hello b", "attachments": ["report.txt", "missing.txt"]})),
            send(json!({"recipient": "b", "content": "buy spam"})),
            send(json!({"address": "http://127.0.0.1:9/agents/x/inbox", "recipient": nowhere, "content": "x"})),
            Reply::Text("sent".into()),
        ],
    )]);
    let mut fleet = Fleet::new(bus.clone(), f);
    fleet.load(&a).unwrap();
    fleet.load(&b).unwrap();
    turn(&mut fleet, &bus, "a", "go").await;
    let r = results(&a);
    assert!(
        r[0].starts_with("Message sent to did:key:z6Mk") && r[0].ends_with("Status: delivered. with 1 attachment(s)"),
        "{r:?}"
    );
    assert!(r[1].contains("(451)") && r[1].contains("no spam"), "{r:?}");
    assert!(r[2].starts_with(&format!("Delivery to {nowhere} failed: cannot reach")), "{r:?}");
    // Point 47: pending → delivered | failed, nothing else.
    let out = rows(&a, "SELECT status, status_code, attachments, content FROM adf_outbox ORDER BY created_at");
    let st: Vec<(Value, Value)> = out.iter().map(|o| (o["status"].clone(), o["status_code"].clone())).collect();
    assert_eq!(st, [(json!("delivered"), Value::Null), (json!("failed"), json!(451)), (json!("failed"), Value::Null)]);
    let att: Value = serde_json::from_str(out[0]["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[1]["skipped"], true, "the missing file is recorded as skipped: {att}");
    // b got one message: rewritten by its middleware, the attachment imported.
    let inbox = rows(&b, "SELECT * FROM adf_inbox");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0]["content"], "HELLO B");
    let m: Value = serde_json::from_str(inbox[0]["meta"].as_str().unwrap()).unwrap();
    assert_eq!((m["message_verified"].clone(), m["payload_encrypted"].clone()), (json!(true), json!(true)));
    let att: Value = serde_json::from_str(inbox[0]["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["transfer"], "imported");
    assert_eq!(att[0]["path"], "imported/a/report.txt");
    assert!(att[0].get("data").is_none());
    let s = Store::open_read_only(&b).unwrap();
    assert_eq!(s.file_read_text("imported/a/report.txt").unwrap(), "quarterly numbers");
    drop(s);
    // Audit (format.md §3.8): every send of a archived whole, attachment
    // data inline although the payload travelled encrypted; b archived the
    // one message it accepted, as its middleware left it, before the
    // attachment was imported. The refused one left no inbox trace.
    let inline = base64::engine::general_purpose::STANDARD.encode("quarterly numbers");
    let sent = audits(&a);
    assert_eq!(sent.iter().map(|(s, _, _)| s.as_str()).collect::<Vec<_>>(), ["outbox_message"; 3]);
    let ids: Vec<Value> = rows(&a, "SELECT message_id FROM adf_outbox ORDER BY created_at")
        .into_iter()
        .map(|r| r["message_id"].clone())
        .collect();
    assert_eq!(sent.iter().map(|(_, r, _)| json!(r)).collect::<Vec<_>>(), ids);
    let first = &sent[0].2;
    assert_eq!(first["payload"]["content_type"], "application/x-adf-encrypted");
    assert!(first["signature"].as_str().unwrap().starts_with("ed25519:"));
    assert_eq!(first["payload"]["attachments"][0]["data"], inline.as_str());
    let got = audits(&b);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), json!(got[0].1)), ("inbox_message", inbox[0]["message_id"].clone()));
    assert_eq!(got[0].2["payload"]["content"], "HELLO B");
    assert_eq!(got[0].2["payload"]["attachments"][0]["data"], inline.as_str());

    // b reads, archives, deletes; code reaches the same tools.
    let code = "const n = await adf.msg_list({});\n\
        const read = await adf.msg_read({});\n\
        const again = await adf.msg_read({});\n\
        await adf.msg_update({message_ids: read[0].id, status: 'archived'});\n\
        const del = await adf.msg_update({message_ids: [read[0].id, 'nope'], status: 'delete'});\n\
        const found = await adf.agent_discover({});\n\
        return {n, id: read[0].id, content: read[0].content, again, del, found: found.map(c => c.handle)};";
    let scripts =
        vec![("b", vec![Reply::Tools(vec![("sys_code".into(), json!({"code": code}))]), Reply::Text("done".into())])];
    assert_eq!(fleet.shutdown().await, Vec::<String>::new());
    let mut fleet = Fleet::new(bus.clone(), factory(scripts));
    fleet.load(&a).unwrap();
    fleet.load(&b).unwrap();
    turn(&mut fleet, &bus, "b", "read").await;
    let r = results(&b);
    let v: Value = serde_json::from_str(r.last().unwrap()).unwrap_or_else(|_| panic!("{r:?}"));
    assert_eq!(v["n"], "Inbox: 1 unread, 0 read, 0 archived, 1 total.");
    assert_eq!(v["content"], "HELLO B");
    assert_eq!(v["again"], "No unread messages in inbox.");
    assert_eq!(v["del"]["results"][0]["success"], true);
    assert_eq!(v["del"]["results"][1]["success"], false);
    assert_eq!(v["found"], json!(["a"]));
    assert!(rows(&b, "SELECT id FROM adf_inbox").is_empty());
    assert_eq!(audits(&b).len(), 1, "deleting a message writes no audit row");
    assert_eq!(fleet.shutdown().await, Vec::<String>::new());
}

/// The agent's message audit rows: (source, ref, decoded message).
fn audits(path: &std::path::Path) -> Vec<(String, String, Value)> {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut q = c.prepare("SELECT source, ref, data FROM adf_audit WHERE source LIKE '%_message' ORDER BY id").unwrap();
    q.query_map([], |r| {
        let blob: Vec<u8> = r.get(2)?;
        Ok((r.get(0)?, r.get(1)?, adf::store::audit::decode(&blob).unwrap()))
    })
    .unwrap()
    .map(|r| r.unwrap())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_methods_of_code_p50_p51() {
    let dir = tmp();
    let d = dir.path();
    let a = create(d, "a", &[]);
    let other = adf::store::identity::AgentKeys::from_seed(&[3u8; 32]).unwrap();
    // An attestation about a, by someone else, and one about someone else.
    let a_did = Store::open_read_only(&a).unwrap().meta_get("adf_did").unwrap().unwrap().value;
    let claim = |subject: &str, role: &str| {
        adf::identity::attest::issue(
            &other.signing,
            &adf::identity::attest::Claim {
                issuer: &other.did,
                subject,
                role,
                issued_at: "2026-12-01T00:00:00.000Z",
                expires_at: None,
                scope: None,
            },
        )
    };
    let good = claim(&a_did, "peer");
    let reserved = claim(&a_did, "owner");
    let elsewhere = claim(&other.did, "peer");
    // Even a crypto:* row opened to code stays closed.
    {
        let c = rusqlite::Connection::open(&a).unwrap();
        c.execute("UPDATE adf_identity SET code_access = 1 WHERE purpose = 'crypto:signing:private_key'", []).unwrap();
    }
    let code = format!(
        "const out = {{}};\n\
         await adf.set_identity({{purpose: 'svc:token', value: 's3cret'}});\n\
         out.v = await adf.get_identity({{purpose: 'svc:token'}});\n\
         out.list = await adf.get_identity({{}});\n\
         try {{ await adf.get_identity({{purpose: 'crypto:signing:private_key'}}); }} catch (e) {{ out.key = e.code; }}\n\
         out.status = await adf.identity_status({{}});\n\
         out.add = await adf.attestation_add({{attestation: {good}}});\n\
         out.dup = await adf.attestation_add({{attestation: {good}}});\n\
         try {{ await adf.attestation_add({{attestation: {reserved}}}); }} catch (e) {{ out.reserved = e.code; }}\n\
         try {{ await adf.attestation_add({{attestation: {elsewhere}}}); }} catch (e) {{ out.elsewhere = e.code; }}\n\
         try {{ await adf.attestation_issue({{subject: '{sub}', role: 'peer'}}); }} catch (e) {{ out.issue = e.code; }}\n\
         out.roles = (await adf.attestation_list({{}})).map(a => a.role);\n\
         return out;",
        sub = other.did
    );
    let bus = Bus::new();
    let f = factory(vec![(
        "a",
        vec![Reply::Tools(vec![("sys_code".into(), json!({"code": code}))]), Reply::Text("ok".into())],
    )]);
    let mut fleet = Fleet::new(bus.clone(), f);
    fleet.load(&a).unwrap();
    turn(&mut fleet, &bus, "a", "go").await;
    let r = results(&a);
    let v: Value = serde_json::from_str(r.last().unwrap()).unwrap_or_else(|_| panic!("{r:?}"));
    assert_eq!(v["v"], "s3cret");
    assert_eq!(v["list"], json!([{"purpose": "svc:token", "encrypted": false}]));
    assert_eq!(v["key"], "FORBIDDEN", "{v}");
    assert_eq!(v["status"]["envelopes"], json!({"identity": "absent", "credentials": "absent"}));
    assert_eq!(v["add"]["added"], true);
    assert_eq!(v["dup"]["added"], false, "a duplicate signature is a no-op");
    assert_eq!(v["reserved"], "RESERVED_ROLE");
    assert_eq!(v["elsewhere"], "INVALID_ATTESTATION");
    assert_eq!(v["issue"], "REQUIRES_AUTHORIZED_CODE", "attestation_issue is restricted by default: {v}");
    assert_eq!(v["roles"], json!(["peer"]));
    // set_identity rows are open to code.
    let ids = rows(&a, "SELECT purpose, code_access FROM adf_identity WHERE purpose = 'svc:token'");
    assert_eq!(ids[0]["code_access"], 1);
    assert_eq!(fleet.shutdown().await, Vec::<String>::new());
}
