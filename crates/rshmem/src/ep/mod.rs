//! Mixture-of-experts dispatch and combine (DeepEP-style) on symmetric memory.
//!
//! Each PE of a team holds `T` tokens: hidden states `x [T, H]`, top-k expert ids `[T, k]`
//! (`i32` or `i64`, `-1` = no expert) and top-k weights `[T, k]` (`f32`). The `E` experts are
//! split evenly over the team: PE `p` owns experts `p*E/n .. (p+1)*E/n` (its *local* experts).
//!
//! * [`Layout::compute`] (pure, shared by every backend): for each token the PEs it goes to (once
//!   per PE even when several of its experts live there), tokens per PE, (token, slot) pairs per
//!   expert.
//! * [`HostBuffer::dispatch`]: every token is written once to each destination PE with one-sided puts
//!   into the destination's symmetric receive buffer. The receiver gets its rows grouped by
//!   local expert (expert-major, one row per (token, slot) served here, counts and offsets per
//!   expert) and a [`Handle`] recording, for each received token, its source PE, source token
//!   index and top-k slots (local expert or -1, with weights). Receive order is deterministic:
//!   by source PE, then source token index (then slot inside an expert).
//!   With [`RecvLayout::TokenMajor`] (in [`EpConfig::layout`]) the receiver gets each token once
//!   instead (DeepEP's normal-dispatch output) and the expert-major index in the handle
//!   ([`Handle::row_token`]), so experts can gather their rows without an expanded copy.
//! * [`HostBuffer::combine`]: the expert outputs `[rows, H]` (expert-major order, either layout) go
//!   back to their source token and slot; the source sums them with the top-k weights in slot
//!   order, accumulating in `f32` and rounding once, giving `[T, H]` in the source order.
//! * [`HostBuffer::combine_tokens`] (DeepEP's combine): the caller reduces its local experts per
//!   received token; one row per received token goes back and the source sums over PEs.
//!
//! # Protocol (both modes, every call)
//! 1. *Validate locally* (shapes, dtype, expert ids, k, T, handle): nothing moves yet.
//! 2. *Agree*: every PE puts a small record into every PE's record area (the call's number, its
//!    status, its k/H/E, its per-destination counts and the destination's per-local-expert
//!    counts), then passes one barrier of the buffer's team carrying the call's kind
//!    (`ep dispatch` or `ep combine`, as every host collective's barrier carries its own), then
//!    reads every record. Every PE then holds the whole count matrix and every status, so every
//!    PE reaches the same decision: if any PE's input is invalid, or (capturable mode) a
//!    (source, destination) count exceeds the capacity, **every** PE returns an error and no
//!    payload moves. The buffer stays usable for the next call. A member inside another kind
//!    of call (`barrier_all`, `alloc`, a [`Coll`](crate::coll::Coll) call, the other MoE call)
//!    makes the barrier an [`Error::CollectiveMismatch`] on every member naming both calls; the
//!    call then did not happen (its number goes back, and this PE clears its records in the
//!    peers' areas), and the team and the buffer stay in step. A buffer whose team was
//!    destroyed refuses every call ([`Error::Team`]).
//! 3. *Move*: payload rows by puts straight from the caller's slices into the destination's
//!    receive buffer, then a `put_signal` per destination carrying the number of rows sent.
//! 4. *Complete*: `wait_until` on one signal per source (timeouts and lost peers end in errors);
//!    received row counts are checked against the agreed matrix, then the local reordering.
//!
//! The record area is double-buffered by call parity, so a PE that finished call `e` can put
//! call `e+1`'s records while a slow peer still reads call `e`'s. One barrier is enough: every
//! record of a call is in place before any member passes its barrier, and a PE writes the same
//! half again (call `e+2`) only after passing call `e+1`'s barrier, which every member reaches
//! only after reading call `e`'s records. The payload areas need no double buffering because no
//! PE passes call `e+1`'s barrier before every PE finished call `e`.
//!
//! # Across nodes
//! On a team spanning nodes with a node of several members, calls take DeepEP's internode
//! path ([`HostBuffer::is_hierarchical`]): a token whose destination PEs are on another node
//! crosses the network once, to the PE of its source's local index there
//! ([`NodeMap::peer`](crate::NodeMap::peer)), which forwards it over shared memory into the
//! destination PEs' receive rows with the records and signals the source would have put, so
//! dispatch returns exactly what the flat path does. Combine is the reverse: each PE folds its
//! rows of each such token in `f32`, the forwarding PE sums its node's partials and sends one
//! row per token back; the source adds each node's partial where that node's first slot (PE,
//! for `combine_tokens`) comes and rounds once. Only the grouping of the float additions
//! differs from the flat path. [`HostBuffer::set_hierarchical`] turns it off (a measurement
//! knob); the forwarding areas' size is in [`HostBuffer::bytes_for_nodes`].
//!
//! # Modes
//! * [`EpMode::Normal`]: rows from each source are packed at offsets computed from the agreed
//!   counts (prefix over sources), so the receive area is `n * max_tokens` rows, the worst case,
//!   and cannot overflow. On a GPU the host sizes outputs from the counts.
//! * [`EpMode::Capturable`]: rows from source `s` go to the fixed slots `s*C .. s*C + C` for a
//!   configured capacity `C` per (source, destination) pair: placement needs no counts from other
//!   PEs and all shapes are static (what a captured CUDA graph needs); a count above `C` is
//!   [`Error::Capacity`] on every PE — never a silent drop, never an
//!   out-of-bounds write.
//!
//! # Buffer sizing (bytes per PE, see [`HostBuffer::bytes`])
//! With `n` team PEs, `R` receive rows (`n*max_tokens` normal, `n*C` capturable),
//! `k = max_topk`, `El = E/n`:
//! * receive rows: `R * H * size_of::<T>()`
//! * receive row records: `R * (1 + 2k) * 4` (source token index, k expert ids, k weights)
//! * combine area: `max_tokens * k * H * size_of::<T>()` (one row per (token, slot))
//! * agreement records: `2 * n * (8 + 2n + El) * 8`, signals and row counts: `n * 8 + n * 8`
//!
//! all in one symmetric allocation, each area rounded up to 256 bytes. Example: `T = 4096`,
//! `H = 7168` bf16, `k = 8`, `E = 256`, 2 PEs, normal mode: 117 MB receive rows + 0.6 MB row
//! records + 470 MB combine area ≈ 588 MB per PE.
//!
//! # GPU backends
//! Shared with every backend: [`EpConfig`] validation, the byte plan of the areas, [`Layout`]
//! (a GPU computes the same arrays in a kernel), the record format and the decisions taken from
//! it (status, mismatches, capacity), the placement rule (`base(s, d)`: prefix of counts in
//! normal mode, `s * C` in capturable mode), the row-record format and the [`Handle`] arrays.
//! Backend-specific: only the movement — the record puts and how a PE knows they are in (the
//! host's team barrier; device `put_signal` / `wait_until` on a GPU, see [`crate::cuda::ep`]), the payload puts (one warp per (token, destination)
//! instead of one `put` per row), and the expert-major permutation and weighted reduction
//! (kernels over the handle arrays). In capturable mode on a GPU the capacity decision is taken
//! on the device from the same records; an overflow writes nothing and latches an error flag the
//! host reads at its next synchronisation, so a captured graph never needs the host mid-step.
//!
//! ```
//! use rshmem::ep::{HostBuffer, EpConfig, EpMode, RecvLayout};
//! let r = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<Vec<f32>> {
//!     let cfg = EpConfig { num_experts: 4, max_tokens: 2, hidden: 3, max_topk: 2, mode: EpMode::Normal,
//!                          layout: RecvLayout::ExpertMajor };
//!     let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg)?;
//!     let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];     // 2 tokens, H = 3
//!     let ids: [i32; 4] = [0, 3, 2, -1];          // token 0 -> experts 0 and 3, token 1 -> 2
//!     let w = [0.5, 0.25, 1.0, 0.0];
//!     let d = buf.dispatch(pe, &x, &ids, &w, 2)?;
//!     // identity experts: send back what came in
//!     let y = buf.combine(pe, &d.handle, &d.x)?;
//!     pe.free(buf)?;
//!     Ok(y)
//! }).values().unwrap();
//! for y in r {
//!     assert_eq!(y.unwrap(), vec![0.75, 1.5, 2.25, 4.0, 5.0, 6.0]);
//! }
//! ```

#[doc(hidden)]
pub mod cuda;
mod handle;
mod host;
mod layout;

pub(crate) use handle::Forward;
pub use handle::{Dispatched, Handle};
pub use host::HostBuffer;
pub(crate) use layout::pack_areas;
pub use layout::Layout;

use crate::elem::{Elem, ElemKind};
use crate::error::{Error, Result};

/// How the receive buffers are laid out (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpMode {
    /// Rows packed by counts agreed first; receive area sized for the worst case.
    Normal,
    /// Fixed slots of `capacity` rows per (source, destination) pair; static shapes.
    Capturable {
        /// Rows one source may send to one destination per call (`1..=max_tokens`).
        capacity: usize,
    },
}

/// The configuration of an expert-parallel [`HostBuffer`]; every PE of the team passes the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpConfig {
    /// Total number of experts `E` (a multiple of the team size).
    pub num_experts: usize,
    /// Most tokens `T` one PE passes to one dispatch.
    pub max_tokens: usize,
    /// Hidden size `H` (elements per token).
    pub hidden: usize,
    /// Largest top-k `k` a dispatch may use.
    pub max_topk: usize,
    /// Normal or capturable.
    pub mode: EpMode,
    /// What dispatch leaves on the receiving PE: expert-major rows (one per token and local
    /// slot) or the received tokens once each, with the expert-major index.
    pub layout: RecvLayout,
}

/// What [`HostBuffer::dispatch`] (and the GPU buffer's) leaves on the receiving PE.
///
/// Both layouts carry the same [`Handle`] (on a GPU the same device index arrays) and take the
/// same combine input: expert outputs in expert-major row order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecvLayout {
    /// One row per (received token, local top-k slot), grouped by local expert: a grouped
    /// GEMM's input as is. A token using `j` experts of a PE is copied `j` times there (with
    /// `k = 8` and 2 PEs, about 4 rows per received token).
    #[default]
    ExpertMajor,
    /// The received tokens, each once (as DeepEP's normal dispatch returns them), plus the
    /// expert-major index: expert-major row `r` is received token
    /// [`Handle::row_token`]`[r]` (on a GPU: receive row `expert_src[r] / max_topk`). For expert
    /// kernels that gather their input rows: no expanded copy is written (a fraction of the
    /// memory traffic and, on a GPU, no expert-major area in the buffer).
    TokenMajor,
}

/// Most top-k slots supported (the row records are sized from `max_topk`; this bounds them).
pub const MAX_TOPK: usize = 64;

impl EpConfig {
    /// A normal-mode, expert-major configuration (the defaults); [`with_mode`](Self::with_mode)
    /// and [`with_layout`](Self::with_layout) change those.
    ///
    /// ```
    /// use rshmem::ep::{EpConfig, EpMode, RecvLayout};
    /// let cfg = EpConfig::new(256, 4096, 7168, 8)
    ///     .with_mode(EpMode::Capturable { capacity: 2048 })
    ///     .with_layout(RecvLayout::TokenMajor);
    /// assert_eq!(cfg.num_experts, 256);
    /// assert_eq!(cfg.layout, RecvLayout::TokenMajor);
    /// assert!(cfg.validate(8).is_ok());
    /// ```
    pub fn new(num_experts: usize, max_tokens: usize, hidden: usize, max_topk: usize) -> EpConfig {
        EpConfig {
            num_experts,
            max_tokens,
            hidden,
            max_topk,
            mode: EpMode::Normal,
            layout: RecvLayout::ExpertMajor,
        }
    }

    /// The same configuration in mode `mode`.
    pub fn with_mode(self, mode: EpMode) -> EpConfig {
        EpConfig { mode, ..self }
    }

    /// The same configuration with receive layout `layout`.
    pub fn with_layout(self, layout: RecvLayout) -> EpConfig {
        EpConfig { layout, ..self }
    }

    /// Checks the configuration against a team of `n_pes`.
    pub fn validate(&self, n_pes: usize) -> Result<()> {
        if n_pes == 0 {
            return Err(Error::invalid("ep: the team has no PEs"));
        }
        if self.num_experts == 0 || !self.num_experts.is_multiple_of(n_pes) {
            return Err(Error::invalid(format!(
                "ep: {} experts cannot be split evenly over {n_pes} PEs",
                self.num_experts
            )));
        }
        if self.num_experts > i32::MAX as usize {
            return Err(Error::invalid("ep: too many experts"));
        }
        if self.hidden == 0 {
            return Err(Error::invalid("ep: hidden size must be positive"));
        }
        if self.max_tokens == 0 || self.max_tokens > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "ep: max_tokens {} is out of range 1..=2^32-1",
                self.max_tokens
            )));
        }
        if self.max_topk == 0 || self.max_topk > MAX_TOPK {
            return Err(Error::invalid(format!(
                "ep: max_topk {} is out of range 1..={MAX_TOPK}",
                self.max_topk
            )));
        }
        if let EpMode::Capturable { capacity } = self.mode {
            if capacity == 0 || capacity > self.max_tokens {
                return Err(Error::invalid(format!(
                    "ep: capacity {capacity} is out of range 1..=max_tokens ({})",
                    self.max_tokens
                )));
            }
        }
        Ok(())
    }
}

/// Element types accepted for hidden states: accumulation is in `f32`.
pub(crate) fn check_dtype<T: Elem>() -> Result<()> {
    match T::KIND {
        ElemKind::F32 | ElemKind::Bf16 | ElemKind::F16 => Ok(()),
        k => Err(Error::invalid(format!(
            "ep: hidden states must be f32, bf16 or f16, not {}",
            k.name()
        ))),
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// Types of top-k expert ids: `i32` and `i64` (`-1` = no expert).
pub trait TopkId: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The id as `i64`.
    fn to_i64(self) -> i64;
}
impl TopkId for i32 {
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl TopkId for i64 {
    fn to_i64(self) -> i64 {
        self
    }
}
