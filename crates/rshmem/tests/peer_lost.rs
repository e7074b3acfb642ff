//! Lost peers in thread mode: a PE that panics, or drops its handle without finalize, makes the
//! others' barriers, waits and collectives end in `Error::PeerLost` (not a timeout, not a hang),
//! and `Launch::run` resumes the panic after every PE has ended.
//!
//! The configured timeout is long (20 s), so a detection that fell back to the timeout would
//! show as `Error::Timeout` and fail the test; nothing here measures time.

mod harness;

use rshmem::{Cmp, Config, Error, InProcBootstrap, Pe, Result, Sym};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

fn cfg() -> Config {
    Config::default()
        .heap_size(1 << 20)
        .timeout(Duration::from_secs(20))
}

type Op = fn(&Pe, &Sym<u64>) -> Result<()>;

/// Runs `op` on every PE but `victim`, which panics instead; returns what `op` returned on each
/// survivor and checks that `Launch::run` resumed the victim's panic.
fn with_panicking_pe(n: usize, victim: usize, op: Op) -> Vec<Option<Result<()>>> {
    let seen: Mutex<Vec<Option<Result<()>>>> = Mutex::new(vec![None; n]);
    // Survivors that have left the first barrier: the victim dies only after all have (a PE
    // still inside that barrier when the victim is lost would end it with PeerLost too).
    let left = std::sync::atomic::AtomicUsize::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| {
        rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(n, |pe| {
                // a healthy start: one collective and a barrier with everyone
                let x = pe.alloc::<u64>(4).expect("alloc");
                pe.local_fill(&x, 0).expect("fill");
                pe.barrier_all().expect("first barrier");
                if pe.my_pe() == victim {
                    let t0 = std::time::Instant::now();
                    while left.load(std::sync::atomic::Ordering::Acquire) < n - 1
                        && t0.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::yield_now();
                    }
                    panic!("PE {victim} gives up on purpose");
                }
                left.fetch_add(1, std::sync::atomic::Ordering::Release);
                let r = op(pe, &x);
                seen.lock().unwrap()[pe.my_pe()] = Some(r);
            })
            .values()
    }));
    let msg = harness::resumed_panic(r);
    assert!(
        msg.contains("gives up on purpose"),
        "resumed panic: {msg:?}"
    );
    seen.into_inner().unwrap()
}

/// Every survivor got `PeerLost`; with `direct`, naming the victim (with more PEs a survivor
/// may be waiting for another survivor that gave up first, and names that one).
fn check_survivors(what: &str, seen: &[Option<Result<()>>], victim: usize, direct: bool) {
    for (p, r) in seen.iter().enumerate() {
        if p == victim {
            assert!(r.is_none(), "{what}: the victim ran the op");
            continue;
        }
        match r {
            Some(Err(Error::PeerLost { pe, .. })) if !direct || *pe == victim => {}
            other => panic!("{what}: PE {p} got {other:?}, expected PeerLost of PE {victim}"),
        }
    }
}

const CASES: &[(usize, usize)] = &[(2, 1), (2, 0), (3, 1), (3, 0), (8, 5)];

#[test]
fn panicking_pe_fails_barriers() {
    for &(n, victim) in CASES {
        let seen = with_panicking_pe(n, victim, |pe, _| pe.barrier_all());
        check_survivors("barrier_all", &seen, victim, n <= 3);
        let seen = with_panicking_pe(n, victim, |pe, _| pe.sync_all());
        check_survivors("sync_all", &seen, victim, n <= 3);
    }
}

#[test]
fn panicking_pe_fails_collectives() {
    for &(n, victim) in CASES {
        let seen = with_panicking_pe(n, victim, |pe, _| pe.alloc::<u32>(8).map(drop));
        check_survivors("alloc", &seen, victim, n <= 3);
        let seen = with_panicking_pe(n, victim, |pe, _| {
            pe.team_split_strided(pe.world_team(), 0, 1, pe.n_pes())
                .map(drop)
        });
        check_survivors("team split", &seen, victim, n <= 3);
    }
}

#[test]
fn panicking_pe_fails_waits() {
    // every survivor waits for a flag nobody sets: the lost PE is noticed, not the timeout
    for &(n, victim) in CASES {
        let seen = with_panicking_pe(n, victim, |pe, x| pe.wait_until(x, 1, Cmp::Ne, 0).map(drop));
        check_survivors("wait_until", &seen, victim, true);
    }
}

/// Threads the application owns: PE `victim` drops its handle without finalize.
#[test]
fn dropped_pe_without_finalize() {
    let n = 3;
    let victim = 2;
    let hub = InProcBootstrap::new(n, Duration::from_secs(20)).unwrap();
    type Outcome = (Result<()>, Result<u64>, Result<()>); // barrier, wait, finalize
    let results: Vec<Option<Outcome>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let hub = hub.clone();
                s.spawn(move || {
                    let pe =
                        Pe::init(cfg(), Box::new(hub.join(rank).expect("join"))).expect("init");
                    let x = pe.alloc::<u64>(1).expect("alloc");
                    pe.local_fill(&x, 0).expect("fill");
                    pe.barrier_all().expect("barrier");
                    if rank == victim {
                        let _ = x;
                        drop(pe); // ends without finalize
                        return None;
                    }
                    let b = pe.barrier_all();
                    let w = pe.wait_until(&x, 0, Cmp::Eq, 1);
                    let f = pe.finalize();
                    Some((b, w, f))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.into_iter().enumerate() {
        if rank == victim {
            assert!(r.is_none());
            continue;
        }
        let (b, w, f) = r.expect("survivor");
        let lost = |e: &Error| matches!(e, Error::PeerLost { pe, .. } if *pe == victim);
        assert!(b.as_ref().is_err_and(lost), "PE {rank} barrier: {b:?}");
        assert!(w.as_ref().is_err_and(lost), "PE {rank} wait_until: {w:?}");
        assert!(f.as_ref().is_err_and(lost), "PE {rank} finalize: {f:?}");
    }
}

/// A PE that finalizes early is gone for barriers (PeerLost) but not for waits on one's own
/// memory, which other PEs could still satisfy: those end in the timeout.
#[test]
fn finalized_pe_leaves_barriers() {
    let hub = InProcBootstrap::new(2, Duration::from_secs(20)).unwrap();
    let r: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let hub = hub.clone();
                s.spawn(move || -> Result<()> {
                    let pe = Pe::init(cfg(), Box::new(hub.join(rank)?))?;
                    let x = pe.alloc::<u64>(1)?;
                    pe.local_fill(&x, 0)?;
                    // Finalize is a collective of its own kind: against PE 0's sync_all it is a
                    // mismatch on both, and PE 1 has ended all the same.
                    let mm = |e: &Error, mine: &str, theirs: &str| {
                        matches!(e, Error::CollectiveMismatch { mine: m, theirs: t, .. }
                            if m.starts_with(mine) && t.starts_with(theirs))
                    };
                    if rank == 1 {
                        let r = pe.finalize();
                        assert!(
                            r.as_ref().is_err_and(|e| mm(e, "finalize", "sync_all")),
                            "{r:?}"
                        );
                        return Ok(());
                    }
                    let r = pe.sync_all();
                    assert!(
                        r.as_ref().is_err_and(|e| mm(e, "sync_all", "finalize")),
                        "{r:?}"
                    );
                    match pe.barrier_all() {
                        Err(Error::PeerLost { pe: 1, .. }) => {}
                        other => panic!("barrier with a finalized peer: {other:?}"),
                    }
                    match pe.wait_until_timeout(&x, 0, Cmp::Eq, 1, Duration::from_millis(20)) {
                        Err(Error::Timeout {
                            op: "wait_until",
                            pe: None,
                            ..
                        }) => {}
                        other => panic!("wait with a finalized peer: {other:?}"),
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for x in r {
        x.unwrap();
    }
}
