"""Symmetric tensors: allocation, peer views and free."""

from typing import Any, Optional, Sequence, Union

from . import _arrays as A
from ._world import current
from .errors import InvalidArgument


def _want(device: Any, like: Optional[str], backend: str) -> str:
    if like is not None:
        return like
    return "torch" if A.HAVE_TORCH else "numpy"


def _check_device(device: Any, w: Any) -> None:
    if device is None:
        return
    d = str(device)
    if w.backend == "cuda":
        if not d.startswith("cuda"):
            raise InvalidArgument(
                f"device {d!r}: this world's heap is on GPU cuda:{w.device} (backend 'cuda')"
            )
        idx = d.split(":", 1)[1] if ":" in d else None
        if idx is not None and int(idx) != w.device:
            raise InvalidArgument(f"device {d!r}: this PE's GPU is cuda:{w.device}")
    elif d != "cpu":
        raise InvalidArgument(
            f"device {d!r}: this world's heap is host memory (backend 'shm'); "
            "init with backend='cuda' for GPU tensors"
        )


def _alloc(shape: Any, dtype: Any, device: Any, like: Optional[str]) -> Any:
    w = current()
    s = A.shape_of(shape)
    name = A.dtype_name(dtype)
    _check_device(device, w)
    want = _want(device, like, w.backend)
    if w.backend == "cuda" and want == "numpy":
        raise InvalidArgument("the CUDA backend's heap is GPU memory: numpy cannot view it")
    if want == "torch" and not A.HAVE_TORCH:
        raise InvalidArgument("torch is not importable: use rshmem.numpy")
    nbytes = A.numel(s) * A.DTYPES[name][0]
    addr = w.alloc(nbytes, A.shape_hash(s, name, ""))
    return A.view(w, addr, nbytes, s, name, want)


def empty(
    shape: Union[int, Sequence[int]], dtype: Any = None, device: Any = None
) -> Any:
    """A tensor on the symmetric heap (collective: every PE passes the same shape and dtype,
    checked: a difference raises ``CollectiveMismatch`` on every PE). Its contents are
    undefined.

    Returns a ``torch.Tensor`` where torch is importable (CPU on the ``shm`` backend, this
    PE's GPU on ``cuda``), else a numpy array (``rshmem.numpy.empty`` always gives numpy).
    ``dtype``: any of the 12 element types as a torch dtype, numpy dtype or name (default
    float32). Release with ``rshmem.free`` (collective) or let it live until finalize.
    """
    return _alloc(shape, dtype, device, None)


def zeros(
    shape: Union[int, Sequence[int]], dtype: Any = None, device: Any = None
) -> Any:
    """As ``empty``, filled with zeros on every PE before any PE returns (a barrier)."""
    return _zero(_alloc(shape, dtype, device, None))


def _zero(t: Any) -> Any:
    from . import _ops

    w = current()
    if A.is_torch(t):
        t.zero_()
    else:
        t.fill(0)
    _ops.barrier() if w.backend == "cuda" else w.barrier()
    return t


def peer(t: Any, pe: int) -> Any:
    """A tensor viewing PE ``pe``'s copy of symmetric tensor ``t`` (same shape and dtype),
    read and written by loads and stores: on the ``shm`` backend every PE of the node; on
    ``cuda`` every PE whose GPU this one maps (NVLink / PCIe peer access). Raises where the
    peer's memory is not reachable that way. Ordering with the peer is the caller's
    (barriers, signals)."""
    w = current()
    i = A.info(t, "tensor")
    if not isinstance(pe, int) or not 0 <= pe < w.n_pes:
        raise InvalidArgument(f"PE {pe!r} is out of range: the world has {w.n_pes} PEs")
    want = "torch" if A.is_torch(t) else "numpy"
    return A.view(w, i.addr, i.nbytes, i.shape, i.dtype, want, pe)


def free(t: Any) -> None:
    """Releases symmetric tensor ``t`` (collective: every PE frees the same tensor, checked).
    Views that still exist keep its memory from being reused; using them in an rshmem call
    raises ``InvalidArgument``."""
    w = current()
    w.free(A.info(t, "tensor").addr)


def is_symmetric(t: Any) -> bool:
    """Whether ``t`` lies on this PE's symmetric heap (and was not freed)."""
    try:
        i = A.info(t)
        current().export(i.addr, i.nbytes, [0], "|u1")
        return True
    except Exception:  # noqa: BLE001 - any refusal means "not symmetric"
        return False
