//! Non-blocking operations: handles that can be polled or waited, and a per-PE completion queue
//! through which a task scheduler learns which submitted operations finished without polling
//! each handle (what the PTO runtime of seed 004 needed).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Waits for completion.
    pub fn wait(self) -> crate::Result<()> {
        while !self.is_done() {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// The per-PE queue of completed operations.
#[derive(Debug, Default)]
pub(crate) struct CompletionQueue {
    q: Mutex<Vec<Completion>>,
}

impl CompletionQueue {
    pub fn push(&self, c: Completion) {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }
    pub fn drain(&self, out: &mut Vec<Completion>) -> usize {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len();
        out.append(&mut q);
        n
    }
}
