//! MoE dispatch/combine: reusing the areas, and aborts.

use super::*;

/// One step of an EP sequence (every PE runs the same list, as the contract asks).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum EpOp {
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
pub(super) const EP_SENTINEL: u64 = u64::MAX;

pub(super) const EP_ABORT: u64 = 16;
/// Receive capacity per source (`cap`), rows.
pub(super) const EP_C: usize = 2;

/// Rows PE `s` sends PE `d` in dispatch `k` (1 or 2, varying with the call).
pub(super) fn ep_rows(k: usize, s: usize, d: usize) -> usize {
    1 + (k + s + d) % 2
}

/// Two PEs' EP buffers. Only words another PE writes are shared; the rest of `ctl` (epoch,
/// wait counts, go, tokens) is thread-local.
pub(super) struct EpMem {
    /// Records, `rec[pe][src]`: `dispatch << 8 | rows` (volatile words: relaxed atomics).
    pub(super) rec: Vec<AtomicU64>,
    /// Signals `sig[pe][src]` for records and ready (set to the epoch), data and combine
    /// (block adds).
    pub(super) sig_rec: Vec<AtomicU64>,
    pub(super) sig_ready: Vec<AtomicU64>,
    pub(super) sig_data: Vec<AtomicU64>,
    pub(super) sig_comb: Vec<AtomicU64>,
    /// The pull combine's ready and done words (set to the combine number).
    pub(super) sig_cready: Vec<AtomicU64>,
    pub(super) sig_cdone: Vec<AtomicU64>,
    /// `ctl[EP_CTL_ERR]` of each PE (peers `atomicOr_system` the abort bit into it).
    pub(super) err: Vec<AtomicU64>,
    /// "Records in" words `prog[pe][src]` (one per source block in the kernels, one block
    /// here): `ep_send` sets them (`red.release.max`, `1 << 63 | hi << 32`) once its row
    /// records are written, before the rows; their owner zeroes them before its ready signal.
    pub(super) prog: Vec<AtomicU64>,
    /// Row records `recv[pe][src][pos]` (plain stores): the dispatch number.
    pub(super) recv: Cells,
    /// The rows of an expert-major receive area, laid out as `recv`: the dispatch number or
    /// the sentinel (filled at creation); relaxed words (`ep_pstream`'s volatile polls race
    /// the senders' stores by design).
    pub(super) srecv: Vec<AtomicU64>,
    /// Combine rows `comb[pe][parity][src][pos]`: the combine number.
    pub(super) comb: Cells,
    /// The caller's `y` rows `y[pe][src][pos]` (plain stores by its expert kernel): the combine
    /// number.
    pub(super) y: Cells,
    /// A split buffer's combine area, laid out as `comb`: the combine number or the sentinel
    /// (filled at creation).
    pub(super) scomb: Vec<AtomicU64>,
}

pub(super) const EP_N: usize = 2;

impl EpMem {
    pub(super) fn new() -> EpMem {
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
    pub(super) fn recv_at(pe: usize, src: usize, pos: usize) -> usize {
        (pe * EP_N + src) * EP_C + pos
    }
    pub(super) fn comb_at(pe: usize, parity: usize, src: usize, pos: usize) -> usize {
        ((pe * 2 + parity) * EP_N + src) * EP_C + pos
    }
}

/// What one PE saw: per op, whether it used the step (go after its waits) and whether one of
/// its waits gave up there.
#[derive(Debug, Default, Clone)]
pub(super) struct EpTrace {
    pub(super) used: Vec<bool>,
    pub(super) gave_up: Vec<bool>,
    pub(super) aborted_at_end: bool,
}

/// One PE running `ops` as `ep.cu` does (self-sends left out: a PE's own rows and signals are
/// program order). `timeout`: the index (counting this PE's waits from 0) of a wait that times
/// out if its condition does not hold at its first poll (a wait can only time out while its
/// condition is false; loom explores every point at which the poll happens). `old_prep`:
/// records written as `ep_prep` once did, also after this PE gave up.
pub(super) fn ep_pe(
    me: usize,
    mem: &EpMem,
    ops: &[EpOp],
    timeout: Option<usize>,
    old_prep: bool,
) -> EpTrace {
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
pub(super) fn ep_model(
    ops: Vec<EpOp>,
    timeout: Option<(usize, usize)>,
    old_prep: bool,
    preemptions: usize,
) {
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
pub(super) fn loom_ep_reuse_three_calls() {
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
pub(super) fn loom_ep_reuse_repeated_combine() {
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
pub(super) fn loom_ep_reuse_back_to_back_dispatches() {
    use EpOp::*;
    ep_model(vec![Dispatch, Dispatch, Combine], None, false, 2);
}

/// EP model with timeouts, 2 PEs, 2 dispatch+combine pairs: for every wait of either PE in the
/// first pair, a run where that wait times out (when its condition does not hold at its first
/// poll). Checks: a PE that gave up uses nothing after it; every row, record or combine row
/// that any PE still uses is complete and of its own call (value checks) and never
/// overwritten while it may be read (loom); the abort reaches the other PE by the end.
#[test]
pub(super) fn loom_ep_abort_propagation() {
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
pub(super) fn loom_ep_pull_combine_reuse() {
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
pub(super) fn loom_ep_split_combine_sentinel() {
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
pub(super) fn loom_ep_dispatch_sentinel() {
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
pub(super) fn loom_ep_pull_abort_propagation() {
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
pub(super) fn loom_ep_abort_old_prep_reads_next_record() {
    use EpOp::*;
    ep_model(
        vec![Dispatch, Combine, Dispatch, Combine],
        Some((0, 2)),
        true,
        1,
    );
}
