//! GPU heaps registered with the fabric (`FI_HMEM_CUDA`), where the provider takes device
//! memory (verbs and EFA with GPUDirect RDMA, cxi, shm built with CUDA): puts and gets to the
//! GPU heap of a PE on another node are one RMA operation each, with no request to its proxy
//! and no host copy on either side when the local side lies in this PE's registered heap too.
//!
//! Registration is collective and all-or-none: every PE registers its heap (and the sync area
//! after it) and publishes the key; if any PE could not (its provider does not take device
//! memory, the registration failed), every PE keeps to the staged path (`staging.rs`), so two
//! PEs never disagree on how a transfer between them travels.
//!
//! Atomics and signals on GPU heaps stay staged requests, carried out by the target's proxy
//! on its own GPU: a provider's atomics on device memory are not coherent with the atomics the
//! target's kernels issue on the same word. A signal after a put still follows its data: a put
//! here returns when the provider reports delivery completion.

use super::{MemoryRegion, Net, Remote};
use crate::backend::cuda::remote::DeviceCopy;
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use std::sync::Arc;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Hmem {
    net: Arc<Net>,
    /// This PE's registered heap.
    mr: MemoryRegion,
    /// Its device address (where the registration starts).
    base: u64,
    /// Every PE's registered heap (this PE's own included).
    remotes: Vec<Remote>,
}

impl Hmem {
    /// Registers `len` bytes of GPU `device`'s memory at device address `base` (PE `me`'s heap
    /// and sync area) and exchanges the keys, collectively over `boot`; `None` on every PE when
    /// any PE's provider does not take device memory or its registration failed.
    ///
    /// # Safety
    /// The range must stay allocated and mapped for the life of the returned value.
    pub unsafe fn open_cuda(
        net: Arc<Net>,
        boot: &dyn Bootstrap,
        me: usize,
        base: u64,
        len: usize,
        device: usize,
    ) -> Result<Option<Hmem>> {
        let ep = net.endpoint();
        let mr = match ep.hmem {
            // SAFETY: the caller's contract.
            true => unsafe { MemoryRegion::register_cuda(ep, base, len, device) },
            false => Err(Error::Fabric {
                op: "fi_mr_regattr",
                pe: None,
                msg: format!("provider {} does not take device memory", ep.provider),
            }),
        };
        // One read of the registration through the provider before any kernel of this PE runs.
        // A provider that copies device memory with the CUDA runtime (shm, tcp-based ones)
        // initialises the runtime in the context on its first copy, and that waits for every
        // kernel running in the context: a kernel spinning on a wait for that very copy would
        // hold it until the kernel's own timeout.
        let mr = mr.and_then(|m| {
            let mut probe = [0u8; 8];
            ep.read(me, &m.remote(), 0, &mut probe).map(|()| m)
        });
        Self::agree(net, boot, mr, base)
    }

    /// Publishes this PE's registration (or its failure) and takes the others'.
    pub(super) fn agree(
        net: Arc<Net>,
        boot: &dyn Bootstrap,
        mr: Result<MemoryRegion>,
        base: u64,
    ) -> Result<Option<Hmem>> {
        let mut rec = vec![mr.is_ok() as u8];
        if let Ok(m) = &mr {
            rec.extend_from_slice(&m.remote().to_bytes());
        }
        let all = boot.allgather(&rec)?;
        let mut remotes = Vec::with_capacity(all.len());
        let mut refused = Vec::new();
        for (pe, r) in all.iter().enumerate() {
            match (r.first(), r.get(1..).and_then(Remote::from_bytes)) {
                (Some(1), Some(remote)) => remotes.push(remote),
                (Some(0), _) if r.len() == 1 => refused.push(pe),
                _ => {
                    return Err(Error::Bootstrap {
                        pe: Some(pe),
                        msg: "malformed GPU heap registration record".into(),
                    })
                }
            }
        }
        match (mr, refused.is_empty()) {
            (Ok(mr), true) => Ok(Some(Hmem {
                net,
                mr,
                base,
                remotes,
            })),
            (mine, _) => {
                tracing::debug!(
                    ?refused,
                    reason = %mine.err().map_or_else(|| "another PE's".into(), |e| e.to_string()),
                    "GPU heaps are not registered with the fabric: transfers to them are staged"
                );
                Ok(None)
            }
        }
    }

    /// `PeerLost` naming `pe` when it is known lost (a transfer that gave up on it), else `e`.
    fn lost_or(&self, pe: usize, op: &'static str, e: Error) -> Error {
        match self.net.is_lost(pe) {
            true => Error::PeerLost { pe, op },
            false => e,
        }
    }

    /// PE `pe`'s registered heap, checked to hold `len` bytes at `offset`.
    fn remote(&self, pe: usize, offset: usize, len: usize) -> Result<&Remote> {
        let r = self
            .remotes
            .get(pe)
            .ok_or_else(|| Error::invalid(format!("PE {pe} has no registered GPU heap")))?;
        match offset.checked_add(len) {
            Some(end) if end as u64 <= r.len => Ok(r),
            _ => Err(Error::invalid(format!(
                "{len} bytes at {offset} are outside PE {pe}'s GPU heap of {} bytes",
                r.len
            ))),
        }
    }

    /// Where device range `addr..addr + len` lies in this PE's registration, if it does.
    fn local(&self, addr: u64, len: usize) -> Option<usize> {
        let at = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        (at.checked_add(len)? <= self.mr.len()).then_some(at)
    }

    /// Host bytes `src` into PE `pe`'s GPU heap at `offset`: in its memory when this returns.
    pub fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        let r = self.remote(pe, offset, src.len())?;
        self.net
            .endpoint()
            .write(pe, r, offset, src, true)
            .map_err(|e| self.lost_or(pe, "fabric put", e))
    }

    /// PE `pe`'s GPU heap bytes from `offset` into host memory `dst`.
    pub fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        let r = self.remote(pe, offset, dst.len())?;
        self.net
            .endpoint()
            .read(pe, r, offset, dst)
            .map_err(|e| self.lost_or(pe, "fabric get", e))
    }

    /// `len` bytes at device address `src` into PE `pe`'s GPU heap at `offset`: straight from
    /// this PE's registered heap where `src` lies in it, else copied to the host first.
    pub fn put_from_device(
        &self,
        copies: &dyn DeviceCopy,
        pe: usize,
        offset: usize,
        src: u64,
        len: usize,
    ) -> Result<()> {
        let r = self.remote(pe, offset, len)?;
        match self.local(src, len) {
            Some(at) => self
                .net
                .endpoint()
                .transfer_registered(pe, r, offset, (&self.mr, at, len), true)
                .map_err(|e| self.lost_or(pe, "fabric put", e)),
            None => {
                let mut buf = vec![0u8; len];
                copies.copy_from_device(src, &mut buf)?;
                self.put(pe, offset, &buf)
            }
        }
    }

    /// `len` bytes of PE `pe`'s GPU heap from `offset` to device address `dst`: straight into
    /// this PE's registered heap where `dst` lies in it, else through the host.
    pub fn get_to_device(
        &self,
        copies: &dyn DeviceCopy,
        pe: usize,
        offset: usize,
        dst: u64,
        len: usize,
    ) -> Result<()> {
        let r = self.remote(pe, offset, len)?;
        match self.local(dst, len) {
            Some(at) => self
                .net
                .endpoint()
                .transfer_registered(pe, r, offset, (&self.mr, at, len), false)
                .map_err(|e| self.lost_or(pe, "fabric get", e)),
            None => {
                let mut buf = vec![0u8; len];
                self.get(pe, offset, &mut buf)?;
                copies.copy_to_device(dst, &buf)
            }
        }
    }
}

#[cfg(test)]
#[path = "hmem_tests.rs"]
mod tests;
