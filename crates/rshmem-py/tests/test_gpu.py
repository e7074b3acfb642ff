"""The CUDA surface with torch, thread mode (one GPU per thread-PE): every operation
stream-ordered, graph capture and replay, user kernels, collectives against references,
all_to_all_single with split sizes on the GPU, MoE dispatch/combine against a reference.
Skipped without torch or without 2 GPUs (run by gpu-test.sh on the GPU machine); on a machine
of one GPU, ``RSHMEM_DEVICES=0,0`` runs them with both thread-PEs on it."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rshmem  # noqa: E402
from conftest import HEAP  # noqa: E402



def _two_pes_have_gpus() -> bool:
    """Two GPUs, or one that RSHMEM_DEVICES lets two PEs share (``0,0``: thread-PEs on one
    GPU, each on a stream of its own)."""
    if not torch.cuda.is_available():
        return False
    listed = [d for d in os.environ.get("RSHMEM_DEVICES", "").split(",") if d.strip()]
    return torch.cuda.device_count() >= 2 or len(listed) >= 2


pytestmark = pytest.mark.skipif(
    not _two_pes_have_gpus(), reason="needs torch with 2 CUDA GPUs (or RSHMEM_DEVICES=0,0)"
)
# Tests that need two distinct GPUs (a tensor on the other GPU; NCCL, which refuses two ranks
# on one GPU).
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 distinct CUDA GPUs",
)
N = 2
DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
          torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]


def run(fn, *args, n=N):
    return rshmem.launch(n, fn, *args, heap_size=max(HEAP, 512 << 20), timeout=60.0,
                         backend="cuda")


def gen(seed, shape, dtype, lo=-4, hi=5):
    g = torch.Generator().manual_seed(seed)
    if not dtype.is_floating_point and "uint" in str(dtype):
        lo = 0
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def sync():
    torch.cuda.synchronize()
    rshmem.check_errors()


@pytest.mark.parametrize("dtype", DTYPES)
def test_alloc_peer_put_get_every_dtype(dtype):
    def f():
        me = rshmem.my_pe()
        dev = torch.device("cuda", rshmem.device())
        t = rshmem.zeros((4, 8), dtype)
        assert t.device == dev and t.dtype == dtype and tuple(t.shape) == (4, 8)
        src = rshmem.empty((4, 8), dtype)
        src.copy_(gen(me, (4, 8), dtype).to(dev))
        rshmem.barrier()
        rshmem.put(t, src, 1 - me)
        rshmem.barrier()
        got = t.cpu()
        peer = rshmem.peer(t, 1 - me).cpu()
        back = rshmem.empty((4, 8), dtype)
        rshmem.get(back, src, 1 - me)
        sync()
        return got, peer, back.cpu()

    for me, (got, peer, back) in enumerate(run(f)):
        assert torch.equal(got, gen(1 - me, (4, 8), dtype))
        assert torch.equal(peer, gen(me, (4, 8), dtype))
        assert torch.equal(back, gen(1 - me, (4, 8), dtype))


def test_put_signal_wait_on_streams_and_in_graphs():
    def f():
        me = rshmem.my_pe()
        data = rshmem.zeros(1024, torch.float32)
        src = rshmem.empty(1024, torch.float32)
        sig = rshmem.zeros(2, torch.uint64)
        out = torch.zeros(1024, device=data.device)
        s = torch.cuda.Stream()
        # Eager, on a side stream.
        with torch.cuda.stream(s):
            src.fill_(me + 1)
            rshmem.put_signal(data, src, sig[0:1], 1, 1 - me)
            rshmem.wait_until(sig[0:1], "==", 1)
            out.copy_(data)
        s.synchronize()
        eager = out.clone()
        rshmem.barrier()
        # Captured once, replayed three times with new source values.
        g = torch.cuda.CUDAGraph()
        rshmem.barrier(stream=s)
        s.synchronize()
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            rshmem.put_signal(data, src, sig[1:2], 1, 1 - me, op="add")
            rshmem.wait_until(sig[1:2], ">=", 0)
            rshmem.barrier()
            out.copy_(data)
        reps = []
        # This PE's streams only: where PEs share a GPU, a device-wide synchronize would also
        # wait for the other PE's replay, whose barrier waits for this PE's.
        cur = torch.cuda.current_stream()
        for i in range(3):
            src.fill_(10 * (i + 1) + me)
            cur.synchronize()
            rshmem.barrier()
            g.replay()
            cur.synchronize()
            s.synchronize()
            reps.append(out.clone().cpu())
        sync()
        return eager.cpu(), reps, int(sig[1:2].view(torch.int64).item())

    for me, (eager, reps, count) in enumerate(run(f)):
        assert torch.equal(eager, torch.full((1024,), float(2 - me)))
        for i, r in enumerate(reps):
            assert torch.equal(r, torch.full((1024,), float(10 * (i + 1) + 1 - me)))
        assert count == 3


OPS = ["sum", "prod", "min", "max"]


def ref_fold(vals, op):
    acc = vals[0].to(torch.float64) if vals[0].is_floating_point() else vals[0].to(torch.int64)
    for v in vals[1:]:
        v = v.to(acc.dtype)
        acc = {"sum": acc + v, "prod": acc * v, "min": torch.minimum(acc, v),
               "max": torch.maximum(acc, v)}[op]
    return acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                   torch.int64, torch.float64])
def test_collectives_against_references(dtype):
    def f():
        me = rshmem.my_pe()
        dev = torch.device("cuda", rshmem.device())
        r = {}
        for i, op in enumerate(OPS):
            x = rshmem.empty(1000, dtype)
            x.copy_(gen(10 * i + me, (1000,), dtype).to(dev))
            o = rshmem.empty(1000, dtype)
            rshmem.all_reduce(x, op, out=o)
            rshmem.all_reduce(x, op)
            r["ar", op] = (o.cpu(), x.cpu())
        b = rshmem.empty((3, 5), dtype)
        b.copy_(gen(40 + me, (3, 5), dtype).to(dev))
        rshmem.broadcast(b, 1)
        r["bc"] = b.cpu()
        inp = rshmem.empty(6, dtype)
        inp.copy_(gen(50 + me, (6,), dtype).to(dev))
        ag = rshmem.empty(12, dtype)
        rshmem.all_gather_into_tensor(ag, inp)
        r["ag"] = ag.cpu()
        rs = rshmem.empty(6, dtype)
        src = rshmem.empty(12, dtype)
        src.copy_(gen(60 + me, (12,), dtype).to(dev))
        rshmem.reduce_scatter_tensor(rs, src)
        r["rs"] = rs.cpu()
        a = rshmem.empty((4, 3), dtype)
        a.copy_(gen(70 + me, (4, 3), dtype).to(dev))
        ao = rshmem.empty((4, 3), dtype)
        rshmem.all_to_all_single(ao, a)
        r["a2a"] = ao.cpu()
        sync()
        return r

    res = run(f)
    for me, r in enumerate(res):
        for i, op in enumerate(OPS):
            want = ref_fold([gen(10 * i + p, (1000,), dtype) for p in range(N)], op).to(dtype)
            assert torch.equal(r["ar", op][0], want), op
            assert torch.equal(r["ar", op][1], want), op
        assert torch.equal(r["bc"], gen(41, (3, 5), dtype))
        assert torch.equal(r["ag"], torch.cat([gen(50 + p, (6,), dtype) for p in range(N)]))
        full = ref_fold([gen(60 + p, (12,), dtype) for p in range(N)], "sum").to(dtype)
        assert torch.equal(r["rs"], full[6 * me:6 * me + 6])
        want = torch.cat([gen(70 + p, (4, 3), dtype)[2 * me:2 * me + 2] for p in range(N)])
        assert torch.equal(r["a2a"], want)


def test_collectives_capture_and_gpu_split_sizes():
    def f():
        me = rshmem.my_pe()
        dev = torch.device("cuda", rshmem.device())
        x = rshmem.empty(4096, torch.float32)
        rows = rshmem.empty((8, 4), torch.float32)
        out = rshmem.zeros((8, 4), torch.float32)
        splits = torch.tensor([1 + me, 3 - me], device=dev)  # rows to PE 0, PE 1
        rshmem.all_reduce(x)             # warm up: loads the collective kernels
        rows.copy_(torch.arange(32, dtype=torch.float32, device=dev).view(8, 4) + 100 * me)
        rshmem.all_to_all_single(out, rows[:4], None, splits)
        sync()
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            rshmem.all_reduce(x)
            rshmem.all_to_all_single(out, rows[:4], None, splits)
        res = []
        for i in range(3):
            x.fill_(me + i)
            torch.cuda.synchronize()
            g.replay()
            torch.cuda.synchronize()
            res.append(x[:4].cpu())
        sync()
        return res, out.cpu()

    for me, (res, out) in enumerate(run(f)):
        for i, r in enumerate(res):
            assert torch.equal(r, torch.full((4,), float(2 * i + 1)))
        # PE p sends its first 1+p rows to PE 0 and the next 3-p rows to PE 1.
        base = torch.arange(32, dtype=torch.float32).view(8, 4)
        parts = []
        for p in range(N):
            lo = 0 if me == 0 else 1 + p
            cnt = 1 + p if me == 0 else 3 - p
            parts.append(base[lo:lo + cnt] + 100 * p)
        got = torch.cat(parts)
        assert torch.equal(out[:len(got)], got)


def test_user_kernel_device_initiated_put():
    code = r"""
    extern "C" __global__ void ring(float* dst, const float* src, unsigned long long n,
                                    rshmem_u64* sig) {
        int peer = (rshmem_my_pe() + 1) % rshmem_n_pes();
        rshmem_putmem_signal_block(dst, src, n * sizeof(float), sig, 1, RSHMEM_SIGNAL_SET, peer);
    }
    extern "C" __global__ void wait(rshmem_u64* sig) {
        rshmem_signal_wait_until(sig, RSHMEM_CMP_EQ, 1);
    }
    """

    def f():
        me = rshmem.my_pe()
        dst = rshmem.zeros(3000, torch.float32)
        src = rshmem.empty(3000, torch.float32)
        sig = rshmem.zeros(1, torch.uint64)
        src.copy_(torch.arange(3000, dtype=torch.float32, device=src.device) * (me + 1))
        ring = rshmem.cuda.RawKernel(code, "ring")
        wait = rshmem.cuda.RawKernel(code, "wait")
        rshmem.barrier()
        with pytest.raises(rshmem.InvalidArgument):
            ring(1, 256, (dst, src, 3000, sig))     # a bare int: its C type is unknown
        ring(1, 256, (dst, src, np.uint64(3000), sig))
        wait(1, 32, (sig,))
        got = dst.cpu()
        sync()
        return got

    for me, got in enumerate(run(f)):
        assert torch.equal(got, torch.arange(3000, dtype=torch.float32) * (2 - me))


def test_moe_dispatch_combine_against_reference():
    from rshmem.ep import Buffer

    h, k, e = 256, 4, 8

    def routing(p):
        g = torch.Generator().manual_seed(500 + p)
        t = 64 + 16 * p
        x = torch.randint(-8, 8, (t, h), generator=g).to(torch.bfloat16)
        idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        idx[torch.rand((t, k), generator=g) < 0.2] = -1
        w = torch.tensor([0.25, 0.5, 1.0, 2.0])[torch.randint(0, 4, (t, k), generator=g)]
        return x, idx, w

    def f():
        me = rshmem.my_pe()
        dev = torch.device("cuda", rshmem.device())
        x, idx, w = (a.to(dev) for a in routing(me))
        b = Buffer(None, int(1e9))
        ntpr, _, ntpe, itir, _ = b.get_dispatch_layout(idx, e)
        rx, ridx, rw, counts, hd, _ = b.dispatch(x, topk_idx=idx, topk_weights=w,
                                                 num_tokens_per_rank=ntpr,
                                                 is_token_in_rank=itir,
                                                 num_tokens_per_expert=ntpe)
        y = (rx.float() * rw.sum(1, keepdim=True)).to(torch.bfloat16)
        cx, _, _ = b.combine(y, hd)
        sync()
        out = (rx.cpu(), ridx.cpu(), rw.cpu(), counts, cx.cpu())
        b.destroy()
        return out

    for me, (rx, ridx, rw, counts, cx) in enumerate(run(f)):
        x, idx, w = routing(me)
        lo = me * (e // N)
        rows, ids, wts = [], [], []
        for p in range(N):
            xp, ip, wp = routing(p)
            mine = (ip >= lo) & (ip < lo + e // N)
            sel = mine.any(1)
            rows.append(xp[sel])
            ids.append(torch.where(mine, ip - lo, -1)[sel])
            wts.append(torch.where(mine, wp, 0)[sel])
        assert torch.equal(rx, torch.cat(rows))
        assert torch.equal(ridx, torch.cat(ids))
        assert torch.equal(rw, torch.cat(wts))
        assert counts == [int((torch.cat(ids) == j).any(1).sum()) for j in range(e // N)]
        want = (x.float() * torch.where(idx >= 0, w, 0).sum(1, keepdim=True)).to(torch.bfloat16)
        assert torch.allclose(cx.float(), want.float(), rtol=2e-2, atol=1e-2)


@two_gpus
def test_gpu_bad_inputs():
    def f():
        t = rshmem.zeros(16, torch.float32)
        other = torch.zeros(16, device=f"cuda:{1 - rshmem.device()}")
        cases = [
            lambda: rshmem.put(t, torch.zeros(16), 0),                 # host tensor
            lambda: rshmem.put(t, torch.zeros(16, device=t.device), 0),  # not symmetric
            lambda: rshmem.put(t, other, 0),                           # another GPU
            lambda: rshmem.put(t, t, 0, stream=torch.cuda.Stream(device=other.device)),
            lambda: rshmem.numpy.empty(4),                             # numpy on a GPU heap
            lambda: rshmem.empty(4, device="cpu"),
            lambda: rshmem.wait_until(t[:1], "==", 0),                 # float word
            lambda: rshmem.all_reduce(torch.zeros(16, device=t.device)),
        ]
        for c in cases:
            with pytest.raises(rshmem.InvalidArgument):
                c()
        rshmem.barrier()
        sync()
        return True

    assert all(run(f))


def torchrun(script, *args):
    import os
    import subprocess
    import sys

    from test_processes import clean_env, free_port_pair

    env = clean_env()
    port = free_port_pair()
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), script, *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
        cwd=os.path.dirname(script))


@two_gpus
def test_collectives_against_nccl_under_torchrun():
    from pathlib import Path

    r = torchrun(str(Path(__file__).parent / "gpu_torchrun_worker.py"))
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("OK ") == 2, r.stdout


def test_moe_layer_example_equals_one_gpu():
    from pathlib import Path

    r = torchrun(str(Path(__file__).parents[1] / "examples" / "moe_layer.py"))
    assert r.returncode == 0, r.stdout
    assert r.stdout.count(" OK") == 2, r.stdout
