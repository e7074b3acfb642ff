//! Entry points that start this process's PEs.
//!
//! * [`launch`]: runs a closure on every PE this process hosts, in the mode the environment
//!   says, and returns every PE's [`Outcome`].
//! * [`init`]: one PE per process, for programs that keep the PE in their own control flow.
//! * [`Launch`]: the same two with an explicit [`Config`], or forced into thread mode (tests,
//!   benchmarks that must not join a launched job).
//! * [`Pe::init`]: a PE over a bootstrap of the caller's own (an [`InProcBootstrap`] hub for
//!   thread-PEs a foreign runtime starts, a [`TcpBootstrap`] with custom settings).
//!
//! Started by `rshmem run` (or torchrun / Open MPI conventions, see
//! [`bootstrap::env`](crate::bootstrap::env)), this process hosts its PEs (`RSHMEM_THREADS` of
//! them, default 1) of the job-wide world: processes meet through the TCP bootstrap, the
//! threads of a process through the in-process hub (mixed mode). Started plainly, it is thread
//! mode with `RSHMEM_PES` PEs (default: the count passed to [`launch`]).

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

/// Runs `f` on every PE this process hosts and returns every PE's outcome in PE order.
///
/// Without a launcher it runs `RSHMEM_PES` (or `pes`) thread-PEs. Launched, it runs this
/// process's PEs of the job (one, or `RSHMEM_THREADS` in mixed mode); `pes` is then ignored.
/// Each PE is finalized after `f` returns; a PE whose finalize fails (a peer died) keeps its
/// value. [`Outcomes::values`] turns the outcomes into the values or the first error. A PE
/// whose `f` panics is a bug, not a fault: its peers see it as lost, and the panic is resumed
/// here once every PE of this process has ended.
///
/// ```
/// let v = rshmem::launch(2, |pe| pe.my_pe() * 10).values().unwrap();
/// assert_eq!(v.len(), if rshmem::launched() { 1 } else { 2 });
/// ```
pub fn launch<R: Send>(pes: usize, f: impl Fn(&Pe) -> R + Sync) -> Outcomes<R> {
    Launch::new().run(pes, f)
}

/// Joins a launched job as its single PE in this process (`RSHMEM_THREADS` must be 1), with
/// the configuration from the environment; without a launcher environment, a world of one PE.
/// Call [`Pe::finalize`] at the end: a PE dropped without it is seen as lost by its peers.
pub fn init() -> Result<Pe> {
    Launch::new().init()
}

/// How to start this process's PEs when [`launch`] and [`init`]'s defaults do not fit: an
/// explicit [`Config`] instead of the environment's, or thread mode whatever the environment
/// says.
///
/// ```
/// let cfg = rshmem::Config::default().heap_size(1 << 20);
/// let v = rshmem::Launch::new().config(cfg).threads().run(3, |pe| pe.n_pes()).values();
/// assert_eq!(v.unwrap(), vec![3, 3, 3]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Launch {
    config: Option<Config>,
    threads: bool,
}

/// One PE's end: `f`'s value, or the error that kept `f` from running; and how its finalize
/// went.
#[derive(Debug)]
pub struct Outcome<R> {
    /// The PE's world index.
    pub pe: usize,
    /// `f`'s value, or why the PE never ran `f` (its bootstrap or set-up failed).
    pub result: Result<R>,
    /// The PE's finalize: an error when a peer was lost or did not arrive in time.
    pub finalize: Result<()>,
}

/// Every outcome of this process's PEs, in PE order, or the error that kept any PE from
/// starting (a bad configuration, a launcher environment that cannot be read).
#[derive(Debug)]
#[must_use = "the outcomes carry every PE's value or error"]
pub struct Outcomes<R>(Result<Vec<Outcome<R>>>);

impl<R> Outcomes<R> {
    /// Every PE's value, in PE order; or the first failure: the start error, a PE's set-up
    /// error, else the first failed finalize.
    pub fn values(self) -> Result<Vec<R>> {
        let pes = self.0?;
        let mut first_finalize = None;
        let mut out = Vec::with_capacity(pes.len());
        for o in pes {
            out.push(o.result?);
            if let Err(e) = o.finalize {
                first_finalize.get_or_insert(e);
            }
        }
        match first_finalize {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Every PE's outcome, or the error that kept any PE from starting.
    pub fn into_result(self) -> Result<Vec<Outcome<R>>> {
        self.0
    }

    /// As [`Outcomes::into_result`], borrowed.
    pub fn as_result(&self) -> Result<&[Outcome<R>], &Error> {
        self.0.as_deref()
    }
}

impl Launch {
    /// The defaults: configuration from the environment, mode from the environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `config` instead of reading it from the environment.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Thread mode with exactly the PE count given to [`Launch::run`], whatever the environment
    /// says (`rshmem run`'s variables and `RSHMEM_PES` are ignored).
    pub fn threads(mut self) -> Self {
        self.threads = true;
        self
    }

    fn take_config(&mut self) -> Result<Config> {
        match self.config.take() {
            Some(c) => Ok(c),
            None => Config::from_env(),
        }
    }

    /// Runs `f` on every PE this process hosts; see [`launch`].
    pub fn run<R: Send>(mut self, pes: usize, f: impl Fn(&Pe) -> R + Sync) -> Outcomes<R> {
        Outcomes(self.run_inner(pes, f))
    }

    fn run_inner<R: Send>(
        &mut self,
        pes: usize,
        f: impl Fn(&Pe) -> R + Sync,
    ) -> Result<Vec<Outcome<R>>> {
        let config = self.take_config()?;
        let le = if self.threads { None } else { env::detect()? };
        let config = launch_node(config, le.as_ref());
        let Some(le) = le else {
            let n = if self.threads {
                pes
            } else {
                pes_from_env(pes)?
            };
            // Checked here too: the hub's waits use the timeout before the PEs check the config.
            config.validate()?;
            let hub = InProcBootstrap::new(n, config.timeout)?;
            return run_threads(&config, n, 0, f, |rank| Ok(Box::new(hub.join(rank)?)));
        };
        let tcp = connect(&le, &config)?;
        if le.threads == 1 {
            let pe = Pe::init(config, Box::new(tcp))?;
            let me = pe.my_pe();
            let r = f(&pe);
            return Ok(vec![Outcome {
                pe: me,
                result: Ok(r),
                finalize: pe.finalize(),
            }]);
        }
        let tcp = Arc::new(tcp);
        let hub = InProcBootstrap::new(le.threads, config.timeout)?;
        run_threads(&config, le.threads, le.first_pe(), f, |t| {
            Ok(Box::new(HierEndpoint::new(
                hub.join(t)?,
                tcp.clone(),
                le.local_rank,
            )?))
        })
    }

    /// One PE in this process; see [`init`]. In thread mode, a world of one PE.
    pub fn init(mut self) -> Result<Pe> {
        let config = self.take_config()?;
        let le = if self.threads { None } else { env::detect()? };
        let config = launch_node(config, le.as_ref());
        match le {
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
}

fn pes_from_env(default: usize) -> Result<usize> {
    match std::env::var("RSHMEM_PES") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(Error::invalid(format!(
                "RSHMEM_PES={v:?}: expected a count of at least 1"
            ))),
        },
        Err(_) => Ok(default),
    }
}

/// The node name from the launcher's node index (`SLURM_NODEID`) when the configuration
/// names none: nodes are then the launcher's, not host names.
fn launch_node(mut config: Config, le: Option<&LaunchEnv>) -> Config {
    if config.node.is_none() {
        if let Some(i) = le.and_then(|le| le.node) {
            config.node = Some(format!("{}-node-{i}", le.map_or("", |le| le.source)));
        }
    }
    config
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

/// Runs `f` on `n` thread-PEs of this process, thread `t` joining through `boot(t)` as world PE
/// `first + t`; each PE is finalized after `f`. A panic is resumed after every thread ended.
pub(crate) fn run_threads<R: Send>(
    config: &Config,
    n: usize,
    first: usize,
    f: impl Fn(&Pe) -> R + Sync,
    boot: impl Fn(usize) -> Result<Box<dyn Bootstrap>> + Sync,
) -> Result<Vec<Outcome<R>>> {
    let results: Vec<std::thread::Result<Outcome<R>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (f, boot) = (&f, &boot);
                let config = config.clone();
                std::thread::Builder::new()
                    .name(format!("rshmem-pe-t{t}"))
                    .spawn_scoped(s, move || -> Outcome<R> {
                        let pe = match boot(t).and_then(|b| Pe::init(config, b)) {
                            Ok(pe) => pe,
                            Err(e) => {
                                return Outcome {
                                    pe: first + t,
                                    result: Err(e),
                                    finalize: Ok(()),
                                }
                            }
                        };
                        let r = f(&pe);
                        Outcome {
                            pe: pe.my_pe(),
                            result: Ok(r),
                            finalize: pe.finalize(),
                        }
                    })
                    .map_err(|e| Error::Os {
                        op: "spawn PE thread",
                        msg: e.to_string(),
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(t, h)| match h {
                Ok(h) => h.join(),
                Err(e) => Ok(Outcome {
                    pe: first + t,
                    result: Err(e),
                    finalize: Ok(()),
                }),
            })
            .collect()
    });
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(o) => out.push(o),
        }
    }
    Ok(out)
}
