"""rshmem: symmetric-memory communication for Python and PyTorch.

Every PE (a process under torchrun / ``rshmem run``, or a thread under ``rshmem.launch``)
allocates the same symmetric tensors; any PE reads and writes a peer's copy with one-sided
operations, runs collectives with torch.distributed's signatures, and dispatches and combines
MoE tokens with DeepEP's ``Buffer`` interface (``rshmem.ep``).

    import torch, rshmem
    rshmem.init(backend="cuda")                 # under torchrun --nproc-per-node 2
    x = rshmem.zeros(1024, dtype=torch.float32)  # on the symmetric heap of this PE's GPU
    x.fill_(rshmem.my_pe() + 1)
    rshmem.all_reduce(x)                        # stream-ordered on torch's current stream
    torch.cuda.synchronize(); rshmem.check_errors()
    rshmem.finalize()

Where torch is importable, ``import rshmem`` also registers the ``torch.distributed``
backend ``"rshmem"``: ``dist.init_process_group("rshmem")`` serves torch's collectives on
ordinary tensors (``rshmem.dist``).

Works without torch (numpy arrays on the CPU backend: ``rshmem.numpy``).
"""

import os as _os

# The driver loads a kernel lazily on first use by default, and a lazy load waits for the
# context's queued work to drain: a PE whose GPU runs a kernel waiting for a peer, while the
# peer's thread loads a kernel (one of torch's, or rshmem's) behind its own waiting kernel,
# deadlocks until the timeout. The library sets EAGER before cuInit when it initialises CUDA
# first; under torch, CUDA is usually initialised first, so set it at import (before torch
# initialises CUDA) unless the user chose a mode.
_os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

from . import _rshmem  # noqa: E402
from ._coll import (
    ReduceOp,
    all_gather_into_tensor,
    all_to_all_single,
    broadcast,
    reduce,
    reduce_scatter_tensor,
)
from ._ops import (
    atomic_compare_swap,
    atomic_fetch,
    atomic_fetch_add,
    atomic_fetch_and,
    atomic_fetch_or,
    atomic_fetch_xor,
    atomic_set,
    atomic_swap,
    check_errors,
)

# The calls of inner loops: native entry points that serve plain operands without Python code
# and hand anything else to the checked functions of _ops and _coll (see src/front.rs).
from ._rshmem import (  # noqa: E402
    all_reduce,
    barrier,
    fence,
    get,
    put,
    put_signal,
    quiet,
    wait_until,
)
from ._tensors import empty, free, is_symmetric, peer, zeros
from ._world import (
    backend,
    device,
    finalize,
    heap_usage,
    init,
    is_initialized,
    launch,
    my_pe,
    n_pes,
    unique_id,
)
from .errors import (
    BackendError,
    BootstrapError,
    Busy,
    CapacityError,
    CollectiveMismatch,
    Error,
    HeapExhausted,
    InvalidArgument,
    OsError,
    PeerLost,
    QueueFull,
    TeamError,
    Timeout,
    WorldEnded,
)
from . import cuda, ep, numpy  # noqa: E402  (submodules that use the names above)
from . import dist  # noqa: E402  (registers the torch.distributed backend "rshmem")

__version__ = _rshmem.__version__

__all__ = [
    "init", "finalize", "launch", "is_initialized", "my_pe", "n_pes", "backend", "device",
    "heap_usage", "unique_id",
    "empty", "zeros", "peer", "free", "is_symmetric",
    "put", "get", "put_signal", "wait_until", "fence", "quiet", "barrier", "check_errors",
    "atomic_fetch", "atomic_set", "atomic_swap", "atomic_compare_swap", "atomic_fetch_add",
    "atomic_fetch_and", "atomic_fetch_or", "atomic_fetch_xor",
    "ReduceOp", "all_reduce", "reduce", "broadcast", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single",
    "Error", "InvalidArgument", "Timeout", "PeerLost", "CollectiveMismatch", "CapacityError",
    "HeapExhausted", "QueueFull", "WorldEnded", "TeamError", "Busy", "BootstrapError",
    "BackendError", "OsError",
    "cuda", "dist", "ep", "numpy",
]
