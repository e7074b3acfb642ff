//! Benchmark baselines for `bench/bench.py`: host operations issued by a Rust loop, each
//! iteration the native half of the Python call (locate the symmetric operands in the
//! registry, then the library call), so that Python's time per call minus this loop's is what
//! the Python side adds.

use crate::errors::invalid;
use crate::gpu::stream;
use crate::ops::{sym, HostBytes};
use crate::world::World;
use pyo3::prelude::*;
use rshmem::coll::ReduceOp;
use rshmem::{Cmp, Signal, SignalOp};
use std::time::Instant;

#[pymethods]
impl World {
    /// `iters` host calls of `op` from a Rust loop; returns the seconds per call (the GIL
    /// released). `op`: `put` (host `src` into symmetric `dst`, `nbytes`), `get` (symmetric
    /// `src` into host `dst`), `put_signal` (as put, then set the symmetric `u64` at `sig`),
    /// `wait_until` (the symmetric `int64` at `dst` >= 0, true at once), `barrier`,
    /// `all_reduce` (float32 sum of the symmetric `nbytes` at `dst`, in place), `fence`, `quiet`.
    #[pyo3(signature = (op, iters, dst=0, src=0, nbytes=0, sig=0, pe=0))]
    #[allow(clippy::too_many_arguments)]
    fn op_loop(
        &self,
        py: Python<'_>,
        op: &str,
        iters: usize,
        dst: u64,
        src: u64,
        nbytes: usize,
        sig: u64,
        pe: usize,
    ) -> PyResult<f64> {
        if !matches!(
            op,
            "put"
                | "get"
                | "put_signal"
                | "wait_until"
                | "barrier"
                | "all_reduce"
                | "fence"
                | "quiet"
        ) {
            return Err(invalid(format!("op_loop: unknown op {op:?}")));
        }
        // The host operand of a put (`src`) or get (`dst`), held by the caller.
        let host = match op {
            "put" | "put_signal" => HostBytes::new(src as usize, nbytes)?,
            "get" => HostBytes::new(dst as usize, nbytes)?,
            _ => HostBytes::new(0, 0)?,
        };
        self.run_live(py, |live| {
            let p = live.borrow_owner();
            let t0 = Instant::now();
            for _ in 0..iters {
                match op {
                    "put" => {
                        let h = self.hold(&[(dst, nbytes, "destination")])?;
                        let g = h.guards();
                        let v = sym(&g[0])?.view::<u8>(h.offset(0), nbytes)?;
                        // SAFETY: the caller holds the host array for the loop.
                        p.put(&v, 0, unsafe { host.bytes() }, pe)?;
                    }
                    "get" => {
                        let h = self.hold(&[(src, nbytes, "source")])?;
                        let g = h.guards();
                        let v = sym(&g[0])?.view::<u8>(h.offset(0), nbytes)?;
                        // SAFETY: the caller holds the writable host array for the loop.
                        p.get(&v, 0, unsafe { host.bytes_mut() }, pe)?;
                    }
                    "put_signal" => {
                        let h = self.hold(&[(dst, nbytes, "destination"), (sig, 8, "signal")])?;
                        let g = h.guards();
                        let v = sym(&g[0])?.view::<u8>(h.offset(0), nbytes)?;
                        let s = sym(&g[1])?.view::<u64>(h.offset(1), 1)?;
                        // SAFETY: the caller holds the host array for the loop.
                        let b = unsafe { host.bytes() };
                        p.put_signal(&v, 0, b, Signal::new(&s, 0, 1, SignalOp::Set), pe)?;
                    }
                    "wait_until" => {
                        let h = self.hold(&[(dst, 8, "wait target")])?;
                        let g = h.guards();
                        let w = sym(&g[0])?.view::<i64>(h.offset(0), 1)?;
                        p.wait_until_timeout(&w, 0, Cmp::Ge, 0, p.config().timeout)?;
                    }
                    "barrier" => p.barrier_all()?,
                    "all_reduce" => {
                        let h = self.hold(&[(dst, nbytes, "output")])?;
                        let g = h.guards();
                        let v = sym(&g[0])?.view::<f32>(h.offset(0), nbytes / 4)?;
                        live.with_dependent(|_, deps| {
                            let c = deps.coll.lock().unwrap_or_else(|e| e.into_inner());
                            c.all_reduce(p.world_team(), &v, &v, nbytes / 4, ReduceOp::Sum)
                        })?;
                    }
                    "fence" => p.fence(),
                    _ => p.quiet()?,
                }
            }
            Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
        })
    }

    /// `iters` stream-ordered calls of `op` on `stream_ptr` from a Rust loop; returns the host
    /// seconds per call (the GIL released). `op`: `put` (symmetric `src` into `dst`, `nbytes`),
    /// `get`, `put_signal` (as put, then set the `u64` at `sig`), `wait_until` (the `u64` at
    /// `sig` >= 0), `quiet`.
    #[pyo3(signature = (op, iters, stream_ptr, dst=0, src=0, nbytes=0, sig=0, pe=0))]
    #[allow(clippy::too_many_arguments)]
    fn op_dev_loop(
        &self,
        py: Python<'_>,
        op: &str,
        iters: usize,
        stream_ptr: usize,
        dst: u64,
        src: u64,
        nbytes: usize,
        sig: u64,
        pe: usize,
    ) -> PyResult<f64> {
        if !matches!(op, "put" | "get" | "put_signal" | "wait_until" | "quiet") {
            return Err(invalid(format!("op_dev_loop: unknown op {op:?}")));
        }
        self.run_cuda(py, |_, g| {
            let st = stream(&g, stream_ptr);
            let t0 = Instant::now();
            for _ in 0..iters {
                match op {
                    "put" => {
                        self.with_views(dst, src, nbytes, |d, s| g.put_on_stream(&st, d, s, pe))?
                    }
                    "get" => {
                        self.with_views(dst, src, nbytes, |d, s| g.get_on_stream(&st, d, s, pe))?
                    }
                    "put_signal" => {
                        self.with_signal_views((dst, src, nbytes), sig, |d, s, sv| {
                            let signal = Signal::new(sv, 0, 1, SignalOp::Set);
                            g.put_signal_on_stream(&st, d, s, signal, pe)
                        })?;
                    }
                    "wait_until" => {
                        let h = self.hold(&[(sig, 8, "signal")])?;
                        let gd = h.guards();
                        let sv = sym(&gd[0])?.view::<u64>(h.offset(0), 1)?;
                        g.wait_until_on_stream(&st, &sv, 0, Cmp::Ge, 0)?;
                    }
                    _ => g.quiet_on_stream(&st)?,
                }
            }
            Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
        })
    }
}
