"""User kernels on the CUDA backend: CUDA C++ source that uses the rshmem device header
(``rshmem_putmem_signal_block``, ``rshmem_signal_wait_until``, ``rshmem_ptr``, ...; the header
is prepended), compiled by NVRTC for this PE's GPU and launched on torch's stream, as cupy's
``RawKernel``::

    k = rshmem.cuda.RawKernel(r'''
    extern "C" __global__ void ring(float* dst, const float* src, unsigned long long n,
                                    rshmem_u64* sig) {
        int peer = (rshmem_my_pe() + 1) % rshmem_n_pes();
        rshmem_putmem_signal_block(dst, src, n * sizeof(float), sig, 1, RSHMEM_SIGNAL_SET, peer);
    }''', "ring")
    k((1,), (256,), (dst, src, numpy.uint64(dst.numel()), sig))

Arguments: torch CUDA tensors of this PE's GPU (passed as their device address; symmetric
tensors' addresses are what the device API translates for peers), and numpy scalars
(``numpy.int32``, ``numpy.uint32``, ``numpy.int64``, ``numpy.uint64``, ``numpy.float32``,
``numpy.float64``) whose type says the parameter's. A plain Python int or float is refused:
its C type would be a guess. As with any raw launch the arguments must match the kernel's
parameters.
"""

from typing import Any, Sequence, Tuple, Union

import numpy as np

from . import _arrays as A
from ._ops import stream_ptr
from ._world import current
from .errors import InvalidArgument

_SCALARS = {
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint64): "u64",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
}


def _arg(w: Any, a: Any) -> Tuple[str, Any]:
    if A.is_torch(a):
        if not a.is_cuda or a.device.index != w.device:
            raise InvalidArgument(f"kernel argument on {a.device}: expected cuda:{w.device}")
        return ("ptr", a.data_ptr())
    if isinstance(a, np.generic) and a.dtype in _SCALARS:
        return (_SCALARS[a.dtype], a.item())
    if isinstance(a, tuple) and len(a) == 2 and a[0] in set(_SCALARS.values()) | {"ptr"}:
        return a
    raise InvalidArgument(
        f"kernel argument {a!r}: pass a CUDA tensor or a numpy scalar (numpy.int32(...), "
        "numpy.uint64(...), ...) so its C type is known"
    )


def _dim(d: Union[int, Sequence[int]], what: str) -> int:
    if isinstance(d, int):
        d = (d,)
    d = tuple(int(x) for x in d)
    if not d or any(x < 1 for x in d) or any(x != 1 for x in d[1:]):
        raise InvalidArgument(f"{what} {d}: rshmem launches 1-D grids and blocks")
    return d[0]


class RawKernel:
    """A kernel compiled with the rshmem device header, loaded on the calling PE's GPU.

    Collective in effect: load a kernel on every PE before launching one that waits for
    peers (loading a module waits for kernels running on the same GPU).
    """

    def __init__(self, code: str, name: str, options: Sequence[str] = ()) -> None:
        w = current()
        if w.backend != "cuda":
            raise InvalidArgument("user kernels need the CUDA backend (init with backend='cuda')")
        self.world = w
        self.name = name
        self._k = w.kernel(code, name, list(options))

    def __call__(self, grid: Union[int, Sequence[int]], block: Union[int, Sequence[int]],
                 args: Sequence[Any], *, shared_mem: int = 0, stream: Any = None) -> None:
        """Launches on ``stream`` (default torch's current stream of this PE's GPU)."""
        w = current()
        if w is not self.world:
            raise InvalidArgument("kernel loaded by another PE")
        a = [_arg(w, x) for x in args]
        w.launch(self._k, _dim(grid, "grid"), _dim(block, "block"), int(shared_mem), a,
                 stream_ptr(w, stream))


__all__ = ["RawKernel"]
