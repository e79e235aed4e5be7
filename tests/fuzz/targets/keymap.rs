//! Keymap files and key notation: any text is accepted or refused with a
//! message, never a panic; every key that parses prints back to itself.
#![no_main]

use adf::tui::keys::{Key, Keymap};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut km = Keymap::default();
    if let Err(e) = km.merge(text, "fuzz.toml") {
        assert!(e.starts_with("fuzz.toml"), "errors name the file: {e}");
    }
    for token in text.split(|c: char| c.is_whitespace() || c == '"' || c == '=').take(16) {
        if let Ok(k) = Key::parse(token) {
            let printed = k.to_string();
            assert_eq!(Key::parse(&printed), Ok(k), "{token:?} prints as {printed:?}");
        }
    }
});
