//! Identity and signatures: canonical JSON (what is signed), ALF message
//! verification. Keys and DIDs of a file live in `store::identity`; the
//! envelopes, credentials and attestations of issue 7 will join here.

pub mod alf;
pub mod canonical;
pub mod slip10;
