"""The Python package's figures beside their baselines, as JSON (rank 0 prints it).

GPU machine (2 GPUs, torch with CUDA):

    torchrun --nproc-per-node 2 crates/rshmem-py/bench/bench.py [--quick] [--json out.json]

CPU only (no torch.distributed baseline; the per-call overhead only, two PEs as two processes
that this command starts):

    python crates/rshmem-py/bench/bench.py --cpu [--quick]

Records:
* ``call_overhead``: host microseconds per call from Python against the same operation issued
  by a Rust loop in the same process, in alternating rounds (medians). GPU: ``put``, ``get``,
  ``put_signal`` of 8 bytes, ``wait_until`` (already true) and ``quiet``, stream-ordered on the
  current stream, not synchronised (rank 0 alone, rounds of 500 calls). CPU (``--cpu``):
  a list, per operand kind (numpy arrays; torch CPU tensors where torch is importable) and
  call: ``put``/``get`` of 8 bytes, ``put_signal``, ``wait_until`` (already true) from PE 0
  while PE 1 waits in a barrier, ``barrier`` and a 64-byte float32 ``all_reduce`` on both PEs
  in step. Target: Python - Rust <= 2 us.
* ``all_reduce``: GPU microseconds per in-place all_reduce (float32 and bfloat16, 4 KiB to
  1 MiB) for rshmem and torch.distributed (NCCL) on the same stream; ratio = rshmem / NCCL.
  Target: <= 0.5 for small sizes. Also ``dist.all_reduce`` on a group of the "rshmem" backend
  (``dist_rshmem_us``: a plain tensor, staged; ``dist_rshmem_symmetric_us``: the symmetric one).
* ``moe``: microseconds per dispatch + combine step through ``rshmem.ep.Buffer`` (DeepEP's
  interface: packing the received rows, unpacking combine's input) on symmetric inputs (used
  in place) and on plain tensors (staged), against the same step issued by a Rust loop on the
  symmetric operands (``GpuBuffer::dispatch`` + ``combine_tokens``);
  T = 4096, H = 7168, bf16, top-8 of 256 experts (``--quick``: T = 512). Target: within 5%.
"""

import argparse
import json
import sys
import time

import numpy as np

import rshmem


def timed(fn, iters, sync=lambda: None):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def med(v):
    return sorted(v)[len(v) // 2]


# (call, both PEs take part): the host calls whose overhead --cpu measures.
CPU_CALLS = (("put", False), ("get", False), ("put_signal", False), ("wait_until", False),
             ("barrier", True), ("all_reduce", True))


def cpu_operands(kind):
    """Symmetric int64 word, host int64 word, symmetric uint64 signal, symmetric float32[16]."""
    if kind == "numpy":
        mod, addr = rshmem.numpy, (lambda a: a.__array_interface__["data"][0])
        return (mod.zeros(1, np.int64), np.ones(1, np.int64), mod.zeros(1, np.uint64),
                mod.zeros(16, np.float32), addr)
    import torch

    return (rshmem.zeros(1, torch.int64), torch.ones(1, dtype=torch.int64),
            rshmem.zeros(1, torch.uint64), rshmem.zeros(16, torch.float32),
            lambda t: t.data_ptr())


def cpu_pe(rank, address, quick):
    """One of the two PEs of --cpu; PE 0 returns the records."""
    rshmem.init(rank=rank, world_size=2, address=address, backend="shm", timeout=60.0)
    w = rshmem._world.current()
    rounds, iters = (5, 500) if quick else (15, 2000)
    kinds = ["numpy"]
    try:
        import torch  # noqa: F401

        kinds.append("torch")
    except ImportError:
        pass
    recs = []
    for kind in kinds:
        dst, src, sig, x, addr = cpu_operands(kind)
        put, get, put_signal, wait_until = (rshmem.put, rshmem.get, rshmem.put_signal,
                                            rshmem.wait_until)
        barrier, all_reduce = rshmem.barrier, rshmem.all_reduce
        calls = {
            "put": lambda: put(dst, src, 1),
            "get": lambda: get(src, dst, 1),
            "put_signal": lambda: put_signal(dst, src, sig, 1, 1),
            "wait_until": lambda: wait_until(dst, ">=", 0),
            "barrier": barrier,
            "all_reduce": lambda: all_reduce(x),
        }
        for name, both in CPU_CALLS:
            args = {"put": (addr(dst), addr(src), 8, 0),
                    "get": (addr(src), addr(dst), 8, 0),
                    "put_signal": (addr(dst), addr(src), 8, addr(sig)),
                    "wait_until": (addr(dst), 0, 8, 0),
                    "all_reduce": (addr(x), 0, 64, 0)}.get(name, (0, 0, 0, 0))
            rshmem.barrier()
            if rank == 1 and not both:  # waits in a barrier while PE 0 measures
                rshmem.barrier()
                continue
            fn = calls[name]
            py, rs = [], []
            for _ in range(rounds):
                fn()
                t0 = time.perf_counter()
                for _ in range(iters):  # a plain loop, as a user writes it
                    fn()
                py.append((time.perf_counter() - t0) / iters)
                d, s, n, g = args
                rs.append(w.op_loop(name, iters, dst=d, src=s, nbytes=n, sig=g, pe=1))
            if not both:
                rshmem.barrier()
            p, r = med(py), med(rs)
            recs.append({"kind": kind, "call": name, "python_us": p * 1e6, "rust_us": r * 1e6,
                         "overhead_us": (p - r) * 1e6})
    rshmem.finalize()
    return recs


def call_overhead_cpu(quick):
    """Two PEs as two processes of this script (each with its own interpreter, as under
    torchrun), host heap; PE 0's records."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--cpu-pe", "0", "--address", f"127.0.0.1:{port}"]
    cmd += ["--quick"] if quick else []
    procs = []
    for r in range(2):
        cmd[3] = str(r)
        procs.append(subprocess.Popen(list(cmd), stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a PE failed: {[p.returncode for p in procs]}")
    return json.loads(outs[0])


def call_overhead_gpu(torch):
    """Rank 0 measures (rank 1 waits in a barrier): per call, rounds of Python calls (a plain
    loop, as a user writes it) alternating with rounds of the Rust loop, so both see the same
    machine; medians over the rounds. A round is short enough that the stream's queue never
    fills (a full queue would time the GPU's work, not the calls); the GPU's own time per put
    is recorded beside it."""
    w = rshmem._world.current()
    me = rshmem.my_pe()
    dst = rshmem.zeros(1, torch.int64)
    src = rshmem.zeros(1, torch.int64)
    sig = rshmem.zeros(1, torch.uint64)
    rec = None
    if me == 0:
        iters, rounds = 500, 21
        s = torch.cuda.current_stream()
        put, get, put_signal, wait_until, quiet = (rshmem.put, rshmem.get, rshmem.put_signal,
                                                   rshmem.wait_until, rshmem.quiet)
        calls = {
            "put": lambda: put(dst, src, 1),
            "get": lambda: get(dst, src, 1),
            "put_signal": lambda: put_signal(dst, src, sig, 1, 1),
            "wait_until": lambda: wait_until(sig, ">=", 0),
            "quiet": quiet,
        }
        args = {"dst": dst.data_ptr(), "src": src.data_ptr(), "nbytes": 8,
                "sig": sig.data_ptr(), "pe": 1}
        recs = []
        for name, fn in calls.items():
            py, rs = [], []
            for _ in range(rounds):
                s.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                py.append((time.perf_counter() - t0) / iters)
                s.synchronize()
                rs.append(w.op_dev_loop(name, iters, s.cuda_stream, **args))
            s.synchronize()
            p, r = med(py), med(rs)
            recs.append({"call": name, "python_us": p * 1e6, "rust_us": r * 1e6,
                         "overhead_us": (p - r) * 1e6})
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        w.op_dev_loop("put", iters, s.cuda_stream, **args)
        b.record()
        s.synchronize()
        rec = {"calls": recs, "gpu_us_per_put": a.elapsed_time(b) * 1e3 / iters,
               "rounds": rounds, "iters": iters}
    torch.cuda.synchronize()
    rshmem.barrier()
    return rec


def gpu_time(torch, fn, iters):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters  # us


def symm_all_reduce(torch, dist, dtype, count):
    """``torch.distributed._symmetric_memory``'s one-shot and two-shot all_reduce on a tensor of
    its own symmetric memory (the multimem variants need NVLink multicast, which stays off):
    microseconds each, or the reason it could not run."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        t = symm_mem.empty(count, dtype=dtype, device=torch.device("cuda", rshmem.device()))
        t.zero_()
        symm_mem.rendezvous(t, group)
        ops = torch.ops.symm_mem
        one = gpu_time(torch, lambda: ops.one_shot_all_reduce(t, "sum", group), 500)
        two = gpu_time(torch, lambda: ops.two_shot_all_reduce_(t, "sum", group), 500)
        return {"symm_one_shot_us": one, "symm_two_shot_us": two}
    except Exception as e:  # an older torch, an unsupported dtype or device: say why
        return {"symm_error": f"{type(e).__name__}: {e}"[:200]}


def dist_rshmem(torch, dist, x, y, iters):
    """``dist.all_reduce`` through a group of the "rshmem" backend (``rshmem.dist``) on plain
    ``y`` (staged) and symmetric ``x``: microseconds each, or the reason it could not run."""
    try:
        g = dist_rshmem.group
        if g is None:
            g = dist_rshmem.group = dist.new_group(backend="rshmem")
        return {"dist_rshmem_us": gpu_time(torch, lambda: dist.all_reduce(y, group=g), iters),
                "dist_rshmem_symmetric_us":
                    gpu_time(torch, lambda: dist.all_reduce(x, group=g), iters)}
    except Exception as e:  # say why
        return {"dist_rshmem_error": f"{type(e).__name__}: {e}"[:200]}


dist_rshmem.group = None


def all_reduce(torch, dist, quick):
    """Beside torch.distributed on NCCL and ``torch.distributed._symmetric_memory``."""
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for nbytes in (4 << 10, 32 << 10, 256 << 10, 1 << 20):
            count = nbytes // torch.tensor([], dtype=dtype).element_size()
            x = rshmem.zeros(count, dtype)
            iters = 200 if quick else 2000
            r = gpu_time(torch, lambda: rshmem.all_reduce(x), iters)
            y = torch.zeros(count, dtype=dtype, device=x.device)
            n = gpu_time(torch, lambda: dist.all_reduce(y), iters)
            rec = {"dtype": str(dtype).replace("torch.", ""), "bytes": nbytes, "rshmem_us": r,
                   "nccl_us": n, "ratio": r / n}
            rec.update(symm_all_reduce(torch, dist, dtype, count))
            rec.update(dist_rshmem(torch, dist, x, y, iters))
            if "symm_one_shot_us" in rec:
                best = min(rec["symm_one_shot_us"], rec["symm_two_shot_us"])
                rec["ratio_symm"] = r / best
            rshmem.check_errors()
            out.append(rec)
            rshmem.free(x)
    return out


def moe(torch, quick):
    """Python's step on symmetric inputs (used in place: the like-for-like comparison with
    the Rust loop) and on plain tensors (staged), against the Rust loop on the same operands."""
    from rshmem.ep import Buffer

    t, h, k, e = (512 if quick else 4096), 7168, 8, 256
    me = rshmem.my_pe()
    dev = torch.device("cuda", rshmem.device())
    g = torch.Generator().manual_seed(me)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(dev)
    scores = torch.rand(t, e, generator=g)
    idx = scores.topk(k, dim=1).indices.to(dev)
    w = torch.rand(t, k, generator=g).to(dev)
    xs, ids, ws = rshmem.empty((t, h), torch.bfloat16), rshmem.empty((t, k), torch.int64), \
        rshmem.empty((t, k), torch.float32)
    xs.copy_(x)
    ids.copy_(idx)
    ws.copy_(w)
    b = Buffer(None, 0, max_tokens=t)
    ntpr, _, ntpe, itir, _ = b.get_dispatch_layout(idx, e)

    def step(a, i, v):
        rx, _, rw, _, hd, _ = b.dispatch(a, topk_idx=i, topk_weights=v,
                                         num_tokens_per_expert=ntpe)
        b.combine(rx, hd)

    iters = 5 if quick else 50
    sym = timed(lambda: step(xs, ids, ws), iters, torch.cuda.synchronize)
    plain = timed(lambda: step(x, idx, w), iters, torch.cuda.synchronize)
    _, _, _, ys, outs = b._stage
    es = xs.element_size()
    rs = b._native.step_loop((xs.data_ptr(), t * h * es), (ids.data_ptr(), t * k * 8),
                             (ws.data_ptr(), t * k * 4), (ys.data_ptr(), ys.numel() * es),
                             (outs.data_ptr(), t * h * es), t, k,
                             torch.cuda.current_stream().cuda_stream, iters)
    rshmem.check_errors()
    b.destroy()
    for a in (xs, ids, ws):
        rshmem.free(a)
    return {"tokens": t, "hidden": h, "topk": k, "experts": e, "python_us": sym * 1e6,
            "python_plain_inputs_us": plain * 1e6, "rust_us": rs * 1e6, "ratio": sym / rs,
            "ratio_plain_inputs": plain / rs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="host heap, thread mode, no NCCL")
    ap.add_argument("--json", help="also write the records to this file")
    ap.add_argument("--cpu-pe", type=int, help=argparse.SUPPRESS)  # one PE of --cpu
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--one-gpu", action="store_true",
                    help="every rank on one GPU (NCCL cannot run there, and kernels waiting on "
                         "another process's time slice time nothing): the call overhead only")
    a = ap.parse_args()
    if a.cpu_pe is not None:
        recs = cpu_pe(a.cpu_pe, a.address, a.quick)
        if a.cpu_pe == 0:
            print(json.dumps(recs))
        return 0
    if a.cpu:
        rec = {"backend": "shm", "call_overhead": call_overhead_cpu(a.quick)}
    else:
        import torch
        import torch.distributed as dist

        rshmem.init(backend="cuda", heap_size=4 << 30)
        dev = torch.device("cuda", rshmem.device())
        if not a.one_gpu:
            dist.init_process_group("nccl", device_id=dev)
        rec = {"backend": "cuda", "n_pes": rshmem.n_pes(),
               "gpu": torch.cuda.get_device_name(dev),
               "call_overhead": call_overhead_gpu(torch)}
        if not a.one_gpu:
            rec["all_reduce"] = all_reduce(torch, dist, a.quick)
            rec["moe"] = moe(torch, a.quick)
        me = rshmem.my_pe()
        if not a.one_gpu:
            dist.destroy_process_group()
        rshmem.finalize()
        if me != 0:
            return 0
    text = json.dumps(rec, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
