//! What each one-kernel GPU path moves, as data: who sends how many bytes to whom, by which
//! means, and the handshakes around the data. The kernels of `kernels/` (`all_reduce.cu`,
//! `move.cu`) move exactly these bytes; the simulator (`crates/rshmem-sim`) reads this
//! description to time them, so a change to a kernel's traffic belongs here too. The
//! barrier-based plans need no such description: they are data already ([`crate::coll::plan`]).

use super::choice::LlGrid;
use super::ll::LL_THREADS;
use super::paths::CollPath;
use crate::coll::plan::CollKind;

/// How a path's bytes cross from one member to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mover {
    /// LL lines stored by the sender: 8 data bytes and a flag in every 16-byte line, so the
    /// wire carries twice the data.
    LlStore,
    /// Loads by the receiver's SMs from the sender's buffer, read in place.
    Load,
    /// Stores by the sender's SMs into the receiver's buffer.
    Store,
}

/// One transfer of a path: `bytes` from member `from` to member `to` (team indices; equal
/// for a member's copy of its own share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Member whose data it is.
    pub from: usize,
    /// Member whose buffer receives it.
    pub to: usize,
    /// Bytes of data (LL lines carry twice as many on the wire).
    pub bytes: usize,
    /// How they move.
    pub mover: Mover,
}

/// A one-kernel path's traffic for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathTraffic {
    /// One-way flag exchanges every member waits for before data moves (the pull handshake
    /// through the LL headers: 1; the LL paths carry their header with the data: 0).
    pub handshakes: usize,
    /// The transfers in rounds: those of a round are in flight together (the kernel's blocks
    /// run them side by side), a round starts when the one before has ended.
    pub rounds: Vec<Vec<Move>>,
    /// Bytes each member reads locally to fold (reductions: every input of its part).
    pub fold_bytes: usize,
    /// System-scope fences each followed by a flag a peer waits for, after the data: the pull
    /// paths' done lines (1), a push pair's steps, a chain's hops.
    pub fences: usize,
    /// The transfers in waves: the grid moves this many bytes to or from a member and waits for
    /// them before its next ones (0: they stream). A fold's thread keeps a few vectors per
    /// member in flight ([`PULL_FOLD_THREAD_BYTES`]) and folds them before loading more; a
    /// pair's pull all_reduce by stores fences every step ([`push_step_vecs`]) before the
    /// next.
    pub wave: usize,
    /// A wave reads its members one after the other, in team order, the member's own input
    /// among them (`rshmemi_pull_fold`); else all of them at once (a pair's
    /// `rshmemi_pair_fold`).
    pub ordered: bool,
}

/// Bytes one thread of a pull fold (`rshmemi_pull_fold`, `rshmemi_pair_fold` of
/// `kernels/all_reduce.cu`) has in flight from each member: `U` = 8 16-byte vectors of a 32-bit
/// type (fewer for narrower ones).
pub const PULL_FOLD_THREAD_BYTES: usize = 128;

/// Steps of one block of a pair's pull all_reduce by stores, each published by a fence and a
/// count: a sixteenth of the block's vectors, 4096 to 16384 vectors a step
/// (`RSHMEMI_PUSH_MIN_VECS`, `RSHMEMI_PUSH_MAX_VECS` of `kernels/all_reduce.cu`).
pub fn push_steps(bytes: usize, blocks: u32) -> usize {
    let vecs = bytes.div_ceil(16).div_ceil(blocks.max(1) as usize);
    vecs.div_ceil(push_step_vecs(bytes, blocks)).max(1)
}

/// 16-byte vectors of one step of one block of a pair's pull all_reduce by stores
/// ([`push_steps`]).
pub fn push_step_vecs(bytes: usize, blocks: u32) -> usize {
    let vecs = bytes.div_ceil(16).div_ceil(blocks.max(1) as usize);
    (vecs / 16).clamp(4096, 16384)
}

/// Dependent waits an LL call spends after its header's verdict before its data is in: 0 where
/// the kernel polls its first data lines beside the verdict, 1 where it polls them only once
/// the verdicts are in (a block barrier and one more load round trip of its own LL area on the
/// call's critical path). The LL all_reduce kernel (`rshmemi_ll_all_reduce` of
/// `kernels/all_reduce.cu`, also the reduce_scatter's) folds its first lines beside the
/// verdict in a call of one block or with a control warp ([`LlGrid::ctrl`]), except that a
/// call of one block whose last warp (the verdict warp) has lines of its own loads them after
/// it; on more blocks without a control warp it folds after them. The data kernels
/// (`rshmemi_ll_move` of `kernels/move.cu`) always take their lines after the verdicts.
pub fn ll_late_waits(kind: CollKind, grid: &LlGrid, threads: u32) -> usize {
    match kind {
        CollKind::AllReduce | CollKind::ReduceScatter => {
            let verdict_warp_has_lines = grid.lines + 32 > threads as usize;
            usize::from(!(grid.ctrl || (grid.blocks == 1 && !verdict_warp_has_lines)))
        }
        _ => 1,
    }
}

/// Steps of one block of a chain broadcast: an eighth of its part (`kernels/move.cu`).
pub const CHAIN_STEPS: usize = 8;

/// The traffic of `kind` on `path` for a team of `n` members and nccl-tests' size `bytes`
/// (the all_gather output, the reduce_scatter input, the all_to_all buffer, the message
/// otherwise; broadcast from member `root`) on a grid of `blocks`
/// ([`super::PathRules::pull_blocks`]); `None` for the plans and for a kind the path does not
/// serve.
pub fn path_traffic(
    path: CollPath,
    kind: CollKind,
    n: usize,
    bytes: usize,
    root: usize,
    blocks: u32,
) -> Option<PathTraffic> {
    let n = n.max(1);
    let part = bytes / n;
    let pairs = |per: usize, mover: Mover, local: bool| -> Vec<Move> {
        let mut v = Vec::with_capacity(n * n);
        for from in 0..n {
            for to in 0..n {
                if from != to || local {
                    v.push(Move {
                        from,
                        to,
                        bytes: per,
                        mover: if from == to { Mover::Load } else { mover },
                    });
                }
            }
        }
        v
    };
    let from_root = |mover: Mover| -> Vec<Move> {
        (0..n)
            .filter(|&to| to != root)
            .map(|to| Move {
                from: root,
                to,
                bytes,
                mover,
            })
            .collect()
    };
    let t = |handshakes, moves, fold_bytes, fences| {
        Some(PathTraffic {
            handshakes,
            rounds: vec![moves],
            fold_bytes,
            fences,
            wave: 0,
            ordered: false,
        })
    };
    // The pull folds' threads: one per vector of a wave, over the whole grid.
    let fold = |mut x: PathTraffic, ordered: bool| {
        x.wave = blocks.max(1) as usize * LL_THREADS as usize * PULL_FOLD_THREAD_BYTES;
        x.ordered = ordered;
        Some(x)
    };
    match (path, kind) {
        (CollPath::Ll, CollKind::AllReduce) => {
            t(0, pairs(bytes, Mover::LlStore, false), n * bytes, 0)
        }
        (CollPath::Ll, CollKind::AllToAll | CollKind::AllGather) => {
            t(0, pairs(part, Mover::LlStore, true), 0, 0)
        }
        (CollPath::Ll, CollKind::ReduceScatter) => {
            t(0, pairs(part, Mover::LlStore, false), n * part, 0)
        }
        (CollPath::Ll, CollKind::Broadcast) => t(0, from_root(Mover::LlStore), 0, 0),
        (CollPath::Pull, CollKind::AllReduce) => {
            fold(t(1, pairs(bytes, Mover::Load, false), n * bytes, 1)?, n > 2)
        }
        (CollPath::Pull, CollKind::AllToAll | CollKind::AllGather) => {
            t(1, pairs(part, Mover::Load, true), 0, 1)
        }
        (CollPath::Pull, CollKind::ReduceScatter) => {
            fold(t(1, pairs(part, Mover::Load, false), n * part, 1)?, true)
        }
        (CollPath::Pull, CollKind::Broadcast) => t(1, from_root(Mover::Load), 0, 1),
        (CollPath::PullTwoShot, CollKind::AllReduce) => {
            // Member i folds part i of every input, then stores it into every member's dst:
            // each block loads, then stores.
            let mut x = t(1, pairs(part, Mover::Load, false), n * part, 1)?;
            x.rounds.push(pairs(part, Mover::Store, false));
            fold(x, true)
        }
        (CollPath::Push, CollKind::AllReduce) => {
            // A step's stores wait for the one before to be fenced: they run in waves of a
            // step of every block.
            let mut x = t(
                1,
                pairs(bytes, Mover::Store, false),
                n * bytes,
                push_steps(bytes, blocks),
            )?;
            x.wave = push_step_vecs(bytes, blocks) * 16 * blocks.max(1) as usize;
            Some(x)
        }
        (CollPath::Push, CollKind::AllToAll | CollKind::AllGather) => {
            t(1, pairs(part, Mover::Store, true), 0, 1)
        }
        (CollPath::Chain, CollKind::Broadcast) => {
            let moves = (1..n)
                .map(|p| Move {
                    from: (root + p - 1) % n,
                    to: (root + p) % n,
                    bytes,
                    mover: Mover::Load,
                })
                .collect();
            t(1, moves, 0, CHAIN_STEPS + n.saturating_sub(2))
        }
        _ => None,
    }
}
