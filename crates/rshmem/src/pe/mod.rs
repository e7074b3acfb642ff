//! The PE handle: allocation, one-sided operations, atomics, signals, waits, barriers, teams.

mod atomics;
mod calls;
mod free;
mod ptr;
mod teams;

pub(crate) use calls::CallKind;
pub(crate) use free::sealed;
pub use free::Free;

use crate::backend::{AtomicOp, InFlight};
use crate::bootstrap::Bootstrap;
use crate::config::{BackendKind, Config};
use crate::control::EXCH_FIXED;
use crate::elem::{AtomicElem, Cmp, Elem, SignalOp};
use crate::error::{Error, Result};
use crate::nbi::{Completion, OpHandle, OpKind};
use crate::sym::{as_bytes, as_bytes_mut, AsSym, RawSym, Signal, Sym};
use crate::sync::{checked_barrier, hier_checked_barrier, Note, NoteMem, SyncMem, LANES};
use crate::team::{color_groups, strided_members, Team};
use crate::world::{self, Mode, PeInner};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A processing element: the handle through which one PE's code talks to the world.
///
/// ```
/// // Two PEs as threads; each writes its rank into the next PE's copy of `x`.
/// let out = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<u64> {
///     let x = pe.alloc::<u64>(1)?;
///     let next = (pe.my_pe() + 1) % pe.n_pes();
///     pe.p(&x, 0, pe.my_pe() as u64 + 100, next)?;
///     pe.barrier_all()?;
///     let v = pe.g(&x, 0, pe.my_pe())?;
///     pe.free(x)?;
///     Ok(v)
/// }).values().unwrap();
/// assert_eq!(out.into_iter().collect::<rshmem::Result<Vec<_>>>().unwrap(), vec![101, 100]);
/// ```
///
/// # Threads
/// A `Pe` is `Sync`: several threads of one PE may issue one-sided operations (put, get,
/// atomics, signals, waits) at the same time, and barriers and syncs of *different* teams.
/// The operations that exchange records through the PE's one exchange area — [`alloc`](Self::alloc),
/// [`alloc_aligned`](Self::alloc_aligned), [`free`](Self::free),
/// [`team_split`](Self::team_split), [`team_split_strided`](Self::team_split_strided),
/// [`team_destroy`](Self::team_destroy) — do not overlap with one another on one PE, even on
/// different teams, and a team's barriers and syncs ([`barrier_all`](Self::barrier_all),
/// [`sync_all`](Self::sync_all), [`team_barrier`](Self::team_barrier),
/// [`team_sync`](Self::team_sync), and the exchanges above on that team) are issued by one
/// thread at a time. A call made while another thread of the PE is inside one it must not
/// overlap with returns [`Error::Busy`] at once (naming the operation running), having done
/// nothing: it wrote no record and signalled no peer, so the other PEs never see it and the
/// running one completes normally. Program the threads so this does not happen — which of two
/// overlapping calls wins is a race — the error only keeps such a mistake from mixing records
/// or barrier counts. Collectives use one [`Coll`](crate::coll::Coll) per thread.
#[derive(Debug)]
pub struct Pe {
    pub(crate) inner: Arc<PeInner>,
}

const TAG_ALLOC: u64 = 1;
const TAG_FREE: u64 = 2;
const TAG_SPLIT_STRIDED: u64 = 3;
const TAG_SPLIT_COLOR: u64 = 4;
const TAG_DESTROY: u64 = 5;
// Codes of the barriers in a team slot's busy bits (beside the exchange tags above).
const OP_BARRIER_ALL: u64 = 6;
const OP_SYNC_ALL: u64 = 7;
const OP_TEAM_BARRIER: u64 = 8;
const OP_TEAM_SYNC: u64 = 9;

/// The most finalize waits for its peers once a barrier of this PE failed.
const FINALIZE_GRACE: Duration = Duration::from_millis(500);

/// Low bits of a team slot's word ([`PeInner::team_epochs`]) holding the code of the operation
/// a thread of this PE is inside (0: none); the slot's barrier epoch is above them.
pub(crate) const OP_BITS: u32 = 4;
const OP_MASK: u64 = (1 << OP_BITS) - 1;

fn tag_name(t: u64) -> &'static str {
    match t {
        TAG_ALLOC => "alloc",
        TAG_FREE => "free",
        TAG_SPLIT_STRIDED => "team_split_strided",
        TAG_SPLIT_COLOR => "team_split",
        TAG_DESTROY => "team_destroy",
        OP_BARRIER_ALL => "barrier_all",
        OP_SYNC_ALL => "sync_all",
        OP_TEAM_BARRIER => "team_barrier",
        OP_TEAM_SYNC => "team_sync",
        _ => "collective",
    }
}

/// A busy word held by one thread of this PE: the exchange area's ([`PeInner::exch_busy`]) or a
/// team slot's ([`PeInner::team_epochs`]). Taken with one atomic read-modify-write that fails
/// when another thread holds it; dropping it, on every exit path, stores `idle` (the word
/// without a code: 0, or the slot's latest epoch).
struct Held<'a> {
    word: &'a AtomicU64,
    idle: u64,
}

impl<'a> Held<'a> {
    /// Marks `word` as inside operation `code`, or reports the operation already inside.
    fn take(word: &'a AtomicU64, code: u64) -> Result<Held<'a>> {
        debug_assert!(code != 0 && code <= OP_MASK);
        match word.fetch_update(Ordering::Acquire, Ordering::Relaxed, |w| {
            (w & OP_MASK == 0).then_some(w | code)
        }) {
            Ok(idle) => Ok(Held { word, idle }),
            Err(w) => Err(Error::Busy {
                op: tag_name(code),
                running: tag_name(w & OP_MASK),
            }),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.word.store(self.idle, Ordering::Release);
    }
}

struct TeamMem<'a> {
    inner: &'a PeInner,
    team: &'a Team,
}

impl SyncMem for TeamMem<'_> {
    #[inline]
    fn add(&self, member: usize, lane: usize, round: usize, v: u64) {
        let w = self.inner.layout.barrier_word(self.team.slot, round) + lane;
        self.inner.ctrl_add(self.team.members[member], w, v);
    }
    #[inline]
    fn load_own(&self, lane: usize, round: usize) -> u64 {
        let w = self.inner.layout.barrier_word(self.team.slot, round) + lane;
        self.inner.ctrls[self.inner.me]
            .word(w)
            .load(Ordering::Acquire)
    }
    #[inline]
    fn set_call(&self, parity: usize, word: u64) {
        let w = self.inner.layout.call_word(self.team.slot, parity);
        self.inner.ctrls[self.inner.me]
            .word(w)
            .store(word, Ordering::Relaxed);
    }
    #[inline]
    fn call_of(&self, member: usize, parity: usize) -> u64 {
        let w = self.inner.layout.call_word(self.team.slot, parity);
        self.inner.ctrl_load(self.team.members[member], w)
    }
}

impl NoteMem for TeamMem<'_> {
    fn set_note(&self, note: Note, parity: usize, member: u64, word: u64) {
        let w = self.inner.layout.note_word(self.team.slot, note, parity);
        let own = &self.inner.ctrls[self.inner.me];
        own.word(w).store(member, Ordering::Relaxed);
        own.word(w + 1).store(word, Ordering::Relaxed);
    }
    fn note_of(&self, member: usize, note: Note, parity: usize) -> (u64, u64) {
        let w = self.inner.layout.note_word(self.team.slot, note, parity);
        let pe = self.team.members[member];
        (self.inner.ctrl_load(pe, w), self.inner.ctrl_load(pe, w + 1))
    }
    fn leader_of(&self, member: usize, parity: usize) -> Result<(u64, (u64, u64))> {
        // The call words and the node notes are adjacent: one read.
        let l = &self.inner.layout;
        let first = l.call_word(self.team.slot, 0);
        let note = l.note_word(self.team.slot, Note::Node, parity) - first;
        let v = self
            .inner
            .ctrl_read(self.team.members[member], first, note + 2)?;
        Ok((v[parity], (v[note], v[note + 1])))
    }
}

impl Pe {
    /// Joins a world through `bootstrap` (collective over every rank of the bootstrap).
    ///
    /// Most programs use [`launch`](crate::launch) or [`init`](crate::init) instead; this is
    /// the entry for threads the application owns: every thread calls it with its endpoint of a
    /// shared [`InProcBootstrap`](crate::InProcBootstrap).
    pub fn init(config: Config, bootstrap: Box<dyn Bootstrap>) -> Result<Pe> {
        Ok(Pe {
            inner: world::init(config, bootstrap)?,
        })
    }

    /// Finalizes this PE: quiet, a barrier with every PE, then the PE is gone. Peers waiting on
    /// a PE that ends without finalize see [`Error::PeerLost`].
    pub fn finalize(self) -> Result<()> {
        let r = self.quiet().and_then(|_| {
            let world = &self.inner.world_team;
            if self.inner.faulted.load(Ordering::Acquire) {
                // A barrier already failed: the peers that can still meet here do so within a
                // short grace; a stuck or lost one would otherwise cost a second full timeout.
                let grace = self.inner.config.timeout.min(FINALIZE_GRACE);
                self.team_sync_within(world, OP_SYNC_ALL, CallKind::Finalize, grace)
            } else {
                self.team_sync_op(world, OP_SYNC_ALL, CallKind::Finalize)
            }
        });
        // Across nodes, a peer's last read of this PE's control block (the final barrier's
        // call word) goes over the fabric, which closes with this process: every PE leaves only
        // once all have passed the barrier, met on the bootstrap, which uses no fabric.
        let r = r.and_then(|()| match &self.inner.net {
            Some(_) => self.inner.bootstrap.barrier(),
            None => Ok(()),
        });
        self.inner.record_cause();
        self.inner.finalized.store(true, Ordering::Release);
        self.inner.ctrls[self.inner.me]
            .word(crate::control::W_STATE)
            .store(crate::control::STATE_FINALIZED, Ordering::Release);
        r
    }

    /// This PE's index in the world.
    pub fn my_pe(&self) -> usize {
        self.inner.me
    }
    /// Number of PEs in the world.
    pub fn n_pes(&self) -> usize {
        self.inner.n
    }
    /// How the world's PEs are placed (threads, processes, mixed).
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }
    /// The backend holding the heap.
    pub fn backend(&self) -> BackendKind {
        self.inner.backend.kind()
    }
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }
    /// The world team.
    pub fn world_team(&self) -> &Team {
        &self.inner.world_team
    }
    /// Heap bytes per PE, and bytes currently allocated.
    pub fn heap_usage(&self) -> (usize, usize) {
        let h = self.inner.heap.lock().unwrap_or_else(|e| e.into_inner());
        (h.size(), h.used_bytes())
    }
    /// Where world PE `pe` runs: its process, its thread in the process, its device ordinal.
    pub fn placement(&self, pe: usize) -> Result<crate::Placement> {
        self.check_pe(pe)?;
        Ok(self.inner.placements[pe])
    }
    /// The whole placement map, by world index.
    pub fn placements(&self) -> &[crate::Placement] {
        &self.inner.placements
    }
    /// The nodes `team`'s members run on ([`NodeMap`](crate::NodeMap)), from the placement
    /// map the world agreed at start-up.
    pub fn node_map(&self, team: &Team) -> crate::NodeMap {
        let p = &self.inner.placements;
        let nodes: Vec<usize> = team.members().iter().map(|&m| p[m].node).collect();
        crate::NodeMap::from_nodes(&nodes)
    }
    /// Heap data this PE moved to or from PEs of other nodes since the world started: puts and
    /// gets (each collective or MoE step counts as the operations it issues) and their bytes;
    /// and, apart, the operations on their control blocks (barrier arrivals, call words,
    /// exchange records). Signal and atomic words of the heap are not counted. All zero in a
    /// world of one node.
    pub fn net_traffic(&self) -> crate::NetTraffic {
        let (ops, bytes, ctrl_ops) = self.inner.net.as_ref().map_or((0, 0, 0), |n| n.traffic());
        crate::NetTraffic {
            ops,
            bytes,
            ctrl_ops,
        }
    }
    /// True when this PE's world spans nodes on the CUDA backend and every PE's GPU heap is
    /// registered with the fabric (`FI_HMEM`, see [`Config::fabric_hmem`]): puts and gets to
    /// GPU heaps of other nodes are then RMA operations, not requests staged through host
    /// memory and the target's proxy.
    ///
    /// [`Config::fabric_hmem`]: crate::Config::fabric_hmem
    pub fn gpu_heaps_on_fabric(&self) -> bool {
        self.inner.backend.gpu_heaps_on_fabric()
    }
    /// True when world PE `pe` lives in this process (direct pointers, no mapping).
    pub fn is_same_process(&self, pe: usize) -> Result<bool> {
        self.check_pe(pe)?;
        Ok(self.inner.peers[pe].same_process)
    }

    // ----- checks -----

    fn check_pe(&self, pe: usize) -> Result<()> {
        if pe >= self.inner.n {
            return Err(Error::PeOutOfRange {
                pe,
                n_pes: self.inner.n,
                what: "world",
            });
        }
        Ok(())
    }

    fn check_raw(&self, raw: RawSym) -> Result<()> {
        if raw.job != self.inner.job {
            return Err(Error::WorldEnded);
        }
        if raw.owner != self.inner.me {
            return Err(Error::invalid(format!(
                "symmetric object handle belongs to PE {}, used by PE {}",
                raw.owner, self.inner.me
            )));
        }
        Ok(())
    }

    /// Checks object, range and PE; returns the byte offset of element `start`.
    fn locate<T: Elem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        start: usize,
        count: usize,
        pe: usize,
    ) -> Result<usize> {
        let raw = sym.raw();
        self.check_raw(raw)?;
        self.check_pe(pe)?;
        match start.checked_add(count) {
            Some(end) if end <= raw.len => Ok(raw.offset + start * std::mem::size_of::<T>()),
            end => Err(Error::OutOfBounds {
                start,
                end: end.unwrap_or(usize::MAX),
                len: raw.len,
            }),
        }
    }

    // ----- allocation -----

    /// Takes the exchange area for operation `tag` until the returned guard drops; a thread of
    /// this PE already inside such an operation is [`Error::Busy`]. Taken before the operation
    /// reads the allocation sequence or the team slots, so no overlapping call can interleave.
    fn take_exchange(&self, tag: u64) -> Result<Held<'_>> {
        Held::take(&self.inner.exch_busy, tag)
    }

    /// Exchanges a record with every member of `team` (collective); returns all records. The
    /// caller holds the exchange area ([`take_exchange`](Self::take_exchange)); the team's slot
    /// is held here, before the record is written, for both barriers.
    fn exchange(&self, team: &Team, rec: &[u64], call: CallKind) -> Result<Vec<Vec<u64>>> {
        self.exchange_held(team, rec, call).map(|(all, _)| all)
    }

    /// [`exchange`](Self::exchange), returning the team's slot still held.
    fn exchange_held(
        &self,
        team: &Team,
        rec: &[u64],
        call: CallKind,
    ) -> Result<(Vec<Vec<u64>>, Held<'_>)> {
        self.check_team(team)?;
        let inner = &*self.inner;
        let mut slot = Held::take(&inner.team_epochs[team.slot], rec[0])?;
        let base = inner.layout.exch;
        debug_assert!(rec.len() <= inner.layout.exch_words);
        debug_assert!(inner.exch_busy.load(Ordering::Relaxed) == rec[0]);
        let my = &inner.ctrls[inner.me];
        for (i, w) in rec.iter().enumerate() {
            my.word(base + i).store(*w, Ordering::Relaxed);
        }
        self.barrier_held(team, &mut slot, call)?;
        let out = team
            .members
            .iter()
            .map(|&p| inner.ctrl_read(p, base, rec.len()))
            .collect::<Result<Vec<_>>>();
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                // A peer's record could not be read: the second barrier ends in PeerLost
                // naming it (the read marked it lost); failing that, the read's own error.
                self.barrier_held(team, &mut slot, call)?;
                return Err(e);
            }
        };
        self.barrier_held(team, &mut slot, call)?;
        Ok((out, slot))
    }

    /// Checks that every member passed the same record; the first that differs is an error.
    fn check_same(
        &self,
        team: &Team,
        rec: &[u64],
        all: &[Vec<u64>],
        show: impl Fn(&[u64]) -> String,
    ) -> Result<()> {
        for (i, r) in all.iter().enumerate() {
            if r.as_slice() != rec {
                return Err(Error::CollectiveMismatch {
                    op: tag_name(rec[0]),
                    pe: team.members[i],
                    mine: show(rec),
                    theirs: show(r),
                });
            }
        }
        Ok(())
    }

    /// Collectively allocates `len` elements of `T` on every PE (same offset everywhere).
    pub fn alloc<T: Elem>(&self, len: usize) -> Result<Sym<T>> {
        self.alloc_aligned(len, std::mem::align_of::<T>())
    }

    /// As [`alloc`](Self::alloc) with an alignment (a power of two; at least 64 is used).
    ///
    /// Every PE must call it with the same length, type and alignment, in the same order as its
    /// other collective allocations; a mismatch is [`Error::CollectiveMismatch`] on every PE and
    /// nothing is allocated.
    pub fn alloc_aligned<T: Elem>(&self, len: usize, align: usize) -> Result<Sym<T>> {
        // An overflowing size still takes part in the exchange (as u64::MAX), so that a PE
        // passing it alone is reported on every PE instead of leaving the others waiting.
        let _exch = self.take_exchange(TAG_ALLOC)?;
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        let seq = self.inner.world_seq.load(Ordering::Relaxed);
        let rec = [
            TAG_ALLOC,
            seq,
            bytes.map_or(u64::MAX, |b| b as u64),
            align as u64,
            T::KIND as u64,
        ];
        let world = &self.inner.world_team;
        let all = self.exchange(world, &rec, CallKind::Alloc)?;
        self.check_same(world, &rec, &all, |r| {
            if r[0] == TAG_ALLOC {
                format!(
                    "alloc #{} of {} bytes, align {}, type {}",
                    r[1],
                    r[2],
                    r[3],
                    crate::elem::ElemKind::tag_name(r[4])
                )
            } else {
                format!("{} #{}", tag_name(r[0]), r[1])
            }
        })?;
        // The sequence number is consumed only by a matched call, so every PE stays in step
        // after a mismatch (which allocates nothing).
        self.inner.world_seq.store(seq + 1, Ordering::Relaxed);
        let bytes = bytes
            .ok_or_else(|| Error::invalid(format!("allocation of {len} elements overflows")))?;
        let off = self
            .inner
            .heap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(bytes, align)?;
        tracing::trace!(pe = self.inner.me, off, bytes, "alloc");
        Ok(Sym::new(RawSym {
            offset: off,
            len,
            job: self.inner.job,
            owner: self.inner.me,
        }))
    }

    /// [`Pe::free`] of a symmetric object.
    pub(crate) fn free_sym<T: Elem>(&self, sym: Sym<T>) -> Result<()> {
        let _exch = self.take_exchange(TAG_FREE)?;
        // A foreign handle still takes part in the exchange, so the others see a mismatch
        // instead of waiting for this PE.
        let local = self.check_raw(sym.raw);
        let off = if local.is_ok() {
            sym.raw.offset as u64
        } else {
            u64::MAX
        };
        let seq = self.inner.world_seq.load(Ordering::Relaxed);
        let rec = [TAG_FREE, seq, off, 0, 0];
        let world = &self.inner.world_team;
        let all = self.exchange(world, &rec, CallKind::Free)?;
        local?;
        self.check_same(world, &rec, &all, |r| match (r[0], r[2]) {
            (TAG_FREE, u64::MAX) => format!("free #{} of a foreign handle", r[1]),
            (TAG_FREE, off) => format!("free #{} at offset {off}", r[1]),
            (tag, _) => format!("{} #{}", tag_name(tag), r[1]),
        })?;
        self.inner.world_seq.store(seq + 1, Ordering::Relaxed);
        self.inner
            .heap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(sym.raw.offset)
    }

    // ----- put / get -----

    /// Copies `src` into PE `pe`'s copy of `dst`, starting at element `at`. Returns when `src`
    /// may be reused (delivery is ensured by [`quiet`](Self::quiet) or a barrier).
    pub fn put<T: Elem>(
        &self,
        dst: &(impl AsSym<T> + ?Sized),
        at: usize,
        src: &[T],
        pe: usize,
    ) -> Result<()> {
        let off = self.locate(dst, at, src.len(), pe)?;
        self.inner.backend.put(pe, off, as_bytes(src))?;
        self.inner.check_peer(pe, "put")
    }

    /// Copies from PE `pe`'s copy of `src` (from element `at`) into `dst`.
    pub fn get<T: Elem>(
        &self,
        src: &(impl AsSym<T> + ?Sized),
        at: usize,
        dst: &mut [T],
        pe: usize,
    ) -> Result<()> {
        let off = self.locate(src, at, dst.len(), pe)?;
        self.inner.backend.get(pe, off, as_bytes_mut(dst))?;
        // The copy reads a mapping that stays valid after the peer died: report the loss.
        self.inner.check_peer(pe, "get")
    }

    /// Writes one element.
    pub fn p<T: Elem>(
        &self,
        dst: &(impl AsSym<T> + ?Sized),
        at: usize,
        value: T,
        pe: usize,
    ) -> Result<()> {
        self.put(dst, at, std::slice::from_ref(&value), pe)
    }

    /// Reads one element.
    pub fn g<T: Elem>(&self, src: &(impl AsSym<T> + ?Sized), at: usize, pe: usize) -> Result<T> {
        let mut v = [T::ZERO];
        self.get(src, at, &mut v, pe)?;
        Ok(v[0])
    }

    /// Reads this PE's own copy of the whole object.
    pub fn local_vec<T: Elem>(&self, sym: &(impl AsSym<T> + ?Sized)) -> Result<Vec<T>> {
        let mut v = vec![T::ZERO; sym.raw().len];
        self.get(sym, 0, &mut v, self.inner.me)?;
        Ok(v)
    }

    /// Writes `src` into this PE's own copy, from element `at`.
    pub fn local_write<T: Elem>(
        &self,
        sym: &(impl AsSym<T> + ?Sized),
        at: usize,
        src: &[T],
    ) -> Result<()> {
        self.put(sym, at, src, self.inner.me)
    }

    /// Fills this PE's own copy with `value`.
    pub fn local_fill<T: Elem>(&self, sym: &(impl AsSym<T> + ?Sized), value: T) -> Result<()> {
        self.local_write(sym, 0, &vec![value; sym.raw().len])
    }

    fn complete(&self, kind: OpKind, pe: usize, tag: u64) -> OpHandle<'static> {
        let id = self.inner.next_op.fetch_add(1, Ordering::Relaxed);
        self.inner.cq.push(Completion { id, kind, pe, tag });
        OpHandle::done(id, pe)
    }

    /// The handle of a non-blocking operation the backend started (its completion-queue place
    /// reserved): complete already (`None`), or in flight, borrowing `dst` (a get's).
    fn submitted<'a>(
        &self,
        kind: OpKind,
        pe: usize,
        tag: u64,
        started: Result<Option<Arc<dyn InFlight>>>,
        dst: Option<&'a mut [u8]>,
    ) -> Result<OpHandle<'a>> {
        let started = started.and_then(|s| {
            // A blocking copy reads a mapping that stays valid after the peer died.
            if s.is_none() {
                self.inner
                    .check_peer(pe, if dst.is_some() { "get_nbi" } else { "put_nbi" })?;
            }
            Ok(s)
        });
        match started {
            Err(e) => {
                self.inner.cq.unreserve();
                Err(e)
            }
            Ok(None) => Ok(self.complete(kind, pe, tag)),
            Ok(Some(op)) => {
                let id = self.inner.next_op.fetch_add(1, Ordering::Relaxed);
                let c = Completion { id, kind, pe, tag };
                self.inner.cq.push_flying(c, op.clone());
                Ok(OpHandle::flying(id, pe, op, dst))
            }
        }
    }

    /// Non-blocking put: returns a handle at once; completion is reported by the handle, by
    /// [`completions`](Self::completions) (with `tag`), and ensured by [`quiet`](Self::quiet).
    /// The handle borrows `src` until it is dropped.
    ///
    /// To a PE of this node the copy is made by the calling thread before returning (the
    /// fastest engine on a CPU); the handle is then already complete. To a PE of another node
    /// `src` is copied into staging the fabric owns, the writes are posted, and the call
    /// returns: `src` may be reused at once (dropping the handle waits for nothing), the data
    /// is in the target's memory once the handle [`is_done`](OpHandle::is_done) or after
    /// [`quiet`](Self::quiet). Its order with later puts to the same PE is set by
    /// [`fence`](Self::fence).
    pub fn put_nbi<'a, T: Elem>(
        &self,
        dst: &(impl AsSym<T> + ?Sized),
        at: usize,
        src: &'a [T],
        pe: usize,
        tag: u64,
    ) -> Result<OpHandle<'a>> {
        let off = self.locate(dst, at, src.len(), pe)?;
        self.inner.cq.reserve()?;
        let started = self.inner.backend.put_nbi(pe, off, as_bytes(src));
        self.submitted(OpKind::Put, pe, tag, started, None)
    }

    /// Non-blocking get; `dst` is borrowed by the handle until it completes.
    ///
    /// From a PE of another node the reads are posted and the call returns; the bytes reach
    /// `dst` when the handle sees the operation end ([`is_done`](OpHandle::is_done),
    /// [`wait`](OpHandle::wait), or dropping it, which waits). Until then `dst` is untouched.
    pub fn get_nbi<'a, T: Elem>(
        &self,
        src: &(impl AsSym<T> + ?Sized),
        at: usize,
        dst: &'a mut [T],
        pe: usize,
        tag: u64,
    ) -> Result<OpHandle<'a>> {
        let off = self.locate(src, at, dst.len(), pe)?;
        self.inner.cq.reserve()?;
        let bytes = as_bytes_mut(dst);
        let started = self.inner.backend.get_nbi(pe, off, bytes);
        self.submitted(OpKind::Get, pe, tag, started, Some(bytes))
    }

    /// Moves the completed non-blocking operations into `out`; returns how many.
    ///
    /// The queue holds [`Config::completion_queue`](crate::Config::completion_queue) entries
    /// (default 65 536; 0 records nothing): once full, a non-blocking submission fails with
    /// [`Error::QueueFull`](crate::Error::QueueFull) before it starts, until the queue is
    /// drained here.
    pub fn completions(&self, out: &mut Vec<Completion>) -> usize {
        self.inner.cq.drain(out)
    }

    // ----- signals -----

    /// Puts `src` into `dst` on PE `pe`, then applies `signal` there (set or add), ordered so
    /// that whoever sees the signal sees the data.
    pub fn put_signal<T: Elem>(
        &self,
        dst: &(impl AsSym<T> + ?Sized),
        at: usize,
        src: &[T],
        signal: Signal,
        pe: usize,
    ) -> Result<()> {
        let off = self.locate(dst, at, src.len(), pe)?;
        let soff = self.locate(&signal.object(), signal.at, 1, pe)?;
        self.inner.backend.put(pe, off, as_bytes(src))?;
        let aop = match signal.op {
            SignalOp::Set => AtomicOp::Set(signal.value),
            SignalOp::Add => AtomicOp::FetchAdd(signal.value),
        };
        self.inner.backend.atomic(pe, soff, true, aop)?;
        self.inner.check_peer(pe, "put_signal")
    }

    /// Non-blocking [`put_signal`](Self::put_signal).
    pub fn put_signal_nbi<'a, T: Elem>(
        &self,
        dst: &(impl AsSym<T> + ?Sized),
        at: usize,
        src: &'a [T],
        signal: Signal,
        pe: usize,
        tag: u64,
    ) -> Result<OpHandle<'a>> {
        self.inner.cq.reserve()?;
        if let Err(e) = self.put_signal(dst, at, src, signal, pe) {
            self.inner.cq.unreserve();
            return Err(e);
        }
        Ok(self.complete(OpKind::PutSignal, pe, tag))
    }

    /// Reads this PE's signal word.
    pub fn signal_fetch(&self, sig: &(impl AsSym<u64> + ?Sized), at: usize) -> Result<u64> {
        self.atomic_fetch(sig, at, self.inner.me)
    }

    // ----- ordering -----

    /// Orders earlier puts, atomics and signals to each PE before later ones to the same PE.
    ///
    /// Across nodes, the first operation to a PE after a fence waits for that PE's
    /// non-blocking operations issued before it; their failures are reported by
    /// [`quiet`](Self::quiet).
    pub fn fence(&self) {
        self.inner.backend.fence()
    }

    /// Completes every outstanding operation of this PE (all non-blocking ones included: a
    /// put's data is in the target's memory, a get's is ready for its handle). An operation
    /// that failed since the last quiet makes it an error (once), even if its handle was
    /// dropped; a lost peer is [`Error::PeerLost`] naming it.
    pub fn quiet(&self) -> Result<()> {
        let r = self.inner.backend.quiet();
        self.inner.check_all_peers("quiet")?;
        r
    }

    // ----- barriers -----

    /// One barrier of `team` as operation `code` (the slot is held for its duration), carrying
    /// `call`.
    fn team_sync_op(&self, team: &Team, code: u64, call: CallKind) -> Result<()> {
        self.team_sync_within(team, code, call, self.inner.config.timeout)
    }

    /// As [`team_sync_op`](Self::team_sync_op), waiting at most `timeout`.
    fn team_sync_within(
        &self,
        team: &Team,
        code: u64,
        call: CallKind,
        timeout: Duration,
    ) -> Result<()> {
        // A team handle of another PE would make this PE act as that member.
        self.check_team(team)?;
        let mut slot = Held::take(&self.inner.team_epochs[team.slot], code)?;
        self.barrier_within(team, &mut slot, call, timeout)
    }

    /// One barrier of `team`, whose slot this thread holds (`slot`: it advances the epoch),
    /// carrying `call`: a member inside another kind of call makes it a
    /// [`Error::CollectiveMismatch`] on every member, after which the team stays in step.
    fn barrier_held(&self, team: &Team, slot: &mut Held<'_>, call: CallKind) -> Result<()> {
        self.barrier_within(team, slot, call, self.inner.config.timeout)
    }

    fn barrier_within(
        &self,
        team: &Team,
        slot: &mut Held<'_>,
        call: CallKind,
        timeout: Duration,
    ) -> Result<()> {
        let inner = &*self.inner;
        // Checked with the slot held: team_destroy advances the generation while it holds it.
        self.check_generation(team)?;
        let epoch = (slot.idle >> OP_BITS) + 1;
        slot.idle = epoch << OP_BITS;
        let mem = TeamMem { inner, team };
        let wait = |from: usize, ready: &dyn Fn() -> bool| {
            let pe = team.members[from];
            inner.wait_for(call.name(), timeout, ready, || Some(pe), true)
        };
        let nodes = self.barrier_nodes(team);
        let differs = match &nodes {
            Some(nodes) => {
                hier_checked_barrier(&mem, nodes, team.my_index, epoch, call.code(), wait)
            }
            None => checked_barrier(
                &mem,
                team.my_index,
                team.members.len(),
                epoch,
                call.code(),
                wait,
            ),
        }
        .map_err(|e| match e {
            // The member waited for may itself wait for the one that never came: name a
            // member whose arrival is missing.
            Error::Timeout { op, pe, after } => {
                let pe = self.missing_arrival(team, nodes.as_ref(), epoch).or(pe);
                if let Some(p) = pe {
                    inner.blame(p);
                }
                Error::Timeout { op, pe, after }
            }
            e => e,
        })?;
        match differs {
            None => Ok(()),
            Some(d) => Err(Error::CollectiveMismatch {
                op: call.name(),
                pe: team.members[d.member],
                mine: CallKind::describe(crate::sync::call_word(call.code(), epoch)),
                theirs: CallKind::describe(d.word),
            }),
        }
    }

    /// The placement a barrier of `team` follows when it is hierarchical: the team spans
    /// nodes and some node holds several members (the same answer on every member).
    fn barrier_nodes(&self, team: &Team) -> Option<crate::NodeMap> {
        self.inner.net.as_ref()?;
        Some(self.node_map(team)).filter(crate::NodeMap::is_hierarchical)
    }

    /// The first member of `team` that has not arrived at barrier `epoch`. Member `m`'s first
    /// signal of a barrier goes to the round-0 counter of the next member (flat), of the next
    /// member of its node (hierarchical, lane 0), or of the next node's leader (hierarchical,
    /// alone on its node, lane 1): each barrier raises that counter by exactly one.
    fn missing_arrival(
        &self,
        team: &Team,
        nodes: Option<&crate::NodeMap>,
        epoch: u64,
    ) -> Option<usize> {
        let inner = &*self.inner;
        let n = team.members.len();
        let w = inner.layout.barrier_word(team.slot, 0);
        let first_signal = |m: usize| match nodes {
            None => ((m + 1) % n, 0),
            Some(nm) => {
                let local = nm.members(nm.node(m));
                if local.len() > 1 {
                    (local[(nm.local(m) + 1) % local.len()], 0)
                } else {
                    (nm.leader((nm.node(m) + 1) % nm.n_nodes()), 1)
                }
            }
        };
        (0..n)
            .filter(|&m| m != team.my_index)
            .find(|&m| {
                let (to, lane) = first_signal(m);
                inner.ctrl_load(team.members[to], w + lane) < epoch
            })
            .map(|m| team.members[m])
    }

    /// A team sync that is part of collective `call` (the collectives' and MoE's steps).
    pub(crate) fn team_sync_as(&self, team: &Team, call: CallKind) -> Result<()> {
        self.team_sync_op(team, OP_TEAM_SYNC, call)
    }

    /// A team barrier (quiet, then sync) that is part of collective `call`.
    pub(crate) fn team_barrier_as(&self, team: &Team, call: CallKind) -> Result<()> {
        self.quiet()?;
        self.team_sync_op(team, OP_TEAM_BARRIER, call)
    }

    /// Barrier of every PE, after completing this PE's outstanding operations.
    pub fn barrier_all(&self) -> Result<()> {
        self.quiet()?;
        self.team_sync_op(&self.inner.world_team, OP_BARRIER_ALL, CallKind::BarrierAll)
    }
    /// Synchronises every PE (no quiet).
    pub fn sync_all(&self) -> Result<()> {
        self.team_sync_op(&self.inner.world_team, OP_SYNC_ALL, CallKind::SyncAll)
    }
    /// Barrier of a team's PEs, after quiet.
    pub fn team_barrier(&self, team: &Team) -> Result<()> {
        self.team_barrier_as(team, CallKind::TeamBarrier)
    }
    /// Synchronises a team's PEs (no quiet).
    pub fn team_sync(&self, team: &Team) -> Result<()> {
        self.team_sync_as(team, CallKind::TeamSync)
    }
}
