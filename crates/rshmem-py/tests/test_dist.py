"""torch.distributed's "rshmem" backend (``dist.init_process_group("rshmem")``): two ranks under
torchrun on CPU tensors (rshmem's host heap, also against gloo) and on CUDA tensors (both ranks
on GPU 0), and with an explicit store; the per-device string "cpu:gloo,cuda:rshmem" (CPU half
everywhere, CUDA half on a GPU); every call's data checked by tests/dist_worker.py.
Without torch: ``import rshmem`` still works and registers nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rshmem
from test_processes import clean_env, free_port_pair

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "dist_worker.py")

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def torchrun(mode, **env):
    e = clean_env()
    e.update(env)
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port_pair()), WORKER, mode],
        env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        cwd=str(HERE))
    assert r.returncode == 0, r.stdout[-20000:]
    assert r.stdout.count("OK rank") == 2, r.stdout[-20000:]


def test_without_torch_the_backend_is_not_registered():
    # In a fresh interpreter where torch cannot be imported, whatever this one has.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import rshmem\n"
        "assert rshmem.dist.BACKEND == 'rshmem' and rshmem.dist.Options().backend is None\n"
        "assert 'torch.distributed' not in sys.modules\n"
        "print('OK')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout


@needs_torch
def test_import_registers_the_backend():
    import torch.distributed as dist

    assert "rshmem" in dist.Backend.backend_list
    assert dist.Backend("rshmem") == "rshmem"
    # The defaults of other devices stay torch's.
    assert dist.Backend.default_device_backend_map.get("cpu") != "rshmem"
    assert rshmem.dist.Options(backend="shm").backend == "shm"


@needs_torch
def test_route_helpers():
    from rshmem._pg_route import device_map, first_tensor

    assert device_map("cpu:gloo,cuda:rshmem") == {"cpu": "gloo", "cuda": "rshmem"}
    assert device_map("cpu:rshmem,cuda:rshmem") == {"cpu": "rshmem", "cuda": "rshmem"}
    t, u = torch.zeros(1), torch.ones(2)
    assert first_tensor(([[], [t]], u)) is t
    assert first_tensor(([], None, 3)) is None
    assert first_tensor((u, [t])) is u


@needs_torch
def test_cpu_tensors_under_torchrun_against_exact_values_and_gloo():
    torchrun("cpu")


@needs_torch
def test_cpu_gloo_cuda_rshmem_string_cpu_half():
    torchrun("mixed")


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_gloo_cuda_rshmem_string_both_halves_on_one_gpu():
    torchrun("mixed-cuda", RSHMEM_DEVICES="0,0",
             NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))


@needs_torch
def test_explicit_store_rounds_and_own_world():
    port = free_port_pair()
    procs = [subprocess.Popen([sys.executable, WORKER, "store", str(r), str(port)],
                              env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=str(HERE))
             for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0 and "OK rank" in out, out


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_under_torchrun_two_ranks_on_one_gpu():
    torchrun("cuda", RSHMEM_DEVICES="0,0", NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
