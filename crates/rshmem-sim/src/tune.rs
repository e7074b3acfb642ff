//! `--tune`: the tuning thresholds a topology calls for, found by timing both sides of each
//! choice on the simulator, with the library's own rules choosing paths.
//!
//! * LL sizes: the largest all_reduce (and all_to_all) size, doubling from 4 KiB, up to which
//!   the LL path beats the path the call takes otherwise at every size.
//! * Push or pull: the smallest size, doubling up to 1 GiB, from which a pair's all_reduce by
//!   stores beats the loads at that size and every larger one (0: never), and the same for
//!   all_to_all.

use crate::schedule::{build, Op, Setup};
use crate::sim::simulate;
use crate::topology::Topology;
use crate::Result;
use rshmem::coll::CollKind;
use rshmem::cuda::{CollTuning, LlSizes};

/// The thresholds picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picks {
    /// Largest LL all_reduce of a pair (a team of n: 2/n of it).
    pub ll_all_reduce: usize,
    /// Largest LL all_to_all (all shares together).
    pub ll_all_to_all: usize,
    /// Smallest pull all_reduce that pushes (0: never; pairs only).
    pub push_all_reduce: usize,
    /// Smallest pull all_to_all that pushes (0: never).
    pub push_all_to_all: usize,
}

fn time(
    topo: &Topology,
    setup: &Setup,
    tuning: CollTuning,
    kind: CollKind,
    pes: usize,
    bytes: usize,
) -> Result<(f64, String)> {
    let s = Setup {
        tuning,
        ..setup.clone()
    };
    let p = build(topo, &s, Op::Coll(kind), pes, bytes)?;
    Ok((simulate(topo, &p, &mut |_, _| {})?.time_us, p.path))
}

/// The largest size, doubling from 4 KiB to 16 MiB, up to which `ll` (LL sizes for a call of
/// that size) beats `other` at every size.
fn ll_limit(
    topo: &Topology,
    setup: &Setup,
    kind: CollKind,
    pes: usize,
    sizes: impl Fn(usize) -> (LlSizes, LlSizes),
) -> Result<usize> {
    let mut best = 0;
    let mut s = 4 << 10;
    while s <= 16 << 20 {
        let (on, off) = sizes(s);
        let base = setup.tuning.clone();
        let (t_ll, p_ll) = time(topo, setup, base.clone().with_ll(on), kind, pes, s)?;
        let (t_other, _) = time(topo, setup, base.with_ll(off), kind, pes, s)?;
        if p_ll != "ll" || t_ll > t_other {
            break;
        }
        best = s;
        s *= 2;
    }
    Ok(best)
}

/// The smallest size, doubling from 1 MiB to 1 GiB, from which `push` beats `pull` at every
/// size (0: never).
fn push_limit(
    topo: &Topology,
    setup: &Setup,
    kind: CollKind,
    pes: usize,
    set: impl Fn(&mut CollTuning, usize),
) -> Result<usize> {
    let mut from = 0;
    let mut s = 1usize << 30;
    while s >= 1 << 20 {
        let mut push = setup.tuning.clone();
        set(&mut push, 1);
        let mut pull = setup.tuning.clone();
        set(&mut pull, 0);
        let (tp, _) = time(topo, setup, push, kind, pes, s)?;
        let (tl, _) = time(topo, setup, pull, kind, pes, s)?;
        if tp >= tl {
            break;
        }
        from = s;
        s /= 2;
    }
    Ok(from)
}

/// The picks for `pes` PEs of `topo`.
pub fn pick(topo: &Topology, setup: &Setup, pes: usize) -> Result<Picks> {
    let ll_all_reduce = ll_limit(topo, setup, CollKind::AllReduce, pes, |s| {
        (
            LlSizes {
                all_reduce: s * pes.max(2) / 2,
                all_to_all: 2 * s,
            },
            LlSizes {
                all_reduce: s / 4,
                all_to_all: s / 2,
            },
        )
    })?;
    // The knob is a pair's size; a team of n runs the LL all_reduce up to 2/n of it.
    let ll_all_reduce = ll_all_reduce * pes.max(2) / 2;
    let ll_all_to_all = ll_limit(topo, setup, CollKind::AllToAll, pes, |s| {
        (
            LlSizes {
                all_reduce: s / 2,
                all_to_all: s,
            },
            LlSizes {
                all_reduce: s / 4,
                all_to_all: s / pes.max(2) / 2,
            },
        )
    })?;
    let push_all_reduce = if pes == 2 {
        push_limit(topo, setup, CollKind::AllReduce, pes, |t, v| {
            t.push_all_reduce = v
        })?
    } else {
        0
    };
    let push_all_to_all = push_limit(topo, setup, CollKind::AllToAll, pes, |t, v| {
        t.push_all_to_all = v
    })?;
    Ok(Picks {
        ll_all_reduce,
        ll_all_to_all,
        push_all_reduce,
        push_all_to_all,
    })
}

fn size(b: usize) -> String {
    match b {
        0 => "never".to_string(),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The picks as text, beside the library's defaults.
pub fn report(topo: &Topology, setup: &Setup, pes: usize) -> Result<String> {
    let p = pick(topo, setup, pes)?;
    let d = CollTuning::default();
    let ll = rshmem::cuda::default_ll_sizes(setup.heap, pes);
    let mut s = format!(
        "{} ({pes} PEs): tuning picks, the library's defaults beside\n",
        topo.name
    );
    let rows = [
        ("RSHMEM_CUDA_COLL_LL_BYTES", p.ll_all_reduce, ll.all_reduce),
        (
            "RSHMEM_CUDA_COLL_LL_A2A_BYTES",
            p.ll_all_to_all,
            ll.all_to_all,
        ),
        (
            "RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES",
            p.push_all_reduce,
            d.push_all_reduce,
        ),
        (
            "RSHMEM_CUDA_COLL_PUSH_A2A_BYTES",
            p.push_all_to_all,
            d.push_all_to_all,
        ),
    ];
    for (name, pick, default) in rows {
        let every =
            name.contains("PUSH_A2A") && pick > 0 && pick <= 2 * p.ll_all_to_all.max(ll.all_to_all);
        let pick = if every {
            "1 (every pull size)".to_string()
        } else {
            size(pick)
        };
        s += &format!("{name:<40} {pick:>20}   default {}\n", size(default));
    }
    Ok(s)
}
