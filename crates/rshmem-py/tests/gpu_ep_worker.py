"""Under torchrun --nproc-per-node 2 (one GPU or two): DeepEP's normal dispatch/combine
through rshmem.ep.Buffer with inputs as plain tensors (staged), as symmetric tensors (used in
place, int64 and int32 ids) and with a rank sending no token; every output checked exactly
against a reference built from every rank's seeded inputs. Exits 0 after printing OK."""

import torch

import rshmem
from rshmem.ep import Buffer

H, E, K = 256, 8, 4
WEIGHTS = torch.tensor([0.25, 0.5, 1.0, 2.0])


def inputs(rank, step):
    """Integer rows and power-of-two weights: every sum below is exact in float32, and each
    PE's partial row (at most 8 significant bits) is exact in bfloat16."""
    g = torch.Generator().manual_seed(100 * step + rank)
    t = [48, 17, 0, 33][(rank + step) % 4]
    x = torch.randint(-8, 8, (t, H), generator=g).to(torch.bfloat16)
    perms = [torch.randperm(E, generator=g)[:K] for _ in range(t)]
    idx = torch.stack(perms) if perms else torch.zeros(0, K, dtype=torch.int64)
    idx[torch.rand(t, K, generator=g) < 0.2] = -1
    w = WEIGHTS[torch.randint(0, 4, (t, K), generator=g)]
    return x, idx, w


def reference(me, n, step):
    loc = E // n
    lo = me * loc
    rows, ids, wts = [], [], []
    for p in range(n):
        xp, ip, wp = inputs(p, step)
        mine = (ip >= lo) & (ip < lo + loc)
        sel = mine.any(1)
        rows.append(xp[sel])
        ids.append(torch.where(mine, ip - lo, -1)[sel])
        wts.append(torch.where(mine, wp, 0.0)[sel])
    ids = torch.cat(ids)
    counts = [int((ids == j).sum()) for j in range(loc)]
    return torch.cat(rows), ids, torch.cat(wts), counts


def place(a, how, dev):
    """``a`` on the GPU: a plain tensor, or the first rows of a symmetric one (of dtype
    ``how``'s; every PE allocates the same 64 rows, whatever its token count)."""
    if how == "plain":
        return a.to(dev), None
    dtype = torch.int32 if how == "sym32" and a.dtype == torch.int64 else a.dtype
    s = rshmem.zeros((64,) + tuple(a.shape[1:]), dtype)
    s[:a.shape[0]].copy_(a.to(dev))
    return s[:a.shape[0]], s


def main():
    rshmem.init(backend="cuda", heap_size=1 << 30, timeout=60.0)
    me, n = rshmem.my_pe(), rshmem.n_pes()
    dev = torch.device("cuda", rshmem.device())
    b = Buffer(None, 0, max_tokens=64)
    for step, how in enumerate(["plain", "sym", "sym32", "plain", "sym"]):
        x, idx, w = inputs(me, step)
        (xs, xa), (ids, ia), (ws, wa) = (place(a, how, dev) for a in (x, idx, w))
        ntpr, _, ntpe, itir, _ = b.get_dispatch_layout(ids, E)
        rx, ridx, rw, counts, hd, _ = b.dispatch(xs, topk_idx=ids, topk_weights=ws,
                                                 num_tokens_per_rank=ntpr,
                                                 is_token_in_rank=itir,
                                                 num_tokens_per_expert=ntpe)
        want_x, want_ids, want_w, want_counts = reference(me, n, step)
        assert torch.equal(rx.cpu(), want_x), (step, how, "recv_x")
        assert ridx.dtype == ids.dtype, (step, how, ridx.dtype)
        assert torch.equal(ridx.cpu().long(), want_ids), (step, how, "recv_topk_idx")
        assert torch.equal(rw.cpu(), want_w), (step, how, "recv_topk_weights")
        assert counts == want_counts, (step, how, counts, want_counts)
        y = (rx.float() * rw.sum(1, keepdim=True)).to(torch.bfloat16)
        try:
            b.combine(y[1:], hd)
        except rshmem.InvalidArgument:
            pass
        else:
            assert y.shape[0] == 0, "combine accepted x with a row missing"
        cx, _, _ = b.combine(y, hd)
        # The cached mode: the same routing, new rows.
        again = b.dispatch(xs * 2, handle=hd)[0]
        torch.cuda.synchronize()
        want = (x.float() * torch.where(idx >= 0, w, 0.0).sum(1, keepdim=True)).to(torch.bfloat16)
        assert torch.equal(cx.cpu(), want), (step, how, "combined_x")
        assert torch.equal(again.cpu(), want_x * 2), (step, how, "cached dispatch")
        if how != "plain":
            for a in (xa, ia, wa):
                rshmem.free(a)
    rshmem.check_errors()
    b.destroy()
    rshmem.barrier()
    print(f"OK rank {me}", flush=True)
    rshmem.finalize()


if __name__ == "__main__":
    main()
