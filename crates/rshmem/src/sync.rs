//! Synchronisation protocols written against a tiny memory facade, so that the same code runs
//! on the symmetric heap and, under `--cfg loom`, on loom's model atomics.
//!
//! * [`dissemination_barrier`]: ⌈log2 n⌉ rounds; in round r the member `i` adds 1 to the round-r
//!   counter of member `(i + 2^r) mod n` and waits until its own round-r counter reaches the
//!   barrier's epoch. Counters only grow and each receives exactly one increment per barrier and
//!   round, so a fast member's early signal for the next barrier never breaks the current one
//!   (the reset race of seed 004's barrier cannot happen: nothing is ever reset).
//! * [`checked_barrier`]: the dissemination barrier, each member first publishing a call word
//!   (what it called and the barrier's epoch) in the slot of the epoch's parity. Passing the
//!   barrier orders every member's word before the reads, so every member reads the same words
//!   and reaches the same verdict: a barrier is never satisfied by another kind of call. Two
//!   parities suffice: a member cannot publish epoch `e + 2` before every member arrived at
//!   `e + 1`, which each does only after reading the words of `e`.
//! * [`hier_checked_barrier`]: the same contract on a team spanning nodes, with messages across
//!   nodes only between node leaders: a dissemination inside each node (lane 0), one among the
//!   nodes' leaders (lane 1), then another inside each node (lane 2), which nobody passes before
//!   its leader arrived, and the leader arrives only after the leaders' phase. Call words are
//!   checked the same way: each leader notes the first member of its node whose word differs
//!   from its own, reads the other leaders' words and notes (one read per node) and notes the
//!   team's verdict, which its node's members read after the last phase. Every counter still
//!   takes one increment per barrier and is waited on only by its owner.
//! * put-with-signal: data first, then a release store or add on the signal word; the waiter
//!   reads the signal with acquire ordering, then the data.

use crate::error::Result;
use crate::team::NodeMap;

/// Words of remote memory as the protocols see them.
pub(crate) trait SyncMem {
    /// Adds `v` to the round-`round` counter of lane `lane` of member `member` (release).
    fn add(&self, member: usize, lane: usize, round: usize, v: u64);
    /// Loads my own round-`round` counter of lane `lane` (acquire).
    fn load_own(&self, lane: usize, round: usize) -> u64;
    /// Stores my call word for barriers of epoch parity `parity`.
    fn set_call(&self, parity: usize, word: u64);
    /// Loads member `member`'s call word of epoch parity `parity`.
    fn call_of(&self, member: usize, parity: usize) -> u64;
}

/// Counter lanes a hierarchical barrier uses (the flat one uses lane 0 only).
pub(crate) const LANES: usize = 3;

/// A note a node leader publishes in a hierarchical barrier, per epoch parity: a member (plus
/// one; 0 for none) and its call word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Note {
    /// The first member of the leader's node whose call word differs from the leader's.
    Node,
    /// The first member of the team whose call word differs from the leader's.
    Team,
}

/// What the hierarchical barrier needs beyond [`SyncMem`]: the leaders' notes.
pub(crate) trait NoteMem: SyncMem {
    /// Stores my note `note` of epoch parity `parity`: `member` (plus one, 0 for none), `word`.
    fn set_note(&self, note: Note, parity: usize, member: u64, word: u64);
    /// Member `member`'s note `note` of parity `parity` (a member of my node).
    fn note_of(&self, member: usize, note: Note, parity: usize) -> (u64, u64);
    /// Leader `member`'s call word and [`Note::Node`] of parity `parity` (a leader of another
    /// node: one read across nodes).
    fn leader_of(&self, member: usize, parity: usize) -> Result<(u64, (u64, u64))>;
}

/// Bits of a call word holding the epoch; the call's kind is above them.
pub(crate) const CALL_EPOCH_BITS: u32 = 56;

/// The call word of a barrier of kind `kind` at `epoch`.
pub(crate) fn call_word(kind: u64, epoch: u64) -> u64 {
    (kind << CALL_EPOCH_BITS) | (epoch & ((1 << CALL_EPOCH_BITS) - 1))
}

/// A member whose call word differs from this member's after a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Differs {
    /// Its index among the members.
    pub member: usize,
    /// Its call word.
    pub word: u64,
}

/// [`dissemination_barrier`] carrying this member's call `kind`: returns the first member
/// whose call word for this epoch differs (the same verdict on every member), if any.
pub(crate) fn checked_barrier<M: SyncMem>(
    mem: &M,
    me: usize,
    n: usize,
    epoch: u64,
    kind: u64,
    wait: impl FnMut(usize, &dyn Fn() -> bool) -> Result<()>,
) -> Result<Option<Differs>> {
    let parity = (epoch % 2) as usize;
    let mine = call_word(kind, epoch);
    // Published by the release of this member's first signal of the barrier.
    mem.set_call(parity, mine);
    dissemination_barrier(mem, me, n, epoch, wait)?;
    Ok((0..n)
        .map(|m| Differs {
            member: m,
            word: mem.call_of(m, parity),
        })
        .find(|d| d.word != mine))
}

/// Rounds of a dissemination barrier over `n` members.
pub(crate) fn rounds(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

/// One barrier of member `me` of `n`; `epoch` counts barriers from 1. When a round's signal has
/// not arrived yet, `wait(from, ready)` is called with the member waited for and the condition;
/// it returns once `ready()` holds, or an error to give up (timeout, lost peer).
pub(crate) fn dissemination_barrier<M: SyncMem>(
    mem: &M,
    me: usize,
    n: usize,
    epoch: u64,
    mut wait: impl FnMut(usize, &dyn Fn() -> bool) -> Result<()>,
) -> Result<()> {
    disseminate(mem, |i| i, me, n, 0, epoch, &mut wait)
}

/// A dissemination among `n` members (member `i` of the group is `member(i)` of the team) on
/// counter lane `lane`; `at` is this member's index in the group.
fn disseminate<M: SyncMem>(
    mem: &M,
    member: impl Fn(usize) -> usize,
    at: usize,
    n: usize,
    lane: usize,
    epoch: u64,
    wait: &mut impl FnMut(usize, &dyn Fn() -> bool) -> Result<()>,
) -> Result<()> {
    let mut dist = 1usize;
    for r in 0..rounds(n) {
        mem.add(member((at + dist) % n), lane, r, 1);
        let ready = || mem.load_own(lane, r) >= epoch;
        if !ready() {
            wait(member((at + n - dist) % n), &ready)?;
        }
        dist <<= 1;
    }
    Ok(())
}

/// [`checked_barrier`] of member `me` of a team placed as `nodes`, crossing nodes only between
/// the nodes' leaders (see the module documentation). Every member gets an error verdict when
/// any call word differs: a member whose word differs from its leader's names the leader,
/// the others the member the leader's verdict names.
pub(crate) fn hier_checked_barrier<M: NoteMem>(
    mem: &M,
    nodes: &NodeMap,
    me: usize,
    epoch: u64,
    kind: u64,
    mut wait: impl FnMut(usize, &dyn Fn() -> bool) -> Result<()>,
) -> Result<Option<Differs>> {
    let parity = (epoch % 2) as usize;
    let mine = call_word(kind, epoch);
    mem.set_call(parity, mine);
    let k = nodes.node(me);
    let local = nodes.members(k);
    let (l, ln) = (nodes.local(me), local.len());
    disseminate(mem, |i| local[i], l, ln, 0, epoch, &mut wait)?;
    let leader = local[0];
    if me == leader {
        let call = |m: usize| mem.call_of(m, parity);
        let node = local.iter().find(|&&m| call(m) != mine).map(|&m| Differs {
            member: m,
            word: call(m),
        });
        let (m, w) = note(node);
        mem.set_note(Note::Node, parity, m, w);
        let nn = nodes.n_nodes();
        disseminate(mem, |j| nodes.leader(j), k, nn, 1, epoch, &mut wait)?;
        // The team's first member (in team order) whose word differs from mine: a node's
        // leader is its first member, and its note names the first one differing from it.
        let mut team: Option<Differs> = None;
        for j in 0..nn {
            let lj = nodes.leader(j);
            let (word, differs) = if j == k {
                (mine, node)
            } else {
                let (word, n) = mem.leader_of(lj, parity)?;
                (word, from_note(n))
            };
            let found = if word != mine {
                Some(Differs { member: lj, word })
            } else {
                differs
            };
            if let Some(d) = found {
                if team.is_none_or(|t| d.member < t.member) {
                    team = Some(d);
                }
            }
        }
        let (m, w) = note(team);
        mem.set_note(Note::Team, parity, m, w);
    }
    disseminate(mem, |i| local[i], l, ln, 2, epoch, &mut wait)?;
    let theirs = if me == leader {
        mine
    } else {
        mem.call_of(leader, parity)
    };
    if theirs != mine {
        return Ok(Some(Differs {
            member: leader,
            word: theirs,
        }));
    }
    Ok(from_note(mem.note_of(leader, Note::Team, parity)))
}

/// A note's two words: the member plus one (0: none) and its call word.
fn note(d: Option<Differs>) -> (u64, u64) {
    d.map_or((0, 0), |d| (d.member as u64 + 1, d.word))
}

fn from_note((m, word): (u64, u64)) -> Option<Differs> {
    (m != 0).then(|| Differs {
        member: m as usize - 1,
        word,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn rounds_count() {
        assert_eq!(rounds(1), 0);
        assert_eq!(rounds(2), 1);
        assert_eq!(rounds(3), 2);
        assert_eq!(rounds(4), 2);
        assert_eq!(rounds(5), 3);
        assert_eq!(rounds(1024), 10);
    }

    /// Sequential model: drive members as state machines and check nobody passes early.
    #[test]
    fn barrier_never_passes_early_sequential() {
        struct Mem<'a> {
            words: &'a [Vec<AtomicU64>],
            me: usize,
        }
        impl SyncMem for Mem<'_> {
            fn add(&self, m: usize, _lane: usize, w: usize, v: u64) {
                self.words[m][w].fetch_add(v, Ordering::Release);
            }
            fn load_own(&self, _lane: usize, w: usize) -> u64 {
                self.words[self.me][w].load(Ordering::Acquire)
            }
            fn set_call(&self, parity: usize, word: u64) {
                self.words[self.me][6 + parity].store(word, Ordering::Relaxed);
            }
            fn call_of(&self, m: usize, parity: usize) -> u64 {
                self.words[m][6 + parity].load(Ordering::Relaxed)
            }
        }
        for n in 1..=9 {
            let words: Vec<Vec<AtomicU64>> = (0..n)
                .map(|_| (0..8).map(|_| AtomicU64::new(0)).collect())
                .collect();
            let passed = AtomicU64::new(0);
            std::thread::scope(|s| {
                for me in 0..n {
                    let words = &words;
                    let passed = &passed;
                    s.spawn(move || {
                        let m = Mem { words, me };
                        for epoch in 1..=50u64 {
                            // Every member calls kind 1, except at epoch 7, where the last
                            // member calls kind 2: every member must see exactly that.
                            let odd = epoch == 7 && me == n - 1 && n > 1;
                            let kind = if odd { 2 } else { 1 };
                            let d = checked_barrier(&m, me, n, epoch, kind, |_, ready| {
                                while !ready() {
                                    std::thread::yield_now();
                                }
                                Ok(())
                            })
                            .unwrap();
                            let want = (epoch == 7 && n > 1).then(|| {
                                let (member, k) = if me == n - 1 { (0, 1) } else { (n - 1, 2) };
                                Differs {
                                    member,
                                    word: call_word(k, epoch),
                                }
                            });
                            assert_eq!(d, want, "member {me} of {n}, barrier {epoch}");
                            // Everyone must have arrived at this epoch before anyone passed it.
                            let p = passed.fetch_add(1, Ordering::SeqCst);
                            assert!(
                                p >= (epoch - 1) * n as u64,
                                "member passed barrier {epoch} early"
                            );
                        }
                    });
                }
            });
        }
    }
    /// The hierarchical barrier on threads: nobody passes early, every member sees a mismatch
    /// at exactly the barrier where one member calls another kind (naming the PE the protocol
    /// says), and only leaders touch other nodes' words.
    #[test]
    fn hierarchical_barrier_never_passes_early_and_agrees_on_mismatches() {
        use std::sync::atomic::AtomicBool;
        // Per member: lanes × rounds counters, 2 call words, 2 notes × 2 parities × 2 words.
        const R: usize = 4;
        const CALL: usize = LANES * R;
        const NOTE: usize = CALL + 2;
        struct Mem<'a> {
            words: &'a [Vec<AtomicU64>],
            nodes: &'a NodeMap,
            me: usize,
            crossed: &'a AtomicBool,
        }
        impl Mem<'_> {
            fn far(&self, m: usize) {
                if self.nodes.node(m) != self.nodes.node(self.me) {
                    assert_eq!(self.nodes.leader(self.nodes.node(self.me)), self.me);
                    self.crossed.store(true, Ordering::Relaxed);
                }
            }
        }
        impl SyncMem for Mem<'_> {
            fn add(&self, m: usize, lane: usize, r: usize, v: u64) {
                self.far(m);
                self.words[m][lane * R + r].fetch_add(v, Ordering::Release);
            }
            fn load_own(&self, lane: usize, r: usize) -> u64 {
                self.words[self.me][lane * R + r].load(Ordering::Acquire)
            }
            fn set_call(&self, parity: usize, word: u64) {
                self.words[self.me][CALL + parity].store(word, Ordering::Relaxed);
            }
            fn call_of(&self, m: usize, parity: usize) -> u64 {
                assert_eq!(
                    self.nodes.node(m),
                    self.nodes.node(self.me),
                    "call word across"
                );
                self.words[m][CALL + parity].load(Ordering::Relaxed)
            }
        }
        impl NoteMem for Mem<'_> {
            fn set_note(&self, note: Note, parity: usize, member: u64, word: u64) {
                let at = NOTE + 4 * (note as usize) + 2 * parity;
                self.words[self.me][at].store(member, Ordering::Relaxed);
                self.words[self.me][at + 1].store(word, Ordering::Relaxed);
            }
            fn note_of(&self, m: usize, note: Note, parity: usize) -> (u64, u64) {
                let at = NOTE + 4 * (note as usize) + 2 * parity;
                let w = &self.words[m];
                (
                    w[at].load(Ordering::Relaxed),
                    w[at + 1].load(Ordering::Relaxed),
                )
            }
            fn leader_of(&self, m: usize, parity: usize) -> Result<(u64, (u64, u64))> {
                self.far(m);
                let call = self.words[m][CALL + parity].load(Ordering::Relaxed);
                Ok((call, self.note_of(m, Note::Node, parity)))
            }
        }
        let layouts: [&[usize]; 8] = [
            &[0, 0, 1, 1],
            &[0, 0, 1, 1, 2, 2],
            &[0, 1, 0, 1],
            &[0, 0, 0, 1],
            &[0, 1, 1, 1],
            &[0, 0, 1, 2, 2, 2],
            &[3, 1, 3, 1, 1],
            &[0, 1, 2],
        ];
        for layout in layouts {
            let nodes = NodeMap::from_nodes(layout);
            let n = layout.len();
            let words: Vec<Vec<AtomicU64>> = (0..n)
                .map(|_| (0..NOTE + 8).map(|_| AtomicU64::new(0)).collect())
                .collect();
            let passed = AtomicU64::new(0);
            let crossed = AtomicBool::new(false);
            std::thread::scope(|s| {
                for me in 0..n {
                    let (words, passed, nodes) = (&words, &passed, &nodes);
                    let crossed = &crossed;
                    s.spawn(move || {
                        let m = Mem {
                            words,
                            nodes,
                            me,
                            crossed,
                        };
                        let odd_one = n - 1;
                        let own_leader = nodes.leader(nodes.node(me));
                        for epoch in 1..=40u64 {
                            let odd = epoch == 7 && me == odd_one;
                            let kind = if odd { 2 } else { 1 };
                            let d = hier_checked_barrier(&m, nodes, me, epoch, kind, |_, ready| {
                                while !ready() {
                                    std::thread::yield_now();
                                }
                                Ok(())
                            })
                            .unwrap();
                            let want = (epoch == 7).then(|| {
                                if me != odd_one {
                                    Differs {
                                        member: odd_one,
                                        word: call_word(2, epoch),
                                    }
                                } else {
                                    let member = if own_leader == me { 0 } else { own_leader };
                                    Differs {
                                        member,
                                        word: call_word(1, epoch),
                                    }
                                }
                            });
                            assert_eq!(d, want, "{layout:?}: member {me}, barrier {epoch}");
                            let p = passed.fetch_add(1, Ordering::SeqCst);
                            assert!(
                                p >= (epoch - 1) * n as u64,
                                "{layout:?}: member {me} passed barrier {epoch} early"
                            );
                        }
                    });
                }
            });
            assert!(crossed.load(Ordering::Relaxed), "{layout:?}");
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! `RUSTFLAGS="--cfg loom" cargo test -p rshmem --release --lib loom_`
    use super::*;
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::Arc;

    struct Mem {
        words: Arc<Vec<AtomicU64>>,
        calls: Arc<Vec<AtomicU64>>,
        stride: usize,
        me: usize,
    }
    impl SyncMem for Mem {
        fn add(&self, m: usize, _lane: usize, w: usize, v: u64) {
            self.words[m * self.stride + w].fetch_add(v, Ordering::Release);
        }
        fn load_own(&self, _lane: usize, w: usize) -> u64 {
            self.words[self.me * self.stride + w].load(Ordering::Acquire)
        }
        fn set_call(&self, parity: usize, word: u64) {
            self.calls[self.me * 2 + parity].store(word, Ordering::Relaxed);
        }
        fn call_of(&self, m: usize, parity: usize) -> u64 {
            self.calls[m * 2 + parity].load(Ordering::Relaxed)
        }
    }

    #[test]
    fn loom_barrier_call_words() {
        // Two members, three barriers; at the second, member 1 calls another kind. Both must
        // see the mismatch at that barrier and agree at the others, whatever the interleaving
        // (a member publishing the third barrier's word early must not spoil the second).
        // Preemptions bounded as in `models/`: the spin-waits make the full space too large.
        let mut b = loom::model::Builder::new();
        if b.preemption_bound.is_none() {
            b.preemption_bound = Some(3);
        }
        b.check(|| {
            let words = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
            let calls = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
            let hs: Vec<_> = (0..2)
                .map(|me| {
                    let (words, calls) = (words.clone(), calls.clone());
                    loom::thread::spawn(move || {
                        let m = Mem {
                            words,
                            calls,
                            stride: 1,
                            me,
                        };
                        for epoch in 1..=3u64 {
                            let kind = if epoch == 2 && me == 1 { 9 } else { 4 };
                            let d = checked_barrier(&m, me, 2, epoch, kind, |_, ready| {
                                while !ready() {
                                    loom::thread::yield_now();
                                }
                                Ok(())
                            })
                            .unwrap();
                            let other = if epoch == 2 && me == 0 { 9 } else { 4 };
                            let want = (epoch == 2).then_some(Differs {
                                member: 1 - me,
                                word: call_word(other, epoch),
                            });
                            assert_eq!(d, want, "member {me}, barrier {epoch}");
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
    }

    #[test]
    fn loom_barrier_orders_writes() {
        // Two members, two barriers: data written before barrier 1 is seen after it, and a
        // member's next-epoch signal does not release the other early.
        loom::model(|| {
            let words = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
            let data = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
            let hs: Vec<_> = (0..2)
                .map(|me| {
                    let words = words.clone();
                    let data = data.clone();
                    loom::thread::spawn(move || {
                        let m = Mem {
                            words,
                            calls: Arc::new(Vec::new()),
                            stride: 2,
                            me,
                        };
                        data[me].store(7, Ordering::Relaxed);
                        dissemination_barrier(&m, me, 2, 1, |_, ready| {
                            while !ready() {
                                loom::thread::yield_now();
                            }
                            Ok(())
                        })
                        .unwrap();
                        assert_eq!(data[1 - me].load(Ordering::Relaxed), 7);
                        dissemination_barrier(&m, me, 2, 2, |_, ready| {
                            while !ready() {
                                loom::thread::yield_now();
                            }
                            Ok(())
                        })
                        .unwrap();
                        data[me].store(9, Ordering::Relaxed);
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
    }

    #[test]
    fn loom_put_signal_wait() {
        // put (relaxed data words) then release signal; the waiter acquires the signal and must
        // see every data word.
        loom::model(|| {
            let data = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
            let sig = Arc::new(AtomicU64::new(0));
            let (d2, s2) = (data.clone(), sig.clone());
            let t = loom::thread::spawn(move || {
                d2[0].store(11, Ordering::Relaxed);
                d2[1].store(22, Ordering::Relaxed);
                s2.fetch_add(1, Ordering::Release);
            });
            while sig.load(Ordering::Acquire) < 1 {
                loom::thread::yield_now();
            }
            assert_eq!(data[0].load(Ordering::Relaxed), 11);
            assert_eq!(data[1].load(Ordering::Relaxed), 22);
            t.join().unwrap();
        });
    }
    /// Plain (non-atomic) data, as the CPU backend's memcpy writes it: loom flags any read of
    /// it that is not ordered after its write.
    struct Plain([loom::cell::UnsafeCell<u64>; 2]);
    // SAFETY: accesses are ordered by the signal protocol under test; loom checks exactly that.
    unsafe impl Sync for Plain {}
    // SAFETY: as above.
    unsafe impl Send for Plain {}

    #[test]
    fn loom_put_signal_plain_data_set_and_add() {
        // Set: one producer, data then a release store of the signal (SignalOp::Set).
        loom::model(|| {
            let data = Arc::new(Plain([0, 0].map(loom::cell::UnsafeCell::new)));
            let sig = Arc::new(AtomicU64::new(0));
            let (d2, s2) = (data.clone(), sig.clone());
            let t = loom::thread::spawn(move || {
                // SAFETY: only this thread writes, before the signal.
                d2.0[0].with_mut(|p| unsafe { *p = 11 });
                s2.store(5, Ordering::Release);
            });
            while sig.load(Ordering::Acquire) != 5 {
                loom::thread::yield_now();
            }
            // SAFETY: ordered after the write by the acquire of the signal (checked by loom).
            data.0[0].with(|p| assert_eq!(unsafe { *p }, 11));
            t.join().unwrap();
        });
        // Add: two producers into disjoint slots, each adding 1 (SignalOp::Add, acq-rel).
        loom::model(|| {
            let data = Arc::new(Plain([0, 0].map(loom::cell::UnsafeCell::new)));
            let sig = Arc::new(AtomicU64::new(0));
            let ts: Vec<_> = (0..2)
                .map(|i| {
                    let (d2, s2) = (data.clone(), sig.clone());
                    loom::thread::spawn(move || {
                        // SAFETY: slot i is written only by producer i, before its signal.
                        d2.0[i].with_mut(|p| unsafe { *p = 20 + i as u64 });
                        s2.fetch_add(1, Ordering::AcqRel);
                    })
                })
                .collect();
            while sig.load(Ordering::Acquire) < 2 {
                loom::thread::yield_now();
            }
            for i in 0..2 {
                // SAFETY: both writes precede the adds the acquire load observed.
                data.0[i].with(|p| assert_eq!(unsafe { *p }, 20 + i as u64));
            }
            for t in ts {
                t.join().unwrap();
            }
        });
    }
}
