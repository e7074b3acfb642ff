//! Pipelined puts and gets: a transfer is cut into chunks, each staged in a slot the endpoint
//! owns, and up to a window of them is in flight at once; completions are reaped as they come
//! and the window refilled, so copying, posting and the wire overlap.
//!
//! A put that must be delivered when it returns asks for delivery completion on its last chunk
//! only when the provider places the data of RMA writes to one peer in the order they were
//! posted (`FI_ORDER_WAW` or `FI_ORDER_RMA_WAW` in the endpoint's message order, and
//! `max_order_waw_size`, the data-placement ordering, covering a chunk): the last chunk's data
//! is then in the target's memory after every earlier chunk's, and the earlier chunks need
//! only transmit completion. Otherwise every chunk asks for delivery completion (tcp;ofi_rxm
//! reports message ordering but a `max_order_waw_size` of 0, and offers no endpoint with
//! atomics when `FI_ORDER_WAW` is asked for).
//!
//! A wait that gives up (deadline, lost peer, a failed chunk) leaves the slots still in flight
//! to the provider for good (they are leaked, never reused), since a late completion could
//! still read or write them.

use super::endpoint::{fail, Endpoint};
use super::ffi::*;
use super::mr::{MemoryRegion, Remote};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Largest chunk one operation moves.
pub(super) const CHUNK: usize = 256 << 10;
/// Most chunks of one transfer in flight (further bounded by the provider's transmit queue).
pub(super) const WINDOW: usize = 16;
/// Staging slots the endpoint keeps for reuse at all times.
const POOL: usize = 2 * WINDOW;
/// Slots kept for reuse while demand outgrew the pool within [`BURST_HOLD`] (windows of
/// non-blocking gets hold each one's staging until its handle collects it): 64 MiB at most,
/// handed back once the burst is over: fresh memory for each chunk of such a window costs
/// more than the copy (its page faults).
const POOL_BURST: usize = 16 * WINDOW;
/// How long after the pool last ran dry the slots beyond [`POOL`] are kept.
pub(super) const BURST_HOLD: Duration = Duration::from_secs(1);
/// Size of the small staging slots, for chunks up to this size (non-blocking operations keep
/// many small ones in flight: a full-chunk slot each would be 64 times the memory).
pub(super) const SMALL: usize = 4096;
/// Small slots the endpoint keeps for reuse.
const SMALL_POOL: usize = 1024;

/// Free staging slots of one size, kept for reuse: `keep` always, up to `burst` while the
/// pool ran dry less than [`BURST_HOLD`] ago.
pub(super) struct Pool {
    slots: Vec<Slot>,
    keep: usize,
    burst: usize,
    dry_at: Option<Instant>,
}

impl Pool {
    pub(super) fn new(small: bool) -> Pool {
        let (keep, burst) = if small {
            (SMALL_POOL, SMALL_POOL)
        } else {
            (POOL, POOL_BURST)
        };
        Pool {
            slots: Vec::new(),
            keep,
            burst,
            dry_at: None,
        }
    }

    fn recent(&self) -> bool {
        self.dry_at.is_some_and(|t| t.elapsed() < BURST_HOLD)
    }

    fn take(&mut self) -> Option<Slot> {
        let s = self.slots.pop();
        if s.is_none() {
            self.dry_at = Some(Instant::now());
        }
        s
    }

    /// Keeps `s`, or hands it back to be freed (outside the pool's lock).
    fn give(&mut self, s: Slot) -> Option<Slot> {
        let n = self.slots.len();
        if n < self.keep || (n < self.burst && self.recent()) {
            self.slots.push(s);
            return None;
        }
        Some(s)
    }

    /// The slots beyond `keep` once the burst is over, to be freed (outside the lock).
    pub(super) fn trim(&mut self) -> Vec<Slot> {
        if self.slots.len() <= self.keep || self.recent() {
            return Vec::new();
        }
        self.slots.split_off(self.keep)
    }

    pub(super) fn clear(&mut self) {
        self.slots.clear();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Staging memory of one chunk: plain memory, or a registration where the provider wants
/// local buffers registered (`FI_MR_LOCAL`).
pub(super) enum Slot {
    Plain(Box<[u8]>),
    Registered(MemoryRegion),
}

impl Slot {
    pub(super) fn bytes(&mut self) -> &mut [u8] {
        match self {
            Slot::Plain(b) => b,
            Slot::Registered(m) => m.bytes_mut(),
        }
    }
    /// Bytes the slot holds.
    pub(super) fn cap(&mut self) -> usize {
        self.bytes().len()
    }
    pub(super) fn desc(&self) -> *mut c_void {
        match self {
            Slot::Plain(_) => std::ptr::null_mut(),
            Slot::Registered(m) => m.desc(),
        }
    }
}

/// Which way a transfer goes.
pub(super) enum Dir<'a> {
    /// Write `src`; `delivery`: the data must be in the target's memory on return.
    Put { src: &'a [u8], delivery: bool },
    /// Read into `dst`.
    Get { dst: &'a mut [u8] },
    /// Write `len` bytes of registered memory at `ptr` in place (its region's descriptor
    /// `desc`): no staging, the provider reads it (a GPU heap under `FI_HMEM`).
    PutFrom {
        ptr: *const u8,
        len: usize,
        desc: *mut c_void,
        delivery: bool,
    },
    /// Read `len` bytes into registered memory at `ptr` in place.
    GetInto {
        ptr: *mut u8,
        len: usize,
        desc: *mut c_void,
    },
}

impl Dir<'_> {
    fn len(&self) -> usize {
        match self {
            Dir::Put { src, .. } => src.len(),
            Dir::Get { dst } => dst.len(),
            Dir::PutFrom { len, .. } | Dir::GetInto { len, .. } => *len,
        }
    }

    /// Byte `lo` of the registered memory moved in place, and its descriptor; `None` where
    /// chunks are staged.
    fn in_place(&self, lo: usize) -> Option<(*mut u8, *mut c_void)> {
        match *self {
            // wrapping_add: only an address for the provider, never dereferenced here.
            Dir::PutFrom { ptr, desc, .. } => Some((ptr.wrapping_add(lo).cast_mut(), desc)),
            Dir::GetInto { ptr, desc, .. } => Some((ptr.wrapping_add(lo), desc)),
            Dir::Put { .. } | Dir::Get { .. } => None,
        }
    }
}

/// Posts one chunk on `ep`: for `get` a read into the `n` bytes at `ptr` (registration
/// `desc`), else a write of them with `flags`, at `raddr` under `key` of the peer at `addr`;
/// the provider's return code.
///
/// # Safety
/// `ep` is an enabled endpoint; the `n` bytes at `ptr` stay alive until the chunk completes.
pub(super) unsafe fn post_rma(
    ep: *mut fid_ep,
    get: bool,
    (ptr, n, desc): (*mut u8, usize, *mut c_void),
    (addr, raddr, key): (fi_addr_t, u64, u64),
    ctx: *mut c_void,
    flags: u64,
) -> ssize_t {
    if get {
        // SAFETY: the caller's contract; the provider writes n bytes at `ptr`.
        return unsafe { ((*(*ep).rma).read)(ep, ptr.cast(), n, desc, addr, raddr, key, ctx) };
    }
    let iov = iovec {
        iov_base: ptr.cast(),
        iov_len: n,
    };
    let rma = fi_rma_iov {
        addr: raddr,
        len: n,
        key,
    };
    let mut d = desc;
    let msg = fi_msg_rma {
        msg_iov: &iov,
        desc: &mut d,
        iov_count: 1,
        addr,
        rma_iov: &rma,
        rma_iov_count: 1,
        context: ctx,
        data: 0,
    };
    // SAFETY: the caller's contract; the message is read during the call.
    unsafe { ((*(*ep).rma).writemsg)(ep, &msg, flags) }
}

/// A posted chunk: its completion id, its index and its staging (`None`: moved in place).
struct Flight {
    id: u64,
    k: usize,
    len: usize,
    slot: Option<Slot>,
}

impl Endpoint {
    /// A free staging slot of `CHUNK` bytes (taken from the pool or made). Never called with
    /// the state locked (a registration locks it).
    fn take_slot(&self) -> Result<Slot> {
        self.take_slot_for(CHUNK)
    }

    /// A free staging slot for a chunk of `len` bytes: a small one up to [`SMALL`], else one of
    /// `CHUNK` bytes. Never called with the state locked.
    pub(super) fn take_slot_for(&self, len: usize) -> Result<Slot> {
        let small = len <= SMALL;
        if let Some(s) = self.pool_of(small).take() {
            return Ok(s);
        }
        let buf = vec![0u8; if small { SMALL } else { CHUNK }].into_boxed_slice();
        if self.needs_local_mr() {
            Ok(Slot::Registered(MemoryRegion::register_owned(self, buf)?))
        } else {
            Ok(Slot::Plain(buf))
        }
    }

    /// Returns a slot whose operation completed. Never called with the state locked (dropping
    /// a registration locks it).
    pub(super) fn give_slot(&self, mut s: Slot) {
        let small = s.cap() <= SMALL;
        let extra = self.pool_of(small).give(s);
        drop(extra);
    }

    /// Moves `dir`'s bytes to or from `offset` of `remote` on peer `pe`, a window of chunks
    /// in flight. Each wait for a completion is bounded by `timeout` (counted from the last
    /// completion, so a long transfer that keeps moving is not cut short) and ends early when
    /// `pe` is lost.
    pub(super) fn transfer(
        &self,
        op: &'static str,
        pe: usize,
        remote: &Remote,
        offset: usize,
        mut dir: Dir<'_>,
        timeout: Duration,
    ) -> Result<()> {
        let len = dir.len();
        if len == 0 {
            return Ok(());
        }
        let chunk = self.chunk();
        let chunks = len.div_ceil(chunk);
        let window = self.window();
        let (put, delivery) = match &dir {
            Dir::Put { delivery, .. } | Dir::PutFrom { delivery, .. } => (true, *delivery),
            Dir::Get { .. } | Dir::GetInto { .. } => (false, false),
        };
        let flags_of = |k: usize| {
            let dc = delivery && (k + 1 == chunks || !self.ordered_writes());
            FI_COMPLETION
                | if dc {
                    FI_DELIVERY_COMPLETE
                } else {
                    FI_TRANSMIT_COMPLETE
                }
        };
        let addr = {
            let s = self.lock();
            *s.peers
                .get(pe)
                .ok_or_else(|| fail(op, Some(pe), "peer has no fabric address".into()))?
        };
        let mut flights: Vec<Flight> = Vec::with_capacity(window);
        // A chunk staged but refused for a full queue, posted first on the next turn.
        let mut pending: Option<(usize, Option<Slot>)> = None;
        let mut next = 0usize;
        let mut last_progress = Instant::now();
        let mut idle = 0u32;
        let result: Result<()> = 'run: loop {
            // Fill the window.
            while (pending.is_some() || next < chunks) && flights.len() < window {
                let (k, mut slot) = match pending.take() {
                    Some(p) => p,
                    None => {
                        let k = next;
                        next += 1;
                        if dir.in_place(0).is_some() {
                            (k, None)
                        } else {
                            let mut slot = match self.take_slot() {
                                Ok(s) => s,
                                Err(e) => break 'run Err(e),
                            };
                            if let Dir::Put { src, .. } = &dir {
                                let lo = k * chunk;
                                let hi = (lo + chunk).min(len);
                                slot.bytes()[..hi - lo].copy_from_slice(&src[lo..hi]);
                            }
                            (k, Some(slot))
                        }
                    }
                };
                let lo = k * chunk;
                let n = (lo + chunk).min(len) - lo;
                let raddr = remote.addr(offset + lo);
                let (ptr, desc) = match (&mut slot, dir.in_place(lo)) {
                    (_, Some(p)) => p,
                    (Some(s), None) => (s.bytes().as_mut_ptr(), s.desc()),
                    (None, None) => {
                        break 'run Err(fail(op, Some(pe), "a staged chunk without staging".into()))
                    }
                };
                let mut s = self.lock();
                let id = s.next_id;
                let ctx = id as *mut c_void;
                // SAFETY: enabled endpoint; the slot (or the registered memory moved in place,
                // the caller's contract) holds n bytes and stays alive until the chunk
                // completes (a slot is leaked if the transfer gives up first).
                let rc = unsafe {
                    post_rma(
                        s.h.ep,
                        !put,
                        (ptr, n, desc),
                        (addr, raddr, remote.key),
                        ctx,
                        flags_of(k),
                    )
                };
                if rc == 0 {
                    s.next_id += 1;
                    flights.push(Flight {
                        id,
                        k,
                        len: n,
                        slot,
                    });
                    continue;
                }
                drop(s);
                if rc == -FI_EAGAIN {
                    pending = Some((k, slot));
                    break;
                }
                // Refused outright: the slot was never handed over.
                if let Some(slot) = slot {
                    self.give_slot(slot);
                }
                break 'run Err(fail(op, Some(pe), self.lib().strerror(rc)));
            }
            if flights.is_empty() && pending.is_none() && next >= chunks {
                break Ok(());
            }
            // Reap what completed.
            let mut finished = Vec::new();
            let mut failed = None;
            {
                let mut s = self.lock();
                s.reap(self.lib());
                let mut i = 0;
                while i < flights.len() {
                    match s.done.remove(&flights[i].id) {
                        Some(r) => {
                            if let Some(msg) = r {
                                failed.get_or_insert(msg);
                            }
                            finished.push(flights.swap_remove(i));
                        }
                        None => i += 1,
                    }
                }
            }
            let progressed = !finished.is_empty();
            for f in finished {
                let Some(mut slot) = f.slot else { continue };
                if let Dir::Get { dst } = &mut dir {
                    let lo = f.k * chunk;
                    dst[lo..lo + f.len].copy_from_slice(&slot.bytes()[..f.len]);
                }
                self.give_slot(slot);
            }
            if let Some(msg) = failed {
                break Err(fail(op, Some(pe), msg));
            }
            if progressed {
                last_progress = Instant::now();
                idle = 0;
                continue;
            }
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(64) {
                if self.is_lost(pe) {
                    break Err(fail(op, Some(pe), "the peer is lost".into()));
                }
                if last_progress.elapsed() > timeout {
                    break Err(Error::Timeout {
                        op,
                        pe: Some(pe),
                        after: last_progress.elapsed(),
                    });
                }
            }
            if idle > 256 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        };
        if let Some((_, Some(slot))) = pending {
            // Never posted: safe to reuse.
            self.give_slot(slot);
        }
        if result.is_err() && !flights.is_empty() {
            // Still in the provider's hands: drop their completions and leak their memory.
            let mut done = Vec::new();
            {
                let mut s = self.lock();
                for f in flights {
                    if s.done.remove(&f.id).is_some() {
                        done.extend(f.slot);
                    } else {
                        s.abandoned.insert(f.id);
                        std::mem::forget(f.slot);
                    }
                }
            }
            for slot in done {
                self.give_slot(slot);
            }
        }
        result
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    fn slot() -> Slot {
        Slot::Plain(vec![0u8; 64].into_boxed_slice())
    }

    #[test]
    fn the_pool_keeps_a_burst_only_while_it_lasts() {
        let mut p = Pool::new(false);
        // No demand beyond it yet: the steady pool only.
        let back = (0..POOL + 5).filter_map(|_| p.give(slot())).count();
        assert_eq!((p.len(), back), (POOL, 5));
        // Demand outgrew it: a burst's slots are kept, up to the burst bound.
        while p.take().is_some() {}
        let back = (0..POOL_BURST + 7).filter_map(|_| p.give(slot())).count();
        assert_eq!((p.len(), back), (POOL_BURST, 7));
        assert!(p.trim().is_empty(), "kept while the burst is recent");
        // Once it is over, trimmed back to the steady pool.
        p.dry_at = Some(Instant::now() - BURST_HOLD - Duration::from_millis(1));
        assert_eq!(p.trim().len(), POOL_BURST - POOL);
        assert_eq!(p.len(), POOL);
        assert!(p.give(slot()).is_some(), "full again");
    }
}
