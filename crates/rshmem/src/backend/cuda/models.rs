//! Loom models of the CUDA kernels' cross-PE protocols (no GPU needed):
//! `RUSTFLAGS="--cfg loom" cargo test -p rshmem --release --lib loom_ -- --test-threads 1`.
//!
//! Each PE's kernel sequence on its stream is one loom thread, step by step as the kernels do
//! it; device memory words are loom atomics with the orderings of the PTX (`red.add.release`
//! → `fetch_add(Release)`, `st.release` → `store(Release)`, `ld.acquire` → `load(Acquire)`,
//! volatile and `atomicOr_system` → `Relaxed`, `fence.sc.sys` → `fence(SeqCst)`,
//! `fence.acq_rel.sys` → `fence(AcqRel)`); data written with plain stores (rows, signature
//! slots) are loom `UnsafeCell`s, so loom flags every read or overwrite not ordered after the
//! write by the protocol (besides the value checks, which name the call a word came from).
//!
//! Abstractions, common to the models: a block is one thread (the kernels' block-wide loops
//! run in sequence; `__syncthreads` and the tid-0 fences become program order); the kernel
//! boundaries of one stream are program order (nothing stronger is assumed); a PE's memory
//! that only it touches (barrier expectations, `ctl` words other than the error word, skip
//! flags, the device failure flag) is thread-local state; a 6-word signature or a multi-word
//! record is one word (the words are written together before one release and read after one
//! acquire, so they behave as one). Each model's own abstractions are in its doc comment.
//! Device waits spin with `yield_now` (a hang shows up as loom's branch limit). The signature
//! slots and the rows are volatile or plain stores in the kernels; as `UnsafeCell`s the model
//! is stricter (any unordered access fails, not only one that reads a wrong value).
//!
//! Exploration is bounded by loom's preemption bound, set per model so that all of them run in
//! well under a minute on two cores (switches where a thread waits are never bounded); a
//! deeper run: `LOOM_MAX_PREEMPTIONS=2` (every model; the 3-PE ones then take hours).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;

/// Words written with plain (weak) stores: loom checks that every access is ordered.
struct Cells(Vec<UnsafeCell<u64>>);
// SAFETY: every access goes through loom's UnsafeCell checks; the protocols under test are
// what orders them, and loom fails the model when they do not.
unsafe impl Sync for Cells {}
// SAFETY: as above.
unsafe impl Send for Cells {}

impl Cells {
    fn new(n: usize) -> Cells {
        Cells((0..n).map(|_| UnsafeCell::new(0)).collect())
    }
    fn put(&self, i: usize, v: u64) {
        // SAFETY: loom checks this write against every other access of the word.
        self.0[i].with_mut(|p| unsafe { *p = v });
    }
    fn get(&self, i: usize) -> u64 {
        // SAFETY: loom checks this read against every write of the word.
        self.0[i].with(|p| unsafe { *p })
    }
}

fn words(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// A device wait (`rshmemi_wait64` without timeout): polls until `ready`.
fn spin(ready: impl Fn() -> bool) {
    while !ready() {
        loom::thread::yield_now();
    }
}

fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.max_branches = 100_000;
    b
}

// ----- 1. the device team barrier -----

/// A team as kernels see it (`rshmem_team`): strided world PEs and a barrier slot.
#[derive(Clone, Copy)]
struct Team {
    slot: usize,
    start: usize,
    stride: usize,
    size: usize,
}

impl Team {
    fn member(&self, i: usize) -> usize {
        self.start + i * self.stride
    }
    fn has(&self, pe: usize) -> bool {
        (0..self.size).any(|i| self.member(i) == pe)
    }
}

/// Every PE's barrier counters (`sync_bar`): PE `p`, slot `s`, member `q` at `(p*slots+s)*n+q`.
struct BarMem {
    n: usize,
    slots: usize,
    ctr: Vec<AtomicU64>,
}

impl BarMem {
    fn new(n: usize, slots: usize) -> BarMem {
        BarMem {
            n,
            slots,
            ctr: words(n * slots * n),
        }
    }
    fn at(&self, pe: usize, slot: usize, member: usize) -> &AtomicU64 {
        &self.ctr[(pe * self.slots + slot) * self.n + member]
    }
}

/// One PE's side of `rshmem_team_sync_block`: its expectations (`sync_exp`, its own memory).
struct BarPe {
    me: usize,
    exp: Vec<u64>,
}

impl BarPe {
    fn new(me: usize, mem: &BarMem) -> BarPe {
        BarPe {
            me,
            exp: vec![0; mem.slots * mem.n],
        }
    }

    /// `rshmem_team_sync_block(team)`, validity checks passed: `fence.sc.sys` (tid 0), then
    /// `red.add.release` of 1 into every member's counter for this PE, then for every member
    /// the expectation `+1` (own memory) and an acquire-polling wait on this PE's counter for
    /// that member. This PE's own counter (its add and its wait, always satisfied at once) is
    /// left out: it only orders the thread with itself.
    fn sync(&mut self, mem: &BarMem, t: &Team) {
        fence(Ordering::SeqCst);
        for i in 0..t.size {
            let pe = t.member(i);
            if pe != self.me {
                mem.at(pe, t.slot, self.me).fetch_add(1, Ordering::Release);
            }
        }
        for i in 0..t.size {
            let pe = t.member(i);
            let x = &mut self.exp[t.slot * mem.n + pe];
            *x += 1;
            let e = *x;
            if pe != self.me {
                let c = mem.at(self.me, t.slot, pe);
                spin(|| c.load(Ordering::Acquire) >= e);
            }
        }
    }
}

/// Barrier model, 2 PEs on the world slot: data written before a barrier is read after it
/// (loom flags the read if the barrier let the reader pass before the writer arrived), and
/// overwritten after the next barrier (flags a PE passing barrier 2 while its peer still reads
/// before it); then once more, so a fast PE's arrivals for barrier `k+1` meet a slow one
/// still waiting in `k`.
#[test]
fn loom_device_barrier_two_pes() {
    builder(3).check(|| {
        let mem = Arc::new(BarMem::new(2, 1));
        let a = Arc::new(Cells::new(2));
        let world = Team {
            slot: 0,
            start: 0,
            stride: 1,
            size: 2,
        };
        let hs: Vec<_> = (0..2)
            .map(|me| {
                let (mem, a) = (mem.clone(), a.clone());
                loom::thread::spawn(move || {
                    let mut b = BarPe::new(me, &mem);
                    let other = 1 - me;
                    a.put(me, 1);
                    b.sync(&mem, &world);
                    assert_eq!(a.get(other), 1);
                    b.sync(&mem, &world);
                    a.put(me, 2);
                    b.sync(&mem, &world);
                    assert_eq!(a.get(other), 2);
                    b.exp
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), vec![3, 3]);
        }
    });
}

/// Barrier model, 3 PEs: the world (slot 0) and a strided team {0, 2} (slot 1) whose barriers
/// fall between the world's on its members while PE 1 runs ahead into the next world barrier.
/// The same read-after / overwrite-after checks for both teams, and every counter ends at the
/// number of barriers done. Without preemptions (threads switch where they wait): 3 spinning
/// threads with one preemption take minutes.
#[test]
fn loom_device_barrier_three_pes_two_slots() {
    builder(0).check(|| {
        let mem = Arc::new(BarMem::new(3, 2));
        let a = Arc::new(Cells::new(3));
        let b = Arc::new(Cells::new(3));
        let world = Team {
            slot: 0,
            start: 0,
            stride: 1,
            size: 3,
        };
        let sub = Team {
            slot: 1,
            start: 0,
            stride: 2,
            size: 2,
        };
        let hs: Vec<_> = (0..3)
            .map(|me| {
                let (mem, a, b) = (mem.clone(), a.clone(), b.clone());
                loom::thread::spawn(move || {
                    let mut bar = BarPe::new(me, &mem);
                    a.put(me, 1);
                    bar.sync(&mem, &world);
                    for p in (0..3).filter(|&p| p != me) {
                        assert_eq!(a.get(p), 1);
                    }
                    if sub.has(me) {
                        b.put(me, 1);
                        bar.sync(&mem, &sub);
                        assert_eq!(b.get(2 - me), 1);
                    }
                    bar.sync(&mem, &world);
                    a.put(me, 2);
                    if sub.has(me) {
                        bar.sync(&mem, &sub);
                        b.put(me, 2);
                    }
                    bar.exp
                })
            })
            .collect();
        let exps: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for (p, e) in exps.iter().enumerate() {
            for q in 0..3 {
                assert_eq!(e[q], 2, "world expectations");
                let own = |v: u64| if p == q { 0 } else { v };
                assert_eq!(mem.at(p, 0, q).load(Ordering::Relaxed), own(2));
                let s = if sub.has(p) && sub.has(q) { 2 } else { 0 };
                assert_eq!(e[3 + q], s, "team expectations");
                assert_eq!(mem.at(p, 1, q).load(Ordering::Relaxed), own(s));
            }
        }
    });
}

// ----- 2. the collectives' cross-PE signature check -----

/// A packed signature word as `rshmemi_sig` word 0 is: bit 63 set, the barrier count in bits
/// 32..47, and (standing for the other five words) a kind in the low bits.
fn sig(kind: u64, syncs: u64) -> u64 {
    1 << 63 | syncs << 32 | kind
}
fn sig_syncs(w: u64) -> u64 {
    (w >> 32) & 0xffff
}

/// One PE's part of a sequence of collectives on one team, mirroring `rshmemi_sig_sync` and
/// `GpuColl::exec`: per call, the user writes its input (`src`, before the call on its
/// stream); the signature goes into every member's slot for this PE, barrier, every slot of
/// this PE is compared with its own signature (max of the barrier counts), the slots are
/// cleared, a mismatch pads the barrier count to the maximum; then the plan's data phases (a
/// one-shot gather: every member's input of this call, read unless the call is skipped) each
/// followed by one of the plan's remaining barriers. `calls[c][pe]` is PE `pe`'s signature of
/// call `c`. Returns the expectations at the end.
fn sig_pe(
    me: usize,
    mem: &BarMem,
    slots: &Cells,
    src: &Cells,
    calls: &[Vec<u64>],
    team: &Team,
) -> Vec<u64> {
    let n = team.size;
    let mut bar = BarPe::new(me, mem);
    for (c, sigs) in calls.iter().enumerate() {
        let tag = |p: usize| (c * 8 + p) as u64 + 1;
        let mine = sigs[me];
        let agreed = sigs.iter().all(|&s| s == mine);
        src.put(me, tag(me));
        // rshmemi_sig_sync: slot row of member i in PE i's memory, word me.
        for i in 0..n {
            slots.put(team.member(i) * n + me, mine);
        }
        bar.sync(mem, team);
        let mut ok = true;
        let mut max_syncs = 0;
        for i in 0..n {
            let s = slots.get(me * n + team.member(i));
            assert_eq!(s, sigs[team.member(i)], "call {c}: slot of member {i}");
            ok &= s == mine;
            max_syncs = max_syncs.max(sig_syncs(s));
        }
        let skip = !ok;
        assert_eq!(ok, agreed, "call {c}: verdict");
        for i in 0..n {
            slots.put(me * n + team.member(i), 0);
        }
        if !ok {
            for _ in sig_syncs(mine)..max_syncs {
                bar.sync(mem, team);
            }
        }
        // The plan's remaining barriers, a data phase (skipped on a mismatch) before each.
        for _ in 1..sig_syncs(mine) {
            if !skip {
                for i in 0..n {
                    let p = team.member(i);
                    assert_eq!(src.get(p), tag(p), "call {c}: input of member {i}");
                }
            }
            bar.sync(mem, team);
        }
    }
    bar.exp
}

/// Runs the signature model for `calls` over the world of `n` PEs and checks that every
/// counter and expectation ends at the same count (nobody hangs in a later barrier).
fn sig_model(n: usize, calls: Vec<Vec<u64>>, preemptions: usize) {
    let calls = std::sync::Arc::new(calls);
    builder(preemptions).check(move || {
        let mem = Arc::new(BarMem::new(n, 1));
        let slots = Arc::new(Cells::new(n * n));
        let src = Arc::new(Cells::new(n));
        let world = Team {
            slot: 0,
            start: 0,
            stride: 1,
            size: n,
        };
        let hs: Vec<_> = (0..n)
            .map(|me| {
                let (mem, slots, src, calls) =
                    (mem.clone(), slots.clone(), src.clone(), calls.clone());
                loom::thread::spawn(move || sig_pe(me, &mem, &slots, &src, &calls, &world))
            })
            .collect();
        let exps: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_in_step(&exps, &mem, &calls);
    });
}

/// Every PE's expectations and counters for every other PE end at the sum over the calls of
/// their largest barrier count (nobody hangs in a later barrier).
fn assert_in_step(exps: &[Vec<u64>], mem: &BarMem, calls: &[Vec<u64>]) {
    let total: u64 = calls
        .iter()
        .map(|sigs| sigs.iter().map(|&s| sig_syncs(s)).max().unwrap_or(0))
        .sum();
    for (p, e) in exps.iter().enumerate() {
        for (q, &x) in e.iter().enumerate() {
            assert_eq!(x, total, "PE {p}'s expectation for {q}");
            let want = if p == q { 0 } else { total };
            assert_eq!(mem.at(p, 0, q).load(Ordering::Relaxed), want);
        }
    }
}

/// Signature model, 2 PEs, 3 calls: a matching one-shot call (2 barriers), a mismatch in both
/// kind and barrier count (2 against 3: PE 0 pads one barrier), a matching two-shot call (3).
/// Checks: both PEs take the verdict the signatures call for, every slot read holds the
/// signature of the same call (loom flags a next call's write racing with a read or clear),
/// a mismatch reads no input, and both PEs end with the same barrier counts. Without
/// preemptions (switches at waits only) for the three calls; with one for each pair of
/// consecutive calls.
#[test]
fn loom_coll_signature_two_pes() {
    let (m2, mm, m3) = (
        vec![sig(1, 2), sig(1, 2)],
        vec![sig(1, 2), sig(2, 3)],
        vec![sig(3, 3), sig(3, 3)],
    );
    sig_model(2, vec![m2.clone(), mm.clone(), m3.clone()], 0);
    sig_model(2, vec![m2, mm.clone()], 1);
    sig_model(2, vec![mm, m3], 1);
}

/// Signature model, 3 PEs, without preemptions (3 spinning threads are expensive to explore):
/// PE 2 alone passes a different call with more barriers (PEs 0 and 1 pad); PE 1 alone passes
/// a different call with as many barriers, then a matching call reuses the slots.
#[test]
fn loom_coll_signature_three_pes() {
    sig_model(3, vec![vec![sig(1, 2), sig(1, 2), sig(2, 3)]], 0);
    sig_model(
        3,
        vec![vec![sig(1, 2), sig(2, 2), sig(1, 2)], vec![sig(1, 2); 3]],
        0,
    );
}

// ----- 2b. the LL all_reduce beside barrier-based calls -----

/// The LL bit of a signature (`CallSig::ll`, word 0 bit 27).
const LL_BIT: u64 = 1 << 27;

/// A signature of an LL call (its barrier count, 2, is only compared: an LL call runs none).
fn ll_sig(kind: u64) -> u64 {
    sig(kind, 2) | LL_BIT
}

/// The pull bit of a signature (`CallSig::pull`, word 0 bit 28).
const PULL_BIT: u64 = 1 << 28;

/// A signature of a pull all_to_all (an LL call whose data are read from the senders' src).
fn pull_sig(kind: u64) -> u64 {
    ll_sig(kind) | PULL_BIT
}

/// Device memory of the LL model: barrier counters, signature slots (volatile words: atomics
/// here, the kernels poll them), and per receiver, half and source one header line and one
/// data line (`flag << 32 | payload`, each 8-byte half of a 16-byte line being one access).
struct LlMem {
    n: usize,
    bar: BarMem,
    slots: Vec<AtomicU64>,
    hdr: Vec<AtomicU64>,
    data: Vec<AtomicU64>,
    /// Inputs read by barrier-based calls' gathers (plain: loom checks the ordering).
    src: Cells,
}

impl LlMem {
    fn line(&self, r: usize, half: usize, s: usize) -> usize {
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
fn ll_pe(me: usize, mem: &LlMem, calls: &[Vec<u64>]) -> Vec<u64> {
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
const DONE: u64 = 0xdead;

/// Runs the LL model for `calls` on `n` PEs and checks that the counters and expectations
/// end in step: per pair, the sum over the calls of the most barriers a barrier-based member
/// runs, except calls in which both ran LL (no barrier between them).
fn ll_model(n: usize, calls: Vec<Vec<u64>>, preemptions: usize) {
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
fn loom_ll_all_reduce_two_pes() {
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
fn loom_ll_all_reduce_three_pes() {
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
fn loom_pull_all_to_all_two_pes() {
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
fn loom_pull_all_to_all_three_pes() {
    let pl = pull_sig(4);
    ll_model(3, vec![vec![pl; 3]; 2], 0);
    ll_model(3, vec![vec![pl, sig(3, 3), pl], vec![pl; 3]], 0);
}

// ----- 2c. the chain broadcast's step counts -----

/// Device memory of the chain model: per PE its `dst` parts (plain stores), the root's `src`
/// parts, and LL lines (`flag << 32 | payload`, one access each): headers, the chain's step
/// counts and the done lines, per receiver, half and source.
struct ChainMem {
    n: usize,
    src: Cells,
    dst: Cells,
    hdr: Vec<AtomicU64>,
    count: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
}

impl ChainMem {
    fn line(&self, r: usize, half: usize, s: usize) -> usize {
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
fn chain_pe(me: usize, mem: &ChainMem, calls: usize, steps: usize) {
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
fn chain_model(calls: usize, steps: usize) {
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
fn loom_chain_broadcast_three_pes() {
    chain_model(1, 2);
    chain_model(2, 1);
}

// ----- 3. EP dispatch/combine: reusing the areas, and aborts -----

/// One step of an EP sequence (every PE runs the same list, as the contract asks).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum EpOp {
    /// `ep_layout` → `ep_send` → `ep_dwait` → `ep_permute` (a token-major buffer: the rows
    /// and row records read after the data wait).
    Dispatch,
    /// The same for an expert-major buffer: `ep_pstream` beside `ep_dwait` takes each
    /// source's row records once its "records in" word is set, then each row as it announces
    /// itself (polled until it is not the sentinel), and stores the sentinel back. Without the
    /// words' zeroing in `ep_layout`, `loom_ep_dispatch_sentinel` fails (an earlier dispatch's
    /// word taken for this one's); without `ep_pstream`'s store back, a row of an earlier
    /// dispatch is taken for this one's.
    EmDispatch,
    /// `ep_csend` → `ep_cwait` → `ep_crecv` (on the latest dispatch's layout).
    Combine,
    /// `combine_tokens`: the caller's expert kernel writes this PE's `y`, then `ep_cready` →
    /// `ep_cpull` → `ep_cdone` → `ep_ccopy` (the sums through the temporary rows, as where
    /// `out` overlaps `y`).
    PullCombine,
    /// `ep_csplit` → `ep_cwait`: the senders put the peers' rows without publishing anything;
    /// the summers poll each peer row of this PE's tokens until it is not the sentinel, then
    /// store the sentinel back. A run with this op models a split buffer: every combine kind
    /// then reads and writes the combine area as words (`EpMem::scomb`, relaxed: the summers'
    /// volatile polls race the senders' stores by design) and `ep_crecv` and `ep_ccopy` store
    /// the sentinel back into what they read.
    SplitCombine,
}

/// The sentinel (`EP_SENTINEL`: every word all ones) of the split combine's area and of the
/// expert-major receive area.
const EP_SENTINEL: u64 = u64::MAX;

const EP_ABORT: u64 = 16;
/// Receive capacity per source (`cap`), rows.
const EP_C: usize = 2;

/// Rows PE `s` sends PE `d` in dispatch `k` (1 or 2, varying with the call).
fn ep_rows(k: usize, s: usize, d: usize) -> usize {
    1 + (k + s + d) % 2
}

/// Two PEs' EP buffers. Only words another PE writes are shared; the rest of `ctl` (epoch,
/// wait counts, go, tokens) is thread-local.
struct EpMem {
    /// Records, `rec[pe][src]`: `dispatch << 8 | rows` (volatile words: relaxed atomics).
    rec: Vec<AtomicU64>,
    /// Signals `sig[pe][src]` for records and ready (set to the epoch), data and combine
    /// (block adds).
    sig_rec: Vec<AtomicU64>,
    sig_ready: Vec<AtomicU64>,
    sig_data: Vec<AtomicU64>,
    sig_comb: Vec<AtomicU64>,
    /// The pull combine's ready and done words (set to the combine number).
    sig_cready: Vec<AtomicU64>,
    sig_cdone: Vec<AtomicU64>,
    /// `ctl[EP_CTL_ERR]` of each PE (peers `atomicOr_system` the abort bit into it).
    err: Vec<AtomicU64>,
    /// "Records in" words `prog[pe][src]` (one per source block in the kernels, one block
    /// here): `ep_send` sets them (`red.release.max`, `1 << 63 | hi << 32`) once its row
    /// records are written, before the rows; their owner zeroes them before its ready signal.
    prog: Vec<AtomicU64>,
    /// Row records `recv[pe][src][pos]` (plain stores): the dispatch number.
    recv: Cells,
    /// The rows of an expert-major receive area, laid out as `recv`: the dispatch number or
    /// the sentinel (filled at creation); relaxed words (`ep_pstream`'s volatile polls race
    /// the senders' stores by design).
    srecv: Vec<AtomicU64>,
    /// Combine rows `comb[pe][parity][src][pos]`: the combine number.
    comb: Cells,
    /// The caller's `y` rows `y[pe][src][pos]` (plain stores by its expert kernel): the combine
    /// number.
    y: Cells,
    /// A split buffer's combine area, laid out as `comb`: the combine number or the sentinel
    /// (filled at creation).
    scomb: Vec<AtomicU64>,
}

const EP_N: usize = 2;

impl EpMem {
    fn new() -> EpMem {
        EpMem {
            rec: words(EP_N * EP_N),
            sig_rec: words(EP_N * EP_N),
            sig_ready: words(EP_N * EP_N),
            sig_data: words(EP_N * EP_N),
            sig_comb: words(EP_N * EP_N),
            sig_cready: words(EP_N * EP_N),
            sig_cdone: words(EP_N * EP_N),
            err: words(EP_N),
            prog: words(EP_N * EP_N),
            recv: Cells::new(EP_N * EP_N * EP_C),
            srecv: (0..EP_N * EP_N * EP_C)
                .map(|_| AtomicU64::new(EP_SENTINEL))
                .collect(),
            comb: Cells::new(EP_N * 2 * EP_N * EP_C),
            y: Cells::new(EP_N * EP_N * EP_C),
            scomb: (0..EP_N * 2 * EP_N * EP_C)
                .map(|_| AtomicU64::new(EP_SENTINEL))
                .collect(),
        }
    }
    fn recv_at(pe: usize, src: usize, pos: usize) -> usize {
        (pe * EP_N + src) * EP_C + pos
    }
    fn comb_at(pe: usize, parity: usize, src: usize, pos: usize) -> usize {
        ((pe * 2 + parity) * EP_N + src) * EP_C + pos
    }
}

/// What one PE saw: per op, whether it used the step (go after its waits) and whether one of
/// its waits gave up there.
#[derive(Debug, Default, Clone)]
struct EpTrace {
    used: Vec<bool>,
    gave_up: Vec<bool>,
    aborted_at_end: bool,
}

/// One PE running `ops` as `ep.cu` does (self-sends left out: a PE's own rows and signals are
/// program order). `timeout`: the index (counting this PE's waits from 0) of a wait that times
/// out if its condition does not hold at its first poll (a wait can only time out while its
/// condition is false; loom explores every point at which the poll happens). `old_prep`:
/// records written as `ep_prep` once did, also after this PE gave up.
fn ep_pe(me: usize, mem: &EpMem, ops: &[EpOp], timeout: Option<usize>, old_prep: bool) -> EpTrace {
    let peers = || (0..EP_N).filter(move |&p| p != me);
    let split = ops.contains(&EpOp::SplitCombine);
    // A combine row: a plain store, or a relaxed word of a split buffer.
    let comb_put = |i: usize, v: u64| {
        if split {
            mem.scomb[i].store(v, Ordering::Relaxed);
        } else {
            mem.comb.put(i, v);
        }
    };
    // A combine row read after the signals that order it; a split buffer's reader stores the
    // sentinel back (ep_crecv, ep_ccopy).
    let comb_take = |i: usize| -> u64 {
        if split {
            let v = mem.scomb[i].load(Ordering::Relaxed);
            mem.scomb[i].store(EP_SENTINEL, Ordering::Relaxed);
            v
        } else {
            mem.comb.get(i)
        }
    };
    // cwait: every combine (ctl[CWAIT], the parity); cpush: push combines (ctl[CPUSH]).
    let (mut epoch, mut dwait, mut cwait, mut cpush) = (0u64, 0u64, 0u64, 0u64);
    let mut go = false;
    let mut failed = false; // the device error word (RSHMEM_ERR_TIMEOUT), sticky
    let mut recv_cnt = [0usize; EP_N];
    let mut waits = 0usize;
    let mut tr = EpTrace::default();
    // rshmemi_wait64: acquire polls; gives up at once after an earlier timeout.
    let mut wait = |w: &AtomicU64, v: u64, failed: &mut bool, gave: &mut bool| {
        let i = waits;
        waits += 1;
        if w.load(Ordering::Acquire) >= v {
            return;
        }
        if *failed || timeout == Some(i) {
            *failed = true;
            *gave = true;
            return;
        }
        spin(|| w.load(Ordering::Acquire) >= v);
    };
    // ep_abort_if_failed (after a wait kernel's waits and fence).
    let abort_if_failed = |failed: bool, go: &mut bool| {
        if failed || mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0 {
            mem.err[me].fetch_or(EP_ABORT, Ordering::Relaxed);
            *go = false;
        }
    };
    // ep_signal: fence.sc, the abort bit first when aborted, then red.add.release.
    let signal = |sig: &Vec<AtomicU64>, d: usize| {
        fence(Ordering::SeqCst);
        if mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0 {
            mem.err[d].fetch_or(EP_ABORT, Ordering::Relaxed);
        }
        sig[d * EP_N + me].fetch_add(1, Ordering::Release);
    };
    let mut k = 0usize; // dispatches so far (the latest one's number)
    for &op in ops {
        let mut gave = false;
        match op {
            EpOp::Dispatch | EpOp::EmDispatch => {
                let em = op == EpOp::EmDispatch;
                k += 1;
                // ep_layout: block 0 puts the abort bit first once this PE gave up, then
                // fence.sc + st.release of the epoch into every peer's ready word; the last
                // block waits for every peer's, fence, then writes the records (none once this
                // PE gave up: the abort bit goes first instead) with fence.sc + st.release of
                // the epoch. ep_send moves rows only when no PE gave up.
                epoch += 1;
                let gone = failed || mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0;
                // The "records in" words are zero again before the ready signals (the previous
                // dispatch's writers were all seen by its ep_dwait).
                for s in peers().filter(|_| em) {
                    mem.prog[me * EP_N + s].store(0, Ordering::Relaxed);
                }
                for d in peers() {
                    if gone {
                        mem.err[d].fetch_or(EP_ABORT, Ordering::Relaxed);
                    }
                    fence(Ordering::SeqCst);
                    mem.sig_ready[d * EP_N + me].store(epoch, Ordering::Release);
                }
                for s in peers() {
                    wait(&mem.sig_ready[me * EP_N + s], epoch, &mut failed, &mut gave);
                }
                fence(Ordering::AcqRel);
                let send = !(failed || mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0);
                if send || old_prep {
                    for d in peers() {
                        let r = (k as u64) << 8 | ep_rows(k, me, d) as u64;
                        mem.rec[d * EP_N + me].store(r, Ordering::Relaxed);
                    }
                }
                for d in peers() {
                    if !send {
                        mem.err[d].fetch_or(EP_ABORT, Ordering::Relaxed);
                    }
                    fence(Ordering::SeqCst);
                    mem.sig_rec[d * EP_N + me].store(epoch, Ordering::Release);
                }
                // ep_send: the row records (token-major buffers: with the rows), then
                // (expert-major) the block's "records in" word and the rows (no word, no
                // fence), then each block's data signal.
                if send {
                    for d in peers() {
                        let rows = ep_rows(k, me, d);
                        for pos in 0..rows {
                            mem.recv.put(EpMem::recv_at(d, me, pos), k as u64);
                        }
                        if em {
                            mem.prog[d * EP_N + me]
                                .fetch_max(1 << 63 | (rows as u64) << 32, Ordering::Release);
                        }
                    }
                    for d in peers().filter(|_| em) {
                        for pos in 0..ep_rows(k, me, d) {
                            mem.srecv[EpMem::recv_at(d, me, pos)]
                                .store(k as u64, Ordering::Relaxed);
                        }
                    }
                }
                for d in peers() {
                    signal(&mem.sig_data, d);
                }
                // ep_dwait: every peer's record, fence, the decision; then every peer's blocks'
                // rows, fence, stop if a wait gave up or an abort arrived.
                dwait += 1;
                for s in peers() {
                    wait(&mem.sig_rec[me * EP_N + s], epoch, &mut failed, &mut gave);
                }
                fence(Ordering::AcqRel);
                let mut recs = [0u64; EP_N];
                for s in peers() {
                    recs[s] = mem.rec[me * EP_N + s].load(Ordering::Relaxed);
                }
                let abort = failed || mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0;
                if abort {
                    go = false;
                    mem.err[me].fetch_or(EP_ABORT, Ordering::Relaxed);
                } else {
                    // The layout (counts the host reads in normal mode) from every record.
                    go = true;
                    for s in peers() {
                        recv_cnt[s] = (recs[s] & 0xff) as usize;
                        assert_eq!(
                            recs[s] >> 8,
                            k as u64,
                            "PE {me} dispatch {k}: decided from a record of another dispatch of {s}"
                        );
                    }
                }
                // ep_pstream (expert-major; beside ep_dwait's data wait, one of the
                // interleavings): a source's row records once its "records in" word is set,
                // then each row polled
                // until it is not the sentinel, taken, and the sentinel stored back. Its waits
                // are not counted among the ones a model run times out (the data wait after
                // them keeps its index); after an earlier timeout they give up at once.
                if go && em {
                    'rows: for s in peers() {
                        let w = &mem.prog[me * EP_N + s];
                        if w.load(Ordering::Acquire) < 1 << 63 {
                            if failed {
                                gave = true;
                                break 'rows;
                            }
                            spin(|| w.load(Ordering::Acquire) >= 1 << 63);
                        }
                        let hi = (w.load(Ordering::Relaxed) >> 32) & 0x7fff_ffff;
                        assert_eq!(hi, recv_cnt[s] as u64, "PE {me} dispatch {k}: rows of {s}");
                        for pos in 0..recv_cnt[s] {
                            let v = mem.recv.get(EpMem::recv_at(me, s, pos));
                            assert_eq!(
                                v, k as u64,
                                "PE {me} dispatch {k}: row record of {s} at {pos}"
                            );
                            let row = &mem.srecv[EpMem::recv_at(me, s, pos)];
                            spin(|| row.load(Ordering::Relaxed) != EP_SENTINEL);
                            let v = row.load(Ordering::Relaxed);
                            assert_eq!(v, k as u64, "PE {me} dispatch {k}: row of {s} at {pos}");
                            row.store(EP_SENTINEL, Ordering::Relaxed);
                        }
                    }
                    abort_if_failed(failed, &mut go);
                }
                for s in peers() {
                    wait(&mem.sig_data[me * EP_N + s], dwait, &mut failed, &mut gave);
                }
                fence(Ordering::AcqRel);
                abort_if_failed(failed, &mut go);
                // After the data wait (ep_permute, or what combine reads again): the row
                // records (token-major: the rows).
                if go {
                    for s in peers() {
                        assert_eq!(recv_cnt[s], ep_rows(k, s, me), "PE {me} dispatch {k}");
                        for pos in 0..recv_cnt[s] {
                            let v = mem.recv.get(EpMem::recv_at(me, s, pos));
                            assert_eq!(v, k as u64, "PE {me} dispatch {k}: row of {s} at {pos}");
                        }
                    }
                }
            }
            EpOp::Combine | EpOp::SplitCombine => {
                // ep_csend (ep_csplit's senders alike): one row per received token back into the
                // source's combine area of this combine's parity (it reads the row records of the
                // dispatch again).
                let c = cwait + 1;
                if go {
                    let parity = (cwait & 1) as usize;
                    for s in peers() {
                        for i in 0..recv_cnt[s] {
                            let v = mem.recv.get(EpMem::recv_at(me, s, i));
                            assert_eq!(v, k as u64, "PE {me} combine {c}: row record of {s}");
                            comb_put(EpMem::comb_at(s, parity, me, i), c);
                        }
                    }
                    // ep_csplit's summers: each peer row of this PE's tokens, polled until it is
                    // not the sentinel, then the sentinel back (no progress word, no fence).
                    for d in peers().filter(|_| op == EpOp::SplitCombine) {
                        for pos in 0..ep_rows(k, me, d) {
                            let w = &mem.scomb[EpMem::comb_at(me, parity, d, pos)];
                            spin(|| w.load(Ordering::Relaxed) != EP_SENTINEL);
                            let v = w.load(Ordering::Relaxed);
                            assert_eq!(v, c, "PE {me} split combine {c}: row of {d} at {pos}");
                            w.store(EP_SENTINEL, Ordering::Relaxed);
                        }
                    }
                }
                // Every block's combine signal (after the block's work).
                for d in peers() {
                    signal(&mem.sig_comb, d);
                }
                // ep_cwait
                cwait += 1;
                cpush += 1;
                for s in peers() {
                    wait(&mem.sig_comb[me * EP_N + s], cpush, &mut failed, &mut gave);
                }
                fence(Ordering::AcqRel);
                abort_if_failed(failed, &mut go);
                // ep_crecv: the rows every destination sent back for this PE's tokens (summed
                // inside ep_csplit already).
                if go && op == EpOp::Combine {
                    let parity = ((cwait - 1) & 1) as usize;
                    for d in peers() {
                        for pos in 0..ep_rows(k, me, d) {
                            let v = comb_take(EpMem::comb_at(me, parity, d, pos));
                            assert_eq!(v, c, "PE {me} combine {c}: row of {d} at {pos}");
                        }
                    }
                }
            }
            EpOp::PullCombine => {
                // The caller's expert kernel: every row of y (go or not).
                let c = cwait + 1;
                for s in 0..EP_N {
                    for i in 0..EP_C {
                        mem.y.put((me * EP_N + s) * EP_C + i, c);
                    }
                }
                // ep_cready: fence.sc + st.release of the number into every peer's ready word
                // (the abort bit first), wait for every peer's, fence, stop on a timeout or
                // an abort.
                cwait += 1;
                let set = |sig: &Vec<AtomicU64>, d: usize| {
                    fence(Ordering::SeqCst);
                    if mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0 {
                        mem.err[d].fetch_or(EP_ABORT, Ordering::Relaxed);
                    }
                    sig[d * EP_N + me].store(cwait, Ordering::Release);
                };
                for d in peers() {
                    set(&mem.sig_cready, d);
                }
                for s in peers() {
                    wait(
                        &mem.sig_cready[me * EP_N + s],
                        cwait,
                        &mut failed,
                        &mut gave,
                    );
                }
                fence(Ordering::AcqRel);
                abort_if_failed(failed, &mut go);
                // ep_cpull: each peer's rows for this PE's tokens, read from the peer's y; the
                // sums into the temporary half of this PE's combine area.
                let temp = ((cwait + 1) & 1) as usize;
                if go {
                    for d in peers() {
                        for pos in 0..ep_rows(k, me, d) {
                            let v = mem.y.get((d * EP_N + me) * EP_C + pos);
                            assert_eq!(v, c, "PE {me} combine {c}: y row of {d} at {pos}");
                        }
                    }
                    for s in 0..EP_N {
                        for i in 0..EP_C {
                            comb_put(EpMem::comb_at(me, temp, s, i), c);
                        }
                    }
                }
                // ep_cdone: the done words likewise, then every peer's.
                for d in peers() {
                    set(&mem.sig_cdone, d);
                }
                for s in peers() {
                    wait(&mem.sig_cdone[me * EP_N + s], cwait, &mut failed, &mut gave);
                }
                fence(Ordering::AcqRel);
                abort_if_failed(failed, &mut go);
                // ep_ccopy: the temporary rows into out (this PE's memory only).
                if go {
                    for s in 0..EP_N {
                        for i in 0..EP_C {
                            assert_eq!(comb_take(EpMem::comb_at(me, temp, s, i)), c);
                        }
                    }
                }
            }
        }
        tr.used.push(go);
        tr.gave_up.push(gave);
    }
    tr.aborted_at_end = mem.err[me].load(Ordering::Relaxed) & EP_ABORT != 0;
    tr
}

/// Runs the EP model: both PEs run `ops`; `timeout` makes wait `.1` of PE `.0` time out.
fn ep_model(ops: Vec<EpOp>, timeout: Option<(usize, usize)>, old_prep: bool, preemptions: usize) {
    let ops = std::sync::Arc::new(ops);
    builder(preemptions).check(move || {
        let mem = Arc::new(EpMem::new());
        let hs: Vec<_> = (0..EP_N)
            .map(|me| {
                let (mem, ops) = (mem.clone(), ops.clone());
                let t = timeout.and_then(|(p, w)| (p == me).then_some(w));
                loom::thread::spawn(move || ep_pe(me, &mem, &ops, t, old_prep))
            })
            .collect();
        let trs: Vec<EpTrace> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        match timeout {
            None => {
                for t in &trs {
                    assert!(
                        t.used.iter().all(|&u| u),
                        "no timeout: every step moves data"
                    );
                }
            }
            Some((p, _)) => {
                for (q, t) in trs.iter().enumerate() {
                    // After a PE's first give-up, it uses nothing.
                    if let Some(first) = t.gave_up.iter().position(|&g| g) {
                        assert!(
                            t.used[first..].iter().all(|&u| !u),
                            "PE {q} used a step after giving up: {t:?}"
                        );
                    }
                    // The abort reaches every PE when a step follows the one given up on.
                    if let Some(first) = trs[p].gave_up.iter().position(|&g| g) {
                        if first + 2 < ops.len() {
                            assert!(t.aborted_at_end, "PE {q} never aborted: {trs:?}");
                        }
                    }
                }
            }
        }
    });
}

/// EP model without timeouts, 2 PEs, 3 dispatch+combine pairs with 1-2 rows per pair and
/// call: every row, row record and record a PE reads is of its current dispatch (combine
/// rows: of its current combine), and nothing is overwritten while a peer may still read it
/// (loom flags the write). Abstracted: one block per grid kernel (the data signals count one
/// add per block), a record is one word, statuses are all valid.
#[test]
fn loom_ep_reuse_three_calls() {
    use EpOp::*;
    ep_model(
        vec![Dispatch, Combine, Dispatch, Combine, Dispatch, Combine],
        None,
        false,
        2,
    );
}

/// EP model, 2 PEs: two combines of one dispatch (allowed: the handle stays the latest
/// dispatch), then a dispatch and a combine. The second combine writes the other half of the
/// combine area while a peer may still read the first combine's rows (the parity double
/// buffer is what makes this safe; with one half loom flags the overwrite).
#[test]
fn loom_ep_reuse_repeated_combine() {
    use EpOp::*;
    ep_model(
        vec![Dispatch, Combine, Combine, Dispatch, Combine],
        None,
        false,
        1,
    );
}

/// EP model, 2 PEs: two dispatches back to back, then a combine. Nothing but `ep_layout`'s
/// ready handshake keeps a fast PE's rows of dispatch 2 from landing in a peer still permuting
/// dispatch 1's (a combine in between would also order them; without the handshake loom flags
/// the overwrite here).
#[test]
fn loom_ep_reuse_back_to_back_dispatches() {
    use EpOp::*;
    ep_model(vec![Dispatch, Dispatch, Combine], None, false, 2);
}

/// EP model with timeouts, 2 PEs, 2 dispatch+combine pairs: for every wait of either PE in the
/// first pair, a run where that wait times out (when its condition does not hold at its first
/// poll). Checks: a PE that gave up uses nothing after it; every row, record or combine row
/// that any PE still uses is complete and of its own call (value checks) and never
/// overwritten while it may be read (loom); the abort reaches the other PE by the end.
#[test]
fn loom_ep_abort_propagation() {
    use EpOp::*;
    let ops = vec![Dispatch, Combine, Dispatch, Combine];
    // Waits per PE and pair with 2 PEs: ep_layout 1, ep_dwait 2 (records, rows), ep_cwait 1.
    for pe in 0..EP_N {
        for w in 0..4 {
            ep_model(ops.clone(), Some((pe, w)), false, 1);
        }
    }
}

/// EP model, 2 PEs: pull combines (`combine_tokens`) among push combines and dispatches.
/// Checks that every y row a peer reads is of its current combine and that no PE's expert
/// kernel overwrites y while a peer may still read it (the done handshake); that the
/// temporary rows (one half of the combine area) never meet a peer's push into the other
/// half; and that the push combines' counts stay in step across pull combines.
#[test]
fn loom_ep_pull_combine_reuse() {
    use EpOp::*;
    ep_model(
        vec![
            Dispatch,
            PullCombine,
            Combine,
            PullCombine,
            Dispatch,
            PullCombine,
        ],
        None,
        false,
        1,
    );
    ep_model(
        vec![Dispatch, Combine, PullCombine, PullCombine, Combine],
        None,
        false,
        1,
    );
}

/// EP model, 2 PEs, a split buffer: split combines after a push combine, after a pull combine
/// and after split combines (each reaching a half of the combine area an earlier combine of
/// another kind used). Checks that a summer only ever takes a row of its own combine (never a
/// row an earlier combine left, never the sentinel) and that no sentinel stored back lands on
/// a later combine's row (a summer would then wait forever: loom reports the hang). Without
/// the summers' stores back, or `ep_crecv`'s or `ep_ccopy`'s, the value check fails (an
/// earlier combine's row).
#[test]
fn loom_ep_split_combine_sentinel() {
    use EpOp::*;
    for ops in [
        vec![Dispatch, SplitCombine, SplitCombine, SplitCombine],
        vec![Dispatch, Combine, SplitCombine, SplitCombine],
        vec![Dispatch, PullCombine, SplitCombine, SplitCombine],
    ] {
        ep_model(ops, None, false, 1);
    }
}

/// EP model, 2 PEs, expert-major dispatches (the receive area's sentinel): back to back, around
/// a combine, and with a timeout of PE 0's data wait in the first. Checks that `ep_pstream`
/// takes only rows and row records of its own dispatch (never a row an earlier dispatch left,
/// never the sentinel) and that no sentinel stored back lands on a later dispatch's row (a
/// reader would then wait forever: loom reports the hang). Fails without `ep_pstream`'s store
/// back (an earlier dispatch's row) or without `ep_layout`'s zeroing of the "records in" words
/// (an earlier dispatch's word, whose row count differs).
#[test]
fn loom_ep_dispatch_sentinel() {
    use EpOp::*;
    ep_model(
        vec![EmDispatch, EmDispatch, Combine, EmDispatch],
        None,
        false,
        1,
    );
    ep_model(
        vec![EmDispatch, Combine, EmDispatch],
        Some((0, 2)),
        false,
        1,
    );
}

/// The abort model with pull combines: each wait of the first pull combine (ep_cready's,
/// ep_cdone's: waits 3 and 4 after ep_layout's 1 and ep_dwait's 2; the dispatch's are
/// `loom_ep_abort_propagation`'s) of PE 0 times out in one run (the PEs run the same code; PE
/// 1's runs would double the time).
#[test]
fn loom_ep_pull_abort_propagation() {
    use EpOp::*;
    let ops = vec![Dispatch, PullCombine, Dispatch, PullCombine];
    for w in 3..5 {
        ep_model(ops.clone(), Some((0, w)), false, 1);
    }
}

/// The abort model with records written as `ep_prep` once wrote them: a PE that gave up in
/// dispatch 1's data wait goes on into dispatch 2 and overwrites its record in the peer, which
/// may still be reading the records of dispatch 1 and take its layout (and, in normal mode, the
/// counts its host returns) from the record of dispatch 2. `ep_send` writes no records once its
/// PE gave up and carries the abort with the record signal.
#[test]
#[should_panic(expected = "decided from a record of another dispatch")]
fn loom_ep_abort_old_prep_reads_next_record() {
    use EpOp::*;
    ep_model(
        vec![Dispatch, Combine, Dispatch, Combine],
        Some((0, 2)),
        true,
        1,
    );
}
