//! A world's fabric: this PE's endpoint, its whole segment (control block and heap) registered
//! as one range, every peer's `Remote`, and which peers live on other nodes. The control block
//! words of a peer on another node (barrier counters, call words, exchange area, header) are
//! reached through it; so are its heap bytes (`FabricBackend`).

use super::nbi::NbiDir;
use super::{exchange, Endpoint, FabricConfig, MemoryRegion, Remote};
use crate::backend::{AtomicOp, Backend, InFlight};
use crate::bootstrap::Bootstrap;
use crate::config::BackendKind;
use crate::error::Result;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Net {
    ep: Endpoint,
    /// Kept registered for the life of the world (dropped before `ep`'s handles close).
    _segment: MemoryRegion,
    /// Each PE's registered segment.
    segments: Vec<Remote>,
    /// Per PE: true when it runs on another node.
    remote: Vec<bool>,
    /// Bytes of the control block at the start of each segment (the heap follows it).
    ctrl_bytes: usize,
    /// Heap puts and gets to other nodes, their bytes, and control-block operations on
    /// other nodes' PEs ([`Pe::net_traffic`]).
    ///
    /// [`Pe::net_traffic`]: crate::Pe::net_traffic
    traffic: [std::sync::atomic::AtomicU64; 3],
}

impl Net {
    /// Opens this PE's endpoint, registers its segment and exchanges addresses and keys with
    /// every PE (collective over `boot`).
    ///
    /// # Safety
    /// `segment..segment + len` must stay mapped for the life of the returned value.
    pub unsafe fn open(
        config: &FabricConfig,
        boot: &dyn Bootstrap,
        segment: *mut u8,
        len: usize,
        ctrl_bytes: usize,
        remote: Vec<bool>,
    ) -> Result<Net> {
        let ep = Endpoint::open(config);
        let ep = crate::bootstrap::agree_value(boot, ep, "opening the fabric endpoint")?;
        // SAFETY: the caller's contract.
        let mr = unsafe { MemoryRegion::register(&ep, segment, len) };
        let mr =
            crate::bootstrap::agree_value(boot, mr, "registering the segment with the fabric")?;
        let all = exchange(boot, &ep, &[&mr])?;
        Ok(Net {
            ep,
            _segment: mr,
            segments: all.into_iter().map(|r| r[0]).collect(),
            remote,
            ctrl_bytes,
            traffic: Default::default(),
        })
    }

    /// (operations, bytes) of heap puts and gets this PE sent to other nodes, and the
    /// control-block operations ([`count_ctrl`](Self::count_ctrl)).
    pub fn traffic(&self) -> (u64, u64, u64) {
        let [ops, bytes, ctrl] = &self.traffic;
        (ops.load(Relaxed), bytes.load(Relaxed), ctrl.load(Relaxed))
    }

    /// Counts one operation on a control block of another node's PE (a barrier arrival, a
    /// call word or note read, an exchange record read).
    pub fn count_ctrl(&self) {
        self.traffic[2].fetch_add(1, Relaxed);
    }

    fn count(&self, bytes: usize) {
        self.traffic[0].fetch_add(1, Relaxed);
        self.traffic[1].fetch_add(bytes as u64, Relaxed);
    }

    /// Reads the completion queue if no other thread is doing so (never blocks).
    pub fn progress(&self) {
        self.ep.progress();
    }

    /// Takes PE `pe` as lost: fabric operations waiting on it give up.
    pub fn mark_lost(&self, pe: usize) {
        self.ep.mark_lost(pe);
    }

    /// Whether PE `pe` runs on another node.
    #[inline]
    pub fn is_remote(&self, pe: usize) -> bool {
        self.remote.get(pe).copied().unwrap_or(false)
    }

    /// Whether PE `pe` is known lost (`mark_lost`).
    pub fn is_lost(&self, pe: usize) -> bool {
        self.ep.is_lost(pe)
    }

    /// This PE's endpoint (the staged transport's requests and replies).
    pub(super) fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// PE `pe`'s registered segment.
    pub(super) fn segment(&self, pe: usize) -> &Remote {
        &self.segments[pe]
    }

    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.ep.provider
    }

    /// Atomic on control word `word` of PE `pe`.
    pub fn ctrl_atomic(&self, pe: usize, word: usize, op: AtomicOp) -> Result<u64> {
        self.ep.atomic(pe, &self.segments[pe], word * 8, true, op)
    }

    /// `n` control words of PE `pe` from `word` on, within `timeout`.
    pub fn ctrl_read(
        &self,
        pe: usize,
        word: usize,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<u64>> {
        let mut b = vec![0u8; n * 8];
        self.ep
            .read_within(pe, &self.segments[pe], word * 8, &mut b, timeout)?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }
}

/// The CPU backend of a world spanning nodes: peers of this node through their mappings (the
/// shm backend), peers of other nodes through the fabric. A blocking fabric put is
/// delivery-complete, so it is in the target's memory when the call returns: a signal (or any
/// later operation) issued after it is seen after the data. Non-blocking puts and gets are
/// posted and complete later (`nbi.rs`): quiet waits for them, and after a fence every
/// operation to a PE with some outstanding waits for them first.
#[derive(Debug)]
pub(crate) struct FabricBackend {
    local: Box<dyn Backend>,
    net: std::sync::Arc<Net>,
}

impl FabricBackend {
    pub fn new(local: Box<dyn Backend>, net: std::sync::Arc<Net>) -> Self {
        FabricBackend { local, net }
    }
}

impl Backend for FabricBackend {
    fn kind(&self) -> BackendKind {
        self.local.kind()
    }
    fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        if !self.net.is_remote(pe) {
            return self.local.put(pe, offset, src);
        }
        let n = &self.net;
        n.count(src.len());
        n.ep.nbi_fenced(pe);
        n.ep.write(pe, &n.segments[pe], n.ctrl_bytes + offset, src, true)
    }
    fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        if !self.net.is_remote(pe) {
            return self.local.get(pe, offset, dst);
        }
        let n = &self.net;
        n.count(dst.len());
        n.ep.nbi_fenced(pe);
        n.ep.read(pe, &n.segments[pe], n.ctrl_bytes + offset, dst)
    }
    fn put_nbi(&self, pe: usize, offset: usize, src: &[u8]) -> Result<Option<Arc<dyn InFlight>>> {
        if !self.net.is_remote(pe) || src.is_empty() {
            return self.local.put_nbi(pe, offset, src);
        }
        let n = &self.net;
        n.count(src.len());
        let dir = NbiDir::Put(src);
        let key =
            n.ep.nbi_post(pe, &n.segments[pe], n.ctrl_bytes + offset, dir)?;
        Ok(Some(Arc::new(FabricOp {
            net: Arc::downgrade(n),
            key,
        })))
    }
    fn get_nbi(
        &self,
        pe: usize,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<Option<Arc<dyn InFlight>>> {
        if !self.net.is_remote(pe) || dst.is_empty() {
            return self.local.get_nbi(pe, offset, dst);
        }
        let n = &self.net;
        n.count(dst.len());
        let dir = NbiDir::Get(dst);
        let key =
            n.ep.nbi_post(pe, &n.segments[pe], n.ctrl_bytes + offset, dir)?;
        Ok(Some(Arc::new(FabricOp {
            net: Arc::downgrade(n),
            key,
        })))
    }
    fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        if !self.net.is_remote(pe) {
            return self.local.atomic(pe, offset, wide, op);
        }
        let n = &self.net;
        n.ep.nbi_fenced(pe);
        n.ep.atomic(pe, &n.segments[pe], n.ctrl_bytes + offset, wide, op)
    }
    fn fence(&self) {
        self.net.ep.nbi_fence();
        self.local.fence();
    }
    fn quiet(&self) -> Result<()> {
        self.net.ep.nbi_quiet()?;
        self.local.quiet()
    }
    fn host_base(&self, pe: usize) -> Option<*mut u8> {
        if self.net.is_remote(pe) {
            return None;
        }
        self.local.host_base(pe)
    }
}

/// A non-blocking put or get on the fabric (its key in the endpoint's table); dropping the last
/// reference releases it (its staging goes back once it ended). It does not keep the fabric
/// alive: a handle kept past the end of its world finds it gone ([`Error::WorldEnded`]), and
/// the endpoint, closing, keeps the staging of whatever was still in flight.
///
/// [`Error::WorldEnded`]: crate::Error::WorldEnded
#[derive(Debug)]
struct FabricOp {
    net: std::sync::Weak<Net>,
    key: u64,
}

impl InFlight for FabricOp {
    fn poll(&self, drive: bool) -> Option<Result<()>> {
        match self.net.upgrade() {
            Some(n) => n.ep.nbi_status(self.key, drive),
            None => Some(Err(crate::Error::WorldEnded)),
        }
    }
    fn wait(&self) -> Result<()> {
        match self.net.upgrade() {
            Some(n) => n.ep.nbi_wait(self.key),
            None => Err(crate::Error::WorldEnded),
        }
    }
    fn land(&self, dst: &mut [u8]) {
        if let Some(n) = self.net.upgrade() {
            n.ep.nbi_land(self.key, dst);
        }
    }
    fn wait_into(&self, dst: &mut [u8]) -> Result<()> {
        match self.net.upgrade() {
            Some(n) => n.ep.nbi_wait_land(self.key, dst),
            None => Err(crate::Error::WorldEnded),
        }
    }
}

impl Drop for FabricOp {
    fn drop(&mut self) {
        if let Some(n) = self.net.upgrade() {
            n.ep.nbi_release(self.key);
        }
    }
}
