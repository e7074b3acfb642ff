//! Which path a GPU collective call takes, as pure functions of the tuning, the LL sizes, the
//! algorithm configuration and the call's facts. [`super::GpuColl`] asks these for every call
//! it launches and for [`super::GpuColl::path`]; the simulator (`crates/rshmem-sim`) asks the
//! same functions without a GPU, so both follow one set of rules.

use super::exec::fusable;
use super::ll::{
    ll_a2a_grid_cap, ll_lines, uses_ctrl_warp, LlSizes, LL_MAX_MEMBERS, PULL_AR_PUSH,
    PULL_AR_TWO_SHOT,
};
use super::paths::CollPath;
use super::sig::{MAX_COPIES, SIG_WORDS, THREADS};
use super::tuning::CollTuning;
use crate::coll::plan::{Algo, CollKind, Plan};
use crate::coll::CollConfig;

/// What decides a call's path besides the call itself: the plans' configuration, the GPU
/// tuning and the LL sizes in force (every member of a team holds the same).
#[derive(Clone, Copy, Debug)]
pub struct PathRules<'a> {
    /// Algorithm choice of the barrier-based plans.
    pub config: &'a CollConfig,
    /// The GPU paths' limits.
    pub tuning: &'a CollTuning,
    /// The LL sizes (from [`CollTuning::ll_sizes`]).
    pub ll_sizes: LlSizes,
}

/// The facts of one call that the rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallFacts {
    /// Members of the team.
    pub members: usize,
    /// The team has an LL area ([`PathRules::ll_serves`] for a team in an LL slot).
    pub served: bool,
    /// Source and destination are the same object.
    pub in_place: bool,
    /// Source and destination addresses are 16-byte aligned.
    pub aligned: bool,
}

impl CallFacts {
    /// An out-of-place call between 16-byte aligned buffers (what benchmarks and the simulator
    /// time) on a team of `members`, `served` by the LL paths or not.
    pub fn out_of_place(members: usize, served: bool) -> CallFacts {
        CallFacts {
            members,
            served,
            in_place: false,
            aligned: true,
        }
    }
}

/// The grid of an LL call ([`PathRules::ll_grid`]): what [`super::GpuColl`] launches and the
/// simulator times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlGrid {
    /// Data lines (8 bytes each) a member sends one peer, over the thread lines
    /// ([`CollTuning::ll_thread_lines`]) of the all_reduce kernel: a thread each.
    pub lines: usize,
    /// Most blocks.
    pub cap: u32,
    /// Blocks: a block per [`CollTuning::ll_threads`] lines, at most `cap`.
    pub blocks: u32,
    /// The LL all_reduce kernel runs a control warp per block beside its data threads.
    pub ctrl: bool,
}

impl PathRules<'_> {
    /// Whether the LL paths serve a team of `members` that sits in a team slot with an LL area
    /// (the world's always does): LL sizes not off, 2 to [`LL_MAX_MEMBERS`] members.
    pub fn ll_serves(&self, members: usize) -> bool {
        self.ll_sizes.region() > 0 && (2..=LL_MAX_MEMBERS).contains(&members)
    }

    /// Bytes up to which an all_reduce on a team of `members` runs the LL way: the LL size on
    /// a pair, `2 / members` of it on larger teams (rounded down to 16 bytes). Each member
    /// pushes its whole message, twice its size with the flags, to every other member, so the
    /// LL path's traffic grows with the team where the two-shot pull's stays about twice the
    /// message: the size where the pull overtakes it shrinks as the team grows (BENCHMARKS.md).
    pub fn ll_all_reduce_bytes(&self, members: usize) -> usize {
        if members <= 2 {
            self.ll_sizes.all_reduce
        } else {
            self.ll_sizes.all_reduce * 2 / members / 16 * 16
        }
    }

    /// The algorithm of an all_reduce of `bytes`: the configured choice, except that a message
    /// within the LL size on a team the LL path serves runs one-shot (the LL path) unless an
    /// algorithm is forced: the LL path beats the barrier-based two-shot up to its size.
    pub fn all_reduce_algo(&self, f: CallFacts, bytes: usize) -> Algo {
        let chosen = self.config.choose(CollKind::AllReduce, bytes);
        let ll = self.config.algo.is_none()
            && bytes > 0
            && bytes <= self.ll_all_reduce_bytes(f.members)
            && f.served;
        if ll {
            Algo::OneShot
        } else {
            chosen
        }
    }

    /// Whether an all_reduce of `bytes` with algorithm `algo` runs the LL way.
    pub fn ll_all_reduce(&self, f: CallFacts, bytes: usize, algo: Algo) -> bool {
        f.served
            && bytes > 0
            && bytes <= self.ll_all_reduce_bytes(f.members)
            && algo == Algo::OneShot
    }

    /// Whether a data movement whose members each send `share` bytes per pair (an
    /// all_to_all's share, an all_gather's input, a reduce_scatter's part) runs the LL way:
    /// all of them together within the LL all_to_all size, a share within a region.
    pub fn ll_all_to_all(&self, f: CallFacts, share: usize) -> bool {
        let Some(total) = share.checked_mul(f.members) else {
            return false;
        };
        f.served
            && share > 0
            && total <= self.ll_sizes.all_to_all
            && share <= self.ll_sizes.region()
    }

    /// Whether a broadcast of `bytes` runs the LL way: within the LL all_reduce size (the same
    /// traffic: one message to every member), no algorithm forced.
    pub fn ll_broadcast(&self, f: CallFacts, bytes: usize) -> bool {
        f.served
            && self.config.algo.is_none()
            && bytes > 0
            && bytes <= self.ll_sizes.all_reduce
            && bytes <= self.ll_sizes.region()
    }

    /// The grid of the LL kernel of `kind` (all_reduce, reduce_scatter, all_to_all,
    /// all_gather, broadcast) for nccl-tests' size `bytes` on a team of `members`, with
    /// `ctrl_lines` the most lines of an all_reduce call with a control warp: the all_reduce
    /// kernel takes a line per thread of the message (a reduce_scatter of the part it sends
    /// each member) up to [`CollTuning::ll_blocks`]; the data kernels a line per thread of a
    /// share (a broadcast of the message) up to [`CollTuning::ll_a2a_blocks`], an all_to_all
    /// past two lines per thread spreading over up to twice as many.
    pub fn ll_grid(
        &self,
        kind: CollKind,
        members: usize,
        bytes: usize,
        ctrl_lines: usize,
    ) -> LlGrid {
        let t = self.tuning;
        let part = bytes / members.max(1);
        let (lines, cap) = match kind {
            CollKind::AllReduce | CollKind::ReduceScatter => {
                let nb = if kind == CollKind::AllReduce {
                    bytes
                } else {
                    part
                };
                (
                    nb.div_ceil(8).div_ceil(t.ll_thread_lines.max(1)),
                    t.ll_blocks,
                )
            }
            CollKind::AllToAll => {
                let lines = part.div_ceil(8);
                (lines, ll_a2a_grid_cap(lines, t.ll_threads, t.ll_a2a_blocks))
            }
            CollKind::Broadcast => (bytes.div_ceil(8), t.ll_a2a_blocks),
            _ => (part.div_ceil(8), t.ll_a2a_blocks),
        };
        let blocks = (lines as u64)
            .div_ceil(t.ll_threads.max(1) as u64)
            .clamp(1, cap.max(1) as u64) as u32;
        LlGrid {
            lines,
            cap,
            blocks,
            ctrl: kind == CollKind::AllReduce && uses_ctrl_warp(lines, t.ll_threads, ctrl_lines),
        }
    }

    /// The grid of a pull kernel reading `bytes`: a block per `per_block` (at most the pull
    /// block cap), if the LL regions hold a line per block after the header.
    pub fn pull_blocks(&self, bytes: usize, per_block: usize) -> Option<u32> {
        let blocks = bytes
            .div_ceil(per_block)
            .clamp(1, self.tuning.pull_blocks as usize);
        (ll_lines(self.ll_sizes.region()) >= SIG_WORDS + blocks).then_some(blocks as u32)
    }

    /// The grid when an all_to_all of `share` bytes per pair runs the pull way: out of place,
    /// whole 16-byte shares at aligned addresses, all of them within
    /// [`CollTuning::pull_all_to_all`], the team served.
    pub fn pull_all_to_all(&self, f: CallFacts, share: usize) -> Option<u32> {
        let total = share.checked_mul(f.members)?;
        let fits = f.served
            && !f.in_place
            && share > 0
            && share.is_multiple_of(16)
            && f.aligned
            && total <= self.tuning.pull_all_to_all;
        let remote = share * (f.members.max(1) - 1);
        fits.then(|| self.pull_blocks(remote, self.tuning.pull_block_bytes))
            .flatten()
    }

    /// The grid and mode word (`RSHMEMI_PULL_AR_*` of `kernels/`: 0, push, two-shot) when an
    /// all_reduce of `bytes` runs the pull way: beyond the LL size, within
    /// [`CollTuning::pull_all_reduce`] or (with `two_ok`, no algorithm forced) past
    /// [`CollTuning::two_shot_pull`], out of place, whole 16-byte vectors at aligned
    /// addresses, the team served.
    pub fn pull_all_reduce(&self, f: CallFacts, bytes: usize, two_ok: bool) -> Option<(u32, u64)> {
        let two = two_ok && self.tuning.two_shot_pull.reached(f.members, bytes);
        let fits = f.served
            && !f.in_place
            && bytes > self.ll_all_reduce_bytes(f.members)
            && (two || bytes <= self.tuning.pull_all_reduce.of(f.members))
            && bytes.is_multiple_of(16)
            && f.aligned;
        // The two-shot's blocks each fold 1/members of their bytes: half the one-shot's bytes
        // per block, so a call spreads over more SMs.
        let per_block = self.tuning.pull_all_reduce_block_bytes / if two { 2 } else { 1 };
        let blocks = fits
            .then(|| self.pull_blocks(bytes, per_block.max(16)))
            .flatten()?;
        let mode = if two {
            PULL_AR_TWO_SHOT
        } else if self.pushes(f.members, bytes) {
            PULL_AR_PUSH
        } else {
            0
        };
        Some((blocks, mode))
    }

    /// The grid when a reduce_scatter of `part` bytes per member runs the pull way: beyond
    /// the LL size, every part together within [`CollTuning::pull_reduce_scatter`], out of
    /// place, whole 16-byte parts at aligned addresses, the team served.
    pub fn pull_reduce_scatter(&self, f: CallFacts, part: usize) -> Option<u32> {
        let total = part.checked_mul(f.members)?;
        let fits = f.served
            && !f.in_place
            && part > 0
            && !self.ll_all_to_all(f, part)
            && total <= self.tuning.pull_reduce_scatter
            && part.is_multiple_of(16)
            && f.aligned;
        fits.then(|| self.pull_blocks(total, self.tuning.pull_all_reduce_block_bytes))
            .flatten()
    }

    /// The grid and way (`true`: along a chain) when a broadcast of `bytes` runs the pull
    /// way: beyond the LL broadcast size, no algorithm forced, within
    /// [`CollTuning::pull_broadcast`], whole 16-byte vectors at aligned addresses, the team
    /// served with a line per block after the header (two on a chain: the step counts).
    pub fn pull_broadcast(&self, f: CallFacts, bytes: usize) -> Option<(u32, bool)> {
        let fits = f.served
            && self.config.algo.is_none()
            && bytes > 0
            && !self.ll_broadcast(f, bytes)
            && bytes <= self.tuning.pull_broadcast.of(f.members)
            && bytes.is_multiple_of(16)
            && f.aligned;
        let blocks = fits
            .then(|| self.pull_blocks(bytes, self.tuning.pull_block_bytes))
            .flatten()?;
        let chain = f.members > 2 && bytes > self.tuning.chain_broadcast;
        let lines = SIG_WORDS + blocks as usize * if chain { 2 } else { 1 };
        (ll_lines(self.ll_sizes.region()) >= lines).then_some((blocks, chain))
    }

    /// Whether a pull all_reduce of `bytes` moves its data by stores (a pair, from
    /// [`CollTuning::push_all_reduce`]).
    pub fn pushes(&self, members: usize, bytes: usize) -> bool {
        members == 2 && self.tuning.push_all_reduce > 0 && bytes >= self.tuning.push_all_reduce
    }

    /// Whether a pull all_to_all or all_gather of `total` bytes (all shares) stores its shares
    /// ([`CollTuning::push_all_to_all`]).
    pub fn pushes_all_to_all(&self, total: usize) -> bool {
        self.tuning.push_all_to_all > 0 && total >= self.tuning.push_all_to_all
    }

    /// Whether a collective of nccl-tests' size `bytes` (the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer, the message otherwise) runs the LL way.
    pub fn uses_ll(&self, kind: CollKind, f: CallFacts, bytes: usize) -> bool {
        let n = f.members.max(1);
        match kind {
            CollKind::AllReduce => self.ll_all_reduce(f, bytes, self.all_reduce_algo(f, bytes)),
            CollKind::AllToAll | CollKind::AllGather | CollKind::ReduceScatter => {
                bytes.is_multiple_of(n) && self.ll_all_to_all(f, bytes / n)
            }
            CollKind::Broadcast => self.ll_broadcast(f, bytes),
            _ => false,
        }
    }

    /// The path of a collective of nccl-tests' size `bytes` (as [`PathRules::uses_ll`]) with
    /// facts `f`: what [`super::GpuColl::path`] reports and the simulator times.
    pub fn path(&self, kind: CollKind, f: CallFacts, bytes: usize) -> CollPath {
        if self.uses_ll(kind, f, bytes) {
            return CollPath::Ll;
        }
        let n = f.members.max(1);
        let plan = CollPath::Plan(match kind {
            CollKind::AllReduce => self.all_reduce_algo(f, bytes),
            _ => self.config.choose(kind, bytes),
        });
        let share = (bytes.is_multiple_of(n)).then_some(bytes / n);
        match kind {
            CollKind::AllReduce if matches!(self.config.algo, None | Some(Algo::OneShot)) => {
                match self.pull_all_reduce(f, bytes, self.config.algo.is_none()) {
                    Some((_, PULL_AR_TWO_SHOT)) => CollPath::PullTwoShot,
                    Some((_, PULL_AR_PUSH)) => CollPath::Push,
                    Some(_) => CollPath::Pull,
                    None => plan,
                }
            }
            CollKind::AllToAll | CollKind::AllGather
                if share.is_some_and(|s| self.pull_all_to_all(f, s).is_some()) =>
            {
                if self.pushes_all_to_all(bytes) {
                    CollPath::Push
                } else {
                    CollPath::Pull
                }
            }
            CollKind::ReduceScatter
                if share.is_some_and(|s| self.pull_reduce_scatter(f, s).is_some()) =>
            {
                CollPath::Pull
            }
            CollKind::Broadcast => match self.pull_broadcast(f, bytes) {
                Some((_, true)) => CollPath::Chain,
                Some((_, false)) => CollPath::Pull,
                None => plan,
            },
            _ => plan,
        }
    }
}

/// Most copy steps of a plan that the GPU plan executor gathers into one copy kernel.
pub const PLAN_COPIES_PER_KERNEL: usize = MAX_COPIES;

/// Blocks of the GPU plan executor's copy kernel for `copies` copies of at most `max_bytes`
/// each on a GPU of `sms` SMs: a block per 64 threads' 16-byte vectors of the largest,
/// at most four blocks per SM over all copies.
pub fn copy_grid(copies: usize, max_bytes: u64, sms: u32) -> u32 {
    let per_block = (THREADS as u64) * 64;
    let limit = ((4 * sms) as usize / copies.max(1)).max(1) as u64;
    copies as u32 * max_bytes.div_ceil(per_block).clamp(1, limit) as u32
}

/// Blocks of the GPU plan executor's reduce kernel for `bytes` of output on a GPU of `sms`
/// SMs: a thread per 16-byte vector, at most four blocks per SM.
pub fn reduce_grid(bytes: usize, sms: u32) -> u32 {
    let vecs = (bytes / 16 + 1) as u64;
    vecs.div_ceil(THREADS as u64).clamp(1, 4 * sms as u64) as u32
}

/// Whether the GPU plan executor runs `plan` (elements of `elem_size` bytes) as one kernel of
/// one block with both barriers inside ([`CollTuning::fused_bytes`]).
pub fn plan_fused(plan: &Plan, elem_size: usize, tuning: &CollTuning) -> bool {
    fusable(plan, elem_size, tuning.fused_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::cuda::default_ll_sizes;

    /// The LL grids GpuColl launches on a pair with the default tuning, and which of them take
    /// their data only after the header's verdict (`traffic::ll_late_waits`).
    #[test]
    fn ll_grids_and_late_waits() {
        use crate::coll::cuda::traffic::ll_late_waits;
        let config = CollConfig::default();
        let tuning = CollTuning::default();
        let rules = PathRules {
            config: &config,
            tuning: &tuning,
            ll_sizes: default_ll_sizes(5 << 29, 2),
        };
        let ctrl = tuning.ll_ctrl_lines;
        for (kind, bytes, lines, cap, blocks, with_ctrl, late) in [
            // One line, one block: folded beside the verdict.
            (CollKind::AllReduce, 8, 1, 128, 1, false, 0),
            // A block whose verdict warp has lines of its own.
            (CollKind::AllReduce, 2048, 256, 128, 1, false, 1),
            // A control warp on 2 to 8 blocks.
            (CollKind::AllReduce, 4096, 512, 128, 2, true, 0),
            (CollKind::AllReduce, 16384, 2048, 128, 8, true, 0),
            (CollKind::AllReduce, 65536, 8192, 128, 32, false, 1),
            (CollKind::AllReduce, 512 << 10, 65536, 128, 128, false, 1),
            // A reduce_scatter pushes each member its part, never with a control warp.
            (CollKind::ReduceScatter, 8, 1, 128, 1, false, 0),
            (CollKind::ReduceScatter, 4096, 256, 128, 1, false, 1),
            // The data kernels: always after the verdicts; an all_to_all spreads further.
            (CollKind::AllToAll, 8, 1, 64, 1, false, 1),
            (CollKind::AllToAll, 1 << 20, 65536, 128, 128, false, 1),
            (CollKind::AllGather, 1 << 20, 65536, 64, 64, false, 1),
            (CollKind::Broadcast, 65536, 8192, 64, 32, false, 1),
        ] {
            let g = rules.ll_grid(kind, 2, bytes, ctrl);
            assert_eq!(
                (g.lines, g.cap, g.blocks, g.ctrl),
                (lines, cap, blocks, with_ctrl),
                "{kind:?} {bytes}"
            );
            assert_eq!(
                ll_late_waits(kind, &g, tuning.ll_threads),
                late,
                "{kind:?} {bytes}"
            );
        }
    }

    /// The paths the 2- and 4-GPU benchmark runs report (2.5 GiB heaps: 512 KiB / 1 MiB LL
    /// sizes), from the default tuning.
    #[test]
    fn default_paths_match_the_benchmarks() {
        let config = CollConfig::default();
        let tuning = CollTuning::default();
        for (n, kind, bytes, want) in [
            (2, CollKind::AllReduce, 8, "ll"),
            (2, CollKind::AllReduce, 524288, "ll"),
            (2, CollKind::AllReduce, 1 << 20, "pull"),
            (2, CollKind::AllReduce, 256 << 20, "push"),
            (2, CollKind::AllToAll, 1 << 20, "ll"),
            (2, CollKind::AllToAll, 16 << 20, "push"),
            (2, CollKind::Broadcast, 1 << 20, "pull"),
            (4, CollKind::AllReduce, 262144, "ll"),
            (4, CollKind::AllReduce, 1 << 20, "pull_two_shot"),
            (4, CollKind::AllGather, 4 << 20, "push"),
            (4, CollKind::ReduceScatter, 4 << 20, "pull"),
            (4, CollKind::ReduceScatter, 16 << 20, "one_shot"),
            (4, CollKind::Broadcast, 1 << 20, "pull"),
            (4, CollKind::Broadcast, 4 << 20, "chain"),
            (17, CollKind::AllReduce, 1 << 20, "two_shot"),
            (17, CollKind::AllToAll, 17 << 10, "one_shot"),
        ] {
            let rules = PathRules {
                config: &config,
                tuning: &tuning,
                ll_sizes: default_ll_sizes(5 << 29, n),
            };
            let f = CallFacts::out_of_place(n, rules.ll_serves(n));
            assert_eq!(
                rules.path(kind, f, bytes).name(),
                want,
                "{n} {kind:?} {bytes}"
            );
        }
    }
}
