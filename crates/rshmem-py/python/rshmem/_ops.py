"""One-sided operations on tensors: put, get, put-with-signal, atomics, waits, fence, quiet,
barrier. On the CUDA backend they are stream-ordered on ``torch.cuda.current_stream()`` (or
the ``stream`` given) and never synchronise the host, so they capture into CUDA graphs.

``rshmem.put``, ``get``, ``put_signal``, ``wait_until``, ``fence``, ``quiet`` and ``barrier``
are native entry points (``src/front.rs``) that serve plain operands themselves and call the
functions of the same name here, the checked path, for anything else.
"""

from typing import Any, Optional

from . import _arrays as A
from ._world import current
from .errors import InvalidArgument

_CMPS = {"==": "eq", "!=": "ne", ">": "gt", ">=": "ge", "<": "lt", "<=": "le",
         "eq": "eq", "ne": "ne", "gt": "gt", "ge": "ge", "lt": "lt", "le": "le"}


def stream_ptr(w: Any, stream: Any) -> int:
    """The raw ``CUstream`` of ``stream`` (a ``torch.cuda.Stream``, or None: torch's current
    stream of this PE's GPU), checked to belong to this PE's GPU."""
    import torch

    if stream is None:
        # The raw handle without building a Stream object (as Triton reads it).
        return torch._C._cuda_getCurrentRawStream(w.device)
    if not isinstance(stream, torch.cuda.Stream):
        raise InvalidArgument(f"stream must be a torch.cuda.Stream, not {type(stream).__name__}")
    if stream.device.index != w.device:
        raise InvalidArgument(
            f"stream of cuda:{stream.device.index} given to the PE of cuda:{w.device}"
        )
    return stream.cuda_stream


def _pe(w: Any, pe: Any) -> int:
    if not isinstance(pe, int) or isinstance(pe, bool):
        raise InvalidArgument(f"PE must be an int, not {type(pe).__name__}")
    if not 0 <= pe < w.n_pes:
        raise InvalidArgument(f"PE {pe} is out of range: the world has {w.n_pes} PEs")
    return pe


def _same(d: A.Info, s: A.Info, op: str) -> None:
    if d.dtype != s.dtype:
        raise InvalidArgument(f"{op}: dtypes differ ({d.dtype} and {s.dtype})")
    if d.nbytes != s.nbytes:
        raise InvalidArgument(f"{op}: sizes differ ({d.numel} and {s.numel} elements)")


def _device_side(w: Any, *infos: A.Info) -> bool:
    """Whether the call runs on the GPU (CUDA backend); checks every operand's device."""
    if w.backend != "cuda":
        for i in infos:
            if i.cuda:
                raise InvalidArgument("a GPU tensor given to a world whose heap is host memory")
        return False
    for i in infos:
        if not i.cuda:
            raise InvalidArgument(
                "a host array given to a world whose heap is GPU memory: move it to "
                f"cuda:{w.device} (and onto the symmetric heap)"
            )
        if i.device != w.device:
            raise InvalidArgument(f"a tensor of cuda:{i.device} given to the PE of cuda:{w.device}")
    return True


def put(dst: Any, src: Any, pe: int, *, stream: Any = None) -> None:
    """Copies ``src`` into PE ``pe``'s copy of symmetric ``dst`` (same dtype and size; any
    contiguous slice of a symmetric tensor). Host: returns when ``src`` may be reused
    (delivery by ``quiet`` or ``barrier``); GPU: ``src`` must be symmetric too, stream-ordered."""
    w = current()
    d, s = A.info(dst, "dst"), A.info(src, "src")
    if d.dtype != s.dtype or d.nbytes != s.nbytes:
        _same(d, s, "put")
    if type(pe) is not int:
        pe = _pe(w, pe)
    try:
        if d.cuda or s.cuda or w.backend == "cuda":
            _device_side(w, d, s)
            w.put_dev(d.addr, s.addr, d.nbytes, pe, stream_ptr(w, stream))
        else:
            w.put(d.addr, s.addr, s.nbytes, pe)
    except OverflowError:
        raise InvalidArgument(f"PE {pe} is out of range: the world has {w.n_pes} PEs") from None


def get(dst: Any, src: Any, pe: int, *, stream: Any = None) -> None:
    """Copies PE ``pe``'s copy of symmetric ``src`` into ``dst`` (host: any contiguous
    writable array; GPU: symmetric, stream-ordered)."""
    w = current()
    pe = _pe(w, pe)
    d, s = A.info(dst, "dst"), A.info(src, "src")
    _same(d, s, "get")
    A.writable(dst, "dst")
    if _device_side(w, d, s):
        w.get_dev(d.addr, s.addr, d.nbytes, pe, stream_ptr(w, stream))
    else:
        w.get(d.addr, d.nbytes, s.addr, pe)


def _signal(w: Any, signal: Any) -> A.Info:
    i = A.info(signal, "signal")
    if i.dtype not in ("uint64", "int64"):
        raise InvalidArgument(f"signal must be a uint64 or int64 symmetric tensor, not {i.dtype}")
    if i.numel < 1:
        raise InvalidArgument("signal is empty (pass sig[i:i+1] for word i)")
    return i


def put_signal(
    dst: Any, src: Any, signal: Any, value: int, pe: int, *, op: str = "set", stream: Any = None
) -> None:
    """Puts ``src`` into ``dst`` on PE ``pe``, then sets (``op="set"``) or adds (``"add"``)
    ``value`` to the first word of symmetric ``signal`` (uint64/int64) there: whoever sees
    the signal sees the data."""
    w = current()
    pe = _pe(w, pe)
    d, s, g = A.info(dst, "dst"), A.info(src, "src"), _signal(w, signal)
    _same(d, s, "put_signal")
    v = int(value) & 0xFFFF_FFFF_FFFF_FFFF
    da, sa = d.addr, s.addr
    if d.nbytes == 0:
        # A signal without data: torch reports address 0 for an empty slice of a symmetric
        # tensor, so move zero bytes at the signal word instead.
        da = sa = g.addr
    if _device_side(w, d, s, g):
        w.put_signal_dev(da, sa, 0 if d.nbytes == 0 else d.nbytes, g.addr, v, op, pe,
                         stream_ptr(w, stream))
    else:
        w.put_signal(da, sa, s.nbytes, g.addr, v, op, pe)


def wait_until(
    t: Any, cmp: str, value: int, *, timeout: Optional[float] = None, stream: Any = None
) -> Any:
    """Waits until this PE's first element of symmetric ``t`` compares true (``cmp`` one of
    ``== != > >= < <=``) with ``value``. Host: int32/uint32/int64/uint64, returns the value
    seen, raises ``Timeout`` after ``timeout`` seconds (default the world's) and ``PeerLost``
    if a peer dies; the GIL is released while waiting. GPU: uint64/int64, stream-ordered
    (returns None; a device timeout is raised by ``check_errors``)."""
    w = current()
    i = A.info(t, "wait target")
    c = _CMPS.get(cmp)
    if c is None:
        raise InvalidArgument(f"comparison {cmp!r}: expected one of == != > >= < <=")
    if i.numel < 1:
        raise InvalidArgument("wait target is empty")
    if _device_side(w, i):
        if i.dtype not in ("uint64", "int64"):
            raise InvalidArgument("a stream-ordered wait takes a uint64 or int64 word")
        w.wait_until_dev(i.addr, c, int(value) & 0xFFFF_FFFF_FFFF_FFFF, stream_ptr(w, stream))
        return None
    try:
        return w.wait_until(i.addr, i.dtype, c, value, timeout)
    except (OverflowError, TypeError) as e:
        raise InvalidArgument(f"wait_until on {i.dtype}: {e}") from None


def _atomic(t: Any, op: str, pe: int, value: Any = None, cond: Any = None) -> Any:
    w = current()
    i = A.info(t, "atomic target")
    if i.numel < 1:
        raise InvalidArgument("atomic target is empty")
    try:
        return w.atomic(i.addr, i.dtype, op, _pe(w, pe), value, cond)
    except (OverflowError, TypeError) as e:
        raise InvalidArgument(f"atomic {op} on {i.dtype}: {e}") from None


def atomic_fetch(t: Any, pe: int) -> int:
    """Atomically reads the first element of PE ``pe``'s copy (int32/uint32/int64/uint64)."""
    return _atomic(t, "fetch", pe)


def atomic_set(t: Any, value: int, pe: int) -> None:
    """Atomically stores ``value``."""
    _atomic(t, "set", pe, value)


def atomic_swap(t: Any, value: int, pe: int) -> int:
    """Atomically swaps in ``value``; returns the old value."""
    return _atomic(t, "swap", pe, value)


def atomic_compare_swap(t: Any, cond: int, value: int, pe: int) -> int:
    """Stores ``value`` if the element is ``cond``; returns the old value."""
    return _atomic(t, "compare_swap", pe, value, cond)


def atomic_fetch_add(t: Any, value: int, pe: int) -> int:
    """Atomically adds ``value`` (wrapping); returns the old value."""
    return _atomic(t, "fetch_add", pe, value)


def atomic_fetch_and(t: Any, value: int, pe: int) -> int:
    """Atomic bitwise and; returns the old value."""
    return _atomic(t, "fetch_and", pe, value)


def atomic_fetch_or(t: Any, value: int, pe: int) -> int:
    """Atomic bitwise or; returns the old value."""
    return _atomic(t, "fetch_or", pe, value)


def atomic_fetch_xor(t: Any, value: int, pe: int) -> int:
    """Atomic bitwise xor; returns the old value."""
    return _atomic(t, "fetch_xor", pe, value)


def fence() -> None:
    """Orders this PE's earlier puts and atomics to each PE before later ones to that PE."""
    current().fence()


def quiet(*, stream: Any = None) -> None:
    """Completes this PE's outstanding operations (GPU: stream-ordered)."""
    w = current()
    if w.backend == "cuda":
        w.quiet_dev(stream_ptr(w, stream))
    else:
        w.quiet()


def barrier(*, stream: Any = None) -> None:
    """Barrier of every PE after completing this PE's operations. Host: blocks (the GIL is
    released); GPU: stream-ordered on the current or given stream, capturable."""
    w = current()
    if w.backend == "cuda":
        w.barrier_dev(stream_ptr(w, stream))
    else:
        w.barrier()


def check_errors() -> None:
    """Raises errors the GPU recorded (device wait timeouts, collective mismatches and
    capacity overflows) since the last check; call after synchronising. No-op on the host."""
    w = current()
    if w.backend == "cuda":
        w.check_errors_dev()
