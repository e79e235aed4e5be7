//! Hostile input: every valid sample truncated and byte-flipped, and
//! arbitrary bytes under every extension, must give a result or an error,
//! never a panic and never a hang.

use proptest::prelude::*;

use super::{ZipLimits, samples, table, to_text, zip_extract, zip_list};

fn valid() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("r.pdf", samples::pdf()),
        ("d.docx", samples::docx()),
        ("b.xlsx", samples::xlsx()),
        ("a.zip", samples::plain_zip()),
        ("c.csv", b"name,age\nAda,36\n\"quoted, field\",\"unterminated\n".to_vec()),
        ("y.yaml", b"a: [1, 2]\nb: {c: d}\n".to_vec()),
    ]
}

/// Everything a caller can ask of these bytes.
fn poke(path: &str, bytes: &[u8]) {
    let _ = to_text(path, bytes);
    let _ = table(path, bytes, None);
    let _ = zip_list(path, bytes);
    let _ = zip_extract(path, bytes, &ZipLimits::default());
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = super::yaml_to_json(text);
    }
}

#[test]
fn truncated_documents_are_errors_not_panics() {
    for (path, bytes) in valid() {
        let n = bytes.len();
        let mut cuts: Vec<usize> = vec![0, 1, 4, 5, 8, 16, 64, n / 3, n / 2, n * 2 / 3, n.saturating_sub(22), n - 1];
        cuts.retain(|&c| c < n);
        for cut in cuts {
            poke(path, &bytes[..cut]);
        }
        // The zip-based kinds cannot be read once their directory is gone.
        if path.ends_with(".docx") || path.ends_with(".xlsx") || path.ends_with(".zip") {
            assert!(to_text(path, &bytes[..n / 2]).is_err(), "{path} cut in half");
        }
    }
}

#[test]
fn flipped_bytes_are_errors_or_text_not_panics() {
    for (path, bytes) in valid() {
        let step = (bytes.len() / 97).max(1);
        for at in (0..bytes.len()).step_by(step) {
            for mask in [0xff, 0x01, 0x80] {
                let mut b = bytes.clone();
                b[at] ^= mask;
                poke(path, &b);
            }
        }
    }
}

const EXTENSIONS: &[&str] = &["pdf", "docx", "xlsx", "xls", "ods", "csv", "zip", "yaml", "bin"];

/// Real headers, so the bytes after them reach the parsers.
const HEADERS: &[(&str, &[u8])] =
    &[("f.pdf", b"%PDF-1.4\n"), ("f.zip", b"PK\x03\x04"), ("f.xls", b"\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1")];

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..2048)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(ext in 0..EXTENSIONS.len(), body in bytes()) {
        let path = format!("f.{}", EXTENSIONS[ext]);
        poke(&path, &body);
    }

    #[test]
    fn arbitrary_bytes_behind_a_real_header_never_panic(which in 0..HEADERS.len(), body in bytes()) {
        let (path, head) = HEADERS[which];
        let mut bytes = head.to_vec();
        bytes.extend_from_slice(&body);
        poke(path, &bytes);
    }
}
