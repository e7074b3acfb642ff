//! What the host reads back after a step: the errors latched on the device (turned into
//! `Error`s and cleared, with the sentinel put back where rows announce themselves) and the
//! device handle of the last dispatch.

use super::{
    words_u32, GpuBuffer, HostHandle, CTL_ERR, CTL_GO, CTL_INFO, CTL_ROWS, CTL_XABORT, ERR_ABORT,
    ERR_CAPACITY, ERR_CORRUPT, ERR_MINE, ERR_PEER,
};
use crate::backend::cuda::ffi;
use crate::device::CudaPe;
use crate::elem::Elem;
use crate::ep::RecvLayout;
use crate::error::{Error, Result};
use crate::Pe;

impl<T: Elem> GpuBuffer<T> {
    fn take_error(&self, pe: &Pe) -> Result<(u64, u64)> {
        let v = pe.local_vec(&self.view::<u64>(self.plan.ctl, 16)?)?;
        self.clear_error(pe, &v)
    }

    /// Clears the latched error of control words `v` (as read from the device); returns (error
    /// bits, info).
    pub(super) fn clear_error(&self, pe: &Pe, v: &[u64]) -> Result<(u64, u64)> {
        // A PE of another node sets its own word for the abort bit (device atomics do not
        // cross nodes).
        let err = v[CTL_ERR] | if v[CTL_XABORT] != 0 { ERR_ABORT } else { 0 };
        if err != 0 {
            self.fill_sentinel(pe)?;
            let ctl = self.view::<u64>(self.plan.ctl, 16)?;
            pe.local_write(&ctl, CTL_ERR, &[0u64, 0u64])?;
            pe.local_write(&ctl, CTL_XABORT, &[0u64])?;
        }
        Ok((err, v[CTL_INFO]))
    }

    /// Fills the areas whose rows announce themselves with the sentinel (every 32-bit word all
    /// ones): the receive area of an expert-major buffer (`ep_pstream` waits for a peer's row
    /// until no element of it is the sentinel) and, where the split combine runs, the combine
    /// area (both halves; `ep_csplit`'s summers wait alike). At creation, and after any failed
    /// step, whose rows may be half there.
    pub(super) fn fill_sentinel(&self, pe: &Pe) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let base = g.ptr(&self.area)?;
        let row = self.cfg.hidden * std::mem::size_of::<T>();
        let rows = self.n * self.plan.cap;
        if self.cfg.layout == RecvLayout::ExpertMajor {
            // Whole 32-bit words: the area ends on a 256-byte boundary (plan).
            g.backend().fill_u32(
                base + self.plan.recv_x as u64,
                u32::MAX,
                (rows * row).div_ceil(4),
            )?;
        }
        if self.split {
            g.backend()
                .fill_u32(base + self.plan.comb as u64, u32::MAX, 2 * rows * row / 4)?;
        }
        Ok(())
    }

    /// Reports errors latched on the device by earlier calls (call after synchronising the
    /// stream): capacity overflow ([`Error::Capacity`], nothing was moved), invalid ids or
    /// weights on some PE, device wait timeouts. Clears them.
    pub fn check(&self, pe: &Pe) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let own = g.check_device_errors();
        let (err, info) = self.take_error(pe)?;
        own?;
        self.error_of(&g, err, info)
    }

    /// [`check`](Self::check) with control words already read (`ctl`), the device error word
    /// only with `device` (else it was read as 0 behind the kernels).
    pub(super) fn check_words(&self, pe: &Pe, ctl: &[u64], device: bool) -> Result<()> {
        let g = CudaPe::new(pe)?;
        let own = if device {
            g.check_device_errors()
        } else {
            Ok(())
        };
        let (err, info) = self.clear_error(pe, ctl)?;
        own?;
        self.error_of(&g, err, info)
    }

    /// The error of latched error bits `err` and info word `info`.
    fn error_of(&self, g: &CudaPe, err: u64, info: u64) -> Result<()> {
        if err & ERR_ABORT != 0 {
            // A peer gave up waiting (its own check reports that timeout): this PE used
            // nothing that followed; its outputs of that step are left as they were.
            return Err(Error::Timeout {
                op: "ep step (a team member's device-side wait timed out; nothing after it was used)",
                pe: None,
                after: g.backend().timeout,
            });
        }
        if err & ERR_CAPACITY != 0 {
            return Err(Error::Capacity {
                op: "ep dispatch",
                src_pe: ((info >> 24) & 0xff) as usize,
                dst_pe: (info & 0xff_ffff) as usize,
                needed: (info >> 32) as usize,
                capacity: self.plan.cap,
            });
        }
        if err & ERR_MINE != 0 {
            return Err(Error::invalid(
                "ep dispatch: an expert id is out of range (-1 or 0..E) or a used slot's weight \
                 is not finite in this PE's input; nothing was sent",
            ));
        }
        if err & ERR_PEER != 0 {
            return Err(Error::invalid(format!(
                "ep dispatch: PE {} (team index) rejected its input; nothing was sent",
                info & 0xff_ffff
            )));
        }
        if err & ERR_CORRUPT != 0 {
            return Err(ffi::err("ep: inconsistent counts on the device"));
        }
        Ok(())
    }

    /// True when the last dispatch moved data (the device decision; after a synchronisation).
    pub fn last_dispatch_ok(&self, pe: &Pe) -> Result<bool> {
        Ok(pe.local_vec(&self.view::<u64>(self.plan.ctl, 16)?)?[CTL_GO] == 1)
    }

    /// Copies the last dispatch's device handle to the host (after a synchronisation).
    pub fn host_handle(&self, pe: &Pe) -> Result<HostHandle> {
        let p = &self.plan;
        let el = self.cfg.num_experts / self.n;
        let k = self.cfg.max_topk;
        let ctl = pe.local_vec(&self.view::<u64>(p.ctl, 16)?)?;
        let recv = words_u32(&pe.local_vec(&self.view::<u32>(p.recv_cnt, self.n)?)?);
        let off = words_u32(&pe.local_vec(&self.view::<u32>(p.expert_off, el + 1)?)?);
        let nrows = ctl[CTL_ROWS] as usize;
        if nrows > p.rmax || off[el] != nrows {
            return Err(ffi::err("ep: inconsistent row count on the device"));
        }
        let rs = pe.local_vec(&self.view::<u32>(p.row_src, p.rmax)?)?;
        let meta = pe.local_vec(&self.view::<u32>(p.recv_meta, self.n * p.cap * p.rmw)?)?;
        let mut rows = Vec::with_capacity(nrows);
        for &v in &rs[..nrows] {
            let (gi, j) = (v as usize / k, v as usize % k);
            rows.push((gi / p.cap, meta[gi * p.rmw] as usize, j));
        }
        Ok(HostHandle {
            recv_tokens_per_pe: recv,
            expert_offsets: off,
            rows,
        })
    }
}
