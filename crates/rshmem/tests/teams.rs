//! Teams: strided splits, color/key splits, nested splits, index translation, team barriers
//! that order data, slot recycling and exhaustion, the split errors, and an MoE buffer that
//! outlives its team.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{check_eq, expect_err};
use harness::rand_vec;
use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{Error, Pe, Result, Team};

/// Each member puts a random block into the next member of `team`, a team barrier, then checks
/// the block from the previous member; `rounds` times, alternating barrier and quiet+sync.
fn team_ring(pe: &Pe, team: &Team, x: &rshmem::Sym<u32>, seed: u64, rounds: u64) -> Result<()> {
    let (i, m) = (team.my_pe(), team.n_pes());
    let next = team.world_pe((i + 1) % m)?;
    let prev_index = (i + m - 1) % m;
    for r in 0..rounds {
        let data: Vec<u32> = rand_vec(pe.my_pe(), seed + r, x.len());
        pe.put(x, 0, &data, next)?;
        if r % 2 == 0 {
            pe.team_barrier(team)?;
        } else {
            pe.quiet()?;
            pe.team_sync(team)?;
        }
        let want: Vec<u32> = rand_vec(team.world_pe(prev_index)?, seed + r, x.len());
        check_eq("team ring", &pe.local_vec(x)?, &want);
        // nobody writes the next round's data before everyone has read this round's
        pe.team_sync(team)?;
    }
    Ok(())
}

fn world_team(pe: &Pe) -> Result<()> {
    let w = pe.world_team();
    assert!(w.is_world());
    assert_eq!(w.n_pes(), pe.n_pes());
    assert_eq!(w.my_pe(), pe.my_pe());
    assert_eq!(w.members(), (0..pe.n_pes()).collect::<Vec<_>>());
    for i in 0..pe.n_pes() {
        assert_eq!(w.world_pe(i)?, i);
        assert_eq!(w.team_pe(i), Some(i));
        assert_eq!(w.translate(i, w)?, Some(i));
    }
    assert_eq!(w.team_pe(pe.n_pes()), None);
    let n = pe.n_pes();
    for bad in [n, usize::MAX] {
        expect_err(
            "world_pe out of range",
            w.world_pe(bad),
            |e| matches!(e, Error::PeOutOfRange { pe, n_pes, what: "team" } if *pe == bad && *n_pes == n),
        );
        expect_err(
            "translate out of range",
            w.translate(bad, w),
            |e| matches!(e, Error::PeOutOfRange { pe, .. } if *pe == bad),
        );
    }
    assert_eq!(w.team_pe(usize::MAX), None);
    let x = pe.alloc::<u32>(33)?;
    team_ring(pe, w, &x, 1, 6)?;
    pe.free(x)
}
mode_test!(world_team_ring, [1, 2, 3, 8], world_team);

fn strided(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let x = pe.alloc::<u32>(17)?;
    let evens = pe.team_split_strided(w, 0, 2, n.div_ceil(2))?;
    let odds = if n >= 2 {
        pe.team_split_strided(w, 1, 2, n / 2)?
    } else {
        None
    };
    let last = pe.team_split_strided(w, n - 1, 0, 1)?;
    let all = pe
        .team_split_strided(w, 0, 1, n)?
        .expect("member of the full team");
    assert_eq!(evens.is_some(), me % 2 == 0);
    assert_eq!(odds.is_some(), me % 2 == 1);
    assert_eq!(last.is_some(), me == n - 1);
    let (mine, other) = if me % 2 == 0 {
        (evens.as_ref(), odds.as_ref())
    } else {
        (odds.as_ref(), evens.as_ref())
    };
    let t = mine.expect("member of my parity team");
    assert!(!t.is_world());
    let want: Vec<usize> = (me % 2..n).step_by(2).collect();
    assert_eq!(t.members(), want);
    assert_eq!(t.my_pe(), me / 2);
    assert_eq!(t.n_pes(), want.len());
    for (i, &wp) in want.iter().enumerate() {
        assert_eq!(t.world_pe(i)?, wp);
        assert_eq!(t.team_pe(wp), Some(i));
        assert_eq!(t.translate(i, w)?, Some(wp));
        assert_eq!(w.translate(wp, t)?, Some(i));
        assert_eq!(t.translate(i, &all)?, Some(wp));
        if let Some(o) = other {
            assert_eq!(t.translate(i, o)?, None, "parity teams are disjoint");
        }
    }
    assert_eq!(t.team_pe(me ^ 1), None);
    expect_err(
        "translate out of range",
        t.translate(want.len(), w),
        |e| matches!(e, Error::PeOutOfRange { pe, n_pes, what: "team" } if *pe == want.len() && *n_pes == want.len()),
    );
    expect_err(
        "world_pe out of range",
        t.world_pe(want.len()),
        |e| matches!(e, Error::PeOutOfRange { pe, n_pes, what: "team" } if *pe == want.len() && *n_pes == want.len()),
    );
    if let Some(l) = &last {
        assert_eq!(l.members(), [n - 1]);
        pe.team_barrier(l)?;
    }
    assert_eq!(all.members(), (0..n).collect::<Vec<_>>());
    // The parity teams run their barriers at the same time, on different slots.
    team_ring(pe, t, &x, 10, 8)?;
    pe.barrier_all()?;
    team_ring(pe, &all, &x, 20, 4)?;
    pe.barrier_all()?;
    pe.team_destroy(all)?;
    if let Some(l) = last {
        pe.team_destroy(l)?;
    }
    for t in [evens, odds].into_iter().flatten() {
        pe.team_destroy(t)?;
    }
    pe.free(x)
}
mode_test!(strided_split, [1, 2, 3, 8], strided);

/// The groups a color split must produce: per color ascending, members by (key, index).
fn expected_groups(colors: &[Option<u32>], keys: &[i64]) -> Vec<Vec<usize>> {
    let mut cs: Vec<u32> = colors.iter().flatten().copied().collect();
    cs.sort_unstable();
    cs.dedup();
    cs.iter()
        .map(|&c| {
            let mut m: Vec<usize> = (0..colors.len())
                .filter(|&i| colors[i] == Some(c))
                .collect();
            m.sort_by_key(|&i| (keys[i], i));
            m
        })
        .collect()
}

fn color_key(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let x = pe.alloc::<u32>(9)?;
    // PE 4 opts out; keys reverse the order within a color, with ties broken by index
    let colors: Vec<Option<u32>> = (0..n)
        .map(|p| (p != 4).then_some((p % 3) as u32 * 7))
        .collect();
    let keys: Vec<i64> = (0..n).map(|p| -((p / 2) as i64)).collect();
    let t = pe.team_split(w, colors[me], keys[me])?;
    let groups = expected_groups(&colors, &keys);
    match colors[me] {
        None => assert!(t.is_none(), "PE without color got a team"),
        Some(_) => {
            let t = t.as_ref().expect("team");
            let g = groups.iter().find(|g| g.contains(&me)).expect("group");
            assert_eq!(t.members(), g.as_slice());
            assert_eq!(t.my_pe(), g.iter().position(|&p| p == me).unwrap());
            for (i, &p) in g.iter().enumerate() {
                assert_eq!(t.translate(i, w)?, Some(p));
            }
            team_ring(pe, t, &x, 30 + me as u64 % 3, 6)?;
        }
    }
    // every PE with no color: nobody gets a team
    let none = pe.team_split(w, None, 0)?;
    assert!(none.is_none());
    // same color everywhere, keys descending: the team is the world reversed
    let rev = pe.team_split(w, Some(1), -(me as i64))?.expect("team");
    assert_eq!(rev.members(), (0..n).rev().collect::<Vec<_>>());
    assert_eq!(rev.my_pe(), n - 1 - me);
    team_ring(pe, &rev, &x, 40, 4)?;
    pe.barrier_all()?;
    pe.team_destroy(rev)?;
    if let Some(t) = t {
        pe.team_destroy(t)?;
    }
    pe.free(x)
}
mode_test!(color_key_split, [1, 2, 3, 8], color_key);

fn nested(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let x = pe.alloc::<u32>(5)?;
    let half = pe
        .team_split(w, Some((me % 2) as u32), 0)?
        .expect("every PE has a color");
    let hw: Vec<usize> = (me % 2..n).step_by(2).collect();
    assert_eq!(half.members(), hw);
    // inside the half: every other member, i.e. world PEs me%2, me%2+4, ...
    let q = pe.team_split_strided(&half, 0, 2, hw.len().div_ceil(2))?;
    let qw: Vec<usize> = hw.iter().copied().step_by(2).collect();
    assert_eq!(q.is_some(), qw.contains(&me));
    if let Some(q) = &q {
        assert_eq!(q.members(), qw);
        for (i, &p) in qw.iter().enumerate() {
            assert_eq!(q.translate(i, w)?, Some(p));
            assert_eq!(q.translate(i, &half)?, Some(2 * i));
            assert_eq!(half.translate(2 * i, q)?, Some(i));
        }
        // a split of the nested team by color: singletons
        let single = pe.team_split(q, Some(q.my_pe() as u32), 0)?.expect("team");
        assert_eq!(single.members(), [me]);
        assert_eq!(single.translate(0, w)?, Some(me));
        pe.team_barrier(&single)?;
        team_ring(pe, q, &x, 50, 4)?;
        pe.team_destroy(single)?;
    }
    pe.team_barrier(&half)?;
    team_ring(pe, &half, &x, 60, 4)?;
    pe.barrier_all()?;
    if let Some(q) = q {
        pe.team_destroy(q)?;
    }
    pe.team_destroy(half)?;
    pe.free(x)
}
mode_test!(nested_split, [1, 2, 3, 8], nested);

/// Create and destroy teams far more often than there are slots, overlapping lifetimes, with a
/// data check through each barrier (counters of a recycled slot must start from zero).
fn recycle(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let w = pe.world_team();
    let x = pe.alloc::<u32>(3)?;
    let slots = pe.config().max_teams;
    let mut keep = pe.team_split_strided(w, 0, 1, n)?.expect("team");
    for i in 0..(2 * slots) as u64 {
        let t = pe.team_split_strided(w, 0, 1, n)?.expect("team");
        team_ring(pe, &t, &x, 1000 + 10 * i, 2)?;
        team_ring(pe, &keep, &x, 5000 + 10 * i, 1)?;
        // swap the roles so both old and new slots get reused
        let old = std::mem::replace(&mut keep, t);
        pe.team_destroy(old)?;
    }
    pe.team_destroy(keep)?;
    pe.free(x)
}
mode_test!(slot_recycling, [1, 2, 3, 8], recycle);

/// An MoE buffer keeps its team's barriers for later calls: once the team is destroyed, and
/// even after a new team got its slot, the buffer's calls are an `Error::Team` on every PE
/// (never a barrier on the new team's counters); the new team works and the buffer frees.
fn buffer_outlives_team(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let t = pe.team_split_strided(w, 0, 1, n)?.expect("member");
    let cfg = EpConfig {
        num_experts: 2 * n,
        max_tokens: 4,
        hidden: 2,
        max_topk: 1,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    };
    let mut buf = HostBuffer::<f32>::new(pe, &t, cfg)?;
    // One token to the next PE's first expert, while the team lives.
    let x = [me as f32 + 1.0, 0.5];
    let ids = [(2 * ((me + 1) % n)) as i32];
    let d = buf.dispatch(pe, &x, &ids, &[1.0], 1)?;
    check_eq(
        "dispatched row",
        &d.x,
        &[((me + n - 1) % n) as f32 + 1.0, 0.5],
    );
    check_eq("combined", &buf.combine(pe, &d.handle, &d.x)?, &x);
    pe.team_destroy(t)?;
    let destroyed = |e: &Error| matches!(e, Error::Team(m) if m.contains("destroyed"));
    expect_err(
        "dispatch on a destroyed team",
        buf.dispatch(pe, &x, &ids, &[1.0], 1),
        destroyed,
    );
    // The next team takes the freed slot.
    let t2 = pe.team_split_strided(w, 0, 1, n)?.expect("member");
    expect_err(
        "dispatch on a reused slot",
        buf.dispatch(pe, &x, &ids, &[1.0], 1),
        destroyed,
    );
    expect_err(
        "combine on a reused slot",
        buf.combine(pe, &d.handle, &d.x),
        destroyed,
    );
    let y = pe.alloc::<u32>(5)?;
    team_ring(pe, &t2, &y, 11, 2)?;
    pe.team_destroy(t2)?;
    pe.free(y)?;
    pe.free(buf)
}
mode_test!(
    ep_buffer_outliving_its_team,
    [1, 2, 3],
    buffer_outlives_team
);

/// Splitting until the slots run out: exactly `max_teams - 1` teams beside the world, then an
/// error on every PE; after destroying them, splitting works again.
fn exhaustion(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let w = pe.world_team();
    let slots = pe.config().max_teams;
    let mut teams = Vec::new();
    loop {
        match pe.team_split_strided(w, 0, 1, n) {
            Ok(t) => teams.push(t.expect("member")),
            Err(Error::Team(msg)) => {
                assert!(msg.contains("no free team slot"), "{msg}");
                break;
            }
            Err(e) => return Err(e),
        }
        assert!(teams.len() < slots, "more teams than slots");
    }
    assert_eq!(teams.len(), slots - 1);
    // a color split needing one slot fails the same way
    expect_err(
        "color split without slots",
        pe.team_split(w, Some(0), 0),
        |e| matches!(e, Error::Team(_)),
    );
    // the last team still works
    let x = pe.alloc::<u32>(2)?;
    if let Some(t) = teams.last() {
        team_ring(pe, t, &x, 7, 2)?;
    }
    for t in teams.drain(..) {
        pe.team_destroy(t)?;
    }
    if slots > 1 {
        let t = pe.team_split_strided(w, 0, 1, n)?.expect("team");
        team_ring(pe, &t, &x, 8, 2)?;
        pe.team_destroy(t)?;
    }
    pe.free(x)
}
mode_test!(slot_exhaustion, [1, 2, 3, 8], exhaustion);

/// Bad strided shapes and mismatched split arguments: an error on every PE, and the world is
/// usable afterwards.
fn split_errors(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let bad = [
        (0, 1, 0),              // empty
        (0, 0, 2),              // stride 0, two PEs
        (0, 1, n + 1),          // too many
        (n, 1, 1),              // start outside
        (1, n, 2),              // second member outside
        (1, usize::MAX, 3),     // stride * (size-1) overflows
        (usize::MAX, 1, 2),     // start + ... overflows
        (0, usize::MAX / 2, 3), // stride * 2 overflows
    ];
    for (start, stride, size) in bad {
        expect_err(
            &format!("strided {start} {stride} {size}"),
            pe.team_split_strided(w, start, stride, size),
            |e| matches!(e, Error::InvalidArgument(_)),
        );
    }
    // different arguments on different PEs
    if n > 1 {
        let start = if me == n - 1 { 1 } else { 0 };
        // the last PE names PE 0, every other PE names the last
        let other = if me == n - 1 { 0 } else { n - 1 };
        expect_err(
            "mismatched strided split",
            pe.team_split_strided(w, start, 1, n - 1),
            |e| {
                matches!(
                    e,
                    Error::CollectiveMismatch {
                        op: "team_split_strided",
                        pe,
                        ..
                    } if *pe == other
                )
            },
        );
        // one PE calls a color split while the others call a strided split
        let r = if me == 0 {
            pe.team_split(w, Some(0), 0)
        } else {
            pe.team_split_strided(w, 0, 1, n)
        };
        expect_err("color vs strided split", r, |e| {
            matches!(e, Error::CollectiveMismatch { .. })
        });
        // one PE allocates while the others split
        if me == 0 {
            expect_err("alloc vs split", pe.alloc::<u8>(8), |e| {
                matches!(e, Error::CollectiveMismatch { op: "alloc", .. })
            });
        } else {
            expect_err("split vs alloc", pe.team_split(w, Some(0), 0), |e| {
                matches!(e, Error::CollectiveMismatch { .. })
            });
        }
    }
    // the world still works, and no slot leaked
    let t = pe.team_split_strided(w, 0, 1, n)?.expect("team");
    let x = pe.alloc::<u32>(4)?;
    team_ring(pe, &t, &x, 9, 2)?;
    pe.team_destroy(t)?;
    pe.free(x)?;
    let mut teams = Vec::new();
    for _ in 1..pe.config().max_teams {
        teams.push(pe.team_split_strided(w, 0, 1, n)?.expect("team"));
    }
    for t in teams {
        pe.team_destroy(t)?;
    }
    Ok(())
}
mode_test!(split_errors_everywhere, [1, 2, 3, 8], split_errors);

/// The same with a small `max_teams` (thread mode: the configuration is this test's own).
#[test]
fn slot_exhaustion_small_max_teams() {
    for (slots, n) in [(1, 2), (2, 3), (3, 3), (4, 8)] {
        let cfg = harness::config().max_teams(slots);
        let r = rshmem::Launch::new()
            .config(cfg)
            .threads()
            .run(n, |pe| {
                assert_eq!(pe.config().max_teams, slots);
                exhaustion(pe)
            })
            .values()
            .expect("world");
        harness::expect_all_ok(&format!("max_teams {slots}, {n} PEs"), r);
    }
}
