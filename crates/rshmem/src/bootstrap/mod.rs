//! Bootstrap: the small host-side exchanges that start a world (and nothing on the hot path).
//!
//! * [`InProcBootstrap`]: threads of one process (thread mode, or threads the application owns).
//! * TCP and the launcher environments (process and mixed mode) build on the same trait.

mod inproc;
pub use inproc::{InProcBootstrap, InProcEndpoint};

use crate::error::Result;

/// Exchanges of small host data among the members of a job, one endpoint per PE.
pub trait Bootstrap: Send + Sync + std::fmt::Debug {
    /// This endpoint's rank (the PE's world index).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
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
