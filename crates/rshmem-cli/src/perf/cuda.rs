//! The CUDA suites: thread-PEs one per GPU, their records, the MoE arguments.

use super::*;

/// Whether the CUDA backend can run here: `Ok(info)` with at least one GPU, else the reason.
pub(super) fn cuda_usable() -> Result<rshmem::cuda::Info, String> {
    match rshmem::cuda::info() {
        Ok(i) if i.gpus.is_empty() => Err("the CUDA driver reports no GPU".into()),
        Ok(i) => Ok(i),
        Err(e) => Err(e.to_string()),
    }
}

/// The number of CUDA PEs: `--gpus N`, checked against the GPUs there are, else 2 (sharing a
/// GPU where there is one: a measurement setup, not a deployment).
pub(super) fn cuda_pes(args: &PerfArgs, gpus: usize) -> CliResult<usize> {
    let Some(n) = args.gpus else {
        return Ok(2);
    };
    if n < 2 {
        return Err(format!("--gpus {n}: the CUDA suites need at least 2 PEs").into());
    }
    if n > gpus {
        return Err(format!(
            "--gpus {n}: this machine has {gpus} GPU(s) (the suites run one PE per GPU)"
        )
        .into());
    }
    Ok(n)
}

/// The CUDA suites (`rshmem_bench::p2p`, `coll_cuda`, `ep_cuda`; `--gpus` thread-PEs,
/// default 2, one per GPU), as perf records.
pub(super) fn run_cuda(
    args: &PerfArgs,
    groups: &[SuiteArg],
    gpus: usize,
) -> CliResult<Vec<Record>> {
    let full = args.full;
    let pes = cuda_pes(args, gpus)?;
    // The benchmarks' RSHMEM_BENCH_* / RSHMEM_EP_BREAKDOWN, read once here.
    let settings = rshmem_bench::Settings::from_env()?;
    let max = args
        .max_size
        .unwrap_or(if full { 1 << 30 } else { 64 << 20 });
    let sizes: Vec<usize> = sizes(full, max)
        .into_iter()
        .filter(|&s| s >= 4096)
        .map(|s| s / 16 * 16)
        .collect();
    let sizes = if sizes.is_empty() { vec![4096] } else { sizes };
    let big = sizes.iter().copied().max().unwrap_or(4096);
    // Two buffers of the largest size, 64 MiB for the rest, and room for the collectives'
    // LL paths at their largest default sizes (they take at most 1/16 of the heap), so the
    // same calls take the same paths whatever `--max-size` says.
    let ll = rshmem::cuda::LlSizes {
        all_reduce: rshmem::cuda::COLL_LL_BYTES,
        all_to_all: rshmem::cuda::COLL_LL_A2A_BYTES,
    };
    let config = Config::from_env()?
        .backend(BackendKind::Cuda)
        .heap_size(2 * big + (64 << 20) + 16 * ll.area(pes).unwrap_or(0));
    let map = config
        .devices
        .clone()
        .unwrap_or_else(|| (0..gpus).collect());
    let p2p_worlds = if !groups.contains(&SuiteArg::P2p) {
        0
    } else if args.pairs {
        map.len() * map.len().saturating_sub(1) / 2
    } else {
        1
    };
    let steps = p2p_worlds
        + usize::from(groups.contains(&SuiteArg::Ep))
        + usize::from(groups.contains(&SuiteArg::Coll));
    if groups.contains(&SuiteArg::P2p) || groups.contains(&SuiteArg::Coll) {
        eprintln!(
            "rshmem perf: {} CUDA suite, {pes} PEs, sizes {}..{}",
            if full { "full" } else { "quick" },
            report::human_bytes(sizes[0]),
            report::human_bytes(big)
        );
    }
    let pb = progress_bar(steps as u64, "cuda")?;
    let iters = if full { 20000 } else { 2000 };
    let mut out = Vec::new();
    if groups.contains(&SuiteArg::P2p) && args.pairs {
        // Every pair of GPUs in a world of its own (GPU i is PE 0: puts go i -> j, gets j -> i).
        for i in 0..map.len() {
            for j in i + 1..map.len() {
                let (a, b) = (map[i], map[j]);
                pb.set_message(format!("p2p GPU {a} <-> GPU {b}"));
                let per_pe = rshmem::Launch::new()
                    .config(config.clone().devices(vec![a, b]))
                    .threads()
                    .run(2, |pe| {
                        rshmem_bench::p2p::bench(pe, &sizes, iters, &settings)
                    })
                    .values()?;
                for r in per_pe {
                    out.extend(r?.iter().map(|b2| Record {
                        mode: format!("gpu{a}-gpu{b}"),
                        ..from_cuda(b2)
                    }));
                }
                pb.inc(1);
            }
        }
    } else if groups.contains(&SuiteArg::P2p) {
        pb.set_message(format!("p2p device put/get, {pes} PEs"));
        let per_pe = rshmem::Launch::new()
            .config(config.clone())
            .threads()
            .run(pes, |pe| {
                rshmem_bench::p2p::bench(pe, &sizes, iters, &settings)
            })
            .values()?;
        for r in per_pe {
            out.extend(r?.iter().map(from_cuda));
        }
        pb.inc(1);
    }
    if groups.contains(&SuiteArg::Ep) {
        let ep_args = cuda_ep_args(args, pes)?;
        let heap = rshmem_bench::ep_cuda::ep_bench_heap_bytes(&ep_args, pes)?;
        pb.suspend(|| eprintln!(
            "rshmem perf: CUDA MoE dispatch/combine, {pes} PEs, T={:?} H={} k={} E={}, {} calls each, heap {} per PE",
            ep_args.tokens,
            ep_args.hidden,
            ep_args.top_k,
            ep_args.experts,
            ep_args.iters,
            report::human_bytes(heap)
        ));
        pb.set_message(format!("ep dispatch/combine, {pes} PEs"));
        let per_pe = rshmem::Launch::new()
            .config(config.clone().heap_size(heap))
            .threads()
            .run(pes, |pe| {
                rshmem_bench::ep_cuda::ep_bench(pe, &ep_args, &settings)
            })
            .values()?;
        for r in per_pe {
            out.extend(r?.iter().map(|b| from_cuda_ep(b, &ep_args)));
        }
        pb.inc(1);
    }
    if groups.contains(&SuiteArg::Coll) {
        // RSHMEM_BENCH_COLL_SIZES: the collectives' sizes (comma separated, e.g. 64K,256K,1M;
        // measurement sweeps), default the nccl-tests-like ladder below.
        let ladder = match std::env::var("RSHMEM_BENCH_COLL_SIZES") {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|x| parse_size_arg(x.trim()))
                .collect::<Result<Vec<usize>, String>>()
                .map_err(|e| format!("RSHMEM_BENCH_COLL_SIZES: {e}"))?,
            _ => vec![
                8usize,
                4096,
                65536,
                1 << 20,
                16 << 20,
                64 << 20,
                256 << 20,
                1 << 30,
            ],
        };
        let coll_sizes: Vec<usize> = ladder.into_iter().filter(|&s| s <= big.max(8)).collect();
        let iters = if full { 200 } else { 50 };
        pb.set_message(format!("coll, {pes} PEs, {} sizes", coll_sizes.len()));
        let per_pe = rshmem::Launch::new()
            .config(config)
            .threads()
            .run(pes, |pe| {
                rshmem_bench::coll_cuda::coll_bench(pe, &coll_sizes, iters, &settings)
            })
            .values()?;
        for r in per_pe {
            out.extend(r?.iter().map(from_cuda_coll));
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(out)
}

/// What `--ep` measures on CUDA: the flags, else issue 7's sizes (T = 4096 and 128 with
/// `--full`, 1024 and 128 quick; H = 7168, k = 8, E = 256).
pub(super) fn cuda_ep_args(
    args: &PerfArgs,
    pes: usize,
) -> CliResult<rshmem_bench::ep_cuda::EpBenchArgs> {
    let full = args.full;
    let a = rshmem_bench::ep_cuda::EpBenchArgs {
        tokens: if args.ep_tokens.is_empty() {
            if full {
                vec![4096, 128]
            } else {
                vec![1024, 128]
            }
        } else {
            args.ep_tokens.clone()
        },
        hidden: args.ep_hidden.unwrap_or(7168),
        top_k: args.ep_topk.unwrap_or(8),
        experts: args.ep_experts.unwrap_or(256),
        iters: args.ep_iters.unwrap_or(if full { 50 } else { 10 }).max(1),
    };
    let opts = |t: usize| ep::EpOpts {
        tokens: t,
        hidden: a.hidden,
        top_k: a.top_k,
        experts: a.experts,
        iters: a.iters,
    };
    for &t in &a.tokens {
        if t == 0 {
            return Err("--ep-tokens: every token count must be at least 1".into());
        }
        opts(t).check(pes)?;
    }
    Ok(a)
}

/// A CUDA MoE record: `mode` is the EP mode (normal, capturable; `+tokens`: a token-major
/// buffer, its combine through `combine_tokens`; the PEs are threads), the
/// baseline NCCL all-to-all-v (missing: ratio 0 and a note).
pub(super) fn from_cuda_ep(
    b: &rshmem_bench::ep_cuda::EpBenchRecord,
    a: &rshmem_bench::ep_cuda::EpBenchArgs,
) -> Record {
    let mut r = Record {
        op: b.op.into(),
        api: b.api.into(),
        backend: b.backend.into(),
        mode: b.mode.into(),
        pes: b.pes,
        bytes: b.bytes,
        iters: b.iters as u64,
        time_us: b.time_us,
        gbps: 0.0,
        baseline: b.baseline.clone(),
        baseline_time_us: b.baseline_time_us,
        ratio: 0.0,
        busbw_gbps: None,
        note: format!(
            "T={} H={} k={} E={} bf16, random routing, identity experts, {} thread-PEs; bytes = hidden-state bytes PE 0 sends to other PEs (DeepEP), time = PE 0's stream, mean of {} calls ({}{}); baseline: NCCL counts all-to-all + host read + grouped send/recv, with its layout/pack/permute/combine kernels; data of both checked{}",
            b.tokens,
            a.hidden,
            a.top_k,
            a.experts,
            b.pes,
            b.iters,
            if b.mode.starts_with("normal") {
                "eager calls, one host sync after the count exchange"
            } else {
                "CUDA graph replays"
            },
            if b.mode.ends_with("+tokens") {
                "; token-major layout: each token once per PE plus the expert-major index, no expanded copy; its combine is combine_tokens (per-token rows from each PE)"
            } else if b.mode.starts_with("low_latency") {
                "; LowLatencyBuffer (per-expert receive buffers, no host work per call); +fp8: e4m3 rows with a f32 scale per 128 elements; +hooks: the send and receive halves as separate graphs (ep_*_send / ep_*_recv, no baseline)"
            } else {
                ""
            },
            b.baseline_note
                .as_deref()
                .map(|n| format!("; baseline missing: {n}"))
                .unwrap_or_default()
        ),
    }
    .finish();
    if b.baseline_time_us <= 0.0 {
        r.ratio = 0.0;
    }
    r
}

/// A record of the CUDA collectives (NCCL baseline; missing baseline: ratio 0 and a note).
pub(super) fn from_cuda_coll(b: &rshmem_bench::coll_cuda::CollBenchRecord) -> Record {
    Record {
        op: b.op.into(),
        api: "stream".into(),
        backend: "cuda".into(),
        mode: "threads".into(),
        pes: b.pes,
        bytes: b.bytes,
        iters: b.iters as u64,
        time_us: b.time_us,
        gbps: b.algbw_gbs,
        baseline: b.baseline.into(),
        baseline_time_us: b.baseline_time_us.unwrap_or(0.0),
        ratio: b.ratio.unwrap_or(0.0),
        busbw_gbps: Some(b.busbw_gbs),
        note: format!(
            "{}{}",
            b.algo,
            b.baseline_note
                .as_deref()
                .map(|n| format!("; baseline missing: {n}"))
                .unwrap_or_default()
        ),
    }
}

/// A record of the CUDA suite as a perf record (same fields; no baseline: ratio 0).
pub(super) fn from_cuda(b: &rshmem_bench::p2p::BenchRecord) -> Record {
    let mut r = Record {
        op: b.op.into(),
        api: b.api.into(),
        backend: b.backend.into(),
        mode: b.mode.into(),
        pes: b.pes,
        bytes: b.bytes,
        iters: b.iters as u64,
        time_us: b.time_us,
        gbps: b.gbps,
        baseline: b.baseline.into(),
        baseline_time_us: b.baseline_time_us,
        ratio: b.ratio,
        busbw_gbps: None,
        note: String::new(),
    }
    .finish();
    if b.baseline_time_us <= 0.0 {
        r.ratio = 0.0;
    }
    r
}

/// Checks the CUDA MoE flags before a GPU is looked for. A default run whose default MoE shape
/// does not split over the `--gpus` PEs leaves MoE out with a note instead of failing, since
/// nothing asked for MoE; asked for, it is an error.
pub(super) fn cuda_default_ep(args: &PerfArgs, groups: &mut Vec<SuiteArg>) -> CliResult<()> {
    if !groups.contains(&SuiteArg::Ep) {
        return Ok(());
    }
    match cuda_ep_args(args, args.gpus.unwrap_or(2)) {
        Ok(_) => Ok(()),
        Err(e) if groups_are_default(args) && ep_flag(args).is_none() => {
            eprintln!("rshmem perf: MoE left out of the default run: {e} (the --ep-* flags pick another shape)");
            groups.retain(|&g| g != SuiteArg::Ep);
            Ok(())
        }
        Err(e) => Err(e),
    }
}
