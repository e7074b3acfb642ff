"""One rank of torch.distributed's "rshmem" backend (tests/test_dist.py starts two, under
torchrun or with an explicit store). Every served call on ordinary and symmetric tensors against
exact expected values built from every rank's seeded inputs (and, on CPU tensors, against a gloo
group over the same ranks), in and out of place, several sizes (one grows the staging buffer),
async_op, a captured CUDA graph (GPU), and bad inputs. Prints "OK rank R" at the end.

    dist_worker.py cpu|cuda          under torchrun --nproc-per-node 2
    dist_worker.py mixed|mixed-cuda  "cpu:gloo,cuda:rshmem" under torchrun (mixed-cuda: with
                                     the CUDA half, which needs a GPU)
    dist_worker.py store RANK PORT   explicit rank, world size and TCPStore (CPU)
"""

import os
import sys
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import rshmem
from rshmem.dist import Options

DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
          torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Where gloo runs the same reduction (to compare against).
GLOO = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32,
        torch.float64)
TIMEOUT = timedelta(seconds=30)
BAD = []
T0 = time.monotonic()


def progress(what):
    """A line per phase: where a slow run (a first kernel compile) spends its time."""
    print(f"rank {os.environ.get('RANK', sys.argv[2] if len(sys.argv) > 2 else '?')}: {what} "
          f"at {time.monotonic() - T0:.1f} s", flush=True)


def gen(seed, shape, dtype):
    """Random small integers, exact in every dtype (unsigned types non-negative)."""
    g = torch.Generator().manual_seed(seed)
    lo = 0 if "uint" in str(dtype) else -4
    return torch.randint(lo, 5, shape, generator=g).to(dtype)


def seed(*key):
    """A seed every process derives alike (``hash`` of a string differs between processes)."""
    return zlib.crc32(repr(key).encode())


def inputs(tag, shape, dtype, n):
    """Every rank's input of one call (rank r's is the r-th)."""
    return [gen(seed(tag, r, str(dtype), tuple(shape)), shape, dtype) for r in range(n)]


def same(got, want):
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype in FLOATS:  # by value (-0.0 == 0.0)
        return torch.equal(got.double(), want.double())
    return torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def check(name, got, want):
    if not same(got, want):
        BAD.append(name)
        if len(BAD) < 6:
            print(f"MISMATCH {name}: got {got.flatten()[:8].tolist()} want "
                  f"{want.flatten()[:8].tolist()}", flush=True)


def fold(xs, op, dtype):
    """The reduction of every rank's tensor, computed wide and converted back."""
    wide = torch.float64 if dtype in FLOATS else torch.int64
    acc = xs[0].to(wide)
    for x in xs[1:]:
        x = x.to(wide)
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc = acc + x
        elif op == ReduceOp.PRODUCT:
            acc = acc * x
        elif op == ReduceOp.MIN:
            acc = torch.minimum(acc, x)
        elif op == ReduceOp.MAX:
            acc = torch.maximum(acc, x)
        elif op == ReduceOp.BAND:
            acc = acc & x
        elif op == ReduceOp.BOR:
            acc = acc | x
        else:
            acc = acc ^ x
    if op == ReduceOp.AVG:
        acc = acc / len(xs)
    return acc.to(dtype)


def ops_of(dtype):
    if dtype in FLOATS:
        return [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]
    return [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
            ReduceOp.BOR, ReduceOp.BXOR]


def make(kind, x, dev):
    """``x`` on ``dev``: an ordinary tensor, or a symmetric one (rshmem.empty)."""
    if kind == "plain":
        return x.to(dev, copy=True)
    t = rshmem.empty(tuple(x.shape), x.dtype)
    t.copy_(x.to(dev))
    return t


def poison(shape, dtype, dev):
    # Filled on the host: CUDA lacks most kernels for uint16/32/64 (copies work).
    return torch.full(shape, 7, dtype=dtype).to(dev)


def reductions(dev, dtype, count, kind, gloo):
    me, n = dist.get_rank(), dist.get_world_size()
    tag = f"{count}{kind}"
    for op in ops_of(dtype):
        xs = inputs(("ar", tag, str(op)), (count,), dtype, n)
        t = make(kind, xs[me], dev)
        dist.all_reduce(t, op)
        check(f"all_reduce {op} {dtype} {count} {kind}", t, fold(xs, op, dtype))
        if gloo is not None and dtype in GLOO and op != ReduceOp.AVG:
            g = xs[me].clone()
            dist.all_reduce(g, op, group=gloo)
            check(f"all_reduce vs gloo {op} {dtype} {count}", t, g)
    for root in range(n):
        xs = inputs(("reduce", tag, root), (count,), dtype, n)
        t = make(kind, xs[me], dev)
        dist.reduce(t, dst=root, op=ReduceOp.MAX)
        want = fold(xs, ReduceOp.MAX, dtype) if me == root else xs[me]
        if me == root or kind == "plain":  # a symmetric tensor off the root is scratch
            check(f"reduce root {root} {dtype} {count} {kind}", t, want)
    # reduce_scatter_tensor: out of place, in place, and the list form.
    for op in (ReduceOp.SUM, ReduceOp.MIN):
        xs = inputs(("rs", tag, str(op)), (n * count,), dtype, n)
        want = fold(xs, op, dtype)[me * count:(me + 1) * count]
        inp = make(kind, xs[me], dev)
        out = make(kind, poison((count,), dtype, "cpu"), dev)
        dist.reduce_scatter_tensor(out, inp, op)
        check(f"reduce_scatter_tensor {op} {dtype} {count} {kind}", out, want)
        if gloo is not None and dtype in GLOO and kind == "plain" and dev.type == "cpu":
            g = poison((count,), dtype, "cpu")
            try:
                dist.reduce_scatter_tensor(g, xs[me].clone(), op, group=gloo)
                check(f"reduce_scatter_tensor vs gloo {op} {dtype}", out, g)
            except (RuntimeError, ValueError, NotImplementedError):
                pass  # gloo lacks it for this dtype or op (on every rank alike)
        inp = make(kind, xs[me], dev)
        dist.reduce_scatter_tensor(inp[me * count:(me + 1) * count], inp, op)  # in place
        check(f"reduce_scatter_tensor in place {op} {dtype} {count} {kind}",
              inp[me * count:(me + 1) * count], want)
    xs = inputs(("rsl", tag), (n * count,), dtype, n)
    out = poison((count,), dtype, dev)
    dist.reduce_scatter(out, [xs[me][i * count:(i + 1) * count].to(dev) for i in range(n)])
    check(f"reduce_scatter list {dtype} {count}", out,
          fold(xs, ReduceOp.SUM, dtype)[me * count:(me + 1) * count])


def movement(dev, dtype, count, kind, gloo):
    me, n = dist.get_rank(), dist.get_world_size()
    tag = f"{count}{kind}"
    xs = inputs(("ag", tag), (count,), dtype, n)
    want = torch.cat(xs)
    out = make(kind, poison((n * count,), dtype, "cpu"), dev)
    dist.all_gather_into_tensor(out, make(kind, xs[me], dev))
    check(f"all_gather_into_tensor {dtype} {count} {kind}", out, want)
    out = make(kind, poison((n * count,), dtype, "cpu"), dev)
    out[me * count:(me + 1) * count].copy_(xs[me].to(dev))
    dist.all_gather_into_tensor(out, out[me * count:(me + 1) * count])  # in place
    check(f"all_gather_into_tensor in place {dtype} {count} {kind}", out, want)
    if kind == "plain":
        outs = [poison((count,), dtype, dev) for _ in range(n)]
        dist.all_gather(outs, xs[me].to(dev))
        check(f"all_gather list {dtype} {count}", torch.cat([o.cpu() for o in outs]), want)
        if gloo is not None and dtype in GLOO:
            g = [poison((count,), dtype, "cpu") for _ in range(n)]
            dist.all_gather(g, xs[me].clone(), group=gloo)
            check(f"all_gather vs gloo {dtype} {count}", torch.cat(g), want)
    for root in range(n):
        xs = inputs(("bc", tag, root), (count,), dtype, n)
        t = make(kind, xs[me], dev)
        dist.broadcast(t, src=root)
        check(f"broadcast root {root} {dtype} {count} {kind}", t, xs[root])
    # all_to_all_single: equal parts, then uneven split sizes (rows of 3 elements).
    xs = inputs(("a2a", tag), (n * count,), dtype, n)
    out = make(kind, poison((n * count,), dtype, "cpu"), dev)
    dist.all_to_all_single(out, make(kind, xs[me], dev))
    check(f"all_to_all_single {dtype} {count} {kind}", out,
          torch.cat([xs[p][me * count:(me + 1) * count] for p in range(n)]))
    rows = [[(p + q + count) % 3 + (count > 1000) * 700 for q in range(n)] for p in range(n)]
    xs = [gen(seed("a2av", tag, p, str(dtype)), (sum(rows[p]), 3), dtype) for p in range(n)]
    outs_rows = [rows[p][me] for p in range(n)]
    parts = [xs[p][sum(rows[p][:me]):sum(rows[p][:me + 1])] for p in range(n)]
    # Symmetric operands are the same objects on every rank: slices of equal tensors.
    most = max(max(sum(r) for r in rows), max(sum(r[q] for r in rows) for q in range(n)))
    out = make(kind, poison((most, 3), dtype, "cpu"), dev)[:sum(outs_rows)]
    inp = make(kind, torch.cat([xs[me], poison((most - len(xs[me]), 3), dtype, "cpu")]), dev)
    dist.all_to_all_single(out, inp[:len(xs[me])], outs_rows, rows[me])
    check(f"all_to_all_single splits {dtype} {count} {kind}", out, torch.cat(parts))
    if kind == "plain":
        outs = [poison((rows[p][me], 3), dtype, dev) for p in range(n)]
        ins = [xs[me][sum(rows[me][:q]):sum(rows[me][:q + 1])].to(dev) for q in range(n)]
        dist.all_to_all(outs, ins)
        check(f"all_to_all list {dtype} {count}", torch.cat([o.cpu() for o in outs]),
              torch.cat(parts))


def asynchronous(dev):
    me, n = dist.get_rank(), dist.get_world_size()
    xs = inputs("async", (1000,), torch.float32, n)
    t = xs[me].to(dev, copy=True)
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            w = dist.all_reduce(t, async_op=True)
        w.wait()  # the current stream waits for the side stream's call
        got = t * 1
    else:
        w = dist.all_reduce(t, async_op=True)
        assert w.is_completed()
        w.wait()
        got = t
    check("all_reduce async_op", got, fold(xs, ReduceOp.SUM, torch.float32))
    out = torch.empty(n * 1000, device=dev)
    w = dist.all_gather_into_tensor(out, xs[me].to(dev), async_op=True)
    w.wait()
    check("all_gather_into_tensor async_op", out, torch.cat(xs))
    if w.get_future().wait()[0].data_ptr() != out.data_ptr():
        BAD.append("async work's future holds another tensor")
    dist.barrier(async_op=True).wait()


def graph(dev):
    """dist calls captured into a CUDA graph and replayed on new inputs."""
    me, n = dist.get_rank(), dist.get_world_size()
    x = torch.zeros(4096, device=dev)
    out = torch.zeros(n * 4096, device=dev)
    dist.all_reduce(x)  # warm up (the staging buffer and kernels exist before capture)
    dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)
    for i in range(3):
        xs = inputs(("graph", i), (4096,), torch.float32, n)
        x.copy_(xs[me].to(dev))
        g.replay()
        torch.cuda.synchronize()
        red = fold(xs, ReduceOp.SUM, torch.float32)
        check(f"graph replay {i} all_reduce", x, red)
        check(f"graph replay {i} all_gather", out, torch.cat([red] * n))
    rshmem.check_errors()


def functional(dev):
    """torch's functional collectives reach the group through C++ (its Python trampoline)."""
    import torch.distributed._functional_collectives as fc

    me, n = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    xs = inputs("fc", (64,), torch.float32, n)
    x = xs[me].to(dev)
    check("functional all_reduce", fc.all_reduce(x, "sum", world),
          fold(xs, ReduceOp.SUM, torch.float32))
    check("functional all_gather_tensor", fc.all_gather_tensor(x, 0, world), torch.cat(xs))
    check("functional reduce_scatter_tensor", fc.reduce_scatter_tensor(x, "max", 0, world),
          fold(xs, ReduceOp.MAX, torch.float32)[me * 64 // n:(me + 1) * 64 // n])
    check("functional all_to_all_single", fc.all_to_all_single(x, None, None, world),
          torch.cat([xs[p][me * 64 // n:(me + 1) * 64 // n] for p in range(n)]))
    check("original untouched", x, xs[me])


def expect_error(name, fn, exc=Exception):
    try:
        fn()
    except exc as e:
        return e
    BAD.append(f"{name}: no error")
    return None


def bad_inputs(dev):
    """Wrong arguments raise on every rank (each rank passes the same ones), and arguments that
    differ across ranks end in an error on every rank."""
    me, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(8, device=dev)
    other = torch.ones(8, device="cpu") if dev.type == "cuda" else (
        torch.ones(8, device="cuda") if torch.cuda.is_available() else None)
    if other is not None:
        expect_error("tensor of the other device", lambda: dist.all_reduce(other),
                     rshmem.InvalidArgument)
    expect_error("all_gather_into_tensor output size",
                 lambda: dist.all_gather_into_tensor(torch.ones(3, device=dev), t),
                 rshmem.InvalidArgument)
    expect_error("all_to_all_single splits",
                 lambda: dist.all_to_all_single(t, t, [4, 4], [3, 3]), rshmem.InvalidArgument)
    expect_error("AVG on integers",
                 lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32, device=dev),
                                         ReduceOp.AVG), rshmem.InvalidArgument)
    expect_error("bitwise on floats", lambda: dist.all_reduce(t, ReduceOp.BAND))
    expect_error("bool reduction",
                 lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool, device=dev)),
                 rshmem.InvalidArgument)
    expect_error("PREMUL_SUM", lambda: dist.all_reduce(t, dist._make_nccl_premul_sum(2.0)),
                 NotImplementedError)
    expect_error("send", lambda: dist.send(t, (me + 1) % n), NotImplementedError)
    expect_error("gather", lambda: dist.gather(
        t, [torch.empty_like(t) for _ in range(n)] if me == 0 else None, dst=0),
        NotImplementedError)
    sub = dist.new_group([0])
    if me == 0:
        expect_error("subgroup", lambda: dist.all_reduce(t, group=sub), NotImplementedError)
    # Arguments that differ across ranks (sizes): an rshmem error on every rank, and the group
    # still works afterwards.
    dist.barrier()
    bad = torch.ones(10 + 2 * me, device=dev)
    if dev.type == "cpu":
        expect_error("sizes differ across ranks", lambda: dist.all_reduce(bad), rshmem.Error)
    else:
        # GPU calls compare their signatures on the device: the barrier's wait raises.
        dist.all_reduce(bad)
        expect_error("sizes differ across ranks (GPU)", lambda: dist.barrier(), rshmem.Error)
    # Sizes whose staging buffers would differ: CollectiveMismatch on every rank.
    big = torch.ones((3 << 20) if me == 0 else (5 << 20), device=dev)
    e = expect_error("staging sizes differ across ranks", lambda: dist.all_reduce(big),
                     rshmem.CollectiveMismatch)
    if e is not None and "disagree on the size" not in str(e):
        BAD.append(f"staging mismatch message: {e}")


def served(dev, gloo, counts, big_dtypes):
    for dtype in DTYPES:
        for count in counts:
            reductions(dev, dtype, count, "plain", gloo)
            movement(dev, dtype, count, "plain", gloo)
    for dtype in big_dtypes:  # sizes that grow the staging buffers
        reductions(dev, dtype, 300_001, "plain", gloo)
        movement(dev, dtype, 300_001, "plain", gloo)
    for dtype in (torch.int64, torch.bfloat16, torch.float32):
        reductions(dev, dtype, 37, "sym", None)
        movement(dev, dtype, 37, "sym", None)
    # Dtypes rshmem does not reduce still move (as bytes); objects go through them.
    me, n = dist.get_rank(), dist.get_world_size()
    grid = torch.zeros(8, 4, device=dev)
    col = grid[:, 1]  # not contiguous: staged through copies that follow its strides
    col.copy_(torch.arange(8.0, device=dev) * (me + 1))
    dist.all_reduce(col)
    want = torch.zeros(8, 4)
    want[:, 1] = torch.arange(8.0) * (n * (n + 1) // 2)
    check("all_reduce of a strided view", grid, want)
    flags = torch.tensor([True, me == 0, False], device=dev)
    dist.broadcast(flags, src=1)
    check("broadcast bool", flags, torch.tensor([True, False, False]))
    c = torch.full((3,), complex(me, -me), device=dev)
    dist.all_reduce(c)
    check("all_reduce complex64", torch.view_as_real(c),
          torch.view_as_real(torch.full((3,), complex(sum(range(n)), -sum(range(n))))))
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me})
    if objs != [{"rank": r} for r in range(n)]:
        BAD.append(f"all_gather_object {objs}")


def torchrun_main(mode):
    opts = Options(backend="shm" if mode == "cpu" else "cuda", heap_size=256 << 20)
    dist.init_process_group("rshmem", timeout=TIMEOUT, pg_options=opts)
    progress("group started")
    me, n = dist.get_rank(), dist.get_world_size()
    assert (rshmem.my_pe(), rshmem.n_pes()) == (me, n) and dist.get_backend() == "rshmem"
    dev = torch.device("cpu") if mode == "cpu" else torch.device("cuda", rshmem.device())
    gloo = dist.new_group(backend="gloo") if mode == "cpu" else None
    # One device (torch picks the device of object collectives from these).
    types = [d.type for d in dist.group.WORLD._device_types]
    if types != [dev.type]:
        BAD.append(f"device types {types}")
    whole = dist.new_group()  # every rank in order: served by the same world
    t = torch.full((5,), float(me + 1), device=dev)
    dist.all_reduce(t, group=whole)
    check("whole-world new_group", t, torch.full((5,), float(n * (n + 1) // 2)))
    progress("first all_reduce done")
    # Two ranks sharing one GPU take turns on it: fewer sizes there keep the run short.
    if mode == "cpu":
        served(dev, gloo, (1, 37), (torch.int8, torch.bfloat16, torch.float32, torch.uint64))
    else:
        served(dev, gloo, (37,), (torch.bfloat16, torch.uint64))
    progress("every call, dtype and size done")
    asynchronous(dev)
    functional(dev)
    if dev.type == "cuda":
        graph(dev)
    progress("async, functional and graph done")
    dist.barrier()
    bad_inputs(dev)
    dist.barrier()
    progress("bad inputs done")
    if dev.type == "cuda":
        torch.cuda.synchronize()
        rshmem.check_errors()
    dist.destroy_process_group()
    assert not rshmem.is_initialized()
    if mode == "cuda":
        # Again, bound to the GPU (device_id) and with a world the process started itself.
        rshmem.init(backend="cuda", heap_size=64 << 20, timeout=30.0)
        dist.init_process_group("rshmem", device_id=dev, timeout=TIMEOUT)
        t = torch.full((1000,), float(me), device=dev)
        dist.all_reduce(t)
        check("device_id group", t, torch.full((1000,), float(sum(range(n)))))
        dist.destroy_process_group()
        assert rshmem.is_initialized()  # the process's own world outlives the group
        rshmem.finalize()
        progress("device_id group done")


def mixed_main(mode):
    """init_process_group("cpu:gloo,cuda:rshmem"): CPU tensors go to gloo (also the calls only
    gloo serves: send/recv, gather, scatter), CUDA tensors to rshmem; object collectives on the
    CPU; a subgroup's CPU calls to gloo; rshmem's world ends with the group."""
    dist.init_process_group("cpu:gloo,cuda:rshmem", timeout=TIMEOUT)
    progress("mixed group started")
    me, n = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    if dist.get_backend_config() != "cpu:gloo,cuda:rshmem":
        BAD.append(f"backend config {dist.get_backend_config()}")
    assert rshmem.is_initialized() and (rshmem.my_pe(), rshmem.n_pes()) == (me, n)
    cpu = torch.device("cpu")
    for dtype in (torch.int32, torch.int64, torch.float32):
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            xs = inputs(("mixed ar", str(op)), (37,), dtype, n)
            t = xs[me].clone()
            dist.all_reduce(t, op)
            check(f"cpu all_reduce {op} {dtype}", t, fold(xs, op, dtype))
        xs = inputs("mixed ag", (5, 3), dtype, n)
        out = poison((n * 5, 3), dtype, cpu)
        dist.all_gather_into_tensor(out, xs[me])
        check(f"cpu all_gather_into_tensor {dtype}", out, torch.cat(xs))
    if not isinstance(pg._get_backend(cpu), dist.ProcessGroupGloo):
        BAD.append(f"cpu backend {type(pg._get_backend(cpu)).__name__}")
    types = [d.type for d in pg._device_types]
    # The heap's device (a GPU wherever one is visible) is rshmem's, the CPU gloo's.
    want = ["cuda", "cpu"] if rshmem.backend() == "cuda" else ["cpu"]
    if mode == "mixed-cuda" and want != ["cuda", "cpu"]:
        BAD.append(f"mixed-cuda on the {rshmem.backend()} backend")
    if types != want:
        BAD.append(f"mixed device types {types}")
    # Calls rshmem does not serve: gloo's.
    xs = inputs("mixed p2p", (16,), torch.int64, n)
    peer = (me + 1) % n
    got = poison((16,), torch.int64, cpu)
    if me % 2 == 0:
        dist.send(xs[me], peer)
        dist.recv(got, (me - 1) % n)
    else:
        dist.recv(got, (me - 1) % n)
        dist.send(xs[me], peer)
    check("cpu send/recv", got, xs[(me - 1) % n])
    outs = [poison((16,), torch.int64, cpu) for _ in range(n)] if me == 0 else None
    dist.gather(xs[me], outs, dst=0)
    if me == 0:
        check("cpu gather", torch.stack(outs), torch.stack(xs))
    got = poison((16,), torch.int64, cpu)
    dist.scatter(got, list(xs) if me == 1 else None, src=1)
    check("cpu scatter", got, xs[me])
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me})
    if objs != [{"rank": r} for r in range(n)]:
        BAD.append(f"all_gather_object {objs}")
    sub = dist.new_group([0])
    if me == 0:
        t = torch.arange(6)
        dist.all_reduce(t, group=sub)
        check("cpu subgroup all_reduce (gloo)", t, torch.arange(6))
    progress("cpu half done")
    if mode == "mixed-cuda":
        dev = torch.device("cuda", rshmem.device())
        if pg._get_backend(dev) is not pg:
            BAD.append(f"cuda backend {type(pg._get_backend(dev)).__name__}")
        for kind in ("plain", "sym"):
            xs = inputs(("mixed cuda", kind), (1000,), torch.float32, n)
            t = make(kind, xs[me], dev)
            dist.all_reduce(t)
            check(f"cuda all_reduce {kind}", t, fold(xs, ReduceOp.SUM, torch.float32))
        t = torch.ones(8, device=dev)
        expect_error("cuda send (rshmem)", lambda: dist.send(t, (me + 1) % n),
                     NotImplementedError)
        if me == 0:
            expect_error("cuda subgroup", lambda: dist.all_reduce(t, group=sub),
                         NotImplementedError)
        dist.barrier()
        torch.cuda.synchronize()
        rshmem.check_errors()
        progress("cuda half done")
    dist.barrier()
    dist.destroy_process_group()
    assert not rshmem.is_initialized()


def store_main(rank, port):
    """Explicit rank, world size and store; a second group after the first is destroyed; a
    group over a world this process started itself."""
    n = 2
    store = dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=TIMEOUT)
    for round_ in range(2):
        dist.init_process_group("rshmem", store=store, rank=rank, world_size=n,
                                timeout=TIMEOUT, pg_options=Options(backend="shm"))
        t = torch.full((100,), float(rank + round_))
        dist.all_reduce(t)
        check(f"store round {round_}", t, torch.full((100,), float(1 + 2 * round_)))
        dist.destroy_process_group()
        assert not rshmem.is_initialized()
    if rank == 0:
        store.set("own", rshmem.unique_id())
    rshmem.init(rank=rank, world_size=n, unique_id=store.get("own").decode(), backend="shm")
    dist.init_process_group("rshmem", store=dist.PrefixStore("again", store), rank=rank,
                            world_size=n, timeout=TIMEOUT)
    x = rshmem.zeros(16, torch.int64)  # symmetric: used in place
    x.fill_(rank + 5)
    dist.all_reduce(x)
    check("own world, symmetric tensor", x, torch.full((16,), 11, dtype=torch.int64))
    dist.destroy_process_group()
    rshmem.finalize()


def main():
    mode = sys.argv[1]
    if mode == "store":
        rank, port = int(sys.argv[2]), int(sys.argv[3])
        store_main(rank, port)
    elif mode.startswith("mixed"):
        rank = int(os.environ["RANK"])
        mixed_main(mode)
    else:
        rank = int(os.environ["RANK"])
        torchrun_main(mode)
    if BAD:
        print(f"FAIL rank {rank}: {len(BAD)} failures: {BAD[:20]}", flush=True)
        sys.exit(1)
    print(f"OK rank {rank}", flush=True)


if __name__ == "__main__":
    main()
