//! rshmem-bench's CUDA suites. CI (no GPU): NVRTC compiles the suites' own kernels. On GPUs
//! (`#[ignore = "needs a GPU"]`, every world in a process of its own through the harness): the
//! point-to-point kernels move the right bytes, the NCCL binding moves data, and the suites
//! run (the MoE suite checks rshmem's and the baseline's data itself).

#[path = "../../rshmem/tests/harness/mod.rs"]
mod harness;

use rshmem::cuda::{self, CudaPe, KernelArg};
use rshmem::{BackendKind, Config, HeapKind, Pe, Result};
use rshmem_bench::{coll_cuda, ep_baseline, ep_cuda as ep, ep_ll, nccl, p2p, Settings};
use std::time::Duration;

// ---------- CI tests (no GPU needed) ----------

/// Every module the suites load compiles with NVRTC (CI has it: `source .ci/nvrtc-setup`).
#[test]
fn nvrtc_compiles_the_bench_kernels() {
    let ci = std::env::var_os("CI").is_some();
    let base = ep_baseline::kernel_options(&[]).unwrap();
    let srcs = [
        (
            "p2p kernels",
            cuda::nvrtc::with_header(p2p::P2P_KERNELS),
            Vec::new(),
        ),
        (
            "MoE baseline kernels",
            cuda::nvrtc::with_header(&ep_baseline::kernel_source()),
            base,
        ),
    ];
    for (what, src, opts) in srcs {
        let opts: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
        match cuda::nvrtc::compile_uncached(&src, "sm_90", &opts) {
            Ok(cubin) => assert!(cubin.len() > 100, "{what}: empty cubin"),
            Err(e) => {
                let missing = format!("{e}").contains("was not found");
                if missing && !ci {
                    eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
                    return;
                }
                panic!("{what}: {e}");
            }
        }
    }
}

// ---------- GPU tests ----------

/// The benchmarks' settings, from this test's environment.
fn settings() -> Settings {
    Settings::from_env().expect("RSHMEM_BENCH_* settings")
}

fn p2p_config() -> Config {
    Config::default()
        .heap_size(256 << 20)
        .timeout(Duration::from_secs(30))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static)
}

fn coll_config() -> Config {
    p2p_config().heap_size(64 << 20)
}

/// As `tests/cuda_ep.rs`: one GPU per PE where `RSHMEM_DEVICES` lists enough.
fn ep_config(n: usize) -> Config {
    let c = Config::default()
        .heap_size(256 << 20)
        .timeout(Duration::from_secs(20))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static);
    harness::cycled_devices(c, n)
}

/// The point-to-point benchmark kernels, block scope by SM and bulk (TMA), move exactly the
/// bytes they are given to or from the next PE.
fn p2p_kernels_body(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let big = 8usize << 20;
    let bsrc = pe.alloc::<u64>(big)?;
    let bdst = pe.alloc::<u64>(big)?;
    let data: Vec<u64> = (0..big as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9) ^ me as u64)
        .collect();
    pe.local_write(&bsrc, 0, &data)?;
    pe.barrier_all()?;
    let from = |p: usize| {
        move |(i, &x): (usize, &u64)| x == (i as u64).wrapping_mul(0x9e37_79b9) ^ p as u64
    };
    // The benchmark copies, block scope by SM and bulk (TMA), put then get, sizes a multiple
    // of 16 but not of the bulk stage: each block a contiguous share (piece 0), or pieces of
    // 64 KiB taken by the blocks in turn (the last one short).
    let nb = (8usize << 20) + 48;
    let kernels = [
        ("rshmemi_bench_put", false),
        ("rshmemi_bench_get", true),
        ("rshmemi_bench_put_bulk", false),
        ("rshmemi_bench_get_bulk", true),
    ];
    for (name, get) in kernels {
        let k = g.kernel(p2p::P2P_KERNELS, name, &[])?;
        for piece in [0u64, 64 << 10] {
            pe.local_fill(&bdst, 0)?;
            pe.barrier_all()?;
            let args = [
                g.arg(&bdst)?,
                g.arg(&bsrc)?,
                KernelArg::U64(nb as u64),
                KernelArg::I32(next as i32),
                KernelArg::U64(piece),
            ];
            let threads = if name.ends_with("bulk") { 32 } else { 256 };
            // SAFETY: rshmemi_bench_{put,get}{,_bulk}(char*, const char*, u64, int, u64);
            // nb bytes fit; pieces a multiple of the bulk stage.
            unsafe { g.launch(&k, &s, 7, threads, 0, &args)? };
            s.synchronize()?;
            pe.barrier_all()?;
            let got = pe.local_vec(&bdst)?;
            let w = nb / 8;
            // put: the previous PE's data arrived here; get: the next PE's source was read.
            assert!(
                got[..w]
                    .iter()
                    .enumerate()
                    .all(from(if get { next } else { prev })),
                "PE {me}: {name} (pieces {piece}) wrong"
            );
            assert!(
                got[w..].iter().all(|&x| x == 0),
                "PE {me}: {name} (pieces {piece}) wrote past the end"
            );
            pe.barrier_all()?;
        }
    }
    pe.free(bdst)?;
    pe.free(bsrc)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_p2p_kernels_move_data() {
    harness::gpu_threads(2, p2p_config(), p2p_kernels_body);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_bench_report() {
    let sizes: Vec<usize> = std::env::var("RSHMEM_BENCH_MAX")
        .ok()
        .and_then(|v| rshmem::config::parse_size(&v))
        .map(|m| {
            let mut v = vec![];
            let mut s = 4096;
            while s <= m {
                v.push(s);
                s *= 4;
            }
            v
        })
        .unwrap_or_else(|| vec![4096, 1 << 20]);
    let max = *sizes.iter().max().unwrap();
    let cfg = p2p_config().heap_size(2 * max + (64 << 20));
    let _gpu = harness::gpu_world();
    let st = settings();
    let r = threads_with(cfg, 2, |pe| p2p::bench(pe, &sizes, 20000, &st)).expect("world");
    for rec in r.into_iter().next().unwrap().unwrap() {
        println!(
            "BENCH {} bytes={} time_us={:.3} gbps={:.1} baseline={} baseline_us={:.3} ratio={:.3}",
            rec.op, rec.bytes, rec.time_us, rec.gbps, rec.baseline, rec.baseline_time_us, rec.ratio
        );
        assert!(rec.time_us > 0.0);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_bench_report() {
    let sizes: Vec<usize> = std::env::var("RSHMEM_COLL_BENCH_SIZES")
        .ok()
        .and_then(|v| v.split(',').map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 64 << 10, 1 << 20, 16 << 20, 64 << 20]);
    let max = sizes.iter().copied().max().unwrap_or(0);
    let cfg = coll_config().heap_size(2 * max + (64 << 20));
    let lib = nccl::Nccl::load();
    eprintln!("NCCL: {:?}", lib.as_ref().map(|l| l.path));
    let sz = sizes.clone();
    let _gpu = harness::gpu_world();
    let st = settings();
    let st = &st;
    let r = threads_with(cfg, 2, move |pe| coll_cuda::coll_bench(pe, &sz, 50, st)).expect("world");
    let mut recs = Vec::new();
    for (pe, x) in r.into_iter().enumerate() {
        match x {
            Ok(v) if pe == 0 => recs = v,
            Ok(v) => assert!(v.is_empty()),
            Err(e) => panic!("PE {pe}: {e}"),
        }
    }
    assert_eq!(recs.len(), 5 * sizes.iter().filter(|&&s| s >= 8).count());
    for r in &recs {
        assert!(r.time_us > 0.0 && r.busbw_gbs > 0.0, "{r:?}");
        // The baseline is measured or its absence explained, never invented.
        assert_eq!(
            r.baseline_time_us.is_some(),
            r.baseline_note.is_none(),
            "{r:?}"
        );
        println!(
            "{{\"op\":\"{}\",\"pes\":{},\"bytes\":{},\"algo\":\"{}\",\"time_us\":{:.2},\"algbw\":{:.2},\"busbw\":{:.2},\"baseline\":\"nccl\",\"baseline_time_us\":{},\"ratio\":{},\"note\":{:?}}}",
            r.op,
            r.pes,
            r.bytes,
            r.algo,
            r.time_us,
            r.algbw_gbs,
            r.busbw_gbs,
            r.baseline_time_us.map_or("null".into(), |b| format!("{b:.2}")),
            r.ratio.map_or("null".into(), |b| format!("{b:.3}")),
            r.baseline_note.clone().unwrap_or_default()
        );
    }
}

/// The NCCL binding (`rshmem_bench::nccl`, the benchmarks' same-run baseline) with one rank: NCCL
/// refuses two ranks on one GPU, so this is what a one-GPU machine can check of it before a
/// multi-GPU run relies on it. With one rank every wrapped call copies `src` to `dst`: each is
/// checked element by element, with the element past `count` left as poisoned. Fails when NCCL
/// cannot be loaded (the GPU machines have it).
fn nccl_one_rank_body(pe: &Pe) -> Result<()> {
    use rshmem_bench::nccl::{world_comm, DataType, Nccl, P2p};
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let lib = Nccl::load();
    let (comm, note) = world_comm(pe, &g, &lib)?;
    let c = comm.unwrap_or_else(|| panic!("NCCL unavailable ({note:?}): this test needs libnccl"));
    let len = 1000;
    let count = len - 1;
    let src = pe.alloc::<f32>(len)?;
    let dst = pe.alloc::<f32>(len)?;
    let want: Vec<f32> = (0..len).map(|i| (i as f32) * 0.5 - 77.0).collect();
    pe.local_write(&src, 0, &want)?;
    let (sp, dp) = (g.ptr(&src)?, g.ptr(&dst)?);
    let raw = s.raw();
    let f32t = DataType::F32;
    for op in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_to_all",
        "group_send_recv",
    ] {
        pe.local_fill(&dst, -1.0)?;
        // SAFETY: src and dst are this GPU's symmetric objects of `len` f32; every call moves
        // `count` < len elements (or count * 4 bytes); the stream is this GPU's.
        unsafe {
            match op {
                "all_reduce" => c.all_reduce(sp, dp, count, f32t, raw),
                "all_gather" => c.all_gather(sp, dp, count, f32t, raw),
                "reduce_scatter" => c.reduce_scatter(sp, dp, count, f32t, raw),
                "broadcast" => c.broadcast(sp, dp, count, f32t, 0, raw),
                "all_to_all" => c.all_to_all(sp, dp, count, 4, f32t, 1, raw),
                _ => {
                    let p = |ptr| P2p {
                        ptr,
                        bytes: count * 4,
                        peer: 0,
                    };
                    c.group_send_recv(&[p(sp)], &[p(dp)], raw)
                }
            }?;
        }
        s.synchronize()?;
        let got = pe.local_vec(&dst)?;
        assert_eq!(&got[..count], &want[..count], "NCCL {op}: data");
        assert_eq!(got[count], -1.0, "NCCL {op} wrote past count");
    }
    drop(c);
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_nccl_binding_one_rank_moves_data() {
    harness::gpu_threads(1, coll_config(), nccl_one_rank_body);
}

/// (tokens, op, mode) of each benchmark record.
fn bench_rows(recs: &[ep::EpBenchRecord]) -> Vec<(usize, &'static str, &'static str)> {
    recs.iter().map(|r| (r.tokens, r.op, r.mode)).collect()
}

/// The records `ep_bench` returns for token counts `ts` of `hidden` elements: per count and
/// mode, dispatch and combine, then token-major dispatch and combine_tokens, then the
/// low-latency buffer's (bf16, its hooks, and FP8 where hidden is a multiple of 128).
fn bench_rows_wanted(ts: &[usize], hidden: usize) -> Vec<(usize, &'static str, &'static str)> {
    let mut v = Vec::new();
    for &t in ts {
        for m in ["normal", "capturable"] {
            v.push((t, "ep_dispatch", m));
            v.push((t, "ep_combine", m));
            let tm = if m == "normal" {
                "normal+tokens"
            } else {
                "capturable+tokens"
            };
            v.push((t, "ep_dispatch", tm));
            v.push((t, "ep_combine", tm));
        }
        if ep_ll::measured(t, hidden) {
            let hooks = [
                "ep_dispatch_send",
                "ep_dispatch_recv",
                "ep_combine_send",
                "ep_combine_recv",
            ];
            v.push((t, "ep_dispatch", "low_latency"));
            v.push((t, "ep_combine", "low_latency"));
            v.extend(hooks.iter().map(|&op| (t, op, "low_latency+hooks")));
            if hidden.is_multiple_of(128) {
                v.push((t, "ep_dispatch", "low_latency+fp8"));
                v.extend(
                    hooks[..2]
                        .iter()
                        .map(|&op| (t, op, "low_latency+fp8+hooks")),
                );
            }
        }
    }
    v
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_bench_report() {
    // Small sizes here (timings are not checked); the full sizes run through ep_bench directly.
    let _gpu = harness::gpu_world();
    let r = threads_with(ep_config(2), 2, |pe| {
        let args = ep::EpBenchArgs {
            tokens: vec![64, 8],
            hidden: 256,
            top_k: 4,
            experts: 8,
            iters: 3,
        };
        ep::ep_bench(pe, &args, &settings())
    })
    .expect("world");
    let recs = r.into_iter().next().unwrap().expect("bench");
    assert_eq!(bench_rows(&recs), bench_rows_wanted(&[64, 8], 256));
    for rec in &recs {
        assert!(rec.time_us > 0.0 && rec.bytes > 0, "{rec:?}");
    }
}

/// The full-size benchmark (T=4096 and 128, H=7168 bf16, k=8, E=256), printed as JSON lines.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_bench_full() {
    if std::env::var_os("RSHMEM_EP_BENCH").is_none() {
        return;
    }
    let cfg = ep_config(2).heap_size(6 << 30);
    let _gpu = harness::gpu_world();
    let r = threads_with(cfg, 2, |pe| {
        ep::ep_bench(pe, &ep::EpBenchArgs::default(), &settings())
    })
    .expect("world");
    let recs = r.into_iter().next().unwrap().expect("bench");
    for x in recs {
        println!(
            "{{\"op\":\"{}\",\"api\":\"{}\",\"backend\":\"{}\",\"mode\":\"{}\",\"pes\":{},\"tokens\":{},\"bytes\":{},\"iters\":{},\"time_us\":{:.2},\"gbps\":{:.1},\"baseline\":\"{}\",\"baseline_time_us\":{},\"ratio\":{}}}",
            x.op, x.api, x.backend, x.mode, x.pes, x.tokens, x.bytes, x.iters, x.time_us, x.gbps, x.baseline, x.baseline_time_us, x.ratio
        );
    }
}

/// The benchmark at a hidden size the vector paths do not take (196 bf16 = 392 bytes), so the
/// scalar fallbacks of the kernels and of the baseline run too; `ep_bench` checks the data of
/// rshmem and of the baseline itself (an error otherwise). The NCCL baseline is measured or
/// missing with its reason.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_bench_scalar_rows_and_baseline() {
    let _gpu = harness::gpu_world();
    let args = ep::EpBenchArgs {
        tokens: vec![96, 5],
        hidden: 196,
        top_k: 3,
        experts: 8,
        iters: 2,
    };
    let cfg = ep_config(2).heap_size(ep::ep_bench_heap_bytes(&args, 2).unwrap());
    let r = threads_with(cfg, 2, |pe| ep::ep_bench(pe, &args, &settings())).expect("world");
    let mut per_pe = r.into_iter();
    let recs = per_pe.next().unwrap().expect("bench on PE 0");
    assert!(per_pe.next().unwrap().expect("bench on PE 1").is_empty());
    assert_eq!(bench_rows(&recs), bench_rows_wanted(&[96, 5], 196));
    for rec in &recs {
        assert_eq!(rec.baseline, ep::EP_BASELINE);
        match &rec.baseline_note {
            None => assert!(rec.baseline_time_us > 0.0 && rec.ratio > 0.0, "{rec:?}"),
            Some(why) => assert!(
                !why.is_empty() && rec.baseline_time_us == 0.0 && rec.ratio == 0.0,
                "{rec:?}"
            ),
        }
    }
}

/// The MoE benchmark on a world of one PE, where NCCL can run on a one-GPU machine (one rank):
/// the NCCL all-to-all-v baseline (its layout, pack, permute, combine kernels and grouped
/// send/recv) runs and `ep_bench` checks its data as it does rshmem's, at a vector-path and a
/// scalar-path hidden size. Fails when NCCL cannot be loaded (the GPU machines have it).
fn ep_bench_one_pe_body(pe: &Pe) -> Result<()> {
    for hidden in [256, 196] {
        let args = ep::EpBenchArgs {
            tokens: vec![96, 5],
            hidden,
            top_k: 3,
            experts: 8,
            iters: 2,
        };
        let recs = ep::ep_bench(pe, &args, &settings())?;
        assert_eq!(bench_rows(&recs), bench_rows_wanted(&[96, 5], hidden));
        for r in &recs {
            assert_eq!(r.baseline_note, None, "NCCL baseline missing: {r:?}");
            // The hook halves have no baseline of their own.
            let half = r.op.ends_with("_send") || r.op.ends_with("_recv");
            assert!(half || (r.baseline_time_us > 0.0 && r.ratio > 0.0), "{r:?}");
            assert!(r.time_us > 0.0, "{r:?}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_ep_bench_nccl_baseline_one_pe() {
    let args = ep::EpBenchArgs {
        tokens: vec![96, 5],
        hidden: 256,
        top_k: 3,
        experts: 8,
        iters: 2,
    };
    let cfg = ep_config(1).heap_size(ep::ep_bench_heap_bytes(&args, 1).unwrap());
    harness::gpu_threads(1, cfg, ep_bench_one_pe_body);
}

/// `n` thread-PEs with `cfg`, every PE's value or the first error.
fn threads_with<R: Send>(
    cfg: rshmem::Config,
    n: usize,
    f: impl Fn(&rshmem::Pe) -> R + Sync,
) -> rshmem::Result<Vec<R>> {
    rshmem::Launch::new()
        .config(cfg)
        .threads()
        .run(n, f)
        .values()
}
