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
//! 3. **Open MPI**: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`
//!    (before Slurm: `mpirun` inside an allocation inherits the allocation's `SLURM_PROCID`).
//! 4. **Slurm** (`srun`): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`.
//! 5. **PMI** (MPICH's Hydra, PMIx launchers): `PMI_RANK` (or `PMIX_RANK`), `PMI_SIZE`,
//!    `PMI_LOCAL_RANK` (or `MPI_LOCALRANKID`).
//!
//! The node index (`SLURM_NODEID`) names this process's node when [`Config::node`]
//! (`RSHMEM_NODE`) is not set; otherwise nodes are told apart by host name.
//!
//! [`Config::node`]: crate::Config::node
//!
//! The torchrun, Open MPI, Slurm and PMI variables **count processes**, as those launchers define them:
//! with `RSHMEM_THREADS = T` the job has `WORLD_SIZE * T` PEs and process `RANK` hosts PEs
//! `RANK * T .. RANK * T + T`. Their bootstrap address is `RSHMEM_BOOTSTRAP` when set, else
//! `MASTER_ADDR:(MASTER_PORT + 1)` — torch's own store already listens on `MASTER_PORT`
//! (under Slurm or PMI set `RSHMEM_BOOTSTRAP`, or `MASTER_ADDR` and `MASTER_PORT`, in the job
//! script: those launchers publish no address of rank 0).
//!
//! In every convention PE `p * T + t` is thread `t` of process `p`.

use crate::error::{Error, Result};

/// What the environment says about this process's place in a launched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Which convention was found: "rshmem", "torchrun", "openmpi", "slurm" or "pmi".
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
    /// Index of this process's node among the job's nodes (`SLURM_NODEID`), when given.
    pub node: Option<usize>,
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

/// Reads the environment; `None` when no launcher convention is present (thread mode).
pub fn detect() -> Result<Option<LaunchEnv>> {
    detect_in(&|name| std::env::var(name).ok())
}

/// [`detect`] over any source of variables (tests pass a map: the process environment is
/// shared by every test thread).
fn detect_in(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
    let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let num = |name: &str| -> Result<Option<usize>> {
        match var(name) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                Error::invalid(format!("{name}={v:?}: expected a non-negative integer"))
            }),
        }
    };
    let need = |name: &str, with: &str| -> Result<usize> {
        num(name)?.ok_or_else(|| Error::invalid(format!("{with} is set but {name} is not")))
    };
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
    } else if let Some(rank) = num("SLURM_PROCID")? {
        let size = need("SLURM_NTASKS", "SLURM_PROCID")?;
        ("slurm", rank, size, num("SLURM_LOCALID")?)
    } else if let Some(rank) = num("PMI_RANK")?.map_or_else(|| num("PMIX_RANK"), |r| Ok(Some(r)))? {
        let size = need("PMI_SIZE", "PMI_RANK")?;
        let local =
            num("PMI_LOCAL_RANK")?.map_or_else(|| num("MPI_LOCALRANKID"), |r| Ok(Some(r)))?;
        ("pmi", rank, size, local)
    } else {
        return Ok(None);
    };
    if process >= n_processes {
        return Err(Error::invalid(format!(
            "{source} environment: process {process} is out of range for {n_processes} processes"
        )));
    }
    let local_rank = local.unwrap_or(process);
    // Device ordinals are local_rank * threads + thread.
    if local_rank
        .checked_mul(threads)
        .and_then(|d| d.checked_add(threads))
        .is_none()
    {
        let var = match source {
            "rshmem" => "RSHMEM_LOCAL_RANK",
            "torchrun" => "LOCAL_RANK",
            "slurm" => "SLURM_LOCALID",
            "pmi" => "PMI_LOCAL_RANK",
            _ => "OMPI_COMM_WORLD_LOCAL_RANK",
        };
        return Err(Error::invalid(format!(
            "{var}={local_rank} with RSHMEM_THREADS={threads}: device ordinals overflow"
        )));
    }
    if n_processes.checked_mul(threads).is_none() {
        return Err(Error::invalid(format!(
            "{source} environment: {n_processes} processes of RSHMEM_THREADS={threads} PEs overflow"
        )));
    }
    // MASTER_PORT is torch's store; ours is the next port, so it must be below 65535. A
    // malformed value is named here (it was once ignored, and the error then said to set it).
    let bootstrap = match explicit_boot {
        Some(b) => Some(b),
        None => match (var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(a), Some(p)) => match p.trim().parse::<u16>() {
                Ok(port) if port < u16::MAX => Some(format!("{}:{}", a.trim(), port + 1)),
                _ => {
                    return Err(Error::invalid(format!(
                        "MASTER_PORT={p:?}: expected a TCP port below 65535 (the bootstrap listens on MASTER_PORT + 1)"
                    )))
                }
            },
            _ => None,
        },
    };
    let node = if source == "slurm" {
        num("SLURM_NODEID")?
    } else {
        None
    };
    Ok(Some(LaunchEnv {
        source,
        process,
        n_processes,
        threads,
        local_rank,
        bootstrap,
        job,
        node,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect_with(vars: &[(&str, &str)]) -> Result<Option<LaunchEnv>> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect_in(&move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    fn invalid_naming(r: Result<Option<LaunchEnv>>, var: &str) {
        match r {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(var), "{m:?} lacks {var}"),
            other => panic!("expected an error naming {var}, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_bootstrap_is_master_port_plus_one() {
        let r = detect_with(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", " node0 "),
            ("MASTER_PORT", "29500"),
        ]);
        let le = r.unwrap().unwrap();
        assert_eq!(le.bootstrap.as_deref(), Some("node0:29501"));
        assert_eq!((le.source, le.process, le.n_processes), ("torchrun", 1, 2));
        assert_eq!(detect_with(&[]).unwrap(), None);
    }

    #[test]
    fn slurm_pmi_and_their_precedence() {
        let slurm = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("MASTER_ADDR", "n0"),
            ("MASTER_PORT", "4000"),
        ];
        let le = detect_with(&slurm).unwrap().unwrap();
        assert_eq!(
            (
                le.source,
                le.process,
                le.n_processes,
                le.local_rank,
                le.node
            ),
            ("slurm", 5, 8, 1, Some(2))
        );
        assert_eq!(le.bootstrap.as_deref(), Some("n0:4001"));
        // Without an address the error says what to set.
        let le = detect_with(&slurm[..4]).unwrap().unwrap();
        assert!(le.bootstrap_address().is_err());
        // mpirun inside an allocation: Open MPI's variables win over the inherited SLURM_*.
        let mut both = slurm.to_vec();
        both.extend([("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        let le = detect_with(&both).unwrap().unwrap();
        assert_eq!(
            (le.source, le.process, le.n_processes, le.node),
            ("openmpi", 3, 4, None)
        );
        // torchrun under srun: torchrun's.
        let mut torch = slurm.to_vec();
        torch.extend([("RANK", "1"), ("WORLD_SIZE", "2")]);
        assert_eq!(detect_with(&torch).unwrap().unwrap().source, "torchrun");
        // PMI (Hydra) and PMIx ranks.
        let le = detect_with(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "0"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (le.source, le.process, le.n_processes, le.local_rank),
            ("pmi", 2, 3, 0)
        );
        let le = detect_with(&[("PMIX_RANK", "1"), ("PMI_SIZE", "2")])
            .unwrap()
            .unwrap();
        assert_eq!((le.source, le.process, le.local_rank), ("pmi", 1, 1));
        // Bad values name their variable.
        invalid_naming(detect_with(&[("SLURM_PROCID", "0")]), "SLURM_NTASKS");
        invalid_naming(
            detect_with(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_NODEID", "x"),
            ]),
            "SLURM_NODEID",
        );
        invalid_naming(
            detect_with(&[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2")]),
            "slurm",
        );
        invalid_naming(detect_with(&[("PMI_RANK", "0")]), "PMI_SIZE");
    }

    #[test]
    fn garbage_values_are_errors_naming_the_variable() {
        let torch = |port: &'static str| {
            detect_with(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port),
            ])
        };
        // Once silently ignored (then "set MASTER_ADDR and MASTER_PORT"), or p + 1 overflowed
        // (a panic in debug builds, port 0 in release).
        for port in ["abc", "-1", "65535", "70000", "18446744073709551615"] {
            invalid_naming(torch(port), "MASTER_PORT");
        }
        // RSHMEM_BOOTSTRAP wins: MASTER_PORT is then not ours to judge.
        let r = detect_with(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("RSHMEM_BOOTSTRAP", "127.0.0.1:5000"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "abc"),
        ]);
        assert_eq!(
            r.unwrap().unwrap().bootstrap.as_deref(),
            Some("127.0.0.1:5000")
        );
        invalid_naming(
            detect_with(&[("RSHMEM_RANK", "0"), ("RSHMEM_WORLD_SIZE", "x")]),
            "RSHMEM_WORLD_SIZE",
        );
        invalid_naming(
            detect_with(&[("RSHMEM_RANK", "0"), ("RSHMEM_THREADS", "0")]),
            "RSHMEM_THREADS",
        );
        invalid_naming(detect_with(&[("RSHMEM_JOB", "zz")]), "RSHMEM_JOB");
        invalid_naming(
            detect_with(&[("OMPI_COMM_WORLD_RANK", "0")]),
            "OMPI_COMM_WORLD_SIZE",
        );
        // local_rank x threads beyond usize: the device ordinal would overflow.
        invalid_naming(
            detect_with(&[
                ("RSHMEM_RANK", "0"),
                ("RSHMEM_WORLD_SIZE", "2"),
                ("RSHMEM_THREADS", "2"),
                ("RSHMEM_LOCAL_RANK", "18446744073709551615"),
            ]),
            "RSHMEM_LOCAL_RANK",
        );
        // processes x threads beyond usize: world_size() would overflow.
        invalid_naming(
            detect_with(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "18446744073709551615"),
                ("RSHMEM_THREADS", "2"),
            ]),
            "RSHMEM_THREADS",
        );
    }
}
