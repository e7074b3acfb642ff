"""DeepEP's low-latency (decode) pair on ``rshmem.ep.Buffer``: ``low_latency_dispatch`` and
``low_latency_combine`` over ``rshmem::cuda::ep::LowLatencyBuffer`` (GPUs only).

Differences from DeepEP:

* The buffer is made at the first ``low_latency_dispatch`` (collective, every PE) for that
  call's ``num_max_dispatch_tokens_per_rank``, hidden size, expert count and top-k; a later
  call with another shape or a larger top-k raises. ``num_rdma_bytes`` is accepted and ignored;
  ``get_low_latency_rdma_size_hint`` says how much symmetric heap the buffer and its staging
  take (``RSHMEM_HEAP_SIZE`` must hold it).
* Inputs are copied into symmetric staging (``x``: ``T * hidden`` bf16; ids and weights);
  ``low_latency_combine``'s ``x`` too (the whole ``[L, n*M, H]`` tensor), unless it is the
  tensor ``get_next_low_latency_combine_buffer`` returned (``zero_copy``) or ``recv_x`` itself.
* FP8 scales are row-major ``[L, n*M, H/128]`` float32 (DeepEP's are column-major in the last
  two dimensions); ``round_scale``, ``use_ue8m0``, ``use_logfmt`` and the wait-cost statistics
  are not supported (they raise).
* Outputs are views of the buffer's two halves (as in DeepEP: at most two dispatches' results
  are valid at once). ``combined_x`` is a view too, unless ``out`` is given.
* ``async_finish`` is ignored (the work is on the current stream); ``hook()`` queues the receive
  on the stream current when it is called: between send and hook no SM is held.
* Buffers are sized for the worst case, so no routing overflows; ids outside ``-1..E-1`` are
  taken as -1 and reported by ``Buffer.check_low_latency()`` (after synchronising).
"""

from typing import Any, Callable, Optional, Tuple

from . import _rshmem
from ._ops import stream_ptr
from .errors import InvalidArgument


class _DevArea:
    """Device bytes for ``torch.as_tensor`` that keep the native buffer alive."""

    def __init__(self, owner: Any, addr: int, nbytes: int) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "strides": None,
            "version": 2,
        }


class LlHandle(tuple):
    """DeepEP's low-latency handle ``(src_info, layout_range, num_max_dispatch_tokens_per_rank,
    hidden, num_experts)``, carrying the native dispatch for ``low_latency_combine``."""

    native: Any

    def __new__(cls, items: Tuple[Any, ...], native: Any) -> "LlHandle":
        h = super().__new__(cls, items)
        h.native = native
        return h


def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                   num_ranks: int, num_experts: int, num_topk: int = 8) -> int:
    """Bytes of symmetric heap per PE that ``low_latency_dispatch`` allocates for this shape:
    the buffer (both halves) and the staging (``num_topk``: rshmem only, the top-k it is sized
    for)."""
    m, h, n, e, k = num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts, num_topk
    buf = _rshmem.GpuLlEp.bytes_for(m, h, e, k, n)
    local = e // n if n else 0
    stage = m * h * 2 + m * k * 8 + 2 * (m * k * 4 + m * h * 2 + local * n * m * h * 2)
    return buf + stage


class LowLatency:
    """The low-latency half of ``rshmem.ep.Buffer`` (mixed into it)."""

    world: Any
    group_size: int
    _ll: Any = None
    _ll_key: Optional[Tuple[int, int, int, int]] = None
    _ll_stage: Any = None
    _ll_views: Optional[dict] = None

    def _ll_ensure(self, m: int, h: int, e: int, k: int) -> None:
        key = (m, h, e, k)
        if self._ll is not None:
            om, oh, oe, ok = self._ll_key
            if (m, h, e) != (om, oh, oe) or k > ok:
                raise InvalidArgument(
                    f"the low-latency buffer was made for (max tokens, hidden, experts, top-k) = "
                    f"{self._ll_key}, this call has {key}"
                )
            return
        import torch

        from ._tensors import empty

        n = self.group_size
        if e <= 0 or e % n:
            raise InvalidArgument(f"{e} experts cannot be split evenly over {n} PEs")
        self._ll = _rshmem.GpuLlEp(self.world, m, h, e, k)
        local = e // n
        bf = torch.bfloat16
        self._ll_stage = {
            "x": empty((m, h), bf), "ids": empty((m * k,), torch.int64),
            "w": [empty((m * k,), torch.float32) for _ in range(2)],
            "out": [empty((m, h), bf) for _ in range(2)],
            "y": [empty((local, n * m, h), bf) for _ in range(2)],
        }
        self._ll_key = key
        self._ll_views = {}

    def _ll_outputs(self, hd: Any) -> Tuple[Any, Any, Any, Any, Any]:
        """Views of dispatch ``hd``'s outputs: rows (bf16 or (e4m3, scales)), counts,
        sources, layout, and the half."""
        import torch

        x, sc, cnt, src, lay = self._ll.areas(hd)
        m, h, e, _ = self._ll_key
        n = self.group_size
        local = e // n
        dev = torch.device("cuda", self.world.device)

        def t(a: Tuple[int, int], dtype: Any, shape: Tuple[int, ...]) -> Any:
            key = (a, dtype, shape)
            v = self._ll_views.get(key)
            if v is None:
                v = torch.as_tensor(_DevArea(self._ll, a[0], a[1]), device=dev)
                v = v.view(dtype).view(shape)
                self._ll_views[key] = v
            return v

        rows = (local, n * m, h)
        if sc[1]:
            xs = (t(x, torch.float8_e4m3fn, rows), t(sc, torch.float32, (local, n * m, h // 128)))
        else:
            xs = t(x, torch.bfloat16, rows)
        return (xs, t(cnt, torch.int32, (local,)), t(src, torch.int32, (local, n * m)),
                t(lay, torch.int32, (local, n, 2)), None)

    def low_latency_dispatch(self, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats: Any = None,
                             dispatch_wait_recv_cost_stats: Any = None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False
                             ) -> Tuple[Any, Any, LlHandle, Any, Optional[Callable[[], None]]]:
        """Sends each token once to every PE serving one of its experts, where it is expanded
        into the experts' rows (collective; no host synchronisation, capturable).

        :param x: ``[num_tokens, hidden]`` bfloat16 on this PE's GPU, ``num_tokens <=
            num_max_dispatch_tokens_per_rank``.
        :param topk_idx: ``[num_tokens, num_topk]`` int64 (or int32) expert ids, -1 for none.
        :param num_max_dispatch_tokens_per_rank: the same on every PE; sizes the buffer.
        :param num_experts: experts of the world, a multiple of the number of PEs.
        :param cumulative_local_expert_recv_stats: None, or ``[num_local_experts]`` int32 to
            which the received counts are added.
        :param dispatch_wait_recv_cost_stats: must be None (not supported).
        :param use_fp8: send e4m3 rows with one float32 scale per 128 elements.
        :param round_scale: must be False. :param use_ue8m0: must be False.
        :param async_finish: ignored (the current stream is used).
        :param return_recv_hook: return after the send; ``hook()`` queues the receive.
        :returns: ``recv_x`` (``[num_local_experts, n * M, hidden]`` bfloat16, or with
            ``use_fp8`` a pair of e4m3 rows and ``[num_local_experts, n * M, hidden // 128]``
            float32 scales), ``recv_count [num_local_experts]`` int32, the handle, an
            ``EventOverlap`` and the hook (None without ``return_recv_hook``).
        """
        if self.world.backend != "cuda":
            raise InvalidArgument("low-latency mode needs the CUDA backend (GPU tensors)")
        import torch

        from .ep import EventOverlap

        if round_scale or use_ue8m0:
            raise InvalidArgument("low_latency_dispatch: round_scale and use_ue8m0 are not supported")
        if dispatch_wait_recv_cost_stats is not None:
            raise InvalidArgument("low_latency_dispatch: dispatch_wait_recv_cost_stats is not supported")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
            raise InvalidArgument("low_latency_dispatch: x must be a [num_tokens, hidden] bfloat16 tensor")
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or \
                topk_idx.shape[0] != x.shape[0] or topk_idx.dtype not in (torch.int64, torch.int32):
            raise InvalidArgument("low_latency_dispatch: topk_idx must be [num_tokens, num_topk] int64")
        dev = self.world.device
        if x.device != torch.device("cuda", dev) or topk_idx.device != x.device:
            raise InvalidArgument(f"low_latency_dispatch: x and topk_idx must be on cuda:{dev}")
        t, h = x.shape
        k = topk_idx.shape[1]
        m = num_max_dispatch_tokens_per_rank
        if t > m:
            raise InvalidArgument(f"low_latency_dispatch: {t} tokens, more than "
                                  f"num_max_dispatch_tokens_per_rank {m}")
        self._ll_ensure(m, h, num_experts, k)
        st = self._ll_stage
        st["x"][:t].copy_(x)
        st["ids"][:t * k].view(t, k).copy_(topk_idx)
        ll = self._ll
        pending = ll.dispatch_send((st["x"].data_ptr(), t * h * 2), (st["ids"].data_ptr(), t * k * 8),
                                   "int64", t, k, bool(use_fp8), stream_ptr(self.world, None))
        native = pending.handle()
        rows, count, src, layout, _ = self._ll_outputs(native)
        handle = LlHandle((src, layout, m, h, num_experts), native)
        stats = cumulative_local_expert_recv_stats

        def hook() -> None:
            ll.dispatch_recv(pending, stream_ptr(self.world, None))
            if stats is not None:
                stats.add_(count)

        if return_recv_hook:
            return rows, count, handle, EventOverlap(), hook
        hook()
        return rows, count, handle, EventOverlap(), None

    def get_next_low_latency_combine_buffer(self, handle: LlHandle) -> Any:
        """The symmetric ``[num_local_experts, n * M, hidden]`` bfloat16 tensor that the
        combine of ``handle`` sends from: write the expert outputs here and pass it (or
        ``zero_copy=True``) to ``low_latency_combine`` to skip the copy."""
        if not isinstance(handle, LlHandle) or self._ll is None:
            raise InvalidArgument("get_next_low_latency_combine_buffer needs a low-latency handle")
        return self._ll_stage["y"][handle.native.half]

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                 num_experts: int) -> None:
        """Nothing to clean: the receive kernels clear what they read."""

    def low_latency_combine(self, x: Any, topk_idx: Any, topk_weights: Any, handle: LlHandle,
                            use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False,
                            out: Any = None, combine_wait_recv_cost_stats: Any = None
                            ) -> Tuple[Any, Any, Optional[Callable[[], None]]]:
        """Sends every expert output row back to its token's PE, which sums each token's rows
        with its top-k weights in float32 (collective; one combine per dispatch).

        :param x: ``[num_local_experts, n * M, hidden]`` bfloat16: the experts' outputs in
            ``recv_x``'s row order.
        :param topk_idx: the dispatch's ``[num_tokens, num_topk]`` ids (shape checked).
        :param topk_weights: ``[num_tokens, num_topk]`` float32.
        :param handle: the dispatch's handle.
        :param use_logfmt: must be False. :param zero_copy: ``x`` is the tensor of
            ``get_next_low_latency_combine_buffer`` (detected either way).
        :param async_finish: ignored.
        :param return_recv_hook: return after the send; ``hook()`` queues the receive.
        :param out: None, or a ``[num_tokens, hidden]`` bfloat16 tensor the result is copied to.
        :param combine_wait_recv_cost_stats: must be None (not supported).
        :returns: ``combined_x [num_tokens, hidden]`` bfloat16, an ``EventOverlap`` and the hook.
        """
        import torch

        from .ep import EventOverlap

        if use_logfmt or combine_wait_recv_cost_stats is not None:
            raise InvalidArgument("low_latency_combine: use_logfmt and the wait-cost statistics "
                                  "are not supported")
        if not isinstance(handle, LlHandle) or self._ll is None:
            raise InvalidArgument("low_latency_combine needs the handle low_latency_dispatch returned")
        nat = handle.native
        t, k = nat.num_tokens, nat.top_k
        if tuple(topk_weights.shape) != (t, k) or topk_weights.dtype != torch.float32:
            raise InvalidArgument(f"low_latency_combine: topk_weights must be float32 [{t}, {k}]")
        if tuple(topk_idx.shape) != (t, k):
            raise InvalidArgument(f"low_latency_combine: topk_idx must be [{t}, {k}]")
        half = nat.half
        st = self._ll_stage
        y = st["y"][half]
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(y.shape) or \
                x.dtype != torch.bfloat16:
            raise InvalidArgument(f"low_latency_combine: x must be bfloat16 {tuple(y.shape)}")
        if x.data_ptr() == y.data_ptr():
            src = y
        elif not nat.fp8 and x.data_ptr() == self._ll_outputs(nat)[0].data_ptr():
            src = x  # recv_x itself (identity experts): already symmetric
        else:
            y.copy_(x)
            src = y
        w = st["w"][half]
        w[:t * k].view(t, k).copy_(topk_weights)
        o = st["out"][half]
        ll = self._ll
        pending = ll.combine_send(nat, (src.data_ptr(), src.numel() * 2),
                                  stream_ptr(self.world, None))
        result = o[:t]

        def hook() -> None:
            ll.combine_recv(pending, (w.data_ptr(), t * k * 4), (o.data_ptr(), t * o.shape[1] * 2),
                            stream_ptr(self.world, None))
            if out is not None:
                out.copy_(result)

        if return_recv_hook:
            return (out if out is not None else result), EventOverlap(), hook
        hook()
        return (out if out is not None else result), EventOverlap(), None

    def check_low_latency(self) -> None:
        """Raises errors the low-latency kernels latched (invalid ids, a peer that never
        sent); call after synchronising."""
        if self._ll is not None:
            self._ll.check()

    def _ll_destroy(self) -> None:
        self._ll_views = {}
        if self._ll is not None:
            self._ll.free()
            self._ll = None
        if self._ll_stage is not None:
            from ._tensors import free

            st = self._ll_stage
            for v in (st["x"], st["ids"], *st["w"], *st["out"], *st["y"]):
                free(v)
            self._ll_stage = None
