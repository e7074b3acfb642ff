"""Under torchrun --nproc-per-node 2 (GPUs): rshmem's collectives against torch.distributed's
NCCL results on the same inputs. Exits 0 after printing OK."""

import sys

import torch
import torch.distributed as dist

import rshmem


def main():
    rshmem.init(backend="cuda", heap_size=1 << 30, timeout=60.0)
    dev = torch.device("cuda", rshmem.device())
    dist.init_process_group("nccl", device_id=dev)
    me, n = dist.get_rank(), dist.get_world_size()
    assert (me, n) == (rshmem.my_pe(), rshmem.n_pes())
    bad = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64):
        for count in (1, 1000, 1 << 18, (1 << 20) + 3):
            g = torch.Generator().manual_seed(7 * me + count)
            x = torch.randint(-4, 5, (count,), generator=g).to(dtype).to(dev)
            # all_reduce
            ref = x.clone()
            dist.all_reduce(ref)
            s = rshmem.empty(count, dtype)
            s.copy_(x)
            rshmem.all_reduce(s)
            if not torch.equal(s, ref):
                bad.append(("all_reduce", dtype, count))
            # all_gather_into_tensor
            ref = torch.empty(n * count, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(ref, x)
            o = rshmem.empty(n * count, dtype)
            rshmem.all_gather_into_tensor(o, s.copy_(x))
            if not torch.equal(o, ref):
                bad.append(("all_gather_into_tensor", dtype, count))
            # reduce_scatter_tensor
            big = torch.randint(-4, 5, (n * count,), generator=g).to(dtype).to(dev)
            ref = torch.empty(count, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(ref, big)
            o.copy_(big)
            r = rshmem.empty(count, dtype)
            rshmem.reduce_scatter_tensor(r, o)
            if not torch.equal(r, ref):
                bad.append(("reduce_scatter_tensor", dtype, count))
            # broadcast
            ref = x.clone()
            dist.broadcast(ref, 1)
            s.copy_(x)
            rshmem.broadcast(s, 1)
            if not torch.equal(s, ref):
                bad.append(("broadcast", dtype, count))
            for t in (s, o, r):
                rshmem.free(t)
        # all_to_all_single with split sizes (host lists and GPU tensors)
        rows = 64
        ins = [(me + q) % 3 + 1 for q in range(n)]
        outs = [(p + me) % 3 + 1 for p in range(n)]
        g = torch.Generator().manual_seed(99 + me)
        a = torch.randint(-4, 5, (sum(ins), rows), generator=g).to(dtype).to(dev)
        ref = torch.empty(sum(outs), rows, dtype=dtype, device=dev)
        dist.all_to_all_single(ref, a, outs, ins)
        sa = rshmem.empty((3 * n, rows), dtype)
        so = rshmem.empty((3 * n, rows), dtype)
        sa[: sum(ins)].copy_(a)
        rshmem.all_to_all_single(so[: sum(outs)], sa[: sum(ins)], outs, ins)
        if not torch.equal(so[: sum(outs)], ref):
            bad.append(("all_to_all_single", dtype, "host splits"))
        so.zero_()
        rshmem.all_to_all_single(so[: sum(outs)], sa[: sum(ins)], None,
                                 torch.tensor(ins, device=dev))
        if not torch.equal(so[: sum(outs)], ref):
            bad.append(("all_to_all_single", dtype, "GPU splits"))
    torch.cuda.synchronize()
    rshmem.check_errors()
    dist.destroy_process_group()
    rshmem.finalize()
    if bad:
        print(f"FAIL on PE {me}: {bad}", flush=True)
        sys.exit(1)
    print(f"OK {me}", flush=True)


if __name__ == "__main__":
    main()
