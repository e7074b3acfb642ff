"""The exceptions rshmem raises: every Rust error becomes one of these, with the same message.

``Error`` is the base. Bad arguments are ``InvalidArgument`` (also a ``ValueError``); a wait or
barrier that ran out of time is ``Timeout`` (also a ``TimeoutError``); a dead peer is
``PeerLost``; arguments that differ across PEs are ``CollectiveMismatch``; a fixed-capacity
buffer that would overflow is ``CapacityError``; an exhausted symmetric heap is
``HeapExhausted`` (also a ``MemoryError``). Where the error names a PE, ``exc.pe`` holds it.
"""


class Error(Exception):
    """Base class of every rshmem error."""

    pe = None


class InvalidArgument(Error, ValueError):
    """An argument that is wrong on this PE (dtype, device, shape, range, not symmetric...)."""


class Timeout(Error, TimeoutError):
    """A wait, barrier or bootstrap step did not complete in time (the peer is alive)."""


class PeerLost(Error):
    """A peer ended (crash, exit, exception) while this PE depended on it."""


class CollectiveMismatch(Error):
    """A collective call whose arguments differ across PEs (raised on every PE)."""


class CapacityError(Error):
    """A fixed-capacity buffer would overflow: nothing was sent, on any PE."""


class HeapExhausted(Error, MemoryError):
    """The symmetric heap has no free block large enough (raise heap_size / RSHMEM_HEAP_SIZE)."""


class QueueFull(Error):
    """The completion queue of non-blocking operations is full."""


class WorldEnded(Error):
    """The world has been finalized, or the object belongs to another world."""


class TeamError(Error):
    """A team operation by a non-member, or too many teams."""


class Busy(Error):
    """Two calls that must not overlap on one PE were made from two threads at once."""


class BootstrapError(Error):
    """Start-up failed: a peer never came, a wrong world size, an address in use."""


class BackendError(Error):
    """A backend that is not available here (no driver, no GPU) or that failed."""


class OsError(Error, OSError):
    """An operating-system call failed."""


__all__ = [
    "Error",
    "InvalidArgument",
    "Timeout",
    "PeerLost",
    "CollectiveMismatch",
    "CapacityError",
    "HeapExhausted",
    "QueueFull",
    "WorldEnded",
    "TeamError",
    "Busy",
    "BootstrapError",
    "BackendError",
    "OsError",
]
