//! Entry points that pick the mode from the environment.
//!
//! * Started by `rshmem run` (or torchrun / Open MPI conventions, see
//!   [`bootstrap::env`](crate::bootstrap::env)): this process hosts its PEs (`RSHMEM_THREADS`
//!   of them, default 1) of the job-wide world; processes meet through the TCP bootstrap, the
//!   threads of a process through the in-process hub (mixed mode).
//! * Started plainly: thread mode with `RSHMEM_PES` PEs (default `default_pes`).

use crate::bootstrap::env::{self, LaunchEnv};
use crate::bootstrap::{Bootstrap, HierEndpoint, InProcBootstrap, TcpBootstrap, TcpConfig};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::pe::Pe;
use std::sync::Arc;

/// True when the environment says this process is one of a launched job (an `rshmem run`,
/// torchrun or Open MPI rank variable is set).
pub fn launched() -> bool {
    !matches!(env::detect(), Ok(None))
}

/// Runs `f` on every PE this process hosts and returns their results in PE order.
///
/// Without a launcher it runs `RSHMEM_PES` (or `default_pes`) thread-PEs. Launched, it runs
/// this process's PEs of the job (one, or `RSHMEM_THREADS` in mixed mode); `default_pes` is then
/// ignored. Each PE is finalized after `f` returns.
pub fn launch<R: Send>(default_pes: usize, f: impl Fn(&Pe) -> R + Sync) -> Result<Vec<R>> {
    launch_with(Config::from_env()?, default_pes, f)
}

/// As [`launch`] with an explicit configuration.
pub fn launch_with<R: Send>(
    config: Config,
    default_pes: usize,
    f: impl Fn(&Pe) -> R + Sync,
) -> Result<Vec<R>> {
    let Some(le) = env::detect()? else {
        let n = match std::env::var("RSHMEM_PES") {
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(Error::invalid(format!(
                        "RSHMEM_PES={v:?}: expected a count of at least 1"
                    )))
                }
            },
            Err(_) => default_pes,
        };
        return crate::threads_with(config, n, f);
    };
    let tcp = connect(&le, &config)?;
    if le.threads == 1 {
        let pe = Pe::init(config, Box::new(tcp))?;
        let r = f(&pe);
        pe.finalize()?;
        return Ok(vec![r]);
    }
    let tcp = Arc::new(tcp);
    let hub = InProcBootstrap::new(le.threads, config.timeout)?;
    run_threads(&config, le.threads, f, |t| {
        Ok(Box::new(HierEndpoint::new(
            hub.join(t)?,
            tcp.clone(),
            le.local_rank,
        )?))
    })
}

/// Joins a launched job as its single PE in this process (`RSHMEM_THREADS` must be 1), with
/// the configuration from the environment; without a launcher environment, a world of one PE.
/// Call [`Pe::finalize`] at the end: a PE dropped without it is seen as lost by its peers.
pub fn init() -> Result<Pe> {
    init_with(Config::from_env()?)
}

/// As [`init`] with an explicit configuration.
pub fn init_with(config: Config) -> Result<Pe> {
    match env::detect()? {
        None => {
            let hub = InProcBootstrap::new(1, config.timeout)?;
            Pe::init(config, Box::new(hub.join(0)?))
        }
        Some(le) if le.threads != 1 => Err(Error::invalid(format!(
            "rshmem::init hosts one PE per process, but RSHMEM_THREADS={}: use rshmem::launch",
            le.threads
        ))),
        Some(le) => {
            let tcp = connect(&le, &config)?;
            Pe::init(config, Box::new(tcp))
        }
    }
}

fn connect(le: &LaunchEnv, config: &Config) -> Result<TcpBootstrap> {
    if le.process == 0 {
        if let (Some(addr), Some(fd)) = (
            le.bootstrap.as_deref(),
            std::env::var("RSHMEM_BOOTSTRAP_FD")
                .ok()
                .and_then(|v| v.trim().parse::<i32>().ok()),
        ) {
            crate::bootstrap::adopt_inherited_listener(addr, fd);
        }
    }
    let mut c = TcpConfig::new(
        le.bootstrap_address()?,
        le.process,
        le.n_processes,
        config.timeout,
    );
    c.pes_per_rank = le.threads;
    c.token = le.job.unwrap_or(0);
    c.locality.device = le.local_rank * le.threads;
    c.locality.job = le.job;
    tracing::debug!(
        source = le.source,
        process = le.process,
        n = le.n_processes,
        threads = le.threads,
        "joining launched job"
    );
    TcpBootstrap::with_config(c)
}

/// Runs `f` on `n` thread-PEs of this process, thread `t` joining through `boot(t)`; each PE is
/// finalized after `f`, a panic is resumed after every thread ended, else the first error wins.
pub(crate) fn run_threads<R: Send>(
    config: &Config,
    n: usize,
    f: impl Fn(&Pe) -> R + Sync,
    boot: impl Fn(usize) -> Result<Box<dyn Bootstrap>> + Sync,
) -> Result<Vec<R>> {
    let results: Vec<std::thread::Result<Result<R>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (f, boot) = (&f, &boot);
                let config = config.clone();
                std::thread::Builder::new()
                    .name(format!("rshmem-pe-t{t}"))
                    .spawn_scoped(s, move || -> Result<R> {
                        let pe = Pe::init(config, boot(t)?)?;
                        let r = f(&pe);
                        pe.finalize()?;
                        Ok(r)
                    })
                    .map_err(|e| Error::Os {
                        op: "spawn PE thread",
                        msg: e.to_string(),
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.map_or_else(|e| Ok(Err(e)), |h| h.join()))
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    let mut first_err = None;
    for r in results {
        match r {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Runs `f` on `n` PEs, each a thread of this process, with the configuration from the
/// environment; returns each PE's result in PE order. See [`threads_with`].
pub fn threads<R: Send>(n: usize, f: impl Fn(&crate::Pe) -> R + Sync) -> Result<Vec<R>> {
    threads_with(Config::from_env()?, n, f)
}

/// Runs `f` on `n` thread-PEs with `config`. Each PE is finalized after `f` returns. If a PE's
/// `f` panics, its peers see it as lost (their waits end in [`Error::PeerLost`]) and the panic
/// is resumed here after every thread has ended.
pub fn threads_with<R: Send>(
    config: Config,
    n: usize,
    f: impl Fn(&crate::Pe) -> R + Sync,
) -> Result<Vec<R>> {
    // Checked here too: the hub's waits use the timeout before the PEs check the config.
    config.validate()?;
    let hub = InProcBootstrap::new(n, config.timeout)?;
    run_threads(&config, n, f, |rank| Ok(Box::new(hub.join(rank)?)))
}
