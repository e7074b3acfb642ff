//! GPU MoE dispatch/combine (`rshmem::cuda::ep`). The first test runs everywhere (CI: NVRTC
//! compiles the kernels for every hidden/id type); the others need GPUs (`--include-ignored`).
//! PEs are threads; `RSHMEM_DEVICES` (e.g. `0,0` on one GPU) is cycled to the team size. The
//! bf16 routings and graph replay also run as launched processes and in mixed mode
//! (`harness::gpu_run`).

#[path = "../harness/mod.rs"]
mod harness;

mod graphs;
mod kernels;
mod tokens;

use rshmem::cuda::ep::{self, Dispatch, GpuBuffer, TokensCombine};
use rshmem::cuda::{self, CudaPe, Stream};
use rshmem::ep::{EpConfig, EpMode, RecvLayout};
use rshmem::{bf16, BackendKind, Cmp, Config, Elem, ElemKind, Error, HeapKind, Pe, Result, Sym};
use std::time::Duration;

/// The environment's MoE tuning; `RSHMEM_TEST_EP_NVRTC_OPTS` (a test switch) adds compile
/// options, the mutation switches that break the kernels on purpose included (a test that
/// still passes with one cannot see what it guards).
fn ep_tuning() -> ep::EpTuning {
    let mut t = ep::EpTuning::from_env().expect("RSHMEM_EP_* variables");
    if let Ok(v) = std::env::var("RSHMEM_TEST_EP_NVRTC_OPTS") {
        t.nvrtc_options
            .extend(v.split_whitespace().map(str::to_string));
    }
    t
}

#[test]
fn nvrtc_compiles_ep_kernels() {
    let src = cuda::nvrtc::with_header(ep::EP_KERNELS);
    for t in [ElemKind::F32, ElemKind::Bf16, ElemKind::F16] {
        for id in [ElemKind::I32, ElemKind::I64] {
            let opts = ep::kernel_options(t, id, &ep_tuning().nvrtc_options).unwrap();
            let o: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
            let r = cuda::nvrtc::compile_uncached(&src, "sm_90", &o);
            if !harness::nvrtc_compiled(&format!("{t:?}/{id:?}"), r) {
                return;
            }
        }
    }
    assert!(ep::kernel_options(ElemKind::I32, ElemKind::I32, &[]).is_err());
    assert!(ep::kernel_options(ElemKind::F32, ElemKind::U32, &[]).is_err());
}

// ---------- GPU tests ----------

fn gpu_config(n: usize) -> Config {
    let c = Config::default()
        .heap_size(256 << 20)
        .timeout(Duration::from_secs(20))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static);
    harness::cycled_devices(c, n)
}

fn on_gpus(n: usize, body: fn(&Pe) -> Result<()>) {
    harness::gpu_threads(n, gpu_config(n), body);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Random,
    /// Every token's experts all on one PE (token t: PE t % n).
    OnePe,
    /// No token goes to the last PE.
    NoneToLast,
    AllMinusOne,
    /// Every slot of every token: expert 1 (duplicates included).
    OneExpert,
}

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Routing of PE `p`: ids (i64, converted per test) and weights (multiples of 1/8).
fn routing(
    p: usize,
    n: usize,
    case: Case,
    t: usize,
    k: usize,
    e: usize,
    seed: u64,
) -> (Vec<i64>, Vec<f32>) {
    let mut r = xorshift(seed * 7919 + p as u64 * 104_729 + 17);
    let el = e / n;
    let mut ids = Vec::new();
    let mut w = Vec::new();
    for tok in 0..t {
        for _ in 0..k {
            let v = match case {
                Case::Random => {
                    if r().is_multiple_of(5) {
                        -1
                    } else {
                        (r() % e as u64) as i64
                    }
                }
                Case::OnePe => ((tok % n) * el) as i64 + (r() % el as u64) as i64,
                Case::NoneToLast => (r() % ((n - 1) * el) as u64) as i64,
                Case::AllMinusOne => -1,
                Case::OneExpert => 1,
            };
            ids.push(v);
            w.push(((r() % 8) + 1) as f32 / 8.0);
        }
    }
    (ids, w)
}

fn xval<T: Elem>(p: usize, t: usize, h: usize) -> T {
    T::from_f64(((p * 131 + t * 7 + h * 3) % 19) as f64 - 9.0)
}

fn factor(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.5
}

/// Rounds an f32 to T (as the kernels' cvt.rn) and back.
fn rt<T: Elem>(v: f32) -> f32 {
    T::from_f64(v as f64).to_f64() as f32
}

struct Inputs<T: Elem> {
    x: Sym<T>,
    ids32: Sym<i32>,
    ids64: Sym<i64>,
    w: Sym<f32>,
    out: Sym<T>,
    y: Sym<T>,
    factors: Sym<f32>,
    /// `E/n` ones: identity experts of a token-major buffer (which gather into `y`).
    ones: Sym<f32>,
    /// Elements by which x, y and out start after their objects' starts (views: 1 makes every
    /// row address miss 16-byte alignment, so the kernels take their scalar paths).
    shift: usize,
}

impl<T: Elem> Inputs<T> {
    fn view<'a>(&self, s: &'a Sym<T>) -> Result<rshmem::SymView<'a, T>> {
        s.view(self.shift * std::mem::size_of::<T>(), s.len() - self.shift)
    }
}

fn inputs<T: Elem>(pe: &Pe, cfg: &EpConfig, n: usize) -> Result<Inputs<T>> {
    inputs_shifted(pe, cfg, n, 0)
}

/// Inputs whose views start `shift` (0 or 1) elements after their objects (of one size on
/// every PE: the shift may differ between PEs).
fn inputs_shifted<T: Elem>(pe: &Pe, cfg: &EpConfig, n: usize, shift: usize) -> Result<Inputs<T>> {
    let rows = n * cfg.max_tokens * cfg.max_topk;
    assert!(shift <= 1);
    Ok(Inputs {
        x: pe.alloc(cfg.max_tokens * cfg.hidden + 1)?,
        ids32: pe.alloc(cfg.max_tokens * cfg.max_topk)?,
        ids64: pe.alloc(cfg.max_tokens * cfg.max_topk)?,
        w: pe.alloc(cfg.max_tokens * cfg.max_topk)?,
        out: pe.alloc(cfg.max_tokens * cfg.hidden + 1)?,
        y: pe.alloc(rows * cfg.hidden + 1)?,
        factors: pe.alloc(cfg.num_experts / n)?,
        ones: pe.alloc(cfg.num_experts / n)?,
        shift,
    })
}

fn free_inputs<T: Elem>(pe: &Pe, i: Inputs<T>) -> Result<()> {
    pe.free(i.ones)?;
    pe.free(i.factors)?;
    pe.free(i.y)?;
    pe.free(i.out)?;
    pe.free(i.w)?;
    pe.free(i.ids64)?;
    pe.free(i.ids32)?;
    pe.free(i.x)
}

struct Step {
    case: Case,
    t: usize,
    k: usize,
    seed: u64,
    i64_ids: bool,
    scale: bool,
}

/// Writes this PE's inputs of `st`.
fn write_inputs<T: Elem>(pe: &Pe, cfg: &EpConfig, inp: &Inputs<T>, st: &Step) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let (ids, w) = routing(me, n, st.case, st.t, st.k, cfg.num_experts, st.seed);
    let h = cfg.hidden;
    let xs: Vec<T> = (0..st.t * h).map(|i| xval(me, i / h, i % h)).collect();
    pe.local_write(&inp.x, inp.shift, &xs)?;
    let i32s: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
    pe.local_write(&inp.ids32, 0, &i32s)?;
    pe.local_write(&inp.ids64, 0, &ids)?;
    pe.local_write(&inp.w, 0, &w)?;
    let f: Vec<f32> = (0..cfg.num_experts / n).map(factor).collect();
    pe.local_write(&inp.factors, 0, &f)?;
    pe.local_fill(&inp.ones, 1.0)?;
    pe.local_fill(&inp.out, T::from_f64(-77.0))?;
    Ok(())
}

fn dispatch<T: Elem>(
    pe: &Pe,
    s: &Stream,
    buf: &GpuBuffer<T>,
    inp: &Inputs<T>,
    st: &Step,
) -> Result<Dispatch> {
    let x = inp.view(&inp.x)?;
    if st.i64_ids {
        buf.dispatch(pe, s, &x, &inp.ids64.slice(..st.t * st.k)?, &inp.w, st.k)
    } else {
        buf.dispatch(pe, s, &x, &inp.ids32.slice(..st.t * st.k)?, &inp.w, st.k)
    }
}

/// Queues expert computation and combine after a dispatch.
fn expert_and_combine<T: Elem>(
    pe: &Pe,
    s: &Stream,
    buf: &GpuBuffer<T>,
    inp: &Inputs<T>,
    d: &Dispatch,
    scale: bool,
) -> Result<()> {
    let (y, out) = (inp.view(&inp.y)?, inp.view(&inp.out)?);
    if buf.config().layout == RecvLayout::TokenMajor {
        // The experts gather their rows from the receive area into expert-major outputs.
        let f = if scale { &inp.factors } else { &inp.ones };
        buf.scale_experts(pe, s, &buf.recv_x()?, &y, f)?;
        return buf.combine(pe, s, d, &y, &out);
    }
    if scale {
        buf.scale_experts(pe, s, &buf.expert_x()?, &y, &inp.factors)?;
        buf.combine(pe, s, d, &y, &out)
    } else {
        buf.combine(pe, s, d, &buf.expert_x()?, &out)
    }
}

/// Poisons the dispatch output area of `buf` (expert-major rows, or the receive area of a
/// token-major buffer) with -55.
fn poison_output<T: Elem>(pe: &Pe, buf: &GpuBuffer<T>) -> Result<()> {
    match buf.config().layout {
        RecvLayout::ExpertMajor => pe.local_fill(&buf.expert_x()?, T::from_f64(-55.0)),
        RecvLayout::TokenMajor => pe.local_fill(&buf.recv_x()?, T::from_f64(-55.0)),
    }
}

/// Checks the dispatch result (handle, expert-major rows) and the combine output of `st`
/// against a host reference computed from every PE's deterministic inputs.
fn verify<T: Elem>(
    pe: &Pe,
    cfg: &EpConfig,
    buf: &GpuBuffer<T>,
    inp: &Inputs<T>,
    st: &Step,
    rows: Option<usize>,
) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let e_n = cfg.num_experts;
    let el = e_n / n;
    let h = cfg.hidden;
    let (t, k) = (st.t, st.k);
    let all: Vec<(Vec<i64>, Vec<f32>)> = (0..n)
        .map(|p| routing(p, n, st.case, t, k, e_n, st.seed))
        .collect();
    let hh = buf.host_handle(pe)?;
    // Tokens received per source, expected rows per local expert.
    let mut want_rows: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); el];
    for (p, (ids, _)) in all.iter().enumerate() {
        let mut cnt = 0;
        for tok in 0..t {
            let mut here = false;
            for j in 0..k {
                let id = ids[tok * k + j];
                if id >= 0 && id as usize / el == me {
                    here = true;
                    want_rows[id as usize % el].push((p, tok, j));
                }
            }
            cnt += here as usize;
        }
        assert_eq!(
            hh.recv_tokens_per_pe[p], cnt,
            "PE {me}: tokens from PE {p} ({:?} t={t} k={k})",
            st.case
        );
    }
    let total: usize = want_rows.iter().map(|v| v.len()).sum();
    assert_eq!(hh.rows.len(), total, "PE {me}: rows");
    if let Some(r) = rows {
        assert_eq!(r, total, "PE {me}: rows reported by normal mode");
    }
    if cfg.layout == RecvLayout::TokenMajor {
        verify_token_major(pe, cfg, buf, &all, st, &hh, &want_rows)?;
    } else {
        let xs = pe.local_vec(&buf.expert_x()?)?;
        #[allow(clippy::needless_range_loop)]
        for e in 0..el {
            let (a, b) = (hh.expert_offsets[e], hh.expert_offsets[e + 1]);
            let mut got: Vec<(usize, usize, usize)> = hh.rows[a..b].to_vec();
            for (r, &(p, tok, _)) in hh.rows[a..b].iter().enumerate() {
                for c in 0..h {
                    let v = xs[(a + r) * h + c];
                    assert!(
                        v == xval::<T>(p, tok, c),
                        "PE {me}: expert {e} row {} (from PE {p} token {tok}) element {c}: {v:?}",
                        a + r
                    );
                }
            }
            got.sort();
            let mut want = want_rows[e].clone();
            want.sort();
            assert_eq!(
                got, want,
                "PE {me}: rows of local expert {e} ({:?})",
                st.case
            );
        }
        // Nothing beyond the rows (poisoned before the dispatch).
        for (i, v) in xs[total * h..].iter().enumerate() {
            assert!(
                *v == T::from_f64(-55.0),
                "PE {me}: expert-major area written beyond the rows at {}",
                total * h + i
            );
        }
    }
    // Combine: per destination PE a partial sum (slot order, f32) rounded to T, then the sum
    // over PEs (ascending, f32) rounded to T.
    let out_all = pe.local_vec(&inp.out)?;
    assert!(
        out_all[..inp.shift]
            .iter()
            .all(|v| *v == T::from_f64(-77.0)),
        "PE {me}: combine wrote before its output view"
    );
    let out = &out_all[inp.shift..];
    let (ids, w) = &all[me];
    for tok in 0..t {
        for c in 0..h {
            let xv = xval::<T>(me, tok, c).to_f64() as f32;
            let mut acc = 0f32;
            for d in 0..n {
                let mut part = 0f32;
                let mut any = false;
                for j in 0..k {
                    let id = ids[tok * k + j];
                    if id >= 0 && id as usize / el == d {
                        any = true;
                        let yv = if st.scale {
                            rt::<T>(xv * factor(id as usize % el))
                        } else {
                            xv
                        };
                        part += w[tok * k + j] * yv;
                    }
                }
                if any {
                    acc += rt::<T>(part);
                }
            }
            let want = T::from_f64(acc as f64);
            let got = out[tok * h + c];
            assert!(
                got == want,
                "PE {me}: combine token {tok} element {c}: {got:?} != {want:?} ({:?} k={k})",
                st.case
            );
        }
    }
    for v in &out[t * h..] {
        assert!(
            *v == T::from_f64(-77.0),
            "PE {me}: combine wrote beyond T rows"
        );
    }
    Ok(())
}

/// The token-major dispatch output: the receive area holds each source's tokens once, in its
/// token order, rows beyond them untouched (poisoned), and the expert-major index points every
/// row of every local expert at the receive row of its (source, token).
fn verify_token_major<T: Elem>(
    pe: &Pe,
    cfg: &EpConfig,
    buf: &GpuBuffer<T>,
    all: &[(Vec<i64>, Vec<f32>)],
    st: &Step,
    hh: &ep::HostHandle,
    want_rows: &[Vec<(usize, usize, usize)>],
) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let el = cfg.num_experts / n;
    let (h, t, k) = (cfg.hidden, st.t, st.k);
    let cap = buf.pair_capacity();
    assert!(
        buf.expert_x().is_err(),
        "a token-major buffer has no expert-major area"
    );
    let rx = pe.local_vec(&buf.recv_x()?)?;
    assert_eq!(rx.len(), n * cap * h);
    // Receive row of (source p, token tok).
    let mut row_of = std::collections::HashMap::new();
    for (p, (ids, _)) in all.iter().enumerate() {
        let toks: Vec<usize> = (0..t)
            .filter(|&tok| {
                (0..k).any(|j| {
                    let id = ids[tok * k + j];
                    id >= 0 && id as usize / el == me
                })
            })
            .collect();
        for row in 0..cap {
            let at = (p * cap + row) * h;
            for c in 0..h {
                let want = match toks.get(row) {
                    Some(&tok) => xval::<T>(p, tok, c),
                    None => T::from_f64(-55.0),
                };
                assert!(
                    rx[at + c] == want,
                    "PE {me}: receive row {row} from PE {p} element {c}: {:?} != {want:?} ({:?})",
                    rx[at + c],
                    st.case
                );
            }
        }
        for (i, &tok) in toks.iter().enumerate() {
            row_of.insert((p, tok), p * cap + i);
        }
    }
    let src = pe.local_vec(&buf.expert_src()?)?;
    let km = cfg.max_topk;
    for (e, want) in want_rows.iter().enumerate() {
        let (a, b) = (hh.expert_offsets[e], hh.expert_offsets[e + 1]);
        let mut got = hh.rows[a..b].to_vec();
        got.sort();
        let mut want = want.clone();
        want.sort();
        assert_eq!(
            got, want,
            "PE {me}: rows of local expert {e} ({:?})",
            st.case
        );
        for (r, (&(p, tok, j), &v)) in hh.rows[a..b].iter().zip(&src[a..b]).enumerate() {
            let r = a + r;
            assert_eq!(
                (v as usize / km, v as usize % km),
                (row_of[&(p, tok)], j),
                "PE {me}: expert-major row {r} (expert {e})"
            );
        }
    }
    Ok(())
}

fn run_step<T: Elem>(
    pe: &Pe,
    s: &Stream,
    cfg: &EpConfig,
    buf: &GpuBuffer<T>,
    inp: &Inputs<T>,
    st: &Step,
) -> Result<()> {
    write_inputs(pe, cfg, inp, st)?;
    poison_output(pe, buf)?;
    pe.barrier_all()?;
    let d = dispatch(pe, s, buf, inp, st)?;
    expert_and_combine(pe, s, buf, inp, &d, st.scale)?;
    s.synchronize()?;
    buf.check(pe)?;
    verify(pe, cfg, buf, inp, st, d.rows())?;
    pe.barrier_all()
}

fn cfg(n: usize, mode: EpMode) -> EpConfig {
    EpConfig {
        num_experts: 4 * n,
        max_tokens: 40,
        hidden: 72,
        max_topk: 8,
        mode,
        layout: RecvLayout::ExpertMajor,
    }
}

fn routings_body<T: Elem>(pe: &Pe, mode: EpMode) -> Result<()> {
    routings_body_with::<T>(pe, mode, 72, 0, 1..=8, RecvLayout::ExpertMajor)
}

/// The routing steps at hidden size `hidden`, with x, y and out `shift` elements into their
/// objects, random routings for each top-k in `ks`, then the special cases.
fn routings_body_with<T: Elem>(
    pe: &Pe,
    mode: EpMode,
    hidden: usize,
    shift: usize,
    ks: std::ops::RangeInclusive<usize>,
    layout: RecvLayout,
) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        hidden,
        layout,
        ..cfg(n, mode)
    };
    let buf = GpuBuffer::<T>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs_shifted::<T>(pe, &c, n, shift)?;
    let mut seed = 1;
    let mut steps = Vec::new();
    for k in ks {
        steps.push((Case::Random, 40, k));
    }
    for case in [
        Case::OnePe,
        Case::NoneToLast,
        Case::AllMinusOne,
        Case::OneExpert,
    ] {
        steps.push((case, 33, 4));
    }
    steps.push((Case::Random, 0, 3));
    steps.push((Case::Random, 1, 8));
    for (case, t, k) in steps {
        for (i64_ids, scale) in [(false, false), (true, true)] {
            seed += 1;
            let st = Step {
                case,
                t,
                k,
                seed,
                i64_ids,
                scale,
            };
            run_step(pe, &s, &c, &buf, &inp, &st)?;
        }
    }
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_normal_bf16() {
    on_gpus(2, |pe| routings_body::<bf16>(pe, EpMode::Normal));
}

gpu_mode_test!(
    gpu_ep_routings_normal_bf16,
    gpu_config(4),
    |pe| routings_body::<bf16>(pe, EpMode::Normal),
    [processes(2), mixed(4)]
);

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_normal_f32() {
    on_gpus(2, |pe| routings_body::<f32>(pe, EpMode::Normal));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_capturable_f16() {
    on_gpus(2, |pe| {
        routings_body::<rshmem::f16>(pe, EpMode::Capturable { capacity: 40 })
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_capturable_bf16() {
    on_gpus(2, |pe| {
        routings_body::<bf16>(pe, EpMode::Capturable { capacity: 40 })
    });
}

gpu_mode_test!(
    gpu_ep_routings_capturable_bf16,
    gpu_config(4),
    |pe| routings_body::<bf16>(pe, EpMode::Capturable { capacity: 40 }),
    [processes(2), mixed(4)]
);

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_4pes_f32() {
    on_gpus(4, |pe| routings_body::<f32>(pe, EpMode::Normal));
}

/// Rows of several vector chunks with a partial last one: 2056 bf16 = 257 16-byte vectors
/// (ep_send's 256-vector chunks: 2, the last of 1 vector; the reductions' 128-vector chunks: 3),
/// where the permute's vector loop once diverged (vectors mod 256 in 1..=31).
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_wide_rows_bf16() {
    on_gpus(2, |pe| {
        routings_body_with::<bf16>(pe, EpMode::Normal, 2056, 0, 7..=8, RecvLayout::ExpertMajor)?;
        routings_body_with::<bf16>(
            pe,
            EpMode::Capturable { capacity: 40 },
            2056,
            0,
            3..=3,
            RecvLayout::ExpertMajor,
        )
    });
}

/// As above for f32 (1028 = 257 vectors) and f16 at 9 vectors (one partial chunk).
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_wide_rows_f32_f16() {
    on_gpus(2, |pe| {
        routings_body_with::<f32>(pe, EpMode::Normal, 1028, 0, 8..=8, RecvLayout::ExpertMajor)?;
        routings_body_with::<rshmem::f16>(pe, EpMode::Normal, 72, 0, 8..=8, RecvLayout::ExpertMajor)
    });
}

/// x, expert outputs and out as views one element into their objects: no row address is
/// 16-byte aligned, so send, csend and crecv take their scalar paths (the results must not
/// change), with a row size the vector paths would otherwise take.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_routings_unaligned_views() {
    on_gpus(2, |pe| {
        routings_body_with::<bf16>(pe, EpMode::Normal, 72, 1, 8..=8, RecvLayout::ExpertMajor)?;
        routings_body_with::<f32>(
            pe,
            EpMode::Capturable { capacity: 40 },
            1028,
            1,
            4..=4,
            RecvLayout::ExpertMajor,
        )
    });
}

fn bad_inputs_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = cfg(n, EpMode::Normal);
    // Bad configurations: every PE gets the error.
    for bad in [
        EpConfig {
            num_experts: 3,
            ..c
        },
        EpConfig { hidden: 0, ..c },
        EpConfig { max_topk: 0, ..c },
        EpConfig {
            num_experts: 2 * 8192,
            ..c
        },
        EpConfig {
            mode: EpMode::Capturable { capacity: 41 },
            ..c
        },
    ] {
        assert!(
            matches!(
                GpuBuffer::<f32>::new(pe, pe.world_team(), bad, &ep_tuning()),
                Err(Error::InvalidArgument(_))
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        GpuBuffer::<i32>::new(pe, pe.world_team(), c, &ep_tuning()),
        Err(Error::InvalidArgument(_))
    ));
    let buf = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<f32>(pe, &c, n)?;
    let small = pe.alloc::<f32>(10)?;
    let good = Step {
        case: Case::Random,
        t: 10,
        k: 4,
        seed: 5,
        i64_ids: false,
        scale: false,
    };
    // Host-side checks on PE 0 (PE 1 is valid and must hear about it); device-side checks.
    for case in 0..7 {
        write_inputs(pe, &c, &inp, &good)?;
        if me == 0 && case == 4 {
            pe.local_write(&inp.ids32, 7, &[c.num_experts as i32])?;
        }
        if me == 0 && case == 5 {
            pe.local_write(&inp.ids32, 2, &[-2])?;
        }
        if me == 0 && case == 6 {
            let ids = pe.local_vec(&inp.ids32)?;
            let j = ids.iter().position(|&v| v >= 0).unwrap_or(0);
            pe.local_write(&inp.w, j, &[f32::NAN])?;
        }
        pe.barrier_all()?;
        let r = if me == 0 {
            match case {
                0 => buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..0)?, &inp.w, 0),
                1 => buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..90)?, &inp.w, 9),
                2 => buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..164)?, &inp.w, 4),
                3 => buf.dispatch(pe, &s, &small, &inp.ids32.slice(..40)?, &inp.w, 4),
                _ => buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..40)?, &inp.w, 4),
            }
        } else if case == 3 {
            // ids that are not a whole number of tokens on PE 1 instead.
            buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..39)?, &inp.w, 4)
        } else {
            buf.dispatch(pe, &s, &inp.x, &inp.ids32.slice(..40)?, &inp.w, 4)
        };
        match r {
            Err(Error::InvalidArgument(_)) | Err(Error::LengthMismatch { .. }) => {}
            other => panic!("PE {me} bad case {case}: expected an error, got {other:?}"),
        }
        s.synchronize()?;
        buf.check(pe)?;
        pe.barrier_all()?;
    }
    // Combine: handles and sizes (every PE makes the same mistake: no kernel runs anywhere).
    run_step(pe, &s, &c, &buf, &inp, &good)?;
    let d1 = dispatch(pe, &s, &buf, &inp, &good)?;
    let d2 = dispatch(pe, &s, &buf, &inp, &good)?;
    assert!(matches!(
        buf.combine(pe, &s, &d1, &buf.expert_x()?, &inp.out),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        buf.combine(pe, &s, &d2, &small, &inp.out),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        buf.combine(pe, &s, &d2, &buf.expert_x()?, &small),
        Err(Error::LengthMismatch { .. })
    ));
    let other = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &ep_tuning())?;
    assert!(matches!(
        other.combine(pe, &s, &d2, &other.expert_x()?, &inp.out),
        Err(Error::InvalidArgument(_))
    ));
    buf.combine(pe, &s, &d2, &buf.expert_x()?, &inp.out)?;
    s.synchronize()?;
    buf.check(pe)?;
    verify(pe, &c, &buf, &inp, &good, d2.rows())?;
    pe.barrier_all()?;
    pe.free(other)?;
    pe.free(small)?;
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_bad_inputs() {
    on_gpus(2, bad_inputs_body);
}
