"""rshmem.ep.Buffer under torchrun with 2 processes: the normal pair (tests/gpu_ep_worker.py)
and DeepEP's low-latency pair (low_latency_dispatch / low_latency_combine): bf16 and FP8 rows,
hooks with work between send and receive, empty and uneven token counts, identity experts
through combine, the cumulative statistics; every value checked against a reference
(tests/gpu_ll_worker.py). Two processes share the GPU where there is one. Skipped without
torch or without a CUDA GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_processes import clean_env, free_port_pair  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs torch with a CUDA GPU"
)


def torchrun(worker):
    """Runs tests/``worker`` under torchrun with 2 processes; both must print OK."""
    path = Path(__file__).parent / worker
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port_pair()), str(path)],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600, cwd=os.path.dirname(path))
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("OK rank") == 2, r.stdout


def test_low_latency_dispatch_combine_under_torchrun():
    torchrun("gpu_ll_worker.py")


def test_normal_dispatch_combine_under_torchrun():
    """Normal mode through rshmem.ep.Buffer (tests/gpu_ep_worker.py): staged and in-place
    inputs, a rank without tokens, exact outputs."""
    torchrun("gpu_ep_worker.py")
