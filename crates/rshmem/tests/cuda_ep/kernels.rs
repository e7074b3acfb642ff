//! The dispatch and combine kernels' protocols: split combine, sentinels, all-ones rows, capacity overflow, a peer timing out.

use super::*;

/// The split combine (`ep_csplit`, every PE alone on its GPU): T up to 2000 tokens (many
/// sender rounds), random and special routings, each dispatch combined three times: into `out`
/// on every PE (sums inside the kernel, checked against the host reference), then with `out`
/// overlapping `y` on PE 0 only (PE 0 sums after the kernel, its peers inside: one protocol for
/// both), then on every PE, one PE starting 20 ms late each time (its peers' summers find the
/// sentinel, not a former combine's rows); each result exact against the first, `y` beyond the
/// overlapped rows untouched.
fn split_combine_body(pe: &Pe, mode: EpMode) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        num_experts: 8 * n,
        max_tokens: 2000,
        hidden: 64,
        max_topk: 8,
        mode,
        layout: RecvLayout::ExpertMajor,
    };
    let h = c.hidden;
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    let steps = [
        (Case::Random, 2000, 8),
        (Case::Random, 1500, 3),
        (Case::OnePe, 1200, 4),
        (Case::NoneToLast, 700, 6),
        (Case::OneExpert, 1100, 2),
        (Case::Random, 513, 1),
        (Case::Random, 1, 2),
        (Case::Random, 0, 4),
    ];
    for (seed, (case, t, k)) in (700..).zip(steps) {
        let st = Step {
            case,
            t,
            k,
            seed,
            i64_ids: false,
            scale: true,
        };
        write_inputs(pe, &c, &inp, &st)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        let d = dispatch(pe, &s, &buf, &inp, &st)?;
        expert_and_combine(pe, &s, &buf, &inp, &d, true)?;
        s.synchronize()?;
        buf.check(pe)?;
        verify(pe, &c, &buf, &inp, &st, d.rows())?;
        let want = pe.local_vec(&inp.out)?[..t * h].to_vec();
        let y = pe.local_vec(&inp.y)?;
        for overlapping in [vec![0], (0..n).collect::<Vec<_>>()] {
            pe.local_fill(&inp.out, bf16::from_f64(-77.0))?;
            pe.local_write(&inp.y, 0, &y)?;
            pe.barrier_all()?;
            let over = overlapping.contains(&me) && t > 0;
            let out = if over {
                inp.y.view::<bf16>(0, t * h)?
            } else {
                inp.out.view::<bf16>(0, t * h)?
            };
            // One PE starts late (by turns): its peers' summers reach rows that are not in yet
            // and must wait for them, not take what a former combine left there.
            if me == (seed as usize + overlapping.len()) % n {
                std::thread::sleep(Duration::from_millis(20));
            }
            buf.combine(pe, &s, &d, &inp.y, &out)?;
            s.synchronize()?;
            buf.check(pe)?;
            let got = pe.local_vec(&out)?;
            if let Some(i) = (0..t * h).find(|&i| got[i] != want[i]) {
                panic!(
                    "PE {me} {case:?} t={t} k={k} (out overlapping y on {overlapping:?}): token {} element {}: {:?} != {:?}",
                    i / h,
                    i % h,
                    got[i],
                    want[i]
                );
            }
            if over {
                let rest = pe.local_vec(&inp.y)?;
                assert!(
                    rest[t * h..] == y[t * h..],
                    "PE {me} {case:?}: combine with out overlapping y changed y beyond T rows"
                );
            }
            pe.barrier_all()?;
        }
        // Into an output one element off 16-byte alignment on every PE (the kernel's scalar
        // paths: elements, each waited for alone), one PE late.
        if t > 0 && t * h < inp.out.len() {
            pe.local_write(&inp.y, 0, &y)?;
            pe.barrier_all()?;
            if me == (seed as usize + 1) % n {
                std::thread::sleep(Duration::from_millis(20));
            }
            let odd = inp.out.view::<bf16>(std::mem::size_of::<bf16>(), t * h)?;
            buf.combine(pe, &s, &d, &inp.y, &odd)?;
            s.synchronize()?;
            buf.check(pe)?;
            let got = pe.local_vec(&odd)?;
            if let Some(i) = (0..t * h).find(|&i| got[i] != want[i]) {
                panic!(
                    "PE {me} {case:?} t={t} k={k} (unaligned out): token {} element {}: {:?} != {:?}",
                    i / h,
                    i % h,
                    got[i],
                    want[i]
                );
            }
            pe.barrier_all()?;
        }
    }
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_split_combine() {
    on_gpus(2, |pe| {
        split_combine_body(pe, EpMode::Capturable { capacity: 2000 })?;
        split_combine_body(pe, EpMode::Normal)
    });
}

/// The same on 4 PEs: the split combine with three peers where the machine has 4 GPUs (each PE
/// alone on one), the three kernels where PEs share GPUs.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_split_combine_4pes() {
    on_gpus(4, |pe| {
        split_combine_body(pe, EpMode::Capturable { capacity: 2000 })
    });
}

gpu_mode_test!(
    gpu_ep_split_combine,
    gpu_config(2),
    |pe| split_combine_body(pe, EpMode::Capturable { capacity: 2000 }),
    [processes(2)]
);

/// The expert-major dispatch's rows announce themselves (the receive area's sentinel): graph
/// replays (capturable mode, k = 1, so each replay puts other tokens at a source's positions),
/// one PE starting 20 ms late by turns (its peers' `ep_pstream` reach rows that are not in yet
/// and must wait for them, not take what an earlier replay left there), two replays
/// overflowing the capacity with no `check` after them (their rows moved and were never read:
/// the device restores the sentinel), and odd PEs' `x` one element off 16-byte alignment (their
/// rows go out element by element into their peers' vector reads). Every other replay exact.
fn dispatch_sentinel_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    // Rows of 4 KiB: a source's rows keep coming in for tens of microseconds after its row
    // records, so a reader that did not wait for them would read the sentinel (or what an
    // earlier replay left).
    let c = EpConfig {
        num_experts: 8 * n,
        max_tokens: 1500,
        hidden: 2048,
        max_topk: 1,
        mode: EpMode::Capturable { capacity: 1000 },
        layout: RecvLayout::ExpertMajor,
    };
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs_shifted::<bf16>(pe, &c, n, me % 2)?;
    let step = |case: Case, seed: u64| Step {
        case,
        t: 1500,
        k: 1,
        seed,
        i64_ids: false,
        scale: true,
    };
    write_inputs(pe, &c, &inp, &step(Case::Random, 1))?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &step(Case::Random, 1))
        .and_then(|d| expert_and_combine(pe, &s, &buf, &inp, &d, true));
    let graph = s.end_capture()?;
    captured?;
    for rep in 0..10u64 {
        // Every token to expert 1 (PE 0): 1500 > 1000.
        let overflow = rep == 3 || rep == 6;
        let st = step(
            if overflow {
                Case::OneExpert
            } else {
                Case::Random
            },
            40 + rep,
        );
        write_inputs(pe, &c, &inp, &st)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        if me == rep as usize % n {
            std::thread::sleep(Duration::from_millis(20));
        }
        graph.launch(&s)?;
        s.synchronize()?;
        if overflow {
            assert!(
                pe.local_vec(&buf.expert_x()?)?
                    .iter()
                    .all(|v| *v == bf16::from_f64(-55.0)),
                "PE {me} replay {rep}: rows written despite overflow"
            );
        } else {
            verify(pe, &c, &buf, &inp, &st, None)?;
        }
        pe.barrier_all()?;
    }
    // The overflows are still latched (no check since): reported now, then cleared.
    match buf.check(pe) {
        Err(Error::Capacity { capacity: 1000, .. }) => {}
        other => panic!("PE {me}: expected the latched capacity error, got {other:?}"),
    }
    buf.check(pe)?;
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_dispatch_sentinel() {
    on_gpus(2, dispatch_sentinel_body);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_dispatch_sentinel_4pes() {
    on_gpus(4, dispatch_sentinel_body);
}

gpu_mode_test!(
    gpu_ep_dispatch_sentinel,
    gpu_config(2),
    dispatch_sentinel_body,
    [processes(2)]
);

/// Dispatched rows hold `x`'s bits but for elements of all ones (a NaN, the receive area's
/// sentinel): those arrive with their sign bit cleared, still a NaN, alike from this PE (read
/// from `x`) and from its peers (through the receive area), on the vector paths and the
/// element paths (`x` one element off alignment on odd PEs, then on every PE).
fn dispatch_all_ones_body<T: Elem>(pe: &Pe, ones: T, canon: T, bits: fn(T) -> u32) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        num_experts: 4 * n,
        max_tokens: 96,
        hidden: 64,
        max_topk: 4,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    };
    let h = c.hidden;
    let buf = GpuBuffer::<T>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let special = |tok: usize, col: usize| (tok + col).is_multiple_of(7);
    for (round, shifts) in [[0, 1], [1, 1]].into_iter().enumerate() {
        let inp = inputs_shifted::<T>(pe, &c, n, shifts[me % 2])?;
        let st = Step {
            case: Case::Random,
            t: 96,
            k: 4,
            seed: 900 + round as u64,
            i64_ids: false,
            scale: false,
        };
        write_inputs(pe, &c, &inp, &st)?;
        let xs: Vec<T> = (0..st.t * h)
            .map(|i| {
                if special(i / h, i % h) {
                    ones
                } else {
                    xval(me, i / h, i % h)
                }
            })
            .collect();
        pe.local_write(&inp.x, inp.shift, &xs)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        let d = dispatch(pe, &s, &buf, &inp, &st)?;
        s.synchronize()?;
        buf.check(pe)?;
        let hh = buf.host_handle(pe)?;
        assert_eq!(Some(hh.rows.len()), d.rows());
        assert!(!hh.rows.is_empty(), "PE {me}: no rows");
        let ex = pe.local_vec(&buf.expert_x()?)?;
        for (r, &(p, tok, _)) in hh.rows.iter().enumerate() {
            for col in 0..h {
                let want = if special(tok, col) {
                    canon
                } else {
                    xval(p, tok, col)
                };
                let got = ex[r * h + col];
                assert!(
                    bits(got) == bits(want),
                    "PE {me} round {round}: row {r} (PE {p} token {tok}) element {col}: {:#x} != {:#x}",
                    bits(got),
                    bits(want)
                );
            }
        }
        pe.barrier_all()?;
        free_inputs(pe, inp)?;
    }
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_dispatch_all_ones_elements() {
    on_gpus(2, |pe| {
        dispatch_all_ones_body::<bf16>(
            pe,
            bf16::from_bits(0xffff),
            bf16::from_bits(0x7fff),
            |v| v.to_bits() as u32,
        )?;
        dispatch_all_ones_body::<f32>(
            pe,
            f32::from_bits(u32::MAX),
            f32::from_bits(0x7fff_ffff),
            |v| v.to_bits(),
        )
    });
}

fn overflow_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let mut c = cfg(n, EpMode::Capturable { capacity: 5 });
    c.max_tokens = 16;
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    for round in 0..2 {
        // All 16 tokens of every PE to expert 1 (PE 0): 16 > 5.
        let st = Step {
            case: Case::OneExpert,
            t: 16,
            k: 2,
            seed: 3,
            i64_ids: false,
            scale: false,
        };
        write_inputs(pe, &c, &inp, &st)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        let d = dispatch(pe, &s, &buf, &inp, &st)?;
        expert_and_combine(pe, &s, &buf, &inp, &d, false)?;
        s.synchronize()?;
        match buf.check(pe) {
            Err(Error::Capacity {
                needed,
                capacity,
                dst_pe,
                ..
            }) => {
                assert_eq!((needed, capacity, dst_pe), (16, 5, 0), "PE {}", pe.my_pe())
            }
            other => panic!(
                "PE {} round {round}: expected a capacity error, got {other:?}",
                pe.my_pe()
            ),
        }
        assert!(!buf.last_dispatch_ok(pe)?);
        assert!(
            pe.local_vec(&buf.expert_x()?)?
                .iter()
                .all(|v| *v == bf16::from_f64(-55.0)),
            "rows written despite overflow"
        );
        assert!(
            pe.local_vec(&inp.out)?
                .iter()
                .all(|v| *v == bf16::from_f64(-77.0)),
            "combine wrote despite overflow"
        );
        buf.check(pe)?; // cleared
        pe.barrier_all()?;
        // The buffer still works: a routing within capacity (4 tokens).
        let st = Step {
            case: Case::Random,
            t: 4,
            k: 3,
            seed: 9 + round,
            i64_ids: true,
            scale: true,
        };
        run_step(pe, &s, &c, &buf, &inp, &st)?;
    }
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_capacity_overflow_is_an_error() {
    on_gpus(2, overflow_body);
}

/// PE 1's device waits have timed out (a wait nobody satisfies, queued before the step): its
/// step stops, and PE 0, whose waits all succeed, must not use what PE 1 sent or failed to
/// send — both report a timeout and leave their outputs alone; after both have synchronised
/// and cleared the flags the buffer works again.
fn peer_timeout_body(pe: &Pe) -> Result<()> {
    peer_timeout_body_mode(pe, EpMode::Capturable { capacity: 40 })
}

/// As [`peer_timeout_body`] in normal mode, where dispatch itself reports the timeout on both
/// PEs (PE 1: its device error word, read back behind the kernels; PE 0: PE 1's abort).
fn peer_timeout_normal_body(pe: &Pe) -> Result<()> {
    peer_timeout_body_mode(pe, EpMode::Normal)
}

fn peer_timeout_body_mode(pe: &Pe, mode: EpMode) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = cfg(n, mode);
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    let never = pe.alloc::<u64>(1)?;
    pe.local_fill(&never, 0)?;
    let st = Step {
        case: Case::Random,
        t: 40,
        k: 3,
        seed: 77,
        i64_ids: false,
        scale: true,
    };
    write_inputs(pe, &c, &inp, &st)?;
    pe.local_fill(&buf.expert_x()?, bf16::from_f64(-55.0))?;
    pe.barrier_all()?;
    if me == 1 {
        // Times out (kernel path: `>` is not a stream-memory comparison) and latches the
        // device flag, which stays set until a check or quiet.
        g.wait_until_on_stream(&s, &never, 0, Cmp::Gt, 0)?;
        s.synchronize()?;
    } else {
        // Host waits time out as device waits do: meet PE 1 after its wait has given up
        // (2 s), well within PE 1's host timeout.
        std::thread::sleep(Duration::from_millis(2600));
    }
    // No quiet: PE 1's flag must survive until its step runs.
    pe.sync_all()?;
    if mode == EpMode::Normal {
        match dispatch(pe, &s, &buf, &inp, &st) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("PE {me}: expected a timeout from dispatch, got {other:?}"),
        }
        s.synchronize()?;
    } else {
        let d = dispatch(pe, &s, &buf, &inp, &st)?;
        expert_and_combine(pe, &s, &buf, &inp, &d, st.scale)?;
        s.synchronize()?;
        match buf.check(pe) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("PE {me}: expected a timeout, got {other:?}"),
        }
    }
    assert!(!buf.last_dispatch_ok(pe)?, "PE {me}: step not stopped");
    assert!(
        pe.local_vec(&buf.expert_x()?)?
            .iter()
            .all(|v| *v == bf16::from_f64(-55.0)),
        "PE {me}: rows permuted after a timeout"
    );
    assert!(
        pe.local_vec(&inp.out)?
            .iter()
            .all(|v| *v == bf16::from_f64(-77.0)),
        "PE {me}: combine wrote after a timeout"
    );
    // Every stream is idle after this barrier: flags that arrived late are cleared here.
    pe.barrier_all()?;
    let _ = buf.check(pe);
    pe.barrier_all()?;
    let st = Step { seed: 78, ..st };
    run_step(pe, &s, &c, &buf, &inp, &st)?;
    pe.free(never)?;
    free_inputs(pe, inp)?;
    pe.free(buf)
}

/// `body` on 2 thread-PEs of this process whose device waits time out after 2 s.
fn on_two_pes_timing_out(what: &str, body: fn(&Pe) -> Result<()>) {
    let _gpu = harness::gpu_world();
    let cfg = gpu_config(2).timeout(Duration::from_secs(2));
    let r = rshmem::Launch::new()
        .config(cfg)
        .threads()
        .run(2, body)
        .values()
        .expect("world");
    harness::expect_all_ok(what, r);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_peer_timeout_stops_every_pe() {
    on_two_pes_timing_out("peer timeout, 2 PEs", peer_timeout_body);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_peer_timeout_stops_every_pe_normal_mode() {
    on_two_pes_timing_out(
        "peer timeout in normal mode, 2 PEs",
        peer_timeout_normal_body,
    );
}

/// A dispatch on PE 0 against a combine on PE 1 (`rshmem::cuda::ep`, "Calls of different
/// kinds"): neither call passes the other, both PEs' device waits time out, `check` reports a
/// timeout on both and PE 0's dispatch is stopped; the buffer is then freed and a new one
/// dispatches and combines exactly.
fn kinds_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = cfg(n, EpMode::Capturable { capacity: 40 });
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    let st = Step {
        case: Case::Random,
        t: 40,
        k: 3,
        seed: 91,
        i64_ids: false,
        scale: true,
    };
    // A dispatch on every PE first, which PE 1 then combines alone.
    write_inputs(pe, &c, &inp, &st)?;
    pe.barrier_all()?;
    let d = dispatch(pe, &s, &buf, &inp, &st)?;
    s.synchronize()?;
    buf.check(pe)?;
    pe.barrier_all()?;
    if me == 0 {
        dispatch(pe, &s, &buf, &inp, &Step { seed: 92, ..st })?;
    } else {
        expert_and_combine(pe, &s, &buf, &inp, &d, st.scale)?;
    }
    s.synchronize()?;
    match buf.check(pe) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("PE {me}: expected a timeout, got {other:?}"),
    }
    if me == 0 {
        assert!(
            !buf.last_dispatch_ok(pe)?,
            "PE 0: the dispatch passed a combine"
        );
    }
    // Every stream is idle after this barrier: flags that arrived late are cleared here.
    pe.barrier_all()?;
    let _ = buf.check(pe);
    pe.barrier_all()?;
    pe.free(buf)?;
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    run_step(pe, &s, &c, &buf, &inp, &Step { seed: 93, ..st })?;
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_dispatch_against_combine_times_out() {
    on_two_pes_timing_out("dispatch against combine, 2 PEs", kinds_body);
}
