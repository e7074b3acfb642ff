//! The CUDA backend of a world spanning nodes, and its proxy threads (as NVSHMEM's proxy works
//! where the provider cannot reach GPU memory).
//!
//! * Host API: operations on PEs of this node go to the CUDA backend (mapped peer heaps);
//!   puts and gets to PEs of other nodes are RMA operations on their registered GPU heaps
//!   where the provider takes device memory (`hmem.rs`), else staged requests
//!   (`staging.rs`); atomics are staged requests either way. Each is complete at the target's
//!   GPU when it returns, so put-with-signal's signal follows its data there.
//! * The server thread serves the staged requests other nodes' PEs send to this PE, on its
//!   own GPU heap (copies and 64-bit sets on the backend's stream, other atomics by its
//!   one-thread kernel).
//! * The ring thread drains the ring kernels and stream operations post into
//!   (`backend/cuda/remote.rs`): it writes a put's source straight from the registered GPU
//!   heap (or copies it from the GPU into host memory and sends it as staged requests),
//!   applies the signal after the data, and advances the ring's `done` counter that device
//!   quiet and blocking device puts wait on.
//!
//! Serving and sending are separate threads, so two PEs whose rings send to each other at once
//! are both served. A failed ring request (a lost peer, a timeout) is kept and reported by the
//! next `quiet`; the ring is then failed for kernels (their waits stop, flagged), and later
//! requests are completed without being carried out.

use super::hmem::Hmem;
use super::staging::Staged;
use crate::backend::cuda::gpu::HostPin;
use crate::backend::cuda::remote::{DeviceCopy, Ring, RingRequest, RingSignal};
use crate::backend::cuda::CudaBackend;
use crate::backend::{AtomicOp, Backend};
use crate::config::BackendKind;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a proxy thread keeps spinning after its last request (more may follow at once:
/// a kernel's puts back to back) before it sleeps between polls.
const BUSY: Duration = Duration::from_millis(20);
/// The sleep between polls of an idle proxy thread (what bounds its CPU use when idle).
const IDLE_SLEEP: Duration = Duration::from_micros(20);

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct GpuFabricBackend {
    /// The GPU heaps registered with the fabric, where every PE's could be. First: fields
    /// drop in order, and the registration must end before `cuda` frees the heap.
    hmem: Option<Arc<Hmem>>,
    cuda: Arc<CudaBackend>,
    staged: Arc<Staged>,
    stop: Arc<AtomicBool>,
    /// The first error of a ring request (reported by quiet).
    failed: Arc<Mutex<Option<Error>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The staging area's page-locking (`None` where the driver refused it), released only
    /// after the threads that copy through the area stopped (fields drop after `drop`).
    _pinned: Option<HostPin>,
}

impl GpuFabricBackend {
    /// Starts the proxy threads of PE `cuda.me`.
    pub fn start(
        cuda: CudaBackend,
        staged: Staged,
        hmem: Option<Hmem>,
        pinned: Option<HostPin>,
    ) -> Result<GpuFabricBackend> {
        let cuda = Arc::new(cuda);
        let staged = Arc::new(staged);
        let hmem = hmem.map(Arc::new);
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let me = cuda.me;
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::Os {
                    op: "spawning the proxy thread",
                    msg: e.to_string(),
                })
        };
        let mut threads = Vec::new();
        let (c, s, st) = (cuda.clone(), staged.clone(), stop.clone());
        threads.push(spawn(
            format!("rshmem-serve-{me}"),
            Box::new(move || serve_loop(&c, &s, &st)),
        )?);
        let (c, s, st, f) = (cuda.clone(), staged.clone(), stop.clone(), failed.clone());
        let h = hmem.clone();
        let ring = spawn(
            format!("rshmem-proxy-{me}"),
            Box::new(move || ring_loop(&c, &s, h.as_deref(), &st, &f)),
        );
        match ring {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop.store(true, Ordering::Release);
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
        Ok(GpuFabricBackend {
            hmem,
            cuda,
            staged,
            stop,
            failed,
            threads,
            _pinned: pinned,
        })
    }

    fn remote(&self, pe: usize) -> bool {
        self.staged.net().is_remote(pe)
    }
}

impl Drop for GpuFabricBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Polls with `work` until `stop`: spinning while there was work within [`BUSY`] (yielding
/// now and then to threads waiting for the core), then sleeping [`IDLE_SLEEP`] between polls.
fn poll(stop: &AtomicBool, mut work: impl FnMut() -> bool) {
    let mut last = Instant::now();
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        if work() {
            last = Instant::now();
            idle = 0;
            continue;
        }
        idle = idle.wrapping_add(1);
        if last.elapsed() >= BUSY {
            std::thread::sleep(IDLE_SLEEP);
        } else if idle.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The server thread: other nodes' requests on this PE's GPU heap (and its sync area, where
/// device barriers of other nodes arrive).
fn serve_loop(cuda: &CudaBackend, staged: &Staged, stop: &AtomicBool) {
    let limit = cuda.heap_size + cuda.layout.bytes();
    let mut seen = vec![0u64; cuda.n];
    poll(stop, || {
        staged.net().progress();
        staged.serve_pending(cuda, limit, &mut seen) > 0
    });
}

/// The ring thread: requests kernels and streams of this PE posted.
fn ring_loop(
    cuda: &CudaBackend,
    staged: &Staged,
    hmem: Option<&Hmem>,
    stop: &AtomicBool,
    failed: &Mutex<Option<Error>>,
) {
    let Some(ring) = &cuda.ring else { return };
    poll(stop, || drain_one(&ring.ring, ring, staged, hmem, failed));
}

/// Takes the next request of `ring`, if one is posted, carries it out (unless the ring has
/// failed) and completes it; false when none was posted. A failure fails the ring, naming the
/// PE, and is kept in `failed` (the first one) for quiet.
pub(super) fn drain_one(
    ring: &Ring,
    copies: &dyn DeviceCopy,
    staged: &Staged,
    hmem: Option<&Hmem>,
    failed: &Mutex<Option<Error>>,
) -> bool {
    let Some(req) = ring.next() else {
        return false;
    };
    if ring.failed().is_none() {
        if let Err((pe, e)) = carry_out(copies, staged, hmem, req) {
            tracing::warn!(pe = staged.me(), peer = pe, %e, "a device request to another node failed");
            ring.fail(pe);
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    }
    ring.complete();
    true
}

/// Carries out one ring request; on failure, the PE it was for and the error.
fn carry_out(
    copies: &dyn DeviceCopy,
    staged: &Staged,
    hmem: Option<&Hmem>,
    req: RingRequest,
) -> std::result::Result<(), (usize, Error)> {
    let signal = |pe: usize, s: RingSignal| {
        let op = match s.add {
            true => AtomicOp::FetchAdd(s.value),
            false => AtomicOp::Set(s.value),
        };
        staged.atomic(pe, s.offset, true, op).map(|_| ())
    };
    match req {
        RingRequest::Put {
            pe,
            dst,
            src,
            len,
            signal: sig,
        } => {
            let r = (|| {
                match hmem {
                    Some(h) => h.put_from_device(copies, pe, dst, src, len)?,
                    None => {
                        let mut buf = vec![0u8; len];
                        copies.copy_from_device(src, &mut buf)?;
                        staged.put(pe, dst, &buf)?;
                    }
                }
                match sig {
                    Some(s) => signal(pe, s),
                    None => Ok(()),
                }
            })();
            r.map_err(|e| (pe, e))
        }
        RingRequest::PutInline {
            pe,
            dst,
            value,
            len,
        } => {
            let bytes = value.to_le_bytes();
            let len = len.min(bytes.len());
            match hmem {
                Some(h) => h.put(pe, dst, &bytes[..len]),
                None => staged.put(pe, dst, &bytes[..len]),
            }
            .map_err(|e| (pe, e))
        }
        RingRequest::Signal { pe, signal: s } => signal(pe, s).map_err(|e| (pe, e)),
        RingRequest::Get { pe, dst, src, len } => {
            let r = match hmem {
                Some(h) => h.get_to_device(copies, pe, src, dst, len),
                None => (|| {
                    let mut buf = vec![0u8; len];
                    staged.get(pe, src, &mut buf)?;
                    copies.copy_to_device(dst, &buf)
                })(),
            };
            r.map_err(|e| (pe, e))
        }
        RingRequest::Malformed => Err((
            staged.me(),
            Error::invalid("a malformed request in the proxy ring (header and library disagree?)"),
        )),
    }
}

impl Backend for GpuFabricBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        match (self.remote(pe), &self.hmem) {
            (true, Some(h)) => h.put(pe, offset, src),
            (true, None) => self.staged.put(pe, offset, src),
            (false, _) => self.cuda.put(pe, offset, src),
        }
    }
    fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        match (self.remote(pe), &self.hmem) {
            (true, Some(h)) => h.get(pe, offset, dst),
            (true, None) => self.staged.get(pe, offset, dst),
            (false, _) => self.cuda.get(pe, offset, dst),
        }
    }
    fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        match self.remote(pe) {
            true => self.staged.atomic(pe, offset, wide, op),
            false => self.cuda.atomic(pe, offset, wide, op),
        }
    }
    fn fence(&self) {
        self.cuda.fence();
    }
    fn quiet(&self) -> Result<()> {
        // The proxy's error first: a device wait it stopped is flagged as a timeout naming
        // the same PE, and the lost peer is the cause.
        if let Some(e) = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(e);
        }
        self.cuda.quiet()
    }
    fn as_cuda(&self) -> Option<&CudaBackend> {
        Some(&self.cuda)
    }
    fn gpu_heaps_on_fabric(&self) -> bool {
        self.hmem.is_some()
    }
}
