//! SLIP-0010 key derivation for Ed25519 (identity.md §2): hardened
//! segments only, HMAC-SHA512 over the parent's chain code. The owner's
//! signing key is the key at `m/44'/0'/0'`, its encryption key at
//! `m/44'/0'/1'`. A few lines on `hmac` + `sha2` (the published crates
//! pull old ed25519 or libsodium).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha512;

type HmacSha512 = Hmac<Sha512>;

/// The owner signing key's path.
pub const OWNER_SIGNING: [u32; 3] = [44, 0, 0];
/// The owner encryption key's path.
pub const OWNER_ENCRYPTION: [u32; 3] = [44, 0, 1];

fn hmac(key: &[u8], parts: &[&[u8]]) -> Option<([u8; 32], [u8; 32])> {
    // HMAC accepts keys of any length; `None` never happens in practice.
    let mut mac = <HmacSha512 as KeyInit>::new_from_slice(key).ok()?;
    for p in parts {
        mac.update(p);
    }
    let out = mac.finalize().into_bytes();
    let (mut k, mut c) = ([0u8; 32], [0u8; 32]);
    k.copy_from_slice(&out[..32]);
    c.copy_from_slice(&out[32..64]);
    Some((k, c))
}

/// `(key, chain code)` at the hardened `path` (each index gets 2^31 added).
pub fn derive(seed: &[u8], path: &[u32]) -> Option<([u8; 32], [u8; 32])> {
    let (mut k, mut c) = hmac(b"ed25519 seed", &[seed])?;
    for i in path {
        let index = (i | 0x8000_0000).to_be_bytes();
        (k, c) = hmac(&c, &[&[0u8], &k, &index])?;
    }
    Some((k, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// SLIP-0010 test vector 1 for ed25519.
    #[test]
    fn test_vector_1() {
        let seed = hex("000102030405060708090a0b0c0d0e0f");
        let cases: [(&[u32], &str, &str); 3] = [
            (
                &[],
                "90046a93de5380a72b5e45010748567d5ea02bbf6522f979e05c0d8d8ca9fffb",
                "2b4be7f19ee27bbf30c667b642d5f4aa69fd169872f8fc3059c08ebae2eb19e7",
            ),
            (
                &[0],
                "8b59aa11380b624e81507a27fedda59fea6d0b779a778918a2fd3590e16e9c69",
                "68e0fe46dfb67e368c75379acec591dad19df3cde26e63b93a8e704f1dade7a3",
            ),
            (
                &[0, 1],
                "a320425f77d1b5c2505a6b1b27382b37368ee640e3557c315416801243552f14",
                "b1d0bad404bf35da785a64ca1ac54b2617211d2777696fbffaf208f746ae84f2",
            ),
        ];
        for (path, chain, key) in cases {
            let (k, c) = derive(&seed, path).unwrap();
            assert_eq!((k.to_vec(), c.to_vec()), (hex(key), hex(chain)), "{path:?}");
        }
    }
}
