//! CUDA events on a stream's GPU, and making a PE's context current for interoperation.

use super::{CudaPe, Stream};
use crate::backend::cuda::ffi::{self, cu};
use crate::backend::cuda::gpu::{CtxGuard, Gpu};
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::sync::Arc;

/// A CUDA event of one GPU (`cuEventCreate`, timing enabled), destroyed on drop: record it on
/// a stream, wait for it, and measure the GPU time between two recorded events.
///
/// ```no_run
/// # fn f(g: &rshmem::cuda::CudaPe, s: &rshmem::cuda::Stream) -> rshmem::Result<()> {
/// use rshmem::cuda::Event;
/// let (start, end) = (Event::new(s)?, Event::new(s)?);
/// start.record(s)?;
/// g.barrier_on_stream(s)?;
/// end.record(s)?;
/// end.synchronize()?;
/// println!("barrier: {:.1} us", start.elapsed_ms(&end)? * 1e3);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    gpu: Arc<Gpu>,
    ev: cu::CUevent,
}

// SAFETY: event handles may be used from any thread; the driver serialises calls on them.
unsafe impl Send for Event {}
// SAFETY: as for Send.
unsafe impl Sync for Event {}

impl Event {
    /// A new event on the GPU of stream `s`.
    pub fn new(s: &Stream) -> Result<Event> {
        let gpu = s.raw.gpu.clone();
        let _g = gpu.bind()?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: creates an event in the context bound above; writes one handle.
        ffi::check(unsafe { cu::cuEventCreate(&mut ev, 0) }, "cuEventCreate")?;
        Ok(Event { gpu, ev })
    }

    /// Records the event on `s` (a stream of the same GPU): it completes when the work queued
    /// on `s` before it has.
    pub fn record(&self, s: &Stream) -> Result<()> {
        if s.raw.gpu.ordinal != self.gpu.ordinal {
            return Err(Error::invalid("event and stream are on different GPUs"));
        }
        let _g = self.gpu.bind()?;
        // SAFETY: a live event and a live stream of the same context.
        ffi::check(
            unsafe { cu::cuEventRecord(self.ev, s.raw.raw) },
            "cuEventRecord",
        )
    }

    /// Waits on the host until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.gpu.bind()?;
        // SAFETY: a live event.
        ffi::check(
            unsafe { cu::cuEventSynchronize(self.ev) },
            "cuEventSynchronize",
        )
    }

    /// Milliseconds of GPU time from this event to `end`, both recorded and complete
    /// (`cuEventElapsedTime`: a resolution of about half a microsecond).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if end.gpu.ordinal != self.gpu.ordinal {
            return Err(Error::invalid("events of different GPUs"));
        }
        let _g = self.gpu.bind()?;
        let mut ms = 0f32;
        // SAFETY: two live events of one context; writes one float (an error when either has
        // not completed).
        ffi::check(
            unsafe { cu::cuEventElapsedTime_v2(&mut ms, self.ev, end.ev) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: destroyed once, in its context.
            unsafe { cu::cuEventDestroy_v2(self.ev) };
        }
    }
}

/// Keeps a PE's CUDA context current on the calling thread until dropped
/// ([`CudaPe::make_current`]); the previous one returns then. Not `Send`: it belongs to the
/// thread that made it.
#[derive(Debug)]
pub struct ContextGuard {
    _ctx: CtxGuard,
    _thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for CtxGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CtxGuard")
    }
}

impl CudaPe<'_> {
    /// Makes this PE's CUDA context (its GPU's primary context) current on the calling thread
    /// until the guard drops. rshmem binds its context around each of its own calls and needs
    /// none of this; it is for libraries that take the device from the current context, such
    /// as NCCL (`ncclCommInitRank` joins the current device) or cuBLAS, called with
    /// [`Stream::raw`] streams.
    pub fn make_current(&self) -> Result<ContextGuard> {
        Ok(ContextGuard {
            _ctx: self.backend().gpu.bind()?,
            _thread: PhantomData,
        })
    }
}
