//! Benchmarks of the CUDA backend, each beside a baseline measured in the same run.

use super::{CudaPe, KernelArg, Stream};
use crate::backend::cuda::ffi::{self, cu};
use crate::backend::cuda::nvrtc;
use crate::error::{Error, Result};
use crate::Pe;
use std::time::Instant;

/// One measurement (the `rshmem perf` JSON schema).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRecord {
    /// Operation: device_put, device_get, stream_put, device_put_signal, device_barrier.
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

/// A CUDA event, destroyed on drop.
pub(crate) struct Ev(pub(crate) cu::CUevent);
impl Ev {
    /// A new event in the current context.
    pub(crate) fn new() -> Result<Ev> {
        let mut e = std::ptr::null_mut();
        // SAFETY: creates an event in the current context (callers bind first).
        ffi::check(unsafe { cu::cuEventCreate(&mut e, 0) }, "cuEventCreate")?;
        Ok(Ev(e))
    }
}
impl Drop for Ev {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        unsafe { cu::cuEventDestroy_v2(self.0) };
    }
}

/// Times `f` `iters` times on `s` with events; returns microseconds per call.
pub(crate) fn time_stream(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let gpu = crate::backend::cuda::gpu::gpu(g.device())?;
    let _b = gpu.bind()?;
    f()?;
    s.synchronize()?;
    let (a, b) = (Ev::new()?, Ev::new()?);
    let raw = s.raw() as cu::CUstream;
    // SAFETY: live events and stream of the current context.
    ffi::check(unsafe { cu::cuEventRecord(a.0, raw) }, "cuEventRecord")?;
    let host = std::time::Instant::now();
    for _ in 0..iters {
        f()?;
    }
    // What issuing one call costs the host (when it exceeds the GPU time, back-to-back
    // figures measure the host): RSHMEM_LOG=rshmem=debug.
    tracing::debug!(
        host_us_per_call = host.elapsed().as_secs_f64() * 1e6 / iters as f64,
        "time_stream"
    );
    // SAFETY: as above.
    ffi::check(unsafe { cu::cuEventRecord(b.0, raw) }, "cuEventRecord")?;
    // SAFETY: as above.
    ffi::check(unsafe { cu::cuEventSynchronize(b.0) }, "cuEventSynchronize")?;
    let mut ms = 0f32;
    // SAFETY: both events recorded and complete.
    ffi::check(
        unsafe { cu::cuEventElapsedTime_v2(&mut ms, a.0, b.0) },
        "cuEventElapsedTime",
    )?;
    Ok(ms as f64 * 1e3 / iters as f64)
}

/// As [`time_stream`], but `iters` calls of `f` are captured once into a CUDA graph and the
/// graph is replayed (what a graph-capturing user pays: no host work per call). One warm-up
/// call and one warm-up replay come first.
pub(crate) fn time_graph(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    s.synchronize()?;
    s.begin_capture()?;
    let mut r = Ok(());
    for _ in 0..iters {
        r = f();
        if r.is_err() {
            break;
        }
    }
    let graph = s.end_capture()?;
    r?;
    graph.launch(s)?;
    s.synchronize()?;
    let t = time_stream(g, s, 1, || graph.launch(s))?;
    Ok(t / iters as f64)
}

/// A piece size of the device put/get benchmarks (`name`, a size such as 64K, a multiple of
/// 16; default 64 KiB, 0 for a contiguous share per block).
fn bench_chunk(name: &str) -> Result<usize> {
    let ok = |v: usize| v.is_multiple_of(16);
    crate::backend::cuda::knobs::knob_from_env(name, 64 << 10, ok, "must be a multiple of 16")
}

/// Runs the CUDA benchmarks (collective over every PE; PE 0 and PE 1 take part, the others
/// only synchronise). The heap must hold two buffers of the largest size. Returns PE 0's
/// records (other PEs return an empty list).
pub fn bench(pe: &Pe, sizes: &[usize], latency_iters: usize) -> Result<Vec<BenchRecord>> {
    if pe.n_pes() < 2 {
        return Err(Error::invalid("the CUDA benchmarks need at least 2 PEs"));
    }
    let g = CudaPe::new(pe)?;
    let max = sizes.iter().copied().max().unwrap_or(0).max(64);
    let src = pe.alloc_aligned::<u8>(max, 4096)?;
    let dst = pe.alloc_aligned::<u8>(max, 4096)?;
    let sig = pe.alloc::<u64>(8)?;
    let s = g.stream()?;
    let me = pe.my_pe();
    let mode = pe.mode().name();
    let mut out = Vec::new();
    // Extra NVRTC options for the benchmark kernels (RSHMEM_BENCH_NVRTC_OPTS, space-separated),
    // to measure the header's compile-time variants.
    let opts_s = std::env::var("RSHMEM_BENCH_NVRTC_OPTS").unwrap_or_default();
    let opts: Vec<&str> = opts_s.split_whitespace().collect();
    let k_put = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_put", &opts)?;
    let k_get = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_get", &opts)?;
    let k_put_bulk = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_put_bulk", &opts)?;
    let k_get_bulk = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_get_bulk", &opts)?;
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
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&v| v > 0)
                .unwrap_or(d)
        };
        // Blocks per SM and threads per block of the device copies (RSHMEM_BENCH_BLOCKS_PER_SM,
        // RSHMEM_BENCH_THREADS override the measured defaults).
        let grid = (g.sm_count() * env("RSHMEM_BENCH_BLOCKS_PER_SM", 8)) as u32;
        let threads = env("RSHMEM_BENCH_THREADS", 512).min(1024) as u32;
        let bulk_grid = (g.sm_count() * env("RSHMEM_BENCH_BULK_BLOCKS_PER_SM", 2)) as u32;
        // RSHMEM_BENCH_CHUNK / RSHMEM_BENCH_BULK_CHUNK (bytes; default 64 KiB, 0 = a
        // contiguous share per block): the blocks take pieces of this size in turn, every
        // block inside one moving window of the buffer. The SM one a multiple of 16, the bulk
        // one of the bulk stage size (8 KiB unless RSHMEM_BENCH_NVRTC_OPTS sets
        // RSHMEMI_BULK_CHUNK). 2x H100, 1 GiB, against cuMemcpyPeerAsync: contiguous shares
        // put / get 0.912 / 0.925 (SM), 0.740 / 0.726 (bulk); 64 KiB pieces 0.935 / 0.944 (SM),
        // 0.941 / 0.944 (bulk); 256 KiB and 1 MiB pieces the same at 1 GiB, worse below 64 MiB.
        let chunk = bench_chunk("RSHMEM_BENCH_CHUNK")?;
        let bulk_chunk = bench_chunk("RSHMEM_BENCH_BULK_CHUNK")?;
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
    let k_sig = g.kernel(
        nvrtc::INTERNAL_KERNELS,
        "rshmemi_bench_pingpong_signal",
        &opts,
    )?;
    let k_raw = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_pingpong_raw", &opts)?;
    let k_bar = g.kernel(nvrtc::INTERNAL_KERNELS, "rshmemi_bench_barrier", &opts)?;
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
        out.push(rec("device_barrier", "device", 0, iters, bar, "none", 0.0));
    }
    pe.free(sig)?;
    pe.free(dst)?;
    pe.free(src)?;
    Ok(out)
}
