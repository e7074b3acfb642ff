//! MoE dispatch and combine on GPUs through the device API (the CUDA side of [`crate::ep`]).
//!
//! Same configuration ([`EpConfig`]), expert split (PE `p` of the team owns experts
//! `p*E/n .. (p+1)*E/n`) and validation rules as the CPU [`crate::ep::Buffer`]; the movement,
//! the layout and the bookkeeping run in kernels (`src/kernels/ep.cu`, compiled by NVRTC with the
//! device header when the buffer is created).
//!
//! # Inputs and outputs
//! All tensors are **symmetric objects** (or views of them) of the calling PE's heap, i.e. GPU
//! memory of this PE's device: that settles device placement (a `Sym` of another world is
//! rejected) and lets every size be checked before a kernel runs. Inputs may be longer than
//! needed (static buffers for graphs): the first `T*H` / `T*k` elements are used.
//! * `x [T, H]` (`f32`, `bf16` or `f16`), `topk_ids [T, k]` (`i32`/`i64`, `-1` = none),
//!   `topk_weights [T, k]` (`f32`).
//! * dispatch output: the buffer's expert-major area [`Buffer::expert_x`] — for local expert 0,
//!   1, … every (received token, slot) it serves, `expert_offsets` on the device; rows of one
//!   expert are in an unspecified order (placed by atomics), the handle says which is which
//!   ([`Buffer::host_handle`]).
//! * combine input: expert outputs `y` in the same row order (any symmetric object with at least
//!   `rows * H` elements; `expert_x` itself for identity experts); output `out [T, H]`.
//! * [`RecvLayout::TokenMajor`] buffers (`EpConfig::layout`) skip the expanded copy: the
//!   dispatch output is the receive area [`Buffer::recv_x`] (each received token once, per
//!   source PE in its token order, DeepEP's normal-dispatch output) plus the expert-major index
//!   [`Buffer::expert_src`] (expert-major row `r` is receive row `expert_src[r] / max_topk`),
//!   which expert kernels gather their input rows by ([`Buffer::scale_experts`] does); combine
//!   takes the same expert-major outputs. The buffer has no expert-major area (`n*C*k*H*s`
//!   bytes less: 940 MB per PE at T=4096, H=7168 bf16, k=8, 2 PEs), and dispatch writes a
//!   fraction of the bytes (the permute kernel fills only the index).
//!
//! # Layout, dispatch, combine (kernels on one stream)
//! 1. `ep_layout` (grid): block 0 signals every PE that this PE's areas are free again (a ready
//!    word set to a device-side call number); every block takes a range of tokens, checks
//!    every id (`-1` or `0..E`) and every weight of a used slot (finite), counts each token's
//!    destination PEs (once per PE) and adds its pairs per expert and counts per PE to this
//!    PE's accumulators; the block that finishes last waits for every PE's ready signal and puts
//!    one record to every PE (status, count, per-local-expert pairs) with a signal carrying the
//!    call number. No PE waits for the peers' records before sending.
//! 2. `ep_send` (grid), at once (on a gate that `ep_layout`'s last block opens before it puts
//!    the records, not on `ep_layout`'s end): each block gives its tokens their positions in
//!    the send to each destination (the counts of the blocks before it, then a scan), puts
//!    every token's row record (token index, k ids, k weights) into each destination, then
//!    moves every token's row once into each destination's receive area at `source * C +
//!    position` (`C` = `max_tokens` normal, `capacity` capturable; a position beyond `C` is not
//!    written); a warp takes a (token, chunk) unit (chunks of about equal size, at most 192
//!    16-byte vectors: 6 in flight per lane), loads it into registers and stores it to every
//!    destination, the peers before this PE; then each block adds its share to each
//!    destination's data signal. `ep_dwait` (one block)
//!    waits for every PE's record and every source's blocks (the grid, one block per SM, is
//!    agreed by the team at creation), and every
//!    PE takes the same decision from the same records: invalid input anywhere, or a count above
//!    the capacity (capturable mode), and **no** PE uses a row of the step (rows may have moved,
//!    always within the receive areas, while the records travelled); the error is latched in a
//!    device flag that [`Buffer::check`] turns into [`Error::Capacity`] /
//!    [`Error::InvalidArgument`]. Rows thus leave about as soon as the layout is known rather
//!    than after a round trip of records (2x H200, T = 4096: BENCHMARKS.md).
//! 3. Expert-major buffers: `ep_pstream` (grid) moves rows **while they are still coming
//!    in**, and **the rows announce themselves**: nothing is published or fenced per row. The
//!    receive area holds a sentinel (every element all ones) where no row is; `ep_send` stores
//!    rows with no all-ones element (an all-ones NaN loses its sign bit and stays a NaN: the
//!    one way a dispatched row may differ from `x`), and an element is written at once, so an
//!    element that is not the sentinel is the sender's. `ep_send`'s blocks (128 threads for
//!    these buffers) put their row records first and then one "records in" word per (source
//!    block, destination) with a `red.release`; `ep_dwait` opens a gate once the records are in
//!    and the offsets are known, and `ep_pstream`'s blocks (448 threads, at most 96 registers:
//!    they fit beside `ep_send`'s) take rows by tickets (every (source, block) pair's k-th row
//!    before any pair's (k+1)-th): each peer's row as it comes (vectors loaded until no element
//!    is the sentinel, which they then store back) and this PE's own rows straight from `x`
//!    (`ep_send` does not copy them): its local slots take their expert-major rows (atomics),
//!    the row is read once and stored to each, filling the handle arrays. A step that
//!    moves no row (an error) restores the sentinel over the rows the peers put, once they are
//!    all in; after a timeout [`Buffer::check`] refills the area. The last block checks that
//!    every expert got all its rows (else an error from [`Buffer::check`]: inconsistent
//!    counts). The expanded copy (about 4 rows written per row received at k = 8 on 2 PEs) thus
//!    overlaps the NVLink transfer instead of following it (BENCHMARKS.md). With PEs sharing a
//!    GPU a PE's waiting `ep_pstream` blocks may hold off a peer's `ep_send` until its own
//!    ends, never stop it. Token-major buffers: `ep_permute` (grid, after `ep_dwait`) fills the
//!    handle arrays only, a thread per row and slot.
//! 4. Combine, **pre-reduced on the expert side**: `ep_csend` sums, for each received token,
//!    weight × expert output over the slots served here (slot order, `f32`), rounds once to
//!    `T` and puts **one row per (token, PE)** back into the source's combine area; `ep_crecv`
//!    sums the rows of a token over PEs (ascending PE, `f32`) and rounds. Both work on (token,
//!    chunk) units with two rows' loads in flight before accumulating (same order of sums). Semantics differ from
//!    the CPU (per-slot rows, one rounding) only by that intermediate rounding of each PE's
//!    partial sum: exact for `f32` partial sums that are exact, within bf16/f16 tolerance
//!    otherwise. The combine area is `2 * n * C` rows (double-buffered by call parity) instead of
//!    `max_tokens * k`: 235 MB instead of 470 MB for T=4096, H=7168 bf16, k=8, 2 PEs, and
//!    combine traffic is one row per (token, PE) instead of one per slot. `ep_csend` walks its
//!    units with the source varying fastest (the copies to this PE's HBM and to each peer's
//!    link run together) and `combine_tokens` leaves a PE's rows for its own tokens in `y`
//!    (`ep_crecv` reads them there unless `out` overlaps `y`).
//!
//!    **The split combine** (`combine` where every PE of the team has its GPU alone,
//!    `RSHMEM_EP_SPLIT_COMBINE` not 0 on any PE; agreed at creation): one kernel, `ep_csplit`,
//!    with half its blocks putting the partial rows of the peers' tokens (as `ep_csend`) and
//!    half summing this PE's own tokens while the peers' rows arrive: the own slots' partial row
//!    straight from `y` (rounded as `ep_csend` rounds it, never stored), then the peers' rows,
//!    ascending over PEs: bit for bit `ep_crecv`'s result, with no pass over the own partial
//!    rows. A summer learns that a row is in from the row itself, not from a progress word
//!    (every system-scope release on a sending SM cost it about 2 us: twenty-second session):
//!    the peers' rows of the combine area hold a **sentinel** (every 32-bit word all ones)
//!    until their sender overwrites them; senders never store an all-ones word (such a NaN
//!    loses its sign bit, staying a NaN); a 32-bit word is written at once, so a word that is
//!    not the sentinel is the sender's. The summer loads its vectors (volatile) until none is
//!    the sentinel (a device-wait timeout bounds it), sums, and stores the sentinel back; every
//!    other reader of peers' rows there (`ep_crecv`, `ep_ccopy`'s temporary rows) stores it
//!    back too, and the host fills the area again at creation and after any latched error
//!    (loom model `loom_ep_split_combine_sentinel` in `models.rs`: split combines after push,
//!    pull and split combines; it fails without any one of those stores back).
//!    Where `out` overlaps `y` or the buffer on a PE, that PE's summers store its own partial
//!    rows instead and `ep_cwait`/`ep_crecv` sum after the kernel; its peers cannot tell.
//!    2x H200, T = 4096: 195-197 us against 231-234 for the three kernels (BENCHMARKS.md).
//! 5. `combine_tokens` **pulling** ([`TokensCombine`]; the default where a pair's rows reach
//!    [`PULL_MIN_PAIR_BYTES`]): `ep_cready` (one block) puts this PE's `y` offset and a ready
//!    signal to every PE and waits for theirs; `ep_cpull` (grid) reads each token's rows from
//!    the PEs it went to (their `y`, over NVLink, and its own) and sums them as `ep_crecv`
//!    does, in one pass with no combine-area copy; `ep_cdone` (one block) tells every PE its
//!    `y` was read and waits until its own was, so `y` may be written once the stream is past
//!    it. Where `out` overlaps `y`, the sums go to the idle half of the combine area first and
//!    `ep_ccopy` moves them to `out` after `ep_cdone`.
//!
//! # Modes
//! * Normal: after the last dispatch kernel, `ep_readback` (one block) writes the counts
//!   exchanged on the GPU and this PE's device error word into page-locked host memory mapped
//!   for the GPU, then (after a system fence) the readback's number; the host spins until it
//!   sees that number (asking the stream every 256 spins whether it failed or went idle) and
//!   reads them there, without synchronising the stream ([`Dispatch::rows`],
//!   [`Dispatch::expert_counts`], [`Dispatch::recv_tokens_per_pe`], and any error; the device
//!   error word is read again, and taken, only when it is set). Against two synchronous copies
//!   after a synchronisation this took 20-26 us off a T = 4096 step and 20-30 us off a T = 128
//!   one; waiting for the number instead of synchronising, 1-4 us and 4-5 us more (2x H200,
//!   BENCHMARKS.md). While the stream is being
//!   captured into a CUDA graph it does not synchronise: the counts stay on the device (those
//!   methods return `None`), errors are latched for [`Buffer::check`], and the step replays
//!   like a capturable one (its receive area is sized for the worst case, so it cannot
//!   overflow).
//! * Capturable: nothing waits for the host; every kernel reads the counts and the decision
//!   from device memory, so dispatch, an expert computation and combine can be captured once in
//!   a CUDA graph and replayed with new routing written into the same input buffers. A capacity
//!   overflow moves nothing and latches the error; call [`Buffer::check`] after synchronising.
//!
//! # Reusing the areas without extra synchronisation
//! A PE writes a peer's records, receive area (rows, row records) and "records in" words only
//! after the peer's ready signal of the same call, which the peer sends when its stream
//! reaches that dispatch, after every kernel of its earlier steps that reads them (loom models
//! in `models.rs`, two dispatches back to back included); an expert-major receive area's rows
//! are the sentinel again by then (its readers store it back); combine rows go to the half of the
//! combine area of the call's parity, and a PE reaches combine `c+2` only after the peer's rows
//! of `c+1`, sent after it read `c`.
//!
//! # Device wait timeouts
//! A device wait that times out (a peer never signalled, or signalled too late) latches an abort
//! flag on that PE: it stops the step (nothing combined; with expert-major buffers the rows that
//! were in before the wait may have been permuted) and every later signal it sends carries the
//! flag to the receiving PE, which stops too; its later `ep_layout`s write no records and its
//! `ep_send`s move no rows (a peer may still be reading those of the step given up on); their ready and record signals carry the flag as well. So no PE uses rows it gave up
//! waiting for, nor rows or records of another call (a peer may still finish that step with the
//! rows it did receive; it stops at its next wait for that PE; loom model in `models.rs`): the PE
//! that timed out gets [`Error::Timeout`] from [`Buffer::check`], its peers get [`Error::Timeout`]
//! too (naming a team member's wait). The flag is sticky until [`Buffer::check`] clears it; a PE
//! that gave up may still receive a peer's flag after its own check, so before reusing the buffer
//! after a timeout, let every PE synchronise its stream, meet (e.g. [`Pe::barrier_all`]) and call
//! [`Buffer::check`] once more (`tests/cuda_ep.rs`, `gpu_ep_peer_timeout_stops_every_pe`).
//! [`Buffer::check`] also puts the sentinel back over the areas whose rows announce themselves
//! (an expert-major receive area, a split combine's area) after any failed step: rows that
//! came in half or were never read would otherwise pass for the next step's.
//! One exception to "nothing combined": in the split combine the summers wait inside the kernel
//! that writes `out`, so a PE whose summers time out (a peer died or stalled mid-combine) has
//! written some of its tokens and left others wrong; `out` is undefined after that error, which
//! [`Buffer::check`] reports as for any timeout (and the combine area is filled with the
//! sentinel again).
//!
//! # Errors that are not agreed on the device
//! A PE whose inputs fail the host checks still launches `ep_layout` (marked invalid, no pointer
//! read) and, in capturable mode, the rest of the step, so peers see the error too. Combine's
//! host checks (handle of this buffer's latest dispatch, sizes) return before any kernel runs
//! on that PE; its peers' combine then ends in [`Error::Timeout`] (device waits time out), never
//! in silently wrong sums.
//!
//! # Status
//! Run on 2x H200 (one PE per GPU, and 4 thread-PEs on the 2 GPUs), on 4x H200 and on one GPU
//! shared by the PEs: as threads, as processes and mixed (`tests/cuda_ep.rs`, 30 tests).
//! [`ep_bench`] measures beside the same-run NCCL all-to-all-v baseline (`ep_base.rs`; missing
//! where PEs share a GPU or NCCL is absent) and checks both paths' data;
//! `RSHMEM_EP_BREAKDOWN=1` makes it print per-kernel times (stream events between launches).
//!
//! # Buffer sizing (bytes per PE, [`Buffer::bytes_for`])
//! `n*C*H*s` receive rows + `n*C*(1+2k)*4` row records + `2*n*C*H*s` combine rows +
//! `n*C*k*H*s` expert-major rows (none for [`RecvLayout::TokenMajor`]) + small bookkeeping
//! (`s` = element size).

mod baseline;

use crate::backend::cuda::api::{CudaPe, Kernel, KernelArg, Stream};
use crate::backend::cuda::ffi::{self, cu};
use crate::backend::cuda::{gpu, knobs, nccl};
use crate::elem::{Elem, ElemKind};
use crate::ep::{EpConfig, EpMode, RecvLayout, TopkId};
use crate::error::{Error, Result};
use crate::sym::{AsSym, RawSym, Sym, SymView};
use crate::team::Team;
use crate::Pe;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kernels' source (after the device header).
pub const EP_KERNELS: &str = include_str!("../../kernels/ep.cu");

/// Most blocks of the grid kernels. Their grid is one block per SM (512 threads, up to 128
/// registers each: one resident block per SM), the smallest SM count of the team's GPUs, agreed
/// when the buffer is created: every PE counts its peers' block signals, so all use one grid.
const MAX_GRID: u32 = 1024;
const BLOCK: u32 = 512;
/// Threads per block of `ep_send` for expert-major buffers and of `ep_pstream`: `ep_send` takes
/// at most 128 registers per thread and `ep_pstream` at most 96 (`EP_PSTREAM_REGS`), so one
/// block of each fits on an SM (`ep_pstream` moves rows while `ep_send` runs). The send needs
/// few threads (its rows announce themselves: no fences), the expansion many (2x H200:
/// BENCHMARKS.md).
const EM_SEND_BLOCK: u32 = 128;
const PSTREAM_BLOCK: u32 = 448;
/// Threads per block of `ep_csplit` (`EP_SPLIT_BLOCK`: one block per SM, no spills to speak of).
const SPLIT_BLOCK: u32 = 384;
/// Most experts (`ep_layout` counts pairs per expert in shared memory).
pub const MAX_GPU_EXPERTS: usize = 8192;
/// Most local experts whose per-block pair counts the token-major index keeps in shared memory
/// (`EP_INDEX_EXPERTS` of `ep.cu`; more: one global atomic per pair).
const INDEX_EXPERTS: usize = 4096;
/// Most PEs of a GPU EP team (`EP_MAX_PES` of `ep.cu`: destinations are bits of a 64-bit mask).
pub const MAX_GPU_EP_PES: usize = 64;

const CTL_GO: usize = 3;
const CTL_ERR: usize = 4;
const CTL_INFO: usize = 5;
const CTL_ROWS: usize = 6;
const ERR_MINE: u64 = 1;
const ERR_PEER: u64 = 2;
const ERR_CAPACITY: u64 = 4;
const ERR_CORRUPT: u64 = 8;
const ERR_ABORT: u64 = 16;
const REC_FIXED: usize = 4;
/// Signal word groups of `n` words (`EP_SIG_GROUPS`).
const SIG_GROUPS: usize = 7;

/// How [`Buffer::combine_tokens`] moves the rows back. Every PE of the team must use the same
/// (the default comes from the configuration and `RSHMEM_EP_COMBINE_TOKENS`, alike on every PE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokensCombine {
    /// [`Pull`](Self::Pull) where one (source, destination) pair's receive rows
    /// (`pair_capacity * hidden` elements) take at least [`PULL_MIN_PAIR_BYTES`], otherwise
    /// [`Push`](Self::Push).
    Auto,
    /// Each PE puts its rows into their sources' combine areas, which then sum them: one
    /// handshake, two passes over the rows (the faster at decode sizes).
    Push,
    /// Each PE reads its tokens' rows straight from its peers' `y` and sums them as they come:
    /// one pass, but a ready and a done handshake (y stays untouched until every peer has read
    /// it). 2x H200, T = 4096, H = 7168 bf16: 193 us against 222 us pushed.
    Pull,
}

/// [`TokensCombine::Auto`]'s threshold (2x H200: BENCHMARKS.md).
pub const PULL_MIN_PAIR_BYTES: usize = 8 << 20;

impl TokensCombine {
    /// `RSHMEM_EP_COMBINE_TOKENS`: `auto` (or unset), `push` or `pull`.
    fn from_env() -> Result<TokensCombine> {
        match std::env::var("RSHMEM_EP_COMBINE_TOKENS").as_deref() {
            Err(_) | Ok("auto") | Ok("") => Ok(TokensCombine::Auto),
            Ok("push") => Ok(TokensCombine::Push),
            Ok("pull") => Ok(TokensCombine::Pull),
            Ok(v) => Err(Error::invalid(format!(
                "RSHMEM_EP_COMBINE_TOKENS={v}: expected auto, push or pull"
            ))),
        }
    }
}

/// `RSHMEM_EP_SPLIT_COMBINE` (0 or 1, default 1): whether `combine` may take the split kernel
/// (`ep_csplit`) where every PE of the team has its GPU alone.
fn split_combine_from_env() -> Result<bool> {
    Ok(knobs::knob_from_env("RSHMEM_EP_SPLIT_COMBINE", 1, |v| v <= 1, "0 or 1")? == 1)
}

/// `RSHMEM_EP_READBACK_SYNC` (0 or 1, default 0; a measurement knob): 1 makes normal-mode
/// dispatch synchronise its stream before reading the counts instead of waiting for the
/// readback's number.
fn readback_sync_from_env() -> Result<bool> {
    Ok(knobs::knob_from_env("RSHMEM_EP_READBACK_SYNC", 0, |v| v <= 1, "0 or 1")? == 1)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Threads per block of `ep_send` and `ep_pstream` from the measurement knobs
/// `RSHMEM_EP_SEND_THREADS` and `RSHMEM_EP_PSTREAM_THREADS` (`name`, value `v`: a multiple of
/// 32 from 64 to 512), else [`EM_SEND_BLOCK`] (`ep_send`, expert-major buffers),
/// [`PSTREAM_BLOCK`] (`ep_pstream`) or [`BLOCK`] (`ep_send` for token-major buffers). Where
/// `ep_send`'s threads times 128 registers and `ep_pstream`'s times 96 pass an SM's 65536,
/// `ep_pstream`'s blocks no longer fit beside `ep_send`'s and move rows only as `ep_send`'s
/// blocks end.
fn block_threads(name: &str, v: Option<&str>, default: u32) -> Result<u32> {
    let ok = |t: usize| (64..=BLOCK as usize).contains(&t) && t.is_multiple_of(32);
    let what = format!("expected a multiple of 32 from 64 to {BLOCK}");
    Ok(knobs::knob_value(name, v, default as usize, ok, &what)? as u32)
}

/// NVRTC `-D` options of the kernels for hidden type `T` and id type `I`.
pub fn kernel_options(t: ElemKind, id: ElemKind) -> Result<Vec<String>> {
    let tn = match t {
        ElemKind::F32 => "float",
        ElemKind::Bf16 => "rshmem_bfloat16",
        ElemKind::F16 => "rshmem_half",
        k => {
            return Err(Error::invalid(format!(
                "ep: hidden states must be f32, bf16 or f16, not {}",
                k.name()
            )))
        }
    };
    let idn = match id {
        ElemKind::I32 => "int",
        ElemKind::I64 => "long long",
        k => {
            return Err(Error::invalid(format!(
                "ep: top-k ids must be i32 or i64, not {}",
                k.name()
            )))
        }
    };
    let mut o = vec![format!("-DEP_T={tn}"), format!("-DEP_ID={idn}")];
    // Compile-time switches of `ep.cu` for measurements (`RSHMEM_CUDA_EP_NVRTC_OPTS`, space
    // separated; e.g. `-DEP_STAMPS=1`).
    o.extend(
        std::env::var("RSHMEM_CUDA_EP_NVRTC_OPTS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string),
    );
    Ok(o)
}

/// Byte offsets of the areas in the buffer's one symmetric allocation.
#[derive(Debug, Clone, Copy)]
struct Plan {
    cap: usize,
    rmax: usize,
    rmw: usize,
    recv_x: usize,
    recv_meta: usize,
    comb: usize,
    expert_x: usize,
    rec: usize,
    sig: usize,
    ctl: usize,
    recv_cnt: usize,
    expert_off: usize,
    fill: usize,
    tok_pos: usize,
    row_src: usize,
    tok_rows: usize,
    acc: usize,
    prog: usize,
    params: usize,
    total: usize,
}

fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid("ep: buffer size overflows"))
}

fn plan(cfg: &EpConfig, n: usize, es: usize) -> Result<Plan> {
    cfg.validate(n)?;
    if n > MAX_GPU_EP_PES {
        return Err(Error::invalid(format!(
            "ep: GPU teams have at most {MAX_GPU_EP_PES} PEs, not {n}"
        )));
    }
    if cfg.num_experts > MAX_GPU_EXPERTS {
        return Err(Error::invalid(format!(
            "ep: at most {MAX_GPU_EXPERTS} experts on GPUs, not {}",
            cfg.num_experts
        )));
    }
    let cap = match cfg.mode {
        EpMode::Normal => cfg.max_tokens,
        EpMode::Capturable { capacity } => capacity,
    };
    let el = cfg.num_experts / n;
    let k = cfg.max_topk;
    let rows = mul(n, cap)?;
    // Duplicate ids in one token's slots make up to k rows per received token.
    let rmax = mul(rows, k)?;
    let rmw = 1 + 2 * k;
    let rw = REC_FIXED + el;
    let h = cfg.hidden;
    let sizes = [
        mul(mul(rows, h)?, es)?,
        mul(mul(rows, rmw)?, 4)?,
        mul(mul(mul(rows, h)?, es)?, 2)?,
        // The expert-major area only where dispatch writes expanded rows.
        match cfg.layout {
            RecvLayout::ExpertMajor => mul(mul(rmax, h)?, es)?,
            RecvLayout::TokenMajor => 0,
        },
        mul(mul(n, rw)?, 8)?,
        // Signals: records, data, combine, ready, then the pull combine's ready, done and y
        // offsets (n words each).
        SIG_GROUPS * n * 8,
        // 16 control words, then 32 for EP_STAMPS measurements.
        48 * 8,
        n * 4,
        (el + 1) * 4,
        el * 4,
        mul(mul(cfg.max_tokens, n)?, 4)?,
        mul(rmax, 4)?,
        mul(mul(rows, k)?, 4)?,
        // ep_layout's accumulators (pairs per expert, tokens per destination, a flag, a
        // ticket), then each block's tokens per destination.
        (cfg.num_experts + n + 2 + MAX_GRID as usize * n) * 4,
        // "Records in" words (expert-major buffers: ep_pstream moves rows as they come in),
        // one per (source, source block).
        match cfg.layout {
            RecvLayout::ExpertMajor => MAX_GRID as usize * n * 8,
            RecvLayout::TokenMajor => 0,
        },
        PARAM_WORDS * 8,
    ];
    let mut offs = [0usize; 16];
    let mut at = 0usize;
    for (o, sz) in offs.iter_mut().zip(sizes) {
        *o = at;
        at = at
            .checked_add(sz)
            .and_then(|v| v.checked_next_multiple_of(256))
            .ok_or_else(|| Error::invalid("ep: buffer size overflows"))?;
    }
    // Row indices are u32 (row_src: row * kmax + slot) and int (tok_rows, expert-major rows);
    // token counts and positions are int, ep_send steps over tokens 512 at a time in int.
    if rmax.saturating_mul(k) > u32::MAX as usize
        || rmax > i32::MAX as usize
        || cfg.max_tokens > i32::MAX as usize - 1024
    {
        return Err(Error::invalid(
            "ep: buffer too large for 32-bit row indices",
        ));
    }
    Ok(Plan {
        cap,
        rmax,
        rmw,
        recv_x: offs[0],
        recv_meta: offs[1],
        comb: offs[2],
        expert_x: offs[3],
        rec: offs[4],
        sig: offs[5],
        ctl: offs[6],
        recv_cnt: offs[7],
        expert_off: offs[8],
        fill: offs[9],
        tok_pos: offs[10],
        row_src: offs[11],
        tok_rows: offs[12],
        acc: offs[13],
        prog: offs[14],
        params: offs[15],
        total: at,
    })
}

/// The words of the kernels' `ep_params` block, in declaration order and named as in `ep.cu`
/// (`base`: the device address of the buffer's area).
fn param_words(
    base: u64,
    p: &Plan,
    cfg: &EpConfig,
    n: usize,
    dt: &crate::backend::cuda::api::DeviceTeam,
    grid: u32,
    sentinel: bool,
) -> [(&'static str, u64); PARAM_WORDS] {
    let a = |off: usize| base + off as u64;
    [
        ("recv_x", a(p.recv_x)),
        ("recv_meta", a(p.recv_meta)),
        ("comb", a(p.comb)),
        ("rec", a(p.rec)),
        ("sig", a(p.sig)),
        ("ctl", a(p.ctl)),
        ("recv_cnt", a(p.recv_cnt)),
        ("expert_off", a(p.expert_off)),
        ("fill", a(p.fill)),
        ("tok_pos", a(p.tok_pos)),
        ("row_src", a(p.row_src)),
        ("tok_rows", a(p.tok_rows)),
        ("acc", a(p.acc)),
        (
            "prog",
            match cfg.layout {
                RecvLayout::ExpertMajor => a(p.prog),
                RecvLayout::TokenMajor => 0,
            },
        ),
        ("n", n as u64),
        ("me", dt.my_index as u64),
        ("start", dt.start as u64),
        ("stride", dt.stride as u64),
        ("cap", p.cap as u64),
        ("hidden", cfg.hidden as u64),
        ("kmax", cfg.max_topk as u64),
        ("el", (cfg.num_experts / n) as u64),
        ("experts", cfg.num_experts as u64),
        ("max_tokens", cfg.max_tokens as u64),
        ("rmax", p.rmax as u64),
        ("grid", grid as u64),
        ("sentinel", sentinel as u64),
    ]
}

/// Words of the kernels' `ep_params` block.
const PARAM_WORDS: usize = 27;

/// What one dispatch returns on one PE: the handle [`Buffer::combine`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    buffer_id: u64,
    seq: u64,
    num_tokens: usize,
    top_k: usize,
    rows: Option<usize>,
    expert_counts: Option<Vec<usize>>,
    recv_tokens: Option<Vec<usize>>,
}

impl Dispatch {
    /// Tokens this PE dispatched (`T`, the rows combine returns).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    /// The top-k of this PE's dispatch.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Expert-major rows received (normal mode; `None` in capturable mode, where the count
    /// stays on the device — [`Buffer::host_handle`] reads it after a synchronisation).
    pub fn rows(&self) -> Option<usize> {
        self.rows
    }
    /// Rows per local expert (normal mode).
    pub fn expert_counts(&self) -> Option<&[usize]> {
        self.expert_counts.as_deref()
    }
    /// Tokens received from each source PE (team index; normal mode): the valid rows of
    /// [`Buffer::recv_x`] are `s*C .. s*C + recv_tokens_per_pe[s]` (DeepEP's receive counts).
    pub fn recv_tokens_per_pe(&self) -> Option<&[usize]> {
        self.recv_tokens.as_deref()
    }
}

/// What normal-mode dispatch reads back after the count exchange.
struct CtlRead {
    /// The 16 control words.
    ctl: Vec<u64>,
    /// Tokens received from each source.
    recv: Vec<usize>,
    /// The `E/n + 1` expert offsets.
    off: Vec<usize>,
}

/// Bytes from the control words to the end of the `el + 1` expert offsets (the areas are
/// adjacent: control, receive counts, offsets), rounded up to 8.
fn readback_len(p: &Plan, el: usize) -> usize {
    (p.expert_off + (el + 1) * 4 - p.ctl).next_multiple_of(8)
}

/// Parses the bytes from the control area to the end of the expert offsets (`b`, starting at
/// `p.ctl`, little-endian): control words, `n` receive counts at `p.recv_cnt`, `el + 1` offsets
/// at `p.expert_off`.
fn parse_ctl(b: &[u8], p: &Plan, n: usize, el: usize) -> CtlRead {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(w)
    };
    let u32s = |at: usize, count: usize| -> Vec<usize> {
        (0..count)
            .map(|i| {
                let mut w = [0u8; 4];
                w.copy_from_slice(&b[at + 4 * i..at + 4 * i + 4]);
                u32::from_le_bytes(w) as usize
            })
            .collect()
    };
    CtlRead {
        ctl: (0..16).map(word).collect(),
        recv: u32s(p.recv_cnt - p.ctl, n),
        off: u32s(p.expert_off - p.ctl, el + 1),
    }
}

/// The device handle of the last dispatch, copied to the host (for tests and debugging).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostHandle {
    /// Tokens received from each source PE (team index).
    pub recv_tokens_per_pe: Vec<usize>,
    /// `[E/n + 1]`: local expert `e`'s rows are `expert_offsets[e]..expert_offsets[e+1]`.
    pub expert_offsets: Vec<usize>,
    /// For each expert-major row: (source PE team index, source token index, top-k slot).
    pub rows: Vec<(usize, usize, usize)>,
}

/// A GPU expert-parallel buffer for hidden states of type `T` (`f32`, `bf16`, `f16`), created
/// collectively and reused by every dispatch and combine of its team (all calls collective over
/// the team, in the same order on every PE, on one stream per PE).
///
/// A token-major step, experts gathering their rows through the index (identity experts by
/// `scale_experts` with factors of 1 here), then the combine:
///
/// ```no_run
/// # fn f(pe: &rshmem::Pe) -> rshmem::Result<()> {
/// use rshmem::cuda::{ep::Buffer, CudaPe};
/// use rshmem::ep::{EpConfig, RecvLayout};
/// let (t, h, k, e) = (4096, 7168, 8, 256);
/// let cfg = EpConfig::new(e, t, h, k).with_layout(RecvLayout::TokenMajor);
/// let buf = Buffer::<rshmem::bf16>::new(pe, pe.world_team(), cfg)?; // collective (world)
/// let x = pe.alloc::<rshmem::bf16>(t * h)?; // inputs live in the symmetric heap
/// let ids = pe.alloc::<i32>(t * k)?;
/// let w = pe.alloc::<f32>(t * k)?;
/// let y = pe.alloc::<rshmem::bf16>(buf.max_rows() * h)?; // expert outputs, expert-major
/// let out = pe.alloc::<rshmem::bf16>(t * h)?;
/// let ones = pe.alloc::<f32>(e / pe.n_pes())?;
/// pe.local_fill(&ones, 1.0)?;
/// let g = CudaPe::new(pe)?;
/// let s = g.stream()?;
/// let d = buf.dispatch(pe, &s, &x, &ids, &w, t, k)?;
/// // d.recv_tokens_per_pe(): tokens from each source in buf.recv_x();
/// // buf.expert_src(): for each expert-major row, its receive row * k + slot.
/// buf.scale_experts(pe, &s, &buf.recv_x()?, &y, &ones)?;
/// buf.combine(pe, &s, &d, &y, &out)?;
/// s.synchronize()?;
/// buf.check(pe)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Buffer<T: Elem> {
    cfg: EpConfig,
    id: u64,
    n: usize,
    world_me: usize,
    plan: Plan,
    area: Sym<u8>,
    layout32: Kernel,
    layout64: Kernel,
    send32: Kernel,
    send64: Kernel,
    dwait: Kernel,
    cwait: Kernel,
    permute: Kernel,
    pstream: Kernel,
    /// `ep_send`'s and `ep_pstream`'s threads per block ([`block_threads`]).
    send_block: u32,
    pstream_block: u32,
    /// `ep_send`'s and `ep_pstream`'s blocks (measurement knobs `RSHMEM_EP_SEND_BLOCKS` and
    /// `RSHMEM_EP_PSTREAM_BLOCKS`, 0: the grid, and one fewer for `ep_pstream`, as
    /// `ep_dwait`'s block takes the room of one beside `ep_send`); `ep_send` runs at most the
    /// grid (each of its blocks runs one or more of `ep_layout`'s token ranges).
    send_grid: u32,
    pstream_grid: u32,
    csend: Kernel,
    crecv: Kernel,
    scale: Kernel,
    cready: Kernel,
    cpull: Kernel,
    cdone: Kernel,
    ccopy: Kernel,
    tokens_combine: std::cell::Cell<TokensCombine>,
    dispatches: std::cell::Cell<u64>,
    /// Page-locked host bytes, mapped for the GPU, that `ep_readback` fills at the end of a
    /// normal-mode dispatch ([`readback_len`] bytes of control words, counts and offsets, the
    /// device error word, then the readback's number); the host reads them once it sees that
    /// number (`wait_readback`).
    readback: gpu::HostBuf,
    /// `readback` as the device addresses it, and `ep_readback`, which fills it.
    readback_dev: u64,
    readback_k: Kernel,
    /// `ep_csplit`, and whether `combine` takes it (every team PE alone on its GPU, rows of
    /// whole 16-byte vectors, a grid of at least 2 blocks and `RSHMEM_EP_SPLIT_COMBINE` not 0
    /// on every PE: agreed at creation).
    csplit: Kernel,
    split: bool,
    /// Normal-mode readbacks so far (the number each one writes last), and whether dispatch
    /// synchronises its stream instead of waiting for that number (`RSHMEM_EP_READBACK_SYNC`).
    readbacks: std::cell::Cell<u64>,
    readback_sync: bool,
    grid: u32,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// Whether two symmetric objects share a byte (both live in the one symmetric heap).
fn overlaps<T: Elem>(a: &(impl AsSym<T> + ?Sized), b: &(impl AsSym<T> + ?Sized)) -> bool {
    a.raw().overlaps(&b.raw(), std::mem::size_of::<T>())
}

fn words_u32(v: &[u32]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

impl<T: Elem> Buffer<T> {
    /// Symmetric bytes per PE a buffer of `cfg` on a team of `n_pes` takes.
    pub fn bytes_for(cfg: &EpConfig, n_pes: usize) -> Result<usize> {
        Ok(plan(cfg, n_pes, std::mem::size_of::<T>())?.total)
    }

    /// Symmetric bytes per PE this buffer takes.
    pub fn bytes(&self) -> usize {
        self.plan.total
    }

    /// The configuration.
    pub fn config(&self) -> &EpConfig {
        &self.cfg
    }

    /// Rows per (source, destination) pair (`max_tokens` normal, `capacity` capturable).
    pub fn pair_capacity(&self) -> usize {
        self.plan.cap
    }

    /// Chooses how [`combine_tokens`](Self::combine_tokens) moves rows (collective in effect:
    /// every PE of the team must set the same before its next `combine_tokens`).
    pub fn set_tokens_combine(&self, how: TokensCombine) {
        self.tokens_combine.set(how);
    }

    /// Whether `combine_tokens` pulls (the setting, `Auto` resolved by the pair size).
    pub fn tokens_combine_pulls(&self) -> bool {
        match self.tokens_combine.get() {
            TokensCombine::Pull => true,
            TokensCombine::Push => false,
            TokensCombine::Auto => {
                self.plan.cap * self.cfg.hidden * std::mem::size_of::<T>() >= PULL_MIN_PAIR_BYTES
            }
        }
    }

    /// Receive rows, `n * C` (`C` = [`pair_capacity`](Self::pair_capacity)): the rows of
    /// [`recv_x`](Self::recv_x) and of `combine_tokens`' input.
    pub fn recv_rows(&self) -> usize {
        self.n * self.plan.cap
    }

    /// Most expert-major rows one dispatch can produce here (`n * C * k`: duplicate ids give up to k rows per token).
    pub fn max_rows(&self) -> usize {
        self.plan.rmax
    }

    /// Allocates the buffer for `team` and loads its kernels (collective over the world, as
    /// every symmetric allocation is; every PE passes the same configuration).
    pub fn new(pe: &Pe, team: &Team, cfg: EpConfig) -> Result<Buffer<T>> {
        let g = CudaPe::new(pe)?;
        let n = team.n_pes();
        let prepared = (|| {
            let tokens_combine = TokensCombine::from_env()?;
            let knob = |name: &str, default: u32| {
                block_threads(name, std::env::var(name).ok().as_deref(), default)
            };
            let send_block = knob(
                "RSHMEM_EP_SEND_THREADS",
                match cfg.layout {
                    RecvLayout::ExpertMajor => EM_SEND_BLOCK,
                    RecvLayout::TokenMajor => BLOCK,
                },
            )?;
            let pstream_block = knob("RSHMEM_EP_PSTREAM_THREADS", PSTREAM_BLOCK)?;
            let blocks = |name: &str| {
                knobs::knob_from_env(name, 0, |v| v <= MAX_GRID as usize, "at most 1024")
                    .map(|v| v as u32)
            };
            let grids = (
                blocks("RSHMEM_EP_SEND_BLOCKS")?,
                blocks("RSHMEM_EP_PSTREAM_BLOCKS")?,
            );
            let readback_sync = readback_sync_from_env()?;
            let split_knob = split_combine_from_env()?;
            let dt = g.device_team(team)?;
            let p = plan(&cfg, n, std::mem::size_of::<T>())?;
            // Normal mode's readback: the control words, receive counts and expert offsets,
            // then the device error word (8-byte aligned).
            let readback = g.host_buf(readback_len(&p, cfg.num_experts / n) + 16)?;
            let readback_dev = readback.device_ptr()?;
            let o32 = kernel_options(T::KIND, ElemKind::I32)?;
            let o64 = kernel_options(T::KIND, ElemKind::I64)?;
            let o32: Vec<&str> = o32.iter().map(|s| s.as_str()).collect();
            let o64: Vec<&str> = o64.iter().map(|s| s.as_str()).collect();
            let k = |name: &str, o: &[&str]| g.kernel(EP_KERNELS, name, o);
            let ks = (
                [k("ep_layout", &o32)?, k("ep_send", &o32)?],
                [k("ep_layout", &o64)?, k("ep_send", &o64)?],
                [
                    k("ep_dwait", &o32)?,
                    k("ep_cwait", &o32)?,
                    k("ep_permute", &o32)?,
                    k("ep_pstream", &o32)?,
                    k("ep_csend", &o32)?,
                    k("ep_crecv", &o32)?,
                    k("ep_scale_experts", &o32)?,
                ],
                [
                    k("ep_cready", &o32)?,
                    k("ep_cpull", &o32)?,
                    k("ep_cdone", &o32)?,
                    k("ep_ccopy", &o32)?,
                    k("ep_readback", &o32)?,
                    k("ep_csplit", &o32)?,
                ],
            );
            Ok::<_, Error>((
                dt,
                p,
                ks,
                (tokens_combine, send_block, pstream_block, readback_sync),
                (readback, readback_dev),
                split_knob,
                grids,
            ))
        })();
        let (
            dt,
            plan,
            (
                [layout32, send32],
                [layout64, send64],
                [dwait, cwait, permute, pstream, csend, crecv, scale],
                [cready, cpull, cdone, ccopy, readback_k, csplit],
            ),
            (tokens_combine, send_block, pstream_block, readback_sync),
            (readback, readback_dev),
            split_knob,
            (send_grid, pstream_grid),
        ) = match prepared {
            Ok(v) => v,
            Err(e) => {
                // Take part in the collective allocation (0 bytes) so peers are not left
                // waiting for this PE.
                if let Ok(s) = pe.alloc_aligned::<u8>(0, 256) {
                    pe.free(s)?;
                }
                return Err(e);
            }
        };
        let area = pe.alloc_aligned::<u8>(plan.total, 256)?;
        // The grid, agreed: every PE puts its SM count into slot (its team index) of each
        // member's record area, all meet, each takes the smallest (the records are rewritten by
        // every dispatch, which no PE starts before the barrier at the end of this function).
        let slots = area.view::<u64>(plan.rec, n)?;
        let sms = (g.sm_count() as u64).clamp(1, MAX_GRID as u64);
        // Bit 32: this PE may take the split combine (the knob on, its GPU its own; the other
        // conditions are alike on every PE).
        let may_split = (split_knob
            && g.gpu_alone()
            && n >= 2
            && (cfg.hidden * std::mem::size_of::<T>()).is_multiple_of(16))
            as u64;
        for i in 0..n {
            pe.put(
                &slots,
                dt.my_index as usize,
                &[sms | may_split << 32],
                team.world_pe(i)?,
            )?;
        }
        pe.team_barrier(team)?;
        let agreed = pe.local_vec(&slots)?;
        let grid = agreed
            .iter()
            .map(|v| v & 0xffff_ffff)
            .min()
            .unwrap_or(1)
            .clamp(1, MAX_GRID as u64) as u32;
        let split = grid >= 2 && agreed.iter().all(|v| v >> 32 == 1);
        pe.local_fill(&slots, 0)?;
        let buf = Buffer {
            cfg,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            n,
            world_me: pe.my_pe(),
            plan,
            area,
            layout32,
            layout64,
            send32,
            send64,
            dwait,
            cwait,
            permute,
            pstream,
            csend,
            crecv,
            scale,
            cready,
            cpull,
            cdone,
            ccopy,
            tokens_combine: std::cell::Cell::new(tokens_combine),
            send_block,
            pstream_block,
            send_grid: match send_grid {
                0 => grid,
                v => v.min(grid),
            },
            pstream_grid: match pstream_grid {
                0 => grid.saturating_sub(1).max(1),
                v => v,
            },
            dispatches: std::cell::Cell::new(0),
            readback_dev,
            readback,
            readback_k,
            csplit,
            split,
            readbacks: std::cell::Cell::new(0),
            readback_sync,
            grid,
            _t: std::marker::PhantomData,
        };
        let base = g.ptr(&buf.area)?;
        let p = &buf.plan;
        let params: Vec<u64> = param_words(base, p, &cfg, n, &dt, buf.grid, buf.split)
            .iter()
            .map(|w| w.1)
            .collect();
        pe.local_write(&buf.view::<u64>(p.params, PARAM_WORDS)?, 0, &params)?;
        pe.local_fill(&buf.view::<u64>(p.sig, SIG_GROUPS * n)?, 0)?;
        buf.fill_sentinel(pe)?;
        pe.local_fill(&buf.view::<u32>(p.acc, cfg.num_experts + n + 2)?, 0)?;
        pe.local_fill(&buf.view::<u64>(p.ctl, 48)?, 0)?;
        pe.local_fill(&buf.view::<u32>(p.expert_off, cfg.num_experts / n + 1)?, 0)?;
        pe.team_barrier(team)?;
        tracing::debug!(
            pe = pe.my_pe(),
            bytes = p.total,
            ?cfg,
            "cuda ep buffer created"
        );
        Ok(buf)
    }

    fn view<U: Elem>(&self, off: usize, len: usize) -> Result<SymView<'_, U>> {
        self.area.view(off, len)
    }

    /// The expert-major dispatch output area (`[max_rows, H]`; the first `rows` are valid).
    /// A [`RecvLayout::TokenMajor`] buffer has none (an error): its experts read
    /// [`recv_x`](Self::recv_x) through [`expert_src`](Self::expert_src).
    pub fn expert_x(&self) -> Result<SymView<'_, T>> {
        if self.cfg.layout == RecvLayout::TokenMajor {
            return Err(Error::invalid(
                "ep: a token-major buffer has no expert-major area (gather recv_x rows through \
                 expert_src)",
            ));
        }
        self.view(self.plan.expert_x, self.plan.rmax * self.cfg.hidden)
    }

    /// The receive area `[n * C, H]` (`C` = [`pair_capacity`](Self::pair_capacity)): the
    /// tokens from team PE `s` are rows `s*C .. s*C + recv_tokens_per_pe[s]`, in the source's
    /// token order. It is the dispatch output of a [`RecvLayout::TokenMajor`] buffer (each
    /// received token once); valid until the next dispatch. An expert-major buffer's dispatch
    /// only passes the peers' rows through it (they are gone once expanded into
    /// [`expert_x`](Self::expert_x)) and reads this PE's own rows from `x`: there it holds no
    /// rows to read.
    pub fn recv_x(&self) -> Result<SymView<'_, T>> {
        self.view(self.plan.recv_x, self.recv_rows() * self.cfg.hidden)
    }

    /// The expert-major index on the device, `[max_rows]` `u32`: expert-major row `r` (of the
    /// last dispatch, `r < rows`) is receive row `expert_src[r] / max_topk` (source PE `row /
    /// C`, position `row % C`) of [`recv_x`](Self::recv_x), serving that token's top-k slot
    /// `expert_src[r] % max_topk`.
    /// What an expert kernel of a token-major buffer gathers its input rows by (both layouts
    /// fill it).
    pub fn expert_src(&self) -> Result<SymView<'_, u32>> {
        self.view(self.plan.row_src, self.plan.rmax)
    }

    /// Releases the symmetric area (collective over the world, like [`Pe::free`]).
    pub fn free(self, pe: &Pe) -> Result<()> {
        pe.free(self.area)
    }

    fn params_ptr(&self, g: &CudaPe) -> Result<u64> {
        Ok(g.ptr(&self.area)? + self.plan.params as u64)
    }

    fn check_pe(&self, pe: &Pe) -> Result<()> {
        if pe.my_pe() != self.world_me {
            return Err(Error::invalid(format!(
                "ep: buffer of PE {} used by PE {}",
                self.world_me,
                pe.my_pe()
            )));
        }
        Ok(())
    }

    fn validate_dispatch<I: Elem>(
        &self,
        g: &CudaPe,
        x: &(impl AsSym<T> + ?Sized),
        ids: &(impl AsSym<I> + ?Sized),
        w: &(impl AsSym<f32> + ?Sized),
        t: usize,
        top_k: usize,
    ) -> Result<(u64, u64, u64)> {
        let c = &self.cfg;
        if top_k == 0 || top_k > c.max_topk {
            return Err(Error::invalid(format!(
                "ep: top_k {top_k} is out of range 1..={} (max_topk of the buffer)",
                c.max_topk
            )));
        }
        if t > c.max_tokens {
            return Err(Error::invalid(format!(
                "ep: {t} tokens exceed max_tokens {} of the buffer",
                c.max_tokens
            )));
        }
        let need = |what: &'static str, got: usize, expected: usize| {
            if got < expected {
                Err(Error::LengthMismatch {
                    what,
                    got,
                    expected,
                })
            } else {
                Ok(())
            }
        };
        need("x (tokens * hidden)", x.raw().len, t * c.hidden)?;
        need("topk_ids (tokens * top_k)", ids.raw().len, t * top_k)?;
        need("topk_weights (tokens * top_k)", w.raw().len, t * top_k)?;
        // ptr() checks that each object belongs to this world (this PE's GPU heap).
        Ok((g.ptr(x)?, g.ptr(ids)?, g.ptr(w)?))
    }

    /// Dispatches this PE's `num_tokens` tokens (see the [module docs](self)): `x [T, H]`,
    /// `topk_ids [T, top_k]`, `topk_weights [T, top_k]`, all symmetric objects of this PE's
    /// heap, on stream `s`. Collective over the team.
    ///
    /// Normal mode waits until the rows and the counts arrived (every dispatch kernel has
    /// ended; `s` itself is not synchronised) and returns errors found on the device at once,
    /// except while `s` is being captured into a graph;
    /// capturable mode never synchronises (call [`check`](Self::check) after synchronising).
    /// The expert-major rows are in [`expert_x`](Self::expert_x) once `s` reaches the end of
    /// the queued work.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        topk_weights: &(impl AsSym<f32> + ?Sized),
        num_tokens: usize,
        top_k: usize,
    ) -> Result<Dispatch> {
        self.dispatch_marked(
            pe,
            s,
            x,
            topk_ids,
            topk_weights,
            num_tokens,
            top_k,
            &mut || Ok(()),
        )
    }

    /// [`dispatch`](Self::dispatch) calling `mark` after each kernel launch (for timelines).
    #[allow(clippy::too_many_arguments)]
    fn dispatch_marked<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        topk_weights: &(impl AsSym<f32> + ?Sized),
        num_tokens: usize,
        top_k: usize,
        mark: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Dispatch> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        if s.device() != g.device() {
            return Err(Error::invalid("ep: stream of another GPU"));
        }
        let (layout, send) = match I::KIND {
            ElemKind::I64 => (&self.layout64, &self.send64),
            _ => (&self.layout32, &self.send32),
        };
        let prm = KernelArg::Ptr(self.params_ptr(&g)?);
        let capturable = matches!(self.cfg.mode, EpMode::Capturable { .. });
        let checked = self.validate_dispatch(&g, x, topk_ids, topk_weights, num_tokens, top_k);
        let (xp, ip, wp, t, k, mine) = match checked {
            Ok((a, b, c)) => (a, b, c, num_tokens as i32, top_k as i32, None),
            // Invalid here: ep_send reads no input (T = 0) and reports this PE as invalid.
            Err(e) => (0, 0, 0, 0, 1, Some(e)),
        };
        let expert_major = self.cfg.layout == RecvLayout::ExpertMajor;
        // SAFETY: ep_layout(const ep_params*, const ep_id*, const float*, int, int, int, int),
        // ep_send(const ep_params*, const ep_t*, const ep_id*, const float*),
        // ep_dwait(const ep_params*): the pointers were checked to be this PE's symmetric
        // objects with at least T*H / T*k elements (or T = 0 and `invalid`: none is read); the
        // params block lies in the buffer; ep_layout runs the agreed grid (the accumulators
        // hold MAX_GRID blocks' counts), ep_send at most as many blocks (each takes a range of
        // ep_layout's blocks' tokens; any block size up to 512 threads); ep_layout's dynamic
        // shared memory holds E
        // counters; ep_send and ep_dwait are launched as dependents: both start with a wait
        // for ep_layout's gate (opened before ep_layout lets ep_send in), ep_send waits for
        // ep_layout's end before it ends and ep_dwait for ep_send's.
        let smem = (self.cfg.num_experts * 4) as u32;
        unsafe {
            g.launch(
                layout,
                s,
                self.grid,
                BLOCK,
                smem,
                &[
                    prm,
                    KernelArg::Ptr(ip),
                    KernelArg::Ptr(wp),
                    KernelArg::I32(t),
                    KernelArg::I32(k),
                    KernelArg::I32(capturable as i32),
                    KernelArg::I32(mine.is_some() as i32),
                ],
            )?;
            mark()?;
            g.launch_dependent(
                send,
                s,
                self.send_grid,
                self.send_block,
                0,
                &[
                    prm,
                    KernelArg::Ptr(xp),
                    KernelArg::Ptr(ip),
                    KernelArg::Ptr(wp),
                ],
            )?;
            mark()?;
            g.launch_dependent(&self.dwait, s, 1, 1024, 0, &[prm])?;
        }
        mark()?;
        if expert_major {
            let out = g.ptr(&self.expert_x()?)?;
            // SAFETY: ep_pstream(const ep_params*, ep_t*, const ep_t*): `out` is the buffer's
            // expert-major area (max_rows rows, every row index checked against the offsets);
            // `xp` is the checked input (T*H elements; ep_pstream reads the rows of the tokens
            // ep_send recorded for this PE, all below T), or 0 with an invalid input, when no
            // row moves; it starts on ep_dwait's gate and ends with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(
                    &self.pstream,
                    s,
                    self.pstream_grid,
                    self.pstream_block,
                    0,
                    &[prm, KernelArg::Ptr(out), KernelArg::Ptr(xp)],
                )?;
            }
        } else {
            // The index counts each block's pairs per local expert in shared memory.
            let el = self.cfg.num_experts / self.n;
            let smem = if el <= INDEX_EXPERTS {
                (2 * el * 4) as u32
            } else {
                0
            };
            // SAFETY: ep_permute(const ep_params*): with El <= EP_INDEX_EXPERTS its dynamic
            // shared memory holds 2 * El counters; it begins with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(&self.permute, s, self.grid, BLOCK, smem, &[prm])?;
            }
        }
        mark()?;
        self.dispatches.set(self.dispatches.get() + 1);
        let mut rows = None;
        let mut counts = None;
        let mut recv_tokens = None;
        // Normal mode reads the counts back once the step is done, except while `s` is being
        // captured into a graph: then, as in capturable mode, they stay on the device (normal
        // mode's receive area holds the worst case, so nothing can overflow) and errors are
        // latched for `check`, so both modes can be captured.
        if !capturable && !s.is_capturing()? {
            // ep_readback (one block behind the last kernel) writes the counts, the device
            // error word and then its number into mapped page-locked memory.
            let el = self.cfg.num_experts / self.n;
            let len = readback_len(&self.plan, el);
            let seq = self.readbacks.get() + 1;
            self.readbacks.set(seq);
            // SAFETY: ep_readback(const ep_params*, unsigned long long*, int, unsigned long
            // long): `readback` holds len + 16 bytes, the kernel writes len / 8 words, the
            // error word and the number after them; it begins with rshmemi_grid_dep_wait (a
            // dependent).
            unsafe {
                g.launch_dependent(
                    &self.readback_k,
                    s,
                    1,
                    64,
                    0,
                    &[
                        prm,
                        KernelArg::Ptr(self.readback_dev),
                        KernelArg::I32((len / 8) as i32),
                        KernelArg::U64(seq),
                    ],
                )?;
            }
            self.wait_readback(s, len + 8, seq)?;
            let b = self.readback.bytes();
            let CtlRead { ctl, recv, off } = parse_ctl(b, &self.plan, self.n, el);
            let dev_err = u64::from_le_bytes(b[len..len + 8].try_into().unwrap_or_default());
            if let Some(e) = mine {
                self.clear_error(pe, &ctl)?;
                return Err(e);
            }
            // The device error word was 0 behind the kernels: no device wait of this PE timed
            // out, so its check (a copy and a synchronisation more) is left out.
            self.check_words(pe, &ctl, dev_err != 0)?;
            rows = Some(off[el]);
            counts = Some(off.windows(2).map(|w| w[1] - w[0]).collect());
            recv_tokens = Some(recv);
        }
        if let Some(e) = mine {
            return Err(e);
        }
        Ok(Dispatch {
            buffer_id: self.id,
            seq: self.dispatches.get(),
            num_tokens,
            top_k,
            rows,
            expert_counts: counts,
            recv_tokens,
        })
    }

    /// Waits until normal mode's readback number `seq` is in `readback` at byte `at` (the
    /// readback kernel writes it after the counts and the error word): spinning on the word,
    /// asking the stream every 256 spins whether it failed (its error is returned) or went idle
    /// without the number (an error). `RSHMEM_EP_READBACK_SYNC=1`: synchronise the stream
    /// instead (measurements).
    fn wait_readback(&self, s: &Stream, at: usize, seq: u64) -> Result<()> {
        if self.readback_sync {
            s.synchronize()?;
        } else {
            let mut spins = 0u32;
            while self.readback.word(at) != seq {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) && s.idle()? {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        if self.readback.word(at) != seq {
            return Err(Error::invalid(format!(
                "ep dispatch: the stream finished without the counts' readback {seq}"
            )));
        }
        Ok(())
    }

    /// Combines the expert outputs `y` (`[rows, H]`, in [`expert_x`](Self::expert_x)'s row
    /// order; at least `rows * H` elements, `max_rows * H` in capturable mode) back into
    /// `out [T, H]` on the source PEs, on stream `s`. `handle` must be this buffer's latest
    /// dispatch (the device keeps one layout). Collective over the team.
    pub fn combine(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
    ) -> Result<()> {
        self.combine_marked(pe, s, handle, y, out, false, &mut || Ok(()))
    }

    /// Combine for callers that reduce over their local experts themselves (DeepEP's combine):
    /// `y` holds one row per receive row, indexed like [`recv_x`](Self::recv_x) (`[n * C, H]`,
    /// at least that many elements; only the rows of received tokens are read), each already
    /// the token's result on this PE (weights applied by the caller). Every row goes back to
    /// its source, which sums a token's rows over the PEs it went to (ascending, `f32`, rounded
    /// once) into `out [T, H]`; tokens without experts give zeros. Works with either layout;
    /// collective over the team (every PE calls `combine_tokens` for the same dispatch).
    pub fn combine_tokens(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
    ) -> Result<()> {
        self.combine_marked(pe, s, handle, y, out, true, &mut || Ok(()))
    }

    #[allow(clippy::too_many_arguments)]
    fn combine_marked(
        &self,
        pe: &Pe,
        s: &Stream,
        handle: &Dispatch,
        y: &(impl AsSym<T> + ?Sized),
        out: &(impl AsSym<T> + ?Sized),
        tokens: bool,
        mark: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        if handle.buffer_id != self.id {
            return Err(Error::invalid(
                "ep combine: the handle comes from another buffer",
            ));
        }
        if handle.seq != self.dispatches.get() {
            return Err(Error::invalid(
                "ep combine: the handle is not the buffer's latest dispatch",
            ));
        }
        let h = self.cfg.hidden;
        let (what, rows) = if tokens {
            (
                "token outputs (n * C receive rows * hidden)",
                self.recv_rows(),
            )
        } else {
            (
                "expert outputs (rows * hidden)",
                handle.rows.unwrap_or(self.plan.rmax),
            )
        };
        if y.raw().len < rows * h {
            return Err(Error::LengthMismatch {
                what,
                got: y.raw().len,
                expected: rows * h,
            });
        }
        if out.raw().len < handle.num_tokens * h {
            return Err(Error::LengthMismatch {
                what: "combine output (tokens * hidden)",
                got: out.raw().len,
                expected: handle.num_tokens * h,
            });
        }
        let prm = KernelArg::Ptr(self.params_ptr(&g)?);
        let yp = KernelArg::Ptr(g.ptr(y)?);
        let op = KernelArg::Ptr(g.ptr(out)?);
        if tokens && self.tokens_combine_pulls() {
            // The pull combine: every PE reads its tokens' rows from its peers' y. Where out
            // overlaps y (which peers read until the done handshake), the sums go to temporary
            // rows (half of the combine area, n * C rows) and are copied to out afterwards.
            let temp = overlaps(y, out);
            if temp && handle.num_tokens > self.recv_rows() {
                return Err(Error::invalid(format!(
                    "ep combine_tokens: out overlaps y, and the {} tokens exceed the {} temporary rows; \
                     give out its own memory",
                    handle.num_tokens,
                    self.recv_rows()
                )));
            }
            let dst = if temp { KernelArg::Ptr(0) } else { op };
            // SAFETY: (all launched as dependents, each beginning with rshmemi_grid_dep_wait)
            // ep_cready(const ep_params*, const ep_t*), ep_cpull(const ep_params*, ep_t*),
            // ep_cdone(const ep_params*), ep_ccopy(const ep_params*, ep_t*): y is this PE's
            // symmetric object of n * C receive rows (checked above; peers read those rows at
            // the offset ep_cready publishes), out holds T rows, or null: the temporary rows,
            // n * C >= T (checked above), copied to out by ep_ccopy.
            unsafe {
                g.launch_dependent(&self.cready, s, 1, 64, 0, &[prm, yp])?;
                mark()?;
                g.launch_dependent(&self.cpull, s, self.grid, BLOCK, 0, &[prm, dst])?;
                mark()?;
                g.launch_dependent(&self.cdone, s, 1, 64, 0, &[prm])?;
                if temp {
                    g.launch_dependent(&self.ccopy, s, self.grid, BLOCK, 0, &[prm, op])?;
                }
            }
            mark()?;
            return Ok(());
        }
        // combine_tokens pushed: this PE's rows for its own tokens are read from y by ep_crecv
        // instead of being copied to the combine area first, unless out overlaps y (then
        // ep_crecv's writes could meet rows it has yet to read).
        let (mode, own_p) = match (tokens, tokens && !overlaps(y, out)) {
            (true, true) => (2, yp),
            (t, _) => (t as i32, KernelArg::Ptr(0)),
        };
        // SAFETY: (all three launched as dependents, each beginning with rshmemi_grid_dep_wait)
        // ep_csend(const ep_params*, const ep_t*, int), ep_cwait(const ep_params*),
        // ep_crecv(const ep_params*, ep_t*, const ep_t*): y holds the rows the device reads
        // (checked above: expert-major rows, or n*C receive rows with `tokens`), out holds T
        // rows; ep_crecv reads y only with mode 2, when out does not overlap it.
        if !tokens && self.split {
            // The split combine: half the grid puts the peers' rows, half sums this PE's own
            // tokens as their rows come in. Where out overlaps y or this buffer (rows the
            // kernel still reads while others are summed), this PE sums after it instead
            // (ep_cwait, ep_crecv); its peers cannot tell.
            let (o, area) = (out.raw(), self.area.raw());
            let in_area = RawSym {
                len: o.len * std::mem::size_of::<T>(),
                ..o
            }
            .overlaps(&area, 1);
            let fin = !overlaps(y, out) && !in_area;
            // SAFETY: (all launched as dependents, each beginning with rshmemi_grid_dep_wait)
            // ep_csplit(const ep_params*, const ep_t*, ep_t*, int): y holds the expert-major
            // rows (checked above), out T rows (checked above) that, with fin, overlap neither
            // y nor the buffer; the grid is the agreed one (at least 2 blocks, one per SM of
            // EP_SPLIT_BLOCK threads: every block resident, as the summers' waits need) and
            // every PE of the team has its GPU alone (`split`); ep_cwait(const ep_params*),
            // ep_crecv(const ep_params*, ep_t*, const ep_t*) as below, with no rows in y.
            unsafe {
                g.launch_dependent(
                    &self.csplit,
                    s,
                    self.grid,
                    SPLIT_BLOCK,
                    0,
                    &[prm, yp, op, KernelArg::I32(fin as i32)],
                )?;
                mark()?;
                g.launch_dependent(&self.cwait, s, 1, 64, 0, &[prm])?;
                if !fin {
                    mark()?;
                    g.launch_dependent(
                        &self.crecv,
                        s,
                        self.grid,
                        BLOCK,
                        0,
                        &[prm, op, KernelArg::Ptr(0)],
                    )?;
                }
            }
            mark()?;
            return Ok(());
        }
        unsafe {
            g.launch_dependent(
                &self.csend,
                s,
                self.grid,
                BLOCK,
                0,
                &[prm, yp, KernelArg::I32(mode)],
            )?;
            mark()?;
            g.launch_dependent(&self.cwait, s, 1, 64, 0, &[prm])?;
            mark()?;
            g.launch_dependent(&self.crecv, s, self.grid, BLOCK, 0, &[prm, op, own_p])?;
        }
        mark()?;
        Ok(())
    }

    /// A stand-in expert computation on stream `s`: `y[r] = x[r] * factors[local expert of r]`
    /// for the rows of the last dispatch (row count read on the device: capturable). On a
    /// [`RecvLayout::TokenMajor`] buffer `x` is the receive area ([`recv_x`](Self::recv_x)) and
    /// row `r` reads the receive row [`expert_src`](Self::expert_src) names, as a gathering
    /// expert kernel would; `y` is expert-major in both layouts (combine's input).
    pub fn scale_experts(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<T> + ?Sized),
        y: &(impl AsSym<T> + ?Sized),
        factors: &(impl AsSym<f32> + ?Sized),
    ) -> Result<()> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        let h = self.cfg.hidden;
        let gather = self.cfg.layout == RecvLayout::TokenMajor;
        let x_rows = if gather {
            self.recv_rows()
        } else {
            self.plan.rmax
        };
        for (what, len, want) in [
            ("expert input", x.raw().len, x_rows * h),
            ("expert output", y.raw().len, self.plan.rmax * h),
        ] {
            if len < want {
                return Err(Error::LengthMismatch {
                    what,
                    got: len,
                    expected: want,
                });
            }
        }
        let el = self.cfg.num_experts / self.n;
        if factors.raw().len < el {
            return Err(Error::LengthMismatch {
                what: "expert factors",
                got: factors.raw().len,
                expected: el,
            });
        }
        let args = [
            KernelArg::Ptr(self.params_ptr(&g)?),
            KernelArg::Ptr(g.ptr(x)?),
            KernelArg::Ptr(g.ptr(y)?),
            KernelArg::Ptr(g.ptr(factors)?),
            KernelArg::I32(gather as i32),
        ];
        // SAFETY: ep_scale_experts(const ep_params*, const ep_t*, ep_t*, const float*, int)
        // with an output of max_rows rows, an input of max_rows rows (n*C receive rows when
        // gathering: every index the permute wrote is below n*C) and E/n factors.
        unsafe { g.launch(&self.scale, s, self.grid, BLOCK, 0, &args) }
    }

    fn take_error(&self, pe: &Pe) -> Result<(u64, u64)> {
        let v = pe.local_vec(&self.view::<u64>(self.plan.ctl, 16)?)?;
        self.clear_error(pe, &v)
    }

    /// Clears the latched error of control words `v` (as read from the device); returns (error
    /// bits, info).
    fn clear_error(&self, pe: &Pe, v: &[u64]) -> Result<(u64, u64)> {
        if v[CTL_ERR] != 0 {
            self.fill_sentinel(pe)?;
            let ctl = self.view::<u64>(self.plan.ctl, 16)?;
            pe.local_write(&ctl, CTL_ERR, &[0u64, 0u64])?;
        }
        Ok((v[CTL_ERR], v[CTL_INFO]))
    }

    /// Fills the areas whose rows announce themselves with the sentinel (every 32-bit word all
    /// ones): the receive area of an expert-major buffer (`ep_pstream` waits for a peer's row
    /// until no element of it is the sentinel) and, where the split combine runs, the combine
    /// area (both halves; `ep_csplit`'s summers wait alike). At creation, and after any failed
    /// step, whose rows may be half there.
    fn fill_sentinel(&self, pe: &Pe) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let base = g.ptr(&self.area)?;
        let row = self.cfg.hidden * std::mem::size_of::<T>();
        let rows = self.n * self.plan.cap;
        if self.cfg.layout == RecvLayout::ExpertMajor {
            // Whole 32-bit words: the area ends on a 256-byte boundary (plan).
            g.backend().fill_u32(
                base + self.plan.recv_x as u64,
                u32::MAX,
                (rows * row).div_ceil(4),
            )?;
        }
        if self.split {
            g.backend()
                .fill_u32(base + self.plan.comb as u64, u32::MAX, 2 * rows * row / 4)?;
        }
        Ok(())
    }

    /// Reports errors latched on the device by earlier calls (call after synchronising the
    /// stream): capacity overflow ([`Error::Capacity`], nothing was moved), invalid ids or
    /// weights on some PE, device wait timeouts. Clears them.
    pub fn check(&self, pe: &Pe) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let own = g.check_device_errors();
        let (err, info) = self.take_error(pe)?;
        own?;
        self.error_of(&g, err, info)
    }

    /// [`check`](Self::check) with control words already read (`ctl`), the device error word
    /// only with `device` (else it was read as 0 behind the kernels).
    fn check_words(&self, pe: &Pe, ctl: &[u64], device: bool) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let own = if device {
            g.check_device_errors()
        } else {
            Ok(())
        };
        let (err, info) = self.clear_error(pe, ctl)?;
        own?;
        self.error_of(&g, err, info)
    }

    /// The error of latched error bits `err` and info word `info`.
    fn error_of(&self, g: &CudaPe, err: u64, info: u64) -> Result<()> {
        if err & ERR_ABORT != 0 {
            // A peer gave up waiting (its own check reports that timeout): this PE used
            // nothing that followed; its outputs of that step are left as they were.
            return Err(Error::Timeout {
                op: "ep step (a team member's device-side wait timed out; nothing after it was used)",
                pe: None,
                after: g.backend().timeout,
            });
        }
        if err & ERR_CAPACITY != 0 {
            return Err(Error::Capacity {
                op: "ep dispatch",
                src_pe: ((info >> 24) & 0xff) as usize,
                dst_pe: (info & 0xff_ffff) as usize,
                needed: (info >> 32) as usize,
                capacity: self.plan.cap,
            });
        }
        if err & ERR_MINE != 0 {
            return Err(Error::invalid(
                "ep dispatch: an expert id is out of range (-1 or 0..E) or a used slot's weight \
                 is not finite in this PE's input; nothing was sent",
            ));
        }
        if err & ERR_PEER != 0 {
            return Err(Error::invalid(format!(
                "ep dispatch: PE {} (team index) rejected its input; nothing was sent",
                info & 0xff_ffff
            )));
        }
        if err & ERR_CORRUPT != 0 {
            return Err(ffi::err("ep: inconsistent counts on the device"));
        }
        Ok(())
    }

    /// True when the last dispatch moved data (the device decision; after a synchronisation).
    pub fn last_dispatch_ok(&self, pe: &Pe) -> Result<bool> {
        Ok(pe.local_vec(&self.view::<u64>(self.plan.ctl, 16)?)?[CTL_GO] == 1)
    }

    /// Copies the last dispatch's device handle to the host (after a synchronisation).
    pub fn host_handle(&self, pe: &Pe) -> Result<HostHandle> {
        let p = &self.plan;
        let el = self.cfg.num_experts / self.n;
        let k = self.cfg.max_topk;
        let ctl = pe.local_vec(&self.view::<u64>(p.ctl, 16)?)?;
        let recv = words_u32(&pe.local_vec(&self.view::<u32>(p.recv_cnt, self.n)?)?);
        let off = words_u32(&pe.local_vec(&self.view::<u32>(p.expert_off, el + 1)?)?);
        let nrows = ctl[CTL_ROWS] as usize;
        if nrows > p.rmax || off[el] != nrows {
            return Err(ffi::err("ep: inconsistent row count on the device"));
        }
        let rs = pe.local_vec(&self.view::<u32>(p.row_src, p.rmax)?)?;
        let meta = pe.local_vec(&self.view::<u32>(p.recv_meta, self.n * p.cap * p.rmw)?)?;
        let mut rows = Vec::with_capacity(nrows);
        for &v in &rs[..nrows] {
            let (gi, j) = (v as usize / k, v as usize % k);
            rows.push((gi / p.cap, meta[gi * p.rmw] as usize, j));
        }
        Ok(HostHandle {
            recv_tokens_per_pe: recv,
            expert_offsets: off,
            rows,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Benchmark

/// One EP measurement (the `rshmem perf` JSON schema plus the token count).
#[derive(Debug, Clone, PartialEq)]
pub struct EpBenchRecord {
    /// `ep_dispatch` or `ep_combine`.
    pub op: &'static str,
    /// Always "device".
    pub api: &'static str,
    /// Always "cuda".
    pub backend: &'static str,
    /// `normal` or `capturable`.
    pub mode: &'static str,
    /// Team size.
    pub pes: usize,
    /// Tokens per PE.
    pub tokens: usize,
    /// Bytes PE 0 sent to other PEs per call (DeepEP's convention).
    pub bytes: usize,
    /// Calls timed.
    pub iters: usize,
    /// Microseconds per call.
    pub time_us: f64,
    /// bytes / time in GB/s.
    pub gbps: f64,
    /// The baseline's name ([`EP_BASELINE`]).
    pub baseline: String,
    /// Why the baseline is missing, when it is.
    pub baseline_note: Option<String>,
    /// Baseline microseconds per call (0 when missing).
    pub baseline_time_us: f64,
    /// baseline_time_us / time_us (0 when missing).
    pub ratio: f64,
}

/// What [`ep_bench`] measures.
#[derive(Debug, Clone)]
pub struct EpBenchArgs {
    /// Token counts per PE (e.g. 4096 and 128).
    pub tokens: Vec<usize>,
    /// Hidden size.
    pub hidden: usize,
    /// Top-k.
    pub top_k: usize,
    /// Experts.
    pub experts: usize,
    /// Timed iterations.
    pub iters: usize,
}

impl Default for EpBenchArgs {
    fn default() -> Self {
        EpBenchArgs {
            tokens: vec![4096, 128],
            hidden: 7168,
            top_k: 8,
            experts: 256,
            iters: 20,
        }
    }
}

/// Deterministic random routing of PE `pe`: `top_k` distinct experts per token, weights.
pub fn bench_routing(pe: usize, t: usize, k: usize, e: usize) -> (Vec<i32>, Vec<f32>) {
    let mut st = 0x9e37_79b9_7f4a_7c15u64 ^ ((pe as u64 + 1) << 20);
    let mut next = || {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        st
    };
    let mut ids = Vec::with_capacity(t * k);
    let mut w = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut chosen: Vec<i32> = Vec::with_capacity(k);
        while chosen.len() < k.min(e) {
            let c = (next() % e as u64) as i32;
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        chosen.resize(k, -1);
        for c in chosen {
            ids.push(c);
            w.push(((next() % 8) + 1) as f32 / 8.0);
        }
    }
    (ids, w)
}

use crate::backend::cuda::bench::{time_stream, Ev};

/// With `-DEP_STAMPS=1` (RSHMEM_CUDA_EP_NVRTC_OPTS): prints the last dispatch's and combine's
/// clock stamps (control words 16.., `ep.cu` says which); nothing when they were not compiled in.
fn print_stamps<T: Elem>(pe: &Pe, buf: &Buffer<T>, what: &str) -> Result<()> {
    let c = pe.local_vec(&buf.view::<u64>(buf.plan.ctl + 16 * 8, 24)?)?;
    if c[0] == 0 {
        return Ok(());
    }
    let us = |k: usize| c[k].wrapping_sub(c[0]) as i64 as f64 / 1e3;
    eprintln!(
        "ep stamps {what} (us after layout start): layout {:.1} peers ready {:.1} records out {:.1} | send {:.1}-{:.1} | records in {:.1} rows in {:.1} wait end {:.1} | index or pstream {:.1}-{:.1}",
        us(1), us(2), us(3), us(4), us(5), us(6), us(7), us(8), us(9), us(10)
    );
    let cs = |k: usize| c[k].wrapping_sub(c[11]) as i64 as f64 / 1e3;
    eprintln!(
        "ep stamps {what} (us after csend start): csend end {:.1} wait end {:.1} crecv {:.1}-{:.1} (cwait start {:.1}, crecv blocks' latest start {:.1})",
        cs(12),
        cs(13),
        cs(14),
        cs(15),
        cs(22),
        cs(23)
    );
    eprintln!(
        "ep stamps {what} (us after layout start): layout blocks' latest start {:.1}, tokens counted {:.1}, counts fenced {:.1}; dwait start {:.1}, its gate open {:.1}, pstream blocks' latest start {:.1}",
        us(16), us(17), us(18), us(21), us(20), us(19)
    );
    Ok(())
}

/// Per-stage times (µs, averaged over `iters`) of calls made by `f`, which calls the mark it
/// is given after each kernel launch.
fn stage_times(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut(&mut dyn FnMut() -> Result<()>) -> Result<()>,
) -> Result<Vec<f64>> {
    let gpu = gpu::gpu(g.device())?;
    let _b = gpu.bind()?;
    let raw = s.raw() as cu::CUstream;
    let mut sums: Vec<f64> = Vec::new();
    for _ in 0..iters {
        let first = Ev::new()?;
        // SAFETY: a live event and stream of the current context.
        ffi::check(unsafe { cu::cuEventRecord(first.0, raw) }, "cuEventRecord")?;
        let mut evs = vec![first];
        f(&mut || {
            let e = Ev::new()?;
            // SAFETY: as above.
            ffi::check(unsafe { cu::cuEventRecord(e.0, raw) }, "cuEventRecord")?;
            evs.push(e);
            Ok(())
        })?;
        s.synchronize()?;
        sums.resize(sums.len().max(evs.len() - 1), 0.0);
        for i in 1..evs.len() {
            let mut ms = 0f32;
            // SAFETY: both events recorded and complete.
            ffi::check(
                unsafe { cu::cuEventElapsedTime_v2(&mut ms, evs[i - 1].0, evs[i].0) },
                "cuEventElapsedTime",
            )?;
            sums[i - 1] += ms as f64 * 1e3;
        }
    }
    Ok(sums.iter().map(|v| v / iters.max(1) as f64).collect())
}

/// The baseline's name in the records.
pub const EP_BASELINE: &str = "nccl-a2av";

/// Symmetric heap bytes per PE [`ep_bench`] needs for `args` on `n` PEs (upper bound).
pub fn ep_bench_heap_bytes(args: &EpBenchArgs, n: usize) -> Result<usize> {
    let mut most = 0usize;
    for &t in &args.tokens {
        let cfg = EpConfig::new(args.experts, t.max(1), args.hidden, args.top_k);
        let es = std::mem::size_of::<crate::bf16>();
        let buf = Buffer::<crate::bf16>::bytes_for(&cfg, n)?;
        let rows_cap = n * t * args.top_k;
        let io = 2 * t * args.hidden * es
            + 2 * t * args.top_k * 4
            + (rows_cap.max(n * t).max(t) + 1) * 8;
        let base = baseline::base_bytes(n, t, args.hidden, args.top_k, args.experts, rows_cap);
        most = most.max(buf + io + base);
    }
    Ok(most + (64 << 20))
}

/// Benchmarks dispatch and combine (bf16, random routing, both modes) on the world team beside
/// the same-run NCCL all-to-all-v baseline (`ep_base.rs` says exactly what it includes), and
/// checks the data of both: the expert-major rows per local expert and the combine output per
/// token against a reference computed from the known inputs (checksums; identity experts).
/// Each mode runs twice: expert-major (`normal`, `capturable`) and token-major (`normal+tokens`,
/// `capturable+tokens`: dispatch checked through the expert-major index, combine through
/// [`Buffer::combine_tokens`] with the receive rows as per-token results). Collective; the heap
/// must hold [`ep_bench_heap_bytes`]. The baseline is reported missing (with the reason in
/// `baseline`, time and ratio 0) when NCCL cannot be loaded on some PE or the PEs share a GPU
/// (NCCL needs one GPU per rank). Returns PE 0's records (others an empty list); a failed data
/// check on any PE is an error on that PE.
pub fn ep_bench(pe: &Pe, args: &EpBenchArgs) -> Result<Vec<EpBenchRecord>> {
    use crate::bf16 as Bf16;
    use baseline::{self as eb, NcclBase};
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let n = pe.n_pes();
    let me = pe.my_pe();
    let h = args.hidden;
    let k = args.top_k;
    let e = args.experts;
    let es = std::mem::size_of::<Bf16>();
    let cfg_of = |t: usize, mode, layout| {
        EpConfig::new(e, t.max(1), h, k)
            .with_mode(mode)
            .with_layout(layout)
    };
    for &t in &args.tokens {
        // The configuration and the GPU limits (PEs, experts) that the baseline's kernels share
        // with rshmem's, checked before anything collective.
        Buffer::<Bf16>::bytes_for(&EpConfig::new(e, t.max(1), h, k), n)?;
    }
    let kernels = eb::Kernels::load(&g)?;
    let lib = nccl::Nccl::load();
    let (comm, why) = nccl::world_comm(pe, &g, &lib)?;
    let grid = (g.sm_count() as u32).clamp(1, MAX_GRID);
    // Data check failures, reported after the collective steps (so no PE is left waiting).
    let mut bad: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for &t in &args.tokens {
        let routes: Vec<(Vec<i32>, Vec<f32>)> = (0..n).map(|p| bench_routing(p, t, k, e)).collect();
        let epp = e / n;
        // Tokens PE p sends to PE d.
        let cnt = |p: usize, d: usize| -> usize {
            routes[p]
                .0
                .chunks(k)
                .filter(|row| row.iter().any(|&id| id >= 0 && id as usize / epp == d))
                .count()
        };
        // Expert-major rows on PE d.
        let rows_on = |d: usize| -> usize {
            routes
                .iter()
                .map(|(ids, _)| {
                    ids.iter()
                        .filter(|&&id| id >= 0 && id as usize / epp == d)
                        .count()
                })
                .sum()
        };
        let rows_cap = (0..n).map(rows_on).max().unwrap_or(0).max(1);
        let dbytes: usize = (0..n)
            .filter(|&d| d != me)
            .map(|d| cnt(me, d))
            .sum::<usize>()
            * h
            * es;
        let cbytes: usize = (0..n)
            .filter(|&s| s != me)
            .map(|s| cnt(s, me))
            .sum::<usize>()
            * h
            * es;
        let max_pair = (0..n)
            .flat_map(|p| (0..n).map(move |d| (p, d)))
            .map(|(p, d)| cnt(p, d))
            .max()
            .unwrap_or(1)
            .max(1);
        let reference = eb::reference(&routes, me, t, h, k, e);
        let x = pe.alloc_aligned::<Bf16>((t * h).max(1), 256)?;
        let ids = pe.alloc::<i32>((t * k).max(1))?;
        let w = pe.alloc::<f32>((t * k).max(1))?;
        let hashes = pe.alloc::<u64>(rows_cap.max(n * t).max(t).max(1))?;
        let xs: Vec<Bf16> = (0..t * h).map(|i| eb::x_val(me, i)).collect();
        pe.local_write(&x, 0, &xs)?;
        pe.local_write(&ids, 0, &routes[me].0)?;
        pe.local_write(&w, 0, &routes[me].1)?;
        let y = pe.alloc_aligned::<Bf16>((t * h).max(1), 256)?;

        // The baseline (same inputs), timed and checked.
        let (mut base_d, mut base_c) = (0.0, 0.0);
        if let Some(c) = &comm {
            let mut b = NcclBase::new(pe, c, &kernels, t, h, k, e, rows_cap, grid)?;
            pe.barrier_all()?;
            let r = (|| -> Result<()> {
                base_d = time_stream(&g, &s, args.iters, || b.dispatch(pe, &g, &s, &x, &ids, &w))?;
                s.synchronize()?;
                let off = b.offsets(pe)?;
                let rows = off.last().copied().unwrap_or(0).min(rows_cap);
                let hs = eb::row_hashes(pe, &g, &s, &kernels, &b.ex, rows, h, &hashes, grid)?;
                if let Err(m) = eb::check_dispatch("nccl baseline dispatch", &off, &hs, &reference)
                {
                    bad.push(format!("T={t}: {m}"));
                }
                base_c = time_stream(&g, &s, args.iters, || b.combine(&g, &s))?;
                let hs = eb::row_hashes(pe, &g, &s, &kernels, &b.out, t, h, &hashes, grid)?;
                if let Err(m) = eb::check_combine("nccl baseline combine", &hs, &reference) {
                    bad.push(format!("T={t}: {m}"));
                }
                Ok(())
            })();
            s.synchronize()?;
            pe.barrier_all()?;
            b.free(pe)?;
            r?;
        }

        let modes = [
            EpMode::Normal,
            EpMode::Capturable {
                capacity: max_pair.min(t.max(1)),
            },
        ];
        for mode in modes {
            // Expert-major (identity experts: combine reads expert_x), then token-major (the
            // same dispatch without the expanded copy; combine_tokens sends each PE's receive
            // rows back as its per-token results, so out = x * the PEs the token went to).
            for layout in [RecvLayout::ExpertMajor, RecvLayout::TokenMajor] {
                let tokens = layout == RecvLayout::TokenMajor;
                let buf = Buffer::<Bf16>::new(pe, pe.world_team(), cfg_of(t, mode, layout))?;
                let name = match (mode == EpMode::Normal, tokens) {
                    (true, false) => "normal",
                    (false, false) => "capturable",
                    (true, true) => "normal+tokens",
                    (false, true) => "capturable+tokens",
                };
                let yin = if tokens {
                    buf.recv_x()?
                } else {
                    buf.expert_x()?
                };
                let combine = |d: &Dispatch, m: &mut dyn FnMut() -> Result<()>| {
                    buf.combine_marked(pe, &s, d, &yin, &y, tokens, m)
                };
                let (td, tc) = if mode == EpMode::Normal {
                    let mut last = None;
                    let td = time_stream(&g, &s, args.iters, || {
                        last = Some(buf.dispatch(pe, &s, &x, &ids, &w, t, k)?);
                        Ok(())
                    })?;
                    let d = last.ok_or_else(|| Error::invalid("no dispatch"))?;
                    let tc = time_stream(&g, &s, args.iters, || combine(&d, &mut || Ok(())))?;
                    (td, tc)
                } else {
                    // Capture one dispatch and one combine, replay each.
                    buf.dispatch(pe, &s, &x, &ids, &w, t, k)?;
                    s.synchronize()?;
                    buf.check(pe)?;
                    pe.barrier_all()?;
                    s.begin_capture()?;
                    let d = buf.dispatch(pe, &s, &x, &ids, &w, t, k);
                    let gd = s.end_capture()?;
                    let d = d?;
                    s.begin_capture()?;
                    let r = combine(&d, &mut || Ok(()));
                    let gc = s.end_capture()?;
                    r?;
                    let td = time_stream(&g, &s, args.iters, || gd.launch(&s))?;
                    let tc = time_stream(&g, &s, args.iters, || gc.launch(&s))?;
                    (td, tc)
                };
                s.synchronize()?;
                buf.check(pe)?;
                if me == 0 && std::env::var_os("RSHMEM_EP_BREAKDOWN").is_some() {
                    // The timed calls' own stamps (no events between their kernels).
                    print_stamps(pe, &buf, &format!("T={t} {name} timed"))?;
                }
                // The data of the last calls: each expert's rows (gathered through the index
                // when token-major) and the combine output.
                let hh = buf.host_handle(pe)?;
                let rows = hh.expert_offsets.last().copied().unwrap_or(0);
                let dispatch_hashes = if tokens {
                    let recv_rows = buf.recv_rows();
                    let hs =
                        eb::row_hashes(pe, &g, &s, &kernels, &yin, recv_rows, h, &hashes, grid)?;
                    let src =
                        pe.local_vec(&buf.view::<u32>(buf.plan.row_src, rows.min(buf.plan.rmax))?)?;
                    src.iter()
                        .map(|&v| hs.get(v as usize / k).copied())
                        .collect()
                } else {
                    let rows = rows.min(rows_cap);
                    Some(eb::row_hashes(
                        pe, &g, &s, &kernels, &yin, rows, h, &hashes, grid,
                    )?)
                };
                let what = format!("rshmem dispatch ({name})");
                match dispatch_hashes {
                    None => bad.push(format!(
                        "T={t}: {what}: an expert row points outside the receive area"
                    )),
                    Some(hs) => {
                        if let Err(m) =
                            eb::check_dispatch(&what, &hh.expert_offsets, &hs, &reference)
                        {
                            bad.push(format!("T={t}: {m}"));
                        }
                    }
                }
                let want = if tokens {
                    eb::Reference {
                        out_hash: eb::reference_token_combine(&routes, me, t, h, k, e),
                        ..reference.clone()
                    }
                } else {
                    reference.clone()
                };
                let hs = eb::row_hashes(pe, &g, &s, &kernels, &y, t, h, &hashes, grid)?;
                if let Err(m) = eb::check_combine(&format!("rshmem combine ({name})"), &hs, &want) {
                    bad.push(format!("T={t}: {m}"));
                }
                pe.barrier_all()?;
                if std::env::var_os("RSHMEM_EP_BREAKDOWN").is_some() {
                    let mut last = None;
                    let dt = stage_times(&g, &s, args.iters, |m| {
                        last = Some(buf.dispatch_marked(pe, &s, &x, &ids, &w, t, k, m)?);
                        Ok(())
                    })?;
                    let d = last.ok_or_else(|| Error::invalid("no dispatch"))?;
                    let ct = stage_times(&g, &s, args.iters, |m| combine(&d, m))?;
                    if me == 0 {
                        print_stamps(pe, &buf, &format!("T={t} {name} marked"))?;
                        let last = if tokens { "index" } else { "permute" };
                        eprintln!(
                            "ep breakdown T={t} {name} grid={}: dispatch layout/send/wait/{last} {dt:.1?} us; combine csend/wait/crecv {ct:.1?} us",
                            buf.grid
                        );
                    }
                    s.synchronize()?;
                    buf.check(pe)?;
                    pe.barrier_all()?;
                }
                for (op, tu, bytes, base) in [
                    ("ep_dispatch", td, dbytes, base_d),
                    ("ep_combine", tc, cbytes, base_c),
                ] {
                    out.push(EpBenchRecord {
                        op,
                        api: "device",
                        backend: "cuda",
                        mode: name,
                        pes: n,
                        tokens: t,
                        bytes,
                        iters: args.iters,
                        time_us: tu,
                        gbps: if tu > 0.0 {
                            bytes as f64 / (tu * 1e3)
                        } else {
                            0.0
                        },
                        baseline: EP_BASELINE.to_string(),
                        baseline_note: why.clone(),
                        baseline_time_us: base,
                        ratio: if tu > 0.0 && base > 0.0 {
                            base / tu
                        } else {
                            0.0
                        },
                    });
                }
                buf.free(pe)?;
            }
        }
        pe.free(y)?;
        pe.free(hashes)?;
        pe.free(w)?;
        pe.free(ids)?;
        pe.free(x)?;
    }
    s.synchronize()?;
    drop(comm);
    pe.barrier_all()?;
    if !bad.is_empty() {
        let msg = format!("ep bench: data check failed on PE {me}: {}", bad.join("; "));
        // Compile switches for measurements may build wrong results on purpose (such as
        // EP_SEND_SKIP_SELF): their timings are still reported, the failure as a warning.
        let switched =
            std::env::var("RSHMEM_CUDA_EP_NVRTC_OPTS").is_ok_and(|o| !o.trim().is_empty());
        if !switched {
            return Err(ffi::err(msg));
        }
        tracing::warn!("{msg} (kernels built with RSHMEM_CUDA_EP_NVRTC_OPTS)");
        eprintln!("rshmem: warning: {msg} (kernels built with RSHMEM_CUDA_EP_NVRTC_OPTS)");
    }
    Ok(if me == 0 { out } else { Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_of_objects_and_views() {
        let r = crate::threads_with(crate::Config::default(), 1, |pe| -> Result<()> {
            let a = pe.alloc::<u16>(100)?;
            let b = pe.alloc::<u16>(100)?;
            assert!(overlaps::<u16>(&a, &a));
            assert!(!overlaps::<u16>(&a, &b) && !overlaps::<u16>(&b, &a));
            // Views in bytes: [20, 60) and [58, 100) share bytes 58..60, [60, 100) none.
            let v = a.view::<u16>(20, 20)?;
            assert!(overlaps::<u16>(&v, &a.view::<u16>(58, 21)?));
            assert!(!overlaps::<u16>(&v, &a.view::<u16>(60, 20)?));
            // An empty view overlaps nothing.
            assert!(!overlaps::<u16>(&a.view::<u16>(30, 0)?, &a));
            Ok(())
        })
        .expect("world");
        for x in r {
            x.expect("PE");
        }
    }

    /// `(name, parameter list)` of every `extern "C" __global__` kernel of `src`.
    fn kernels(src: &str) -> Vec<(&str, &str)> {
        src.split("extern \"C\" __global__")
            .skip(1)
            .map(|d| {
                let d = d.trim_start().trim_start_matches("void").trim_start();
                // Launch bounds or a register cap: `__launch_bounds__(N) name(`,
                // `__maxnreg__(N) name(`.
                let d = match d
                    .strip_prefix("__launch_bounds__(")
                    .or_else(|| d.strip_prefix("__maxnreg__("))
                {
                    Some(r) => r[r.find(')').expect("launch bounds") + 1..].trim_start(),
                    None => d,
                };
                let open = d.find('(').expect("parameter list");
                let close = d.find(')').expect("parameter list");
                (d[..open].trim(), &d[open + 1..close])
            })
            .collect()
    }

    /// Parameter types of kernel `name` as declared in `src` (pointers as `ptr`, `const`
    /// dropped).
    fn kernel_params(src: &str, name: &str) -> Vec<String> {
        let (_, list) = kernels(src)
            .into_iter()
            .find(|k| k.0 == name)
            .unwrap_or_else(|| panic!("kernel {name} not declared"));
        crate::backend::cuda::srcparse::param_types(list)
    }

    /// Every kernel of `ep.cu` takes the parameters its launch site passes, in order (the
    /// driver reads as many bytes per parameter as the kernel declares): `KernelArg::Ptr` ↔
    /// pointer, `I32` ↔ `int`, `I64` ↔ `long long`, `U64` ↔ `unsigned long long` (ep.rs and
    /// ep_base.rs).
    #[test]
    fn launches_match_the_kernel_signatures() {
        let (p, i, l) = ("ptr", "int", "long long");
        let launches: [(&str, Vec<&str>); 21] = [
            // ep.rs
            ("ep_layout", vec![p, p, p, i, i, i, i]),
            ("ep_send", vec![p, p, p, p]),
            ("ep_dwait", vec![p]),
            ("ep_cwait", vec![p]),
            ("ep_permute", vec![p]),
            ("ep_pstream", vec![p, p, p]),
            ("ep_csend", vec![p, p, i]),
            ("ep_csplit", vec![p, p, p, i]),
            ("ep_crecv", vec![p, p, p]),
            ("ep_scale_experts", vec![p, p, p, p, i]),
            ("ep_cready", vec![p, p]),
            ("ep_cpull", vec![p, p]),
            ("ep_cdone", vec![p]),
            ("ep_ccopy", vec![p, p]),
            ("ep_readback", vec![p, p, i, "unsigned long long"]),
            // ep_base.rs
            ("epb_layout", vec![p, i, i, i, i, p, p, p]),
            ("epb_pack", vec![p, p, p, p, i, i, i, l, p, p]),
            (
                "epb_permute",
                vec![p, i, i, i, i, i, l, p, p, p, p, p, p, p],
            ),
            ("epb_csum", vec![p, i, i, i, i, l, p, p, p, p]),
            ("epb_crecv", vec![p, i, i, l, p, p]),
            ("epb_rowhash", vec![p, l, l, p]),
        ];
        for (name, want) in &launches {
            assert_eq!(&kernel_params(EP_KERNELS, name), want, "{name}");
        }
        // Every extern "C" kernel of the file is in the list above.
        let all = kernels(EP_KERNELS);
        assert_eq!(all.len(), launches.len());
        for (name, _) in all {
            assert!(
                launches.iter().any(|l| l.0 == name),
                "kernel {name} has no checked launch"
            );
        }
    }

    /// `(type, name)` of every field of `struct name { ... };` in `src` (comma lists split).
    fn struct_fields(src: &str, name: &str) -> Vec<(String, String)> {
        let body = src
            .split(&format!("struct {name} {{"))
            .nth(1)
            .and_then(|b| b.split("};").next())
            .unwrap_or_else(|| panic!("struct {name}"));
        // Line comments out first (a field's comment may span lines before it).
        let body: String = body
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = Vec::new();
        for decl in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut names = decl.split(',').map(str::trim);
            let first = names.next().expect("declaration");
            let (ty, n0) = first.rsplit_once(' ').expect("type and name");
            out.push((ty.to_string(), n0.to_string()));
            out.extend(names.map(|n| (ty.to_string(), n.to_string())));
        }
        out
    }

    /// The parameter block the host writes has the fields of `ep_params`, in order, all 8 bytes.
    #[test]
    fn params_block_matches_ep_params() {
        let fields = struct_fields(EP_KERNELS, "ep_params");
        let cfg = EpConfig {
            num_experts: 12,
            max_tokens: 40,
            hidden: 72,
            max_topk: 8,
            mode: EpMode::Capturable { capacity: 30 },
            layout: RecvLayout::ExpertMajor,
        };
        let (n, base) = (3, 1u64 << 40);
        let p = plan(&cfg, n, 2).unwrap();
        let dt = crate::backend::cuda::api::DeviceTeam {
            slot: 0,
            my_index: 2,
            size: 3,
            start: 1,
            stride: 2,
        };
        let words = param_words(base, &p, &cfg, n, &dt, 132, true);
        let names: Vec<&str> = words.iter().map(|w| w.0).collect();
        let want: Vec<&str> = fields.iter().map(|f| f.1.as_str()).collect();
        assert_eq!(names, want);
        for (ty, name) in &fields {
            assert!(
                ty == "unsigned long long" || ty == "long long",
                "{name}: {ty} is not 8 bytes"
            );
        }
        let get = |k: &str| words.iter().find(|w| w.0 == k).unwrap().1;
        assert_eq!(get("recv_x"), base + p.recv_x as u64);
        assert_eq!(get("tok_rows"), base + p.tok_rows as u64);
        assert_eq!(
            (get("n"), get("me"), get("start"), get("stride")),
            (3, 2, 1, 2)
        );
        assert_eq!((get("cap"), get("el"), get("experts")), (30, 4, 12));
        assert_eq!(
            (get("rmax"), get("grid"), get("sentinel")),
            (3 * 30 * 8, 132, 1)
        );
        // The block fits its area.
        assert!(p.params + PARAM_WORDS * 8 <= p.total);
        assert_eq!(get("acc"), base + p.acc as u64);
        let acc_words = 12 + 3 + 2 + MAX_GRID as usize * 3;
        assert!(
            p.acc + acc_words * 4 <= p.params,
            "the accumulators fit their area"
        );
    }

    /// The block-size knobs take multiples of 32 from 64 to 512 only, and name themselves
    /// when refused; unset, the default holds.
    #[test]
    fn block_threads_knobs() {
        let k = "RSHMEM_EP_SEND_THREADS";
        assert_eq!(block_threads(k, None, 256).unwrap(), 256);
        assert_eq!(block_threads(k, Some(""), 512).unwrap(), 512);
        assert_eq!(block_threads(k, Some("384"), 256).unwrap(), 384);
        assert_eq!(block_threads(k, Some("64"), 512).unwrap(), 64);
        for bad in ["0", "32", "100", "544", "1024", "x", "-256"] {
            let e = block_threads("RSHMEM_EP_PSTREAM_THREADS", Some(bad), 256)
                .unwrap_err()
                .to_string();
            assert!(e.contains("RSHMEM_EP_PSTREAM_THREADS"), "{bad}: {e}");
        }
    }

    /// Normal mode's readback covers the control words, every source's receive count and
    /// every expert offset, in 8-byte words (what `ep_readback` copies), and the parse reads
    /// each field where the plan put it.
    #[test]
    fn readback_covers_the_counts_and_offsets() {
        for (n, e) in [(2usize, 256usize), (3, 9), (4, 4)] {
            let cfg = EpConfig {
                num_experts: e,
                max_tokens: 100,
                hidden: 64,
                max_topk: 4,
                mode: EpMode::Normal,
                layout: RecvLayout::ExpertMajor,
            };
            let p = plan(&cfg, n, 2).unwrap();
            let el = e / n;
            let len = readback_len(&p, el);
            assert_eq!(len % 8, 0);
            assert!(len >= p.expert_off + (el + 1) * 4 - p.ctl);
            assert!(len < p.expert_off + (el + 1) * 4 - p.ctl + 8);
            let mut b = vec![0u8; len];
            for i in 0..16 {
                b[8 * i..8 * i + 8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
            }
            for s in 0..n {
                let at = p.recv_cnt - p.ctl + 4 * s;
                b[at..at + 4].copy_from_slice(&(7 + s as u32).to_le_bytes());
            }
            for x in 0..=el {
                let at = p.expert_off - p.ctl + 4 * x;
                b[at..at + 4].copy_from_slice(&(3 * x as u32).to_le_bytes());
            }
            let r = parse_ctl(&b, &p, n, el);
            assert_eq!(r.ctl, (0..16).map(|i| 1000 + i).collect::<Vec<u64>>());
            assert_eq!(r.recv, (0..n).map(|s| 7 + s).collect::<Vec<_>>());
            assert_eq!(r.off, (0..=el).map(|x| 3 * x).collect::<Vec<_>>());
        }
    }

    /// A token-major buffer has no expert-major area and no progress words: issue 7's size (T =
    /// 4096, H = 7168 bf16, k = 8, 2 PEs) takes 940 MB (and 16 KiB) less per PE; every other
    /// area is where it was.
    #[test]
    fn token_major_plan_drops_the_expert_major_area() {
        let em = EpConfig {
            num_experts: 256,
            max_tokens: 4096,
            hidden: 7168,
            max_topk: 8,
            mode: EpMode::Normal,
            layout: RecvLayout::ExpertMajor,
        };
        let tm = EpConfig {
            layout: RecvLayout::TokenMajor,
            ..em
        };
        let (a, b) = (plan(&em, 2, 2).unwrap(), plan(&tm, 2, 2).unwrap());
        let expanded = 2 * 4096 * 8 * 7168 * 2;
        let progress = 2 * MAX_GRID as usize * 8;
        assert_eq!(a.total - b.total, expanded + progress);
        assert_eq!(
            a.params - a.prog,
            progress,
            "the progress words before the parameters"
        );
        assert_eq!(b.params, b.prog, "no progress words");
        assert_eq!(
            (a.recv_x, a.recv_meta, a.comb),
            (b.recv_x, b.recv_meta, b.comb)
        );
        assert_eq!(a.expert_x, b.expert_x);
        assert_eq!(b.rec, b.expert_x, "no bytes between expert_x and rec");
        assert_eq!(
            a.rmax, b.rmax,
            "the index still holds every expert-major row"
        );
    }

    /// The control read-back of normal mode finds each area at its plan offset.
    #[test]
    fn control_read_back_parses_every_area() {
        let cfg = EpConfig::new(12, 40, 72, 8);
        let (n, el) = (3, 4);
        let p = plan(&cfg, n, 2).unwrap();
        let mut b = vec![0xAAu8; p.expert_off + (el + 1) * 4 - p.ctl];
        for i in 0..16 {
            b[8 * i..8 * i + 8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        }
        let rc = p.recv_cnt - p.ctl;
        for s in 0..n {
            b[rc + 4 * s..rc + 4 * s + 4].copy_from_slice(&(7 * s as u32 + 1).to_le_bytes());
        }
        let eo = p.expert_off - p.ctl;
        for e in 0..=el {
            b[eo + 4 * e..eo + 4 * e + 4].copy_from_slice(&(100 * e as u32).to_le_bytes());
        }
        let r = parse_ctl(&b, &p, n, el);
        assert_eq!(r.ctl, (1000..1016).collect::<Vec<u64>>());
        assert_eq!(r.recv, vec![1, 8, 15]);
        assert_eq!(r.off, vec![0, 100, 200, 300, 400]);
        // The areas are laid out control, receive counts, offsets (one copy reads all three).
        assert!(p.ctl < p.recv_cnt && p.recv_cnt < p.expert_off);
    }

    /// Sizes the kernels' 32-bit indices cannot address are refused before anything is
    /// allocated.
    #[test]
    fn plan_refuses_what_32_bit_indices_cannot_address() {
        let c = |max_tokens: usize, k: usize, mode| EpConfig {
            num_experts: 2,
            max_tokens,
            hidden: 1,
            max_topk: k,
            mode,
            layout: RecvLayout::ExpertMajor,
        };
        assert!(plan(&c(1 << 20, 8, EpMode::Normal), 2, 2).is_ok());
        // int tokens: 2^31 - 1 tokens pass the CPU validation but not the GPU plan.
        let big = i32::MAX as usize;
        assert!(plan(&c(big, 1, EpMode::Capturable { capacity: 1 }), 1, 2).is_err());
        // int expert-major rows: n * cap * k > 2^31 - 1 with (n*cap*k) * k < 2^32.
        assert!(plan(&c(1 << 30, 1, EpMode::Normal), 2, 2).is_err());
        // u32 row_src: rows * k >= 2^32.
        assert!(plan(&c(1 << 26, 8, EpMode::Normal), 2, 2).is_err());
        assert!(plan(&c(1 << 24, 8, EpMode::Normal), 2, 2).is_ok());
    }

    /// Constants shared with `ep.cu`.
    #[test]
    fn constants_match_the_kernels() {
        let src = EP_KERNELS;
        for (name, v) in [
            ("EP_CTL_GO", CTL_GO),
            ("EP_CTL_ERR", CTL_ERR),
            ("EP_CTL_INFO", CTL_INFO),
            ("EP_CTL_ROWS", CTL_ROWS),
            ("EP_REC_FIXED", REC_FIXED),
            ("EP_SIG_GROUPS", SIG_GROUPS),
            ("EP_MAX_PES", MAX_GPU_EP_PES),
            ("EP_INDEX_EXPERTS", INDEX_EXPERTS),
            ("EP_SPLIT_BLOCK", SPLIT_BLOCK as usize),
        ] {
            assert!(src.contains(&format!("#define {name} {v}\n")), "{name}");
        }

        for (name, v) in [
            ("EP_ERR_MINE", ERR_MINE),
            ("EP_ERR_PEER", ERR_PEER),
            ("EP_ERR_CAPACITY", ERR_CAPACITY),
            ("EP_ERR_CORRUPT", ERR_CORRUPT),
            ("EP_ERR_ABORT", ERR_ABORT),
        ] {
            assert!(src.contains(&format!("#define {name} {v}ull\n")), "{name}");
        }
        // ep_layout: dynamic shared memory of MAX_GPU_EXPERTS words beside about 2 KiB of static
        // shared memory stays within the 48 KiB a launch gets without opting in.
        const _: () = assert!(MAX_GPU_EXPERTS * 4 + (8 << 10) <= 48 << 10);
        // The token-major index: 2 * INDEX_EXPERTS words likewise.
        const _: () = assert!(INDEX_EXPERTS * 8 + (8 << 10) <= 48 << 10);
    }

    /// Byte ranges `{ ... }` (or the single statement) of the body that starts after `at`.
    fn body_after(src: &str, at: usize) -> &str {
        let b = src.as_bytes();
        let mut i = at;
        while b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b[i] != b'{' {
            let end = src[i..].find(';').expect("statement") + i;
            return &src[i..=end];
        }
        let mut depth = 0;
        for (j, &c) in b.iter().enumerate().skip(i) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return &src[i..=j];
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced braces")
    }

    /// The end of the parenthesised list that opens at `open` (index of `(`).
    fn close_paren(src: &str, open: usize) -> usize {
        let mut depth = 0;
        for (j, c) in src.bytes().enumerate().skip(open) {
            match c {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return j;
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced parentheses")
    }

    /// No warp or block collective (`__shfl*_sync`, `__ballot_sync`, `__syncwarp`,
    /// `__syncthreads`, or a function of the file that uses one) runs inside a loop that starts
    /// at the lane or thread index: such a loop runs a different number of times on different
    /// lanes, and a collective with a full mask on some lanes only is undefined (a hang or wrong
    /// values). A lint over the source (loops whose first clause names `lane`, `tid` or
    /// `threadIdx.x` other than as `>> 5`).
    #[test]
    fn no_collective_under_lane_dependent_loops() {
        let src = EP_KERNELS;
        let mut collective: Vec<String> =
            ["__shfl", "__ballot_sync", "__syncwarp", "__syncthreads"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        // Device functions of the file that use a collective, to a fixpoint.
        let defs: Vec<(String, &str)> = src
            .match_indices("__device__ ")
            .filter_map(|(at, _)| {
                let open = at + src[at..].find('(')?;
                let name = src[..open].split_whitespace().last()?.to_string();
                let close = close_paren(src, open);
                let rest = src[close + 1..].trim_start();
                rest.starts_with('{')
                    .then(|| (name, body_after(src, close + 1)))
            })
            .collect();
        loop {
            let before = collective.len();
            for (name, body) in &defs {
                if !collective.contains(name)
                    && collective.iter().any(|c| body.contains(c.as_str()))
                {
                    collective.push(name.clone());
                }
            }
            if collective.len() == before {
                break;
            }
        }
        assert!(collective.iter().any(|c| c == "ep_sum_slots"));
        let lane_level = |init: &str| {
            let init = init.replace("threadIdx.x >> 5", "").replace("tid >> 5", "");
            init.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .any(|w| w == "lane" || w == "tid" || w == "threadIdx.x")
        };
        let mut checked = 0;
        for (at, _) in src.match_indices("for (") {
            let open = at + 4;
            let close = close_paren(src, open);
            let init = src[open + 1..close].split(';').next().unwrap_or("");
            if !lane_level(init) {
                continue;
            }
            checked += 1;
            let body = body_after(src, close + 1);
            for c in &collective {
                let called = body.match_indices(c.as_str()).any(|(i, _)| {
                    let after = &body[i + c.len()..];
                    c.starts_with("__") || after.starts_with('(') || after.starts_with('<')
                });
                assert!(
                    !called,
                    "a loop starting at the lane (`for ({init};...`) uses {c}: {body}"
                );
            }
        }
        assert!(checked > 10, "the lint found only {checked} lane loops");
    }
}
