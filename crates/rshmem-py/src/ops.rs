//! Host one-sided operations on symmetric arrays: put, get, put-with-signal, atomics, waits,
//! fence, quiet, barrier. Symmetric operands arrive as (address, bytes), located in the
//! registry; host operands as buffers (numpy arrays, or torch CPU tensors through numpy).

use crate::elem::kind;
use crate::errors::{invalid, IntoPy};
use crate::registry::Located;
use crate::world::World;
use pyo3::prelude::*;
use rshmem::{Cmp, ElemKind, Error, Pe, Signal, SignalOp, Sym};
use std::sync::RwLockReadGuard;
use std::time::Duration;

/// A contiguous host array's bytes: its address and length as the Python layer read them
/// from a numpy array (or torch CPU tensor) that it holds for the duration of the call.
/// (The stable ABI of Python 3.9 has no buffer protocol, so arrays reach here by address;
/// these native functions are internal to the package.)
#[derive(Clone, Copy)]
pub(crate) struct HostBytes {
    addr: usize,
    len: usize,
}

impl HostBytes {
    pub(crate) fn new(addr: usize, len: usize) -> PyResult<HostBytes> {
        if addr == 0 && len != 0 {
            return Err(invalid("null host array"));
        }
        Ok(HostBytes { addr, len })
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// The bytes to read.
    ///
    /// # Safety
    /// The buffer must stay alive and unmoved while the slice is used (its `PyBuffer` is held).
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: a contiguous buffer of `len` bytes at `addr`, kept alive by the caller.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
    /// The bytes to write.
    ///
    /// # Safety
    /// As [`bytes`](Self::bytes), and the buffer is writable (checked in [`of`](Self::of)).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; writable per the buffer's flags.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

/// Located symmetric operands with their handles read-locked.
pub(crate) struct Held {
    locs: Vec<Located>,
}

impl Held {
    pub(crate) fn guards(&self) -> Vec<RwLockReadGuard<'_, Option<Sym<u8>>>> {
        self.locs
            .iter()
            .map(|l| l.block.sym.read().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }
    pub(crate) fn offset(&self, i: usize) -> usize {
        self.locs[i].offset
    }
}

/// The handle behind a read guard (None once the allocation went back to the heap).
pub(crate) fn sym<'a>(g: &'a RwLockReadGuard<'_, Option<Sym<u8>>>) -> rshmem::Result<&'a Sym<u8>> {
    g.as_ref()
        .ok_or_else(|| Error::InvalidArgument("symmetric tensor used after rshmem.free".into()))
}

impl World {
    /// Locates symmetric operands `(address, bytes, name)`.
    pub(crate) fn hold(&self, ops: &[(u64, usize, &str)]) -> rshmem::Result<Held> {
        let reg = self.reg.lock().unwrap_or_else(|e| e.into_inner());
        let locs = ops
            .iter()
            .map(|&(a, n, w)| reg.locate(a, n, w))
            .collect::<rshmem::Result<Vec<_>>>()?;
        Ok(Held { locs })
    }

    /// Runs `f` with the live PE, the GIL released.
    pub(crate) fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Pe) -> rshmem::Result<R> + Send,
    ) -> PyResult<R> {
        py.allow_threads(|| {
            let l = self.live()?;
            f(l.get().borrow_owner())
        })
        .py()
    }
}

pub(crate) fn cmp_of(name: &str) -> PyResult<Cmp> {
    Ok(match name {
        "eq" | "==" => Cmp::Eq,
        "ne" | "!=" => Cmp::Ne,
        "gt" | ">" => Cmp::Gt,
        "ge" | ">=" => Cmp::Ge,
        "lt" | "<" => Cmp::Lt,
        "le" | "<=" => Cmp::Le,
        c => {
            return Err(invalid(format!(
                "comparison {c:?}: expected one of == != > >= < <="
            )))
        }
    })
}

pub(crate) fn signal_op(name: &str) -> PyResult<SignalOp> {
    match name {
        "set" => Ok(SignalOp::Set),
        "add" => Ok(SignalOp::Add),
        o => Err(invalid(format!("signal op {o:?}: expected 'set' or 'add'"))),
    }
}

/// Runs `$body` with `$T` bound to the atomic element type of `$kind` (else an error).
macro_rules! with_atomic {
    ($kind:expr, $T:ident => $body:expr) => {
        match $kind {
            ElemKind::I32 => {
                type $T = i32;
                $body
            }
            ElemKind::U32 => {
                type $T = u32;
                $body
            }
            ElemKind::I64 => {
                type $T = i64;
                $body
            }
            ElemKind::U64 => {
                type $T = u64;
                $body
            }
            k => Err(invalid(format!(
                "atomics and waits take int32, uint32, int64 or uint64 elements, not {}",
                k.name()
            ))),
        }
    };
}

#[pymethods]
impl World {
    /// Copies the host array at `src` (`nbytes`) into PE `pe`'s copy of the symmetric bytes at
    /// `dst`.
    pub(crate) fn put(
        &self,
        py: Python<'_>,
        dst: u64,
        src: usize,
        nbytes: usize,
        pe: usize,
    ) -> PyResult<()> {
        let s = HostBytes::new(src, nbytes)?;
        self.run(py, |p| {
            let h = self.hold(&[(dst, s.len(), "destination")])?;
            let g = h.guards();
            let v = sym(&g[0])?.view::<u8>(h.offset(0), s.len())?;
            // SAFETY: `src` is held by this call.
            p.put(&v, 0, unsafe { s.bytes() }, pe)
        })
    }

    /// Copies PE `pe`'s copy of the symmetric bytes at `src` into the writable host array at
    /// `dst` (`nbytes`).
    pub(crate) fn get(
        &self,
        py: Python<'_>,
        dst: usize,
        nbytes: usize,
        src: u64,
        pe: usize,
    ) -> PyResult<()> {
        let d = HostBytes::new(dst, nbytes)?;
        self.run(py, |p| {
            let h = self.hold(&[(src, d.len(), "source")])?;
            let g = h.guards();
            let v = sym(&g[0])?.view::<u8>(h.offset(0), d.len())?;
            // SAFETY: `dst` is held by this call and writable.
            p.get(&v, 0, unsafe { d.bytes_mut() }, pe)
        })
    }

    /// Puts `src` into `dst` on PE `pe`, then sets or adds `value` to the symmetric `u64` at
    /// `sig` there (whoever sees the signal sees the data).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_signal(
        &self,
        py: Python<'_>,
        dst: u64,
        src: usize,
        nbytes: usize,
        sig: u64,
        value: u64,
        op: &str,
        pe: usize,
    ) -> PyResult<()> {
        let s = HostBytes::new(src, nbytes)?;
        let op = signal_op(op)?;
        self.run(py, |p| {
            let h = self.hold(&[(dst, s.len(), "destination"), (sig, 8, "signal")])?;
            let g = h.guards();
            let v = sym(&g[0])?.view::<u8>(h.offset(0), s.len())?;
            let sv = sym(&g[1])?.view::<u64>(h.offset(1), 1)?;
            // SAFETY: `src` is held by this call.
            p.put_signal(
                &v,
                0,
                unsafe { s.bytes() },
                Signal::new(&sv, 0, value, op),
                pe,
            )
        })
    }

    /// An atomic on the symmetric word at `addr` of PE `pe`: `op` one of fetch, set, swap,
    /// compare_swap (with `cond`), fetch_add, fetch_and, fetch_or, fetch_xor; returns the old
    /// value (None for set).
    #[pyo3(signature = (addr, dtype, op, pe, value=None, cond=None))]
    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &self,
        py: Python<'_>,
        addr: u64,
        dtype: &str,
        op: &str,
        pe: usize,
        value: Option<Bound<'_, PyAny>>,
        cond: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let k = kind(dtype)?;
        with_atomic!(k, T => {
            let v: T = match &value {
                Some(v) => v.extract()?,
                None if op == "fetch" => 0,
                None => return Err(invalid(format!("atomic {op} needs a value"))),
            };
            let c: T = match &cond {
                Some(c) => c.extract()?,
                None if op == "compare_swap" => {
                    return Err(invalid("compare_swap needs cond"))
                }
                None => 0,
            };
            let op = op.to_string();
            let r: Option<T> = self.run(py, move |p| {
                let h = self.hold(&[(addr, std::mem::size_of::<T>(), "atomic target")])?;
                let g = h.guards();
                let w = sym(&g[0])?.view::<T>(h.offset(0), 1)?;
                Ok(match op.as_str() {
                    "fetch" => Some(p.atomic_fetch(&w, 0, pe)?),
                    "set" => {
                        p.atomic_set(&w, 0, v, pe)?;
                        None
                    }
                    "swap" => Some(p.atomic_swap(&w, 0, v, pe)?),
                    "compare_swap" => Some(p.atomic_compare_swap(&w, 0, c, v, pe)?),
                    "fetch_add" => Some(p.atomic_fetch_add(&w, 0, v, pe)?),
                    "fetch_and" => Some(p.atomic_fetch_and(&w, 0, v, pe)?),
                    "fetch_or" => Some(p.atomic_fetch_or(&w, 0, v, pe)?),
                    "fetch_xor" => Some(p.atomic_fetch_xor(&w, 0, v, pe)?),
                    o => return Err(Error::InvalidArgument(format!("unknown atomic {o:?}"))),
                })
            })?;
            Ok(r.into_pyobject(py)?.into_any().unbind())
        })
    }

    /// Waits until this PE's symmetric word at `addr` compares true with `value` (at most
    /// `timeout` seconds, default the world's); returns the value seen. The GIL is released.
    #[pyo3(signature = (addr, dtype, cmp, value, timeout=None))]
    pub(crate) fn wait_until(
        &self,
        py: Python<'_>,
        addr: u64,
        dtype: &str,
        cmp: &str,
        value: Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<PyObject> {
        let (k, c) = (kind(dtype)?, cmp_of(cmp)?);
        if let Some(t) = timeout {
            if !(t.is_finite() && t >= 0.0) {
                return Err(invalid(format!("timeout {t}: expected seconds >= 0")));
            }
        }
        with_atomic!(k, T => {
            let v: T = value.extract()?;
            let r: T = self.run(py, move |p| {
                let h = self.hold(&[(addr, std::mem::size_of::<T>(), "wait target")])?;
                let g = h.guards();
                let w = sym(&g[0])?.view::<T>(h.offset(0), 1)?;
                let t = timeout.map_or(p.config().timeout, Duration::from_secs_f64);
                p.wait_until_timeout(&w, 0, c, v, t)
            })?;
            Ok(r.into_pyobject(py)?.into_any().unbind())
        })
    }

    /// Orders this PE's earlier puts and atomics to each PE before later ones.
    pub(crate) fn fence(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |p| {
            p.fence();
            Ok(())
        })
    }

    /// Completes this PE's outstanding operations.
    pub(crate) fn quiet(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |p| p.quiet())
    }

    /// Barrier of every PE (after quiet). The GIL is released.
    pub(crate) fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |p| p.barrier_all())
    }
}
