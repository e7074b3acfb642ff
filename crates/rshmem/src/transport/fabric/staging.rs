//! GPU heaps of PEs on other nodes, staged through registered host memory (the path where the
//! provider cannot register GPU memory, as NVSHMEM's proxy works without GPUDirect RDMA).
//!
//! Each PE's registered segment holds, after its control block, a staging area
//! ([`StageLayout`]): a request slot per source PE (a doorbell word, a header, then up to
//! [`STAGE_BYTES`] of data) and a reply line per target PE. A request from PE `s` to PE `t`:
//!
//! 1. `s` writes the header and the data into its slot at `t` (one delivery-complete
//!    `fi_writemsg`), then sets the doorbell to the request's sequence number (`fi_atomic`,
//!    issued after the write completed, so `t` sees the header and data first);
//! 2. `t`'s proxy thread sees the doorbell, does the work on its own GPU heap ([`serve`]: a
//!    copy into or out of the heap, or an atomic there) and writes the reply (value, status)
//!    into `s`'s reply line, then sets its acknowledgement word to the sequence number;
//! 3. `s` waits for the acknowledgement (bounded: the configured timeout, and `PeerLost` as
//!    soon as the peer is known lost); a get then reads the data from its slot at `t`.
//!
//! One request per (source, target) pair is in flight (a lock per target), so a slot is never
//! overwritten before it was served, and a PE's requests to one target are served in order: a
//! signal issued after a put is applied after the put's data is in the target's GPU memory.

use super::Net;
use crate::backend::{AtomicOp, Backend};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of data one request carries (larger transfers are several requests).
pub(crate) const STAGE_BYTES: usize = 512 << 10;
/// Bytes before a slot's data: the doorbell word, then the header words.
const SLOT_HEAD: usize = 64;
/// Bytes of a reply line: acknowledgement, value, status (a cache line).
const REPLY_LINE: usize = 64;
/// The sequence number of a pair whose last request went unanswered (timeout, lost peer, a
/// failed fabric operation): its slot may still be written or served late, so no further
/// request to that PE is sent.
const UNANSWERED: u64 = u64::MAX;

/// Where things lie in a PE's staging area (byte offsets from its start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StageLayout {
    /// PEs of the world.
    pub n: usize,
    /// Data bytes of each slot.
    pub data: usize,
}

impl StageLayout {
    pub fn new(n: usize) -> StageLayout {
        StageLayout {
            n,
            data: STAGE_BYTES,
        }
    }
    /// The slot of requests from PE `s` (its doorbell word).
    pub fn slot(&self, s: usize) -> usize {
        s * (SLOT_HEAD + self.data)
    }
    /// The header of `s`'s slot (after the doorbell).
    pub fn header(&self, s: usize) -> usize {
        self.slot(s) + 8
    }
    /// The data of `s`'s slot.
    pub fn slot_data(&self, s: usize) -> usize {
        self.slot(s) + SLOT_HEAD
    }
    /// The reply line of PE `t` (its acknowledgement word; value and status follow).
    pub fn reply(&self, t: usize) -> usize {
        self.slot(self.n) + t * REPLY_LINE
    }
    /// Bytes of the whole area, in whole pages.
    pub fn bytes(&self) -> usize {
        self.reply(self.n).div_ceil(4096) * 4096
    }
}

/// One request, as its header words carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// The slot's first `len` data bytes into the heap at `offset`.
    Put { offset: usize, len: usize },
    /// `len` heap bytes from `offset` into the slot's data.
    Get { offset: usize, len: usize },
    /// An atomic on the heap word at `offset`.
    Atomic {
        offset: usize,
        wide: bool,
        op: AtomicOp,
    },
}

/// Header words of a request.
const HEADER_WORDS: usize = 6;

impl Request {
    pub fn encode(&self) -> [u64; HEADER_WORDS] {
        match *self {
            Request::Put { offset, len } => [1, offset as u64, len as u64, 0, 0, 0],
            Request::Get { offset, len } => [2, offset as u64, len as u64, 0, 0, 0],
            Request::Atomic { offset, wide, op } => {
                let (code, a, b) = op.encode();
                [3 | code << 8, offset as u64, wide as u64, a, b, 0]
            }
        }
    }

    /// The request of header words `w`; `None` for words no PE of this version writes.
    pub fn decode(w: &[u64; HEADER_WORDS]) -> Option<Request> {
        let offset = usize::try_from(w[1]).ok()?;
        let len = usize::try_from(w[2]).ok()?;
        Some(match w[0] & 0xff {
            1 => Request::Put { offset, len },
            2 => Request::Get { offset, len },
            3 => Request::Atomic {
                offset,
                wide: w[2] != 0,
                op: AtomicOp::decode(w[0] >> 8, w[3], w[4])?,
            },
            _ => return None,
        })
    }
}

/// Status of a reply: done.
pub(crate) const STATUS_OK: u64 = 0;
/// Status of a reply: refused (a range outside the heap, a malformed request).
pub(crate) const STATUS_REFUSED: u64 = 1;
/// Status of a reply: the target's own GPU operation failed.
pub(crate) const STATUS_FAILED: u64 = 2;

/// What serving a request produced: the value (old value of an atomic) and a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub value: u64,
    pub status: u64,
}

/// Serves `req` on PE `me`'s own heap through `local` (its backend): bytes up to `limit` may be
/// reached (the user heap and, for device barriers, the sync area after it); `data` is the
/// slot's data. Nothing outside `limit` or `data` is touched.
pub(crate) fn serve(
    local: &dyn Backend,
    me: usize,
    limit: usize,
    req: Request,
    data: &mut [u8],
) -> Reply {
    let inside = |offset: usize, len: usize| offset.checked_add(len).is_some_and(|e| e <= limit);
    let refused = Reply {
        value: 0,
        status: STATUS_REFUSED,
    };
    let done = |r: Result<u64>| match r {
        Ok(value) => Reply {
            value,
            status: STATUS_OK,
        },
        Err(e) => {
            tracing::warn!(pe = me, %e, "a staged request from another node failed here");
            Reply {
                value: 0,
                status: STATUS_FAILED,
            }
        }
    };
    match req {
        Request::Put { offset, len } | Request::Get { offset, len }
            if len > data.len() || !inside(offset, len) =>
        {
            refused
        }
        Request::Put { offset, len } => done(local.put(me, offset, &data[..len]).map(|_| 0)),
        Request::Get { offset, len } => done(local.get(me, offset, &mut data[..len]).map(|_| 0)),
        Request::Atomic { offset, wide, op } => {
            let size = if wide { 8 } else { 4 };
            if !offset.is_multiple_of(size) || !inside(offset, size) {
                return refused;
            }
            done(local.atomic(me, offset, wide, op))
        }
    }
}

/// This PE's staging area in its registered segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Area {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the area is process memory that outlives every user (the world's segment); words are
// reached atomically, data bytes only by the one thread a slot's protocol step belongs to.
unsafe impl Send for Area {}
// SAFETY: as for Send.
unsafe impl Sync for Area {}

impl Area {
    /// # Safety
    /// `ptr..ptr + len` must be 8-aligned memory that stays mapped while the area is used.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Area {
        Area { ptr, len }
    }

    /// The word at byte `at` (8-aligned, inside the area).
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(
            at.is_multiple_of(8) && at + 8 <= self.len,
            "staging word {at}"
        );
        // SAFETY: aligned and inside the live area (checked above); every access to the word
        // is atomic (the provider's writes land before the doorbell or acknowledgement that
        // announces them).
        unsafe { AtomicU64::from_ptr(self.ptr.add(at).cast()) }
    }

    /// `len` bytes from `at` (inside the area).
    ///
    /// # Safety
    /// No other thread, and no fabric operation, may touch the bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.len, "staging bytes {at}+{len}");
        // SAFETY: inside the live area; exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

/// The staged transport of one PE: requests to the GPU heaps of PEs on other nodes, and the
/// serving of theirs (by the proxy thread, [`Staged::serve_pending`]).
#[derive(Debug)]
pub(crate) struct Staged {
    net: Arc<Net>,
    me: usize,
    layout: StageLayout,
    area: Area,
    /// Offset of the staging area in every PE's registered segment.
    base: usize,
    timeout: Duration,
    /// Per target: the last sequence number sent; held for a request's whole round trip.
    pairs: Vec<Mutex<u64>>,
}

impl Staged {
    /// The staged transport of PE `me` whose staging area is `area`, at `base` in every PE's
    /// registered segment; each request waits at most `timeout` for its reply.
    pub fn new(
        net: Arc<Net>,
        me: usize,
        n: usize,
        area: Area,
        base: usize,
        timeout: Duration,
    ) -> Staged {
        Staged {
            net,
            me,
            layout: StageLayout::new(n),
            area,
            base,
            timeout,
            pairs: (0..n).map(|_| Mutex::new(0)).collect(),
        }
    }

    /// The PE this transport belongs to.
    pub fn me(&self) -> usize {
        self.me
    }

    /// The fabric.
    pub fn net(&self) -> &Arc<Net> {
        &self.net
    }

    /// The pair lock of PE `pe`: one request to it in flight, its slot this PE's meanwhile.
    fn pair(&self, pe: usize) -> std::sync::MutexGuard<'_, u64> {
        self.pairs[pe].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One request to PE `pe` with `payload` for its slot, under `seq` (the pair's lock); the
    /// reply's value. A request that goes unanswered closes the pair ([`UNANSWERED`]).
    fn call(
        &self,
        seq: &mut u64,
        pe: usize,
        req: Request,
        payload: &[u8],
        op: &'static str,
    ) -> Result<u64> {
        if *seq == UNANSWERED {
            return Err(self.lost_or(
                pe,
                op,
                Error::Fabric {
                    op,
                    pe: Some(pe),
                    msg: format!(
                        "an earlier staged request to PE {pe} went unanswered; none is sent after it"
                    ),
                },
            ));
        }
        let last = *seq;
        *seq = UNANSWERED;
        let value = self.round_trip(last + 1, pe, req, payload, op)?;
        *seq = last + 1;
        value
    }

    /// Request number `s` to PE `pe` and its reply (see [`call`](Self::call)): `Err` only when it
    /// went unanswered; the reply's own status is the inner result.
    fn round_trip(
        &self,
        s: u64,
        pe: usize,
        req: Request,
        payload: &[u8],
        op: &'static str,
    ) -> Result<Result<u64>> {
        let l = &self.layout;
        let r = l.reply(pe);
        self.area.word(r + 8).store(0, Ordering::Relaxed);
        self.area.word(r + 16).store(0, Ordering::Relaxed);
        let mut msg = Vec::with_capacity(SLOT_HEAD - 8 + payload.len());
        for w in req.encode() {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.resize(SLOT_HEAD - 8, 0);
        msg.extend_from_slice(payload);
        let seg = self.net.segment(pe);
        let ep = self.net.endpoint();
        let lost = |e: Error| self.lost_or(pe, op, e);
        ep.write(pe, seg, self.base + l.header(self.me), &msg, true)
            .map_err(lost)?;
        ep.atomic(pe, seg, self.base + l.slot(self.me), true, AtomicOp::Set(s))
            .map_err(lost)?;
        let ack = self.area.word(r);
        let start = Instant::now();
        let mut i = 0u32;
        while ack.load(Ordering::Acquire) != s {
            self.net.progress();
            i = i.wrapping_add(1);
            if i < 64 {
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            if i.is_multiple_of(64) {
                if self.net.is_lost(pe) {
                    return Err(Error::PeerLost { pe, op });
                }
                if start.elapsed() > self.timeout {
                    return Err(Error::Timeout {
                        op,
                        pe: Some(pe),
                        after: start.elapsed(),
                    });
                }
            }
        }
        let value = self.area.word(r + 8).load(Ordering::Acquire);
        Ok(match self.area.word(r + 16).load(Ordering::Acquire) {
            STATUS_OK => Ok(value),
            STATUS_REFUSED => Err(Error::Fabric {
                op,
                pe: Some(pe),
                msg: format!("PE {pe} refused the staged request {req:?} (outside its GPU heap)"),
            }),
            _ => Err(Error::Fabric {
                op,
                pe: Some(pe),
                msg: format!("PE {pe} failed the staged request {req:?} on its GPU"),
            }),
        })
    }

    /// `PeerLost` naming `pe` when it is known lost (a fabric operation that gave up on it),
    /// else `e`.
    fn lost_or(&self, pe: usize, op: &'static str, e: Error) -> Error {
        match self.net.is_lost(pe) {
            true => Error::PeerLost { pe, op },
            false => e,
        }
    }

    /// `src` into PE `pe`'s GPU heap at `offset`: in its memory when this returns.
    pub fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        for (k, c) in src.chunks(self.layout.data).enumerate() {
            let at = offset + k * self.layout.data;
            let req = Request::Put {
                offset: at,
                len: c.len(),
            };
            self.call(&mut self.pair(pe), pe, req, c, "staged put")?;
        }
        Ok(())
    }

    /// PE `pe`'s GPU heap bytes from `offset` into `dst`.
    pub fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        let data = self.layout.data;
        for (k, c) in dst.chunks_mut(data).enumerate() {
            let req = Request::Get {
                offset: offset + k * data,
                len: c.len(),
            };
            // The request and the read of its data from this PE's slot at `pe` under one hold
            // of the pair's lock: no later request overwrites the slot in between.
            let mut seq = self.pair(pe);
            self.call(&mut seq, pe, req, &[], "staged get")?;
            let at = self.base + self.layout.slot_data(self.me);
            self.net
                .endpoint()
                .read(pe, self.net.segment(pe), at, c)
                .map_err(|e| self.lost_or(pe, "staged get", e))?;
        }
        Ok(())
    }

    /// An atomic on PE `pe`'s GPU heap word at `offset`; the old value (0 for `Set`).
    pub fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        let req = Request::Atomic { offset, wide, op };
        let v = self.call(&mut self.pair(pe), pe, req, &[], "staged atomic")?;
        Ok(if wide { v } else { v & 0xffff_ffff })
    }

    /// Serves every request waiting in this PE's slots from PEs on other nodes on `local`,
    /// this PE's own backend (bytes up to `limit`); `seen` holds the last sequence number
    /// served per source. Returns how many were served. A reply that cannot be sent (the
    /// source is gone) is dropped: its waiting caller, if any, ends in its own error.
    pub fn serve_pending(&self, local: &dyn Backend, limit: usize, seen: &mut [u64]) -> usize {
        let l = self.layout;
        let mut served = 0;
        for s in (0..l.n).filter(|&s| self.net.is_remote(s)) {
            let bell = self.area.word(l.slot(s)).load(Ordering::Acquire);
            if bell == seen[s] {
                continue;
            }
            seen[s] = bell;
            served += 1;
            let mut w = [0u64; HEADER_WORDS];
            for (k, x) in w.iter_mut().enumerate() {
                *x = self.area.word(l.header(s) + 8 * k).load(Ordering::Relaxed);
            }
            let reply = match Request::decode(&w) {
                // SAFETY: source `s` has one request in flight and waits for this reply
                // before it touches the slot again.
                Some(req) => serve(local, self.me, limit, req, unsafe {
                    self.area.bytes(l.slot_data(s), l.data)
                }),
                None => Reply {
                    value: 0,
                    status: STATUS_REFUSED,
                },
            };
            if let Err(e) = self.reply(s, bell, reply) {
                tracing::warn!(pe = self.me, peer = s, %e, "a staged reply was not delivered");
            }
        }
        served
    }

    fn reply(&self, s: usize, seq: u64, reply: Reply) -> Result<()> {
        let seg = self.net.segment(s);
        let ep = self.net.endpoint();
        let line = self.base + self.layout.reply(self.me);
        if reply
            != (Reply {
                value: 0,
                status: 0,
            })
        {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&reply.value.to_le_bytes());
            b[8..].copy_from_slice(&reply.status.to_le_bytes());
            ep.write(s, seg, line + 8, &b, true)?;
        }
        ep.atomic(s, seg, line, true, AtomicOp::Set(seq))?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "staging_tests.rs"]
pub(super) mod tests;
