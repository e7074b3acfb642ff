"""Shared helpers: thread-mode worlds, array kinds (numpy always, torch CPU where importable),
dtype tables and conversions for exact comparisons."""

import numpy as np
import pytest

import rshmem

try:
    import torch
except ImportError:
    torch = None

KINDS = ["numpy"] + (["torch"] if torch is not None else [])

ALL_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "bfloat16", "float32", "float64"]
INT_DTYPES = [d for d in ALL_DTYPES if d.startswith(("int", "uint"))]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
# Heap and timeout of the test worlds: small, and short so a broken test fails fast.
HEAP = 32 << 20
TIMEOUT = 20.0


def run(n, fn, *args, timeout=TIMEOUT):
    """Runs fn(*args) on n thread-PEs; returns their results in PE order."""
    return rshmem.launch(n, fn, *args, heap_size=HEAP, timeout=timeout)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def empty(kind, shape, dtype):
    """A symmetric array of ``kind``."""
    if kind == "numpy":
        return rshmem.numpy.empty(shape, dtype)
    return rshmem.empty(shape, getattr(torch, dtype))


def zeros(kind, shape, dtype):
    if kind == "numpy":
        return rshmem.numpy.zeros(shape, dtype)
    return rshmem.zeros(shape, getattr(torch, dtype))


def host(kind, a, dtype):
    """A plain (non-symmetric) array of ``kind`` holding float64/int ``a`` as ``dtype``."""
    if kind == "numpy":
        from rshmem._arrays import numpy_dtype

        nd = numpy_dtype(dtype)
        if dtype == "bfloat16" and nd == np.dtype("<u2"):
            return bf16_bits(np.asarray(a, np.float32))
        return np.asarray(a).astype(nd)
    t = torch.from_numpy(np.asarray(a, np.float64 if dtype.startswith("float")
                                    or dtype == "bfloat16" else np.int64))
    return t.to(getattr(torch, dtype)).contiguous()


def bf16_bits(f32):
    """bfloat16 bits (round to nearest even) of float32 values, as uint16."""
    u = np.ascontiguousarray(f32, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_np(a, dtype):
    """The values of array ``a`` (either kind) as float64 / int64 numpy for comparison."""
    if torch is not None and isinstance(a, torch.Tensor):
        # Copies: `.to()` of a tensor already of that dtype returns the tensor itself, and its
        # `.numpy()` would then alias symmetric memory that later operations rewrite.
        if dtype in ("bfloat16", "float16", "float32", "float64"):
            return a.to(torch.float64).numpy().copy()
        if dtype == "uint64":
            return a.view(torch.int64).numpy().view(np.uint64).copy()
        return a.to(torch.int64).numpy().copy()
    a = np.asarray(a)
    if dtype == "bfloat16" and a.dtype == np.dtype("<u2"):
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in FLOAT_DTYPES:
        return a.astype(np.float64)
    return a.copy()


def rand(seed, shape, dtype, lo=-50, hi=50):
    """Deterministic random values every PE can regenerate: small integers, exact in every
    dtype (unsigned types get non-negative ones)."""
    rng = np.random.default_rng(seed)
    if dtype.startswith("uint"):
        lo = 0
    return rng.integers(lo, hi, size=shape).astype(np.float64 if dtype in FLOAT_DTYPES
                                                   else np.int64)
