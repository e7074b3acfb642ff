//! One spelling for every collective release: `pe.free(x)` for a symmetric object and for the
//! values that own symmetric objects (host collectives' scratch, MoE buffers).

use super::Pe;
use crate::elem::Elem;
use crate::error::Result;
use crate::sym::Sym;

/// What [`Pe::free`] releases: a [`Sym`], a host [`Coll`](crate::coll::Coll), an
/// [`ep::HostBuffer`](crate::ep::HostBuffer) or a `cuda::ep::GpuBuffer`. Sealed: the library
/// implements it for its own types.
pub trait Free: sealed::Sealed {
    /// Releases `self` with `pe` (collective over the world).
    #[doc(hidden)]
    fn free_with(self, pe: &Pe) -> Result<()>;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

impl<T: Elem> sealed::Sealed for Sym<T> {}
impl<T: Elem> Free for Sym<T> {
    fn free_with(self, pe: &Pe) -> Result<()> {
        pe.free_sym(self)
    }
}

impl Pe {
    /// Collectively frees `x`: a symmetric object, or a value owning symmetric objects (every
    /// PE frees the same one, checked; a mismatch is [`Error::CollectiveMismatch`] on every
    /// PE).
    ///
    /// [`Error::CollectiveMismatch`]: crate::Error::CollectiveMismatch
    pub fn free(&self, x: impl Free) -> Result<()> {
        x.free_with(self)
    }
}
