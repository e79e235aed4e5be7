//! Running a third-party parser on hostile bytes. Document parsers (PDF
//! ones above all) are known to panic on malformed input, and some can
//! loop for a long time. `contained` turns a panic into an error, without
//! the binary's panic hook printing "internal error … this is a bug" (the
//! bug is in the file, not in us), and `with_deadline` gives up waiting
//! after a while.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::sync::mpsc;
use std::time::Duration;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is inside `contained`: a panic here is a
/// parser failing on a bad file, reported as an error, so a panic hook
/// should stay silent. The binary's hook checks this.
pub fn panic_is_contained() -> bool {
    QUIET.with(Cell::get)
}

/// Wrap whatever panic hook is installed (the binary's, or the default in
/// tests) once, so panics inside `contained` print nothing even if the
/// hook itself does not ask.
fn wrap_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !panic_is_contained() {
                previous(info);
            }
        }));
    });
}

/// Run `f`, turning a panic into `Err(message)`.
pub fn contained<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    wrap_hook();
    let was = QUIET.with(|q| q.replace(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    out.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown failure".into())
    })
}

/// How `with_deadline` ended badly.
#[derive(Debug, PartialEq)]
pub enum Stopped {
    Panicked(String),
    TimedOut,
}

/// Run `f` on its own thread (contained) and wait at most `limit`. A parser
/// that runs past the limit is abandoned: its thread finishes on its own
/// and its result is dropped. Rust cannot stop a thread, so this bounds
/// the wait, not the work.
pub fn with_deadline<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Stopped> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("adf-doc-parse".into()).spawn(move || {
        let _ = tx.send(contained(f));
    });
    if let Err(e) = spawned {
        return Err(Stopped::Panicked(format!("cannot start a parser thread: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(msg)) => Err(Stopped::Panicked(msg)),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Stopped::TimedOut),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Stopped::Panicked("the parser thread stopped".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_the_flag_is_restored() {
        let r: Result<(), String> = contained(|| panic!("bad xref"));
        assert_eq!(r, Err("bad xref".to_string()));
        assert!(!panic_is_contained());
        assert_eq!(contained(|| 7), Ok(7));
    }

    #[test]
    fn a_slow_parser_is_abandoned_at_the_deadline() {
        let r = with_deadline(Duration::from_millis(50), || std::thread::sleep(Duration::from_secs(2)));
        assert_eq!(r, Err(Stopped::TimedOut));
        let r = with_deadline(Duration::from_secs(5), || -> u8 { panic!("boom {}", 1) });
        assert_eq!(r, Err(Stopped::Panicked("boom 1".into())));
    }
}
