//! The collectives' cross-PE signature check (`rshmemi_sig_sync`).

use super::*;

/// A packed signature word as `rshmemi_sig` word 0 is: bit 63 set, the barrier count in bits
/// 32..47, and (standing for the other five words) a kind in the low bits.
pub(super) fn sig(kind: u64, syncs: u64) -> u64 {
    1 << 63 | syncs << 32 | kind
}
pub(super) fn sig_syncs(w: u64) -> u64 {
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
pub(super) fn sig_pe(
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
pub(super) fn sig_model(n: usize, calls: Vec<Vec<u64>>, preemptions: usize) {
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
pub(super) fn assert_in_step(exps: &[Vec<u64>], mem: &BarMem, calls: &[Vec<u64>]) {
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
pub(super) fn loom_coll_signature_two_pes() {
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
pub(super) fn loom_coll_signature_three_pes() {
    sig_model(3, vec![vec![sig(1, 2), sig(1, 2), sig(2, 3)]], 0);
    sig_model(
        3,
        vec![vec![sig(1, 2), sig(2, 2), sig(1, 2)], vec![sig(1, 2); 3]],
        0,
    );
}
