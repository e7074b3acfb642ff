//! One harness that runs a test body on every mode: threads; processes and mixed by
//! re-executing this test binary (`--exact <test>`) through the launcher
//! ([`rshmem::launcher`]) with [`CHILD_VAR`] set, the child running the body through
//! [`rshmem::launch_with`] as its PEs of the job.
//!
//! A body is `fn(&Pe) -> Result<()>` that checks its data itself (assert on exact expected
//! values, computed from seeded randomness every PE can reproduce).
#![allow(dead_code)]

use rshmem::launcher::{self, Job, Outcome};
use rshmem::{Config, Pe, Result};
use std::cell::Cell;
use std::time::Duration;

/// Set in a child process of the harness: `<call index>:<n>` of the `all_modes` call to run.
pub const CHILD_VAR: &str = "RSHMEM_HARNESS_CHILD";

thread_local! {
    static CALLS: Cell<usize> = const { Cell::new(0) };
}

/// True in a process started by the harness or by [`spawn_self`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// Runs this test binary's test `test` as a job of `n` PEs (`threads` per process) through the
/// launcher, with `env` added; checks that no segment of the job is left in /dev/shm.
pub fn spawn_self(
    test: &str,
    n: usize,
    threads: usize,
    env: &[(&str, &str)],
    grace: Duration,
) -> Outcome {
    let exe = std::env::current_exe().expect("current_exe");
    let mut job = Job::new(n, exe);
    job.threads_per_proc = threads;
    job.args = [
        "--exact",
        test,
        "--nocapture",
        "--test-threads",
        "1",
        "--quiet",
    ]
    .iter()
    .map(Into::into)
    .collect();
    job.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    job.timeout = Some(Duration::from_secs(120));
    job.prefix = true;
    job.grace = grace;
    let out = launcher::run(&job).expect("launcher");
    let prefix = format!("rshmem-{:016x}-", out.job);
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "segments left after the job: {left:?}");
    out
}

/// Runs `body` on `n` PEs as `n / threads` processes of `threads` thread-PEs each.
pub fn processes(test: &str, n: usize, threads: usize, body: fn(&Pe) -> Result<()>) {
    let _ = body;
    let call = CALLS.with(|c| c.get());
    let tag = format!("{call}:{n}");
    let out = spawn_self(
        test,
        n,
        threads,
        &[(CHILD_VAR, &tag)],
        Duration::from_secs(5),
    );
    assert_eq!(
        out.code,
        0,
        "{test} on {n} PEs as {} process(es) x {threads} thread(s) failed: {:?}",
        n / threads,
        out.exits
    );
    assert_eq!(
        out.leftover_segments, 0,
        "the library left segments of the job for the launcher to remove"
    );
}

/// The configuration tests use: a small heap, a short timeout.
pub fn config() -> Config {
    Config::default()
        .heap_size(8 << 20)
        .timeout(Duration::from_secs(30))
}

/// Runs `body` on `n` PEs in thread mode; panics (failing the test) on any error.
pub fn threads(n: usize, body: fn(&Pe) -> Result<()>) {
    let r = rshmem::threads_with(config(), n, body).expect("world");
    for (pe, x) in r.into_iter().enumerate() {
        if let Err(e) = x {
            panic!("PE {pe} of {n}: {e}");
        }
    }
}

/// Runs `body` on `n` PEs in every mode: threads; `n` processes; `n / 2` processes × 2
/// threads when `n` is even. In a child process it runs only the call it was started for.
pub fn all_modes(test: &str, n: usize, body: fn(&Pe) -> Result<()>) {
    let call = CALLS.with(|c| {
        let v = c.get() + 1;
        c.set(v);
        v
    });
    if let Ok(tag) = std::env::var(CHILD_VAR) {
        if tag != format!("{call}:{n}") {
            return;
        }
        let r = rshmem::launch_with(config(), n, body).expect("world");
        for (t, x) in r.into_iter().enumerate() {
            if let Err(e) = x {
                panic!("{test}: thread {t} of this process (of {n} PEs): {e}");
            }
        }
        return;
    }
    threads(n, body);
    if cfg!(miri) {
        return; // Miri runs no processes
    }
    processes(test, n, 1, body);
    if n >= 2 && n.is_multiple_of(2) {
        processes(test, n, 2, body);
    }
}

/// `mode_test!(name, [n1, n2], body)`: a test running `body` for each PE count on every mode.
#[macro_export]
macro_rules! mode_test {
    ($name:ident, [$($n:expr),+], $body:expr) => {
        #[test]
        fn $name() {
            let path = concat!(module_path!(), "::", stringify!($name));
            let test = path.split_once("::").map_or(path, |(_, t)| t);
            for n in [$($n),+] {
                $crate::harness::all_modes(test, n, $body);
            }
        }
    };
}

/// Deterministic pseudo-random values for PE `pe`, stream `stream`.
pub fn rand_vec<T: rshmem::Elem>(pe: usize, stream: u64, len: usize) -> Vec<T> {
    let mut x =
        0x9e37_79b9_7f4a_7c15u64 ^ ((pe as u64) << 32) ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64(((x >> 11) % 200_000) as f64 / 8.0 - 10_000.0)
        })
        .collect()
}

/// Serialises GPU worlds within one test process: hold the guard while a GPU world runs.
///
/// PEs of every world of a process share the GPU's CUDA context, whose streams share a fixed
/// number of hardware queues (see the CUDA backend's module docs): worlds running in parallel
/// (`cargo test`'s default) multiply the live streams, and a kernel of one world waiting for
/// its peer can then hold back another stream's work on its queue until the device timeout.
pub fn gpu_world() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}
