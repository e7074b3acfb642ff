//! Errors name the PE at fault: a barrier's `Timeout` names the PE whose arrival is missing
//! (not the live member this PE happened to wait on), and a `PeerLost` names the PE that died,
//! never a survivor that ended after noticing the death.

use rshmem::{Cmp, Config, Error, InProcBootstrap, Pe, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn cfg(timeout: Duration) -> Config {
    Config::default().heap_size(1 << 20).timeout(timeout)
}

/// PE 3 of 4 stays out of a barrier (alive, asleep): every other PE's timeout names PE 3. In a
/// dissemination barrier PE 2 waits on PE 0 in its second round, and PE 0 (stuck on PE 3)
/// never signals it, so naming the member waited on would blame a live PE.
#[test]
fn timeout_names_the_missing_pe() {
    for n in [4, 5, 8] {
        let sleeper = n - 1;
        let done = std::sync::Barrier::new(n);
        let out = rshmem::Launch::new()
            .config(cfg(Duration::from_millis(400)))
            .threads()
            .run(n, |pe| -> Result<()> {
                pe.barrier_all()?;
                let r = if pe.my_pe() == sleeper {
                    Ok(())
                } else {
                    pe.barrier_all()
                };
                // The sleeper wakes only once every other PE has its error.
                done.wait();
                r
            })
            .into_result()
            .expect("world");
        for o in out {
            let r = o.result.expect("PE started");
            if o.pe == sleeper {
                assert!(r.is_ok(), "{r:?}");
                continue;
            }
            assert!(
                matches!(r, Err(Error::Timeout { op: "barrier_all", pe: Some(p), .. }) if p == sleeper),
                "{n} PEs, PE {}: expected a timeout naming PE {sleeper}, got {r:?}",
                o.pe
            );
        }
    }
}

/// PE 2 dies; PE 3 sees it (PeerLost naming 2) and finalizes. PEs 0 and 1, whose barrier rounds
/// wait on PE 3, must still name PE 2.
#[test]
fn peer_lost_names_the_dead_pe_not_a_survivor() {
    for _ in 0..5 {
        let hub = InProcBootstrap::new(4, Duration::from_secs(20)).unwrap();
        let started = std::sync::Barrier::new(4);
        let finalized = AtomicBool::new(false);
        let r: Vec<Option<Result<()>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|rank| {
                    let (hub, started, finalized) = (hub.clone(), &started, &finalized);
                    s.spawn(move || -> Option<Result<()>> {
                        let pe =
                            Pe::init(cfg(Duration::from_secs(20)), Box::new(hub.join(rank).ok()?))
                                .ok()?;
                        let sig = pe.alloc::<u64>(1).ok()?;
                        pe.local_fill(&sig, 0).ok()?;
                        pe.barrier_all().ok()?;
                        match rank {
                            2 => {
                                started.wait();
                                drop(pe); // dies without finalize
                                None
                            }
                            3 => {
                                started.wait();
                                // A signal PE 2 never sends.
                                let w = pe.wait_until(&sig, 0, Cmp::Ge, 1);
                                assert!(
                                    matches!(w, Err(Error::PeerLost { pe: 2, .. })),
                                    "PE 3's wait: {w:?}"
                                );
                                let f = pe.finalize();
                                finalized.store(true, Ordering::Release);
                                Some(f)
                            }
                            _ => {
                                started.wait();
                                while !finalized.load(Ordering::Acquire) {
                                    std::thread::yield_now();
                                }
                                let b = pe.barrier_all();
                                let _ = pe.finalize();
                                Some(b)
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        for (rank, r) in r.into_iter().enumerate() {
            match rank {
                2 => assert!(r.is_none()),
                3 => assert!(
                    matches!(r, Some(Err(Error::PeerLost { pe: 2, .. }))),
                    "PE 3's finalize: {r:?}"
                ),
                _ => assert!(
                    matches!(r, Some(Err(Error::PeerLost { pe: 2, .. }))),
                    "PE {rank}'s barrier must name the dead PE 2: {r:?}"
                ),
            }
        }
    }
}

/// PE 3 stays out of a barrier; PEs 0 and 1 time out in it and finalize. PE 2 enters the same
/// barrier only then, and waits on PE 0, which has ended: its error must be a timeout naming
/// PE 3 (missing, not dead), not a lost PE 0.
#[test]
fn a_peer_that_gave_up_passes_on_whom_it_waited_for() {
    let hub = InProcBootstrap::new(4, Duration::from_secs(20)).unwrap();
    let gave_up = std::sync::Barrier::new(3);
    let done = std::sync::Barrier::new(4);
    let r: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|rank| {
                let (hub, gave_up, done) = (hub.clone(), &gave_up, &done);
                s.spawn(move || -> Result<()> {
                    let pe = Pe::init(cfg(Duration::from_millis(500)), Box::new(hub.join(rank)?))?;
                    pe.barrier_all()?;
                    let r = match rank {
                        3 => Ok(()),
                        2 => {
                            gave_up.wait();
                            pe.barrier_all()
                        }
                        _ => {
                            let b = pe.barrier_all();
                            let _ = pe.finalize();
                            gave_up.wait();
                            done.wait();
                            return b;
                        }
                    };
                    done.wait();
                    let _ = pe.finalize();
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    // PEs 0 and 1 found both 2 and 3 missing.
    for (rank, r) in r.iter().enumerate().take(2) {
        assert!(
            matches!(
                r,
                Err(Error::Timeout {
                    pe: Some(2 | 3),
                    ..
                })
            ),
            "PE {rank}: {r:?}"
        );
    }
    assert!(
        matches!(r[2], Err(Error::Timeout { pe: Some(3), .. })),
        "PE 2: {:?}",
        r[2]
    );
}
