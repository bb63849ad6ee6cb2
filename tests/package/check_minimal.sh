#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The smallest ckpt a user can build: a shared library with none of the optional components
# (-DCKPT_S3=OFF -DCKPT_MPI=OFF -DCKPT_PYTHON=OFF), the library alone. Builds it from the
# source tree into a scratch directory and checks the installed package as check_install.sh
# does for a shared libckpt.so (CMake and pkg-config consumers, their s3:// error, no
# libcurl loaded, the soname, only ckpt's symbols exported).
#   check_minimal.sh SOURCE_DIR
set -euo pipefail
src=$1
scratch=$(mktemp -d /var/tmp/ckpt-minimal-XXXXXX)
trap '[ -n "${KEEP_SCRATCH:-}" ] || rm -rf "$scratch"' EXIT
# -O0 without debug information: this build checks what is built and exported, not speed, and
# compiles fastest.
cmake -S "$src" -B "$scratch/build" -DBUILD_SHARED_LIBS=ON -DCKPT_S3=OFF -DCKPT_MPI=OFF -DCKPT_PYTHON=OFF \
  -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_APPS=OFF -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0 > "$scratch/configure.log" 2>&1 ||
  { echo "check_minimal: configure failed: $(tail -20 "$scratch/configure.log")" >&2; exit 1; }
cmake --build "$scratch/build" -j "$(nproc 2>/dev/null || echo 2)" > "$scratch/build.log" 2>&1 ||
  { echo "check_minimal: build failed: $(grep -E 'error|Error' "$scratch/build.log" | head -20)" >&2; exit 1; }
for lib in libckpt_s3 libckpt_mpi; do
  [ -z "$(find "$scratch/build" -name "$lib.*")" ] || { echo "check_minimal: $lib built although its component is OFF" >&2; exit 1; }
done
# Its headers are the source tree's but version.hpp, which package/find_package_consumer
# compiles one by one from the Release tree: here only the generated one is compiled alone.
HEADERS_ALONE=generated "$src/tests/package/check_install.sh" "$scratch/build" "$src"
