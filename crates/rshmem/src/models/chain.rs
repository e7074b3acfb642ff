//! The chain broadcast's step counts.

use super::*;

/// Device memory of the chain model: per PE its `dst` parts (plain stores), the root's `src`
/// parts, and LL lines (`flag << 32 | payload`, one access each): headers, the chain's step
/// counts and the done lines, per receiver, half and source.
pub(super) struct ChainMem {
    pub(super) n: usize,
    pub(super) src: Cells,
    pub(super) dst: Cells,
    pub(super) hdr: Vec<AtomicU64>,
    pub(super) count: Vec<AtomicU64>,
    pub(super) done: Vec<AtomicU64>,
}

impl ChainMem {
    pub(super) fn line(&self, r: usize, half: usize, s: usize) -> usize {
        (r * 2 + half) * self.n + s
    }
}

/// One PE's part of `calls` chain broadcasts from root 0 (`rshmemi_coll_pull_bcast` with the
/// chain bit, one block, out of place): the root writes its `src` before each call (stream
/// order); the handshake as the pull calls' (release fence, header to every member, acquire
/// after each header seen, no mismatch here); the member at position p >= 1 reads step k from
/// the one before it (p = 1: the root's `src`; p >= 2: its `dst`, once that member's count
/// line says k, then an acquire), writes its own `dst`, and, unless last, publishes k after a
/// release fence (`rshmemi_chain_fence`: GPU scope in the kernel, a release fence here: the
/// model has no scopes, see the kernel's comment for why GPU scope holds on NVLink); then the
/// done lines (release fence, a line to every member, the wait for every member's with an
/// acquire). Loom checks that no read of a `dst` or `src` part is unordered with its writes,
/// in this call or the next one's overwrite.
pub(super) fn chain_pe(me: usize, mem: &ChainMem, calls: usize, steps: usize) {
    let n = mem.n;
    let tag = |c: usize, k: usize| (c * 16 + k) as u64 + 1;
    for c in 0..calls {
        let half = c & 1;
        let flag = c as u64 + 1;
        if me == 0 {
            for k in 0..steps {
                mem.src.put(k, tag(c, k));
            }
        }
        fence(Ordering::AcqRel);
        for p in (0..n).filter(|&p| p != me) {
            mem.hdr[mem.line(p, half, me)].store(flag << 32, Ordering::Relaxed);
        }
        for p in (0..n).filter(|&p| p != me) {
            let h = &mem.hdr[mem.line(me, half, p)];
            spin(|| h.load(Ordering::Relaxed) >> 32 == flag);
            fence(Ordering::AcqRel);
        }
        if me > 0 {
            let up = me - 1;
            for k in 0..steps {
                let v = if me == 1 {
                    mem.src.get(k)
                } else {
                    let l = &mem.count[mem.line(me, half, up)];
                    let step = |x: u64| (x >> 32 == flag).then_some(x & 0xffff_ffff);
                    spin(|| step(l.load(Ordering::Relaxed)).is_some_and(|s| s > k as u64));
                    let _ = l.load(Ordering::Acquire);
                    mem.dst.get(up * steps + k)
                };
                assert_eq!(v, tag(c, k), "call {c}: PE {me}'s step {k}");
                mem.dst.put(me * steps + k, v);
                if me < n - 1 {
                    fence(Ordering::Release);
                    let l = &mem.count[mem.line(me + 1, half, me)];
                    l.store(flag << 32 | (k as u64 + 1), Ordering::Relaxed);
                }
            }
        }
        fence(Ordering::AcqRel);
        for p in (0..n).filter(|&p| p != me) {
            mem.done[mem.line(p, half, me)].store(flag << 32, Ordering::Relaxed);
        }
        for p in (0..n).filter(|&p| p != me) {
            let d = &mem.done[mem.line(me, half, p)];
            spin(|| d.load(Ordering::Relaxed) >> 32 == flag);
            let _ = d.load(Ordering::Acquire);
        }
        // Stream order: this call's writes come before the next call's.
        fence(Ordering::Release);
    }
}

/// Runs the chain model: `calls` broadcasts of `steps` steps on 3 PEs (root, a middle member
/// that reads the root's `src` and is read from, the last member), without preemptions (3
/// spinning threads).
pub(super) fn chain_model(calls: usize, steps: usize) {
    let n = 3;
    builder(0).check(move || {
        let mem = Arc::new(ChainMem {
            n,
            src: Cells::new(steps),
            dst: Cells::new(n * steps),
            hdr: words(n * 2 * n),
            count: words(n * 2 * n),
            done: words(n * 2 * n),
        });
        let hs: Vec<_> = (0..n)
            .map(|me| {
                let mem = mem.clone();
                loom::thread::spawn(move || chain_pe(me, &mem, calls, steps))
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

/// Chain model: one call of two steps (the last member reads each step of the middle one's
/// `dst` only after its count), then two calls of one step (the second overwrites `src` and
/// the `dst` part the first call's readers read).
#[test]
pub(super) fn loom_chain_broadcast_three_pes() {
    chain_model(1, 2);
    chain_model(2, 1);
}
