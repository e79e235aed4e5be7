//! The shell grammar of trigger commands and `.sh` timers: any text parses
//! or is refused with a message, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match adf::runtime::shell::check_syntax(text) {
        Ok(n) => assert!(n <= text.len() + 1),
        Err(e) => assert!(!e.is_empty()),
    }
});
