//! `rshmem::launch` returns every PE's outcome: when a peer dies, the PEs that finished keep
//! their values (the lost peer shows in their finalize), in process and mixed mode.

#[path = "harness/mod.rs"]
mod harness;

use rshmem::launcher::Exit;
use rshmem::{Error, Result};
use std::time::Duration;

const DONE_VAR: &str = "RSHMEM_TEST_OUTCOMES_DONE";

fn die() -> ! {
    // SAFETY: plain syscalls on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    std::process::abort()
}

#[test]
fn launch_keeps_the_values_of_survivors() {
    if !harness::is_child() {
        for (n, threads) in [(2, 1), (4, 2)] {
            let done = std::env::temp_dir().join(format!(
                "rshmem-outcomes-{}-{n}-{threads}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&done);
            std::fs::create_dir_all(&done).unwrap();
            let done_s = done.to_string_lossy().into_owned();
            let out = harness::spawn_self(
                "launch_keeps_the_values_of_survivors",
                n,
                threads,
                &[
                    (harness::CHILD_VAR, "fault"),
                    ("RSHMEM_TIMEOUT", "30"),
                    ("RSHMEM_HEAP_SIZE", "1M"),
                    (DONE_VAR, &done_s),
                ],
                Duration::from_secs(15),
            );
            let ran = std::fs::read_dir(&done).map_or(0, |d| d.count());
            let _ = std::fs::remove_dir_all(&done);
            let procs = n / threads;
            assert_eq!(out.exits[procs - 1], Exit::Signal(9), "{:?}", out.exits);
            for p in 0..procs - 1 {
                assert_eq!(
                    out.exits[p],
                    Exit::Code(0),
                    "survivor process {p}: {:?}",
                    out.exits
                );
            }
            assert_eq!(ran, n - threads, "survivor PEs that checked their outcomes");
        }
        return;
    }
    // The last process dies (its first PE kills it) after a healthy barrier.
    let out = rshmem::launch(2, |pe| -> (usize, Result<()>) {
        let me = pe.my_pe();
        let t = pe.placements().iter().filter(|p| p.process == 0).count();
        let victim = pe.n_pes() - t;
        if let Err(e) = pe.barrier_all() {
            return (me, Err(e));
        }
        if me >= victim {
            if me == victim {
                std::thread::sleep(Duration::from_millis(100));
                die();
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        (me * 10 + 7, pe.barrier_all())
    });
    let outcomes = out.into_result().expect("this process's PEs started");
    assert!(!outcomes.is_empty());
    let n = std::env::var("RSHMEM_WORLD_SIZE")
        .unwrap()
        .parse::<usize>()
        .unwrap();
    let t = outcomes.len();
    let lost_ok = |p: usize| p >= n - t;
    for o in &outcomes {
        let (v, r) = o.result.as_ref().expect("PE ran");
        assert_eq!(*v, o.pe * 10 + 7, "PE {}'s value", o.pe);
        assert!(
            matches!(r, Err(Error::PeerLost { pe, .. }) if lost_ok(*pe)),
            "PE {}: {r:?}",
            o.pe
        );
        assert!(
            matches!(&o.finalize, Err(Error::PeerLost { pe, .. }) if lost_ok(*pe)),
            "PE {}'s finalize: {:?}",
            o.pe,
            o.finalize
        );
        let done = std::env::var(DONE_VAR).unwrap();
        std::fs::write(std::path::Path::new(&done).join(o.pe.to_string()), b"").unwrap();
    }
}

#[test]
fn values_gives_the_values_or_the_first_error() {
    let cfg = harness::config();
    let v = rshmem::Launch::new()
        .config(cfg.clone())
        .threads()
        .run(3, |pe| pe.my_pe() * 2)
        .values()
        .unwrap();
    assert_eq!(v, vec![0, 2, 4]);
    let o = rshmem::Launch::new()
        .config(cfg.clone())
        .threads()
        .run(3, |pe| pe.my_pe())
        .into_result()
        .unwrap();
    let got: Vec<(usize, usize, bool)> = o
        .into_iter()
        .map(|o| (o.pe, o.result.unwrap(), o.finalize.is_ok()))
        .collect();
    assert_eq!(got, vec![(0, 0, true), (1, 1, true), (2, 2, true)]);
    let bad = rshmem::Launch::new()
        .config(cfg.heap_size(0))
        .threads()
        .run(2, |pe| pe.my_pe());
    assert!(
        matches!(bad.values(), Err(Error::InvalidArgument(_))),
        "a bad configuration starts no PE"
    );
}
