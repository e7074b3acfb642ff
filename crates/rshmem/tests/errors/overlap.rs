//! Two threads of one PE in calls that must not overlap: one gets `Error::Busy`, the other
//! completes, and the world stays in step.

use super::*;

/// A call PE 0's threads race with ([`overlapping_calls`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Alloc,
    Free,
    Split,
    SplitStrided,
    Destroy,
    BarrierAll,
    SyncAll,
    TeamBarrier,
    TeamSync,
}

impl Call {
    /// The name `Error::Busy` gives it.
    fn name(self) -> &'static str {
        match self {
            Call::Alloc => "alloc",
            Call::Free => "free",
            Call::Split => "team_split",
            Call::SplitStrided => "team_split_strided",
            Call::Destroy => "team_destroy",
            Call::BarrierAll => "barrier_all",
            Call::SyncAll => "sync_all",
            Call::TeamBarrier => "team_barrier",
            Call::TeamSync => "team_sync",
        }
    }
}

/// What a call made, for the collective clean-up.
#[derive(Debug)]
enum Made {
    Sym(Sym<u32>),
    Team(Option<Team>),
    Nothing,
}

/// The objects a race's calls work on: a team of every PE (not the world: another slot), and
/// an object and a team of every PE for `Free` and `Destroy` to consume.
struct RaceObjs {
    sub: Team,
    victim_sym: Mutex<Option<Sym<u32>>>,
    victim_team: Mutex<Option<Team>>,
}

fn take<T>(m: &Mutex<Option<T>>) -> Option<T> {
    m.lock().unwrap().take()
}

fn make_call(pe: &Pe, call: Call, o: &RaceObjs) -> Result<Made> {
    Ok(match call {
        Call::Alloc => Made::Sym(pe.alloc::<u32>(100)?),
        Call::Free => {
            pe.free(take(&o.victim_sym).expect("victim object"))?;
            Made::Nothing
        }
        Call::Split => Made::Team(pe.team_split(&o.sub, Some(7), -(pe.my_pe() as i64))?),
        Call::SplitStrided => Made::Team(pe.team_split_strided(pe.world_team(), 0, 1, 1)?),
        Call::Destroy => {
            pe.team_destroy(take(&o.victim_team).expect("victim team"))?;
            Made::Nothing
        }
        Call::BarrierAll => pe.barrier_all().map(|_| Made::Nothing)?,
        Call::SyncAll => pe.sync_all().map(|_| Made::Nothing)?,
        Call::TeamBarrier => pe.team_barrier(&o.sub).map(|_| Made::Nothing)?,
        Call::TeamSync => pe.team_sync(&o.sub).map(|_| Made::Nothing)?,
    })
}

/// Checks what a race's winner made (the same on every PE) and releases it collectively.
fn release_made(pe: &Pe, call: Call, made: Made) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    match (call, made) {
        (Call::Alloc, Made::Sym(x)) => {
            // the object is in step on every PE: each PE writes its block into the next one
            let data: Vec<u32> = rand_vec(me, 77, x.len());
            pe.put(&x, 0, &data, (me + 1) % n)?;
            pe.barrier_all()?;
            let want: Vec<u32> = rand_vec((me + n - 1) % n, 77, x.len());
            check_eq(
                "object allocated by the race's winner",
                &pe.local_vec(&x)?,
                &want,
            );
            pe.barrier_all()?;
            pe.free(x)
        }
        (Call::Split, Made::Team(Some(t))) => {
            // one team of every PE, ordered by descending world index
            assert_eq!(t.members(), (0..n).rev().collect::<Vec<_>>());
            pe.team_sync(&t)?;
            pe.team_destroy(t)
        }
        (Call::SplitStrided, Made::Team(t)) => {
            assert_eq!(
                t.as_ref().map(|t| t.members().to_vec()),
                (me == 0).then(|| vec![0])
            );
            match t {
                Some(t) => pe.team_destroy(t),
                None => Ok(()),
            }
        }
        (Call::Free | Call::Destroy | Call::BarrierAll | Call::SyncAll, Made::Nothing)
        | (Call::TeamBarrier | Call::TeamSync, Made::Nothing) => Ok(()),
        (call, made) => panic!("{call:?} made {made:?}"),
    }
}

/// Each PE writes a seeded block into the next PE's copy of a fresh object, and checks the one
/// it got: a matched alloc, data, a matched free.
fn still_usable(pe: &Pe, stream: u64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x = pe.alloc::<u64>(129)?;
    pe.local_fill(&x, poison())?;
    pe.barrier_all()?;
    pe.put(&x, 0, &rand_vec::<u64>(me, stream, 129), (me + 1) % n)?;
    pe.barrier_all()?;
    let want: Vec<u64> = rand_vec((me + n - 1) % n, stream, 129);
    check_eq("after the race", &pe.local_vec(&x)?, &want);
    pe.barrier_all()?;
    pe.free(x)
}

/// Two threads of PE 0 make calls `a` and `b` at once; the other PEs make one call. Calls that
/// must not overlap: exactly one thread gets `Error::Busy` naming the other's call — determined
/// without timing, since the other PEs join the winner's call only once the loser has its error
/// (PE 0's loser tells them, and which call won, through `flag[race]`), so the winner is still
/// inside its call when the loser enters. Calls that may overlap: both succeed, the other PEs
/// making `a` then `b`. Then the world is in step: what the winner made is checked and
/// released, and a fresh alloc/put/free works on every PE.
fn race(pe: &Pe, flag: &Sym<u64>, race: usize, a: Call, b: Call, conflict: bool) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let objs = RaceObjs {
        sub: pe.team_split_strided(w, 0, 1, n)?.expect("member"),
        victim_sym: Mutex::new(Some(pe.alloc::<u32>(5)?)),
        victim_team: Mutex::new(pe.team_split_strided(w, 0, 1, n)?),
    };
    let calls = [a, b];
    let (winner, made) = if me == 0 {
        let results: Vec<Result<Made>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|i| {
                    let objs = &objs;
                    s.spawn(move || {
                        let r = make_call(pe, calls[i], objs);
                        if let Err(Error::Busy { .. }) = r {
                            for p in 1..n {
                                pe.atomic_set(flag, race, 2 - i as u64, p)
                                    .expect("signalling the winner");
                            }
                        }
                        r
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let what = format!("race {race}: {a:?} against {b:?}");
        let mut results = results.into_iter();
        let (ra, rb) = (results.next().unwrap(), results.next().unwrap());
        if conflict {
            let (winner, made, lost) = match (ra, rb) {
                (Ok(m), Err(e)) => (0, m, e),
                (Err(e), Ok(m)) => (1, m, e),
                other => panic!("{what}: expected one success and one Busy, got {other:?}"),
            };
            let (loser, won) = (calls[1 - winner], calls[winner]);
            assert_eq!(
                lost,
                Error::Busy {
                    op: loser.name(),
                    running: won.name()
                },
                "{what}"
            );
            let msg = lost.to_string();
            assert!(
                msg.contains(loser.name()) && msg.contains(won.name()) && msg.contains("overlap"),
                "{what}: {msg}"
            );
            (Some(winner), vec![made])
        } else {
            let ma = ra.unwrap_or_else(|e| panic!("{what}: {a:?}: {e}"));
            let mb = rb.unwrap_or_else(|e| panic!("{what}: {b:?}: {e}"));
            (None, vec![ma, mb])
        }
    } else if conflict {
        let v = pe.wait_until(flag, race, Cmp::Ne, 0)?;
        let winner = v as usize - 1;
        (Some(winner), vec![make_call(pe, calls[winner], &objs)?])
    } else {
        (
            None,
            vec![make_call(pe, a, &objs)?, make_call(pe, b, &objs)?],
        )
    };
    let made_by: Vec<Call> = winner.map_or(calls.to_vec(), |i| vec![calls[i]]);
    for (call, m) in made_by.into_iter().zip(made) {
        release_made(pe, call, m)?;
    }
    // The loser consumed its handle on PE 0 only: the others drop theirs too (a leak on every
    // PE, still in step); an untouched victim is released collectively.
    let loser = winner.map(|i| calls[1 - i]);
    let sym = objs.victim_sym.into_inner().unwrap();
    let team = objs.victim_team.into_inner().unwrap();
    if loser != Some(Call::Free) {
        if let Some(x) = sym {
            pe.free(x)?;
        }
    }
    if loser != Some(Call::Destroy) {
        if let Some(t) = team {
            pe.team_destroy(t)?;
        }
    }
    pe.team_destroy(objs.sub)?;
    still_usable(pe, 1000 + race as u64)
}

/// Overlapping exchange-area operations (alloc, free, team split/destroy, even on different
/// teams) and barriers of one team, by two threads of one PE: the second is refused with
/// `Error::Busy` and never mixes with the first; barriers of different teams, and an exchange
/// beside another team's barrier, do overlap.
fn overlapping_calls(pe: &Pe) -> Result<()> {
    use Call::*;
    let races = [
        (Alloc, Alloc, true),
        (Alloc, Split, true),
        (Free, SplitStrided, true),
        (Destroy, Alloc, true),
        (Split, Free, true),
        (SyncAll, BarrierAll, true),
        (TeamSync, TeamBarrier, true),
        (Alloc, SyncAll, true),
        (TeamBarrier, Destroy, false),
        (TeamSync, SyncAll, false),
        (Alloc, TeamSync, false),
    ];
    let flag = pe.alloc::<u64>(races.len())?;
    pe.local_fill(&flag, 0)?;
    pe.barrier_all()?;
    for (i, &(a, b, conflict)) in races.iter().enumerate() {
        race(pe, &flag, i, a, b, conflict)?;
    }
    pe.barrier_all()?;
    pe.free(flag)
}
mode_test!(overlapping_calls_are_refused, [2, 4], overlapping_calls);
