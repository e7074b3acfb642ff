//! The public CUDA API: stream-ordered operations, CUDA graphs, and kernels compiled by NVRTC
//! with the rshmem device header.

mod event;

pub use event::{ContextGuard, Event};

use crate::backend::cuda::gpu::{self, Func, Module, RawStream};
use crate::backend::cuda::remote::{RingRequest, RingSignal};
use crate::backend::cuda::{ffi, nvrtc, set_state, CudaBackend};
use crate::elem::{Cmp, Elem, SignalOp};
use crate::error::{Error, Result};
use crate::sym::{AsSym, RawSym, Signal};
use crate::team::Team;
use crate::Pe;
use std::collections::HashMap;
use std::sync::Arc;

/// The CUDA side of a PE: its GPU, stream-ordered operations and device kernels.
///
/// ```no_run
/// # fn f(pe: &rshmem::Pe) -> rshmem::Result<()> {
/// let gpu = rshmem::cuda::CudaPe::new(pe)?;
/// let x = pe.alloc::<f32>(1024)?;
/// let s = gpu.stream()?;
/// let peer = (pe.my_pe() + 1) % pe.n_pes();
/// gpu.put_on_stream(&s, &x, &x, peer)?;  // my copy → the peer's, copy engine
/// gpu.barrier_on_stream(&s)?;
/// s.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CudaPe<'a> {
    pe: &'a Pe,
    b: &'a CudaBackend,
}

impl<'a> CudaPe<'a> {
    pub(crate) fn backend(&self) -> &'a CudaBackend {
        self.b
    }
    pub(crate) fn pe_ref(&self) -> &'a Pe {
        self.pe
    }
    pub(crate) fn check_stream_pub(&self, s: &Stream) -> Result<()> {
        self.check_stream(s)
    }

    // for tests/cuda_fabric_ep.rs: whether a step that timed out left requests in the ring.
    /// Requests kernels and streams of this PE posted to its proxy ring, and how many the proxy
    /// completed (`None` in a world on one node). A diagnostic hook, not part of the API.
    #[doc(hidden)]
    pub fn proxy_ring_counts(&self) -> Result<Option<(u64, u64)>> {
        self.b.ring_counts()
    }
}

/// A CUDA stream: owned by rshmem or wrapping the caller's `CUstream`.
#[derive(Debug)]
pub struct Stream {
    pub(crate) raw: RawStream,
    backend_gpu: usize,
}

/// A captured and instantiated CUDA graph.
#[derive(Debug)]
pub struct Graph {
    gpu: Arc<gpu::Gpu>,
    graph: ffi::cu::CUgraph,
    exec: ffi::cu::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread.
unsafe impl Send for Graph {}
// SAFETY: as for Send; launches are serialised by the driver.
unsafe impl Sync for Graph {}

/// A kernel compiled with the device header and loaded on one PE's GPU (with its device state).
#[derive(Debug, Clone)]
pub struct Kernel {
    pub(crate) module: Arc<Module>,
    func: Func,
    name: String,
}

/// A team as kernels see it (`rshmem_team` in the header): strided world PEs and a barrier slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTeam {
    /// Barrier slot.
    pub slot: i32,
    /// This PE's index in the team.
    pub my_index: i32,
    /// Number of members.
    pub size: i32,
    /// First member (world index).
    pub start: i32,
    /// Distance between members.
    pub stride: i32,
}

impl DeviceTeam {
    /// Threads of a one-block barrier kernel for this team: a thread per member (whole warps)
    /// up to the 1024 a block may have (the barrier loops over the members beyond that).
    pub(crate) fn sync_threads(&self) -> u32 {
        sync_block_threads(self.size.max(1) as usize)
    }
}

/// Threads of a one-block barrier of `members` PEs: whole warps, at most 1024 (a launch of
/// more fails; the device barrier strides over the members).
pub(crate) fn sync_block_threads(members: usize) -> u32 {
    (members.clamp(1, 1024) as u32).div_ceil(32) * 32
}

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub enum KernelArg {
    /// `int`
    I32(i32),
    /// `unsigned`
    U32(u32),
    /// `long long`
    I64(i64),
    /// `unsigned long long` / `size_t`
    U64(u64),
    /// `float`
    F32(f32),
    /// `double`
    F64(f64),
    /// A device pointer (e.g. [`CudaPe::ptr`] of a symmetric object).
    Ptr(u64),
    /// `rshmem_team` by value.
    Team(DeviceTeam),
}

impl KernelArg {
    fn bytes(&self) -> Vec<u8> {
        match *self {
            KernelArg::I32(v) => v.to_le_bytes().to_vec(),
            KernelArg::U32(v) => v.to_le_bytes().to_vec(),
            KernelArg::I64(v) => v.to_le_bytes().to_vec(),
            KernelArg::U64(v) | KernelArg::Ptr(v) => v.to_le_bytes().to_vec(),
            KernelArg::F32(v) => v.to_le_bytes().to_vec(),
            KernelArg::F64(v) => v.to_le_bytes().to_vec(),
            KernelArg::Team(t) => [t.slot, t.my_index, t.size, t.start, t.stride]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        }
    }
}

impl Stream {
    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.raw.sync()
    }
    /// The raw `CUstream`.
    pub fn raw(&self) -> *mut std::ffi::c_void {
        self.raw.raw as *mut _
    }
    /// GPU ordinal of the stream.
    pub fn device(&self) -> usize {
        self.backend_gpu
    }
    /// Whether everything queued on the stream has finished (`cuStreamQuery`); an error of that
    /// work is returned.
    pub(crate) fn idle(&self) -> Result<bool> {
        let _g = self.raw.gpu.bind()?;
        // SAFETY: a live stream.
        match unsafe { ffi::cu::cuStreamQuery(self.raw.raw) } {
            ffi::cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => ffi::check(r, "cuStreamQuery").map(|_| true),
        }
    }
    /// True while the stream's work is being captured into a graph (between
    /// [`begin_capture`](Self::begin_capture) and [`end_capture`](Self::end_capture), or a
    /// capture the application began on this stream).
    pub fn is_capturing(&self) -> Result<bool> {
        let _g = self.raw.gpu.bind()?;
        let mut st = ffi::cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream; writes one status.
        ffi::check(
            unsafe { ffi::cu::cuStreamIsCapturing(self.raw.raw, &mut st) },
            "cuStreamIsCapturing",
        )?;
        Ok(st != ffi::cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    /// Starts capturing the stream's work into a graph (thread-local capture mode).
    pub fn begin_capture(&self) -> Result<()> {
        let _g = self.raw.gpu.bind()?;
        // SAFETY: a live stream.
        ffi::check(
            unsafe {
                ffi::cu::cuStreamBeginCapture_v2(
                    self.raw.raw,
                    ffi::cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture",
        )
    }
    /// Ends the capture and instantiates the graph.
    pub fn end_capture(&self) -> Result<Graph> {
        let _g = self.raw.gpu.bind()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: a stream in capture mode (else the driver returns an error).
        ffi::check(
            unsafe { ffi::cu::cuStreamEndCapture(self.raw.raw, &mut graph) },
            "cuStreamEndCapture",
        )?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: a complete graph.
        let r = ffi::check(
            unsafe { ffi::cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) },
            "cuGraphInstantiate",
        );
        if let Err(e) = r {
            // SAFETY: destroys the graph made above.
            unsafe { ffi::cu::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Graph {
            gpu: self.raw.gpu.clone(),
            graph,
            exec,
        })
    }
}

impl Graph {
    /// Launches the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.backend_gpu != self.gpu.ordinal {
            return Err(Error::invalid("graph and stream are on different GPUs"));
        }
        let _g = self.gpu.bind()?;
        // SAFETY: a live executable graph and stream of the same GPU.
        ffi::check(
            unsafe { ffi::cu::cuGraphLaunch(self.exec, stream.raw.raw) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: destroyed once.
            unsafe {
                ffi::cu::cuGraphExecDestroy(self.exec);
                ffi::cu::cuGraphDestroy(self.graph);
            }
        }
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn amo_type_ok(cmp: Cmp) -> Option<ffi::cu::CUstreamWaitValue_flags> {
    use ffi::cu::CUstreamWaitValue_flags::*;
    match cmp {
        Cmp::Eq => Some(CU_STREAM_WAIT_VALUE_EQ),
        Cmp::Ge => Some(CU_STREAM_WAIT_VALUE_GEQ),
        _ => None,
    }
}

fn cmp_code(c: Cmp) -> i32 {
    match c {
        Cmp::Eq => 0,
        Cmp::Ne => 1,
        Cmp::Gt => 2,
        Cmp::Ge => 3,
        Cmp::Lt => 4,
        Cmp::Le => 5,
    }
}

impl<'a> CudaPe<'a> {
    /// The CUDA side of `pe`; [`Error::Backend`] when its world does not use the CUDA backend.
    pub fn new(pe: &'a Pe) -> Result<CudaPe<'a>> {
        let b = pe.inner.backend.as_cuda().ok_or_else(|| {
            ffi::err("this PE's world does not use the CUDA backend (RSHMEM_BACKEND=cuda)")
        })?;
        Ok(CudaPe { pe, b })
    }

    /// The GPU ordinal of this PE.
    pub fn device(&self) -> usize {
        self.b.gpu.ordinal
    }

    /// [`Error::Backend`] when one of `members` (world PEs) runs on another node: `what`'s
    /// kernels reach peers by loads and stores into their mapped heaps, which only PEs of
    /// this node have (device put, put-with-signal, get and quiet reach other nodes through
    /// the proxy).
    pub(crate) fn check_one_node(&self, members: &[usize], what: &str) -> Result<()> {
        match members.iter().find(|&&p| self.b.is_remote(p)) {
            Some(p) => Err(ffi::err(format!(
                "{what} needs every member on this PE's node; PE {p} runs on another node"
            ))),
            None => Ok(()),
        }
    }

    /// Whether one of `members` (world PEs) runs on another node (reached through the proxy).
    pub(crate) fn any_remote(&self, members: &[usize]) -> bool {
        members.iter().any(|&p| self.b.is_remote(p))
    }

    /// Whether no other PE of the world runs on this PE's GPU.
    pub(crate) fn gpu_alone(&self) -> bool {
        self.b.gpu_alone()
    }

    /// The GPU ordinal of world PE `pe` (as its own process numbers GPUs).
    pub fn device_of(&self, pe: usize) -> Result<usize> {
        self.b.ordinals.get(pe).copied().ok_or(Error::PeOutOfRange {
            pe,
            n_pes: self.b.n,
            what: "world",
        })
    }

    /// Bytes of the sync area (barrier counters, error word, heap base table) that each PE's
    /// GPU heap holds beyond the user heap: `n_pes × (max_teams + 1) × 16 + 64 + 8 × n_pes`.
    pub fn sync_area_bytes(&self) -> usize {
        self.b.layout.bytes()
    }

    /// Number of SMs of this PE's GPU.
    pub fn sm_count(&self) -> usize {
        self.b.gpu.sms()
    }

    fn loc<T: Elem>(&self, raw: RawSym, at: usize, count: usize, pe: usize) -> Result<usize> {
        if raw.job != self.pe.inner.job {
            return Err(Error::WorldEnded);
        }
        if pe >= self.b.n {
            return Err(Error::PeOutOfRange {
                pe,
                n_pes: self.b.n,
                what: "world",
            });
        }
        match at.checked_add(count) {
            Some(end) if end <= raw.len => Ok(raw.offset + at * std::mem::size_of::<T>()),
            end => Err(Error::OutOfBounds {
                start: at,
                end: end.unwrap_or(usize::MAX),
                len: raw.len,
            }),
        }
    }

    fn check_stream(&self, s: &Stream) -> Result<()> {
        if s.backend_gpu != self.b.gpu.ordinal {
            return Err(Error::invalid(format!(
                "stream of GPU {} used by the PE of GPU {}",
                s.backend_gpu, self.b.gpu.ordinal
            )));
        }
        Ok(())
    }

    /// Device address of this PE's copy of `sym` (for kernel arguments).
    pub fn ptr<T: Elem>(&self, sym: &(impl AsSym<T> + ?Sized)) -> Result<u64> {
        let off = self.loc::<T>(sym.raw(), 0, 0, self.b.me)?;
        Ok(self.b.addr(self.b.me, off))
    }

    /// Device address of element `at` of PE `pe`'s copy, as mapped on this GPU.
    pub fn peer_ptr<T: Elem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        pe: usize,
    ) -> Result<u64> {
        let off = self.loc::<T>(sym.raw(), at, 0, pe)?;
        if self.b.is_remote(pe) {
            return Err(Error::invalid(format!(
                "PE {pe} runs on another node: its heap has no address on this GPU"
            )));
        }
        Ok(self.b.addr(pe, off))
    }

    /// A kernel argument pointing at this PE's copy of `sym`.
    pub fn arg<T: Elem>(&self, sym: &(impl AsSym<T> + ?Sized)) -> Result<KernelArg> {
        self.ptr(sym).map(KernelArg::Ptr)
    }

    /// A new stream on this PE's GPU (non-blocking, destroyed on drop).
    pub fn stream(&self) -> Result<Stream> {
        Ok(Stream {
            raw: RawStream::new(&self.b.gpu)?,
            backend_gpu: self.b.gpu.ordinal,
        })
    }

    /// Wraps the caller's `CUstream` (not destroyed on drop).
    ///
    /// # Safety
    /// `raw` must be a live stream of this PE's GPU (primary context) for the wrapper's life.
    pub unsafe fn stream_from_raw(&self, raw: *mut std::ffi::c_void) -> Stream {
        Stream {
            raw: RawStream {
                gpu: self.b.gpu.clone(),
                raw: raw as ffi::cu::CUstream,
                owned: false,
            },
            backend_gpu: self.b.gpu.ordinal,
        }
    }

    /// Stream-ordered put: this PE's `src` (all of it) into the start of PE `pe`'s `dst`, by
    /// the copy engine. Ranges come from [`Sym::slice`](crate::Sym::slice):
    /// `put_on_stream(&s, &x.slice(8..)?, &y.slice(..4)?, 1)` copies `y[0..4]` into PE 1's
    /// `x[8..12]`.
    pub fn put_on_stream<T: Elem>(
        &self,
        s: &Stream,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        pe: usize,
    ) -> Result<()> {
        self.check_stream(s)?;
        let count = src.raw().len;
        let d = self.loc::<T>(dst.raw(), 0, count, pe)?;
        let so = self.loc::<T>(src.raw(), 0, count, self.b.me)?;
        if self.b.is_remote(pe) {
            let src = self.b.addr(self.b.me, so);
            let len = count * std::mem::size_of::<T>();
            let req = RingRequest::Put {
                pe,
                dst: d,
                src,
                len,
                signal: None,
            };
            return self.remote(s, req);
        }
        self.copy(
            s,
            self.b.addr(pe, d),
            self.b.addr(self.b.me, so),
            count * std::mem::size_of::<T>(),
        )
    }

    /// Stream-ordered get: the start of PE `pe`'s `src` into this PE's `dst` (all of it).
    pub fn get_on_stream<T: Elem>(
        &self,
        s: &Stream,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        pe: usize,
    ) -> Result<()> {
        self.check_stream(s)?;
        let count = dst.raw().len;
        let d = self.loc::<T>(dst.raw(), 0, count, self.b.me)?;
        let so = self.loc::<T>(src.raw(), 0, count, pe)?;
        if self.b.is_remote(pe) {
            let dst = self.b.addr(self.b.me, d);
            let len = count * std::mem::size_of::<T>();
            return self.remote(
                s,
                RingRequest::Get {
                    pe,
                    dst,
                    src: so,
                    len,
                },
            );
        }
        self.copy(
            s,
            self.b.addr(self.b.me, d),
            self.b.addr(pe, so),
            count * std::mem::size_of::<T>(),
        )
    }

    /// A stream-ordered request to a PE on another node through this PE's proxy (see
    /// `backend/cuda/remote.rs`): complete at the target before the stream's later work.
    fn remote(&self, s: &Stream, req: RingRequest) -> Result<()> {
        match req {
            RingRequest::Put {
                len: 0,
                signal: None,
                ..
            }
            | RingRequest::Get { len: 0, .. } => Ok(()),
            _ => self.b.proxy_on_stream(&s.raw, req),
        }
    }

    /// Stream-ordered copy between raw device addresses (both mapped on this GPU).
    pub fn copy_raw_on_stream(&self, s: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.check_stream(s)?;
        self.copy(s, dst, src, bytes)
    }

    fn copy(&self, s: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _g = self.b.gpu.bind()?;
        // SAFETY: both ranges were checked to lie in mapped symmetric heaps (or are the
        // caller's device addresses for the raw form); the copy is ordered on the stream.
        ffi::check(
            unsafe { ffi::cu::cuMemcpyAsync(dst, src, bytes, s.raw.raw) },
            "cuMemcpyAsync",
        )
    }

    /// Stream-ordered signal update of `sig[sig_at]` on PE `pe` (set or add), after everything
    /// earlier on the stream (a memory barrier precedes the write).
    pub fn signal_on_stream(
        &self,
        s: &Stream,
        sig: &(impl AsSym<u64> + ?Sized),
        sig_at: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        self.check_stream(s)?;
        let off = self.loc::<u64>(sig.raw(), sig_at, 1, pe)?;
        if self.b.is_remote(pe) {
            let sig = RingSignal {
                offset: off,
                value,
                add: op == SignalOp::Add,
            };
            return self.remote(s, RingRequest::Signal { pe, signal: sig });
        }
        let mut addr = self.b.addr(pe, off);
        match op {
            SignalOp::Set => {
                let _g = self.b.gpu.bind()?;
                // SAFETY: an aligned word of a mapped heap; default flags keep the memory
                // barrier so earlier data on the stream is visible before the signal.
                ffi::check(
                    unsafe {
                        ffi::cu::cuStreamWriteValue64_v2(
                            s.raw.raw,
                            addr,
                            value,
                            ffi::cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                        )
                    },
                    "cuStreamWriteValue64",
                )
            }
            SignalOp::Add => {
                let mut v = value;
                let mut p = [
                    &mut addr as *mut u64 as *mut std::ffi::c_void,
                    &mut v as *mut u64 as *mut _,
                ];
                // SAFETY: matches rshmemi_signal_add(u64, u64); addr is an in-heap word.
                unsafe { gpu::launch(&s.raw, self.b.f_signal_add, 1, 32, 0, &mut p) }
            }
        }
    }

    /// Stream-ordered put with signal: this PE's `src` into the start of PE `pe`'s `dst` (as
    /// [`put_on_stream`](Self::put_on_stream)), then `signal` there (visible only after the
    /// data).
    pub fn put_signal_on_stream<T: Elem>(
        &self,
        s: &Stream,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        signal: Signal,
        pe: usize,
    ) -> Result<()> {
        let sig = signal.object();
        let soff = self.loc::<u64>(signal.sym, signal.at, 1, pe)?;
        if self.b.is_remote(pe) {
            // One request: the proxy applies the signal once the data is in the target's GPU.
            self.check_stream(s)?;
            let count = src.raw().len;
            let d = self.loc::<T>(dst.raw(), 0, count, pe)?;
            let so = self.loc::<T>(src.raw(), 0, count, self.b.me)?;
            let sig = RingSignal {
                offset: soff,
                value: signal.value,
                add: signal.op == SignalOp::Add,
            };
            let src = self.b.addr(self.b.me, so);
            let len = count * std::mem::size_of::<T>();
            let req = RingRequest::Put {
                pe,
                dst: d,
                src,
                len,
                signal: Some(sig),
            };
            return self.remote(s, req);
        }
        self.put_on_stream(s, dst, src, pe)?;
        self.signal_on_stream(s, &sig, signal.at, signal.value, signal.op, pe)
    }

    /// Stream-ordered wait until this PE's `sig[at] <cmp> value`: `==` and `>=` by
    /// `cuStreamWaitValue64`, the other comparisons by a one-thread kernel. A device-side wait
    /// that exceeds the timeout is reported by [`Pe::quiet`] as [`Error::Timeout`].
    pub fn wait_until_on_stream(
        &self,
        s: &Stream,
        sig: &(impl AsSym<u64> + ?Sized),
        at: usize,
        cmp: Cmp,
        value: u64,
    ) -> Result<()> {
        self.check_stream(s)?;
        let off = self.loc::<u64>(sig.raw(), at, 1, self.b.me)?;
        let mut addr = self.b.addr(self.b.me, off);
        if let Some(f) = amo_type_ok(cmp) {
            let _g = self.b.gpu.bind()?;
            // SAFETY: an aligned word of this PE's heap.
            return ffi::check(
                unsafe { ffi::cu::cuStreamWaitValue64_v2(s.raw.raw, addr, value, f as u32) },
                "cuStreamWaitValue64",
            );
        }
        let mut c = cmp_code(cmp);
        let mut v = value;
        let mut p = [
            &mut addr as *mut u64 as *mut std::ffi::c_void,
            &mut c as *mut i32 as *mut _,
            &mut v as *mut u64 as *mut _,
        ];
        // SAFETY: matches rshmemi_wait(u64, int, u64).
        unsafe { gpu::launch(&s.raw, self.b.f_wait, 1, 32, 0, &mut p) }
    }

    /// Stream-ordered barrier of every PE: earlier work on the stream completes, then the PEs
    /// meet (a one-block kernel exchanging counters; replay-safe inside graphs).
    pub fn barrier_on_stream(&self, s: &Stream) -> Result<()> {
        self.check_stream(s)?;
        let mut t = DeviceTeam {
            slot: self.b.layout.stream_slot() as i32,
            my_index: self.b.me as i32,
            size: self.b.n as i32,
            start: 0,
            stride: 1,
        };
        let mut p = [&mut t as *mut DeviceTeam as *mut std::ffi::c_void];
        // At most 1024 threads however many PEs (the device barrier loops over the rest).
        let threads = t.sync_threads();
        // SAFETY: matches rshmemi_team_sync(rshmem_team) (five ints, repr(C)).
        unsafe { gpu::launch(&s.raw, self.b.f_team_sync, 1, threads, 0, &mut p) }
    }

    /// Stream-ordered quiet: operations on one stream complete in order, and every rshmem
    /// stream operation is complete when the next one starts; nothing is queued.
    pub fn quiet_on_stream(&self, s: &Stream) -> Result<()> {
        self.check_stream(s)
    }

    /// The device-side view of `team` (teams with strided members only). Errors: a team of an
    /// ended world ([`Error::WorldEnded`]), another PE's team handle, a team with non-strided
    /// members or a slot beyond the device's ([`Error::Team`]).
    pub fn device_team(&self, team: &Team) -> Result<DeviceTeam> {
        // A team of an earlier world would name a slot whose counters now belong to another
        // team; a team handed over from another PE would name that PE's index.
        self.pe.check_team(team)?;
        let m = &team.members;
        // Every host team slot has device counters (the stream barrier's slot comes after).
        if team.slot >= self.b.layout.stream_slot() {
            return Err(Error::Team(format!(
                "team slot {} is beyond the device's {} team slots",
                team.slot,
                self.b.layout.stream_slot()
            )));
        }
        let stride = if m.len() > 1 {
            m[1] as i64 - m[0] as i64
        } else {
            1
        };
        if stride <= 0 || m.windows(2).any(|w| w[1] as i64 - w[0] as i64 != stride) {
            return Err(Error::Team("device-side teams need strided members".into()));
        }
        Ok(DeviceTeam {
            slot: team.slot as i32,
            my_index: team.my_index as i32,
            size: m.len() as i32,
            start: m.first().copied().unwrap_or(0) as i32,
            stride: stride as i32,
        })
    }

    /// Compiles `src` (CUDA C++ using `rshmem_device.cuh`, which is prepended) with NVRTC for
    /// this GPU, loads it (cached per source, architecture and options in memory and on disk;
    /// modules per PE), fills its device state, and returns kernel `name`.
    ///
    /// Every kernel of the module is loaded at once (not lazily at first launch). Obtain the
    /// kernels on every PE before launching ones that wait for peers: loading a module waits for
    /// kernels running on the same GPU.
    pub fn kernel(&self, src: &str, name: &str, options: &[&str]) -> Result<Kernel> {
        let full = nvrtc::with_header(src);
        let key = self.module_key(&full, options);
        let module = match self.loaded(key) {
            Some(m) => m,
            None => {
                let cubin = nvrtc::compile(&full, &self.b.gpu.arch(), options)?;
                self.load(key, &cubin)?
            }
        };
        Ok(Kernel {
            func: module.func(name)?,
            module,
            name: name.to_string(),
        })
    }

    /// The modules of `srcs` (as [`kernel`](Self::kernel) compiles and loads one), those not
    /// yet loaded compiled on parallel threads ([`nvrtc::compile_all`]: put the slowest
    /// first), then every one loaded on this thread; in the order of `srcs`.
    pub(crate) fn modules(&self, srcs: &[String], options: &[&str]) -> Result<Vec<Arc<Module>>> {
        let full: Vec<String> = srcs.iter().map(|s| nvrtc::with_header(s)).collect();
        let keys: Vec<u64> = full.iter().map(|f| self.module_key(f, options)).collect();
        let missing: Vec<usize> = (0..keys.len())
            .filter(|&i| self.loaded(keys[i]).is_none())
            .collect();
        let programs: Vec<(&str, &[&str])> = missing
            .iter()
            .map(|&i| (full[i].as_str(), options))
            .collect();
        let cubins = nvrtc::compile_all(&programs, &self.b.gpu.arch())?;
        let mut cubins: HashMap<usize, Arc<Vec<u8>>> = missing.into_iter().zip(cubins).collect();
        let mut out = Vec::with_capacity(srcs.len());
        for (i, &key) in keys.iter().enumerate() {
            let m = match (self.loaded(key), cubins.remove(&i)) {
                (Some(m), _) => m,
                (None, Some(cubin)) => self.load(key, &cubin)?,
                (None, None) => return Err(ffi::err("a module was unloaded while compiling")),
            };
            out.push(m);
        }
        Ok(out)
    }

    /// The key of a module of this PE: its source (header included), architecture, options.
    fn module_key(&self, full: &str, options: &[&str]) -> u64 {
        nvrtc::fnv(&[
            full.as_bytes(),
            self.b.gpu.arch().as_bytes(),
            options.join("\u{1}").as_bytes(),
        ])
    }

    /// The module of `key` if this PE has loaded it.
    fn loaded(&self, key: u64) -> Option<Arc<Module>> {
        self.b
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    /// Loads `cubin` as this PE's module of `key` and fills its device state.
    fn load(&self, key: u64, cubin: &[u8]) -> Result<Arc<Module>> {
        let m = Arc::new(Module::load(&self.b.gpu, cubin)?);
        set_state(&m, &self.b.state())?;
        self.b
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, m.clone());
        Ok(m)
    }

    /// Launches `k` (1-D grid and block) on `s` with `args`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type (the driver reads
    /// as many parameter bytes as the kernel declares), and pointer arguments must be valid for
    /// what the kernel does with them.
    pub unsafe fn launch(
        &self,
        k: &Kernel,
        s: &Stream,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(k, s, grid, block, shared_bytes, args, false) }
    }

    /// [`launch`](Self::launch) as a programmatic dependent launch (on GPUs of compute
    /// capability 9.0 and up; an ordinary launch on older ones): the kernel may become resident
    /// while the previous kernel on `s` finishes, and must begin with `rshmemi_grid_dep_wait()`
    /// (the device header's `griddepcontrol.wait`) before it touches anything earlier work on
    /// `s` writes. Its blocks wait there holding their SMs: where PEs share the GPU, the
    /// previous kernel must trigger (`rshmemi_grid_dep_launch()`) only once it no longer waits
    /// for other PEs, or they could starve each other (rshmem's LL kernels trigger at their
    /// start where the PE has its GPU to itself).
    ///
    /// # Safety
    /// As [`launch`](Self::launch), and the kernel waits as above.
    pub(crate) unsafe fn launch_dependent(
        &self,
        k: &Kernel,
        s: &Stream,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(k, s, grid, block, shared_bytes, args, true) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_with(
        &self,
        k: &Kernel,
        s: &Stream,
        grid: u32,
        block: u32,
        shared_bytes: u32,
        args: &[KernelArg],
        dependent: bool,
    ) -> Result<()> {
        self.check_stream(s)?;
        if k.module.gpu.ordinal != self.b.gpu.ordinal {
            return Err(Error::invalid("kernel loaded for another GPU"));
        }
        if grid == 0 || block == 0 || block > 1024 {
            return Err(Error::invalid(format!(
                "launch of {grid} blocks of {block} threads"
            )));
        }
        let mut store: Vec<Vec<u8>> = args.iter().map(KernelArg::bytes).collect();
        let mut p: Vec<*mut std::ffi::c_void> =
            store.iter_mut().map(|b| b.as_mut_ptr() as *mut _).collect();
        // SAFETY: the caller's argument list describes the kernel's parameters (NVRTC kernels are
        // C ABI); a mismatch is the caller's error as with any CUDA launch, and each buffer
        // lives until the launch call returns (the driver copies parameters at launch). A
        // dependent kernel waits for the earlier work (the caller's promise).
        unsafe {
            if dependent {
                gpu::launch_dependent(&s.raw, k.func, grid, block, shared_bytes, &mut p)
            } else {
                gpu::launch(&s.raw, k.func, grid, block, shared_bytes, &mut p)
            }
        }
    }

    /// Raises device-side wait timeouts recorded on this GPU as [`Error::Timeout`].
    pub fn check_device_errors(&self) -> Result<()> {
        self.b.take_device_error()
    }

    /// `len` zeroed bytes of page-locked host memory of this PE's GPU context.
    pub(crate) fn host_buf(&self, len: usize) -> Result<gpu::HostBuf> {
        gpu::HostBuf::zeroed(&self.b.gpu, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Barrier kernels (the stream barrier over the world, collective barriers over teams)
    /// launch whole warps, never more than the 1024 threads a block may have: no limit on PEs
    /// means worlds beyond 1024 PEs too.
    #[test]
    fn barrier_blocks_stay_launchable() {
        for (members, threads) in [
            (0, 32),
            (1, 32),
            (32, 32),
            (33, 64),
            (72, 96),
            (1000, 1024),
            (1024, 1024),
            (1025, 1024),
            (5000, 1024),
            (i32::MAX as usize, 1024),
        ] {
            assert_eq!(sync_block_threads(members), threads, "{members} members");
        }
        let t = |size| DeviceTeam {
            slot: 0,
            my_index: 0,
            size,
            start: 0,
            stride: 1,
        };
        assert_eq!(t(2000).sync_threads(), 1024);
        assert_eq!(t(72).sync_threads(), 96);
        assert_eq!(t(0).sync_threads(), 32);
        assert_eq!(t(-5).sync_threads(), 32);
    }
}
