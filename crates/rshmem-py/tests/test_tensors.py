"""Symmetric tensors: every dtype, zeros, peer views, checked shapes, safe free."""

import gc

import numpy as np
import pytest

import rshmem
from conftest import ALL_DTYPES, as_np, empty, host, rand, run, torch, zeros


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_is_symmetric_and_peer_visible(kind, dtype):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        # An object freed where `z` is placed next (its last view dropped, so its memory is
        # reused): zeros must clear what it left.
        dirty = empty(kind, (3, 5), dtype)
        dirty[...] = host(kind, rand(me + 7, (3, 5), dtype), dtype)
        rshmem.free(dirty)
        del dirty
        gc.collect()
        z = zeros(kind, (3, 5), dtype)
        assert tuple(z.shape) == (3, 5)
        assert (as_np(z, dtype) == 0).all()
        if kind == "torch":
            assert z.dtype == getattr(torch, dtype) and z.device.type == "cpu"
        t = empty(kind, (3, 5), dtype)
        t[...] = host(kind, rand(me, (3, 5), dtype), dtype)
        rshmem.barrier()
        nxt = (me + 1) % n
        p = rshmem.peer(t, nxt)
        assert tuple(p.shape) == (3, 5)
        got = as_np(p, dtype)
        rshmem.barrier()
        return (got == as_np(host(kind, rand(nxt, (3, 5), dtype), dtype), dtype)).all()

    assert all(run(3, f))


def test_peer_writes_reach_the_owner(kind):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        t = zeros(kind, 8, "int32")
        rshmem.peer(t, (me + 1) % n)[me] = 100 + me
        rshmem.barrier()
        return as_np(t, "int32").tolist()

    out = run(4, f)
    for me, row in enumerate(out):
        prev = (me - 1) % 4
        assert row == [100 + prev if i == prev else 0 for i in range(8)]


def test_peer_bad_inputs(kind):
    def f():
        t = zeros(kind, 4, "float32")
        for bad in (2, -1, "0", 1.0):
            with pytest.raises(rshmem.InvalidArgument):
                rshmem.peer(t, bad)
        with pytest.raises(rshmem.InvalidArgument, match="not on the symmetric heap"):
            rshmem.peer(host(kind, [1, 2], "float32"), 0)
        rshmem.barrier()
        return True

    assert all(run(2, f))


def test_shapes_that_differ_across_pes_raise_everywhere():
    def f():
        me = rshmem.my_pe()
        with pytest.raises(rshmem.CollectiveMismatch):
            rshmem.numpy.empty((2, 3) if me == 0 else (3, 2), np.float32)
        with pytest.raises(rshmem.CollectiveMismatch):
            rshmem.numpy.empty(4, np.float32 if me == 0 else np.int32)
        with pytest.raises(rshmem.CollectiveMismatch):
            rshmem.numpy.empty(4 + me)
        # The world is still in step.
        t = rshmem.numpy.zeros(4, np.int64)
        rshmem.put(t[me:me + 1], np.array([me + 7]), 0)
        rshmem.barrier()
        return t.tolist() if me == 0 else None

    assert run(2, f)[0] == [7, 8, 0, 0]


def test_bad_allocation_arguments():
    def f():
        for shape, dtype in (((-1,), np.float32), (("a",), np.float32), ((2,), np.complex64),
                             ((2,), "bool"), ((2,), object)):
            with pytest.raises(rshmem.InvalidArgument):
                rshmem.numpy.empty(shape, dtype)
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.empty(4, device="cuda:0")
        with pytest.raises(rshmem.HeapExhausted):
            rshmem.numpy.empty(1 << 40, np.uint8)
        rshmem.barrier()
        return True

    assert all(run(2, f))


def test_free_is_checked_and_safe():
    def f():
        me = rshmem.my_pe()
        base = rshmem.heap_usage()[1]
        a = rshmem.numpy.zeros(1024, np.uint8)
        b = rshmem.numpy.zeros(1024, np.uint8)
        # Different tensors on different PEs: a mismatch on every PE, nothing freed.
        with pytest.raises(rshmem.CollectiveMismatch):
            rshmem.free(a if me == 0 else b)
        held = [rshmem.heap_usage()[1] - base]
        # A view is not the allocation; a plain array is not symmetric.
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.free(a[8:])
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.free(np.zeros(4))
        view = a[16:32]
        addr = view.__array_interface__["data"][0]
        rshmem.free(a)
        # Used after free: refused by every call, never written through.
        with pytest.raises(rshmem.InvalidArgument, match="freed"):
            rshmem.put(view, np.ones(16, np.uint8), (me + 1) % 2)
        with pytest.raises(rshmem.InvalidArgument, match="freed"):
            rshmem.peer(view, 0)
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.free(a)
        # While the view lives its memory is not handed out again.
        c = rshmem.numpy.zeros(1024, np.uint8)
        lo = c.__array_interface__["data"][0]
        assert not lo <= addr < lo + 1024
        del a, view
        gc.collect()
        rshmem.free(c)
        rshmem.free(b)
        d = rshmem.numpy.zeros(4096, np.uint8)  # the released blocks are reclaimed here
        held.append(rshmem.heap_usage()[1] - base)
        rshmem.free(d)
        del b, c, d
        gc.collect()
        e = rshmem.numpy.zeros(1024, np.uint8)  # b, c and d reclaimed here
        held.append(rshmem.heap_usage()[1] - base)
        rshmem.free(e)
        return held

    # In use: a and b after the refused free; then d, and b and c (freed, their arrays still
    # live) but not a (its array and view deleted); at last e alone.
    assert run(2, f) == [[2048, 4096 + 2048, 1024]] * 2


def test_views_outlive_finalize_without_crash():
    def f():
        t = rshmem.numpy.zeros(16, np.int64)
        t[:] = rshmem.my_pe() + 1
        return t  # still referenced after the PE finalized

    out = run(2, f)
    assert [int(x.sum()) for x in out] == [16, 32]
    with pytest.raises(rshmem.WorldEnded):
        rshmem.numpy.empty(1)
    del out
