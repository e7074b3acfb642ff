"""The native entry points (``rshmem.put``, ``get``, ``put_signal``, ``wait_until``,
``barrier``, ``quiet``, ``fence``, ``all_reduce``): plain operands served natively with exact
data, everything else handed to the checked path with the same arguments (same results, same
errors), and the calling thread's PE found natively."""

import threading

import numpy as np
import pytest

import rshmem
from conftest import as_np, host, rand, run, torch, zeros


@pytest.mark.parametrize("sig_dtype", ["uint64", "int64"])
def test_put_signal_values_ops_and_wraps(kind, sig_dtype):
    def f():
        me = rshmem.my_pe()
        data = zeros(kind, 8, "int32")
        sig = zeros(kind, 3, sig_dtype)
        rshmem.barrier()
        if me == 0:
            src = host(kind, rand(7, 8, "int32"), "int32")
            rshmem.put_signal(data, src, sig[0:1], 5, 1)
            rshmem.put_signal(data[:4], src[:4], sig[1:2], 2, 1, op="add")
            rshmem.put_signal(data[:4], src[:4], sig[1:2], np.int64(3), 1, op="add")
            rshmem.put_signal(data[4:], src[4:], sig[2:3], -1, 1)  # wraps to all ones
        rshmem.barrier()
        got = (as_np(data, "int32").tolist(), as_np(sig, sig_dtype).tolist())
        rshmem.barrier()
        return got

    out = run(2, f)
    ones = 2**64 - 1 if sig_dtype == "uint64" else -1
    assert out[1] == (rand(7, 8, "int32").astype(int).tolist(), [5, 5, ones])
    assert out[0] == ([0] * 8, [0, 0, 0])


def test_put_signal_bad_arguments_raise(kind):
    def f():
        data = zeros(kind, 8, "int32")
        sig = zeros(kind, 2, "uint64")
        src = host(kind, np.zeros(8), "int32")
        cases = [
            lambda: rshmem.put_signal(data, src, zeros(kind, 2, "int32"), 1, 0),  # signal type
            lambda: rshmem.put_signal(data, src, host(kind, np.zeros(2), "uint64"), 1, 0),
            lambda: rshmem.put_signal(data, src, sig, 1, 0, op="xor"),
            lambda: rshmem.put_signal(data, src, sig, 1, 2),                      # PE
            lambda: rshmem.put_signal(data, src[:4], sig, 1, 0),                  # sizes
        ]
        for c in cases:
            with pytest.raises(rshmem.InvalidArgument):
                c()
        rshmem.barrier()
        return as_np(sig, "uint64").tolist()

    assert run(2, f) == [[0, 0], [0, 0]]


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64", "uint64"])
def test_wait_until_types_values_and_timeouts(kind, dtype):
    def f():
        w = zeros(kind, 2, dtype)
        w[...] = host(kind, np.array([7, 0]), dtype)
        assert rshmem.wait_until(w, ">=", 7) == 7
        assert rshmem.wait_until(w[1:], "eq", 0, timeout=1) == 0
        assert rshmem.wait_until(w, "<", np.int64(8), timeout=0.5) == 7
        big = 2**40 if dtype.endswith("32") else 2**70
        for bad in (lambda: rshmem.wait_until(w, "==", big),
                    lambda: rshmem.wait_until(w, "==", -1 if dtype.startswith("u") else big),
                    lambda: rshmem.wait_until(w, "=>", 7),
                    lambda: rshmem.wait_until(w, 5, 7),
                    lambda: rshmem.wait_until(w, "==", 7, timeout=-1.0),
                    lambda: rshmem.wait_until(w[:0], "==", 7)):
            with pytest.raises(rshmem.InvalidArgument):
                bad()
        with pytest.raises(rshmem.Timeout):
            rshmem.wait_until(w, "==", 8, timeout=0.05)
        rshmem.barrier()
        return True

    assert all(run(2, f))


def test_barrier_quiet_fence_and_all_reduce_arguments(kind):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        rshmem.barrier(None, False, None)
        rshmem.quiet()
        rshmem.fence()
        x = zeros(kind, 5, "int64")
        x[...] = host(kind, np.arange(5) + me, "int64")
        rshmem.all_reduce(x)
        y = zeros(kind, 5, "int64")
        y[...] = host(kind, np.arange(5) * (me + 1), "int64")
        rshmem.all_reduce(y, "MAX")  # another spelling: the checked path's
        z = zeros(kind, 5, "int64")
        z[...] = host(kind, np.arange(5) - me, "int64")
        rshmem.all_reduce(z, rshmem.ReduceOp.MIN)
        out = zeros(kind, 5, "int64")
        rshmem.all_reduce(z, "sum", out=out)
        for bad in (lambda: rshmem.barrier(group=object()),
                    lambda: rshmem.barrier(async_op=True),
                    lambda: rshmem.all_reduce(x, group=object()),
                    lambda: rshmem.all_reduce(x, async_op=True),
                    lambda: rshmem.all_reduce(x, "avg"),
                    lambda: rshmem.all_reduce(host(kind, np.zeros(5), "int64"))):
            with pytest.raises(rshmem.InvalidArgument):
                bad()
        got = [as_np(a, "int64").tolist() for a in (x, y, z, out)]
        rshmem.barrier()
        return got, n

    for got, n in run(3, f):
        r = np.arange(5)
        assert got == [(n * r + sum(range(n))).tolist(), (r * n).tolist(),
                       (r - (n - 1)).tolist(), (n * (r - (n - 1))).tolist()]


def test_read_only_array_is_not_reduced_into():
    def f():
        x = rshmem.numpy.zeros(4, np.float32)
        v = x.view()
        v.flags.writeable = False
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.all_reduce(v)
        rshmem.barrier()
        return True

    assert all(run(2, f))


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_numpy_and_torch_operands_mix():
    def f():
        me = rshmem.my_pe()
        s = rshmem.zeros(6, torch.float32)
        rshmem.barrier()
        rshmem.put(s, np.arange(6, dtype=np.float32) + 10 * me, (me + 1) % 2)
        rshmem.barrier()
        got = np.zeros(6, np.float32)
        rshmem.get(got, s, me)
        rshmem.barrier()
        return got.tolist()

    out = run(2, f)
    assert out == [(np.arange(6) + 10).tolist(), np.arange(6).tolist()]


def test_calls_find_the_calling_threads_pe():
    def f():
        me = rshmem.my_pe()
        s = rshmem.numpy.zeros(1, np.int64)
        seen = []

        def helper():  # a thread of a PE's own is not a PE
            try:
                rshmem.put(s, np.ones(1, np.int64), 0)
            except rshmem.WorldEnded as e:
                seen.append(type(e).__name__)

        t = threading.Thread(target=helper)
        t.start()
        t.join()
        rshmem.put(s, np.full(1, me + 1, np.int64), me)
        rshmem.barrier()
        return seen, int(s[0])

    assert run(2, f) == [(["WorldEnded"], 1), (["WorldEnded"], 2)]
    for call in (lambda: rshmem.put(np.zeros(1), np.zeros(1), 0), rshmem.barrier, rshmem.fence,
                 lambda: rshmem.wait_until(np.zeros(1, np.int64), "==", 0),
                 lambda: rshmem.all_reduce(np.zeros(1))):
        with pytest.raises(rshmem.WorldEnded):
            call()


def test_entry_points_are_documented():
    for f in (rshmem.put, rshmem.get, rshmem.put_signal, rshmem.wait_until, rshmem.barrier,
              rshmem.quiet, rshmem.fence, rshmem.all_reduce):
        assert f.__doc__ and len(f.__doc__) > 40, f
    assert "stream" in rshmem.put.__text_signature__
