//! The MoE benchmark (`rshmem perf --backend cuda --ep`): dispatch and combine timed beside
//! the same-run NCCL baseline of [`ep_baseline`](crate::ep_baseline), with both paths' data
//! checked; at decode sizes also the low-latency buffer ([`ep_ll`](crate::ep_ll)).

use crate::ep_baseline as baseline;
use crate::nccl;
use crate::timing::{stage_times, time_stream};
use crate::Settings;
use rshmem::cuda::ep::{Dispatch, EpTuning, GpuBuffer};
use rshmem::cuda::CudaPe;
use rshmem::ep::{EpConfig, EpMode, RecvLayout};
use rshmem::{Elem, Error, Pe, Result};

/// Most blocks of the baseline's and the checks' grid kernels (one per SM), as the MoE
/// kernels' grid.
const MAX_GRID: u32 = 1024;

/// One EP measurement (the `rshmem perf` JSON schema plus the token count).
#[derive(Debug, Clone, PartialEq)]
pub struct EpBenchRecord {
    /// `ep_dispatch` or `ep_combine`.
    pub op: &'static str,
    /// Always "device".
    pub api: &'static str,
    /// Always "cuda".
    pub backend: &'static str,
    /// `normal` or `capturable`.
    pub mode: &'static str,
    /// Team size.
    pub pes: usize,
    /// Tokens per PE.
    pub tokens: usize,
    /// Bytes PE 0 sent to other PEs per call (DeepEP's convention).
    pub bytes: usize,
    /// Calls timed.
    pub iters: usize,
    /// Microseconds per call.
    pub time_us: f64,
    /// bytes / time in GB/s.
    pub gbps: f64,
    /// The baseline's name ([`EP_BASELINE`]).
    pub baseline: String,
    /// Why the baseline is missing, when it is.
    pub baseline_note: Option<String>,
    /// Baseline microseconds per call (0 when missing).
    pub baseline_time_us: f64,
    /// baseline_time_us / time_us (0 when missing).
    pub ratio: f64,
}

/// What [`ep_bench`] measures.
#[derive(Debug, Clone)]
pub struct EpBenchArgs {
    /// Token counts per PE (e.g. 4096 and 128).
    pub tokens: Vec<usize>,
    /// Hidden size.
    pub hidden: usize,
    /// Top-k.
    pub top_k: usize,
    /// Experts.
    pub experts: usize,
    /// Timed iterations.
    pub iters: usize,
}

impl Default for EpBenchArgs {
    fn default() -> Self {
        EpBenchArgs {
            tokens: vec![4096, 128],
            hidden: 7168,
            top_k: 8,
            experts: 256,
            iters: 20,
        }
    }
}

/// Deterministic random routing of PE `pe`: `top_k` distinct experts per token, weights.
pub fn bench_routing(pe: usize, t: usize, k: usize, e: usize) -> (Vec<i32>, Vec<f32>) {
    let mut st = 0x9e37_79b9_7f4a_7c15u64 ^ ((pe as u64 + 1) << 20);
    let mut next = || {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        st
    };
    let mut ids = Vec::with_capacity(t * k);
    let mut w = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::with_capacity(k);
        while chosen.len() < k.min(e) {
            let c = (next() % e as u64) as i32;
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        chosen.resize(k, -1);
        for c in chosen {
            ids.push(c);
            w.push(((next() % 8) + 1) as f32 / 8.0);
        }
    }
    (ids, w)
}

/// With `-DEP_STAMPS=1` (RSHMEM_CUDA_EP_NVRTC_OPTS): prints the last dispatch's and combine's
/// clock stamps (control words 16.., `kernels/common.cuh` says which); nothing when they were not compiled in.
fn print_stamps<T: Elem>(pe: &Pe, buf: &GpuBuffer<T>, what: &str) -> Result<()> {
    let c = buf.stamps(pe)?;
    if c[0] == 0 {
        return Ok(());
    }
    let us = |k: usize| c[k].wrapping_sub(c[0]) as i64 as f64 / 1e3;
    eprintln!(
        "ep stamps {what} (us after layout start): layout {:.1} peers ready {:.1} records out {:.1} | send {:.1}-{:.1} | records in {:.1} rows in {:.1} wait end {:.1} | index or pstream {:.1}-{:.1}",
        us(1), us(2), us(3), us(4), us(5), us(6), us(7), us(8), us(9), us(10)
    );
    let cs = |k: usize| c[k].wrapping_sub(c[11]) as i64 as f64 / 1e3;
    eprintln!(
        "ep stamps {what} (us after csend start): csend end {:.1} wait end {:.1} crecv {:.1}-{:.1} (cwait start {:.1}, crecv blocks' latest start {:.1})",
        cs(12),
        cs(13),
        cs(14),
        cs(15),
        cs(22),
        cs(23)
    );
    eprintln!(
        "ep stamps {what} (us after layout start): layout blocks' latest start {:.1}, tokens counted {:.1}, counts fenced {:.1}; dwait start {:.1}, its gate open {:.1}, pstream blocks' latest start {:.1}",
        us(16), us(17), us(18), us(21), us(20), us(19)
    );
    Ok(())
}

/// The baseline's name in the records.
pub const EP_BASELINE: &str = "nccl-a2av";

/// Symmetric heap bytes per PE [`ep_bench`] needs for `args` on `n` PEs (upper bound).
pub fn ep_bench_heap_bytes(args: &EpBenchArgs, n: usize) -> Result<usize> {
    let mut most = 0usize;
    for &t in &args.tokens {
        let cfg = EpConfig::new(args.experts, t.max(1), args.hidden, args.top_k);
        let es = std::mem::size_of::<rshmem::bf16>();
        let buf = GpuBuffer::<rshmem::bf16>::bytes_for(&cfg, n)?;
        let rows_cap = n * t * args.top_k;
        let io = 2 * t * args.hidden * es
            + 2 * t * args.top_k * 4
            + (rows_cap.max(n * t).max(t) + 1) * 8;
        let base = baseline::base_bytes(n, t, args.hidden, args.top_k, args.experts, rows_cap);
        // The low-latency buffer, at decode sizes (it is freed before the other modes' run).
        let ll = crate::ep_ll::ll_heap_bytes(t, args.hidden, args.experts, args.top_k, n)?;
        most = most.max(buf.max(ll) + io + base);
    }
    Ok(most + (64 << 20))
}

/// Benchmarks dispatch and combine (bf16, random routing, both modes) on the world team beside
/// the same-run NCCL all-to-all-v baseline (`baseline.rs` says exactly what it includes), and
/// checks the data of both: the expert-major rows per local expert and the combine output per
/// token against a reference computed from the known inputs (checksums; identity experts).
/// Each mode runs twice: expert-major (`normal`, `capturable`) and token-major (`normal+tokens`,
/// `capturable+tokens`: dispatch checked through the expert-major index, combine through
/// [`GpuBuffer::combine_tokens`] with the receive rows as per-token results). Collective; the heap
/// must hold [`ep_bench_heap_bytes`]. The baseline is reported missing (with the reason in
/// `baseline`, time and ratio 0) when NCCL cannot be loaded on some PE or the PEs share a GPU
/// (NCCL needs one GPU per rank). Returns PE 0's records (others an empty list); a failed data
/// check on any PE is an error on that PE. `settings.ep_breakdown` (`RSHMEM_EP_BREAKDOWN`)
/// adds per-kernel times and clock stamps on stderr.
pub fn ep_bench(pe: &Pe, args: &EpBenchArgs, settings: &Settings) -> Result<Vec<EpBenchRecord>> {
    use crate::ep_check as ck;
    use baseline::{self as eb, NcclBase};
    use rshmem::bf16 as Bf16;
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let n = pe.n_pes();
    let tuning = EpTuning::from_env()?;
    let me = pe.my_pe();
    let h = args.hidden;
    let k = args.top_k;
    let e = args.experts;
    let es = std::mem::size_of::<Bf16>();
    let cfg_of = |t: usize, mode, layout| {
        EpConfig::new(e, t.max(1), h, k)
            .with_mode(mode)
            .with_layout(layout)
    };
    for &t in &args.tokens {
        // The configuration and the GPU limits (PEs, experts) that the baseline's kernels share
        // with rshmem's, checked before anything collective.
        GpuBuffer::<Bf16>::bytes_for(&EpConfig::new(e, t.max(1), h, k), n)?;
    }
    let kernels = eb::Kernels::load(&g, &tuning.nvrtc_options)?;
    let lib = nccl::Nccl::load();
    let (comm, why) = nccl::world_comm(pe, &g, &lib)?;
    let grid = (g.sm_count() as u32).clamp(1, MAX_GRID);
    // Data check failures, reported after the collective steps (so no PE is left waiting).
    let mut bad: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for &t in &args.tokens {
        let routes: Vec<(Vec<i32>, Vec<f32>)> = (0..n).map(|p| bench_routing(p, t, k, e)).collect();
        let epp = e / n;
        // Tokens PE p sends to PE d.
        let cnt = |p: usize, d: usize| -> usize {
            routes[p]
                .0
                .chunks(k)
                .filter(|row| row.iter().any(|&id| id >= 0 && id as usize / epp == d))
                .count()
        };
        // Expert-major rows on PE d.
        let rows_on = |d: usize| -> usize {
            routes
                .iter()
                .map(|(ids, _)| {
                    ids.iter()
                        .filter(|&&id| id >= 0 && id as usize / epp == d)
                        .count()
                })
                .sum()
        };
        let rows_cap = (0..n).map(rows_on).max().unwrap_or(0).max(1);
        let dbytes: usize = (0..n)
            .filter(|&d| d != me)
            .map(|d| cnt(me, d))
            .sum::<usize>()
            * h
            * es;
        let cbytes: usize = (0..n)
            .filter(|&s| s != me)
            .map(|s| cnt(s, me))
            .sum::<usize>()
            * h
            * es;
        let max_pair = (0..n)
            .flat_map(|p| (0..n).map(move |d| (p, d)))
            .map(|(p, d)| cnt(p, d))
            .max()
            .unwrap_or(1)
            .max(1);
        let reference = ck::reference(&routes, me, t, h, k, e);
        let x = pe.alloc_aligned::<Bf16>((t * h).max(1), 256)?;
        let ids = pe.alloc::<i32>((t * k).max(1))?;
        let w = pe.alloc::<f32>((t * k).max(1))?;
        let hashes = pe.alloc::<u64>(rows_cap.max(n * t).max(t).max(1))?;
        let xs: Vec<Bf16> = (0..t * h).map(|i| ck::x_val(me, i)).collect();
        pe.local_write(&x, 0, &xs)?;
        pe.local_write(&ids, 0, &routes[me].0)?;
        pe.local_write(&w, 0, &routes[me].1)?;
        let y = pe.alloc_aligned::<Bf16>((t * h).max(1), 256)?;

        // The baseline (same inputs), timed and checked.
        let (mut base_d, mut base_c) = (0.0, 0.0);
        if let Some(c) = &comm {
            let mut b = NcclBase::new(pe, c, &kernels, t, h, k, e, rows_cap, grid)?;
            pe.barrier_all()?;
            let r = (|| -> Result<()> {
                base_d = time_stream(&g, &s, args.iters, || b.dispatch(pe, &g, &s, &x, &ids, &w))?;
                s.synchronize()?;
                let off = b.offsets(pe)?;
                let rows = off.last().copied().unwrap_or(0).min(rows_cap);
                let hs = ck::row_hashes(pe, &g, &s, &kernels, &b.ex, rows, h, &hashes, grid)?;
                if let Err(m) = ck::check_dispatch("nccl baseline dispatch", &off, &hs, &reference)
                {
                    bad.push(format!("T={t}: {m}"));
                }
                base_c = time_stream(&g, &s, args.iters, || b.combine(&g, &s))?;
                let hs = ck::row_hashes(pe, &g, &s, &kernels, &b.out, t, h, &hashes, grid)?;
                if let Err(m) = ck::check_combine("nccl baseline combine", &hs, &reference) {
                    bad.push(format!("T={t}: {m}"));
                }
                Ok(())
            })();
            s.synchronize()?;
            pe.barrier_all()?;
            b.free(pe)?;
            r?;
        }

        let modes = [
            EpMode::Normal,
            EpMode::Capturable {
                capacity: max_pair.min(t.max(1)),
            },
        ];
        for mode in modes {
            // Expert-major (identity experts: combine reads expert_x), then token-major (the
            // same dispatch without the expanded copy; combine_tokens sends each PE's receive
            // rows back as its per-token results, so out = x * the PEs the token went to).
            for layout in [RecvLayout::ExpertMajor, RecvLayout::TokenMajor] {
                let tokens = layout == RecvLayout::TokenMajor;
                let buf =
                    GpuBuffer::<Bf16>::new(pe, pe.world_team(), cfg_of(t, mode, layout), &tuning)?;
                let name = match (mode == EpMode::Normal, tokens) {
                    (true, false) => "normal",
                    (false, false) => "capturable",
                    (true, true) => "normal+tokens",
                    (false, true) => "capturable+tokens",
                };
                let yin = if tokens {
                    buf.recv_x()?
                } else {
                    buf.expert_x()?
                };
                let combine = |d: &Dispatch, m: &mut dyn FnMut() -> Result<()>| {
                    buf.combine_marked(pe, &s, d, &yin, &y, tokens, m)
                };
                let (td, tc) = if mode == EpMode::Normal {
                    let mut last = None;
                    let td = time_stream(&g, &s, args.iters, || {
                        last = Some(buf.dispatch(pe, &s, &x, &ids.slice(..t * k)?, &w, k)?);
                        Ok(())
                    })?;
                    let d = last.ok_or_else(|| Error::InvalidArgument("no dispatch".into()))?;
                    let tc = time_stream(&g, &s, args.iters, || combine(&d, &mut || Ok(())))?;
                    (td, tc)
                } else {
                    // Capture one dispatch and one combine, replay each.
                    buf.dispatch(pe, &s, &x, &ids.slice(..t * k)?, &w, k)?;
                    s.synchronize()?;
                    buf.check(pe)?;
                    pe.barrier_all()?;
                    s.begin_capture()?;
                    let d = buf.dispatch(pe, &s, &x, &ids.slice(..t * k)?, &w, k);
                    let gd = s.end_capture()?;
                    let d = d?;
                    s.begin_capture()?;
                    let r = combine(&d, &mut || Ok(()));
                    let gc = s.end_capture()?;
                    r?;
                    let td = time_stream(&g, &s, args.iters, || gd.launch(&s))?;
                    let tc = time_stream(&g, &s, args.iters, || gc.launch(&s))?;
                    (td, tc)
                };
                s.synchronize()?;
                buf.check(pe)?;
                if me == 0 && settings.ep_breakdown {
                    // The timed calls' own stamps (no events between their kernels).
                    print_stamps(pe, &buf, &format!("T={t} {name} timed"))?;
                }
                // The data of the last calls: each expert's rows (gathered through the index
                // when token-major) and the combine output.
                let hh = buf.host_handle(pe)?;
                let rows = hh.expert_offsets.last().copied().unwrap_or(0);
                let dispatch_hashes = if tokens {
                    let recv_rows = buf.recv_rows();
                    let hs =
                        ck::row_hashes(pe, &g, &s, &kernels, &yin, recv_rows, h, &hashes, grid)?;
                    let index = buf.expert_src()?;
                    let src = pe.local_vec(&index.slice(..rows.min(buf.max_rows()))?)?;
                    src.iter()
                        .map(|&v| hs.get(v as usize / k).copied())
                        .collect()
                } else {
                    let rows = rows.min(rows_cap);
                    Some(ck::row_hashes(
                        pe, &g, &s, &kernels, &yin, rows, h, &hashes, grid,
                    )?)
                };
                let what = format!("rshmem dispatch ({name})");
                match dispatch_hashes {
                    None => bad.push(format!(
                        "T={t}: {what}: an expert row points outside the receive area"
                    )),
                    Some(hs) => {
                        if let Err(m) =
                            ck::check_dispatch(&what, &hh.expert_offsets, &hs, &reference)
                        {
                            bad.push(format!("T={t}: {m}"));
                        }
                    }
                }
                let want = if tokens {
                    ck::Reference {
                        out_hash: ck::reference_token_combine(&routes, me, t, h, k, e),
                        ..reference.clone()
                    }
                } else {
                    reference.clone()
                };
                let hs = ck::row_hashes(pe, &g, &s, &kernels, &y, t, h, &hashes, grid)?;
                if let Err(m) = ck::check_combine(&format!("rshmem combine ({name})"), &hs, &want) {
                    bad.push(format!("T={t}: {m}"));
                }
                pe.barrier_all()?;
                if settings.ep_breakdown {
                    let mut last = None;
                    let dt = stage_times(&g, &s, args.iters, |m| {
                        last = Some(buf.dispatch_marked(
                            pe,
                            &s,
                            &x,
                            &ids.slice(..t * k)?,
                            &w,
                            k,
                            m,
                        )?);
                        Ok(())
                    })?;
                    let d = last.ok_or_else(|| Error::InvalidArgument("no dispatch".into()))?;
                    let ct = stage_times(&g, &s, args.iters, |m| combine(&d, m))?;
                    if me == 0 {
                        print_stamps(pe, &buf, &format!("T={t} {name} marked"))?;
                        let last = if tokens { "index" } else { "permute" };
                        eprintln!(
                            "ep breakdown T={t} {name} grid={}: dispatch layout/send/wait/{last} {dt:.1?} us; combine csend/wait/crecv {ct:.1?} us",
                            buf.grid()
                        );
                    }
                    s.synchronize()?;
                    buf.check(pe)?;
                    pe.barrier_all()?;
                }
                for (op, tu, bytes, base) in [
                    ("ep_dispatch", td, dbytes, base_d),
                    ("ep_combine", tc, cbytes, base_c),
                ] {
                    out.push(EpBenchRecord {
                        op,
                        api: "device",
                        backend: "cuda",
                        mode: name,
                        pes: n,
                        tokens: t,
                        bytes,
                        iters: args.iters,
                        time_us: tu,
                        gbps: if tu > 0.0 {
                            bytes as f64 / (tu * 1e3)
                        } else {
                            0.0
                        },
                        baseline: EP_BASELINE.to_string(),
                        baseline_note: why.clone(),
                        baseline_time_us: base,
                        ratio: if tu > 0.0 && base > 0.0 {
                            base / tu
                        } else {
                            0.0
                        },
                    });
                }
                pe.free(buf)?;
            }
        }
        if crate::ep_ll::measured(t, h) {
            let run = crate::ep_ll::LlRun {
                pe,
                g: &g,
                s: &s,
                x: &x,
                ids: &ids,
                w: &w,
                out: &y,
                routes: &routes,
                t,
                h,
                k,
                e,
                iters: args.iters,
                nvrtc_options: &tuning.nvrtc_options,
                dbytes,
                cbytes,
                base_d,
                base_c,
                baseline: EP_BASELINE,
                why: why.clone(),
            };
            out.extend(run.run(&mut bad)?);
        }
        pe.free(y)?;
        pe.free(hashes)?;
        pe.free(w)?;
        pe.free(ids)?;
        pe.free(x)?;
    }
    s.synchronize()?;
    drop(comm);
    pe.barrier_all()?;
    if !bad.is_empty() {
        let msg = format!("ep bench: data check failed on PE {me}: {}", bad.join("; "));
        // The environment cannot build kernels that are wrong on purpose (EpTuning refuses
        // those switches), so a failed check is an error whatever the options.
        return Err(nccl::err(msg));
    }
    Ok(if me == 0 { out } else { Vec::new() })
}
