"""Under torchrun --nproc-per-node 2 (one GPU or two): DeepEP's low-latency pair through
rshmem.ep.Buffer against a reference built from every rank's seeded inputs. Exits 0 after
printing OK."""

import sys

import torch

import rshmem
from rshmem.ep import Buffer

M, H, E, K = 32, 256, 8, 4


def inputs(rank, step, t):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = (torch.randn(t, H, generator=g) * 4).to(torch.bfloat16)
    perms = [torch.randperm(E, generator=g)[:K] for _ in range(t)]
    idx = torch.stack(perms) if perms else torch.zeros(0, K, dtype=torch.int64)
    idx[torch.rand(t, K, generator=g) < 0.15] = -1          # slots without an expert
    w = torch.rand(t, K, generator=g)
    return x, idx, w


def tokens(rank, step):
    return [M, M // 2 + 3, 0][(rank + step) % 3] if step < 3 else M


def expected(me, n, step):
    """Per local expert: the rows (source order, then token order) and their sources."""
    loc = E // n
    rows = [[] for _ in range(loc)]
    src = [[] for _ in range(loc)]
    for s in range(n):
        x, idx, _ = inputs(s, step, tokens(s, step))
        for t in range(x.shape[0]):
            for e in range(loc):
                if (idx[t] == me * loc + e).any():
                    rows[e].append(x[t])
                    src[e].append(s * M + t)
    return rows, src


def combined(x, idx, w):
    acc = torch.zeros(x.shape[0], H, dtype=torch.float32)
    for j in range(K):
        acc = acc + torch.where(idx[:, j:j + 1] >= 0, w[:, j:j + 1], 0.0) * x.float()
    return acc.to(torch.bfloat16)


def main():
    rshmem.init(backend="cuda", heap_size=1 << 30, timeout=60.0)
    me, n = rshmem.my_pe(), rshmem.n_pes()
    dev = torch.device("cuda", rshmem.device())
    b = Buffer(None, 0, rshmem.ep.get_low_latency_rdma_size_hint(M, H, n, E, K),
               low_latency_mode=True)
    loc = E // n
    stats = torch.zeros(loc, dtype=torch.int32, device=dev)
    bad, want_stats = [], torch.zeros(loc, dtype=torch.int32)
    for step in range(5):
        t = tokens(me, step)
        x, idx, w = inputs(me, step, t)
        fp8 = step == 3
        hook_mode = step >= 2
        rx, cnt, hd, _, hook = b.low_latency_dispatch(
            x.to(dev), idx.to(dev), M, E, cumulative_local_expert_recv_stats=stats,
            use_fp8=fp8, return_recv_hook=hook_mode)
        if hook_mode:
            torch.cuda._sleep(1000)  # other work between send and receive
            hook()
        torch.cuda.synchronize()
        b.check_low_latency()
        rows, src = expected(me, n, step)
        want_stats += torch.tensor([len(r) for r in rows], dtype=torch.int32)
        got_cnt = cnt.cpu().tolist()
        if got_cnt != [len(r) for r in rows]:
            bad.append(("count", step, got_cnt))
            continue
        srcs = hd[0].cpu()
        for e in range(loc):
            c = got_cnt[e]
            if c and srcs[e, :c].tolist() != src[e]:
                bad.append(("src", step, e))
            if not c:
                continue
            ref = torch.stack(rows[e])
            if fp8:
                q, sc = rx
                deq = (q[e, :c].float().cpu().view(c, H // 128, 128) *
                       sc[e, :c].cpu().view(c, H // 128, 1)).view(c, H)
                amax = ref.float().view(c, H // 128, 128).abs().amax(-1)
                want_sc = torch.clamp(amax, min=1e-4) / 448
                if not torch.allclose(sc[e, :c].cpu(), want_sc, rtol=1e-6, atol=0):
                    bad.append(("fp8 scales", step, e))
                err = (deq - ref.float()).abs()
                bound = ref.float().abs() * 0.0625 + want_sc.repeat_interleave(128, 1) * 2 ** -6
                if (err > bound).any():
                    bad.append(("fp8 error bound", step, e, float(err.max())))
            elif not torch.equal(rx[e, :c].cpu(), ref):
                bad.append(("rows", step, e))
        # Identity experts: combine the rows back (bf16 rows even after an FP8 dispatch).
        y = b.get_next_low_latency_combine_buffer(hd)
        if fp8:
            y.zero_()
            for e in range(loc):
                if got_cnt[e]:
                    y[e, :got_cnt[e]] = torch.stack(rows[e]).to(dev)
        else:
            y.copy_(rx)
        out, _, chook = b.low_latency_combine(y, idx.to(dev), w.to(dev), hd,
                                              return_recv_hook=hook_mode)
        if hook_mode:
            chook()
        torch.cuda.synchronize()
        b.check_low_latency()
        if not torch.equal(out.cpu(), combined(x, idx, w)):
            bad.append(("combine", step))
    if not torch.equal(stats.cpu(), want_stats):
        bad.append(("stats", stats.cpu().tolist(), want_stats.tolist()))
    b.destroy()
    rshmem.finalize()
    if bad:
        print(f"rank {me} FAILED {bad}", flush=True)
        sys.exit(1)
    print(f"OK rank {me}", flush=True)


if __name__ == "__main__":
    main()
