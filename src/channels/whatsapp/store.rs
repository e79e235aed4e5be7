//! The WhatsApp client's store (its `Backend`) kept in the agent's sealed
//! credentials. A linked device is its keys: the Noise and identity keys,
//! the Signal sessions, prekeys and sender keys, the app-state keys and
//! versions, the phone number and LID maps. They are the account, so they
//! live where the other channels keep their tokens, sealed
//! (`adapter:whatsapp:SESSION`), never in a table of the agent's own.
//!
//! What is worth keeping lives in [`State`], serialised whole as JSON; what
//! is only a cache of the platform (receipts to retry, trusted-contact
//! tokens, message secrets, which group members hold a sender key) lives in
//! the client's in-memory backend and is rebuilt after a restart.
//!
//! A change the client relies on (a ratchet step, a prekey used, a message
//! buffered until the agent's inbox has it) is sealed before the call
//! returns: the client acknowledges messages and answers the server on the
//! strength of it. Writes racing one another share one seal ([`persist`]).
//! Only what a crash may lose without harm (the removal of a buffered
//! message already in the inbox: replayed, it is a duplicate the inbox
//! refuses) is sealed shortly after (`changed`), and once more when the
//! channel stops.
//!
//! [`persist`]: SealedBackend::persist

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use base64::Engine;
use serde::{Deserialize, Serialize};
use whatsapp_rust::bytes::Bytes;
use whatsapp_rust::wacore::appstate::hash::HashState;
use whatsapp_rust::wacore::store::Device;
use whatsapp_rust::wacore::store::InMemoryBackend;
use whatsapp_rust::wacore::store::error::Result;
use whatsapp_rust::wacore::store::traits::*;

type Mac = whatsapp_rust::wacore::appstate::processor::AppStateMutationMAC;

/// The sealed credential holding the linked device.
pub const SESSION: &str = "adapter:whatsapp:SESSION";

/// Bytes, written as base64 in the JSON.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct B(pub Vec<u8>);

impl Serialize for B {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for B {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<B, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s).map(B).map_err(serde::de::Error::custom)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What a linked device keeps between runs.
#[derive(Default, Serialize, Deserialize)]
pub struct State {
    pub device: Option<Device>,
    identities: BTreeMap<String, B>,
    sessions: BTreeMap<String, B>,
    prekeys: BTreeMap<u32, B>,
    signed_prekeys: BTreeMap<u32, B>,
    sender_keys: BTreeMap<String, B>,
    /// By the key id in hex.
    sync_keys: BTreeMap<String, AppStateSyncKey>,
    latest_sync_key_id: Option<B>,
    versions: BTreeMap<String, HashState>,
    /// By `<collection>/<index mac in hex>`.
    mutation_macs: BTreeMap<String, B>,
    lid_mappings: BTreeMap<String, LidPnMappingEntry>,
    device_lists: BTreeMap<String, DeviceListRecord>,
    /// Decrypted messages not yet in the agent's inbox, by `chat sender id`:
    /// (when buffered, unix seconds; the message). The client replays them
    /// when the server delivers them again.
    #[serde(default)]
    pending: BTreeMap<String, (i64, B)>,
}

fn pending_key(chat: &str, sender: &str, id: &str) -> String {
    format!("{chat} {sender} {id}")
}

/// Writes the sealed copy (blocking): the channel's, set once it runs.
pub type Sealer = Arc<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// The client's store: [`State`] for what is kept, the in-memory backend
/// for the caches.
pub struct SealedBackend {
    state: Mutex<State>,
    cache: InMemoryBackend,
    /// Raised by every change: the channel then seals, shortly after, what
    /// no seal has covered yet (the changes left for later).
    pub changed: Arc<tokio::sync::Notify>,
    /// The link was removed (`adapters rm`) or revoked (the phone unlinked
    /// it): nothing is sealed any more.
    forgotten: AtomicBool,
    sealer: std::sync::OnceLock<Sealer>,
    /// Changes made (counted under the state's lock), and changes a seal
    /// has covered: a write is durable once `sealed` reaches its count.
    made: AtomicU64,
    sealed: AtomicU64,
    /// One seal at a time; the writers waiting share the next.
    sealing: tokio::sync::Mutex<()>,
}

/// A poisoned lock is a panic elsewhere; the store says so, it does not panic.
fn poisoned() -> whatsapp_rust::wacore::store::error::StoreError {
    whatsapp_rust::wacore::store::error::StoreError::Io(std::io::Error::other("the WhatsApp store's lock is poisoned"))
}

impl SealedBackend {
    /// A store from the sealed copy (`None`: a device not linked yet).
    pub fn open(sealed: Option<&[u8]>) -> std::result::Result<SealedBackend, String> {
        let state = match sealed {
            Some(b) => {
                serde_json::from_slice(b).map_err(|e| format!("the sealed WhatsApp session is unreadable: {e}"))?
            }
            None => State::default(),
        };
        Ok(SealedBackend {
            state: Mutex::new(state),
            cache: InMemoryBackend::new(),
            changed: Default::default(),
            forgotten: Default::default(),
            sealer: Default::default(),
            made: Default::default(),
            sealed: Default::default(),
            sealing: Default::default(),
        })
    }

    /// Seal every change from now on before it is reported done.
    pub fn seal_with(&self, sealer: Sealer) {
        let _ = self.sealer.set(sealer);
    }

    /// Seal nothing from now on.
    pub fn forget(&self) {
        self.forgotten.store(true, Ordering::SeqCst);
    }

    /// Whether the link was removed (nothing is sealed any more).
    pub fn forgotten(&self) -> bool {
        self.forgotten.load(Ordering::SeqCst)
    }

    /// The sealed copy of what is kept (none once forgotten).
    pub fn snapshot(&self) -> std::result::Result<Vec<u8>, String> {
        if self.forgotten.load(Ordering::SeqCst) {
            return Err("the WhatsApp link was removed".into());
        }
        let s = self.state.lock().map_err(|_| "the WhatsApp store's lock is poisoned".to_string())?;
        serde_json::to_vec(&*s).map_err(|e| e.to_string())
    }

    /// Whether a device is linked (it has a phone number).
    pub fn linked(&self) -> bool {
        self.state.lock().is_ok_and(|s| s.device.as_ref().is_some_and(|d| d.pn.is_some()))
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T> {
        Ok(f(&*self.state.lock().map_err(|_| poisoned())?))
    }

    /// A change sealed later (see the module's note).
    fn write_later<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T> {
        let out = {
            let mut s = self.state.lock().map_err(|_| poisoned())?;
            self.made.fetch_add(1, Ordering::AcqRel);
            f(&mut s)
        };
        self.changed.notify_one();
        Ok(out)
    }

    /// A change, sealed before it returns.
    async fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T> {
        let out = self.write_later(f)?;
        self.persist().await?;
        Ok(out)
    }

    /// Seal every change made so far, if a seal since has not: writers
    /// that come while one seal runs wait for it, and the first of them
    /// seals for all.
    pub async fn persist(&self) -> Result<()> {
        let Some(sealer) = self.sealer.get().cloned() else { return Ok(()) };
        let want = self.made.load(Ordering::Acquire);
        let _one = self.sealing.lock().await;
        if self.sealed.load(Ordering::Acquire) >= want || self.forgotten.load(Ordering::SeqCst) {
            return Ok(());
        }
        // The copy is taken after this count, so it holds at least these.
        let covers = self.made.load(Ordering::Acquire);
        let io = |e: String| whatsapp_rust::wacore::store::error::StoreError::Io(std::io::Error::other(e));
        tokio::task::spawn_blocking(move || sealer()).await.map_err(|e| io(e.to_string()))?.map_err(io)?;
        self.sealed.fetch_max(covers, Ordering::AcqRel);
        Ok(())
    }
}

use async_trait::async_trait;

#[async_trait]
impl SignalStore for SealedBackend {
    async fn put_identity(&self, address: &str, key: [u8; 32]) -> Result<()> {
        self.write(|s| s.identities.insert(address.into(), B(key.to_vec()))).await.map(drop)
    }
    async fn load_identity(&self, address: &str) -> Result<Option<[u8; 32]>> {
        self.read(|s| s.identities.get(address).and_then(|k| k.0.as_slice().try_into().ok()))
    }
    async fn delete_identity(&self, address: &str) -> Result<()> {
        self.write(|s| s.identities.remove(address)).await.map(drop)
    }
    async fn get_session(&self, address: &str) -> Result<Option<Bytes>> {
        self.read(|s| s.sessions.get(address).map(|b| Bytes::copy_from_slice(&b.0)))
    }
    async fn put_session(&self, address: &str, session: &[u8]) -> Result<()> {
        self.write(|s| s.sessions.insert(address.into(), B(session.to_vec()))).await.map(drop)
    }
    async fn delete_session(&self, address: &str) -> Result<()> {
        self.write(|s| s.sessions.remove(address)).await.map(drop)
    }
    async fn store_prekey(&self, id: u32, record: &[u8], _uploaded: bool) -> Result<()> {
        self.write(|s| s.prekeys.insert(id, B(record.to_vec()))).await.map(drop)
    }
    async fn load_prekey(&self, id: u32) -> Result<Option<Bytes>> {
        self.read(|s| s.prekeys.get(&id).map(|b| Bytes::copy_from_slice(&b.0)))
    }
    async fn mark_prekeys_uploaded(&self, _ids: &[u32]) -> Result<()> {
        Ok(())
    }
    async fn remove_prekey(&self, id: u32) -> Result<()> {
        self.write(|s| s.prekeys.remove(&id)).await.map(drop)
    }
    async fn get_max_prekey_id(&self) -> Result<u32> {
        self.read(|s| s.prekeys.keys().next_back().copied().unwrap_or(0))
    }
    async fn store_signed_prekey(&self, id: u32, record: &[u8]) -> Result<()> {
        self.write(|s| s.signed_prekeys.insert(id, B(record.to_vec()))).await.map(drop)
    }
    async fn load_signed_prekey(&self, id: u32) -> Result<Option<Vec<u8>>> {
        self.read(|s| s.signed_prekeys.get(&id).map(|b| b.0.clone()))
    }
    async fn load_all_signed_prekeys(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        self.read(|s| s.signed_prekeys.iter().map(|(k, v)| (*k, v.0.clone())).collect())
    }
    async fn remove_signed_prekey(&self, id: u32) -> Result<()> {
        self.write(|s| s.signed_prekeys.remove(&id)).await.map(drop)
    }
    async fn put_sender_key(&self, address: &str, record: &[u8]) -> Result<()> {
        self.write(|s| s.sender_keys.insert(address.into(), B(record.to_vec()))).await.map(drop)
    }
    async fn put_identities_batch(&self, identities: &[(Arc<str>, [u8; 32])]) -> Result<()> {
        self.write(|s| {
            for (a, k) in identities {
                s.identities.insert(a.to_string(), B(k.to_vec()));
            }
        })
        .await
    }
    async fn put_sessions_batch(&self, sessions: &[(Arc<str>, Bytes)]) -> Result<()> {
        self.write(|s| {
            for (a, r) in sessions {
                s.sessions.insert(a.to_string(), B(r.to_vec()));
            }
        })
        .await
    }
    async fn store_prekeys_batch(&self, keys: &[(u32, Bytes)], _uploaded: bool) -> Result<()> {
        self.write(|s| {
            for (id, r) in keys {
                s.prekeys.insert(*id, B(r.to_vec()));
            }
        })
        .await
    }
    async fn put_sender_keys_batch(&self, sender_keys: &[(Arc<str>, Bytes)]) -> Result<()> {
        self.write(|s| {
            for (a, r) in sender_keys {
                s.sender_keys.insert(a.to_string(), B(r.to_vec()));
            }
        })
        .await
    }
    async fn get_sender_key(&self, address: &str) -> Result<Option<Vec<u8>>> {
        self.read(|s| s.sender_keys.get(address).map(|b| b.0.clone()))
    }
    async fn delete_sender_key(&self, address: &str) -> Result<()> {
        self.write(|s| s.sender_keys.remove(address)).await.map(drop)
    }
}

#[async_trait]
impl AppSyncStore for SealedBackend {
    async fn get_sync_key(&self, key_id: &[u8]) -> Result<Option<AppStateSyncKey>> {
        self.read(|s| s.sync_keys.get(&hex(key_id)).cloned())
    }
    async fn set_sync_key(&self, key_id: &[u8], key: AppStateSyncKey) -> Result<()> {
        self.write(|s| {
            s.sync_keys.insert(hex(key_id), key);
            s.latest_sync_key_id = Some(B(key_id.to_vec()));
        })
        .await
    }
    async fn get_version(&self, name: &str) -> Result<HashState> {
        self.read(|s| s.versions.get(name).cloned().unwrap_or_default())
    }
    async fn set_version(&self, name: &str, state: HashState) -> Result<()> {
        self.write(|s| s.versions.insert(name.into(), state)).await.map(drop)
    }
    async fn put_mutation_macs(&self, name: &str, _version: u64, mutations: &[Mac]) -> Result<()> {
        self.write(|s| {
            for m in mutations {
                s.mutation_macs.insert(format!("{name}/{}", hex(&m.index_mac)), B(m.value_mac.clone()));
            }
        })
        .await
    }
    async fn get_mutation_mac(&self, name: &str, index_mac: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(|s| s.mutation_macs.get(&format!("{name}/{}", hex(index_mac))).map(|b| b.0.clone()))
    }
    async fn delete_mutation_macs(&self, name: &str, index_macs: &[Vec<u8>]) -> Result<()> {
        self.write(|s| {
            for m in index_macs {
                s.mutation_macs.remove(&format!("{name}/{}", hex(m)));
            }
        })
        .await
    }
    async fn clear_mutation_macs(&self, name: &str) -> Result<()> {
        let prefix = format!("{name}/");
        self.write(|s| s.mutation_macs.retain(|k, _| !k.starts_with(&prefix))).await
    }
    async fn get_latest_sync_key_id(&self) -> Result<Option<Vec<u8>>> {
        self.read(|s| s.latest_sync_key_id.as_ref().map(|b| b.0.clone()))
    }
}

#[async_trait]
impl ProtocolStore for SealedBackend {
    async fn get_sender_key_devices(&self, group_jid: &str) -> Result<Vec<(String, bool)>> {
        self.cache.get_sender_key_devices(group_jid).await
    }
    async fn set_sender_key_status(&self, group_jid: &str, entries: &[(&str, bool)]) -> Result<()> {
        self.cache.set_sender_key_status(group_jid, entries).await
    }
    async fn clear_sender_key_devices(&self, group_jid: &str) -> Result<()> {
        self.cache.clear_sender_key_devices(group_jid).await
    }
    async fn delete_sender_key_device_rows(&self, device_jids: &[&str]) -> Result<()> {
        self.cache.delete_sender_key_device_rows(device_jids).await
    }
    async fn clear_all_sender_key_devices(&self) -> Result<()> {
        self.cache.clear_all_sender_key_devices().await
    }
    async fn get_lid_mapping(&self, lid: &str) -> Result<Option<LidPnMappingEntry>> {
        self.read(|s| s.lid_mappings.get(lid).cloned())
    }
    async fn get_pn_mapping(&self, phone: &str) -> Result<Option<LidPnMappingEntry>> {
        self.read(|s| s.lid_mappings.values().find(|e| e.phone_number == phone).cloned())
    }
    async fn put_lid_mapping(&self, entry: &LidPnMappingEntry) -> Result<()> {
        self.write(|s| s.lid_mappings.insert(entry.lid.clone(), entry.clone())).await.map(drop)
    }
    async fn put_lid_mappings(&self, entries: &[LidPnMappingEntry]) -> Result<()> {
        self.write(|s| {
            for e in entries {
                s.lid_mappings.insert(e.lid.clone(), e.clone());
            }
        })
        .await
    }
    async fn get_all_lid_mappings(&self) -> Result<Vec<LidPnMappingEntry>> {
        self.read(|s| s.lid_mappings.values().cloned().collect())
    }
    async fn save_base_key(&self, address: &str, message_id: &str, base_key: &[u8]) -> Result<()> {
        self.cache.save_base_key(address, message_id, base_key).await
    }
    async fn has_same_base_key(&self, address: &str, message_id: &str, current: &[u8]) -> Result<bool> {
        self.cache.has_same_base_key(address, message_id, current).await
    }
    async fn delete_base_key(&self, address: &str, message_id: &str) -> Result<()> {
        self.cache.delete_base_key(address, message_id).await
    }
    async fn update_device_list(&self, record: DeviceListRecord) -> Result<()> {
        self.write(|s| s.device_lists.insert(record.user.clone(), record)).await.map(drop)
    }
    async fn update_device_lists(&self, records: Vec<DeviceListRecord>) -> Result<()> {
        self.write(|s| {
            for r in records {
                s.device_lists.insert(r.user.clone(), r);
            }
        })
        .await
    }
    async fn get_devices(&self, user: &str) -> Result<Option<DeviceListRecord>> {
        self.read(|s| s.device_lists.get(user).cloned())
    }
    async fn delete_devices(&self, user: &str) -> Result<()> {
        self.write(|s| s.device_lists.remove(user)).await.map(drop)
    }
    async fn get_tc_token(&self, jid: &str) -> Result<Option<TcTokenEntry>> {
        self.cache.get_tc_token(jid).await
    }
    async fn put_tc_token(&self, jid: &str, entry: &TcTokenEntry) -> Result<()> {
        self.cache.put_tc_token(jid, entry).await
    }
    async fn delete_tc_token(&self, jid: &str) -> Result<()> {
        self.cache.delete_tc_token(jid).await
    }
    async fn get_all_tc_token_jids(&self) -> Result<Vec<String>> {
        self.cache.get_all_tc_token_jids().await
    }
    async fn delete_expired_tc_tokens(&self, token_cutoff: i64, sender_cutoff: i64) -> Result<u32> {
        self.cache.delete_expired_tc_tokens(token_cutoff, sender_cutoff).await
    }
    async fn store_sent_message(&self, chat_jid: &str, message_id: &str, payload: &[u8]) -> Result<()> {
        self.cache.store_sent_message(chat_jid, message_id, payload).await
    }
    async fn take_sent_message(&self, chat_jid: &str, message_id: &str) -> Result<Option<Vec<u8>>> {
        self.cache.take_sent_message(chat_jid, message_id).await
    }
    async fn delete_expired_sent_messages(&self, cutoff_timestamp: i64) -> Result<u32> {
        self.cache.delete_expired_sent_messages(cutoff_timestamp).await
    }
    async fn store_pending_inbound(&self, chat: &str, sender: &str, id: &str, message: &[u8]) -> Result<()> {
        let row = PendingInboundRow { chat, sender, id, message };
        self.store_pending_inbound_batch(std::slice::from_ref(&row)).await
    }
    async fn store_pending_inbound_batch(&self, rows: &[PendingInboundRow<'_>]) -> Result<()> {
        let now = chrono::Utc::now().timestamp();
        self.write(|s| {
            for r in rows {
                s.pending.insert(pending_key(r.chat, r.sender, r.id), (now, B(r.message.to_vec())));
            }
        })
        .await
    }
    async fn get_pending_inbound(&self, chat: &str, sender: &str, id: &str) -> Result<Option<Vec<u8>>> {
        self.read(|s| s.pending.get(&pending_key(chat, sender, id)).map(|(_, b)| b.0.clone()))
    }
    async fn delete_pending_inbound(&self, chat: &str, sender: &str, id: &str) -> Result<()> {
        self.write_later(|s| s.pending.remove(&pending_key(chat, sender, id))).map(drop)
    }
    async fn delete_pending_inbound_batch(&self, keys: &[PendingInboundKey<'_>]) -> Result<()> {
        self.write_later(|s| {
            for k in keys {
                s.pending.remove(&pending_key(k.chat, k.sender, k.id));
            }
        })
    }
    async fn delete_expired_pending_inbound(&self, cutoff_timestamp: i64) -> Result<u32> {
        // Swept at every keepalive: a change only when one expired.
        if !self.read(|s| s.pending.values().any(|(t, _)| *t < cutoff_timestamp))? {
            return Ok(0);
        }
        self.write_later(|s| {
            let before = s.pending.len();
            s.pending.retain(|_, (t, _)| *t >= cutoff_timestamp);
            (before - s.pending.len()) as u32
        })
    }
}

#[async_trait]
impl MsgSecretStore for SealedBackend {
    async fn put_msg_secrets(&self, entries: Vec<MsgSecretEntry>) -> Result<usize> {
        self.cache.put_msg_secrets(entries).await
    }
    async fn get_msg_secret(&self, chat: &str, sender: &str, msg_id: &str) -> Result<Option<Vec<u8>>> {
        self.cache.get_msg_secret(chat, sender, msg_id).await
    }
    async fn delete_expired_msg_secrets(&self, cutoff_timestamp: i64) -> Result<u32> {
        self.cache.delete_expired_msg_secrets(cutoff_timestamp).await
    }
}

#[async_trait]
impl DeviceStore for SealedBackend {
    async fn save(&self, device: &Device) -> Result<()> {
        self.write(|s| s.device = Some(device.clone())).await
    }
    async fn load(&self) -> Result<Option<Device>> {
        self.read(|s| s.device.clone())
    }
    async fn exists(&self) -> Result<bool> {
        self.read(|s| s.device.is_some())
    }
    async fn create(&self) -> Result<i32> {
        self.write(|s| {
            if s.device.is_none() {
                s.device = Some(Device::new());
            }
        })
        .await?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_is_kept_survives_the_sealed_copy_and_the_caches_do_not() {
        let b = SealedBackend::open(None).unwrap();
        assert!(!b.linked());
        b.create().await.unwrap();
        let mut d = b.load().await.unwrap().unwrap();
        d.pn = Some("15550000001@s.whatsapp.net".parse().unwrap());
        b.save(&d).await.unwrap();
        b.put_identity("15551234567.0", [7; 32]).await.unwrap();
        b.put_session("15551234567.0", b"session").await.unwrap();
        b.store_prekey(5, b"pk5", false).await.unwrap();
        b.store_prekey(9, b"pk9", false).await.unwrap();
        b.store_signed_prekey(1, b"spk").await.unwrap();
        b.set_sync_key(&[0, 0, 0, 1], AppStateSyncKey::default()).await.unwrap();
        b.store_sent_message("chat", "id", b"payload").await.unwrap();
        let copy = b.snapshot().unwrap();

        let r = SealedBackend::open(Some(&copy)).unwrap();
        assert!(r.linked());
        let key = r.load().await.unwrap().unwrap();
        assert_eq!(key.identity_key.public_key.public_key_bytes(), d.identity_key.public_key.public_key_bytes());
        assert_eq!(r.load_identity("15551234567.0").await.unwrap(), Some([7; 32]));
        assert_eq!(r.get_session("15551234567.0").await.unwrap().as_deref(), Some(&b"session"[..]));
        assert_eq!(r.get_max_prekey_id().await.unwrap(), 9);
        assert_eq!(r.load_signed_prekey(1).await.unwrap(), Some(b"spk".to_vec()));
        assert_eq!(r.get_latest_sync_key_id().await.unwrap(), Some(vec![0, 0, 0, 1]));
        assert_eq!(r.take_sent_message("chat", "id").await.unwrap(), None, "a cache, not kept");
        assert!(SealedBackend::open(Some(b"{not json")).err().unwrap().contains("unreadable"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_is_sealed_before_it_returns_and_writers_together_share_a_seal() {
        let b = Arc::new(SealedBackend::open(None).unwrap());
        let seals = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let full = Arc::new(AtomicBool::new(false));
        let (weak, log, disk) = (Arc::downgrade(&b), seals.clone(), full.clone());
        b.seal_with(Arc::new(move || {
            if disk.load(Ordering::SeqCst) {
                return Err("database or disk is full".into());
            }
            let copy = weak.upgrade().unwrap().snapshot()?;
            std::thread::sleep(std::time::Duration::from_millis(20));
            log.lock().unwrap().push(copy);
            Ok(())
        }));
        let last = || SealedBackend::open(Some(seals.lock().unwrap().last().unwrap())).unwrap();

        b.put_session("15551234567.0", b"one").await.unwrap();
        assert_eq!(last().get_session("15551234567.0").await.unwrap().as_deref(), Some(&b"one"[..]));
        let row = PendingInboundRow { chat: "c@s.whatsapp.net", sender: "c@s.whatsapp.net", id: "3EB0", message: b"m" };
        b.store_pending_inbound_batch(&[row]).await.unwrap();
        assert_eq!(
            last().get_pending_inbound("c@s.whatsapp.net", "c@s.whatsapp.net", "3EB0").await.unwrap(),
            Some(b"m".to_vec())
        );

        // Twenty writers at once: fewer seals than writes, and every write
        // in the seal taken last.
        let before = seals.lock().unwrap().len();
        let writes = (0..20).map(|i| {
            let b = b.clone();
            tokio::spawn(async move { b.put_session(&format!("1555000{i:04}.0"), b"x").await })
        });
        for w in futures_util::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        let n = seals.lock().unwrap().len() - before;
        assert!((1..20).contains(&n), "{n} seals for 20 writes");
        for i in 0..20 {
            assert!(last().get_session(&format!("1555000{i:04}.0")).await.unwrap().is_some(), "{i}");
        }

        // A seal that fails fails the write: the client does not go on.
        full.store(true, Ordering::SeqCst);
        assert!(b.put_session("15551234567.0", b"two").await.is_err());
        full.store(false, Ordering::SeqCst);
        // What may wait (a buffered message the inbox has) waits.
        let n = seals.lock().unwrap().len();
        let key = PendingInboundKey { chat: "c@s.whatsapp.net", sender: "c@s.whatsapp.net", id: "3EB0" };
        b.delete_pending_inbound_batch(&[key]).await.unwrap();
        assert_eq!(seals.lock().unwrap().len(), n, "not sealed at once");
        // Once forgotten, nothing is sealed and writes go on.
        b.forget();
        b.put_session("15551234567.0", b"three").await.unwrap();
        assert_eq!(seals.lock().unwrap().len(), n);
    }
}
