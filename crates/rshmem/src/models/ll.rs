//! The LL all_reduce beside barrier-based calls, and the pull all_to_all.

use super::*;

/// The LL bit of a signature (`CallSig::ll`, word 0 bit 27).
pub(super) const LL_BIT: u64 = 1 << 27;

/// A signature of an LL call (its barrier count, 2, is only compared: an LL call runs none).
pub(super) fn ll_sig(kind: u64) -> u64 {
    sig(kind, 2) | LL_BIT
}

/// The pull bit of a signature (`CallSig::pull`, word 0 bit 28).
pub(super) const PULL_BIT: u64 = 1 << 28;

/// A signature of a pull all_to_all (an LL call whose data are read from the senders' src).
pub(super) fn pull_sig(kind: u64) -> u64 {
    ll_sig(kind) | PULL_BIT
}

/// Device memory of the LL model: barrier counters, signature slots (volatile words: atomics
/// here, the kernels poll them), and per receiver, half and source one header line and one
/// data line (`flag << 32 | payload`, each 8-byte half of a 16-byte line being one access).
pub(super) struct LlMem {
    pub(super) n: usize,
    pub(super) bar: BarMem,
    pub(super) slots: Vec<AtomicU64>,
    pub(super) hdr: Vec<AtomicU64>,
    pub(super) data: Vec<AtomicU64>,
    /// Inputs read by barrier-based calls' gathers (plain: loom checks the ordering).
    pub(super) src: Cells,
}

impl LlMem {
    pub(super) fn line(&self, r: usize, half: usize, s: usize) -> usize {
        (r * 2 + half) * self.n + s
    }
}

/// One PE's part of a sequence of calls on the world, some LL (`rshmemi_ll_all_reduce`),
/// some barrier-based (`rshmemi_sig_sync` + the plan, as in [`sig_pe`]). LL: flags from the
/// expectation and the pair's LL sequence (`rshmemi_ll_flag`), header and data pushed into
/// the half the sequence's parity names at each member, then per member its header (in the
/// half of the same parity: the sequences are equal on both sides) or, failing that, its
/// slot (a barrier-based call: looked at once more for the header, then taken as one); the
/// data of every member when all agree;
/// (a pull call, `rshmemi_coll_pull_a2a`: no data lines; a release fence before the header,
/// an acquire fence after each header seen, then every member's src read, a release fence,
/// a "done" line to every member and the wait for every member's, with an acquire);
/// then the sequences of LL members move on (the kernels keep a copy per block, each read and
/// moved on at its block's begin and, after a mismatch, moved back for the members that did not
/// run an LL call; the copies of a pair are equal between calls, so one block stands for all),
/// and when some member is barrier-based its slot
/// is cleared, then it gets the arrivals of the most barriers a barrier-based member of the
/// call runs, the expectation for it moving by as many. The end of every kernel sequence of
/// a call is a release fence (a kernel's writes are visible before what the stream runs after
/// it: CUDA's stream order, the one assumption beyond [`sig_pe`]'s).
pub(super) fn ll_pe(me: usize, mem: &LlMem, calls: &[Vec<u64>]) -> Vec<u64> {
    let n = mem.n;
    let world = Team {
        slot: 0,
        start: 0,
        stride: 1,
        size: n,
    };
    let mut bar = BarPe::new(me, &mem.bar);
    let mut seq = vec![0u64; n];
    for (c, sigs) in calls.iter().enumerate() {
        let tag = |p: usize| (c * 8 + p) as u64 + 1;
        let mine = sigs[me];
        let agreed = sigs.iter().all(|&s| s == mine);
        mem.src.put(me, tag(me));
        if mine & LL_BIT == 0 {
            // Barrier-based: as sig_pe, the slots as polled words, each write after the
            // `fence.acq_rel.sys` of `rshmemi_sig_sync`: what a member wrote before an LL header
            // this PE saw in an earlier call (its clearing of this PE's slot) comes first.
            fence(Ordering::AcqRel);
            for p in 0..n {
                mem.slots[p * n + me].store(mine, Ordering::Relaxed);
            }
            bar.sync(&mem.bar, &world);
            let mut ok = true;
            let mut max_syncs = 0;
            for (p, &theirs) in sigs.iter().enumerate() {
                let s = mem.slots[me * n + p].load(Ordering::Relaxed);
                let want = if theirs & LL_BIT != 0 { 0 } else { theirs };
                assert_eq!(s, want, "call {c}: PE {me}'s slot of {p}");
                ok &= s == mine;
                max_syncs = max_syncs.max(sig_syncs(s));
            }
            assert_eq!(ok, agreed, "call {c}: PE {me}'s verdict");
            for p in 0..n {
                mem.slots[me * n + p].store(0, Ordering::Relaxed);
            }
            if !ok {
                for _ in sig_syncs(mine)..max_syncs {
                    bar.sync(&mem.bar, &world);
                }
            }
            for _ in 1..sig_syncs(mine) {
                if ok {
                    for p in 0..n {
                        assert_eq!(mem.src.get(p), tag(p), "call {c}: input of {p}");
                    }
                }
                bar.sync(&mem.bar, &world);
            }
        } else {
            let pull = mine & PULL_BIT != 0;
            let flag: Vec<u64> = (0..n)
                .map(|p| 0x8000_0000 | (bar.exp[p].wrapping_add(seq[p]) & 0x7fff_ffff))
                .collect();
            if pull {
                // Releases what the stream wrote into src before the call.
                fence(Ordering::AcqRel);
            }
            for p in (0..n).filter(|&p| p != me) {
                let h = (seq[p] & 1) as usize;
                let lo = mine & 0xffff_ffff;
                mem.hdr[mem.line(p, h, me)].store(flag[p] << 32 | lo, Ordering::Relaxed);
                if !pull {
                    let d = flag[p] << 32 | tag(me);
                    mem.data[mem.line(p, h, me)].store(d, Ordering::Relaxed);
                }
            }
            // Verdicts: 0 agrees, 1 differs, 2 barrier-based (with its slot's word).
            let mut kind = vec![0u8; n];
            let mut from = vec![0usize; n];
            let mut w0 = vec![0u64; n];
            for p in (0..n).filter(|&p| p != me) {
                // The member's lines for this call are in the half this PE's sequence names.
                from[p] = (seq[p] & 1) as usize;
                let header = || -> Option<u64> {
                    let x = mem.hdr[mem.line(me, from[p], p)].load(Ordering::Relaxed);
                    (x >> 32 == flag[p]).then_some(x & 0xffff_ffff)
                };
                let v = loop {
                    if let Some(v) = header() {
                        break Some(v);
                    }
                    let s = mem.slots[me * n + p].load(Ordering::Acquire);
                    if s != 0 {
                        w0[p] = s;
                        break header();
                    }
                    loom::thread::yield_now();
                };
                kind[p] = match v {
                    Some(v) if v == mine & 0xffff_ffff => 0,
                    Some(_) => 1,
                    None => 2,
                };
                if pull && kind[p] == 0 {
                    // The verdict warp's fence after the header it saw.
                    fence(Ordering::AcqRel);
                }
                let want = if sigs[p] & LL_BIT == 0 {
                    2
                } else {
                    u8::from(sigs[p] != mine)
                };
                assert_eq!(kind[p], want, "call {c}: PE {me}'s verdict on {p}");
            }
            let ok = kind.iter().all(|&k| k == 0);
            assert_eq!(ok, agreed, "call {c}: PE {me}'s verdict");
            if ok && pull {
                // Every member's share, read from its src (loom flags a read not ordered after
                // the member's write of it, or before its next call's overwrite).
                for p in (0..n).filter(|&p| p != me) {
                    assert_eq!(mem.src.get(p), tag(p), "call {c}: PE {me}'s pull from {p}");
                }
                // The reads are complete before "done" (only local stores pending).
                fence(Ordering::AcqRel);
                for p in (0..n).filter(|&p| p != me) {
                    let h = (seq[p] & 1) as usize;
                    mem.data[mem.line(p, h, me)].store(flag[p] << 32 | DONE, Ordering::Relaxed);
                }
                for p in (0..n).filter(|&p| p != me) {
                    let d = &mem.data[mem.line(me, from[p], p)];
                    spin(|| d.load(Ordering::Relaxed) >> 32 == flag[p]);
                    let v = d.load(Ordering::Acquire) & 0xffff_ffff;
                    assert_eq!(v, DONE, "call {c}: PE {me}'s done line from {p}");
                }
            } else if ok {
                for p in (0..n).filter(|&p| p != me) {
                    let d = &mem.data[mem.line(me, from[p], p)];
                    spin(|| d.load(Ordering::Relaxed) >> 32 == flag[p]);
                    let v = d.load(Ordering::Relaxed) & 0xffff_ffff;
                    assert_eq!(v, tag(p), "call {c}: PE {me}'s line from {p}");
                }
            }
            let barrier_based = |p: &usize| *p != me && kind[*p] == 2;
            let syncs = (0..n)
                .filter(barrier_based)
                .map(|p| sig_syncs(w0[p]))
                .fold(0, u64::max);
            for p in (0..n).filter(barrier_based) {
                mem.slots[me * n + p].store(0, Ordering::Relaxed);
            }
            for p in (0..n).filter(|&p| p != me) {
                if kind[p] == 2 {
                    bar.exp[p] += syncs;
                    mem.bar.at(p, 0, me).fetch_add(syncs, Ordering::Release);
                } else {
                    seq[p] += 1;
                }
            }
        }
        // Stream order: this call's writes come before the next call's.
        fence(Ordering::Release);
    }
    bar.exp
}

/// The payload of a pull call's "done" line (tags are small call/PE numbers).
pub(super) const DONE: u64 = 0xdead;

/// Runs the LL model for `calls` on `n` PEs and checks that the counters and expectations
/// end in step: per pair, the sum over the calls of the most barriers a barrier-based member
/// runs, except calls in which both ran LL (no barrier between them).
pub(super) fn ll_model(n: usize, calls: Vec<Vec<u64>>, preemptions: usize) {
    let calls = std::sync::Arc::new(calls);
    builder(preemptions).check(move || {
        let mem = Arc::new(LlMem {
            n,
            bar: BarMem::new(n, 1),
            slots: words(n * n),
            hdr: words(n * 2 * n),
            data: words(n * 2 * n),
            src: Cells::new(n),
        });
        let hs: Vec<_> = (0..n)
            .map(|me| {
                let (mem, calls) = (mem.clone(), calls.clone());
                loom::thread::spawn(move || ll_pe(me, &mem, &calls))
            })
            .collect();
        let exps: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let is_ll = |s: u64| s & LL_BIT != 0;
        for (p, e) in exps.iter().enumerate() {
            for (q, &x) in e.iter().enumerate() {
                let total: u64 = calls
                    .iter()
                    .filter(|sigs| !(is_ll(sigs[p]) && is_ll(sigs[q])))
                    .map(|sigs| {
                        let b = sigs.iter().filter(|&&s| !is_ll(s));
                        b.map(|&s| sig_syncs(s)).max().unwrap_or(0)
                    })
                    .sum();
                assert_eq!(x, total, "PE {p}'s expectation for {q}");
                let want = if p == q { 0 } else { total };
                let ctr = mem.bar.at(p, 0, q).load(Ordering::Relaxed);
                assert_eq!(ctr, want, "PE {p}'s counter for {q}");
            }
        }
    });
}

/// LL model, 2 PEs: LL calls back to back (the halves alternate: a fast PE's next call must
/// not overwrite lines its peer has yet to read), an LL call against a barrier-based one of
/// 3 barriers (both report the mismatch, the LL side pads), an LL count mismatch, then LL
/// and barrier-based calls in step again.
#[test]
pub(super) fn loom_ll_all_reduce_two_pes() {
    let (ll, ll_b, b2, b3) = (ll_sig(1), ll_sig(2), sig(5, 2), sig(3, 3));
    ll_model(2, vec![vec![ll, ll]; 3], 1);
    ll_model(2, vec![vec![ll, b3], vec![ll, ll], vec![b2, b2]], 1);
    ll_model(2, vec![vec![b3, ll], vec![ll, ll], vec![ll, ll]], 1);
    ll_model(
        2,
        vec![vec![ll, ll_b], vec![ll, ll], vec![b2, b2], vec![ll, ll]],
        1,
    );
    ll_model(2, vec![vec![ll, ll], vec![b2, ll], vec![ll, ll]], 1);
}

/// LL model, 3 PEs without preemptions: PE 2 alone runs a barrier-based call of 3 barriers
/// while the others run LL (both LL PEs pad to 3), then all LL; then PE 0 alone runs LL
/// beside barrier-based calls of 3 and 2 barriers (PE 0 pads both to 3, as PE 2 does).
#[test]
pub(super) fn loom_ll_all_reduce_three_pes() {
    ll_model(
        3,
        vec![vec![ll_sig(1), ll_sig(1), sig(3, 3)], vec![ll_sig(1); 3]],
        0,
    );
    ll_model(
        3,
        vec![vec![ll_sig(1), sig(3, 3), sig(5, 2)], vec![ll_sig(1); 3]],
        0,
    );
}

/// Pull model, 2 PEs: pull calls back to back (a PE's next call overwrites its src only after
/// its peer read it: the done lines), a pull call against an LL one (header mismatch: nothing
/// read, nothing waited for) and against a barrier-based one of 3 barriers (padding), LL and
/// pull calls in turn.
#[test]
pub(super) fn loom_pull_all_to_all_two_pes() {
    let (pl, ll, b2, b3) = (pull_sig(4), ll_sig(4), sig(5, 2), sig(3, 3));
    ll_model(2, vec![vec![pl, pl]; 3], 1);
    ll_model(2, vec![vec![pl, ll], vec![pl, pl], vec![ll, ll]], 1);
    ll_model(2, vec![vec![b3, pl], vec![pl, pl], vec![b2, b2]], 1);
    ll_model(
        2,
        vec![vec![ll, ll], vec![pl, pl], vec![ll, ll], vec![pl, pl]],
        1,
    );
}

/// Pull model, 3 PEs without preemptions: pull calls back to back, then PE 1 in a
/// barrier-based call beside two pulls, then pulls again.
#[test]
pub(super) fn loom_pull_all_to_all_three_pes() {
    let pl = pull_sig(4);
    ll_model(3, vec![vec![pl; 3]; 2], 0);
    ll_model(3, vec![vec![pl, sig(3, 3), pl], vec![pl; 3]], 0);
}
