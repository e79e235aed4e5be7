//! Identity and signatures: canonical JSON (what is signed), the owner's
//! and this install's keys, the sealed envelopes of a file, attestations,
//! and ALF message signing, encryption and verification. Keys and DIDs of a
//! file live in `store::identity`.

pub mod alf;
pub mod attest;
pub mod bench;
pub mod canonical;
pub mod envelope;
pub mod install;
pub mod message;
pub mod owner;
pub mod seal;
pub mod slip10;

/// Bytes as lowercase hex (digests, random tokens).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
