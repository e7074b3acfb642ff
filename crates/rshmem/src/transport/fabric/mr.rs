//! Memory registration: a registered range, its key and descriptor, and what a peer needs to
//! reach it (`Remote`: base address and key, exchanged at start-up).

use super::endpoint::{Endpoint, State};
use super::ffi::*;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// What a peer needs to address a registered range: the base the provider expects (the
/// virtual address under `FI_MR_VIRT_ADDR`, else 0) and the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Remote {
    pub base: u64,
    pub key: u64,
    pub len: u64,
}

impl Remote {
    /// The target address of byte `offset` of the range.
    pub fn addr(&self, offset: usize) -> u64 {
        self.base.wrapping_add(offset as u64)
    }
    /// The 24-byte form sent to peers.
    pub fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.base.to_le_bytes());
        b[8..16].copy_from_slice(&self.key.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    /// The inverse of `to_bytes`; `None` for a record of the wrong length.
    pub fn from_bytes(b: &[u8]) -> Option<Remote> {
        if b.len() != 24 {
            return None;
        }
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Remote {
            base: w(0),
            key: w(8),
            len: w(16),
        })
    }
}

/// A registered range of this process's memory. Holds the endpoint's handles, so the domain is
/// closed only after every registration.
pub(crate) struct MemoryRegion {
    mr: *mut fid_mr,
    ptr: *mut u8,
    len: usize,
    remote: Remote,
    _owned: Option<Box<[u8]>>,
    _state: Arc<Mutex<State>>,
}

// SAFETY: the MR handle is only closed (once, on drop); the memory is owned or outlives it.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only reads the fields.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len)
            .field("remote", &self.remote)
            .finish()
    }
}

impl MemoryRegion {
    /// Registers `len` bytes at `ptr` for local use and remote reads, writes and atomics.
    ///
    /// # Safety
    /// The range must stay mapped for the life of the registration.
    pub unsafe fn register(ep: &Endpoint, ptr: *mut u8, len: usize) -> Result<MemoryRegion> {
        Self::reg(ep, ptr, len, None, None)
    }

    /// Registers `len` bytes of CUDA memory of GPU `device` at device address `ptr`, on an
    /// endpoint that takes device memory ([`Endpoint::hmem`]).
    ///
    /// # Safety
    /// The range must stay allocated and mapped for the life of the registration.
    pub unsafe fn register_cuda(
        ep: &Endpoint,
        ptr: u64,
        len: usize,
        device: usize,
    ) -> Result<MemoryRegion> {
        let device = c_int::try_from(device)
            .map_err(|_| Error::invalid(format!("GPU ordinal {device} out of range")))?;
        Self::reg(ep, ptr as *mut u8, len, None, Some(device))
    }

    /// Registers memory the registration owns.
    pub fn register_owned(ep: &Endpoint, mut buf: Box<[u8]>) -> Result<MemoryRegion> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        Self::reg(ep, ptr, len, Some(buf), None)
    }

    /// Registers host memory (`cuda`: `None`) or memory of that CUDA device.
    fn reg(
        ep: &Endpoint,
        ptr: *mut u8,
        len: usize,
        owned: Option<Box<[u8]>>,
        cuda: Option<c_int>,
    ) -> Result<MemoryRegion> {
        let state = ep.state().clone();
        let lib = ep.lib();
        let access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
        let mut mr: *mut fid_mr = std::ptr::null_mut();
        let rc = {
            let s = state.lock().unwrap_or_else(|e| e.into_inner());
            let dom = s.domain();
            let requested_key = ptr as u64 >> 12;
            match cuda {
                Some(device) => {
                    let iov = iovec {
                        iov_base: ptr.cast(),
                        iov_len: len,
                    };
                    let attr = fi_mr_attr {
                        mr_iov: &iov,
                        iov_count: 1,
                        access,
                        offset: 0,
                        requested_key,
                        context: std::ptr::null_mut(),
                        auth_key_size: 0,
                        auth_key: std::ptr::null_mut(),
                        iface: FI_HMEM_CUDA,
                        device: device as u32 as u64,
                    };
                    // SAFETY: an open domain of an endpoint opened with FI_HMEM; the attribute
                    // and its iovec are read during the call; the device range is allocated
                    // (the caller's contract).
                    unsafe { ((*(*dom).mr).regattr)(dom.cast(), &attr, 0, &mut mr) }
                }
                // SAFETY: an open domain; the range is mapped (the caller's contract); the key
                // is ignored under FI_MR_PROV_KEY and unique per domain otherwise (the address).
                None => unsafe {
                    ((*(*dom).mr).reg)(
                        dom.cast(),
                        ptr as *const c_void,
                        len,
                        access,
                        0,
                        requested_key,
                        0,
                        &mut mr,
                        std::ptr::null_mut(),
                    )
                },
            }
        };
        if rc != 0 || mr.is_null() {
            return Err(Error::Fabric {
                op: "fi_mr_reg",
                pe: None,
                msg: match cuda {
                    Some(d) => format!(
                        "{len} bytes of GPU {d}'s memory: {}",
                        lib.strerror(rc as isize)
                    ),
                    None => format!("{len} bytes: {}", lib.strerror(rc as isize)),
                },
            });
        }
        // SAFETY: a registered MR; its key is valid from here on.
        let key = unsafe { (*mr).key };
        let base = if ep.mr_mode & FI_MR_VIRT_ADDR != 0 {
            ptr as u64
        } else {
            0
        };
        Ok(MemoryRegion {
            mr,
            ptr,
            len,
            remote: Remote {
                base,
                key,
                len: len as u64,
            },
            _owned: owned,
            _state: state,
        })
    }

    /// What peers need to reach this range.
    pub fn remote(&self) -> Remote {
        self.remote
    }
    /// The address of byte `at` of the range, for an operation on `len` bytes from there;
    /// an error when they do not lie inside it.
    pub fn at(&self, at: usize, len: usize) -> Result<*mut u8> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr.wrapping_add(at)),
            _ => Err(Error::invalid(format!(
                "{len} bytes at {at} are outside a registered range of {} bytes",
                self.len
            ))),
        }
    }
    /// Bytes of the range.
    pub fn len(&self) -> usize {
        self.len
    }
    /// The local descriptor for operations whose local buffer lies in this range.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: the MR is open for the life of self.
        unsafe { (*self.mr).mem_desc }
    }
    /// Start of the range.
    #[cfg(test)]
    pub fn ptr(&self) -> *mut c_void {
        self.ptr.cast()
    }
    /// The range, for owned registrations (empty otherwise).
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        self._owned.as_deref().unwrap_or(&[])
    }
    /// The range, mutably, for owned registrations (empty otherwise).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self._owned.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _guard = self._state.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: an open MR, closed once, before its domain (we hold the state).
        unsafe {
            let f: *mut fid = self.mr.cast();
            ((*(*f).ops).close)(f);
        }
    }
}
