//! Reading plain operands in Rust: a C-contiguous numpy array (native byte order) or a
//! contiguous torch tensor of one of rshmem's 12 element types becomes its address, bytes,
//! element type and device without any Python code, so the entry points of `front.rs` cost
//! little more from Python than the same call from Rust. Anything unusual (another type, a
//! non-contiguous or byte-swapped array, `torch.bool`, an element type rshmem does not have, a
//! read-only destination) reads as `None`, and the caller takes the Python layer's checked
//! path, which raises the precise error.

use crate::world::World;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyInt, PyType};
use rshmem::ElemKind;
use std::ffi::{c_char, c_int, c_void};

/// The torch objects the fast path needs, looked up once.
pub(crate) struct Torch {
    tensor: Py<PyType>,
    /// The dtype objects of the 12 element types (torch's dtypes are singletons: a dtype is
    /// recognised by identity).
    dtypes: Vec<(usize, ElemKind)>,
    /// `torch._C._cuda_getCurrentRawStream` (absent from CPU-only builds).
    raw_stream: Option<Py<PyAny>>,
    /// `torch.cuda.Stream`.
    stream_type: Option<Py<PyType>>,
}

static TORCH: GILOnceCell<Option<Torch>> = GILOnceCell::new();

/// torch, where it is importable.
pub(crate) fn torch(py: Python<'_>) -> Option<&'static Torch> {
    TORCH
        .get_or_init(py, || {
            // The package imports torch where it is installed; without it there is no fast path.
            let m = py.import("torch").ok()?;
            let tensor = m.getattr("Tensor").ok()?.downcast_into::<PyType>().ok()?;
            let dtypes = KINDS
                .iter()
                .filter_map(|&(name, k)| Some((m.getattr(name).ok()?.as_ptr() as usize, k)))
                .collect();
            let raw_stream = m
                .getattr("_C")
                .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
                .ok()
                .map(Bound::unbind);
            let stream_type = py
                .import("torch.cuda")
                .and_then(|c| c.getattr("Stream"))
                .ok()
                .and_then(|t| t.downcast_into::<PyType>().ok())
                .map(Bound::unbind);
            Some(Torch {
                tensor: tensor.unbind(),
                dtypes,
                raw_stream,
                stream_type,
            })
        })
        .as_ref()
}

/// The 12 element types by their torch (and rshmem) names.
pub(crate) const KINDS: [(&str, ElemKind); 12] = [
    ("int8", ElemKind::I8),
    ("int16", ElemKind::I16),
    ("int32", ElemKind::I32),
    ("int64", ElemKind::I64),
    ("uint8", ElemKind::U8),
    ("uint16", ElemKind::U16),
    ("uint32", ElemKind::U32),
    ("uint64", ElemKind::U64),
    ("float16", ElemKind::F16),
    ("bfloat16", ElemKind::Bf16),
    ("float32", ElemKind::F32),
    ("float64", ElemKind::F64),
];

/// The rshmem (torch) name of an element type.
pub(crate) fn name_of(k: ElemKind) -> &'static str {
    KINDS
        .iter()
        .find(|&&(_, kk)| kk == k)
        .map_or("?", |&(n, _)| n)
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

/// What a call needs to know about an array or tensor.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub(crate) addr: u64,
    pub(crate) nbytes: usize,
    pub(crate) kind: ElemKind,
    /// Whether the memory is the host's (asked of torch tensors where `ask_device` only: on
    /// the CUDA backend an address on the heap settles the device).
    pub(crate) host: bool,
}

/// A C-contiguous numpy array in native byte order of one of rshmem's element types (signed
/// and unsigned integers of 1 to 8 bytes, floats of 2, 4 or 8; writable where `write`), or
/// `None`.
fn operand_np(a: &Bound<'_, PyAny>, write: bool) -> PyResult<Option<Operand>> {
    let py = a.py();
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
    let kind = match (i.typekind as u8, i.itemsize) {
        (b'i', 1) => ElemKind::I8,
        (b'i', 2) => ElemKind::I16,
        (b'i', 4) => ElemKind::I32,
        (b'i', 8) => ElemKind::I64,
        (b'u', 1) => ElemKind::U8,
        (b'u', 2) => ElemKind::U16,
        (b'u', 4) => ElemKind::U32,
        (b'u', 8) => ElemKind::U64,
        (b'f', 2) => ElemKind::F16,
        (b'f', 4) => ElemKind::F32,
        (b'f', 8) => ElemKind::F64,
        _ => return Ok(None),
    };
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
        kind,
        host: true,
    }))
}

/// A contiguous torch tensor of one of rshmem's element types, or `None`.
fn operand_torch(t: &Torch, a: &Bound<'_, PyAny>, ask_device: bool) -> PyResult<Option<Operand>> {
    let py = a.py();
    if !a.is_instance(t.tensor.bind(py))? {
        return Ok(None);
    }
    let dtype = a.getattr(intern!(py, "dtype"))?.as_ptr() as usize;
    let Some(&(_, kind)) = t.dtypes.iter().find(|&&(d, _)| d == dtype) else {
        return Ok(None);
    };
    if !a.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
        return Ok(None);
    }
    Ok(Some(Operand {
        addr: a.call_method0(intern!(py, "data_ptr"))?.extract()?,
        nbytes: a.getattr(intern!(py, "nbytes"))?.extract()?,
        kind,
        host: ask_device && a.getattr(intern!(py, "is_cpu"))?.is_truthy()?,
    }))
}

/// A plain `int` in `0..n`, else `None`.
pub(crate) fn plain_index(v: &Bound<'_, PyAny>, n: usize) -> Option<usize> {
    let i = v.downcast_exact::<PyInt>().ok()?;
    i.extract::<usize>().ok().filter(|&p| p < n)
}

impl World {
    /// `a` as an operand of this PE's kind of memory (`write`: the call writes it), or `None`:
    /// on the host a numpy array or CPU tensor, on the CUDA backend a tensor on the heap (an
    /// address outside the heap -- another device, host memory -- is for the checked path).
    pub(crate) fn operand(&self, a: &Bound<'_, PyAny>, write: bool) -> PyResult<Option<Operand>> {
        let py = a.py();
        let cuda = self.is_cuda();
        if !cuda {
            if let Some(np) = ndarray(py) {
                if a.get_type().is(np.bind(py)) {
                    return operand_np(a, write);
                }
            }
        }
        let Some(t) = torch(py) else { return Ok(None) };
        let Some(o) = operand_torch(t, a, !cuda)? else {
            return Ok(None);
        };
        let mine = if cuda {
            self.on_heap(o.addr, o.nbytes)
        } else {
            o.host
        };
        Ok(mine.then_some(o))
    }

    /// The raw stream a call runs on: `stream` (a `torch.cuda.Stream` of this PE's GPU), else
    /// torch's current stream of this PE's GPU (CUDA backend); 0 on the host without a
    /// `stream`. `None` where the checked path must decide (a `stream` on the host, of another
    /// type or device; a torch without CUDA).
    pub(crate) fn stream_of(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<usize>> {
        let t = torch(py);
        match (self.is_cuda(), stream, self.ordinal()) {
            (false, None, _) => Ok(Some(0)),
            (true, None, Some(dev)) => match t.and_then(|t| t.raw_stream.as_ref()) {
                Some(raw) => Ok(Some(raw.bind(py).call1((dev,))?.extract()?)),
                None => Ok(None),
            },
            (true, Some(s), Some(dev)) => {
                let Some(ty) = t.and_then(|t| t.stream_type.as_ref()) else {
                    return Ok(None);
                };
                if !s.is_instance(ty.bind(py))?
                    || s.getattr(intern!(py, "device_index"))?.extract::<i64>()? != dev as i64
                {
                    return Ok(None);
                }
                Ok(Some(s.getattr(intern!(py, "cuda_stream"))?.extract()?))
            }
            _ => Ok(None),
        }
    }
}
