"""rshmem.ep.Buffer with DeepEP's interface on the CPU backend: layout, dispatch, combine and
cached dispatch against references built from every PE's regenerated inputs; bad inputs."""

import numpy as np
import pytest

import rshmem
from conftest import as_np, host, run, torch
from rshmem.ep import Buffer

N, H, K, E = 3, 8, 3, 6
WEIGHTS = np.array([0.25, 0.5, 1.0, 2.0], np.float32)


def routing(p):
    """PE p's tokens: x (small integers), top-k ids (distinct, some -1), weights (powers of 2)."""
    rng = np.random.default_rng(1000 + p)
    t = 4 + 3 * p
    x = rng.integers(-8, 8, size=(t, H)).astype(np.float32)
    idx = np.stack([rng.choice(E, K, replace=False) for _ in range(t)]).astype(np.int64)
    idx[rng.random((t, K)) < 0.25] = -1
    w = WEIGHTS[rng.integers(0, 4, size=(t, K))]
    return x, idx, w


def arr(kind, a, dtype=None):
    if kind == "numpy":
        return a if dtype is None else host(kind, a, dtype)
    t = torch.from_numpy(a)
    return t if dtype is None else t.to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dispatch_combine_against_reference(kind, dtype):
    def f():
        me = rshmem.my_pe()
        x, idx, w = routing(me)
        b = Buffer(None, num_nvl_bytes=1 << 20)
        ntpr, rdma, ntpe, itir, ev = b.get_dispatch_layout(arr(kind, idx), E)
        assert rdma is None
        ev.current_stream_wait()
        rx, ridx, rw, counts, h, _ = b.dispatch(
            arr(kind, x, dtype), num_tokens_per_rank=ntpr, is_token_in_rank=itir,
            num_tokens_per_expert=ntpe, topk_idx=arr(kind, idx), topk_weights=arr(kind, w),
            expert_alignment=2)
        # Experts: identity, each received token weighted by its local slots' weights.
        rwn = as_np(rw, "float32")
        y = as_np(rx, dtype) * rwn.sum(1, keepdims=True)
        cx, cw, _ = b.combine(arr(kind, y.astype(np.float32), dtype), h, topk_weights=rw)
        again = b.dispatch(arr(kind, x * 2, dtype), handle=h)
        assert again[1] is None and again[3] is None
        out = dict(ntpr=as_np(ntpr, "int32"), ntpe=as_np(ntpe, "int32"),
                   itir=np.asarray(itir), rx=as_np(rx, dtype), ridx=as_np(ridx, "int64"),
                   rw=rwn, counts=counts, cx=as_np(cx, dtype), cw=as_np(cw, "float32"),
                   again=as_np(again[0], dtype))
        b.destroy()
        return out

    for me, r in enumerate(run(N, f)):
        x, idx, w = routing(me)
        pe_of = np.where(idx >= 0, idx // (E // N), -1)
        itir = np.stack([(pe_of == q).any(1) for q in range(N)], 1)
        assert (r["itir"] == itir).all()
        assert (r["ntpr"] == itir.sum(0)).all()
        assert (r["ntpe"] == np.bincount(idx[idx >= 0], minlength=E)).all()
        # What PE `me` receives: every source's tokens with an expert here, in order.
        lo = me * (E // N)
        rows, ids, wts = [], [], []
        for p in range(N):
            xp, ip, wp = routing(p)
            for t in range(len(xp)):
                mine = (ip[t] >= lo) & (ip[t] < lo + E // N)
                if mine.any():
                    rows.append(xp[t])
                    ids.append(np.where(mine, ip[t] - lo, -1))
                    wts.append(np.where(mine, wp[t], 0))
        assert (r["rx"] == np.array(rows)).all()
        assert (r["ridx"] == np.array(ids)).all()
        assert (r["rw"] == np.array(wts)).all()
        per = [int((np.array(ids) == e).any(1).sum()) for e in range(E // N)]
        assert r["counts"] == [-(-c // 2) * 2 for c in per]
        want = x * np.where(idx >= 0, w, 0).sum(1, keepdims=True)
        assert (r["cx"] == want).all()
        assert (r["cw"] == np.where(idx >= 0, w, 0)).all()
        assert (r["again"] == np.array(rows) * 2).all()


def test_bad_inputs_raise_on_every_pe():
    def f():
        me = rshmem.my_pe()
        x, idx, w = routing(me)
        b = Buffer(None)
        with pytest.raises(rshmem.InvalidArgument):
            b.get_dispatch_layout(idx, 5)            # experts not divisible
        with pytest.raises(rshmem.InvalidArgument):
            b.get_dispatch_layout(idx, E - 1)        # ids beyond the experts
        with pytest.raises(rshmem.InvalidArgument):
            b.dispatch(x, topk_idx=idx, topk_weights=w)   # experts unknown
        b.get_dispatch_layout(idx, E)
        for kw in (dict(topk_weights=w),                                  # no ids
                   dict(topk_idx=idx, topk_weights=w[:, :2].copy()),      # shapes
                   dict(topk_idx=idx.astype(np.float32), topk_weights=w),
                   dict(topk_idx=idx, topk_weights=w, num_worst_tokens=4),
                   dict(topk_idx=idx, topk_weights=w, expert_alignment=0)):
            with pytest.raises(rshmem.InvalidArgument):
                b.dispatch(x, **kw)
        with pytest.raises(rshmem.InvalidArgument):
            b.dispatch((x, x), topk_idx=idx, topk_weights=w)
        with pytest.raises(rshmem.InvalidArgument):
            b.dispatch(x.astype(np.int32), topk_idx=idx, topk_weights=w)
        # An id out of range on one PE only: every PE raises, nothing moves.
        bad = idx.copy()
        if me == 1:
            bad[0, 0] = E + 3
        with pytest.raises(rshmem.InvalidArgument):
            b.dispatch(x, topk_idx=bad, topk_weights=w)
        # Still usable afterwards.
        rx, _, rw, _, h, _ = b.dispatch(x, topk_idx=idx, topk_weights=w)
        cx, _, _ = b.combine(rx * rw.sum(1, keepdims=True), h)
        with pytest.raises(rshmem.InvalidArgument):
            b.combine(rx, "not a handle")
        b.destroy()
        return (cx == x * np.where(idx >= 0, w, 0).sum(1, keepdims=True)).all()

    assert all(run(N, f))


def test_unsupported_modes_raise():
    def f():
        for kw in (dict(num_rdma_bytes=1 << 20), dict(max_tokens=0)):
            with pytest.raises(rshmem.InvalidArgument):
                Buffer(None, **kw)
        # DeepEP's low-latency construction is accepted; its calls need GPUs.
        b = Buffer(None, 0, 1 << 30, low_latency_mode=True)
        with pytest.raises(rshmem.InvalidArgument, match="CUDA backend"):
            b.low_latency_dispatch(np.zeros((4, 8), np.float32), np.zeros((4, 2), np.int64), 128, 4)
        b.destroy()
        return True

    assert all(run(2, f))


def test_low_latency_size_hint_covers_the_buffers():
    hint = rshmem.ep.get_low_latency_rdma_size_hint
    m, h, n, e, k = 128, 7168, 2, 256, 8
    got = hint(m, h, n, e)
    # At least the two halves of received rows and of the combine staging, each
    # [E/n, n*M, H] bf16, and the inputs' staging.
    rows = (e // n) * n * m * h * 2
    assert got >= 4 * rows + m * h * 2
    assert hint(2 * m, h, n, e) > got and hint(m, h, n, e, num_topk=16) > got
    with pytest.raises(rshmem.InvalidArgument):
        hint(m, h, n, e, num_topk=0)
