//! Collectives of different kinds never match each other: every barrier carries its call's
//! kind, so one PE calling `alloc` while the others call `barrier_all` (or any other pair) is a
//! `CollectiveMismatch` on every PE naming both calls, and the world stays usable afterwards
//! (same heap on every PE, data moves correctly). Threads, processes and mixed mode.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::{Error, Pe, Result, Sym};

/// A collective call a PE makes in a mismatch round.
#[derive(Clone, Copy, Debug, PartialEq)]
enum C {
    BarrierAll,
    SyncAll,
    TeamSync,
    Alloc,
    Free,
    Split,
    AllReduce,
    Broadcast,
}

impl C {
    fn name(self) -> &'static str {
        match self {
            C::BarrierAll => "barrier_all",
            C::SyncAll => "sync_all",
            C::TeamSync => "team_sync",
            C::Alloc => "alloc",
            C::Free => "free",
            C::Split => "team_split_strided",
            C::AllReduce => "all_reduce",
            C::Broadcast => "broadcast",
        }
    }
}

/// (PE 0's call, every other PE's call).
const PAIRS: &[(C, C)] = &[
    (C::Alloc, C::BarrierAll),
    (C::BarrierAll, C::Alloc),
    (C::BarrierAll, C::SyncAll),
    (C::TeamSync, C::BarrierAll),
    (C::AllReduce, C::BarrierAll),
    (C::Broadcast, C::AllReduce),
    (C::Split, C::Alloc),
    (C::Free, C::BarrierAll),
    (C::SyncAll, C::Free),
];

fn call(
    pe: &Pe,
    coll: &Coll,
    c: C,
    obj: &Sym<u64>,
    out: &Sym<u64>,
    victim: Sym<u64>,
) -> Result<()> {
    let world = pe.world_team();
    match c {
        C::BarrierAll => pe.barrier_all(),
        C::SyncAll => pe.sync_all(),
        C::TeamSync => pe.team_sync(world),
        C::Alloc => pe.alloc::<u64>(128).map(|_| ()),
        C::Free => pe.free(victim),
        C::Split => pe.team_split_strided(world, 0, 1, pe.n_pes()).map(|_| ()),
        C::AllReduce => coll.all_reduce(world, out, obj, 4, ReduceOp::Sum),
        C::Broadcast => coll.broadcast(world, out, obj, 4, 0),
    }
}

/// The world works after a mismatch: a fresh object at the same offset everywhere carries
/// every PE's values to its neighbour, and an all-reduce sums exactly.
fn usable(pe: &Pe, coll: &Coll, round: usize) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x = pe.alloc::<u64>(128)?;
    pe.local_fill(&x, common::poison())?;
    pe.barrier_all()?;
    let mine: Vec<u64> = (0..128)
        .map(|i| (round * 1000 + me * 200 + i) as u64)
        .collect();
    pe.put(&x, 0, &mine, (me + 1) % n)?;
    pe.barrier_all()?;
    let prev = (me + n - 1) % n;
    let want: Vec<u64> = (0..128)
        .map(|i| (round * 1000 + prev * 200 + i) as u64)
        .collect();
    common::check_eq(
        &format!("round {round}: neighbour's data"),
        &pe.local_vec(&x)?,
        &want,
    );
    let s = pe.alloc::<u64>(4)?;
    let d = pe.alloc::<u64>(4)?;
    pe.local_write(&s, 0, &[me as u64 + 1, 10, round as u64, 1])?;
    pe.local_fill(&d, common::poison())?;
    coll.all_reduce(pe.world_team(), &d, &s, 4, ReduceOp::Sum)?;
    let nn = n as u64;
    let want = [nn * (nn + 1) / 2, 10 * nn, round as u64 * nn, nn];
    common::check_eq(
        &format!("round {round}: all_reduce"),
        &pe.local_vec(&d)?,
        &want,
    );
    for o in [d, s, x] {
        pe.free(o)?;
    }
    Ok(())
}

fn kinds_never_match(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let coll = Coll::new(pe, CollConfig::default())?;
    for (round, &(odd, rest)) in PAIRS.iter().enumerate() {
        let (_, used0) = pe.heap_usage();
        // Freed by no PE (a mismatched free frees nothing): stays allocated on every PE.
        let victim = pe.alloc::<u64>(8)?;
        let (_, used1) = pe.heap_usage();
        let obj = pe.alloc::<u64>(4)?;
        let out = pe.alloc::<u64>(4)?;
        pe.local_write(&obj, 0, &[1, 2, 3, 4])?;
        pe.barrier_all()?;
        let (mine, theirs, culprit) = if me == 0 {
            (odd, rest, 1)
        } else {
            (rest, odd, 0)
        };
        match call(pe, &coll, mine, &obj, &out, victim) {
            Err(Error::CollectiveMismatch {
                op,
                pe: p,
                mine: m,
                theirs: t,
            }) => assert!(
                op == mine.name()
                    && p == culprit
                    && m.starts_with(mine.name())
                    && t.starts_with(theirs.name()),
                "round {round} ({odd:?} on PE 0 against {rest:?}), PE {me}: mismatch in {op} \
                 naming PE {p}: mine {m:?}, theirs {t:?}"
            ),
            other => panic!(
                "round {round} ({odd:?} on PE 0 against {rest:?}), PE {me}: expected a \
                 CollectiveMismatch naming {} and {}, got {other:?}",
                mine.name(),
                theirs.name()
            ),
        }
        // Nothing was allocated or freed by the mismatched calls.
        pe.free(out)?;
        pe.free(obj)?;
        assert!(used1 > used0);
        assert_eq!(pe.heap_usage().1, used1, "round {round}: heap in use");
        usable(pe, &coll, round)?;
    }
    pe.free(coll)
}

#[test]
fn kinds_never_match_all_modes() {
    harness::all_modes("kinds_never_match_all_modes", 4, kinds_never_match);
}

/// Mismatch messages name element types by name (`u32`, `f32`), not by an internal tag.
#[test]
fn type_mismatch_names_the_types() {
    let r = rshmem::Launch::new()
        .config(harness::config())
        .threads()
        .run(2, |pe| {
            if pe.my_pe() == 0 {
                pe.alloc::<u32>(4).map(|_| ())
            } else {
                pe.alloc::<f32>(4).map(|_| ())
            }
        })
        .values()
        .expect("world");
    for (me, x) in r.into_iter().enumerate() {
        let (mine, theirs) = if me == 0 {
            ("u32", "f32")
        } else {
            ("f32", "u32")
        };
        match x {
            Err(Error::CollectiveMismatch {
                mine: m, theirs: t, ..
            }) => assert!(
                m.ends_with(&format!("type {mine}")) && t.ends_with(&format!("type {theirs}")),
                "PE {me}: {m:?} / {t:?}"
            ),
            other => panic!("PE {me}: {other:?}"),
        }
    }
}
