//! Stream-ordered collectives on the CUDA backend: [`GpuColl`] (its docs describe the design).

use super::api::{CudaPe, DeviceTeam, Stream};
use super::coll_tuning::{CollTuning, PerTeam};
use super::gpu::{self, DevBuf, Func, Module, RawStream};
use super::{ffi, nvrtc};
use crate::coll::plan::{self, Algo, Buf, CollKind, Plan, Shape, Step};
use crate::coll::{AllToAllV, CollConfig, ReduceOp};
use crate::elem::{Elem, ElemKind};
use crate::error::{Error, Result};
use crate::sym::{AsSym, RawSym, Sym};
use crate::team::Team;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Copies per copy-kernel launch (`RSHMEMI_COLL_MAX_COPIES`); more copies take more launches.
const MAX_COPIES: usize = 64;
/// Members per all_to_all_v (host counts) list chunk, one launch each (`RSHMEMI_A2AV_CHUNK`).
const A2AV_CHUNK: usize = 64;
const THREADS: u32 = 512;
/// Staging memory allocated up front (and the least any growth allocates).
const MIN_STAGING: usize = 1 << 16;

// Signatures and the error record: mirrors `kernels/coll.cu`.
/// Words of a call signature (`RSHMEMI_SIG_WORDS`).
const SIG_WORDS: usize = 6;
/// Error record flags.
const ERR_CAPACITY: u64 = 1;
const ERR_A2AV: u64 = 2;
const ERR_MISMATCH: u64 = 4;
/// Error record words: the first differing member (world PE), this PE's and its signature.
const ERR_MM_PE: usize = 5;
const ERR_MM_MINE: usize = 6;
const ERR_MM_THEIRS: usize = ERR_MM_MINE + SIG_WORDS;
/// First skip flag (one per team slot); the words before it are the record proper.
const ERR_SKIP: usize = 32;
const _: () = assert!(ERR_MM_THEIRS + SIG_WORDS <= ERR_SKIP);

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CopyDesc {
    dst: u64,
    src: u64,
    bytes: u64,
    pe: i64,
}

#[repr(C)]
struct Copies {
    d: [CopyDesc; MAX_COPIES],
}

#[repr(C)]
struct A2avList {
    count: [u64; A2AV_CHUNK],
    displ: [u64; A2AV_CHUNK],
}

/// The kinds a signature names: the plan collectives and the device-count all_to_all_v.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SigKind {
    Coll(CollKind),
    A2avDevice,
}

impl SigKind {
    fn code(self) -> u64 {
        match self {
            SigKind::Coll(k) => k.code(),
            SigKind::A2avDevice => CollKind::ALL.len() as u64 + 1,
        }
    }
    fn name(self) -> &'static str {
        match self {
            SigKind::Coll(k) => k.name(),
            SigKind::A2avDevice => "all_to_all_v_device",
        }
    }
    fn from_code(c: u64) -> Option<SigKind> {
        CollKind::ALL
            .iter()
            .map(|&k| SigKind::Coll(k))
            .chain([SigKind::A2avDevice])
            .find(|k| k.code() == c)
    }
}

/// Everything about one collective call that must agree across the team's members, as its
/// first barrier carries it (see `kernels/coll.cu`): packed into [`SIG_WORDS`] words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CallSig {
    kind: SigKind,
    elem: ElemKind,
    op: Option<ReduceOp>,
    algo: Option<Algo>,
    in_place: bool,
    /// Barriers the call performs (every member pads to the largest on a mismatch).
    syncs: usize,
    count: u64,
    /// The root (broadcast, reduce); the counts object's offset (all_to_all_v_device).
    aux: u64,
    /// Byte offsets of the symmetric source and destination.
    src: u64,
    dst: u64,
    /// The team as every member sees it (size, first member, stride).
    team: (i32, i32, i32),
    /// Runs as an LL call (no barrier waits; see `kernels/coll.cu`).
    ll: bool,
    /// Runs as the pull all_to_all (LL handshake, data read from the peers' src).
    pull: bool,
    /// A pull broadcast along a chain (each member reads from the one before it).
    chain: bool,
    /// A pair's pull all_reduce moving its data by stores (each member into the other's dst).
    push: bool,
}

const SIG_MARK: u64 = 1 << 63;

fn fnv(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    })
}

impl CallSig {
    fn pack(&self) -> Result<[u64; SIG_WORDS]> {
        let syncs = u64::try_from(self.syncs)
            .ok()
            .filter(|&x| x <= 0xffff)
            .ok_or_else(|| Error::invalid("collective plan with more than 65535 barriers"))?;
        let w0 = SIG_MARK
            | syncs << 32
            | self.kind.code()
            | (self.elem as u64 + 1) << 8
            | self.op.map_or(0, ReduceOp::code) << 16
            | u64::from(self.in_place) << 24
            | self.algo.map_or(0, Algo::code) << 25
            | u64::from(self.ll) << 27
            | u64::from(self.pull) << 28
            | u64::from(self.chain) << 29
            | u64::from(self.push) << 30;
        let (size, start, stride) = self.team;
        let team = fnv(&[size as u64, start as u64, stride as u64]);
        Ok([w0, self.count, self.aux, self.src, self.dst, team])
    }

    /// Barriers the call of a packed signature performs (as the kernels read it).
    fn syncs_of(w: &[u64; SIG_WORDS]) -> usize {
        ((w[0] >> 32) & 0xffff) as usize
    }

    /// A packed signature in words, for error messages.
    fn describe(w: &[u64; SIG_WORDS]) -> String {
        if w[0] & SIG_MARK == 0 {
            return "no collective signature (a different call: a barrier, an LL all_reduce, a \
                    collective that failed its own checks, or none)"
                .to_string();
        }
        let kind = SigKind::from_code(w[0] & 0xff);
        let elem = ELEMS.iter().find(|k| **k as u64 + 1 == (w[0] >> 8) & 0xff);
        let op = ReduceOp::ALL
            .iter()
            .find(|o| o.code() == (w[0] >> 16) & 0xff);
        let algo = [Algo::OneShot, Algo::TwoShot]
            .into_iter()
            .find(|a| a.code() == (w[0] >> 25) & 3);
        let mut out = format!(
            "{} {}",
            kind.map_or("?", SigKind::name),
            elem.map_or("?", |e| e.name())
        );
        if let Some(op) = op {
            out += &format!(" {}", op.name());
        }
        out += &format!(" count {}", w[1]);
        match kind {
            Some(SigKind::Coll(CollKind::Broadcast | CollKind::Reduce)) => {
                out += &format!(" root {}", w[2])
            }
            Some(SigKind::A2avDevice) => out += &format!(" counts @{:#x}", w[2]),
            _ => {}
        }
        out += &format!(
            " in_place {} algo {} barriers {} src @{:#x} dst @{:#x} team {:x}",
            (w[0] >> 24) & 1 != 0,
            if (w[0] >> 30) & 1 != 0 {
                "push"
            } else if (w[0] >> 29) & 1 != 0 {
                "chain"
            } else if (w[0] >> 28) & 1 != 0 && algo == Some(Algo::TwoShot) {
                "pull_two_shot"
            } else if (w[0] >> 28) & 1 != 0 {
                "pull"
            } else if (w[0] >> 27) & 1 != 0 {
                "ll"
            } else {
                algo.map_or("-", Algo::name)
            },
            Self::syncs_of(w),
            w[3],
            w[4],
            w[5]
        );
        out
    }
}

/// What a collective's first barrier needs (`rshmemi_check`): the signature, this PE's slot
/// row of the team's slot, the error record.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Check {
    sig: [u64; SIG_WORDS],
    slots: u64,
    err: u64,
}

const ELEMS: [ElemKind; 12] = [
    ElemKind::I8,
    ElemKind::I16,
    ElemKind::I32,
    ElemKind::I64,
    ElemKind::U8,
    ElemKind::U16,
    ElemKind::U32,
    ElemKind::U64,
    ElemKind::F16,
    ElemKind::Bf16,
    ElemKind::F32,
    ElemKind::F64,
];

fn reduce_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_reduce_{}_{}", k.name(), op.name())
}

/// The kernel names of `kernels/coll.cu` (every one is compiled and loaded by [`GpuColl::new`]).
pub fn coll_kernel_names() -> Vec<String> {
    let mut v = vec![
        "rshmemi_coll_copy".to_string(),
        "rshmemi_coll_a2av_dev".to_string(),
        "rshmemi_coll_a2av_meta".to_string(),
        "rshmemi_coll_a2av_host".to_string(),
        "rshmemi_coll_sync_sig".to_string(),
        "rshmemi_coll_ll_move_a2a_words".to_string(),
        "rshmemi_coll_ll_move_a2a_bytes".to_string(),
        "rshmemi_coll_ll_move_gather_words".to_string(),
        "rshmemi_coll_ll_move_gather_bytes".to_string(),
        "rshmemi_coll_ll_move_bcast_words".to_string(),
        "rshmemi_coll_ll_move_bcast_bytes".to_string(),
        "rshmemi_coll_pull_a2a".to_string(),
        "rshmemi_coll_pull_bcast".to_string(),
    ];
    for k in ELEMS {
        for op in ReduceOp::ALL {
            if op.supports(k) {
                v.push(reduce_name(k, op));
                v.push(ll_name(k, op));
                v.push(pull_ar_name(k, op));
            }
        }
    }
    v
}

/// Where [`GpuColl`] keeps the kernels of (element type, operation).
fn typed_index(k: ElemKind, op: ReduceOp) -> usize {
    k as usize * ReduceOp::ALL.len() + op as usize
}

fn pull_ar_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_pull_ar_{}_{}", k.name(), op.name())
}

fn ll_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_ll_{}_{}", k.name(), op.name())
}

/// Most members of a team the LL paths serve (`RSHMEMI_LL_MAX_MEMBERS` of `coll.cu`).
pub const LL_MAX_MEMBERS: usize = 16;
/// Team slots with an LL area (the world's and the first teams made after it).
const LL_SLOTS: usize = 4;
/// Most blocks of an LL all_reduce: its blocks wait for peers, so they must leave SMs to the
/// peers' kernels when PEs share a GPU. 2x H100, graph replay, a line per thread, 64 against
/// 128 blocks: 256 KiB 6.20 against 5.47 us.
pub(super) const LL_MAX_BLOCKS: u32 = 128;
/// Most lines per LL all_reduce thread (`RSHMEMI_LL_U` of `coll.cu`: one batch of loads).
pub(super) const LL_LINES_PER_THREAD: usize = 4;
/// Lines per LL all_reduce thread the grid is sized for below the block cap: one, so a call
/// spreads over as many SMs as it can (one SM stores into a peer at only about 13-20 GB/s).
/// 2x H100, graph replay, 4 against 1: 8 KiB 4.75 against 4.00 us, 64 KiB 5.19 against 4.08,
/// 128 KiB 5.52 against 4.48; reduce_scatter 64 KiB 5.18 against 4.22.
pub(super) const LL_THREAD_LINES: usize = 1;
/// Most blocks of an LL all_to_all (bandwidth-bound up to its larger size; the same care).
/// 2x H200, graph replay, 32 against 64 blocks: all_to_all 1 MiB 7.62 against 7.26 us,
/// all_gather 1 MiB 7.90 against 7.33 (128: 7.42 and 7.63).
pub(super) const LL_A2A_MAX_BLOCKS: u32 = 64;
/// An LL all_to_all of more than two lines per thread on that many blocks spreads over up to
/// twice as many, two lines per thread (each kernel runs the batch its lines need, `coll.cu`).
/// 2x H100, graph replay, early launch, 64 against 128 blocks: 1 MiB 6.69 against 6.45-6.55 us;
/// 512 KiB (two lines per thread on 64) 4.97-5.00 against 5.19-5.31, so not below. The
/// all_gather (1 MiB 6.56-6.62 against 6.59-6.63) and the broadcast (512 KiB 5.45-5.46 against
/// 5.59-5.60) keep 64.
fn ll_a2a_grid_cap(lines: usize, threads: u32, cap: u32) -> u32 {
    let per_two = lines.div_ceil(2 * threads as usize);
    if per_two > cap as usize {
        per_two.min(2 * cap as usize) as u32
    } else {
        cap
    }
}
/// The LL data kernels' kinds (`RSHMEMI_LL_A2A`, `RSHMEMI_LL_GATHER`, `RSHMEMI_LL_BCAST`):
/// the rows of `f_ll_move`.
const MOVE_A2A: usize = 0;
const MOVE_GATHER: usize = 1;
const MOVE_BCAST: usize = 2;
/// Bit 1 of the pull all_to_all kernel's last argument: an all_gather (`coll.cu`).
const A2A_GATHER: u64 = 2;
/// The pull all_reduce kernel's modes (`RSHMEMI_PULL_AR_*` of `coll.cu`): a pair by stores,
/// two-shot, reduce_scatter.
const PULL_AR_PUSH: u64 = 1;
const PULL_AR_TWO_SHOT: u64 = 2;
const PULL_AR_SCATTER: u64 = 4;
pub(super) const LL_THREADS: u32 = 256;
/// Most blocks of a pull kernel (they wait for peers, like the LL kernels, but one block per
/// SM of an H100/H200 at most). 2x H200, same run, 64 against 128 blocks: a pair's all_reduce
/// by stores 1 GiB 342 against 360 GB/s bus bandwidth, all_to_all by stores 1 GiB 319 against
/// 348 (BENCHMARKS.md).
pub(super) const PULL_MAX_BLOCKS: u32 = 128;
/// Bytes per pull all_to_all block: two rounds of eight 16-byte loads per thread.
pub(super) const PULL_BLOCK_BYTES: usize = LL_THREADS as usize * 256;
/// Bytes per pull all_reduce block: one round of eight 16-byte vectors per thread (32-bit
/// types; fewer for narrower ones, whose accumulators take more registers).
pub(super) const PULL_AR_BLOCK_BYTES: usize = LL_THREADS as usize * 128;

/// The LL argument of `coll.cu` (`rshmemi_ll`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LlArg {
    area: u64,
    lines: u64,
    done: u64,
    /// LL_EARLY_LAUNCH, LL_CTRL_WARP or 0.
    flags: u64,
}

/// `rshmemi_ll::flags` bit (`RSHMEMI_LL_CTRL_WARP`): the LL all_reduce / reduce_scatter kernel
/// runs a control warp per block beside its data threads (it pushes the header and takes the
/// verdict; the data threads poll their first lines beside it instead of after it). Set for
/// the all_reduce only ([`LL_CTRL_LINES`]; the reduce_scatter was slower with it).
const LL_CTRL_WARP: u64 = 2;
/// Most lines (threads at a line each) of an LL all_reduce call that runs with a control warp
/// per block (`RSHMEM_CUDA_COLL_LL_CTRL_LINES`; 0: never); calls of one block
/// run without (their one warp of verdicts folds its line beside it anyway). 2x H200, graph,
/// same binary, with / without: all_reduce 4 KiB 2.75-2.79 / 2.94-2.96 us, 8 KiB 2.84-2.86 /
/// 2.95-2.96, 16 KiB 2.93-2.96 / 2.98-2.99, 32 KiB 3.04-3.05 / 3.00-3.10, 64 KiB 3.23-3.25 /
/// 3.01-3.05 (every thread polling while the lines still come in slows the larger calls).
pub(super) const LL_CTRL_LINES: usize = 2048;

/// Whether an LL all_reduce call of `lines` lines on blocks of `threads` data threads runs a
/// control warp per block: on more than one block, up to `ctrl_lines` lines.
fn uses_ctrl_warp(lines: usize, threads: u32, ctrl_lines: usize) -> bool {
    lines > threads as usize && lines <= ctrl_lines
}

/// `rshmemi_ll::flags` bit (`RSHMEMI_LL_EARLY_LAUNCH`): the kernel lets the next dependent
/// kernel launch as soon as it starts (only where this PE has its GPU to itself).
const LL_EARLY_LAUNCH: u64 = 1;

/// Largest default LL all_reduce size (`RSHMEM_CUDA_COLL_LL_BYTES` unset): 512 KiB, the
/// largest size where the LL all_reduce beat NCCL on 2 H200s (1.09x at 512 KiB, 0.87x at
/// 1 MiB, graph replay; the barrier-based two-shot took twice NCCL's time from 256 KiB).
pub const COLL_LL_BYTES: usize = 512 << 10;
/// Largest default LL all_to_all size (`RSHMEM_CUDA_COLL_LL_A2A_BYTES` unset; all of a
/// member's input, every pair's share together): 1 MiB.
pub const COLL_LL_A2A_BYTES: usize = 1 << 20;

/// The sizes of the LL paths, and of the area they share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlSizes {
    /// Largest all_reduce message of the LL path (0: none).
    pub all_reduce: usize,
    /// Largest all_to_all input of the LL path, all pairs' shares together (0: none); a
    /// pair's share must also be a multiple of 8 bytes.
    pub all_to_all: usize,
}

impl LlSizes {
    /// Payload bytes of one (half, source) region of the area: an all_reduce message, or one
    /// pair's share of an all_to_all of a team of 2 (the largest share).
    pub fn region(&self) -> usize {
        self.all_reduce.max(self.all_to_all / 2)
    }
    /// Bytes of a PE's LL area for `n_pes` PEs (every LL team slot).
    pub fn area(&self, n_pes: usize) -> Option<usize> {
        ll_area_bytes(self.region(), n_pes, LL_SLOTS)
    }
}

/// The default LL sizes for a heap of `heap` bytes per PE and `n_pes` PEs: from
/// [`COLL_LL_BYTES`] and [`COLL_LL_A2A_BYTES`], the all_to_all size halved first (down to
/// twice the all_reduce size, where it needs no area of its own), then both, until the LL
/// area takes at most 1/16 of the heap; both 0 (off) when the all_reduce size would fall
/// below 1 KiB. With the default 128 MiB heap: 128 KiB / 256 KiB for 2 PEs, 32 KiB / 64 KiB
/// for 8, 4 KiB / 8 KiB for 72; with 2.5 GiB (the benchmarks), 512 KiB / 1 MiB for 2.
pub fn default_ll_sizes(heap: usize, n_pes: usize) -> LlSizes {
    let mut z = LlSizes {
        all_reduce: COLL_LL_BYTES,
        all_to_all: COLL_LL_A2A_BYTES,
    };
    while z.all_reduce >= 1024 {
        if z.area(n_pes).is_some_and(|a| a <= heap / 16) {
            return z;
        }
        if z.all_to_all / 2 > z.all_reduce {
            z.all_to_all /= 2;
        } else {
            z.all_reduce /= 2;
            z.all_to_all = 2 * z.all_reduce;
        }
    }
    LlSizes {
        all_reduce: 0,
        all_to_all: 0,
    }
}

/// Most blocks of any LL or pull kernel (`RSHMEMI_LL_MAX_BLOCKS` of `coll.cu`): each block
/// keeps its own copy of the pair sequences, so a call's blocks never wait for one another at
/// its end (an end of several blocks took 850-930 cycles against 320-440 for one when block
/// 0 moved a single copy once every block had read it).
pub(super) const LL_KERNEL_MAX_BLOCKS: u32 = 128;

/// Private u32 words per LL slot: the blocks' end arrivals (`rshmemi_ll_end`), then per block
/// (up to [`LL_KERNEL_MAX_BLOCKS`]) and world PE the pair's sequence, whose parity names the
/// half this PE writes next into that PE's area.
fn ll_notes(n_pes: usize) -> usize {
    1 + LL_KERNEL_MAX_BLOCKS as usize * n_pes
}
// Every LL grid the defaults give fits (an all_to_all spreads over up to twice its cap).
const _: () = assert!(
    LL_MAX_BLOCKS <= LL_KERNEL_MAX_BLOCKS
        && 2 * LL_A2A_MAX_BLOCKS <= LL_KERNEL_MAX_BLOCKS
        && PULL_MAX_BLOCKS <= LL_KERNEL_MAX_BLOCKS
);

/// Lines of one (half, source) LL region for messages up to `bytes`: the signature, then 8
/// bytes of data per line.
fn ll_lines(bytes: usize) -> usize {
    SIG_WORDS + bytes.div_ceil(8)
}

/// Bytes of a PE's LL area: per LL slot, two halves of `n_pes` sources' lines of 16 bytes.
fn ll_area_bytes(ll_bytes: usize, n_pes: usize, slots: usize) -> Option<usize> {
    ll_lines(ll_bytes)
        .checked_mul(16)?
        .checked_mul(n_pes)?
        .checked_mul(2)?
        .checked_mul(slots)
}

/// Stream-ordered collectives of one PE on the CUDA backend.
///
/// The algorithms are the host collectives' plans ([`crate::coll::plan`]), run by a GPU
/// executor: every [`Step::Sync`] becomes a one-block team barrier kernel (monotonically
/// increasing counters in device memory, so a captured graph replays correctly), and the
/// copy or reduce steps between two syncs become one kernel (`kernels/coll.cu`) that reads the
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
/// * **Small messages** ([`GpuColl::fused_bytes`], default 64 KiB read per PE,
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
///   barrier counters stay in step (see `kernels/coll.cu`).
/// * **Pull all_to_all** ([`GpuColl::pull_a2a_bytes`], default every size): beyond the LL
///   size, an out-of-place all_to_all of whole 16-byte shares runs as one kernel that meets
///   its peers through the LL headers and then, by default ([`GpuColl::push_a2a_bytes`]),
///   stores every share straight into its receiver's `dst` (or reads it from its sender's
///   `src`): the data crosses the link once, one launch instead of three, and each block
///   starts at a different member, so the copy of a member's own share runs beside the
///   transfers. An all_gather past the LL size runs on the same kernel, every share being the
///   member's whole input (out of place; in place too when it stores).
/// * **Pull all_reduce** ([`GpuColl::pull_all_reduce_bytes`]: every size on two-member
///   teams, 8 MiB on larger ones): beyond the LL size, an out-of-place all_reduce of whole
///   16-byte vectors runs as one kernel with the same handshake that folds the members' inputs
///   read in place, in team order (one launch instead of five; a pair moves as many bytes as
///   two-shot, larger teams `members / 2` times as many). A pair from
///   [`GpuColl::push_all_reduce_bytes`] (256 MiB) moves its data by stores instead: each
///   member stores its input into the other's `dst` in steps and folds the other's steps as
///   their counts arrive (both GPUs storing at once outrun both loading at once).
/// * **Pull broadcast** ([`GpuColl::pull_broadcast_bytes`], the same defaults): beyond the LL
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
/// * **Team size**: no limit of its own except [`GpuColl::all_to_all_v_device`] (its n×n count
///   matrix lives in one block's shared memory: about 170 members on H100/H200; an explicit
///   error beyond). Host-count all_to_all_v lists travel in 64-member chunks of kernel
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
    _module: Arc<Module>,
    /// Kernels of the module (for `Debug`).
    kernels: usize,
    /// The reduce and LL all_reduce kernel per (element type, operation), at
    /// [`typed_index`]: no name formatting or hashing per call.
    typed: Vec<[Option<Func>; 3]>,
    f_copy: Func,
    f_a2av_dev: Func,
    f_a2av_meta: Func,
    f_a2av_host: Func,
    f_sync_sig: Func,
    /// `rshmemi_coll_ll_move_<kind>_<words|bytes>`: `[kind][bytes]` (kinds MOVE_*).
    f_ll_move: [[Func; 2]; 3],
    f_pull_a2a: Func,
    f_pull_bcast: Func,
    /// Largest all_to_all input (all shares) of the pull path (0: off).
    pull_a2a_bytes: usize,
    /// Most blocks of the LL data kernel (`RSHMEM_CUDA_COLL_LL_A2A_BLOCKS`).
    ll_a2a_blocks: u32,
    /// Most blocks of the LL all_reduce kernel (`RSHMEM_CUDA_COLL_LL_BLOCKS`).
    ll_blocks: u32,
    /// Data lines per thread the LL all_reduce's grid is sized for, below its block cap
    /// (`RSHMEM_CUDA_COLL_LL_THREAD_LINES`).
    ll_thread_lines: usize,
    /// Threads per block of the LL kernels (`RSHMEM_CUDA_COLL_LL_THREADS`).
    ll_threads: u32,
    /// `rshmemi_ll::flags` of the LL calls (`ll_early`):
    /// LL_EARLY_LAUNCH where no other PE uses this GPU (unless `RSHMEM_CUDA_COLL_EARLY_LAUNCH=0`).
    ll_flags: u64,
    /// Most lines of an LL all_reduce call with a control warp per block ([`LL_CTRL_LINES`];
    /// 0 where the kernels cannot run a warp more than `ll_threads`).
    ll_ctrl_lines: usize,
    /// Most blocks of the pull kernels (`RSHMEM_CUDA_COLL_PULL_BLOCKS`).
    pull_blocks: u32,
    /// Bytes per block of the pull all_to_all and broadcast, and of the pull all_reduce
    /// (`RSHMEM_CUDA_COLL_PULL_BLOCK_BYTES`, `RSHMEM_CUDA_COLL_PULL_AR_BLOCK_BYTES`).
    pull_block_bytes: [usize; 2],
    /// Largest all_reduce of the pull path (0: off), by team size.
    pull_all_reduce: PerTeam,
    /// Smallest pull all_reduce of a pair that moves its data by stores (0: never).
    push_all_reduce: usize,
    /// Smallest all_reduce that runs the pull way two-shot (0: never), by team size.
    two_shot_pull: PerTeam,
    /// Largest reduce_scatter input (every member's part) of the pull path (0: off).
    pull_rs_bytes: usize,
    push_a2a: usize,
    /// Largest broadcast of the pull path (0: off), by team size.
    pull_bcast: PerTeam,
    /// Broadcasts past this size on teams of more than two run the pull way as a chain.
    chain_bcast: usize,
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
    sms: u32,
    /// Bytes read per PE up to which a one-phase plan runs as one fused kernel.
    fused_bytes: usize,
    /// Private stream for the error record (never the legacy default stream: it must not
    /// interact with other PEs' graph captures on the same GPU).
    own: RawStream,
    /// LL paths: their sizes (0: off), their team slots, the symmetric area
    /// (`ll_area_bytes`) and the private notes (`ll_notes` u32 per LL slot).
    ll_sizes: LlSizes,
    ll_slots: usize,
    ll: Option<(Sym<u8>, DevBuf)>,
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
    /// Compiles (NVRTC, cached per GPU architecture on disk and per PE in memory) and loads
    /// every collective kernel, allocates its symmetric objects (all_to_all_v metadata,
    /// 16 bytes per PE; signature slots, `48 × n_pes × (max_teams + 1)` bytes) and 64 KiB of
    /// staging, and meets the other PEs. Collective over the world: every PE calls it before
    /// any PE launches a collective (loading a module waits for kernels running on the GPU).
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
        let names = coll_kernel_names();
        let opts: Vec<&str> = tuning.nvrtc_options.iter().map(|s| s.as_str()).collect();
        let k = g.kernel(nvrtc::COLL_KERNELS, &names[0], &opts)?;
        let module = k.module.clone();
        let mut funcs = HashMap::new();
        for n in &names {
            funcs.insert(n.clone(), module.func(n)?);
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
        let mut typed = vec![[None; 3]; ELEMS.len() * ReduceOp::ALL.len()];
        for k in ELEMS {
            for op in ReduceOp::ALL {
                typed[typed_index(k, op)] = [
                    funcs.get(&reduce_name(k, op)).copied(),
                    funcs.get(&ll_name(k, op)).copied(),
                    funcs.get(&pull_ar_name(k, op)).copied(),
                ];
            }
        }
        let f_a2av_dev = funcs["rshmemi_coll_a2av_dev"];
        let a2av_dev_max = a2av_dev_shared(&b.gpu, f_a2av_dev, n_pes)?;
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
            pull_a2a_bytes: tuning.pull_all_to_all,
            ll_a2a_blocks: tuning.ll_a2a_blocks,
            ll_blocks: tuning.ll_blocks,
            ll_thread_lines: tuning.ll_thread_lines,
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
            pull_blocks: tuning.pull_blocks,
            pull_block_bytes: [tuning.pull_block_bytes, tuning.pull_all_reduce_block_bytes],
            pull_all_reduce: tuning.pull_all_reduce,
            push_all_reduce: tuning.push_all_reduce,
            two_shot_pull: tuning.two_shot_pull,
            pull_rs_bytes: tuning.pull_reduce_scatter,
            push_a2a: tuning.push_all_to_all,
            pull_bcast: tuning.pull_broadcast,
            chain_bcast: tuning.chain_broadcast,
            kernels: funcs.len(),
            typed,
            _module: module,
            g,
            config,
            temp: Mutex::new(vec![(temp, MIN_STAGING)]),
            err,
            meta,
            sigs,
            n_pes,
            a2av_dev_max,
            a2av_chunk: A2AV_CHUNK,
            sms: b.gpu.sms().max(1) as u32,
            fused_bytes: tuning.fused_bytes,
            own,
            ll_sizes,
            ll_slots,
            ll,
        })
    }

    /// The configuration (algorithm choice).
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// Makes sure `bytes` of staging memory exist (call before capturing an in-place one-shot
    /// all_reduce or in-place all_to_all of that size; calls outside capture grow it on demand,
    /// but best before the first collective: see the [`GpuColl`] docs). 64 KiB exist from
    /// [`GpuColl::new`].
    pub fn reserve(&self, bytes: usize) -> Result<()> {
        self.temp_addr(None, bytes).map(|_| ())
    }

    fn temp_addr(&self, s: Option<&Stream>, bytes: usize) -> Result<u64> {
        let mut t = self.temp.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((b, cap)) = t.last() {
            if *cap >= bytes {
                return Ok(b.ptr);
            }
        }
        if let Some(s) = s {
            if s.is_capturing()? {
                return Err(Error::invalid(format!(
                    "this collective needs {bytes} bytes of staging memory, more than reserved; \
                     call GpuColl::reserve({bytes}) (or run it once) before capturing"
                )));
            }
        }
        let cap = bytes.next_power_of_two().max(MIN_STAGING);
        let b = DevBuf::zeroed_on(&self.own, cap)?;
        let p = b.ptr;
        t.push((b, cap));
        Ok(p)
    }

    /// Reads and clears the device error flags; call after the stream is synchronised, outside
    /// capture. Members whose calls differ (the signatures their first barriers carried)
    /// become [`Error::CollectiveMismatch`] naming the first differing member and both calls
    /// (reported in preference to the others; those calls moved no data on any member).
    /// Device-side count violations become [`Error::Capacity`] (device counts beyond
    /// the objects) or [`Error::InvalidArgument`] (counts that do not pair up); device wait
    /// timeouts become [`Error::Timeout`]. After a device wait of this PE timed out, its
    /// collectives move no data (barriers still run) until this check or [`Pe::quiet`](crate::Pe::quiet) clears
    /// the flag: a PE that gave up on a barrier never overwrites what its peers may still read.
    pub fn check_errors(&self) -> Result<()> {
        // The device timeout flag is read (and cleared) after the record: a mismatch, which
        // makes members pad their barriers, is the cause to report before any timeout.
        let timeout = self.g.check_device_errors();
        let b = self.g.backend();
        let mut w = [0u64; ERR_SKIP];
        let bytes = ERR_SKIP * 8;
        let _g = b.gpu.bind()?;
        // SAFETY: the record proper (the skip flags stay) of our own error record into a
        // local, on our own stream (then synchronised); cleared the same way.
        unsafe {
            ffi::check(
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    w.as_mut_ptr() as *mut _,
                    self.err.ptr,
                    bytes,
                    self.own.raw,
                ),
                "cuMemcpyDtoHAsync",
            )?;
            self.own.sync()?;
            if w[0] != 0 {
                ffi::check(
                    ffi::cu::cuMemsetD8Async(self.err.ptr, 0, bytes, self.own.raw),
                    "cuMemsetD8Async",
                )?;
                self.own.sync()?;
            }
        }
        if let Some(e) = mismatch_error(&w) {
            return Err(e);
        }
        timeout?;
        let v = [w[0], w[1], w[2], w[3], w[4]].map(|x| x as usize);
        if w[0] & ERR_CAPACITY != 0 {
            return Err(Error::Capacity {
                op: "cuda all_to_all_v (device counts)",
                src_pe: v[1],
                dst_pe: v[2],
                needed: v[3],
                capacity: v[4],
            });
        }
        if w[0] & ERR_A2AV != 0 {
            return Err(Error::invalid(
                "cuda all_to_all_v: counts or displacements did not pair up between members \
                 or exceeded the objects; nothing was copied for those pairs",
            ));
        }
        Ok(())
    }

    // ----- validation helpers -----

    fn team(&self, s: &Stream, team: &Team) -> Result<DeviceTeam> {
        self.g.check_stream_pub(s)?;
        self.g.device_team(team)
    }

    fn buf<T: Elem>(&self, x: &(impl AsSym<T> + ?Sized), need: usize) -> Result<u64> {
        let r = x.raw();
        if need > r.len {
            return Err(Error::OutOfBounds {
                start: 0,
                end: need,
                len: r.len,
            });
        }
        self.g.ptr(x)
    }

    /// `Some(true)`: same object; `Some(false)`: disjoint; error when they partly overlap.
    fn in_place<T: Elem>(
        src: &(impl AsSym<T> + ?Sized),
        dst: &(impl AsSym<T> + ?Sized),
    ) -> Result<bool> {
        let (a, b) = (src.raw(), dst.raw());
        if a.offset == b.offset && a.len == b.len {
            return Ok(true);
        }
        if a.overlaps(&b, std::mem::size_of::<T>()) {
            return Err(Error::invalid(
                "src and dst partly overlap (in place means the same object)",
            ));
        }
        Ok(false)
    }

    fn shape(dt: &DeviceTeam, in_place: bool) -> Shape {
        Shape {
            n: dt.size as usize,
            me: dt.my_index as usize,
            in_place,
            chunk: usize::MAX,
        }
    }

    /// The LL all_reduce kernel of `T` and `op` (checked by [`GpuColl::reduce_func`] first).
    fn ll_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        self.typed[typed_index(T::KIND, op)][1]
            .ok_or_else(|| Error::invalid("no LL kernel for this type"))
    }

    /// The pull all_reduce kernel of `T` and `op` (checked by [`GpuColl::reduce_func`] first).
    fn pull_ar_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        self.typed[typed_index(T::KIND, op)][2]
            .ok_or_else(|| Error::invalid("no pull all_reduce kernel for this type"))
    }

    fn reduce_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        op.check(T::KIND)?;
        self.typed[typed_index(T::KIND, op)][0]
            .ok_or_else(|| Error::invalid("no reduction kernel for this type"))
    }

    // ----- launches -----

    fn sync(&self, s: &Stream, dt: DeviceTeam) -> Result<()> {
        let mut t = dt;
        let mut p = [&mut t as *mut DeviceTeam as *mut std::ffi::c_void];
        let threads = dt.sync_threads();
        // SAFETY: matches rshmemi_team_sync(rshmem_team) (five ints, repr(C)).
        unsafe { gpu::launch(&s.raw, self.g.backend().f_team_sync, 1, threads, 0, &mut p) }
    }

    /// The check argument of a call on `dt` with signature `sig` (default: data kernels that
    /// only read the skip flag).
    fn check(&self, dt: DeviceTeam, sig: [u64; SIG_WORDS]) -> Result<Check> {
        let row = (dt.slot as usize) * self.n_pes * SIG_WORDS * 8;
        Ok(Check {
            sig,
            slots: self.g.ptr(&self.sigs)? + row as u64,
            err: self.err.ptr,
        })
    }

    /// The first barrier of a call: carries and checks the signature (`rshmemi_coll_sync_sig`).
    fn sig_sync(&self, s: &Stream, dt: DeviceTeam, ck: Check) -> Result<()> {
        let (mut t, mut c) = (dt, ck);
        let mut p = [
            &mut t as *mut DeviceTeam as *mut std::ffi::c_void,
            &mut c as *mut Check as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_sync_sig(rshmem_team, rshmemi_check) (repr(C)); the
        // slot row is ours (symmetric, n_pes × SIG_WORDS words), err our record.
        unsafe { gpu::launch(&s.raw, self.f_sync_sig, 1, dt.sync_threads(), 0, &mut p) }
    }

    fn flush(
        &self,
        s: &Stream,
        copies: &mut Vec<CopyDesc>,
        dt: DeviceTeam,
        fused: bool,
        ck: Check,
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let n = copies.len();
        let max = copies.iter().map(|c| c.bytes).max().unwrap_or(0);
        let per_block = (THREADS as u64) * 64;
        let limit = ((4 * self.sms) as usize / n).max(1) as u64;
        let per = max.div_ceil(per_block).clamp(1, limit) as u32;
        let grid = if fused { 1 } else { n as u32 * per };
        let (mut t, mut fu, mut k) = (dt, fused as i32, ck);
        let mut c = Copies {
            d: [CopyDesc::default(); MAX_COPIES],
        };
        c.d[..n].copy_from_slice(copies);
        let mut ni = n as i32;
        let mut p = [
            &mut c as *mut Copies as *mut std::ffi::c_void,
            &mut ni as *mut i32 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut fu as *mut i32 as *mut _,
            &mut k as *mut Check as *mut _,
        ];
        copies.clear();
        // SAFETY: matches rshmemi_coll_copy(rshmemi_copies, int, rshmem_team, int,
        // rshmemi_check): every
        // descriptor's source is a checked range of a symmetric object (translated on the
        // device) or our staging buffer, its destination a checked range of this PE's memory.
        unsafe { gpu::launch(&s.raw, self.f_copy, grid, THREADS, 0, &mut p) }
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_launch(
        &self,
        s: &Stream,
        f: Func,
        dst: u64,
        src: u64,
        len: usize,
        es: usize,
        dt: DeviceTeam,
        fused: bool,
        ck: Check,
    ) -> Result<()> {
        let vecs = (len * es / 16 + 1) as u64;
        let blocks = vecs.div_ceil(THREADS as u64).clamp(1, 4 * self.sms as u64) as u32;
        let blocks = if fused { 1 } else { blocks };
        let (mut d, mut sr, mut n, mut t) = (dst, src, len as u64, dt);
        let (mut fu, mut k) = (fused as i32, ck);
        let mut p = [
            &mut d as *mut u64 as *mut std::ffi::c_void,
            &mut sr as *mut u64 as *mut _,
            &mut n as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut fu as *mut i32 as *mut _,
            &mut k as *mut Check as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_reduce_*(T*, const T*, u64, rshmem_team, int,
        // rshmemi_check); ranges checked.
        unsafe { gpu::launch(&s.raw, f, blocks, THREADS, 0, &mut p) }
    }

    /// The LL argument of team `dt`: LL on, a team of 2 to [`LL_MAX_MEMBERS`] in an LL slot.
    fn ll_team_arg(&self, dt: DeviceTeam) -> Option<LlArg> {
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
    fn ll_ctrl(&self, ll: LlArg, lines: usize) -> LlArg {
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
    fn ll_early(&self, ll: LlArg) -> LlArg {
        LlArg {
            flags: self.ll_flags,
            ..ll
        }
    }

    /// The LL argument when an all_reduce of `bytes` on `dt` runs the LL way: the message
    /// within the LL size, not forced two-shot, the team served ([`GpuColl::ll_team_arg`]).
    fn ll_arg(&self, dt: DeviceTeam, bytes: usize, algo: Algo) -> Option<LlArg> {
        let fits = bytes > 0 && bytes <= self.ll_ar_max(dt) && algo == Algo::OneShot;
        fits.then(|| self.ll_team_arg(dt)).flatten()
    }

    /// The LL argument when a data movement whose members each send `share` bytes per pair
    /// (an all_to_all's share, an all_gather's input; a reduce_scatter's part) on `dt` runs
    /// the LL way: all of them together within the LL all_to_all size, a share within a
    /// region, the team served.
    fn ll_a2a_arg(&self, dt: DeviceTeam, share: usize) -> Option<LlArg> {
        let total = share.checked_mul(dt.size.max(0) as usize)?;
        let fits =
            share > 0 && total <= self.ll_sizes.all_to_all && share <= self.ll_sizes.region();
        fits.then(|| self.ll_team_arg(dt)).flatten()
    }

    /// The LL argument when a broadcast of `bytes` on `dt` runs the LL way: within the LL
    /// all_reduce size (the same traffic: one message to every member), no algorithm forced,
    /// the team served.
    fn ll_bcast_arg(&self, dt: DeviceTeam, bytes: usize) -> Option<LlArg> {
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
    fn ll_move(
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
            ll_a2a_grid_cap(lines, self.ll_threads, self.ll_a2a_blocks)
        } else {
            self.ll_a2a_blocks
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
    fn pull_grid(
        &self,
        dt: DeviceTeam,
        fits: bool,
        bytes: usize,
        per_block: usize,
    ) -> Option<(LlArg, u32)> {
        let ll = fits.then(|| self.ll_team_arg(dt)).flatten()?;
        let blocks = bytes
            .div_ceil(per_block)
            .clamp(1, self.pull_blocks as usize);
        (ll.lines as usize >= SIG_WORDS + blocks).then_some((ll, blocks as u32))
    }

    /// The LL argument and grid when an all_to_all of `share` bytes per pair on `dt` runs
    /// the pull way: out of place, the shares whole 16-byte vectors at 16-byte aligned
    /// addresses, all of them together within [`GpuColl::pull_a2a_bytes`], the team served by
    /// the LL paths with a line per block after the header in its regions.
    fn pull_a2a_arg(
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
            && total <= self.pull_a2a_bytes;
        let remote = share * (dt.size.max(1) as usize - 1);
        self.pull_grid(dt, fits, remote, self.pull_block_bytes[0])
    }

    /// The LL argument and grid when an all_reduce of `bytes` on `dt` runs the pull way (a
    /// one-shot fold of the members' inputs read in place, after an LL handshake): beyond the
    /// LL size, within [`GpuColl::pull_all_reduce_bytes`] for the team's size, out of place,
    /// whole 16-byte vectors at 16-byte aligned addresses, the team served by the LL paths
    /// with a line per block after the header in its regions.
    /// With `two_ok` (no algorithm forced), past [`GpuColl::two_shot_pull_bytes`] for the
    /// team's size, the call runs two-shot (whatever the one-shot limit). Returns the kernel's
    /// mode word too (`RSHMEMI_PULL_AR_*` of `coll.cu`).
    fn pull_ar_arg(
        &self,
        dt: DeviceTeam,
        bytes: usize,
        in_place: bool,
        (src, dst): (u64, u64),
        two_ok: bool,
    ) -> Option<(LlArg, u32, u64)> {
        let members = dt.size.max(0) as usize;
        let two = two_ok && self.two_shot_pull.reached(members, bytes);
        let fits = !in_place
            && bytes > self.ll_ar_max(dt)
            && (two || bytes <= self.pull_all_reduce.of(members))
            && bytes.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        // The two-shot's blocks each fold 1/members of their bytes: half the one-shot's bytes
        // per block, so a call spreads over more SMs.
        let per_block = self.pull_block_bytes[1] / if two { 2 } else { 1 };
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
    fn pull_rs_arg(
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
            && total <= self.pull_rs_bytes
            && part.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        self.pull_grid(dt, fits, total, self.pull_block_bytes[1])
    }

    /// Whether a pull all_reduce of `bytes` on `dt` moves its data by stores (a pair, from
    /// [`GpuColl::push_all_reduce_bytes`]).
    fn pushes(&self, dt: DeviceTeam, bytes: usize) -> bool {
        dt.size == 2 && self.push_all_reduce > 0 && bytes >= self.push_all_reduce
    }

    /// Whether a pull all_to_all or all_gather of `total` bytes (all shares) stores its shares
    /// ([`GpuColl::push_a2a_bytes`]).
    fn pushes_a2a(&self, total: usize) -> bool {
        self.push_a2a > 0 && total >= self.push_a2a
    }

    /// The check argument of an LL call with signature `sig` (marked LL; its barrier count,
    /// 2, is only compared: an LL call runs none).
    fn ll_check(&self, dt: DeviceTeam, sig: CallSig) -> Result<Check> {
        let sig = CallSig {
            syncs: 2,
            ll: true,
            ..sig
        };
        self.check(dt, sig.pack()?)
    }

    /// Whether an all_reduce of `bytes` on `team` runs the LL way (what the benchmarks report).
    pub(crate) fn all_reduce_uses_ll(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let algo = self.all_reduce_algo(dt, bytes);
            self.ll_arg(dt, bytes, algo).is_some()
        })
    }

    /// The algorithm of an all_reduce of `bytes` on `dt`: the configured choice, except that a
    /// message within the LL size on a team the LL path serves runs one-shot (the LL path)
    /// unless an algorithm is forced ([`CollConfig::algo`]): the LL path beats the barrier-based
    /// two-shot up to its size.
    fn all_reduce_algo(&self, dt: DeviceTeam, bytes: usize) -> Algo {
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
    pub fn all_to_all_uses_ll(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let share = bytes / (dt.size.max(1) as usize);
            share * dt.size as usize == bytes && self.ll_a2a_arg(dt, share).is_some()
        })
    }

    /// Whether a collective of nccl-tests' size `bytes` (the all_gather output, the
    /// reduce_scatter input, the all_to_all buffer, the message otherwise) on `team` runs the
    /// LL way (what the benchmarks report).
    pub(crate) fn uses_ll(&self, kind: CollKind, team: &Team, bytes: usize) -> bool {
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
    fn pull_bcast_arg(
        &self,
        dt: DeviceTeam,
        bytes: usize,
        src: u64,
        dst: u64,
    ) -> Option<(LlArg, u32, bool)> {
        let fits = self.config.algo.is_none()
            && bytes > 0
            && self.ll_bcast_arg(dt, bytes).is_none()
            && bytes <= self.pull_bcast.of(dt.size.max(0) as usize)
            && bytes.is_multiple_of(16)
            && (src | dst).is_multiple_of(16);
        let (ll, blocks) = self.pull_grid(dt, fits, bytes, self.pull_block_bytes[0])?;
        let chain = dt.size > 2 && bytes > self.chain_bcast;
        let lines = SIG_WORDS + blocks as usize * if chain { 2 } else { 1 };
        (ll.lines as usize >= lines).then_some((ll, blocks, chain))
    }

    /// Whether a broadcast of `bytes` on `team` between 4096-aligned buffers runs the pull
    /// way (what the benchmarks report).
    pub fn broadcast_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g
            .device_team(team)
            .is_ok_and(|dt| self.pull_bcast_arg(dt, bytes, 0, 0).is_some())
    }

    /// Whether a broadcast of `bytes` on `team` between 4096-aligned buffers runs the pull
    /// way along a chain.
    pub fn broadcast_uses_chain(&self, team: &Team, bytes: usize) -> bool {
        self.g
            .device_team(team)
            .is_ok_and(|dt| self.pull_bcast_arg(dt, bytes, 0, 0).is_some_and(|a| a.2))
    }

    /// Whether an out-of-place all_reduce of `bytes` on `team` between 4096-aligned buffers
    /// runs the pull way (what the benchmarks report).
    pub fn all_reduce_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.all_reduce_pull_mode(team, bytes).is_some()
    }

    /// Whether an out-of-place all_reduce of `bytes` on `team` between 4096-aligned buffers
    /// runs the pull way two-shot (what the benchmarks report).
    pub fn all_reduce_uses_two_shot_pull(&self, team: &Team, bytes: usize) -> bool {
        self.all_reduce_pull_mode(team, bytes) == Some(PULL_AR_TWO_SHOT)
    }

    /// Whether an out-of-place reduce_scatter of `bytes` (every member's part) on `team`
    /// between 4096-aligned buffers runs the pull way (what the benchmarks report).
    pub fn reduce_scatter_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let n = dt.size.max(1) as usize;
            bytes.is_multiple_of(n) && self.pull_rs_arg(dt, bytes / n, false, (0, 0)).is_some()
        })
    }

    /// The pull kernel's mode word of an out-of-place all_reduce of `bytes` on `team` between
    /// 4096-aligned buffers, if it runs the pull way.
    fn all_reduce_pull_mode(&self, team: &Team, bytes: usize) -> Option<u64> {
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
    pub fn all_to_all_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.g.device_team(team).is_ok_and(|dt| {
            let share = bytes / (dt.size.max(1) as usize);
            share * dt.size as usize == bytes
                && self.ll_a2a_arg(dt, share).is_none()
                && self.pull_a2a_arg(dt, share, false, 0, 0).is_some()
        })
    }

    /// Bytes up to which all_reduce runs the LL way on a pair (0: never; see
    /// [`CollTuning::ll_sizes`]); larger teams stop earlier ([`GpuColl::ll_all_reduce_bytes`]).
    pub fn ll_bytes(&self) -> usize {
        self.ll_sizes.all_reduce
    }

    /// Bytes up to which an all_reduce on a team of `members` runs the LL way: the LL size on
    /// a pair, `2 / members` of it on larger teams (rounded down to 16 bytes). Each member
    /// pushes its whole message, twice its size with the flags, to every other member, so the
    /// LL path's traffic grows with the team where the two-shot pull's stays about twice the
    /// message: the size where the pull overtakes it shrinks as the team grows (BENCHMARKS.md,
    /// 4x H200).
    pub fn ll_all_reduce_bytes(&self, members: usize) -> usize {
        if members <= 2 {
            self.ll_sizes.all_reduce
        } else {
            self.ll_sizes.all_reduce * 2 / members / 16 * 16
        }
    }

    fn ll_ar_max(&self, dt: DeviceTeam) -> usize {
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
    fn ll_launch(
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
    fn pull_move(
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

    /// Runs `plan` on the stream: barriers for syncs (the first carries `sig`), one kernel per
    /// phase.
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        plan: &Plan,
        src: u64,
        dst: u64,
        es: usize,
        reduce: Option<Func>,
        sig: CallSig,
    ) -> Result<()> {
        if plan.steps.first() != Some(&Step::Sync) || plan.syncs() < 2 {
            return Err(Error::invalid(
                "internal: a collective plan must start with a barrier and have two",
            ));
        }
        let ck = self.check(
            dt,
            CallSig {
                syncs: plan.syncs(),
                ..sig
            }
            .pack()?,
        )?;
        let temp = if plan.temp_len > 0 {
            self.temp_addr(Some(s), plan.temp_len * es)?
        } else {
            0
        };
        let addr = |b: Buf, at: usize| -> u64 {
            (match b {
                Buf::Src => src,
                Buf::Dst => dst,
                Buf::Temp => temp,
            }) + (at * es) as u64
        };
        let fused = self.fusable(plan, es);
        let steps = if fused {
            &plan.steps[1..plan.steps.len() - 1]
        } else {
            &plan.steps[..]
        };
        let mut copies = Vec::new();
        let mut first = true;
        for step in steps {
            match *step {
                Step::Sync => {
                    self.flush(s, &mut copies, dt, false, ck)?;
                    if std::mem::take(&mut first) {
                        self.sig_sync(s, dt, ck)?;
                    } else {
                        self.sync(s, dt)?;
                    }
                }
                Step::Copy {
                    peer,
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    if len == 0 {
                        continue;
                    }
                    let pe = if from == Buf::Temp {
                        -1
                    } else {
                        (dt.start as i64) + peer as i64 * dt.stride as i64
                    };
                    copies.push(CopyDesc {
                        dst: addr(to, to_at),
                        src: addr(from, from_at),
                        bytes: (len * es) as u64,
                        pe,
                    });
                    if copies.len() == MAX_COPIES {
                        self.flush(s, &mut copies, dt, fused, ck)?;
                    }
                }
                Step::Reduce {
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    self.flush(s, &mut copies, dt, fused, ck)?;
                    if len > 0 {
                        let f = reduce.ok_or_else(|| Error::invalid("plan reduces without op"))?;
                        self.reduce_launch(
                            s,
                            f,
                            addr(to, to_at),
                            addr(from, from_at),
                            len,
                            es,
                            dt,
                            fused,
                            ck,
                        )?;
                    }
                }
            }
        }
        self.flush(s, &mut copies, dt, fused, ck)
    }

    fn fusable(&self, plan: &Plan, es: usize) -> bool {
        fusable(plan, es, self.fused_bytes)
    }

    /// Bytes read per PE up to which a one-phase collective runs as one fused launch.
    pub fn fused_bytes(&self) -> usize {
        self.fused_bytes
    }

    /// Sets [`GpuColl::fused_bytes`] (0: never fuse).
    pub fn set_fused_bytes(&mut self, bytes: usize) {
        self.fused_bytes = bytes;
    }

    /// Largest all_to_all input or all_gather output (every pair's share together) of the
    /// pull path (0: off;
    /// default [`COLL_PULL_A2A_BYTES`], environment `RSHMEM_CUDA_COLL_PULL_A2A_BYTES`): an
    /// out-of-place all_to_all beyond the LL size whose shares are whole 16-byte vectors runs
    /// as one kernel of up to 128 blocks that moves every share straight between the members'
    /// buffers after an LL handshake (by stores, see [`GpuColl::push_a2a_bytes`]; the data
    /// crosses the link once, no barrier waits), on a team the LL paths serve; so does an
    /// all_gather of that size.
    pub fn pull_a2a_bytes(&self) -> usize {
        self.pull_a2a_bytes
    }

    /// Largest all_reduce of the pull path on a team of `members` (0: off): an out-of-place
    /// all_reduce past the LL size of whole 16-byte vectors runs one-shot as one kernel that
    /// meets its peers through the LL headers and folds their inputs read in place (no barrier
    /// launches), on a team the LL paths serve, unless an algorithm other than one-shot is
    /// forced. Defaults: [`COLL_PULL_ALL_REDUCE_PAIR_BYTES`] (every size) for two members,
    /// [`COLL_PULL_ALL_REDUCE_BYTES`] for more; `RSHMEM_CUDA_COLL_PULL_ALL_REDUCE_BYTES` sets
    /// both.
    pub fn pull_all_reduce_bytes(&self, members: usize) -> usize {
        self.pull_all_reduce.of(members)
    }

    /// Sets [`GpuColl::pull_all_reduce_bytes`] for every team size. Every PE must set the same.
    pub fn set_pull_all_reduce_bytes(&mut self, bytes: usize) {
        self.pull_all_reduce = PerTeam::all(bytes);
    }

    /// Smallest pull all_reduce of a two-member team that moves its data by stores (0: never):
    /// each member stores its input into the other's `dst` in steps, publishing a count per
    /// step after a system-scope fence, and folds the other's steps into its own `dst` as they
    /// arrive. Both GPUs storing at once move more than both loading at once (2x H200: 365
    /// against 336 GB/s each way), but the fence per step costs more than that gains below
    /// about 256 MiB. Default [`COLL_PUSH_ALL_REDUCE_BYTES`];
    /// `RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES`.
    pub fn push_all_reduce_bytes(&self) -> usize {
        self.push_all_reduce
    }

    /// Sets [`GpuColl::push_all_reduce_bytes`] (0: never; 1: every pull size). Both members of
    /// a pair must set the same (a call that differs is reported as a mismatch).
    pub fn set_push_all_reduce_bytes(&mut self, bytes: usize) {
        self.push_all_reduce = bytes;
    }

    /// Smallest pull all_to_all or all_gather (every pair's share together, see
    /// [`GpuColl::pull_a2a_bytes`]) whose members store their shares into the others' `dst`
    /// instead of reading them from the others' `src` (0: never): after the same handshake, a
    /// system-scope fence before each block's done line. Default [`COLL_PUSH_A2A_BYTES`];
    /// `RSHMEM_CUDA_COLL_PUSH_A2A_BYTES`.
    pub fn push_a2a_bytes(&self) -> usize {
        self.push_a2a
    }

    /// Sets [`GpuColl::push_a2a_bytes`] (0: never; 1: every pull size). Every member must set
    /// the same (a call that differs is reported as a mismatch).
    pub fn set_push_a2a_bytes(&mut self, bytes: usize) {
        self.push_a2a = bytes;
    }

    /// Whether an out-of-place all_to_all of `bytes` (all shares) on `team` between
    /// 4096-aligned buffers runs the pull path by stores (what the benchmarks report).
    pub fn all_to_all_uses_push(&self, team: &Team, bytes: usize) -> bool {
        self.all_to_all_uses_pull(team, bytes) && self.pushes_a2a(bytes)
    }

    /// Whether an out-of-place all_gather of `bytes` (the whole output) on `team` between
    /// 4096-aligned buffers runs the pull all_to_all's kernel (what the benchmarks report): the
    /// same sizes as [`GpuColl::all_to_all_uses_pull`].
    pub fn all_gather_uses_pull(&self, team: &Team, bytes: usize) -> bool {
        self.all_to_all_uses_pull(team, bytes)
    }

    /// Whether that all_gather stores its shares ([`GpuColl::push_a2a_bytes`]).
    pub fn all_gather_uses_push(&self, team: &Team, bytes: usize) -> bool {
        self.all_to_all_uses_push(team, bytes)
    }

    /// Whether an out-of-place all_reduce of `bytes` on `team` between 4096-aligned buffers
    /// runs the pull path by stores (what the benchmarks report).
    pub fn all_reduce_uses_push(&self, team: &Team, bytes: usize) -> bool {
        self.all_reduce_pull_mode(team, bytes) == Some(PULL_AR_PUSH)
    }

    /// Smallest all_reduce of a team of `members` that runs the pull way two-shot (0: never):
    /// an out-of-place all_reduce of whole 16-byte vectors past the LL size, no algorithm
    /// forced, on a team the LL paths serve: after the pull handshake each member folds one
    /// `1/members` part of the vectors from every member's src and stores it into every
    /// member's dst, then a done line per block after a system-scope fence. Each member moves
    /// `(members - 1) / members` of the message over its links each way, where the one-shot
    /// pull reads `members - 1` times the message. Defaults:
    /// [`COLL_TWO_SHOT_PULL_PAIR_BYTES`] for two members, [`COLL_TWO_SHOT_PULL_BYTES`] for
    /// more; `RSHMEM_CUDA_COLL_TWO_SHOT_PULL_BYTES` sets both.
    pub fn two_shot_pull_bytes(&self, members: usize) -> usize {
        self.two_shot_pull.of(members)
    }

    /// Sets [`GpuColl::two_shot_pull_bytes`] for every team size. Every PE must set the same
    /// (a member that runs a call another way is reported as a mismatch).
    pub fn set_two_shot_pull_bytes(&mut self, bytes: usize) {
        self.two_shot_pull = PerTeam::all(bytes);
    }

    /// Largest reduce_scatter input (every member's part together) of the pull path (0: off):
    /// an out-of-place reduce_scatter past the LL size whose parts are whole 16-byte vectors
    /// at 16-byte aligned addresses runs as one kernel in which every member folds its part of
    /// the members' inputs, read in place, after the pull handshake (no barrier launches).
    /// Default [`COLL_PULL_RS_BYTES`]; `RSHMEM_CUDA_COLL_PULL_RS_BYTES`.
    pub fn pull_reduce_scatter_bytes(&self) -> usize {
        self.pull_rs_bytes
    }

    /// Sets [`GpuColl::pull_reduce_scatter_bytes`]. Every PE must set the same.
    pub fn set_pull_reduce_scatter_bytes(&mut self, bytes: usize) {
        self.pull_rs_bytes = bytes;
    }

    /// Largest broadcast of the pull path on a team of `members` (0: off): a broadcast past
    /// the LL size of whole 16-byte vectors runs as one kernel that meets its peers through
    /// the LL headers, every member reading the root's `src` in place or, on teams of more
    /// than two past [`GpuColl::chain_broadcast_bytes`], the one before it along a chain from
    /// the root (in or out of place; no barrier launches), on a team the LL paths serve,
    /// unless an algorithm is forced. Default `COLL_PULL_BCAST_BYTES` (`usize::MAX`: every size);
    /// `RSHMEM_CUDA_COLL_PULL_BCAST_BYTES` sets it for every team size.
    pub fn pull_broadcast_bytes(&self, members: usize) -> usize {
        self.pull_bcast.of(members)
    }

    /// Sets [`GpuColl::pull_broadcast_bytes`] for every team size. Every PE must set the same.
    pub fn set_pull_broadcast_bytes(&mut self, bytes: usize) {
        self.pull_bcast = PerTeam::all(bytes);
    }

    /// Pull broadcasts past this size on teams of more than two members run along a chain
    /// (the member at distance p from the root reads from the one at p - 1, in steps), so
    /// each link carries the message once; up to it every member reads the root's `src`
    /// (fewer hops of latency, the root's links carrying `members - 1` copies). Default
    /// `COLL_CHAIN_BCAST_BYTES` (1 MiB); `RSHMEM_CUDA_COLL_CHAIN_BCAST_BYTES` sets it.
    pub fn chain_broadcast_bytes(&self) -> usize {
        self.chain_bcast
    }

    /// Sets [`GpuColl::chain_broadcast_bytes`]. Every PE should set the same (a member that
    /// differs is reported as a mismatch).
    pub fn set_chain_broadcast_bytes(&mut self, bytes: usize) {
        self.chain_bcast = bytes;
    }

    /// Sets [`GpuColl::pull_a2a_bytes`]. Every PE must set the same (a member that runs a call
    /// another way is reported as a mismatch).
    pub fn set_pull_a2a_bytes(&mut self, bytes: usize) {
        self.pull_a2a_bytes = bytes;
    }

    /// Members per [`GpuColl::all_to_all_v`] list launch, 1 to 64 (the default, and the most
    /// a launch's arguments hold): smaller values only add launches. For tests, which cover
    /// several chunks with small teams this way.
    #[doc(hidden)]
    pub fn set_a2av_chunk(&mut self, members: usize) -> Result<()> {
        if !(1..=A2AV_CHUNK).contains(&members) {
            return Err(Error::invalid(format!(
                "all_to_all_v chunk of {members} members: 1 to {A2AV_CHUNK}"
            )));
        }
        self.a2av_chunk = members;
        Ok(())
    }

    /// The largest team [`GpuColl::all_to_all_v_device`] serves on this GPU.
    pub fn all_to_all_v_device_max_team(&self) -> usize {
        self.a2av_dev_max
    }

    // ----- the collectives -----

    /// Stream-ordered barrier of `team` (earlier work on the stream completes first).
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

    /// The fold of every member's `src[..count]` into member `root`'s `dst[..count]`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        check_root(root, dt)?;
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

    /// The fold of every member's `src[..count]` into every member's `dst[..count]`.
    pub fn all_reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        self.all_reduce_on(s, dt, dst, src, count, op, None)
    }

    /// [`GpuColl::all_reduce`] with a forced algorithm.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_with<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        algo: Algo,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        self.all_reduce_on(s, dt, dst, src, count, op, Some(algo))
    }

    /// [`GpuColl::all_reduce_with`] on a team already resolved and checked against `s`; no
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
            let lines = bytes.div_ceil(8).div_ceil(self.ll_thread_lines);
            let grid = (lines, self.ll_blocks, self.ll_threads);
            let ll = self.ll_ctrl(ll, lines);
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
            let ck = self.ll_check(dt, sig)?;
            let pf = self.pull_ar_func::<T>(op)?;
            let grid = (blocks as usize * LL_THREADS as usize, blocks, LL_THREADS);
            return self.ll_launch(s, pf, (d, sr, count), grid, dt, ck, ll, Some(mode));
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
            let lines = part.div_ceil(8).div_ceil(self.ll_thread_lines);
            let grid = (lines, self.ll_blocks, self.ll_threads);
            // (No control warp: 2x H200, graph, with / without, 8 KiB 2.92-2.94 / 2.89-2.90
            // us, 16 KiB 3.03-3.06 / 2.91-2.97, 64 KiB 3.25-3.26 / 2.98-3.02.)
            let stride = Some(count as u64);
            return self.ll_launch(s, lf, (to, sr, count), grid, dt, ck, ll, stride);
        }
        if let Some((ll, blocks)) = self.pull_rs_arg(dt, part, ip, (sr, d)) {
            let sig = CallSig { pull: true, ..sig };
            let ck = self.ll_check(dt, sig)?;
            let pf = self.pull_ar_func::<T>(op)?;
            let grid = (blocks as usize * LL_THREADS as usize, blocks, LL_THREADS);
            let mode = Some(PULL_AR_SCATTER);
            return self.ll_launch(s, pf, (d, sr, count), grid, dt, ck, ll, mode);
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
        let (sl, dl) = (src.raw().len, dst.raw().len);
        v.check(n, sl, dl)?;
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

    /// All-to-all with counts known only on the GPU: member j sends `send_counts[k]` (this
    /// PE's copy of the symmetric `send_counts`, ≥ team-size u64 words, written by earlier
    /// stream work) elements to member k, packed in member order from `src[0]`; member k
    /// receives them packed in member order from `dst[0]` and gets the per-sender counts in its
    /// `recv_counts` (≥ team-size words). The counts are exchanged on the device (each member
    /// reads every member's counts after a barrier), so the call captures into a graph; the
    /// capacity bound is the objects' lengths. If any sender's total exceeds `src`'s length or
    /// any receiver's total exceeds `dst`'s, every member copies nothing, writes the counts it
    /// saw to `recv_counts`, and raises a device flag: [`GpuColl::check_errors`] (after a
    /// synchronize, outside capture) returns [`Error::Capacity`]. Never an out-of-bounds write.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v_device<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        send_counts: &(impl AsSym<u64> + ?Sized),
        recv_counts: &(impl AsSym<u64> + ?Sized),
    ) -> Result<()> {
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
        let c = self.buf(send_counts, n)?;
        let rc = self.buf(recv_counts, n)?;
        let (sl, dl) = (src.raw().len, dst.raw().len);
        let (sr, d) = (self.g.ptr(src)?, self.g.ptr(dst)?);
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
        self.sig_sync(s, dt, self.check(dt, CallSig { syncs: 2, ..sig }.pack()?)?)?;
        let es = std::mem::size_of::<T>() as u64;
        // Sizes are unknown on the host: spread the capacity's worth over the grid.
        let per = self.per(dl as u64 * es / n as u64, n);
        let (mut dd, mut ss, mut cc, mut rr, mut e) = (d, sr, c, rc, self.err.ptr);
        let (mut el, mut sc, mut dc, mut t) = (es, sl as u64, dl as u64, dt);
        let mut p = [
            &mut dd as *mut u64 as *mut std::ffi::c_void,
            &mut ss as *mut u64 as *mut _,
            &mut cc as *mut u64 as *mut _,
            &mut rr as *mut u64 as *mut _,
            &mut e as *mut u64 as *mut _,
            &mut el as *mut u64 as *mut _,
            &mut sc as *mut u64 as *mut _,
            &mut dc as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
        ];
        let shmem = (n * n * 8) as u32;
        // SAFETY: matches rshmemi_coll_a2av_dev; the kernel checks every count against the
        // lengths passed before it copies; n² words of shared memory fit (n <= a2av_dev_max).
        unsafe {
            gpu::launch(
                &s.raw,
                self.f_a2av_dev,
                n as u32 * per,
                THREADS,
                shmem,
                &mut p,
            )?
        };
        self.sync(s, dt)
    }
}

/// True for a plan `Sync, (copies | one reduce), Sync` that reads something and at most
/// `limit` bytes and uses no staging: it runs as one kernel of one block with the barriers
/// inside. Every member runs exactly two barriers either way, so members may differ.
fn fusable(plan: &Plan, es: usize, limit: usize) -> bool {
    let st = &plan.steps;
    if plan.temp_len > 0 || st.len() < 3 || st[0] != Step::Sync || st[st.len() - 1] != Step::Sync {
        return false;
    }
    let (mut bytes, mut copies, mut reduces) = (0usize, 0, 0);
    for x in &st[1..st.len() - 1] {
        match *x {
            Step::Sync => return false,
            Step::Copy { len, .. } => {
                copies += 1;
                bytes = bytes.saturating_add(len.saturating_mul(es));
            }
            Step::Reduce { len, .. } => {
                reduces += 1;
                bytes = bytes.saturating_add(len.saturating_mul(es * plan.shape.n));
            }
        }
    }
    let shape_ok = (reduces == 0 && copies <= MAX_COPIES) || (reduces == 1 && copies == 0);
    shape_ok && bytes > 0 && bytes <= limit
}

/// Whether every LL all_reduce / reduce_scatter kernel (not the data kernels) can run blocks of
/// `threads` threads.
fn ll_ar_threads_fit(funcs: &HashMap<String, Func>, threads: u32) -> bool {
    funcs
        .iter()
        .filter(|(n, _)| {
            n.starts_with("rshmemi_coll_ll_") && !n.starts_with("rshmemi_coll_ll_move_")
        })
        .all(|(_, f)| f.max_threads().is_ok_and(|m| m >= threads))
}

/// Whether every LL kernel (`rshmemi_coll_ll_*`) can run blocks of `threads` threads: how many
/// a kernel may have depends on its registers, so a `RSHMEM_CUDA_COLL_LL_THREADS` the kernels
/// cannot launch with (1024 on sm_90) is refused here, naming the kernel, not at its first
/// call's launch.
fn ll_threads_fit(funcs: &HashMap<String, Func>, threads: u32) -> Result<()> {
    let mut limits = Vec::new();
    for (n, f) in funcs {
        if n.starts_with("rshmemi_coll_ll_") {
            limits.push((n.as_str(), f.max_threads()?));
        }
    }
    ll_threads_within(limits, threads)
}

/// [`ll_threads_fit`] on (kernel, most threads per block) pairs: an error naming the kernel
/// of the lowest limit (the first by name among equals) when `threads` exceeds it.
fn ll_threads_within<'n>(
    limits: impl IntoIterator<Item = (&'n str, u32)>,
    threads: u32,
) -> Result<()> {
    let lowest = limits
        .into_iter()
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)));
    match lowest {
        Some((n, max)) if max < threads => Err(Error::invalid(format!(
            "LL threads {threads} (CollTuning::ll_threads, RSHMEM_CUDA_COLL_LL_THREADS={threads}): \
             kernel {n} runs at most {max} threads per block on this GPU; use a multiple of 32 \
             up to {max}"
        ))),
        _ => Ok(()),
    }
}

fn mul(n: usize, count: usize) -> Result<usize> {
    n.checked_mul(count)
        .ok_or_else(|| Error::invalid("count times team size overflows"))
}

/// The signature of a call (its barrier count is the plan's, filled in by `exec`).
#[allow(clippy::too_many_arguments)]
fn call_sig<T: Elem>(
    kind: CollKind,
    op: Option<ReduceOp>,
    algo: Option<Algo>,
    in_place: bool,
    count: usize,
    aux: usize,
    src: &(impl AsSym<T> + ?Sized),
    dst: &(impl AsSym<T> + ?Sized),
    dt: DeviceTeam,
) -> CallSig {
    raw_sig(
        SigKind::Coll(kind),
        T::KIND,
        op,
        algo,
        in_place,
        count,
        aux,
        src.raw(),
        dst.raw(),
        dt,
    )
}

#[allow(clippy::too_many_arguments)]
fn raw_sig(
    kind: SigKind,
    elem: ElemKind,
    op: Option<ReduceOp>,
    algo: Option<Algo>,
    in_place: bool,
    count: usize,
    aux: usize,
    src: RawSym,
    dst: RawSym,
    dt: DeviceTeam,
) -> CallSig {
    CallSig {
        kind,
        elem,
        op,
        algo,
        in_place,
        syncs: 0,
        count: count as u64,
        aux: aux as u64,
        src: src.offset as u64,
        dst: dst.offset as u64,
        team: (dt.size, dt.start, dt.stride),
        ll: false,
        pull: false,
        chain: false,
        push: false,
    }
}

/// The mismatch recorded in an error record (`w[..ERR_SKIP]`), if any.
fn mismatch_error(w: &[u64]) -> Option<Error> {
    if w.first().copied().unwrap_or(0) & ERR_MISMATCH == 0 {
        return None;
    }
    let sig = |at: usize| -> [u64; SIG_WORDS] {
        let mut x = [0u64; SIG_WORDS];
        for (i, v) in x.iter_mut().enumerate() {
            *v = w.get(at + i).copied().unwrap_or(0);
        }
        x
    };
    let (mine, theirs) = (sig(ERR_MM_MINE), sig(ERR_MM_THEIRS));
    Some(Error::CollectiveMismatch {
        op: SigKind::from_code(mine[0] & 0xff).map_or("cuda collective", SigKind::name),
        pe: w.get(ERR_MM_PE).copied().unwrap_or(0) as usize,
        mine: CallSig::describe(&mine),
        theirs: CallSig::describe(&theirs),
    })
}

/// Prepares `rshmemi_coll_a2av_dev`'s dynamic shared memory (the team's count matrix, n² words)
/// for teams up to the world's size where the GPU allows; returns the largest team it serves.
fn a2av_dev_shared(gpu: &gpu::Gpu, f: Func, n_pes: usize) -> Result<usize> {
    let optin = gpu
        .attr(ffi::cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    let (want, max) = a2av_dev_limit(optin, n_pes);
    if want > SHARED_DEFAULT {
        let _g = gpu.bind()?;
        // SAFETY: a loaded function of this GPU's context; raises its dynamic shared memory
        // limit within what the device allows.
        ffi::check(
            unsafe {
                ffi::cu::cuFuncSetAttribute(
                    f.0,
                    ffi::cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    want as i32,
                )
            },
            "cuFuncSetAttribute",
        )?;
    }
    Ok(max)
}

/// Dynamic shared memory a block may use without opting in (48 KiB less 1 KiB kept for the
/// kernel's static shared memory).
const SHARED_DEFAULT: usize = (48 << 10) - 1024;

/// For a device opt-in limit (`optin` bytes, −1 unknown) and a world of `n_pes`: the dynamic
/// shared memory to allow `rshmemi_coll_a2av_dev` (bytes) and the largest team it then serves.
fn a2av_dev_limit(optin: i32, n_pes: usize) -> (usize, usize) {
    let avail = usize::try_from(optin)
        .map_or(0, |x| x.saturating_sub(1024))
        .max(SHARED_DEFAULT);
    let want = n_pes.saturating_mul(n_pes).saturating_mul(8).min(avail);
    let words = want.max(SHARED_DEFAULT) / 8;
    let max = (1..).take_while(|k| k * k <= words).last().unwrap_or(1);
    (want, max)
}

fn check_root(root: usize, dt: DeviceTeam) -> Result<()> {
    if root >= dt.size as usize {
        return Err(Error::PeOutOfRange {
            pe: root,
            n_pes: dt.size as usize,
            what: "team",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize, me: usize, in_place: bool) -> Shape {
        Shape {
            n,
            me,
            in_place,
            chunk: usize::MAX,
        }
    }

    #[test]
    fn ll_threads_refused_past_a_kernels_limit() {
        let limits = [
            ("rshmemi_coll_ll_float_sum", 768),
            ("rshmemi_coll_ll_bfloat16_max", 640),
        ];
        assert!(ll_threads_within(limits, 256).is_ok());
        assert!(ll_threads_within(limits, 640).is_ok());
        let e = ll_threads_within(limits, 768).unwrap_err().to_string();
        assert!(e.contains("RSHMEM_CUDA_COLL_LL_THREADS=768"), "{e}");
        assert!(
            e.contains("rshmemi_coll_ll_bfloat16_max runs at most 640"),
            "{e}"
        );
        assert!(ll_threads_within([], 1024).is_ok());
    }

    #[test]
    fn ll_a2a_grid_spreads_past_two_lines_per_thread() {
        // 256 threads, a cap of 64 blocks: a line per thread up to 64 blocks (16384 lines),
        // two per thread up to 32768 lines on 64 blocks, then more blocks at two per thread up
        // to 128, then more lines per thread.
        for (lines, cap) in [
            (1, 64),
            (16384, 64),
            (32768, 64),
            (32769, 65),
            (65536, 128),
            (1 << 20, 128),
        ] {
            assert_eq!(ll_a2a_grid_cap(lines, 256, 64), cap, "{lines} lines");
        }
        // The knob's cap scales it: on a cap of 1 block, 600 lines take 2 (twice the cap at
        // most), 512 lines (two per thread) stay on 1.
        assert_eq!(ll_a2a_grid_cap(600, 256, 1), 2);
        assert_eq!(ll_a2a_grid_cap(512, 256, 1), 1);
    }

    #[test]
    fn default_ll_sizes_fit_a_sixteenth_of_the_heap() {
        let z = |r: usize, t: usize| LlSizes {
            all_reduce: r << 10,
            all_to_all: t << 10,
        };
        let heap = 128 << 20;
        assert_eq!(default_ll_sizes(heap, 2), z(128, 256));
        assert_eq!(default_ll_sizes(heap, 7), z(64, 128));
        assert_eq!(default_ll_sizes(heap, 8), z(32, 64));
        assert_eq!(default_ll_sizes(heap, 72), z(4, 8));
        assert_eq!(default_ll_sizes(2560 << 20, 2), z(512, 1024));
        for n in [2, 3, 8, 16, 72, 1000] {
            let d = default_ll_sizes(heap, n);
            if d.all_reduce > 0 {
                let area = d.area(n).unwrap();
                assert!(area <= heap / 16, "{n} PEs: {d:?} takes {area}");
                assert!(d.all_to_all >= 2 * d.all_reduce, "{n} PEs: {d:?}");
            }
        }
        // A heap too small for even 1 KiB: off, never an allocation failure.
        assert_eq!(default_ll_sizes(1 << 20, 72), z(0, 0));
        assert_eq!(default_ll_sizes(0, 2), z(0, 0));
        // The region: an all_reduce message or a team of 2's share of an all_to_all.
        assert_eq!(z(64, 1024).region(), 512 << 10);
        assert_eq!(z(64, 64).region(), 64 << 10);
    }

    #[test]
    fn which_plans_fuse() {
        let lim = crate::backend::cuda::COLL_FUSED_BYTES;
        // one-shot all_reduce out of place: 4 members × 1000 f32 = 16 000 bytes read
        let p = plan::all_reduce(shape(4, 1, false), 1000, Algo::OneShot);
        assert!(fusable(&p, 4, lim));
        assert!(!fusable(&p, 4, 15_999));
        assert!(!fusable(&p, 4, 0));
        // in place one-shot stages in Temp; two-shot has three syncs
        assert!(!fusable(
            &plan::all_reduce(shape(4, 1, true), 10, Algo::OneShot),
            4,
            lim
        ));
        assert!(!fusable(
            &plan::all_reduce(shape(4, 1, false), 10, Algo::TwoShot),
            4,
            lim
        ));
        // all_to_all / all_gather out of place fuse, in-place all_to_all does not
        assert!(fusable(&plan::all_to_all(shape(3, 2, false), 10), 8, lim));
        assert!(!fusable(&plan::all_to_all(shape(3, 2, true), 10), 8, lim));
        assert!(fusable(&plan::all_gather(shape(3, 0, true), 10), 8, lim));
        // reduce: the root fuses, the others have nothing between their two syncs
        assert!(fusable(&plan::reduce(shape(3, 1, false), 1, 10), 8, lim));
        assert!(!fusable(&plan::reduce(shape(3, 0, false), 1, 10), 8, lim));
        // nothing to move: not fused (the barriers still run as kernels)
        assert!(!fusable(&plan::all_gather(shape(3, 0, false), 0), 8, lim));
        // every plan keeps two or more syncs, so fused and unfused members agree
        for p in [
            plan::reduce(shape(3, 0, false), 1, 10),
            plan::broadcast(shape(3, 0, false), 1, 10, Algo::OneShot),
        ] {
            assert!(p.syncs() >= 2);
        }
    }

    fn sig(kind: CollKind, count: usize) -> CallSig {
        let dt = DeviceTeam {
            slot: 3,
            my_index: 1,
            size: 4,
            start: 0,
            stride: 1,
        };
        CallSig {
            syncs: 2,
            ..raw_sig(
                SigKind::Coll(kind),
                ElemKind::F32,
                Some(ReduceOp::Sum),
                Some(Algo::OneShot),
                false,
                count,
                0,
                RawSym {
                    offset: 4096,
                    len: 100,
                    job: 1,
                    owner: 1,
                },
                RawSym {
                    offset: 8192,
                    len: 100,
                    job: 1,
                    owner: 1,
                },
                dt,
            )
        }
    }

    #[test]
    fn signature_packs_every_field() {
        let base = sig(CollKind::AllReduce, 100);
        let w = base.pack().unwrap();
        assert_ne!(w[0] & SIG_MARK, 0, "a written slot is never 0");
        assert_eq!(CallSig::syncs_of(&w), 2);
        assert_eq!(w[1], 100);
        assert_eq!((w[3], w[4]), (4096, 8192));
        // every field that must agree changes the packed words
        let variants = [
            CallSig {
                kind: SigKind::Coll(CollKind::Reduce),
                ..base
            },
            CallSig {
                kind: SigKind::A2avDevice,
                ..base
            },
            CallSig {
                elem: ElemKind::I32,
                ..base
            },
            CallSig {
                op: Some(ReduceOp::Max),
                ..base
            },
            CallSig { op: None, ..base },
            CallSig {
                algo: Some(Algo::TwoShot),
                ..base
            },
            CallSig {
                in_place: true,
                ..base
            },
            CallSig { syncs: 3, ..base },
            CallSig { count: 101, ..base },
            CallSig { aux: 1, ..base },
            CallSig { src: 0, ..base },
            CallSig { dst: 0, ..base },
            CallSig {
                team: (4, 0, 2),
                ..base
            },
            CallSig {
                team: (3, 0, 1),
                ..base
            },
        ];
        let mut seen = vec![w];
        for v in variants {
            let p = v.pack().unwrap();
            assert!(!seen.contains(&p), "{v:?} packs like an earlier variant");
            seen.push(p);
        }
        // my_index and slot are not part of it: every member computes the same words
        let other = DeviceTeam {
            slot: 3,
            my_index: 2,
            size: 4,
            start: 0,
            stride: 1,
        };
        let r = RawSym {
            offset: 4096,
            len: 7,
            job: 1,
            owner: 2,
        };
        let d = RawSym { offset: 8192, ..r };
        let theirs = CallSig {
            syncs: 2,
            ..raw_sig(
                SigKind::Coll(CollKind::AllReduce),
                ElemKind::F32,
                Some(ReduceOp::Sum),
                Some(Algo::OneShot),
                false,
                100,
                0,
                r,
                d,
                other,
            )
        };
        assert_eq!(
            theirs.pack().unwrap(),
            w,
            "lengths and my_index do not count"
        );
        assert!(CallSig {
            syncs: 0x1_0000,
            ..base
        }
        .pack()
        .is_err());
    }

    #[test]
    fn signature_syncs_follow_the_plan() {
        let sh = shape(4, 1, false);
        let one = plan::all_reduce(sh, 1000, Algo::OneShot).syncs();
        let two = plan::all_reduce(sh, 1000, Algo::TwoShot).syncs();
        assert_eq!((one, two), (2, 3));
        let a = CallSig {
            syncs: one,
            ..sig(CollKind::AllReduce, 1000)
        };
        let b = CallSig {
            syncs: two,
            algo: Some(Algo::TwoShot),
            ..a
        };
        assert_eq!(CallSig::syncs_of(&a.pack().unwrap()), 2);
        assert_eq!(CallSig::syncs_of(&b.pack().unwrap()), 3);
        for k in CollKind::ALL
            .iter()
            .map(|&k| SigKind::Coll(k))
            .chain([SigKind::A2avDevice])
        {
            assert_eq!(SigKind::from_code(k.code()), Some(k));
            assert!(k.code() < 256);
        }
        assert_eq!(SigKind::from_code(0), None);
    }

    #[test]
    fn signature_descriptions_name_the_fields() {
        let w = sig(CollKind::AllReduce, 100).pack().unwrap();
        let d = CallSig::describe(&w);
        assert!(
            d.starts_with("all_reduce float sum count 100 in_place false algo one_shot barriers 2 src @0x1000 dst @0x2000"),
            "{d}"
        );
        let b = CallSig {
            kind: SigKind::Coll(CollKind::Broadcast),
            op: None,
            aux: 3,
            ..sig(CollKind::AllReduce, 5)
        };
        let d = CallSig::describe(&b.pack().unwrap());
        assert!(d.starts_with("broadcast float count 5 root 3 "), "{d}");
        assert!(CallSig::describe(&[0; SIG_WORDS]).starts_with("no collective signature"));
        // The LL all_reduce: its own signature (differs from the one-shot call's), named "ll".
        let l = CallSig {
            algo: None,
            ll: true,
            ..sig(CollKind::AllReduce, 100)
        };
        let lw = l.pack().unwrap();
        assert_ne!(lw, w);
        let d = CallSig::describe(&lw);
        assert!(d.contains(" algo ll barriers 2 "), "{d}");
        // The pull all_to_all: differs from the LL one of the same call, named "pull".
        let a = CallSig {
            kind: SigKind::Coll(CollKind::AllToAll),
            op: None,
            algo: None,
            ll: true,
            ..sig(CollKind::AllReduce, 100)
        };
        let p = CallSig { pull: true, ..a };
        let (aw, pw) = (a.pack().unwrap(), p.pack().unwrap());
        assert_ne!(aw, pw);
        assert!(CallSig::describe(&aw).contains(" algo ll "), "{aw:?}");
        let d = CallSig::describe(&pw);
        assert!(d.starts_with("all_to_all float count 100 "), "{d}");
        assert!(d.contains(" algo pull barriers 2 "), "{d}");
        // A pull broadcast along a chain: differs from the one where everyone reads the root.
        let pb = CallSig {
            kind: SigKind::Coll(CollKind::Broadcast),
            pull: true,
            ..a
        };
        let cb = CallSig { chain: true, ..pb };
        let (pbw, cbw) = (pb.pack().unwrap(), cb.pack().unwrap());
        assert_ne!(pbw, cbw);
        assert!(CallSig::describe(&pbw).contains(" algo pull "), "{pbw:?}");
        assert!(CallSig::describe(&cbw).contains(" algo chain "), "{cbw:?}");
        // A pair's all_reduce by pushes: differs from the pull one, named "push".
        let pa = CallSig { pull: true, ..l };
        let pu = CallSig { push: true, ..pa };
        let (paw, puw) = (pa.pack().unwrap(), pu.pack().unwrap());
        assert_ne!(paw, puw);
        assert!(CallSig::describe(&paw).contains(" algo pull "), "{paw:?}");
        assert!(CallSig::describe(&puw).contains(" algo push "), "{puw:?}");
    }

    #[test]
    fn mismatch_records_become_errors() {
        let mine = sig(CollKind::AllReduce, 100).pack().unwrap();
        let theirs = sig(CollKind::AllReduce, 200).pack().unwrap();
        let mut w = [0u64; ERR_SKIP];
        assert!(mismatch_error(&w).is_none());
        w[0] = ERR_CAPACITY;
        assert!(mismatch_error(&w).is_none());
        w[0] |= ERR_MISMATCH;
        w[ERR_MM_PE] = 3;
        w[ERR_MM_MINE..ERR_MM_MINE + SIG_WORDS].copy_from_slice(&mine);
        w[ERR_MM_THEIRS..ERR_MM_THEIRS + SIG_WORDS].copy_from_slice(&theirs);
        match mismatch_error(&w) {
            Some(Error::CollectiveMismatch {
                op,
                pe,
                mine: m,
                theirs: t,
            }) => {
                assert_eq!((op, pe), ("all_reduce", 3));
                assert!(m.contains("count 100 "), "{m}");
                assert!(t.contains("count 200 "), "{t}");
            }
            other => panic!("{other:?}"),
        }
        // a member that wrote nothing
        w[ERR_MM_THEIRS..ERR_MM_THEIRS + SIG_WORDS].fill(0);
        let e = mismatch_error(&w).unwrap().to_string();
        assert!(e.contains("no collective signature"), "{e}");
    }

    #[test]
    fn layouts_match_the_kernels() {
        // rshmemi_check: six signature words, two pointers; the error record fits every slot.
        assert_eq!(std::mem::size_of::<Check>(), 8 * (SIG_WORDS + 2));
        assert_eq!(std::mem::size_of::<A2avList>(), 16 * A2AV_CHUNK);
        let src = crate::backend::cuda::nvrtc::COLL_KERNELS;
        for (name, v) in [
            ("RSHMEMI_SIG_WORDS", SIG_WORDS),
            ("RSHMEMI_ERR_MM_PE", ERR_MM_PE),
            ("RSHMEMI_ERR_MM_MINE", ERR_MM_MINE),
            ("RSHMEMI_ERR_SKIP", ERR_SKIP),
            ("RSHMEMI_A2AV_CHUNK", A2AV_CHUNK),
            ("RSHMEMI_COLL_MAX_COPIES", MAX_COPIES),
            ("RSHMEMI_LL_MAX_BLOCKS", LL_KERNEL_MAX_BLOCKS as usize),
        ] {
            assert!(
                src.contains(&format!("#define {name} {v}\n")),
                "{name} must be {v} in coll.cu"
            );
        }
        for (name, v) in [
            ("RSHMEMI_ERR_CAPACITY", ERR_CAPACITY),
            ("RSHMEMI_ERR_A2AV", ERR_A2AV),
            ("RSHMEMI_ERR_MISMATCH", ERR_MISMATCH),
        ] {
            assert!(src.contains(&format!("#define {name} {v}ull\n")), "{name}");
        }
    }

    /// Parameter types of kernel `name` as declared in `src` (pointers as `ptr`, `const`
    /// dropped), the declaration possibly inside a macro.
    fn kernel_params(src: &str, name: &str) -> Vec<String> {
        let at = src
            .find(&format!("void {name}("))
            .unwrap_or_else(|| panic!("kernel {name} not declared"));
        let rest = &src[at + name.len() + 6..];
        let list = &rest[..rest.find(')').expect("parameter list")];
        super::super::srcparse::param_types(list)
    }

    /// Field types of `struct name { ... };` in `src`, in order.
    fn struct_fields(src: &str, name: &str) -> Vec<String> {
        let body = src
            .split(&format!("struct {name} {{"))
            .nth(1)
            .and_then(|b| b.split("};").next())
            .unwrap_or_else(|| panic!("struct {name}"));
        body.lines()
            .filter_map(|l| l.split("//").next())
            .flat_map(|l| l.split(';'))
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                if d.contains('*') {
                    "ptr".to_string()
                } else {
                    d.rsplit_once(' ').expect("type and name").0.to_string()
                }
            })
            .collect()
    }

    /// Every kernel this file launches takes the parameters its launch site passes, in order
    /// (the driver reads as many bytes per parameter as the kernel declares), and every struct
    /// passed by value has the layout of its Rust mirror.
    #[test]
    fn launches_match_the_kernel_signatures() {
        use std::mem::{offset_of, size_of};
        let coll = crate::backend::cuda::nvrtc::COLL_KERNELS;
        let internal = crate::backend::cuda::nvrtc::INTERNAL_KERNELS;
        let header = crate::backend::cuda::nvrtc::DEVICE_HEADER;
        let (p, u, i, team, ck) = ("ptr", "rshmem_u64", "int", "rshmem_team", "rshmemi_check");
        // What `sync`, `sig_sync`, `reduce_launch`, `flush`, `all_to_all_v` and
        // `all_to_all_v_device` pass (u64 addresses go to pointer or rshmem_u64 parameters).
        let launches: [(&str, &str, Vec<&str>); 12] = [
            (internal, "rshmemi_team_sync", vec![team]),
            (coll, "rshmemi_coll_sync_sig", vec![team, ck]),
            (
                coll,
                "rshmemi_coll_reduce_##NAME##_##OPN",
                vec![p, p, u, team, i, ck],
            ),
            (
                coll,
                "rshmemi_coll_copy",
                vec!["rshmemi_copies", i, team, i, ck],
            ),
            (
                coll,
                "rshmemi_coll_ll_##NAME##_##OPN",
                vec![p, p, u, team, ck, "rshmemi_ll", u],
            ),
            (
                coll,
                "rshmemi_coll_pull_ar_##NAME##_##OPN",
                vec![p, p, u, team, ck, "rshmemi_ll", u],
            ),
            (
                coll,
                "rshmemi_coll_ll_move_##KN##_##SN",
                vec![p, p, u, team, ck, "rshmemi_ll", u],
            ),
            (
                coll,
                "rshmemi_coll_pull_a2a",
                vec![p, p, u, team, ck, "rshmemi_ll", u],
            ),
            (
                coll,
                "rshmemi_coll_pull_bcast",
                vec![p, p, u, team, ck, "rshmemi_ll", u],
            ),
            (
                coll,
                "rshmemi_coll_a2av_dev",
                vec![p, p, p, p, p, u, u, u, team],
            ),
            (
                coll,
                "rshmemi_coll_a2av_meta",
                vec![p, "rshmemi_a2av_list", i, i, u],
            ),
            (
                coll,
                "rshmemi_coll_a2av_host",
                vec![p, p, p, "rshmemi_a2av_list", i, i, u, p, u, u, u, team],
            ),
        ];
        for (src, name, want) in launches {
            assert_eq!(kernel_params(src, name), want, "{name}");
        }
        // Structs by value: field types, sizes, offsets.
        assert_eq!(struct_fields(header, "rshmem_team"), vec![i; 5]);
        assert_eq!(size_of::<DeviceTeam>(), 5 * 4);
        assert_eq!(
            [
                offset_of!(DeviceTeam, slot),
                offset_of!(DeviceTeam, my_index),
                offset_of!(DeviceTeam, size),
                offset_of!(DeviceTeam, start),
                offset_of!(DeviceTeam, stride),
            ],
            [0, 4, 8, 12, 16]
        );
        assert!(header.contains(
            "struct rshmem_team {\n    int slot;\n    int my_index;\n    int size;\n    int start;\n    int stride;\n};"
        ));
        assert_eq!(struct_fields(coll, "rshmemi_sig"), vec![u]);
        assert!(coll.contains("rshmem_u64 w[RSHMEMI_SIG_WORDS];"));
        assert_eq!(
            struct_fields(coll, "rshmemi_check"),
            vec!["rshmemi_sig", p, p]
        );
        assert_eq!(
            (offset_of!(Check, slots), offset_of!(Check, err)),
            (8 * SIG_WORDS, 8 * SIG_WORDS + 8)
        );
        assert_eq!(struct_fields(coll, "rshmemi_ll"), vec![u, u, p, u]);
        assert_eq!(
            (
                offset_of!(LlArg, lines),
                offset_of!(LlArg, done),
                offset_of!(LlArg, flags),
                size_of::<LlArg>()
            ),
            (8, 16, 24, 32)
        );
        assert!(coll.contains(&format!(
            "#define RSHMEMI_LL_MAX_MEMBERS {LL_MAX_MEMBERS}\n"
        )));
        assert_eq!(
            struct_fields(coll, "rshmemi_copy_desc"),
            vec![u, u, u, "long long"]
        );
        assert_eq!(size_of::<CopyDesc>(), 32);
        assert_eq!(size_of::<Copies>(), 32 * MAX_COPIES);
        assert!(coll.contains("rshmemi_copy_desc d[RSHMEMI_COLL_MAX_COPIES];"));
        assert_eq!(struct_fields(coll, "rshmemi_a2av_list"), vec![u, u]);
        assert!(coll.contains("rshmem_u64 count[RSHMEMI_A2AV_CHUNK];"));
        assert!(coll.contains("rshmem_u64 displ[RSHMEMI_A2AV_CHUNK];"));
        assert_eq!(offset_of!(A2avList, displ), 8 * A2AV_CHUNK);
        // The largest parameter list stays far below the 4 KiB every architecture takes.
        let copy_params =
            size_of::<Copies>() + 4 + size_of::<DeviceTeam>() + 4 + size_of::<Check>();
        assert!(copy_params + 16 < 4096, "{copy_params}");
    }

    #[test]
    fn a2av_device_team_limit() {
        // H100/H200: 227 KiB opt-in → 170 members; a small world needs no opt-in.
        let (want, max) = a2av_dev_limit(227 << 10, 256);
        assert_eq!(want, (227 << 10) - 1024);
        assert_eq!(max, 170);
        assert!(max * max * 8 <= want && (max + 1) * (max + 1) * 8 > want);
        let (want, max) = a2av_dev_limit(227 << 10, 64);
        assert_eq!(want, 64 * 64 * 8);
        assert!(want <= SHARED_DEFAULT && max >= 64);
        // unknown attribute: the default 47 KiB → 77 members
        assert_eq!(a2av_dev_limit(-1, 1024).1, 77);
    }

    #[test]
    fn every_gpu_plan_opens_with_a_barrier_and_has_two() {
        // `exec` relies on it: the first barrier carries the signature, and a second one
        // keeps the slots from being rewritten before every member has read them.
        for n in 1..6 {
            for me in 0..n {
                for ip in [false, true] {
                    for count in [0, 1, 7, 1000] {
                        let sh = shape(n, me, ip);
                        let mut plans = vec![
                            plan::reduce(sh, n - 1, count),
                            plan::all_gather(sh, count),
                            plan::reduce_scatter(sh, count),
                            plan::all_to_all(sh, count),
                        ];
                        for algo in [Algo::OneShot, Algo::TwoShot] {
                            plans.push(plan::broadcast(sh, me, count, algo));
                            plans.push(plan::all_reduce(sh, count, algo));
                        }
                        for p in plans {
                            assert_eq!(p.steps.first(), Some(&Step::Sync), "{p:?}");
                            assert!(p.syncs() >= 2 && p.syncs() <= 0xffff, "{p:?}");
                        }
                    }
                }
            }
        }
    }

    /// The signature carries the plan's barrier count (`exec`), so every member of one call
    /// must plan as many barriers whatever its index, or identical calls would read as a
    /// mismatch (and pad). Roots are the same on every member here, as the call requires.
    #[test]
    fn every_member_of_a_call_plans_as_many_barriers() {
        for n in 1..8 {
            for ip in [false, true] {
                for count in [0, 1, 2, 3, 7, 64, 1000] {
                    let syncs = |mk: &dyn Fn(Shape) -> Plan| -> Vec<usize> {
                        (0..n).map(|me| mk(shape(n, me, ip)).syncs()).collect()
                    };
                    let mut all: Vec<(String, Vec<usize>)> = vec![
                        (
                            "all_gather".into(),
                            syncs(&|sh| plan::all_gather(sh, count)),
                        ),
                        (
                            "reduce_scatter".into(),
                            syncs(&|sh| plan::reduce_scatter(sh, count)),
                        ),
                        (
                            "all_to_all".into(),
                            syncs(&|sh| plan::all_to_all(sh, count)),
                        ),
                    ];
                    for root in 0..n {
                        all.push((
                            format!("reduce root {root}"),
                            syncs(&|sh| plan::reduce(sh, root, count)),
                        ));
                        for algo in [Algo::OneShot, Algo::TwoShot] {
                            all.push((
                                format!("broadcast root {root} {algo:?}"),
                                syncs(&|sh| plan::broadcast(sh, root, count, algo)),
                            ));
                        }
                    }
                    for algo in [Algo::OneShot, Algo::TwoShot] {
                        all.push((
                            format!("all_reduce {algo:?}"),
                            syncs(&|sh| plan::all_reduce(sh, count, algo)),
                        ));
                    }
                    for (what, s) in all {
                        assert!(
                            s.iter().all(|&x| x == s[0] && x >= 2),
                            "{what}, {n} members, in place {ip}, count {count}: barriers per \
                             member {s:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn control_warp_on_several_blocks_up_to_its_size() {
        // One block (up to 256 lines): none; 2 to 8 blocks of 256 lines: one each; past
        // LL_CTRL_LINES or with the knob at 0: none.
        for (lines, want) in [
            (1, false),
            (256, false),
            (257, true),
            (2048, true),
            (2049, false),
        ] {
            assert_eq!(
                uses_ctrl_warp(lines, 256, LL_CTRL_LINES),
                want,
                "{lines} lines"
            );
        }
        assert!(!uses_ctrl_warp(512, 256, 0));
        assert!(uses_ctrl_warp(129, 128, LL_CTRL_LINES));
    }

    #[test]
    fn ll_sizes() {
        assert_eq!(
            (ll_lines(0), ll_lines(1), ll_lines(8), ll_lines(9)),
            (6, 7, 7, 8)
        );
        assert_eq!(ll_lines(64 << 10), 6 + 8192);
        assert_eq!(ll_area_bytes(64 << 10, 2, 4), Some(4 * 2 * 2 * 8198 * 16));
        assert_eq!(ll_area_bytes(usize::MAX / 4, 2, 4), None);
        // The end arrivals, then a copy of every pair sequence per block.
        assert_eq!(ll_notes(72), 1 + 128 * 72);
    }

    #[test]
    fn kernel_names_cover_every_type_and_op() {
        let names = coll_kernel_names();
        assert_eq!(names.len(), 13 + 3 * (8 * 7 + 4 * 4));
        assert!(names.contains(&"rshmemi_coll_pull_a2a".to_string()));
        assert!(names.contains(&"rshmemi_coll_pull_ar_half_min".to_string()));
        assert!(!names.contains(&"rshmemi_coll_pull_ar_double_and".to_string()));
        assert!(names.contains(&"rshmemi_coll_reduce_bfloat16_max".to_string()));
        assert!(names.contains(&"rshmemi_coll_ll_bfloat16_max".to_string()));
        assert!(names.contains(&"rshmemi_coll_ll_int8_and".to_string()));
        assert!(!names.contains(&"rshmemi_coll_ll_half_or".to_string()));
        assert!(names.contains(&"rshmemi_coll_reduce_uint8_xor".to_string()));
        assert!(!names.contains(&"rshmemi_coll_reduce_float_xor".to_string()));
    }
}
