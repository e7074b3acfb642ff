//! The FFI edge: every raw CUDA driver and NVRTC call of the backend goes through here.
//!
//! The libraries are loaded at run time (cudarc `dynamic-loading`). cudarc panics when a library
//! or a symbol is missing, so [`driver`] and [`nvrtc`] probe both first and turn absence into
//! [`Error::Backend`]; nothing above this module calls cudarc before a successful probe.

use crate::error::{Error, Result};
use std::sync::OnceLock;

pub(crate) use cudarc::driver::sys as cu;
pub(crate) use cudarc::nvrtc::sys as rtc;

/// Driver symbols the backend uses; all are checked before the first call.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetCurrent",
    "cuCtxEnablePeerAccess",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemGetAllocationGranularity",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyAsync",
    "cuMemcpyPeerAsync",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWriteValue64_v2",
    "cuStreamWaitValue64_v2",
    "cuStreamBeginCapture_v2",
    "cuStreamIsCapturing",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuFuncSetAttribute",
    "cuFuncGetAttribute",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuGetErrorString",
    "cuDriverGetVersion",
];

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcDestroyProgram",
    "nvrtcVersion",
];

/// A backend error with `msg`.
pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Backend {
        backend: "cuda",
        msg: msg.into(),
    }
}

/// Loads and initialises the driver once; the outcome is remembered.
pub(crate) fn driver() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: only tries to open the library; no CUDA call is made.
        if !unsafe { cu::is_culib_present() } {
            return Err(
                "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver \
                        on this machine, or it is not on the loader path"
                    .into(),
            );
        }
        // SAFETY: the library is present (checked above); `get` only looks a symbol up.
        let lib = unsafe { cu::culib() };
        for s in DRIVER_SYMBOLS {
            // SAFETY: a symbol lookup, the pointer is not used.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s} (driver too old)"));
            }
        }
        raise_connections();
        // SAFETY: cuInit with flags 0 is always valid once the library is loaded.
        let r = unsafe { cu::cuInit(0) };
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(format!("cuInit failed: {}", describe(r)));
        }
        Ok(())
    })
    .clone()
    .map_err(err)
}

/// Hardware work queues per context that rshmem asks for (the driver's maximum).
pub(crate) const MAX_CONNECTIONS: &str = "32";

/// Asks for the most hardware work queues per context (`CUDA_DEVICE_MAX_CONNECTIONS`, read by
/// the driver when it creates a context; default 8) unless the user chose a value.
///
/// Streams beyond the queue count share queues, and a queue runs its work in order: a kernel
/// of one stream waiting for a peer then holds back the later work of every stream sharing its
/// queue. With PEs sharing a GPU (threads of one process share its context) each PE has a
/// host-operation stream and its users' streams; with 8 queues, a waiting kernel of one PE (the
/// EP layout exchange, a stream barrier) often held back the very kernel of another PE it was
/// waiting for, until the device wait timed out.
fn raise_connections() {
    const VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
    if std::env::var_os(VAR).is_none() {
        // Before cuInit, once (under the caller's OnceLock).
        std::env::set_var(VAR, MAX_CONNECTIONS);
        tracing::debug!("{VAR}={MAX_CONNECTIONS} (PEs sharing a GPU need queues of their own)");
    }
    eager_loading();
}

/// Asks the driver to load every kernel of a module when the module is loaded
/// (`CUDA_MODULE_LOADING=EAGER`) unless the user chose a loading mode.
///
/// With lazy loading (the driver's default since CUDA 12.2) a kernel, the driver's own
/// included (memset, stream memory operations), may be loaded on first use, and loading one
/// waits for the GPU's work to drain while holding the context's lock. PEs sharing a GPU in
/// one process share its context: one PE's first launch of a kernel then waits for another
/// PE's barrier kernel, which waits for that very launch, until the device wait times out.
/// This removes one cause of the stalls of PEs sharing a GPU, not all of them (see the `cuda`
/// module docs, "PEs sharing a GPU").
fn eager_loading() {
    const VAR: &str = "CUDA_MODULE_LOADING";
    if std::env::var_os(VAR).is_none() {
        std::env::set_var(VAR, "EAGER");
        tracing::debug!("{VAR}=EAGER (a lazy kernel load waits for peers' waiting kernels)");
    }
}

/// Loads NVRTC once (for run-time kernel compilation); the outcome is remembered.
pub(crate) fn nvrtc() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: only tries to open the library.
        if !unsafe { rtc::is_culib_present() } {
            return Err(
                "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit or \
                        `pip install nvidia-cuda-nvrtc` and put its lib folder on LD_LIBRARY_PATH"
                    .into(),
            );
        }
        // SAFETY: present, checked above.
        let lib = unsafe { rtc::culib() };
        for s in NVRTC_SYMBOLS {
            // SAFETY: a symbol lookup, the pointer is not used.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("NVRTC lacks {s}"));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(err)
}

/// True when the (already probed) driver exports `name` (for calls of newer drivers).
pub(crate) fn has_driver_symbol(name: &str) -> bool {
    driver().is_ok()
        // SAFETY: the library is present (driver() succeeded); a lookup only.
        && unsafe { cu::culib().get::<*const ()>(name.as_bytes()) }.is_ok()
}

/// True when NVRTC can be loaded here.
pub(crate) fn nvrtc_present() -> bool {
    nvrtc().is_ok()
}

/// The driver's name and text for a result code.
pub(crate) fn describe(r: cu::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
    let ok = unsafe { cu::cuGetErrorString(r, &mut p) } == cu::CUresult::CUDA_SUCCESS;
    if ok && !p.is_null() {
        // SAFETY: a NUL-terminated static string owned by the driver.
        let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy();
        format!("{r:?} ({s})")
    } else {
        format!("{r:?}")
    }
}

/// Turns a driver result into `Result`, naming the call.
#[inline]
pub(crate) fn check(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(err(format!("{what} failed: {}", describe(r))))
    }
}

/// Turns an NVRTC result into `Result`.
pub(crate) fn check_rtc(r: rtc::nvrtcResult, what: &str) -> Result<()> {
    if r == rtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(err(format!("{what} failed: {r:?}")))
    }
}
