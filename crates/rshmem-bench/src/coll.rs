//! The host collectives' benchmark (CPU backend, `rshmem perf --coll`): times one collective
//! on one team; nccl-tests' bus factors.
//!
//! ```
//! use rshmem::coll::{Coll, CollConfig, CollKind};
//! use rshmem_bench::coll;
//! let r = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<coll::BenchResult> {
//!     let c = Coll::new(pe, CollConfig::default())?;
//!     coll::run(&c, pe.world_team(), CollKind::AllReduce, 4096, 1, 3)
//! }).values().unwrap();
//! assert!(r.into_iter().all(|x| x.unwrap().time_s > 0.0));
//! ```

use rshmem::coll::{AllToAllV, Coll, CollKind, ReduceOp, ToRoot};
use rshmem::{Result, Team};
use std::time::Instant;

/// One measurement, as seen by this PE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchResult {
    /// The collective.
    pub kind: CollKind,
    /// Bytes per member vector (nccl-tests' "size": the all_reduce/broadcast vector, each
    /// member's all_gather input times the team size, the all_to_all buffer).
    pub bytes: usize,
    /// Team size.
    pub n_pes: usize,
    /// Mean seconds per call on this PE (the CLI reports the slowest PE).
    pub time_s: f64,
    /// `bytes / time_s` (bytes per second).
    pub algbw: f64,
    /// Bus bandwidth, nccl-tests' factor applied: all_reduce 2(n-1)/n; all_gather,
    /// reduce_scatter, all_to_all(v) (n-1)/n; broadcast and reduce 1.
    pub busbw: f64,
}

/// nccl-tests' bus-bandwidth factor of `kind` on `n` members.
pub fn bus_factor(kind: CollKind, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll
        | CollKind::AllToAllV => (n - 1.0) / n,
        CollKind::Broadcast | CollKind::Reduce => 1.0,
    }
}

/// Times `iters` calls of `kind` on `team` over `bytes` bytes of `f32` (rounded down to a
/// multiple of 4·team size), after `warmup` untimed calls. Collective over the world (it
/// allocates and frees its buffers); members of `team` time, the others only allocate.
pub fn run(
    coll: &Coll<'_>,
    team: &Team,
    kind: CollKind,
    bytes: usize,
    warmup: usize,
    iters: usize,
) -> Result<BenchResult> {
    let pe = coll.pe();
    let n = team.n_pes();
    let total = bytes / 4 / n * n; // elements of the full vector
    let per = total / n; // elements per member part
    let src = pe.alloc::<f32>(total.max(1))?;
    let dst = pe.alloc::<f32>(total.max(1))?;
    let r = (|| -> Result<f64> {
        if team.members().get(team.my_pe()) != Some(&pe.my_pe()) {
            return Ok(0.0);
        }
        pe.local_fill(&src, 1.0)?;
        let counts = vec![per; n];
        let displs: Vec<usize> = (0..n).map(|j| j * per).collect();
        let v = AllToAllV {
            send_counts: &counts,
            send_displs: &displs,
            recv_counts: &counts,
            recv_displs: &displs,
        };
        let once = || match kind {
            CollKind::Broadcast => coll.broadcast(team, &dst, &src, total, 0),
            CollKind::Reduce => coll.reduce(
                team,
                &dst,
                &src,
                total,
                ToRoot {
                    op: ReduceOp::Sum,
                    root: 0,
                },
            ),
            CollKind::AllReduce => coll.all_reduce(team, &dst, &src, total, ReduceOp::Sum),
            CollKind::AllGather => coll.all_gather(team, &dst, &src, per),
            CollKind::ReduceScatter => coll.reduce_scatter(team, &dst, &src, per, ReduceOp::Sum),
            CollKind::AllToAll => coll.all_to_all(team, &dst, &src, per),
            CollKind::AllToAllV => coll.all_to_all_v(team, &dst, &src, &v),
        };
        for _ in 0..warmup {
            once()?;
        }
        coll.barrier(team)?;
        let t = Instant::now();
        for _ in 0..iters {
            once()?;
        }
        Ok(t.elapsed().as_secs_f64() / iters.max(1) as f64)
    })();
    let fs = pe.free(dst).and_then(|_| pe.free(src));
    let time_s = r?;
    fs?;
    let b = (total * 4) as f64;
    let algbw = if time_s > 0.0 { b / time_s } else { 0.0 };
    Ok(BenchResult {
        kind,
        bytes: total * 4,
        n_pes: n,
        time_s,
        algbw,
        busbw: algbw * bus_factor(kind, n),
    })
}
