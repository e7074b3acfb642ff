//! Low-latency MoE dispatch/combine (`rshmem::cuda::ep::LowLatencyBuffer`). The first test runs
//! everywhere (CI: NVRTC compiles the kernels); the others need a GPU (`--include-ignored`) and
//! run as launched processes and as thread-PEs (`harness::gpu_run`); PEs beyond the GPU count
//! share GPUs (`RSHMEM_DEVICES=0,0` puts two PEs on one).

#[macro_use]
#[path = "../harness/mod.rs"]
mod harness;

mod fp8;
mod put_signal;
mod reference;

use reference::{Routing, Step};
use rshmem::cuda::ep::{self, LlConfig, LlDispatch, LlDispatchOpts, LowLatencyBuffer};
use rshmem::cuda::{self, CudaPe, Stream};
use rshmem::{bf16, BackendKind, Config, Error, HeapKind, Pe, Result, Sym};
use std::time::Duration;

#[test]
fn nvrtc_compiles_ll_kernels() {
    for (what, src) in [
        ("LL kernels", ep::LL_KERNELS),
        ("put-signal kernels", put_signal::SRC),
    ] {
        let r = cuda::nvrtc::compile_uncached(&cuda::nvrtc::with_header(src), "sm_90", &[]);
        if !harness::nvrtc_compiled(what, r) {
            return;
        }
    }
}

#[test]
fn ll_config_is_checked_and_sized() {
    let c = LlConfig::new(128, 7168, 256, 8);
    let b = LowLatencyBuffer::bytes_for(&c, 2).unwrap();
    // The receive area alone: 2 halves x 128 experts x 256 rows x 7168 bf16.
    assert!(b > 2 * 128 * 256 * 7168 * 2, "{b}");
    assert!(b < 1_100_000_000, "{b}");
    for bad in [
        LlConfig::new(0, 128, 8, 2),
        LlConfig::new(4, 12, 8, 2),
        LlConfig::new(4, 128, 7, 2),
        LlConfig::new(4, 128, 8, 0),
        LlConfig::new(4, 128, 8, ep::LL_MAX_TOPK + 1),
        LlConfig::new(4, 128, 2 * (ep::LL_MAX_LOCAL_EXPERTS + 1), 2),
    ] {
        assert!(
            matches!(
                LowLatencyBuffer::bytes_for(&bad, 2),
                Err(Error::InvalidArgument(_))
            ),
            "{bad:?}"
        );
    }
    assert!(LowLatencyBuffer::bytes_for(&c, 0).is_err());
    assert!(LowLatencyBuffer::bytes_for(&c, 65).is_err());
    assert!(LowLatencyBuffer::bytes_for(&LlConfig::new(usize::MAX / 4, 7168, 256, 8), 2).is_err());
}

// ---------- GPU tests ----------

fn gpu_config() -> Config {
    let c = Config::default()
        .heap_size(128 << 20)
        .timeout(Duration::from_secs(10))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static);
    harness::cycled_devices(c, 2)
}

/// The shape of the tests: 4 local experts per PE, top-4, hidden 256 (FP8 groups: 2).
fn shape(n: usize) -> LlConfig {
    LlConfig::new(24, 256, 4 * n, 4)
}

/// Symmetric inputs and outputs of one micro-batch.
struct Io {
    x: Sym<bf16>,
    ids32: Sym<i32>,
    ids64: Sym<i64>,
    w: Sym<f32>,
    y: Sym<bf16>,
    out: Sym<bf16>,
}

fn io(pe: &Pe, buf: &LowLatencyBuffer) -> Result<Io> {
    let c = buf.config();
    let (m, h, k) = (c.max_tokens, c.hidden, c.max_topk);
    Ok(Io {
        x: pe.alloc(m * h)?,
        ids32: pe.alloc(m * k)?,
        ids64: pe.alloc(m * k)?,
        w: pe.alloc(m * k)?,
        y: pe.alloc(buf.local_experts() * buf.expert_rows() * h)?,
        out: pe.alloc(m * h)?,
    })
}

fn free_io(pe: &Pe, io: Io) -> Result<()> {
    pe.free(io.x)?;
    pe.free(io.ids32)?;
    pe.free(io.ids64)?;
    pe.free(io.w)?;
    pe.free(io.y)?;
    pe.free(io.out)
}

const POISON: f32 = -12345.0;

/// Writes this PE's inputs of `st` and poisons the outputs (`out`, `y`).
fn write_inputs(pe: &Pe, buf: &LowLatencyBuffer, io: &Io, st: &Step) -> Result<()> {
    let c = buf.config();
    let me = pe.my_pe();
    let r = st.routing(me, pe.n_pes(), c);
    pe.local_write(&io.x, 0, &st.x(me, c))?;
    let ids32: Vec<i32> = r.ids.iter().map(|&v| v as i32).collect();
    pe.local_write(&io.ids32, 0, &ids32)?;
    pe.local_write(&io.ids64, 0, &r.ids)?;
    pe.local_write(&io.w, 0, &r.w)?;
    pe.local_fill(&io.out, bf16::from_f32(POISON))?;
    pe.local_fill(&io.y, bf16::from_f32(POISON))
}

fn dispatch(pe: &Pe, s: &Stream, buf: &LowLatencyBuffer, io: &Io, st: &Step) -> Result<LlDispatch> {
    let k = st.top_k;
    let opts = LlDispatchOpts { fp8: st.fp8 };
    if st.i64_ids {
        buf.dispatch(pe, s, &io.x, &io.ids64.slice(..st.t * k)?, k, opts)
    } else {
        buf.dispatch(pe, s, &io.x, &io.ids32.slice(..st.t * k)?, k, opts)
    }
}

/// Poisons the receive area of `d`'s half (bf16 rows, or FP8 bytes and scales).
fn poison_recv(pe: &Pe, buf: &LowLatencyBuffer, d: &LlDispatch) -> Result<()> {
    if d.fp8() {
        let (q, sc) = buf.recv_x_fp8(d)?;
        pe.local_fill(&q, 0x7f)?;
        pe.local_fill(&sc, POISON)?;
    } else {
        pe.local_fill(&buf.recv_x(d)?, bf16::from_f32(POISON))?;
    }
    pe.local_fill(&buf.recv_src(d)?, -7)?;
    pe.local_fill(&buf.recv_count(d)?, -7)
}

/// Checks the received rows, sources, layout and counts of `d` against `st` on every PE;
/// returns this PE's expert rows as `(global expert, source PE, token)` in slot order.
fn verify_recv(
    pe: &Pe,
    buf: &LowLatencyBuffer,
    d: &LlDispatch,
    st: &Step,
) -> Result<Vec<Vec<(usize, usize)>>> {
    let c = *buf.config();
    let (n, me) = (pe.n_pes(), pe.my_pe());
    let want = reference::expert_rows(st, n, me, &c);
    let l = buf.local_experts();
    let nm = buf.expert_rows();
    let counts = pe.local_vec(&buf.recv_count(d)?)?;
    let src = pe.local_vec(&buf.recv_src(d)?)?;
    let lay = pe.local_vec(&buf.recv_layout(d)?)?;
    for e in 0..l {
        assert_eq!(
            counts[e] as usize,
            want[e].len(),
            "PE {me} expert {e}: count"
        );
        for (r, &(s, t)) in want[e].iter().enumerate() {
            assert_eq!(
                src[e * nm + r],
                (s * c.max_tokens + t) as i32,
                "PE {me} expert {e} row {r}"
            );
        }
        let mut first = 0;
        for s in 0..n {
            let rows = want[e].iter().filter(|r| r.0 == s).count();
            assert_eq!(
                (lay[(e * n + s) * 2], lay[(e * n + s) * 2 + 1]),
                (first as i32, rows as i32),
                "PE {me} expert {e} source {s}: layout"
            );
            first += rows;
        }
    }
    if d.fp8() {
        fp8::verify_rows(pe, buf, d, st, &want)?;
    } else {
        let got = pe.local_vec(&buf.recv_x(d)?)?;
        let h = c.hidden;
        for e in 0..l {
            for (r, &(s, t)) in want[e].iter().enumerate() {
                let x = st.x(s, &c);
                let row = &got[(e * nm + r) * h..(e * nm + r + 1) * h];
                assert!(
                    row == &x[t * h..(t + 1) * h],
                    "PE {me} expert {e} row {r}: not token {t} of PE {s}"
                );
            }
        }
    }
    Ok(want)
}

/// The stand-in experts on the host: y = bf16(x * factor(global expert)) for the received rows
/// (`rows` from [`verify_recv`]); with FP8 x is the dequantised row.
fn host_experts(
    pe: &Pe,
    buf: &LowLatencyBuffer,
    d: &LlDispatch,
    io: &Io,
    rows: &[Vec<(usize, usize)>],
) -> Result<()> {
    let c = *buf.config();
    let (h, nm, l) = (c.hidden, buf.expert_rows(), buf.local_experts());
    let x: Vec<f32> = if d.fp8() {
        fp8::dequantised(pe, buf, d)?
    } else {
        pe.local_vec(&buf.recv_x(d)?)?
            .iter()
            .map(|v| v.to_f32())
            .collect()
    };
    let mut y = vec![bf16::from_f32(POISON); l * nm * h];
    for (e, er) in rows.iter().enumerate() {
        let f = reference::factor(pe.my_pe() * l + e);
        for r in 0..er.len() {
            for i in 0..h {
                let at = (e * nm + r) * h + i;
                y[at] = bf16::from_f32(x[at] * f);
            }
        }
    }
    pe.local_write(&io.y, 0, &y)
}

/// Checks `out` against the reference combine of `st` (experts of [`host_experts`], or
/// identity experts).
fn verify_out(pe: &Pe, buf: &LowLatencyBuffer, io: &Io, st: &Step, identity: bool) -> Result<()> {
    let c = *buf.config();
    let me = pe.my_pe();
    let want = reference::combined(st, pe.n_pes(), me, &c, identity);
    let got = pe.local_vec(&io.out.slice(..st.t * c.hidden)?)?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "PE {me} out[{}][{}]: {g} != {w} ({st:?})",
            i / c.hidden,
            i % c.hidden
        );
    }
    Ok(())
}

/// A whole step: dispatch, host experts, combine, every output checked.
fn step(pe: &Pe, s: &Stream, buf: &LowLatencyBuffer, io: &Io, st: &Step) -> Result<()> {
    write_inputs(pe, buf, io, st)?;
    pe.barrier_all()?;
    let d = dispatch(pe, s, buf, io, st)?;
    s.synchronize()?;
    buf.check(pe)?;
    let rows = verify_recv(pe, buf, &d, st)?;
    host_experts(pe, buf, &d, io, &rows)?;
    buf.combine(pe, s, &d, &io.y, &io.w, &io.out)?;
    s.synchronize()?;
    buf.check(pe)?;
    verify_out(pe, buf, io, st, false)?;
    // Poison this half for the next step that uses it.
    poison_recv(pe, buf, &d)?;
    pe.barrier_all()
}

fn new_buf(pe: &Pe) -> Result<LowLatencyBuffer> {
    LowLatencyBuffer::new(pe, pe.world_team(), shape(pe.n_pes()), &[])
}

/// Random routings and every edge case, i32 and i64 ids, bf16 and FP8, both halves.
fn routings(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let io = io(pe, &buf)?;
    let s = CudaPe::new(pe)?.stream()?;
    let m = buf.config().max_tokens;
    let mut seed = 1;
    for routing in Routing::ALL {
        for (t, top_k, i64_ids, fp8) in [
            (m, 4, false, false),
            (m - 5, 3, true, false),
            (1, 4, false, true),
            (0, 2, true, false),
            (m, 4, true, true),
        ] {
            seed += 1;
            let st = Step {
                routing,
                t,
                top_k,
                seed,
                i64_ids,
                fp8,
            };
            step(pe, &s, &buf, &io, &st)?;
        }
    }
    free_io(pe, io)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_routings,
    gpu_config(),
    routings,
    [threads(2), processes(2)]
);

/// Two micro-batches in flight (dispatch A, dispatch B, combine A, combine B), no barrier or
/// synchronisation between the calls; identity experts (y = recv_x).
fn two_microbatches(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let (a, b) = (io(pe, &buf)?, io(pe, &buf)?);
    let s = CudaPe::new(pe)?.stream()?;
    let m = buf.config().max_tokens;
    for rep in 0..6u64 {
        let sa = Step::random(m, 4, 100 + rep);
        let sb = Step {
            routing: Routing::ALL[rep as usize % Routing::ALL.len()],
            ..Step::random(m - 3, 3, 200 + rep)
        };
        write_inputs(pe, &buf, &a, &sa)?;
        write_inputs(pe, &buf, &b, &sb)?;
        pe.barrier_all()?;
        for _ in 0..3 {
            let da = dispatch(pe, &s, &buf, &a, &sa)?;
            let db = dispatch(pe, &s, &buf, &b, &sb)?;
            assert_ne!(da.half(), db.half());
            buf.combine(pe, &s, &da, &buf.recv_x(&da)?, &a.w, &a.out)?;
            buf.combine(pe, &s, &db, &buf.recv_x(&db)?, &b.w, &b.out)?;
        }
        s.synchronize()?;
        buf.check(pe)?;
        verify_out(pe, &buf, &a, &sa, true)?;
        verify_out(pe, &buf, &b, &sb, true)?;
        pe.barrier_all()?;
    }
    free_io(pe, a)?;
    free_io(pe, b)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_two_microbatches,
    gpu_config(),
    two_microbatches,
    [threads(2), processes(2)]
);

/// Graph replays with changing routing: one micro-batch per graph, then two.
fn graph_replays(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let (a, b) = (io(pe, &buf)?, io(pe, &buf)?);
    let s = CudaPe::new(pe)?.stream()?;
    let m = buf.config().max_tokens;
    let first = Step::random(m, 4, 7);
    write_inputs(pe, &buf, &a, &first)?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &a, &first)
        .and_then(|d| buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &a.w, &a.out));
    let one = s.end_capture()?;
    captured?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &a, &first).and_then(|da| {
        let db = dispatch(pe, &s, &buf, &b, &first)?;
        buf.combine(pe, &s, &da, &buf.recv_x(&da)?, &a.w, &a.out)?;
        buf.combine(pe, &s, &db, &buf.recv_x(&db)?, &b.w, &b.out)
    });
    let two = s.end_capture()?;
    captured?;
    for rep in 0..12u64 {
        let st = Step {
            routing: Routing::ALL[rep as usize % Routing::ALL.len()],
            ..Step::random(m, 4, 300 + rep)
        };
        let st2 = Step::random(m, 4, 400 + rep);
        write_inputs(pe, &buf, &a, &st)?;
        write_inputs(pe, &buf, &b, &st2)?;
        pe.barrier_all()?;
        if rep % 2 == 0 {
            one.launch(&s)?;
        } else {
            two.launch(&s)?;
        }
        s.synchronize()?;
        buf.check(pe)?;
        verify_out(pe, &buf, &a, &st, true)?;
        if rep % 2 == 1 {
            verify_out(pe, &buf, &b, &st2, true)?;
        }
        pe.barrier_all()?;
    }
    free_io(pe, a)?;
    free_io(pe, b)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_graph_replays,
    gpu_config(),
    graph_replays,
    [threads(2), processes(2)]
);

/// Hooks: sends return, other work runs on the send stream (a copy checked afterwards), the
/// receives go on another stream; FP8 too.
fn hooks(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let io = io(pe, &buf)?;
    let g = CudaPe::new(pe)?;
    let (s1, s2) = (g.stream()?, g.stream()?);
    let m = buf.config().max_tokens;
    let big_src = pe.alloc::<u32>(4 << 20)?;
    let big_dst = pe.alloc::<u32>(4 << 20)?;
    for rep in 0..4u64 {
        let st = Step {
            fp8: rep % 2 == 1,
            ..Step::random(m, 4, 500 + rep)
        };
        write_inputs(pe, &buf, &io, &st)?;
        pe.local_fill(&big_src, rep as u32 + 1)?;
        pe.local_fill(&big_dst, 0)?;
        pe.barrier_all()?;
        let sent = buf.dispatch_send(
            pe,
            &s1,
            &io.x,
            &io.ids32.slice(..m * 4)?,
            4,
            LlDispatchOpts { fp8: st.fp8 },
        )?;
        g.put_on_stream(&s1, &big_dst, &big_src, pe.my_pe())?;
        s1.synchronize()?;
        let d = buf.dispatch_recv(pe, &s2, sent)?;
        s2.synchronize()?;
        buf.check(pe)?;
        let rows = verify_recv(pe, &buf, &d, &st)?;
        host_experts(pe, &buf, &d, &io, &rows)?;
        pe.barrier_all()?;
        let sent = buf.combine_send(pe, &s2, &d, &io.y)?;
        g.put_on_stream(&s2, &big_dst, &big_src, pe.my_pe())?;
        buf.combine_recv(pe, &s1, sent, &io.w, &io.out)?;
        s1.synchronize()?;
        s2.synchronize()?;
        buf.check(pe)?;
        verify_out(pe, &buf, &io, &st, false)?;
        assert!(pe.local_vec(&big_dst)?.iter().all(|&v| v == rep as u32 + 1));
        pe.barrier_all()?;
    }
    pe.free(big_src)?;
    pe.free(big_dst)?;
    free_io(pe, io)?;
    pe.free(buf)
}
gpu_mode_test!(ll_hooks, gpu_config(), hooks, [threads(2), processes(2)]);

/// One PE late by 300 ms in every call: the others wait for it; data exact.
fn one_pe_late(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let io = io(pe, &buf)?;
    let s = CudaPe::new(pe)?.stream()?;
    let m = buf.config().max_tokens;
    let late = pe.n_pes() - 1;
    for rep in 0..2u64 {
        let st = Step::random(m, 4, 600 + rep);
        write_inputs(pe, &buf, &io, &st)?;
        pe.barrier_all()?;
        if pe.my_pe() == late {
            std::thread::sleep(Duration::from_millis(300));
        }
        let d = dispatch(pe, &s, &buf, &io, &st)?;
        if pe.my_pe() == late {
            std::thread::sleep(Duration::from_millis(300));
        }
        buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &io.w, &io.out)?;
        s.synchronize()?;
        buf.check(pe)?;
        verify_out(pe, &buf, &io, &st, true)?;
        pe.barrier_all()?;
    }
    free_io(pe, io)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_one_pe_late,
    gpu_config(),
    one_pe_late,
    [threads(2), processes(2)]
);

/// Bad inputs: an out-of-range id (latched, reported by check on that PE only, taken as -1),
/// too many tokens (refused at once; an empty dispatch still goes out), handles of another
/// buffer or kind; then a good step.
fn bad_inputs(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let io = io(pe, &buf)?;
    let s = CudaPe::new(pe)?.stream()?;
    let c = *buf.config();
    let m = c.max_tokens;
    let st = Step {
        routing: Routing::BadIdOnPe0,
        ..Step::random(m, 4, 700)
    };
    write_inputs(pe, &buf, &io, &st)?;
    pe.barrier_all()?;
    let d = dispatch(pe, &s, &buf, &io, &st)?;
    buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &io.w, &io.out)?;
    s.synchronize()?;
    let r = buf.check(pe);
    if pe.my_pe() == 0 {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        buf.check(pe)?;
    } else {
        r?;
    }
    // The bad ids count as -1 everywhere.
    verify_out(pe, &buf, &io, &st, true)?;
    pe.barrier_all()?;
    // Too many tokens on PE 0: refused there, the others get no rows from it.
    let big = pe.alloc::<i32>((m + 1) * 4)?;
    pe.local_fill(&big, 0)?;
    let good = Step::random(m, 4, 701);
    write_inputs(pe, &buf, &io, &good)?;
    pe.barrier_all()?;
    let r = if pe.my_pe() == 0 {
        buf.dispatch(pe, &s, &io.x, &big, 4, LlDispatchOpts::default())
    } else {
        dispatch(pe, &s, &buf, &io, &good)
    };
    s.synchronize()?;
    match r {
        Err(e) => {
            assert_eq!(pe.my_pe(), 0, "{e}");
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(buf.check(pe).is_err());
        }
        Ok(d) => {
            buf.check(pe)?;
            let lay = pe.local_vec(&buf.recv_layout(&d)?)?;
            for e in 0..buf.local_experts() {
                assert_eq!(lay[e * pe.n_pes() * 2 + 1], 0, "rows from the refused PE 0");
            }
        }
    }
    pe.barrier_all()?;
    // A refused top-k on every PE: each sends and receives an empty dispatch, and reports it.
    let r = buf.dispatch(
        pe,
        &s,
        &io.x,
        &io.ids32.slice(..m * 4)?,
        0,
        LlDispatchOpts::default(),
    );
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    s.synchronize()?;
    assert!(matches!(buf.check(pe), Err(Error::InvalidArgument(_))));
    pe.barrier_all()?;
    let other = new_buf(pe)?;
    let io2 = &io;
    let st2 = Step::random(m, 4, 702);
    write_inputs(pe, &buf, io2, &st2)?;
    pe.barrier_all()?;
    let d = dispatch(pe, &s, &buf, io2, &st2)?;
    assert!(other.recv_x(&d).is_err());
    assert!(buf.recv_x_fp8(&d).is_err());
    assert!(matches!(
        buf.combine(pe, &s, &d, &io.y.slice(..4)?, &io.w, &io.out),
        Err(Error::LengthMismatch { .. })
    ));
    buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &io.w, &io.out)?;
    s.synchronize()?;
    buf.check(pe)?;
    verify_out(pe, &buf, &io, &st2, true)?;
    pe.barrier_all()?;
    // Weights too short: the rows went out, the receive writes nothing but still takes them
    // in, so the next steps of both halves are exact.
    let d = dispatch(pe, &s, &buf, io2, &st2)?;
    let r = buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &io.w.slice(..1)?, &io.out);
    assert!(matches!(r, Err(Error::LengthMismatch { .. })), "{r:?}");
    s.synchronize()?;
    buf.check(pe)?;
    pe.barrier_all()?;
    for seed in [703, 704] {
        let st3 = Step::random(m, 4, seed);
        write_inputs(pe, &buf, io2, &st3)?;
        pe.barrier_all()?;
        let d = dispatch(pe, &s, &buf, io2, &st3)?;
        buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &io.w, &io.out)?;
        s.synchronize()?;
        buf.check(pe)?;
        verify_out(pe, &buf, &io, &st3, true)?;
        pe.barrier_all()?;
    }
    pe.free(other)?;
    pe.free(big)?;
    free_io(pe, io)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_bad_inputs,
    gpu_config(),
    bad_inputs,
    [threads(2), processes(2)]
);

fn short_timeout() -> Config {
    gpu_config().timeout(Duration::from_secs(2))
}

/// A PE that never dispatches: the others' receives give up after the device timeout and
/// `check` reports it, naming no wrong data.
fn peer_missing(pe: &Pe) -> Result<()> {
    let buf = new_buf(pe)?;
    let io = io(pe, &buf)?;
    let s = CudaPe::new(pe)?.stream()?;
    let st = Step::random(buf.config().max_tokens, 4, 800);
    write_inputs(pe, &buf, &io, &st)?;
    pe.barrier_all()?;
    if pe.my_pe() == 0 {
        dispatch(pe, &s, &buf, &io, &st)?;
        s.synchronize()?;
        let r = buf.check(pe);
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    } else {
        // Host waits time out as device waits do: meet PE 0 after its wait has given up
        // (2 s), well within its host timeout.
        std::thread::sleep(Duration::from_millis(2600));
    }
    pe.barrier_all()?;
    free_io(pe, io)?;
    pe.free(buf)
}
gpu_mode_test!(
    ll_peer_missing,
    short_timeout(),
    peer_missing,
    [processes(2)]
);

#[test]
fn fp8_reference_round_trips_and_rounds_to_even() {
    for code in 0u8..=0x7e {
        assert_eq!(fp8::f32_to_e4m3(fp8::e4m3_to_f32(code)), code);
        assert_eq!(
            fp8::f32_to_e4m3(-fp8::e4m3_to_f32(code)),
            code | if code == 0 { 0 } else { 0x80 }
        );
    }
    // 1 + 1/16 lies between 1 (code 0x38) and 1.125 (0x39): the even code.
    assert_eq!(fp8::f32_to_e4m3(1.0625), 0x38);
    assert_eq!(fp8::f32_to_e4m3(1000.0), 0x7e);
    let (q, s) = fp8::quantise(&[0.0; 128]);
    assert!(q.iter().all(|&b| b == 0));
    assert_eq!(s, 1e-4 / 448.0);
}

gpu_mode_test!(
    ll_put_signal_echo,
    gpu_config(),
    put_signal::echo,
    [threads(2), processes(2)]
);
gpu_mode_test!(
    ll_put_signal_never_sent,
    short_timeout(),
    put_signal::never_sent,
    [processes(2)]
);
