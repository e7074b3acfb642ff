//! Every misuse returns the crate's error, on every PE that must know, and leaves the world
//! usable: PE out of range, ranges outside the object (overflow included), heap exhausted,
//! bad alignments and misaligned views, wait timeouts, mismatched collectives, handles of
//! another PE, handles of an ended world (bad configurations: `config_env.rs`). By subject:
//! ranges, views, heap and alignment (`memory`), wait timeouts and mismatched collectives
//! (`waits`), two threads of one PE in calls that must not overlap (`overlap`), and what needs
//! thread mode: handles of another PE or world, configurations, queue bounds (`handles`).

#[path = "../harness/mod.rs"]
mod harness;

#[path = "../common/mod.rs"]
mod common;

mod handles;
mod memory;
mod overlap;
mod waits;

use common::{all_ok, check_eq, expect_err, poison};
use harness::rand_vec;
use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{Cmp, Config, Error, InProcBootstrap, Pe, Result, Signal, Sym, Team};
use std::sync::Mutex;
use std::time::Duration;
