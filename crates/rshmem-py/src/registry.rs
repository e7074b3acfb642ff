//! The symmetric allocations of one PE, found by address: arrays and tensors reach the native
//! calls as (address, bytes), and an address is accepted only inside a live allocation.
//!
//! Freeing is collective and safe against views that outlive it: `free` marks an allocation
//! released on every PE (after checking that every PE frees the same one); its heap block goes
//! back to the allocator only at a later collective point where no PE holds a view of it any
//! more (the PEs agree on that, so the heap stays symmetric). A view used after free is
//! refused by address; its memory is never handed to another allocation while it exists.

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rshmem::{Error, Sym};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// One symmetric allocation of this PE.
#[derive(Debug)]
pub(crate) struct Block {
    /// The handle; taken out when the heap block is returned (readers hold the lock while
    /// they use it, so that never happens under them).
    pub(crate) sym: RwLock<Option<Sym<u8>>>,
    /// This PE's address of the allocation (host or device, as the backend maps it).
    pub(crate) addr: u64,
    pub(crate) nbytes: usize,
    /// Allocation number, the same on every PE for the same allocation.
    pub(crate) seq: u64,
    pub(crate) released: AtomicBool,
    /// Live array or tensor views ([`Export`]s) of this allocation, of any PE's copy.
    pub(crate) exports: AtomicUsize,
}

/// Where an address range lies: its allocation and the byte offset in it.
pub(crate) struct Located {
    pub(crate) block: Arc<Block>,
    pub(crate) offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Live and released-but-kept allocations by address.
    blocks: BTreeMap<u64, Arc<Block>>,
    /// Released allocations waiting for their views to end, in release order (the same on
    /// every PE).
    pub(crate) zombies: Vec<Arc<Block>>,
    pub(crate) next_seq: u64,
}

/// Most released allocations considered per collective point (one word of flags).
pub(crate) const ZOMBIE_WINDOW: usize = 64;

impl Registry {
    pub(crate) fn insert(&mut self, b: Arc<Block>) {
        self.blocks.insert(b.addr, b);
    }

    pub(crate) fn remove(&mut self, addr: u64) {
        self.blocks.remove(&addr);
    }

    /// The allocation holding `[addr, addr + nbytes)`; an address outside every allocation, or
    /// inside a released one, is an error.
    pub(crate) fn locate(&self, addr: u64, nbytes: usize, what: &str) -> rshmem::Result<Located> {
        let found = self.blocks.range(..=addr).next_back().map(|(_, b)| b);
        let b = match found {
            Some(b) if addr - b.addr <= b.nbytes as u64 => b,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{what} is not on the symmetric heap (allocate it with rshmem.empty or rshmem.zeros)"
                )))
            }
        };
        if b.released.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{what} belongs to a symmetric tensor that was freed (used after rshmem.free)"
            )));
        }
        let offset = (addr - b.addr) as usize;
        if offset + nbytes > b.nbytes {
            return Err(Error::InvalidArgument(format!(
                "{what}: {nbytes} bytes at offset {offset} run past its symmetric allocation of {} bytes",
                b.nbytes
            )));
        }
        Ok(Located {
            block: b.clone(),
            offset,
        })
    }

    /// Whether any allocation has a live view here.
    pub(crate) fn has_views(&self) -> bool {
        self.blocks
            .values()
            .any(|b| b.exports.load(Ordering::Acquire) > 0)
    }

    /// Flags of the first [`ZOMBIE_WINDOW`] released allocations with no view left here.
    pub(crate) fn reclaimable_mask(&self) -> u64 {
        self.zombies
            .iter()
            .take(ZOMBIE_WINDOW)
            .enumerate()
            .filter(|(_, b)| b.exports.load(Ordering::Acquire) == 0)
            .fold(0, |m, (i, _)| m | 1 << i)
    }
}

/// A view of a symmetric allocation handed to numpy (`__array_interface__`) or torch
/// (`__cuda_array_interface__`); the array keeps it alive, and while it lives the allocation's
/// heap block is not reused.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct Export {
    block: Arc<Block>,
    /// Keeps the heaps mapped while the view lives, even past finalize.
    _world: Arc<crate::world::Live>,
    iface: Py<PyDict>,
    cuda: bool,
}

impl Export {
    /// A view of `shape` elements of `typestr` at `addr` (inside `block`, this PE's copy or a
    /// peer's as mapped here).
    pub(crate) fn new(
        py: Python<'_>,
        block: Arc<Block>,
        world: Arc<crate::world::Live>,
        addr: u64,
        shape: Vec<usize>,
        typestr: &str,
        cuda: bool,
    ) -> PyResult<Export> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, shape)?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", if cuda { 2 } else { 3 })?;
        block.exports.fetch_add(1, Ordering::AcqRel);
        Ok(Export {
            block,
            _world: world,
            iface: d.unbind(),
            cuda,
        })
    }
}

#[pymethods]
impl Export {
    /// numpy's array interface (host memory only).
    #[getter]
    fn __array_interface__(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        if self.cuda {
            return Err(PyAttributeError::new_err(
                "device memory: no __array_interface__",
            ));
        }
        Ok(self.iface.clone_ref(py))
    }
    /// The CUDA array interface (device memory only).
    #[getter]
    fn __cuda_array_interface__(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        if !self.cuda {
            return Err(PyAttributeError::new_err(
                "host memory: no __cuda_array_interface__",
            ));
        }
        Ok(self.iface.clone_ref(py))
    }
    /// Allocation number (the same on every PE).
    #[getter]
    fn seq(&self) -> u64 {
        self.block.seq
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.block.exports.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64, nbytes: usize, seq: u64) -> Arc<Block> {
        Arc::new(Block {
            sym: RwLock::new(None),
            addr,
            nbytes,
            seq,
            released: AtomicBool::new(false),
            exports: AtomicUsize::new(0),
        })
    }

    /// Addresses inside an allocation are found with their offset; anything outside, past the
    /// end or in a released allocation is refused.
    #[test]
    fn locate_by_address() {
        let mut r = Registry::default();
        r.insert(block(0x1000, 256, 0));
        r.insert(block(0x1100, 0, 1));
        r.insert(block(0x2000, 64, 2));
        let at = |a: u64, n: usize| r.locate(a, n, "t").map(|l| (l.block.seq, l.offset));
        assert_eq!(at(0x1000, 256).ok(), Some((0, 0)));
        assert_eq!(at(0x1010, 16).ok(), Some((0, 16)));
        assert_eq!(at(0x10ff, 1).ok(), Some((0, 255)));
        assert_eq!(at(0x1100, 0).ok(), Some((1, 0)));
        assert_eq!(at(0x2040, 0).ok(), Some((2, 64)));
        for (a, n) in [
            (0x0fff, 1),
            (0x10f0, 17),
            (0x1100, 1),
            (0x1200, 4),
            (0x2030, 17),
        ] {
            assert!(
                matches!(at(a, n), Err(Error::InvalidArgument(_))),
                "{a:#x}+{n}"
            );
        }
        r.blocks[&0x2000].released.store(true, Ordering::Release);
        let e = at(0x2000, 8)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("freed"), "{e}");
    }

    /// Released allocations are reclaimable only while nothing views them, flagged by their
    /// place in release order.
    #[test]
    fn reclaimable_mask_follows_views() {
        let mut r = Registry::default();
        let (a, b, c) = (
            block(0x1000, 8, 0),
            block(0x2000, 8, 1),
            block(0x3000, 8, 2),
        );
        b.exports.store(2, Ordering::Release);
        r.zombies = vec![a, b.clone(), c];
        assert_eq!(r.reclaimable_mask(), 0b101);
        b.exports.store(0, Ordering::Release);
        assert_eq!(r.reclaimable_mask(), 0b111);
        r.zombies = (0..70).map(|i| block(0x1000 * (i + 1), 8, i)).collect();
        assert_eq!(r.reclaimable_mask(), u64::MAX);
        assert!(!r.has_views());
    }
}
