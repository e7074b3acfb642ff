//! Functional mode: the call runs for real, PEs as threads on the CPU backend moving real
//! data, while its clock is the simulated one; every result is checked.
//!
//! The collectives run on [`rshmem::coll::Coll`], the host executor of the same plans the
//! simulator times, and the MoE dispatch on [`rshmem::ep::HostBuffer`] with the same seeded
//! routing ([`seeded_topk`]); each PE checks every value it holds afterwards against what
//! it must hold, computed apart from the library. The time reported is the timing mode's for
//! the same call on the topology: the data moves in real time, the clock is virtual.

use crate::schedule::{build, seeded_topk, EpSpec, Op, Setup};
use crate::sim::simulate;
use crate::topology::Topology;
use crate::{Result, SimError};
use rshmem::coll::{Coll, CollConfig, CollKind, ReduceOp};
use rshmem::ep::{EpConfig, HostBuffer};
use rshmem::Pe;

/// What a functional run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Functional {
    /// PEs (threads).
    pub pes: usize,
    /// Values checked on all PEs together.
    pub checked: usize,
    /// Simulated time of the call on the topology, µs.
    pub time_us: f64,
}

/// The largest collective a functional run moves (the CPU backend's heap holds the buffers).
pub const MAX_BYTES: usize = 16 << 20;

/// Element `i` of PE `p`'s input: distinct per PE and element, and sums of them stay exact.
fn value(p: usize, i: usize) -> u64 {
    (p as u64) << 40 | i as u64
}

/// Runs `op` of `bytes` (a multiple of 8 per PE's part) on `pes` thread-PEs with real data,
/// checking every result. MoE calls take their shape from `setup.ep`, at most 128 tokens and
/// 256 hidden values per PE.
pub fn run(topo: &Topology, setup: &Setup, op: Op, pes: usize, bytes: usize) -> Result<Functional> {
    if bytes > MAX_BYTES {
        return Err(SimError::Invalid(format!(
            "functional mode moves at most {MAX_BYTES} bytes per call, not {bytes}"
        )));
    }
    let ep = EpSpec {
        tokens: setup.ep.tokens.min(128),
        hidden: setup.ep.hidden.min(256),
        ..setup.ep.clone()
    };
    let setup = Setup {
        ep: ep.clone(),
        ..setup.clone()
    };
    let prog = build(topo, &setup, op, pes, bytes)?;
    let time_us = simulate(topo, &prog, &mut |_, _| {})?.time_us;
    let config = setup.config;
    let counts = rshmem::Launch::new()
        .threads()
        .run(pes, |pe| -> Result<usize> {
            match op {
                Op::Coll(kind) => coll(pe, &config, kind, bytes),
                Op::Dispatch => dispatch(pe, &ep),
                _ => Err(SimError::Invalid(format!(
                    "functional mode runs the collectives and dispatch, not {}",
                    op.name()
                ))),
            }
        })
        .values()?;
    let mut checked = 0;
    for c in counts {
        checked += c?;
    }
    Ok(Functional {
        pes,
        checked,
        time_us,
    })
}

fn mismatch(pe: usize, what: &str, i: usize, got: u64, want: u64) -> SimError {
    SimError::Invalid(format!(
        "functional check failed on PE {pe}: {what}[{i}] = {got:#x}, expected {want:#x}"
    ))
}

/// One collective of `bytes` (u64 elements) on the world, checked; returns values checked.
fn coll(pe: &Pe, config: &CollConfig, kind: CollKind, bytes: usize) -> Result<usize> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let world = pe.world_team();
    let c = Coll::new(pe, *config)?;
    let per = |b: usize| (b / 8).max(1);
    // count: the call's count argument; input and output lengths in elements.
    let (count, src_len, dst_len) = match kind {
        CollKind::AllGather => (per(bytes / n), per(bytes / n), per(bytes / n) * n),
        CollKind::ReduceScatter => (per(bytes / n), per(bytes / n) * n, per(bytes / n)),
        CollKind::AllToAll => (per(bytes / n), per(bytes / n) * n, per(bytes / n) * n),
        _ => (per(bytes), per(bytes), per(bytes)),
    };
    let src = pe.alloc::<u64>(src_len)?;
    let dst = pe.alloc::<u64>(dst_len)?;
    let input: Vec<u64> = (0..src_len).map(|i| value(me, i)).collect();
    pe.local_write(&src, 0, &input)?;
    // Poisoned: value(0, 0) is 0, which a fresh heap already holds.
    pe.local_fill(&dst, u64::MAX)?;
    pe.barrier_all()?;
    match kind {
        CollKind::AllReduce => c.all_reduce(world, &dst, &src, count, ReduceOp::Sum)?,
        CollKind::AllGather => c.all_gather(world, &dst, &src, count)?,
        CollKind::ReduceScatter => c.reduce_scatter(world, &dst, &src, count, ReduceOp::Sum)?,
        CollKind::AllToAll => c.all_to_all(world, &dst, &src, count)?,
        CollKind::Broadcast => c.broadcast(world, &dst, &src, count, 0)?,
        _ => {
            return Err(SimError::Invalid(format!(
                "functional mode does not run {}",
                kind.name()
            )))
        }
    }
    let got = pe.local_vec(&dst)?;
    let sum = |i: usize| (0..n).fold(0u64, |a, p| a.wrapping_add(value(p, i)));
    for (i, &g) in got.iter().enumerate() {
        let want = match kind {
            CollKind::AllReduce => sum(i),
            CollKind::AllGather => value(i / count, i % count),
            CollKind::ReduceScatter => sum(me * count + i),
            CollKind::AllToAll => value(i / count, me * count + i % count),
            _ => value(0, i),
        };
        if g != want {
            return Err(mismatch(me, kind.name(), i, g, want));
        }
    }
    pe.barrier_all()?;
    pe.free(c)?;
    pe.free(dst)?;
    pe.free(src)?;
    Ok(got.len())
}

/// Row `t` of PE `p`'s tokens, value `h`: exact in f32.
fn row_value(p: usize, t: usize, h: usize) -> f32 {
    ((p * 131 + t * 7 + h) % 4096) as f32
}

/// One expert-major dispatch on the seeded routing, checked row by row.
fn dispatch(pe: &Pe, ep: &EpSpec) -> Result<usize> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let (t_n, h, k) = (ep.tokens, ep.hidden, ep.topk);
    let cfg = EpConfig::new(ep.experts, t_n, h, k);
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg)?;
    let routing: Vec<Vec<i32>> = (0..n)
        .map(|p| {
            let mut ids = vec![0i32; t_n * k];
            seeded_topk(ep, p, &mut ids);
            ids
        })
        .collect();
    let x: Vec<f32> = (0..t_n * h).map(|i| row_value(me, i / h, i % h)).collect();
    let weights = vec![1.0f32; t_n * k];
    let d = buf.dispatch(pe, &x, &routing[me], &weights, k)?;
    // Expert-major: for each local expert, every (source PE, token, slot) it serves.
    let epp = ep.experts / n;
    let mut want = Vec::new();
    for e in me * epp..(me + 1) * epp {
        for (s, ids) in routing.iter().enumerate() {
            for t in 0..t_n {
                for &id in &ids[t * k..(t + 1) * k] {
                    if id == e as i32 {
                        want.extend((0..h).map(|j| row_value(s, t, j)));
                    }
                }
            }
        }
    }
    if d.x.len() != want.len() {
        return Err(SimError::Invalid(format!(
            "functional check failed on PE {me}: {} received values, expected {}",
            d.x.len(),
            want.len()
        )));
    }
    for (i, (g, w)) in d.x.iter().zip(&want).enumerate() {
        if g != w {
            return Err(mismatch(me, "dispatch", i, *g as u64, *w as u64));
        }
    }
    pe.barrier_all()?;
    pe.free(buf)?;
    Ok(want.len())
}
