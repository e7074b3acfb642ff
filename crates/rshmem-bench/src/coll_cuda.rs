//! Benchmarks of the stream-ordered collectives ([`GpuColl`]) against NCCL on the same
//! buffers in the same run (nccl-tests conventions).

use crate::coll::bus_factor;
use crate::nccl::{self, DataType, Nccl};
use crate::timing::{time_graph, time_stream};
use crate::Settings;
use rshmem::coll::{CollConfig, CollKind, ReduceOp};
use rshmem::cuda::{CollTuning, CudaPe, GpuColl, Stream};
use rshmem::{Error, Pe, Result};

/// One collective measurement against its NCCL baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct CollBenchRecord {
    /// all_reduce, all_gather, reduce_scatter, all_to_all or broadcast.
    pub op: &'static str,
    /// Number of PEs (GPUs).
    pub pes: usize,
    /// nccl-tests' size: the all_reduce/broadcast vector, the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer (f32 elements).
    pub bytes: usize,
    /// Iterations timed (after one warm-up).
    pub iters: usize,
    /// rshmem's algorithm for this size (one_shot / two_shot; one_shot for the single-algorithm
    /// collectives; ll, pull, pull_two_shot or push for the LL-handshake paths).
    pub algo: &'static str,
    /// rshmem time per call, microseconds (PE 0's stream, CUDA events, eager launches).
    pub time_us: f64,
    /// bytes / time, GB/s.
    pub algbw_gbs: f64,
    /// algbw × nccl-tests' bus factor, GB/s.
    pub busbw_gbs: f64,
    /// Always "nccl".
    pub baseline: &'static str,
    /// NCCL's time per call on the same buffers; `None` when NCCL could not run.
    pub baseline_time_us: Option<f64>,
    /// NCCL's bus bandwidth, GB/s.
    pub baseline_busbw_gbs: Option<f64>,
    /// baseline_time_us / time_us: above 1 means rshmem is faster.
    pub ratio: Option<f64>,
    /// Why the baseline is missing, if it is.
    pub baseline_note: Option<String>,
}

const OPS: [CollKind; 5] = [
    CollKind::AllReduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AllToAll,
    CollKind::Broadcast,
];

/// Times the five collectives on the world team for every size in `sizes` (bytes, f32
/// elements, rounded down to a multiple of 4·n_pes), rshmem then NCCL on the same symmetric
/// buffers. Collective over the world; the heap must hold two buffers of the largest size.
/// NCCL is loaded at run time (`libnccl.so.2`, `libnccl.so`); when it is absent, or the PEs do
/// not have distinct GPUs (NCCL refuses duplicates), the baseline is reported missing with the
/// reason. `settings` say which collectives ([`Settings::coll_ops`]) and how they are timed
/// ([`Settings::graph`]). Returns PE 0's records (the other PEs return an empty list).
pub fn coll_bench(
    pe: &Pe,
    sizes: &[usize],
    iters: usize,
    settings: &Settings,
) -> Result<Vec<CollBenchRecord>> {
    let n = pe.n_pes();
    if n < 2 {
        return Err(Error::InvalidArgument(
            "the collective benchmarks need at least 2 PEs".into(),
        ));
    }
    let iters = iters.max(1);
    let g = CudaPe::new(pe)?;
    let config = CollConfig::from_env()?;
    let coll = GpuColl::new(g, config, CollTuning::from_env()?)?;
    let unit = 4 * n;
    let max = sizes.iter().copied().max().unwrap_or(0).max(unit) / unit * unit;
    let src = pe.alloc_aligned::<f32>(max / 4, 4096)?;
    let dst = pe.alloc_aligned::<f32>(max / 4, 4096)?;
    pe.local_fill(&src, 1.0)?;
    let s = g.stream()?;
    let me = pe.my_pe();
    let w = pe.world_team();

    // NCCL: loaded everywhere or used nowhere.
    let lib = Nccl::load();
    let (comm, note) = nccl::world_comm(pe, &g, &lib)?;

    // RSHMEM_BENCH_GRAPH=1: both sides timed as replays of a captured graph of `iters` calls
    // (no host work per call), else as calls issued back to back (nccl-tests' default).
    let graph = settings.graph;
    let timer = |g: &CudaPe<'_>,
                 s: &Stream,
                 iters: usize,
                 f: &mut dyn FnMut() -> Result<()>|
     -> Result<f64> {
        if graph {
            time_graph(g, s, iters, f)
        } else {
            time_stream(g, s, iters, f)
        }
    };
    // RSHMEM_BENCH_COLL_OPS: the collectives to time, default all.
    let mut out = Vec::new();
    for kind in OPS {
        if !settings.times_coll(kind.name()) {
            continue;
        }
        for &size in sizes {
            let bytes = size / unit * unit;
            if bytes == 0 {
                continue;
            }
            let elems = bytes / 4;
            let per = elems / n;
            let (s_, d_) = (g.ptr(&src)?, g.ptr(&dst)?);
            let algo = coll.path(kind, w, bytes).name();
            pe.barrier_all()?;
            let t = timer(&g, &s, iters, &mut || match kind {
                CollKind::AllReduce => coll.all_reduce(&s, w, &dst, &src, elems, ReduceOp::Sum),
                CollKind::AllGather => coll.all_gather(&s, w, &dst, &src.view::<f32>(0, per)?, per),
                CollKind::ReduceScatter => {
                    coll.reduce_scatter(&s, w, &dst, &src, per, ReduceOp::Sum)
                }
                CollKind::AllToAll => coll.all_to_all(&s, w, &dst, &src, per),
                _ => coll.broadcast(&s, w, &dst, &src, elems, 0),
            })?;
            coll.check_errors()?;
            let base = match &comm {
                Some(c) => {
                    pe.barrier_all()?;
                    let raw = s.raw();
                    // SAFETY: src and dst are this GPU's symmetric objects of `max` bytes, each
                    // call stays within `bytes` of them; the stream is this GPU's.
                    Some(timer(&g, &s, iters, &mut || unsafe {
                        match kind {
                            CollKind::AllReduce => c.all_reduce(s_, d_, elems, DataType::F32, raw),
                            CollKind::AllGather => c.all_gather(s_, d_, per, DataType::F32, raw),
                            CollKind::ReduceScatter => {
                                c.reduce_scatter(s_, d_, per, DataType::F32, raw)
                            }
                            CollKind::AllToAll => {
                                c.all_to_all(s_, d_, per, 4, DataType::F32, n, raw)
                            }
                            _ => c.broadcast(s_, d_, elems, DataType::F32, 0, raw),
                        }
                    })?)
                }
                None => None,
            };
            let f = bus_factor(kind, n);
            let algbw = bytes as f64 / (t * 1e-6) / 1e9;
            out.push(CollBenchRecord {
                op: kind.name(),
                pes: n,
                bytes,
                iters,
                algo,
                time_us: t,
                algbw_gbs: algbw,
                busbw_gbs: algbw * f,
                baseline: "nccl",
                baseline_time_us: base,
                baseline_busbw_gbs: base.map(|b| bytes as f64 / (b * 1e-6) / 1e9 * f),
                ratio: base.map(|b| b / t),
                baseline_note: note.clone(),
            });
        }
    }
    s.synchronize()?;
    drop(comm);
    pe.barrier_all()?;
    Ok(if me == 0 { out } else { Vec::new() })
}
