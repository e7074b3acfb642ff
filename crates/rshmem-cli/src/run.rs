//! `rshmem run`: the job launcher (see [`rshmem::launcher`]).

use clap::Args;
use rshmem::launcher::{self, Job};
use std::ffi::OsString;
use std::time::Duration;

/// Arguments of `rshmem run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of PEs.
    #[arg(short = 'n', long = "np", default_value_t = 2)]
    pub n: usize,
    /// Thread-PEs per process (mixed mode when > 1); must divide N.
    #[arg(short = 't', long = "threads-per-proc", default_value_t = 1)]
    pub threads_per_proc: usize,
    /// Stop the job after this many seconds (exit status 124).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Prefix every output line with `[pe k]`.
    #[arg(long)]
    pub prefix: bool,
    /// Seconds the other processes may still run after one failed, before they are stopped.
    #[arg(long, default_value_t = launcher::DEFAULT_GRACE.as_secs_f64())]
    pub grace: f64,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

fn secs(what: &str, s: f64) -> Result<Duration, String> {
    // try_: from_secs_f64 panics on values above u64::MAX seconds.
    match Duration::try_from_secs_f64(s) {
        Ok(d) if s.is_finite() => Ok(d),
        _ => Err(format!(
            "--{what} {s}: expected a non-negative, representable number of seconds"
        )),
    }
}

/// Runs the job; returns the exit status for the `rshmem` process.
pub fn run(a: RunArgs) -> i32 {
    let go = || -> Result<i32, String> {
        let mut cmd = a.command.into_iter();
        let program = cmd.next().ok_or("no program given")?;
        let mut job = Job::new(a.n, program);
        job.args = cmd.collect();
        job.threads_per_proc = a.threads_per_proc;
        job.timeout = a.timeout.map(|t| secs("timeout", t)).transpose()?;
        job.grace = secs("grace", a.grace)?;
        job.prefix = a.prefix;
        job.forward_signals = true;
        let out = launcher::run(&job).map_err(|e| e.to_string())?;
        if let Some(line) = out.report() {
            eprintln!("rshmem run: {line}");
        }
        if out.leftover_segments > 0 {
            tracing::info!(
                n = out.leftover_segments,
                "removed segments left by the job"
            );
        }
        Ok(out.code)
    };
    match go() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rshmem run: {e}");
            2
        }
    }
}
