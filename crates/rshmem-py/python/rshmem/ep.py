"""MoE dispatch and combine with DeepEP's interface: ``from rshmem.ep import Buffer`` in place
of ``from deep_ep import Buffer``.

The same constructor, methods, arguments and tensor shapes as DeepEP's normal
(intranode) mode::

    buffer = Buffer(group, num_nvl_bytes)
    num_tokens_per_rank, _, num_tokens_per_expert, is_token_in_rank, _ = \\
        buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, _ = \\
        buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights,
                        num_tokens_per_rank=num_tokens_per_rank,
                        is_token_in_rank=is_token_in_rank,
                        num_tokens_per_expert=num_tokens_per_expert)
    # experts: each received token's result here, already weighted by recv_topk_weights
    combined_x, _, _ = buffer.combine(y, handle)

Differences from DeepEP (each one documented where it applies):

* The world is rshmem's (every PE, ``rshmem.init`` or ``rshmem.launch``); ``group`` may be a
  torch.distributed group of the same size, or None.
* Sizes: rshmem's buffers are sized by tokens, not bytes. ``num_nvl_bytes`` and
  ``num_rdma_bytes`` are accepted and ignored; the buffer is made at the first ``dispatch``
  (collective) for that call's hidden size, top-k, dtype and number of experts, with
  ``max_tokens`` the largest token count of any PE rounded up to a power of two (at least
  64), unless the constructor's ``max_tokens`` says otherwise. A later call with more tokens,
  another hidden size, top-k, dtype or expert count raises ``InvalidArgument`` on every PE.
* Low-latency mode (``low_latency_dispatch``/``low_latency_combine``, GPUs only) has its own
  list of differences in ``rshmem._ep_ll``. In the normal mode FP8 inputs (``x`` as a tuple),
  ``num_worst_tokens`` and internode (RDMA) are not supported: they raise.
* ``previous_event``, ``async_finish``, ``allocate_on_comm_stream`` and ``config`` are accepted;
  the work is ordered on the current stream and the returned ``EventOverlap`` holds no event.
* ``combined_topk_weights`` is each source token's own dispatched weights where a slot has an
  expert (0 elsewhere): what DeepEP's sum of ``recv_topk_weights`` over ranks gives; weights
  passed to ``combine`` are checked for shape only.
* Every input may live anywhere. On GPUs, inputs that are contiguous symmetric tensors of the
  right dtype (``rshmem.empty``) are used in place; others are copied into the buffer's
  symmetric staging tensors first (one copy of ``x``). ``dispatch`` waits on the host for the
  counts, as DeepEP's normal mode does. ``recv_x`` is packed from the buffer's receive area
  (one copy of the received rows), and ``combine`` copies ``x`` into the area's layout (one
  copy): rshmem's kernels keep each source's rows at a fixed offset.
* ``num_recv_tokens_per_expert_list`` counts (token, top-k slot) pairs per local expert, as
  DeepEP's layout counts do (a token naming one expert twice counts twice).
* numpy arrays work in place of CPU tensors (the ``shm`` backend).
"""

from typing import Any, List, Optional, Tuple

import numpy as np

from . import _arrays as A
from . import _rshmem
from ._ep_ll import LlHandle, LowLatency, get_low_latency_rdma_size_hint
from ._ops import stream_ptr
from ._world import current
from .errors import InvalidArgument


class EventOverlap:
    """DeepEP's event wrapper; rshmem orders work on the current stream, so it holds none."""

    def __init__(self, event: Any = None) -> None:
        self.event = event

    def current_stream_wait(self) -> None:
        """Nothing to wait for: the work is already on the current stream."""

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class Config:
    """DeepEP's performance config; accepted and ignored (rshmem tunes through
    ``RSHMEM_EP_*``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def _xp(a: Any) -> Any:
    if A.is_torch(a):
        import torch

        return torch
    if isinstance(a, np.ndarray):
        return np
    raise InvalidArgument(f"expected a torch tensor or numpy array, not {type(a).__name__}")


class _Handle:
    """What dispatch hands to combine (opaque to callers, as DeepEP's handle tuple)."""

    def __init__(self, native: Any, topk_idx: Any, topk_weights: Any, num_tokens: int,
                 segments: Optional[List[Tuple[int, int]]] = None) -> None:
        self.native = native
        self.topk_idx = topk_idx
        self.topk_weights = topk_weights
        self.num_tokens = num_tokens
        # GPU: (first receive-area row, rows) per source PE with rows, in recv_x's order.
        self.segments = segments


class Buffer(LowLatency):
    """A DeepEP-compatible expert-parallel communication buffer (see the module docs)."""

    num_sms: int = 20

    def __init__(self, group: Any = None, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, *, max_tokens: Optional[int] = None) -> None:
        """Collective over the world.

        :param group: None, or a torch.distributed group whose size equals the world's.
        :param num_nvl_bytes: accepted, ignored (rshmem sizes by tokens).
        :param num_rdma_bytes: must be 0 unless ``low_latency_mode`` (no internode transport).
        :param low_latency_mode: accepted; the low-latency calls work on any buffer (GPUs).
        :param num_qps_per_rank: ignored.
        :param allow_nvlink_for_low_latency_mode: ignored.
        :param allow_mnnvl: ignored.
        :param explicitly_destroy: as DeepEP: when True call ``destroy()`` before the end.
        :param max_tokens: rshmem only: most tokens one PE dispatches per call (default: the
            first dispatch's largest count, rounded up to a power of two, at least 64).
        """
        self.world = current()
        n = self.world.n_pes
        if group is not None and hasattr(group, "size") and group.size() != n:
            raise InvalidArgument(f"group of {group.size()} ranks, the rshmem world has {n} PEs")
        # Low-latency mode: num_rdma_bytes is DeepEP's size hint, not a request for RDMA.
        if num_rdma_bytes and not low_latency_mode:
            raise InvalidArgument("rshmem.ep.Buffer: internode (RDMA) is not supported")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidArgument(f"max_tokens {max_tokens} must be at least 1")
        self.group_size = n
        self.rank = self.world.my_pe
        self.num_nvl_bytes = num_nvl_bytes
        self.explicitly_destroy = explicitly_destroy
        self.max_tokens = max_tokens
        self.num_experts: Optional[int] = None
        self._native: Any = None
        self._key: Optional[Tuple[Any, ...]] = None
        self._stage: Any = None
        self._views: dict = {}

    # ----- DeepEP's static helpers -----

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Accepted for compatibility; rshmem sizes its grids itself."""
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An ``EventOverlap`` (no event: the work is on the current stream)."""
        return EventOverlap()

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """A placeholder ``Config`` (ignored by rshmem)."""
        return Config(num_ranks)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """A placeholder ``Config`` (ignored by rshmem)."""
        return Config(num_ranks)

    def destroy(self) -> None:
        """Collectively releases the symmetric memory (every PE calls it)."""
        self._ll_destroy()
        self._views = {}
        if self._native is not None:
            self._native.free()
            self._native = None
        if self._stage is not None:
            from ._tensors import free

            for t in self._stage:
                free(t)
            self._stage = None

    # ----- layout -----

    def get_dispatch_layout(self, topk_idx: Any, num_experts: int, previous_event: Any = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False
                            ) -> Tuple[Any, None, Any, Any, EventOverlap]:
        """Counts where each token goes (local computation, no communication).

        :param topk_idx: ``[num_tokens, num_topk]`` int64 (or int32) expert ids, -1 for none.
        :param num_experts: total experts, a multiple of the number of PEs.
        :param previous_event: ignored (work is ordered on the current stream).
        :param async_finish: ignored.
        :param allocate_on_comm_stream: ignored.
        :returns: ``num_tokens_per_rank [num_ranks]`` int32, ``None`` (no RDMA ranks),
            ``num_tokens_per_expert [num_experts]`` int32 (one per (token, slot)),
            ``is_token_in_rank [num_tokens, num_ranks]`` bool, and an ``EventOverlap``.
        """
        xp = _xp(topk_idx)
        n = self.group_size
        if topk_idx.ndim != 2:
            raise InvalidArgument(f"topk_idx must be [num_tokens, num_topk], not {tuple(topk_idx.shape)}")
        if num_experts <= 0 or num_experts % n:
            raise InvalidArgument(f"{num_experts} experts cannot be split evenly over {n} PEs")
        epp = num_experts // n
        valid = topk_idx >= 0
        if bool(((topk_idx >= num_experts) | (topk_idx < -1)).any()):
            raise InvalidArgument(f"topk_idx holds ids outside -1..{num_experts - 1}")
        rank_of = xp.where(valid, topk_idx // epp, -1)
        cols = [(rank_of == r).any(1) for r in range(n)]
        is_token_in_rank = xp.stack(cols, 1) if cols else None
        int32 = xp.int32
        num_tokens_per_rank = is_token_in_rank.sum(0).astype(int32) if xp is np else \
            is_token_in_rank.sum(0).to(int32)
        ids = topk_idx[valid]
        if xp is np:
            per_expert = np.bincount(ids.astype(np.int64), minlength=num_experts).astype(np.int32)
        else:
            per_expert = xp.bincount(ids.long(), minlength=num_experts).to(int32)
        self.num_experts = num_experts
        return num_tokens_per_rank, None, per_expert, is_token_in_rank, EventOverlap()

    # ----- dispatch -----

    def dispatch(self, x: Any, handle: Optional[_Handle] = None,
                 num_tokens_per_rank: Any = None, num_tokens_per_rdma_rank: Any = None,
                 is_token_in_rank: Any = None, num_tokens_per_expert: Any = None,
                 topk_idx: Any = None, topk_weights: Any = None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config: Any = None, previous_event: Any = None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False
                 ) -> Tuple[Any, Any, Any, Any, _Handle, EventOverlap]:
        """Sends each token to the PEs of its experts, once per PE (collective).

        :param x: ``[num_tokens, hidden]`` float32, bfloat16 or float16 (FP8 tuples are not
            supported); ``num_tokens`` may differ between PEs.
        :param handle: a previous dispatch's handle: dispatch ``x`` again with that routing
            (DeepEP's cached mode); then only ``recv_x`` is returned (the rest None).
        :param num_tokens_per_rank: from ``get_dispatch_layout``; accepted, not needed (the
            layout is computed again inside dispatch).
        :param num_tokens_per_rdma_rank: must be None (no RDMA).
        :param is_token_in_rank: from ``get_dispatch_layout``; accepted, not needed.
        :param num_tokens_per_expert: from ``get_dispatch_layout``; its length gives the
            number of experts (else the last ``get_dispatch_layout``'s).
        :param topk_idx: ``[num_tokens, num_topk]`` int64/int32 expert ids, -1 for none.
        :param topk_weights: ``[num_tokens, num_topk]`` float32; finite where an id is set.
        :param expert_alignment: ``num_recv_tokens_per_expert_list`` is rounded up to it.
        :param num_worst_tokens: must be 0.
        :param config: ignored. :param previous_event: ignored.
        :param async_finish: ignored. :param allocate_on_comm_stream: ignored.
        :returns: ``recv_x [num_recv_tokens, hidden]`` (by source PE, then source token),
            ``recv_topk_idx [num_recv_tokens, num_topk]`` (local expert index, -1 where
            another PE serves the slot), ``recv_topk_weights`` (0 where -1),
            ``num_recv_tokens_per_expert_list`` (a list, one count per local expert),
            the handle for ``combine``, and an ``EventOverlap``.
        """
        if isinstance(x, tuple):
            raise InvalidArgument("FP8 dispatch (x as a tuple) is not supported")
        if num_tokens_per_rdma_rank is not None:
            raise InvalidArgument("internode dispatch (num_tokens_per_rdma_rank) is not supported")
        if num_worst_tokens:
            raise InvalidArgument("num_worst_tokens is not supported")
        if expert_alignment < 1:
            raise InvalidArgument(f"expert_alignment {expert_alignment} must be at least 1")
        cached = handle is not None
        if cached:
            topk_idx, topk_weights = handle.topk_idx, handle.topk_weights
        if topk_idx is None or topk_weights is None:
            raise InvalidArgument("dispatch needs topk_idx and topk_weights (or a handle)")
        if num_tokens_per_expert is not None:
            self.num_experts = int(num_tokens_per_expert.shape[0])
        if self.num_experts is None:
            raise InvalidArgument(
                "dispatch: the number of experts is unknown: pass num_tokens_per_expert or call "
                "get_dispatch_layout first"
            )
        xi = A.info(x, "x")
        if len(xi.shape) != 2:
            raise InvalidArgument(f"x must be [num_tokens, hidden], not {xi.shape}")
        ii, wi = A.info(topk_idx, "topk_idx"), A.info(topk_weights, "topk_weights")
        t, h = xi.shape
        if len(ii.shape) != 2 or ii.shape[0] != t:
            raise InvalidArgument(f"topk_idx must be [{t}, num_topk], not {ii.shape}")
        k = ii.shape[1]
        if wi.shape != ii.shape or wi.dtype != "float32":
            raise InvalidArgument(f"topk_weights must be float32 {ii.shape}, not {wi.dtype} {wi.shape}")
        if ii.dtype not in ("int64", "int32"):
            raise InvalidArgument(f"topk_idx must be int64 or int32, not {ii.dtype}")
        self._ensure(xi.dtype, t, h, k, xi.cuda)
        if xi.cuda:
            out = self._dispatch_gpu(x, topk_idx, topk_weights, t, k)
        else:
            out = self._dispatch_host(x, topk_idx, topk_weights, xi, ii, wi, t, k)
        recv_x, recv_idx, recv_w, native, segments = out
        hd = _Handle(native, topk_idx, topk_weights, t, segments)
        if cached:
            return recv_x, None, None, None, hd, EventOverlap()
        if isinstance(recv_idx, np.ndarray):
            recv_idx = recv_idx.astype(topk_idx.dtype)
            counts = self._tokens_per_local_expert(recv_idx)
        else:
            recv_idx = recv_idx.to(topk_idx.dtype)
            # Read back with the receive counts (no second host synchronisation).
            counts = list(native.expert_counts)
        counts = [-(-c // expert_alignment) * expert_alignment for c in counts]
        return recv_x, recv_idx, recv_w, counts, hd, EventOverlap()

    def _tokens_per_local_expert(self, recv_idx: Any) -> List[int]:
        """(token, slot) pairs per local expert of the host path's ``recv_idx``."""
        el = self.num_experts // self.group_size
        ids = recv_idx[recv_idx >= 0].astype(np.int64)
        return [int(c) for c in np.bincount(ids, minlength=el)[:el]]

    def _ensure(self, dtype: str, t: int, h: int, k: int, cuda: bool) -> None:
        """Makes the native buffer at the first dispatch (collective), sized for this call."""
        key = (dtype, h, k, self.num_experts, cuda)
        if self._native is not None:
            if key != self._key:
                raise InvalidArgument(
                    f"rshmem.ep.Buffer was made for (dtype, hidden, top-k, experts) = "
                    f"{self._key[:4]}, this dispatch has {key[:4]}"
                )
            return
        mt = self.max_tokens
        if mt is None:
            most = self.world.max_of(t)
            mt = max(64, 1 << max(0, int(most) - 1).bit_length())
            self.max_tokens = mt
        w = self.world
        if cuda:
            self._native = _rshmem.GpuEp(w, dtype, self.num_experts, mt, h, k, True, None)
            self._cap = self._native.areas()[3]
            self._make_stage(dtype, mt, h, k)
        else:
            self._native = _rshmem.HostEp(w, dtype, self.num_experts, mt, h, k, True, None)
        self._key = key

    # ----- host -----

    def _dispatch_host(self, x: Any, topk_idx: Any, topk_weights: Any, xi: A.Info,
                       ii: A.Info, wi: A.Info, t: int, k: int) -> Tuple[Any, ...]:
        data, nh = self._native.dispatch((xi.addr, xi.nbytes), (ii.addr, ii.nbytes), ii.dtype,
                                         (wi.addr, wi.nbytes), k)
        r, h = nh.num_recv_tokens, xi.shape[1]
        raw = np.frombuffer(data, dtype=np.uint8)
        local = np.frombuffer(nh.recv_topk_local, dtype=np.int32).reshape(r, -1)[:, :k]
        wts = np.frombuffer(nh.recv_topk_weights, dtype=np.float32).reshape(r, -1)[:, :k]
        wts = np.where(local >= 0, wts, np.float32(0))
        if A.is_torch(x):
            import torch

            recv_x = torch.from_numpy(raw).view(x.dtype).view(r, h)
            return (recv_x, torch.from_numpy(local.copy()), torch.from_numpy(wts.copy()), nh,
                    None)
        recv_x = raw.view(A.numpy_dtype(xi.dtype)).reshape(r, h)
        return recv_x, local.copy(), wts, nh, None

    # ----- GPU -----

    def _make_stage(self, dtype: str, mt: int, h: int, k: int) -> None:
        import torch

        from ._tensors import empty

        recv_rows = self._native.areas()[0][1] // h
        dt = getattr(torch, dtype)
        # Symmetric staging: the inputs, the per-receive-row combine input and the output.
        self._stage = (
            empty((mt, h), dt), empty((mt, k), torch.int64), empty((mt, k), torch.float32),
            empty((recv_rows, h), dt), empty((mt, h), dt),
        )

    def _area(self, which: str, dtype: Any) -> Any:
        """A view of the native buffer's area (made once: the areas do not move)."""
        import torch

        t = self._views.get(which)
        if t is None:
            t = torch.as_tensor(self._native.view(which))
            self._views[which] = t
        return t.view(dtype)

    def _on_heap(self, a: Any) -> bool:
        """Whether ``a`` is a contiguous tensor on this PE's symmetric heap (usable in place)."""
        return a.is_contiguous() and self.world.on_heap(a.data_ptr(), a.nbytes)

    def _symmetric(self, a: Any, stage: Any, n: int) -> Any:
        """``a`` itself where it is a symmetric tensor of ``stage``'s dtype usable in place,
        else ``stage`` holding a copy of ``a`` in its first ``n`` rows."""
        if a.dtype == stage.dtype and self._on_heap(a):
            return a
        stage[:n].copy_(a)
        return stage

    def _dispatch_gpu(self, x: Any, topk_idx: Any, topk_weights: Any, t: int,
                      k: int) -> Tuple[Any, ...]:
        import torch

        w = self.world
        xs, ids, wts, _, _ = self._stage
        if topk_idx.dtype == torch.int32 and self._on_heap(topk_idx):
            ids, id_dtype = topk_idx, "int32"
        else:
            ids, id_dtype = self._symmetric(topk_idx, ids, t), "int64"
        xs = self._symmetric(x, xs, t)
        wts = self._symmetric(topk_weights, wts, t)
        es = xs.element_size()
        h = x.shape[1]
        hd = self._native.dispatch((xs.data_ptr(), t * h * es),
                                   (ids.data_ptr(), t * k * ids.element_size()), id_dtype,
                                   (wts.data_ptr(), t * k * 4), t, k, stream_ptr(w, None))
        counts = hd.recv_tokens_per_pe
        if counts is None:
            raise InvalidArgument("rshmem.ep.Buffer.dispatch cannot run under graph capture")
        cap = self._cap
        segments = [(s * cap, c) for s, c in enumerate(counts) if c]
        kmax = self._key[2]
        area = self._area("recv_x", xs.dtype).view(-1, h)
        records = self._area("records", torch.int32).view(-1, 1 + 2 * kmax)
        if segments:
            # One copy each: the received rows packed in recv_x's order (by source PE).
            recv_x = torch.cat([area[a:a + c] for a, c in segments])
            rec = torch.cat([records[a:a + c] for a, c in segments])
        else:
            recv_x, rec = area[:0].clone(), records[:0].clone()
        gid = rec[:, 1:1 + k].to(torch.int64)
        wt = rec[:, 1 + kmax:1 + kmax + k].contiguous().view(torch.float32)
        el = self.num_experts // self.group_size
        lo = self.rank * el
        mine = (gid >= lo) & (gid < lo + el)
        local = torch.where(mine, gid - lo, torch.full_like(gid, -1))
        wt = torch.where(mine, wt, torch.zeros_like(wt))
        return recv_x, local, wt, hd, segments

    # ----- combine -----

    def combine(self, x: Any, handle: _Handle, topk_weights: Any = None, bias: Any = None,
                config: Any = None, previous_event: Any = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False) -> Tuple[Any, Any, EventOverlap]:
        """Sends each received token's result back to its source, which sums the results of
        the PEs it went to (float32, rounded once) (collective).

        :param x: ``[num_recv_tokens, hidden]``: dispatch's ``recv_x`` rows after the local
            experts, each already reduced over this PE's slots (weights applied by the caller).
        :param handle: the dispatch's handle.
        :param topk_weights: ``[num_recv_tokens, num_topk]`` float32 or None; see the module
            docs for what ``combined_topk_weights`` holds.
        :param bias: None, a ``[num_tokens, hidden]`` tensor, or a pair of them, added to the
            combined result (as DeepEP).
        :param config: ignored. :param previous_event: ignored.
        :param async_finish: ignored. :param allocate_on_comm_stream: ignored.
        :returns: ``combined_x [num_tokens, hidden]`` in the source's token order,
            ``combined_topk_weights [num_tokens, num_topk]`` (or None), an ``EventOverlap``.
        """
        if not isinstance(handle, _Handle):
            raise InvalidArgument("combine needs the handle dispatch returned")
        if self._native is None:
            raise InvalidArgument("combine before any dispatch")
        xi = A.info(x, "x")
        if xi.cuda:
            out = self._combine_gpu(x, handle)
        else:
            data = self._native.combine(handle.native, (xi.addr, xi.nbytes), False)
            raw = np.frombuffer(data, dtype=np.uint8)
            h = self._key[1]
            if A.is_torch(x):
                import torch

                out = torch.from_numpy(raw).view(x.dtype).view(handle.num_tokens, h)
            else:
                out = raw.view(A.numpy_dtype(xi.dtype)).reshape(handle.num_tokens, h)
        for b in (bias if isinstance(bias, tuple) else (bias,)):
            if b is not None:
                out = out + b
        cw = None
        if topk_weights is not None:
            ti = A.info(topk_weights, "topk_weights")
            if ti.shape[0] != xi.shape[0]:
                raise InvalidArgument(f"topk_weights has {ti.shape[0]} rows, x {xi.shape[0]}")
            xp = _xp(handle.topk_weights)
            zero = xp.zeros_like(handle.topk_weights)
            cw = xp.where(handle.topk_idx >= 0, handle.topk_weights, zero)
        return out, cw, EventOverlap()

    def _combine_gpu(self, x: Any, handle: _Handle) -> Any:
        w = self.world
        _, _, _, ys, outs = self._stage
        received = sum(c for _, c in handle.segments)
        if x.shape[0] != received:
            raise InvalidArgument(f"combine: x has {x.shape[0]} rows, the dispatch received {received}")
        # Each source's rows back at its offset of the receive area's layout (one copy each).
        at = 0
        for a, c in handle.segments:
            ys[a:a + c].copy_(x[at:at + c])
            at += c
        t = handle.num_tokens
        es = ys.element_size()
        self._native.combine(handle.native, (ys.data_ptr(), ys.numel() * es),
                             (outs.data_ptr(), t * ys.shape[1] * es), True, stream_ptr(w, None))
        return outs[:t].clone()


__all__ = ["Buffer", "Config", "EventOverlap", "LlHandle", "get_low_latency_rdma_size_hint"]
