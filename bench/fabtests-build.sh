#!/usr/bin/env bash
# Builds libfabric's fabtests (fi_rma_bw, fi_rma_pingpong and the rest) from Debian's source
# package of the libfabric installed here (bookworm: 1.17.0), against the installed
# libfabric-dev, into a folder (default bench/fabtests/build, not committed).
#
#   bash bench/fabtests-build.sh [OUT_DIR]
#   LIBFABRIC_GIT=/path/to/libfabric.git bash bench/fabtests-build.sh [OUT_DIR]
#   PATH=$OUT_DIR/bin:$PATH rshmem perf --suites fabric
#
# The source is Debian's (`apt-get source`; a deb-src line for the archives the binary packages
# come from is added when none is configured), or, with LIBFABRIC_GIT, a clone of the upstream
# repository at the tag of the installed version (v1.17.0 for 1.17.0-3): the same fabtests
# (LIBFABRIC_TAG picks another tag, e.g. v1.21.0 for fi_rma_pingpong, where it builds against
# the installed headers).
# Needs root for apt, a C compiler, make and autotools (for the git tree). The binaries link the system's libfabric.so.1
# only: carrying OUT_DIR/bin to a machine with libfabric1 installed is enough.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:-$here/fabtests/build}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ver=$(dpkg-query -W -f '${Version}' libfabric-dev 2>/dev/null || true)
if [ -z "$ver" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric-dev
  ver=$(dpkg-query -W -f '${Version}' libfabric-dev)
fi
command -v dpkg-source >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
command -v make >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make gcc

cd "$work"
if [ -n "${LIBFABRIC_GIT:-}" ]; then
  tag="${LIBFABRIC_TAG:-v${ver%%-*}}"
  mkdir libfabric
  git -C "$LIBFABRIC_GIT" archive "$tag" fabtests | tar -x -C libfabric
else
  if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # The same archives as the binary packages, for source packages.
    sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > /etc/apt/sources.list.d/rshmem-deb-src.sources
  fi
  apt-get update -qq
  apt-get source -qq --download-only "libfabric=$ver" || {
    echo "no Debian source of libfabric $ver here: set LIBFABRIC_GIT to a clone of the upstream libfabric repository" >&2
    exit 1
  }
  dpkg-source -x --no-check libfabric_*.dsc libfabric >/dev/null
fi
cd libfabric/fabtests
[ -x configure ] || ./autogen.sh >/dev/null 2>&1
./configure -q --prefix="$out" --with-libfabric=/usr CFLAGS=-O2 >/dev/null
make -s -j"$(nproc)" >/dev/null
make -s install >/dev/null
echo "fabtests of libfabric $ver in $out/bin:"
ls "$out/bin" | grep -E '^fi_rma_(bw|pingpong)$'
