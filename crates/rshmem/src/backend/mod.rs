//! Backends: where the symmetric heap lives and how bytes and atomics reach a peer's copy.
//!
//! The backend is chosen when the world is created; everything above this trait (PE handles,
//! teams, collectives, MoE dispatch) is backend-independent. Offsets handed to a backend are
//! already checked against the heap and the object by the caller.

pub mod cuda;
pub(crate) mod shm;

use crate::config::BackendKind;
use crate::error::Result;
use std::sync::Arc;

/// An atomic read-modify-write on a 32- or 64-bit heap word; operands are zero-extended bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    Fetch,
    Set(u64),
    Swap(u64),
    CompareSwap { cond: u64, value: u64 },
    FetchAdd(u64),
    FetchAnd(u64),
    FetchOr(u64),
    FetchXor(u64),
}

impl AtomicOp {
    /// The op as (code, first operand, second operand): the encoding that the CUDA backend's
    /// `rshmemi_host_amo` kernel and the fabric's staged requests share.
    pub(crate) fn encode(self) -> (u64, u64, u64) {
        match self {
            AtomicOp::Fetch => (0, 0, 0),
            AtomicOp::Set(v) => (1, v, 0),
            AtomicOp::Swap(v) => (2, v, 0),
            AtomicOp::CompareSwap { cond, value } => (3, cond, value),
            AtomicOp::FetchAdd(v) => (4, v, 0),
            AtomicOp::FetchAnd(v) => (5, v, 0),
            AtomicOp::FetchOr(v) => (6, v, 0),
            AtomicOp::FetchXor(v) => (7, v, 0),
        }
    }

    /// The op that [`encode`](Self::encode) gave `(code, a, b)`; `None` for an unknown code.
    pub(crate) fn decode(code: u64, a: u64, b: u64) -> Option<AtomicOp> {
        Some(match code {
            0 => AtomicOp::Fetch,
            1 => AtomicOp::Set(a),
            2 => AtomicOp::Swap(a),
            3 => AtomicOp::CompareSwap { cond: a, value: b },
            4 => AtomicOp::FetchAdd(a),
            5 => AtomicOp::FetchAnd(a),
            6 => AtomicOp::FetchOr(a),
            7 => AtomicOp::FetchXor(a),
            _ => return None,
        })
    }
}

/// An operation a backend started and that may not have completed: a non-blocking put or get
/// to a PE of another node, posted on the fabric.
pub(crate) trait InFlight: Send + Sync + std::fmt::Debug {
    /// Its outcome once it ended, `None` while it runs; never blocks. `drive`: read the
    /// transport's completions first (one caller polling many operations drives once).
    fn poll(&self, drive: bool) -> Option<Result<()>>;
    /// Waits for it to end (bounded by the world's deadline, counted from its last progress,
    /// and ending early when its peer is lost); its outcome.
    fn wait(&self) -> Result<()>;
    /// A get that ended well: copies its bytes into `dst` (the length it was started with),
    /// once; nothing for a put, a failed get, or one still running.
    fn land(&self, dst: &mut [u8]);
    /// [`wait`](Self::wait), then [`land`](Self::land) into `dst` when it ended well; a
    /// transport may land a get's bytes as they arrive instead.
    fn wait_into(&self, dst: &mut [u8]) -> Result<()> {
        let r = self.wait();
        if r.is_ok() {
            self.land(dst);
        }
        r
    }
}

/// Memory of the symmetric heap and the engines that move data between PEs.
pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Copies `src` to `offset` of PE `pe`'s heap.
    fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()>;
    /// Copies from `offset` of PE `pe`'s heap into `dst`.
    fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Atomic on the 8-byte (`wide`) or 4-byte word at `offset` of PE `pe`; returns the old value.
    fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64>;
    /// Starts a put of `src` to `offset` of PE `pe`'s heap: `None` when it completed before
    /// returning (every backend but the fabric's, and the fabric's to PEs of this node), else
    /// the operation in flight (`src` already copied: reusable at once).
    fn put_nbi(&self, pe: usize, offset: usize, src: &[u8]) -> Result<Option<Arc<dyn InFlight>>> {
        self.put(pe, offset, src).map(|()| None)
    }
    /// Starts a get of `dst.len()` bytes from `offset` of PE `pe`'s heap: `None` when the bytes
    /// are in `dst` on return, else the operation in flight, which writes nothing into `dst`
    /// until [`InFlight::land`].
    fn get_nbi(
        &self,
        pe: usize,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<Option<Arc<dyn InFlight>>> {
        self.get(pe, offset, dst).map(|()| None)
    }
    /// Orders this PE's earlier puts and atomics before later ones to each PE.
    fn fence(&self);
    /// Completes every outstanding operation of this PE.
    fn quiet(&self) -> Result<()>;
    /// Base of PE `pe`'s heap in this process's address space, where this process's loads and
    /// stores reach it (the CPU backend maps every PE's heap); `None` otherwise.
    fn host_base(&self, _pe: usize) -> Option<*mut u8> {
        None
    }
    /// The CUDA backend, when this is it (for the CUDA-specific public API).
    fn as_cuda(&self) -> Option<&cuda::CudaBackend> {
        None
    }
    /// Whether GPU heaps of PEs on other nodes are reached by RMA on their registration with
    /// the fabric (`FI_HMEM`) rather than through the proxies' staging.
    fn gpu_heaps_on_fabric(&self) -> bool {
        false
    }
}
