//! Thread mode only (these hand a value from one PE, or world, to another): handles of
//! another PE, handles of an ended world, configurations that differ between PEs, a huge
//! timeout, the completion queue's bound.

use super::*;

fn cfg() -> Config {
    harness::config().timeout(Duration::from_secs(20))
}

#[test]
fn handle_of_another_pe() {
    let syms: Mutex<Vec<Option<Sym<u64>>>> = Mutex::new(vec![None, None]);
    let teams: Mutex<Vec<Option<Team>>> = Mutex::new(vec![None, None]);
    all_ok(rshmem::Launch::new().config(cfg()).threads().run(2, |pe| -> Result<()> {
        let me = pe.my_pe();
        let x = pe.alloc::<u64>(2)?;
        let y = pe.alloc::<u64>(2)?;
        pe.local_fill(&x, 7)?;
        let t = pe
            .team_split_strided(pe.world_team(), 0, 1, 2)?
            .expect("team");
        // each PE hands its `y` and its team to the other
        syms.lock().unwrap()[me] = Some(y);
        teams.lock().unwrap()[me] = Some(t);
        pe.barrier_all()?;
        let theirs = syms.lock().unwrap()[1 - me].take().expect("sym");
        let their_team = teams.lock().unwrap()[1 - me].take().expect("team");
        let foreign =
            |e: &Error| matches!(e, Error::InvalidArgument(m) if m.contains("belongs to PE"));
        expect_err("put", pe.put(&theirs, 0, &[1], me), foreign);
        expect_err("get", pe.get(&theirs, 0, &mut [0], 1 - me), foreign);
        expect_err("atomic", pe.atomic_inc(&theirs, 0, me), foreign);
        expect_err("wait", pe.wait_until(&theirs, 0, Cmp::Eq, 0), foreign);
        let v = theirs.view::<u32>(0, 1)?;
        expect_err("view", pe.atomic_fetch(&v, 0, me), foreign);
        expect_err("local_vec", pe.local_vec(&theirs), foreign);
        expect_err("local_write", pe.local_write(&theirs, 0, &[1]), foreign);
        expect_err("local_fill", pe.local_fill(&theirs, 1), foreign);
        // collectives with the other PE's object or team: an error on both, nobody waits
        let coll = Coll::new(pe, CollConfig::default())?;
        let z = pe.alloc::<u64>(2)?;
        pe.local_fill(&z, 9)?;
        expect_err(
            "coll foreign object",
            coll.all_reduce(pe.world_team(), &z, &theirs, 2, ReduceOp::Sum),
            foreign,
        );
        let not_member_coll = |e: &Error| matches!(e, Error::Team(m) if m.contains("not a member"));
        expect_err("coll barrier", coll.barrier(&their_team), not_member_coll);
        expect_err(
            "coll foreign team",
            coll.all_reduce(&their_team, &z, &z, 2, ReduceOp::Sum),
            not_member_coll,
        );
        assert_eq!(pe.local_vec(&z)?, [9, 9], "a failed collective wrote");
        coll.all_reduce(pe.world_team(), &z, &z, 2, ReduceOp::Sum)?;
        assert_eq!(pe.local_vec(&z)?, [18, 18], "collectives work afterwards");
        pe.free(z)?;
        pe.free(coll)?;
        let not_member = |e: &Error| matches!(e, Error::Team(m) if m.contains("not a member"));
        expect_err("team barrier", pe.team_barrier(&their_team), not_member);
        expect_err("team sync", pe.team_sync(&their_team), not_member);
        expect_err("split", pe.team_split(&their_team, Some(0), 0), not_member);
        expect_err("destroy", pe.team_destroy(their_team), not_member);
        // the collective free: the PE passing a foreign handle gets its own error, the other
        // a mismatch; nobody waits for the other
        if me == 0 {
            expect_err("free foreign", pe.free(theirs), foreign);
        } else {
            expect_err("free vs foreign", pe.free(x), |e| {
                matches!(
                    e,
                    Error::CollectiveMismatch {
                        op: "free",
                        pe: 0,
                        ..
                    }
                )
            });
            let _ = theirs; // PE 0's object: a handle this PE cannot free
        }
        pe.barrier_all()?;
        Ok(())
    }).values());
}

#[test]
fn handles_of_an_ended_world() {
    // the first world hands out its objects and teams; the second uses them
    let old = all_ok(
        rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(2, |pe| -> Result<(Sym<u64>, Team)> {
                let x = pe.alloc::<u64>(4)?;
                let t = pe
                    .team_split_strided(pe.world_team(), 0, 1, 2)?
                    .expect("team");
                Ok((x, t))
            })
            .values(),
    );
    let old = Mutex::new(old.into_iter().map(Some).collect::<Vec<_>>());
    all_ok(
        rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(2, |pe| -> Result<()> {
                let me = pe.my_pe();
                let (x, t) = old.lock().unwrap()[me].take().expect("old handles");
                let y = pe.alloc::<u64>(4)?; // possibly the same offset as x
                pe.local_fill(&y, 3)?;
                pe.barrier_all()?;
                let ended = |e: &Error| matches!(e, Error::WorldEnded);
                expect_err("put", pe.put(&x, 0, &[1], 1 - me), ended);
                expect_err("get", pe.get(&x, 0, &mut [0], 1 - me), ended);
                expect_err("p", pe.p(&x, 0, 1, me), ended);
                expect_err("g", pe.g(&x, 0, me), ended);
                expect_err("atomic", pe.atomic_fetch_add(&x, 0, 1, 1 - me), ended);
                expect_err(
                    "signal",
                    pe.put_signal(&y, 0, &[1], Signal::set(&x, 0, 1), 1 - me),
                    ended,
                );
                expect_err("wait", pe.wait_until(&x, 0, Cmp::Eq, 0), ended);
                expect_err("view", pe.atomic_fetch(&x.view::<u64>(8, 1)?, 0, me), ended);
                expect_err("local_vec", pe.local_vec(&x), ended);
                expect_err("local_write", pe.local_write(&x, 0, &[1]), ended);
                expect_err("local_fill", pe.local_fill(&x, 1), ended);
                // collectives with the old world's object or team
                let coll = Coll::new(pe, CollConfig::default())?;
                expect_err(
                    "coll old object",
                    coll.all_reduce(pe.world_team(), &y, &x, 4, ReduceOp::Sum),
                    ended,
                );
                expect_err("coll old team", coll.barrier(&t), ended);
                expect_err(
                    "coll old team all_reduce",
                    coll.all_reduce(&t, &y, &y, 4, ReduceOp::Sum),
                    ended,
                );
                pe.free(coll)?;
                // an expert-parallel buffer for the old team: an error, and no symmetric memory kept
                let used = pe.heap_usage().1;
                let ep = EpConfig {
                    num_experts: 4,
                    max_tokens: 4,
                    hidden: 8,
                    max_topk: 2,
                    mode: EpMode::Normal,
                    layout: RecvLayout::ExpertMajor,
                };
                expect_err(
                    "ep buffer old team",
                    HostBuffer::<f32>::new(pe, &t, ep),
                    ended,
                );
                assert_eq!(
                    pe.heap_usage().1,
                    used,
                    "a failed ep::HostBuffer::new kept memory"
                );
                expect_err("team barrier", pe.team_barrier(&t), ended);
                expect_err("team split", pe.team_split_strided(&t, 0, 1, 1), ended);
                expect_err("team destroy", pe.team_destroy(t), ended);
                expect_err("free", pe.free(x), ended);
                pe.barrier_all()?;
                assert_eq!(
                    pe.local_vec(&y)?,
                    [3; 4],
                    "the new world's object is untouched"
                );
                pe.free(y)
            })
            .values(),
    );
}

#[test]
fn mismatched_configurations_fail_everywhere() {
    // threads the application owns, joining through a shared in-process bootstrap
    let hub = InProcBootstrap::new(3, Duration::from_secs(20)).unwrap();
    let results: Vec<Result<Pe>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let hub = hub.clone();
                s.spawn(move || {
                    let heap = if rank == 2 { 2 << 20 } else { 1 << 20 };
                    Pe::init(cfg().heap_size(heap), Box::new(hub.join(rank)?))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.into_iter().enumerate() {
        expect_err(
            &format!("rank {rank}"),
            r,
            |e| matches!(e, Error::Bootstrap { msg, .. } if msg.contains("heap size")),
        );
    }
    expect_err("join twice", hub.join(1).map(|_| ()), |e| {
        matches!(e, Error::Bootstrap { .. })
    });
    expect_err("join out of range", hub.join(3).map(|_| ()), |e| {
        matches!(
            e,
            Error::PeOutOfRange {
                pe: 3,
                n_pes: 3,
                ..
            }
        )
    });
    expect_err(
        "empty hub",
        InProcBootstrap::new(0, Duration::from_secs(1)).map(|_| ()),
        |e| matches!(e, Error::InvalidArgument(_)),
    );
}

#[test]
fn huge_timeout_does_not_panic() {
    // Duration::MAX: no deadline anywhere (the bootstrap once added it to an Instant and panicked)
    let r = rshmem::Launch::new()
        .config(cfg().timeout(Duration::MAX))
        .threads()
        .run(3, |pe| -> Result<u64> {
            let x = pe.alloc::<u64>(1)?;
            pe.local_fill(&x, 0)?;
            pe.barrier_all()?;
            pe.atomic_inc(&x, 0, 0)?;
            pe.barrier_all()?;
            let v = pe.g(&x, 0, 0)?;
            pe.barrier_all()?;
            pe.free(x)?;
            Ok(v)
        })
        .values();
    assert_eq!(all_ok(r), [3, 3, 3]);
}

/// A full completion queue refuses the next non-blocking operation before it starts (nothing
/// written); draining makes room; capacity 0 records nothing and never refuses.
#[test]
fn completion_queue_is_bounded() {
    let r = rshmem::Launch::new()
        .config(cfg().completion_queue(3))
        .threads()
        .run(2, |pe| -> Result<()> {
            let x = pe.alloc::<u32>(8)?;
            pe.local_fill(&x, 0)?;
            pe.barrier_all()?;
            let peer = 1 - pe.my_pe();
            let vals: Vec<u32> = (0..8).map(|i| 100 * pe.my_pe() as u32 + i + 1).collect();
            for i in 0..3 {
                pe.put_nbi(&x, i, &vals[i..i + 1], peer, i as u64)?.wait()?;
            }
            let full = pe.put_nbi(&x, 3, &vals[3..4], peer, 3);
            assert!(
                matches!(full, Err(Error::QueueFull { capacity: 3 })),
                "{full:?}"
            );
            let mut dst = [7u32; 1];
            let full = pe.get_nbi(&x, 0, &mut dst, peer, 9).map(|h| h.id());
            assert!(matches!(full, Err(Error::QueueFull { .. })), "{full:?}");
            assert_eq!(dst, [7], "a refused get wrote its destination");
            let mut done = Vec::new();
            assert_eq!(pe.completions(&mut done), 3);
            let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
            assert_eq!(tags, [0, 1, 2]);
            pe.put_nbi(&x, 4, &vals[4..5], peer, 4)?.wait()?;
            pe.barrier_all()?;
            let got = pe.local_vec(&x)?;
            let p = 100 * peer as u32;
            assert_eq!(
                got,
                [p + 1, p + 2, p + 3, 0, p + 5, 0, 0, 0],
                "PE {}",
                pe.my_pe()
            );
            Ok(())
        })
        .values();
    all_ok(r);
    let r = rshmem::Launch::new()
        .config(cfg().completion_queue(0))
        .threads()
        .run(1, |pe| -> Result<()> {
            let x = pe.alloc::<u32>(1)?;
            for i in 0..10 {
                pe.put_nbi(&x, 0, &[i], 0, 0)?.wait()?;
            }
            assert_eq!(pe.local_vec(&x)?, [9]);
            let mut done = Vec::new();
            assert_eq!(pe.completions(&mut done), 0);
            Ok(())
        })
        .values();
    all_ok(r);
}
