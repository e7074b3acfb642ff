//! Collectives on teams (barrier, broadcast, reductions, all-gather, all-to-all), backend-independent.
//!
//! ```
//! use rshmem::coll::{Coll, CollConfig, ReduceOp};
//! let out = rshmem::Launch::new().threads().run(3, |pe| -> rshmem::Result<Vec<i32>> {
//!     let coll = Coll::new(pe, CollConfig::default())?;     // world collective
//!     let x = pe.alloc::<i32>(4)?;
//!     pe.local_write(&x, 0, &[pe.my_pe() as i32; 4])?;
//!     coll.all_reduce(pe.world_team(), &x, &x, 4, ReduceOp::Sum)?; // in place
//!     pe.local_vec(&x)
//! }).values().unwrap();
//! assert!(out.into_iter().all(|v| v.unwrap() == vec![0 + 1 + 2; 4]));
//! ```
//!
//! # Contract
//! * **Who calls.** Every member of the team calls the same collective with the same arguments
//!   (except the all_to_all_v counts, see there), in the same order as its other collectives on
//!   that team. Collectives on different teams may interleave freely on a PE; threads of a PE
//!   that run collectives at the same time use one [`Coll`] each (a `Coll` is not `Sync`).
//! * **Buffers.** `src` and `dst` are symmetric objects ([`Sym`](crate::Sym) or a
//!   [`SymView`](crate::SymView)), the *same* object (same offset and length) on every member,
//!   as in NVSHMEM. They are read and written on peers while the call runs. Counts and
//!   displacements are in elements. Inputs must be complete when the call starts (local writes,
//!   or remote puts followed by a barrier); outputs are complete on return.
//! * **In place** means `src` and `dst` are the same object. Objects that partially overlap are
//!   an error. The in-place forms: broadcast, reduce, all_reduce read and write `dst[..count]`;
//!   all_gather takes member `i`'s input from `dst[i·count..]`; reduce_scatter leaves member
//!   `i`'s result in `dst[i·count..]` (out of place in `dst[..count]`); all_to_all(v) stage the
//!   received data privately before overwriting.
//! * **Errors.** Before any data moves, the members exchange their arguments through a small
//!   symmetric scratch object: a bad argument on any member (count beyond an object, root
//!   outside the team, a bitwise operation on floats, different arguments on different members,
//!   all_to_all_v counts that do not pair up) is an [`Error`] on *every* member,
//!   with no data moved, never a hang. The member that passed the bad argument gets the precise
//!   error; the others get [`Error::InvalidArgument`] or
//!   [`Error::CollectiveMismatch`] naming it. The CUDA
//!   executor (`cuda::GpuColl`) checks its arguments locally before launching and compares a
//!   signature of every call across members inside its first barrier on the GPU: differing
//!   calls move no data on any member and `GpuColl::check_errors` reports the mismatch.
//! * **Reductions**: see [`ReduceOp`] — team-order fold, integers wrap, `f16`/`bf16` accumulate
//!   in `f32` and round once, every member gets the same bits.
//!
//! # Algorithms and thresholds
//! Algorithms are data ([`plan`]): a planner turns (team size, member, sizes, in place, chunk,
//! [`Algo`]) into a list of steps (sync, copy from a member, reduce over members); the host
//! executor runs them with `get`/`put`/`team_sync`, so they work on every backend, and a GPU
//! executor can run the same plans. Data moves by pull from peers' symmetric objects, so no
//! data scratch is needed. all_reduce and broadcast choose [`Algo::OneShot`] below
//! [`CollConfig::two_shot_bytes`] (default 256 KiB) and [`Algo::TwoShot`] from there up; the
//! others have one algorithm. Copies and reductions are split in chunks of
//! [`CollConfig::chunk_bytes`] (default 256 KiB; a reduction step reads `chunk / n` from each
//! of the n members), which bounds the executor's staging memory to about two chunks;
//! in-place one-shot all_reduce and in-place all_to_all(v) also stage the result privately
//! (count, resp. the received elements). Environment:
//! `RSHMEM_COLL_ALGO=auto|one_shot|two_shot`, `RSHMEM_COLL_TWO_SHOT_BYTES`,
//! `RSHMEM_COLL_CHUNK` (sizes with K/M/G suffixes), `RSHMEM_COLL_HIER=1|0`,
//! `RSHMEM_COLL_HIER_BYTES`.
//!
//! # Across nodes
//! On a team that spans nodes with a node of several members ([`NodeMap`](crate::NodeMap),
//! [`Pe::node_map`](crate::Pe::node_map)), all_reduce, all_gather and broadcast run the
//! hierarchical plans of [`plan::hier`] ([`CollConfig::hierarchical`], default on, from
//! [`CollConfig::hier_bytes`], default 1 MiB, per member vector): inside a
//! node over shared memory, across nodes each local index with the same index on the other
//! nodes, so every element crosses between two nodes once. Their reductions fold inside each
//! node in team order, then over the nodes' results in node order: every member still gets
//! the same bits and integers the flat result, but float sums group their terms by node (and
//! `f16`/`bf16` round once per level). Teams of one node keep the flat plans unchanged.
//!
//! # Scratch
//! [`Coll::new`] allocates, collectively over the world, one symmetric `u64` object of
//! `16 + 2·n_pes` words ([`Coll::scratch_bytes`]; 192 bytes for 4 PEs): a 16-word argument
//! record and the all_to_all_v send counts and displacements. It is sized for the largest
//! team (the world), so it cannot run out; collectives on different teams share it safely
//! because every call synchronises its team before it writes and after its last read.

pub(crate) mod cuda;
mod host;
pub mod plan;
mod reduce;

pub use host::{AllToAllV, Coll};
pub use plan::{Algo, CollKind};
pub use reduce::{Fold, ReduceOp, ToRoot};

use crate::config::env_size;
use crate::error::{Error, Result};

/// Tuning of the collectives: algorithm choice and chunking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollConfig {
    /// Forced algorithm for the collectives that have several (`RSHMEM_COLL_ALGO`); `None`
    /// (`auto`) chooses by size.
    pub algo: Option<Algo>,
    /// Message size in bytes from which all_reduce and broadcast use [`Algo::TwoShot`]
    /// (`RSHMEM_COLL_TWO_SHOT_BYTES`, default 256 KiB).
    pub two_shot_bytes: usize,
    /// Most bytes per copy or reduce step (`RSHMEM_COLL_CHUNK`, default 256 KiB).
    pub chunk_bytes: usize,
    /// On teams that span nodes (with a node of more than one member), all_reduce,
    /// all_gather and broadcast run the hierarchical plans of [`plan::hier`]
    /// (`RSHMEM_COLL_HIER`, default on), from [`hier_bytes`](Self::hier_bytes) up. Alike on
    /// every PE (checked).
    pub hierarchical: bool,
    /// Message size in bytes (per member vector) from which the hierarchical plans run
    /// (`RSHMEM_COLL_HIER_BYTES`, default 1 MiB): they take five (all_reduce) or three team
    /// syncs, which cost more than the bytes they save on small messages.
    pub hier_bytes: usize,
}

impl Default for CollConfig {
    fn default() -> Self {
        CollConfig {
            algo: None,
            two_shot_bytes: 256 << 10,
            chunk_bytes: 256 << 10,
            hierarchical: true,
            hier_bytes: 1 << 20,
        }
    }
}

/// The environment variables the collectives read, with their meaning.
pub const ENV_VARS: &[(&str, &str)] = &[
    (
        "RSHMEM_COLL_ALGO",
        "auto | one_shot | two_shot: algorithm of all_reduce and broadcast, default auto (by size)",
    ),
    (
        "RSHMEM_COLL_TWO_SHOT_BYTES",
        "message bytes from which auto picks two_shot, default 256K",
    ),
    (
        "RSHMEM_COLL_CHUNK",
        "bytes per copy/reduce step of the collectives, default 256K",
    ),
    (
        "RSHMEM_COLL_HIER",
        "1 | 0: hierarchical plans on teams spanning nodes, default 1",
    ),
    (
        "RSHMEM_COLL_HIER_BYTES",
        "message bytes from which the hierarchical plans run, default 1M",
    ),
];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl CollConfig {
    /// Defaults overridden by `RSHMEM_COLL_*`; a malformed value is an error.
    pub fn from_env() -> Result<CollConfig> {
        let mut c = CollConfig::default();
        if let Some(v) = env("RSHMEM_COLL_ALGO") {
            c.algo = match v.trim() {
                "auto" => None,
                "one_shot" | "oneshot" => Some(Algo::OneShot),
                "two_shot" | "twoshot" => Some(Algo::TwoShot),
                _ => {
                    return Err(Error::invalid(format!(
                        "RSHMEM_COLL_ALGO={v:?}: expected auto, one_shot or two_shot"
                    )))
                }
            };
        }
        if let Some(b) = env_size("RSHMEM_COLL_TWO_SHOT_BYTES")? {
            c.two_shot_bytes = b;
        }
        if let Some(b) = env_size("RSHMEM_COLL_CHUNK")? {
            c.chunk_bytes = b;
        }
        if c.chunk_bytes == 0 {
            return Err(Error::invalid("RSHMEM_COLL_CHUNK must be at least 1 byte"));
        }
        if let Some(b) = env_size("RSHMEM_COLL_HIER_BYTES")? {
            c.hier_bytes = b;
        }
        if let Some(v) = env("RSHMEM_COLL_HIER") {
            c.hierarchical = match v.trim() {
                "1" | "on" | "true" => true,
                "0" | "off" | "false" => false,
                _ => {
                    return Err(Error::invalid(format!(
                        "RSHMEM_COLL_HIER={v:?}: expected 1 or 0"
                    )))
                }
            };
        }
        Ok(c)
    }
    /// Forces an algorithm (`None`: by size).
    pub fn algo(mut self, a: Option<Algo>) -> Self {
        self.algo = a;
        self
    }
    /// Sets the two-shot threshold in bytes.
    pub fn two_shot_bytes(mut self, b: usize) -> Self {
        self.two_shot_bytes = b;
        self
    }
    /// Turns the hierarchical plans on teams spanning nodes on or off.
    pub fn hierarchical(mut self, on: bool) -> Self {
        self.hierarchical = on;
        self
    }
    /// Sets the size from which the hierarchical plans run.
    pub fn hier_bytes(mut self, b: usize) -> Self {
        self.hier_bytes = b;
        self
    }
    /// True when a `kind` call moving `bytes` per member vector on a team placed as `nodes`
    /// runs a hierarchical plan (all_reduce, all_gather, broadcast; reduce_scatter when in
    /// place, where the buffer can hold the partials: out of place it runs the flat plan).
    pub fn is_hierarchical(&self, kind: CollKind, bytes: usize, nodes: &crate::NodeMap) -> bool {
        self.hierarchical
            && bytes >= self.hier_bytes
            && nodes.is_hierarchical()
            && matches!(
                kind,
                CollKind::AllReduce
                    | CollKind::AllGather
                    | CollKind::Broadcast
                    | CollKind::ReduceScatter
            )
    }
    /// Sets the chunk size in bytes (at least one element is used).
    pub fn chunk_bytes(mut self, b: usize) -> Self {
        self.chunk_bytes = b;
        self
    }
    /// The algorithm for a `kind` call moving `bytes` bytes per member vector.
    pub fn choose(&self, kind: CollKind, bytes: usize) -> Algo {
        if !kind.has_two_shot() {
            return Algo::OneShot;
        }
        match self.algo {
            Some(a) => a,
            None if bytes >= self.two_shot_bytes => Algo::TwoShot,
            None => Algo::OneShot,
        }
    }
    /// Chunk size in elements of `elem_size` bytes (at least 1).
    pub fn chunk_elems(&self, elem_size: usize) -> usize {
        (self.chunk_bytes / elem_size.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_by_size() {
        let c = CollConfig::default();
        assert_eq!(
            c.choose(CollKind::AllReduce, (256 << 10) - 1),
            Algo::OneShot
        );
        assert_eq!(c.choose(CollKind::AllReduce, 256 << 10), Algo::TwoShot);
        assert_eq!(c.choose(CollKind::Broadcast, 1 << 30), Algo::TwoShot);
        assert_eq!(c.choose(CollKind::AllGather, 1 << 30), Algo::OneShot);
        let forced = c.algo(Some(Algo::OneShot));
        assert_eq!(forced.choose(CollKind::AllReduce, 1 << 30), Algo::OneShot);
        let forced = c.algo(Some(Algo::TwoShot)).two_shot_bytes(0);
        assert_eq!(forced.choose(CollKind::AllReduce, 0), Algo::TwoShot);
        assert_eq!(forced.choose(CollKind::AllToAll, 0), Algo::OneShot);
        assert_eq!(c.chunk_bytes(3).chunk_elems(8), 1);
        assert_eq!(c.chunk_elems(4), 64 << 10);
    }

    #[test]
    fn environment() {
        // The only test of the crate that touches RSHMEM_COLL_* (one variable at a time).
        for (var, v) in [
            ("RSHMEM_COLL_ALGO", "three_shot"),
            ("RSHMEM_COLL_TWO_SHOT_BYTES", "big"),
            ("RSHMEM_COLL_CHUNK", "1.5K"),
            ("RSHMEM_COLL_CHUNK", "0"),
            ("RSHMEM_COLL_HIER", "maybe"),
            ("RSHMEM_COLL_HIER_BYTES", "lots"),
        ] {
            std::env::set_var(var, v);
            let r = CollConfig::from_env();
            std::env::remove_var(var);
            match r {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(var), "{var}={v}: {m}"),
                other => panic!("{var}={v}: {other:?}"),
            }
        }
        std::env::set_var("RSHMEM_COLL_ALGO", "two_shot");
        std::env::set_var("RSHMEM_COLL_CHUNK", "2K");
        std::env::set_var("RSHMEM_COLL_TWO_SHOT_BYTES", "0");
        std::env::set_var("RSHMEM_COLL_HIER", "0");
        let c = CollConfig::from_env();
        for var in [
            "RSHMEM_COLL_ALGO",
            "RSHMEM_COLL_CHUNK",
            "RSHMEM_COLL_TWO_SHOT_BYTES",
            "RSHMEM_COLL_HIER",
        ] {
            std::env::remove_var(var);
        }
        let c = c.unwrap();
        assert_eq!(c.choose(CollKind::AllReduce, 1), Algo::TwoShot);
        assert_eq!(c.chunk_elems(4), 512);
        assert!(!c.hierarchical);
        let nodes = crate::NodeMap::from_nodes(&[0, 0, 1, 1]);
        assert!(!c.is_hierarchical(CollKind::AllReduce, 1 << 30, &nodes));
        let d = CollConfig::default();
        assert!(d.is_hierarchical(CollKind::AllReduce, 1 << 20, &nodes));
        assert!(!d.is_hierarchical(CollKind::AllReduce, (1 << 20) - 1, &nodes));
        assert!(!d.is_hierarchical(CollKind::AllToAll, 1 << 30, &nodes));
        let one = crate::NodeMap::from_nodes(&[0, 0]);
        assert!(!d.is_hierarchical(CollKind::AllReduce, 1 << 30, &one));
        assert!(d
            .hier_bytes(0)
            .is_hierarchical(CollKind::AllGather, 0, &nodes));
    }
}
