//! Bootstrap: the small host-side exchanges that start a world (and nothing on the hot path).
//!
//! * [`InProcBootstrap`]: threads of one process (thread mode, or threads the application owns).
//! * [`TcpBootstrap`]: processes, a star around rank 0 (address from the environment or a
//!   [`unique_id`]).
//! * [`HierEndpoint`]: mixed mode, TCP among processes and the in-process hub among a process's
//!   threads, so each thread is one PE of the global world.
//! * [`env`](mod@env): the launcher conventions (`RSHMEM_*`, torchrun, Open MPI).

pub mod env;
mod hier;
mod inproc;
mod tcp;
pub use hier::HierEndpoint;
pub use inproc::{InProcBootstrap, InProcEndpoint};
pub(crate) use tcp::adopt_inherited_listener;
pub use tcp::{unique_id, TcpBootstrap, TcpConfig, TCP_PROTOCOL_VERSION};

/// Where a bootstrap endpoint's PE runs: reported by [`Bootstrap::locality`] and exchanged at
/// start-up to build the world's placement map ([`Pe::placement`](crate::Pe::placement)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locality {
    /// Index of the PE's process in the job (0 in thread mode).
    pub process: usize,
    /// Index of the PE's thread within its process (0 in process mode).
    pub thread: usize,
    /// Node-local PE index: the device ordinal under the one-device-per-PE convention
    /// (`local_rank * threads_per_process + thread`).
    pub device: usize,
    /// Job id chosen by the launcher (`RSHMEM_JOB`), used to name shared-memory segments so
    /// that the launcher can remove them after the job.
    pub job: Option<u64>,
}

use crate::error::{Error, Result};

/// Exchanges of small host data among the members of a job, one endpoint per PE.
pub trait Bootstrap: Send + Sync + std::fmt::Debug {
    /// This endpoint's rank (the PE's world index).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Where this endpoint's PE runs. The default describes a thread of a single-process world.
    fn locality(&self) -> Locality {
        Locality {
            process: 0,
            thread: self.rank(),
            device: self.rank(),
            job: None,
        }
    }
    /// Every rank contributes `data`; everyone receives all contributions in rank order.
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// All ranks meet.
    fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }
    /// Rank `root`'s data reaches everyone.
    fn broadcast(&self, data: &[u8], root: usize) -> Result<Vec<u8>> {
        let mut all = self.allgather(if self.rank() == root { data } else { &[] })?;
        if root >= all.len() {
            return Err(crate::Error::PeOutOfRange {
                pe: root,
                n_pes: all.len(),
                what: "world",
            });
        }
        Ok(std::mem::take(&mut all[root]))
    }
}

/// Every rank reports its local outcome; if any failed, every rank returns that error.
pub(crate) fn agree(boot: &dyn Bootstrap, local: Result<()>, step: &str) -> Result<()> {
    let msg = match &local {
        Ok(()) => Vec::new(),
        Err(e) => format!("{step}: {e}").into_bytes(),
    };
    let all = boot.allgather(&msg)?;
    if let Some((pe, m)) = all.iter().enumerate().find(|(_, m)| !m.is_empty()) {
        local.as_ref().map_err(Clone::clone)?;
        return Err(Error::Bootstrap {
            pe: Some(pe),
            msg: String::from_utf8_lossy(m).into_owned(),
        });
    }
    Ok(())
}

/// [`agree`] on a step that yields a value: every rank gets its value or the same error.
pub(crate) fn agree_value<T>(boot: &dyn Bootstrap, local: Result<T>, step: &str) -> Result<T> {
    match local {
        Ok(v) => agree(boot, Ok(()), step).map(|()| v),
        Err(e) => {
            agree(boot, Err(e.clone()), step)?;
            Err(e)
        }
    }
}

/// 64 random bits (`/dev/urandom`, else the clock and the pid): job ids and tokens.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_nanos() as u64) ^ ((std::process::id() as u64) << 32)
}
