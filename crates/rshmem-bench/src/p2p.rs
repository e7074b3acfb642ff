//! The point-to-point suite of the CUDA backend: device and stream put/get against
//! `cuMemcpyPeerAsync`, put-with-signal latency against a raw flag ping-pong kernel, and the
//! device barrier. Its kernels are this crate's (`kernels/p2p.cu`).

use crate::timing::time_stream;
use crate::Settings;
use rshmem::cuda::{CudaPe, KernelArg};
use rshmem::{Error, Pe, Result};
use std::time::Instant;

/// The suite's kernels (`rshmemi_bench_*`), compiled with the rshmem device header.
pub const P2P_KERNELS: &str = include_str!("kernels/p2p.cu");

/// Message sizes of `device_put_signal_ll` (bytes; at most the device header's
/// `RSHMEM_LL_MAX_BYTES`).
const LL_SIZES: [usize; 5] = [8, 64, 512, 1024, 4096];

/// One measurement (the `rshmem perf` JSON schema).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRecord {
    /// Operation: device_put, device_get, stream_put, device_put_signal,
    /// device_put_signal_ll, device_barrier.
    pub op: &'static str,
    /// API: "device" or "stream".
    pub api: &'static str,
    /// Always "cuda".
    pub backend: &'static str,
    /// World mode name.
    pub mode: &'static str,
    /// Number of PEs.
    pub pes: usize,
    /// Bytes per operation (0 for latency and barriers).
    pub bytes: usize,
    /// Iterations timed.
    pub iters: usize,
    /// Time per operation in microseconds.
    pub time_us: f64,
    /// Bandwidth in GB/s (bytes / time; 0 for latency figures).
    pub gbps: f64,
    /// What the baseline is.
    pub baseline: &'static str,
    /// The baseline's time per operation in microseconds (0 when there is none).
    pub baseline_time_us: f64,
    /// baseline_time_us / time_us: above 1 is faster than the baseline (0 without baseline).
    pub ratio: f64,
}

/// Runs the CUDA benchmarks (collective over every PE; PE 0 and PE 1 take part, the others
/// only synchronise) with the kernel shapes and NVRTC options of `settings`. The heap must
/// hold two buffers of the largest size. Returns PE 0's records (other PEs return an empty
/// list).
pub fn bench(
    pe: &Pe,
    sizes: &[usize],
    latency_iters: usize,
    settings: &Settings,
) -> Result<Vec<BenchRecord>> {
    if pe.n_pes() < 2 {
        return Err(Error::InvalidArgument(
            "the CUDA benchmarks need at least 2 PEs".into(),
        ));
    }
    let g = CudaPe::new(pe)?;
    let max = sizes.iter().copied().max().unwrap_or(0).max(64 << 10);
    let src = pe.alloc_aligned::<u8>(max, 4096)?;
    let dst = pe.alloc_aligned::<u8>(max, 4096)?;
    let sig = pe.alloc::<u64>(8)?;
    let s = g.stream()?;
    let me = pe.my_pe();
    let mode = pe.mode().name();
    let mut out = Vec::new();
    // Extra NVRTC options for the benchmark kernels (RSHMEM_BENCH_NVRTC_OPTS), to measure the
    // header's compile-time variants.
    let opts: Vec<&str> = settings.nvrtc_options.iter().map(|s| s.as_str()).collect();
    let k_put = g.kernel(P2P_KERNELS, "rshmemi_bench_put", &opts)?;
    let k_get = g.kernel(P2P_KERNELS, "rshmemi_bench_get", &opts)?;
    let k_put_bulk = g.kernel(P2P_KERNELS, "rshmemi_bench_put_bulk", &opts)?;
    let k_get_bulk = g.kernel(P2P_KERNELS, "rshmemi_bench_get_bulk", &opts)?;
    let rec = |op, api, bytes: usize, iters, t: f64, base, bt: f64| BenchRecord {
        op,
        api,
        backend: "cuda",
        mode,
        pes: pe.n_pes(),
        bytes,
        iters,
        time_us: t,
        gbps: if bytes > 0 {
            bytes as f64 / (t * 1e3)
        } else {
            0.0
        },
        baseline: base,
        baseline_time_us: bt,
        ratio: if t > 0.0 { bt / t } else { 0.0 },
    };
    pe.barrier_all()?;
    if me == 0 {
        let sp = g.ptr(&src)?;
        let dp = g.ptr(&dst)?;
        let peer_dst = g.peer_ptr(&dst, 0, 1)?;
        let peer_src = g.peer_ptr(&src, 0, 1)?;
        // Blocks per SM and threads per block of the device copies (RSHMEM_BENCH_BLOCKS_PER_SM,
        // RSHMEM_BENCH_THREADS override the measured defaults).
        let grid = (g.sm_count() * settings.blocks_per_sm) as u32;
        let threads = settings.threads.min(1024) as u32;
        let bulk_grid = (g.sm_count() * settings.bulk_blocks_per_sm) as u32;
        // RSHMEM_BENCH_CHUNK / RSHMEM_BENCH_BULK_CHUNK (bytes; default 64 KiB, 0 = a
        // contiguous share per block): the blocks take pieces of this size in turn, every
        // block inside one moving window of the buffer. The SM one a multiple of 16, the bulk
        // one of the bulk stage size (8 KiB unless RSHMEM_BENCH_NVRTC_OPTS sets
        // RSHMEMI_BULK_CHUNK). Pieces of 64 KiB move more than contiguous shares (the bulk
        // copies by far) and, at smaller sizes, than larger pieces.
        let (chunk, bulk_chunk) = (settings.chunk, settings.bulk_chunk);
        for &n in sizes {
            let iters = if n >= 64 << 20 { 10 } else { 100 };
            let ce_put = time_stream(&g, &s, iters, || g.copy_raw_on_stream(&s, peer_dst, sp, n))?;
            let ce_get = time_stream(&g, &s, iters, || g.copy_raw_on_stream(&s, dp, peer_src, n))?;
            let blocks = grid.min(n.div_ceil(chunk.max(16 * 1024)).max(1) as u32);
            let args = |c: usize| {
                [
                    KernelArg::Ptr(dp),
                    KernelArg::Ptr(sp),
                    KernelArg::U64(n as u64),
                    KernelArg::I32(1),
                    KernelArg::U64(c as u64),
                ]
            };
            let (args_put, args_bulk) = (args(chunk), args(bulk_chunk));
            // SAFETY (both launches): the arguments match rshmemi_bench_put/get
            // (char*, const char*, u64, int, u64) and the buffers hold `n` bytes on both PEs.
            let t_put = time_stream(&g, &s, iters, || unsafe {
                g.launch(&k_put, &s, blocks, threads, 0, &args_put)
            })?;
            let t_get = time_stream(&g, &s, iters, || unsafe {
                g.launch(&k_get, &s, blocks, threads, 0, &args_put)
            })?;
            let bulk_blocks = bulk_grid.min(n.div_ceil(bulk_chunk.max(64 * 1024)).max(1) as u32);
            // SAFETY (both launches): rshmemi_bench_put_bulk/get_bulk take the same arguments
            // as the kernels above; sizes are multiples of 16.
            let t_put_bulk = time_stream(&g, &s, iters, || unsafe {
                g.launch(&k_put_bulk, &s, bulk_blocks, 32, 0, &args_bulk)
            })?;
            let t_get_bulk = time_stream(&g, &s, iters, || unsafe {
                g.launch(&k_get_bulk, &s, bulk_blocks, 32, 0, &args_bulk)
            })?;
            let t_stream = time_stream(&g, &s, iters, || {
                g.put_on_stream(&s, &dst.slice(..n)?, &src.slice(..n)?, 1)
            })?;
            let b = "cuMemcpyPeerAsync";
            out.push(rec("device_put", "device", n, iters, t_put, b, ce_put));
            out.push(rec("device_get", "device", n, iters, t_get, b, ce_get));
            out.push(rec("stream_put", "stream", n, iters, t_stream, b, ce_put));
            out.push(rec(
                "device_put_bulk",
                "device",
                n,
                iters,
                t_put_bulk,
                b,
                ce_put,
            ));
            out.push(rec(
                "device_get_bulk",
                "device",
                n,
                iters,
                t_get_bulk,
                b,
                ce_get,
            ));
        }
    }
    pe.barrier_all()?;
    // Latency: put-with-signal ping-pong against a raw flag ping-pong, PEs 0 and 1.
    let k_sig = g.kernel(P2P_KERNELS, "rshmemi_bench_pingpong_signal", &opts)?;
    let k_raw = g.kernel(P2P_KERNELS, "rshmemi_bench_pingpong_raw", &opts)?;
    let k_bar = g.kernel(P2P_KERNELS, "rshmemi_bench_barrier", &opts)?;
    let iters = latency_iters.max(1);
    let pingpong = |sig_kernel: bool| -> Result<f64> {
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        if me > 1 {
            pe.barrier_all()?;
            return Ok(0.0);
        }
        let role = me as i32;
        let peer = 1 - me;
        let t = Instant::now();
        // SAFETY: argument lists match the two ping-pong kernels; the signal words are
        // symmetric and zeroed on both PEs before the barrier above.
        unsafe {
            if sig_kernel {
                g.launch(
                    &k_sig,
                    &s,
                    1,
                    32,
                    0,
                    &[
                        g.arg(&dst)?,
                        g.arg(&sig)?,
                        KernelArg::I32(iters as i32),
                        KernelArg::I32(role),
                        KernelArg::I32(peer as i32),
                    ],
                )?;
            } else {
                g.launch(
                    &k_raw,
                    &s,
                    1,
                    32,
                    0,
                    &[
                        g.arg(&sig)?,
                        KernelArg::Ptr(g.peer_ptr(&sig, 0, peer)?),
                        KernelArg::I32(iters as i32),
                        KernelArg::I32(role),
                    ],
                )?;
            }
        }
        s.synchronize()?;
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
        pe.barrier_all()?;
        Ok(us)
    };
    let raw = pingpong(false)?;
    let sigd = pingpong(true)?;
    // The flag in the data: messages of these sizes (bytes), the same ping-pong.
    let k_ll = g.kernel(P2P_KERNELS, "rshmemi_bench_pingpong_ll", &opts)?;
    let mut ll = Vec::new();
    for bytes in LL_SIZES {
        pe.local_fill(&dst, 0)?;
        pe.barrier_all()?;
        if me > 1 {
            pe.barrier_all()?;
            continue;
        }
        let t = Instant::now();
        // SAFETY: matches rshmemi_bench_pingpong_ll(char*, char*, int, int, int, int); dst
        // (the LL area, 2 * bytes) and src (bytes) are symmetric and at least 64 KiB long, the
        // area zeroed on both PEs before the barrier above (no stale flag).
        unsafe {
            g.launch(
                &k_ll,
                &s,
                1,
                32,
                0,
                &[
                    g.arg(&dst)?,
                    g.arg(&src)?,
                    KernelArg::I32(bytes as i32),
                    KernelArg::I32(iters as i32),
                    KernelArg::I32(me as i32),
                    KernelArg::I32(1 - me as i32),
                ],
            )?;
        }
        s.synchronize()?;
        ll.push((bytes, t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0));
        pe.barrier_all()?;
    }
    pe.barrier_all()?;
    let t = Instant::now();
    // SAFETY: rshmemi_bench_barrier(int); every PE launches it.
    unsafe { g.launch(&k_bar, &s, 1, 64, 0, &[KernelArg::I32(iters as i32)])? };
    s.synchronize()?;
    let bar = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    pe.quiet()?;
    pe.barrier_all()?;
    if me == 0 {
        out.push(rec(
            "device_put_signal",
            "device",
            0,
            iters,
            sigd,
            "raw flag ping-pong kernel",
            raw,
        ));
        for &(bytes, us) in &ll {
            out.push(rec(
                "device_put_signal_ll",
                "device",
                bytes,
                iters,
                us,
                "raw flag ping-pong kernel",
                raw,
            ));
        }
        out.push(rec("device_barrier", "device", 0, iters, bar, "none", 0.0));
    }
    pe.free(sig)?;
    pe.free(dst)?;
    pe.free(src)?;
    Ok(out)
}
