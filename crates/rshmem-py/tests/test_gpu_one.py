"""put and get on one GPU (a world of one PE): the native path for plain torch tensors (on the
current stream or a given one) and the checked path for everything else give the same data and
the same errors. Skipped without
torch or without a CUDA GPU (run by gpu-test.sh on the GPU machine)."""

import pytest

torch = pytest.importorskip("torch")

import rshmem  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs torch with a CUDA GPU"
)
DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
          torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]


def run(fn):
    return rshmem.launch(1, fn, heap_size=64 << 20, timeout=60.0, backend="cuda")[0]


def gen(seed, n, dtype):
    g = torch.Generator().manual_seed(seed)
    lo = 0 if "uint" in str(dtype) else -100
    return torch.randint(lo, 100, (n,), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_put_get_fast_and_checked_paths_agree(dtype):
    def f():
        dev = torch.device("cuda", rshmem.device())
        a, b, c = (rshmem.zeros(64, dtype) for _ in range(3))
        a.copy_(gen(1, 64, dtype).to(dev))
        s = torch.cuda.Stream(device=dev)
        rshmem.put(b, a, 0)                    # fast path: current stream
        rshmem.put(c[8:40], a[8:40], 0)        # fast path: contiguous slices
        torch.cuda.current_stream().synchronize()
        with torch.cuda.stream(s):
            got = rshmem.empty(64, dtype)
            got.fill_(7)
            rshmem.get(got, b, 0, stream=s)    # native path: a given stream
        s.synchronize()
        back = rshmem.empty(64, dtype)
        back.fill_(5)
        rshmem.get(back, c, 0)                 # fast path
        torch.cuda.synchronize()
        rshmem.check_errors()
        return a.cpu(), b.cpu(), c.cpu(), got.cpu(), back.cpu()

    a, b, c, got, back = run(f)
    want = gen(1, 64, dtype)
    assert torch.equal(a, want) and torch.equal(b, want) and torch.equal(got, want)
    z = torch.zeros(64, dtype=dtype)
    assert torch.equal(c[8:40], want[8:40])
    assert torch.equal(c[:8], z[:8]) and torch.equal(c[40:], z[40:])
    assert torch.equal(back, c)


def test_fast_path_falls_back_to_the_checked_errors():
    def f():
        t = rshmem.zeros(16, torch.float32)
        u = rshmem.zeros((4, 4), torch.float32)
        flags = rshmem.zeros(16, torch.uint8).view(torch.bool)
        cases = [
            (lambda: rshmem.put(t, torch.zeros(16), 0), rshmem.InvalidArgument),   # host tensor
            (lambda: rshmem.put(t, torch.zeros(16, device=t.device), 0),            # not symmetric
             rshmem.InvalidArgument),
            (lambda: rshmem.put(t, rshmem.zeros(16, torch.int32), 0), rshmem.InvalidArgument),
            (lambda: rshmem.put(t, rshmem.zeros(8, torch.float32), 0), rshmem.InvalidArgument),
            (lambda: rshmem.put(t[:4], u.t()[0], 0), rshmem.InvalidArgument),     # strided
            (lambda: rshmem.put(t, t, 1), rshmem.InvalidArgument),               # PE range
            (lambda: rshmem.put(t, t, -1), rshmem.InvalidArgument),
            (lambda: rshmem.put(t, t, True), rshmem.InvalidArgument),            # bool PE
            (lambda: rshmem.get(t, t, 1.0), rshmem.InvalidArgument),
            (lambda: rshmem.put(flags, flags, 0), rshmem.InvalidArgument),       # torch.bool
            (lambda: rshmem.put(t, t, 0, stream="s"), rshmem.InvalidArgument),   # not a stream
            (lambda: rshmem.barrier(stream=1), rshmem.InvalidArgument),
        ]
        seen = []
        for c, exc in cases:
            try:
                c()
                seen.append(None)
            except exc as e:
                seen.append(str(e))
        torch.cuda.synchronize()
        rshmem.check_errors()
        return seen

    seen = run(f)
    assert all(m for m in seen), seen
    assert "out of range" in seen[5] and "out of range" in seen[6]


def test_given_stream_for_every_native_call():
    """put_signal, wait_until, quiet, barrier and all_reduce on a given side stream: the work
    is ordered on that stream (exact data after synchronising it alone)."""

    def f():
        dev = torch.device("cuda", rshmem.device())
        s = torch.cuda.Stream(device=dev)
        data = rshmem.zeros(256, torch.int32)
        src = rshmem.empty(256, torch.int32)
        sig = rshmem.zeros(1, torch.uint64)
        x = rshmem.empty(100, torch.float32)
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            src.copy_(gen(3, 256, torch.int32).to(dev))
            x.copy_(gen(4, 100, torch.float32).to(dev))
        rshmem.put_signal(data, src, sig, 9, 0, stream=s)
        rshmem.wait_until(sig, "==", 9, stream=s)
        rshmem.quiet(stream=s)
        rshmem.all_reduce(x, "max", stream=s)
        rshmem.barrier(stream=s)
        s.synchronize()
        rshmem.check_errors()
        return data.cpu(), sig.cpu(), x.cpu()

    data, sig, x = run(f)
    assert torch.equal(data, gen(3, 256, torch.int32))
    assert sig.view(torch.int64).tolist() == [9]
    assert torch.equal(x, gen(4, 100, torch.float32))
