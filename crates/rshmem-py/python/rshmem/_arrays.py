"""Arrays and tensors as the native calls see them: an address, a size in bytes, an element
type and a device; and symmetric tensors made from views of the heap without a copy.

Host memory reaches numpy through ``__array_interface__`` and torch through numpy
(``torch.from_numpy``); GPU memory reaches torch through ``__cuda_array_interface__``. The
view object each array keeps alive holds the allocation: its memory is not reused while any
view exists, even after ``free``.
"""

import hashlib
import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _rshmem
from .errors import InvalidArgument

try:
    import torch

    HAVE_TORCH = True
except ImportError:  # the package works with numpy alone
    torch = None
    HAVE_TORCH = False

try:  # numpy has no bfloat16; ml_dtypes provides one where installed
    import ml_dtypes

    _NP_BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    _NP_BF16 = None

# The 12 element types: name -> (bytes, numpy typestr or None).
DTYPES = {
    "int8": (1, "|i1"),
    "int16": (2, "<i2"),
    "int32": (4, "<i4"),
    "int64": (8, "<i8"),
    "uint8": (1, "|u1"),
    "uint16": (2, "<u2"),
    "uint32": (4, "<u4"),
    "uint64": (8, "<u8"),
    "float16": (2, "<f2"),
    "bfloat16": (2, None),
    "float32": (4, "<f4"),
    "float64": (8, "<f8"),
}


def dtype_name(dtype: Any) -> str:
    """The rshmem name of a torch dtype, numpy dtype or name."""
    if dtype is None:
        return "float32"
    if HAVE_TORCH and isinstance(dtype, torch.dtype):
        name = str(dtype).replace("torch.", "")
    elif isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise InvalidArgument(f"unsupported element type {dtype!r}") from None
    name = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
            "int": "int32", "short": "int16", "bool": "bool"}.get(name, name)
    if name not in DTYPES:
        raise InvalidArgument(
            f"unsupported element type {dtype!r}: rshmem has {', '.join(DTYPES)}"
        )
    return name


def torch_dtype(name: str) -> Any:
    return getattr(torch, name)


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return _NP_BF16 if _NP_BF16 is not None else np.dtype("<u2")
    return np.dtype(DTYPES[name][1])


class Info:
    """What a native call needs to know about an array (shape and element count computed on
    demand: the hot paths need only address, size, type and device)."""

    __slots__ = ("addr", "nbytes", "dtype", "cuda", "device", "_a")

    def __init__(self, addr: int, nbytes: int, dtype: str, device: int, a: Any) -> None:
        self.addr = addr
        self.nbytes = nbytes
        self.dtype = dtype
        self.cuda = device >= 0
        self.device = device if device >= 0 else None
        self._a = a

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self._a.shape)

    @property
    def numel(self) -> int:
        return self.nbytes // DTYPES[self.dtype][0]


def is_torch(a: Any) -> bool:
    return HAVE_TORCH and isinstance(a, torch.Tensor)


# dtype object -> rshmem name, filled on first sight (a dict lookup per call after that).
_NAMES: dict = {}


def _name_of(dt: Any) -> str:
    n = _NAMES.get(dt)
    if n is None:
        if HAVE_TORCH and isinstance(dt, torch.dtype):
            n = "bool" if dt == torch.bool else dtype_name(dt)
        elif _NP_BF16 is not None and dt == _NP_BF16:
            n = "bfloat16"
        else:
            n = dtype_name(dt.name)
        _NAMES[dt] = n
    return n


def info(a: Any, what: str = "tensor") -> Info:
    """The address, size and type of a contiguous numpy array or torch tensor."""
    if HAVE_TORCH and isinstance(a, torch.Tensor):
        if not a.is_contiguous():
            raise InvalidArgument(f"{what} is not contiguous (call .contiguous() first)")
        name = _name_of(a.dtype)
        if name == "bool":
            raise InvalidArgument(f"{what}: bool tensors are not supported (use uint8)")
        return Info(a.data_ptr(), a.nbytes, name, a.get_device(), a)
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise InvalidArgument(f"{what} is not contiguous (np.ascontiguousarray first)")
        if not a.dtype.isnative:
            # Bytes move as they are: a peer would read the elements byte-swapped.
            raise InvalidArgument(
                f"{what} is not in native byte order (a.astype(a.dtype.newbyteorder('=')) first)"
            )
        name = _name_of(a.dtype)
        return Info(a.__array_interface__["data"][0], a.nbytes, name, -1, a)
    raise InvalidArgument(
        f"{what} must be a numpy array or a torch tensor, not {type(a).__name__}"
    )


def writable(a: Any, what: str) -> None:
    if isinstance(a, np.ndarray) and not a.flags["WRITEABLE"]:
        raise InvalidArgument(f"{what} is read-only")


def shape_of(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    import operator

    if isinstance(shape, int) or hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        s = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise InvalidArgument(f"shape {shape!r} is not a sequence of ints") from None
    if any(d < 0 for d in s):
        raise InvalidArgument(f"shape {s} has a negative dimension")
    return s


def shape_hash(shape: Tuple[int, ...], dtype: str, kind: str) -> int:
    """A hash of (shape, dtype) that is the same in every process (unlike ``hash``)."""
    h = hashlib.blake2b(repr((shape, dtype, kind)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def view(
    w: "_rshmem.World",
    addr: int,
    nbytes: int,
    shape: Tuple[int, ...],
    dtype: str,
    want: str,
    pe: Optional[int] = None,
) -> Any:
    """An array of ``shape``/``dtype`` over the heap bytes at ``addr`` (this PE's copy, or PE
    ``pe``'s as mapped here): ``want`` "torch" or "numpy"."""
    if w.backend == "cuda":
        if want != "torch":
            raise InvalidArgument("the CUDA backend's heap is GPU memory: numpy cannot view it")
        exp = w.export(addr, nbytes, [nbytes], "|u1", pe)
        # No device argument: torch places the view on the GPU that owns the memory (a peer's
        # GPU for a thread-PE's copy), where asking for another device would copy it.
        t = torch.as_tensor(exp)
        return t.view(torch_dtype(dtype)).view(shape)
    if want == "torch":
        exp = w.export(addr, nbytes, [nbytes], "|u1", pe)
        return torch.from_numpy(np.asarray(exp)).view(torch_dtype(dtype)).view(shape)
    nd = numpy_dtype(dtype)
    exp = w.export(addr, nbytes, [nbytes], "|u1", pe)
    return np.asarray(exp).view(nd).reshape(shape)


def numel(shape: Tuple[int, ...]) -> int:
    return math.prod(shape)
