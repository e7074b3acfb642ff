//! The job launcher behind `rshmem run` (and the test harness): starts the processes of a job
//! with the environment of [`bootstrap::env`](crate::bootstrap::env), forwards their output,
//! stops the others (after a grace period) when one fails, forwards SIGINT/SIGTERM, enforces a
//! time limit, and removes the job's shared-memory segments afterwards.
//!
//! The launcher picks the job id (`RSHMEM_JOB`) and rank 0's bootstrap address
//! (`RSHMEM_BOOTSTRAP`, a free port on 127.0.0.1); segments are named after the job id, so
//! whatever the processes did, `/dev/shm/rshmem-<job>-*` is gone when [`run`] returns.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`Job::grace`] unless set.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);

/// What to launch.
#[derive(Debug, Clone)]
pub struct Job {
    /// Number of PEs.
    pub n_pes: usize,
    /// Thread-PEs per process (mixed mode when > 1); must divide `n_pes`.
    pub threads_per_proc: usize,
    /// Program and its arguments.
    pub program: OsString,
    /// Arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables for every process.
    pub env: Vec<(OsString, OsString)>,
    /// Stop everything after this long (exit status 124).
    pub timeout: Option<Duration>,
    /// Prefix every output line with `[pe k]` (`[pe a-b]` for a mixed-mode process).
    pub prefix: bool,
    /// How long the others may still run after one process failed, before SIGTERM (then SIGKILL
    /// after the same grace again). Survivors see a lost peer within milliseconds and a
    /// finalize after a failure waits at most half a second, so a short grace suffices.
    pub grace: Duration,
    /// Install SIGINT/SIGTERM handlers in this process and forward those signals to the job
    /// (the previous actions are put back when [`run`] returns; one such job at a time).
    pub forward_signals: bool,
}

impl Job {
    /// `n_pes` processes of `program` with default settings (no prefix, 1 s grace, no limit).
    pub fn new(n_pes: usize, program: impl Into<OsString>) -> Job {
        Job {
            n_pes,
            threads_per_proc: 1,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: None,
            prefix: false,
            grace: DEFAULT_GRACE,
            forward_signals: false,
        }
    }
}

/// How one process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Exit {
    fn from_status(s: ExitStatus) -> Exit {
        match (s.code(), s.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) => Exit::Signal(sig),
            _ => Exit::Code(1),
        }
    }
    /// The shell convention: the code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal(s) => write!(f, "was killed by {}", signal_name(s)),
        }
    }
}

/// `SIGKILL` for 9, and so on; `signal N` for a signal without a name here.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// What happened to a job.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The launcher's exit status: the first non-zero status of a process (in time), 124 on
    /// timeout, else 0.
    pub code: i32,
    /// How each process ended, by process index.
    pub exits: Vec<Exit>,
    /// The job id (segments are `/dev/shm/rshmem-<job as 16 hex digits>-*`).
    pub job: u64,
    /// How many segments of the job were still in /dev/shm after the processes ended (and were
    /// removed by the launcher); 0 when the processes cleaned up after themselves.
    pub leftover_segments: usize,
    /// True when the time limit stopped the job.
    pub timed_out: bool,
    /// The signal forwarded to the job, if any.
    pub signal: Option<i32>,
    /// The process that failed first, if one did before the launcher stopped any (of the
    /// processes whose failure the launcher saw in the same poll, one killed by a signal, as a
    /// crash is the cause and its peers' error exits the consequence; then the lowest index).
    pub first_failure: Option<usize>,
    /// Per process: true when the launcher had already signalled it (grace over, time limit,
    /// forwarded signal) when it ended.
    pub stopped: Vec<bool>,
    /// PEs per process.
    pub threads_per_proc: usize,
}

impl Outcome {
    fn pes(&self, p: usize) -> String {
        let t = self.threads_per_proc;
        if t == 1 {
            format!("PE {p}")
        } else {
            format!("process {p} (PEs {}-{})", p * t, p * t + t - 1)
        }
    }

    /// One line saying which PE failed first and how, and which others ended abnormally; `None`
    /// when every process exited with status 0.
    pub fn report(&self) -> Option<String> {
        let bad = |p: usize| self.exits[p] != Exit::Code(0);
        if !(0..self.exits.len()).any(bad) && !self.timed_out {
            return None;
        }
        let mut line = String::new();
        if self.timed_out {
            line.push_str("time limit reached");
        } else if let Some(s) = self.signal {
            line.push_str(&format!("{} forwarded to the job", signal_name(s)));
        }
        if let Some(f) = self.first_failure {
            if !line.is_empty() {
                line.push_str("; ");
            }
            line.push_str(&format!(
                "{} {} (first failure)",
                self.pes(f),
                self.exits[f]
            ));
        }
        let others: Vec<String> = (0..self.exits.len())
            .filter(|&p| bad(p) && Some(p) != self.first_failure)
            .map(|p| {
                let by = if self.stopped[p] {
                    " (stopped by the launcher)"
                } else {
                    ""
                };
                format!("{} {}{by}", self.pes(p), self.exits[p])
            })
            .collect();
        if !others.is_empty() {
            line.push_str(&format!("; then {}", others.join(", ")));
        }
        Some(line)
    }
}

/// A handle to ask a running job to receive a signal (what the signal handlers do).
#[derive(Debug, Clone, Default)]
pub struct Signaller(Arc<AtomicI32>);

impl Signaller {
    /// A new handle, not yet attached to a job.
    pub fn new() -> Self {
        Self::default()
    }
    /// Forwards signal `sig` to every process of the job.
    pub fn signal(&self, sig: i32) {
        self.0.store(sig, Ordering::SeqCst);
    }
}

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

const FORWARDED: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// The forwarding handlers while a job runs; dropping it puts back the actions it replaced, so
/// that after [`run`] the host process reacts to Ctrl-C as before (and a signal that arrives
/// between two jobs is not forwarded to the next).
struct Handlers([libc::sigaction; 2]);

fn install_handlers() -> Handlers {
    PENDING_SIGNAL.store(0, Ordering::SeqCst);
    // SAFETY: zeroed sigaction structs are valid; the old actions are saved before ours goes
    // in; the handler only stores into an atomic, which is async-signal-safe.
    unsafe {
        let mut olds: [libc::sigaction; 2] = std::mem::zeroed();
        for (k, &sig) in FORWARDED.iter().enumerate() {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut act.sa_mask);
            act.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &act, &mut olds[k]);
        }
        Handlers(olds)
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        for (k, &sig) in FORWARDED.iter().enumerate() {
            // SAFETY: puts back an action that sigaction itself returned.
            unsafe { libc::sigaction(sig, &self.0[k], std::ptr::null_mut()) };
        }
    }
}

/// Rank 0's listening socket, bound here and inherited by rank 0's process
/// (`RSHMEM_BOOTSTRAP_FD`): nobody else can take the port in between.
fn bootstrap_listener() -> Result<(std::net::TcpListener, u16)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Bootstrap {
        pe: None,
        msg: format!("launcher: no free port on 127.0.0.1: {e}"),
    })?;
    let port = l
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::Bootstrap {
            pe: None,
            msg: format!("launcher: {e}"),
        })?;
    Ok((l, port))
}

/// Copies `from` line by line to our stdout (stderr when `err`) with a `[label]` prefix.
/// (Through `print!`, so that a test harness captures it.)
fn forward(
    from: impl Read + Send + 'static,
    label: String,
    err: bool,
) -> Option<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rshmem-launcher-io".into())
        .spawn(move || {
            let mut r = BufReader::new(from);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        let text = text.strip_suffix('\n').unwrap_or(&text);
                        if err {
                            eprintln!("[{label}] {text}");
                        } else {
                            println!("[{label}] {text}");
                        }
                    }
                }
            }
            let _ = std::io::stdout().flush();
        })
        .ok()
}

fn kill_all(children: &[Option<Child>], sig: i32) {
    for c in children.iter().flatten() {
        // Each child leads its own process group: signal the group (its children too).
        // SAFETY: kill with a pid we spawned and have not reaped yet.
        unsafe { libc::kill(-(c.id() as libc::pid_t), sig) };
    }
}

/// Orders the failures seen in one poll, the one to report as first in front: which of them
/// ended first is unknown, and a crash (a signal) is the cause that its peers' error exits
/// follow; then by process index, so the same fault gives the same report every time.
fn blame_order(failed: &mut [(usize, Exit)]) {
    failed.sort_by_key(|&(p, e)| (!matches!(e, Exit::Signal(_)), p));
}

/// Runs `job` to the end (see the module documentation).
pub fn run(job: &Job) -> Result<Outcome> {
    run_with(job, &Signaller::new())
}

/// As [`run`]; `signaller` forwards a signal to the job while it runs.
pub fn run_with(job: &Job, signaller: &Signaller) -> Result<Outcome> {
    let t = job.threads_per_proc;
    if job.n_pes == 0 || t == 0 || !job.n_pes.is_multiple_of(t) {
        return Err(Error::invalid(format!(
            "launcher: {} PEs cannot be split into processes of {t} threads",
            job.n_pes
        )));
    }
    let procs = job.n_pes / t;
    let job_id = crate::bootstrap::random_u64() | 1;
    let (listener, port) = bootstrap_listener()?;
    let listen_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let _handlers = job.forward_signals.then(install_handlers);
    let mut children: Vec<Option<Child>> = Vec::with_capacity(procs);
    let mut spawn_err = None;
    let mut io = Vec::new();
    for p in 0..procs {
        let mut cmd = Command::new(&job.program);
        cmd.args(&job.args)
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .env("RSHMEM_RANK", (p * t).to_string())
            .env("RSHMEM_WORLD_SIZE", job.n_pes.to_string())
            .env("RSHMEM_LOCAL_RANK", p.to_string())
            .env("RSHMEM_THREADS", t.to_string())
            .env("RSHMEM_BOOTSTRAP", format!("127.0.0.1:{port}"))
            .env("RSHMEM_JOB", format!("{job_id:016x}"))
            .stdin(Stdio::null())
            .process_group(0);
        // SAFETY: runs in the forked child before exec; prctl, getppid and kill are
        // async-signal-safe. Should the launcher die (even by SIGKILL), each process of the job
        // gets SIGKILL: one that ignores SIGTERM must not outlive it (its segments were
        // unlinked once every PE had mapped them). If the launcher died before the prctl, the
        // parent is already another process: die now.
        let launcher_pid = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != launcher_pid {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Ok(())
            });
        }
        if p == 0 {
            cmd.env("RSHMEM_BOOTSTRAP_FD", listen_fd.to_string());
            // SAFETY: runs in the forked child before exec; fcntl is async-signal-safe. It
            // lets rank 0's process inherit the listening socket (std opens it close-on-exec).
            unsafe {
                cmd.pre_exec(move || {
                    let fl = libc::fcntl(listen_fd, libc::F_GETFD);
                    if fl < 0 || libc::fcntl(listen_fd, libc::F_SETFD, fl & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if job.prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        match cmd.spawn() {
            Ok(mut c) => {
                if job.prefix {
                    let label = if t == 1 {
                        format!("pe {p}")
                    } else {
                        format!("pe {}-{}", p * t, p * t + t - 1)
                    };
                    if let Some(o) = c.stdout.take() {
                        io.extend(forward(o, label.clone(), false));
                    }
                    if let Some(e) = c.stderr.take() {
                        io.extend(forward(e, label, true));
                    }
                }
                children.push(Some(c));
            }
            Err(e) => {
                spawn_err = Some(Error::Os {
                    op: "spawn",
                    msg: format!("{}: {e}", job.program.to_string_lossy()),
                });
                break;
            }
        }
    }
    // Rank 0 owns the socket now; were it to die, the others must see the port closed.
    drop(listener);
    let start = Instant::now();
    let mut exits: Vec<Option<Exit>> = vec![None; procs];
    let mut stopped = vec![false; procs];
    let mut first_failure: Option<usize> = None;
    let mut code = 0;
    let mut failed_at: Option<Instant> = None;
    let mut termed_at: Option<Instant> = None;
    let mut timed_out = false;
    let mut forwarded = None;
    if spawn_err.is_some() {
        kill_all(&children, libc::SIGKILL);
        failed_at = Some(start);
        termed_at = Some(start);
        code = 127;
    }
    loop {
        let mut running = 0;
        let signalled = termed_at.is_some() || forwarded.is_some();
        let mut failed_now: Vec<(usize, Exit)> = Vec::new();
        for (p, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    let e = Exit::from_status(st);
                    exits[p] = Some(e);
                    stopped[p] = signalled;
                    *slot = None;
                    if e.code() != 0 {
                        failed_now.push((p, e));
                    }
                }
                Ok(None) => running += 1,
                Err(_) => {
                    exits[p] = Some(Exit::Code(1));
                    *slot = None;
                }
            }
        }
        blame_order(&mut failed_now);
        if let Some(&(p, e)) = failed_now.first() {
            if code == 0 {
                code = e.code();
                if !signalled {
                    first_failure = Some(p);
                }
            }
            failed_at.get_or_insert_with(Instant::now);
        }
        if running == 0 {
            break;
        }
        let sig = match PENDING_SIGNAL.swap(0, Ordering::SeqCst) {
            0 => signaller.0.swap(0, Ordering::SeqCst),
            s => s,
        };
        if sig != 0 {
            tracing::info!(sig, "launcher: forwarding signal to the job");
            kill_all(&children, sig);
            forwarded = Some(sig);
            failed_at.get_or_insert_with(Instant::now);
        }
        if let Some(limit) = job.timeout {
            if !timed_out && start.elapsed() >= limit {
                eprintln!("rshmem run: time limit of {limit:?} reached, stopping the job");
                timed_out = true;
                kill_all(&children, libc::SIGTERM);
                termed_at = Some(Instant::now());
                failed_at.get_or_insert_with(Instant::now);
            }
        }
        if let Some(f) = failed_at {
            match termed_at {
                None if f.elapsed() >= job.grace => {
                    kill_all(&children, libc::SIGTERM);
                    termed_at = Some(Instant::now());
                }
                Some(tm) if tm.elapsed() >= job.grace => kill_all(&children, libc::SIGKILL),
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if timed_out {
        code = 124;
    }
    // The forwarders end when every writer of their pipe is gone; a process the job left
    // behind (a background child) may hold it open forever: after what the job's own
    // processes wrote has been read (a short while), stop waiting and leave them detached.
    let drain_by = Instant::now()
        + job
            .grace
            .clamp(Duration::from_secs(1), Duration::from_secs(5));
    while io.iter().any(|h| !h.is_finished()) && Instant::now() < drain_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in io {
        if h.is_finished() {
            let _ = h.join();
        }
    }
    let leftover = crate::segment::remove_job_segments(job_id);
    if let Some(e) = spawn_err {
        return Err(e);
    }
    Ok(Outcome {
        code,
        exits: exits
            .into_iter()
            .map(|e| e.unwrap_or(Exit::Code(1)))
            .collect(),
        job: job_id,
        leftover_segments: leftover,
        timed_out,
        signal: forwarded,
        first_failure,
        stopped,
        threads_per_proc: t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_is_blamed_before_the_exits_it_caused() {
        let mut f = vec![
            (0, Exit::Code(4)),
            (1, Exit::Code(1)),
            (3, Exit::Signal(libc::SIGABRT)),
            (2, Exit::Signal(libc::SIGKILL)),
        ];
        blame_order(&mut f);
        assert_eq!(
            f,
            vec![
                (2, Exit::Signal(libc::SIGKILL)),
                (3, Exit::Signal(libc::SIGABRT)),
                (0, Exit::Code(4)),
                (1, Exit::Code(1)),
            ]
        );
    }

    #[test]
    fn report_names_first_failure_and_the_others() {
        let out = Outcome {
            code: 137,
            exits: vec![
                Exit::Code(4),
                Exit::Code(0),
                Exit::Signal(libc::SIGKILL),
                Exit::Signal(libc::SIGTERM),
            ],
            job: 1,
            leftover_segments: 0,
            timed_out: false,
            signal: None,
            first_failure: Some(2),
            stopped: vec![false, false, false, true],
            threads_per_proc: 1,
        };
        assert_eq!(
            out.report().as_deref(),
            Some(
                "PE 2 was killed by SIGKILL (first failure); then PE 0 exited with status 4, \
                 PE 3 was killed by SIGTERM (stopped by the launcher)"
            )
        );
        let mixed = Outcome {
            threads_per_proc: 2,
            exits: vec![Exit::Code(0), Exit::Signal(libc::SIGSEGV)],
            stopped: vec![false, false],
            first_failure: Some(1),
            code: 139,
            ..out
        };
        assert_eq!(
            mixed.report().as_deref(),
            Some("process 1 (PEs 2-3) was killed by SIGSEGV (first failure)")
        );
        assert_eq!(signal_name(64), "signal 64");
    }
}
