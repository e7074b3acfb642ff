//! The control block at the start of every PE's segment: header (pid, state), the exchange
//! area used by collective bookkeeping (allocation checks, team splits), the team barrier
//! counters, and per team slot the call words its barriers carry (two, by epoch parity). All of it is 64-bit atomics in CPU shared memory, whatever the data backend.

use crate::sync::{rounds, Note};
use std::sync::atomic::AtomicU64;

pub(crate) const MAGIC: u64 = 0x7273_686d_656d_0001; // "rshmem" v1
pub(crate) const W_MAGIC: usize = 0;
pub(crate) const W_PID: usize = 1;
pub(crate) const W_STATE: usize = 2;
/// The PE (plus one) whose loss (or, failing that, whose missing arrival) this PE had seen when
/// it ended, 0 if none: a PE ending because of a peer is not reported as the lost one.
pub(crate) const W_CAUSE: usize = 3;
/// Flag of a [`W_CAUSE`] that is a missing PE (a timeout), not a lost one.
pub(crate) const CAUSE_TIMEOUT: u64 = 1 << 63;

/// PE states in the header (0: starting).
pub(crate) const STATE_ALIVE: u64 = 1;
pub(crate) const STATE_FINALIZED: u64 = 2;
pub(crate) const STATE_FAILED: u64 = 3;

/// Fixed words of an exchange record before the team bitmap.
pub(crate) const EXCH_FIXED: usize = 16;

/// Where things are in a control block; equal on every PE of a job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CtrlLayout {
    pub rounds: usize,
    pub exch: usize,
    pub exch_words: usize,
    pub teams: usize,
    pub calls: usize,
    pub words: usize,
}

impl CtrlLayout {
    pub fn new(n_pes: usize, max_teams: usize) -> Self {
        let line = 8;
        let exch = line;
        let exch_words = EXCH_FIXED + max_teams.div_ceil(64);
        let teams = exch + exch_words.div_ceil(line) * line;
        let rounds = rounds(n_pes).max(1);
        let calls = teams + max_teams * rounds * line;
        let words = calls + max_teams * line;
        CtrlLayout {
            rounds,
            exch,
            exch_words,
            teams,
            calls,
            words,
        }
    }
    /// Bytes, rounded to a page.
    pub fn bytes(&self) -> usize {
        (self.words * 8).div_ceil(4096) * 4096
    }
    /// Word of team slot `slot`'s round-`r` barrier counter.
    pub fn barrier_word(&self, slot: usize, r: usize) -> usize {
        self.teams + (slot * self.rounds + r) * 8
    }
    /// Word of team slot `slot`'s call word for barriers of epoch parity `parity`.
    pub fn call_word(&self, slot: usize, parity: usize) -> usize {
        self.calls + slot * 8 + parity
    }
    /// First of the two words (member plus one, call word) of a node leader's note of epoch
    /// parity `parity` in a hierarchical barrier of team slot `slot`: the node note beside the
    /// call words (other leaders read both at once), the team note in the round-0 counter
    /// line after the counter lanes.
    pub fn note_word(&self, slot: usize, note: Note, parity: usize) -> usize {
        match note {
            Note::Node => self.call_word(slot, 2 + 2 * parity),
            Note::Team => self.barrier_word(slot, 0) + 4 + 2 * parity,
        }
    }
}

/// A view of one PE's control block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctrl {
    base: *mut AtomicU64,
    words: usize,
}

// SAFETY: the block is only accessed through atomics; the mapping outlives every Ctrl (the PE
// keeps the region alive through an Arc).
unsafe impl Send for Ctrl {}
// SAFETY: as above.
unsafe impl Sync for Ctrl {}

impl Ctrl {
    /// # Safety
    /// `base` must point to a live, 8-byte aligned mapping of at least `words * 8` bytes that
    /// outlives the returned value.
    pub unsafe fn new(base: *mut u8, words: usize) -> Ctrl {
        Ctrl {
            base: base as *mut AtomicU64,
            words,
        }
    }
    #[inline]
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(
            i < self.words,
            "control word {i} out of range (internal bug)"
        );
        // SAFETY: in bounds of a live mapping (constructor contract); AtomicU64 has the layout of u64.
        unsafe { &*self.base.add(i) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::LANES;
    #[test]
    fn layout_disjoint() {
        for n in [1, 2, 3, 8, 1000] {
            let l = CtrlLayout::new(n, 64);
            assert!(l.exch + l.exch_words <= l.teams);
            assert!(l.barrier_word(63, l.rounds - 1) < l.words);
            assert!(l.barrier_word(0, 0) >= l.teams);
            assert!(l.barrier_word(63, l.rounds - 1) < l.call_word(0, 0));
            assert!(l.call_word(63, 1) < l.words);
            // Counter lanes, node notes and team notes stay inside their lines.
            const { assert!(LANES <= 4) };
            for p in 0..2 {
                assert!(l.note_word(63, Note::Node, p) + 1 < l.words);
                assert_eq!(l.note_word(5, Note::Node, p) / 8, l.call_word(5, 0) / 8);
                assert_eq!(l.note_word(5, Note::Team, p) / 8, l.barrier_word(5, 0) / 8);
            }
            assert_eq!(l.bytes() % 4096, 0);
        }
    }
}
