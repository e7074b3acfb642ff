//! Addresses of symmetric objects for code that reads and writes them by loads and stores
//! (array libraries viewing the heap without a copy, such as the Python package).

use super::Pe;
use crate::elem::Elem;
use crate::error::{Error, Result};
use crate::sym::AsSym;

impl Pe {
    /// Address in this process of element `at` of PE `pe`'s copy of `sym`, on the CPU backend
    /// (where every PE's heap is mapped into every process of the node).
    ///
    /// The pointer stays valid while the world lives; what it points at belongs to the object
    /// until [`free`](Self::free). Accesses through it are plain loads and stores: ordering with
    /// other PEs' operations is the caller's (barriers, [`quiet`](Self::quiet), signals), as for
    /// any shared memory. Errors: a handle of another world or PE, `pe` or `at` out of range,
    /// or a backend whose heap this process cannot address (CUDA: use
    /// `rshmem::cuda::CudaPe::peer_ptr`), an [`Error::Backend`].
    ///
    /// ```
    /// let out = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<u32> {
    ///     let x = pe.alloc::<u32>(4)?;
    ///     pe.local_write(&x, 0, &[pe.my_pe() as u32 + 7; 4])?;
    ///     pe.barrier_all()?;
    ///     let other = pe.host_ptr(&x, 2, 1 - pe.my_pe())?;
    ///     // SAFETY: in range of the peer's live copy; nothing writes it concurrently.
    ///     let v = unsafe { other.read_volatile() };
    ///     pe.barrier_all()?;
    ///     Ok(v)
    /// }).values().unwrap();
    /// assert_eq!(out.into_iter().map(|v| v.unwrap()).collect::<Vec<_>>(), vec![8, 7]);
    /// ```
    pub fn host_ptr<T: Elem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
    ) -> Result<*mut T> {
        // One past the last element is a valid address (an empty range at the end).
        let off = self.locate(sym, at, 0, pe)?;
        let base = self
            .inner
            .backend
            .host_base(pe)
            .ok_or_else(|| Error::Backend {
                backend: self.inner.backend.kind().name(),
                msg: "this backend's heap is not addressable by host loads and stores".into(),
            })?;
        // SAFETY (of the add): `locate` checked that the offset lies in the object, which lies
        // in the heap that `base` maps.
        Ok(unsafe { base.add(off) } as *mut T)
    }
}
