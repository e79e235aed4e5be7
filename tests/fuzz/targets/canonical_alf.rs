//! Canonical JSON (what signatures cover) and ALF message checks: any JSON
//! canonicalises to text that parses and canonicalises to itself, and a
//! message of any shape is checked without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    let text = adf::identity::canonical::to_string(&v);
    let back: Value = serde_json::from_str(&text).expect("canonical JSON parses");
    assert_eq!(adf::identity::canonical::to_string(&back), text, "canonical JSON is a fixed point");
    let verdict = adf::identity::alf::verify(&v);
    let _ = verdict.ok();
});
