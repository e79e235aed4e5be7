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
