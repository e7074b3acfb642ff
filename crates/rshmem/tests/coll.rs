//! Collectives: every collective × element type × operation × team shape (1–4 PEs, a strided
//! team, a split team) × in place / out of place × one-shot / two-shot with small chunks,
//! against references computed from every member's seeded inputs; and bad inputs.
//!
//! Data: integers are full-range random values (sums and products wrap, checked exactly);
//! floats are `harness::rand_vec` values (multiples of 1/8 below 2^14, so sums of up to 4 of
//! them are exact in f32 and f64) or, for products, small integers — every float result is
//! exact, so floats are compared exactly too (f16/bf16: the exact value rounded once).

#[path = "harness/mod.rs"]
mod harness;

use rshmem::coll::{Algo, AllToAllV, Coll, CollConfig, ReduceOp, ToRoot};
use rshmem::{bf16, f16, Elem, Error, Pe, Result, Sym, Team};

#[macro_use]
#[path = "harness/coll_data.rs"]
mod coll_data;
use coll_data::{check, mix, TElem};

/// The world, a strided team (3+ PEs) and a split team (members in reverse PE order), the
/// same list on every PE (`None` where this PE is not a member).
struct Teams {
    strided: Option<Team>,
    split: Option<Team>,
}

impl Teams {
    fn new(pe: &Pe) -> Result<Teams> {
        let w = pe.world_team();
        let n = pe.n_pes();
        let strided = if n >= 3 {
            pe.team_split_strided(w, (n + 1) % 2, 2, 2)? // 3 PEs: {0, 2}; 4 PEs: {1, 3}
        } else {
            None
        };
        let split = pe.team_split(w, Some((pe.my_pe() % 2) as u32), -(pe.my_pe() as i64))?;
        Ok(Teams { strided, split })
    }
    fn list<'a>(&'a self, pe: &'a Pe) -> [(&'static str, Option<&'a Team>); 3] {
        [
            ("world", Some(pe.world_team())),
            ("strided", self.strided.as_ref()),
            ("split", self.split.as_ref()),
        ]
    }
    fn destroy(self, pe: &Pe) -> Result<()> {
        if let Some(t) = self.strided {
            pe.team_destroy(t)?;
        }
        if let Some(t) = self.split {
            pe.team_destroy(t)?;
        }
        Ok(())
    }
}

/// Two configurations: one-shot with whole-vector steps; two-shot with 16-byte chunks.
fn colls(pe: &Pe) -> Result<[Coll<'_>; 2]> {
    Ok([
        Coll::new(
            pe,
            CollConfig::default()
                .algo(Some(Algo::OneShot))
                .chunk_bytes(1 << 20),
        )?,
        Coll::new(
            pe,
            CollConfig::default()
                .algo(Some(Algo::TwoShot))
                .chunk_bytes(16),
        )?,
    ])
}

/// The element counts tried (per member part), one per case.
const COUNTS: [usize; 4] = [5, 1, 23, 0];
const MAXC: usize = 23;

/// One test case: which coll, team, in place, count, stream.
struct Case<'a> {
    coll: &'a Coll<'a>,
    team: &'a Team,
    in_place: bool,
    count: usize,
    stream: u64,
    ctx: String,
}

/// Calls `f` for every coll × team × in place, with a count and a stream that every PE
/// derives the same way (non-members skip the case but advance the stream).
fn cases<'a>(
    pe: &'a Pe,
    cs: &'a [Coll<'a>; 2],
    teams: &'a Teams,
    what: &str,
    mut f: impl FnMut(&Case<'_>) -> Result<()>,
) -> Result<()> {
    let mut stream = 0u64;
    for (ci, coll) in cs.iter().enumerate() {
        for (tname, team) in teams.list(pe) {
            for in_place in [false, true] {
                stream += 1;
                let Some(team) = team else { continue };
                // Shifted by the coll so that every (coll, team, in place) of the world team
                // moves data: unshifted, two-shot on the world out of place only ever got 0.
                let count = COUNTS[(stream as usize + ci) % COUNTS.len()];
                let ctx = format!(
                    "{what} coll {ci} team {tname} {:?} in_place {in_place} count {count} (PE {} of {})",
                    team.members(),
                    pe.my_pe(),
                    pe.n_pes()
                );
                f(&Case {
                    coll,
                    team,
                    in_place,
                    count,
                    stream,
                    ctx,
                })?;
            }
        }
    }
    Ok(())
}

fn tname<T: Elem>() -> &'static str {
    T::KIND.name()
}

// ----- reductions -----

fn all_reduce_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(MAXC)?;
    for &op in T::ops() {
        let what = format!("all_reduce {} {}", tname::<T>(), op.name());
        cases(pe, cs, teams, &what, |c| {
            let s = c.stream * 16 + op as u64;
            let m = c.team.members();
            let mine = T::gen(pe.my_pe(), s, c.count, op);
            pe.local_fill(&dst, T::poison())?;
            if c.in_place {
                pe.local_write(&dst, 0, &mine)?;
                c.coll.all_reduce(c.team, &dst, &dst, c.count, op)?;
            } else {
                pe.local_write(&src, 0, &mine)?;
                c.coll.all_reduce(c.team, &dst, &src, c.count, op)?;
            }
            let ins: Vec<Vec<T>> = m.iter().map(|&w| T::gen(w, s, c.count, op)).collect();
            let mut want: Vec<T> = (0..c.count)
                .map(|i| T::fold(op, &ins.iter().map(|v| v[i]).collect::<Vec<_>>()))
                .collect();
            want.resize(MAXC, T::poison());
            check(&pe.local_vec(&dst)?, &want, &c.ctx);
            Ok(())
        })?;
    }
    pe.free(dst)?;
    pe.free(src)
}

fn reduce_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(MAXC)?;
    for &op in T::ops() {
        let what = format!("reduce {} {}", tname::<T>(), op.name());
        cases(pe, cs, teams, &what, |c| {
            let s = c.stream * 16 + op as u64;
            let m = c.team.members();
            let root = (c.stream as usize) % m.len();
            let mine = T::gen(pe.my_pe(), s, MAXC, op);
            pe.local_fill(&dst, T::poison())?;
            let obj = if c.in_place { &dst } else { &src };
            pe.local_write(obj, 0, &mine)?;
            c.coll
                .reduce(c.team, &dst, obj, c.count, ToRoot { op, root })?;
            let want: Vec<T> = if c.team.my_pe() == root {
                let ins: Vec<Vec<T>> = m.iter().map(|&w| T::gen(w, s, MAXC, op)).collect();
                let mut w: Vec<T> = (0..c.count)
                    .map(|i| T::fold(op, &ins.iter().map(|v| v[i]).collect::<Vec<_>>()))
                    .collect();
                w.extend_from_slice(if c.in_place { &mine[c.count..] } else { &[] });
                w.resize(MAXC, T::poison());
                w
            } else if c.in_place {
                mine // untouched
            } else {
                vec![T::poison(); MAXC]
            };
            check(
                &pe.local_vec(&dst)?,
                &want,
                &format!("{} root {root}", c.ctx),
            );
            Ok(())
        })?;
    }
    pe.free(dst)?;
    pe.free(src)
}

fn reduce_scatter_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let len = MAXC * pe.n_pes();
    let src = pe.alloc::<T>(len)?;
    let dst = pe.alloc::<T>(len)?;
    for &op in T::ops() {
        let what = format!("reduce_scatter {} {}", tname::<T>(), op.name());
        cases(pe, cs, teams, &what, |c| {
            let s = c.stream * 16 + op as u64;
            let (m, me, k) = (c.team.members(), c.team.my_pe(), c.count);
            let mine = T::gen(pe.my_pe(), s, len, op);
            pe.local_fill(&dst, T::poison())?;
            let obj = if c.in_place { &dst } else { &src };
            pe.local_write(obj, 0, &mine)?;
            c.coll.reduce_scatter(c.team, &dst, obj, k, op)?;
            let ins: Vec<Vec<T>> = m.iter().map(|&w| T::gen(w, s, len, op)).collect();
            let part: Vec<T> = (me * k..(me + 1) * k)
                .map(|i| T::fold(op, &ins.iter().map(|v| v[i]).collect::<Vec<_>>()))
                .collect();
            let want: Vec<T> = if c.in_place {
                let mut w = mine.clone();
                w[me * k..(me + 1) * k].copy_from_slice(&part);
                w
            } else {
                let mut w = part;
                w.resize(len, T::poison());
                w
            };
            check(&pe.local_vec(&dst)?, &want, &c.ctx);
            Ok(())
        })?;
    }
    pe.free(dst)?;
    pe.free(src)
}

// ----- data movement (no op: one pass per type) -----

fn broadcast_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(MAXC)?;
    let what = format!("broadcast {}", tname::<T>());
    cases(pe, cs, teams, &what, |c| {
        let m = c.team.members();
        for (root, &root_pe) in m.iter().enumerate() {
            let s = c.stream * 16 + root as u64;
            let mine = T::gen(pe.my_pe(), s, MAXC, ReduceOp::Sum);
            pe.local_fill(&dst, T::poison())?;
            let obj = if c.in_place { &dst } else { &src };
            pe.local_write(obj, 0, &mine)?;
            c.coll.broadcast(c.team, &dst, obj, c.count, root)?;
            let mut want = T::gen(root_pe, s, c.count, ReduceOp::Sum);
            if c.in_place {
                want.extend_from_slice(&mine[c.count..]);
            }
            want.resize(MAXC, T::poison());
            check(
                &pe.local_vec(&dst)?,
                &want,
                &format!("{} root {root}", c.ctx),
            );
        }
        Ok(())
    })?;
    pe.free(dst)?;
    pe.free(src)
}

fn all_gather_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let len = MAXC * pe.n_pes();
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(len)?;
    let what = format!("all_gather {}", tname::<T>());
    cases(pe, cs, teams, &what, |c| {
        let (m, me, k) = (c.team.members(), c.team.my_pe(), c.count);
        let s = c.stream;
        let mine = T::gen(pe.my_pe(), s, k, ReduceOp::Sum);
        pe.local_fill(&dst, T::poison())?;
        if c.in_place {
            pe.local_write(&dst, me * k, &mine)?;
            c.coll.all_gather(c.team, &dst, &dst, k)?;
        } else {
            pe.local_write(&src, 0, &mine)?;
            c.coll.all_gather(c.team, &dst, &src, k)?;
        }
        let mut want: Vec<T> = m
            .iter()
            .flat_map(|&w| T::gen(w, s, k, ReduceOp::Sum))
            .collect();
        want.resize(len, T::poison());
        check(&pe.local_vec(&dst)?, &want, &c.ctx);
        Ok(())
    })?;
    pe.free(dst)?;
    pe.free(src)
}

fn all_to_all_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let len = MAXC * pe.n_pes();
    let src = pe.alloc::<T>(len)?;
    let dst = pe.alloc::<T>(len)?;
    let what = format!("all_to_all {}", tname::<T>());
    cases(pe, cs, teams, &what, |c| {
        let (m, me, k) = (c.team.members(), c.team.my_pe(), c.count);
        let s = c.stream;
        let mine = T::gen(pe.my_pe(), s, len, ReduceOp::Sum);
        pe.local_fill(&dst, T::poison())?;
        let obj = if c.in_place { &dst } else { &src };
        pe.local_write(obj, 0, &mine)?;
        c.coll.all_to_all(c.team, &dst, obj, k)?;
        let mut want: Vec<T> = if c.in_place {
            mine.clone()
        } else {
            vec![T::poison(); len]
        };
        for (j, &w) in m.iter().enumerate() {
            let theirs = T::gen(w, s, len, ReduceOp::Sum);
            want[j * k..(j + 1) * k].copy_from_slice(&theirs[me * k..(me + 1) * k]);
        }
        check(&pe.local_vec(&dst)?, &want, &c.ctx);
        Ok(())
    })?;
    pe.free(dst)?;
    pe.free(src)
}

/// all_to_all_v layout for a case: member i sends `cnt(i, j)` elements to j from
/// `sdispl(i)[j]`, packed in member order with one-element gaps; j receives them at
/// `rdispl(j)[i]`, packed in reverse member order with two-element gaps.
struct VLayout {
    n: usize,
    stream: u64,
}

impl VLayout {
    fn cnt(&self, i: usize, j: usize) -> usize {
        (mix(harness::rand_vec::<f64>(i * 64 + j, self.stream, 1)[0]) >> 33) as usize % 5
    }
    fn sdispl(&self, i: usize) -> Vec<usize> {
        let mut at = 1;
        (0..self.n)
            .map(|j| {
                let d = at;
                at += self.cnt(i, j) + 1;
                d
            })
            .collect()
    }
    fn rdispl(&self, j: usize) -> Vec<usize> {
        let mut d = vec![0; self.n];
        let mut at = 0;
        for i in (0..self.n).rev() {
            d[i] = at;
            at += self.cnt(i, j) + 2;
        }
        d
    }
    /// Object length that holds every layout: n·(4 + 2) + 1.
    fn len(n: usize) -> usize {
        n * 6 + 1
    }
}

fn all_to_all_v_t<T: TElem>(pe: &Pe, cs: &[Coll<'_>; 2], teams: &Teams) -> Result<()> {
    let len = VLayout::len(pe.n_pes());
    let src = pe.alloc::<T>(len)?;
    let dst = pe.alloc::<T>(len)?;
    let what = format!("all_to_all_v {}", tname::<T>());
    cases(pe, cs, teams, &what, |c| {
        let (m, me, n) = (c.team.members(), c.team.my_pe(), c.team.n_pes());
        let l = VLayout {
            n,
            stream: c.stream,
        };
        let s = c.stream;
        let mine = T::gen(pe.my_pe(), s, len, ReduceOp::Sum);
        pe.local_fill(&dst, T::poison())?;
        let obj = if c.in_place { &dst } else { &src };
        pe.local_write(obj, 0, &mine)?;
        let sc: Vec<usize> = (0..n).map(|j| l.cnt(me, j)).collect();
        let rc: Vec<usize> = (0..n).map(|i| l.cnt(i, me)).collect();
        let (sd, rd) = (l.sdispl(me), l.rdispl(me));
        let v = AllToAllV {
            send_counts: &sc,
            send_displs: &sd,
            recv_counts: &rc,
            recv_displs: &rd,
        };
        c.coll.all_to_all_v(c.team, &dst, obj, &v)?;
        let mut want: Vec<T> = if c.in_place {
            mine.clone()
        } else {
            vec![T::poison(); len]
        };
        for (i, &w) in m.iter().enumerate() {
            let theirs = T::gen(w, s, len, ReduceOp::Sum);
            let at = l.sdispl(i)[me];
            want[rd[i]..rd[i] + rc[i]].copy_from_slice(&theirs[at..at + rc[i]]);
        }
        check(&pe.local_vec(&dst)?, &want, &c.ctx);
        Ok(())
    })?;
    pe.free(dst)?;
    pe.free(src)
}

macro_rules! coll_body {
    ($name:ident, $f:ident) => {
        fn $name(pe: &Pe) -> Result<()> {
            let teams = Teams::new(pe)?;
            let cs = colls(pe)?;
            each_type!($f(pe, &cs, &teams));
            let [a, b] = cs;
            pe.free(a)?;
            pe.free(b)?;
            teams.destroy(pe)
        }
    };
}

coll_body!(all_reduce_body, all_reduce_t);
coll_body!(reduce_body, reduce_t);
coll_body!(reduce_scatter_body, reduce_scatter_t);
coll_body!(broadcast_body, broadcast_t);
coll_body!(all_gather_body, all_gather_t);
coll_body!(all_to_all_body, all_to_all_t);
coll_body!(all_to_all_v_body, all_to_all_v_t);

mode_test!(coll_all_reduce, [1, 2, 3, 4], all_reduce_body);
mode_test!(coll_reduce, [1, 2, 3, 4], reduce_body);
mode_test!(coll_reduce_scatter, [1, 2, 3, 4], reduce_scatter_body);
mode_test!(coll_broadcast, [1, 2, 3, 4], broadcast_body);
mode_test!(coll_all_gather, [1, 2, 3, 4], all_gather_body);
mode_test!(coll_all_to_all, [1, 2, 3, 4], all_to_all_body);
mode_test!(coll_all_to_all_v, [1, 2, 3, 4], all_to_all_v_body);

// ----- larger vectors with the default configuration (size-based choice, many chunks) -----

fn auto_body(pe: &Pe) -> Result<()> {
    // 96K f32 elements = 384 KiB: above the default two-shot threshold, two chunks.
    let coll = Coll::new(pe, CollConfig::default())?;
    let count = 96 << 10;
    let x = pe.alloc::<f32>(count)?;
    for (k, &root) in [0usize, pe.n_pes() - 1].iter().enumerate() {
        let s = 900 + k as u64;
        pe.local_write(&x, 0, &f32::gen(pe.my_pe(), s, count, ReduceOp::Sum))?;
        coll.all_reduce(pe.world_team(), &x, &x, count, ReduceOp::Sum)?;
        let ins: Vec<Vec<f32>> = (0..pe.n_pes())
            .map(|w| f32::gen(w, s, count, ReduceOp::Sum))
            .collect();
        let want: Vec<f32> = (0..count)
            .map(|i| f32::fold(ReduceOp::Sum, &ins.iter().map(|v| v[i]).collect::<Vec<_>>()))
            .collect();
        check(&pe.local_vec(&x)?, &want, "auto all_reduce");
        pe.local_write(&x, 0, &ins[pe.my_pe()])?;
        coll.broadcast(pe.world_team(), &x, &x, count, root)?;
        check(&pe.local_vec(&x)?, &ins[root], "auto broadcast");
    }
    pe.free(x)?;
    pe.free(coll)
}

mode_test!(coll_auto_large, [2, 3], auto_body);

// ----- bad inputs: an error on every member, nothing moved, and the next call works -----

fn bad_body(pe: &Pe) -> Result<()> {
    // a zero chunk is refused before anything is allocated
    let used = pe.heap_usage().1;
    let r = Coll::new(pe, CollConfig::default().chunk_bytes(0)).map(|_| ());
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("chunk")),
        "{r:?}"
    );
    assert_eq!(pe.heap_usage().1, used);
    let coll = Coll::new(pe, CollConfig::default())?;
    let w = pe.world_team();
    let (n, me) = (pe.n_pes(), pe.my_pe());
    let last = n - 1;
    let a = pe.alloc::<i32>(8 * n)?;
    let b = pe.alloc::<i32>(8 * n)?;
    let f = pe.alloc::<f32>(8)?;
    let poison = -7i32;
    let reset = |s: &Sym<i32>| pe.local_fill(s, poison);
    pe.local_write(&a, 0, &vec![me as i32 + 1; 8 * n])?;
    reset(&b)?;
    pe.local_fill(&f, 0.5)?;
    // neither the destination nor the sources changed (`a` is also a destination below)
    let untouched = || -> Result<()> {
        assert!(pe.local_vec(&b)?.iter().all(|&x| x == poison), "data moved");
        assert_eq!(
            pe.local_vec(&a)?,
            vec![me as i32 + 1; 8 * n],
            "source changed"
        );
        assert_eq!(pe.local_vec(&f)?, vec![0.5f32; 8], "float object changed");
        Ok(())
    };

    // count beyond the object on the last PE only
    let r = coll.all_reduce(
        w,
        &b,
        &a,
        if me == last { 8 * n + 1 } else { 8 },
        ReduceOp::Sum,
    );
    if me == last {
        assert!(
            matches!(r, Err(Error::OutOfBounds { start: 0, end, len }) if end == 8 * n + 1 && len == 8 * n),
            "{r:?}"
        );
    } else {
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(&format!("PE {last}"))),
            "{r:?}"
        );
    }
    untouched()?;

    // counts whose n·count (or byte size) overflows usize: an error on every PE, nothing moved
    for count in [usize::MAX / 2 + 1, usize::MAX] {
        for r in [
            coll.all_reduce(w, &b, &a, count, ReduceOp::Sum),
            coll.all_gather(w, &b, &a, count),
            coll.reduce_scatter(w, &b, &a, count, ReduceOp::Sum),
            coll.all_to_all(w, &b, &a, count),
        ] {
            assert!(
                matches!(
                    r,
                    Err(Error::OutOfBounds { .. }) | Err(Error::InvalidArgument(_))
                ),
                "count {count}: {r:?}"
            );
        }
    }
    untouched()?;

    // different counts (each valid on its own)
    let r = coll.all_reduce(w, &b, &a, if me == last { 3 } else { 4 }, ReduceOp::Sum);
    if n > 1 {
        let other = if me == last { 0 } else { last };
        assert!(
            matches!(&r, Err(Error::CollectiveMismatch { pe, .. }) if *pe == other),
            "{r:?}"
        );
    } else {
        // one PE: a valid call, which moves exactly `count` elements
        r?;
        let mut want = vec![poison; 8 * n];
        want[..3].fill(1);
        assert_eq!(pe.local_vec(&b)?, want, "single-PE all_reduce of 3");
        reset(&b)?;
    }
    untouched()?;

    // different objects on the last PE
    let (s, d) = if me == last && n > 1 {
        (&b, &a)
    } else {
        (&a, &b)
    };
    let r = coll.all_gather(w, d, s, 4);
    if n > 1 {
        let other = if me == last { 0 } else { last };
        assert!(
            matches!(&r, Err(Error::CollectiveMismatch { pe, .. }) if *pe == other),
            "{r:?}"
        );
        untouched()?;
    } else {
        r?;
        let mut want = vec![poison; 8];
        want[..4].fill(1);
        assert_eq!(pe.local_vec(&b)?, want, "single-PE all_gather of 4");
        reset(&b)?;
    }

    // different operation, element type, or algorithm on the last PE
    if n > 1 {
        let op = if me == last {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        let r = coll.all_reduce(w, &b, &a, 4, op);
        assert!(matches!(r, Err(Error::CollectiveMismatch { .. })), "{r:?}");
        let r = if me == last {
            let (bu, au) = (b.view::<u32>(0, 8)?, a.view::<u32>(0, 8)?);
            coll.all_reduce(w, &bu, &au, 4, ReduceOp::Sum)
        } else {
            coll.all_reduce(w, &b, &a, 4, ReduceOp::Sum)
        };
        assert!(matches!(r, Err(Error::CollectiveMismatch { .. })), "{r:?}");
        let algo = if me == last {
            Algo::TwoShot
        } else {
            Algo::OneShot
        };
        let other = Coll::new(pe, CollConfig::default().algo(Some(algo)))?;
        let r = other.all_reduce(w, &b, &a, 4, ReduceOp::Sum);
        assert!(matches!(r, Err(Error::CollectiveMismatch { .. })), "{r:?}");
        pe.free(other)?;
        untouched()?;
    }

    // root outside the team
    let r = coll.broadcast(w, &b, &a, 4, n);
    assert!(
        matches!(r, Err(Error::PeOutOfRange { pe, .. }) if pe == n),
        "{r:?}"
    );
    let r = coll.reduce(
        w,
        &b,
        &a,
        4,
        ToRoot {
            op: ReduceOp::Max,
            root: n + 5,
        },
    );
    assert!(
        matches!(r, Err(Error::PeOutOfRange { pe, n_pes, what: "team" }) if pe == n + 5 && n_pes == n),
        "{r:?}"
    );
    untouched()?;

    // bitwise operation on floats
    for op in [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor] {
        let r = coll.all_reduce(w, &f, &f, 8, op);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        let r = coll.reduce_scatter(w, &f, &f, 1, op);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }

    // partially overlapping source and destination
    let v1 = a.view::<i32>(0, 4 * n)?;
    let v2 = a.view::<i32>(8, 4 * n)?; // two elements further
    let r = coll.all_to_all(w, &v2, &v1, 1);
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("overlap")),
        "{r:?}"
    );
    // all_to_all needs n·count elements
    let r = coll.all_to_all(w, &b, &a, 9);
    assert!(
        matches!(r, Err(Error::OutOfBounds { start: 0, end, len }) if end == 9 * n && len == 8 * n),
        "{r:?}"
    );
    untouched()?;

    // all_to_all_v: member 0 expects one element more from the last member than it sends
    let ones = vec![1usize; n];
    let displs: Vec<usize> = (0..n).collect();
    let mut rc = ones.clone();
    if me == 0 {
        rc[last] = 2;
    }
    let mut rd = displs.clone();
    if me == 0 && last > 0 {
        rd[last] = n; // room for the extra element
    }
    let v = AllToAllV {
        send_counts: &ones,
        send_displs: &displs,
        recv_counts: &rc,
        recv_displs: &rd,
    };
    let r = coll.all_to_all_v(w, &b, &a, &v);
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("all_to_all_v")),
        "{r:?}"
    );
    untouched()?;
    // wrong number of counts; overlapping receive ranges; displacement beyond the object
    let short = vec![1usize; n + 1];
    let r = coll.all_to_all_v(
        w,
        &b,
        &a,
        &AllToAllV {
            send_counts: &short,
            ..v
        },
    );
    assert!(
        matches!(r, Err(Error::LengthMismatch { what: "send_counts", got, expected }) if got == n + 1 && expected == n),
        "{r:?}"
    );
    if n > 1 {
        let zero = vec![0usize; n];
        let r = coll.all_to_all_v(
            w,
            &b,
            &a,
            &AllToAllV {
                recv_counts: &ones,
                recv_displs: &zero,
                ..v
            },
        );
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("receive ranges")),
            "{r:?}"
        );
    }
    let far = vec![8 * n; n];
    let r = coll.all_to_all_v(
        w,
        &b,
        &a,
        &AllToAllV {
            send_displs: &far,
            recv_counts: &ones,
            recv_displs: &displs,
            ..v
        },
    );
    assert!(
        matches!(r, Err(Error::OutOfBounds { start, end, len }) if start == 8 * n && end == 8 * n + 1 && len == 8 * n),
        "{r:?}"
    );
    untouched()?;

    // after all that, a correct call works
    coll.all_reduce(w, &b, &a, 8 * n, ReduceOp::Sum)?;
    let sum = (1..=n as i32).sum::<i32>();
    assert_eq!(pe.local_vec(&b)?, vec![sum; 8 * n]);
    pe.free(f)?;
    pe.free(b)?;
    pe.free(a)?;
    pe.free(coll)
}

mode_test!(coll_bad_inputs, [1, 2, 3, 4], bad_body);

fn scratch_body(pe: &Pe) -> Result<()> {
    let coll = Coll::new(pe, CollConfig::default())?;
    assert_eq!(coll.scratch_bytes(), 8 * (16 + 2 * pe.n_pes()));
    coll.barrier(pe.world_team())?;
    pe.free(coll)
}

mode_test!(coll_scratch_size, [1, 4], scratch_body);

// ----- edge cases -----

fn empty_views_body(pe: &Pe) -> Result<()> {
    let coll = Coll::new(pe, CollConfig::default())?;
    let (w, n) = (pe.world_team(), pe.n_pes());
    let x = pe.alloc::<i32>(8 * n)?;
    pe.local_fill(&x, 7)?;
    pe.barrier_all()?;
    // An empty view lying inside the other buffer overlaps nothing: count 0 moves nothing.
    let e = x.view::<i32>(4 * 4, 0)?;
    coll.all_reduce(w, &x, &e, 0, ReduceOp::Sum)?;
    coll.all_reduce(w, &e, &x, 0, ReduceOp::Sum)?;
    coll.broadcast(w, &e, &x, 0, 0)?;
    coll.all_gather(w, &x, &e, 0)?;
    coll.reduce_scatter(w, &e, &x, 0, ReduceOp::Max)?;
    coll.all_to_all(w, &e, &x, 0)?;
    assert_eq!(pe.local_vec(&x)?, vec![7; 8 * n]);
    pe.free(x)?;
    pe.free(coll)
}

mode_test!(coll_empty_views, [1, 3], empty_views_body);

/// In place through views that start 3 elements into the object (guard cells on both sides
/// stay poisoned): all_gather, reduce_scatter, all_reduce, and all_to_all_v whose send and
/// receive displacements run in reverse member order.
fn in_place_views_body(pe: &Pe) -> Result<()> {
    let (n, me) = (pe.n_pes(), pe.my_pe());
    let w = pe.world_team();
    let sum = |v: i64| n as i64 * v + (n * (n - 1) / 2) as i64;
    for cfg in [
        CollConfig::default(),
        CollConfig::default()
            .algo(Some(Algo::TwoShot))
            .chunk_bytes(8),
    ] {
        let c = Coll::new(pe, cfg)?;
        let x = pe.alloc::<i64>(8 + 4 * n * n)?;
        let guards = |len: usize| -> Result<()> {
            let got = pe.local_vec(&x)?;
            assert_eq!(got[..3], [-7; 3], "guard before the view");
            assert!(
                got[3 + len..].iter().all(|&a| a == -7),
                "guard after the view"
            );
            Ok(())
        };
        let v = x.view::<i64>(3 * 8, 5 * n)?;
        pe.local_fill(&x, -7)?;
        pe.local_write(&v, me * 5, &[(me as i64 + 1) * 10; 5])?;
        pe.barrier_all()?;
        c.all_gather(w, &v, &v, 5)?;
        let want: Vec<i64> = (0..5 * n).map(|i| (i / 5 + 1) as i64 * 10).collect();
        assert_eq!(pe.local_vec(&v)?, want, "all_gather");
        guards(5 * n)?;

        let input: Vec<i64> = (0..5 * n as i64).map(|i| i + me as i64).collect();
        pe.local_write(&v, 0, &input)?;
        pe.barrier_all()?;
        c.reduce_scatter(w, &v, &v, 5, ReduceOp::Sum)?;
        let got = pe.local_vec(&v)?;
        let want: Vec<i64> = (me * 5..me * 5 + 5).map(|i| sum(i as i64)).collect();
        assert_eq!(got[me * 5..me * 5 + 5], want[..], "reduce_scatter");
        guards(5 * n)?;

        pe.local_write(&v, 0, &input)?;
        pe.barrier_all()?;
        c.all_reduce(w, &v, &v, 5 * n, ReduceOp::Sum)?;
        let want: Vec<i64> = (0..5 * n as i64).map(sum).collect();
        assert_eq!(pe.local_vec(&v)?, want, "all_reduce");
        guards(5 * n)?;

        // member i sends i+1 elements to each member j from (n-1-j)·(n+1); they land at
        // len - (i+1)·(n+1) on the receiver
        let len = 4 * n * n;
        let y = x.view::<i64>(3 * 8, len)?;
        pe.local_fill(&x, -7)?;
        let send_counts = vec![me + 1; n];
        let send_displs: Vec<usize> = (0..n).map(|j| (n - 1 - j) * (n + 1)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|i| i + 1).collect();
        let recv_displs: Vec<usize> = (0..n).map(|i| len - (i + 1) * (n + 1)).collect();
        let src = |m: usize| -> Vec<i64> { (0..len as i64).map(|k| 1000 * m as i64 + k).collect() };
        pe.local_write(&y, 0, &src(me))?;
        pe.barrier_all()?;
        let a = AllToAllV {
            send_counts: &send_counts,
            send_displs: &send_displs,
            recv_counts: &recv_counts,
            recv_displs: &recv_displs,
        };
        c.all_to_all_v(w, &y, &y, &a)?;
        let mut want = src(me);
        let from = (n - 1 - me) * (n + 1);
        for i in 0..n {
            let at = recv_displs[i];
            want[at..at + i + 1].copy_from_slice(&src(i)[from..from + i + 1]);
        }
        assert_eq!(pe.local_vec(&y)?, want, "all_to_all_v");
        guards(len)?;
        pe.barrier_all()?;
        pe.free(x)?;
        pe.free(c)?;
    }
    Ok(())
}

mode_test!(coll_in_place_views, [1, 2, 3, 4], in_place_views_body);

/// A team of one, in place: the receive range overlaps the send range two elements further,
/// copied in one-element chunks.
fn a2av_alone_body(pe: &Pe) -> Result<()> {
    let coll = Coll::new(pe, CollConfig::default().chunk_bytes(4))?;
    let me = pe.team_split(pe.world_team(), Some(pe.my_pe() as u32), 0)?;
    let me = me.ok_or_else(|| Error::InvalidArgument("a team of one".into()))?;
    let x = pe.alloc::<i32>(8)?;
    let orig: Vec<i32> = (0..8).map(|i| 100 * pe.my_pe() as i32 + i).collect();
    pe.local_write(&x, 0, &orig)?;
    let v = AllToAllV {
        send_counts: &[5],
        send_displs: &[0],
        recv_counts: &[5],
        recv_displs: &[2],
    };
    coll.all_to_all_v(&me, &x, &x, &v)?;
    let mut want = orig.clone();
    want[2..7].copy_from_slice(&orig[0..5]);
    assert_eq!(pe.local_vec(&x)?, want);
    pe.free(x)?;
    pe.team_destroy(me)?;
    pe.free(coll)
}

mode_test!(coll_all_to_all_v_alone_in_place, [1, 2], a2av_alone_body);

fn joined<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    h.join()
        .map_err(|_| Error::InvalidArgument("collective thread panicked".into()))?
}

/// Two threads of every PE run all_reduce at the same time on two teams (the world and a
/// copy of it), each thread with its own `Coll`.
fn concurrent_teams_body(pe: &Pe) -> Result<()> {
    let w = pe.world_team();
    let copy = pe
        .team_split(w, Some(0), 0)?
        .ok_or_else(|| Error::InvalidArgument("every PE is in the copy".into()))?;
    let (c1, c2) = (
        Coll::new(pe, CollConfig::default())?,
        Coll::new(pe, CollConfig::default())?,
    );
    let (x, y) = (pe.alloc::<u64>(64)?, pe.alloc::<u64>(64)?);
    let (n, me) = (pe.n_pes() as u64, pe.my_pe() as u64);
    let run = |c: &Coll<'_>, t: &Team, s: &Sym<u64>, scale: u64| -> Result<()> {
        for i in 0..100u64 {
            pe.local_write(s, 0, &[scale * i + me; 64])?;
            c.all_reduce(t, s, s, 64, ReduceOp::Sum)?;
            assert_eq!(
                pe.local_vec(s)?,
                vec![n * scale * i + n * (n - 1) / 2; 64],
                "call {i}"
            );
            c.barrier(t)?; // nobody reads s any more: the next call may write it
        }
        Ok(())
    };
    // A Coll is not Sync: each thread takes its own and hands it back.
    let (c1, c2) = std::thread::scope(|sc| {
        let a = sc.spawn(|| run(&c1, w, &x, 1).map(|_| c1));
        let b = sc.spawn(|| run(&c2, &copy, &y, 3).map(|_| c2));
        Ok::<_, Error>((joined(a)?, joined(b)?))
    })?;
    pe.free(y)?;
    pe.free(x)?;
    pe.free(c2)?;
    pe.free(c1)?;
    pe.team_destroy(copy)
}

mode_test!(coll_concurrent_teams, [1, 3], concurrent_teams_body);
