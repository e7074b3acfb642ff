//! Symmetric objects: typed handles to (offset, length) in the symmetric heap, equal on every PE.

use crate::elem::Elem;
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

/// The untyped identity of a symmetric range, as operations see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSym {
    /// Byte offset in the heap.
    pub offset: usize,
    /// Length in elements.
    pub len: usize,
    pub(crate) job: u64,
    pub(crate) owner: usize,
}

impl RawSym {
    /// Whether this range and `other` (elements of `elem_bytes` bytes) share a byte of the
    /// heap; an empty range shares none, even inside the other.
    pub(crate) fn overlaps(&self, other: &RawSym, elem_bytes: usize) -> bool {
        let (a0, a1) = (self.offset, self.offset + self.len * elem_bytes);
        let (b0, b1) = (other.offset, other.offset + other.len * elem_bytes);
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }
}

/// A symmetric array of `len` elements of `T`, allocated collectively by
/// [`Pe::alloc`](crate::Pe::alloc) and released by [`Pe::free`](crate::Pe::free).
///
/// The handle is not `Clone`: `free` consumes it, so a freed object cannot be used again through
/// it. It is `Send + Sync` (it holds no pointer). Using it with a PE of another world (or after
/// its world ended) returns [`Error::WorldEnded`].
#[derive(Debug)]
pub struct Sym<T: Elem> {
    pub(crate) raw: RawSym,
    _t: PhantomData<fn() -> T>,
}

/// A typed window into a symmetric object (borrowed from it), e.g. bytes viewed as `u64`.
#[derive(Debug, Clone, Copy)]
pub struct SymView<'a, T: Elem> {
    raw: RawSym,
    _t: PhantomData<&'a Sym<T>>,
}

/// Anything that names a symmetric range of `T`: a [`Sym`] or a [`SymView`].
pub trait AsSym<T: Elem> {
    /// The range's identity.
    fn raw(&self) -> RawSym;
}

impl<T: Elem> AsSym<T> for Sym<T> {
    fn raw(&self) -> RawSym {
        self.raw
    }
}
impl<T: Elem> AsSym<T> for SymView<'_, T> {
    fn raw(&self) -> RawSym {
        self.raw
    }
}

impl<T: Elem> Sym<T> {
    pub(crate) fn new(raw: RawSym) -> Self {
        Sym {
            raw,
            _t: PhantomData,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.raw.len
    }
    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }
    /// Byte offset in the symmetric heap (the same on every PE).
    pub fn offset(&self) -> usize {
        self.raw.offset
    }

    /// The elements `range` of this object, as a view that the one-sided and collective calls
    /// take wherever they take the object (`x.slice(16..32)?`: elements 16 to 31).
    ///
    /// A range past the end (or reversed) is [`Error::OutOfBounds`] (in elements).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<SymView<'_, T>> {
        Ok(SymView {
            raw: self.raw.slice(range, std::mem::size_of::<T>())?,
            _t: PhantomData,
        })
    }

    /// Views `len` elements of `U` starting `byte_offset` bytes into this object.
    ///
    /// A `byte_offset` that is not a multiple of `U`'s size is [`Error::Misaligned`]; a window
    /// that does not fit is [`Error::OutOfBounds`] (in bytes).
    pub fn view<U: Elem>(&self, byte_offset: usize, len: usize) -> Result<SymView<'_, U>> {
        let us = std::mem::size_of::<U>();
        let bytes = self.raw.len * std::mem::size_of::<T>();
        if !byte_offset.is_multiple_of(us) {
            return Err(Error::Misaligned {
                offset: byte_offset,
                align: us,
            });
        }
        let end = len.checked_mul(us).and_then(|b| b.checked_add(byte_offset));
        match end {
            Some(end) if end <= bytes => Ok(SymView {
                raw: RawSym {
                    offset: self.raw.offset + byte_offset,
                    len,
                    ..self.raw
                },
                _t: PhantomData,
            }),
            _ => Err(Error::OutOfBounds {
                start: byte_offset,
                end: end.unwrap_or(usize::MAX),
                len: bytes,
            }),
        }
    }
}

impl<'a, T: Elem> SymView<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.raw.len
    }
    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }
    /// Byte offset in the symmetric heap (the same on every PE).
    pub fn offset(&self) -> usize {
        self.raw.offset
    }
    /// The elements `range` of this view (as [`Sym::slice`]).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<SymView<'a, T>> {
        Ok(SymView {
            raw: self.raw.slice(range, std::mem::size_of::<T>())?,
            _t: PhantomData,
        })
    }
}

impl RawSym {
    /// The elements `range` of this range (elements of `elem_bytes` bytes).
    fn slice(self, range: impl RangeBounds<usize>, elem_bytes: usize) -> Result<RawSym> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return Err(Error::OutOfBounds {
                start,
                end,
                len: self.len,
            });
        }
        Ok(RawSym {
            offset: self.offset + start * elem_bytes,
            len: end - start,
            ..self
        })
    }
}

/// Views a slice of elements as bytes.
pub(crate) fn as_bytes<T: Elem>(s: &[T]) -> &[u8] {
    // SAFETY: Elem is sealed to primitive numeric types without padding; any initialised value
    // is valid as bytes, and the length is exact.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// Views a mutable slice of elements as bytes.
pub(crate) fn as_bytes_mut<T: Elem>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in as_bytes; in addition every bit pattern is a valid T, so writing arbitrary
    // bytes cannot create an invalid value.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

/// The signal half of a put-with-signal ([`crate::Pe::put_signal`]): on the target PE, after
/// the data, element `at` of a symmetric `u64` object is set to or increased by `value`.
///
/// ```
/// # fn f(pe: &rshmem::Pe, data: &rshmem::Sym<u32>, flag: &rshmem::Sym<u64>) -> rshmem::Result<()> {
/// use rshmem::Signal;
/// pe.put_signal(data, 0, &[7, 8], Signal::set(flag, 0, 1), 1)?; // data, then flag[0] = 1 on PE 1
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub(crate) sym: RawSym,
    pub(crate) at: usize,
    pub(crate) value: u64,
    pub(crate) op: crate::elem::SignalOp,
}

impl Signal {
    /// `op` with `value` on `sig[at]`.
    pub fn new(
        sig: &(impl AsSym<u64> + ?Sized),
        at: usize,
        value: u64,
        op: crate::elem::SignalOp,
    ) -> Signal {
        Signal {
            sym: sig.raw(),
            at,
            value,
            op,
        }
    }
    /// Sets `sig[at]` to `value`.
    pub fn set(sig: &(impl AsSym<u64> + ?Sized), at: usize, value: u64) -> Signal {
        Signal::new(sig, at, value, crate::elem::SignalOp::Set)
    }
    /// Adds `value` to `sig[at]`.
    pub fn add(sig: &(impl AsSym<u64> + ?Sized), at: usize, value: u64) -> Signal {
        Signal::new(sig, at, value, crate::elem::SignalOp::Add)
    }
    /// The signal object, as the locating code takes it.
    pub(crate) fn object(&self) -> SignalObject {
        SignalObject(self.sym)
    }
}

/// A signal's `u64` object by its identity alone.
pub(crate) struct SignalObject(RawSym);

impl AsSym<u64> for SignalObject {
    fn raw(&self) -> RawSym {
        self.0
    }
}
