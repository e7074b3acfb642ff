"""A small MoE layer (router, top-k, experts as matmuls) whose forward pass over 2 GPUs with
rshmem's DeepEP-style dispatch/combine equals the same layer computed on one GPU.

    torchrun --nproc-per-node 2 crates/rshmem-py/examples/moe_layer.py

Every rank builds the same weights (one seed); rank r holds experts r*E/n .. (r+1)*E/n and its
own tokens; each rank also computes the whole layer on its GPU as the reference.
"""

import sys

import torch

import rshmem
from rshmem.ep import Buffer

TOKENS, HIDDEN, FFN, EXPERTS, TOPK = 256, 512, 1024, 8, 2


def make_layer(device):
    g = torch.Generator().manual_seed(0)
    router = torch.randn(HIDDEN, EXPERTS, generator=g) / HIDDEN ** 0.5
    w1 = torch.randn(EXPERTS, HIDDEN, FFN, generator=g) / HIDDEN ** 0.5
    w2 = torch.randn(EXPERTS, FFN, HIDDEN, generator=g) / FFN ** 0.5
    return router.to(device), w1.to(device), w2.to(device)


def route(x, router):
    probs = torch.softmax(x @ router, dim=-1)
    w, idx = torch.topk(probs, TOPK, dim=-1)
    return idx, (w / w.sum(-1, keepdim=True)).float()


def expert(x, w1, w2, e):
    return torch.relu(x @ w1[e]) @ w2[e]


def reference(x, router, w1, w2):
    """The layer on one GPU: every token through its top-k experts, weighted."""
    idx, w = route(x, router)
    out = torch.zeros_like(x)
    for e in range(EXPERTS):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        out.index_add_(0, tok, expert(x[tok], w1, w2, e) * w[tok, slot, None])
    return out


def distributed(x, router, w1, w2, buf):
    """The same layer with the experts spread over the PEs."""
    idx, w = route(x, router)
    n_tpr, _, n_tpe, in_rank, _ = buf.get_dispatch_layout(idx, EXPERTS)
    rx, ridx, rw, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                              num_tokens_per_rank=n_tpr,
                                              is_token_in_rank=in_rank,
                                              num_tokens_per_expert=n_tpe)
    first = rshmem.my_pe() * (EXPERTS // rshmem.n_pes())
    y = torch.zeros_like(rx)
    for le in range(EXPERTS // rshmem.n_pes()):
        tok, slot = (ridx == le).nonzero(as_tuple=True)
        y.index_add_(0, tok, expert(rx[tok], w1, w2, first + le) * rw[tok, slot, None])
    out, _, _ = buf.combine(y, handle)
    return out


def main():
    rshmem.init(backend="cuda", heap_size=1 << 30)
    dev = torch.device("cuda", rshmem.device())
    router, w1, w2 = make_layer(dev)
    g = torch.Generator().manual_seed(1 + rshmem.my_pe())
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(dev)
    buf = Buffer(None, 0)
    got = distributed(x, router, w1, w2, buf)
    want = reference(x, router, w1, w2)
    torch.cuda.synchronize()
    rshmem.check_errors()
    err = (got - want).abs().max().item()
    ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    print(f"PE {rshmem.my_pe()}: max |distributed - one GPU| = {err:.3g} {'OK' if ok else 'FAIL'}",
          flush=True)
    buf.destroy()
    rshmem.finalize()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
