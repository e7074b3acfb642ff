//! Entry points that pick the mode from the environment.
//!
//! * Started by `rshmem run` (or torchrun / mpirun conventions): this process hosts its PEs
//!   (`RSHMEM_THREADS` of them, default 1) of the job-wide world.
//! * Started plainly: thread mode with `RSHMEM_PES` PEs (default `default_pes`).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pe::Pe;

/// True when the environment says this process is one of a launched job.
pub fn launched() -> bool {
    std::env::var_os("RSHMEM_RANK").is_some()
}

/// Runs `f` on every PE this process hosts and returns their results in PE order.
///
/// Without a launcher it runs `RSHMEM_PES` (or `default_pes`) thread-PEs.
pub fn launch<R: Send>(default_pes: usize, f: impl Fn(&Pe) -> R + Sync) -> Result<Vec<R>> {
    let config = Config::from_env()?;
    if launched() {
        return Err(Error::Bootstrap {
            pe: None,
            msg: "process mode is not built yet".into(),
        });
    }
    let n = match std::env::var("RSHMEM_PES") {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::invalid(format!("RSHMEM_PES={v:?}: expected a count")))?,
        Err(_) => default_pes,
    };
    crate::threads_with(config, n, f)
}
