//! What the machine offers: GPUs, peer access and native atomics, VMM, POSIX-FD handles,
//! 64-bit stream memory operations (for `rshmem info`).

use super::ffi::cu::CUdevice_attribute::*;
use super::gpu;
use crate::error::Result;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Ordinal.
    pub ordinal: usize,
    /// Device name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Number of SMs.
    pub sms: usize,
    /// Virtual memory management (`cuMemCreate`/`cuMemMap`).
    pub vmm: bool,
    /// POSIX file-descriptor handles for VMM allocations.
    pub posix_fd: bool,
    /// 64-bit stream memory operations (`cuStreamWriteValue64`/`WaitValue64`).
    pub stream_mem_ops_64: bool,
}

/// The machine's CUDA facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// Driver version (e.g. 13000).
    pub driver_version: i32,
    /// The GPUs.
    pub gpus: Vec<GpuInfo>,
    /// `peer_access[i][j]`: GPU i can access GPU j's memory.
    pub peer_access: Vec<Vec<bool>>,
    /// `native_atomics[i][j]`: atomics from GPU i on GPU j's memory are native.
    pub native_atomics: Vec<Vec<bool>>,
    /// NVRTC is loadable (device kernels can be compiled).
    pub nvrtc: bool,
}

/// Reads the CUDA facts of this machine; [`Error::Backend`](crate::Error::Backend) without a
/// driver.
pub fn info() -> Result<Info> {
    let n = gpu::device_count()?;
    let gs = (0..n).map(gpu::gpu).collect::<Result<Vec<_>>>()?;
    let mut v = 0;
    // SAFETY: writes one int.
    let _ = unsafe { super::ffi::cu::cuDriverGetVersion(&mut v) };
    Ok(Info {
        driver_version: v,
        gpus: gs
            .iter()
            .map(|g| GpuInfo {
                ordinal: g.ordinal,
                name: g.name(),
                compute_capability: g.cc(),
                sms: g.sms(),
                vmm: g.attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) > 0,
                posix_fd: g.attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
                    > 0,
                stream_mem_ops_64: g.attr(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) > 0,
            })
            .collect(),
        peer_access: gs
            .iter()
            .map(|a| gs.iter().map(|b| a.peer_caps(b).0).collect())
            .collect(),
        native_atomics: gs
            .iter()
            .map(|a| gs.iter().map(|b| a.peer_caps(b).1).collect())
            .collect(),
        nvrtc: super::ffi::nvrtc_present(),
    })
}
