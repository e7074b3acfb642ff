"""Collectives with torch.distributed's signatures: data against references computed from
every PE's regenerated inputs, in and out of place, and bad inputs."""

import numpy as np
import pytest

import rshmem
from conftest import ALL_DTYPES, INT_DTYPES, as_np, empty, host, rand, run

N = 4


def fold(vals, op, dtype):
    """The PE-order fold of ``vals`` (float64/int64 arrays) as rshmem defines it."""
    acc = vals[0].copy()
    for v in vals[1:]:
        if op == "sum":
            acc = acc + v
        elif op == "prod":
            acc = acc * v
        elif op == "min":
            acc = np.minimum(acc, v)
        elif op == "max":
            acc = np.maximum(acc, v)
        elif op == "band":
            acc = acc & v
        elif op == "bor":
            acc = acc | v
        elif op == "bxor":
            acc = acc ^ v
    if dtype in INT_DTYPES:  # integers wrap
        bits = 8 * np.dtype(dtype).itemsize
        acc = acc.astype(np.int64) & ((1 << bits) - 1) if bits < 64 else acc
        if dtype.startswith("int") and bits < 64:
            acc = np.where(acc >= 1 << (bits - 1), acc - (1 << bits), acc)
    return acc


def filled(kind, shape, dtype, seed):
    t = empty(kind, shape, dtype)
    t[...] = host(kind, rand(seed, shape, dtype, -4, 5), dtype)
    return t


def inputs(shape, dtype, base):
    return [rand(base + p, shape, dtype, -4, 5) for p in range(N)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_all_reduce_every_op(kind, dtype):
    ops = ["sum", "prod", "min", "max"] + (["band", "bor", "bxor"] if dtype in INT_DTYPES else [])

    def f():
        me = rshmem.my_pe()
        res = {}
        for i, op in enumerate(ops):
            t = filled(kind, 37, dtype, 10 * i + me)
            out = empty(kind, 37, dtype)
            out[...] = host(kind, np.full(37, 3), dtype)  # poison
            rshmem.all_reduce(t, op, out=out)              # out of place
            res[op, "out"] = as_np(out, dtype)
            rshmem.all_reduce(t, rshmem.ReduceOp.SUM if op == "sum" else op)  # in place
            res[op, "in"] = as_np(t, dtype)
        return res

    for res in run(N, f):
        for i, op in enumerate(ops):
            want = fold([host_vals(x, dtype) for x in inputs(37, dtype, 10 * i)], op, dtype)
            assert (res[op, "out"] == want).all(), op
            assert (res[op, "in"] == want).all(), op


def host_vals(x, dtype):
    return x.astype(np.int64) if dtype in INT_DTYPES else x


def test_bitwise_on_floats_and_unknown_ops_raise():
    def f():
        t = rshmem.numpy.zeros(4, np.float32)
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.all_reduce(t, "band")       # refused by rshmem on every PE
        for bad in ("avg", "mean", 3):
            with pytest.raises(rshmem.InvalidArgument):
                rshmem.all_reduce(t, bad)
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.all_reduce(t, group=object())
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.all_reduce(t, async_op=True)
        rshmem.barrier()
        return True

    assert all(run(2, f))


@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "float64", "uint8"])
def test_broadcast_reduce_from_every_root(kind, dtype):
    def f():
        me = rshmem.my_pe()
        got = []
        for root in range(N):
            t = filled(kind, (3, 4), dtype, 100 * root + me)
            rshmem.broadcast(t, root)
            got.append(as_np(t, dtype))
            r = filled(kind, (3, 4), dtype, 200 * root + me)
            out = empty(kind, (3, 4), dtype)
            out[...] = host(kind, np.full((3, 4), 2), dtype)
            rshmem.reduce(r, root, "max", out=out)
            got.append(as_np(out, dtype) if me == root else None)
        return got

    for me, got in enumerate(run(N, f)):
        for root in range(N):
            assert (got[2 * root] == rand(100 * root + root, (3, 4), dtype, -4, 5)).all()
            if me == root:
                want = fold(inputs((3, 4), dtype, 200 * root), "max", dtype)
                assert (got[2 * root + 1] == want).all()


@pytest.mark.parametrize("dtype", ["int64", "float16", "float32", "uint16"])
def test_all_gather_and_reduce_scatter_in_and_out_of_place(kind, dtype):
    def f():
        me = rshmem.my_pe()
        r = {}
        x = filled(kind, (2, 5), dtype, me)
        out = empty(kind, (N * 2, 5), dtype)
        out[...] = host(kind, np.full((N * 2, 5), 9), dtype)
        rshmem.all_gather_into_tensor(out, x)
        r["ag"] = as_np(out, dtype)
        buf = empty(kind, (N * 2, 5), dtype)
        buf[...] = host(kind, np.full((N * 2, 5), 9), dtype)
        buf[2 * me:2 * me + 2] = host(kind, rand(50 + me, (2, 5), dtype, -4, 5), dtype)
        rshmem.all_gather_into_tensor(buf, buf[2 * me:2 * me + 2])   # in place
        r["ag_in"] = as_np(buf, dtype)
        src = filled(kind, (N * 3,), dtype, 70 + me)
        o = empty(kind, 3, dtype)
        o[...] = host(kind, np.full(3, 9), dtype)
        rshmem.reduce_scatter_tensor(o, src)
        r["rs"] = as_np(o, dtype)
        rshmem.reduce_scatter_tensor(src[3 * me:3 * me + 3], src, "min")  # in place
        r["rs_in"] = as_np(src[3 * me:3 * me + 3], dtype)
        return r

    for me, r in enumerate(run(N, f)):
        assert (r["ag"] == np.concatenate(inputs((2, 5), dtype, 0))).all()
        assert (r["ag_in"] == np.concatenate(inputs((2, 5), dtype, 50))).all()
        full = inputs((N * 3,), dtype, 70)
        assert (r["rs"] == fold(full, "sum", dtype)[3 * me:3 * me + 3]).all()
        assert (r["rs_in"] == fold(full, "min", dtype)[3 * me:3 * me + 3]).all()


@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "float64"])
def test_all_to_all_single_equal_and_split(kind, dtype):
    # splits[p][q]: rows PE p sends to PE q.
    splits = [[(p + q) % 3 for q in range(N)] for p in range(N)]

    def f():
        me = rshmem.my_pe()
        r = {}
        x = filled(kind, (N * 2, 3), dtype, me)
        out = empty(kind, (N * 2, 3), dtype)
        out[...] = host(kind, np.full((N * 2, 3), 9), dtype)
        rshmem.all_to_all_single(out, x)
        r["eq"] = as_np(out, dtype)
        ins = splits[me]
        outs = [splits[p][me] for p in range(N)]
        # Symmetric objects have one size on every PE: the most rows, used in part.
        xs = filled(kind, (3 * N, 3), dtype, 30 + me)[: sum(ins)]
        o = empty(kind, (3 * N, 3), dtype)
        o[...] = host(kind, np.full((3 * N, 3), 9), dtype)
        rshmem.all_to_all_single(o[: sum(outs)], xs, outs, np.array(ins))
        r["v"] = as_np(o, dtype)
        return r

    for me, r in enumerate(run(N, f)):
        want = np.concatenate([inputs((N * 2, 3), dtype, 0)[p][2 * me:2 * me + 2]
                               for p in range(N)])
        assert (r["eq"] == want).all()
        parts = []
        for p in range(N):
            xp = rand(30 + p, (3 * N, 3), dtype, -4, 5)
            at = sum(splits[p][:me])
            parts.append(xp[at:at + splits[p][me]])
        got = np.concatenate(parts)
        assert (r["v"][: len(got)] == got).all()
        assert (r["v"][len(got):] == 9).all()


def test_collective_bad_inputs():
    def f():
        me = rshmem.my_pe()
        t = rshmem.numpy.zeros(8, np.float32)
        plain = np.zeros(8, np.float32)
        cases = [
            lambda: rshmem.all_reduce(plain),                                      # not symmetric
            lambda: rshmem.all_reduce(t, out=rshmem_i32),                          # dtype
            lambda: rshmem.all_reduce(t, out=t[:4]),                               # size
            lambda: rshmem.all_gather_into_tensor(t, t[:3]),                       # sizes
            lambda: rshmem.reduce_scatter_tensor(t[:3], t),
            lambda: rshmem.all_to_all_single(t, t[:6]),
            lambda: rshmem.all_to_all_single(t, t, [1, 1], [1, 1]),               # split count
            lambda: rshmem.all_to_all_single(t, t, [8, 0], [9, -1]),              # bad sums
            lambda: rshmem.broadcast(t, "0"),
        ]
        for c in cases:
            with pytest.raises(rshmem.InvalidArgument):
                c()
        # A root out of range on every PE is refused by rshmem on every PE.
        with pytest.raises(rshmem.InvalidArgument):
            rshmem.broadcast(t, 5)
        # Counts that differ across PEs: an error on every PE, no data moved.
        u = rshmem.numpy.zeros(8, np.float32)
        u[:] = me + 1
        with pytest.raises(rshmem.CollectiveMismatch) as e:
            rshmem.all_reduce(u[: 4 + me])
        assert e.value.pe == 1 - me, e.value
        assert (u == me + 1).all()
        rshmem.all_reduce(u)
        return u.tolist()

    rshmem_i32 = None

    def g():
        nonlocal rshmem_i32
        rshmem_i32 = rshmem.numpy.zeros(8, np.int32)
        return f()

    assert run(2, g) == [[3.0] * 8] * 2


def test_float_inputs_round_once(kind):
    # float16 sums accumulate in float32 and round once: 2048 + 1 + 1 = 2050 exactly,
    # where a float16 accumulator would give 2048.
    def f():
        me = rshmem.my_pe()
        t = empty(kind, 1, "float16")
        t[...] = host(kind, [2048.0 if me == 0 else 1.0], "float16")
        rshmem.all_reduce(t)
        return float(as_np(t, "float16")[0])

    assert run(3, f) == [2050.0] * 3
