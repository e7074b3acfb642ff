//! GPU MoE dispatch/combine (`rshmem::cuda::ep`). The first test runs everywhere (CI: NVRTC
//! compiles the kernels for every hidden/id type); the others need GPUs (`--include-ignored`).
//! PEs are threads; `RSHMEM_DEVICES` (e.g. `0,0` on one GPU) is cycled to the team size. The
//! bf16 routings and graph replay also run as launched processes and in mixed mode
//! (`harness::gpu_run`).

mod harness;

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
    let ci = std::env::var_os("CI").is_some();
    let src = cuda::nvrtc::with_header(ep::EP_KERNELS);
    for t in [ElemKind::F32, ElemKind::Bf16, ElemKind::F16] {
        for id in [ElemKind::I32, ElemKind::I64] {
            let opts = ep::kernel_options(t, id, &ep_tuning().nvrtc_options).unwrap();
            let o: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
            match cuda::nvrtc::compile_uncached(&src, "sm_90", &o) {
                Ok(cubin) => assert!(cubin.len() > 100, "{t:?}/{id:?}: empty cubin"),
                Err(e) => {
                    let missing = format!("{e}").contains("was not found");
                    if missing && !ci {
                        eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
                        return;
                    }
                    panic!("{t:?}/{id:?}: {e}");
                }
            }
        }
    }
    assert!(ep::kernel_options(ElemKind::I32, ElemKind::I32, &[]).is_err());
    assert!(ep::kernel_options(ElemKind::F32, ElemKind::U32, &[]).is_err());
}

// ---------- GPU tests ----------

fn gpu_config(n: usize) -> Config {
    let devs: Vec<usize> = std::env::var("RSHMEM_DEVICES")
        .ok()
        .and_then(|v| v.split(',').map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    let c = Config::default()
        .heap_size(256 << 20)
        .timeout(Duration::from_secs(20))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static);
    if devs.is_empty() {
        c
    } else {
        c.devices((0..n).map(|i| devs[i % devs.len()]).collect())
    }
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
    let r = rshmem::threads_with(cfg, 2, body).expect("world");
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

fn graph_body(pe: &Pe) -> Result<()> {
    graph_body_with(pe, RecvLayout::ExpertMajor)
}

fn graph_body_with(pe: &Pe, layout: RecvLayout) -> Result<()> {
    graph_body_mode(pe, EpMode::Capturable { capacity: 40 }, layout)
}

fn graph_body_mode(pe: &Pe, mode: EpMode, layout: RecvLayout) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = EpConfig {
        layout,
        ..cfg(n, mode)
    };
    let buf = GpuBuffer::<bf16>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<bf16>(pe, &c, n)?;
    let t = 37;
    let k = 6;
    let first = Step {
        case: Case::Random,
        t,
        k,
        seed: 100,
        i64_ids: false,
        scale: true,
    };
    write_inputs(pe, &c, &inp, &first)?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &first).and_then(|d| {
        // Counts stay on the device while capturing, in both modes.
        assert_eq!(d.rows(), None);
        assert!(s.is_capturing()?);
        expert_and_combine(pe, &s, &buf, &inp, &d, true)
    });
    let graph = s.end_capture()?;
    captured?;
    for rep in 0..14u64 {
        let case = match rep % 7 {
            3 => Case::OnePe,
            4 => Case::AllMinusOne,
            5 => Case::NoneToLast,
            _ => Case::Random,
        };
        let st = Step {
            case,
            t,
            k,
            seed: 200 + rep,
            i64_ids: false,
            scale: true,
        };
        write_inputs(pe, &c, &inp, &st)?;
        poison_output(pe, &buf)?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        buf.check(pe)?;
        verify(pe, &c, &buf, &inp, &st, None)?;
        pe.barrier_all()?;
    }
    // Every slot of every token to one expert (duplicate ids): 444 rows on PE 0.
    let one = Step {
        case: Case::OneExpert,
        t,
        k,
        seed: 1,
        i64_ids: false,
        scale: true,
    };
    write_inputs(pe, &c, &inp, &one)?;
    poison_output(pe, &buf)?;
    pe.barrier_all()?;
    graph.launch(&s)?;
    s.synchronize()?;
    buf.check(pe)?;
    verify(pe, &c, &buf, &inp, &one, None)?;
    pe.barrier_all()?;
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_changing_routing() {
    on_gpus(2, graph_body);
}

gpu_mode_test!(
    gpu_ep_graph_replay_changing_routing,
    gpu_config(4),
    graph_body,
    [processes(2), mixed(4)]
);

/// Token-major buffers (each token once per PE, experts gather through the expert-major
/// index): every routing, both modes and id types, identity and scaling experts, wide rows.
fn token_major_body(pe: &Pe) -> Result<()> {
    let tm = RecvLayout::TokenMajor;
    routings_body_with::<bf16>(pe, EpMode::Normal, 72, 0, 1..=8, tm)?;
    routings_body_with::<f32>(pe, EpMode::Capturable { capacity: 40 }, 1028, 1, 3..=4, tm)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_token_major_routings() {
    on_gpus(2, token_major_body);
}

gpu_mode_test!(
    gpu_ep_token_major_routings,
    gpu_config(4),
    token_major_body,
    [processes(2)]
);

/// Normal mode captured too: while the stream captures, dispatch does not synchronise (the
/// counts stay on the device, `rows()` is `None`), and the graph replays with changing routing.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_normal_mode() {
    on_gpus(2, |pe| {
        graph_body_mode(pe, EpMode::Normal, RecvLayout::ExpertMajor)?;
        graph_body_mode(pe, EpMode::Normal, RecvLayout::TokenMajor)
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_token_major_graph_replay() {
    on_gpus(2, |pe| graph_body_with(pe, RecvLayout::TokenMajor));
}

fn graph_overflow_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let c = cfg(n, EpMode::Capturable { capacity: 12 });
    let buf = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &ep_tuning())?;
    let inp = inputs::<f32>(pe, &c, n)?;
    let t = 20;
    let k = 3;
    let good = |seed| Step {
        case: Case::OnePe,
        t,
        k,
        seed,
        i64_ids: true,
        scale: true,
    }; // 10 per PE
    write_inputs(pe, &c, &inp, &good(1))?;
    pe.barrier_all()?;
    s.begin_capture()?;
    let captured = dispatch(pe, &s, &buf, &inp, &good(1))
        .and_then(|d| expert_and_combine(pe, &s, &buf, &inp, &d, true));
    let graph = s.end_capture()?;
    captured?;
    for rep in 0..10u64 {
        let overflow = rep % 3 == 1;
        let st = if overflow {
            Step {
                case: Case::OneExpert,
                t,
                k,
                seed: rep,
                i64_ids: true,
                scale: true,
            } // 20 > 12
        } else {
            good(10 + rep)
        };
        write_inputs(pe, &c, &inp, &st)?;
        pe.local_fill(&buf.expert_x()?, -55.0)?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        if overflow {
            match buf.check(pe) {
                Err(Error::Capacity {
                    needed: 20,
                    capacity: 12,
                    ..
                }) => {}
                other => panic!(
                    "PE {} replay {rep}: expected a capacity error, got {other:?}",
                    pe.my_pe()
                ),
            }
            assert!(
                pe.local_vec(&inp.out)?.iter().all(|v| *v == -77.0),
                "combine wrote despite overflow"
            );
        } else {
            buf.check(pe)?;
            verify(pe, &c, &buf, &inp, &st, None)?;
        }
        pe.barrier_all()?;
    }
    drop(graph);
    free_inputs(pe, inp)?;
    pe.free(buf)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_graph_replay_with_overflow() {
    on_gpus(2, graph_overflow_body);
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
