//! # rshmem
//!
//! Symmetric-memory communication between processing elements (PEs): threads of one process,
//! processes, or both; CPU memory now, GPUs through the CUDA backend. Every PE allocates the same
//! objects at the same offsets of its symmetric heap, and any PE reads, writes and updates a
//! peer's copy with one-sided operations.
//!
//! ```
//! let sums = rshmem::Launch::new().threads().run(4, |pe| -> rshmem::Result<u64> {
//!     let x = pe.alloc::<u64>(1)?;                       // collective, same offset everywhere
//!     pe.atomic_fetch_add(&x, 0, pe.my_pe() as u64, 0)?; // everyone adds into PE 0's copy
//!     pe.barrier_all()?;
//!     pe.g(&x, 0, 0)
//! }).values().unwrap();
//! assert!(sums.into_iter().all(|s| s.unwrap() == 0 + 1 + 2 + 3));
//! ```
//!
//! Errors are [`Error`]; nothing a caller passes or a peer does makes the library panic or hang:
//! waits and barriers end in [`Error::Timeout`] or [`Error::PeerLost`].
#![warn(missing_docs)]

mod backend;
pub mod bootstrap;
pub mod coll;
pub mod config;
mod control;
pub mod cuda;
mod device;
pub mod elem;
pub mod ep;
mod error;
pub mod heap;
mod launch;
pub mod launcher;
#[cfg(all(test, loom))]
mod models;
pub mod nbi;
mod pe;
pub mod segment;
mod sym;
mod sync;
mod team;
pub mod transport;
mod world;

pub use bootstrap::{unique_id, Bootstrap, InProcBootstrap, Locality, TcpBootstrap};
pub use config::{BackendKind, Config, HeapKind};
pub use elem::{AtomicElem, Cmp, Elem, ElemKind, SignalOp};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use launch::{init, launch, launched, Launch, Outcome, Outcomes};
pub use nbi::{Completion, OpHandle, OpId, OpKind};
pub use pe::{Free, Pe};
pub use sym::{AsSym, RawSym, Signal, Sym, SymView};
pub use team::{NetTraffic, NodeMap, Team};
pub use world::{Mode, Placement, PROTOCOL_VERSION};

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
