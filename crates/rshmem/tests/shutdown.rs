//! Shutdown after a failure is bounded: once a barrier of a PE failed (a stuck peer), its
//! finalize waits a short grace, not a second full timeout.
//!
//! The bounds are far from both sides (grace 0.5 s, timeout 6 s, bound 3 s), so load on the
//! machine cannot decide the outcome.

use rshmem::{Config, Error, InProcBootstrap, Pe};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(6);

#[test]
fn finalize_after_a_failed_barrier_waits_a_short_grace() {
    let hub = InProcBootstrap::new(3, TIMEOUT).unwrap();
    let others_done = std::sync::Barrier::new(3);
    let cfg = Config::default().heap_size(1 << 20).timeout(TIMEOUT);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let (hub, cfg, others_done) = (hub.clone(), cfg.clone(), &others_done);
                s.spawn(move || {
                    let pe = Pe::init(cfg, Box::new(hub.join(rank).unwrap())).unwrap();
                    pe.barrier_all().unwrap();
                    if rank == 2 {
                        // Stuck until the others have finalized.
                        others_done.wait();
                        let _ = pe.finalize();
                        return;
                    }
                    let b = pe.barrier_all();
                    assert!(
                        matches!(b, Err(Error::Timeout { pe: Some(2), .. })),
                        "PE {rank}'s barrier: {b:?}"
                    );
                    let f = pe.finalize();
                    match f {
                        Err(Error::Timeout {
                            op: "finalize",
                            pe: Some(2),
                            after,
                        }) => assert!(
                            after < Duration::from_secs(3),
                            "PE {rank}'s finalize waited {after:?} (timeout {TIMEOUT:?})"
                        ),
                        other => panic!("PE {rank}'s finalize: {other:?}"),
                    }
                    others_done.wait();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}
