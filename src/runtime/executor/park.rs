//! Idle agents cost almost nothing: after a quiet timer tick the actor
//! parks its executor, which drops what a turn rebuilds (transcript,
//! session summary, parsed config, prompt) and closes the file's SQLite
//! connection while keeping the writer lock. The next use opens it again
//! (well under a millisecond). A parked agent's ticks read no file: they
//! look at the next timer it had and at the file's size and times, and only
//! a due timer or a write by another connection wakes it.

use super::Executor;

/// What a parked agent remembers to know when a tick has work.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parked {
    /// The earliest `next_wake_at` of its live timers and scheduled loops.
    next_timer: Option<i64>,
}

impl Executor {
    /// Park an idle agent (see the module note). Refused while something
    /// waits in memory only: unkeyed injections, queued system jobs,
    /// background calls. `true` when the agent is parked now.
    pub fn park(&mut self) -> bool {
        if self.store.is_parked() {
            return true;
        }
        if !self.inject.is_empty() || !self.system_queue.is_empty() || !self.async_calls.is_empty() {
            return false;
        }
        let Ok(timers) = self.store.timer_list(false) else { return false };
        let next_timer = timers.iter().filter(|t| !t.expired).map(|t| t.next_wake_at).chain(self.next_loop_run()).min();
        self.leave_side();
        self.drop_loop_states();
        self.reset_session();
        self.cfg = None;
        match self.store.park() {
            Ok(true) => {
                self.parked = Some(Parked { next_timer });
                true
            }
            _ => false,
        }
    }

    /// Whether the agent is parked (its file's connection closed).
    pub fn is_parked(&self) -> bool {
        self.store.is_parked()
    }

    /// Whether a tick of a parked agent has nothing to do: no timer due by
    /// `now` and the file unchanged since it was parked. An agent that is
    /// not parked always has its tick.
    pub fn parked_and_quiet(&self, now: i64) -> bool {
        match &self.parked {
            Some(p) => p.next_timer.is_none_or(|t| t > now) && self.store.parked_untouched(),
            _ => false,
        }
    }
}
