//! `rshmem-sim`: a discrete-event simulator that times rshmem's own collective and MoE
//! schedules on modelled topologies, from 2 to thousands of PEs.
//!
//! * [`topology`]: GPUs, links, switches and NICs from a TOML file ([`Topology::load`]), with
//!   generators for meshes, NVSwitch domains, rings, 2D tori, PCIe trees and rail-optimised fat
//!   trees, and the route between any two GPUs.
//! * [`fluid`]: the engine. Transfers are fluid flows that share every link they cross by
//!   max-min fairness; an event queue ordered by (time, sequence) starts and ends them, so the
//!   same inputs give the same timeline. A flow may start a delay after another ends: a
//!   kernel's threads that load or store in waves, each issued once the last one is in. Why flows and not packets: a packet model of a 1 GiB
//!   all-to-all on 4096 PEs would need about 10^13 events, while flows need a few per
//!   transfer, and on NVLink and InfiniBand with credit flow control the max-min share is what
//!   long transfers converge to. What flows miss (queueing of single packets, congestion
//!   control transients) is below the calibrated errors at the sizes rshmem times.
//! * [`schedule`]: the schedule of one call, from the library's own code: the path a GPU call
//!   takes ([`rshmem::cuda::PathRules`]), each one-kernel path's traffic
//!   ([`rshmem::cuda::traffic`], with the waves its kernels move in: a fold's loads in
//!   flight, member after member, a pair's fenced steps; an LL call's grid,
//!   [`rshmem::cuda::PathRules::ll_grid`], and whether it takes its data only after the
//!   header's verdict, [`rshmem::cuda::traffic::ll_late_waits`]), the barrier-based plans
//!   ([`rshmem::coll::plan`]) and the MoE routing layout ([`rshmem::ep::Layout`]), with the
//!   HBM traffic of an expert-major dispatch's expansion and an expert-major combine's sums
//!   as flows beside the link.
//! * [`sim`]: runs a schedule on a topology: phases, per-link bytes and busy time.
//! * [`calibrate`]: fits the model's few parameters to `rshmem perf --json` records and reports
//!   the error on records not used in the fit.
//! * [`functional`]: runs the same calls on the CPU backend with real data, checked, on the
//!   simulated clock.
//! * [`tune`]: picks tuning thresholds for a topology.

pub mod calibrate;
pub mod fluid;
pub mod functional;
pub mod schedule;
pub mod sim;
pub mod topology;
pub mod tune;

pub use schedule::{Op, Program};
pub use sim::{simulate, LinkUse, SimResult};
pub use topology::{Model, Topology};

/// What can go wrong in the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A topology file or a generated topology that cannot be built.
    #[error("topology: {0}")]
    Topology(String),
    /// A file that cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A TOML file that does not parse.
    #[error("{path}: {source}")]
    Toml {
        /// The file.
        path: String,
        /// Why.
        source: toml::de::Error,
    },
    /// A JSON file that does not parse.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A call the simulator cannot time (an operation, size or team it does not model).
    #[error("{0}")]
    Invalid(String),
    /// An error of the rshmem library (routing layout, plans, the CPU backend).
    #[error(transparent)]
    Rshmem(#[from] rshmem::Error),
}

/// Results of the simulator.
pub type Result<T> = std::result::Result<T, SimError>;
