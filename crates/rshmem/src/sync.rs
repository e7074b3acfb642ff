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
//! * put-with-signal: data first, then a release store or add on the signal word; the waiter
//!   reads the signal with acquire ordering, then the data.

use crate::error::Result;

/// Words of remote memory as the protocols see them.
pub(crate) trait SyncMem {
    /// Adds `v` to the round-`round` counter of member `member` (release).
    fn add(&self, member: usize, round: usize, v: u64);
    /// Loads my own round-`round` counter (acquire).
    fn load_own(&self, round: usize) -> u64;
    /// Stores my call word for barriers of epoch parity `parity`.
    fn set_call(&self, parity: usize, word: u64);
    /// Loads member `member`'s call word of epoch parity `parity`.
    fn call_of(&self, member: usize, parity: usize) -> u64;
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
    let mut dist = 1usize;
    for r in 0..rounds(n) {
        let to = (me + dist) % n;
        let from = (me + n - dist) % n;
        mem.add(to, r, 1);
        let ready = || mem.load_own(r) >= epoch;
        if !ready() {
            wait(from, &ready)?;
        }
        dist <<= 1;
    }
    Ok(())
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
            fn add(&self, m: usize, w: usize, v: u64) {
                self.words[m][w].fetch_add(v, Ordering::Release);
            }
            fn load_own(&self, w: usize) -> u64 {
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
        fn add(&self, m: usize, w: usize, v: u64) {
            self.words[m * self.stride + w].fetch_add(v, Ordering::Release);
        }
        fn load_own(&self, w: usize) -> u64 {
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
