//! MoE dispatch and combine on GPUs (`rshmem::cuda::ep::GpuBuffer`); the Python
//! `rshmem.ep.Buffer` stages DeepEP-style tensors into the symmetric operands it takes.

use crate::coll::elems;
use crate::elem::{bad_hidden, with_buf, Hidden};
use crate::ep::{ep_config, free_buf, wide_ids};
use crate::errors::invalid;
use crate::gpu::stream;
use crate::ops::sym;
use crate::world::World;
use pyo3::prelude::*;
use rshmem::cuda::ep::{Dispatch, EpTuning, GpuBuffer};
use rshmem::cuda::CudaPe;
use rshmem::{bf16, f16, Error};
use std::sync::Mutex;

type Buf = Hidden<GpuBuffer<f32>, GpuBuffer<bf16>, GpuBuffer<f16>>;

/// A GPU MoE buffer of one PE.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct GpuEp {
    world: Py<World>,
    buf: Mutex<Option<Buf>>,
}

/// What a GPU dispatch returns: the handle for combine and, in normal mode, the counts.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct GpuEpHandle {
    d: Dispatch,
}

/// A device area: its address and length in elements.
type Area = (u64, usize);

#[pymethods]
impl GpuEp {
    /// Collectively creates the buffer and loads its kernels (every PE the same arguments).
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
    ) -> PyResult<GpuEp> {
        let cfg = ep_config(
            (num_experts, max_tokens, hidden, max_topk),
            token_major,
            capacity,
        );
        let dtype = dtype.to_string();
        let buf = world.get().run(py, move |pe| {
            let team = pe.world_team();
            let t = EpTuning::from_env()?;
            Ok(match dtype.as_str() {
                "float32" => Hidden::F32(GpuBuffer::new(pe, team, cfg, &t)?),
                "bfloat16" => Hidden::Bf16(GpuBuffer::new(pe, team, cfg, &t)?),
                "float16" => Hidden::F16(GpuBuffer::new(pe, team, cfg, &t)?),
                d => return Err(bad_hidden(d)),
            })
        })?;
        Ok(GpuEp {
            world,
            buf: Mutex::new(Some(buf)),
        })
    }

    /// (address, elements) of the receive area `[recv_rows, H]`, the row records
    /// `[recv_rows, 1 + 2 max_topk]` (u32) and the expert-major index `[max_rows]` (u32), and
    /// the pair capacity, on this PE's GPU.
    fn areas(&self, py: Python<'_>) -> PyResult<(Area, Area, Area, usize)> {
        self.world.get().run(py, |pe| {
            let g = CudaPe::new(pe)?;
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            with_buf!(b, b, _T => {
                let (x, r, s) = (b.recv_x()?, b.recv_records()?, b.expert_src()?);
                Ok((
                    (g.ptr(&x)?, x.len()),
                    (g.ptr(&r)?, r.len()),
                    (g.ptr(&s)?, s.len()),
                    b.pair_capacity(),
                ))
            })
        })
    }

    /// A CUDA-array-interface view of one of the buffer's areas (`"recv_x"`, `"records"`,
    /// `"expert_src"`) as bytes; it keeps the buffer object alive. For the package's own use:
    /// the area is rewritten by the next dispatch and gone after `free`.
    fn view(slf: Bound<'_, Self>, which: &str) -> PyResult<AreaView> {
        let py = slf.py();
        let (x, r, s, _) = slf.get().areas(py)?;
        let (addr, bytes) = match which {
            "recv_x" => (x.0, x.1 * slf.get().elem_bytes()),
            "records" => (r.0, r.1 * 4),
            "expert_src" => (s.0, s.1 * 4),
            o => return Err(invalid(format!("unknown area {o:?}"))),
        };
        let d = pyo3::types::PyDict::new(py);
        d.set_item("shape", (bytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 2)?;
        Ok(AreaView {
            iface: d.unbind(),
            _owner: slf.unbind(),
        })
    }

    /// Dispatches `num_tokens` tokens of symmetric `x`, `topk_ids` (`id_dtype` int32/int64)
    /// and `topk_weights` (float32), each (address, bytes), on `stream_ptr`. Collective.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        py: Python<'_>,
        x: (u64, usize),
        topk_ids: (u64, usize),
        id_dtype: &str,
        topk_weights: (u64, usize),
        num_tokens: usize,
        top_k: usize,
        stream_ptr: usize,
    ) -> PyResult<GpuEpHandle> {
        let wide = wide_ids(id_dtype)?;
        let w = self.world.get();
        let d = w.run(py, |pe| {
            let g = CudaPe::new(pe)?;
            let h = w.hold(&[
                (x.0, x.1, "x"),
                (topk_ids.0, topk_ids.1, "topk_idx"),
                (topk_weights.0, topk_weights.1, "topk_weights"),
            ])?;
            let gd = h.guards();
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            let s = stream(&g, stream_ptr);
            let wv = sym(&gd[2])?.view::<f32>(h.offset(2), elems(topk_weights.1, 4, "topk_weights")?)?;
            with_buf!(b, b, T => {
                let es = std::mem::size_of::<T>();
                let xv = sym(&gd[0])?.view::<T>(h.offset(0), elems(x.1, es, "x")?)?;
                if wide {
                    let iv = sym(&gd[1])?.view::<i64>(h.offset(1), elems(topk_ids.1, 8, "topk_idx")?)?;
                    b.dispatch(pe, &s, &xv, &iv.slice(..num_tokens * top_k)?, &wv, top_k)
                } else {
                    let iv = sym(&gd[1])?.view::<i32>(h.offset(1), elems(topk_ids.1, 4, "topk_idx")?)?;
                    b.dispatch(pe, &s, &xv, &iv.slice(..num_tokens * top_k)?, &wv, top_k)
                }
            })
        })?;
        Ok(GpuEpHandle { d })
    }

    /// Combines symmetric `y` into symmetric `out` (each (address, bytes)) on `stream_ptr`:
    /// `tokens` for one row per receive row (DeepEP's combine), else expert-major rows.
    /// Collective.
    fn combine(
        &self,
        py: Python<'_>,
        handle: &GpuEpHandle,
        y: (u64, usize),
        out: (u64, usize),
        tokens: bool,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let w = self.world.get();
        let d = &handle.d;
        w.run(py, |pe| {
            let g = CudaPe::new(pe)?;
            let h = w.hold(&[(y.0, y.1, "x"), (out.0, out.1, "combined_x")])?;
            let gd = h.guards();
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            let s = stream(&g, stream_ptr);
            with_buf!(b, b, T => {
                let es = std::mem::size_of::<T>();
                let yv = sym(&gd[0])?.view::<T>(h.offset(0), elems(y.1, es, "x")?)?;
                let ov = sym(&gd[1])?.view::<T>(h.offset(1), elems(out.1, es, "combined_x")?)?;
                if tokens {
                    b.combine_tokens(pe, &s, d, &yv, &ov)
                } else {
                    b.combine(pe, &s, d, &yv, &ov)
                }
            })
        })
    }

    /// Benchmark baseline: `iters` dispatch + combine_tokens steps on symmetric operands
    /// issued by a Rust loop on `stream_ptr` (`y` one row per receive row); returns the seconds
    /// per step, the stream synchronised (the GIL released).
    #[allow(clippy::too_many_arguments)]
    fn step_loop(
        &self,
        py: Python<'_>,
        x: (u64, usize),
        topk_ids: (u64, usize),
        topk_weights: (u64, usize),
        y: (u64, usize),
        out: (u64, usize),
        num_tokens: usize,
        top_k: usize,
        stream_ptr: usize,
        iters: usize,
    ) -> PyResult<f64> {
        let w = self.world.get();
        w.run(py, |pe| {
            let g = CudaPe::new(pe)?;
            let h = w.hold(&[
                (x.0, x.1, "x"),
                (topk_ids.0, topk_ids.1, "topk_idx"),
                (topk_weights.0, topk_weights.1, "topk_weights"),
                (y.0, y.1, "y"),
                (out.0, out.1, "out"),
            ])?;
            let gd = h.guards();
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            let s = stream(&g, stream_ptr);
            let wv = sym(&gd[2])?.view::<f32>(h.offset(2), elems(topk_weights.1, 4, "w")?)?;
            let iv = sym(&gd[1])?.view::<i64>(h.offset(1), elems(topk_ids.1, 8, "ids")?)?;
            with_buf!(b, b, T => {
                let es = std::mem::size_of::<T>();
                let xv = sym(&gd[0])?.view::<T>(h.offset(0), elems(x.1, es, "x")?)?;
                let yv = sym(&gd[3])?.view::<T>(h.offset(3), elems(y.1, es, "y")?)?;
                let ov = sym(&gd[4])?.view::<T>(h.offset(4), elems(out.1, es, "out")?)?;
                s.synchronize()?;
                let t0 = std::time::Instant::now();
                for _ in 0..iters {
                    let d = b.dispatch(pe, &s, &xv, &iv.slice(..num_tokens * top_k)?, &wv, top_k)?;
                    b.combine_tokens(pe, &s, &d, &yv, &ov)?;
                }
                s.synchronize()?;
                Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
            })
        })
    }

    /// Raises errors latched on the device (capacity, invalid input, timeouts); call after
    /// synchronising.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.world.get().run(py, |pe| {
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            with_buf!(b, b, _T => b.check(pe))
        })
    }

    /// Collectively releases the buffer.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.world.get().run(py, |pe| free_buf(pe, &self.buf))
    }
}

impl GpuEp {
    fn elem_bytes(&self) -> usize {
        match self.buf.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(Hidden::F32(_)) => 4,
            Some(_) => 2,
            None => 1,
        }
    }
}

/// A view of a GPU MoE buffer's area for torch (`__cuda_array_interface__`).
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct AreaView {
    iface: Py<pyo3::types::PyDict>,
    _owner: Py<GpuEp>,
}

#[pymethods]
impl AreaView {
    #[getter]
    fn __cuda_array_interface__(&self, py: Python<'_>) -> Py<pyo3::types::PyDict> {
        self.iface.clone_ref(py)
    }
}

#[pymethods]
impl GpuEpHandle {
    #[getter]
    fn num_tokens(&self) -> usize {
        self.d.num_tokens()
    }
    #[getter]
    fn top_k(&self) -> usize {
        self.d.top_k()
    }
    /// Tokens received from each PE (normal mode; None in capturable mode or under capture).
    #[getter]
    fn recv_tokens_per_pe(&self) -> Option<Vec<usize>> {
        self.d.recv_tokens_per_pe().map(|v| v.to_vec())
    }
    /// Rows per local expert (normal mode).
    #[getter]
    fn expert_counts(&self) -> Option<Vec<usize>> {
        self.d.expert_counts().map(|v| v.to_vec())
    }
    /// Expert-major rows received (normal mode).
    #[getter]
    fn rows(&self) -> Option<usize> {
        self.d.rows()
    }
}
