//! MoE dispatch and combine on the CPU backend (`rshmem::ep::HostBuffer`); the Python
//! `rshmem.ep.Buffer` gives it DeepEP's face.

use crate::elem::{bad_hidden, with_buf, Hidden};
use crate::errors::invalid;
use crate::ops::HostBytes;
use crate::world::World;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use rshmem::ep::{EpConfig, EpMode, Handle, HostBuffer, RecvLayout};
use rshmem::{bf16, f16, Elem, Error, Free, Pe};
use std::sync::Mutex;

type Buf = Hidden<HostBuffer<f32>, HostBuffer<bf16>, HostBuffer<f16>>;

/// A host MoE buffer of one PE.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct HostEp {
    world: Py<World>,
    buf: Mutex<Option<Buf>>,
}

/// What a dispatch recorded for its combine, and the routing of the received tokens.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct HostEpHandle {
    h: Handle,
}

/// The configuration of an MoE buffer of `(num_experts, max_tokens, hidden, max_topk)`: the
/// receive layout token-major or expert-major, capturable with `capacity` pairs or normal.
pub(crate) fn ep_config(
    (num_experts, max_tokens, hidden, max_topk): (usize, usize, usize, usize),
    token_major: bool,
    capacity: Option<usize>,
) -> EpConfig {
    EpConfig::new(num_experts, max_tokens, hidden, max_topk)
        .with_layout(if token_major {
            RecvLayout::TokenMajor
        } else {
            RecvLayout::ExpertMajor
        })
        .with_mode(match capacity {
            Some(capacity) => EpMode::Capturable { capacity },
            None => EpMode::Normal,
        })
}

/// Whether routing ids of dtype `id_dtype` are int64 (else int32).
pub(crate) fn wide_ids(id_dtype: &str) -> PyResult<bool> {
    match id_dtype {
        "int64" => Ok(true),
        "int32" => Ok(false),
        d => Err(invalid(format!("topk_idx must be int64 or int32, not {d}"))),
    }
}

/// Collectively frees the buffer in `slot`, which is left empty.
pub(crate) fn free_buf<F: Free, B: Free, H: Free>(
    pe: &Pe,
    slot: &Mutex<Option<Hidden<F, B, H>>>,
) -> rshmem::Result<()> {
    let b = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    match b {
        Some(b) => with_buf!(b, b, _T => pe.free(b)),
        None => Err(Error::InvalidArgument("ep buffer already freed".into())),
    }
}

/// `hb`'s bytes as elements of `T` (aligned, whole elements).
///
/// # Safety
/// As [`HostBytes::bytes`].
unsafe fn typed<'a, T: Elem>(hb: &'a HostBytes, what: &str) -> rshmem::Result<&'a [T]> {
    // SAFETY: forwarded.
    let b = unsafe { hb.bytes() };
    let s = std::mem::size_of::<T>();
    if !b.len().is_multiple_of(s)
        || !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    {
        return Err(Error::InvalidArgument(format!(
            "{what}: not an aligned array of {}-byte elements",
            s
        )));
    }
    if b.is_empty() {
        return Ok(&[]);
    }
    // SAFETY: aligned, whole elements of a plain-data type (every bit pattern valid).
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / s) })
}

/// `v`'s bytes.
fn as_bytes<T: Elem>(v: &[T]) -> &[u8] {
    // SAFETY: Elem types are plain data without padding; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// A new bytearray holding `v`'s bytes.
fn bytearray<'py, T: Elem>(py: Python<'py>, v: &[T]) -> Bound<'py, PyByteArray> {
    PyByteArray::new(py, as_bytes(v))
}

#[pymethods]
impl HostEp {
    /// Collectively creates the buffer (every PE the same arguments).
    #[new]
    #[pyo3(signature = (world, dtype, num_experts, max_tokens, hidden, max_topk, token_major=true, capacity=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        world: Py<World>,
        dtype: &str,
        num_experts: usize,
        max_tokens: usize,
        hidden: usize,
        max_topk: usize,
        token_major: bool,
        capacity: Option<usize>,
    ) -> PyResult<HostEp> {
        let cfg = ep_config(
            (num_experts, max_tokens, hidden, max_topk),
            token_major,
            capacity,
        );
        let dtype = dtype.to_string();
        let w = world.get();
        let buf = w.run(py, move |pe| {
            let team = pe.world_team();
            Ok(match dtype.as_str() {
                "float32" => Hidden::F32(HostBuffer::new(pe, team, cfg)?),
                "bfloat16" => Hidden::Bf16(HostBuffer::new(pe, team, cfg)?),
                "float16" => Hidden::F16(HostBuffer::new(pe, team, cfg)?),
                d => {
                    // Take part in the collective allocation so the peers are not left waiting.
                    let _ = HostBuffer::<f32>::new(pe, team, EpConfig::new(0, 0, 0, 0));
                    return Err(bad_hidden(d));
                }
            })
        })?;
        Ok(HostEp {
            world,
            buf: Mutex::new(Some(buf)),
        })
    }

    /// Dispatches `x [T, H]` by `topk_ids [T, top_k]` (`id_dtype` int32 or int64) and
    /// `topk_weights [T, top_k]` (float32); returns the received tokens' bytes and the handle. Arrays
    /// arrive as (address, bytes) of contiguous host arrays the caller holds.
    /// Collective; the GIL is released.
    #[allow(clippy::too_many_arguments)]
    fn dispatch<'py>(
        &self,
        py: Python<'py>,
        x: (usize, usize),
        topk_ids: (usize, usize),
        id_dtype: &str,
        topk_weights: (usize, usize),
        top_k: usize,
    ) -> PyResult<(Bound<'py, PyByteArray>, HostEpHandle)> {
        let xb = HostBytes::new(x.0, x.1)?;
        let ib = HostBytes::new(topk_ids.0, topk_ids.1)?;
        let wb = HostBytes::new(topk_weights.0, topk_weights.1)?;
        let wide = wide_ids(id_dtype)?;
        let world = self.world.get();
        let (bytes, h) = world.run(py, |pe| {
            let mut g = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let buf = g.as_mut().ok_or(Error::WorldEnded)?;
            // SAFETY: the three buffers are held by this call.
            let (w, xs) = unsafe { (typed::<f32>(&wb, "topk_weights")?, &xb) };
            with_buf!(buf, b, T => {
                // SAFETY: as above.
                let xv = unsafe { typed::<T>(xs, "x")? };
                let d = if wide {
                    // SAFETY: as above.
                    b.dispatch(pe, xv, unsafe { typed::<i64>(&ib, "topk_idx")? }, w, top_k)?
                } else {
                    // SAFETY: as above.
                    b.dispatch(pe, xv, unsafe { typed::<i32>(&ib, "topk_idx")? }, w, top_k)?
                };
                Ok((as_bytes(&d.x).to_vec(), d.handle))
            })
        })?;
        Ok((PyByteArray::new(py, &bytes), HostEpHandle { h }))
    }

    /// Combines one row per received token (`y [num_recv_tokens, H]`, already reduced over
    /// this PE's experts) back to the source tokens, summed over PEs; returns `[T, H]` bytes.
    /// With `expert_major`, `y` is one row per (token, local expert) in expert-major order and
    /// the source applies the top-k weights (rshmem's own combine). Collective; the GIL is
    /// released.
    #[pyo3(signature = (handle, y, expert_major=false))]
    fn combine<'py>(
        &self,
        py: Python<'py>,
        handle: &HostEpHandle,
        y: (usize, usize),
        expert_major: bool,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let yb = HostBytes::new(y.0, y.1)?;
        let world = self.world.get();
        let h = &handle.h;
        let bytes = world.run(py, |pe| {
            let mut g = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let buf = g.as_mut().ok_or(Error::WorldEnded)?;
            with_buf!(buf, b, T => {
                // SAFETY: `y` is held by this call.
                let yv = unsafe { typed::<T>(&yb, "x")? };
                let out = if expert_major {
                    b.combine(pe, h, yv)?
                } else {
                    b.combine_tokens(pe, h, yv)?
                };
                Ok(as_bytes(&out).to_vec())
            })
        })?;
        Ok(PyByteArray::new(py, &bytes))
    }

    /// Collectively releases the buffer's symmetric memory.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.world.get().run(py, |pe| free_buf(pe, &self.buf))
    }
}

#[pymethods]
impl HostEpHandle {
    #[getter]
    fn num_tokens(&self) -> usize {
        self.h.num_tokens()
    }
    #[getter]
    fn num_recv_tokens(&self) -> usize {
        self.h.num_recv_tokens()
    }
    #[getter]
    fn top_k(&self) -> usize {
        self.h.top_k()
    }
    #[getter]
    fn hidden(&self) -> usize {
        self.h.hidden()
    }
    #[getter]
    fn num_rows(&self) -> usize {
        self.h.num_rows()
    }
    /// `[num_recv_tokens, top_k]` int32: each slot's local expert, -1 where another PE serves it.
    #[getter]
    fn recv_topk_local<'py>(&self, py: Python<'py>) -> Bound<'py, PyByteArray> {
        bytearray(py, self.h.recv_topk_local())
    }
    /// `[num_recv_tokens, top_k]` float32 weights of the slots served here (0 elsewhere).
    #[getter]
    fn recv_topk_weights<'py>(&self, py: Python<'py>) -> Bound<'py, PyByteArray> {
        bytearray(py, self.h.recv_topk_weights())
    }
    /// Source PE of each received token.
    #[getter]
    fn recv_src_pe(&self) -> Vec<u32> {
        self.h.recv_src_pe().to_vec()
    }
    /// Index of each received token on its source PE.
    #[getter]
    fn recv_src_token(&self) -> Vec<u32> {
        self.h.recv_src_token().to_vec()
    }
    /// Tokens received from each PE.
    #[getter]
    fn recv_tokens_per_pe(&self) -> Vec<usize> {
        self.h.recv_tokens_per_pe().to_vec()
    }
    /// (token, slot) rows per local expert.
    #[getter]
    fn expert_counts(&self) -> Vec<usize> {
        self.h.expert_counts()
    }
    /// For each expert-major row, its received token.
    #[getter]
    fn row_token(&self) -> Vec<u32> {
        self.h.row_token().to_vec()
    }
}
