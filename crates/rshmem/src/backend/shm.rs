//! CPU backend: every PE's heap is mapped into this process (direct pointer for peers of the
//! same process, a shared mapping for the others); puts are memcpy, atomics are CPU atomics.

use super::{AtomicOp, Backend};
use crate::config::BackendKind;
use crate::error::Result;
use crate::segment::Region;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct ShmBackend {
    /// Base of each PE's heap in this address space, by world index.
    bases: Vec<*mut u8>,
    /// Keeps the mappings alive as long as the backend.
    _regions: Vec<Arc<Region>>,
}

// SAFETY: the bases point into mappings owned by `_regions`; all data access is by explicit
// copies and atomics whose ordering is the SHMEM memory model's concern, not Rust aliasing.
unsafe impl Send for ShmBackend {}
// SAFETY: as for Send; no interior mutability besides the shared memory itself.
unsafe impl Sync for ShmBackend {}

impl ShmBackend {
    pub fn new(bases: Vec<*mut u8>, regions: Vec<Arc<Region>>) -> Self {
        ShmBackend {
            bases,
            _regions: regions,
        }
    }
    #[inline]
    fn at(&self, pe: usize, offset: usize) -> *mut u8 {
        // SAFETY (of the add): offset was checked by the caller to lie within the heap.
        unsafe { self.bases[pe].add(offset) }
    }
}

macro_rules! rmw {
    ($a:expr, $op:expr, $t:ty) => {{
        let a = $a;
        let o = Ordering::AcqRel;
        let r: $t = match $op {
            AtomicOp::Fetch => a.load(Ordering::Acquire),
            AtomicOp::Set(v) => {
                a.store(v as $t, Ordering::Release);
                0
            }
            AtomicOp::Swap(v) => a.swap(v as $t, o),
            AtomicOp::CompareSwap { cond, value } => {
                match a.compare_exchange(cond as $t, value as $t, o, Ordering::Acquire) {
                    Ok(x) | Err(x) => x,
                }
            }
            AtomicOp::FetchAdd(v) => a.fetch_add(v as $t, o),
            AtomicOp::FetchAnd(v) => a.fetch_and(v as $t, o),
            AtomicOp::FetchOr(v) => a.fetch_or(v as $t, o),
            AtomicOp::FetchXor(v) => a.fetch_xor(v as $t, o),
        };
        r as u64
    }};
}

impl Backend for ShmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Shm
    }
    #[inline]
    fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: destination range checked by the caller to lie in PE `pe`'s mapped heap; the
        // source is a live slice; the two cannot overlap (a user slice is never heap memory we
        // hand out by reference).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.at(pe, offset), src.len()) };
        Ok(())
    }
    #[inline]
    fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as in put, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(self.at(pe, offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    #[inline]
    fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        let p = self.at(pe, offset);
        Ok(if wide {
            // SAFETY: offset checked in range and 8-byte aligned by the caller; heap bases are
            // page aligned.
            let a = unsafe { &*(p as *const AtomicU64) };
            rmw!(a, op, u64)
        } else {
            // SAFETY: as above, 4-byte aligned.
            let a = unsafe { &*(p as *const AtomicU32) };
            rmw!(a, op, u32)
        })
    }
    fn fence(&self) {
        fence(Ordering::SeqCst);
    }
    fn host_base(&self, pe: usize) -> Option<*mut u8> {
        self.bases.get(pe).copied()
    }
    fn quiet(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        Ok(())
    }
}
