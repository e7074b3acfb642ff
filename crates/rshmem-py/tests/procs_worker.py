"""One process-PE of the process tests (started by test_processes.py under torchrun's or
rshmem run's environment, or with explicit arguments). Exits 0 after printing OK."""

import os
import sys

import numpy as np

import rshmem


def check(cond, what):
    if not cond:
        print(f"FAIL on PE {rshmem.my_pe()}: {what}", flush=True)
        sys.exit(1)


def ops_and_collectives():
    me, n = rshmem.my_pe(), rshmem.n_pes()
    x = rshmem.numpy.zeros(16, np.int64)
    rshmem.put(x, np.arange(16) + 100 * me, (me + 1) % n)
    rshmem.barrier()
    check((x == np.arange(16) + 100 * ((me - 1) % n)).all(), "put ring")
    p = rshmem.peer(x, (me + 1) % n)
    check((p == np.arange(16) + 100 * me).all(), "peer view across processes")
    sig = rshmem.numpy.zeros(1, np.uint64)
    rshmem.put_signal(x[:1], np.array([7]), sig, 1, 0, op="add")
    if me == 0:
        check(rshmem.wait_until(sig, "==", n) == n, "signals from every process")
    y = rshmem.numpy.empty(8, np.float32)
    y[:] = me + 1
    rshmem.all_reduce(y)
    check((y == n * (n + 1) / 2).all(), "all_reduce")
    g = rshmem.numpy.empty(2 * n, np.int32)
    g[2 * me:2 * me + 2] = [me, -me]
    rshmem.all_gather_into_tensor(g, g[2 * me:2 * me + 2])
    check((g == np.array([[p, -p] for p in range(n)]).ravel()).all(), "all_gather in place")
    a = rshmem.numpy.empty(n * 3, np.float64)
    a[:] = np.arange(n * 3) + me
    o = rshmem.numpy.empty(n * 3, np.float64)
    rshmem.all_to_all_single(o, a)
    want = np.concatenate([np.arange(3 * me, 3 * me + 3) + p for p in range(n)])
    check((o == want).all(), "all_to_all_single")
    try:
        rshmem.numpy.empty(3 + me)
        check(False, "a shape differing across processes must raise")
    except rshmem.CollectiveMismatch:
        pass
    rshmem.free(o)
    # MoE across processes.
    from rshmem.ep import Buffer

    rng = np.random.default_rng(me)
    t = 5 + me
    xs = rng.integers(-4, 4, size=(t, 4)).astype(np.float32)
    idx = rng.integers(-1, 2 * n, size=(t, 2)).astype(np.int64)
    idx[:, 1] = np.where(idx[:, 1] == idx[:, 0], -1, idx[:, 1])
    w = np.full((t, 2), 0.5, np.float32)
    b = Buffer(None)
    _, _, ntpe, _, _ = b.get_dispatch_layout(idx, 2 * n)
    rx, _, rw, _, h, _ = b.dispatch(xs, topk_idx=idx, topk_weights=w, num_tokens_per_expert=ntpe)
    cx, _, _ = b.combine(rx * rw.sum(1, keepdims=True), h)
    check((cx == xs * np.where(idx >= 0, w, 0).sum(1, keepdims=True)).all(), "ep combine")
    b.destroy()


def main():
    mode = sys.argv[1]
    if mode == "uid0":
        # Rank 0 makes the unique id (its process keeps the port) and hands it out on stdout.
        uid = rshmem.unique_id()
        print(f"UID {uid}", flush=True)
        rshmem.init(rank=0, world_size=2, unique_id=uid, heap_size=32 << 20, timeout=30.0)
    elif mode == "uid":
        rshmem.init(rank=int(sys.argv[2]), world_size=2, unique_id=sys.argv[3],
                    heap_size=32 << 20, timeout=30.0)
    elif mode == "explicit":
        rshmem.init(rank=int(sys.argv[2]), world_size=int(sys.argv[3]), address=sys.argv[4],
                    heap_size=32 << 20, timeout=30.0)
    else:
        rshmem.init(heap_size=32 << 20, timeout=30.0)
    if mode == "peerlost":
        x = rshmem.numpy.zeros(1, np.int64)
        if rshmem.my_pe() == 1:
            os._exit(3)  # dies without finalize
        try:
            rshmem.wait_until(x, "==", 1)
            check(False, "a wait on a dead process must raise")
        except (rshmem.PeerLost, rshmem.Timeout) as e:
            print(f"LOST {type(e).__name__} {e.pe}", flush=True)
        return
    ops_and_collectives()
    rshmem.finalize()
    print(f"OK {sys.argv[1]}", flush=True)


if __name__ == "__main__":
    main()
