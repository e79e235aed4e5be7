//! The WhatsApp channel (issue 20) against a wire-level fake of WhatsApp's
//! chat server on loopback: a WebSocket carrying the multi-device
//! protocol's frames (3-byte lengths, the `WA` header first), the Noise XX
//! handshake as the server's side of it, then Noise-encrypted binary
//! nodes. The fake plays the phone too: it reads the QR code the client
//! shows (its ref, keys and ADV secret), signs the device identity with an
//! account key and the HMAC keyed by that secret, as a phone does, answers
//! the client's signature, and restarts the stream (515) so the client logs
//! in as a linked device. After a login it answers the IQs a linked device
//! sends (passive, prekeys, app-state sync, usync, pings) as the server
//! would, with nothing to sync.
//!
//! The client's build in the tests skips the check of the server's
//! certificate chain against WhatsApp's root (the fake cannot sign with
//! it); everything else is the real client.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::{Fleet, ProviderFactory};
use base64::Engine;
use common::*;
use futures_util::{SinkExt, StreamExt};
use hmac::Mac;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use whatsapp_rust::buffa::{Message as _, MessageField};
use whatsapp_rust::prelude::MessageExt;
use whatsapp_rust::wacore::framing::{FrameDecoder, encode_frame};
use whatsapp_rust::wacore::handshake::NoiseHandshake;
use whatsapp_rust::wacore::libsignal::protocol::KeyPair;
use whatsapp_rust::wacore_binary::builder::NodeBuilder;
use whatsapp_rust::wacore_binary::consts::{NOISE_PATTERN_XX, WA_CONN_HEADER};
use whatsapp_rust::wacore_binary::node::Node;
use whatsapp_rust::waproto::whatsapp as wa;

/// The tests set `ADF_HOME` for the fleet they run: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The phone number the fake's phone has.
const PHONE: &str = "15550000001";

/// What the fake saw and what the test tells it.
#[derive(Default)]
struct Seen {
    /// Handshakes: `register` for a new device, else the login's user.
    logins: Vec<String>,
    /// The QR code to scan (from the test), and what the client answered.
    qr: Option<String>,
    signed: bool,
    /// Tamper with the HMAC (a phone that read another code).
    bad_hmac: bool,
    iqs: Vec<String>,
    /// The registered device's Signal bundle: registration id, identity,
    /// signed prekey id, key and signature.
    bundle: Option<Bundle>,
    /// Messages to deliver to the linked device: (id, sender, push name, text).
    outbox: Vec<Out>,
    /// Messages waiting on the server while the device is off: sent as
    /// the offline queue at its next login.
    offline: Vec<Out>,
    /// The last message time handed out (seconds past the base).
    t: u64,
    /// The Signal type of each message the fake's people sent.
    kinds: Vec<&'static str>,
    /// Drop the connection (the server going away).
    kick: bool,
    /// Nodes to send as they are (a malformed message, a stream error).
    raw: Vec<Node>,
    /// The group the next messages of the outbox are sent in, if any.
    group: Option<String>,
    /// Encrypted media the fake's CDN serves, by path.
    media: std::collections::HashMap<String, Vec<u8>>,
    /// What the linked device sent, decrypted: (to, message).
    received: Vec<(String, wa::Message)>,
    /// The stanza id of each of those.
    received_ids: Vec<String>,
    /// Messages delivered that the device has not acknowledged: delivered
    /// again, as they were, at its next login (as the server does).
    unacked: Vec<(String, Node)>,
    /// The ids the device acknowledged.
    acked: Vec<String>,
    /// The phone numbers of the people who write from a LID (`…@lid`),
    /// sent beside it as the server does.
    pn_of_lid: std::collections::HashMap<String, String>,
}

/// Deliver a message to the device, kept until it is acknowledged.
async fn deliver(c: &mut Conn, seen: &Shared, m: Node) {
    seen.lock().unwrap().unacked.push((attr(&m, "id"), m.clone()));
    c.send(m).await;
}

type Shared = Arc<Mutex<Seen>>;

/// The registered device's Signal bundle: registration id, identity key,
/// signed prekey id, key and signature.
type Bundle = (u32, Vec<u8>, u32, Vec<u8>, Vec<u8>);

/// A message from one of the fake's people: id, sender number, push name.
type Out = (String, String, String, wa::Message);

/// A certificate chain naming the server's static key, expired (so the
/// client keeps to XX and never tries IK with a cached key).
fn cert_chain(server_static: &[u8]) -> Vec<u8> {
    use wa::cert_chain::noise_certificate::Details;
    let details = |serial: u32, issuer: u32, key: Vec<u8>| {
        Details {
            serial: Some(serial),
            issuer_serial: Some(issuer),
            key: Some(key),
            not_before: Some(0),
            not_after: Some(1_000_000_000),
        }
        .encode_to_vec()
    };
    let cert = |d: Vec<u8>| wa::cert_chain::NoiseCertificate { details: Some(d), signature: Some(vec![0; 64]) };
    wa::CertChain {
        intermediate: MessageField::some(cert(details(1, 0, vec![0xcc; 32]))),
        leaf: MessageField::some(cert(details(2, 1, server_static.to_vec()))),
    }
    .encode_to_vec()
}

/// One client connection: the Noise transport and the node codec.
struct Conn {
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    frames: FrameDecoder,
    first: bool,
    read: Option<whatsapp_rust::wacore::noise::NoiseCipher>,
    write: Option<whatsapp_rust::wacore::noise::NoiseCipher>,
    rc: u32,
    wc: u32,
}

impl Conn {
    async fn frame(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(f) = self.frames.decode_frame() {
                return Some(f.to_vec());
            }
            let msg = self.ws.next().await?.ok()?;
            let Message::Binary(mut b) = msg else { continue };
            if self.first {
                self.first = false;
                if b.starts_with(&WA_CONN_HEADER) {
                    b = b.slice(WA_CONN_HEADER.len()..);
                }
            }
            self.frames.feed(&b);
        }
    }

    async fn send_frame(&mut self, payload: &[u8]) {
        let f = encode_frame(payload, None).unwrap();
        let _ = self.ws.send(Message::Binary(f.into())).await;
    }

    async fn recv(&mut self) -> Option<Node> {
        let mut f = self.frame().await?;
        let c = self.read.as_ref()?;
        c.decrypt_in_place_with_counter(self.rc, &mut f).ok()?;
        self.rc += 1;
        let raw = whatsapp_rust::wacore_binary::util::unpack(&f).ok()?;
        Some(whatsapp_rust::wacore_binary::marshal::unmarshal_ref(&raw).ok()?.to_owned())
    }

    async fn send(&mut self, n: Node) {
        let pt = whatsapp_rust::wacore_binary::marshal::marshal(&n).unwrap();
        let ct = self.write.as_ref().unwrap().encrypt_with_counter(self.wc, &pt).unwrap();
        self.wc += 1;
        self.send_frame(&ct).await;
    }

    /// The server's side of Noise XX; the client's payload.
    async fn handshake(&mut self, server: &KeyPair) -> Option<wa::ClientPayload> {
        let hello = wa::HandshakeMessage::decode_from_slice(&self.frame().await?).ok()?;
        let eph: Vec<u8> = hello.client_hello.as_option()?.ephemeral.clone()?;
        let mut n = NoiseHandshake::new(NOISE_PATTERN_XX, &WA_CONN_HEADER).ok()?;
        n.authenticate(&eph);
        let se = KeyPair::generate(&mut rand::rng());
        let se_pub = se.public_key.public_key_bytes().to_vec();
        n.authenticate(&se_pub);
        n.mix_shared_secret(se.private_key.serialize(), &eph).ok()?;
        let s_pub = server.public_key.public_key_bytes().to_vec();
        let enc_static = n.encrypt(&s_pub).ok()?;
        n.mix_shared_secret(server.private_key.serialize(), &eph).ok()?;
        let enc_cert = n.encrypt(&cert_chain(&s_pub)).ok()?;
        let sh = wa::HandshakeMessage {
            server_hello: MessageField::some(wa::handshake_message::ServerHello {
                ephemeral: Some(se_pub),
                r#static: Some(enc_static),
                payload: Some(enc_cert),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.send_frame(&sh.encode_to_vec()).await;
        let fin = wa::HandshakeMessage::decode_from_slice(&self.frame().await?).ok()?;
        let cf = fin.client_finish.as_option()?;
        let client_static = n.decrypt(cf.r#static.as_deref()?).ok()?;
        n.mix_shared_secret(se.private_key.serialize(), &client_static).ok()?;
        let payload = n.decrypt(cf.payload.as_deref()?).ok()?;
        let (c2s, s2c) = n.finish().ok()?;
        self.read = Some(c2s);
        self.write = Some(s2c);
        wa::ClientPayload::decode_from_slice(&payload).ok()
    }
}

fn attr(n: &Node, k: &str) -> String {
    n.attrs.get(k).map(|v| v.as_str().to_string()).unwrap_or_default()
}

/// The phone's answer to a scanned code: the device identity, signed by
/// the account key over the companion's identity key, HMAC'd with the
/// code's ADV secret.
fn device_identity(qr: &str, bad_hmac: bool) -> Vec<u8> {
    let parts: Vec<&str> = qr.split(',').collect();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    let (identity, secret) = (b64(parts[2]), b64(parts[3]));
    let account = KeyPair::generate(&mut rand::rng());
    let details = wa::ADVDeviceIdentity {
        raw_id: Some(1),
        timestamp: Some(1_764_547_200),
        key_index: Some(1),
        account_type: Some(wa::ADVEncryptionType::E2EE),
        device_type: Some(wa::ADVEncryptionType::E2EE),
    }
    .encode_to_vec();
    let signed_over = [&[6u8, 0][..], &details, &identity].concat();
    let sig = account.private_key.calculate_signature(&signed_over, &mut rand::rng()).unwrap();
    let signed = wa::ADVSignedDeviceIdentity {
        details: Some(details),
        account_signature_key: Some(account.public_key.public_key_bytes().to_vec()),
        account_signature: Some(sig.to_vec()),
        ..Default::default()
    }
    .encode_to_vec();
    let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::KeyInit>::new_from_slice(&secret).unwrap();
    mac.update(&signed);
    let mut hmac = mac.finalize().into_bytes().to_vec();
    if bad_hmac {
        hmac[0] ^= 1;
    }
    wa::ADVSignedDeviceIdentityHMAC {
        details: Some(signed),
        hmac: Some(hmac),
        account_type: Some(wa::ADVEncryptionType::E2EE),
    }
    .encode_to_vec()
}

fn iq(id: &str, ty: &str) -> NodeBuilder {
    NodeBuilder::new("iq").attr("id", id.to_string()).attr("type", ty.to_string()).attr("from", "s.whatsapp.net")
}

/// A new device: show a ref, wait for the scan, send the pairing, wait
/// for the signature, restart the stream.
async fn register(c: &mut Conn, seen: &Shared) {
    let refs = NodeBuilder::new("pair-device")
        .children([NodeBuilder::new("ref").bytes(b"2@fake-ref-1".to_vec()).build()])
        .build();
    c.send(iq("pair-1", "set").attr("xmlns", "md").children([refs]).build()).await;
    let qr = loop {
        tokio::select! {
            n = c.recv() => if n.is_none() { return },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        if let Some(q) = seen.lock().unwrap().qr.take() {
            break q;
        }
    };
    let bad = seen.lock().unwrap().bad_hmac;
    let success = NodeBuilder::new("pair-success")
        .children([
            NodeBuilder::new("device-identity").bytes(device_identity(&qr, bad)).build(),
            NodeBuilder::new("platform").attr("name", "android").build(),
            NodeBuilder::new("device").attr("jid", format!("{PHONE}:1@s.whatsapp.net")).build(),
            NodeBuilder::new("biz").attr("name", "Ann's phone").build(),
        ])
        .build();
    c.send(iq("pair-2", "set").attr("xmlns", "md").children([success]).build()).await;
    while let Some(n) = c.recv().await {
        if n.tag == "iq" && attr(&n, "id") == "pair-2" {
            if attr(&n, "type") == "result" && n.get_optional_child("pair-device-sign").is_some() {
                seen.lock().unwrap().signed = true;
                c.send(NodeBuilder::new("stream:error").attr("code", "515").build()).await;
            }
            return;
        }
    }
}

/// The answer to one of a linked device's IQs, as the server would give
/// it with nothing to sync.
fn answer(n: &Node) -> Node {
    let id = attr(n, "id");
    let ns = attr(n, "xmlns");
    let mut out = iq(&id, "result");
    if ns == "w:sync:app:state"
        && let Some(sync) = n.get_optional_child("sync")
    {
        let cols: Vec<Node> = sync
            .get_children_by_tag("collection")
            .map(|c| NodeBuilder::new("collection").attr("name", attr(c, "name")).attr("version", "0").build())
            .collect();
        out = out.children([NodeBuilder::new("sync").children(cols).build()]);
    } else if ns == "w:g2" {
        let to = attr(n, "to");
        let g = NodeBuilder::new("group")
            .attr("id", to.split('@').next().unwrap_or("").to_string())
            .attr("subject", "Ops")
            .attr("creation", "1764547000")
            .children([
                NodeBuilder::new("participant").attr("jid", "15551234567@s.whatsapp.net").build(),
                NodeBuilder::new("participant")
                    .attr("jid", format!("{PHONE}@s.whatsapp.net"))
                    .attr("type", "admin")
                    .build(),
            ])
            .build();
        out = out.children([g]);
    } else if ns == "w:m" {
        let host = NodeBuilder::new("host").attr("hostname", "mmg.whatsapp.net").build();
        out = out.children([NodeBuilder::new("media_conn")
            .attr("auth", "fakeauth")
            .attr("ttl", "3600")
            .children([host])
            .build()]);
    } else if ns == "usync"
        && let Some(list) = n.get_optional_child("usync").and_then(|u| u.get_optional_child("list"))
    {
        let devices = n
            .get_optional_child("usync")
            .and_then(|u| u.get_optional_child("query"))
            .is_some_and(|q| q.get_optional_child("devices").is_some());
        let users: Vec<Node> = list
            .get_children_by_tag("user")
            .map(|u| {
                if !devices {
                    return NodeBuilder::new("user").attr("jid", attr(u, "jid")).build();
                }
                let dl = NodeBuilder::new("device-list").children([NodeBuilder::new("device").attr("id", "0").build()]);
                NodeBuilder::new("user")
                    .attr("jid", attr(u, "jid"))
                    .children([NodeBuilder::new("devices").children([dl.build()]).build()])
                    .build()
            })
            .collect();
        let list = NodeBuilder::new("list").children(users).build();
        out = out.children([NodeBuilder::new("usync").children([list]).build()]);
    }
    out.build()
}

/// The people the fake plays, kept across connections (their sessions
/// with the linked device go on after it reconnects).
type Peers = Arc<tokio::sync::Mutex<std::collections::HashMap<String, Peer>>>;

/// A message from one of the fake's people, encrypted to the linked
/// device: pairwise, or in the current group under the sender's key.
async fn stanza(seen: &Shared, peers: &Peers, out: Out, offline: bool) -> Node {
    let (id, from, name, msg) = out;
    let (bundle, group, t, pn) = {
        let mut s = seen.lock().unwrap();
        s.t += 1;
        (s.bundle.clone().unwrap(), s.group.clone(), 1_764_547_300 + s.t, s.pn_of_lid.get(&from).cloned())
    };
    // A person by number, or by LID with the number beside it.
    let jid = if from.contains('@') { from.clone() } else { format!("{from}@s.whatsapp.net") };
    let mut all = peers.lock().await;
    let peer = all.entry(from.clone()).or_insert_with(Peer::new);
    let kind = if msg.audio_message.is_set() { "media" } else { "text" };
    let mut encs = Vec::new();
    let mut m = NodeBuilder::new("message");
    if let Some(g) = &group {
        let (skdm, skmsg) = peer.group_encrypt(g, &msg).await;
        let (ty, ct) = peer.encrypt(&bundle, &skdm).await;
        encs.push(NodeBuilder::new("enc").attr("v", "2").attr("type", ty).bytes(ct).build());
        encs.push(NodeBuilder::new("enc").attr("v", "2").attr("type", "skmsg").bytes(skmsg).build());
        m = m.attr("from", g.clone()).attr("participant", jid);
        if let Some(pn) = &pn {
            m = m.attr("addressing_mode", "lid").attr("participant_pn", format!("{pn}@s.whatsapp.net"));
        }
    } else {
        let (ty, ct) = peer.encrypt(&bundle, &msg).await;
        seen.lock().unwrap().kinds.push(ty);
        encs.push(NodeBuilder::new("enc").attr("v", "2").attr("type", ty).bytes(ct).build());
        m = m.attr("from", jid);
        if let Some(pn) = &pn {
            m = m.attr("sender_pn", format!("{pn}@s.whatsapp.net"));
        }
    }
    if offline {
        m = m.attr("offline", "1");
    }
    m.attr("id", id).attr("t", t.to_string()).attr("type", kind).attr("notify", name).children(encs).build()
}

fn ib(child: Node) -> Node {
    NodeBuilder::new("ib").attr("from", "s.whatsapp.net").children([child]).build()
}

/// What waited for a device while it was off, once it says it is active:
/// the offline queue between its preview and its end marker.
async fn drain(c: &mut Conn, seen: &Shared, peers: &Peers) {
    let (queued, again) = {
        let mut s = seen.lock().unwrap();
        (std::mem::take(&mut s.offline), std::mem::take(&mut s.unacked))
    };
    let count = (queued.len() + again.len()).to_string();
    if count != "0" {
        c.send(ib(NodeBuilder::new("offline_preview")
            .attr("count", count.clone())
            .attr("message", count.clone())
            .build()))
            .await;
        for (_, m) in again {
            deliver(c, seen, m).await;
        }
        for out in queued {
            let m = stanza(seen, peers, out, true).await;
            deliver(c, seen, m).await;
        }
    }
    c.send(ib(NodeBuilder::new("offline").attr("count", count).build())).await;
}

/// A linked device logs in: the offline queue once it is active, then
/// live traffic and IQs.
async fn login(c: &mut Conn, seen: &Shared, peers: &Peers) {
    c.send(NodeBuilder::new("success").attr("t", "1764547200").attr("lid", "100000000000001:1@lid").build()).await;
    loop {
        if std::mem::take(&mut seen.lock().unwrap().kick) {
            return;
        }
        let raw = std::mem::take(&mut seen.lock().unwrap().raw);
        for n in raw {
            c.send(n).await;
        }
        let next = {
            let mut s = seen.lock().unwrap();
            if s.outbox.is_empty() { None } else { Some(s.outbox.remove(0)) }
        };
        if let Some(out) = next {
            let m = stanza(seen, peers, out, false).await;
            deliver(c, seen, m).await;
            continue;
        }
        let n = tokio::select! {
            n = c.recv() => match n { Some(n) => n, None => return },
            _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
        };
        // A message is taken off the server's queue by its delivery
        // receipt (several ids in one, after an offline drain) or a bare
        // ack; a retry receipt asks for it again instead.
        let taken =
            (n.tag == "receipt" && attr(&n, "type") != "retry") || (n.tag == "ack" && attr(&n, "class") == "message");
        if taken {
            let items = n.get_optional_child("list").into_iter().flat_map(|l| l.get_children_by_tag("item"));
            let ids: Vec<String> = std::iter::once(attr(&n, "id")).chain(items.map(|i| attr(i, "id"))).collect();
            let mut s = seen.lock().unwrap();
            s.unacked.retain(|(i, _)| !ids.contains(i));
            s.acked.extend(ids);
            continue;
        }
        if n.tag == "message" {
            // Decrypt what is for a person the fake plays; acknowledge. In
            // a group, the sender key comes pairwise and the message under it.
            let group = attr(&n, "to").ends_with("@g.us").then(|| attr(&n, "to"));
            let mut peers = peers.lock().await;
            for to in n.get_optional_child("participants").into_iter().flat_map(|p| p.get_children_by_tag("to")) {
                let jid = attr(to, "jid");
                let user = jid.split(['@', ':']).next().unwrap_or("").to_string();
                let (Some(peer), Some(enc)) = (peers.get_mut(&user), to.get_optional_child("enc")) else { continue };
                if user == PHONE {
                    continue;
                }
                let Some(whatsapp_rust::wacore_binary::node::NodeContent::Bytes(bytes)) = &enc.content else {
                    continue;
                };
                let v = attr(enc, "v").parse().unwrap_or(2);
                let m = peer.decrypt(&attr(enc, "type"), bytes, v).await;
                match (&group, m.sender_key_distribution_message.as_option()) {
                    (Some(g), Some(skdm)) => {
                        let sk = skdm.axolotl_sender_key_distribution_message.clone().unwrap_or_default();
                        peer.take_sender_key(g, &sk).await;
                        let top = n.get_children_by_tag("enc").find(|e| attr(e, "type") == "skmsg");
                        if let Some(top) = top
                            && let Some(whatsapp_rust::wacore_binary::node::NodeContent::Bytes(b)) = &top.content
                        {
                            let v = attr(top, "v").parse().unwrap_or(2);
                            let m = peer.group_decrypt(g, b, v).await;
                            let mut s = seen.lock().unwrap();
                            s.received.push((g.clone(), m));
                            s.received_ids.push(attr(&n, "id"));
                        }
                    }
                    _ => {
                        let mut s = seen.lock().unwrap();
                        s.received.push((jid.clone(), m));
                        s.received_ids.push(attr(&n, "id"));
                    }
                }
            }
            let ack = NodeBuilder::new("ack")
                .attr("class", "message")
                .attr("id", attr(&n, "id"))
                .attr("from", attr(&n, "to"))
                .attr("t", "1764547400")
                .build();
            c.send(ack).await;
            continue;
        }
        if n.tag == "iq" && !attr(&n, "id").is_empty() && attr(&n, "type") != "result" {
            seen.lock().unwrap().iqs.push(attr(&n, "xmlns"));
            let keys =
                n.get_optional_child("key").filter(|_| attr(&n, "xmlns") == "encrypt" && attr(&n, "type") == "get");
            if let Some(key) = keys {
                // Prekey bundles of the people asked for (and of the phone).
                let mut peers = peers.lock().await;
                let users: Vec<Node> = key
                    .get_children_by_tag("user")
                    .map(|u| {
                        let jid = attr(u, "jid");
                        let user = jid.split(['@', ':']).next().unwrap_or("").to_string();
                        peers.entry(user).or_insert_with(Peer::new).bundle_node(&jid)
                    })
                    .collect();
                c.send(
                    iq(&attr(&n, "id"), "result").children([NodeBuilder::new("list").children(users).build()]).build(),
                )
                .await;
                continue;
            }
            c.send(answer(&n)).await;
            if attr(&n, "xmlns") == "passive" {
                drain(c, seen, peers).await;
            }
        }
    }
}

use whatsapp_rust::wacore::libsignal::protocol::{
    CiphertextMessage, CiphertextMessageType, Direction, GenericSignedPreKey, IdentityChange, IdentityKey,
    IdentityKeyPair, IdentityKeyStore, PreKeyBundle, PreKeyId, PreKeyRecord, PreKeySignalMessage, PreKeyStore,
    ProtocolAddress, PublicKey, SessionRecord, SessionStore, SignalMessage, SignalProtocolError, SignedPreKeyId,
    SignedPreKeyRecord, SignedPreKeyStore, Timestamp, UsePQRatchet, message_decrypt, message_encrypt,
    process_prekey_bundle,
};
use whatsapp_rust::wacore::libsignal::protocol::{
    SenderKeyDistributionMessage, SenderKeyName, SenderKeyRecord, SenderKeyStore,
    create_sender_key_distribution_message, group_decrypt, group_encrypt, process_sender_key_distribution_message,
};
type SignalResult<T> = whatsapp_rust::wacore::libsignal::protocol::error::Result<T>;

/// A person writing to the agent: their Signal identity, signed prekey
/// and sessions.
struct Peer {
    ids: Ids,
    sessions: Sessions,
    senders: SenderKeys,
    signed: SignedPreKeys,
    spk: KeyPair,
    spk_sig: Vec<u8>,
}

#[derive(Default)]
struct SenderKeys(std::collections::HashMap<SenderKeyName, SenderKeyRecord>);

#[async_trait::async_trait]
impl SenderKeyStore for SenderKeys {
    async fn store_sender_key(&mut self, n: &SenderKeyName, r: SenderKeyRecord) -> SignalResult<()> {
        self.0.insert(n.clone(), r);
        Ok(())
    }
    async fn load_sender_key(&self, n: &SenderKeyName) -> SignalResult<Option<SenderKeyRecord>> {
        Ok(self.0.get(n).cloned())
    }
}

#[derive(Default)]
struct SignedPreKeys(std::collections::HashMap<SignedPreKeyId, SignedPreKeyRecord>);
struct NoPreKeys;

#[async_trait::async_trait]
impl SignedPreKeyStore for SignedPreKeys {
    async fn get_signed_pre_key(&self, id: SignedPreKeyId) -> SignalResult<SignedPreKeyRecord> {
        self.0.get(&id).cloned().ok_or(SignalProtocolError::InvalidSignedPreKeyId)
    }
    async fn save_signed_pre_key(&mut self, id: SignedPreKeyId, r: &SignedPreKeyRecord) -> SignalResult<()> {
        self.0.insert(id, r.clone());
        Ok(())
    }
}

#[async_trait::async_trait]
impl PreKeyStore for NoPreKeys {
    async fn get_pre_key(&self, _: PreKeyId) -> SignalResult<PreKeyRecord> {
        Err(SignalProtocolError::InvalidPreKeyId)
    }
    async fn save_pre_key(&mut self, _: PreKeyId, _: &PreKeyRecord) -> SignalResult<()> {
        Ok(())
    }
    async fn remove_pre_key(&mut self, _: PreKeyId) -> SignalResult<()> {
        Ok(())
    }
}

struct Ids(IdentityKeyPair, std::collections::HashMap<ProtocolAddress, IdentityKey>);
#[derive(Default)]
struct Sessions(std::collections::HashMap<ProtocolAddress, SessionRecord>);

#[async_trait::async_trait]
impl IdentityKeyStore for Ids {
    async fn get_identity_key_pair(&self) -> SignalResult<IdentityKeyPair> {
        Ok(self.0.clone())
    }
    async fn get_local_registration_id(&self) -> SignalResult<u32> {
        Ok(4242)
    }
    async fn save_identity(&mut self, a: &ProtocolAddress, k: &IdentityKey) -> SignalResult<IdentityChange> {
        let changed = self.1.insert(a.clone(), *k).is_some_and(|old| old != *k);
        Ok(IdentityChange::from_changed(changed))
    }
    async fn is_trusted_identity(&self, _: &ProtocolAddress, _: &IdentityKey, _: Direction) -> SignalResult<bool> {
        Ok(true)
    }
    async fn get_identity(&self, a: &ProtocolAddress) -> SignalResult<Option<IdentityKey>> {
        Ok(self.1.get(a).cloned())
    }
}

#[async_trait::async_trait]
impl SessionStore for Sessions {
    async fn load_session(&self, a: &ProtocolAddress) -> SignalResult<Option<SessionRecord>> {
        Ok(self.0.get(a).cloned())
    }
    async fn has_session(&self, a: &ProtocolAddress) -> SignalResult<bool> {
        Ok(self.0.contains_key(a))
    }
    async fn store_session(&mut self, a: &ProtocolAddress, r: SessionRecord) -> SignalResult<()> {
        self.0.insert(a.clone(), r);
        Ok(())
    }
}

impl Peer {
    fn new() -> Peer {
        let mut rng = rand::make_rng::<rand::rngs::StdRng>();
        let id = IdentityKeyPair::generate(&mut rng);
        let spk = KeyPair::generate(&mut rng);
        let spk_sig = id.private_key().calculate_signature(&spk.public_key.serialize(), &mut rng).unwrap().to_vec();
        let mut signed = SignedPreKeys::default();
        let record = SignedPreKeyRecord::new(1u32.into(), Timestamp::from_epoch_millis(0), &spk, &spk_sig);
        signed.0.insert(1u32.into(), record);
        Peer {
            ids: Ids(id, Default::default()),
            sessions: Default::default(),
            senders: Default::default(),
            signed,
            spk,
            spk_sig,
        }
    }

    /// This person's prekey bundle, as the server hands it out.
    fn bundle_node(&self, jid: &str) -> Node {
        use whatsapp_rust::wacore::protocol::ProtocolNode;
        let bundle = PreKeyBundle::new(
            4242,
            0u32.into(),
            None,
            1u32.into(),
            self.spk.public_key,
            self.spk_sig.clone(),
            *self.ids.0.identity_key(),
        )
        .unwrap();
        whatsapp_rust::wacore::iq::prekeys::PreKeyBundleUserNode::from_bundle(jid.parse().unwrap(), &bundle, None)
            .unwrap()
            .into_node()
    }

    /// This person's message in a group: the sender key distribution
    /// message (to send pairwise) and the message under the sender key.
    async fn group_encrypt(&mut self, group: &str, msg: &wa::Message) -> (wa::Message, Vec<u8>) {
        let name = SenderKeyName::new(group.to_string(), "me".into());
        let mut rng = rand::make_rng::<rand::rngs::StdRng>();
        let skdm = create_sender_key_distribution_message(&name, &mut self.senders, &mut rng).await.unwrap();
        let pt = whatsapp_rust::wacore::messages::MessageUtils::encode_and_pad(msg);
        let skmsg = group_encrypt(&mut self.senders, &name, &pt, &mut rng).await.unwrap();
        let wrapped = wa::Message {
            sender_key_distribution_message: MessageField::some(wa::message::SenderKeyDistributionMessage {
                group_id: Some(group.to_string()),
                axolotl_sender_key_distribution_message: Some(skdm.serialized().to_vec()),
            }),
            ..Default::default()
        };
        (wrapped, skmsg.serialized().to_vec())
    }

    /// The linked device's sender key for a group, from its distribution message.
    async fn take_sender_key(&mut self, group: &str, skdm: &[u8]) {
        let name = SenderKeyName::new(group.to_string(), "agent".into());
        let skdm = SenderKeyDistributionMessage::try_from(skdm).unwrap();
        process_sender_key_distribution_message(&name, &skdm, &mut self.senders).await.unwrap();
    }

    /// The linked device's message in a group, decrypted.
    async fn group_decrypt(&mut self, group: &str, b: &[u8], v: u8) -> wa::Message {
        let name = SenderKeyName::new(group.to_string(), "agent".into());
        let pt = group_decrypt(b, &mut self.senders, &name).await.unwrap();
        whatsapp_rust::wacore::messages::decode_plaintext(&pt, v).unwrap()
    }

    /// A message from the linked device to this person, decrypted.
    async fn decrypt(&mut self, ty: &str, b: &[u8], v: u8) -> wa::Message {
        let device = ProtocolAddress::new(PHONE, 1u32.into());
        let ct = if ty == "pkmsg" {
            CiphertextMessage::PreKeySignalMessage(PreKeySignalMessage::try_from(b).unwrap())
        } else {
            CiphertextMessage::SignalMessage(SignalMessage::try_from(b).unwrap())
        };
        let mut rng = rand::make_rng::<rand::rngs::StdRng>();
        let out = message_decrypt(
            &ct,
            &device,
            &mut self.sessions,
            &mut self.ids,
            &mut NoPreKeys,
            &self.signed,
            &mut rng,
            UsePQRatchet::No,
        )
        .await
        .unwrap();
        whatsapp_rust::wacore::messages::decode_plaintext(&out.plaintext, v).unwrap()
    }

    /// A text to the linked device, end to end: (`pkmsg`|`msg`, bytes).
    async fn encrypt(&mut self, b: &Bundle, msg: &wa::Message) -> (&'static str, Vec<u8>) {
        let device = ProtocolAddress::new(PHONE, 1u32.into());
        if !self.sessions.0.contains_key(&device) {
            let key = |k: &[u8]| PublicKey::from_djb_public_key_bytes(k).unwrap();
            let bundle = PreKeyBundle::new(
                b.0,
                1u32.into(),
                None,
                b.2.into(),
                key(&b.3),
                b.4.clone(),
                IdentityKey::new(key(&b.1)),
            )
            .unwrap();
            process_prekey_bundle(
                &device,
                &mut self.sessions,
                &mut self.ids,
                &bundle,
                &mut rand::make_rng::<rand::rngs::StdRng>(),
                UsePQRatchet::No,
            )
            .await
            .unwrap();
        }
        let pt = whatsapp_rust::wacore::messages::MessageUtils::encode_and_pad(msg);
        let ct = message_encrypt(&pt, &device, &mut self.sessions, &mut self.ids).await.unwrap();
        let ty = if ct.message_type() == CiphertextMessageType::PreKey { "pkmsg" } else { "msg" };
        (ty, ct.serialize().to_vec())
    }
}

fn text(t: &str) -> wa::Message {
    wa::Message { conversation: Some(t.to_string()), ..Default::default() }
}

/// The fake's media CDN: the encrypted file at the path asked for, or 404.
async fn cdn(mut tcp: tokio::net::TcpStream, seen: &Shared) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_string();
    let body = seen.lock().unwrap().media.get(&path).cloned();
    let resp = match body {
        Some(b) => {
            [format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", b.len()).into_bytes(), b]
                .concat()
        }
        None => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
    };
    let _ = tcp.write_all(&resp).await;
}

/// The fake server: its `ws://` URL.
async fn serve(seen: Shared) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws/chat", l.local_addr().unwrap());
    let server = Arc::new(KeyPair::generate(&mut rand::rng()));
    let peers: Peers = Default::default();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (seen, server, peers) = (seen.clone(), server.clone(), peers.clone());
            tokio::spawn(async move {
                // The same port is the media CDN: a GET that is no upgrade.
                let mut head = [0u8; 512];
                let n = tcp.peek(&mut head).await.unwrap_or(0);
                if !String::from_utf8_lossy(&head[..n]).to_ascii_lowercase().contains("upgrade: websocket") {
                    return cdn(tcp, &seen).await;
                }
                let Ok(ws) = tokio_tungstenite::accept_async(tcp).await else { return };
                let mut c =
                    Conn { ws, frames: FrameDecoder::new(), first: true, read: None, write: None, rc: 0, wc: 0 };
                let Some(p) = c.handshake(&server).await else { return };
                if let Some(r) = p.device_pairing_data.as_option() {
                    let be = |b: &Option<Vec<u8>>| b.iter().flatten().fold(0u32, |n, x| n << 8 | *x as u32);
                    {
                        let mut s = seen.lock().unwrap();
                        s.logins.push("register".into());
                        s.bundle = Some((
                            be(&r.e_regid),
                            r.e_ident.clone().unwrap_or_default(),
                            be(&r.e_skey_id),
                            r.e_skey_val.clone().unwrap_or_default(),
                            r.e_skey_sig.clone().unwrap_or_default(),
                        ));
                    }
                    register(&mut c, &seen).await;
                } else {
                    seen.lock().unwrap().logins.push(p.username.map(|u| u.to_string()).unwrap_or_default());
                    login(&mut c, &seen, &peers).await;
                }
            });
        }
    });
    url
}

/// What the fake WhatsApp server saw, for a timed-out wait.
fn told(seen: &Shared) -> impl FnOnce() -> String + '_ {
    move || {
        let s = seen.lock().unwrap();
        format!("logins {:?}\niqs {:?}\nkinds {:?}", s.logins, s.iqs, s.kinds)
    }
}

/// `adf adapters add FILE whatsapp --json` running: the QR code it shows
/// is handed to the fake's phone as soon as it is printed.
fn pair(d: &std::path::Path, url: &str, seen: &Shared) -> (std::process::ExitStatus, Vec<Value>, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .current_dir(d)
        .env("ADF_HOME", d.join(".adf-home"))
        .args(["adapters", "add", "a.adf", "whatsapp", "--api-url", url, "--dm", "all", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // One compact `{"qr": …}` line a code, then the result (pretty-printed).
    let (mut lines, mut rest) = (Vec::new(), String::new());
    for l in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let l = l.unwrap();
        match serde_json::from_str::<Value>(&l) {
            Ok(v) if v["qr"].is_string() => {
                seen.lock().unwrap().qr = v["qr"].as_str().map(str::to_string);
                lines.push(v);
            }
            _ => rest.push_str(&l),
        }
    }
    if !rest.is_empty() {
        lines.push(serde_json::from_str(&rest).unwrap_or(Value::String(rest)));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (child.wait().unwrap(), lines, err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_links_by_qr_code_seals_the_link_and_logs_in_with_it() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path().to_path_buf();
    let seen: Shared = Default::default();
    let url = serve(seen.clone()).await;
    ok(&adf(&d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    fails(&adf(&d, &["adapters", "add", "a.adf", "whatsapp", "--api-url", "http://x"], None), &["ws or wss"]);
    // A server that cannot be reached: said at once, nothing written.
    let closed = "ws://127.0.0.1:9/ws/chat";
    let out = fails(
        &adf(&d, &["adapters", "add", "a.adf", "whatsapp", "--api-url", closed, "--dm", "all"], None),
        &["cannot reach the WhatsApp server at ws://127.0.0.1:9/ws/chat", "nothing changed"],
    );
    assert!(!out.contains("not linked within"), "not after the 3 minutes: {out}");
    // A personal number: who may write to the agent is said, not assumed.
    fails(
        &adf(&d, &["adapters", "add", "a.adf", "whatsapp", "--api-url", &url], None),
        &["--allow NUMBER", "--dm all"],
    );

    // A phone that answers with the wrong secret: refused, nothing written.
    seen.lock().unwrap().bad_hmac = true;
    let (d2, u2, s2) = (d.clone(), url.clone(), seen.clone());
    let (status, _, err) = tokio::task::spawn_blocking(move || pair(&d2, &u2, &s2)).await.unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("refused"), "{err}");
    assert!(!seen.lock().unwrap().signed);
    let ls = ok(&adf(&d, &["adapters", "ls", "a.adf", "--json"], None));
    assert!(!ls.contains("whatsapp"), "nothing changed: {ls}");

    // The phone scans the code: linked, and the client logged in with it.
    seen.lock().unwrap().bad_hmac = false;
    let (d2, u2, s2) = (d.clone(), url.clone(), seen.clone());
    let (status, lines, err) = tokio::task::spawn_blocking(move || pair(&d2, &u2, &s2)).await.unwrap();
    assert!(status.success(), "{err} {lines:?}");
    assert!(lines[0]["qr"].as_str().unwrap().starts_with("2@fake-ref-1,"), "{lines:?}");
    assert!(err.contains('█') && err.contains("Linked devices"), "the code is drawn: {err}");
    let last = lines.last().unwrap();
    assert_eq!(last["account"], format!("+{PHONE}"), "{last}");
    assert_eq!(last["adapter"]["enabled"], true);
    assert!(seen.lock().unwrap().signed, "the client signed the device identity");
    assert_eq!(
        seen.lock().unwrap().logins.last().map(String::as_str),
        Some(PHONE),
        "then logged in as the phone's device"
    );
    // The link (its JSON names `identities`, `sessions`, …) is only in
    // the sealed credentials.
    let raw = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!raw.windows(12).any(|w| w == b"\"identities\""), "the link is sealed");

    // The agent's channel logs in with the sealed link: no new pairing.
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let logins = seen.lock().unwrap().logins.len();
    // The agent answers Ann's first message, quoting it.
    let path = d.join("a.adf");
    let (n, p2) = (Arc::new(Mutex::new(0)), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (n, p) = (n.clone(), p2.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut n = n.lock().unwrap();
            if *n == 0
                && let Some(row) = inbox_rows(&p).into_iter().find(|r| r["from"] == "whatsapp:15551234567")
            {
                *n += 1;
                return Reply::Tools(vec![("msg_send".into(), json!({"parent_id": row["id"], "content": "Hi Ann!"}))]);
            }
            if *n == 1
                && let Some(row) =
                    inbox_rows(&p).into_iter().find(|r| r["from"].as_str().is_some_and(|f| f.ends_with("@g.us")))
            {
                *n += 1;
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"parent_id": row["id"], "content": "All green."}),
                )]);
            }
            if *n == 2 && inbox_rows(&p).iter().any(|r| r["content"] == "lunch?") {
                *n += 1;
                let form = json!({"id": "lunch", "title": "Lunch", "render": "compact", "questions": [
                    {"id": "q1", "text": "Where?", "type": "choice", "options": [{"id": "a", "label": "Pizza"}, {"id": "b", "label": "Sushi"}]},
                    {"id": "q2", "text": "Anything else?", "type": "text"}]});
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"recipient": "whatsapp:15551234567", "content": form.to_string(), "content_type": "application/vnd.adf.form+json"}),
                )]);
            }
            Reply::Text("done".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    wait("connected", || fleet.channel_status(&id).first().is_some_and(|s| s.1.state == "connected")).await;
    let st = fleet.channel_status(&id);
    assert_eq!(st[0].1.account.as_deref(), Some("+15550000001"), "{st:?}");
    assert_eq!(st[0].1.qr, None);
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.logins[logins..].to_vec(), vec![PHONE.to_string()], "a login, not a registration");
        assert!(s.iqs.iter().any(|x| x == "passive"), "it went active: {:?}", s.iqs);
    }

    // Ann writes, end to end: an inbox row from her chat's address; the
    // same message delivered again is not a second row.
    let ann = ("3EB0A1".to_string(), "15551234567".to_string(), "Ann".to_string(), "hello agent".to_string());
    seen.lock().unwrap().outbox.push((ann.0.clone(), ann.1.clone(), ann.2.clone(), text(&ann.3)));
    wait("Ann's message", || inbox_rows(&path).len() == 1).await;
    let row = &inbox_rows(&path)[0];
    assert_eq!(
        (row["from"].as_str(), row["content"].as_str()),
        (Some("whatsapp:15551234567"), Some("hello agent")),
        "{row}"
    );
    seen.lock().unwrap().outbox.push(("3EB0A2".into(), ann.1.clone(), ann.2.clone(), text("second")));
    seen.lock().unwrap().outbox.push(("3EB0A1".into(), ann.1.clone(), ann.2.clone(), text("hello agent")));
    wait("the second message", || inbox_rows(&path).len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = inbox_rows(&path);
    assert_eq!(rows.iter().map(|r| r["content"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["hello agent", "second"]);

    // A voice note: its file downloaded from the CDN, decrypted and
    // imported; the row says what it is.
    let ogg = b"OggS voice note bytes ".repeat(200);
    let em =
        whatsapp_rust::wacore::upload::encrypt_media(&ogg, whatsapp_rust::wacore::download::MediaType::Audio).unwrap();
    let path_v = "/v/t62.7117-24/voice1.enc";
    seen.lock().unwrap().media.insert(path_v.into(), em.data_to_upload.clone());
    let voice = wa::Message {
        audio_message: MessageField::some(wa::message::AudioMessage {
            url: Some(format!("https://mmg.whatsapp.net{path_v}")),
            direct_path: Some(path_v.into()),
            mimetype: Some("audio/ogg; codecs=opus".into()),
            ptt: Some(true),
            seconds: Some(3),
            media_key: Some(em.media_key.to_vec()),
            file_sha256: Some(em.file_sha256.to_vec()),
            file_enc_sha256: Some(em.file_enc_sha256.to_vec()),
            file_length: Some(ogg.len() as u64),
            media_key_timestamp: Some(1_764_547_300),
            ..Default::default()
        }),
        ..Default::default()
    };
    seen.lock().unwrap().outbox.push(("3EB0A3".into(), ann.1.clone(), ann.2.clone(), voice));
    wait("the voice note", || inbox_rows(&path).len() == 3).await;
    let row =
        inbox_rows(&path).into_iter().find(|r| r["content"] == "[voice note, 3 s]").expect("the voice note's row");
    let att: Value = serde_json::from_str(row["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["transfer"], "imported", "{att}");
    let file = att[0]["path"].as_str().unwrap();
    assert!(file.ends_with("voice_3EB0A3.ogg"), "{file}");
    let saved = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .current_dir(&d)
        .env("ADF_HOME", d.join(".adf-home"))
        .args(["files", "cat", "a.adf", file])
        .output()
        .unwrap();
    assert_eq!(saved.stdout, ogg, "the voice note's bytes, decrypted");

    // In the group (mentions only, the default): Ann's message that does
    // not mention the agent is refused and logged, the one that does is a
    // row from the group's address.
    let group = "120363000000000001@g.us";
    seen.lock().unwrap().group = Some(group.into());
    let mention = wa::Message {
        extended_text_message: MessageField::some(wa::message::ExtendedTextMessage {
            text: Some(format!("@{PHONE} status?")),
            context_info: MessageField::some(wa::ContextInfo {
                mentioned_jid: vec![format!("{PHONE}@s.whatsapp.net")],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    seen.lock().unwrap().outbox.push(("3EB0B1".into(), ann.1.clone(), ann.2.clone(), text("lunch anyone?")));
    seen.lock().unwrap().outbox.push(("3EB0B2".into(), ann.1.clone(), ann.2.clone(), mention));
    wait("the group message", || inbox_rows(&path).len() == 4).await;
    let row =
        inbox_rows(&path).into_iter().find(|r| r["from"] == format!("whatsapp:{group}")).expect("the group's row");
    assert_eq!(row["content"], format!("@{PHONE} status?"));
    assert!(!inbox_rows(&path).iter().any(|r| r["content"] == "lunch anyone?"), "no mention: refused");
    wait("the refusal counted", || fleet.channel_status(&id)[0].1.refused == 1).await;

    // The agent's reply reached Ann, end to end, quoting her message.
    wait("the reply", || !seen.lock().unwrap().received.is_empty()).await;
    let (to, m) = seen.lock().unwrap().received[0].clone();
    assert_eq!(to, "15551234567@s.whatsapp.net");
    let ext = m.extended_text_message.as_option().expect("a quoted reply is an extended text");
    assert_eq!(ext.text.as_deref(), Some("Hi Ann!"));
    let ctx = ext.context_info.as_option().unwrap();
    assert_eq!(ctx.stanza_id.as_deref(), Some("3EB0A1"), "it quotes Ann's message");
    assert_eq!(ctx.participant.as_deref(), Some("15551234567@s.whatsapp.net"));
    assert_eq!(ctx.quoted_message.as_option().and_then(|q| q.conversation.as_deref()), Some("hello agent"));

    // And its answer in the group, under its own sender key, quoting Ann.
    wait("the group reply", || seen.lock().unwrap().received.iter().any(|(to, _)| to == group)).await;
    let m = seen.lock().unwrap().received.iter().find(|(to, _)| to == group).unwrap().1.clone();
    let ext = m.extended_text_message.as_option().expect("a quoted reply");
    assert_eq!(ext.text.as_deref(), Some("All green."));
    let ctx = ext.context_info.as_option().unwrap();
    assert_eq!(
        (ctx.stanza_id.as_deref(), ctx.participant.as_deref()),
        (Some("3EB0B2"), Some("15551234567@s.whatsapp.net"))
    );
    assert_eq!(fleet.channel_status(&id)[0].1.sent, 2);

    // A form goes as a numbered list; Ann answers by quoting it, and the
    // agent gets the answers checked, as one structured message.
    seen.lock().unwrap().group = None;
    seen.lock().unwrap().outbox.push(("3EB0E1".into(), ann.1.clone(), ann.2.clone(), text("lunch?")));
    let is_form = |m: &wa::Message| m.text_content().is_some_and(|t| t.starts_with("Lunch\n1. Where?"));
    wait("the form", || seen.lock().unwrap().received.iter().any(|(_, m)| is_form(m))).await;
    let form_id = {
        let s = seen.lock().unwrap();
        let i = s.received.iter().position(|(_, m)| is_form(m)).unwrap();
        s.received_ids[i].clone()
    };
    let answer = |body: &str| wa::Message {
        extended_text_message: MessageField::some(wa::message::ExtendedTextMessage {
            text: Some(body.into()),
            context_info: MessageField::some(wa::ContextInfo {
                stanza_id: Some(form_id.clone()),
                participant: Some(format!("{PHONE}@s.whatsapp.net")),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    seen.lock().unwrap().outbox.push(("3EB0E2".into(), ann.1.clone(), ann.2.clone(), answer("1z")));
    seen.lock().unwrap().outbox.push(("3EB0E3".into(), ann.1.clone(), ann.2.clone(), answer("1b, 2 no onions")));
    let content = |r: &Value| r["content"].as_str().unwrap_or("").to_string();
    wait("the answers", || inbox_rows(&path).iter().any(|r| content(r).starts_with("[form lunch]"))).await;
    let rows = inbox_rows(&path);
    let right = rows.iter().find(|r| content(r).starts_with("[form lunch]")).unwrap();
    assert_eq!(content(right), "[form lunch] Where?: Sushi; Anything else?: no onions");
    let ctx: Value = serde_json::from_str(right["context"].as_str().unwrap()).unwrap();
    assert_eq!(ctx["answers"][0], json!({"question_id": "q1", "answer_id": "b", "answer_value": "Sushi"}));
    let wrong = rows.iter().find(|r| content(r).contains("[not an answer to form lunch")).expect("the wrong answer");
    assert!(content(wrong).contains("it has no option z"), "{wrong}");
    fleet.shutdown().await;

    // Off and on again: the channel logs in with the sealed link; what
    // Ann wrote meanwhile comes from the server's offline queue, and the
    // agent wakes once for the three. Her session goes on (a plain Signal
    // message under the ratchet the link kept, not a new session).
    let logins = seen.lock().unwrap().logins.len();
    {
        let mut s = seen.lock().unwrap();
        s.group = None;
        for (i, t) in ["are you there?", "hello?", "call me"].iter().enumerate() {
            s.offline.push((format!("3EB0C{i}"), ann.1.clone(), ann.2.clone(), text(t)));
        }
    }
    let calls = Arc::new(Mutex::new(0));
    let c2 = calls.clone();
    let counting: ProviderFactory = Arc::new(move |_| {
        let c = c2.clone();
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            *c.lock().unwrap() += 1;
            Reply::Text("done".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    let mut fleet = Fleet::new(Bus::new(), counting);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    wait_or_tell(
        "the messages after the restart",
        &path,
        || inbox_rows(&path).iter().any(|r| r["content"] == "call me"),
        told(&seen),
    )
    .await;
    wait("the agent's turn", || *calls.lock().unwrap() >= 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // On a failure, what woke each turn says why (three messages woken
    // one by one, or something else).
    let woke: Vec<String> = {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let mut st =
            c.prepare("SELECT content_json FROM adf_loop WHERE role = 'user' ORDER BY seq DESC LIMIT 4").unwrap();
        st.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
    };
    let wakes = *calls.lock().unwrap();
    assert_eq!(wakes, 1, "one wake for the batch; the last user rows, newest first: {woke:#?}");
    assert_eq!(seen.lock().unwrap().logins[logins..].to_vec(), vec![PHONE.to_string()], "a login with the sealed link");
    let kinds = seen.lock().unwrap().kinds.clone();
    assert_eq!((kinds.first(), kinds.last()), (Some(&"pkmsg"), Some(&"msg")), "the session went on: {kinds:?}");

    // A message that cannot be decrypted is logged, never silently dropped.
    let bad = NodeBuilder::new("message")
        .attr("from", "15551234567@s.whatsapp.net")
        .attr("id", "3EB0D1")
        .attr("t", "1764548000")
        .attr("type", "text")
        .children([NodeBuilder::new("enc").attr("v", "2").attr("type", "msg").bytes(vec![0x33; 40]).build()])
        .build();
    seen.lock().unwrap().raw.push(bad);
    let logged = |event: &str| -> i64 {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        c.query_row("SELECT count(*) FROM adf_logs WHERE event = ?1", [event], |r| r.get(0)).unwrap()
    };
    wait("the undecryptable message logged", || logged("message_undecryptable") == 1).await;

    // The phone unlinks the device: the channel stops and says how to link again.
    seen.lock().unwrap().raw.push(NodeBuilder::new("stream:error").attr("code", "401").build());
    // The client's end and the logout event race; what is left says why.
    wait("logged out", || {
        let st = fleet.channel_status(&id);
        st[0].1.state == "stopped"
            && st[0].1.last_error.as_deref().unwrap_or("").contains("adf adapters add FILE whatsapp")
    })
    .await;
    fleet.shutdown().await;
}

/// A channel switched on without a link (the agent's own `adapter_setup`,
/// or `adapters add` through a daemon) asks to be linked: its status
/// carries the QR code (what `/channels` and `adapters status` draw), the
/// phone scans it, and the link is sealed where it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_channel_shows_its_code_and_links_where_it_runs() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path().to_path_buf();
    let seen: Shared = Default::default();
    let url = serve(seen.clone()).await;
    ok(&adf(&d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    let path = d.join("a.adf");
    // The agent switches WhatsApp on for itself (the owner approves once).
    use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
    use futures_util::future::BoxFuture;
    struct Approves(Mutex<usize>);
    impl Owner for Approves {
        fn approve<'a>(&'a self, _: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
            *self.0.lock().unwrap() += 1;
            Box::pin(async { Decision::Approve { always: false } })
        }
        fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
            Box::pin(async { None })
        }
    }
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE adf_config SET config_json = json_insert(config_json, '$.tools[#]', json('{\"name\":\"adapter_setup\",\"enabled\":true}'))",
        [],
    )
    .unwrap();
    drop(raw);
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut store = adf::store::Store::open(&path).unwrap();
    store.unlock(&adf::identity::install::current().unwrap()).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Tools(vec![(
            "adapter_setup".into(),
            json!({"type": "whatsapp", "dm": "allowlist", "allow_from": ["15551234567"], "api_url": url}),
        )]),
        Reply::Text("Scan the code, please.".into()),
    ]));
    let owner = Arc::new(Approves(Mutex::new(0)));
    let mut ex = Executor::new(store, provider, Bus::new(), owner.clone()).unwrap();
    ex.chat("get on WhatsApp").await.unwrap();
    assert_eq!(*owner.0.lock().unwrap(), 1, "asked once");
    assert_eq!(ex.store.config_value().unwrap()["adapters"]["whatsapp"]["enabled"], true);
    ex.store_into().close().unwrap();
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    let qr = || fleet.channel_status(&id).first().and_then(|s| s.1.qr.clone());
    wait("the code", || qr().is_some()).await;
    assert_eq!(fleet.channel_status(&id)[0].1.state, "pairing");
    seen.lock().unwrap().qr = qr();
    wait("linked", || fleet.channel_status(&id)[0].1.state == "connected").await;
    let st = fleet.channel_status(&id);
    assert_eq!((st[0].1.account.as_deref(), st[0].1.qr.as_deref()), (Some("+15550000001"), None), "{st:?}");
    fleet.shutdown().await;

    // The link was sealed where the channel ran: the next start logs in.
    let logins = seen.lock().unwrap().logins.len();
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    wait("connected again", || fleet.channel_status(&id).first().is_some_and(|s| s.1.state == "connected")).await;
    assert_eq!(seen.lock().unwrap().logins[logins..].to_vec(), vec![PHONE.to_string()], "a login, not a new pairing");

    // The server goes away: the client comes back by itself, and what is
    // sent then arrives. Who may talk: the allowlist admits Ann only.
    seen.lock().unwrap().kick = true;
    wait("a new connection", || seen.lock().unwrap().logins.len() == logins + 2).await;
    {
        let mut s = seen.lock().unwrap();
        s.outbox.push(("3EB0F1".into(), "15559999999".into(), "Eve".into(), text("hi, who are you?")));
        s.outbox.push(("3EB0F2".into(), "15551234567".into(), "Ann".into(), text("back online?")));
    }
    wait("Ann's message", || inbox_rows(&path).iter().any(|r| r["content"] == "back online?")).await;
    assert_eq!(inbox_rows(&path).len(), 1, "Eve is not on the allowlist");
    wait("the refusal counted", || fleet.channel_status(&id)[0].1.refused == 1).await;

    // A file over the size limit (20 MB by default) is not fetched: the
    // message arrives with the file recorded as skipped, and why.
    let big = wa::Message {
        document_message: MessageField::some(wa::message::DocumentMessage {
            url: Some("https://mmg.whatsapp.net/v/t62/big.enc".into()),
            direct_path: Some("/v/t62/big.enc".into()),
            mimetype: Some("application/octet-stream".into()),
            file_name: Some("dump.bin".into()),
            file_length: Some(52_428_800),
            media_key: Some(vec![1; 32]),
            file_sha256: Some(vec![2; 32]),
            file_enc_sha256: Some(vec![3; 32]),
            ..Default::default()
        }),
        ..Default::default()
    };
    seen.lock().unwrap().outbox.push(("3EB0F3".into(), "15551234567".into(), "Ann".into(), big));
    wait("the big file's message", || inbox_rows(&path).iter().any(|r| r["content"] == "[document dump.bin]")).await;
    let row = inbox_rows(&path).into_iter().find(|r| r["content"] == "[document dump.bin]").unwrap();
    let att: Value = serde_json::from_str(row["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["skipped"], true, "{att}");
    assert!(att[0]["reason"].as_str().unwrap().contains("52428800 bytes, over the 20971520 byte limit"), "{att}");
    assert!(!seen.lock().unwrap().iqs.iter().any(|x| x == "w:m"), "no download was even started");

    // WhatsApp addresses people by LID now: Ann writes from hers, with her
    // number beside it. In a DM she is her number (the allowlist has it,
    // her chat's address is it); in a group, a mention of the agent's own
    // LID counts.
    let ann_lid = "200000000000009@lid";
    seen.lock().unwrap().pn_of_lid.insert(ann_lid.into(), "15551234567".into());
    seen.lock().unwrap().outbox.push(("3EB0L1".into(), ann_lid.into(), "Ann".into(), text("from my LID")));
    wait_or_tell("the LID DM", &path, || inbox_rows(&path).iter().any(|r| r["content"] == "from my LID"), told(&seen))
        .await;
    let row = inbox_rows(&path).into_iter().find(|r| r["content"] == "from my LID").unwrap();
    assert_eq!(row["from"], "whatsapp:15551234567", "{row}");
    let group = "120363000000000002@g.us";
    let at_lid = |body: &str, who: &str| wa::Message {
        extended_text_message: MessageField::some(wa::message::ExtendedTextMessage {
            text: Some(body.into()),
            context_info: MessageField::some(wa::ContextInfo { mentioned_jid: vec![who.into()], ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    {
        let mut s = seen.lock().unwrap();
        s.group = Some(group.into());
        s.outbox.push(("3EB0L2".into(), ann_lid.into(), "Ann".into(), at_lid("@bob lunch?", "300000000000003@lid")));
        s.outbox.push(("3EB0L3".into(), ann_lid.into(), "Ann".into(), at_lid("@agent ping", "100000000000001@lid")));
    }
    wait_or_tell(
        "the LID mention",
        &path,
        || inbox_rows(&path).iter().any(|r| r["content"] == "@agent ping"),
        told(&seen),
    )
    .await;
    seen.lock().unwrap().group = None;
    let row = inbox_rows(&path).into_iter().find(|r| r["content"] == "@agent ping").unwrap();
    assert_eq!(row["from"], format!("whatsapp:{group}"));
    let ctx: Value = serde_json::from_str(row["context"].as_str().unwrap()).unwrap();
    assert_eq!(ctx["sender_id"], "15551234567", "the number beside the LID: {ctx}");
    assert!(!inbox_rows(&path).iter().any(|r| r["content"] == "@bob lunch?"), "a mention of someone else");

    // The disk fills as a message comes in: the inbox cannot take it, so
    // the server is not told it arrived, and the decrypted message is in
    // the sealed link already (its ratchet moved on: it could not be
    // decrypted twice). The runtime goes down; the disk is freed; at the
    // next start the server delivers it again, the client replays it from
    // the sealed copy, and it is in the inbox once.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "CREATE TRIGGER full_disk BEFORE INSERT ON adf_inbox BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
    )
    .unwrap();
    let body = "kept through a full disk";
    seen.lock().unwrap().outbox.push(("3EB0F4".into(), "15551234567".into(), "Ann".into(), text(body)));
    let not_written = || -> i64 {
        raw.query_row("SELECT count(*) FROM adf_logs WHERE event = 'message_not_delivered'", [], |r| r.get(0)).unwrap()
    };
    wait("the failed write logged", || not_written() >= 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!seen.lock().unwrap().acked.iter().any(|i| i == "3EB0F4"), "not acknowledged");
    let mut sib = adf::store::Store::sibling(&path).unwrap();
    sib.unlock(&adf::identity::install::current().unwrap()).unwrap();
    let link: Value = serde_json::from_slice(&sib.secret_get("adapter:whatsapp:SESSION").unwrap().unwrap()).unwrap();
    assert!(
        link["pending"].as_object().unwrap().keys().any(|k| k.ends_with(" 3EB0F4")),
        "sealed while the channel runs: {}",
        link["pending"]
    );
    drop(sib);
    fleet.shutdown().await;
    raw.execute_batch("DROP TRIGGER full_disk").unwrap();
    let count = || inbox_rows(&path).iter().filter(|r| r["content"] == body).count();
    assert_eq!(count(), 0);
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    wait_or_tell("the message delivered again", &path, || count() == 1, told(&seen)).await;
    wait("acknowledged now", || seen.lock().unwrap().acked.iter().any(|i| i == "3EB0F4")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(), 1, "once");
    fleet.shutdown().await;
}

/// On a file a daemon holds, `adf adapters add FILE whatsapp` switches the
/// channel on there; `adf adapters status AGENT` draws the code the
/// channel waits on, and shows it linked once the phone scanned it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_daemon_the_status_draws_the_code_to_scan() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path().to_path_buf();
    let seen: Shared = Default::default();
    let url = serve(seen.clone()).await;
    let fleet = d.join(".adf-home/data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    ok(&adf(&d, &["new", ".adf-home/data/agents/scout.adf", "--provider", "anthropic", "--model", "m"], None));
    let daemon = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--port", "0", "--no-mesh"])
        .env("ADF_HOME", d.join(".adf-home"))
        .env_remove("ADF_DAEMON_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = KillOnDrop(daemon);
    daemon_info(&fleet, Duration::from_secs(20));
    let said = ok(&adf(
        &d,
        &[
            "adapters",
            "add",
            ".adf-home/data/agents/scout.adf",
            "whatsapp",
            "--api-url",
            &url,
            "--allow",
            "15551234567",
        ],
        None,
    ));
    assert!(said.contains("through the process that holds it"), "{said}");
    let dd = d.clone();
    let status = move |json: bool| {
        let args: &[&str] =
            if json { &["adapters", "status", "scout", "--json"] } else { &["adapters", "status", "scout"] };
        ok(&adf(&dd, args, None))
    };
    let s2 = status.clone();
    let code = tokio::task::spawn_blocking(move || {
        for _ in 0..200 {
            let v: Value = serde_json::from_str(&s2(true)).unwrap();
            if let Some(q) = v["adapters"][0]["qr"].as_str() {
                return q.to_string();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no code in the status");
    })
    .await
    .unwrap();
    let shown = status(false);
    assert!(shown.contains("pairing") && shown.contains("Linked devices"), "{shown}");
    let qr = adf::channels::whatsapp::qr_text(&code).unwrap();
    assert!(shown.contains(qr.lines().nth(3).unwrap()), "the code is drawn: {shown}");
    seen.lock().unwrap().qr = Some(code);
    let linked = tokio::task::spawn_blocking(move || {
        for _ in 0..300 {
            let v: Value = serde_json::from_str(&status(true)).unwrap();
            if v["adapters"][0]["state"] == "connected" {
                return v;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("not linked: {}", status(true));
    })
    .await
    .unwrap();
    assert_eq!(linked["adapters"][0]["account"], "+15550000001", "{linked}");
    assert!(linked["adapters"][0].get("qr").is_none(), "no code once linked: {linked}");

    // Sealed where it runs; `adapters rm` removes the link for good (the
    // stopping channel writes nothing back).
    let file = fleet.join("scout.adf");
    let links = move || -> i64 {
        let c = rusqlite::Connection::open_with_flags(&file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        c.query_row("SELECT count(*) FROM adf_identity WHERE purpose = 'adapter:whatsapp:SESSION'", [], |r| r.get(0))
            .unwrap()
    };
    wait("the link sealed", || links() == 1).await;
    ok(&adf(&d, &["adapters", "rm", ".adf-home/data/agents/scout.adf", "whatsapp"], None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(links(), 0, "the link is gone");
}

/// The QR code drawn on a terminal's screen, read as a phone's camera
/// reads it: the block of half-block rows, decoded.
fn scan_screen(screen: &str) -> Option<String> {
    let rows: Vec<Vec<char>> = screen.lines().map(|l| l.chars().collect()).collect();
    let half = |c: char| matches!(c, '█' | '▀' | '▄' | ' ');
    // The code's first row: the longest run of full blocks on the screen.
    let (top, left, width) = rows
        .iter()
        .enumerate()
        .filter_map(|(r, row)| {
            let start = row.iter().position(|&c| c == '█')?;
            let n = row[start..].iter().take_while(|&&c| c == '█').count();
            Some((r, start, n))
        })
        // (The first such: the last row is as long.)
        .max_by_key(|x| (x.2, std::cmp::Reverse(x.0)))?;
    let code: Vec<&[char]> = rows[top..]
        .iter()
        // Every row of the code opens with its light margin.
        .take_while(|row| {
            row.len() >= left + width && row[left] == '█' && row[left..left + width].iter().all(|&c| half(c))
        })
        .map(|row| &row[left..left + width])
        .collect();
    let light = |c: char| match c {
        '█' => (true, true),
        '▀' => (true, false),
        '▄' => (false, true),
        _ => (false, false),
    };
    let (scale, pad) = (4, 16);
    let (iw, ih) = (width * scale + 2 * pad, code.len() * 2 * scale + 2 * pad);
    let mut img = rqrr::PreparedImage::prepare_from_greyscale(iw, ih, |x, y| {
        if x < pad || y < pad || x >= iw - pad || y >= ih - pad {
            return 255;
        }
        let (cx, my) = ((x - pad) / scale, (y - pad) / scale);
        let (up, down) = light(code[my / 2][cx]);
        if (my % 2 == 0 && up) || (my % 2 == 1 && down) { 255 } else { 0 }
    });
    img.detect_grids().first()?.decode().ok().map(|d| d.1)
}

/// From the real app in a real terminal: `:channel_add whatsapp NUMBER`
/// switches the channel on, the channels view draws the code, and the
/// phone scans it off the screen; the app shows the number linked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_links_whatsapp_by_the_code_on_its_screen() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let seen: Shared = Default::default();
    let url = serve(seen.clone()).await;
    let home = dir.path().join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    ok(&adf_home(&home, &agents, &["new", "a.adf", "--provider", "anthropic", "--model", "m"]));
    ok(&adf_home(&home, &agents, &["identity", "show", "--phrase", "--yes", "--json"]));
    let conf = json!({"enabled": false, "config": {"api_url": url}}).to_string();
    ok(&adf_home(&home, &agents, &["config", "set", "a.adf", "adapters.whatsapp", &conf]));
    let (h, s2) = (home.clone(), seen.clone());
    tokio::task::spawn_blocking(move || {
        let mut t = common::pty::Tui::start_with(&h, &[], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":channel_add whatsapp\r");
        t.wait_for("usage: channel_add whatsapp NUMBER");
        t.send(":channel_add whatsapp 15551234567\r");
        let screen = t.wait_for("Linked devices");
        let mut code = scan_screen(&screen);
        for _ in 0..40 {
            if code.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            code = scan_screen(&t.screen());
        }
        let code = code.unwrap_or_else(|| panic!("no code read off the screen:\n{}", t.screen()));
        assert!(code.starts_with("2@fake-ref-1,"), "{code}");
        s2.lock().unwrap().qr = Some(code);
        let s = t.wait_for("whatsapp   connected    +15550000001");
        assert!(!s.contains("Linked devices"), "no code once linked: {s}");
        t.quit();
    })
    .await
    .unwrap();
    let file = agents.join("a.adf");
    let c = rusqlite::Connection::open_with_flags(&file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let (dm, allow): (String, String) = c
        .query_row(
            "SELECT json_extract(config_json, '$.adapters.whatsapp.policy.dm'), \
             json_extract(config_json, '$.adapters.whatsapp.policy.allow_from') FROM adf_config",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((dm.as_str(), allow.as_str()), ("allowlist", r#"["15551234567"]"#));
}

/// A channel whose server cannot be reached says so in its status, with
/// the cause, and keeps trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_status_with_its_cause() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path().to_path_buf();
    ok(&adf(&d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    let path = d.join("a.adf");
    {
        let mut s = adf::store::Store::open(&path).unwrap();
        adf::channels::connect(&mut s, &json!({"type": "whatsapp", "api_url": "ws://127.0.0.1:9/ws/chat"})).unwrap();
        s.close().unwrap();
    }
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    let st = || fleet.channel_status(&id).first().map(|s| s.1.clone()).unwrap_or_default();
    wait("the cause", || st().last_error.is_some_and(|e| e.contains("cannot reach the WhatsApp server"))).await;
    assert_eq!(st().state, "backing_off");
    fleet.shutdown().await;
}
