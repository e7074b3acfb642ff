"""Symmetric numpy arrays (host heap, ``shm`` backend), whether or not torch is installed.

numpy has no bfloat16: where ``ml_dtypes`` is installed its ``bfloat16`` is used, otherwise
bfloat16 arrays appear as their ``uint16`` bits.
"""

from typing import Any, Sequence, Union

from . import _tensors


def empty(shape: Union[int, Sequence[int]], dtype: Any = None) -> Any:
    """As ``rshmem.empty``, returning a numpy array."""
    return _tensors._alloc(shape, dtype, None, "numpy")


def zeros(shape: Union[int, Sequence[int]], dtype: Any = None) -> Any:
    """As ``rshmem.zeros``, returning a numpy array."""
    return _tensors._zero(_tensors._alloc(shape, dtype, None, "numpy"))


peer = _tensors.peer
free = _tensors.free
