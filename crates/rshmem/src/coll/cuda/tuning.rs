//! Tuning of the GPU collectives: [`CollTuning`], one typed value with the measured defaults,
//! read from the environment once ([`CollTuning::from_env`]) and handed to
//! [`super::GpuColl::new`]. docs/tuning.md lists the variables.

use super::ll::{
    default_ll_sizes, LlSizes, LL_A2A_MAX_BLOCKS, LL_CTRL_LINES, LL_KERNEL_MAX_BLOCKS,
    LL_LINES_PER_THREAD, LL_MAX_BLOCKS, LL_THREADS, LL_THREAD_LINES, PULL_AR_BLOCK_BYTES,
    PULL_BLOCK_BYTES, PULL_MAX_BLOCKS,
};
use crate::backend::cuda::knobs::{knob_from_env, nvrtc_options};
use crate::error::{Error, Result};

/// Default of [`CollTuning::net_chunk_bytes`].
pub const COLL_NET_CHUNK_BYTES: usize = 512 << 10;
/// Default of [`CollTuning::fused_bytes`].
pub const COLL_FUSED_BYTES: usize = 64 << 10;

/// Default [`CollTuning::pull_all_reduce`] for teams of three or more members: a member
/// reads every other member's whole input, `members / 2` times the link traffic of two-shot,
/// so the pull path stops where its saved launches stop paying (8 MiB: not measured on more
/// than 2 GPUs).
pub const COLL_PULL_ALL_REDUCE_BYTES: usize = 8 << 20;

/// Default [`CollTuning::pull_all_reduce`] for two-member teams: every size. A pair's pull
/// moves as many bytes over the link as two-shot, in one kernel instead of five launches.
pub const COLL_PULL_ALL_REDUCE_PAIR_BYTES: usize = usize::MAX;

/// Default [`CollTuning::two_shot_pull`] for teams of three or more members: every pull
/// size (1), so past the LL size.
pub const COLL_TWO_SHOT_PULL_BYTES: usize = 1;

/// Default [`CollTuning::two_shot_pull`] for two-member teams: never (0); a pair's one-shot
/// pull reads as many bytes over the link as two-shot.
pub const COLL_TWO_SHOT_PULL_PAIR_BYTES: usize = 0;

/// Default [`CollTuning::pull_reduce_scatter`]: 8 MiB. Past it the barrier-based plan's
/// reduce kernel, on every SM, reads the parts faster than the pull kernel's 128 blocks
/// (BENCHMARKS.md).
pub const COLL_PULL_RS_BYTES: usize = 8 << 20;

/// Default [`CollTuning::push_all_reduce`]: 256 MiB. From there pushes on 64 blocks beat
/// loads; below it they lose, and on 128 blocks they gain nothing at any size (BENCHMARKS.md).
pub const COLL_PUSH_ALL_REDUCE_BYTES: usize = 256 << 20;

/// Default [`CollTuning::pull_broadcast`]: every size (past
/// [`CollTuning::chain_broadcast`] on teams of more than two, along a chain).
pub const COLL_PULL_BCAST_BYTES: usize = usize::MAX;

/// Default [`CollTuning::chain_broadcast`]. Up to it everyone reading the root is faster
/// than the chain (a hop of latency per member); past it the chain wins, more so as sizes
/// grow (the root's links carry one copy instead of one per reader).
pub const COLL_CHAIN_BCAST_BYTES: usize = 1 << 20;

/// Default [`CollTuning::pull_all_to_all`]: every size (by stores on 128 blocks it beats the
/// barrier-based plan up to the largest sizes; BENCHMARKS.md).
pub const COLL_PULL_A2A_BYTES: usize = usize::MAX;

/// Default [`CollTuning::push_all_to_all`]: every pull size (stores beat loads from small
/// sizes to the largest; BENCHMARKS.md).
pub const COLL_PUSH_A2A_BYTES: usize = 1;

/// A size threshold of the GPU collectives for two-member teams and for larger ones: the
/// paths' costs grow with the team differently (a pair's one link against `n - 1` links).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerTeam {
    /// Teams of two members.
    pub pair: usize,
    /// Teams of three or more.
    pub larger: usize,
}

impl PerTeam {
    /// The same value for every team size.
    pub fn all(bytes: usize) -> PerTeam {
        PerTeam {
            pair: bytes,
            larger: bytes,
        }
    }

    /// The value for a team of `members`.
    pub fn of(&self, members: usize) -> usize {
        if members == 2 {
            self.pair
        } else {
            self.larger
        }
    }

    /// Whether `bytes` is at or past this threshold for a team of `members` (0: never).
    pub(super) fn reached(&self, members: usize, bytes: usize) -> bool {
        let t = self.of(members);
        t > 0 && bytes >= t
    }

    /// From `name` (one value for every team size) or `default`.
    fn from_env(name: &str, default: PerTeam) -> Result<PerTeam> {
        Ok(crate::config::env_size(name)?.map_or(default, PerTeam::all))
    }
}

/// How the GPU collectives choose their paths and size their kernels. Every PE of a job must
/// use the same values: a call that runs another way on one member is reported as a
/// [`crate::Error::CollectiveMismatch`]. `Default` holds the measured defaults (each field's
/// constant says why it is what it is); [`CollTuning::from_env`] reads the
/// `RSHMEM_CUDA_COLL_*` variables once. Sizes are bytes; 0 turns a path off where noted.
///
/// ```
/// use rshmem::cuda::{CollTuning, PerTeam};
/// let t = CollTuning {
///     two_shot_pull: PerTeam::all(0), // never the two-shot pull
///     ..CollTuning::default()
/// };
/// assert!(t.check().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollTuning {
    /// Largest all_reduce (on a pair; larger teams take `2 / members` of it) and broadcast of
    /// the LL paths; `None`: the default ([`CollTuning::ll_sizes`]).
    pub ll_all_reduce: Option<usize>,
    /// Largest all_to_all, all_gather and reduce_scatter traffic (every pair's share
    /// together) of the LL paths; `None`: twice `ll_all_reduce` when that is set, else the
    /// default.
    pub ll_all_to_all: Option<usize>,
    /// Most blocks of the LL all_reduce kernel (1 to 128).
    pub ll_blocks: u32,
    /// Most blocks of the LL data kernel (1 to 64; an all_to_all may spread over twice as many).
    pub ll_a2a_blocks: u32,
    /// Data lines per LL all_reduce thread the grid is sized for (1 to 4).
    pub ll_thread_lines: usize,
    /// Threads per block of the LL kernels (a multiple of 32 up to what every LL kernel
    /// launches with).
    pub ll_threads: u32,
    /// Lets the LL kernels start the next kernel on their stream early where a PE has its GPU
    /// to itself.
    pub early_launch: bool,
    /// Most lines of an LL all_reduce call run with a control warp per block (0: never).
    pub ll_ctrl_lines: usize,
    /// Most blocks of the pull kernels (1 to 128).
    pub pull_blocks: u32,
    /// Bytes per block of the pull all_to_all and broadcast.
    pub pull_block_bytes: usize,
    /// Bytes per block of the pull all_reduce (the two-shot takes half).
    pub pull_all_reduce_block_bytes: usize,
    /// Largest one-shot all_reduce of the pull path (0: off): an out-of-place all_reduce past
    /// the LL size of whole 16-byte vectors runs one-shot as one kernel that meets its peers
    /// through the LL headers and folds their inputs read in place (no barrier launches), on
    /// a team the LL paths serve, unless an algorithm other than one-shot is forced.
    pub pull_all_reduce: PerTeam,
    /// Smallest all_reduce that runs the pull way two-shot (0: never): no algorithm forced,
    /// after the pull handshake each member folds one `1/members` part of the vectors from
    /// every member's `src` and stores it into every member's `dst`, then a done line per
    /// block after a system-scope fence. Each member moves `(members - 1) / members` of the
    /// message over its links each way, where the one-shot pull reads `members - 1` times the
    /// message. Takes precedence over the one-shot pull and its limit.
    pub two_shot_pull: PerTeam,
    /// Smallest pull all_reduce of a pair that moves its data by stores (0: never): each
    /// member stores its input into the other's `dst` in steps, publishing a count per step
    /// after a system-scope fence, and folds the other's steps as they arrive. Both GPUs
    /// storing at once move more than both loading at once, but the fence per step costs more
    /// than that gains below about 256 MiB.
    pub push_all_reduce: usize,
    /// Largest all_to_all input or all_gather output (every pair's share together) of the
    /// pull path (0: off): an out-of-place call beyond the LL size whose shares are whole
    /// 16-byte vectors runs as one kernel that moves every share straight between the
    /// members' buffers after an LL handshake (no barrier waits).
    pub pull_all_to_all: usize,
    /// Smallest pull all_to_all or all_gather whose members store their shares into the
    /// others' `dst` instead of reading the others' `src` (0: never; a system-scope fence
    /// before each block's done line).
    pub push_all_to_all: usize,
    /// Largest broadcast of the pull path (0: off): past the LL size, whole 16-byte vectors,
    /// one kernel in which every member reads the root's `src` in place, or along a chain
    /// (`chain_broadcast`).
    pub pull_broadcast: PerTeam,
    /// Pull broadcasts past this size on teams of more than two run along a chain (the member
    /// at distance p from the root reads from the one at p - 1, in steps), so each link
    /// carries the message once; up to it every member reads the root's `src` (fewer hops of
    /// latency, the root's links carrying `members - 1` copies).
    pub chain_broadcast: usize,
    /// Largest reduce_scatter input (every member's part together) of the pull path (0: off):
    /// out of place, past the LL size, whole 16-byte parts; every member folds its part of
    /// the members' inputs, read in place, after the pull handshake.
    pub pull_reduce_scatter: usize,
    /// Bytes read per PE up to which a one-phase plan (one-shot all_reduce, reduce,
    /// reduce_scatter, all_gather, all_to_all, one-shot broadcast, out of place) runs as one
    /// kernel of one block with both barriers inside (0: never).
    pub fused_bytes: usize,
    /// Bytes a member moves to another node per round of a collective on a team spanning
    /// nodes, and of each of the two scratch halves per PE and node that reductions receive
    /// the other nodes' partials into (`2 × nodes ×` this of the symmetric heap, allocated by
    /// [`super::GpuColl::new`] in a world spanning nodes); a multiple of 16 from 16 bytes to
    /// 1 GiB.
    pub net_chunk_bytes: usize,
    /// Extra NVRTC options of the collectives' module: the compile-time switches of
    /// `kernels/`, for measurements. The switches in [`WRONG_RESULT_SWITCHES`] break the
    /// kernels on purpose, for rshmem's own tests; [`CollTuning::from_env`] refuses them.
    pub nvrtc_options: Vec<String>,
}

impl Default for CollTuning {
    fn default() -> Self {
        CollTuning {
            ll_all_reduce: None,
            ll_all_to_all: None,
            ll_blocks: LL_MAX_BLOCKS,
            ll_a2a_blocks: LL_A2A_MAX_BLOCKS,
            ll_thread_lines: LL_THREAD_LINES,
            ll_threads: LL_THREADS,
            early_launch: true,
            ll_ctrl_lines: LL_CTRL_LINES,
            pull_blocks: PULL_MAX_BLOCKS,
            pull_block_bytes: PULL_BLOCK_BYTES,
            pull_all_reduce_block_bytes: PULL_AR_BLOCK_BYTES,
            pull_all_reduce: PerTeam {
                pair: COLL_PULL_ALL_REDUCE_PAIR_BYTES,
                larger: COLL_PULL_ALL_REDUCE_BYTES,
            },
            two_shot_pull: PerTeam {
                pair: COLL_TWO_SHOT_PULL_PAIR_BYTES,
                larger: COLL_TWO_SHOT_PULL_BYTES,
            },
            push_all_reduce: COLL_PUSH_ALL_REDUCE_BYTES,
            pull_all_to_all: COLL_PULL_A2A_BYTES,
            push_all_to_all: COLL_PUSH_A2A_BYTES,
            pull_broadcast: PerTeam::all(COLL_PULL_BCAST_BYTES),
            chain_broadcast: COLL_CHAIN_BCAST_BYTES,
            pull_reduce_scatter: COLL_PULL_RS_BYTES,
            fused_bytes: COLL_FUSED_BYTES,
            net_chunk_bytes: COLL_NET_CHUNK_BYTES,
            nvrtc_options: Vec::new(),
        }
    }
}

impl CollTuning {
    /// The defaults with every `RSHMEM_CUDA_COLL_*` variable that is set applied (sizes with
    /// K/M/G suffixes; docs/tuning.md), checked ([`CollTuning::check`]). An unparsable or
    /// out-of-range value is an error naming the variable.
    pub fn from_env() -> Result<CollTuning> {
        let d = CollTuning::default();
        let size = |name: &str, default: usize| -> Result<usize> {
            Ok(crate::config::env_size(name)?.unwrap_or(default))
        };
        let t = CollTuning {
            ll_all_reduce: crate::config::env_size("RSHMEM_CUDA_COLL_LL_BYTES")?,
            ll_all_to_all: crate::config::env_size("RSHMEM_CUDA_COLL_LL_A2A_BYTES")?,
            ll_blocks: blocks_from_env(
                "RSHMEM_CUDA_COLL_LL_BLOCKS",
                d.ll_blocks,
                LL_KERNEL_MAX_BLOCKS,
            )?,
            ll_a2a_blocks: blocks_from_env(
                "RSHMEM_CUDA_COLL_LL_A2A_BLOCKS",
                d.ll_a2a_blocks,
                LL_KERNEL_MAX_BLOCKS / 2,
            )?,
            ll_thread_lines: knob_from_env(
                "RSHMEM_CUDA_COLL_LL_THREAD_LINES",
                d.ll_thread_lines,
                |v| (1..=LL_LINES_PER_THREAD).contains(&v),
                &format!("1 to {LL_LINES_PER_THREAD} lines"),
            )?,
            ll_threads: knob_from_env(
                "RSHMEM_CUDA_COLL_LL_THREADS",
                d.ll_threads as usize,
                |v| (32..=1024).contains(&v) && v.is_multiple_of(32),
                "a multiple of 32 from 32 to 1024",
            )? as u32,
            early_launch: knob_from_env("RSHMEM_CUDA_COLL_EARLY_LAUNCH", 1, |v| v <= 1, "0 or 1")?
                == 1,
            ll_ctrl_lines: knob_from_env(
                "RSHMEM_CUDA_COLL_LL_CTRL_LINES",
                d.ll_ctrl_lines,
                |v| v <= 1 << 20,
                "0 to 1M lines",
            )?,
            pull_blocks: blocks_from_env(
                "RSHMEM_CUDA_COLL_PULL_BLOCKS",
                d.pull_blocks,
                LL_KERNEL_MAX_BLOCKS,
            )?,
            pull_block_bytes: block_bytes_from_env(
                "RSHMEM_CUDA_COLL_PULL_BLOCK_BYTES",
                d.pull_block_bytes,
            )?,
            pull_all_reduce_block_bytes: block_bytes_from_env(
                "RSHMEM_CUDA_COLL_PULL_AR_BLOCK_BYTES",
                d.pull_all_reduce_block_bytes,
            )?,
            pull_all_reduce: PerTeam::from_env(
                "RSHMEM_CUDA_COLL_PULL_ALL_REDUCE_BYTES",
                d.pull_all_reduce,
            )?,
            two_shot_pull: PerTeam::from_env(
                "RSHMEM_CUDA_COLL_TWO_SHOT_PULL_BYTES",
                d.two_shot_pull,
            )?,
            push_all_reduce: size("RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES", d.push_all_reduce)?,
            pull_all_to_all: size("RSHMEM_CUDA_COLL_PULL_A2A_BYTES", d.pull_all_to_all)?,
            push_all_to_all: size("RSHMEM_CUDA_COLL_PUSH_A2A_BYTES", d.push_all_to_all)?,
            pull_broadcast: PerTeam::from_env(
                "RSHMEM_CUDA_COLL_PULL_BCAST_BYTES",
                d.pull_broadcast,
            )?,
            chain_broadcast: size("RSHMEM_CUDA_COLL_CHAIN_BCAST_BYTES", d.chain_broadcast)?,
            pull_reduce_scatter: size("RSHMEM_CUDA_COLL_PULL_RS_BYTES", d.pull_reduce_scatter)?,
            fused_bytes: size("RSHMEM_CUDA_COLL_FUSED_BYTES", d.fused_bytes)?,
            net_chunk_bytes: size("RSHMEM_CUDA_COLL_NET_CHUNK_BYTES", d.net_chunk_bytes)?,
            nvrtc_options: nvrtc_options_value(
                "RSHMEM_CUDA_COLL_NVRTC_OPTS",
                &std::env::var("RSHMEM_CUDA_COLL_NVRTC_OPTS").unwrap_or_default(),
            )?,
        };
        t.check()?;
        Ok(t)
    }

    /// The LL paths' sizes for a heap of `heap` bytes per PE and `n_pes` PEs: the defaults
    /// ([`default_ll_sizes`]) where neither size is set; an all_reduce size alone makes the
    /// all_to_all size twice it (no area beyond the all_reduce's).
    pub fn ll_sizes(&self, heap: usize, n_pes: usize) -> LlSizes {
        match (self.ll_all_reduce, self.ll_all_to_all) {
            (None, None) => default_ll_sizes(heap, n_pes),
            (Some(r), None) => LlSizes {
                all_reduce: r,
                all_to_all: 2 * r,
            },
            (r, Some(t)) => LlSizes {
                all_reduce: r.unwrap_or(default_ll_sizes(heap, n_pes).all_reduce),
                all_to_all: t,
            },
        }
    }

    /// These values with the LL paths' sizes given (0: off).
    pub fn with_ll(self, sizes: LlSizes) -> CollTuning {
        CollTuning {
            ll_all_reduce: Some(sizes.all_reduce),
            ll_all_to_all: Some(sizes.all_to_all),
            ..self
        }
    }

    /// Whether the grid values are ones the kernels run with (a value whose use depends on
    /// the GPU, the LL threads, is checked again against the compiled kernels by
    /// [`super::GpuColl::new`]).
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid(format!("CollTuning: {what}")));
        if !(1..=LL_KERNEL_MAX_BLOCKS).contains(&self.ll_blocks) {
            return bad(format!(
                "ll_blocks {} is not 1 to {LL_KERNEL_MAX_BLOCKS}",
                self.ll_blocks
            ));
        }
        if !(1..=LL_KERNEL_MAX_BLOCKS / 2).contains(&self.ll_a2a_blocks) {
            return bad(format!(
                "ll_a2a_blocks {} is not 1 to {}",
                self.ll_a2a_blocks,
                LL_KERNEL_MAX_BLOCKS / 2
            ));
        }
        if !(1..=LL_KERNEL_MAX_BLOCKS).contains(&self.pull_blocks) {
            return bad(format!(
                "pull_blocks {} is not 1 to {LL_KERNEL_MAX_BLOCKS}",
                self.pull_blocks
            ));
        }
        if !(1..=LL_LINES_PER_THREAD).contains(&self.ll_thread_lines) {
            return bad(format!(
                "ll_thread_lines {} is not 1 to {LL_LINES_PER_THREAD}",
                self.ll_thread_lines
            ));
        }
        if !(32..=1024).contains(&self.ll_threads) || !self.ll_threads.is_multiple_of(32) {
            return bad(format!(
                "ll_threads {} is not a multiple of 32 from 32 to 1024",
                self.ll_threads
            ));
        }
        for (name, v) in [
            ("pull_block_bytes", self.pull_block_bytes),
            (
                "pull_all_reduce_block_bytes",
                self.pull_all_reduce_block_bytes,
            ),
        ] {
            if !(16..=1 << 30).contains(&v) {
                return bad(format!("{name} {v} is not 16 bytes to 1G"));
            }
        }
        let v = self.net_chunk_bytes;
        if !(16..=1 << 30).contains(&v) || !v.is_multiple_of(16) {
            return bad(format!(
                "net_chunk_bytes {v} is not a multiple of 16 from 16 bytes to 1G"
            ));
        }
        Ok(())
    }
}

/// Most blocks of a kernel that waits for peers, from `name`, 1 to `max`, else `default`.
fn blocks_from_env(name: &str, default: u32, max: u32) -> Result<u32> {
    let ok = |v| (1..=max as usize).contains(&v);
    Ok(knob_from_env(name, default as usize, ok, &format!("1 to {max} blocks"))? as u32)
}

/// A pull kernel's bytes per block from `name`, 16 bytes to 1 GiB, else `default`.
fn block_bytes_from_env(name: &str, default: usize) -> Result<usize> {
    knob_from_env(
        name,
        default,
        |v| (16..=1 << 30).contains(&v),
        "16 bytes to 1G",
    )
}

/// Compile-time switches of the collectives' kernels that give wrong results on purpose
/// (measurements of what a fence or a check costs, and the tests that show what they guard):
/// never from an environment variable.
pub const WRONG_RESULT_SWITCHES: &[&str] = &[
    "RSHMEMI_LL_NOP",
    "RSHMEMI_LL_STOP",
    "RSHMEMI_LL_SKIP_VERDICT",
    "RSHMEMI_LL_FLAG_15",
    "RSHMEMI_CHAIN_FENCE",
    "RSHMEMI_PULL_FENCES",
];

fn nvrtc_options_value(name: &str, v: &str) -> Result<Vec<String>> {
    nvrtc_options(name, v, WRONG_RESULT_SWITCHES)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A knob's value `got` for the setting `v` of variable `var`: `want`, or an error naming
    /// the variable where `want` is None.
    fn expect_knob(got: Result<usize>, want: Option<usize>, var: &str, v: &str) {
        match (got, want) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "{v}"),
            (Err(Error::InvalidArgument(m)), None) => assert!(m.contains(var), "{v}: {m}"),
            (other, want) => panic!("{v}: {other:?}, want {want:?}"),
        }
    }

    #[test]
    fn measurement_knobs_are_checked() {
        // A variable of this test alone (no other test reads it).
        const V: &str = "TEST_RSHMEMI_COLL_KNOB";
        std::env::remove_var(V);
        let lines = |v: usize| (1..=LL_LINES_PER_THREAD).contains(&v);
        let threads = |v: usize| (32..=1024).contains(&v) && v.is_multiple_of(32);
        assert_eq!(knob_from_env(V, LL_THREAD_LINES, lines, "x").unwrap(), 1);
        assert_eq!(knob_from_env(V, 256, threads, "x").unwrap(), 256);
        for (v, l, t) in [
            ("1", Some(1), None),
            ("4", Some(4), None),
            ("5", None, None),
            ("0", None, None),
            ("64", None, Some(64)),
            ("1024", None, Some(1024)),
            ("1K", None, Some(1024)),
            ("100", None, None),
            ("2048", None, None),
            ("many", None, None),
        ] {
            std::env::set_var(V, v);
            let (a, b) = (
                knob_from_env(V, 1, lines, "lines"),
                knob_from_env(V, 256, threads, "threads"),
            );
            std::env::remove_var(V);
            expect_knob(a, l, V, v);
            expect_knob(b, t, V, v);
        }
    }

    #[test]
    fn block_knobs_are_checked() {
        // A variable of this test alone (no other test reads it).
        const V: &str = "TEST_RSHMEMI_COLL_BLOCK_KNOB";
        std::env::remove_var(V);
        assert_eq!(block_bytes_from_env(V, PULL_BLOCK_BYTES).unwrap(), 64 << 10);
        assert_eq!(blocks_from_env(V, PULL_MAX_BLOCKS, 128).unwrap(), 128);
        for (v, bytes, blocks) in [
            ("8K", Some(8 << 10), None),
            ("16", Some(16), Some(16)),
            ("1024", Some(1024), None),
            ("128", Some(128), Some(128)),
            ("8", None, Some(8)),
            ("0", None, None),
            ("2G", None, None),
            ("lots", None, None),
        ] {
            std::env::set_var(V, v);
            let (a, b) = (block_bytes_from_env(V, 1), blocks_from_env(V, 1, 128));
            std::env::remove_var(V);
            expect_knob(a, bytes, V, &format!("bytes {v}"));
            expect_knob(b.map(|b| b as usize), blocks, V, &format!("blocks {v}"));
        }
    }

    #[test]
    fn tuning_values_are_checked() {
        assert!(CollTuning::default().check().is_ok());
        for bad in [
            CollTuning {
                ll_blocks: 0,
                ..CollTuning::default()
            },
            CollTuning {
                ll_blocks: 129,
                ..CollTuning::default()
            },
            CollTuning {
                ll_a2a_blocks: 65,
                ..CollTuning::default()
            },
            CollTuning {
                pull_blocks: 0,
                ..CollTuning::default()
            },
            CollTuning {
                ll_thread_lines: 5,
                ..CollTuning::default()
            },
            CollTuning {
                ll_threads: 100,
                ..CollTuning::default()
            },
            CollTuning {
                ll_threads: 2048,
                ..CollTuning::default()
            },
            CollTuning {
                pull_block_bytes: 8,
                ..CollTuning::default()
            },
            CollTuning {
                pull_all_reduce_block_bytes: 2 << 30,
                ..CollTuning::default()
            },
        ] {
            match bad.check() {
                Err(Error::InvalidArgument(m)) => assert!(m.starts_with("CollTuning: "), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn ll_sizes_follow_what_is_set() {
        let heap = 2usize << 30;
        let d = default_ll_sizes(heap, 2);
        let t = CollTuning::default();
        assert_eq!(t.ll_sizes(heap, 2), d);
        let only_ar = CollTuning {
            ll_all_reduce: Some(64 << 10),
            ..t.clone()
        };
        assert_eq!(
            only_ar.ll_sizes(heap, 2),
            LlSizes {
                all_reduce: 64 << 10,
                all_to_all: 128 << 10
            }
        );
        let only_a2a = CollTuning {
            ll_all_to_all: Some(0),
            ..t.clone()
        };
        assert_eq!(
            only_a2a.ll_sizes(heap, 2),
            LlSizes {
                all_reduce: d.all_reduce,
                all_to_all: 0
            }
        );
        let z = LlSizes {
            all_reduce: 0,
            all_to_all: 0,
        };
        assert_eq!(t.with_ll(z).ll_sizes(heap, 2), z);
    }

    #[test]
    fn per_team_thresholds() {
        let p = PerTeam {
            pair: 0,
            larger: 1 << 20,
        };
        assert_eq!((p.of(2), p.of(3), p.of(16)), (0, 1 << 20, 1 << 20));
        assert!(!p.reached(2, usize::MAX), "0 is never");
        assert!(!p.reached(4, (1 << 20) - 1));
        assert!(p.reached(4, 1 << 20));
        assert_eq!(PerTeam::all(5), PerTeam { pair: 5, larger: 5 });
    }

    #[test]
    fn wrong_result_switches_stay_out_of_the_environment() {
        let ok = nvrtc_options_value("V", "-DRSHMEMI_LL_U=2 -DRSHMEMI_PULL_PAIR_LOADS=0").unwrap();
        assert_eq!(ok, ["-DRSHMEMI_LL_U=2", "-DRSHMEMI_PULL_PAIR_LOADS=0"]);
        for bad in [
            "-DRSHMEMI_PULL_FENCES=0",
            "-DRSHMEMI_LL_U=2 -DRSHMEMI_LL_NOP",
        ] {
            match nvrtc_options_value("V", bad) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("wrong results"), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
