//! Launcher environment conventions.
//!
//! Read in this order; the first convention whose rank variable is set wins:
//!
//! 1. **rshmem** (`rshmem run`): `RSHMEM_RANK`, `RSHMEM_WORLD_SIZE`, `RSHMEM_LOCAL_RANK`,
//!    `RSHMEM_THREADS`, `RSHMEM_BOOTSTRAP`, `RSHMEM_JOB`. **These count PEs**:
//!    `RSHMEM_WORLD_SIZE` is the number of PEs of the job and `RSHMEM_RANK` the world index of
//!    this process's first PE (its thread 0). With `RSHMEM_THREADS = T` (default 1) the process
//!    hosts PEs `RSHMEM_RANK .. RSHMEM_RANK + T`; `RSHMEM_RANK` must be a multiple of T and
//!    `RSHMEM_WORLD_SIZE` a multiple of T. `RSHMEM_LOCAL_RANK` is the process's index on its
//!    node (default: its process index).
//! 2. **torchrun**: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`.
//! 3. **Open MPI**: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`.
//!
//! The torchrun and Open MPI variables **count processes**, as those launchers define them:
//! with `RSHMEM_THREADS = T` the job has `WORLD_SIZE * T` PEs and process `RANK` hosts PEs
//! `RANK * T .. RANK * T + T`. Their bootstrap address is `RSHMEM_BOOTSTRAP` when set, else
//! `MASTER_ADDR:(MASTER_PORT + 1)` — torch's own store already listens on `MASTER_PORT`.
//!
//! In every convention PE `p * T + t` is thread `t` of process `p`.

use crate::error::{Error, Result};

/// What the environment says about this process's place in a launched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Which convention was found: "rshmem", "torchrun" or "openmpi".
    pub source: &'static str,
    /// This process's index among the job's processes.
    pub process: usize,
    /// Number of processes.
    pub n_processes: usize,
    /// PEs (threads) per process.
    pub threads: usize,
    /// This process's index on its node.
    pub local_rank: usize,
    /// Rank 0's bootstrap address (`host:port` or a unique id), when given.
    pub bootstrap: Option<String>,
    /// Job id chosen by the launcher (`RSHMEM_JOB`, hex), when given.
    pub job: Option<u64>,
}

impl LaunchEnv {
    /// World index of this process's first PE.
    pub fn first_pe(&self) -> usize {
        self.process * self.threads
    }
    /// Number of PEs of the job.
    pub fn world_size(&self) -> usize {
        self.n_processes * self.threads
    }
    /// The bootstrap address, or an error saying which variable to set.
    pub fn bootstrap_address(&self) -> Result<&str> {
        self.bootstrap.as_deref().ok_or_else(|| Error::Bootstrap {
            pe: Some(self.first_pe()),
            msg: format!(
                "launched by {} conventions but no bootstrap address: set RSHMEM_BOOTSTRAP (host:port or unique id){}",
                self.source,
                if self.source == "torchrun" { " or MASTER_ADDR and MASTER_PORT" } else { "" }
            ),
        })
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn num(name: &str) -> Result<Option<usize>> {
    match var(name) {
        None => Ok(None),
        Some(v) => {
            v.trim().parse().map(Some).map_err(|_| {
                Error::invalid(format!("{name}={v:?}: expected a non-negative integer"))
            })
        }
    }
}

fn need(name: &str, with: &str) -> Result<usize> {
    num(name)?.ok_or_else(|| Error::invalid(format!("{with} is set but {name} is not")))
}

/// Reads the environment; `None` when no launcher convention is present (thread mode).
pub fn detect() -> Result<Option<LaunchEnv>> {
    let threads = num("RSHMEM_THREADS")?.unwrap_or(1);
    if threads == 0 {
        return Err(Error::invalid("RSHMEM_THREADS must be at least 1"));
    }
    let job = match var("RSHMEM_JOB") {
        None => None,
        Some(v) => Some(
            u64::from_str_radix(v.trim(), 16)
                .map_err(|_| Error::invalid(format!("RSHMEM_JOB={v:?}: expected hex")))?,
        ),
    };
    let explicit_boot = var("RSHMEM_BOOTSTRAP");
    let (source, process, n_processes, local) = if let Some(first) = num("RSHMEM_RANK")? {
        let size = need("RSHMEM_WORLD_SIZE", "RSHMEM_RANK")?;
        if !size.is_multiple_of(threads) || !first.is_multiple_of(threads) {
            return Err(Error::invalid(format!(
                "RSHMEM_RANK={first} and RSHMEM_WORLD_SIZE={size} must be multiples of RSHMEM_THREADS={threads} (they count PEs)"
            )));
        }
        (
            "rshmem",
            first / threads,
            size / threads,
            num("RSHMEM_LOCAL_RANK")?,
        )
    } else if let Some(rank) = num("RANK")? {
        let size = need("WORLD_SIZE", "RANK")?;
        ("torchrun", rank, size, num("LOCAL_RANK")?)
    } else if let Some(rank) = num("OMPI_COMM_WORLD_RANK")? {
        let size = need("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")?;
        ("openmpi", rank, size, num("OMPI_COMM_WORLD_LOCAL_RANK")?)
    } else {
        return Ok(None);
    };
    if process >= n_processes {
        return Err(Error::invalid(format!(
            "{source} environment: process {process} is out of range for {n_processes} processes"
        )));
    }
    let bootstrap = explicit_boot.or_else(|| match (var("MASTER_ADDR"), num("MASTER_PORT")) {
        (Some(a), Ok(Some(p))) => Some(format!("{}:{}", a.trim(), p + 1)),
        _ => None,
    });
    Ok(Some(LaunchEnv {
        source,
        process,
        n_processes,
        threads,
        local_rank: local.unwrap_or(process),
        bootstrap,
        job,
    }))
}
