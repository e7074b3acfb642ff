//! Which path serves a call (LL, pull, push, two-shot, chain) and the launches of the
//! LL-handshake kernels.

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
    /// not move with it). 2x H100, graph, same call, early against late launch: all_reduce 8 B
    /// 2.75-2.83 against 3.00-3.01 us, 64 KiB 3.80-3.81 against 3.88-3.94, 256 KiB 5.01-5.19
    /// against 5.31-5.33. The data kernels lost with it at first (all_to_all 64 KiB 4.45-4.48
    /// against 4.22-4.28); since each runs only the batch its lines need they gain: all_to_all
    /// 8 B 3.35-3.43 against 3.46-3.51, 512 KiB 4.97-5.00 against 5.10-5.17, 1 MiB 6.69
    /// against 6.82-6.83, all_gather 1 MiB 6.56-6.62 against 6.67-6.70, broadcast 8 B
    /// 3.07-3.09 against 3.12-3.24 (64 KiB within 0.1 us either way).
    pub(super) fn ll_early(&self, ll: LlArg) -> LlArg {
        LlArg {
            flags: self.ll_flags,
            ..ll
        }
    }

    /// The LL argument when an all_reduce of `bytes` on `dt` runs the LL way: the message
    /// within the LL size, not forced two-shot, the team served ([`GpuColl::ll_team_arg`]).
    pub(super) fn ll_arg(&self, dt: DeviceTeam, bytes: usize, algo: Algo) -> Option<LlArg> {
        let fits = bytes > 0 && bytes <= self.ll_ar_max(dt) && algo == Algo::OneShot;
        fits.then(|| self.ll_team_arg(dt)).flatten()
    }

    /// The LL argument when a data movement whose members each send `share` bytes per pair
    /// (an all_to_all's share, an all_gather's input; a reduce_scatter's part) on `dt` runs
    /// the LL way: all of them together within the LL all_to_all size, a share within a
    /// region, the team served.
    pub(super) fn ll_a2a_arg(&self, dt: DeviceTeam, share: usize) -> Option<LlArg> {
        let total = share.checked_mul(dt.size.max(0) as usize)?;
        let fits =
            share > 0 && total <= self.ll_sizes.all_to_all && share <= self.ll_sizes.region();
        fits.then(|| self.ll_team_arg(dt)).flatten()
    }

    /// The LL argument when a broadcast of `bytes` on `dt` runs the LL way: within the LL
    /// all_reduce size (the same traffic: one message to every member), no algorithm forced,
    /// the team served.
    pub(super) fn ll_bcast_arg(&self, dt: DeviceTeam, bytes: usize) -> Option<LlArg> {
        let fits = self.config.algo.is_none()
            && bytes > 0
            && bytes <= self.ll_sizes.all_reduce
            && bytes <= self.ll_sizes.region();
        fits.then(|| self.ll_team_arg(dt)).flatten()
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
        let lines = nb.div_ceil(8);
        let words = nb.is_multiple_of(8) && (dst | src).is_multiple_of(8);
        let f = self.f_ll_move[kind][usize::from(!words)];
        let extra = Some(root as u64);
        let ll = self.ll_early(ll);
        let cap = if kind == MOVE_A2A {
            ll_a2a_grid_cap(lines, self.ll_threads, self.tuning.ll_a2a_blocks)
        } else {
            self.tuning.ll_a2a_blocks
        };
        self.ll_launch(
            s,
            f,
            (dst, src, nb),
            (lines, cap, self.ll_threads),
            dt,
            ck,
            ll,
            extra,
        )
    }

    /// The LL argument and grid of a pull kernel whose call `fits` its path: a block per
    /// `per_block` of the `bytes` it reads (at most the pull block cap), the team served by the
    /// LL paths with a line per block after the header in its regions.
    pub(super) fn pull_grid(
        &self,
        dt: DeviceTeam,
        fits: bool,
        bytes: usize,
        per_block: usize,
    ) -> Option<(LlArg, u32)> {
        let ll = fits.then(|| self.ll_team_arg(dt)).flatten()?;
        let blocks = bytes
            .div_ceil(per_block)
            .clamp(1, self.tuning.pull_blocks as usize);
        (ll.lines as usize >= SIG_WORDS + blocks).then_some((ll, blocks as u32))
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
        let total = share.checked_mul(dt.size.max(0) as usize)?;
        let fits = !in_place
            && share > 0
            && share.is_multiple_of(16)
            && (src | dst).is_multiple_of(16)
            && total <= self.tuning.pull_all_to_all;
        let remote = share * (dt.size.max(1) as usize - 1);
        self.pull_grid(dt, fits, remote, self.tuning.pull_block_bytes)
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
        let members = dt.size.max(0) as usize;
        let two = two_ok && self.tuning.two_shot_pull.reached(members, bytes);
        let fits = !in_place
            && bytes > self.ll_ar_max(dt)
            && (two || bytes <= self.tuning.pull_all_reduce.of(members))
            && bytes.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        // The two-shot's blocks each fold 1/members of their bytes: half the one-shot's bytes
        // per block, so a call spreads over more SMs.
        let per_block = self.tuning.pull_all_reduce_block_bytes / if two { 2 } else { 1 };
        let (ll, blocks) = self.pull_grid(dt, fits, bytes, per_block.max(16))?;
        let mode = if two {
            PULL_AR_TWO_SHOT
        } else if self.pushes(dt, bytes) {
            PULL_AR_PUSH
        } else {
            0
        };
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
        let total = part.checked_mul(dt.size.max(0) as usize)?;
        let fits = !in_place
            && part > 0
            && self.ll_a2a_arg(dt, part).is_none()
            && total <= self.tuning.pull_reduce_scatter
            && part.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        self.pull_grid(dt, fits, total, self.tuning.pull_all_reduce_block_bytes)
    }

    /// Whether a pull all_reduce of `bytes` on `dt` moves its data by stores (a pair, from
    /// [`GpuColl::push_all_reduce_bytes`]).
    pub(super) fn pushes(&self, dt: DeviceTeam, bytes: usize) -> bool {
        dt.size == 2 && self.tuning.push_all_reduce > 0 && bytes >= self.tuning.push_all_reduce
    }

    /// Whether a pull all_to_all or all_gather of `total` bytes (all shares) stores its shares
    /// ([`GpuColl::push_a2a_bytes`]).
    pub(super) fn pushes_a2a(&self, total: usize) -> bool {
        self.tuning.push_all_to_all > 0 && total >= self.tuning.push_all_to_all
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

    /// Whether an all_reduce of `bytes` on `team` runs the LL way (what the benchmarks report).
    pub(super) fn all_reduce_uses_ll(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let algo = self.all_reduce_algo(dt, bytes);
            self.ll_arg(dt, bytes, algo).is_some()
        })
    }

    /// The algorithm of an all_reduce of `bytes` on `dt`: the configured choice, except that a
    /// message within the LL size on a team the LL path serves runs one-shot (the LL path)
    /// unless an algorithm is forced ([`CollConfig::algo`]): the LL path beats the barrier-based
    /// two-shot up to its size.
    pub(super) fn all_reduce_algo(&self, dt: DeviceTeam, bytes: usize) -> Algo {
        let chosen = self.config.choose(CollKind::AllReduce, bytes);
        let ll = self.config.algo.is_none()
            && bytes > 0
            && bytes <= self.ll_ar_max(dt)
            && self.ll_team_arg(dt).is_some();
        if ll {
            Algo::OneShot
        } else {
            chosen
        }
    }

    /// Whether an all_to_all of `bytes` (all shares) on `team` between 4096-aligned buffers
    /// runs the LL way (what the benchmarks report).
    pub(super) fn all_to_all_uses_ll(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let share = bytes / (dt.size.max(1) as usize);
            share * dt.size as usize == bytes && self.ll_a2a_arg(dt, share).is_some()
        })
    }

    /// Whether a collective of nccl-tests' size `bytes` (the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer, the message otherwise) on `team` runs the
    /// LL way (what the benchmarks report).
    pub(super) fn uses_ll(&self, kind: CollKind, team: &Team, bytes: usize) -> bool {
        let Ok(dt) = self.g.device_team(team) else {
            return false;
        };
        let n = dt.size.max(1) as usize;
        match kind {
            CollKind::AllReduce => self.all_reduce_uses_ll(team, bytes),
            CollKind::AllToAll => self.all_to_all_uses_ll(team, bytes),
            CollKind::AllGather | CollKind::ReduceScatter => {
                bytes.is_multiple_of(n) && self.ll_a2a_arg(dt, bytes / n).is_some()
            }
            CollKind::Broadcast => self.ll_bcast_arg(dt, bytes).is_some(),
            _ => false,
        }
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
        let fits = self.config.algo.is_none()
            && bytes > 0
            && self.ll_bcast_arg(dt, bytes).is_none()
            && bytes <= self.tuning.pull_broadcast.of(dt.size.max(0) as usize)
            && bytes.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        let (ll, blocks) = self.pull_grid(dt, fits, bytes, self.tuning.pull_block_bytes)?;
        let chain = dt.size > 2 && bytes > self.tuning.chain_broadcast;
        let lines = SIG_WORDS + blocks as usize * if chain { 2 } else { 1 };
        (ll.lines as usize >= lines).then_some((ll, blocks, chain))
    }

    /// Whether a broadcast of `bytes` on `team` between 4096-aligned buffers runs the pull
    /// way (what the benchmarks report).
    pub(super) fn broadcast_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g
            .device_team(team)
            .is_ok_and(|dt| self.pull_bcast_arg(dt, bytes, 0, 0).is_some())
    }

    /// Whether a broadcast of `bytes` on `team` between 4096-aligned buffers runs the pull
    /// way along a chain.
    pub(super) fn broadcast_uses_chain(&self, team: &Team, bytes: usize) -> bool {
        self.g
            .device_team(team)
            .is_ok_and(|dt| self.pull_bcast_arg(dt, bytes, 0, 0).is_some_and(|a| a.2))
    }

    /// Whether an out-of-place reduce_scatter of `bytes` (every member's part) on `team`
    /// between 4096-aligned buffers runs the pull way (what the benchmarks report).
    pub(super) fn reduce_scatter_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let n = dt.size.max(1) as usize;
            bytes.is_multiple_of(n) && self.pull_rs_arg(dt, bytes / n, false, (0, 0)).is_some()
        })
    }

    /// The pull kernel's mode word of an out-of-place all_reduce of `bytes` on `team` between
    /// 4096-aligned buffers, if it runs the pull way.
    pub(super) fn all_reduce_pull_mode(&self, team: &Team, bytes: usize) -> Option<u64> {
        let dt = self.g.device_team(team).ok()?;
        if !matches!(self.config.algo, None | Some(Algo::OneShot))
            || self.all_reduce_uses_ll(team, bytes)
        {
            return None;
        }
        let two_ok = self.config.algo.is_none();
        self.pull_ar_arg(dt, bytes, false, (0, 0), two_ok)
            .map(|a| a.2)
    }

    /// Whether an out-of-place all_to_all of `bytes` (all shares) on `team` between
    /// 4096-aligned buffers runs the pull way (what the benchmarks report).
    pub(super) fn all_to_all_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let share = bytes / (dt.size.max(1) as usize);
            share * dt.size as usize == bytes
                && self.ll_a2a_arg(dt, share).is_none()
                && self.pull_a2a_arg(dt, share, false, 0, 0).is_some()
        })
    }

    /// Bytes up to which an all_reduce on a team of `members` runs the LL way: the LL size on
    /// a pair, `2 / members` of it on larger teams (rounded down to 16 bytes). Each member
    /// pushes its whole message, twice its size with the flags, to every other member, so the
    /// LL path's traffic grows with the team where the two-shot pull's stays about twice the
    /// message: the size where the pull overtakes it shrinks as the team grows (BENCHMARKS.md,
    /// 4x H200).
    pub(super) fn ll_all_reduce_bytes(&self, members: usize) -> usize {
        if members <= 2 {
            self.ll_sizes.all_reduce
        } else {
            self.ll_sizes.all_reduce * 2 / members / 16 * 16
        }
    }

    pub(super) fn ll_ar_max(&self, dt: DeviceTeam) -> usize {
        self.ll_all_reduce_bytes(dt.size.max(0) as usize)
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

    /// The path a collective of nccl-tests' size `bytes` (the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer, the message otherwise) on `team` takes
    /// between out-of-place, 4096-aligned buffers: what the benchmarks report and the tests
    /// check. Every member of a team computes the same path from the same tuning.
    pub fn path(&self, kind: CollKind, team: &Team, bytes: usize) -> CollPath {
        if self.uses_ll(kind, team, bytes) {
            return CollPath::Ll;
        }
        let plan = CollPath::Plan(match kind {
            CollKind::AllReduce => self
                .g
                .device_team(team)
                .map_or(Algo::OneShot, |dt| self.all_reduce_algo(dt, bytes)),
            _ => self.config.choose(kind, bytes),
        });
        match kind {
            CollKind::AllReduce => match self.all_reduce_pull_mode(team, bytes) {
                Some(PULL_AR_TWO_SHOT) => CollPath::PullTwoShot,
                Some(PULL_AR_PUSH) => CollPath::Push,
                Some(_) => CollPath::Pull,
                None => plan,
            },
            CollKind::AllToAll | CollKind::AllGather if self.all_to_all_uses_pull(team, bytes) => {
                if self.pushes_a2a(bytes) {
                    CollPath::Push
                } else {
                    CollPath::Pull
                }
            }
            CollKind::ReduceScatter if self.reduce_scatter_uses_pull(team, bytes) => CollPath::Pull,
            CollKind::Broadcast if self.broadcast_uses_chain(team, bytes) => CollPath::Chain,
            CollKind::Broadcast if self.broadcast_uses_pull(team, bytes) => CollPath::Pull,
            _ => plan,
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
