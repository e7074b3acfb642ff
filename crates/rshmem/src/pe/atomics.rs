//! Atomics and waits on symmetric words.

use super::*;

impl Pe {
    // ----- atomics -----

    pub(super) fn amo<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
        op: AtomicOp,
    ) -> Result<T> {
        let off = self.locate(sym, at, 1, pe)?;
        if off % std::mem::size_of::<T>() != 0 {
            return Err(Error::Misaligned {
                offset: off,
                align: std::mem::size_of::<T>(),
            });
        }
        let v = self.inner.backend.atomic(pe, off, T::WIDE, op)?;
        self.inner.check_peer(pe, "atomic")?;
        Ok(T::from_bits(v))
    }

    /// Atomically reads element `at` on PE `pe`.
    pub fn atomic_fetch<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::Fetch)
    }
    /// Atomically stores `v`.
    pub fn atomic_set<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<()> {
        self.amo(sym, at, pe, AtomicOp::Set(v.to_bits()))
            .map(|_: T| ())
    }
    /// Atomically swaps in `v`; returns the old value.
    pub fn atomic_swap<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::Swap(v.to_bits()))
    }
    /// Stores `v` if the value is `cond`; returns the old value.
    pub fn atomic_compare_swap<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cond: T,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(
            sym,
            at,
            pe,
            AtomicOp::CompareSwap {
                cond: cond.to_bits(),
                value: v.to_bits(),
            },
        )
    }
    /// Adds `v` (wrapping); returns the old value.
    pub fn atomic_fetch_add<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::FetchAdd(v.to_bits()))
    }
    /// Adds `v` (wrapping).
    pub fn atomic_add<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_add(sym, at, v, pe).map(|_| ())
    }
    /// Adds one; returns the old value.
    pub fn atomic_fetch_inc<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::FetchAdd(1))
    }
    /// Adds one.
    pub fn atomic_inc<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_inc(sym, at, pe).map(|_| ())
    }
    /// Bitwise and; returns the old value.
    pub fn atomic_fetch_and<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::FetchAnd(v.to_bits()))
    }
    /// Bitwise or; returns the old value.
    pub fn atomic_fetch_or<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::FetchOr(v.to_bits()))
    }
    /// Bitwise xor; returns the old value.
    pub fn atomic_fetch_xor<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<T> {
        self.amo(sym, at, pe, AtomicOp::FetchXor(v.to_bits()))
    }
    /// Bitwise and.
    pub fn atomic_and<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_and(sym, at, v, pe).map(|_| ())
    }
    /// Bitwise or.
    pub fn atomic_or<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_or(sym, at, v, pe).map(|_| ())
    }
    /// Bitwise xor.
    pub fn atomic_xor<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        v: T,
        pe: usize,
    ) -> Result<()> {
        self.atomic_fetch_xor(sym, at, v, pe).map(|_| ())
    }

    // ----- waiting -----

    /// True when this PE's `sym[at] <cmp> value` holds now.
    pub fn test<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: T,
    ) -> Result<bool> {
        Ok(cmp.eval(self.atomic_fetch(sym, at, self.inner.me)?, value))
    }

    /// Waits until this PE's `sym[at] <cmp> value`, at most the configured timeout.
    pub fn wait_until<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: T,
    ) -> Result<T> {
        self.wait_until_timeout(sym, at, cmp, value, self.inner.config.timeout)
    }

    /// Waits until this PE's `sym[at] <cmp> value`, at most `timeout`; returns the value seen.
    /// Ends in [`Error::PeerLost`] as soon as any peer is found dead, or [`Error::Timeout`].
    pub fn wait_until_timeout<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: T,
        timeout: Duration,
    ) -> Result<T> {
        self.wait_until_on(sym, at, cmp, value, timeout, None, "wait_until")
    }

    /// As [`wait_until`](Self::wait_until) for a value PE `from` writes: a timeout names it,
    /// and `op` names the operation waiting.
    pub(crate) fn wait_until_from<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: T,
        from: usize,
        op: &'static str,
    ) -> Result<T> {
        let timeout = self.inner.config.timeout;
        self.wait_until_on(sym, at, cmp, value, timeout, Some(from), op)
    }

    #[allow(clippy::too_many_arguments)]
    fn wait_until_on<T: AtomicElem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: T,
        timeout: Duration,
        from: Option<usize>,
        op: &'static str,
    ) -> Result<T> {
        let me = self.inner.me;
        let off = self.locate(sym, at, 1, me)?;
        let b = &self.inner.backend;
        let mut seen = T::ZERO;
        let mut err = None;
        self.inner.wait_for(
            op,
            timeout,
            || match b.atomic(me, off, T::WIDE, AtomicOp::Fetch) {
                Ok(v) => {
                    seen = T::from_bits(v);
                    cmp.eval(seen, value)
                }
                Err(e) => {
                    err = Some(e);
                    true
                }
            },
            || from,
            false,
        )?;
        match err {
            Some(e) => Err(e),
            None => Ok(seen),
        }
    }
}
