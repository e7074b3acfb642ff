//! Faults: PEs killed with SIGKILL during a barrier, a wait and a blocking get; a silent peer;
//! bootstrap failures; torchrun and Open MPI variables set by hand; the launcher's exit codes
//! and signals. Each multi-process test re-executes this binary (`--exact <test>`) through the
//! launcher; the child part checks what its PE saw and exits 0 only when it was right.

#[path = "harness/mod.rs"]
mod harness;

use rshmem::bootstrap::{TcpConfig, TCP_PROTOCOL_VERSION};
use rshmem::launcher::{self, Exit, Job, Signaller};
use rshmem::*;
use std::time::{Duration, Instant};

/// Timeout of the silent-peer job (RSHMEM_TIMEOUT), seconds.
const T: f64 = 2.0;
const FAULT_ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "fault"),
    ("RSHMEM_TIMEOUT", "2"),
    ("RSHMEM_HEAP_SIZE", "1M"),
];
/// Timeout of the kill jobs, seconds: long, so that a loss noticed only through the timeout
/// shows as `Error::Timeout` (failing the test), and a loss reported no sooner than the timeout
/// would take more than [`NOT_THE_TIMEOUT`] — a bound far from both the detection latency
/// (milliseconds) and the timeout, so a loaded machine cannot make the test fail.
const KILL_T: f64 = 30.0;
const NOT_THE_TIMEOUT: Duration = Duration::from_secs(15);
const KILL_ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "fault"),
    ("RSHMEM_TIMEOUT", "30"),
    ("RSHMEM_HEAP_SIZE", "1M"),
];

fn die() -> ! {
    // SAFETY: plain syscalls on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    std::process::abort()
}

/// Runs `test` as `n` processes (`threads` each); `victim_proc` must die by SIGKILL and every
/// other process must exit 0 (it verified its own error); the launcher reports failure.
fn expect_one_killed(test: &str, n: usize, threads: usize, victim_proc: usize) {
    let out = harness::spawn_self(test, n, threads, KILL_ENV, Duration::from_secs(15));
    assert_ne!(out.code, 0, "the launcher must exit non-zero");
    assert_eq!(
        out.code,
        128 + 9,
        "first failure is the kill: {:?}",
        out.exits
    );
    for (p, e) in out.exits.iter().enumerate() {
        if p == victim_proc {
            assert_eq!(*e, Exit::Signal(9), "process {p}");
        } else {
            assert_eq!(
                *e,
                Exit::Code(0),
                "survivor process {p} did not see the loss in time"
            );
        }
    }
}

/// A survivor's check: the error is `PeerLost` naming the victim, not found by waiting for
/// the (long) timeout.
fn assert_lost(r: Result<impl std::fmt::Debug>, t0: Instant, victim: usize, op: &str) {
    let el = t0.elapsed();
    match r {
        Err(Error::PeerLost { pe, .. }) => assert_eq!(pe, victim, "{op}: wrong PE lost"),
        other => panic!("{op}: expected PeerLost of PE {victim}, got {other:?} after {el:?}"),
    }
    assert!(
        el < NOT_THE_TIMEOUT,
        "{op}: loss noticed after {el:?} (timeout {KILL_T} s)"
    );
    println!("survivor saw the loss of PE {victim} in {op} after {el:?}");
}

#[test]
fn kill_during_barrier() {
    if !harness::is_child() {
        return expect_one_killed("kill_during_barrier", 4, 1, 1);
    }
    let pe = rshmem::init().unwrap();
    pe.barrier_all().unwrap();
    if pe.my_pe() == 1 {
        std::thread::sleep(Duration::from_millis(200));
        die();
    }
    let t0 = Instant::now();
    assert_lost(pe.barrier_all(), t0, 1, "barrier_all");
    // Later collective calls fail too (never hang); by now the other survivors may have
    // ended as well, so any lost PE may be named.
    let t0 = Instant::now();
    let r = pe.alloc::<u64>(4);
    assert!(
        matches!(r, Err(Error::PeerLost { pe: p, .. }) if p != pe.my_pe()),
        "alloc: {r:?}"
    );
    assert!(t0.elapsed() < NOT_THE_TIMEOUT, "{:?}", t0.elapsed());
    assert!(matches!(pe.quiet(), Err(Error::PeerLost { .. })), "quiet");
}

#[test]
fn kill_during_barrier_mixed() {
    if !harness::is_child() {
        return expect_one_killed("kill_during_barrier_mixed", 4, 2, 1);
    }
    // 2 processes × 2 threads; process 1 (PEs 2 and 3) dies.
    let r = rshmem::launch(4, |pe| {
        pe.barrier_all().unwrap();
        if pe.placement(pe.my_pe()).unwrap().process == 1 {
            if pe.my_pe() == 2 {
                std::thread::sleep(Duration::from_millis(200));
                die();
            }
            std::thread::sleep(Duration::from_secs(30));
        }
        let t0 = Instant::now();
        let r = pe.barrier_all();
        let el = t0.elapsed();
        match r {
            Err(Error::PeerLost { pe: lost, .. }) => assert!(lost == 2 || lost == 3, "{lost}"),
            other => panic!("expected PeerLost of PE 2 or 3, got {other:?}"),
        }
        assert!(el < NOT_THE_TIMEOUT, "{el:?}");
    })
    .values();
    assert!(
        matches!(r, Err(Error::PeerLost { .. })),
        "finalize fails too: {r:?}"
    );
}

#[test]
fn kill_during_wait_until() {
    if !harness::is_child() {
        return expect_one_killed("kill_during_wait_until", 3, 1, 2);
    }
    let pe = rshmem::init().unwrap();
    let flag = pe.alloc::<u64>(1).unwrap();
    pe.local_fill(&flag, 0).unwrap();
    pe.barrier_all().unwrap();
    if pe.my_pe() == 2 {
        std::thread::sleep(Duration::from_millis(200));
        die(); // never sets the flags it was supposed to set
    }
    let t0 = Instant::now();
    assert_lost(pe.wait_until(&flag, 0, Cmp::Eq, 1u64), t0, 2, "wait_until");
}

#[test]
fn kill_during_blocking_get() {
    if !harness::is_child() {
        return expect_one_killed("kill_during_blocking_get", 3, 1, 0);
    }
    let pe = rshmem::init().unwrap();
    let x = pe.alloc::<u32>(256).unwrap();
    pe.local_fill(&x, pe.my_pe() as u32 + 5).unwrap();
    pe.barrier_all().unwrap();
    if pe.my_pe() == 0 {
        std::thread::sleep(Duration::from_millis(200));
        die();
    }
    let t0 = Instant::now();
    let mut buf = vec![0u32; 256];
    let mut gets = 0u64;
    let r = loop {
        match pe.get(&x, 0, &mut buf, 0) {
            Ok(()) => {
                assert_eq!(buf, vec![5u32; 256], "data read before the loss");
                gets += 1;
            }
            Err(e) => break Err::<(), _>(e),
        }
        assert!(
            t0.elapsed() < NOT_THE_TIMEOUT,
            "blocking get kept succeeding after the peer died ({gets} gets)"
        );
    };
    assert!(gets > 0);
    assert_lost(r, t0, 0, "get");
    let t0 = Instant::now();
    assert_lost(pe.put(&x, 0, &buf, 0), t0, 0, "put");
}

#[test]
fn silent_peer_times_out() {
    if !harness::is_child() {
        let out = harness::spawn_self(
            "silent_peer_times_out",
            2,
            1,
            FAULT_ENV,
            Duration::from_secs(15),
        );
        assert_eq!(out.code, 0, "{:?}", out.exits);
        return;
    }
    let pe = rshmem::init().unwrap();
    if pe.my_pe() == 1 {
        // alive but silent for longer than the timeout, then gone without finalize
        std::thread::sleep(Duration::from_secs_f64(T + 1.5));
        return;
    }
    let t0 = Instant::now();
    let r = pe.barrier_all();
    let el = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Timeout { op: "barrier_all", pe: Some(1), after }) if after >= Duration::from_secs_f64(T)),
        "alive but silent: {r:?}"
    );
    // Not before the timeout (exact: the clock is monotonic), and not much after it: twice the
    // timeout is far beyond any polling delay, and catches a wait that restarts its deadline.
    assert!(
        el >= Duration::from_secs_f64(T) && el < Duration::from_secs_f64(2.0 * T),
        "{el:?}"
    );
}

// ----- bootstrap -----

fn tcp(id: &str, rank: usize, size: usize, ms: u64) -> TcpConfig {
    TcpConfig::new(id, rank, size, Duration::from_millis(ms))
}

/// Starts one rank per config (in this order, 150 ms apart); returns their results.
fn bootstrap_all(cfgs: Vec<TcpConfig>) -> Vec<Result<()>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .map(|c| {
                let h = s.spawn(move || {
                    let b = TcpBootstrap::with_config(c)?;
                    b.barrier()
                });
                std::thread::sleep(Duration::from_millis(150));
                h
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_boot_err(r: &Result<()>, pe: Option<usize>, words: &str) {
    match r {
        Err(Error::Bootstrap { pe: p, msg }) => {
            assert_eq!(*p, pe, "{msg}");
            assert!(msg.contains(words), "message {msg:?} lacks {words:?}");
        }
        other => panic!("expected a bootstrap error about {words}, got {other:?}"),
    }
}

#[test]
fn bootstrap_wrong_world_size() {
    let id = unique_id().unwrap();
    // Rank 1 connects after rank 0 has already failed: it gets the error too, at once.
    let t0 = Instant::now();
    let r = bootstrap_all(vec![
        tcp(&id, 0, 3, 5000),
        tcp(&id, 2, 4, 5000),
        tcp(&id, 1, 3, 5000),
    ]);
    for x in &r {
        assert_boot_err(x, Some(2), "world size mismatch");
    }
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
}

#[test]
fn bootstrap_peer_never_comes() {
    let id = unique_id().unwrap();
    let t0 = Instant::now();
    let r = bootstrap_all(vec![tcp(&id, 0, 3, 600), tcp(&id, 1, 3, 600)]);
    for x in &r {
        assert_boot_err(x, Some(2), "never connected");
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn bootstrap_version_mismatch_and_duplicate_rank() {
    let id = unique_id().unwrap();
    let mut old = tcp(&id, 1, 2, 5000);
    old.protocol_version = TCP_PROTOCOL_VERSION + 1;
    for x in &bootstrap_all(vec![tcp(&id, 0, 2, 5000), old]) {
        assert_boot_err(x, Some(1), "protocol version");
    }
    let id = unique_id().unwrap();
    let r = bootstrap_all(vec![
        tcp(&id, 0, 3, 5000),
        tcp(&id, 1, 3, 5000),
        tcp(&id, 1, 3, 5000),
    ]);
    for x in &r {
        assert_boot_err(x, Some(1), "duplicate rank");
    }
}

#[test]
fn bootstrap_address_in_use() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let r = TcpBootstrap::with_config(tcp(&addr, 0, 2, 500));
    assert_boot_err(&r.map(|_| ()), Some(0), "already in use");
}

#[test]
fn bootstrap_errors_reach_every_pe_of_a_world() {
    // A world over TCP whose ranks disagree on the heap size: every PE fails, naming PE 1.
    let id = unique_id().unwrap();
    let r: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let id = id.clone();
                s.spawn(move || {
                    let b = TcpBootstrap::connect(&id, rank, 2, Duration::from_secs(5))?;
                    let c = harness::config().heap_size((1 + rank) << 20);
                    Pe::init(c, Box::new(b)).map(|_| ())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for x in &r {
        assert_boot_err(x, Some(1), "heap size differs");
    }
}

// ----- other launchers' variables -----

fn spawn_plain(test: &str, env: &[(String, String)]) -> std::process::Child {
    spawn_wrapped(&[], test, env)
}

/// As [`spawn_plain`], run through `wrapper` (a command that runs its arguments).
fn spawn_wrapped(wrapper: &[&str], test: &str, env: &[(String, String)]) -> std::process::Child {
    let exe = std::env::current_exe().unwrap();
    let mut c = match wrapper.split_first() {
        None => std::process::Command::new(&exe),
        Some((w, rest)) => {
            let mut c = std::process::Command::new(w);
            c.args(rest).arg(&exe);
            c
        }
    };
    c.args([
        "--exact",
        test,
        "--nocapture",
        "--test-threads",
        "1",
        "--quiet",
    ]);
    for (k, _) in std::env::vars() {
        if k.starts_with("RSHMEM_")
            || k.starts_with("OMPI_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            ]
            .contains(&k.as_str())
        {
            c.env_remove(k);
        }
    }
    c.env(harness::CHILD_VAR, "plain")
        .env("RSHMEM_TIMEOUT", "10")
        .env("RSHMEM_HEAP_SIZE", "1M")
        .envs(env.iter().cloned());
    c.spawn().unwrap()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The child side of the hand-set launcher variable tests: a 3-PE ring put.
fn ring_child() {
    let pe = rshmem::init().unwrap();
    assert_eq!(pe.n_pes(), 3);
    assert_eq!(pe.mode(), Mode::Processes);
    let me = pe.my_pe();
    let x = pe.alloc::<u64>(3).unwrap();
    pe.local_fill(&x, 0).unwrap();
    pe.barrier_all().unwrap();
    pe.put(&x, 0, &[me as u64 * 10 + 1, 2, 3], (me + 1) % 3)
        .unwrap();
    pe.barrier_all().unwrap();
    let prev = ((me + 2) % 3) as u64;
    assert_eq!(pe.local_vec(&x).unwrap(), vec![prev * 10 + 1, 2, 3]);
    pe.finalize().unwrap();
}

/// Starts 3 ranks with `envs(rank)` (and a job id, to find their segments), checks that every
/// rank succeeded and that no segment of the job is left.
fn run_plain(test: &str, envs: impl Fn(usize) -> Vec<(String, String)>) {
    let job = format!(
        "{:016x}",
        std::process::id() as u64 * 7919 + 0xabc0_0000_0000_0001
    );
    let mut kids: Vec<_> = (0..3)
        .map(|r| {
            let mut e = envs(r);
            e.push(("RSHMEM_JOB".into(), job.clone()));
            spawn_plain(test, &e)
        })
        .collect();
    let ok: Vec<bool> = kids
        .iter_mut()
        .map(|k| k.wait().unwrap().success())
        .collect();
    let left = rshmem::segment::remove_job_segments(u64::from_str_radix(&job, 16).unwrap());
    assert_eq!(ok, vec![true; 3], "ranks that succeeded");
    assert_eq!(left, 0, "segments left in /dev/shm");
}

/// Processes of a job in different PID namespaces (containers sharing /dev/shm and the
/// network, each with its own PIDs): a peer's pid means nothing here, or is even this
/// process's own pid (both pid 1). Once, the first made the monitor declare the peer dead at
/// once (PeerLost in the next barrier), the second made both PEs "the same process" (thread
/// mode, and start-up failed). Needs `unshare` (root or user namespaces): skipped without.
#[test]
fn processes_in_other_pid_namespaces() {
    if harness::is_child() {
        let pe = rshmem::init().unwrap();
        assert_eq!(pe.mode(), Mode::Processes);
        let me = pe.my_pe();
        assert!(!pe.is_same_process(1 - me).unwrap());
        let x = pe.alloc::<u64>(1).unwrap();
        pe.local_fill(&x, 0).unwrap();
        pe.barrier_all().unwrap();
        // The monitor looks at the peers every 10 ms: give it many looks.
        std::thread::sleep(Duration::from_millis(300));
        pe.p(&x, 0, me as u64 + 1, 1 - me).unwrap();
        pe.barrier_all().unwrap();
        assert_eq!(pe.g(&x, 0, me).unwrap(), (1 - me) as u64 + 1);
        pe.finalize().unwrap();
        return;
    }
    let unshare = ["unshare", "--pid", "--fork", "--mount-proc"];
    let usable = std::process::Command::new(unshare[0])
        .args(&unshare[1..])
        .arg("true")
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !usable {
        println!("skipped: unshare --pid is not available here");
        return;
    }
    // Rank 1 alone in a new namespace, then both (each is pid 1 in its own).
    for wrapped in [[false, true], [true, true]] {
        let port = free_port();
        let job = format!(
            "{:016x}",
            std::process::id() as u64 * 7907 + 0xabd0_0000_0000_0001
        );
        let mut kids: Vec<_> = (0..2)
            .map(|r| {
                let env = vec![
                    ("RSHMEM_RANK".to_string(), r.to_string()),
                    ("RSHMEM_WORLD_SIZE".into(), "2".into()),
                    ("RSHMEM_BOOTSTRAP".into(), format!("127.0.0.1:{port}")),
                    ("RSHMEM_JOB".into(), job.clone()),
                ];
                let w: &[&str] = if wrapped[r] { &unshare } else { &[] };
                spawn_wrapped(w, "processes_in_other_pid_namespaces", &env)
            })
            .collect();
        let ok: Vec<bool> = kids
            .iter_mut()
            .map(|k| k.wait().unwrap().success())
            .collect();
        rshmem::segment::remove_job_segments(u64::from_str_radix(&job, 16).unwrap());
        assert_eq!(
            ok,
            vec![true; 2],
            "ranks that succeeded ({wrapped:?} in new namespaces)"
        );
    }
}

#[test]
fn torchrun_variables_by_hand() {
    if harness::is_child() {
        return ring_child();
    }
    let port = free_port();
    run_plain("torchrun_variables_by_hand", |r| {
        vec![
            ("RANK".into(), r.to_string()),
            ("WORLD_SIZE".into(), "3".into()),
            ("LOCAL_RANK".into(), r.to_string()),
            ("MASTER_ADDR".into(), "127.0.0.1".into()),
            // rshmem listens on MASTER_PORT + 1 (torch's store has MASTER_PORT)
            ("MASTER_PORT".into(), (port - 1).to_string()),
        ]
    });
}

#[test]
fn openmpi_variables_by_hand() {
    if harness::is_child() {
        return ring_child();
    }
    let port = free_port();
    run_plain("openmpi_variables_by_hand", |r| {
        vec![
            ("OMPI_COMM_WORLD_RANK".into(), r.to_string()),
            ("OMPI_COMM_WORLD_SIZE".into(), "3".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK".into(), r.to_string()),
            ("RSHMEM_BOOTSTRAP".into(), format!("127.0.0.1:{port}")),
        ]
    });
}

// ----- launcher -----

#[test]
fn launcher_forwards_exit_code() {
    if harness::is_child() {
        let monitors = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "rshmem-monitor")
                })
                .count()
        };
        // the monitor names itself when it starts and ends some time after finalize: poll
        // (a fixed sleep made the test depend on the machine's load)
        let settle = |want: usize| {
            let t0 = Instant::now();
            while monitors() != want && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            monitors()
        };
        let pe = rshmem::init().unwrap();
        assert_eq!(settle(1), 1, "one peer monitor while the world lives");
        let me = pe.my_pe();
        pe.finalize().unwrap();
        assert_eq!(settle(0), 0, "the monitor ends with the world");
        if me == 1 {
            std::process::exit(3);
        }
        return;
    }
    let out = harness::spawn_self(
        "launcher_forwards_exit_code",
        3,
        1,
        FAULT_ENV,
        Duration::from_secs(10),
    );
    assert_eq!(out.code, 3);
    assert_eq!(out.exits, vec![Exit::Code(0), Exit::Code(3), Exit::Code(0)]);
    assert_eq!(out.leftover_segments, 0);
}

#[test]
fn launcher_forwards_signals() {
    let mut job = Job::new(2, "sh");
    job.args = vec!["-c".into(), "exec sleep 30".into()];
    let sig = Signaller::new();
    let t0 = Instant::now();
    let out = std::thread::scope(|s| {
        let h = s.spawn(|| launcher::run_with(&job, &sig));
        std::thread::sleep(Duration::from_millis(300));
        sig.signal(libc::SIGTERM);
        h.join().unwrap().unwrap()
    });
    assert_eq!(out.exits, vec![Exit::Signal(libc::SIGTERM); 2]);
    assert_eq!(out.code, 128 + libc::SIGTERM);
    assert_eq!(out.signal, Some(libc::SIGTERM));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn launcher_time_limit_and_bad_split() {
    let mut job = Job::new(2, "sleep");
    job.args = vec!["30".into()];
    job.timeout = Some(Duration::from_millis(300));
    job.grace = Duration::from_millis(200);
    let out = launcher::run(&job).unwrap();
    assert!(out.timed_out);
    assert_eq!(out.code, 124);
    job.threads_per_proc = 3;
    assert!(matches!(
        launcher::run(&job),
        Err(Error::InvalidArgument(_))
    ));
    let missing = Job::new(1, "/nonexistent/rshmem-test-program");
    let r = launcher::run(&missing);
    assert!(
        matches!(&r, Err(Error::Os { op: "spawn", msg }) if msg.contains("/nonexistent/rshmem-test-program")),
        "{r:?}"
    );
    for (n, t) in [(0, 1), (2, 0)] {
        let mut bad = Job::new(n, "true");
        bad.threads_per_proc = t;
        let r = launcher::run(&bad);
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(&format!("{n} PEs"))),
            "{n} PEs, {t} threads: {r:?}"
        );
    }
}

#[test]
fn init_without_launcher_is_one_pe() {
    if harness::is_child() || rshmem::launched() {
        return;
    }
    let pe = rshmem::Launch::new()
        .config(harness::config())
        .init()
        .unwrap();
    assert_eq!((pe.my_pe(), pe.n_pes(), pe.mode()), (0, 1, Mode::Threads));
    let x = pe.alloc::<i32>(3).unwrap();
    pe.put(&x, 0, &[1, -2, 3], 0).unwrap();
    assert_eq!(pe.local_vec(&x).unwrap(), vec![1, -2, 3]);
    pe.finalize().unwrap();
}

#[test]
fn sigterm_during_init_window_unlinks_segments() {
    use rshmem::segment::{segment_name, Region};
    use std::os::unix::process::ExitStatusExt;
    if harness::is_child() {
        let job = u64::from_str_radix(&std::env::var("RSHMEM_TEST_JOB").unwrap(), 16).unwrap();
        let current = || {
            // SAFETY: queries the current action only.
            unsafe {
                let mut a: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut a);
                a.sa_sigaction
            }
        };
        let before = current();
        let a = Region::create_shm(&segment_name(job, 0), 4096).unwrap();
        assert_ne!(current(), before, "handler installed while a name exists");
        a.unlink();
        assert_eq!(
            current(),
            before,
            "previous action restored after the unlink"
        );
        let _b = Region::create_shm(&segment_name(job, 1), 4096).unwrap();
        // SAFETY: signals this process.
        unsafe { libc::raise(libc::SIGTERM) };
        std::thread::sleep(Duration::from_secs(5));
        unreachable!("SIGTERM did not end the process");
    }
    let job = 0x5157_0000_0000_0000u64 | std::process::id() as u64;
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.env("RSHMEM_TEST_JOB", format!("{job:x}"))
        .args([
            "--exact",
            "sigterm_during_init_window_unlinks_segments",
            "--nocapture",
            "--test-threads",
            "1",
            "--quiet",
        ])
        .env(harness::CHILD_VAR, "signal");
    let st = c.status().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    let left = rshmem::segment::remove_job_segments(job);
    assert_eq!(left, 0, "segment left after SIGTERM");
}

/// A process that ignores SIGINT (started in the background by a shell, or under nohup) keeps
/// ignoring it during the start-up window: the segment handler once replaced SIG_IGN, so a
/// SIGINT meant for nobody unlinked this PE's segment name before its peers had mapped it
/// (their start-up failed) and then re-raised into SIG_IGN: the process went on.
#[test]
fn ignored_sigint_stays_ignored_in_init_window() {
    use rshmem::segment::{segment_name, Region};
    if harness::is_child() {
        let job = u64::from_str_radix(&std::env::var("RSHMEM_TEST_JOB").unwrap(), 16).unwrap();
        let current = |sig| {
            // SAFETY: queries the current action only.
            unsafe {
                let mut a: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut a);
                a.sa_sigaction
            }
        };
        // SAFETY: sets this process's SIGINT action to ignore.
        unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        let name = segment_name(job, 0);
        let a = Region::create_shm(&name, 4096).unwrap();
        assert_eq!(current(libc::SIGINT), libc::SIG_IGN, "SIGINT still ignored");
        assert_ne!(
            current(libc::SIGTERM),
            libc::SIG_DFL,
            "SIGTERM still handled"
        );
        // SAFETY: signals this process (ignored).
        unsafe { libc::raise(libc::SIGINT) };
        assert!(
            Region::open_shm(&name, 4096).is_ok(),
            "the name must survive an ignored SIGINT"
        );
        drop(a);
        return;
    }
    let job = 0x5158_0000_0000_0000u64 | std::process::id() as u64;
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .env("RSHMEM_TEST_JOB", format!("{job:x}"))
        .args([
            "--exact",
            "ignored_sigint_stays_ignored_in_init_window",
            "--nocapture",
            "--test-threads",
            "1",
            "--quiet",
        ])
        .env(harness::CHILD_VAR, "signal")
        .status()
        .unwrap();
    let left = rshmem::segment::remove_job_segments(job);
    assert!(st.success(), "{st:?}");
    assert_eq!(left, 0, "segment left");
}

#[test]
fn bootstrap_failures_across_processes() {
    if harness::is_child() {
        // Every process must fail with a bootstrap error whose message says what went wrong.
        let want = std::env::var("EXPECT").unwrap();
        let t0 = Instant::now();
        match rshmem::init() {
            Err(Error::Bootstrap { msg, .. }) => assert!(msg.contains(&want), "{msg}"),
            other => panic!("expected a bootstrap error ({want}), got {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        return;
    }
    let test = "bootstrap_failures_across_processes";
    let run = |sizes: &[usize], expect: &str| {
        let port = free_port();
        let mut kids: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(r, size)| {
                let k = spawn_plain(
                    test,
                    &[
                        ("RSHMEM_RANK".into(), r.to_string()),
                        ("RSHMEM_WORLD_SIZE".into(), size.to_string()),
                        ("RSHMEM_BOOTSTRAP".into(), format!("127.0.0.1:{port}")),
                        ("RSHMEM_TIMEOUT".into(), "1".into()),
                        ("EXPECT".into(), expect.into()),
                    ],
                );
                std::thread::sleep(Duration::from_millis(100));
                k
            })
            .collect();
        for (r, k) in kids.iter_mut().enumerate() {
            assert!(k.wait().unwrap().success(), "{expect}: rank {r}");
        }
    };
    run(&[3, 3, 4], "world size mismatch");
    run(&[3, 3], "never connected");
}

#[test]
fn bad_launcher_environment() {
    if harness::is_child() {
        // init must refuse the environment before any bootstrap, naming what is wrong
        let want = std::env::var("EXPECT").unwrap();
        match rshmem::init() {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(&want), "{msg}"),
            other => panic!("expected an invalid-argument error ({want}), got {other:?}"),
        }
        return;
    }
    let s = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let cases = [
        (
            s(&[("RSHMEM_RANK", "3"), ("RSHMEM_WORLD_SIZE", "3")]),
            "process 3 is out of range",
        ),
        (
            s(&[("RSHMEM_RANK", "0")]),
            "RSHMEM_RANK is set but RSHMEM_WORLD_SIZE is not",
        ),
        (
            s(&[("RSHMEM_RANK", "-1"), ("RSHMEM_WORLD_SIZE", "2")]),
            "RSHMEM_RANK=\"-1\"",
        ),
        (
            s(&[
                ("RSHMEM_RANK", "1"),
                ("RSHMEM_WORLD_SIZE", "4"),
                ("RSHMEM_THREADS", "2"),
            ]),
            "multiples of RSHMEM_THREADS=2",
        ),
        (
            s(&[("RSHMEM_THREADS", "0")]),
            "RSHMEM_THREADS must be at least 1",
        ),
        (s(&[("RSHMEM_JOB", "not-hex")]), "RSHMEM_JOB"),
        (
            s(&[("RANK", "2"), ("WORLD_SIZE", "2")]),
            "torchrun environment: process 2",
        ),
        (s(&[("OMPI_COMM_WORLD_RANK", "0")]), "OMPI_COMM_WORLD_SIZE"),
    ];
    let test = "bad_launcher_environment";
    for (mut env, expect) in cases {
        env.push(("EXPECT".into(), expect.into()));
        let st = spawn_plain(test, &env).wait().unwrap();
        assert!(st.success(), "{env:?}: {st:?}");
    }
}

#[test]
fn bad_pes_count_is_refused() {
    if harness::is_child() {
        // launch without a launcher environment takes its PE count from RSHMEM_PES
        let want = std::env::var("EXPECT").unwrap();
        match rshmem::launch(2, |pe| pe.my_pe()).values() {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(&want), "{msg}"),
            other => panic!("expected an invalid-argument error ({want}), got {other:?}"),
        }
        return;
    }
    for (v, expect) in [
        ("0", "RSHMEM_PES=\"0\""),
        ("x", "RSHMEM_PES=\"x\""),
        ("-2", "at least 1"),
    ] {
        let env = vec![
            ("RSHMEM_PES".to_string(), v.to_string()),
            ("EXPECT".to_string(), expect.to_string()),
        ];
        let st = spawn_plain("bad_pes_count_is_refused", &env)
            .wait()
            .unwrap();
        assert!(st.success(), "RSHMEM_PES={v}: {st:?}");
    }
}

#[test]
fn bootstrap_bad_rank_or_size() {
    let id = unique_id().unwrap();
    for (rank, size) in [(3, 3), (0, 0), (usize::MAX, 2)] {
        let r = TcpBootstrap::with_config(tcp(&id, rank, size, 500)).map(|_| ());
        assert_boot_err(&r, Some(rank), "out of range");
    }
    let mut c = tcp(&id, 0, 2, 500);
    c.pes_per_rank = 0;
    let r = TcpBootstrap::with_config(c).map(|_| ());
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("pes_per_rank")),
        "{r:?}"
    );
}
