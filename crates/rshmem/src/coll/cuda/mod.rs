//! The collectives on GPUs: [`GpuColl`] (its docs describe the design), stream-ordered and
//! graph-capturable, built on the CUDA backend's streams, kernels and peer mappings.
//!
//! Files: this one holds [`GpuColl`], its constructor and the collective calls; `paths` chooses
//! the path of a call (LL, pull, push, two-shot, chain) and launches the LL-handshake kernels;
//! `exec` runs the host collectives' plans on the GPU (barrier, copy and reduce kernels);
//! `sig` the call signatures every member's call is checked against; `ll` the LL and pull
//! paths' constants and area; `tuning` the typed tuning ([`CollTuning`]); `kernels/` the CUDA
//! sources, one file per family over shared headers; `modules` the NVRTC modules they are
//! compiled as, in parallel ([`COLL_MODULES`]). The benchmark against NCCL is the
//! `rshmem-bench` crate's.

mod choice;
mod exec;
mod ll;
mod modules;
mod net;
mod net_a2av;
#[cfg(test)]
mod net_model;
mod net_sched;
#[cfg(test)]
mod net_tests;
mod paths;
mod sig;
#[cfg(test)]
mod tests;
pub mod traffic;
mod tuning;

pub use choice::{
    copy_grid, plan_fused, reduce_grid, CallFacts, LlGrid, PathRules, PLAN_COPIES_PER_KERNEL,
};
pub use ll::{default_ll_sizes, LlSizes, COLL_LL_A2A_BYTES, COLL_LL_BYTES, LL_MAX_MEMBERS};
pub use modules::{compile_coll_modules, CollModule, COLL_MODULES};
pub use paths::CollPath;
pub use sig::coll_kernel_names;
pub use tuning::{
    CollTuning, PerTeam, COLL_CHAIN_BCAST_BYTES, COLL_FUSED_BYTES, COLL_NET_CHUNK_BYTES,
    COLL_PULL_A2A_BYTES, COLL_PULL_ALL_REDUCE_BYTES, COLL_PULL_ALL_REDUCE_PAIR_BYTES,
    COLL_PULL_BCAST_BYTES, COLL_PULL_RS_BYTES, COLL_PUSH_A2A_BYTES, COLL_PUSH_ALL_REDUCE_BYTES,
    COLL_TWO_SHOT_PULL_BYTES, COLL_TWO_SHOT_PULL_PAIR_BYTES, WRONG_RESULT_SWITCHES,
};

use crate::backend::cuda::ffi;
use crate::backend::cuda::gpu::{self, DevBuf, Func, Module, RawStream};
use crate::coll::plan::{self, Algo, Buf, CollKind, Plan, Shape, Step};
use crate::coll::{AllToAllV, CollConfig, Fold, ReduceOp, ToRoot};
use crate::device::{CudaPe, DeviceTeam, Stream};
use crate::elem::{Elem, ElemKind};
use crate::error::{Error, Result};
use crate::sym::{AsSym, RawSym, Sym};
use crate::team::Team;
use exec::*;
use ll::*;
use sig::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Stream-ordered collectives of one PE on the CUDA backend.
///
/// The algorithms are the host collectives' plans ([`crate::coll::plan`]), run by a GPU
/// executor: every [`Step::Sync`] becomes a one-block team barrier kernel (monotonically
/// increasing counters in device memory, so a captured graph replays correctly), and the
/// copy or reduce steps between two syncs become one kernel (`kernels/`) that reads the
/// peers' symmetric buffers directly through the peer mappings, spread over the GPU's SMs.
/// Data kernels never wait for peers, so waiting kernels never take the SMs their peers need
/// (PEs that share a GPU can still stall on its hardware queues: see the [`crate::cuda`] docs).
///
/// * **Algorithms.** all_reduce and broadcast: one-shot (every member reads every input;
///   2 barriers) below [`CollConfig::two_shot_bytes`], two-shot (reduce-scatter then
///   all-gather, resp. scatter then all-gather; 3 barriers) from there up; overridable with
///   [`CollConfig`] or `RSHMEM_COLL_ALGO` / `RSHMEM_COLL_TWO_SHOT_BYTES` (see
///   [`crate::coll`]). Large messages are split over every SM by the kernels (grid-stride, 16-byte
///   vectors); the plan's host chunking is not used on the GPU.
/// * **Small messages** ([`CollTuning::fused_bytes`], default 64 KiB read per PE,
///   [`CollTuning::fused_bytes`]): a plan with a single data phase (one-shot all_reduce,
///   reduce, reduce_scatter, all_gather, all_to_all, one-shot broadcast, out of place) runs as
///   one kernel of one block with both barriers inside: one launch instead of three.
/// * **LL paths** ([`CollTuning::ll_all_reduce`] and [`CollTuning::ll_all_to_all`]; defaults
///   [`default_ll_sizes`]: 512 KiB and 1 MiB unless the heap is small for the job): all_reduce
///   (on a pair; `2 / members` of it on larger teams) and broadcast up to the first size (unless an
///   algorithm is forced), all_to_all, all_gather and reduce_scatter whose per-member traffic
///   (all shares, the gathered output, the input) is within the second, any element count,
///   in and out of place, run as one kernel without barrier waits or fences, each member
///   pushing its data with a flag in every 16-byte line into the others' LL areas (NCCL's LL
///   protocol) and its signature as a header; lines are taken in batches (one load latency
///   per batch). A member running another call is still reported as
///   [`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch) on every member, and the
///   barrier counters stay in step (see `kernels/`).
/// * **Pull all_to_all** ([`CollTuning::pull_all_to_all`], default every size): beyond the LL
///   size, an out-of-place all_to_all of whole 16-byte shares runs as one kernel that meets
///   its peers through the LL headers and then, by default ([`CollTuning::push_all_to_all`]),
///   stores every share straight into its receiver's `dst` (or reads it from its sender's
///   `src`): the data crosses the link once, one launch instead of three, and each block
///   starts at a different member, so the copy of a member's own share runs beside the
///   transfers. An all_gather past the LL size runs on the same kernel, every share being the
///   member's whole input (out of place; in place too when it stores).
/// * **Pull all_reduce** ([`CollTuning::pull_all_reduce`]: every size on two-member
///   teams, 8 MiB on larger ones): beyond the LL size, an out-of-place all_reduce of whole
///   16-byte vectors runs as one kernel with the same handshake that folds the members' inputs
///   read in place, in team order (one launch instead of five; a pair moves as many bytes as
///   two-shot, larger teams `members / 2` times as many). A pair from
///   [`CollTuning::push_all_reduce`] (256 MiB) moves its data by stores instead: each
///   member stores its input into the other's `dst` in steps and folds the other's steps as
///   their counts arrive (both GPUs storing at once outrun both loading at once).
/// * **Pull broadcast** ([`CollTuning::pull_broadcast`], the same defaults): beyond the LL
///   size, a broadcast of whole 16-byte vectors (in or out of place) runs as one kernel with
///   the same handshake in which every member reads the root's `src` in place.
/// * **No host synchronisation** inside a collective: launches only, so every collective can
///   be captured in a CUDA graph ([`Stream::begin_capture`]) and replayed. Staging memory (in-place
///   one-shot all_reduce, in-place all_to_all): 64 KiB from [`GpuColl::new`], more allocated on
///   demand outside capture; a capture that would need more than [`GpuColl::reserve`]d is an
///   error. Reserve the most a run needs before its first collective: allocating device
///   memory while peers' kernels already wait in a collective may wait for them (PEs sharing a
///   GPU).
///   Capture and instantiate on every PE before any PE launches its graph (as with kernel
///   loading, the driver may make graph instantiation wait for kernels running on the GPU,
///   and a launched collective waits for its peers).
/// * **Validation before launch**: lengths against the objects, root inside the team, the
///   operation against the element type, strided team, stream of this GPU → [`Error`]. What
///   only the GPU knows (device-side counts of [`GpuColl::all_to_all_v_device`], peers' counts
///   of [`GpuColl::all_to_all_v`]) is checked on the GPU: a violation copies nothing for the
///   offending pairs and raises a flag that [`GpuColl::check_errors`] turns into an error.
/// * **Cross-PE argument check, on the GPU** (no host synchronisation, no extra launch): the
///   first barrier of every collective (the barrier kernel, or the first barrier inside a fused
///   kernel) carries the call's signature, a kernel argument computed on the host: kind,
///   element type, operation, count, root, in place, algorithm, barrier count, the source and
///   destination objects, the team. Each member stores it into every member's slot before the
///   barrier and compares every member's after it. If any differ, no member moves data in that
///   call (its later kernels read a per-team-slot skip flag), every member still performs as
///   many barriers as the longest of the members' calls (nobody hangs, counters stay in step),
///   and [`GpuColl::check_errors`] returns [`Error::CollectiveMismatch`] naming the first
///   differing member and both calls. Graph replays carry the captured signature.
///   [`GpuColl::barrier`] carries none (it has one barrier; a collective needs at least two
///   for the slots to be reused safely), and a call refused on the host launches nothing, so
///   its peers wait for it (device timeout) as before.
/// * **Contract** as for [`crate::coll::Coll`]: every member calls the same collectives in the
///   same order with the same arguments; one stream at a time per [`GpuColl`], whatever the
///   team (its staging memory and all_to_all_v metadata serve every team: in-place calls or
///   all_to_all_v of two teams running at once on two streams would overwrite each other's).
///   Collectives of different teams that run concurrently need a [`GpuColl`] per stream.
/// * **Teams spanning nodes** (a world whose PEs name several nodes: `docs/fabric.md`):
///   every collective decomposes along the team's
///   [`NodeMap`](crate::NodeMap): the node-local paths above on the node's members of the
///   team (on the team's slot; they must be evenly strided, as every device team), and
///   between nodes rounds of puts with signals through the proxy, each member of a node
///   carrying a share, chunked by [`CollTuning::net_chunk_bytes`] (reductions fold each
///   node's partial first and the nodes' partials in node order, so floats group their terms
///   by node). Graph-capturable like the rest (out-of-place reduce_scatter, reduce and
///   in-place all_to_all use staging memory: [`GpuColl::reserve`] before capturing).
///   all_to_all_v puts each share for another node straight at the displacement its
///   receiver published; all_to_all_v_device first sends each member's count row to the
///   members of other nodes (through the proxy, before the ready handshake), so every member
///   computes the same layout and capacity verdict, then puts each share for another node at
///   the place it computed. Teams of more than 64 nodes are an [`Error::Backend`].
///   The signature check covers members of other nodes too (carried with each call's first
///   exchange between two PEs);
///   [`GpuColl::check_errors`] reports a lost node as [`Error::PeerLost`].
/// * **Team size**: no limit of its own except [`GpuColl::all_to_all_v_device`] (its n×n count
///   matrix lives in one block's shared memory: about 170 members on H100/H200; 256 on teams
///   spanning nodes, the rows each PE keeps; an explicit error beyond). Host-count all_to_all_v lists travel in 64-member chunks of kernel
///   arguments (one launch per chunk), copies in launches of 64 descriptors.
///
/// Reductions fold in team order; integers wrap; f16/bf16 accumulate in f32 and round once;
/// min/max ignore a NaN operand (minNum/maxNum) — the same bits as the host collectives.
///
/// ```no_run
/// # fn f(pe: &rshmem::Pe) -> rshmem::Result<()> {
/// use rshmem::coll::{CollConfig, ReduceOp};
/// use rshmem::cuda::{CollTuning, CudaPe, GpuColl};
/// let g = CudaPe::new(pe)?;
/// let coll = GpuColl::new(g, CollConfig::from_env()?, CollTuning::from_env()?)?; // collective (world)
/// let x = pe.alloc::<f32>(1 << 20)?;
/// let s = g.stream()?;
/// coll.all_reduce(&s, pe.world_team(), &x, &x, 1 << 20, ReduceOp::Sum)?; // in place
/// s.synchronize()?;
/// coll.check_errors()?;
/// # Ok(()) }
/// ```
pub struct GpuColl<'a> {
    g: CudaPe<'a>,
    config: CollConfig,
    /// The modules of [`COLL_MODULES`], in that order (their kernels' functions below).
    _modules: Vec<Arc<Module>>,
    /// Kernels of the modules (for `Debug`).
    kernels: usize,
    /// The reduce, LL all_reduce, pull all_reduce and cross-node fold kernel per (element
    /// type, operation), at [`typed_index`]: no name formatting or hashing per call.
    typed: Vec<[Option<Func>; 4]>,
    f_copy: Func,
    f_a2av_dev: Func,
    f_a2av_meta: Func,
    f_a2av_host: Func,
    f_sync_sig: Func,
    /// `rshmemi_coll_ll_move_<kind>_<words|bytes>`: `[kind][bytes]` (kinds MOVE_*).
    f_ll_move: [[Func; 2]; 3],
    f_pull_a2a: Func,
    f_pull_bcast: Func,
    /// Threads per block of the LL kernels (`RSHMEM_CUDA_COLL_LL_THREADS`).
    ll_threads: u32,
    /// `rshmemi_ll::flags` of the LL calls (`ll_early`):
    /// LL_EARLY_LAUNCH where no other PE uses this GPU (unless `RSHMEM_CUDA_COLL_EARLY_LAUNCH=0`).
    ll_flags: u64,
    /// Most lines of an LL all_reduce call with a control warp per block ([`LL_CTRL_LINES`];
    /// 0 where the kernels cannot run a warp more than `ll_threads`).
    ll_ctrl_lines: usize,
    /// Staging memory; earlier (smaller) buffers stay alive for graphs that captured them.
    temp: Mutex<Vec<(DevBuf, usize)>>,
    /// Device error record (u64[ERR_SKIP + team slots]): flags (bit 1: device counts beyond capacity;
    /// bit 2: a2av pairs that do not match; bit 4: signatures that differ), sender, receiver,
    /// needed, capacity of the first capacity violation, the first signature mismatch (member,
    /// both signatures), then one skip flag per team slot.
    err: DevBuf,
    /// Symmetric u64[2·n_pes]: this PE's all_to_all_v send counts and displacements (released
    /// with the world: freeing is collective).
    meta: Sym<u64>,
    /// Symmetric u64[team slots][n_pes][SIG_WORDS]: the signature slots, per team slot and
    /// world PE (zero when consumed).
    sigs: Sym<u64>,
    n_pes: usize,
    /// Largest team of [`GpuColl::all_to_all_v_device`] (its count matrix is in shared memory).
    a2av_dev_max: usize,
    /// Members per all_to_all_v list launch (at most [`A2AV_CHUNK`]).
    a2av_chunk: usize,
    /// Entries per list of a cross-node round launch (at most `net::NET_MAX`).
    net_list: usize,
    sms: u32,
    /// Private stream for the error record (never the legacy default stream: it must not
    /// interact with other PEs' graph captures on the same GPU).
    own: RawStream,
    /// LL paths: their sizes (0: off), their team slots, the symmetric area
    /// (`ll_area_bytes`) and the private notes (`ll_notes` u32 per LL slot).
    ll_sizes: LlSizes,
    ll_slots: usize,
    ll: Option<(Sym<u8>, DevBuf)>,
    /// The paths' limits and the kernels' grids the calls read, LL sizes resolved
    /// ([`GpuColl::tuning`]).
    tuning: CollTuning,
    /// Signals, scratch and pair counts of teams spanning nodes (`None` in a world of one
    /// node).
    net: Option<net::Net>,
}

impl std::fmt::Debug for GpuColl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuColl")
            .field("config", &self.config)
            .field("kernels", &self.kernels)
            .finish()
    }
}

impl<'a> GpuColl<'a> {
    /// Compiles (NVRTC, cached per GPU architecture on disk and per PE in memory; the modules
    /// of [`COLL_MODULES`] on parallel threads, so a cold cache costs about the slowest
    /// module's compile given a core per module) and loads every collective kernel, allocates
    /// its symmetric objects (all_to_all_v metadata, 16 bytes per PE; signature slots,
    /// `48 × n_pes × (max_teams + 1)` bytes) and 64 KiB of staging, and meets the other PEs.
    /// Collective over the world: every PE calls it before any PE launches a collective
    /// (loading a module waits for kernels running on the GPU).
    ///
    /// `tuning` chooses the paths and sizes the kernels ([`CollTuning`]; `CollTuning::from_env`
    /// at a program's edge, or `CollTuning::default()`); every PE must pass the same. The LL
    /// paths: one kernel, no barrier waits, each member pushing its data with a flag in every
    /// 16-byte line into every other member's LL area, for teams of 2 to [`LL_MAX_MEMBERS`]
    /// members in the first 4 team slots (the world's included). Their area is
    /// [`LlSizes::area`], `4 × 2 × n_pes × (48 + 2·region)` bytes of the symmetric heap per PE
    /// (reported in the log); sizes whose area does not fit the heap are an allocation error
    /// here.
    pub fn new(g: CudaPe<'a>, config: CollConfig, tuning: CollTuning) -> Result<GpuColl<'a>> {
        tuning.check()?;
        let ll_sizes = tuning.ll_sizes(g.backend().heap_size, g.pe_ref().n_pes());
        let opts: Vec<&str> = tuning.nvrtc_options.iter().map(|s| s.as_str()).collect();
        let srcs: Vec<String> = COLL_MODULES.iter().map(|m| m.source()).collect();
        let modules = g.modules(&srcs, &opts)?;
        let mut funcs = HashMap::new();
        for (m, module) in COLL_MODULES.iter().zip(&modules) {
            for n in m.kernel_names() {
                let f = module.func(&n)?;
                funcs.insert(n, f);
            }
        }
        let ll_threads = tuning.ll_threads;
        ll_threads_fit(&funcs, ll_threads)?;
        let b = g.backend();
        let own = RawStream::new(&b.gpu)?;
        // Every team slot of the job (the configured teams and the stream barrier's).
        let slots = b.layout.slots;
        let err = DevBuf::zeroed_on(&own, (ERR_SKIP + slots) * 8)?;
        let pe = g.pe_ref();
        let n_pes = pe.n_pes();
        let meta = pe.alloc::<u64>(2 * n_pes)?;
        let sigs = pe.alloc::<u64>(slots * n_pes * SIG_WORDS)?;
        let sp = g.ptr(&sigs)?;
        {
            let _g = b.gpu.bind()?;
            // SAFETY: our own symmetric object's bytes, on our own stream, then synchronised;
            // no peer writes it before the barrier below.
            ffi::check(
                unsafe { ffi::cu::cuMemsetD8Async(sp, 0, sigs.len() * 8, own.raw) },
                "cuMemsetD8Async",
            )?;
            own.sync()?;
        }
        let region = ll_sizes.region();
        let ll_slots = if region > 0 {
            LL_SLOTS.min(b.layout.stream_slot())
        } else {
            0
        };
        let ll = if ll_slots > 0 {
            let bytes = ll_area_bytes(region, n_pes, ll_slots)
                .ok_or_else(|| Error::invalid("LL area size overflows"))?;
            let area = pe.alloc_aligned::<u8>(bytes, 256)?;
            let ap = g.ptr(&area)?;
            let _g = b.gpu.bind()?;
            // SAFETY: our own symmetric object's bytes, on our own stream, then synchronised;
            // no peer writes it before the barrier below.
            ffi::check(
                unsafe { ffi::cu::cuMemsetD8Async(ap, 0, bytes, own.raw) },
                "cuMemsetD8Async",
            )?;
            own.sync()?;
            drop(_g);
            let done = DevBuf::zeroed_on(&own, ll_slots * ll_notes(n_pes) * 4)?;
            tracing::info!(
                all_reduce_bytes = ll_sizes.all_reduce,
                all_to_all_bytes = ll_sizes.all_to_all,
                area_bytes = bytes,
                slots = ll_slots,
                "CUDA collectives: LL area"
            );
            Some((area, done))
        } else {
            None
        };
        // Staging for small in-place collectives now, not in the middle of one.
        let temp = DevBuf::zeroed_on(&own, MIN_STAGING)?;
        let mut typed = vec![[None; 4]; ELEMS.len() * ReduceOp::ALL.len()];
        for k in ELEMS {
            for op in ReduceOp::ALL {
                typed[typed_index(k, op)] = [
                    funcs.get(&reduce_name(k, op)).copied(),
                    funcs.get(&ll_name(k, op)).copied(),
                    funcs.get(&pull_ar_name(k, op)).copied(),
                    funcs.get(&net_fold_name(k, op)).copied(),
                ];
            }
        }
        let f_a2av_dev = funcs["rshmemi_coll_a2av_dev"];
        let a2av_dev_max = a2av_dev_shared(&b.gpu, f_a2av_dev, n_pes)?;
        // Teams spanning nodes: every PE of such a world allocates the same objects.
        let net = if (0..n_pes).any(|p| b.is_remote(p)) {
            let f = (
                funcs["rshmemi_coll_net_round"],
                funcs["rshmemi_coll_net_a2av"],
                funcs["rshmemi_coll_net_a2avd"],
            );
            Some(net::Net::new(&g, &own, f, tuning.net_chunk_bytes, slots)?)
        } else {
            None
        };
        pe.barrier_all()?;
        Ok(GpuColl {
            f_copy: funcs["rshmemi_coll_copy"],
            f_a2av_dev,
            f_a2av_meta: funcs["rshmemi_coll_a2av_meta"],
            f_a2av_host: funcs["rshmemi_coll_a2av_host"],
            f_sync_sig: funcs["rshmemi_coll_sync_sig"],
            f_ll_move: ["a2a", "gather", "bcast"].map(|k| {
                ["words", "bytes"].map(|w| funcs[&format!("rshmemi_coll_ll_move_{k}_{w}")])
            }),
            f_pull_a2a: funcs["rshmemi_coll_pull_a2a"],
            f_pull_bcast: funcs["rshmemi_coll_pull_bcast"],
            ll_threads,
            ll_flags: if g.gpu_alone() && tuning.early_launch {
                LL_EARLY_LAUNCH
            } else {
                0
            },
            ll_ctrl_lines: if ll_ar_threads_fit(&funcs, ll_threads + 32) {
                tuning.ll_ctrl_lines
            } else {
                0
            },
            kernels: funcs.len(),
            typed,
            _modules: modules,
            g,
            config,
            temp: Mutex::new(vec![(temp, MIN_STAGING)]),
            err,
            meta,
            sigs,
            n_pes,
            a2av_dev_max,
            a2av_chunk: A2AV_CHUNK,
            net_list: net::NET_MAX,
            sms: b.gpu.sms().max(1) as u32,
            own,
            ll_sizes,
            ll_slots,
            ll,
            tuning: tuning.with_ll(ll_sizes),
            net,
        })
    }
}

impl<'a> GpuColl<'a> {
    // ----- the collectives -----

    /// Stream-ordered barrier of `team` (earlier work on the stream completes first); members
    /// on other nodes are reached through the proxy.
    pub fn barrier(&self, s: &Stream, team: &Team) -> Result<()> {
        let dt = self.team(s, team)?;
        self.sync(s, dt)
    }

    /// `count` elements of member `root`'s `src` into every member's `dst`.
    pub fn broadcast<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        root: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        check_root(root, dt)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_broadcast(s, &nt, dst, src, count, root);
        }
        self.broadcast_on(s, dt, dst, src, count, root)
    }

    /// [`GpuColl::broadcast`] on a node-local team already resolved and checked against `s`.
    fn broadcast_on<T: Elem>(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        root: usize,
    ) -> Result<()> {
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let es = std::mem::size_of::<T>();
        let algo = self.config.choose(CollKind::Broadcast, count * es);
        let sig = call_sig::<T>(
            CollKind::Broadcast,
            None,
            Some(algo),
            ip,
            count,
            root,
            src,
            dst,
            dt,
        );
        if let Some(ll) = self.ll_bcast_arg(dt, count * es) {
            return self.ll_move(s, dt, sig, ll, (d, sr, count * es), MOVE_BCAST, root);
        }
        if let Some((ll, blocks, chain)) = self.pull_bcast_arg(dt, count * es, sr, d) {
            // A pull call is marked LL and pull (and chain), and names no algorithm.
            let sig = CallSig {
                pull: true,
                chain,
                algo: None,
                ..sig
            };
            let ck = self.ll_check(dt, sig)?;
            let lines = blocks as usize * LL_THREADS as usize;
            let (f, vecs) = (self.f_pull_bcast, count * es / 16);
            let extra = Some(root as u64 | u64::from(chain) << 32);
            let grid = (lines, blocks, LL_THREADS);
            return self.ll_launch(s, f, (d, sr, vecs), grid, dt, ck, ll, extra);
        }
        let plan = plan::broadcast(Self::shape(&dt, ip), root, count, algo);
        self.exec(s, dt, &plan, sr, d, es, None, sig)
    }

    /// The fold (`to.op`) of every member's `src[..count]` into member `to.root`'s
    /// `dst[..count]`.
    pub fn reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        to: ToRoot,
    ) -> Result<()> {
        let ToRoot { op, root } = to;
        let dt = self.team(s, team)?;
        check_root(root, dt)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_reduce(s, &nt, dst, src, count, op, root);
        }
        let f = self.reduce_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let plan = plan::reduce(Self::shape(&dt, ip), root, count);
        let sig = call_sig::<T>(
            CollKind::Reduce,
            Some(op),
            None,
            ip,
            count,
            root,
            src,
            dst,
            dt,
        );
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), Some(f), sig)
    }

    /// The fold of every member's `src[..count]` into every member's `dst[..count]`: `op` a
    /// [`ReduceOp`], or a [`Fold`] with the algorithm forced (`Fold { op, algo: Some(a) }`).
    pub fn all_reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: impl Into<Fold>,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let Fold { op, algo } = op.into();
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_all_reduce(s, &nt, dst, src, count, op, algo);
        }
        self.all_reduce_on(s, dt, dst, src, count, op, algo)
    }

    /// [`GpuColl::all_reduce`] on a team already resolved and checked against `s`; no
    /// algorithm: the pull path where it serves the call, else [`GpuColl::all_reduce_algo`].
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_on<T: Elem>(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        algo: Option<Algo>,
    ) -> Result<()> {
        let f = self.reduce_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let bytes = count * std::mem::size_of::<T>();
        // The pull path serves one-shot calls, chosen or forced, and two-shot ones where no
        // algorithm is forced (it starts past the LL size).
        let forced = algo.or(self.config.algo);
        let pull = matches!(forced, None | Some(Algo::OneShot))
            .then(|| self.pull_ar_arg(dt, bytes, ip, (sr, d), forced.is_none()))
            .flatten();
        let algo = match (algo, &pull) {
            (Some(a), _) => a,
            (None, Some(p)) if p.2 == PULL_AR_TWO_SHOT => Algo::TwoShot,
            (None, Some(_)) => Algo::OneShot,
            (None, None) => self.all_reduce_algo(dt, bytes),
        };
        let sig = call_sig::<T>(
            CollKind::AllReduce,
            Some(op),
            Some(algo),
            ip,
            count,
            0,
            src,
            dst,
            dt,
        );
        if let Some(ll) = self.ll_arg(dt, bytes, algo) {
            let ll = self.ll_early(ll);
            // An LL call names no algorithm (its LL mark does).
            let ck = self.ll_check(dt, CallSig { algo: None, ..sig })?;
            let lf = self.ll_func::<T>(op)?;
            // A block per LL threads × thread lines (LL_THREAD_LINES), up to the block cap.
            let g = self.rules().ll_grid(
                CollKind::AllReduce,
                dt.size as usize,
                bytes,
                self.ll_ctrl_lines,
            );
            let grid = (g.lines, g.cap, self.ll_threads);
            let ll = self.ll_ctrl(ll, g.lines);
            return self.ll_launch(s, lf, (d, sr, count), grid, dt, ck, ll, Some(0));
        }
        if let Some((ll, blocks, mode)) = pull {
            // A pull call is marked LL and pull (and push where a pair stores its data), and
            // names an algorithm only when it runs two-shot.
            let two = mode == PULL_AR_TWO_SHOT;
            let sig = CallSig {
                pull: true,
                push: mode == PULL_AR_PUSH,
                algo: two.then_some(Algo::TwoShot),
                ..sig
            };
            let ll = (ll, blocks);
            return self.pull_fold::<T>(s, dt, (op, mode), sig, ll, (d, sr, count));
        }
        let plan = plan::all_reduce(Self::shape(&dt, ip), count, algo);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), Some(f), sig)
    }

    /// Member j's `src[..count]` into every member's `dst[j·count..]` (in place: the input is
    /// already at `dst[me·count..]`).
    pub fn all_gather<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_all_gather(s, &nt, dst, src, count);
        }
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, if ip { mul(n, count)? } else { count })?;
        let sig = call_sig::<T>(CollKind::AllGather, None, None, ip, count, 0, src, dst, dt);
        let nb = mul(count, std::mem::size_of::<T>())?;
        // In place the input is this member's block of dst.
        let from = if ip {
            d + (dt.my_index as usize * nb) as u64
        } else {
            sr
        };
        if let Some(ll) = self.ll_a2a_arg(dt, nb) {
            return self.ll_move(s, dt, sig, ll, (d, from, nb), MOVE_GATHER, 0);
        }
        // The pull all_to_all's kernel with every share the member's whole input. In place
        // only by stores (no member writes another's own block; loads would need each
        // member's block at its own offset).
        let push = self.pushes_a2a(nb * n);
        if let Some(grid) = self.pull_a2a_arg(dt, nb, ip && !push, from, d) {
            return self.pull_move(s, dt, sig, grid, (d, from, nb), push, true);
        }
        let plan = plan::all_gather(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), None, sig)
    }

    /// The fold of every member's `src[k·count..]` into member k's `dst[..count]` (in place:
    /// into `dst[k·count..]`).
    pub fn reduce_scatter<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_reduce_scatter(s, &nt, dst, src, count, op);
        }
        let f = self.reduce_func::<T>(op)?;
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let d = self.buf(dst, if ip { mul(n, count)? } else { count })?;
        let sig = call_sig::<T>(
            CollKind::ReduceScatter,
            Some(op),
            None,
            ip,
            count,
            0,
            src,
            dst,
            dt,
        );
        let es = std::mem::size_of::<T>();
        let part = mul(count, es)?;
        if let Some(ll) = self.ll_a2a_arg(dt, part) {
            let ll = self.ll_early(ll);
            // The LL all_reduce kernel, each member's part pushed to that member only; in
            // place the result goes to this member's block.
            let lf = self.ll_func::<T>(op)?;
            let ck = self.ll_check(dt, sig)?;
            let to = if ip {
                d + (dt.my_index as usize * part) as u64
            } else {
                d
            };
            let g = self.rules().ll_grid(
                CollKind::ReduceScatter,
                dt.size as usize,
                part * dt.size as usize,
                0,
            );
            let grid = (g.lines, g.cap, self.ll_threads);
            // (No control warp: it makes the reduce_scatter slower.)
            let stride = Some(count as u64);
            return self.ll_launch(s, lf, (to, sr, count), grid, dt, ck, ll, stride);
        }
        if let Some((ll, blocks)) = self.pull_rs_arg(dt, part, ip, (sr, d)) {
            let sig = CallSig { pull: true, ..sig };
            let (ll, mode) = ((ll, blocks), PULL_AR_SCATTER);
            return self.pull_fold::<T>(s, dt, (op, mode), sig, ll, (d, sr, count));
        }
        let plan = plan::reduce_scatter(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, es, Some(f), sig)
    }

    /// Member j's `src[k·count..]` into member k's `dst[j·count..]`.
    pub fn all_to_all<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_all_to_all(s, &nt, dst, src, count);
        }
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let sig = call_sig::<T>(CollKind::AllToAll, None, None, ip, count, 0, src, dst, dt);
        let share = mul(count, std::mem::size_of::<T>())?;
        if let Some(ll) = self.ll_a2a_arg(dt, share) {
            return self.ll_move(s, dt, sig, ll, (d, sr, share), MOVE_A2A, 0);
        }
        if let Some(grid) = self.pull_a2a_arg(dt, share, ip, sr, d) {
            let push = self.pushes_a2a(share * n);
            return self.pull_move(s, dt, sig, grid, (d, sr, share), push, false);
        }
        let plan = plan::all_to_all(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), None, sig)
    }

    /// All-to-all with per-pair counts and displacements known on the host (see
    /// [`AllToAllV`]; the arrays are baked into the launches in chunks of 64 members, one
    /// launch each, so a captured graph replays them and any team size works).
    /// Own ranges are checked here; whether the members' counts pair up is checked on the GPU
    /// (a mismatch copies nothing for that pair; [`GpuColl::check_errors`] reports it).
    /// `src` and `dst` must be different objects.
    pub fn all_to_all_v<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        v: &AllToAllV<'_>,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        if Self::in_place(src, dst)? {
            return Err(Error::invalid(
                "cuda all_to_all_v: src and dst must be different objects",
            ));
        }
        v.check(n, src.raw().len, dst.raw().len)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_all_to_all_v(s, &nt, dst, src, v);
        }
        self.all_to_all_v_on(s, dt, dst, src, v)
    }

    /// [`GpuColl::all_to_all_v`] on a node-local team already resolved and checked against
    /// `s`, `v` checked against the objects.
    fn all_to_all_v_on<T: Elem>(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        v: &AllToAllV<'_>,
    ) -> Result<()> {
        let n = dt.size as usize;
        let (sl, dl) = (src.raw().len, dst.raw().len);
        let sr = self.g.ptr(src)?;
        let d = self.g.ptr(dst)?;
        let mp = self.g.ptr(&self.meta)?;
        let sig = call_sig::<T>(CollKind::AllToAllV, None, None, false, 0, 0, src, dst, dt);
        let ck = self.check(dt, CallSig { syncs: 2, ..sig }.pack()?)?;
        let chunk = self.a2av_chunk.clamp(1, A2AV_CHUNK);
        let list = |c: &[usize], d: &[usize], base: usize| {
            let mut l = A2avList {
                count: [0; A2AV_CHUNK],
                displ: [0; A2AV_CHUNK],
            };
            let cn = (n - base).min(chunk);
            for i in 0..cn {
                l.count[i] = c[base + i] as u64;
                l.displ[i] = d[base + i] as u64;
            }
            (l, cn)
        };
        // The previous all_to_all_v's readers of `meta` finished at its closing barrier.
        for base in (0..n).step_by(chunk) {
            let (mut send, cn) = list(v.send_counts, v.send_displs, base);
            let (mut m, mut b, mut ni, mut st) = (mp, base as i32, cn as i32, self.n_pes as u64);
            let mut p = [
                &mut m as *mut u64 as *mut std::ffi::c_void,
                &mut send as *mut A2avList as *mut _,
                &mut b as *mut i32 as *mut _,
                &mut ni as *mut i32 as *mut _,
                &mut st as *mut u64 as *mut _,
            ];
            // SAFETY: matches rshmemi_coll_a2av_meta(u64*, rshmemi_a2av_list, int, int, u64);
            // meta holds 2·n_pes words and base + cn <= n <= n_pes.
            unsafe { gpu::launch(&s.raw, self.f_a2av_meta, 1, 64, 0, &mut p)? };
        }
        self.sig_sync(s, dt, ck)?;
        let es = std::mem::size_of::<T>() as u64;
        for base in (0..n).step_by(chunk) {
            let (mut recv, cn) = list(v.recv_counts, v.recv_displs, base);
            let max = v.recv_counts[base..base + cn]
                .iter()
                .max()
                .copied()
                .unwrap_or(0) as u64
                * es;
            let per = self.per(max, cn);
            let (mut dd, mut ss, mut mm, mut e) = (d, sr, mp, self.err.ptr);
            let (mut b, mut ni, mut st) = (base as i32, cn as i32, self.n_pes as u64);
            let (mut el, mut sc, mut dc, mut t) = (es, sl as u64, dl as u64, dt);
            let mut p = [
                &mut dd as *mut u64 as *mut std::ffi::c_void,
                &mut ss as *mut u64 as *mut _,
                &mut mm as *mut u64 as *mut _,
                &mut recv as *mut A2avList as *mut _,
                &mut b as *mut i32 as *mut _,
                &mut ni as *mut i32 as *mut _,
                &mut st as *mut u64 as *mut _,
                &mut e as *mut u64 as *mut _,
                &mut el as *mut u64 as *mut _,
                &mut sc as *mut u64 as *mut _,
                &mut dc as *mut u64 as *mut _,
                &mut t as *mut DeviceTeam as *mut _,
            ];
            // SAFETY: matches rshmemi_coll_a2av_host; the kernel bounds every copy by the
            // src/dst lengths; senders base .. base + cn are team members.
            unsafe {
                gpu::launch(
                    &s.raw,
                    self.f_a2av_host,
                    cn as u32 * per,
                    THREADS,
                    0,
                    &mut p,
                )?
            };
        }
        self.sync(s, dt)
    }

    fn per(&self, max_bytes: u64, n: usize) -> u32 {
        let limit = ((4 * self.sms) as usize / n.max(1)).max(1) as u64;
        max_bytes.div_ceil(THREADS as u64 * 64).clamp(1, limit) as u32
    }

    /// All-to-all with counts known only on the GPU: member j sends `counts.send[k]` (this
    /// PE's copy of the symmetric `counts.send`, ≥ team-size u64 words, written by earlier
    /// stream work) elements to member k, packed in member order from `src[0]`; member k
    /// receives them packed in member order from `dst[0]` and gets the per-sender counts in its
    /// `counts.recv` (≥ team-size words). The counts are exchanged on the device (each member
    /// reads every member's counts after a barrier; on a team spanning nodes the members of
    /// other nodes put their counts through the proxy first), so the call captures into a
    /// graph; the
    /// capacity bound is the objects' lengths. If any sender's total exceeds `src`'s length or
    /// any receiver's total exceeds `dst`'s, every member copies nothing, writes the counts it
    /// saw to `counts.recv`, and raises a device flag: [`GpuColl::check_errors`] (after a
    /// synchronize, outside capture) returns [`Error::Capacity`]. Never an out-of-bounds write.
    pub fn all_to_all_v_device<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        counts: DeviceCounts<'_>,
    ) -> Result<()> {
        let DeviceCounts {
            send: send_counts,
            recv: recv_counts,
        } = counts;
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        if n > self.a2av_dev_max {
            return Err(Error::invalid(format!(
                "cuda all_to_all_v_device: a team of {n} members; this GPU serves at most {} \
                 (the {n}×{n} count matrix must fit in one block's shared memory); use \
                 all_to_all_v with host counts",
                self.a2av_dev_max
            )));
        }
        if Self::in_place(src, dst)? {
            return Err(Error::invalid(
                "cuda all_to_all_v_device: src and dst must be different objects",
            ));
        }
        self.buf(send_counts, n)?;
        self.buf(recv_counts, n)?;
        let sig = raw_sig(
            SigKind::A2avDevice,
            T::KIND,
            None,
            None,
            false,
            0,
            send_counts.raw().offset,
            src.raw(),
            dst.raw(),
            dt,
        );
        let ck = self.check(dt, CallSig { syncs: 2, ..sig }.pack()?)?;
        if let Some(nt) = self.net_team(team, dt)? {
            return self.net_all_to_all_v_device(s, &nt, dst, src, counts, ck);
        }
        self.sig_sync(s, dt, ck)?;
        self.a2av_dev_launch(s, dt, dst, src, counts, [0; 3])?;
        self.sync(s, dt)
    }
}

/// The symmetric count arrays of [`GpuColl::all_to_all_v_device`]: what this PE sends to each
/// member (written by earlier stream work) and, written by the call, what it receives from
/// each.
#[derive(Clone, Copy)]
pub struct DeviceCounts<'a> {
    /// Elements to each member, one u64 per member.
    pub send: &'a dyn AsSym<u64>,
    /// Elements from each member, one u64 per member (written by the call).
    pub recv: &'a dyn AsSym<u64>,
}
