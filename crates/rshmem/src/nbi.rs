//! Non-blocking operations: handles that can be polled or waited, and a per-PE completion queue
//! through which a task scheduler learns which submitted operations finished without polling
//! each handle (what the PTO runtime of seed 004 needed).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// An entry of the completion queue.
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

/// A submitted non-blocking operation. It borrows the source (put) or destination (get) buffer
/// until it completes, so the buffer cannot be reused or read early.
#[derive(Debug)]
#[must_use = "a non-blocking operation must be waited, or completed by quiet"]
pub struct OpHandle<'a> {
    pub(crate) id: OpId,
    pub(crate) pe: usize,
    pub(crate) timeout: Duration,
    pub(crate) done: Arc<AtomicBool>,
    pub(crate) _buf: PhantomData<&'a mut [u8]>,
}

impl OpHandle<'_> {
    /// The id that the completion queue reports.
    pub fn id(&self) -> OpId {
        self.id
    }
    /// True once the operation completed (data delivered for a put, landed for a get).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    /// Waits for completion, at most the world's timeout ([`crate::Config::timeout`]):
    /// [`Error::Timeout`](crate::Error::Timeout) naming the target PE after that.
    pub fn wait(self) -> crate::Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.is_done() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                if start.elapsed() > self.timeout {
                    return Err(crate::Error::Timeout {
                        op: "non-blocking operation",
                        pe: Some(self.pe),
                        after: self.timeout,
                    });
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// The per-PE queue of completed operations, bounded: a submission that would overflow it fails
/// before it starts ([`crate::Error::QueueFull`]); capacity 0 records nothing.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    q: Mutex<Vec<Completion>>,
    capacity: usize,
}

impl CompletionQueue {
    pub fn new(capacity: usize) -> Self {
        CompletionQueue {
            q: Mutex::new(Vec::new()),
            capacity,
        }
    }
    /// Checks that one more entry fits (before an operation starts).
    pub fn check_room(&self) -> crate::Result<()> {
        if self.capacity == 0 {
            return Ok(());
        }
        let q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.capacity {
            return Err(crate::Error::QueueFull {
                capacity: self.capacity,
            });
        }
        Ok(())
    }
    /// Records a completion (dropped when the queue is off). Only the owning PE's thread
    /// submits, so room checked by [`check_room`](Self::check_room) is still there.
    pub fn push(&self, c: Completion) {
        if self.capacity == 0 {
            return;
        }
        self.q.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }
    pub fn drain(&self, out: &mut Vec<Completion>) -> usize {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len();
        out.append(&mut q);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_on_an_unfinished_operation_times_out_naming_the_pe() {
        let h = OpHandle {
            id: 1,
            pe: 3,
            timeout: Duration::from_millis(20),
            done: Arc::new(AtomicBool::new(false)),
            _buf: PhantomData,
        };
        match h.wait() {
            Err(crate::Error::Timeout { pe: Some(3), .. }) => {}
            other => panic!("expected a timeout naming PE 3, got {other:?}"),
        }
        let done = Arc::new(AtomicBool::new(false));
        let h = OpHandle {
            id: 2,
            pe: 0,
            timeout: Duration::from_secs(20),
            done: done.clone(),
            _buf: PhantomData,
        };
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            done.store(true, Ordering::Release);
        });
        h.wait().expect("completes once done is set");
        t.join().unwrap();
    }

    #[test]
    fn queue_capacity() {
        let q = CompletionQueue::new(2);
        let c = Completion {
            id: 0,
            kind: OpKind::Put,
            pe: 1,
            tag: 5,
        };
        for _ in 0..2 {
            q.check_room().unwrap();
            q.push(c);
        }
        assert!(matches!(
            q.check_room(),
            Err(crate::Error::QueueFull { capacity: 2 })
        ));
        let mut out = Vec::new();
        assert_eq!(q.drain(&mut out), 2);
        assert_eq!(out, [c, c]);
        q.check_room().unwrap();
        let off = CompletionQueue::new(0);
        off.check_room().unwrap();
        off.push(c);
        assert_eq!(off.drain(&mut out), 0);
    }
}
