//! The fast path of `put` and `get` on torch tensors: the operands are read here (address,
//! bytes, dtype, device, contiguity) and the call goes straight to the library, with no Python
//! code in between, so a call from Python costs little more than the same call from Rust.
//! On the host backend plain numpy arrays take it too (the package's CPU surface). Anything
//! unusual (not a contiguous torch tensor or numpy array, `torch.bool`, an element type rshmem
//! does not have, dtypes or sizes that differ, a read-only destination of a get, another device,
//! a PE that is not a plain in-range `int`) answers `False` and the Python layer takes its
//! checked path, which raises the precise error. Errors of the call itself (an operand
//! off the symmetric heap, a freed tensor) are the same on both paths: they come from the same
//! Rust calls.

use crate::world::World;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyInt, PyType};
use std::ffi::{c_char, c_int, c_void};

/// The torch objects the fast path needs, looked up once.
struct Torch {
    tensor: Py<PyType>,
    bool_: Py<PyAny>,
    /// `torch._C._cuda_getCurrentRawStream` (absent from CPU-only builds).
    raw_stream: Option<Py<PyAny>>,
}

static TORCH: GILOnceCell<Option<Torch>> = GILOnceCell::new();

fn torch(py: Python<'_>) -> Option<&'static Torch> {
    TORCH
        .get_or_init(py, || {
            // The package imports torch where it is installed; without it there is no fast path.
            let m = py.import("torch").ok()?;
            let tensor = m.getattr("Tensor").ok()?.downcast_into::<PyType>().ok()?;
            let bool_ = m.getattr("bool").ok()?;
            let raw_stream = m
                .getattr("_C")
                .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
                .ok()
                .map(Bound::unbind);
            Some(Torch {
                tensor: tensor.unbind(),
                bool_: bool_.unbind(),
                raw_stream,
            })
        })
        .as_ref()
}

/// numpy's array type, looked up once.
static NDARRAY: GILOnceCell<Option<Py<PyType>>> = GILOnceCell::new();

fn ndarray(py: Python<'_>) -> Option<&'static Py<PyType>> {
    NDARRAY
        .get_or_init(py, || {
            let t = py.import("numpy").ok()?.getattr("ndarray").ok()?;
            Some(t.downcast_into::<PyType>().ok()?.unbind())
        })
        .as_ref()
}

/// numpy's C-struct form of the array interface (`__array_struct__`, version 2), which gives
/// the address, type, shape and flags in one attribute read where `__array_interface__` builds
/// a dictionary.
#[repr(C)]
struct ArrayStruct {
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *const isize,
    strides: *const isize,
    data: *mut c_void,
    descr: *mut c_void,
}

const C_CONTIGUOUS: c_int = 0x1;
const NOTSWAPPED: c_int = 0x200;
const WRITEABLE: c_int = 0x400;

/// A C-contiguous numpy array in native byte order of one of rshmem's element types (signed
/// and unsigned integers of 1 to 8 bytes, floats of 2, 4 or 8; writable where `write`), or
/// `None` where the checked path must decide.
fn operand_np(
    py: Python<'_>,
    ndarray: &Py<PyType>,
    a: &Bound<'_, PyAny>,
    write: bool,
) -> PyResult<Option<Operand>> {
    if !a.get_type().is(ndarray.bind(py)) {
        return Ok(None);
    }
    let cap = a.getattr(intern!(py, "__array_struct__"))?;
    let Ok(cap) = cap.downcast::<PyCapsule>() else {
        return Ok(None);
    };
    let p = cap.pointer() as *const ArrayStruct;
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: numpy's capsule holds a PyArrayInterface (checked by `two` below) that lives as
    // long as the capsule, which `cap` keeps alive; `shape` has `nd` entries.
    let i = unsafe { &*p };
    let need = C_CONTIGUOUS | NOTSWAPPED | if write { WRITEABLE } else { 0 };
    if i.two != 2 || i.flags & need != need || i.nd < 0 {
        return Ok(None);
    }
    let kind = i.typekind as u8;
    let ok = match kind {
        b'i' | b'u' => matches!(i.itemsize, 1 | 2 | 4 | 8),
        b'f' => matches!(i.itemsize, 2 | 4 | 8),
        _ => false,
    };
    if !ok {
        return Ok(None);
    }
    let mut elems: usize = 1;
    for d in 0..i.nd as usize {
        // SAFETY: `d < nd`, the length of `shape` (see above).
        let n = unsafe { *i.shape.add(d) };
        let Some(e) = usize::try_from(n).ok().and_then(|n| elems.checked_mul(n)) else {
            return Ok(None);
        };
        elems = e;
    }
    let Some(nbytes) = elems.checked_mul(i.itemsize as usize) else {
        return Ok(None);
    };
    Ok(Some(Operand {
        addr: i.data as u64,
        nbytes,
        // The same code for the same element type (dst and src are compared with each other).
        dtype: usize::from(kind) << 8 | i.itemsize as usize,
        device: -1,
    }))
}

/// What a call needs to know about a tensor.
struct Operand {
    addr: u64,
    nbytes: usize,
    /// The dtype object (torch's dtypes are singletons: the same dtype is the same object).
    dtype: usize,
    /// `get_device()`: -1 on the host (asked on the host backend only).
    device: i64,
}

/// The operand `a`, or `None` where the checked path must decide. `device` is asked only
/// where `ask_device` (on the CUDA backend an address on the heap settles the device).
fn operand(
    py: Python<'_>,
    t: &Torch,
    a: &Bound<'_, PyAny>,
    ask_device: bool,
) -> PyResult<Option<Operand>> {
    if !a.is_instance(t.tensor.bind(py))? {
        return Ok(None);
    }
    if !a.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
        return Ok(None);
    }
    let dtype = a.getattr(intern!(py, "dtype"))?;
    if dtype.is(t.bool_.bind(py)) {
        return Ok(None);
    }
    Ok(Some(Operand {
        addr: a.call_method0(intern!(py, "data_ptr"))?.extract()?,
        nbytes: a.getattr(intern!(py, "nbytes"))?.extract()?,
        dtype: dtype.as_ptr() as usize,
        device: if ask_device {
            a.call_method0(intern!(py, "get_device"))?.extract()?
        } else {
            0
        },
    }))
}

/// A plain `int` PE in `0..n`, else `None`.
fn plain_pe(pe: &Bound<'_, PyAny>, n: usize) -> Option<usize> {
    let i = pe.downcast_exact::<PyInt>().ok()?;
    i.extract::<usize>().ok().filter(|&p| p < n)
}

/// A pair of operands of the same dtype and size on this world's kind of memory, with torch's
/// current stream of their GPU on the CUDA backend (0 on the host).
struct Pair {
    dst: Operand,
    src: Operand,
    pe: usize,
    stream: usize,
}

impl World {
    /// `write_dst`: the call writes `dst` (a get), so a read-only array is not plain.
    fn pair(
        &self,
        py: Python<'_>,
        (dst, src, pe): (&Bound<'_, PyAny>, &Bound<'_, PyAny>, &Bound<'_, PyAny>),
        write_dst: bool,
    ) -> PyResult<Option<Pair>> {
        let Some(pe) = plain_pe(pe, self.world_size()) else {
            return Ok(None);
        };
        let cuda = self.is_cuda();
        if let (false, Some(np)) = (cuda, ndarray(py)) {
            let d = operand_np(py, np, dst, write_dst)?;
            if let (Some(d), Some(s)) = (d, operand_np(py, np, src, false)?) {
                let same = d.dtype == s.dtype && d.nbytes == s.nbytes;
                return Ok(same.then_some(Pair {
                    dst: d,
                    src: s,
                    pe,
                    stream: 0,
                }));
            }
        }
        let Some(t) = torch(py) else { return Ok(None) };
        let (Some(d), Some(s)) = (operand(py, t, dst, !cuda)?, operand(py, t, src, !cuda)?) else {
            return Ok(None);
        };
        if d.dtype != s.dtype || d.nbytes != s.nbytes {
            return Ok(None);
        }
        let stream = match (cuda, self.ordinal(), &t.raw_stream) {
            // Both operands must be symmetric, so on this PE's GPU: an address outside the
            // heap (another device, host memory) goes to the checked path and its error.
            (true, Some(dev), Some(raw)) => {
                if !self.on_heap(d.addr, d.nbytes) || !self.on_heap(s.addr, s.nbytes) {
                    return Ok(None);
                }
                raw.bind(py).call1((dev,))?.extract()?
            }
            (false, _, _) if d.device < 0 && s.device < 0 => 0,
            _ => return Ok(None),
        };
        Ok(Some(Pair {
            dst: d,
            src: s,
            pe,
            stream,
        }))
    }
}

impl World {
    /// Runs `op` on the plain pair, if it is one: whether it ran.
    fn with_pair(
        &self,
        py: Python<'_>,
        args: (&Bound<'_, PyAny>, &Bound<'_, PyAny>, &Bound<'_, PyAny>),
        write_dst: bool,
        op: impl FnOnce(Pair) -> PyResult<()>,
    ) -> PyResult<bool> {
        match self.pair(py, args, write_dst)? {
            Some(p) => op(p).map(|()| true),
            None => Ok(false),
        }
    }
}

#[pymethods]
impl World {
    /// `put(dst, src, pe)` on torch's current stream (CUDA) or from host memory (shm), when
    /// the operands are plain: returns whether it ran (`False`: take the checked path).
    fn put_fast(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.with_pair(py, (dst, src, pe), false, |p| {
            if self.is_cuda() {
                self.put_dev(py, p.dst.addr, p.src.addr, p.dst.nbytes, p.pe, p.stream)
            } else {
                self.put(py, p.dst.addr, p.src.addr as usize, p.src.nbytes, p.pe)
            }
        })
    }

    /// `get(dst, src, pe)` as [`put_fast`](Self::put_fast) does `put`.
    fn get_fast(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.with_pair(py, (dst, src, pe), true, |p| {
            if self.is_cuda() {
                self.get_dev(py, p.dst.addr, p.src.addr, p.dst.nbytes, p.pe, p.stream)
            } else {
                self.get(py, p.dst.addr as usize, p.dst.nbytes, p.src.addr, p.pe)
            }
        })
    }
}
