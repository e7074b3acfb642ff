//! The CUDA side: stream-ordered one-sided operations, barriers and collectives on the
//! caller's stream (torch's current stream), and user kernels compiled with the device header.
//! Every operand is a symmetric tensor of this PE's GPU heap.

use crate::coll::elems;
use crate::elem::{kind, reduce_op, with_elem};
use crate::errors::{invalid, IntoPy};
use crate::ops::{cmp_of, signal_op, sym};
use crate::world::{Live, World};
use pyo3::prelude::*;
use rshmem::coll::{AllToAllV, CollConfig, ToRoot};
use rshmem::cuda::{CollTuning, CudaPe, DeviceCounts, GpuColl, Kernel, KernelArg, Stream};
use rshmem::{Error, Pe, Signal, SymView};
use std::sync::MutexGuard;

/// Per-PE CUDA state that borrows the PE (made by the first GPU collective: collective).
pub(crate) struct GpuSide<'a> {
    pub(crate) coll: GpuColl<'a>,
}

/// The caller's `CUstream` wrapped for `g`'s GPU.
pub(crate) fn stream(g: &CudaPe<'_>, raw: usize) -> Stream {
    // SAFETY: the Python layer passes torch's stream of this PE's device (it checks the
    // device), alive for the call; the wrapper does not destroy it.
    unsafe { g.stream_from_raw(raw as *mut std::ffi::c_void) }
}

impl World {
    /// Runs `f` with the PE, its CUDA side and its GPU collectives (made on first use), the
    /// GIL released.
    fn run_gpu<R: Send>(
        &self,
        py: Python<'_>,
        f: impl for<'a> FnOnce(&'a Pe, CudaPe<'a>, &GpuColl<'a>) -> rshmem::Result<R> + Send,
    ) -> PyResult<R> {
        self.run_live(py, |live: &Live| {
            live.with_dependent(|pe, deps| {
                let g = CudaPe::new(pe)?;
                let mut side: MutexGuard<'_, Option<GpuSide<'_>>> =
                    deps.gpu.lock().unwrap_or_else(|e| e.into_inner());
                if side.is_none() {
                    let coll = GpuColl::new(g, CollConfig::from_env()?, CollTuning::from_env()?)?;
                    *side = Some(GpuSide { coll });
                }
                let s = side.as_ref().ok_or(Error::WorldEnded)?;
                f(pe, g, &s.coll)
            })
        })
    }

    /// Runs `f` with this PE's byte views of symmetric `dst` and `src` (`nbytes` each), the
    /// allocations held against a concurrent free for the duration.
    pub(crate) fn with_views<R>(
        &self,
        dst: u64,
        src: u64,
        nbytes: usize,
        f: impl FnOnce(&SymView<'_, u8>, &SymView<'_, u8>) -> rshmem::Result<R>,
    ) -> rshmem::Result<R> {
        let h = self.hold(&[(dst, nbytes, "destination"), (src, nbytes, "source")])?;
        let gd = h.guards();
        let d = sym(&gd[0])?.view::<u8>(h.offset(0), nbytes)?;
        let s = sym(&gd[1])?.view::<u8>(h.offset(1), nbytes)?;
        f(&d, &s)
    }

    /// As [`with_views`](Self::with_views), with the first word of the symmetric `u64` at `sig`
    /// as well (a put-with-signal's operands).
    pub(crate) fn with_signal_views<R>(
        &self,
        (dst, src, nbytes): (u64, u64, usize),
        sig: u64,
        f: impl FnOnce(&SymView<'_, u8>, &SymView<'_, u8>, &SymView<'_, u64>) -> rshmem::Result<R>,
    ) -> rshmem::Result<R> {
        let h = self.hold(&[
            (dst, nbytes, "destination"),
            (src, nbytes, "source"),
            (sig, 8, "signal"),
        ])?;
        let gd = h.guards();
        let d = sym(&gd[0])?.view::<u8>(h.offset(0), nbytes)?;
        let s = sym(&gd[1])?.view::<u8>(h.offset(1), nbytes)?;
        let sv = sym(&gd[2])?.view::<u64>(h.offset(2), 1)?;
        f(&d, &s, &sv)
    }

    /// Runs `f`, which only enqueues work on a stream (it never waits for a peer), with the
    /// PE's CUDA side: the GIL is kept where this process has no other PE (releasing and
    /// taking it back is a good part of such a call's cost from Python), else released (a
    /// stream whose queue is full blocks the call, and a thread-PE that the stream waits for
    /// may need the GIL to get there).
    fn enqueue_cuda<R: Send>(
        &self,
        py: Python<'_>,
        f: impl for<'a> FnOnce(&'a Pe, CudaPe<'a>) -> rshmem::Result<R> + Send,
    ) -> PyResult<R> {
        if !crate::world::only_pe_in_process() {
            return self.run_cuda(py, f);
        }
        let l = self.live().py()?;
        let pe = l.get().borrow_owner();
        CudaPe::new(pe).and_then(|g| f(pe, g)).py()
    }

    /// Runs `f` with the PE's CUDA side only (no collectives made), the GIL released.
    pub(crate) fn run_cuda<R: Send>(
        &self,
        py: Python<'_>,
        f: impl for<'a> FnOnce(&'a Pe, CudaPe<'a>) -> rshmem::Result<R> + Send,
    ) -> PyResult<R> {
        self.run(py, |pe| f(pe, CudaPe::new(pe)?))
    }
}

/// A user kernel loaded on one PE's GPU.
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct UserKernel {
    k: Kernel,
}

#[pymethods]
impl World {
    /// Stream-ordered put of `nbytes` from this PE's symmetric `src` into PE `pe`'s `dst`.
    pub(crate) fn put_dev(
        &self,
        py: Python<'_>,
        dst: u64,
        src: u64,
        nbytes: usize,
        pe: usize,
        stream_ptr: usize,
    ) -> PyResult<()> {
        self.enqueue_cuda(py, |_, g| {
            self.with_views(dst, src, nbytes, |d, s| {
                g.put_on_stream(&stream(&g, stream_ptr), d, s, pe)
            })
        })
    }

    /// Stream-ordered get of `nbytes` of PE `pe`'s symmetric `src` into this PE's `dst`.
    pub(crate) fn get_dev(
        &self,
        py: Python<'_>,
        dst: u64,
        src: u64,
        nbytes: usize,
        pe: usize,
        stream_ptr: usize,
    ) -> PyResult<()> {
        self.enqueue_cuda(py, |_, g| {
            self.with_views(dst, src, nbytes, |d, s| {
                g.get_on_stream(&stream(&g, stream_ptr), d, s, pe)
            })
        })
    }

    /// Stream-ordered put with signal (`nbytes` may be 0: a signal alone).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_signal_dev(
        &self,
        py: Python<'_>,
        dst: u64,
        src: u64,
        nbytes: usize,
        sig: u64,
        value: u64,
        op: &str,
        pe: usize,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let op = signal_op(op)?;
        self.enqueue_cuda(py, |_, g| {
            let st = stream(&g, stream_ptr);
            self.with_signal_views((dst, src, nbytes), sig, |d, s, sv| {
                g.put_signal_on_stream(&st, d, s, Signal::new(sv, 0, value, op), pe)
            })
        })
    }

    /// Stream-ordered wait until this PE's symmetric `u64` at `sig` compares true with `value`.
    pub(crate) fn wait_until_dev(
        &self,
        py: Python<'_>,
        sig: u64,
        cmp: &str,
        value: u64,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let c = cmp_of(cmp)?;
        self.enqueue_cuda(py, |_, g| {
            let h = self.hold(&[(sig, 8, "signal")])?;
            let gd = h.guards();
            let sv = sym(&gd[0])?.view::<u64>(h.offset(0), 1)?;
            g.wait_until_on_stream(&stream(&g, stream_ptr), &sv, 0, c, value)
        })
    }

    /// Stream-ordered barrier of every PE.
    pub(crate) fn barrier_dev(&self, py: Python<'_>, stream_ptr: usize) -> PyResult<()> {
        self.enqueue_cuda(py, |_, g| g.barrier_on_stream(&stream(&g, stream_ptr)))
    }

    /// Stream-ordered quiet.
    pub(crate) fn quiet_dev(&self, py: Python<'_>, stream_ptr: usize) -> PyResult<()> {
        self.enqueue_cuda(py, |_, g| g.quiet_on_stream(&stream(&g, stream_ptr)))
    }

    /// Device-side errors (wait timeouts, collective mismatches) recorded so far, raised.
    fn check_errors_dev(&self, py: Python<'_>) -> PyResult<()> {
        self.run_live(py, |live| {
            live.with_dependent(|pe, deps| {
                CudaPe::new(pe)?.check_device_errors()?;
                let side = deps.gpu.lock().unwrap_or_else(|e| e.into_inner());
                match side.as_ref() {
                    Some(s) => s.coll.check_errors(),
                    None => Ok(()),
                }
            })
        })
    }

    /// A GPU collective over the world on `stream_ptr` (see `World.collective`).
    #[pyo3(signature = (kind_name, dtype, dst, dst_bytes, src, src_bytes, count, op, root, stream_ptr))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn collective_dev(
        &self,
        py: Python<'_>,
        kind_name: &str,
        dtype: &str,
        dst: u64,
        dst_bytes: usize,
        src: u64,
        src_bytes: usize,
        count: usize,
        op: Option<&str>,
        root: usize,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let k = kind(dtype)?;
        let op = op.map(reduce_op).transpose()?;
        let kind_name = kind_name.to_string();
        with_elem!(k, T => self.run_gpu(py, move |pe, g, c| {
            self.with_io_views::<T, _>((dst, dst_bytes), (src, src_bytes), |dv, sv| {
            let s = stream(&g, stream_ptr);
            let team = pe.world_team();
            let need_op = || {
                op.ok_or_else(|| Error::InvalidArgument(format!("{kind_name} needs an op")))
            };
            match kind_name.as_str() {
                "broadcast" => c.broadcast(&s, team, dv, sv, count, root),
                "reduce" => c.reduce(&s, team, dv, sv, count, ToRoot { op: need_op()?, root }),
                "all_reduce" => c.all_reduce(&s, team, dv, sv, count, need_op()?),
                "all_gather" => c.all_gather(&s, team, dv, sv, count),
                "reduce_scatter" => c.reduce_scatter(&s, team, dv, sv, count, need_op()?),
                "all_to_all" => c.all_to_all(&s, team, dv, sv, count),
                "barrier" => c.barrier(&s, team),
                o => Err(Error::InvalidArgument(format!("unknown collective {o:?}"))),
            }
            })
        }))
    }

    /// GPU all_to_all_v with host counts (elements).
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v_dev(
        &self,
        py: Python<'_>,
        dtype: &str,
        dst: u64,
        dst_bytes: usize,
        src: u64,
        src_bytes: usize,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let k = kind(dtype)?;
        with_elem!(k, T => self.run_gpu(py, move |pe, g, c| {
            self.with_io_views::<T, _>((dst, dst_bytes), (src, src_bytes), |dv, sv| {
            let v = AllToAllV {
                send_counts: &send_counts,
                send_displs: &send_displs,
                recv_counts: &recv_counts,
                recv_displs: &recv_displs,
            };
            c.all_to_all_v(&stream(&g, stream_ptr), pe.world_team(), dv, sv, &v)
            })
        }))
    }

    /// GPU all_to_all_v with the counts on the device: symmetric `u64[n_pes]` send and
    /// receive counts (elements), packed in PE order; capturable.
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v_device(
        &self,
        py: Python<'_>,
        dtype: &str,
        dst: u64,
        dst_bytes: usize,
        src: u64,
        src_bytes: usize,
        send_counts: u64,
        recv_counts: u64,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let k = kind(dtype)?;
        let n = self.n_pes_usize();
        with_elem!(k, T => self.run_gpu(py, move |pe, g, c| {
            let es = std::mem::size_of::<T>();
            let h = self.hold(&[
                (dst, dst_bytes, "output"),
                (src, src_bytes, "input"),
                (send_counts, 8 * n, "input split sizes"),
                (recv_counts, 8 * n, "output split sizes"),
            ])?;
            let gd = h.guards();
            let dv = sym(&gd[0])?.view::<T>(h.offset(0), elems(dst_bytes, es, "output")?)?;
            let sv = sym(&gd[1])?.view::<T>(h.offset(1), elems(src_bytes, es, "input")?)?;
            let sc = sym(&gd[2])?.view::<u64>(h.offset(2), n)?;
            let rc = sym(&gd[3])?.view::<u64>(h.offset(3), n)?;
            c.all_to_all_v_device(
                &stream(&g, stream_ptr),
                pe.world_team(),
                &dv,
                &sv,
                DeviceCounts { send: &sc, recv: &rc },
            )
        }))
    }

    /// Compiles `source` (CUDA C++; the rshmem device header is prepended) with NVRTC for this
    /// PE's GPU and loads kernel `name`. Collective in effect: every PE loads its kernels
    /// before any launches one that waits for peers. The GIL is released.
    #[pyo3(signature = (source, name, options=Vec::new()))]
    fn kernel(
        &self,
        py: Python<'_>,
        source: String,
        name: String,
        options: Vec<String>,
    ) -> PyResult<UserKernel> {
        self.run_cuda(py, move |_, g| {
            let o: Vec<&str> = options.iter().map(|s| s.as_str()).collect();
            Ok(UserKernel {
                k: g.kernel(&source, &name, &o)?,
            })
        })
    }

    /// Launches `kernel` on `stream_ptr` with `args`: (type, value) pairs, type one of i32,
    /// u32, i64, u64, f32, f64, ptr. Pointer arguments must be symmetric tensors of this PE or
    /// device memory of its GPU the kernel may use as it does: like any raw kernel launch,
    /// the arguments must match the kernel's parameters.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: &UserKernel,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: Vec<(String, Bound<'_, PyAny>)>,
        stream_ptr: usize,
    ) -> PyResult<()> {
        let mut a = Vec::with_capacity(args.len());
        for (t, v) in &args {
            a.push(match t.as_str() {
                "i32" => KernelArg::I32(v.extract()?),
                "u32" => KernelArg::U32(v.extract()?),
                "i64" => KernelArg::I64(v.extract()?),
                "u64" => KernelArg::U64(v.extract()?),
                "f32" => KernelArg::F32(v.extract()?),
                "f64" => KernelArg::F64(v.extract()?),
                "ptr" => KernelArg::Ptr(v.extract()?),
                o => return Err(invalid(format!("kernel argument type {o:?}"))),
            });
        }
        let k = kernel.k.clone();
        self.run_cuda(py, move |_, g| {
            // SAFETY: the argument list is the caller's description of the kernel's
            // parameters (as with cupy's RawKernel); rshmem checks the grid, the block and
            // the stream's GPU.
            unsafe { g.launch(&k, &stream(&g, stream_ptr), grid, block, shared_bytes, &a) }
        })
    }
}

impl World {
    fn n_pes_usize(&self) -> usize {
        self.live()
            .map(|l| l.get().borrow_owner().n_pes())
            .unwrap_or(0)
    }
}
