//! `adf bench crypto`: what identity and messaging cost. Sign and verify a
//! message (level 1), seal and open one (level 2: sign, encrypt to the
//! recipient's DID, sign; verify, decrypt, verify), unwrap an envelope's
//! key slot, and unlock with a password (scrypt N = 2^17) — measured on a
//! blocking thread while a 1 ms ticker runs on the async runtime, to show
//! the unlock never stalls it.

use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use serde::Serialize;
use serde_json::{Value, json};
use x25519_dalek::{PublicKey, StaticSecret};

use super::envelope::{self, Descriptor, Slot};
use super::message::{self, Policy};
use crate::store::identity::did_key;

#[derive(Debug, Serialize)]
pub struct Report {
    pub sign_p50_us: f64,
    pub sign_p99_us: f64,
    pub verify_p50_us: f64,
    pub verify_p99_us: f64,
    pub seal_p50_us: f64,
    pub seal_p99_us: f64,
    pub open_p50_us: f64,
    pub open_p99_us: f64,
    pub slot_unwrap_p50_us: f64,
    pub password_unlock_ms: Vec<f64>,
    /// The worst lateness of a 1 ms async ticker while unlocks ran.
    pub runtime_stall_max_ms: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
}

fn time<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        std::hint::black_box(f());
        t.push(s.elapsed().as_secs_f64() * 1e6);
    }
    (pct(&mut t, 0.5), pct(&mut t, 0.99))
}

fn message(from: &str, to: &str) -> Value {
    json!({"version": "1.0", "network": "devnet", "id": "abcdefghij0123456789", "timestamp": "2026-12-01T00:00:00.000Z",
        "from": from, "to": to, "reply_to": "http://127.0.0.1:7295/agents/a/inbox", "meta": {"card": "http://127.0.0.1:7295/agents/a/card"},
        "payload": {"sender_alias": "a", "parent_id": null, "subject": "status",
            "content": "x".repeat(1024), "attachments": [], "sent_at": "2026-12-01T00:00:00.000Z"}})
}

pub fn run(iterations: usize) -> anyhow::Result<Report> {
    let n = iterations.max(10);
    let a = SigningKey::from_bytes(&rand::random());
    let b = SigningKey::from_bytes(&rand::random());
    let (ad, bd) = (did_key(&a.verifying_key()), did_key(&b.verifying_key()));
    let base = message(&ad, &bd);
    let (sign_p50_us, sign_p99_us) = time(n, || {
        let mut m = base.clone();
        message::egress(&mut m, Some(&a), 1, false).map(|_| m)
    });
    let mut signed = base.clone();
    message::egress(&mut signed, Some(&a), 1, false).map_err(|r| anyhow::anyhow!(r.error))?;
    let (verify_p50_us, verify_p99_us) = time(n, || message::ingress(signed.clone(), None, Policy::default()).is_ok());
    let (seal_p50_us, seal_p99_us) = time(n, || {
        let mut m = base.clone();
        message::egress(&mut m, Some(&a), 2, true).map(|_| m)
    });
    let mut sealed = base.clone();
    message::egress(&mut sealed, Some(&a), 2, true).map_err(|r| anyhow::anyhow!(r.error))?;
    let ok = message::ingress(sealed.clone(), Some(&b), Policy::default()).map_err(|r| anyhow::anyhow!(r.error))?;
    anyhow::ensure!(ok.payload_encrypted && ok.payload_verified, "the sealed message did not open");
    let (open_p50_us, open_p99_us) = time(n, || message::ingress(sealed.clone(), Some(&b), Policy::default()).is_ok());
    let dek: envelope::Dek = rand::random();
    let runtime = StaticSecret::from(rand::random::<[u8; 32]>());
    let slot = envelope::wrap_key(&dek, envelope::IDENTITY, PublicKey::from(&runtime).as_bytes(), "did:key:zR")
        .map_err(|e| anyhow::anyhow!(e))?;
    let d = Descriptor { v: 1, slots: vec![Slot::Runtime(slot)] };
    let (slot_unwrap_p50_us, _) = time(n, || d.open_with_key(envelope::IDENTITY, &runtime, "runtime"));
    let (password_unlock_ms, runtime_stall_max_ms) = password(&dek)?;
    Ok(Report {
        sign_p50_us,
        sign_p99_us,
        verify_p50_us,
        verify_p99_us,
        seal_p50_us,
        seal_p99_us,
        open_p50_us,
        open_p99_us,
        slot_unwrap_p50_us,
        password_unlock_ms,
        runtime_stall_max_ms,
    })
}

/// Three password unlocks at the real cost, off the async runtime, with a
/// ticker on it measuring how late its ticks come.
fn password(dek: &envelope::Dek) -> anyhow::Result<(Vec<f64>, f64)> {
    let slot = envelope::password_slot(dek, "correct horse battery", envelope::PASSWORD_LOG_N)
        .map_err(|e| anyhow::anyhow!(e))?;
    let d = Descriptor { v: 1, slots: vec![slot] };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let ticker = tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let now = Instant::now();
                worst = worst.max(now.duration_since(last).saturating_sub(Duration::from_millis(1)));
                last = now;
            }
            worst
        });
        let mut times = Vec::new();
        for _ in 0..3 {
            let d = d.clone();
            let t = Instant::now();
            let opened = tokio::task::spawn_blocking(move || d.open_with_password("correct horse battery")).await?;
            anyhow::ensure!(opened.is_ok(), "the password slot did not open");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let worst = ticker.await?;
        Ok((times, worst.as_secs_f64() * 1e3))
    })
}
