//! Which path serves a call (LL, pull, push, two-shot, chain) and the launches of the
//! LL-handshake kernels.

use super::choice::{CallFacts, PathRules};
use super::*;

impl GpuColl<'_> {
    /// The LL argument of team `dt`: LL on, a team of 2 to [`LL_MAX_MEMBERS`] in an LL slot.
    pub(super) fn ll_team_arg(&self, dt: DeviceTeam) -> Option<LlArg> {
        let (area, done) = self.ll.as_ref()?;
        let size = dt.size as usize;
        let slot = dt.slot as usize;
        if !(2..=LL_MAX_MEMBERS).contains(&size) || slot >= self.ll_slots {
            return None;
        }
        let region = self.ll_sizes.region();
        let per_slot = ll_area_bytes(region, self.n_pes, 1)?;
        Some(LlArg {
            area: self.g.ptr(area).ok()? + (slot * per_slot) as u64,
            lines: ll_lines(region) as u64,
            done: done.ptr + (slot * ll_notes(self.n_pes) * 4) as u64,
            flags: 0,
        })
    }

    /// `ll` with LL_CTRL_WARP for an LL all_reduce call of `lines` lines on more than one
    /// block, up to `ll_ctrl_lines`.
    pub(super) fn ll_ctrl(&self, ll: LlArg, lines: usize) -> LlArg {
        if uses_ctrl_warp(lines, self.ll_threads, self.ll_ctrl_lines) {
            LlArg {
                flags: ll.flags | LL_CTRL_WARP,
                ..ll
            }
        } else {
            ll
        }
    }

    /// `ll` with LL_EARLY_LAUNCH where this PE has its GPU alone: for the LL kernels (the
    /// all_reduce and reduce_scatter kernel, the data kernels), not the pull kernels (they did
    /// not move with it). It makes the all_reduce faster at every size; the data kernels gain
    /// from it because each runs only the batch its lines need.
    pub(super) fn ll_early(&self, ll: LlArg) -> LlArg {
        LlArg {
            flags: self.ll_flags,
            ..ll
        }
    }

    /// The LL argument when an all_reduce of `bytes` on `dt` runs the LL way: the message
    /// within the LL size, not forced two-shot, the team served ([`GpuColl::ll_team_arg`]).
    pub(super) fn ll_arg(&self, dt: DeviceTeam, bytes: usize, algo: Algo) -> Option<LlArg> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, false, 0);
        self.rules().ll_all_reduce(f, bytes, algo).then_some(ll)
    }

    /// The LL argument when a data movement whose members each send `share` bytes per pair
    /// (an all_to_all's share, an all_gather's input; a reduce_scatter's part) on `dt` runs
    /// the LL way: all of them together within the LL all_to_all size, a share within a
    /// region, the team served.
    pub(super) fn ll_a2a_arg(&self, dt: DeviceTeam, share: usize) -> Option<LlArg> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, false, 0);
        self.rules().ll_all_to_all(f, share).then_some(ll)
    }

    /// The LL argument when a broadcast of `bytes` on `dt` runs the LL way: within the LL
    /// all_reduce size (the same traffic: one message to every member), no algorithm forced,
    /// the team served.
    pub(super) fn ll_bcast_arg(&self, dt: DeviceTeam, bytes: usize) -> Option<LlArg> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, false, 0);
        self.rules().ll_broadcast(f, bytes).then_some(ll)
    }

    /// Launches `rshmemi_coll_ll_move_*` (`kind`: MOVE_A2A, MOVE_GATHER, MOVE_BCAST) for shares
    /// of `nb` bytes: the words kernel when they are whole 8-byte words at 8-byte aligned
    /// addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ll_move(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        sig: CallSig,
        ll: LlArg,
        (dst, src, nb): (u64, u64, usize),
        kind: usize,
        root: usize,
    ) -> Result<()> {
        let ck = self.ll_check(dt, sig)?;
        // A thread per line up to the most blocks (as measured: more blocks beat batches
        // here), then more lines per thread (the kernel picks its batch from the grid); an
        // all_to_all past two lines per thread on them spreads further (ll_a2a_grid_cap).
        let words = nb.is_multiple_of(8) && (dst | src).is_multiple_of(8);
        let f = self.f_ll_move[kind][usize::from(!words)];
        let extra = Some(root as u64);
        let ll = self.ll_early(ll);
        let n = dt.size as usize;
        let g = match kind {
            MOVE_A2A => self.rules().ll_grid(CollKind::AllToAll, n, nb * n, 0),
            MOVE_GATHER => self.rules().ll_grid(CollKind::AllGather, n, nb * n, 0),
            _ => self.rules().ll_grid(CollKind::Broadcast, n, nb, 0),
        };
        self.ll_launch(
            s,
            f,
            (dst, src, nb),
            (g.lines, g.cap, self.ll_threads),
            dt,
            ck,
            ll,
            extra,
        )
    }

    /// The rules every path choice follows ([`PathRules`]), with this PE's tuning.
    pub(super) fn rules(&self) -> PathRules<'_> {
        PathRules {
            config: &self.config,
            tuning: &self.tuning,
            ll_sizes: self.ll_sizes,
        }
    }

    /// The facts of a call on `dt`: `served` by the LL paths, `in_place`, the buffers'
    /// addresses or-ed together in `addrs` (for their alignment).
    pub(super) fn facts(
        &self,
        dt: DeviceTeam,
        served: bool,
        in_place: bool,
        addrs: u64,
    ) -> CallFacts {
        CallFacts {
            members: dt.size.max(0) as usize,
            served,
            in_place,
            aligned: addrs.is_multiple_of(16),
        }
    }

    /// The facts of an out-of-place call between 4096-aligned buffers on `team` (what
    /// [`GpuColl::path`] reports), if the team is a device team.
    fn team_facts(&self, team: &Team) -> Option<CallFacts> {
        let dt = self.g.device_team(team).ok()?;
        Some(self.facts(dt, self.ll_team_arg(dt).is_some(), false, 0))
    }

    /// The LL argument and grid when an all_to_all of `share` bytes per pair on `dt` runs
    /// the pull way: out of place, the shares whole 16-byte vectors at 16-byte aligned
    /// addresses, all of them together within [`GpuColl::pull_a2a_bytes`], the team served by
    /// the LL paths with a line per block after the header in its regions.
    pub(super) fn pull_a2a_arg(
        &self,
        dt: DeviceTeam,
        share: usize,
        in_place: bool,
        src: u64,
        dst: u64,
    ) -> Option<(LlArg, u32)> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, in_place, src | dst);
        Some((ll, self.rules().pull_all_to_all(f, share)?))
    }

    /// The LL argument and grid when an all_reduce of `bytes` on `dt` runs the pull way (a
    /// one-shot fold of the members' inputs read in place, after an LL handshake): beyond the
    /// LL size, within [`GpuColl::pull_all_reduce_bytes`] for the team's size, out of place,
    /// whole 16-byte vectors at 16-byte aligned addresses, the team served by the LL paths
    /// with a line per block after the header in its regions.
    /// With `two_ok` (no algorithm forced), past [`GpuColl::two_shot_pull_bytes`] for the
    /// team's size, the call runs two-shot (whatever the one-shot limit). Returns the kernel's
    /// mode word too (`RSHMEMI_PULL_AR_*` of `kernels/`).
    pub(super) fn pull_ar_arg(
        &self,
        dt: DeviceTeam,
        bytes: usize,
        in_place: bool,
        (src, dst): (u64, u64),
        two_ok: bool,
    ) -> Option<(LlArg, u32, u64)> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, in_place, src | dst);
        let (blocks, mode) = self.rules().pull_all_reduce(f, bytes, two_ok)?;
        Some((ll, blocks, mode))
    }

    /// The LL argument and grid when a reduce_scatter of `part` bytes per member on `dt` runs
    /// the pull way (every member folds its part of the members' inputs, read in place, after
    /// an LL handshake): beyond the LL size, every part together within
    /// [`GpuColl::pull_reduce_scatter_bytes`], out of place, whole 16-byte vectors at 16-byte
    /// aligned addresses, the team served by the LL paths with a line per block after the
    /// header in its regions.
    pub(super) fn pull_rs_arg(
        &self,
        dt: DeviceTeam,
        part: usize,
        in_place: bool,
        (src, dst): (u64, u64),
    ) -> Option<(LlArg, u32)> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, in_place, src | dst);
        Some((ll, self.rules().pull_reduce_scatter(f, part)?))
    }

    /// Whether a pull all_to_all or all_gather of `total` bytes (all shares) stores its shares
    /// ([`GpuColl::push_a2a_bytes`]).
    pub(super) fn pushes_a2a(&self, total: usize) -> bool {
        self.rules().pushes_all_to_all(total)
    }

    /// The check argument of an LL call with signature `sig` (marked LL; its barrier count,
    /// 2, is only compared: an LL call runs none).
    pub(super) fn ll_check(&self, dt: DeviceTeam, sig: CallSig) -> Result<Check> {
        let sig = CallSig {
            syncs: 2,
            ll: true,
            ..sig
        };
        self.check(dt, sig.pack()?)
    }

    /// The algorithm of an all_reduce of `bytes` on `dt`: the configured choice, except that a
    /// message within the LL size on a team the LL path serves runs one-shot (the LL path)
    /// unless an algorithm is forced ([`CollConfig::algo`]): the LL path beats the barrier-based
    /// two-shot up to its size.
    pub(super) fn all_reduce_algo(&self, dt: DeviceTeam, bytes: usize) -> Algo {
        let f = self.facts(dt, self.ll_team_arg(dt).is_some(), false, 0);
        self.rules().all_reduce_algo(f, bytes)
    }

    /// The LL argument, grid and way when a broadcast of `bytes` on `dt` runs the pull way
    /// (after an LL handshake every member reads the root's `src`, or, on teams of more than
    /// two past [`GpuColl::chain_broadcast_bytes`], the one before it along a chain: `true`):
    /// beyond the LL broadcast size, no algorithm forced, within
    /// [`GpuColl::pull_broadcast_bytes`] for the team's size, whole 16-byte vectors at 16-byte
    /// aligned addresses, the team served by the LL paths with a line per block after the
    /// header in its regions (two on a chain: the step counts).
    pub(super) fn pull_bcast_arg(
        &self,
        dt: DeviceTeam,
        bytes: usize,
        src: u64,
        dst: u64,
    ) -> Option<(LlArg, u32, bool)> {
        let ll = self.ll_team_arg(dt)?;
        let f = self.facts(dt, true, false, src | dst);
        let (blocks, chain) = self.rules().pull_broadcast(f, bytes)?;
        Some((ll, blocks, chain))
    }

    /// The LL paths' sizes ([`CollTuning::ll_sizes`]).
    pub fn ll_sizes(&self) -> LlSizes {
        self.ll_sizes
    }

    /// Launches an LL-handshake kernel: `(dst, src, count)`, the team, the check, the LL
    /// argument, then the `extra` u64 parameter if any; `lines` threads' worth of blocks, at most
    /// `max_blocks`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ll_launch(
        &self,
        s: &Stream,
        f: Func,
        (dst, src, count): (u64, u64, usize),
        (lines, max_blocks, threads): (usize, u32, u32),
        dt: DeviceTeam,
        ck: Check,
        ll: LlArg,
        extra: Option<u64>,
    ) -> Result<()> {
        let blocks = (lines as u64)
            .div_ceil(threads as u64)
            .clamp(1, max_blocks as u64) as u32;
        // A control warp per block beside the data threads the grid was sized for.
        let threads = threads + if ll.flags & LL_CTRL_WARP != 0 { 32 } else { 0 };
        if blocks > LL_KERNEL_MAX_BLOCKS {
            // The knobs are checked against it; a grid past it would share sequence copies.
            return Err(Error::invalid(format!(
                "LL grid of {blocks} blocks is over the kernels' {LL_KERNEL_MAX_BLOCKS}"
            )));
        }
        let (mut d, mut sr, mut n, mut t, mut k, mut l) = (dst, src, count as u64, dt, ck, ll);
        let mut e = extra.unwrap_or(0);
        let mut p = [
            &mut d as *mut u64 as *mut std::ffi::c_void,
            &mut sr as *mut u64 as *mut _,
            &mut n as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut k as *mut Check as *mut _,
            &mut l as *mut LlArg as *mut _,
            &mut e as *mut u64 as *mut _,
        ];
        let p = &mut p[..6 + usize::from(extra.is_some())];
        // SAFETY: matches rshmemi_coll_ll_*(T*, const T*, u64, rshmem_team, rshmemi_check,
        // rshmemi_ll, u64 stride), rshmemi_coll_ll_move_*(char*, const char*, u64, ...,
        // u64 root), rshmemi_coll_pull_ar_*(T*, const T*, u64, ..., u64 push),
        // rshmemi_coll_pull_a2a(v4*, const v4*, u64, ..., u64 push) and
        // rshmemi_coll_pull_bcast(v4*, const v4*, u64, ..., u64 root) (repr(C); the callers
        // pass one extra value each); ranges checked by the callers, the message fits the
        // area's regions
        // (ll_arg, ll_a2a_arg, ll_bcast_arg, pull_ar_arg, pull_a2a_arg, pull_bcast_arg), the
        // counter is this slot's. Launched as
        // programmatic dependents: each of these kernels begins with rshmemi_grid_dep_wait and
        // lets the next kernel in only after its waits for other PEs (rshmemi_ll_end, the
        // common path).
        unsafe { gpu::launch_dependent(&s.raw, f, blocks, threads, 0, p) }
    }

    /// The pull all_to_all kernel on `grid` (from `pull_a2a_arg`): shares of `share` bytes
    /// from `src` into `dst`, by stores where `push`, each share the whole input where
    /// `gather` (all_gather). The call is marked pull, and push where the members store.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pull_move(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        sig: CallSig,
        (ll, blocks): (LlArg, u32),
        (dst, src, share): (u64, u64, usize),
        push: bool,
        gather: bool,
    ) -> Result<()> {
        let sig = CallSig {
            pull: true,
            push,
            ..sig
        };
        let ck = self.ll_check(dt, sig)?;
        let lines = blocks as usize * LL_THREADS as usize;
        let word = u64::from(push) | if gather { A2A_GATHER } else { 0 };
        let f = self.f_pull_a2a;
        let grid = (lines, blocks, LL_THREADS);
        self.ll_launch(s, f, (dst, src, share / 16), grid, dt, ck, ll, Some(word))
    }

    /// The pull all_reduce kernel of `T` and `op` in `mode` on `blocks` blocks (from
    /// `pull_ar_arg` or `pull_rs_arg`): `count` elements of the members' `src` folded into
    /// `dst`, the call checked as `sig`.
    pub(super) fn pull_fold<T: Elem>(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        (op, mode): (ReduceOp, u64),
        sig: CallSig,
        (ll, blocks): (LlArg, u32),
        (dst, src, count): (u64, u64, usize),
    ) -> Result<()> {
        let ck = self.ll_check(dt, sig)?;
        let pf = self.pull_ar_func::<T>(op)?;
        let grid = (blocks as usize * LL_THREADS as usize, blocks, LL_THREADS);
        self.ll_launch(s, pf, (dst, src, count), grid, dt, ck, ll, Some(mode))
    }

    /// The path a collective of nccl-tests' size `bytes` (the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer, the message otherwise) on `team` takes
    /// between out-of-place, 4096-aligned buffers: what the benchmarks report and the tests
    /// check. Every member of a team computes the same path from the same tuning.
    pub fn path(&self, kind: CollKind, team: &Team, bytes: usize) -> CollPath {
        match self.team_facts(team) {
            Some(f) => self.rules().path(kind, f, bytes),
            None => CollPath::Plan(match kind {
                CollKind::AllReduce => Algo::OneShot,
                _ => self.config.choose(kind, bytes),
            }),
        }
    }
}

/// The path of a collective call ([`GpuColl::path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollPath {
    /// The LL path: data and flag in every 16-byte line, no barrier waits.
    Ll,
    /// The pull path: one kernel after an LL handshake, members' inputs read in place (the
    /// one-shot all_reduce, reduce_scatter, all_to_all, all_gather, broadcast from the root).
    Pull,
    /// The all_reduce two-shot pull: each member folds one part and stores it into every
    /// member's output.
    PullTwoShot,
    /// The pull handshake with the data moved by stores into the members' outputs.
    Push,
    /// The pull broadcast along a chain from the root.
    Chain,
    /// The barrier-based plan with this algorithm.
    Plan(Algo),
}

impl CollPath {
    /// Short name, as the benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            CollPath::Ll => "ll",
            CollPath::Pull => "pull",
            CollPath::PullTwoShot => "pull_two_shot",
            CollPath::Push => "push",
            CollPath::Chain => "chain",
            CollPath::Plan(a) => a.name(),
        }
    }

    /// Whether the call meets its peers through the pull handshake (every path but the LL
    /// one and the plans).
    pub fn pulls(self) -> bool {
        matches!(
            self,
            CollPath::Pull | CollPath::PullTwoShot | CollPath::Push | CollPath::Chain
        )
    }
}
