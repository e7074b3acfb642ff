//! One harness that runs a test body on every mode: threads; processes and mixed by
//! re-executing this test binary (`--exact <test>`) through the launcher
//! ([`rshmem::launcher`]) with [`CHILD_VAR`] set, the child running the body through
//! [`rshmem::Launch::run`] as its PEs of the job.
//!
//! A body is `fn(&Pe) -> Result<()>` that checks its data itself (assert on exact expected
//! values, computed from seeded randomness every PE can reproduce).
//!
//! GPU bodies (CUDA configuration, `#[ignore]`d tests) go through [`gpu_run`] / [`gpu_modes`] /
//! `gpu_mode_test!`: the same re-execution, one mode per call, with done markers so a child
//! that never reached the body cannot pass, and [`gpu_world`] held in the parent.
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
    spawn_job(
        test,
        n,
        threads,
        env,
        grace,
        false,
        Duration::from_secs(120),
    )
}

/// As [`spawn_self`] for an `#[ignore]`d test (a GPU test): the children run it anyway.
pub fn spawn_self_ignored(
    test: &str,
    n: usize,
    threads: usize,
    env: &[(&str, &str)],
    grace: Duration,
) -> Outcome {
    spawn_job(test, n, threads, env, grace, true, Duration::from_secs(120))
}

/// As [`spawn_self_ignored`], the job stopped after `limit` (a short limit per test, so one
/// that hangs does not take a run's whole time on the GPU).
#[allow(dead_code)]
pub fn spawn_self_ignored_within(
    test: &str,
    n: usize,
    threads: usize,
    env: &[(&str, &str)],
    grace: Duration,
    limit: Duration,
) -> Outcome {
    spawn_job(test, n, threads, env, grace, true, limit)
}

/// As [`spawn_self`]; `ignored`: the test is `#[ignore]`d (the children run it anyway), and the
/// job is stopped after `limit`.
fn spawn_job(
    test: &str,
    n: usize,
    threads: usize,
    env: &[(&str, &str)],
    grace: Duration,
    ignored: bool,
    limit: Duration,
) -> Outcome {
    let exe = std::env::current_exe().expect("current_exe");
    let mut job = Job::new(n, exe);
    job.threads_per_proc = threads;
    let ignored = if ignored {
        &["--include-ignored"][..]
    } else {
        &[]
    };
    job.args = [
        "--exact",
        test,
        "--nocapture",
        "--test-threads",
        "1",
        "--quiet",
    ]
    .iter()
    .chain(ignored)
    .map(Into::into)
    .collect();
    job.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    job.timeout = Some(limit);
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
///
/// Each PE of the job that ran `body` to the end leaves a marker file: a child that never
/// reached the body (a test name not found, a call skipped) exits 0 too, and must not pass.
pub fn processes(test: &str, n: usize, threads: usize, body: fn(&Pe) -> Result<()>) {
    let _ = body;
    let call = CALLS.with(|c| c.get());
    let tag = format!("{call}:{n}:{threads}");
    let done = marker_dir(test, &tag);
    let done_s = done.to_string_lossy().into_owned();
    let out = spawn_self(
        test,
        n,
        threads,
        &[(CHILD_VAR, &tag), (DONE_VAR, &done_s)],
        Duration::from_secs(5),
    );
    let ran = std::fs::read_dir(&done).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&done);
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
    assert_eq!(
        ran,
        n,
        "{test}: only {ran} of {n} PEs as {} process(es) x {threads} thread(s) ran the body \
         to the end",
        n / threads
    );
}

/// The message of the panic a world resumed (`r`: `catch_unwind` around the world); fails the
/// test when the world returned instead.
pub fn resumed_panic<T: std::fmt::Debug>(r: std::thread::Result<T>) -> String {
    let payload = match r {
        Err(p) => p,
        Ok(v) => panic!("Launch::run returned {v:?} instead of resuming the panic"),
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default()
}

/// A fresh, empty folder for the done markers ([`DONE_VAR`]) of one job of `test`.
fn marker_dir(test: &str, tag: &str) -> std::path::PathBuf {
    let done = std::env::temp_dir().join(format!(
        "rshmem-harness-{}-{}-{}",
        std::process::id(),
        test.replace(':', "-"),
        tag.replace(':', "-")
    ));
    let _ = std::fs::remove_dir_all(&done);
    std::fs::create_dir_all(&done).expect("marker folder");
    done
}

/// In a launched child: runs `body` on this process's PEs of an `n`-PE world, checking each
/// runs in `want_mode` and leaving a marker per PE that finished ([`DONE_VAR`]); panics on any
/// error (the parent reports the job's failure).
fn run_child(
    test: &str,
    n: usize,
    want_mode: rshmem::Mode,
    config: Config,
    body: fn(&Pe) -> Result<()>,
) {
    let done = std::env::var_os(DONE_VAR).map(std::path::PathBuf::from);
    let run = |pe: &Pe| -> Result<()> {
        assert_eq!(pe.mode(), want_mode, "{test}: PE {} of {n}", pe.my_pe());
        // Printed here too: a PE whose finalize then fails (a peer's sticky GPU fault, a
        // finalize barrier timing out) makes the launch return that error instead.
        body(pe).inspect_err(|e| eprintln!("{test}: PE {} failed: {e}", pe.my_pe()))?;
        if let Some(d) = &done {
            std::fs::write(d.join(pe.my_pe().to_string()), b"").expect("done marker");
        }
        Ok(())
    };
    let r = rshmem::Launch::new()
        .config(config)
        .run(n, run)
        .values()
        .unwrap_or_else(|e| {
            panic!("{test} ({want_mode:?}, {n} PEs): this process's PEs could not start: {e}")
        });
    expect_all_ok(
        &format!("{test} ({want_mode:?}, {n} PEs): threads of this process"),
        r,
    );
}

/// The configuration tests use: a small heap, a short timeout.
pub fn config() -> Config {
    Config::default()
        .heap_size(8 << 20)
        .timeout(Duration::from_secs(30))
}

/// Panics (failing the test) if any PE's result is an error, listing every PE's error with
/// the likely causes first: a PE's own failure before the timeouts and lost peers it caused
/// in the others (which would otherwise hide it when PE 0 is reported first).
pub fn expect_all_ok<R>(what: &str, results: Vec<Result<R>>) {
    let mut errs: Vec<(bool, usize, rshmem::Error)> = results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| (i, e)))
        .map(|(i, e)| {
            let consequence = matches!(
                e,
                rshmem::Error::Timeout { .. } | rshmem::Error::PeerLost { .. }
            );
            (consequence, i, e)
        })
        .collect();
    if errs.is_empty() {
        return;
    }
    errs.sort_by_key(|(c, i, _)| (*c, *i));
    let list: Vec<String> = errs
        .iter()
        .map(|(_, i, e)| format!("  PE {i}: {e}"))
        .collect();
    panic!(
        "{what}: {} PE(s) failed (likely causes first):\n{}",
        errs.len(),
        list.join("\n")
    );
}

/// Runs `body` on `n` PEs in thread mode; panics (failing the test) on any error.
pub fn threads(n: usize, body: fn(&Pe) -> Result<()>) {
    let r = rshmem::Launch::new()
        .config(config())
        .threads()
        .run(n, body)
        .values()
        .expect("world");
    expect_all_ok(&format!("{n} PEs (threads)"), r);
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
        let Some(threads) = tag
            .strip_prefix(&format!("{call}:{n}:"))
            .and_then(|t| t.parse::<usize>().ok())
        else {
            return;
        };
        let want_mode = match (threads, n / threads) {
            (_, 1) => rshmem::Mode::Threads,
            (1, _) => rshmem::Mode::Processes,
            _ => rshmem::Mode::Mixed,
        };
        run_child(test, n, want_mode, config(), body);
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

// ---------- GPU bodies in every mode ----------

/// How [`gpu_run`] runs a body's PEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// `n` thread-PEs of one launched process (this test binary re-executed once, so each
    /// thread-mode world starts with a fresh CUDA context: PEs sharing a GPU share its context's
    /// hardware queues, and the streams a long test process accumulates came to share queues
    /// between PEs, stalling device waits until their timeout; see the CUDA backend's docs).
    Threads,
    /// One PE per process: this test binary re-executed `n` times through the launcher (TCP
    /// bootstrap, `RSHMEM_*` environment).
    Processes,
    /// `n / 2` launched processes of 2 thread-PEs each.
    Mixed,
}

impl GpuMode {
    /// The mode named by `gpu_mode_test!`'s test names: `threads`, `processes`, `mixed`.
    pub fn named(name: &str) -> GpuMode {
        match name {
            "threads" => GpuMode::Threads,
            "processes" => GpuMode::Processes,
            "mixed" => GpuMode::Mixed,
            _ => panic!("no GPU mode {name:?} (threads, processes, mixed)"),
        }
    }
    fn threads_per_proc(self) -> usize {
        match self {
            GpuMode::Mixed => 2,
            _ => 1,
        }
    }
}

/// Set in a child of [`gpu_run`]: a folder where each PE that ran the body to the end leaves a
/// file.
pub const DONE_VAR: &str = "RSHMEM_HARNESS_DONE";

/// How long a launched GPU job may run before the launcher stops it (a hang fails the test).
pub const GPU_JOB_LIMIT: Duration = Duration::from_secs(180);

/// Runs `body` on `n` PEs in `mode` with `config` (a CUDA configuration), holding
/// [`gpu_world`] in this process; panics (failing the test) on any error.
///
/// Every mode re-executes this test binary (`--exact test --include-ignored`) through the
/// launcher (thread mode as one process of `n` thread-PEs); the child re-runs the same test function, which reaches the same call
/// with the same `config` (so `config` must not depend on the process: build it from
/// constants and the inherited environment) and runs `body` on its PEs. One GPU is enough:
/// PEs beyond the GPU count share GPUs (round robin), and `RSHMEM_DEVICES` (inherited) still
/// maps PEs to GPUs. A child that cannot use a GPU fails with the backend's error; the parent
/// then reports which job failed (the children's output precedes it, prefixed `[pe k]`).
pub fn gpu_run(test: &str, mode: GpuMode, n: usize, config: Config, body: fn(&Pe) -> Result<()>) {
    let t = match mode {
        GpuMode::Threads => n.max(1),
        _ => mode.threads_per_proc(),
    };
    assert!(
        n >= 1 && n.is_multiple_of(t),
        "{test}: {n} PEs in {mode:?} mode"
    );
    let call = CALLS.with(|c| {
        let v = c.get() + 1;
        c.set(v);
        v
    });
    let tag = format!("gpu:{call}:{n}:{t}");
    if let Ok(want) = std::env::var(CHILD_VAR) {
        if want != tag {
            return;
        }
        let want_mode = match (mode, n / t) {
            (_, 1) => rshmem::Mode::Threads,
            (GpuMode::Mixed, _) => rshmem::Mode::Mixed,
            _ => rshmem::Mode::Processes,
        };
        run_child(test, n, want_mode, config, body);
        return;
    }
    let _gpu = gpu_world();
    // Each PE marks its success here: a child that never reached the body (a test name not
    // found, a call skipped) exits 0 too.
    let done = marker_dir(test, &tag);
    let done_s = done.to_string_lossy().into_owned();
    let out = spawn_job(
        test,
        n,
        t,
        &[(CHILD_VAR, &tag), (DONE_VAR, &done_s)],
        Duration::from_secs(10),
        true,
        GPU_JOB_LIMIT,
    );
    let ran = std::fs::read_dir(&done).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&done);
    assert!(
        !out.timed_out,
        "{test}: {n} PEs as {} process(es) x {t} thread(s) still ran after {GPU_JOB_LIMIT:?}: \
         stopped ({:?})",
        n / t,
        out.exits
    );
    assert_eq!(
        out.code,
        0,
        "{test}: {n} PEs as {} process(es) x {t} thread(s) failed (their output is above): {:?}",
        n / t,
        out.exits
    );
    assert_eq!(
        ran, n,
        "{test}: only {ran} of {n} PEs of the job ran the body to the end"
    );
    assert_eq!(
        out.leftover_segments, 0,
        "the library left segments of the job for the launcher to remove"
    );
}

/// The running test's name (libtest names each test's thread after it), for [`gpu_run`].
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .expect("a test thread has the test's name")
        .to_string()
}

/// Runs `body` on `n` thread-PEs of one fresh process ([`GpuMode::Threads`]) with `config`.
pub fn gpu_threads(n: usize, config: Config, body: fn(&Pe) -> Result<()>) {
    gpu_run(&test_name(), GpuMode::Threads, n, config, body);
}

/// `c` with its `n` PEs' GPUs cycled from `RSHMEM_DEVICES` (e.g. `0,0` puts two PEs on one
/// GPU) where it lists any; `c` as it is otherwise.
pub fn cycled_devices(c: Config, n: usize) -> Config {
    let devs: Vec<usize> = std::env::var("RSHMEM_DEVICES")
        .ok()
        .and_then(|v| v.split(',').map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    if devs.is_empty() {
        c
    } else {
        c.devices((0..n).map(|i| devs[i % devs.len()]).collect())
    }
}

/// Runs `body` on `n` PEs in every mode: threads, `n` processes, and `n / 2` processes × 2
/// threads when `n` is even (see [`gpu_run`]).
pub fn gpu_modes(test: &str, n: usize, config: impl Fn() -> Config, body: fn(&Pe) -> Result<()>) {
    gpu_run(test, GpuMode::Threads, n, config(), body);
    gpu_run(test, GpuMode::Processes, n, config(), body);
    if n.is_multiple_of(2) {
        gpu_run(test, GpuMode::Mixed, n, config(), body);
    }
}

/// `gpu_mode_test!(name, config, body, [processes(2), mixed(4)])`: a module `name` of GPU
/// tests (`#[ignore = "needs a GPU"]`), one per listed mode (`threads`, `processes`, `mixed`)
/// with its PE count, each running `body` with `config` (expressions evaluated inside the
/// module, which sees the enclosing module's items) through [`gpu_run`]. The tests are
/// `name::processes` etc., so a filter `name` also matches a thread-mode test `name` kept
/// beside the module.
#[macro_export]
macro_rules! gpu_mode_test {
    ($name:ident, $config:expr, $body:expr, [$($mode:ident($n:expr)),+ $(,)?]) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                #[ignore = "needs a GPU"]
                fn $mode() {
                    let path = concat!(module_path!(), "::", stringify!($mode));
                    let test = path.split_once("::").map_or(path, |(_, t)| t);
                    $crate::harness::gpu_run(
                        test,
                        $crate::harness::GpuMode::named(stringify!($mode)),
                        $n,
                        $config,
                        $body,
                    );
                }
            )+
        }
    };
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

/// Whether NVRTC compiled `what` into a cubin (checked non-empty). False where NVRTC is not
/// installed outside CI (the caller skips the rest of its check; CI sets `CI` and requires
/// NVRTC); any other error fails the test naming `what`.
pub fn nvrtc_compiled(what: &str, r: Result<Vec<u8>>) -> bool {
    match r {
        Ok(cubin) => {
            assert!(cubin.len() > 100, "{what}: empty cubin");
            true
        }
        Err(e) if std::env::var_os("CI").is_none() && format!("{e}").contains("was not found") => {
            eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
            false
        }
        Err(e) => panic!("{what}: {e}"),
    }
}
