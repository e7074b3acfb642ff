"""Collectives with torch.distributed's signatures over the whole world, on symmetric
tensors. Host (``shm``): blocking, the GIL released. GPU (``cuda``): stream-ordered on the
current (or given) stream, capturable into CUDA graphs.

Differences from torch.distributed: tensors must be symmetric (``rshmem.empty``/``zeros``);
``group`` must be None (the world) and ``async_op`` False; ``op`` is a name ("sum", "prod",
"min", "max", "band", "bor", "bxor"), an ``rshmem.ReduceOp`` or a
``torch.distributed.ReduceOp``; reductions fold in PE order, integers wrap, float16/bfloat16
accumulate in float32 and round once (every PE gets the same bits).
"""

import enum
import weakref
from typing import Any, List, Optional, Sequence

from . import _arrays as A
from ._ops import _device_side, stream_ptr
from ._world import current
from .errors import InvalidArgument


class ReduceOp(str, enum.Enum):
    """Reductions (names as torch.distributed.ReduceOp)."""

    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


def _op(op: Any) -> str:
    if isinstance(op, ReduceOp):
        return op.value
    if isinstance(op, str):
        name = op.lower()
    else:  # torch.distributed.ReduceOp and its RedOpType
        name = str(op).split(".")[-1].lower()
    name = {"product": "prod", "avg": "avg"}.get(name, name)
    if name not in {"sum", "prod", "min", "max", "band", "bor", "bxor"}:
        raise InvalidArgument(
            f"reduction {op!r} is not supported (sum, prod, min, max, band, bor, bxor)"
        )
    return name


def _plain(group: Any, async_op: bool) -> None:
    if group is not None:
        raise InvalidArgument("rshmem collectives run over the whole world: group must be None")
    if async_op:
        raise InvalidArgument("async_op is not supported: GPU calls are stream-ordered")


def _run(kind: str, dst: A.Info, src: A.Info, count: int, op: Optional[str] = None,
         root: int = 0, stream: Any = None) -> None:
    w = current()
    if dst.dtype != src.dtype:
        raise InvalidArgument(f"{kind}: dtypes differ ({dst.dtype} and {src.dtype})")
    A.writable(dst._a, f"{kind}: the output")
    if _device_side(w, dst, src):
        w.collective_dev(kind, dst.dtype, dst.addr, dst.nbytes, src.addr, src.nbytes, count,
                         op, root, stream_ptr(w, stream))
    else:
        w.collective(kind, dst.dtype, dst.addr, dst.nbytes, src.addr, src.nbytes, count, op,
                     root)


def all_reduce(tensor: Any, op: Any = "sum", group: Any = None, async_op: bool = False, *,
               out: Any = None, stream: Any = None) -> None:
    """Folds every PE's ``tensor`` with ``op`` into every PE's ``tensor`` (in place), or into
    ``out`` (same shape and dtype) when given."""
    _plain(group, async_op)
    s = A.info(tensor, "tensor")
    d = A.info(out, "out") if out is not None else s
    if d.numel != s.numel:
        raise InvalidArgument(f"all_reduce: out has {d.numel} elements, tensor {s.numel}")
    _run("all_reduce", d, s, s.numel, _op(op), stream=stream)


def reduce(tensor: Any, dst: int, op: Any = "sum", group: Any = None, async_op: bool = False,
           *, out: Any = None, stream: Any = None) -> None:
    """Folds every PE's ``tensor`` into PE ``dst``'s ``tensor`` (or ``out``)."""
    _plain(group, async_op)
    s = A.info(tensor, "tensor")
    d = A.info(out, "out") if out is not None else s
    if d.numel != s.numel:
        raise InvalidArgument(f"reduce: out has {d.numel} elements, tensor {s.numel}")
    _run("reduce", d, s, s.numel, _op(op), root=_root(dst), stream=stream)


def _root(r: Any) -> int:
    if not isinstance(r, int) or isinstance(r, bool):
        raise InvalidArgument(f"root must be an int, not {type(r).__name__}")
    return r


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False, *,
              stream: Any = None) -> None:
    """Copies PE ``src``'s ``tensor`` into every PE's ``tensor``."""
    _plain(group, async_op)
    t = A.info(tensor, "tensor")
    _run("broadcast", t, t, t.numel, root=_root(src), stream=stream)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, *, stream: Any = None) -> None:
    """PE i's ``input_tensor`` into every PE's ``output_tensor[i*c:(i+1)*c]`` (flattened,
    ``c`` = input elements). In place when ``input_tensor`` is that slice of ``output_tensor``."""
    _plain(group, async_op)
    w = current()
    d, s = A.info(output_tensor, "output_tensor"), A.info(input_tensor, "input_tensor")
    if d.numel != s.numel * w.n_pes:
        raise InvalidArgument(
            f"all_gather_into_tensor: output has {d.numel} elements, expected "
            f"{w.n_pes} x {s.numel}"
        )
    es = A.DTYPES[s.dtype][0]
    in_place = s.addr == d.addr + w.my_pe * s.nbytes and d.dtype == s.dtype and es > 0
    _run("all_gather", d, d if in_place else s, s.numel, stream=stream)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = "sum", group: Any = None,
                          async_op: bool = False, *, stream: Any = None) -> None:
    """Folds every PE's ``input[i*c:(i+1)*c]`` into PE i's ``output`` (``c`` = output
    elements). In place when ``output`` is that slice of ``input``."""
    _plain(group, async_op)
    w = current()
    d, s = A.info(output, "output"), A.info(input, "input")
    if s.numel != d.numel * w.n_pes:
        raise InvalidArgument(
            f"reduce_scatter_tensor: input has {s.numel} elements, expected {w.n_pes} x {d.numel}"
        )
    in_place = d.addr == s.addr + w.my_pe * d.nbytes and d.dtype == s.dtype
    _run("reduce_scatter", s if in_place else d, s, d.numel, _op(op), stream=stream)


def _splits(sizes: Optional[Sequence[int]], n: int, rows: int, what: str) -> Optional[List[int]]:
    if sizes is None:
        return None
    sizes = [int(x) for x in sizes]
    if len(sizes) != n:
        raise InvalidArgument(f"{what} has {len(sizes)} entries, the world {n} PEs")
    if any(x < 0 for x in sizes) or sum(sizes) != rows:
        raise InvalidArgument(f"{what} {sizes} do not split {rows} rows")
    return sizes


def _prefix(c: List[int]) -> List[int]:
    out, at = [], 0
    for x in c:
        out.append(at)
        at += x
    return out


def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None,
                      input_split_sizes: Any = None, group: Any = None,
                      async_op: bool = False, *, stream: Any = None) -> None:
    """Splits ``input`` along dim 0 (equally, or by ``input_split_sizes``), sends part j to PE
    j, and gathers what every PE sent here into ``output`` in PE order (``output_split_sizes``
    rows from each). Split sizes may be lists or tensors; GPU tensors of sizes (CUDA backend)
    keep the call on the device (capturable): there the received sizes are not checked
    against ``output_split_sizes`` on the host -- a sender's total beyond ``output`` moves
    nothing and ``check_errors`` raises ``CapacityError``."""
    _plain(group, async_op)
    w = current()
    n = w.n_pes
    d, s = A.info(output, "output"), A.info(input, "input")
    if d.dtype != s.dtype:
        raise InvalidArgument(f"all_to_all_single: dtypes differ ({d.dtype} and {s.dtype})")
    if input_split_sizes is None and output_split_sizes is None:
        if s.numel != d.numel or s.numel % n:
            raise InvalidArgument(
                f"all_to_all_single: {s.numel} input and {d.numel} output elements do not "
                f"split in {n} equal parts"
            )
        _run("all_to_all", d, s, s.numel // n, stream=stream)
        return
    srows = s.shape[0] if s.shape else 1
    drows = d.shape[0] if d.shape else 1
    row = s.numel // srows if srows else 0
    drow = d.numel // drows if drows else 0
    if srows and drows and row != drow:
        raise InvalidArgument("all_to_all_single: input and output rows differ in size")
    device = _device_side(w, d, s)
    if device and A.is_torch(input_split_sizes) and input_split_sizes.is_cuda:
        _a2a_device(w, d, s, input_split_sizes, row, stream)
        return
    ins = _splits(_host_list(input_split_sizes), n, srows, "input_split_sizes")
    outs = _splits(_host_list(output_split_sizes), n, drows, "output_split_sizes")
    if ins is None:
        ins = _equal(srows, n, "input")
    if outs is None:
        outs = _equal(drows, n, "output")
    sc = [x * row for x in ins]
    rc = [x * row for x in outs]
    # The parts used may differ in size across PEs, but the objects must be the same on every
    # PE: the whole allocations, with the parts' offsets in the displacements.
    es = A.DTYPES[d.dtype][0]
    (da, dn), (sa, sn) = w.block_of(d.addr, d.nbytes), w.block_of(s.addr, s.nbytes)
    if (d.addr - da) % es or (s.addr - sa) % es:
        raise InvalidArgument("all_to_all_single: tensors not aligned to their elements")
    dd, sd = (d.addr - da) // es, (s.addr - sa) // es
    args = (d.dtype, da, dn - dn % es, sa, sn - sn % es, sc, [x + sd for x in _prefix(sc)], rc,
            [x + dd for x in _prefix(rc)])
    if device:
        w.all_to_all_v_dev(*args, stream_ptr(w, stream))
    else:
        w.all_to_all_v(*args)


def _equal(rows: int, n: int, what: str) -> List[int]:
    if rows % n:
        raise InvalidArgument(f"all_to_all_single: {rows} {what} rows do not split in {n}")
    return [rows // n] * n


def _host_list(sizes: Any) -> Optional[List[int]]:
    if sizes is None:
        return None
    if A.is_torch(sizes):
        return [int(x) for x in sizes.tolist()]
    return [int(x) for x in sizes]


# Per world: the symmetric count scratch of device-side all_to_all_single.
_A2A_COUNTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _a2a_device(w: Any, d: A.Info, s: A.Info, splits: Any, row: int, stream: Any) -> None:
    import torch

    from ._tensors import empty

    if splits.numel() != w.n_pes:
        raise InvalidArgument(
            f"input_split_sizes has {splits.numel()} entries, the world {w.n_pes} PEs"
        )
    counts = _A2A_COUNTS.get(w)
    if counts is None:
        # Symmetric scratch for the counts (collective, made by the first such call).
        counts = (empty(w.n_pes, torch.int64), empty(w.n_pes, torch.int64))
        _A2A_COUNTS[w] = counts
    send, recv = counts
    # The same objects on every PE: the whole allocations, which the parts must start.
    (da, dn), (sa, sn) = w.block_of(d.addr, d.nbytes), w.block_of(s.addr, s.nbytes)
    if da != d.addr or sa != s.addr:
        raise InvalidArgument(
            "all_to_all_single with split sizes on the GPU: input and output must start at "
            "the start of their symmetric tensors (the device packs from element 0)"
        )
    es = A.DTYPES[d.dtype][0]
    send.copy_(splits.to(torch.int64) * row)
    w.all_to_all_v_device(d.dtype, da, dn - dn % es, sa, sn - sn % es, send.data_ptr(),
                          recv.data_ptr(), stream_ptr(w, stream))


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, *,
            stream: Any = None) -> None:
    """Barrier of every PE (torch.distributed's signature; ``device_ids`` ignored)."""
    from ._ops import barrier as b

    _plain(group, async_op)
    b(stream=stream)
