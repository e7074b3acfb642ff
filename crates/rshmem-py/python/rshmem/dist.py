"""The ``torch.distributed`` backend ``"rshmem"``: ``import rshmem`` registers it where torch is
importable, and ``dist.init_process_group("rshmem")`` starts rshmem for the job.

    import torch, torch.distributed as dist, rshmem      # under torchrun --nproc-per-node 2
    dist.init_process_group("rshmem")                    # rshmem's world, bootstrapped by the store
    x = torch.full((1024,), dist.get_rank() + 1.0, device="cuda")
    dist.all_reduce(x)                                   # stream-ordered on the current stream
    out = torch.empty(2 * 1024, device="cuda")
    dist.all_gather_into_tensor(out, x)
    dist.destroy_process_group()                         # finalizes rshmem

Served calls: ``all_reduce``, ``reduce``, ``broadcast``, ``all_gather`` (list form),
``all_gather_into_tensor``, ``reduce_scatter`` (list form), ``reduce_scatter_tensor``,
``all_to_all_single`` (equal or given split sizes), ``all_to_all`` (list form), ``barrier``,
the coalesced all_reduce / all_gather_into_tensor / reduce_scatter_tensor (one call after
another), and what torch builds on them (``all_gather_object``, ``broadcast_object_list``, the
functional collectives). Anything else (``send``/``recv``, ``gather``, ``scatter``) raises
``NotImplementedError`` naming the call.

**The heap.** One world per process holds either host memory (``"shm"``: CPU tensors) or this
PE's GPU (``"cuda"``: CUDA tensors of that GPU); a tensor of the other kind raises
``InvalidArgument``. The kind is ``Options.backend``, else ``RSHMEM_BACKEND``, else ``"cuda"``
where torch sees a GPU and ``"shm"`` otherwise. On ``"cuda"`` rshmem picks the GPU
(``RSHMEM_DEVICES``, else the rank modulo the visible GPUs) and makes it torch's current device.

**Per-device strings.** ``init_process_group("cpu:gloo,cuda:rshmem")`` (torch's syntax; gloo or
nccl for the other device; also in ``new_group``) sends every call whose first tensor is on
the CPU to gloo (``send``/``recv``, ``gather`` and ``scatter`` included; object collectives
pick the CPU) and CUDA tensors to rshmem. torch combines C++ backends only (a Python group
replaces the whole group), so the rshmem group routes by itself, to a gloo (nccl) backend it
makes over the group's ranks and store at that device's first call. Calls without tensors
(``barrier``) are rshmem's. The heap's default follows the GPU, not the string: for
``"cpu:rshmem,cuda:nccl"`` on a machine with a GPU pass ``Options(backend="shm")``.
If this process already called ``rshmem.init()`` (same rank and size) that world is used and
left running at ``destroy_process_group``; otherwise the group starts it -- rank 0 makes
``rshmem.unique_id()`` and hands it out through the group's store -- and finalizes it there.

**Tensors.** Collectives need symmetric operands. Tensors on the symmetric heap
(``rshmem.empty``/``zeros``, contiguous) are used in place; any other tensor is copied into a
symmetric staging buffer that the group owns, and the result copied back, on the current stream
(stream-ordered on the GPU, so calls capture into CUDA graphs; the copies also accept
non-contiguous tensors). The staging buffer grows collectively, to the next power of two
(at least 1 MiB), when a call needs more: every rank makes the same calls with the same sizes,
so every rank grows at the same call; ranks that disagree get ``CollectiveMismatch`` (sizes
that differ without growth are refused by the collective itself, also on every rank).
``all_to_all_single`` with split sizes agrees on the largest rank's need first (one host
exchange per call). Pass symmetric tensors on every rank or on none, per call. Data movement
(broadcast, gathers, all-to-all) takes any dtype as bytes; reductions take rshmem's 12 element
types (int8-64, uint8-64, float16, bfloat16, float32, float64; complex tensors as float pairs).

**Reductions**: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR fold in rank order (integers wrap,
float16/bfloat16 accumulate in float32 and round once, every rank gets the same bits); AVG is
SUM then a division by the group size in the tensor's dtype (float16/bfloat16 round twice) and
raises ``InvalidArgument`` on integer tensors, where torch's division would not be exact.
PREMUL_SUM raises ``NotImplementedError``.

**Work.** Host (``"shm"``): complete on return. CUDA: enqueued on the current stream; the
returned ``Work`` (``async_op=True``) makes the current stream wait for the call when
``wait()`` is called from another stream, as NCCL's does. ``barrier`` also blocks the host
until the GPU passed it (as NCCL's), then raises device-side errors (``rshmem.check_errors``).

**Groups.** ``dist.new_group`` over every rank in order shares the world; a group of fewer or
reordered ranks is created, but each of its calls raises ``NotImplementedError`` (make such
groups with ``backend="gloo"`` or ``"nccl"``). Collectives of one process run in call order
on the current stream: issue them in the same order on every rank and not concurrently from
two streams.

**Differences from NCCL**: two ranks may share a GPU (``RSHMEM_DEVICES=0,0``); mismatched
calls end in errors on every rank (host: ``CollectiveMismatch``; GPU: raised by ``barrier`` or
``rshmem.check_errors()``), after which the group still works unless the staging buffers were
to grow (a failed growth makes every later growth raise: re-create the group), a dead peer in
``PeerLost`` or ``Timeout`` naming it, never a hang; ``init_process_group``'s ``timeout``
(when given) becomes rshmem's wait timeout, else ``RSHMEM_TIMEOUT`` (60 s); no
``send``/``recv`` on the device rshmem serves.
"""

from dataclasses import dataclass
from typing import Any, Optional

from . import _arrays as A

__all__ = ["Options", "BACKEND"]

#: The name to pass to ``torch.distributed.init_process_group``.
BACKEND = "rshmem"


@dataclass(frozen=True)
class Options:
    """Settings of an rshmem process group, passed as ``init_process_group("rshmem",
    pg_options=rshmem.dist.Options(...))``. Ignored where this process already runs rshmem.

    ``backend``: ``"shm"`` (host heap, CPU tensors) or ``"cuda"`` (GPU heap, CUDA tensors);
    default ``RSHMEM_BACKEND``, else ``"cuda"`` where torch sees a GPU, else ``"shm"``.
    ``heap_size``: symmetric heap bytes per rank (staging buffers live there); default
    ``RSHMEM_HEAP_SIZE``, else 128 MiB.
    """

    backend: Optional[str] = None
    heap_size: Optional[int] = None


def _create(dist_opts: Any, pg_options: Any) -> Any:
    # Imported here: the ProcessGroup subclass costs nothing until a group is made.
    from ._pg import create

    return create(dist_opts, pg_options)


def _register() -> None:
    if not A.HAVE_TORCH:
        return
    import torch.distributed as td

    if not td.is_available():
        return
    td.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


_register()
