//! Safe types above the FFI: one [`Gpu`] per device ordinal (its retained primary context),
//! a guard that makes a GPU's context current for the duration of a call, owned streams,
//! device buffers and loaded modules.
//!
//! Every call that touches a GPU takes a [`CtxGuard`] for the GPU it means, so nothing depends on
//! which context happens to be current on the calling thread (seed 000's bug class), and the
//! caller's own current context is restored afterwards.

use super::ffi::{self, check, cu};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

/// One GPU of this process: its device handle and retained primary context.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub ordinal: usize,
    pub dev: cu::CUdevice,
    pub ctx: cu::CUcontext,
    /// Compute capability 9.0 or up: programmatic dependent launch ([`launch_dependent`]).
    pub pdl: bool,
    /// Idle streams rshmem created on this GPU, reused before creating more (see
    /// [`RawStream::new`]).
    idle: Mutex<Vec<cu::CUstream>>,
}

// SAFETY: a CUcontext and CUdevice are process-wide handles usable from any thread.
unsafe impl Send for Gpu {}
// SAFETY: as for Send; the handles are never mutated.
unsafe impl Sync for Gpu {}

/// Number of GPUs visible to this process.
pub(crate) fn device_count() -> Result<usize> {
    ffi::driver()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { cu::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// The process-wide `Gpu` of `ordinal` (created on first use, kept for the process's life).
pub(crate) fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let n = device_count()?;
    if ordinal >= n {
        return Err(ffi::err(format!(
            "GPU {ordinal} does not exist: this process sees {n} GPU(s)"
        )));
    }
    let mut map = GPUS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(g) = map.get(&ordinal) {
        return Ok(g.clone());
    }
    let mut dev = 0;
    // SAFETY: ordinal < device count; writes one handle.
    check(
        unsafe { cu::cuDeviceGet(&mut dev, ordinal as i32) },
        "cuDeviceGet",
    )?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid device; the primary context is retained for the process's life.
    check(
        unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    let mut major = 0;
    // SAFETY: valid device; writes one int.
    check(
        unsafe {
            cu::cuDeviceGetAttribute(
                &mut major,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                dev,
            )
        },
        "cuDeviceGetAttribute",
    )?;
    let g = Arc::new(Gpu {
        ordinal,
        dev,
        ctx,
        pdl: major >= 9,
        idle: Mutex::new(Vec::new()),
    });
    map.insert(ordinal, g.clone());
    Ok(g)
}

/// Makes a GPU's context current on this thread until dropped (then the previous one returns).
/// `pushed`: false when the context was current already (nothing to pop).
pub(crate) struct CtxGuard {
    pushed: bool,
}

impl Gpu {
    /// Makes this GPU's context current: pushed, and popped when the guard drops, unless it
    /// is current already (the common case on a PE's own thread: no push and pop per launch).
    pub fn bind(&self) -> Result<CtxGuard> {
        let mut cur = std::ptr::null_mut();
        // SAFETY: writes one context handle (null when none is current).
        let r = unsafe { cu::cuCtxGetCurrent(&mut cur) };
        if r == cu::CUresult::CUDA_SUCCESS && cur == self.ctx {
            return Ok(CtxGuard { pushed: false });
        }
        // SAFETY: a retained, live primary context.
        check(
            unsafe { cu::cuCtxPushCurrent_v2(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        Ok(CtxGuard { pushed: true })
    }

    /// A device attribute (−1 when the driver does not know it).
    pub fn attr(&self, a: cu::CUdevice_attribute) -> i32 {
        let mut v = -1;
        // SAFETY: writes one int; an unknown attribute returns an error and leaves -1.
        let _ = unsafe { cu::cuDeviceGetAttribute(&mut v, a, self.dev) };
        v
    }

    /// The device's name.
    pub fn name(&self) -> String {
        let mut b = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds 256 bytes, the driver writes a NUL-terminated name.
        let r = unsafe { cu::cuDeviceGetName(b.as_mut_ptr(), 256, self.dev) };
        if r != cu::CUresult::CUDA_SUCCESS {
            return String::from("?");
        }
        // SAFETY: NUL-terminated within the buffer.
        unsafe { std::ffi::CStr::from_ptr(b.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// (major, minor) compute capability.
    pub fn cc(&self) -> (i32, i32) {
        use cu::CUdevice_attribute::*;
        (
            self.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            self.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )
    }

    /// `sm_XY` of this GPU.
    pub fn arch(&self) -> String {
        let (a, b) = self.cc();
        format!("sm_{a}{b}")
    }

    /// Number of SMs.
    pub fn sms(&self) -> usize {
        self.attr(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .max(1) as usize
    }

    /// Enables access from this GPU's context to `peer`'s memory (idempotent).
    pub fn enable_peer(&self, peer: &Gpu) -> Result<()> {
        if peer.ordinal == self.ordinal {
            return Ok(());
        }
        let _g = self.bind()?;
        // SAFETY: both contexts are live.
        let r = unsafe { cu::cuCtxEnablePeerAccess(peer.ctx, 0) };
        if r == cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(r, "cuCtxEnablePeerAccess")
    }

    /// Whether this GPU can access `peer`'s memory, and whether peer atomics are native.
    pub fn peer_caps(&self, peer: &Gpu) -> (bool, bool) {
        if peer.ordinal == self.ordinal {
            return (true, true);
        }
        let mut can = 0;
        let mut atom = 0;
        // SAFETY: write one int each.
        unsafe {
            let _ = cu::cuDeviceCanAccessPeer(&mut can, self.dev, peer.dev);
            let _ = cu::cuDeviceGetP2PAttribute(
                &mut atom,
                cu::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                self.dev,
                peer.dev,
            );
        }
        (can != 0, atom != 0)
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if !self.pushed {
            return;
        }
        let mut old = std::ptr::null_mut();
        // SAFETY: pops the context pushed by `bind` on this thread.
        let _ = unsafe { cu::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// A stream owned by rshmem (destroyed on drop) or borrowed from the caller.
#[derive(Debug)]
pub(crate) struct RawStream {
    pub gpu: Arc<Gpu>,
    pub raw: cu::CUstream,
    pub owned: bool,
}

// SAFETY: CUstream handles may be used from any thread; calls on it are serialised by the driver.
unsafe impl Send for RawStream {}
// SAFETY: as for Send.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// A non-blocking stream of `gpu`: an idle one of rshmem's earlier streams when there is
    /// one, else a new one.
    ///
    /// Reuse keeps the number of streams rshmem ever creates on a GPU at the most it has live
    /// at once. The driver spreads streams over the context's hardware queues
    /// (`CUDA_DEVICE_MAX_CONNECTIONS`) as they are created; streams created and destroyed
    /// over a long run (tests, successive worlds) come round to share a queue with a live
    /// stream of another PE on the same GPU, and a queue runs its work in order: work queued
    /// behind a kernel that waits for a peer then holds back that peer's kernel.
    pub fn new(gpu: &Arc<Gpu>) -> Result<RawStream> {
        if let Some(s) = gpu.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(RawStream {
                gpu: gpu.clone(),
                raw: s,
                owned: true,
            });
        }
        let _g = gpu.bind()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: the GPU's context is current; writes one handle.
        check(
            unsafe {
                cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        Ok(RawStream {
            gpu: gpu.clone(),
            raw: s,
            owned: true,
        })
    }
    pub fn sync(&self) -> Result<()> {
        let _g = self.gpu.bind()?;
        // SAFETY: a live stream.
        check(
            unsafe { cu::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let Ok(_g) = self.gpu.bind() else { return };
        // SAFETY: a stream this object owns; nothing else uses it after drop.
        let idle = unsafe { cu::cuStreamQuery(self.raw) } == cu::CUresult::CUDA_SUCCESS;
        if idle {
            // Finished: the next RawStream::new reuses it.
            self.gpu
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.raw);
        } else {
            // Still has work (e.g. a wait abandoned after an error): never handed out again.
            // SAFETY: as above; the driver destroys it once its work completes.
            let _ = unsafe { cu::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// A device buffer of this GPU (`cuMemAlloc`), freed on drop.
#[derive(Debug)]
pub(crate) struct DevBuf {
    pub gpu: Arc<Gpu>,
    pub ptr: u64,
}

impl DevBuf {
    pub fn zeroed(gpu: &Arc<Gpu>, bytes: usize) -> Result<DevBuf> {
        let _g = gpu.bind()?;
        let mut p = 0;
        // SAFETY: context current; writes one pointer.
        check(
            unsafe { cu::cuMemAlloc_v2(&mut p, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        // SAFETY: p is a fresh allocation of at least `bytes`.
        let r = check(unsafe { cu::cuMemsetD8_v2(p, 0, bytes) }, "cuMemsetD8");
        if let Err(e) = r {
            // SAFETY: frees what was just allocated.
            let _ = unsafe { cu::cuMemFree_v2(p) };
            return Err(e);
        }
        Ok(DevBuf {
            gpu: gpu.clone(),
            ptr: p,
        })
    }
}

impl DevBuf {
    /// As [`DevBuf::zeroed`], zeroing on `stream` (then synchronised) instead of the legacy
    /// default stream, so it never interacts with other threads' stream captures.
    pub fn zeroed_on(stream: &RawStream, bytes: usize) -> Result<DevBuf> {
        let gpu = &stream.gpu;
        let _g = gpu.bind()?;
        let mut p = 0;
        // SAFETY: context current; writes one pointer.
        check(
            unsafe { cu::cuMemAlloc_v2(&mut p, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        let b = DevBuf {
            gpu: gpu.clone(),
            ptr: p,
        };
        // SAFETY: p is a fresh allocation of at least `bytes`; ordered on a live stream.
        check(
            unsafe { cu::cuMemsetD8Async(p, 0, bytes, stream.raw) },
            "cuMemsetD8Async",
        )?;
        stream.sync()?;
        Ok(b)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: allocated by `zeroed`, freed once.
            let _ = unsafe { cu::cuMemFree_v2(self.ptr) };
        }
    }
}

/// Page-locked host memory of this GPU's context (`cuMemHostAlloc`, mapped for its kernels),
/// zeroed, freed on drop: kernels write small results into it and the host reads them once the
/// stream is synchronised or a word the kernel writes last says they are in (no copy, and no
/// second synchronisation as a copy to pageable memory needs).
#[derive(Debug)]
pub(crate) struct HostBuf {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation belongs to the process, not to a thread; the device writes it only in
// kernels the owner launches, and the owner reads it only after synchronising them or after
// their last word (read atomically) said the rest is written.
unsafe impl Send for HostBuf {}

impl HostBuf {
    pub fn zeroed(gpu: &Arc<Gpu>, len: usize) -> Result<HostBuf> {
        let _g = gpu.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: context current; writes one pointer.
        check(
            unsafe { cu::cuMemHostAlloc(&mut p, len.max(1), cu::CU_MEMHOSTALLOC_DEVICEMAP) },
            "cuMemHostAlloc",
        )?;
        // SAFETY: a fresh allocation of at least `len` bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
        Ok(HostBuf {
            gpu: gpu.clone(),
            ptr: p as *mut u8,
            len,
        })
    }

    /// The buffer's address for kernels of its GPU (mapped page-locked memory).
    pub fn device_ptr(&self) -> Result<u64> {
        let _g = self.gpu.bind()?;
        let mut d = 0;
        // SAFETY: a live allocation of cuMemHostAlloc with DEVICEMAP; writes one address.
        check(
            unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut _, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(d)
    }

    /// The 8-byte word at byte offset `at` (a multiple of 8 inside the buffer; else 0), read
    /// atomically with acquire ordering: a word a running kernel writes last, after a system
    /// fence, to say the bytes before it are in.
    pub fn word(&self, at: usize) -> u64 {
        if !at.is_multiple_of(8) || at + 8 > self.len {
            return 0;
        }
        // SAFETY: 8-aligned (cuMemHostAlloc memory is page-aligned, `at` a multiple of 8) and
        // inside the live allocation; the device writes it with one 8-byte store and the host
        // only reads it, atomically.
        let w = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.ptr.add(at) as *mut u64) };
        w.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The buffer's host address (for owners that reach it by atomic words only).
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes, as the kernels launched last left them once their stream was synchronised
    /// (or once their last word, read with [`word`](Self::word), said they were in).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation) of plain integers; the caller
        // reads them after synchronising the kernels that write them.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: allocated by `zeroed`, freed once.
            let _ = unsafe { cu::cuMemFreeHost(self.ptr as *mut _) };
        }
    }
}

/// Host memory the caller owns, page-locked for the GPU's copies (`cuMemHostRegister`) while
/// the value lives and unregistered when it drops: copies between it and GPU memory take the
/// DMA path instead of the driver's staging through its own pinned buffers. Only the whole
/// pages inside the range are locked (the range need not be page-aligned).
#[derive(Debug)]
pub(crate) struct HostPin {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    #[cfg_attr(not(test), allow(dead_code))]
    len: usize,
}

// SAFETY: a registration belongs to the process, not to a thread; the value only holds the
// address to unregister.
unsafe impl Send for HostPin {}
// SAFETY: as for Send (no access through a shared reference).
unsafe impl Sync for HostPin {}

impl HostPin {
    /// Page-locks the whole pages inside `ptr..ptr + len` for `gpu`'s context (and every other,
    /// `PORTABLE`); `None` when no whole page lies inside.
    ///
    /// # Safety
    /// The range must stay mapped for the life of the returned value.
    pub unsafe fn register(gpu: &Arc<Gpu>, ptr: *mut u8, len: usize) -> Result<Option<HostPin>> {
        // SAFETY: sysconf reads a constant.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let start = (ptr as usize).next_multiple_of(page);
        let end = (ptr as usize).saturating_add(len) / page * page;
        if end <= start {
            return Ok(None);
        }
        let _g = gpu.bind()?;
        // SAFETY: context current; whole pages of a range the caller keeps mapped.
        check(
            unsafe {
                cu::cuMemHostRegister_v2(
                    start as *mut _,
                    end - start,
                    cu::CU_MEMHOSTREGISTER_PORTABLE,
                )
            },
            "cuMemHostRegister",
        )?;
        Ok(Some(HostPin {
            gpu: gpu.clone(),
            ptr: start as *mut u8,
            len: end - start,
        }))
    }

    /// The locked range: its first byte and length.
    #[cfg(test)]
    pub fn range(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: registered by `register`, unregistered once, while still mapped (the
            // caller's contract).
            let _ = unsafe { cu::cuMemHostUnregister(self.ptr as *mut _) };
        }
    }
}

/// A module loaded into one GPU's context (never unloaded: kernels may be in graphs).
#[derive(Debug)]
pub(crate) struct Module {
    pub gpu: Arc<Gpu>,
    pub raw: cu::CUmodule,
}

// SAFETY: module and function handles are process-wide and immutable once loaded.
unsafe impl Send for Module {}
// SAFETY: as for Send.
unsafe impl Sync for Module {}

/// A kernel of a loaded module.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Func(pub cu::CUfunction);
// SAFETY: function handles are immutable process-wide handles.
unsafe impl Send for Func {}
// SAFETY: as for Send.
unsafe impl Sync for Func {}

impl Func {
    /// The most threads a block of this kernel may have (its registers and shared memory
    /// decide), `cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)`.
    pub fn max_threads(&self) -> Result<u32> {
        let mut v = 0i32;
        // SAFETY: a function handle of a loaded module; writes one int.
        check(
            unsafe {
                cu::cuFuncGetAttribute(
                    &mut v,
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                    self.0,
                )
            },
            "cuFuncGetAttribute",
        )?;
        Ok(v.max(0) as u32)
    }
}

impl Module {
    pub fn load(gpu: &Arc<Gpu>, cubin: &[u8]) -> Result<Module> {
        let _g = gpu.bind()?;
        let mut m = std::ptr::null_mut();
        // SAFETY: the image is a complete cubin produced by NVRTC; the driver copies it.
        check(
            unsafe { cu::cuModuleLoadData(&mut m, cubin.as_ptr() as *const _) },
            "cuModuleLoadData",
        )?;
        let m = Module {
            gpu: gpu.clone(),
            raw: m,
        };
        m.load_all()?;
        Ok(m)
    }

    /// Loads every kernel of the module now. Under lazy loading (the driver's default) a kernel
    /// is otherwise loaded at first use, which waits for kernels running on the GPU: with two
    /// PEs sharing a GPU, one PE's waiting kernel would then block the other's first launch.
    fn load_all(&self) -> Result<()> {
        for s in [
            "cuModuleGetFunctionCount",
            "cuModuleEnumerateFunctions",
            "cuFuncLoad",
        ] {
            if !ffi::has_driver_symbol(s) {
                return Ok(());
            }
        }
        let mut n = 0u32;
        // SAFETY: live module (context bound by the caller); writes one count.
        check(
            unsafe { cu::cuModuleGetFunctionCount(&mut n, self.raw) },
            "cuModuleGetFunctionCount",
        )?;
        let mut fs = vec![std::ptr::null_mut(); n as usize];
        // SAFETY: the buffer holds n handles.
        check(
            unsafe { cu::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, self.raw) },
            "cuModuleEnumerateFunctions",
        )?;
        for f in fs {
            // SAFETY: a function of this module.
            check(unsafe { cu::cuFuncLoad(f) }, "cuFuncLoad")?;
        }
        Ok(())
    }
    pub fn func(&self, name: &str) -> Result<Func> {
        let c = CString::new(name).map_err(|_| ffi::err("kernel name contains NUL"))?;
        let _g = self.gpu.bind()?;
        let mut f = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name.
        check(
            unsafe { cu::cuModuleGetFunction(&mut f, self.raw, c.as_ptr()) },
            &format!("cuModuleGetFunction({name})"),
        )?;
        Ok(Func(f))
    }
    /// Address and size of a global symbol.
    pub fn global(&self, name: &str) -> Result<(u64, usize)> {
        let c = CString::new(name).map_err(|_| ffi::err("symbol name contains NUL"))?;
        let _g = self.gpu.bind()?;
        let mut p = 0;
        let mut n = 0;
        // SAFETY: live module, NUL-terminated name.
        check(
            unsafe { cu::cuModuleGetGlobal_v2(&mut p, &mut n, self.raw, c.as_ptr()) },
            &format!("cuModuleGetGlobal({name})"),
        )?;
        Ok((p, n))
    }
}

/// [`launch`] with programmatic dependent launch (`cuLaunchKernelEx`,
/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`; an ordinary [`launch`] on GPUs
/// below compute capability 9.0, where `griddepcontrol.wait` compiles to nothing and the
/// stream serialises as usual): the kernel may start while the
/// previous kernel on `stream` is still running, once that kernel's blocks have all triggered
/// (`griddepcontrol.launch_dependents`) or exited. It must execute `griddepcontrol.wait`
/// (`rshmemi_grid_dep_wait`) before touching anything earlier work on the stream writes; the
/// wait returns once that work is complete and visible. Captured into graphs as a programmatic
/// edge.
///
/// # Safety
/// As [`launch`], and the kernel waits as above.
pub(crate) unsafe fn launch_dependent(
    stream: &RawStream,
    f: Func,
    grid: u32,
    block: u32,
    shmem: u32,
    params: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    if !stream.gpu.pdl {
        // SAFETY: upheld by the caller.
        return unsafe { launch(stream, f, grid, block, shmem, params) };
    }
    let _g = stream.gpu.bind()?;
    // SAFETY: a plain-old-data attribute (the union's integer member is set after zeroing).
    let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = cu::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shmem,
        hStream: stream.raw,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: upheld by the caller; `cfg` and `attr` live until the call returns.
    check(
        unsafe { cu::cuLaunchKernelEx(&cfg, f.0, params.as_mut_ptr(), std::ptr::null_mut()) },
        "cuLaunchKernelEx",
    )
}

/// Launches `f` on `stream` with `params` (pointers to each argument's value).
///
/// # Safety
/// `params` must match the kernel's parameter list in number, order and size, and every pointer
/// argument must be valid for what the kernel does with it.
pub(crate) unsafe fn launch(
    stream: &RawStream,
    f: Func,
    grid: u32,
    block: u32,
    shmem: u32,
    params: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    let _g = stream.gpu.bind()?;
    // SAFETY: upheld by the caller.
    check(
        unsafe {
            cu::cuLaunchKernel(
                f.0,
                grid,
                1,
                1,
                block,
                1,
                1,
                shmem,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}
