//! Low-latency MoE dispatch and combine on GPUs (`rshmem::cuda::ep::LowLatencyBuffer`); the
//! Python `rshmem.ep.Buffer.low_latency_dispatch` / `low_latency_combine` stage DeepEP-style
//! tensors into the symmetric operands it takes and view its outputs without a copy.

use crate::coll::elems;
use crate::errors::invalid;
use crate::gpu::stream;
use crate::ops::sym;
use crate::world::World;
use pyo3::prelude::*;
use rshmem::cuda::ep::{
    LlCombineSent, LlConfig, LlDispatch, LlDispatchOpts, LlDispatchSent, LowLatencyBuffer,
};
use rshmem::cuda::CudaPe;
use rshmem::{Error, SymView};
use std::sync::Mutex;

/// A low-latency MoE buffer of one PE.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct GpuLlEp {
    world: Py<World>,
    buf: Mutex<Option<LowLatencyBuffer>>,
}

/// A received (or receivable) low-latency dispatch: what combine and the output views need.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct LlHandle {
    d: LlDispatch,
}

/// A send that still has to be received (the hook); taken once.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct LlPending {
    dispatch: Mutex<Option<LlDispatchSent>>,
    combine: Mutex<Option<LlCombineSent>>,
}

#[pymethods]
impl LlHandle {
    /// Tokens this PE dispatched.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.d.num_tokens()
    }
    /// The dispatch's top-k.
    #[getter]
    fn top_k(&self) -> usize {
        self.d.top_k()
    }
    /// Whether the rows travelled as FP8.
    #[getter]
    fn fp8(&self) -> bool {
        self.d.fp8()
    }
    /// The buffer half holding the outputs (0 or 1).
    #[getter]
    fn half(&self) -> usize {
        self.d.half()
    }
}

#[pymethods]
impl LlPending {
    /// The handle of a pending dispatch (its output views are filled by the receive).
    fn handle(&self) -> PyResult<LlHandle> {
        let d = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let d = d.as_ref().ok_or_else(|| crate::errors::to_py(taken()))?;
        Ok(LlHandle {
            d: d.dispatch().clone(),
        })
    }
}

/// (address, bytes) of a view on this PE's GPU.
fn area<T: rshmem::Elem>(g: &CudaPe<'_>, v: &SymView<'_, T>) -> rshmem::Result<(u64, usize)> {
    Ok((g.ptr(v)?, v.len() * std::mem::size_of::<T>()))
}

fn taken() -> Error {
    Error::InvalidArgument("ep low latency: this hook was already called".into())
}

impl GpuLlEp {
    /// Runs `f` with the PE, its CUDA side and the buffer, the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl for<'a> FnOnce(&'a rshmem::Pe, CudaPe<'a>, &LowLatencyBuffer) -> rshmem::Result<R>
            + Send,
    ) -> PyResult<R> {
        self.world.get().run(py, |pe| {
            let g = CudaPe::new(pe)?;
            let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let b = b.as_ref().ok_or(Error::WorldEnded)?;
            f(pe, g, b)
        })
    }
}

#[pymethods]
impl GpuLlEp {
    /// Collectively creates the buffer for the world team (every PE the same arguments).
    #[new]
    fn new(
        py: Python<'_>,
        world: Py<World>,
        max_tokens: usize,
        hidden: usize,
        num_experts: usize,
        max_topk: usize,
    ) -> PyResult<GpuLlEp> {
        let cfg = LlConfig::new(max_tokens, hidden, num_experts, max_topk);
        let buf = world.get().run(py, move |pe| {
            LowLatencyBuffer::new(pe, pe.world_team(), cfg, &[])
        })?;
        Ok(GpuLlEp {
            world,
            buf: Mutex::new(Some(buf)),
        })
    }

    /// Bytes of symmetric heap a buffer of this shape takes on each of `n_pes` PEs.
    #[staticmethod]
    fn bytes_for(
        max_tokens: usize,
        hidden: usize,
        num_experts: usize,
        max_topk: usize,
        n_pes: usize,
    ) -> PyResult<usize> {
        let cfg = LlConfig::new(max_tokens, hidden, num_experts, max_topk);
        LowLatencyBuffer::bytes_for(&cfg, n_pes).map_err(crate::errors::to_py)
    }

    /// Queues the send of `num_tokens` tokens of symmetric `x` (bf16) and `topk_ids`
    /// (`id_dtype` int32/int64), each (address, bytes), on `stream_ptr`; returns the pending
    /// receive. Collective.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_send(
        &self,
        py: Python<'_>,
        x: (u64, usize),
        topk_ids: (u64, usize),
        id_dtype: &str,
        num_tokens: usize,
        top_k: usize,
        fp8: bool,
        stream_ptr: usize,
    ) -> PyResult<LlPending> {
        let wide = match id_dtype {
            "int64" => true,
            "int32" => false,
            d => return Err(invalid(format!("topk_idx must be int64 or int32, not {d}"))),
        };
        let w = self.world.get();
        let sent = self.with(py, |pe, g, b| {
            let h = w.hold(&[(x.0, x.1, "x"), (topk_ids.0, topk_ids.1, "topk_idx")])?;
            let gd = h.guards();
            let s = stream(&g, stream_ptr);
            let opts = LlDispatchOpts { fp8 };
            let xv = sym(&gd[0])?.view::<rshmem::bf16>(h.offset(0), elems(x.1, 2, "x")?)?;
            let n = num_tokens * top_k;
            if wide {
                let iv =
                    sym(&gd[1])?.view::<i64>(h.offset(1), elems(topk_ids.1, 8, "topk_idx")?)?;
                b.dispatch_send(pe, &s, &xv, &iv.slice(..n)?, top_k, opts)
            } else {
                let iv =
                    sym(&gd[1])?.view::<i32>(h.offset(1), elems(topk_ids.1, 4, "topk_idx")?)?;
                b.dispatch_send(pe, &s, &xv, &iv.slice(..n)?, top_k, opts)
            }
        })?;
        Ok(LlPending {
            dispatch: Mutex::new(Some(sent)),
            combine: Mutex::new(None),
        })
    }

    /// Queues the receive of a pending dispatch on `stream_ptr` (once).
    fn dispatch_recv(
        &self,
        py: Python<'_>,
        pending: &LlPending,
        stream_ptr: usize,
    ) -> PyResult<LlHandle> {
        let sent = pending
            .dispatch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let d = self.with(py, |pe, g, b| {
            let sent = sent.ok_or_else(taken)?;
            b.dispatch_recv(pe, &stream(&g, stream_ptr), sent)
        })?;
        Ok(LlHandle { d })
    }

    /// (address, bytes) of dispatch `handle`'s outputs on this GPU: the rows (bf16, or e4m3
    /// bytes), the FP8 scales (else (0, 0)), the per-expert counts, sources and layout.
    #[allow(clippy::type_complexity)]
    fn areas(
        &self,
        py: Python<'_>,
        handle: &LlHandle,
    ) -> PyResult<(
        (u64, usize),
        (u64, usize),
        (u64, usize),
        (u64, usize),
        (u64, usize),
    )> {
        let d = &handle.d;
        self.with(py, |_, g, b| {
            let (x, scales) = if d.fp8() {
                let (x, s) = b.recv_x_fp8(d)?;
                (area(&g, &x)?, area(&g, &s)?)
            } else {
                (area(&g, &b.recv_x(d)?)?, (0, 0))
            };
            Ok((
                x,
                scales,
                area(&g, &b.recv_count(d)?)?,
                area(&g, &b.recv_src(d)?)?,
                area(&g, &b.recv_layout(d)?)?,
            ))
        })
    }

    /// Queues the send of symmetric expert outputs `y` (bf16 `[L, n*M, H]`, (address, bytes))
    /// of dispatch `handle` on `stream_ptr`; returns the pending receive. Collective.
    fn combine_send(
        &self,
        py: Python<'_>,
        handle: &LlHandle,
        y: (u64, usize),
        stream_ptr: usize,
    ) -> PyResult<LlPending> {
        let w = self.world.get();
        let sent = self.with(py, |pe, g, b| {
            let h = w.hold(&[(y.0, y.1, "x")])?;
            let gd = h.guards();
            let yv = sym(&gd[0])?.view::<rshmem::bf16>(h.offset(0), elems(y.1, 2, "x")?)?;
            b.combine_send(pe, &stream(&g, stream_ptr), &handle.d, &yv)
        })?;
        Ok(LlPending {
            dispatch: Mutex::new(None),
            combine: Mutex::new(Some(sent)),
        })
    }

    /// Queues the receive of a pending combine on `stream_ptr` (once): symmetric
    /// `topk_weights` (f32) and `out` (bf16 `[T, H]`), each (address, bytes).
    fn combine_recv(
        &self,
        py: Python<'_>,
        pending: &LlPending,
        topk_weights: (u64, usize),
        out: (u64, usize),
        stream_ptr: usize,
    ) -> PyResult<()> {
        let sent = pending
            .combine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let w = self.world.get();
        self.with(py, |pe, g, b| {
            let sent = sent.ok_or_else(taken)?;
            let h = w.hold(&[
                (topk_weights.0, topk_weights.1, "topk_weights"),
                (out.0, out.1, "combined_x"),
            ])?;
            let gd = h.guards();
            let wv = sym(&gd[0])?.view::<f32>(h.offset(0), elems(topk_weights.1, 4, "w")?)?;
            let ov = sym(&gd[1])?.view::<rshmem::bf16>(h.offset(1), elems(out.1, 2, "out")?)?;
            b.combine_recv(pe, &stream(&g, stream_ptr), sent, &wv, &ov)
        })
    }

    /// Local experts (`L`) and rows per expert (`n * max_tokens`).
    fn shape(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        self.with(py, |_, _, b| Ok((b.local_experts(), b.expert_rows())))
    }

    /// Bytes of symmetric heap this buffer takes.
    fn bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |_, _, b| Ok(b.bytes()))
    }

    /// Raises errors latched on the device (invalid ids, timeouts); call after synchronising.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |pe, _, b| b.check(pe))
    }

    /// Collectively releases the buffer.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.world.get().run(py, |pe| {
            match self.buf.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(b) => pe.free(b),
                None => Err(Error::InvalidArgument("ep buffer already freed".into())),
            }
        })
    }
}
