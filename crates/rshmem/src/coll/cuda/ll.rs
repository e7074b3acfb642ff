//! The LL and pull paths' constants, kernel arguments and LL area layout (`kernels/ll.cuh`).

use super::*;

/// Most members of a team the LL paths serve (`RSHMEMI_LL_MAX_MEMBERS` of `kernels/`).
pub const LL_MAX_MEMBERS: usize = 16;
/// Team slots with an LL area (the world's and the first teams made after it).
pub(super) const LL_SLOTS: usize = 4;
/// Most blocks of an LL all_reduce: its blocks wait for peers, so they must leave SMs to the
/// peers' kernels when PEs share a GPU; 128, since fewer make large calls slower.
pub(super) const LL_MAX_BLOCKS: u32 = 128;
/// Most lines per LL all_reduce thread (`RSHMEMI_LL_U` of `kernels/`: one batch of loads).
pub(super) const LL_LINES_PER_THREAD: usize = 4;
/// Lines per LL all_reduce thread the grid is sized for below the block cap: one, so a call
/// spreads over as many SMs as it can (one SM stores into a peer at only about 13-20 GB/s).
pub(super) const LL_THREAD_LINES: usize = 1;
/// Most blocks of an LL all_to_all (bandwidth-bound up to its larger size; the same care):
/// 64, faster at its largest sizes than 32 or 128.
pub(super) const LL_A2A_MAX_BLOCKS: u32 = 64;
/// An LL all_to_all of more than two lines per thread on that many blocks spreads over up to
/// twice as many, two lines per thread (each kernel runs the batch its lines need, `kernels/`).
/// More blocks pay only past two lines per thread (at two they make the call slower); the
/// all_gather and the broadcast gain nothing from them and keep 64.
pub(super) fn ll_a2a_grid_cap(lines: usize, threads: u32, cap: u32) -> u32 {
    let per_two = lines.div_ceil(2 * threads as usize);
    if per_two > cap as usize {
        per_two.min(2 * cap as usize) as u32
    } else {
        cap
    }
}
/// The LL data kernels' kinds (`RSHMEMI_LL_A2A`, `RSHMEMI_LL_GATHER`, `RSHMEMI_LL_BCAST`):
/// the rows of `f_ll_move`.
pub(super) const MOVE_A2A: usize = 0;
pub(super) const MOVE_GATHER: usize = 1;
pub(super) const MOVE_BCAST: usize = 2;
/// Bit 1 of the pull all_to_all kernel's last argument: an all_gather (`kernels/`).
pub(super) const A2A_GATHER: u64 = 2;
/// The pull all_reduce kernel's modes (`RSHMEMI_PULL_AR_*` of `kernels/`): a pair by stores,
/// two-shot, reduce_scatter.
pub(super) const PULL_AR_PUSH: u64 = 1;
pub(super) const PULL_AR_TWO_SHOT: u64 = 2;
pub(super) const PULL_AR_SCATTER: u64 = 4;
pub(super) const LL_THREADS: u32 = 256;
/// Most blocks of a pull kernel (they wait for peers, like the LL kernels, but one block per
/// SM of an H100/H200 at most): 128, since 64 leave the pair paths by stores short of the
/// link's bandwidth (BENCHMARKS.md).
pub(super) const PULL_MAX_BLOCKS: u32 = 128;
/// Bytes per pull all_to_all block: two rounds of eight 16-byte loads per thread.
pub(super) const PULL_BLOCK_BYTES: usize = LL_THREADS as usize * 256;
/// Bytes per pull all_reduce block: one round of eight 16-byte vectors per thread (32-bit
/// types; fewer for narrower ones, whose accumulators take more registers).
pub(super) const PULL_AR_BLOCK_BYTES: usize = LL_THREADS as usize * 128;

/// The LL argument of `kernels/` (`rshmemi_ll`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct LlArg {
    pub(super) area: u64,
    pub(super) lines: u64,
    pub(super) done: u64,
    /// LL_EARLY_LAUNCH, LL_CTRL_WARP or 0.
    pub(super) flags: u64,
}

/// `rshmemi_ll::flags` bit (`RSHMEMI_LL_CTRL_WARP`): the LL all_reduce / reduce_scatter kernel
/// runs a control warp per block beside its data threads (it pushes the header and takes the
/// verdict; the data threads poll their first lines beside it instead of after it). Set for
/// the all_reduce only ([`LL_CTRL_LINES`]; the reduce_scatter is slower with it).
pub(super) const LL_CTRL_WARP: u64 = 2;
/// Most lines (threads at a line each) of an LL all_reduce call that runs with a control warp
/// per block (`RSHMEM_CUDA_COLL_LL_CTRL_LINES`; 0: never); calls of one block
/// run without (their one warp of verdicts folds its line beside it anyway). The control warp
/// makes calls up to 16 KiB faster and larger ones slower (every thread polling while the
/// lines still come in).
pub(super) const LL_CTRL_LINES: usize = 2048;

/// Whether an LL all_reduce call of `lines` lines on blocks of `threads` data threads runs a
/// control warp per block: on more than one block, up to `ctrl_lines` lines.
pub(super) fn uses_ctrl_warp(lines: usize, threads: u32, ctrl_lines: usize) -> bool {
    lines > threads as usize && lines <= ctrl_lines
}

/// `rshmemi_ll::flags` bit (`RSHMEMI_LL_EARLY_LAUNCH`): the kernel lets the next dependent
/// kernel launch as soon as it starts (only where this PE has its GPU to itself).
pub(super) const LL_EARLY_LAUNCH: u64 = 1;

/// Largest default LL all_reduce size (`RSHMEM_CUDA_COLL_LL_BYTES` unset): 512 KiB, the
/// largest size where the LL all_reduce beats NCCL on a pair (BENCHMARKS.md).
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

/// Most blocks of any LL or pull kernel (`RSHMEMI_LL_MAX_BLOCKS` of `kernels/`): each block
/// keeps its own copy of the pair sequences, so a call's blocks never wait for one another at
/// its end (a single copy, moved by block 0 once every block had read it, would make the end
/// of a call of several blocks about twice as slow as one block's).
pub(super) const LL_KERNEL_MAX_BLOCKS: u32 = 128;

/// Private u32 words per LL slot: the blocks' end arrivals (`rshmemi_ll_end`), then per block
/// (up to [`LL_KERNEL_MAX_BLOCKS`]) and world PE the pair's sequence, whose parity names the
/// half this PE writes next into that PE's area.
pub(super) fn ll_notes(n_pes: usize) -> usize {
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
pub(super) fn ll_lines(bytes: usize) -> usize {
    SIG_WORDS + bytes.div_ceil(8)
}

/// Bytes of a PE's LL area: per LL slot, two halves of `n_pes` sources' lines of 16 bytes.
pub(super) fn ll_area_bytes(ll_bytes: usize, n_pes: usize, slots: usize) -> Option<usize> {
    ll_lines(ll_bytes)
        .checked_mul(16)?
        .checked_mul(n_pes)?
        .checked_mul(2)?
        .checked_mul(slots)
}

/// Whether every LL all_reduce / reduce_scatter kernel (not the data kernels) can run blocks of
/// `threads` threads.
pub(super) fn ll_ar_threads_fit(funcs: &HashMap<String, Func>, threads: u32) -> bool {
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
pub(super) fn ll_threads_fit(funcs: &HashMap<String, Func>, threads: u32) -> Result<()> {
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
pub(super) fn ll_threads_within<'n>(
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
