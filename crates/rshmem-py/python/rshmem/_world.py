"""Which PE the calling thread is, and how PEs start and end.

A process started by torchrun or ``rshmem run`` holds one PE (``init()``); thread mode runs n
Python threads as n PEs of one world (``launch(n, fn)``), each thread seeing its own PE.
"""

import atexit
import threading
from typing import Any, Callable, List, Optional

from . import _rshmem
from .errors import InvalidArgument, PeerLost, WorldEnded

# Which PE the calling thread is lives in the native module (``set_world``, ``current_world``),
# where the entry points of the hot calls find it without Python code. The process's PE is let
# go at exit (as a module global is at interpreter shutdown), so a PE never finalized still
# releases its resources there.
atexit.register(_rshmem.set_world, None, False)


def current() -> _rshmem.World:
    """The calling thread's PE (set by ``launch``), else the process's (set by ``init``)."""
    w = _rshmem.current_world()
    if w is None or w.ended:
        raise WorldEnded(
            "no rshmem world: call rshmem.init() (torchrun, rshmem run, or explicit arguments) "
            "or run the code under rshmem.launch(n, fn)"
        )
    return w


def _bind_device(w: _rshmem.World, shared: bool = False) -> None:
    """Makes the PE's GPU torch's current device of this thread (CUDA backend). Where other
    thread-PEs of this process share that GPU (``shared``), also gives this thread a stream of
    its own as its current stream: torch's default stream is one per GPU, so their
    stream-ordered calls would queue behind each other (one PE's barrier kernel waiting for the
    other PE's, which is queued behind it, until the device timeout)."""
    if w.backend != "cuda":
        return
    try:
        import torch
    except ImportError:
        return
    torch.cuda.set_device(w.device)
    if shared:
        torch.cuda.set_stream(torch.cuda.Stream(device=w.device))


def init(
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    address: Optional[str] = None,
    unique_id: Optional[str] = None,
    heap_size: Optional[int] = None,
    timeout: Optional[float] = None,
    backend: Optional[str] = None,
) -> None:
    """Joins a world as this process's PE.

    Without ``rank``: the job described by the environment -- torchrun (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; rshmem listens on
    ``MASTER_PORT + 1``), ``rshmem run``, Open MPI -- or a world of one PE without any.
    With ``rank`` and ``world_size``: rank 0's ``address`` (``host:port``) or a ``unique_id``
    from ``rshmem.unique_id()`` made in rank 0's process and handed to every rank.

    ``heap_size`` (bytes per PE), ``timeout`` (seconds) and ``backend`` (``"shm"`` or
    ``"cuda"``) override ``RSHMEM_HEAP_SIZE``, ``RSHMEM_TIMEOUT`` and ``RSHMEM_BACKEND``.
    Collective: every PE calls it. End with ``finalize()``.
    """
    g = _rshmem.current_world(False)
    if g is not None and not g.ended:
        raise InvalidArgument("rshmem.init: this process already has a PE (call finalize first)")
    if rank is None and world_size is None and address is None and unique_id is None:
        w = _rshmem.World.from_env(heap_size, timeout, backend)
    else:
        if rank is None or world_size is None:
            raise InvalidArgument("rshmem.init: rank and world_size go together")
        where = address or unique_id
        if where is None or (address is not None and unique_id is not None):
            raise InvalidArgument("rshmem.init: pass exactly one of address and unique_id")
        w = _rshmem.World.connect(where, rank, world_size, heap_size, timeout, backend)
    _rshmem.set_world(w, False)
    _bind_device(w)


def finalize() -> None:
    """Ends this thread's (or process's) PE: quiet, a barrier of every PE. Collective."""
    w = current()
    try:
        w.finalize()
    finally:
        if _rshmem.current_world(True) is w:
            _rshmem.set_world(None, True)
        if _rshmem.current_world(False) is w:
            _rshmem.set_world(None, False)


def is_initialized() -> bool:
    """Whether the calling thread has a live PE."""
    w = _rshmem.current_world()
    return w is not None and not w.ended


def launch(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    heap_size: Optional[int] = None,
    timeout: Optional[float] = None,
    backend: Optional[str] = None,
) -> List[Any]:
    """Runs ``fn(*args)`` on ``n`` PEs, each a Python thread of this process (one GPU each on
    the CUDA backend), and returns their results in PE order.

    Inside ``fn`` every rshmem call acts for the calling thread's PE. Blocking calls release
    the GIL, so a PE waiting for another never stops it. If ``fn`` raises on a PE, that PE
    leaves without finalize (its peers' waits end in ``PeerLost``) and the first exception
    that is not a ``PeerLost`` is raised here once every thread ended.

    On the CUDA backend each thread's current torch device is its PE's GPU; thread-PEs that
    share a GPU (``RSHMEM_DEVICES=0,0``) each also get a stream of their own as the thread's
    current stream, so that their stream-ordered calls do not queue behind each other.

    Started by a launcher (torchrun, ``rshmem run``), this process is one PE of that job:
    ``fn`` runs once, here, and the list holds its one result.
    """
    if _rshmem.launched():
        init(heap_size=heap_size, timeout=timeout, backend=backend)
        try:
            r = fn(*args)
        except BaseException:
            current().abandon()
            raise
        finalize()
        return [r]
    if not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"rshmem.launch: n must be a positive int, not {n!r}")
    hub = _rshmem.Hub(n, heap_size, timeout, backend)
    results: List[Any] = [None] * n
    errors: List[Optional[BaseException]] = [None] * n
    # Each PE's GPU, known once every PE joined (the gate), to tell which share one.
    devices: List[Optional[int]] = [None] * n
    gate = threading.Barrier(n)

    def body(rank: int) -> None:
        try:
            w = hub.join(rank)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[rank] = e
            gate.abort()
            return
        _rshmem.set_world(w, True)
        try:
            devices[rank] = w.device  # None off the CUDA backend
            try:
                gate.wait()
                shared = devices[rank] is not None and devices.count(devices[rank]) > 1
            except threading.BrokenBarrierError:
                # A PE that could not join: this one's first call with it fails instead.
                shared = False
            _bind_device(w, shared)
            results[rank] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[rank] = e
            w.abandon()
            return
        finally:
            _rshmem.set_world(None, True)
        try:
            w.finalize()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[rank] = e

    threads = [
        threading.Thread(target=body, args=(r,), name=f"rshmem-pe-{r}", daemon=True)
        for r in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        root = next(((r, e) for r, e in failed if not isinstance(e, PeerLost)), failed[0])
        raise root[1]
    return results


def my_pe() -> int:
    """This PE's index in the world."""
    return current().my_pe


def n_pes() -> int:
    """Number of PEs in the world."""
    return current().n_pes


def backend() -> str:
    """``"shm"`` (CPU) or ``"cuda"``."""
    return current().backend


def device() -> Optional[int]:
    """This PE's GPU ordinal (CUDA backend), else None."""
    return current().device


def heap_usage() -> tuple:
    """(symmetric heap bytes per PE, bytes allocated on this PE)."""
    return current().heap_usage()


def unique_id() -> str:
    """A unique id for ``init(rank=..., world_size=..., unique_id=...)``: made in rank 0's
    process (which keeps the port open) and handed to every rank out of band."""
    return _rshmem.unique_id()
