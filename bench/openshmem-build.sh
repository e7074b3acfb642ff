#!/usr/bin/env bash
# Builds the OpenSHMEM baseline of `rshmem perf --suites fabric` with Open MPI's oshcc
# (Debian's openmpi-bin / libopenmpi-dev 4.1.4 ship OSHMEM with spml ucx) into OUT_DIR/bin.
#
#   bash bench/openshmem-build.sh [OUT_DIR]     # default bench/openshmem/build (not committed)
#   PATH=$OUT_DIR/bin:$PATH rshmem perf --suites fabric
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:-$here/openshmem/build}")
if ! command -v oshcc >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev
fi
mkdir -p "$out/bin"
oshcc -O2 -o "$out/bin/rshmem-oshmem-fabric-bench" "$here/openshmem/fabric_bench.c"
echo "$out/bin/rshmem-oshmem-fabric-bench"
