//! Symmetric GPU heaps: the PE's own allocation (static `cuMemAlloc` or VMM `cuMemCreate`) and
//! its peers' heaps mapped into this process (direct pointers for peers of this process, CUDA
//! IPC handles or POSIX file descriptors for the others). Never pool or managed memory, never
//! multicast objects.

use super::ffi::{self, check, cu};
use super::gpu::Gpu;
use crate::config::HeapKind;
use crate::error::Result;
use std::sync::Arc;

/// Bytes of a handle record exchanged at start-up (a `CUipcMemHandle` is 64 bytes).
pub(crate) const HANDLE_BYTES: usize = 64;

/// This PE's own heap allocation.
#[derive(Debug)]
pub(crate) struct OwnHeap {
    pub gpu: Arc<Gpu>,
    pub ptr: u64,
    pub bytes: usize,
    /// VMM: the allocation handle (released on drop) and the exported file descriptor.
    vmm: Option<(cu::CUmemGenericAllocationHandle, i32)>,
}

fn vmm_prop(ordinal: usize) -> cu::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is a valid "no flags" value; the fields that
    // matter are set below.
    let mut p: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal as i32;
    p
}

/// The VMM granularity of a GPU (recommended).
pub(crate) fn vmm_granularity(ordinal: usize) -> Result<usize> {
    let prop = vmm_prop(ordinal);
    let mut g = 0usize;
    // SAFETY: a valid property struct; writes one size.
    check(
        unsafe {
            cu::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(g.max(1 << 21))
}

fn set_access(ptr: u64, bytes: usize, ordinals: &[usize]) -> Result<()> {
    let descs: Vec<cu::CUmemAccessDesc> = ordinals
        .iter()
        .map(|&o| {
            // SAFETY: zeroed then filled; plain C struct.
            let mut d: cu::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            d.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            d.location.id = o as i32;
            d.flags = cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            d
        })
        .collect();
    // SAFETY: [ptr, ptr+bytes) is mapped; descs live for the call.
    check(
        unsafe { cu::cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len()) },
        "cuMemSetAccess",
    )
}

impl OwnHeap {
    /// Allocates `bytes` (already rounded to the granularity for VMM) on `gpu`, zeroed; a VMM heap
    /// is made accessible from every GPU in `access` (this GPU and those of same-process peers).
    pub fn create(gpu: &Arc<Gpu>, kind: HeapKind, bytes: usize, access: &[usize]) -> Result<Self> {
        let _g = gpu.bind()?;
        let mut h = OwnHeap {
            gpu: gpu.clone(),
            ptr: 0,
            bytes,
            vmm: None,
        };
        match kind {
            HeapKind::Static => {
                // SAFETY: context current; writes one pointer.
                check(
                    unsafe { cu::cuMemAlloc_v2(&mut h.ptr, bytes) },
                    "cuMemAlloc (symmetric heap)",
                )?;
            }
            HeapKind::Vmm => {
                let prop = vmm_prop(gpu.ordinal);
                let mut handle = 0;
                // SAFETY: valid property; writes one handle.
                check(
                    unsafe { cu::cuMemCreate(&mut handle, bytes, &prop, 0) },
                    "cuMemCreate",
                )?;
                h.vmm = Some((handle, -1));
                // SAFETY: reserves address space only.
                check(
                    unsafe { cu::cuMemAddressReserve(&mut h.ptr, bytes, 0, 0, 0) },
                    "cuMemAddressReserve",
                )?;
                // SAFETY: maps the whole allocation at the reserved range.
                let r = check(
                    unsafe { cu::cuMemMap(h.ptr, bytes, 0, handle, 0) },
                    "cuMemMap",
                );
                if let Err(e) = r {
                    // SAFETY: frees the reservation made above; nothing is mapped.
                    unsafe { cu::cuMemAddressFree(h.ptr, bytes) };
                    h.ptr = 0;
                    return Err(e);
                }
                let mut acc: Vec<usize> = access.to_vec();
                acc.push(gpu.ordinal);
                acc.sort_unstable();
                acc.dedup();
                set_access(h.ptr, bytes, &acc)?;
                let mut fd: i32 = -1;
                // SAFETY: exports the allocation as a POSIX fd written into `fd`.
                check(
                    unsafe {
                        cu::cuMemExportToShareableHandle(
                            &mut fd as *mut i32 as *mut std::ffi::c_void,
                            handle,
                            cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                            0,
                        )
                    },
                    "cuMemExportToShareableHandle",
                )?;
                h.vmm = Some((handle, fd));
            }
        }
        // SAFETY: the range is this allocation.
        check(unsafe { cu::cuMemsetD8_v2(h.ptr, 0, bytes) }, "cuMemsetD8")?;
        // SAFETY: waits for the memset (legacy stream).
        check(unsafe { cu::cuCtxSynchronize() }, "cuCtxSynchronize")?;
        Ok(h)
    }

    /// The record peers of other processes need: an IPC handle (static) or the fd number (VMM).
    pub fn export(&self) -> Result<[u8; HANDLE_BYTES]> {
        let mut out = [0u8; HANDLE_BYTES];
        match self.vmm {
            None => {
                let _g = self.gpu.bind()?;
                // SAFETY: zeroed is a valid handle value to be overwritten.
                let mut ipc: cu::CUipcMemHandle = unsafe { std::mem::zeroed() };
                // SAFETY: ptr is the base of a cuMemAlloc allocation.
                check(
                    unsafe { cu::cuIpcGetMemHandle(&mut ipc, self.ptr) },
                    "cuIpcGetMemHandle",
                )?;
                for (o, c) in out.iter_mut().zip(ipc.reserved.iter()) {
                    *o = *c as u8;
                }
            }
            Some((_, fd)) => out[..4].copy_from_slice(&fd.to_le_bytes()),
        }
        Ok(out)
    }

    /// Closes the exported fd (after every peer has taken its copy).
    pub fn close_export(&mut self) {
        if let Some((_, fd)) = &mut self.vmm {
            if *fd >= 0 {
                // SAFETY: an fd this object owns, closed once.
                unsafe { libc::close(*fd) };
                *fd = -1;
            }
        }
    }
}

impl OwnHeap {
    /// Waits for every piece of work on this heap's GPU (all streams of its context).
    pub fn quiesce(&self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: a context-wide synchronisation; no memory is touched.
            unsafe { cu::cuCtxSynchronize() };
        }
    }
}

impl Drop for OwnHeap {
    fn drop(&mut self) {
        self.close_export();
        let Ok(_g) = self.gpu.bind() else { return };
        // SAFETY: quiesce the device before freeing memory kernels may still use.
        unsafe { cu::cuCtxSynchronize() };
        match self.vmm {
            None if self.ptr != 0 => {
                // SAFETY: a cuMemAlloc allocation, freed once.
                unsafe { cu::cuMemFree_v2(self.ptr) };
            }
            Some((handle, _)) => {
                // SAFETY: unmap, free the range and release the handle made in `create`.
                unsafe {
                    if self.ptr != 0 {
                        cu::cuMemUnmap(self.ptr, self.bytes);
                        cu::cuMemAddressFree(self.ptr, self.bytes);
                    }
                    cu::cuMemRelease(handle);
                }
            }
            _ => {}
        }
    }
}

/// A peer heap of another process mapped here.
#[derive(Debug)]
pub(crate) struct PeerMap {
    gpu: Arc<Gpu>,
    pub ptr: u64,
    bytes: usize,
    vmm: Option<cu::CUmemGenericAllocationHandle>,
    /// Static heaps: the key of the shared opening in [`IPC_OPEN`].
    ipc: Option<IpcKey>,
}

/// A CUDA IPC handle opened on one GPU (primary context) of this process.
type IpcKey = (usize, [u8; 64]);

/// The IPC handles this process has open, with how many `PeerMap`s use each: a context can
/// open a handle once (a second `cuIpcOpenMemHandle` fails with `CUDA_ERROR_ALREADY_MAPPED`),
/// and in mixed mode every thread-PE of a process maps the same peer heaps on a shared GPU.
static IPC_OPEN: std::sync::Mutex<Vec<(IpcKey, u64, usize)>> = std::sync::Mutex::new(Vec::new());

/// Opens (or shares the opening of) `ipc` on `gpu`; returns the mapped address.
fn ipc_open(key: &IpcKey, ipc: cu::CUipcMemHandle) -> Result<u64> {
    let mut open = IPC_OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = open.iter_mut().find(|e| e.0 == *key) {
        e.2 += 1;
        return Ok(e.1);
    }
    let mut p = 0;
    // SAFETY: a handle made by cuIpcGetMemHandle in the peer process, not open in this
    // context (checked under the lock above); the caller made the GPU's context current.
    check(
        unsafe {
            cu::cuIpcOpenMemHandle_v2(
                &mut p,
                ipc,
                cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        },
        "cuIpcOpenMemHandle",
    )?;
    open.push((*key, p, 1));
    Ok(p)
}

/// Drops one use of the opening `key`; closes it after the last (context current).
fn ipc_close(key: &IpcKey) {
    let mut open = IPC_OPEN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = open.iter().position(|e| e.0 == *key) else {
        return;
    };
    open[i].2 -= 1;
    if open[i].2 == 0 {
        let (_, p, _) = open.swap_remove(i);
        // SAFETY: opened by `ipc_open`, no user left.
        unsafe { cu::cuIpcCloseMemHandle(p) };
    }
}

/// Takes a copy of file descriptor `fd` of process `pid` (pidfd_getfd; needs ptrace rights over
/// it, which a launcher's children of one user have unless the Yama policy forbids it).
fn take_fd(pid: u32, fd: i32) -> Result<i32> {
    // SAFETY: plain syscalls with integer arguments.
    let pidfd =
        unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if pidfd < 0 {
        return Err(ffi::err(format!(
            "pidfd_open({pid}) failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: as above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd,
            fd as libc::c_long,
            0 as libc::c_long,
        )
    };
    let e = std::io::Error::last_os_error();
    // SAFETY: closes the pidfd opened above.
    unsafe { libc::close(pidfd as i32) };
    if r < 0 {
        return Err(ffi::err(format!(
            "pidfd_getfd(pid {pid}, fd {fd}) failed: {e} (VMM heaps across processes need \
             ptrace rights over peers; try RSHMEM_HEAP=static)"
        )));
    }
    Ok(r as i32)
}

impl PeerMap {
    /// Maps a peer's heap described by `handle` (from its `export`) on `gpu`.
    pub fn open(
        gpu: &Arc<Gpu>,
        kind: HeapKind,
        handle: &[u8],
        bytes: usize,
        pid: u32,
    ) -> Result<PeerMap> {
        let _g = gpu.bind()?;
        match kind {
            HeapKind::Static => {
                // SAFETY: zeroed then filled from the peer's 64 bytes.
                let mut ipc: cu::CUipcMemHandle = unsafe { std::mem::zeroed() };
                for (d, s) in ipc.reserved.iter_mut().zip(handle.iter()) {
                    *d = *s as std::ffi::c_char;
                }
                let mut key: IpcKey = (gpu.ordinal, [0; 64]);
                for (d, s) in key.1.iter_mut().zip(handle.iter()) {
                    *d = *s;
                }
                let p = ipc_open(&key, ipc)?;
                Ok(PeerMap {
                    gpu: gpu.clone(),
                    ptr: p,
                    bytes,
                    vmm: None,
                    ipc: Some(key),
                })
            }
            HeapKind::Vmm => {
                let peer_fd = i32::from_le_bytes([handle[0], handle[1], handle[2], handle[3]]);
                let fd = take_fd(pid, peer_fd)?;
                let mut h = 0;
                // SAFETY: imports a POSIX fd made by cuMemExportToShareableHandle.
                let r = check(
                    unsafe {
                        cu::cuMemImportFromShareableHandle(
                            &mut h,
                            fd as isize as *mut std::ffi::c_void,
                            cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                        )
                    },
                    "cuMemImportFromShareableHandle",
                );
                // SAFETY: the imported handle holds its own reference.
                unsafe { libc::close(fd) };
                r?;
                let mut m = PeerMap {
                    gpu: gpu.clone(),
                    ptr: 0,
                    bytes,
                    vmm: Some(h),
                    ipc: None,
                };
                // SAFETY: reserve, then map the imported allocation there.
                check(
                    unsafe { cu::cuMemAddressReserve(&mut m.ptr, bytes, 0, 0, 0) },
                    "cuMemAddressReserve",
                )?;
                let r = check(unsafe { cu::cuMemMap(m.ptr, bytes, 0, h, 0) }, "cuMemMap");
                if let Err(e) = r {
                    // SAFETY: nothing mapped; frees the reservation.
                    unsafe { cu::cuMemAddressFree(m.ptr, bytes) };
                    m.ptr = 0;
                    return Err(e);
                }
                set_access(m.ptr, bytes, &[gpu.ordinal])?;
                Ok(m)
            }
        }
    }
}

impl Drop for PeerMap {
    fn drop(&mut self) {
        let Ok(_g) = self.gpu.bind() else { return };
        // SAFETY: mappings made in `open`, undone once.
        unsafe {
            cu::cuCtxSynchronize();
            match self.vmm {
                None => {
                    if let Some(key) = &self.ipc {
                        ipc_close(key);
                    }
                }
                Some(h) => {
                    if self.ptr != 0 {
                        cu::cuMemUnmap(self.ptr, self.bytes);
                        cu::cuMemAddressFree(self.ptr, self.bytes);
                    }
                    cu::cuMemRelease(h);
                }
            }
        }
    }
}
