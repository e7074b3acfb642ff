//! Non-blocking operations: handles that can be polled or waited, and a per-PE completion queue
//! through which a task scheduler learns which submitted operations finished without polling
//! each handle (what the PTO runtime of seed 004 needed).

use crate::backend::InFlight;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// Identifier of a submitted non-blocking operation, unique per PE.
pub type OpId = u64;

/// What kind of operation completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A non-blocking put.
    Put,
    /// A non-blocking get.
    Get,
    /// A non-blocking put-with-signal.
    PutSignal,
}

/// An entry of the completion queue: the operation ended. One that failed is reported too;
/// its error comes from its handle's [`wait`](OpHandle::wait) and from the next
/// [`quiet`](crate::Pe::quiet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The operation's id (as returned by [`OpHandle::id`]).
    pub id: OpId,
    /// Its kind.
    pub kind: OpKind,
    /// The target PE.
    pub pe: usize,
    /// The caller's tag (0 unless given).
    pub tag: u64,
}

/// Where a submitted operation stands.
enum State {
    /// Completed before the submission returned.
    Done,
    /// In flight on the backend. A get's bytes are copied into `dst` (the buffer this handle
    /// borrows) by this handle once it sees the operation end, under `landed`, never by the
    /// transport: a handle that is leaked leaves nothing writing into the buffer.
    Flying {
        op: Arc<dyn InFlight>,
        dst: Option<(*mut u8, usize)>,
        /// Set once the handle collected the operation (its outcome, then).
        landed: Mutex<Option<crate::Result<()>>>,
    },
}

/// A submitted non-blocking operation. It borrows the source (put) or destination (get) buffer
/// until it completes, so the buffer cannot be reused or read early.
///
/// ```
/// // Two PEs as threads: each reads its neighbour's copy of `x` without blocking, then waits.
/// let out = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<Vec<u32>> {
///     let x = pe.alloc::<u32>(4)?;
///     pe.local_fill(&x, pe.my_pe() as u32 + 1)?;
///     pe.barrier_all()?;
///     let mut got = vec![0u32; 4];
///     let h = pe.get_nbi(&x, 0, &mut got, (pe.my_pe() + 1) % 2, 7)?;
///     h.wait()?; // `got` is borrowed until here
///     let mut done = Vec::new();
///     pe.completions(&mut done);
///     assert_eq!(done.len(), 1);
///     assert_eq!(done[0].tag, 7);
///     pe.barrier_all()?;
///     pe.free(x)?;
///     Ok(got)
/// }).values().unwrap();
/// let out: Vec<Vec<u32>> = out.into_iter().collect::<rshmem::Result<_>>().unwrap();
/// assert_eq!(out, vec![vec![2; 4], vec![1; 4]]);
/// ```
///
/// A put's source is copied before the submission returns; a get's destination receives its
/// bytes when this handle sees the operation end ([`is_done`](Self::is_done),
/// [`wait`](Self::wait), or its drop, which waits for it: at most the world's timeout). After
/// [`Pe::quiet`](crate::Pe::quiet) every operation has ended, so those no longer wait.
#[must_use = "a non-blocking operation must be waited, or completed by quiet"]
pub struct OpHandle<'a> {
    pub(crate) id: OpId,
    pub(crate) pe: usize,
    state: State,
    pub(crate) _buf: PhantomData<&'a mut [u8]>,
}

// SAFETY: the only field that is not Send and Sync is the destination pointer, which stands for
// the `&'a mut [u8]` the handle borrows (Send and Sync) and is written only under `landed`.
unsafe impl Send for OpHandle<'_> {}
// SAFETY: as above.
unsafe impl Sync for OpHandle<'_> {}

impl std::fmt::Debug for OpHandle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Without polling: formatting a handle never drives the operation or fills a buffer.
        let collected = match &self.state {
            State::Done => true,
            State::Flying { landed, .. } => {
                landed.lock().unwrap_or_else(|e| e.into_inner()).is_some()
            }
        };
        f.debug_struct("OpHandle")
            .field("id", &self.id)
            .field("pe", &self.pe)
            .field("collected", &collected)
            .finish()
    }
}

impl<'a> OpHandle<'a> {
    /// A handle of an operation that completed before its submission returned.
    pub(crate) fn done(id: OpId, pe: usize) -> OpHandle<'a> {
        OpHandle {
            id,
            pe,
            state: State::Done,
            _buf: PhantomData,
        }
    }

    /// A handle of an operation in flight; `dst`: a get's destination, which the handle
    /// borrows for `'a`.
    pub(crate) fn flying(
        id: OpId,
        pe: usize,
        op: Arc<dyn InFlight>,
        dst: Option<&'a mut [u8]>,
    ) -> OpHandle<'a> {
        OpHandle {
            id,
            pe,
            state: State::Flying {
                op,
                dst: dst.map(|d| (d.as_mut_ptr(), d.len())),
                landed: Mutex::new(None),
            },
            _buf: PhantomData,
        }
    }

    /// The id that the completion queue reports.
    pub fn id(&self) -> OpId {
        self.id
    }

    /// True once the operation ended (data delivered for a put, in the buffer for a get; or
    /// failed: [`wait`](Self::wait) then says how). Never blocks.
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Done => true,
            State::Flying { op, .. } => match op.poll(true) {
                Some(r) => {
                    let _ = self.collect(r);
                    true
                }
                None => false,
            },
        }
    }

    /// Waits for the operation to end: `Ok` once delivered (a put) or in the buffer (a get);
    /// the error that ended it otherwise ([`Error::PeerLost`](crate::Error::PeerLost) naming
    /// the target PE once it is known lost, or [`Error::Timeout`](crate::Error::Timeout) naming
    /// it when nothing of the operation completed within the world's timeout).
    pub fn wait(self) -> crate::Result<()> {
        self.finish()
    }

    /// Waits for the operation and collects it (once; later calls give the same outcome).
    fn finish(&self) -> crate::Result<()> {
        match &self.state {
            State::Done => Ok(()),
            State::Flying {
                op,
                dst: Some((ptr, len)),
                landed,
            } => {
                let mut landed = landed.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(prev) = &*landed {
                    return prev.clone();
                }
                // SAFETY: as in `collect`: the buffer this handle borrows, written by this
                // one collection only (`landed`).
                let dst = unsafe { std::slice::from_raw_parts_mut(*ptr, *len) };
                let r = op.wait_into(dst);
                *landed = Some(r.clone());
                r
            }
            State::Flying { op, .. } => {
                let r = op.wait();
                self.collect(r)
            }
        }
    }

    /// Collects an ended operation whose outcome is `r`: a get's bytes go into the buffer.
    fn collect(&self, r: crate::Result<()>) -> crate::Result<()> {
        let State::Flying { op, dst, landed } = &self.state else {
            return Ok(());
        };
        let mut landed = landed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = &*landed {
            return prev.clone();
        }
        if let (Ok(()), Some((ptr, len))) = (&r, dst) {
            // SAFETY: `ptr..ptr + len` is the `&'a mut [u8]` this handle borrows (so nothing
            // else reads or writes it while the handle lives); `landed` makes this the only
            // writer, once.
            let dst = unsafe { std::slice::from_raw_parts_mut(*ptr, *len) };
            op.land(dst);
        }
        *landed = Some(r.clone());
        r
    }
}

impl Drop for OpHandle<'_> {
    fn drop(&mut self) {
        // A get's buffer is free again once the handle is gone: its bytes must be in it by
        // then (a failure is still reported by the next quiet). A put's source was copied:
        // nothing to wait for.
        if let State::Flying { dst: Some(_), .. } = &self.state {
            let _ = self.finish();
        }
    }
}

/// The per-PE queue of completed operations, bounded: a submission that would overflow it fails
/// before it starts ([`crate::Error::QueueFull`]); capacity 0 records nothing. Operations in
/// flight hold their entry's place from submission, so one that completes always has room.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    q: Mutex<Queue>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Queue {
    /// Entries of ended operations, in the order they were seen to end.
    done: Vec<Completion>,
    /// Operations in flight, with their entries, in submission order.
    flying: Vec<(Completion, Arc<dyn InFlight>)>,
    /// Places held by submissions still starting.
    reserved: usize,
}

impl CompletionQueue {
    pub fn new(capacity: usize) -> Self {
        CompletionQueue {
            q: Mutex::new(Queue::default()),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a place for one more entry (before an operation starts), or
    /// [`QueueFull`](crate::Error::QueueFull); the place is used by [`push`](Self::push) or
    /// [`push_flying`](Self::push_flying), or given back by [`unreserve`](Self::unreserve).
    pub fn reserve(&self) -> crate::Result<()> {
        if self.capacity == 0 {
            return Ok(());
        }
        let mut q = self.lock();
        if q.done.len() + q.flying.len() + q.reserved >= self.capacity {
            return Err(crate::Error::QueueFull {
                capacity: self.capacity,
            });
        }
        q.reserved += 1;
        Ok(())
    }

    /// Gives back a place held by [`reserve`](Self::reserve) (the operation did not start).
    pub fn unreserve(&self) {
        if self.capacity == 0 {
            return;
        }
        let mut q = self.lock();
        q.reserved = q.reserved.saturating_sub(1);
    }

    /// Records the completion of an operation that ended on submission, in its reserved place.
    pub fn push(&self, c: Completion) {
        if self.capacity == 0 {
            return;
        }
        let mut q = self.lock();
        q.reserved = q.reserved.saturating_sub(1);
        q.done.push(c);
    }

    /// Records an operation in flight, in its reserved place: its entry arrives once it ended.
    pub fn push_flying(&self, c: Completion, op: Arc<dyn InFlight>) {
        if self.capacity == 0 {
            return;
        }
        let mut q = self.lock();
        q.reserved = q.reserved.saturating_sub(1);
        q.flying.push((c, op));
    }

    /// Moves the entries of ended operations into `out`; returns how many.
    pub fn drain(&self, out: &mut Vec<Completion>) -> usize {
        let mut q = self.lock();
        let q = &mut *q;
        let mut first = true;
        let mut ended = Vec::new();
        q.flying.retain(|(c, op)| {
            let drive = std::mem::take(&mut first);
            match op.poll(drive) {
                Some(_) => {
                    ended.push(*c);
                    false
                }
                None => true,
            }
        });
        q.done.append(&mut ended);
        let n = q.done.len();
        out.append(&mut q.done);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// An operation that ends when told to, with a given outcome and bytes to land.
    #[derive(Debug)]
    struct Fake {
        ended: AtomicBool,
        outcome: crate::Result<()>,
        bytes: Vec<u8>,
        lands: AtomicUsize,
    }

    impl Fake {
        fn new(outcome: crate::Result<()>, bytes: &[u8]) -> Arc<Fake> {
            Arc::new(Fake {
                ended: AtomicBool::new(false),
                outcome,
                bytes: bytes.to_vec(),
                lands: AtomicUsize::new(0),
            })
        }
        fn end(&self) {
            self.ended.store(true, Ordering::Release);
        }
        fn end_later(self: &Arc<Self>, ms: u64) -> std::thread::JoinHandle<()> {
            let f = self.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                f.end();
            })
        }
    }

    impl InFlight for Fake {
        fn poll(&self, _drive: bool) -> Option<crate::Result<()>> {
            self.ended
                .load(Ordering::Acquire)
                .then(|| self.outcome.clone())
        }
        fn wait(&self) -> crate::Result<()> {
            let t0 = Instant::now();
            while !self.ended.load(Ordering::Acquire) {
                if t0.elapsed() > Duration::from_secs(5) {
                    return Err(crate::Error::Timeout {
                        op: "fake",
                        pe: Some(3),
                        after: t0.elapsed(),
                    });
                }
                std::thread::yield_now();
            }
            self.outcome.clone()
        }
        fn land(&self, dst: &mut [u8]) {
            self.lands.fetch_add(1, Ordering::Relaxed);
            dst.copy_from_slice(&self.bytes);
        }
    }

    #[test]
    fn a_get_lands_in_its_buffer_once_when_the_handle_sees_it_end() {
        let data = [7u8, 1, 250, 3, 9];
        let op = Fake::new(Ok(()), &data);
        let mut dst = [0xAAu8; 7];
        {
            let h = OpHandle::flying(4, 3, op.clone(), Some(&mut dst[1..6]));
            assert!(!h.is_done(), "not ended yet");
            assert_eq!(op.lands.load(Ordering::Relaxed), 0);
            let t = op.end_later(5);
            h.wait().expect("ends well");
            t.join().unwrap();
        }
        assert_eq!(
            dst,
            [0xAA, 7, 1, 250, 3, 9, 0xAA],
            "bytes landed, neighbours untouched"
        );
        assert_eq!(
            op.lands.load(Ordering::Relaxed),
            1,
            "landed once (wait, then drop)"
        );
        // is_done collects too, once, however often it is asked.
        let op = Fake::new(Ok(()), &data);
        let mut dst = [0u8; 5];
        {
            let h = OpHandle::flying(5, 3, op.clone(), Some(&mut dst));
            op.end();
            assert!(h.is_done() && h.is_done());
        }
        assert_eq!(dst, data);
        assert_eq!(op.lands.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn dropping_a_get_waits_and_lands_forgetting_it_writes_nothing() {
        let data = [5u8; 16];
        let op = Fake::new(Ok(()), &data);
        let mut dst = [0u8; 16];
        let t = op.end_later(20);
        drop(OpHandle::flying(1, 0, op.clone(), Some(&mut dst)));
        assert_eq!(dst, data, "the drop waited for the bytes");
        t.join().unwrap();
        let op = Fake::new(Ok(()), &[9u8; 16]);
        let mut dst = [0u8; 16];
        std::mem::forget(OpHandle::flying(2, 0, op.clone(), Some(&mut dst)));
        op.end();
        assert_eq!(dst, [0u8; 16], "a leaked handle leaves the buffer alone");
        assert_eq!(op.lands.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_failed_get_reports_its_error_and_leaves_the_buffer() {
        let lost = crate::Error::PeerLost {
            pe: 3,
            op: "get_nbi",
        };
        let op = Fake::new(Err(lost.clone()), &[1u8; 4]);
        let mut dst = [0u8; 4];
        {
            let h = OpHandle::flying(1, 3, op.clone(), Some(&mut dst));
            op.end();
            assert!(h.is_done(), "a failed operation has ended");
            assert_eq!(h.wait(), Err(lost));
        }
        assert_eq!(dst, [0u8; 4]);
        assert_eq!(op.lands.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn dropping_a_put_handle_waits_for_nothing() {
        let op = Fake::new(Ok(()), &[]);
        let t0 = Instant::now();
        drop(OpHandle::flying(1, 3, op.clone(), None));
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the drop did not wait"
        );
        assert_eq!(op.lands.load(Ordering::Relaxed), 0);
        // A put in flight that never ends: wait reports the timeout naming the PE.
        let h = OpHandle::flying(2, 3, op, None);
        assert!(matches!(
            h.wait(),
            Err(crate::Error::Timeout { pe: Some(3), .. })
        ));
    }

    #[test]
    fn queue_capacity_counts_operations_in_flight() {
        let q = CompletionQueue::new(3);
        let c = |id| Completion {
            id,
            kind: OpKind::Put,
            pe: 1,
            tag: 5 + id,
        };
        q.reserve().unwrap();
        q.push(c(0));
        let a = Fake::new(Ok(()), &[]);
        let b = Fake::new(
            Err(crate::Error::PeerLost {
                pe: 1,
                op: "put_nbi",
            }),
            &[],
        );
        q.reserve().unwrap();
        q.push_flying(c(1), a.clone());
        q.reserve().unwrap();
        q.push_flying(c(2), b.clone());
        assert!(matches!(
            q.reserve(),
            Err(crate::Error::QueueFull { capacity: 3 })
        ));
        let mut out = Vec::new();
        assert_eq!(q.drain(&mut out), 1, "only the ended one");
        assert_eq!(out, [c(0)]);
        // Entries arrive in the order their operations were seen to end; a failed one too.
        b.end();
        assert_eq!(q.drain(&mut out), 1);
        a.end();
        assert_eq!(q.drain(&mut out), 1);
        assert_eq!(out, [c(0), c(2), c(1)]);
        q.reserve().unwrap();
        q.unreserve();
        for _ in 0..3 {
            q.reserve().unwrap();
        }
        assert!(q.reserve().is_err(), "reserved places count");
        let off = CompletionQueue::new(0);
        off.reserve().unwrap();
        off.push(c(0));
        off.reserve().unwrap();
        off.push_flying(c(1), Fake::new(Ok(()), &[]));
        assert_eq!(off.drain(&mut out), 0);
    }
}
