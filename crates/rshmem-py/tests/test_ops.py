"""One-sided operations: put, get, put-with-signal, waits, atomics, fence/quiet, bad inputs."""

import numpy as np
import pytest

import rshmem
from conftest import ALL_DTYPES, as_np, empty, host, rand, run, torch, zeros


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_put_get_random_data(kind, dtype):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        nxt, prv = (me + 1) % n, (me - 1) % n
        dst = empty(kind, 64, dtype)
        dst[...] = host(kind, np.full(64, 99), dtype)  # poison
        rshmem.barrier()
        # The whole object, then a slice of it.
        rshmem.put(dst, host(kind, rand(me, 64, dtype), dtype), nxt)
        rshmem.quiet()
        rshmem.barrier()
        whole = as_np(dst, dtype)
        rshmem.barrier()
        rshmem.put(dst[10:20], host(kind, rand(100 + me, 10, dtype), dtype), nxt)
        rshmem.barrier()
        part = as_np(dst, dtype)
        # get: the previous PE's copy into a plain array.
        out = host(kind, np.full(64, 77), dtype)
        rshmem.get(out, dst, prv)
        got = as_np(out, dtype)
        rshmem.barrier()
        want = as_np(host(kind, rand(prv, 64, dtype), dtype), dtype)
        assert (whole == want).all()
        want[10:20] = as_np(host(kind, rand(100 + prv, 10, dtype), dtype), dtype)
        assert (part == want).all()
        pp = (prv - 1) % n
        want_pp = as_np(host(kind, rand(pp, 64, dtype), dtype), dtype)
        want_pp[10:20] = as_np(host(kind, rand(100 + pp, 10, dtype), dtype), dtype)
        assert (got == want_pp).all()
        return True

    assert all(run(3, f))


def test_put_signal_then_wait(kind):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        data = zeros(kind, (n, 32), "float32")
        sig = zeros(kind, n + 1, "uint64")
        # Every PE sends its row to PE 0 with signal "set" on its own word, then "add" on the
        # shared last word.
        row = host(kind, rand(me, 32, "float32"), "float32")
        rshmem.put_signal(data[me], row, sig[me:me + 1], 1 + me, 0)
        rshmem.put_signal(data[me, :0], row[:0], sig[n:], 10, 0, op="add")
        if me == 0:
            for p in range(n):
                assert rshmem.wait_until(sig[p:p + 1], "==", 1 + p) == 1 + p
            assert rshmem.wait_until(sig[n:], ">=", 10 * n) == 10 * n
            for p in range(n):
                assert (as_np(data[p], "float32") == rand(p, 32, "float32")).all()
        rshmem.barrier()
        return True

    assert all(run(4, f))


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64", "uint64"])
def test_atomics(dtype):
    def f():
        me = rshmem.my_pe()
        w = rshmem.numpy.zeros(4, dtype)
        rshmem.atomic_fetch_add(w[0:1], me + 1, 0)
        rshmem.atomic_fetch_or(w[1:2], 1 << me, 0)
        rshmem.barrier()
        r = {}
        if me == 0:
            r["sum"] = rshmem.atomic_fetch(w[0:1], 0)
            r["or"] = rshmem.atomic_fetch(w[1:2], 0)
            assert rshmem.atomic_swap(w[2:3], 9, 1) == 0
            assert rshmem.atomic_compare_swap(w[2:3], 8, 5, 1) == 9  # no swap
            assert rshmem.atomic_compare_swap(w[2:3], 9, 5, 1) == 9
            assert rshmem.atomic_fetch_and(w[2:3], 4, 1) == 5
            assert rshmem.atomic_fetch_xor(w[2:3], 7, 1) == 4
            rshmem.atomic_set(w[3:4], 42, 1)
        rshmem.barrier()
        if me == 1:
            r["w"] = w.tolist()
        return r

    out = run(3, f)
    assert out[0] == {"sum": 6, "or": 7}
    assert out[1]["w"][2:] == [3, 42]


def test_wait_until_every_comparison():
    def f():
        w = rshmem.numpy.zeros(1, np.int64)
        w[0] = -3
        # Each holds for -3 and its neighbour comparisons fail for some of them (">=" with -4,
        # "<=" with -2, ...): a comparison read as another one waits and ends in Timeout.
        for cmp, v in (("==", -3), ("!=", 0), ("!=", -4), (">", -4), (">=", -3), (">=", -4),
                       ("<", 0), ("<", -2), ("<=", -3), ("<=", -2), ("eq", -3), ("ge", -3),
                       ("ge", -4)):
            assert rshmem.wait_until(w, cmp, v) == -3
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.wait_until(w, "=~", 0)
        rshmem.barrier()
        return True

    assert all(run(2, f))


def test_bad_inputs_raise_and_leave_the_world_usable(kind):
    def f():
        me, n = rshmem.my_pe(), rshmem.n_pes()
        s = zeros(kind, 16, "float32")
        plain = host(kind, np.zeros(16), "float32")
        cases = [
            lambda: rshmem.put(s, host(kind, np.zeros(16), "float64"), 0),   # dtype
            lambda: rshmem.put(s, host(kind, np.zeros(8), "float32"), 0),    # size
            lambda: rshmem.put(plain, plain, 0),                              # not symmetric
            lambda: rshmem.put(s, plain, n),                                  # PE out of range
            lambda: rshmem.put(s, plain, -1),
            lambda: rshmem.put(s, plain, "1"),
            lambda: rshmem.get(plain, plain, 0),
            lambda: rshmem.put([1, 2], plain, 0),                             # not an array
            lambda: rshmem.wait_until(s[:1], "==", 0),                        # float word
            lambda: rshmem.atomic_fetch_add(s[:1], 1, 0),
            lambda: rshmem.put_signal(s, plain, s[:1], 1, 0),                 # float signal
            lambda: rshmem.put_signal(s, plain, zeros_u64[:0], 1, 0),         # empty signal
            lambda: rshmem.put_signal(s, plain, zeros_u64, 1, 0, op="mul"),
        ]
        if kind == "torch":
            cases += [
                lambda: rshmem.put(s.view(4, 4).t(), plain.view(4, 4), 0),    # non-contiguous
                lambda: rshmem.put(s[:2], torch.zeros(2, dtype=torch.bool), 0),
            ]
        else:
            cases += [
                lambda: rshmem.put(s.reshape(4, 4).T, plain.reshape(4, 4), 0),
                lambda: rshmem.get(np.zeros(16, np.float32)[::1].copy().reshape(4, 4).T,
                                   s.reshape(4, 4), 0),
            ]
            ro = np.zeros(16, np.float32)
            ro.flags.writeable = False
            cases.append(lambda: rshmem.get(ro, s, 0))
            # Same byte counts, element types rshmem does not have.
            cases.append(lambda: rshmem.put(s, np.zeros(64, np.bool_), 0))
            cases.append(lambda: rshmem.put(s, np.zeros(8, np.complex64), 0))
            cases.append(lambda: rshmem.get(np.zeros(8, np.complex64), s, 0))
            cases.append(lambda: rshmem.put(s, np.zeros(16, ">f4"), 0))     # byte-swapped
        for i, c in enumerate(cases):
            with pytest.raises(rshmem.InvalidArgument):
                c()
        s[...] = host(kind, np.full(16, 5), "float32")
        rshmem.barrier()
        rshmem.put(s, host(kind, np.full(16, me), "float32"), (me + 1) % n)
        rshmem.barrier()
        return as_np(s, "float32").tolist()

    zeros_u64 = None

    def g():
        nonlocal zeros_u64
        zeros_u64 = zeros(kind, 2, "uint64")
        return f()

    out = run(2, g)
    assert out == [[1.0] * 16, [0.0] * 16]


def test_fence_and_quiet_order_puts():
    def f():
        me = rshmem.my_pe()
        d = rshmem.numpy.zeros(1000, np.int64)
        flag = rshmem.numpy.zeros(1, np.uint64)
        if me == 0:
            for i in range(1000):
                rshmem.put(d[i:i + 1], np.array([i * 3]), 1)
            rshmem.fence()
            rshmem.quiet()
            rshmem.atomic_set(flag, 1, 1)
        else:
            rshmem.wait_until(flag, "==", 1)
            assert (d == np.arange(1000) * 3).all()
        rshmem.barrier()
        return True

    assert all(run(2, f))
