//! MoE dispatch and combine on GPUs through the device API (the CUDA side of [`crate::ep`]).
//!
//! Same configuration ([`EpConfig`]), expert split (PE `p` of the team owns experts
//! `p*E/n .. (p+1)*E/n`) and validation rules as the CPU [`crate::ep::HostBuffer`]; the movement,
//! the layout and the bookkeeping run in kernels (`kernels/` beside this file, one program:
//! [`EP_KERNELS`], compiled by NVRTC with the device header when the buffer is created).
//!
//! # Inputs and outputs
//! All tensors are **symmetric objects** (or views of them) of the calling PE's heap, i.e. GPU
//! memory of this PE's device: that settles device placement (a `Sym` of another world is
//! rejected) and lets every size be checked before a kernel runs. Inputs may be longer than
//! needed (static buffers for graphs): the first `T*H` / `T*k` elements are used.
//! * `x [T, H]` (`f32`, `bf16` or `f16`), `topk_ids [T, k]` (`i32`/`i64`, `-1` = none),
//!   `topk_weights [T, k]` (`f32`).
//! * dispatch output: the buffer's expert-major area [`GpuBuffer::expert_x`] — for local expert 0,
//!   1, … every (received token, slot) it serves, `expert_offsets` on the device; rows of one
//!   expert are in an unspecified order (placed by atomics), the handle says which is which
//!   ([`GpuBuffer::host_handle`]).
//! * combine input: expert outputs `y` in the same row order (any symmetric object with at least
//!   `rows * H` elements; `expert_x` itself for identity experts); output `out [T, H]`.
//! * [`RecvLayout::TokenMajor`] buffers (`EpConfig::layout`) skip the expanded copy: the
//!   dispatch output is the receive area [`GpuBuffer::recv_x`] (each received token once, per
//!   source PE in its token order, DeepEP's normal-dispatch output) plus the expert-major index
//!   [`GpuBuffer::expert_src`] (expert-major row `r` is receive row `expert_src[r] / max_topk`),
//!   which expert kernels gather their input rows by ([`GpuBuffer::scale_experts`] does); combine
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
//!    device flag that [`GpuBuffer::check`] turns into [`Error::Capacity`] /
//!    [`Error::InvalidArgument`]. Rows thus leave about as soon as the layout is known rather
//!    than after a round trip of records (BENCHMARKS.md).
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
//!    all in; after a timeout [`GpuBuffer::check`] refills the area. The last block checks that
//!    every expert got all its rows (else an error from [`GpuBuffer::check`]: inconsistent
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
//!    (a system-scope release costs a sending SM about 2 us):
//!    the peers' rows of the combine area hold a **sentinel** (every 32-bit word all ones)
//!    until their sender overwrites them; senders never store an all-ones word (such a NaN
//!    loses its sign bit, staying a NaN); a 32-bit word is written at once, so a word that is
//!    not the sentinel is the sender's. The summer loads its vectors (volatile) until none is
//!    the sentinel (a device-wait timeout bounds it), sums, and stores the sentinel back; every
//!    other reader of peers' rows there (`ep_crecv`, `ep_ccopy`'s temporary rows) stores it
//!    back too, and the host fills the area again at creation and after any latched error
//!    (loom model `loom_ep_split_combine_sentinel` in `models/ep.rs`: split combines after push,
//!    pull and split combines; it fails without any one of those stores back).
//!    Where `out` overlaps `y` or the buffer on a PE, that PE's summers store its own partial
//!    rows instead and `ep_cwait`/`ep_crecv` sum after the kernel; its peers cannot tell.
//!    It combines faster than `ep_csend`, `ep_cwait` and `ep_crecv` (BENCHMARKS.md).
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
//!   error word is read again, and taken, only when it is set). That is faster than two
//!   synchronous copies after a synchronisation, and waiting for the number faster than
//!   synchronising (BENCHMARKS.md). While the stream is being
//!   captured into a CUDA graph it does not synchronise: the counts stay on the device (those
//!   methods return `None`), errors are latched for [`GpuBuffer::check`], and the step replays
//!   like a capturable one (its receive area is sized for the worst case, so it cannot
//!   overflow).
//! * Capturable: nothing waits for the host; every kernel reads the counts and the decision
//!   from device memory, so dispatch, an expert computation and combine can be captured once in
//!   a CUDA graph and replayed with new routing written into the same input buffers. A capacity
//!   overflow moves nothing and latches the error; call [`GpuBuffer::check`] after synchronising.
//!
//! # Reusing the areas without extra synchronisation
//! A PE writes a peer's records, receive area (rows, row records) and "records in" words only
//! after the peer's ready signal of the same call, which the peer sends when its stream
//! reaches that dispatch, after every kernel of its earlier steps that reads them (loom models
//! in `models/ep.rs`, two dispatches back to back included); an expert-major receive area's rows
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
//! rows it did receive; it stops at its next wait for that PE; loom model in `models/ep.rs`): the PE
//! that timed out gets [`Error::Timeout`] from [`GpuBuffer::check`], its peers get [`Error::Timeout`]
//! too (naming a team member's wait). The flag is sticky until [`GpuBuffer::check`] clears it; a PE
//! that gave up may still receive a peer's flag after its own check, so before reusing the buffer
//! after a timeout, let every PE synchronise its stream, meet (e.g. [`Pe::barrier_all`]) and call
//! [`GpuBuffer::check`] once more (`tests/cuda_ep.rs`, `gpu_ep_peer_timeout_stops_every_pe`).
//! [`GpuBuffer::check`] also puts the sentinel back over the areas whose rows announce themselves
//! (an expert-major receive area, a split combine's area) after any failed step: rows that
//! came in half or were never read would otherwise pass for the next step's.
//! One exception to "nothing combined": in the split combine the summers wait inside the kernel
//! that writes `out`, so a PE whose summers time out (a peer died or stalled mid-combine) has
//! written some of its tokens and left others wrong; `out` is undefined after that error, which
//! [`GpuBuffer::check`] reports as for any timeout (and the combine area is filled with the
//! sentinel again).
//!
//! # Across nodes
//! A team with members on other nodes (a CUDA world over the fabric, docs/fabric.md) takes the
//! same kernels, outputs, layouts and API, and **DeepEP's internode design**: a token bound for
//! another node crosses the network once, to its **forwarder** there (the member of that node
//! with the source's local index, modulo the node's size: [`NodeMap::peer`](crate::NodeMap::peer)),
//! which stores it over NVLink into the receive areas of its node's destinations at the rows
//! the source would have used itself (positions keyed by the original source: `recv_x`, the row
//! records and the handle keep their meaning), and in combine sums its node's partial rows of
//! the token and puts one row per (token, node) back. What goes to another node leaves through
//! this PE's proxy ring (`backend/cuda/remote.rs`: requests carried out in ticket order, each
//! complete at the target before the next), in a few requests per node and step, as each is a
//! round trip through both proxies (the schedule's host model: `fwd_model.rs`):
//! * `ep_layout` puts its count record to every PE of another node with the records signal, as
//!   on one node (from a staging row, after the ready signal).
//! * `ep_send`'s blocks move rows to this node's PEs only; the block that finishes last
//!   (`ep_pack_nodes`, `kernels/fwd.cu`) gives this PE's tokens bound for each other node their
//!   node positions (token order), writes their rows and records into a staging area per node
//!   (after the buffer's areas, [`GpuBuffer::bytes`]), puts them in one request each into the
//!   forwarder's node area at this PE's slot (the records after a header with their count), and
//!   sets the forwarder's word for this PE to the call number. Nothing is put from `x`.
//! * `ep_fwd` (a block per source this PE forwards for, between `ep_send` and `ep_dwait`) waits
//!   for that word (the rows arrive whole before it), gives each node row its position at each
//!   destination of this node (a scan in row order: the source's own positions, which its count
//!   records announced), stores records, "records in" words (expert-major buffers) and rows
//!   into their receive areas, and sets their data words for the source to what the source's
//!   grid would have added (call number × grid).
//! * `ep_csend` sums a source of another node's rows into this PE's idle half of the combine
//!   area (rows `(1 - parity, s, ·)`, which no other PE writes) and its last block sets a word
//!   at each forwarder of this node; `ep_cfwd` (after `ep_csend`) waits for every member's word,
//!   sums each node row's partials over the node's destinations (ascending, `f32`), rounds once
//!   and puts the rows back in one request per `C` rows, into the combine slots of this node's
//!   members at the source (which send it no rows of their own), then sets the source's combine
//!   word for this PE. `ep_cwait` waits for this node's PEs and for one forwarder per other
//!   node; `ep_crecv` sums by combine positions that `ep_pack_nodes` wrote (a node's row where
//!   that node's partial is). Against one node the sum of a token's rows of another node is
//!   rounded to `T` once more (at the forwarder): exact for exact sums, within bf16/f16
//!   tolerance otherwise.
//!
//! A forwarder's node area holds `min(max_tokens, lmax * C)` rows per source (`lmax`: the most
//! PEs of one node): a source's tokens for one node fit whenever each of its pairs fits `C`, so
//! capacity errors are those of one node. [`GpuBuffer::net_bytes`] counts the bytes this PE's
//! kernels put across nodes (one row and record per (token, destination node) in dispatch, one
//! row per (token, node) in combine, against one per (token, destination PE) before).
//!
//! **Every signal to a PE of another node is a set** (ready, records, a source's node rows,
//! combine, the abort word): each word has one writer (its source; a data word of a source of
//! another node has one too, the source's forwarder on this node), so setting the count the
//! adds would reach is as good as adding, and the target's proxy serves a set by a stream
//! memory write (`cuStreamWriteValue64`) after the data's copy, with no kernel. An add would be
//! a one-thread kernel in the target's context, which must become resident beside the EP
//! kernels that wait for it; nothing the kernels wait for then needs an SM of the target (a
//! lint in the unit tests holds the kernels to it). `ep_fwd` and `ep_cfwd` wait only for sets
//! across nodes and for words of PEs of their own node.
//!
//! A staged area is rewritten only after every PE's next ready signal, which each sends after
//! it waited for this PE's signals of the step, posted after the puts; a forwarder's node areas
//! are rewritten by their sources only after its next ready signal, sent after its combine.
//! The abort bit (a device atomic on one node) crosses as a word (`EP_CTL_XABORT`) set through
//! the proxy before a signal; the host reads it with the error word. Pull `combine_tokens` and
//! the split combine read or wait on peers' memory by loads: a buffer across nodes pushes
//! ([`GpuBuffer::tokens_combine_pulls`] is false) and never splits. [`LowLatencyBuffer`] stays
//! refused across nodes.
//!
//! # Errors that are not agreed on the device
//! A PE whose inputs fail the host checks still launches `ep_layout` (marked invalid, no pointer
//! read) and, in capturable mode, the rest of the step, so peers see the error too. Combine's
//! host checks (handle of this buffer's latest dispatch, sizes) return before any kernel runs
//! on that PE; its peers' combine then ends in [`Error::Timeout`] (device waits time out), never
//! in silently wrong sums.
//!
//! # Calls of different kinds
//! What holds when team members make different calls (the host buffer
//! [`crate::ep::HostBuffer`] does better: a [`Error::CollectiveMismatch`] on every PE):
//! * **GPU MoE calls carry no call kind, and no call passes another.** Each waits only for words
//!   in this buffer's own area that the same call writes on the peers: a dispatch for their
//!   ready words (set to the dispatch's number), records and row counts; a pushing combine for
//!   their combine counts; a pulling `combine_tokens` for their pull-ready words (set to the
//!   combine's number). No other call writes them (another buffer, a device barrier, a
//!   [`GpuColl`](crate::cuda::GpuColl) collective, a host call), so with calls in step until
//!   then, a dispatch against a combine (or any other call) ends in device wait timeouts on
//!   every PE that waits: [`Error::Timeout`] from [`GpuBuffer::check`] (or from a normal-mode
//!   dispatch), nothing combined, as under "Device wait timeouts" above. It is not a
//!   [`Error::CollectiveMismatch`], and the buffer is not usable afterwards: the PE in dispatch
//!   counted a dispatch, the PE in combine counted a combine (and, pushing, added its rows'
//!   signals to the peers' combine counts), so the buffer's counters differ between PEs and a
//!   later call may time out again or pass a wait too early. The re-synchronisation above
//!   assumes every PE made the same calls; after calls of different kinds, free the buffer
//!   (every PE, after [`GpuBuffer::check`]) and create a new one (`tests/cuda_ep`,
//!   `gpu_ep_dispatch_against_combine_times_out`).
//! * **Device barriers.** [`CudaPe::barrier_on_stream`](crate::cuda::CudaPe::barrier_on_stream)
//!   counts on a slot of its own that no collective, team barrier or MoE kernel uses: against
//!   any of them, both sides' device waits time out. [`GpuColl::barrier`](crate::cuda::GpuColl::barrier)
//!   and a kernel's `rshmem_team_sync_block` / `rshmem_barrier_all_block` count on the team
//!   slot's device counters, which the collectives' barrier kernels share, and carry no
//!   signature. Against a collective whose first barrier is a barrier kernel (the plan paths),
//!   the barrier's members pass without an error while the collective's members get
//!   [`Error::CollectiveMismatch`] from [`GpuColl::check_errors`](crate::cuda::GpuColl::check_errors)
//!   and move no data; the collective's remaining barriers then pair with whatever the others
//!   call next, so the team's device barrier counts are not in step afterwards. Against a call
//!   that carries its signature in LL headers instead (the LL and pull paths), both sides'
//!   device waits time out. Collectives of different kinds or arguments against each other are
//!   a [`Error::CollectiveMismatch`] on every member with the counters in step (see
//!   [`GpuColl`](crate::cuda::GpuColl)).
//!
//! # Status
//! Run on 2 GPUs (one PE per GPU, and 4 thread-PEs on the 2 GPUs), on 4 GPUs and on one GPU
//! shared by the PEs: as threads, as processes and mixed (`tests/cuda_ep.rs`, 30 tests). Across
//! nodes, forwarding once per node: `tests/cuda_fabric_ep.rs` (2 nodes of one PE, 2 nodes of
//! two, a node of one beside a node of two, a killed node of one and of two) on one GPU shared
//! by processes playing the nodes; not yet on GPUs of their own.
//! The `rshmem-bench` crate measures it beside a same-run NCCL all-to-all-v baseline (missing
//! where PEs share a GPU or NCCL is absent) and checks both paths' data; with
//! `RSHMEM_EP_BREAKDOWN=1` it prints per-kernel times through hooks kept for it alone
//! (`GpuBuffer::dispatch_marked`, `combine_marked`, `stamps`, `grid`: hidden from the docs).
//!
//! # GpuBuffer sizing (bytes per PE, [`GpuBuffer::bytes_for`])
//! `n*C*H*s` receive rows + `n*C*(1+2k)*4` row records + `2*n*C*H*s` combine rows +
//! `n*C*k*H*s` expert-major rows (none for [`RecvLayout::TokenMajor`]) + small bookkeeping
//! (`s` = element size). Across nodes ([`GpuBuffer::bytes`]) also, with `C'` = `min(max_tokens,
//! lmax*C)`: `(nodes + 2n)*C'*H*s` staging, node and summed rows, `(nodes + n)*C'*(1+2k)*4`
//! row records, `n*C'*lmax*4` positions and `max_tokens*(n+1)*4` combine positions.

mod check;
mod combine;
mod dispatch;
#[cfg(test)]
mod fwd_model;
mod ll;
mod params;
#[cfg(test)]
mod tests;
mod tuning;

use crate::backend::cuda::{gpu, knobs};
use crate::device::{CudaPe, Kernel};
use crate::elem::{Elem, ElemKind};
use crate::ep::{EpConfig, RecvLayout};
use crate::error::{Error, Result};
use crate::sym::{AsSym, Sym, SymView};
use crate::team::Team;
use crate::Pe;
use std::sync::atomic::{AtomicU64, Ordering};

pub use ll::{
    LlCombineSent, LlConfig, LlDispatch, LlDispatchOpts, LlDispatchSent, LowLatencyBuffer,
    LL_KERNELS, LL_MAX_LOCAL_EXPERTS, LL_MAX_TOPK,
};
use params::{node_table, param_words, plan, readback_len, stage_plan, Plan, Stage, PARAM_WORDS};
pub use tuning::{EpTuning, EP_WRONG_RESULT_SWITCHES};

/// The kernels' source (after the device header): the files of `kernels/` in this order, one
/// program (the pieces are cut from one file at top-level blank lines, so the text, and with it
/// the cubins and the kernel cache keys, is what that file was).
pub const EP_KERNELS: &str = concat!(
    // Types, `ep_params`, the constants mirrored here, signals, waits and scans.
    include_str!("kernels/common.cuh"),
    // Dispatch steps 1 and 3: ep_layout (counts, records) and ep_dwait (the common decision).
    include_str!("kernels/layout.cu"),
    // How rows move (16-byte vectors) and announce themselves (the sentinel).
    include_str!("kernels/rows.cuh"),
    // Across nodes: the node table, ep_send's packing per node, ep_fwd and ep_cfwd.
    include_str!("kernels/fwd.cu"),
    // Dispatch step 2: ep_send.
    include_str!("kernels/send.cu"),
    // One-block kernels: ep_cwait (combine's wait) and ep_readback (normal mode's counts).
    include_str!("kernels/waits.cu"),
    // The expert-major copy and the index: ep_pstream, ep_permute.
    include_str!("kernels/expand.cu"),
    // Combine's f32 sums (over slots, over PEs) and ep_csend.
    include_str!("kernels/combine.cu"),
    // The split combine: ep_csplit.
    include_str!("kernels/split.cu"),
    // The source side's sum (ep_sum_rows; rshmem-bench's baseline uses it too) and ep_crecv.
    include_str!("kernels/crecv.cu"),
    // The pull combine of combine_tokens: ep_cready, ep_cpull, ep_cdone, ep_ccopy.
    include_str!("kernels/pull.cu"),
    // The stand-in expert computation: ep_scale_experts.
    include_str!("kernels/experts.cu"),
);

/// Most blocks of the grid kernels. Their grid is one block per SM (512 threads, up to 128
/// registers each: one resident block per SM), the smallest SM count of the team's GPUs, agreed
/// when the buffer is created: every PE counts its peers' block signals, so all use one grid.
const MAX_GRID: u32 = 1024;
const BLOCK: u32 = 512;
/// Threads per block of `ep_send` for expert-major buffers and of `ep_pstream`: `ep_send` takes
/// at most 128 registers per thread and `ep_pstream` at most 96 (`EP_PSTREAM_REGS`), so one
/// block of each fits on an SM (`ep_pstream` moves rows while `ep_send` runs). The send needs
/// few threads (its rows announce themselves: no fences), the expansion many (BENCHMARKS.md).
const EM_SEND_BLOCK: u32 = 128;
const PSTREAM_BLOCK: u32 = 448;
/// Threads per block of `ep_csplit` (`EP_SPLIT_BLOCK`: one block per SM, no spills to speak of).
const SPLIT_BLOCK: u32 = 384;
/// Most experts (`ep_layout` counts pairs per expert in shared memory).
pub const MAX_GPU_EXPERTS: usize = 8192;
/// Most local experts whose per-block pair counts the token-major index keeps in shared memory
/// (`EP_INDEX_EXPERTS` of `kernels/expand.cu`; more: one global atomic per pair).
const INDEX_EXPERTS: usize = 4096;
/// Most PEs of a GPU EP team (`EP_MAX_PES` of `kernels/common.cuh`: destinations are bits of a 64-bit mask).
pub const MAX_GPU_EP_PES: usize = 64;

const CTL_GO: usize = 3;
const CTL_ERR: usize = 4;
const CTL_INFO: usize = 5;
const CTL_ROWS: usize = 6;
const CTL_XABORT: usize = 14;
const ERR_MINE: u64 = 1;
const ERR_PEER: u64 = 2;
const ERR_CAPACITY: u64 = 4;
const ERR_CORRUPT: u64 = 8;
const ERR_ABORT: u64 = 16;
const REC_FIXED: usize = 4;
/// Signal word groups of `n` words (`EP_SIG_GROUPS`).
const SIG_GROUPS: usize = 7;

/// How [`GpuBuffer::combine_tokens`] moves the rows back. Every PE of the team must use the same
/// ([`EpTuning::combine_tokens`]).
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
    /// it): the faster at prefill sizes.
    Pull,
}

/// [`TokensCombine::Auto`]'s threshold (BENCHMARKS.md).
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
/// `extra`: [`EpTuning::nvrtc_options`].
pub fn kernel_options(t: ElemKind, id: ElemKind, extra: &[String]) -> Result<Vec<String>> {
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
    o.extend(extra.iter().cloned());
    Ok(o)
}

/// What one dispatch returns on one PE: the handle [`GpuBuffer::combine`] needs.
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
    /// stays on the device — [`GpuBuffer::host_handle`] reads it after a synchronisation).
    pub fn rows(&self) -> Option<usize> {
        self.rows
    }
    /// Rows per local expert (normal mode).
    pub fn expert_counts(&self) -> Option<&[usize]> {
        self.expert_counts.as_deref()
    }
    /// Tokens received from each source PE (team index; normal mode): the valid rows of
    /// [`GpuBuffer::recv_x`] are `s*C .. s*C + recv_tokens_per_pe[s]` (DeepEP's receive counts).
    pub fn recv_tokens_per_pe(&self) -> Option<&[usize]> {
        self.recv_tokens.as_deref()
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
/// use rshmem::cuda::{ep::{GpuBuffer, EpTuning}, CudaPe};
/// use rshmem::ep::{EpConfig, RecvLayout};
/// let (t, h, k, e) = (4096, 7168, 8, 256);
/// let cfg = EpConfig::new(e, t, h, k).with_layout(RecvLayout::TokenMajor);
/// let tuning = EpTuning::from_env()?; // at the program's edge
/// let buf = GpuBuffer::<rshmem::bf16>::new(pe, pe.world_team(), cfg, &tuning)?; // collective (world)
/// let x = pe.alloc::<rshmem::bf16>(t * h)?; // inputs live in the symmetric heap
/// let ids = pe.alloc::<i32>(t * k)?;
/// let w = pe.alloc::<f32>(t * k)?;
/// let y = pe.alloc::<rshmem::bf16>(buf.max_rows() * h)?; // expert outputs, expert-major
/// let out = pe.alloc::<rshmem::bf16>(t * h)?;
/// let ones = pe.alloc::<f32>(e / pe.n_pes())?;
/// pe.local_fill(&ones, 1.0)?;
/// let g = CudaPe::new(pe)?;
/// let s = g.stream()?;
/// let d = buf.dispatch(pe, &s, &x, &ids.slice(..t * k)?, &w, k)?;
/// // d.recv_tokens_per_pe(): tokens from each source in buf.recv_x();
/// // buf.expert_src(): for each expert-major row, its receive row * k + slot.
/// buf.scale_experts(pe, &s, &buf.recv_x()?, &y, &ones)?;
/// buf.combine(pe, &s, &d, &y, &out)?;
/// s.synchronize()?;
/// buf.check(pe)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GpuBuffer<T: Elem> {
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
    /// The plan of the area for other nodes where the team spans nodes (after the plan's
    /// areas): staging, the node areas of a forwarder, the forwarding signals.
    stage: Option<Stage>,
    /// Across nodes: `ep_fwd` (after `ep_send`) and `ep_cfwd` (after `ep_csend`).
    fwd: Kernel,
    cfwd: Kernel,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// Whether two symmetric objects share a byte (both live in the one symmetric heap).
fn overlaps<T: Elem>(a: &(impl AsSym<T> + ?Sized), b: &(impl AsSym<T> + ?Sized)) -> bool {
    a.raw().overlaps(&b.raw(), std::mem::size_of::<T>())
}

fn words_u32(v: &[u32]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

impl<T: Elem> GpuBuffer<T> {
    /// Symmetric bytes per PE a buffer of `cfg` on a team of `n_pes` takes.
    pub fn bytes_for(cfg: &EpConfig, n_pes: usize) -> Result<usize> {
        Ok(plan(cfg, n_pes, std::mem::size_of::<T>())?.total)
    }

    /// Symmetric bytes per PE this buffer takes ([`bytes_for`](Self::bytes_for), plus, where the
    /// team spans nodes, the staging and node areas of DeepEP's internode design: "Across
    /// nodes").
    pub fn bytes(&self) -> usize {
        self.plan.total + self.stage.map_or(0, |st| st.total)
    }

    /// Whether the team spans nodes (its PEs there reached through the proxy).
    pub fn spans_nodes(&self) -> bool {
        self.stage.is_some()
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

    /// Whether `combine_tokens` pulls (the setting, `Auto` resolved by the pair size; never
    /// where the team spans nodes: the push path is taken whatever the setting).
    pub fn tokens_combine_pulls(&self) -> bool {
        // Pulling reads peers' y by loads, which PEs of other nodes do not offer.
        if self.spans_nodes() {
            return false;
        }
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
    /// every symmetric allocation is; every PE passes the same configuration and tuning:
    /// `EpTuning::from_env()` at a program's edge, or `EpTuning::default()`).
    pub fn new(pe: &Pe, team: &Team, cfg: EpConfig, tuning: &EpTuning) -> Result<GpuBuffer<T>> {
        let g = CudaPe::new(pe)?;
        // A team across nodes: its peers there are reached through the proxy (see "Across
        // nodes"), from a staging area after the plan's areas.
        let spans = g.any_remote(&team.members);
        let n = team.n_pes();
        let prepared = (|| {
            tuning.check()?;
            let tokens_combine = tuning.combine_tokens;
            let send_block = tuning.send_threads_for(cfg.layout);
            let pstream_block = tuning.pstream_threads;
            let grids = (tuning.send_blocks, tuning.pstream_blocks);
            let readback_sync = tuning.readback_sync;
            let split_knob = tuning.split_combine;
            let dt = g.device_team(team)?;
            let p = plan(&cfg, n, std::mem::size_of::<T>())?;
            let nodes = pe.node_map(team);
            // Forwarders reach the PEs of their node by loads and stores: the node map must say
            // which members the device reaches through the proxy.
            for (i, &m) in team.members.iter().enumerate() {
                if (nodes.node(i) != nodes.node(dt.my_index as usize)) != g.any_remote(&[m]) {
                    return Err(Error::invalid(format!(
                        "ep: PE {m} is on another node by the node map but not by the device"
                    )));
                }
            }
            let stage = match spans {
                true => Some(stage_plan(&cfg, &nodes, std::mem::size_of::<T>())?),
                false => None,
            };
            // Normal mode's readback: the control words, receive counts and expert offsets,
            // then the device error word (8-byte aligned).
            let readback = g.host_buf(readback_len(&p, cfg.num_experts / n) + 16)?;
            let readback_dev = readback.device_ptr()?;
            let o32 = kernel_options(T::KIND, ElemKind::I32, &tuning.nvrtc_options)?;
            let o64 = kernel_options(T::KIND, ElemKind::I64, &tuning.nvrtc_options)?;
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
                [k("ep_fwd", &o32)?, k("ep_cfwd", &o32)?],
            );
            Ok::<_, Error>((
                dt,
                (p, stage, nodes),
                ks,
                (tokens_combine, send_block, pstream_block, readback_sync),
                (readback, readback_dev),
                split_knob,
                grids,
            ))
        })();
        let (
            dt,
            (plan, stage, nodes),
            (
                [layout32, send32],
                [layout64, send64],
                [dwait, cwait, permute, pstream, csend, crecv, scale],
                [cready, cpull, cdone, ccopy, readback_k, csplit],
                [fwd, cfwd],
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
        let area = pe.alloc_aligned::<u8>(plan.total + stage.map_or(0, |st| st.total), 256)?;
        // The grid, agreed: every PE puts its SM count into slot (its team index) of each
        // member's record area, all meet, each takes the smallest (the records are rewritten by
        // every dispatch, which no PE starts before the barrier at the end of this function).
        let slots = area.view::<u64>(plan.rec, n)?;
        let sms = (g.sm_count() as u64).clamp(1, MAX_GRID as u64);
        // Bit 32: this PE may take the split combine (the knob on, its GPU its own; the other
        // conditions are alike on every PE).
        let may_split = (split_knob
            && !spans
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
        pe.team_barrier_as(team, crate::pe::CallKind::EpBufferNew)?;
        let agreed = pe.local_vec(&slots)?;
        let grid = agreed
            .iter()
            .map(|v| v & 0xffff_ffff)
            .min()
            .unwrap_or(1)
            .clamp(1, MAX_GRID as u64) as u32;
        let split = grid >= 2 && agreed.iter().all(|v| v >> 32 == 1);
        pe.local_fill(&slots, 0)?;
        let buf = GpuBuffer {
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
            stage,
            fwd,
            cfwd,
            _t: std::marker::PhantomData,
        };
        let base = g.ptr(&buf.area)?;
        let p = &buf.plan;
        let staged = buf.stage.as_ref().map(|st| (base + p.total as u64, st));
        let params: Vec<u64> = param_words(base, p, staged, &cfg, n, &dt, buf.grid, buf.split)
            .iter()
            .map(|w| w.1)
            .collect();
        pe.local_write(&buf.view::<u64>(p.params, PARAM_WORDS)?, 0, &params)?;
        if let Some(st) = &buf.stage {
            // The forwarding signals and the byte counter start at 0; the node table.
            pe.local_fill(&buf.view::<u64>(p.total + st.fsig, 2 * n)?, 0)?;
            pe.local_fill(&buf.view::<u64>(p.total + st.xcount, 2)?, 0)?;
            let t = node_table(&nodes);
            pe.local_write(&buf.view::<u32>(p.total + st.ntab, t.len())?, 0, &t)?;
        }
        pe.local_fill(&buf.view::<u64>(p.sig, SIG_GROUPS * n)?, 0)?;
        buf.fill_sentinel(pe)?;
        pe.local_fill(&buf.view::<u32>(p.acc, cfg.num_experts + n + 2)?, 0)?;
        pe.local_fill(&buf.view::<u64>(p.ctl, 48)?, 0)?;
        pe.local_fill(&buf.view::<u32>(p.expert_off, cfg.num_experts / n + 1)?, 0)?;
        pe.team_barrier_as(team, crate::pe::CallKind::EpBufferNew)?;
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

    // for rshmem-bench: its RSHMEM_EP_BREAKDOWN timeline.
    /// The clock stamps of the last dispatch and combine (control words 16..40, which
    /// `kernels/common.cuh` describes; all zero unless the kernels were built with
    /// `-DEP_STAMPS=1`). A benchmark hook, not part of the supported API.
    #[doc(hidden)]
    pub fn stamps(&self, pe: &Pe) -> Result<Vec<u64>> {
        pe.local_vec(&self.view::<u64>(self.plan.ctl + 16 * 8, 24)?)
    }

    // for tests/cuda_fabric_ep.rs: where a step that timed out stopped.
    /// The 16 control words (call numbers, gates, error words: `kernels/common.cuh`) and the
    /// `7 * n` signal words (records, data, combine and ready per source, then the pull
    /// combine's), as they are now. A diagnostic hook, not part of the supported API.
    #[doc(hidden)]
    pub fn control_words(&self, pe: &Pe) -> Result<(Vec<u64>, Vec<u64>)> {
        Ok((
            pe.local_vec(&self.view::<u64>(self.plan.ctl, 16)?)?,
            pe.local_vec(&self.view::<u64>(self.plan.sig, SIG_GROUPS * self.n)?)?,
        ))
    }

    // for tests/cuda_fabric_ep.rs: the bytes each step sends across nodes.
    /// Bytes this PE's kernels put to PEs of other nodes so far: (dispatch rows and their row
    /// records, combine rows), counted on the device where the puts are posted; `(0, 0)` where
    /// the team is on one node. Read after synchronising the stream. Count records and signals
    /// are not counted. A diagnostic hook, not part of the supported API.
    #[doc(hidden)]
    pub fn net_bytes(&self, pe: &Pe) -> Result<(u64, u64)> {
        match &self.stage {
            None => Ok((0, 0)),
            Some(st) => {
                let v = pe.local_vec(&self.view::<u64>(self.plan.total + st.xcount, 2)?)?;
                Ok((v[0], v[1]))
            }
        }
    }

    // for rshmem-bench: printed beside its per-kernel times.
    /// Blocks of the grid kernels, agreed by the team at creation. A benchmark hook.
    #[doc(hidden)]
    pub fn grid(&self) -> u32 {
        self.grid
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

    /// The row records of the receive area on the device, `[n * C, 1 + 2 * max_topk]` `u32`:
    /// for receive row `s*C + i` (valid for `i < recv_tokens_per_pe[s]`), the token's index
    /// on its source PE, its `max_topk` global expert ids (`i32` bits; `-1` for none and for
    /// the slots beyond the dispatch's `top_k`), then its `max_topk` weights (`f32` bits). What
    /// DeepEP-style callers read the received tokens' routing from; valid until the next
    /// dispatch.
    pub fn recv_records(&self) -> Result<SymView<'_, u32>> {
        self.view(self.plan.recv_meta, self.recv_rows() * self.plan.rmw)
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
}

impl<T: Elem> crate::pe::sealed::Sealed for GpuBuffer<T> {}
/// `pe.free(buf)` releases the symmetric area (collective over the world).
impl<T: Elem> crate::pe::Free for GpuBuffer<T> {
    fn free_with(self, pe: &Pe) -> Result<()> {
        pe.free(self.area)
    }
}
