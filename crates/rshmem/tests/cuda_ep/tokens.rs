//! `combine_tokens` (token-major results reduced by the caller), eager and in graphs.

use super::*;

/// `combine_tokens` on both layouts: each PE computes on the host, for every receive row, the
/// weighted sum over its local slots (what a caller reducing its own experts does), puts it in
/// `y` at the receive row; the sources' outputs must be the f32 sum over PEs (ascending) of
/// those rows, rounded once, exactly.
fn combine_tokens_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let (pull, push) = (TokensCombine::Pull, TokensCombine::Push);
    for (layout, how) in [
        (RecvLayout::ExpertMajor, pull),
        (RecvLayout::TokenMajor, pull),
        (RecvLayout::ExpertMajor, push),
        (RecvLayout::TokenMajor, push),
    ] {
        let c = EpConfig {
            layout,
            ..cfg(n, EpMode::Normal)
        };
        let el = c.num_experts / n;
        let h = c.hidden;
        let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
        buf.set_tokens_combine(how);
        assert_eq!(buf.tokens_combine_pulls(), how == pull);
        let inp = inputs::<bf16>(pe, &c, n)?;
        let cap = buf.pair_capacity();
        let yt = pe.alloc::<bf16>(n * cap * h)?;
        let steps = [
            (Case::Random, 40, 8),
            (Case::Random, 17, 3),
            (Case::OnePe, 33, 4),
            (Case::NoneToLast, 33, 4),
            (Case::OneExpert, 21, 5),
            (Case::Random, 0, 2),
        ];
        for (seed, (case, t, k)) in (901..).zip(steps) {
            let st = Step {
                case,
                t,
                k,
                seed,
                i64_ids: false,
                scale: false,
            };
            write_inputs(pe, &c, &inp, &st)?;
            let all: Vec<(Vec<i64>, Vec<f32>)> = (0..n)
                .map(|p| routing(p, n, case, t, k, c.num_experts, seed))
                .collect();
            // Partial of token `tok` of PE `p` on PE `d` (None: not sent there).
            let partial = |p: usize, tok: usize, d: usize, col: usize| -> Option<bf16> {
                let (ids, w) = &all[p];
                let mut f = 0f32;
                let mut any = false;
                for j in 0..k {
                    let id = ids[tok * k + j];
                    if id >= 0 && id as usize / el == d {
                        any = true;
                        f += w[tok * k + j] * factor(id as usize % el);
                    }
                }
                let x = xval::<bf16>(p, tok, col).to_f64() as f32;
                any.then(|| bf16::from_f64((f * x) as f64))
            };
            let mut y = vec![bf16::from_f64(-9.0); n * cap * h];
            for p in 0..n {
                let mut i = 0;
                for tok in 0..t {
                    if partial(p, tok, me, 0).is_none() {
                        continue;
                    }
                    for col in 0..h {
                        y[(p * cap + i) * h + col] = partial(p, tok, me, col).unwrap_or_default();
                    }
                    i += 1;
                }
            }
            pe.local_write(&yt, 0, &y)?;
            // (verify, below, checks the expert-major area beyond the rows too.)
            poison_output(pe, &buf)?;
            pe.barrier_all()?;
            let d = dispatch(pe, &s, &buf, &inp, &st)?;
            // Normal mode reports the receive counts per source with the dispatch.
            let want_recv: Vec<usize> = (0..n)
                .map(|p| {
                    (0..t)
                        .filter(|&tok| partial(p, tok, me, 0).is_some())
                        .count()
                })
                .collect();
            assert_eq!(
                d.recv_tokens_per_pe(),
                Some(&want_recv[..]),
                "PE {me} {case:?}"
            );
            buf.combine_tokens(pe, &s, &d, &yt, &inp.out)?;
            s.synchronize()?;
            buf.check(pe)?;
            let out = pe.local_vec(&inp.out)?;
            let check = |out: &[bf16], what: &str| {
                for tok in 0..t {
                    for col in 0..h {
                        let mut acc = 0f32;
                        for dd in 0..n {
                            if let Some(v) = partial(me, tok, dd, col) {
                                acc += v.to_f64() as f32;
                            }
                        }
                        let want = bf16::from_f64(acc as f64);
                        assert!(
                            out[tok * h + col] == want,
                            "PE {me} {layout:?} {how:?} {case:?} t={t} k={k} {what}: token {tok} element {col}: {:?} != {want:?}",
                            out[tok * h + col]
                        );
                    }
                }
            };
            check(&out, "");
            assert!(
                out[t * h..].iter().all(|v| *v == bf16::from_f64(-77.0)),
                "PE {me}: combine_tokens wrote beyond T rows"
            );
            // Again for the same dispatch, with out overlapping y (its first T rows): the peers
            // read this PE's y while it combines, so the sums go through temporary rows.
            if t > 0 {
                pe.barrier_all()?;
                let over = yt.view::<bf16>(0, t * h)?;
                buf.combine_tokens(pe, &s, &d, &yt, &over)?;
                s.synchronize()?;
                buf.check(pe)?;
                check(&pe.local_vec(&over)?, "out overlapping y");
                let bs = std::mem::size_of::<bf16>();
                let rest = pe.local_vec(&yt.view::<bf16>(t * h * bs, n * cap * h - t * h)?)?;
                if let Some(i) = (0..rest.len()).find(|&i| rest[i] != y[t * h + i]) {
                    let bad = (0..rest.len()).filter(|&i| rest[i] != y[t * h + i]).count();
                    panic!(
                        "PE {me} {layout:?} {how:?}: combine_tokens with out overlapping y changed y beyond T rows: \
                         {bad} elements, the first at row {} element {}: {:?} != {:?} (cap {cap}, h {h})",
                        t + i / h,
                        i % h,
                        rest[i],
                        y[t * h + i]
                    );
                }
                pe.local_write(&yt, 0, &y)?;
            }
            // And into an output one element off 16-byte alignment (the scalar path), where out
            // has room for it.
            if t > 0 && t * h < inp.out.len() {
                pe.barrier_all()?;
                let odd = inp.out.view::<bf16>(std::mem::size_of::<bf16>(), t * h)?;
                buf.combine_tokens(pe, &s, &d, &yt, &odd)?;
                s.synchronize()?;
                buf.check(pe)?;
                check(&pe.local_vec(&odd)?, "unaligned out");
            }
            // Then `combine` on the same buffer (expert-major: the split combine where each PE
            // has its GPU alone), one PE starting late: the combine area's rows that
            // combine_tokens used (its own rows, pushed or temporary) must hold the sentinel
            // again, or the late PE's peers would sum them as if they were its rows.
            if layout == RecvLayout::ExpertMajor && t > 0 {
                pe.local_fill(&inp.out, bf16::from_f64(-77.0))?;
                pe.barrier_all()?;
                if me == seed as usize % n {
                    std::thread::sleep(Duration::from_millis(20));
                }
                buf.combine(pe, &s, &d, &buf.expert_x()?, &inp.out)?;
                s.synchronize()?;
                buf.check(pe)?;
                verify(pe, &c, &buf, &inp, &st, d.rows())?;
            }
            // A y shorter than the receive area is refused before any kernel runs.
            if me == 0 && t == 40 {
                let short = yt.view::<bf16>(0, n * cap * h - 1)?;
                let e = buf.combine_tokens(pe, &s, &d, &short, &inp.out);
                assert!(
                    matches!(e, Err(Error::LengthMismatch { what, .. }) if what.starts_with("token outputs")),
                    "{e:?}"
                );
            }
            pe.barrier_all()?;
        }
        pe.free(yt)?;
        free_inputs(pe, inp)?;
        pe.free(buf)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_combine_tokens() {
    on_gpus(2, combine_tokens_body);
}

gpu_mode_test!(
    gpu_ep_combine_tokens,
    gpu_config(4),
    combine_tokens_body,
    [processes(2)]
);

/// combine_tokens captured with dispatch in one graph (capturable mode, token-major), replayed
/// with a new routing each time: each PE returns its receive rows as its per-token results
/// (`y` = the receive area), so token t's output is x[t] times the number of PEs it went to
/// (f32 sums of bf16 values, exact, rounded once), zeros for tokens without experts.
fn combine_tokens_graph_body(pe: &Pe) -> Result<()> {
    combine_tokens_graph_with(pe, TokensCombine::Pull)?;
    combine_tokens_graph_with(pe, TokensCombine::Push)?;
    overlap_beyond_temp_rows(pe)
}

/// Pulling with out overlapping y takes n * C temporary rows: more tokens than that are refused
/// before any kernel runs (on every PE, so none waits).
fn overlap_beyond_temp_rows(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        layout: RecvLayout::TokenMajor,
        ..cfg(n, EpMode::Capturable { capacity: 4 })
    };
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    buf.set_tokens_combine(TokensCombine::Pull);
    let inp = inputs::<bf16>(pe, &c, n)?;
    let (t, h) = (4 * n + 1, c.hidden);
    let st = Step {
        case: Case::Random,
        t,
        k: 2,
        seed: 77,
        i64_ids: false,
        scale: false,
    };
    write_inputs(pe, &c, &inp, &st)?;
    pe.barrier_all()?;
    let d = dispatch(pe, &s, &buf, &inp, &st)?;
    let big = pe.alloc::<bf16>(t * h)?;
    let y = big.view::<bf16>(0, buf.recv_rows() * h)?;
    let e = buf.combine_tokens(pe, &s, &d, &y, &big);
    assert!(
        matches!(&e, Err(Error::InvalidArgument(m)) if m.contains("temporary rows")),
        "{e:?}"
    );
    s.synchronize()?;
    // The dispatch itself may have overflowed the capacity of 4 (latched, reported here).
    let chk = buf.check(pe);
    assert!(
        matches!(chk, Ok(()) | Err(Error::Capacity { .. })),
        "{chk:?}"
    );
    pe.barrier_all()?;
    pe.free(big)?;
    free_inputs(pe, inp)?;
    pe.free(buf)
}

fn combine_tokens_graph_with(pe: &Pe, how: TokensCombine) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        layout: RecvLayout::TokenMajor,
        ..cfg(n, EpMode::Capturable { capacity: 40 })
    };
    let (t, k, h, el) = (37, 6, c.hidden, c.num_experts / n);
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    buf.set_tokens_combine(how);
    let inp = inputs::<bf16>(pe, &c, n)?;
    let step = |case: Case, seed: u64| Step {
        case,
        t,
        k,
        seed,
        i64_ids: false,
        scale: false,
    };
    write_inputs(pe, &c, &inp, &step(Case::Random, 300))?;
    pe.barrier_all()?;
    let recv = buf.recv_x()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &step(Case::Random, 300))
        .and_then(|d| buf.combine_tokens(pe, &s, &d, &recv, &inp.out));
    let graph = s.end_capture()?;
    captured?;
    for rep in 0..10u64 {
        let case = match rep % 5 {
            1 => Case::OnePe,
            2 => Case::NoneToLast,
            3 => Case::AllMinusOne,
            _ => Case::Random,
        };
        let st = step(case, 400 + rep);
        write_inputs(pe, &c, &inp, &st)?;
        pe.local_fill(&inp.out, bf16::from_f64(-77.0))?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        buf.check(pe)?;
        let (ids, _) = routing(me, n, case, t, k, c.num_experts, st.seed);
        let out = pe.local_vec(&inp.out)?;
        for tok in 0..t {
            let pes = (0..n)
                .filter(|&d| {
                    (0..k).any(|j| ids[tok * k + j] >= 0 && ids[tok * k + j] as usize / el == d)
                })
                .count();
            for col in 0..h {
                let x = xval::<bf16>(me, tok, col).to_f64() as f32;
                let want = bf16::from_f64((x * pes as f32) as f64);
                assert!(
                    out[tok * h + col] == want,
                    "PE {me} {how:?} replay {rep} {case:?}: token {tok} element {col}: {:?} != {want:?}",
                    out[tok * h + col]
                );
            }
        }
        assert!(
            out[t * h..].iter().all(|v| *v == bf16::from_f64(-77.0)),
            "PE {me} replay {rep}: combine_tokens wrote beyond T rows"
        );
        pe.barrier_all()?;
    }
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_combine_tokens_graph_replay() {
    on_gpus(2, combine_tokens_graph_body);
}

gpu_mode_test!(
    gpu_ep_combine_tokens_graph_replay,
    gpu_config(4),
    combine_tokens_graph_body,
    [processes(2), mixed(4)]
);
