"""The process group behind ``init_process_group("rshmem")`` (see ``rshmem.dist``): a Python
``torch.distributed.ProcessGroup`` whose collectives run rshmem's over the world, on symmetric
tensors directly or through the group's symmetric staging buffers. With a per-device backend
string (``"cpu:gloo,cuda:rshmem"``) it hands the other devices' tensors to their backends
(``_pg_route``)."""

import os
import weakref
from typing import Any, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import _arrays as A
from . import _coll as C
from . import _ops
from . import _world
from ._pg_route import CALLS, Router, routed
from ._rshmem import all_reduce as _all_reduce  # native entry (plain tensors: no Python code)
from ._tensors import empty, free
from .dist import BACKEND, Options
from .errors import CollectiveMismatch, Error, HeapExhausted, InvalidArgument

_OPS = (
    (ReduceOp.SUM, "sum"),
    (ReduceOp.PRODUCT, "prod"),
    (ReduceOp.MIN, "min"),
    (ReduceOp.MAX, "max"),
    (ReduceOp.BAND, "band"),
    (ReduceOp.BOR, "bor"),
    (ReduceOp.BXOR, "bxor"),
    (ReduceOp.AVG, "avg"),
)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The dtypes rshmem reduces (the others move as bytes).
_REDUCIBLE = frozenset(
    getattr(torch, n) for n in A.DTYPES if hasattr(torch, n)
)
_MIN_STAGING = 1 << 20


def _op_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", ReduceOp.SUM) if opts is not None else ReduceOp.SUM
    for o, name in _OPS:
        if op == o:
            return name
    raise NotImplementedError(
        f"rshmem process group: reduction {op} is not supported "
        "(SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG)"
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of contiguous ``t``."""
    return t.reshape(-1).view(torch.uint8)


class _Staging:
    """The symmetric staging buffers of one world (shared by its process groups): two byte
    buffers (output-side and input-side), grown collectively."""

    def __init__(self) -> None:
        self.bufs: List[Optional[torch.Tensor]] = [None, None]
        # Buffers a captured CUDA graph may use: kept until shutdown, never reused.
        self.pinned: List[torch.Tensor] = []
        self.captured = False
        self.users = 0
        # Why a growth failed: the buffers may then differ across ranks.
        self.broken: Optional[str] = None

    def get(self, which: int, nbytes: int, what: str) -> torch.Tensor:
        b = self.bufs[which]
        if b is None or b.numel() < nbytes:
            if self.broken is not None:
                raise Error(
                    "rshmem process group: its staging buffers may differ across ranks since "
                    f"a failed growth ({self.broken}); destroy and re-create the group"
                )
            try:
                b = self._grow(which, nbytes, what)
            except Error as e:
                self.broken = str(e)
                raise
        return b[:nbytes]

    def _grow(self, which: int, nbytes: int, what: str) -> torch.Tensor:
        cap = max(_MIN_STAGING, 1 << max(nbytes - 1, 0).bit_length())
        old = self.bufs[which]
        self.bufs[which] = None
        if old is not None:
            if self.captured:
                self.pinned.append(old)
            else:
                free(old)
            del old
        try:
            b = empty(cap, torch.uint8)
        except CollectiveMismatch as e:
            err = CollectiveMismatch(
                f"rshmem process group: ranks disagree on the size of {what} (this rank grows "
                f"its staging buffer to {cap} bytes for {nbytes}; do the tensors differ across "
                f"ranks?): {e}"
            )
            err.pe = e.pe
            raise err from e
        except HeapExhausted as e:
            err = HeapExhausted(
                f"rshmem process group: {what} needs a staging buffer of {cap} bytes: {e} "
                "(rshmem.dist.Options(heap_size=...) or RSHMEM_HEAP_SIZE; or pass symmetric "
                "tensors from rshmem.empty)"
            )
            err.pe = e.pe
            raise err from e
        self.bufs[which] = b
        return b

    def release(self) -> None:
        bufs = [b for b in self.bufs if b is not None] + self.pinned
        self.bufs, self.pinned = [None, None], []
        for b in bufs:
            free(b)


# Per world: its staging buffers.
_STAGING: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Work(dist._Work):
    """A call's completion: done on return (host), or enqueued on a stream (CUDA)."""

    def __init__(self, result: List[torch.Tensor], event: Any = None, device: Any = None,
                 world: Any = None) -> None:
        super().__init__()
        self._result = result
        self._event = event
        self._device = device
        # A barrier's world: wait() blocks the host until the GPU passed it, as NCCL's does.
        self._world = world

    def wait(self, timeout: Any = None) -> bool:
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        if self._world is not None and not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(self._device).synchronize()
            self._world.check_errors_dev()
        return True

    def is_completed(self) -> bool:
        return self._event.query() if self._event is not None else True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Any:
        # A future holding CUDA tensors must name their device.
        dev = self._device
        f = torch.futures.Future(devices=[dev]) if dev is not None else torch.futures.Future()
        f.set_result(self._result)
        return f


# Returned by calls made with async_op=False on the host, or on a GPU without a barrier:
# nothing left to wait for on the calling stream.
_DONE: Optional[_Work] = None


def _done() -> _Work:
    global _DONE
    if _DONE is None:
        _DONE = _Work([])
    return _DONE


@routed
class ProcessGroupRshmem(dist.ProcessGroup):
    """A ``torch.distributed`` process group over rshmem's world (see ``rshmem.dist``)."""

    def __init__(self, rank: int, size: int, world: Any, owned: bool, router: Router) -> None:
        super().__init__(rank, size)
        self._router = router
        self._w = world
        self._owned = owned
        self._cuda = world.backend == "cuda"
        self._dev = torch.device("cuda", world.device) if self._cuda else torch.device("cpu")
        st = _STAGING.get(world)
        if st is None:
            st = _STAGING[world] = _Staging()
        st.users += 1
        self._st = st
        self._live = True
        self._name = ""
        self._desc = ""

    # -- identity -----------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    @property
    def _device_types(self) -> List[torch.device]:
        # The heap's device and those the backend string gives to other backends (torch picks
        # the device of object collectives from these).
        mine = self._dev.type
        devs = self._router.devices(self, also=mine)
        return [torch.device(d) for d in devs]

    # torch asks a group for its backend of a device (init_process_group's device_id, group
    # splitting): this group is its own (or the routed backend of that device), and it does
    # not split.
    supports_splitting = False

    def _get_backend(self, device: Any) -> Any:
        return self._router.backend(self, torch.device(device).type) or self

    # The name and description torch gives the group (functional collectives find it by name).
    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return f"ProcessGroupRshmem(rank={self.rank()}, size={self.size()}, device={self._dev})"

    # -- helpers ------------------------------------------------------------------------
    def _check(self, t: Any, what: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"{what} must be a torch.Tensor, not {type(t).__name__}")
        d = t.device
        if d.type != self._dev.type or (self._cuda and d.index != self._dev.index):
            where = f"GPU {self._dev}" if self._cuda else "host memory"
            raise InvalidArgument(
                f"{what} is on {d}, but this rshmem process group's heap is {where} (backend "
                f"{self._w.backend!r}): rshmem serves one device per process; give the other "
                "device to another backend (init_process_group(\"cpu:gloo,cuda:rshmem\")), use "
                "a gloo or nccl group, or rshmem.dist.Options(backend=...)"
            )
        return t

    def _one(self, tensors: Any, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            return self._check(tensors, what)
        if len(tensors) != 1:
            raise InvalidArgument(f"{what}: one tensor per call, not {len(tensors)}")
        return self._check(tensors[0], what)

    def _sym(self, *ts: torch.Tensor) -> bool:
        """Whether every tensor is a contiguous range of the symmetric heap."""
        for t in ts:
            if not t.is_contiguous() or not self._w.on_heap(t.data_ptr(), t.nbytes):
                return False
        return True

    def _stage(self, which: int, nbytes: int, what: str) -> torch.Tensor:
        if self._cuda and torch.cuda.is_current_stream_capturing():
            self._st.captured = True
        return self._st.get(which, nbytes, what)

    def _reducible(self, t: torch.Tensor, op: str, what: str) -> None:
        if t.dtype not in _REDUCIBLE:
            raise InvalidArgument(
                f"{what}: rshmem reduces int8-64, uint8-64, float16, bfloat16, float32 and "
                f"float64, not {t.dtype}"
            )
        if op == "avg" and t.dtype not in _FLOATS:
            raise InvalidArgument(
                f"{what}: AVG on {t.dtype}: the division by the group size is not exact on "
                "integers (use SUM and divide)"
            )

    def _root(self, root: int) -> int:
        if not 0 <= root < self.size():
            raise InvalidArgument(f"root {root} is out of range: the group has {self.size()} ranks")
        return root

    def _work(self, opts: Any, result: List[torch.Tensor], sync: bool = False) -> _Work:
        async_op = getattr(opts, "asyncOp", True) if opts is not None else True
        if not self._cuda:
            return _Work(result) if async_op else _done()
        ev = None
        if async_op:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self._dev))
        elif not sync:
            return _done()
        return _Work(result, ev, self._dev, self._w if sync else None)

    # -- reductions ---------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None) -> _Work:
        t = self._one(tensors, "all_reduce")
        op = _op_name(opts)
        self._reducible(t, op, "all_reduce")
        rop = "sum" if op == "avg" else op
        if not t.numel():
            return self._work(opts, [t])
        if self._sym(t):
            _all_reduce(t, rop)
            if op == "avg":
                t.div_(self.size())
        else:
            s = self._stage(0, t.nbytes, "all_reduce").view(t.dtype).view(t.shape)
            s.copy_(t)
            _all_reduce(s, rop)
            if op == "avg":
                s.div_(self.size())
            t.copy_(s)
        return self._work(opts, [t])

    def reduce(self, tensors: Any, opts: Any = None) -> _Work:
        t = self._one(tensors, "reduce")
        op = _op_name(opts)
        root = self._root(opts.rootRank)
        self._reducible(t, op, "reduce")
        rop = "sum" if op == "avg" else op
        mine = root == self.rank()
        if not t.numel():
            return self._work(opts, [t])
        if self._sym(t):
            C.reduce(t, root, rop)
            if op == "avg" and mine:
                t.div_(self.size())
        else:
            s = self._stage(0, t.nbytes, "reduce").view(t.dtype).view(t.shape)
            s.copy_(t)
            C.reduce(s, root, rop)
            if mine:
                if op == "avg":
                    s.div_(self.size())
                t.copy_(s)
        return self._work(opts, [t])

    def _rs(self, out: torch.Tensor, parts: Sequence[torch.Tensor], inp: Optional[torch.Tensor],
            opts: Any, what: str) -> _Work:
        n, me = self.size(), self.rank()
        op = _op_name(opts)
        self._reducible(out, op, what)
        rop = "sum" if op == "avg" else op
        c = out.numel()
        if not c:
            return self._work(opts, [out])
        if inp is not None and self._sym(out, inp) and inp.dtype == out.dtype:
            C.reduce_scatter_tensor(out, inp, rop)
            if op == "avg":
                out.div_(n)
            return self._work(opts, [out])
        s = self._stage(0, n * out.nbytes, what).view(out.dtype)
        if inp is not None:
            s.view(inp.shape).copy_(inp)
        else:
            for i, p in enumerate(parts):
                s[i * c:(i + 1) * c].view(p.shape).copy_(p)
        mine = s[me * c:(me + 1) * c]
        C.reduce_scatter_tensor(mine, s, rop)
        if op == "avg":
            mine.div_(n)
        out.copy_(mine.view(out.shape))
        return self._work(opts, [out])

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any = None) -> _Work:
        out = self._check(output, "reduce_scatter_tensor output")
        inp = self._check(input, "reduce_scatter_tensor input")
        if inp.dtype != out.dtype or inp.numel() != self.size() * out.numel():
            raise InvalidArgument(
                f"reduce_scatter_tensor: input has {inp.numel()} {inp.dtype} elements, expected "
                f"{self.size()} x {out.numel()} {out.dtype}"
            )
        return self._rs(out, (), inp, opts, "reduce_scatter_tensor")

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> _Work:
        out = self._one(output_tensors, "reduce_scatter output")
        if len(input_tensors) != 1:
            raise InvalidArgument("reduce_scatter: one list of input tensors per call")
        parts = [self._check(p, "reduce_scatter input") for p in input_tensors[0]]
        self._same_parts(parts, out, "reduce_scatter", "input_list")
        return self._rs(out, parts, None, opts, "reduce_scatter")

    def _same_parts(self, parts: Sequence[torch.Tensor], t: torch.Tensor, what: str,
                    name: str) -> None:
        if len(parts) != self.size():
            raise InvalidArgument(f"{what}: {name} has {len(parts)} tensors, the group "
                                  f"{self.size()} ranks")
        for p in parts:
            if p.dtype != t.dtype or p.numel() != t.numel():
                raise InvalidArgument(
                    f"{what}: every tensor of {name} must have {t.numel()} {t.dtype} elements "
                    f"(one has {p.numel()} {p.dtype})"
                )

    # -- data movement ------------------------------------------------------------------
    def broadcast(self, tensors: Any, opts: Any = None) -> _Work:
        t = self._one(tensors, "broadcast")
        root = self._root(opts.rootRank)
        if not t.numel():
            return self._work(opts, [t])
        if self._sym(t):
            C.broadcast(_bytes(t), root)
        else:
            b = self._stage(0, t.nbytes, "broadcast")
            s = b.view(t.dtype).view(t.shape)
            mine = root == self.rank()
            if mine:
                s.copy_(t)
            C.broadcast(b, root)
            if not mine:
                t.copy_(s)
        return self._work(opts, [t])

    def _ag(self, inp: torch.Tensor, outs: Sequence[torch.Tensor], out: Optional[torch.Tensor],
            opts: Any, what: str) -> _Work:
        n, me = self.size(), self.rank()
        c = inp.nbytes
        if not c:
            return self._work(opts, [out] if out is not None else list(outs))
        if out is not None and self._sym(out, inp):
            C.all_gather_into_tensor(_bytes(out), _bytes(inp))
            return self._work(opts, [out])
        b = self._stage(0, n * c, what)
        b[me * c:(me + 1) * c].view(inp.dtype).view(inp.shape).copy_(inp)
        C.all_gather_into_tensor(b, b[me * c:(me + 1) * c])
        if out is not None:
            out.copy_(b.view(out.dtype).view(out.shape))
            return self._work(opts, [out])
        for i, o in enumerate(outs):
            o.copy_(b[i * c:(i + 1) * c].view(o.dtype).view(o.shape))
        return self._work(opts, list(outs))

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> _Work:
        out = self._check(output, "all_gather_into_tensor output")
        inp = self._check(input, "all_gather_into_tensor input")
        if inp.dtype != out.dtype or out.numel() != self.size() * inp.numel():
            raise InvalidArgument(
                f"all_gather_into_tensor: output has {out.numel()} {out.dtype} elements, "
                f"expected {self.size()} x {inp.numel()} {inp.dtype}"
            )
        return self._ag(inp, (), out, opts, "all_gather_into_tensor")

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> _Work:
        inp = self._one(input_tensors, "all_gather input")
        if len(output_tensors) != 1:
            raise InvalidArgument("all_gather: one list of output tensors per call")
        outs = [self._check(o, "all_gather output") for o in output_tensors[0]]
        self._same_parts(outs, inp, "all_gather", "tensor_list")
        return self._ag(inp, outs, None, opts, "all_gather")

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: Any,
                      input_split_sizes: Any, opts: Any = None) -> _Work:
        out = self._check(output, "all_to_all_single output")
        inp = self._check(input, "all_to_all_single input")
        n = self.size()
        if out.dtype != inp.dtype:
            raise InvalidArgument(f"all_to_all_single: dtypes differ ({out.dtype} and {inp.dtype})")
        outs = list(output_split_sizes) if output_split_sizes else None
        ins = list(input_split_sizes) if input_split_sizes else None
        if out.dim() == 0 or inp.dim() == 0:
            raise InvalidArgument("all_to_all_single: tensors need a first dimension to split")
        if _row_bytes(out) != _row_bytes(inp):
            raise InvalidArgument(
                f"all_to_all_single: input rows {tuple(inp.shape[1:])} and output rows "
                f"{tuple(out.shape[1:])} differ in size"
            )
        row = _row_bytes(inp)
        if ins is None and outs is None:
            if inp.numel() != out.numel() or inp.shape[0] % n:
                raise InvalidArgument(
                    f"all_to_all_single: {inp.shape[0]} input and {out.shape[0]} output rows "
                    f"do not split in {n} equal parts"
                )
            if not inp.numel():
                return self._work(opts, [out])
            if self._sym(out, inp):
                C.all_to_all_single(_bytes(out), _bytes(inp))
                return self._work(opts, [out])
            so = self._stage(0, out.nbytes, "all_to_all_single")
            si = self._stage(1, inp.nbytes, "all_to_all_single")
            si.view(inp.dtype).view(inp.shape).copy_(inp)
            C.all_to_all_single(so, si)
            out.copy_(so.view(out.dtype).view(out.shape))
            return self._work(opts, [out])
        return self._a2av(out, inp, outs, ins, row, opts, "all_to_all_single")

    def _a2av(self, out: torch.Tensor, inp: torch.Tensor, outs: Optional[List[int]],
              ins: Optional[List[int]], row: int, opts: Any, what: str) -> _Work:
        n = self.size()
        orows, irows = out.shape[0], inp.shape[0]
        for name, sizes, rows in (("output_split_sizes", outs, orows),
                                  ("input_split_sizes", ins, irows)):
            if sizes is not None and (len(sizes) != n or any(x < 0 for x in sizes)
                                      or sum(sizes) != rows):
                raise InvalidArgument(f"{what}: {name} {sizes} do not split {rows} rows in {n}")
        if self._sym(out, inp):
            C.all_to_all_single(_bytes(out).view(orows, row), _bytes(inp).view(irows, row),
                                outs, ins)
            return self._work(opts, [out])
        return self._a2a_bytes(out, inp, [x * row for x in (outs or _equal(orows, n, what))],
                               [x * row for x in (ins or _equal(irows, n, what))], opts, what)

    def _a2a_bytes(self, out: torch.Tensor, inp: torch.Tensor, recv: List[int],
                   send: List[int], opts: Any, what: str) -> _Work:
        """all_to_all_v through the staging buffers, counts in bytes (the whole buffers, the
        same objects on every rank, with the parts' offsets in the displacements)."""
        # Each rank's sizes differ: agree on the largest need so that every rank grows alike.
        need = max(int(self._w.max_of(max(out.nbytes, inp.nbytes))), 1)
        so = self._stage(0, need, what)
        si = self._stage(1, need, what)
        if inp.nbytes:
            si[:inp.nbytes].view(inp.dtype).view(inp.shape).copy_(inp)
        args = ("uint8", so.data_ptr(), need, si.data_ptr(), need, send, _prefix(send), recv,
                _prefix(recv))
        if self._cuda:
            self._w.all_to_all_v_dev(*args, _ops.stream_ptr(self._w, None))
        else:
            self._w.all_to_all_v(*args)
        if out.nbytes:
            out.copy_(so[:out.nbytes].view(out.dtype).view(out.shape))
        return self._work(opts, [out])

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> _Work:
        n = self.size()
        outs = [self._check(t, "all_to_all output") for t in output_tensors]
        ins = [self._check(t, "all_to_all input") for t in input_tensors]
        if len(outs) != n or len(ins) != n:
            raise InvalidArgument(
                f"all_to_all: {len(outs)} output and {len(ins)} input tensors, the group {n} ranks"
            )
        dt = ins[0].dtype
        if any(t.dtype != dt for t in outs + ins):
            raise InvalidArgument("all_to_all: every tensor must have the same dtype")
        onb = [t.nbytes for t in outs]
        inb = [t.nbytes for t in ins]
        flat_in = torch.cat([t.reshape(-1).view(torch.uint8) for t in ins]) if ins else None
        flat_out = torch.empty(sum(onb), dtype=torch.uint8, device=self._dev)
        self._a2a_bytes(flat_out, flat_in, onb, inb, opts, "all_to_all")
        at = 0
        for t in outs:
            t.copy_(flat_out[at:at + t.nbytes].view(t.dtype).view(t.shape))
            at += t.nbytes
        return self._work(opts, outs)

    def barrier(self, opts: Any = None) -> _Work:
        if self._cuda:
            _ops.barrier()
            return self._work(opts, [], sync=True)
        self._w.barrier()
        return self._work(opts, [])

    # -- lifetime -----------------------------------------------------------------------
    def shutdown(self) -> None:
        if not self._live:
            return
        self._live = False
        self._router.shutdown()
        st = self._st
        st.users -= 1
        if self._w.ended:
            return
        if st.users == 0:
            if self._cuda:
                torch.cuda.synchronize(self._dev)
            st.release()
            _STAGING.pop(self._w, None)
        if self._owned:
            _world.finalize()

    def abort(self) -> None:
        self._live = False
        self._router.shutdown()
        if self._owned and not self._w.ended:
            self._w.abandon()

    # -- not served ---------------------------------------------------------------------
    def send(self, tensors: Any, dstRank: int, tag: int) -> _Work:
        raise _unsupported("send")

    def recv(self, tensors: Any, srcRank: int, tag: int) -> _Work:
        raise _unsupported("recv")

    def recv_anysource(self, tensors: Any, tag: int) -> _Work:
        raise _unsupported("recv_anysource")

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> _Work:
        raise _unsupported("gather")

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> _Work:
        raise _unsupported("scatter")

    # Coalesced forms (functional collectives use them): the calls one after another.
    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> _Work:
        inner = _Inner(opts)
        for t in tensors:
            self.allreduce([t], inner)
        return self._work(opts, list(tensors))

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> _Work:
        if len(outputs) != len(inputs):
            raise InvalidArgument("allgather_into_tensor_coalesced: as many outputs as inputs")
        inner = _Inner(opts)
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, inner)
        return self._work(opts, list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> _Work:
        if len(outputs) != len(inputs):
            raise InvalidArgument("reduce_scatter_tensor_coalesced: as many outputs as inputs")
        inner = _Inner(opts)
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, inner)
        return self._work(opts, list(outputs))

    def allgather_coalesced(self, output_lists: Any, input_list: Any, opts: Any = None) -> _Work:
        raise _unsupported("allgather_coalesced")

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> None:
        raise _unsupported("monitored_barrier")


class _Inner:
    """Options of one call of a coalesced group: its reduction, no Work of its own."""

    asyncOp = False

    def __init__(self, opts: Any) -> None:
        self.reduceOp = getattr(opts, "reduceOp", ReduceOp.SUM)


def _row_bytes(t: torch.Tensor) -> int:
    r = t.element_size()
    for d in t.shape[1:]:
        r *= d
    return r


def _prefix(counts: List[int]) -> List[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _equal(rows: int, n: int, what: str) -> List[int]:
    if rows % n:
        raise InvalidArgument(f"{what}: {rows} rows do not split in {n} equal parts")
    return [rows // n] * n


def _unsupported(call: str) -> NotImplementedError:
    return NotImplementedError(
        f"the rshmem process group does not implement {call} (served: all_reduce, reduce, "
        "broadcast, all_gather, all_gather_into_tensor, reduce_scatter, "
        "reduce_scatter_tensor, all_to_all_single, all_to_all, barrier, and the coalesced "
        "all_reduce, all_gather_into_tensor and reduce_scatter_tensor)"
    )


class _Subgroup(dist.ProcessGroup):
    """A group of some of the world's ranks: rshmem's collectives here span the world, so each
    call raises (such groups are made with another backend), except those the backend string
    gives to another backend."""

    def __init__(self, rank: int, size: int, ranks: List[int], router: Router) -> None:
        super().__init__(rank, size)
        self._ranks = ranks
        self._router = router

    def getBackendName(self) -> str:
        return BACKEND

    def _get_backend(self, device: Any) -> Any:
        return self._router.backend(self, torch.device(device).type) or self

    def shutdown(self) -> None:
        self._router.shutdown()


def _refuse(call: str) -> Any:
    def f(self: _Subgroup, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{call} on an rshmem group of ranks {self._ranks}: rshmem's collectives span "
            "every rank in order; make groups of fewer or reordered ranks with "
            "dist.new_group(ranks, backend='gloo') (or 'nccl')"
        )

    f.__name__ = call
    return f


for _c in CALLS:
    setattr(_Subgroup, _c, _refuse(_c))
# Calls of devices that the backend string gives to another backend go there.
routed(_Subgroup)


def _start(store: Any, rank: int, size: int, timeout: Any, opts: Options) -> Any:
    """Starts this process's PE through the group's store: rank 0's unique id under a key of
    this start's own (the store outlives a destroyed group)."""
    from datetime import timedelta

    from torch.distributed.constants import default_pg_timeout

    gen = (int(store.add("rshmem/joined", 1)) - 1) // size
    key = f"rshmem/uid/{gen}"
    if rank == 0:
        store.set(key, _world.unique_id())
    uid = store.get(key).decode()
    backend = opts.backend
    if backend is None and "RSHMEM_BACKEND" not in os.environ:
        backend = "cuda" if torch.cuda.is_available() else "shm"
    t = None
    if isinstance(timeout, timedelta) and timeout != default_pg_timeout:
        t = timeout.total_seconds()
    _world.init(rank=rank, world_size=size, unique_id=uid, heap_size=opts.heap_size,
                timeout=t, backend=backend)
    return _world.current()


def create(dist_opts: Any, pg_options: Any) -> dist.ProcessGroup:
    """The creator registered for "rshmem" (torch's extended API)."""
    rank, size = dist_opts.group_rank, dist_opts.group_size
    ranks = list(dist_opts.global_ranks_in_group)
    router = Router(dist_opts.store, rank, size, dist_opts.timeout)
    if pg_options is None:
        pg_options = Options()
    if not isinstance(pg_options, Options):
        raise InvalidArgument(
            f"pg_options of an rshmem group must be rshmem.dist.Options, not "
            f"{type(pg_options).__name__}"
        )
    if ranks:
        # A group made by new_group: the world's ranks in order, or a subgroup.
        if _world.is_initialized():
            w = _world.current()
            if ranks == list(range(w.n_pes)) and rank == w.my_pe:
                return ProcessGroupRshmem(rank, size, w, owned=False, router=router)
        sub = Router(dist_opts.store, rank, size, dist_opts.timeout, tensorless_elsewhere=True)
        return _Subgroup(rank, size, ranks, sub)
    if _world.is_initialized():
        w = _world.current()
        if (w.my_pe, w.n_pes) != (rank, size):
            raise InvalidArgument(
                f"this process runs rshmem as PE {w.my_pe} of {w.n_pes}, but the process group "
                f"is rank {rank} of {size}"
            )
        return ProcessGroupRshmem(rank, size, w, owned=False, router=router)
    w = _start(dist_opts.store, rank, size, dist_opts.timeout, pg_options)
    return ProcessGroupRshmem(rank, size, w, owned=True, router=router)

