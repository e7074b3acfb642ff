"""The Python package's figures beside their baselines, as JSON (rank 0 prints it).

GPU machine (2 GPUs, torch with CUDA):

    torchrun --nproc-per-node 2 crates/rshmem-py/bench/bench.py [--quick] [--json out.json]

CPU only (no torch.distributed baseline; the per-call overhead only):

    python crates/rshmem-py/bench/bench.py --cpu

Records:
* ``call_overhead``: host microseconds per ``rshmem.put`` call from Python against the same
  operation issued by a Rust loop in the same process (8 bytes; GPU: stream-ordered, not
  synchronised; rank 0 alone, alternating rounds of 500 calls, medians). Target: Python - Rust <= 2 us.
* ``all_reduce``: GPU microseconds per in-place all_reduce (float32 and bfloat16, 4 KiB to
  1 MiB) for rshmem and torch.distributed (NCCL) on the same stream; ratio = rshmem / NCCL.
  Target: <= 0.5 for small sizes.
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


def call_overhead_cpu():
    """Thread mode, 2 PEs, host heap."""

    def f():
        me = rshmem.my_pe()
        dst = rshmem.numpy.zeros(1, np.int64)
        src = np.ones(1, np.int64)
        if me == 1:  # PE 1 waits in a barrier (without the GIL) while PE 0 measures
            rshmem.barrier()
            return None
        iters = 200_000
        put = rshmem.put
        put(dst, src, 1)
        t0 = time.perf_counter()
        for _ in range(iters):  # a plain loop, as a user writes it
            put(dst, src, 1)
        py = (time.perf_counter() - t0) / iters
        rs = rshmem._world.current().put_loop(dst.__array_interface__["data"][0],
                                              src.__array_interface__["data"][0], 8, 1, iters)
        rshmem.barrier()
        return {"python_us": py * 1e6, "rust_us": rs * 1e6, "overhead_us": (py - rs) * 1e6}

    return rshmem.launch(2, f)[0]


def call_overhead_gpu(torch):
    """Rank 0 measures (rank 1 waits in a barrier): rounds of Python calls (a plain loop, as a
    user writes it) alternating with rounds of the Rust loop, so both see the same machine;
    medians over the rounds. A round is short enough that the stream's queue never fills
    (a full queue would time the GPU's copies, not the calls); the GPU's own time per put is
    recorded beside it."""
    w = rshmem._world.current()
    me = rshmem.my_pe()
    dst = rshmem.zeros(1, torch.int64)
    src = rshmem.zeros(1, torch.int64)
    rec = None
    if me == 0:
        iters, rounds = 500, 21
        s = torch.cuda.current_stream()
        put = rshmem.put
        py, rs = [], []
        for _ in range(rounds):
            s.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                put(dst, src, 1)
            py.append((time.perf_counter() - t0) / iters)
            s.synchronize()
            rs.append(w.put_dev_loop(dst.data_ptr(), src.data_ptr(), 8, 1, s.cuda_stream, iters))
        s.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        w.put_dev_loop(dst.data_ptr(), src.data_ptr(), 8, 1, s.cuda_stream, iters)
        b.record()
        s.synchronize()
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        p, r = med(py), med(rs)
        rec = {"python_us": p * 1e6, "rust_us": r * 1e6, "overhead_us": (p - r) * 1e6,
               "gpu_us_per_put": a.elapsed_time(b) * 1e3 / iters, "rounds": rounds,
               "iters": iters}
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
    ap.add_argument("--one-gpu", action="store_true",
                    help="every rank on one GPU (NCCL cannot run there, and kernels waiting on "
                         "another process's time slice time nothing): the call overhead only")
    a = ap.parse_args()
    if a.cpu:
        rec = {"backend": "shm", "call_overhead": call_overhead_cpu()}
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
