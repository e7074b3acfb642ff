#!/usr/bin/env bash
# On this (CPU) machine: builds the release abi3 wheel into .whl/ at the repository root, with
# pytest and its pure-Python dependencies in .whl/py/ for a GPU machine that cannot reach PyPI.
# Then run gpu-test.sh there with .whl carried along.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PY=${PY:-python3}
command -v maturin >/dev/null || "$PY" -m pip install -q "maturin>=1.5,<2"
rm -rf .whl/rshmem-*.whl
maturin build -q --release -m crates/rshmem-py/Cargo.toml -o .whl
mkdir -p .whl/py
rm -rf .whl/py
# Pure-Python wheels that install on any CPython from 3.9 on.
"$PY" -m pip download -q --no-deps --only-binary=:all: --implementation py --abi none \
  --platform any --python-version 3.9 -d .whl/py pytest pluggy iniconfig packaging \
  exceptiongroup tomli typing_extensions
ls -1 .whl .whl/py
