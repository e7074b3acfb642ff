"""Worlds: thread mode, PE identity, the error hierarchy, failures in one PE, the GIL."""

import threading

import numpy as np
import pytest

import rshmem
from conftest import run


def test_launch_returns_results_in_pe_order():
    out = run(4, lambda: (rshmem.my_pe(), rshmem.n_pes(), rshmem.backend(),
                          threading.current_thread().name))
    assert [o[:3] for o in out] == [(p, 4, "shm") for p in range(4)]
    assert [o[3] for o in out] == [f"rshmem-pe-{p}" for p in range(4)]


def test_launch_passes_args_and_finalizes():
    def f(a, b):
        assert rshmem.is_initialized()
        return a + b * rshmem.my_pe()

    assert run(3, f, 10, 2) == [10, 12, 14]
    assert not rshmem.is_initialized()


def test_no_world_raises():
    with pytest.raises(rshmem.WorldEnded):
        rshmem.my_pe()
    with pytest.raises(rshmem.WorldEnded):
        rshmem.numpy.empty(4)


def test_error_hierarchy():
    assert issubclass(rshmem.InvalidArgument, rshmem.Error)
    assert issubclass(rshmem.InvalidArgument, ValueError)
    assert issubclass(rshmem.Timeout, TimeoutError)
    assert issubclass(rshmem.HeapExhausted, MemoryError)
    for c in (rshmem.PeerLost, rshmem.CollectiveMismatch, rshmem.CapacityError,
              rshmem.WorldEnded, rshmem.Busy, rshmem.BackendError, rshmem.BootstrapError):
        assert issubclass(c, rshmem.Error)


def test_bad_launch_arguments():
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.launch(0, lambda: None)
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.launch(2, lambda: None, backend="tpu")
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.launch(2, lambda: None, timeout=-1.0)


def test_exception_in_one_pe_is_raised_and_peers_see_peer_lost():
    seen = {}

    def f():
        if rshmem.my_pe() == 1:
            raise KeyError("boom on PE 1")
        try:
            rshmem.barrier()
        except rshmem.PeerLost as e:
            seen["lost"] = e.pe
            raise

    with pytest.raises(KeyError, match="boom on PE 1"):
        run(2, f)
    assert seen["lost"] == 1


def test_blocking_calls_release_the_gil():
    # PE 1 waits for a word that PE 0 sets only after running Python code; a wait that held
    # the GIL would stop PE 0 and end in Timeout.
    def f():
        flag = rshmem.numpy.zeros(1, np.uint64)
        if rshmem.my_pe() == 0:
            total = 0
            for i in range(200_000):  # pure Python: needs the GIL
                total += i
            rshmem.atomic_set(flag, total, 1)
            rshmem.barrier()
            return total
        seen = rshmem.wait_until(flag, "==", sum(range(200_000)), timeout=15.0)
        rshmem.barrier()
        return seen

    a, b = run(2, f)
    assert a == b == sum(range(200_000))


def test_wait_timeout_reports_value():
    def f():
        w = rshmem.numpy.zeros(2, np.int32)
        w[0] = 5
        with pytest.raises(rshmem.Timeout):
            rshmem.wait_until(w[:1], ">", 5, timeout=0.2)
        assert rshmem.wait_until(w[:1], ">=", 5) == 5
        rshmem.barrier()
        return True

    assert run(2, f) == [True, True]


def test_init_argument_checks():
    uid = rshmem.unique_id()
    assert uid.startswith("rshmem1:")
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.init(rank=0)
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.init(rank=0, world_size=2, address="127.0.0.1:1", unique_id=uid)
    with pytest.raises(rshmem.InvalidArgument):
        rshmem.init(rank=0, world_size=2)
