#!/usr/bin/env bash
# On the GPU machine (2+ GPUs, torch with CUDA): installs the wheel that build-wheel.sh left in
# .whl/ beside torch (into a temporary directory on PYTHONPATH; the torch venv is untouched) and
# runs, by argument:
#   tests  the whole pytest suite: CPU tests with numpy and torch CPU tensors, the GPU tests in
#          thread mode, collectives against NCCL and the MoE layer example under torchrun
#          (on a machine of one GPU, RSHMEM_DEVICES=0,0 runs the two-PE tests with both PEs on
#          it; those that need two distinct GPUs skip)
#   bench  bench/bench.py under torchrun --nproc-per-node 2 (JSON; $BENCH_ARGS added, e.g.
#          BENCH_ARGS=--one-gpu RSHMEM_DEVICES=0,0 on a machine of one GPU)
#   all    both (default)
# Logs and bench.json go to $OUT (default /tmp/rshmem-py-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
PY=${PY:-/opt/torch/.venv/bin/python}
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
# Before torch initialises CUDA (see rshmem/__init__.py): no lazy kernel loads behind waiting kernels.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
out=${OUT:-/tmp/rshmem-py-gpu}
mkdir -p "$out"
site=$(mktemp -d)
set -e
"$PY" -m pip install -q --no-deps --no-index --target "$site" .whl/rshmem-*.whl
# The checkout's Python files over the wheel's (the same files when the wheel was built from this
# checkout; a wheel of another commit keeps its compiled module). A source directory put first
# on PYTHONPATH instead would shadow the package without its compiled _rshmem module.
cp crates/rshmem-py/python/rshmem/*.py "$site/rshmem/"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-index --target "$site" .whl/py/*.whl
fi
set +e
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import rshmem, torch; print('rshmem', rshmem.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPUs')"
rc=0
cd crates/rshmem-py
if [ "$what" = tests ] || [ "$what" = all ]; then
  "$PY" -m pytest -v -p no:cacheprovider tests 2>&1 | tee "$out/pytest.log"
  r=${PIPESTATUS[0]}
  # 5: nothing collected (a broken install or path): a failure.
  [ "$r" -eq 5 ] && echo "pytest collected no tests" >&2
  [ "$r" -ne 0 ] && rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  "$PY" -m torch.distributed.run --nproc-per-node 2 --master-port 29611 bench/bench.py \
    --json "$out/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
fi
echo "logs in $out"
exit $rc
