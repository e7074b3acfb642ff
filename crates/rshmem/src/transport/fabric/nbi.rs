//! Non-blocking puts and gets to peers of other nodes: posted, then returned; completed by
//! whoever looks next (the operation's handle, quiet, a fence, a later post).
//!
//! A put copies its source into staging slots the endpoint owns (the caller may reuse it at
//! once, and the provider never reads memory the caller could free or change) and posts each
//! chunk as a write asking for delivery completion, so an operation that completed is in the
//! target's memory. A get posts reads into staging slots; their bytes reach the caller's
//! buffer only while the caller lends it: during the post (a get past the staging bound lands
//! what arrived while it waits for room) and when the handle that borrows it collects
//! ([`Endpoint::nbi_wait_land`], chunk by chunk as they arrive, or [`Endpoint::nbi_land`]):
//! the provider never writes memory the caller owns, so a handle that is forgotten rather than
//! dropped leaves nothing writing behind the borrow's end.
//!
//! Completions of posted chunks are filed by every reader of the completion queue (the progress
//! thread included) in the state's `nbi_done`; the table collects them when it is driven.
//! A wait gives an operation up when its peer is lost or nothing of it completed within the
//! deadline (counted from its last progress): its chunks still in flight are abandoned to the
//! provider with their staging (leaked, never reused), and the operation ends in the error.
//! Every operation that fails is also reported once by the next quiet, so the error of an
//! operation whose handle was dropped is not lost.
//!
//! A fence marks the peers with operations outstanding; the next operation to such a peer
//! (non-blocking or blocking, atomics included) first waits for them to complete, which orders
//! it after them on every provider (no reliance on `FI_FENCE`, which tcp's `ofi_rxm` does not
//! offer together with atomics).

use super::endpoint::{fail, Endpoint};
use super::ffi::*;
use super::mr::Remote;
use super::xfer::{post_rma, Slot};
use crate::error::{Error, Result};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::c_void;
use std::sync::MutexGuard;
use std::time::Instant;

/// Most chunks of non-blocking operations in flight on one endpoint: a post beyond it first
/// waits for earlier ones (memory and the provider's queue stay bounded).
const MAX_FLIGHTS: usize = 1024;
/// Most staging bytes those chunks hold (four windows of a blocking transfer: enough in flight
/// to keep a link busy, little memory held).
const MAX_STAGED: usize = 4 * super::xfer::WINDOW * super::xfer::CHUNK;
#[cfg(test)]
pub(super) const MAX_STAGED_FOR_TESTS: usize = MAX_STAGED;

/// Which way a non-blocking operation goes.
pub(crate) enum NbiDir<'a> {
    /// Write these bytes.
    Put(&'a [u8]),
    /// Read into this buffer: chunks that complete while the post is still waiting for room
    /// land in it then (the caller lends it for the call); the rest when the handle collects.
    Get(&'a mut [u8]),
}

/// One posted chunk of an operation.
struct Chunk {
    id: u64,
    lo: usize,
    len: usize,
    /// Its staging; `None` once given back (or abandoned to the provider).
    slot: Option<Slot>,
    /// Posted and not completed.
    live: bool,
}

struct Op {
    pe: usize,
    get: bool,
    chunks: Vec<Chunk>,
    /// Chunks in flight.
    left: usize,
    /// A get's chunks that completed well and hold bytes not yet copied to the caller.
    landable: usize,
    /// Its poster is still posting chunks.
    posting: bool,
    error: Option<Error>,
    /// Its post or latest completion: the deadline counts from here.
    last: Instant,
    /// No handle will collect it: removed once it ended.
    detached: bool,
}

impl Op {
    fn ended(&self) -> bool {
        !self.posting && self.left == 0
    }
    fn name(&self) -> &'static str {
        if self.get {
            "get_nbi"
        } else {
            "put_nbi"
        }
    }
}

/// The endpoint's non-blocking operations (behind `Endpoint::nbi`).
#[derive(Default)]
pub(crate) struct Table {
    next: u64,
    /// Operations by key: running, or ended and not yet collected or released.
    ops: HashMap<u64, Op>,
    /// Keys of the operations not yet ended (what quiet and the deadline checks look at; ended
    /// ones may be many, kept until the completion queue is drained).
    running: BTreeSet<u64>,
    /// Completion id of each live chunk → its operation.
    chunk_op: HashMap<u64, u64>,
    /// Live chunks, and the staging bytes they hold.
    flights: usize,
    staged: usize,
    /// Per peer: operations not yet ended.
    busy: HashMap<usize, usize>,
    /// Peers fenced while operations to them were outstanding.
    fenced: HashSet<usize>,
    /// The first failure of an operation since the last quiet.
    failed: Option<Error>,
}

impl Table {
    /// Leaves the staging of live chunks to the provider for good (the endpoint closes).
    pub(super) fn forget_in_flight(&mut self) {
        for op in self.ops.values_mut() {
            for c in &mut op.chunks {
                if c.live {
                    std::mem::forget(c.slot.take());
                }
            }
        }
    }
}

impl Endpoint {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.nbi.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a non-blocking put or get of `dir` at `offset` of `remote` on peer `pe`; returns
    /// the operation's key. Posting waits only where a fence or the bounds on chunks and
    /// staging in flight say so.
    pub(crate) fn nbi_post(
        &self,
        pe: usize,
        remote: &Remote,
        offset: usize,
        dir: NbiDir<'_>,
    ) -> Result<u64> {
        let (src, mut dst) = match dir {
            NbiDir::Put(src) => (Some(src), None),
            NbiDir::Get(dst) => (None, Some(dst)),
        };
        let get = dst.is_some();
        let len = src.map_or_else(|| dst.as_ref().map_or(0, |d| d.len()), |s| s.len());
        let name = if get { "get_nbi" } else { "put_nbi" };
        self.nbi_fenced(pe);
        if self.is_lost(pe) {
            return Err(Error::PeerLost { pe, op: name });
        }
        let addr = {
            let s = self.lock();
            *s.peers
                .get(pe)
                .ok_or_else(|| fail(name, Some(pe), "peer has no fabric address".into()))?
        };
        let chunk = self.chunk();
        let chunks = len.div_ceil(chunk);
        let mut t = self.table();
        let key = t.next;
        t.next += 1;
        t.ops.insert(
            key,
            Op {
                pe,
                get,
                chunks: Vec::with_capacity(chunks),
                left: 0,
                landable: 0,
                posting: true,
                error: None,
                last: Instant::now(),
                detached: false,
            },
        );
        t.running.insert(key);
        *t.busy.entry(pe).or_default() += 1;
        for k in 0..chunks {
            let lo = k * chunk;
            let n = (lo + chunk).min(len) - lo;
            while t.flights >= MAX_FLIGHTS || t.staged + chunk > MAX_STAGED {
                drop(t);
                // A large get lands what already arrived meanwhile: its staging goes back to
                // the pool for the chunks still to post, and the copies overlap the wire.
                self.nbi_drive(
                    |_, _| true,
                    |t| {
                        if let Some(d) = dst.as_deref_mut() {
                            self.land_ready(t, key, d);
                        }
                        t.flights < MAX_FLIGHTS && t.staged + chunk <= MAX_STAGED
                    },
                );
                t = self.table();
            }
            if t.ops.get(&key).is_none_or(|o| o.error.is_some()) {
                break;
            }
            let mut slot = match self.take_slot_for(n) {
                Ok(s) => s,
                Err(e) => {
                    t.ops.get_mut(&key).map(|o| o.error.get_or_insert(e));
                    break;
                }
            };
            if let Some(src) = src {
                slot.bytes()[..n].copy_from_slice(&src[lo..lo + n]);
            }
            // Delivery completion of every chunk, except that where the provider places
            // writes in order the last one's covers the others (as `xfer.rs`).
            let dc = k + 1 == chunks || !self.ordered_writes();
            let flags = FI_COMPLETION
                | if dc {
                    FI_DELIVERY_COMPLETE
                } else {
                    FI_TRANSMIT_COMPLETE
                };
            let start = Instant::now();
            let posted = loop {
                let rc = self.post_chunk(
                    &mut slot,
                    n,
                    addr,
                    remote.addr(offset + lo),
                    remote.key,
                    get,
                    flags,
                );
                match rc {
                    Ok(id) => break Ok(id),
                    Err(rc) if rc == -FI_EAGAIN => {
                        // The provider's queue is full: collect completions and retry.
                        self.nbi_sweep(&mut t);
                        if self.is_lost(pe) {
                            break Err(Error::PeerLost { pe, op: name });
                        }
                        if start.elapsed() > self.timeout() {
                            break Err(Error::Timeout {
                                op: name,
                                pe: Some(pe),
                                after: start.elapsed(),
                            });
                        }
                        std::thread::yield_now();
                    }
                    Err(rc) => break Err(fail(name, Some(pe), self.lib().strerror(rc))),
                }
            };
            match posted {
                Ok(id) => {
                    let cap = slot.cap();
                    t.chunk_op.insert(id, key);
                    t.flights += 1;
                    t.staged += cap;
                    match t.ops.get_mut(&key) {
                        Some(op) => {
                            op.left += 1;
                            op.chunks.push(Chunk {
                                id,
                                lo,
                                len: n,
                                slot: Some(slot),
                                live: true,
                            });
                        }
                        // Not reachable (only the poster removes a posting operation), but a
                        // posted slot must never be freed.
                        None => std::mem::forget(slot),
                    }
                }
                Err(e) => {
                    // Never handed to the provider: reusable.
                    self.give_slot(slot);
                    t.ops.get_mut(&key).map(|o| o.error.get_or_insert(e));
                    break;
                }
            }
        }
        let Some(op) = t.ops.get_mut(&key) else {
            return Err(fail(name, Some(pe), "the operation was lost".into()));
        };
        op.posting = false;
        let err = op.error.clone();
        if let Some(d) = dst {
            self.land_ready(&mut t, key, d);
        }
        let Some(op) = t.ops.get_mut(&key) else {
            return Err(fail(name, Some(pe), "the operation was lost".into()));
        };
        if err.is_some() {
            // The caller gets the error, not a handle: nobody collects the operation.
            op.detached = true;
        }
        if op.ended() {
            self.finish(&mut t, key);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(key),
        }
    }

    /// Posts one chunk (a write of `n` bytes from the slot, or a read into it); the completion
    /// id, or the provider's return code.
    #[allow(clippy::too_many_arguments)]
    fn post_chunk(
        &self,
        slot: &mut Slot,
        n: usize,
        addr: fi_addr_t,
        raddr: u64,
        key: u64,
        get: bool,
        flags: u64,
    ) -> std::result::Result<u64, isize> {
        let desc = slot.desc();
        let ptr = slot.bytes().as_mut_ptr();
        let mut s = self.lock();
        let id = s.next_id;
        let ctx = id as *mut c_void;
        // SAFETY: enabled endpoint; the slot holds n bytes and stays alive until the chunk
        // completes (abandoned to the provider if it never does).
        let rc = unsafe { post_rma(s.h.ep, get, (ptr, n, desc), (addr, raddr, key), ctx, flags) };
        if rc != 0 {
            return Err(rc);
        }
        s.next_id += 1;
        s.nbi_ids.insert(id);
        Ok(id)
    }

    /// Collects the completions of non-blocking chunks (reading the completion queue).
    fn nbi_sweep(&self, t: &mut Table) {
        let done = {
            let mut s = self.lock();
            s.reap(self.lib());
            std::mem::take(&mut s.nbi_done)
        };
        for (id, err) in done {
            self.chunk_done(t, id, err);
        }
    }

    /// Chunk `id` completed (`err`: its error text).
    fn chunk_done(&self, t: &mut Table, id: u64, err: Option<String>) {
        let Some(key) = t.chunk_op.remove(&id) else {
            return;
        };
        t.flights -= 1;
        let Some(op) = t.ops.get_mut(&key) else {
            return;
        };
        let Some(c) = op.chunks.iter_mut().find(|c| c.id == id) else {
            return;
        };
        c.live = false;
        let cap = c.slot.as_mut().map_or(0, |s| s.cap());
        op.left -= 1;
        op.last = Instant::now();
        if let Some(msg) = err {
            let e = fail(op.name(), Some(op.pe), msg);
            op.error.get_or_insert(e);
        }
        // A get's bytes stay in its slot until collected.
        if op.get && op.error.is_none() {
            op.landable += 1;
        }
        let back = if !op.get || op.error.is_some() {
            op.chunks
                .iter_mut()
                .find(|c| c.id == id)
                .and_then(|c| c.slot.take())
        } else {
            None
        };
        let ended = op.ended();
        // Only live chunks count against the bound (a get's landed bytes wait for their
        // handle, however long).
        t.staged -= cap.min(t.staged);
        if let Some(s) = back {
            self.give_slot(s);
        }
        if ended {
            self.finish(t, key);
        }
    }

    /// Operation `key` ended: it no longer holds its peer's fence; a failure is kept for quiet;
    /// nobody collecting it, it goes.
    fn finish(&self, t: &mut Table, key: u64) {
        let Some(op) = t.ops.get(&key) else {
            return;
        };
        let (pe, detached) = (op.pe, op.detached);
        t.running.remove(&key);
        if let Some(e) = &op.error {
            t.failed.get_or_insert_with(|| e.clone());
        }
        if let Some(b) = t.busy.get_mut(&pe) {
            *b -= 1;
            if *b == 0 {
                t.busy.remove(&pe);
                t.fenced.remove(&pe);
            }
        }
        if detached {
            self.remove(t, key);
        }
    }

    /// Removes ended operation `key`, giving its staging back.
    fn remove(&self, t: &mut Table, key: u64) -> Option<Op> {
        let mut op = t.ops.remove(&key)?;
        for c in &mut op.chunks {
            if let Some(s) = c.slot.take() {
                self.give_slot(s);
            }
        }
        Some(op)
    }

    /// Gives operation `key` up with `err`: its live chunks are abandoned to the provider.
    fn give_up(&self, t: &mut Table, key: u64, err: Error) {
        let Some(op) = t.ops.get(&key) else {
            return;
        };
        let live: Vec<u64> = op.chunks.iter().filter(|c| c.live).map(|c| c.id).collect();
        let (done, abandoned) = {
            let mut s = self.lock();
            s.reap(self.lib());
            let done = std::mem::take(&mut s.nbi_done);
            let mut abandoned = Vec::new();
            for id in live {
                if s.nbi_ids.remove(&id) {
                    s.abandoned.insert(id);
                    abandoned.push(id);
                }
            }
            (done, abandoned)
        };
        for (id, e) in done {
            self.chunk_done(t, id, e);
        }
        for id in abandoned {
            t.chunk_op.remove(&id);
            t.flights -= 1;
            if let Some(op) = t.ops.get_mut(&key) {
                if let Some(c) = op.chunks.iter_mut().find(|c| c.id == id) {
                    c.live = false;
                    if let Some(mut s) = c.slot.take() {
                        t.staged -= s.cap().min(t.staged);
                        std::mem::forget(s);
                    }
                }
                op.left -= 1;
            }
        }
        let Some(op) = t.ops.get_mut(&key) else {
            return;
        };
        op.error.get_or_insert(err);
        // A get's slots that did land are useless now.
        for c in &mut op.chunks {
            if let Some(s) = c.slot.take() {
                self.give_slot(s);
            }
        }
        if op.ended() {
            self.finish(t, key);
        }
    }

    /// Drives the table until `enough` holds, giving up the operations `in_scope` selects
    /// whose peer is lost or that made no progress within the deadline.
    fn nbi_drive(
        &self,
        in_scope: impl Fn(u64, &Op) -> bool,
        mut enough: impl FnMut(&mut Table) -> bool,
    ) {
        let mut i = 0u32;
        loop {
            {
                let mut t = self.table();
                self.nbi_sweep(&mut t);
                if enough(&mut t) {
                    return;
                }
                if i.is_multiple_of(64) {
                    let stuck: Vec<(u64, Error)> = t
                        .running
                        .iter()
                        .filter_map(|k| t.ops.get(k).map(|o| (k, o)))
                        .filter(|(k, o)| o.left > 0 && in_scope(**k, o))
                        .filter_map(|(k, o)| {
                            if self.is_lost(o.pe) {
                                Some((
                                    *k,
                                    Error::PeerLost {
                                        pe: o.pe,
                                        op: o.name(),
                                    },
                                ))
                            } else {
                                let after = o.last.elapsed();
                                (after > self.timeout()).then_some((
                                    *k,
                                    Error::Timeout {
                                        op: o.name(),
                                        pe: Some(o.pe),
                                        after,
                                    },
                                ))
                            }
                        })
                        .collect();
                    for (k, e) in stuck {
                        self.give_up(&mut t, k, e);
                    }
                    if enough(&mut t) {
                        return;
                    }
                }
            }
            i = i.wrapping_add(1);
            if i > 256 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Operation `key`'s outcome once it ended (`drive`: collect completions first); `None`
    /// while it runs. An operation already collected counts as ended well.
    pub(crate) fn nbi_status(&self, key: u64, drive: bool) -> Option<Result<()>> {
        let mut t = self.table();
        if drive {
            self.nbi_sweep(&mut t);
        }
        match t.ops.get(&key) {
            None => Some(Ok(())),
            Some(o) if o.ended() => Some(o.error.clone().map_or(Ok(()), Err)),
            Some(_) => None,
        }
    }

    /// Waits for operation `key` to end (within the deadline from its last progress, or until
    /// its peer is lost); its outcome.
    pub(crate) fn nbi_wait(&self, key: u64) -> Result<()> {
        self.nbi_drive(
            |k, _| k == key,
            |t| t.ops.get(&key).is_none_or(|o| o.ended()),
        );
        self.nbi_status(key, false).unwrap_or(Ok(()))
    }

    /// Waits for get `key` to end as [`nbi_wait`](Self::nbi_wait) does, copying each chunk
    /// into `dst` as it arrives (the copies overlap the chunks still on the wire), then
    /// collects it ([`nbi_land`](Self::nbi_land)); its outcome.
    pub(crate) fn nbi_wait_land(&self, key: u64, dst: &mut [u8]) -> Result<()> {
        self.nbi_drive(
            |k, _| k == key,
            |t| {
                self.land_ready(t, key, dst);
                t.ops.get(&key).is_none_or(|o| o.ended())
            },
        );
        let r = self.nbi_status(key, false).unwrap_or(Ok(()));
        self.nbi_land(key, dst);
        r
    }

    /// Copies the chunks of get `key` that completed well and were not copied yet into `dst`,
    /// giving their staging back.
    fn land_ready(&self, t: &mut Table, key: u64, dst: &mut [u8]) {
        let Some(op) = t.ops.get_mut(&key) else {
            return;
        };
        if op.landable == 0 || op.error.is_some() {
            return;
        }
        op.landable = 0;
        for c in op.chunks.iter_mut().filter(|c| !c.live) {
            let Some(mut s) = c.slot.take() else { continue };
            if let Some(d) = dst.get_mut(c.lo..c.lo + c.len) {
                d.copy_from_slice(&s.bytes()[..c.len]);
            }
            self.give_slot(s);
        }
    }

    /// Collects ended get `key`: copies its bytes not landed yet into `dst` (when it ended
    /// well) and gives its staging back. Nothing while it runs.
    pub(crate) fn nbi_land(&self, key: u64, dst: &mut [u8]) {
        let mut t = self.table();
        if !t.ops.get(&key).is_some_and(|o| o.ended()) {
            return;
        }
        if let Some(op) = t.ops.get_mut(&key) {
            if op.error.is_none() {
                for c in &mut op.chunks {
                    if let (Some(s), Some(d)) = (&mut c.slot, dst.get_mut(c.lo..c.lo + c.len)) {
                        d.copy_from_slice(&s.bytes()[..c.len]);
                    }
                }
            }
        }
        self.remove(&mut t, key);
    }

    /// Operation `key` will not be collected: removed now if it ended, else once it does.
    pub(crate) fn nbi_release(&self, key: u64) {
        let mut t = self.table();
        match t.ops.get_mut(&key) {
            Some(o) if o.ended() => {
                self.remove(&mut t, key);
            }
            Some(o) => o.detached = true,
            None => {}
        }
    }

    /// Waits for every non-blocking operation posted before the call to end (OpenSHMEM quiet:
    /// a put's data is in the target's memory, a get's in staging for its handle); the first
    /// failure of an operation since the last quiet, if any.
    pub(crate) fn nbi_quiet(&self) -> Result<()> {
        let before = self.table().next;
        self.nbi_drive(
            |k, _| k < before,
            |t| t.running.range(..before).next().is_none(),
        );
        match self.table().failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// OpenSHMEM fence: the next operation to each peer with operations outstanding waits for
    /// them first ([`nbi_fenced`](Self::nbi_fenced)).
    pub(crate) fn nbi_fence(&self) {
        let mut t = self.table();
        let busy: Vec<usize> = t.busy.keys().copied().collect();
        t.fenced.extend(busy);
    }

    /// Before an operation to `pe`: where a fence is pending for it, waits until the
    /// operations to `pe` it covers ended (their failures are quiet's to report).
    pub(crate) fn nbi_fenced(&self, pe: usize) {
        if !self.table().fenced.contains(&pe) {
            return;
        }
        self.nbi_drive(|_, o| o.pe == pe, |t| !t.fenced.contains(&pe));
    }

    /// Chunks of non-blocking operations in flight and operations not collected (tests).
    #[cfg(test)]
    pub(crate) fn nbi_counts(&self) -> (usize, usize) {
        let t = self.table();
        (t.flights, t.ops.len())
    }
}
