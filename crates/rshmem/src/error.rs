//! The one error type of the library.
//!
//! Every misuse a caller can make, and every fault a peer can cause, ends in one of these
//! variants; nothing the caller passes leads to a panic or to undefined behaviour.

use std::time::Duration;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in rshmem.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A PE index outside `0..n_pes` of the world or team it was given for.
    #[error("PE {pe} is out of range: the {what} has {n_pes} PEs")]
    PeOutOfRange {
        /// The index that was passed.
        pe: usize,
        /// How many PEs the world or team has.
        n_pes: usize,
        /// "world" or "team".
        what: &'static str,
    },
    /// An element range that does not lie inside the symmetric object.
    #[error("range {start}..{end} is outside the symmetric object of {len} elements")]
    OutOfBounds {
        /// First element of the range.
        start: usize,
        /// One past the last element of the range.
        end: usize,
        /// Length of the object in elements.
        len: usize,
    },
    /// A destination or source buffer whose length does not match what the call needs.
    #[error("length mismatch: {what} has {got} elements, {expected} expected")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the call needs.
        expected: usize,
    },
    /// The symmetric heap has no free block large enough.
    #[error("symmetric heap exhausted: {requested} bytes requested, largest free block {largest_free} bytes, heap size {heap_size} bytes (raise RSHMEM_HEAP_SIZE)")]
    HeapExhausted {
        /// Bytes asked for (after rounding).
        requested: usize,
        /// Largest free block at the time.
        largest_free: usize,
        /// Total heap size per PE.
        heap_size: usize,
    },
    /// An alignment that is not a power of two, or an address not aligned for an atomic.
    #[error("misaligned: offset {offset} is not a multiple of {align}")]
    Misaligned {
        /// The byte offset (or the requested alignment when `align` is 0).
        offset: usize,
        /// The alignment required.
        align: usize,
    },
    /// A wait or a synchronisation did not complete in time while the peer is alive.
    #[error("timeout after {after:?} in {op}{}", pe.map(|p| format!(" waiting for PE {p}")).unwrap_or_default())]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
        /// The PE it was waiting for, when known.
        pe: Option<usize>,
        /// How long it waited.
        after: Duration,
    },
    /// The completion queue of non-blocking operations is full: the operation was not started.
    #[error(
        "completion queue full ({capacity} entries): drain it with Pe::completions, or size it \
         with Config::completion_queue / RSHMEM_COMPLETION_QUEUE (0 records nothing)"
    )]
    QueueFull {
        /// The queue's capacity.
        capacity: usize,
    },
    /// A peer died (crash, kill, exit without finalize) while this PE depended on it.
    #[error("PE {pe} was lost (process or thread ended) during {op}")]
    PeerLost {
        /// The lost PE (world index).
        pe: usize,
        /// The operation that noticed.
        op: &'static str,
    },
    /// A collective call (allocation, free, team split) whose arguments differ across PEs.
    #[error("collective mismatch in {op}: PE {pe} passed {theirs}, this PE passed {mine}")]
    CollectiveMismatch {
        /// The collective operation.
        op: &'static str,
        /// The first PE found to disagree.
        pe: usize,
        /// This PE's arguments.
        mine: String,
        /// That PE's arguments.
        theirs: String,
    },
    /// The world this handle belongs to has been finalized, or the handle belongs to another world.
    #[error("the world has ended or the handle belongs to another world")]
    WorldEnded,
    /// A team operation by a PE that is not a member, or with too many teams alive.
    #[error("team error: {0}")]
    Team(String),
    /// An argument that is invalid for another reason (the message says which).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that must not overlap with another one on the same PE, made while another thread
    /// of this PE was inside that one: two of alloc, free, team split and team destroy (they
    /// share the PE's exchange area, even on different teams), or two barriers or syncs of one
    /// team. The call returned at once and did nothing — it wrote no record and signalled no
    /// peer, so the other PEs did not see it ([`Pe::free`](crate::Pe::free) and
    /// [`Pe::team_destroy`](crate::Pe::team_destroy) still consumed their handle).
    #[error("{op} called while another thread of this PE is inside {running}: they must not overlap on one PE (nothing was done)")]
    Busy {
        /// The call refused.
        op: &'static str,
        /// The operation the other thread was inside.
        running: &'static str,
    },
    /// Bootstrap failed: a peer never came, a wrong world size, a version mismatch, an address in use.
    #[error("bootstrap failed{}: {msg}", pe.map(|p| format!(" (PE {p})")).unwrap_or_default())]
    Bootstrap {
        /// The PE concerned, when known.
        pe: Option<usize>,
        /// What went wrong.
        msg: String,
    },
    /// A backend that is not available here (no driver, no device) or that failed.
    #[error("backend {backend}: {msg}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// A fixed-capacity buffer would overflow (MoE dispatch in capturable mode): nothing was
    /// sent, on any PE of the team, and the buffer stays usable.
    #[error("capacity exceeded in {op}: PE {src_pe} has {needed} rows for PE {dst_pe}, capacity {capacity} per (source, destination) pair")]
    Capacity {
        /// The operation.
        op: &'static str,
        /// The sending PE (team index).
        src_pe: usize,
        /// The receiving PE (team index).
        dst_pe: usize,
        /// Rows it would need.
        needed: usize,
        /// Rows available.
        capacity: usize,
    },
    /// The fabric (libfabric transport between nodes) failed an operation.
    #[error("fabric error in {op}{}: {msg}", pe.map(|p| format!(" with PE {p}")).unwrap_or_default())]
    Fabric {
        /// The operation.
        op: &'static str,
        /// The peer concerned, when known.
        pe: Option<usize>,
        /// The provider's and libfabric's account.
        msg: String,
    },
    /// An operating-system call failed.
    #[error("{op} failed: {msg}")]
    Os {
        /// The call.
        op: &'static str,
        /// The OS error text.
        msg: String,
    },
}

impl Error {
    pub(crate) fn os(op: &'static str) -> Error {
        Error::Os {
            op,
            msg: std::io::Error::last_os_error().to_string(),
        }
    }
    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}
