//! Functional mode (next commit).

use crate::schedule::{Op, Setup};
use crate::topology::Topology;
use crate::Result;

/// What a functional run checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Functional {
    /// PEs.
    pub pes: usize,
    /// Values checked.
    pub checked: usize,
    /// Simulated time, µs.
    pub time_us: f64,
}

/// Runs `op` of `bytes` on `pes` CPU PEs with real data, checked.
pub fn run(
    _topo: &Topology,
    _setup: &Setup,
    _op: Op,
    _pes: usize,
    _bytes: usize,
) -> Result<Functional> {
    Err(crate::SimError::Invalid(
        "functional mode is not there yet".into(),
    ))
}
