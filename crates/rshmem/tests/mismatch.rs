//! Collectives of different kinds never match each other: every barrier carries its call's
//! kind, so one PE calling `alloc` while the others call `barrier_all` (or any other pair) is a
//! `CollectiveMismatch` on every PE naming both calls, and the world stays usable afterwards
//! (same heap on every PE, data moves correctly). Threads, processes and mixed mode. The host
//! MoE calls too: a dispatch or combine against `barrier_all`, `alloc`, an all-reduce or the
//! other MoE call, after which the same buffer dispatches and combines exactly.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::ep::{Dispatched, EpConfig, EpMode, HostBuffer, RecvLayout};
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
        assert_mismatch(
            call(pe, &coll, mine, &obj, &out, victim),
            (mine.name(), theirs.name()),
            culprit,
            &format!("round {round} ({odd:?} on PE 0 against {rest:?}), PE {me}"),
        );
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

/// Asserts that `r` is a `CollectiveMismatch` of this PE's call `mine` naming `culprit` inside
/// `theirs`.
fn assert_mismatch<T: std::fmt::Debug>(
    r: Result<T>,
    (mine, theirs): (&str, &str),
    culprit: usize,
    what: &str,
) {
    match r {
        Err(Error::CollectiveMismatch {
            op,
            pe: p,
            mine: m,
            theirs: t,
        }) => assert!(
            op == mine && p == culprit && m.starts_with(mine) && t.starts_with(theirs),
            "{what}: mismatch in {op} naming PE {p}: mine {m:?}, theirs {t:?}"
        ),
        other => panic!(
            "{what}: expected a CollectiveMismatch naming {mine} and {theirs} (PE {culprit}), \
             got {other:?}"
        ),
    }
}

/// A host MoE call, or a call of another kind, in a mismatch round.
#[derive(Clone, Copy, Debug, PartialEq)]
enum M {
    BarrierAll,
    Alloc,
    AllReduce,
    Dispatch,
    Combine,
}

impl M {
    fn name(self) -> &'static str {
        match self {
            M::BarrierAll => "barrier_all",
            M::Alloc => "alloc",
            M::AllReduce => "all_reduce",
            M::Dispatch => "ep dispatch",
            M::Combine => "ep combine",
        }
    }
}

/// (PE 0's call, every other PE's call).
const MOE_PAIRS: &[(M, M)] = &[
    (M::Dispatch, M::BarrierAll),
    (M::BarrierAll, M::Dispatch),
    (M::Combine, M::Alloc),
    (M::Alloc, M::Combine),
    (M::Dispatch, M::Combine),
    (M::Combine, M::Dispatch),
    (M::Dispatch, M::AllReduce),
];

const MOE_T: usize = 6;
const MOE_H: usize = 4;
const MOE_E: usize = 8;

fn moe_cfg() -> EpConfig {
    EpConfig {
        num_experts: MOE_E,
        max_tokens: 8,
        hidden: MOE_H,
        max_topk: 2,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    }
}

/// PE `s`'s routing in round `round`: token `t` goes to two different experts, weights 1/2
/// and 1/4.
fn moe_ids(s: usize, round: usize) -> Vec<i32> {
    (0..MOE_T)
        .flat_map(|t| {
            let e = (s + t + round) % MOE_E;
            [e as i32, ((e + 1 + t % 3) % MOE_E) as i32]
        })
        .collect()
}

/// PE `s`'s hidden state of token `t` in round `round` (exact in f32, also times 3/4).
fn moe_x(s: usize, t: usize, round: usize) -> Vec<f32> {
    (0..MOE_H)
        .map(|h| ((round * 7 + s * 3 + t) % 50) as f32 + h as f32 * 0.5)
        .collect()
}

/// A dispatch of round `round`'s routing on every PE, its rows checked against every PE's
/// routing: each (expert, source, token, slot) once, carrying the source's row.
fn moe_dispatch(pe: &Pe, buf: &mut HostBuffer<f32>, round: usize) -> Result<Dispatched<f32>> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x: Vec<f32> = (0..MOE_T).flat_map(|t| moe_x(me, t, round)).collect();
    let w: Vec<f32> = (0..MOE_T).flat_map(|_| [0.5, 0.25]).collect();
    let d = buf.dispatch(pe, &x, &moe_ids(me, round), &w, 2)?;
    let epp = MOE_E / n;
    let mut want = Vec::new();
    for s in 0..n {
        for (i, &e) in moe_ids(s, round).iter().enumerate() {
            if e as usize / epp == me {
                want.push((e as usize, s, i / 2, i % 2));
            }
        }
    }
    want.sort_unstable();
    let h = &d.handle;
    let offs = h.expert_offsets();
    let mut got = Vec::new();
    for r in 0..h.num_rows() {
        let e = me * epp + (0..epp).find(|&l| offs[l] <= r && r < offs[l + 1]).unwrap();
        let i = h.row_token()[r] as usize;
        let (s, t) = (h.recv_src_pe()[i] as usize, h.recv_src_token()[i] as usize);
        common::check_eq(
            &format!("round {round}: row {r} (PE {s} token {t})"),
            &d.x[r * MOE_H..(r + 1) * MOE_H],
            &moe_x(s, t, round),
        );
        got.push((e, s, t, h.row_slot()[r] as usize));
    }
    got.sort_unstable();
    assert_eq!(got, want, "PE {me} round {round}: rows received");
    Ok(d)
}

/// Combine of `d` with identity experts: each token comes back as x * (1/2 + 1/4), exactly.
fn moe_combine(
    pe: &Pe,
    buf: &mut HostBuffer<f32>,
    d: &Dispatched<f32>,
    round: usize,
) -> Result<()> {
    let out = buf.combine(pe, &d.handle, &d.x)?;
    let want: Vec<f32> = (0..MOE_T)
        .flat_map(|t| moe_x(pe.my_pe(), t, round))
        .map(|v| v * 0.75)
        .collect();
    common::check_eq(&format!("round {round}: combine"), &out, &want);
    Ok(())
}

/// Dispatch and combine of one buffer against barrier-type calls and each other: every PE gets
/// a `CollectiveMismatch` naming both calls, nothing moves, and the buffer and the world work
/// afterwards (the pending dispatch combines, a new round dispatches and combines, data checked).
fn moe_kinds_never_match(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let coll = Coll::new(pe, CollConfig::default())?;
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), moe_cfg())?;
    let obj = pe.alloc::<u64>(4)?;
    let out = pe.alloc::<u64>(4)?;
    pe.local_write(&obj, 0, &[1, 2, 3, 4])?;
    for (k, &(odd, rest)) in MOE_PAIRS.iter().enumerate() {
        let round = 2 * k;
        let d = moe_dispatch(pe, &mut buf, round)?;
        let (_, used) = pe.heap_usage();
        let (mine, theirs, culprit) = if me == 0 {
            (odd, rest, 1)
        } else {
            (rest, odd, 0)
        };
        let x: Vec<f32> = (0..MOE_T).flat_map(|t| moe_x(me, t, round + 1)).collect();
        let w = vec![0.5f32; 2 * MOE_T];
        let r = match mine {
            M::BarrierAll => pe.barrier_all(),
            M::Alloc => pe.alloc::<u64>(128).map(|_| ()),
            M::AllReduce => coll.all_reduce(pe.world_team(), &out, &obj, 4, ReduceOp::Sum),
            M::Dispatch => buf
                .dispatch(pe, &x, &moe_ids(me, round + 1), &w, 2)
                .map(|_| ()),
            M::Combine => buf.combine(pe, &d.handle, &d.x).map(|_| ()),
        };
        let what = format!("round {k} ({odd:?} on PE 0 against {rest:?}), PE {me}");
        assert_mismatch(r, (mine.name(), theirs.name()), culprit, &what);
        assert_eq!(pe.heap_usage().1, used, "{what}: heap in use");
        // The team is in step: the dispatch before the mismatch combines, the buffer carries
        // a new round, and the world moves data.
        moe_combine(pe, &mut buf, &d, round)?;
        let d = moe_dispatch(pe, &mut buf, round + 1)?;
        moe_combine(pe, &mut buf, &d, round + 1)?;
        pe.barrier_all()?;
        usable(pe, &coll, round)?;
    }
    pe.free(out)?;
    pe.free(obj)?;
    pe.free(buf)?;
    pe.free(coll)
}

#[test]
fn moe_kinds_never_match_all_modes() {
    harness::all_modes("moe_kinds_never_match_all_modes", 4, moe_kinds_never_match);
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
