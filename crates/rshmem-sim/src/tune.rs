//! Picks tuning thresholds for a topology (next commit).

use crate::schedule::Setup;
use crate::topology::Topology;
use crate::Result;

/// The picks as text.
pub fn report(_topo: &Topology, _setup: &Setup, _pes: usize) -> Result<String> {
    Err(crate::SimError::Invalid("--tune is not there yet".into()))
}
