#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the built ckpt into a scratch prefix and checks the package other projects consume,
# as they would consume it:
#   1. every installed header compiles on its own against the installed tree (so the headers
#      include only installed headers), and none but runtime/async_wait.hpp includes Asio;
#   2. tests/package/consumer builds with find_package(ckpt) + ckpt::ckpt + <ckpt/ckpt.hpp>
#      alone, and its compile line carries no definition of ckpt's (BOOST_ASIO_*, CKPT_*);
#      against a shared libckpt.so its link line names neither liburing nor OpenSSL;
#   3. the same main.cpp builds with pkg-config alone (g++ main.cpp $(pkg-config ... ckpt));
#   4. tests/package/async_consumer (COMPONENTS asio, ckpt::asio) co_awaits saves;
#   5. find_package(ckpt QUIET) with liburing.pc out of reach reports instead of failing:
#      ckpt not found, naming liburing, for a static libckpt.a (which links it); found, without
#      its asio component, for a shared one.
#   6. where the build has the Prometheus endpoint (libckpt_metrics), tests/package/
#      metrics_consumer builds with find_package(ckpt COMPONENTS metrics) + ckpt::metrics.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
scratch=$(mktemp -d /var/tmp/ckpt-install-XXXXXX)
trap '[ -n "${KEEP_SCRATCH:-}" ] || rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
fail() { echo "check_install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libckpt.*' \( -name '*.a' -o -name '*.so' \) | head -1)")
[ -d "$libdir" ] || fail "no libckpt installed"
[ -f "$prefix/share/doc/ckpt/LICENSE" ] && grep -q "Apache License" "$prefix/share/doc/ckpt/LICENSE" ||
  fail "the licence is not installed as share/doc/ckpt/LICENSE"
if [ -e "$libdir/libckpt.so" ]; then kind=shared; else kind=static; fi

# 1. Headers, each alone (async_wait.hpp with the definition ckpt::asio gives; the MPI header
#    with MPI's include path).
mpi_flags=$(pkg-config --cflags ompi-c 2>/dev/null || true)
(cd "$prefix/include" && find ckpt -name '*.hpp' | sort) > "$scratch/headers"
[ -s "$scratch/headers" ] || fail "no headers installed"
while read -r h; do
  flags=""
  case $h in
    ckpt/runtime/async_wait.hpp) flags=-DBOOST_ASIO_HAS_IO_URING ;;
    ckpt/dist/mpi/*) flags="$mpi_flags" ;;
  esac
  printf '#include <%s>\n#include <%s>\n' "$h" "$h" > "$scratch/one.cpp"
  # One compile both checks the header and lists what it includes (-MD: the dependencies as a
  # side effect of the syntax check, instead of a second preprocessing run).
  g++ -std=c++20 -fsyntax-only -MD -MF "$scratch/one.d" $flags -I"$prefix/include" "$scratch/one.cpp" 2> "$scratch/err" ||
    fail "installed header $h does not compile on its own: $(head -5 "$scratch/err")"
  if [ "$h" != ckpt/runtime/async_wait.hpp ]; then
    grep -q 'boost/asio' "$scratch/one.d" && fail "installed header $h includes Asio"
  fi
done < "$scratch/headers"
for h in train/trainer.hpp testing/fault_injection.hpp testing/memory_file_system.hpp core/random.hpp; do
  [ ! -e "$prefix/include/ckpt/$h" ] || fail "ckpt/$h is installed, but it is not part of the public API"
done

# 2. The CMake consumer, and its compile line.
cmake -S "$src/tests/package/consumer" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" -- VERBOSE=1 > "$scratch/build.log"
compile=$(grep -E '(c\+\+|g\+\+).* -c .*main\.cpp' "$scratch/build.log") || fail "no compile line for main.cpp in the build log"
echo "$compile" | grep -qE 'BOOST_ASIO|-DCKPT|-luring' && fail "ckpt-private flags on the consumer's compile line: $compile"
if [ $kind = shared ]; then  # liburing and OpenSSL stay inside libckpt.so
  link=$(grep -E ' -o consumer ' "$scratch/build.log") || fail "no link line for the consumer in the build log"
  echo "$link" | grep -qE 'uring|crypto|ssl' && fail "a private dependency of the shared libckpt on the consumer's link line: $link"
fi
"$scratch/build/consumer" "$scratch/ckpts-cmake"

# 3. pkg-config alone. A static libckpt.a needs its private dependencies: --static.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pcstatic=""; [ $kind = static ] && pcstatic=--static
pkg-config --cflags ckpt | grep -qE -- '(^| )-D' && fail "pkg-config --cflags ckpt defines something: $(pkg-config --cflags ckpt)"
# shellcheck disable=SC2046
g++ -std=c++20 -O1 "$src/tests/package/consumer/main.cpp" $(pkg-config $pcstatic --cflags --libs ckpt) -o "$scratch/consumer-pc" ||
  fail "the consumer does not build with pkg-config $pcstatic --cflags --libs ckpt"
if [ $kind = shared ]; then LD_LIBRARY_PATH="$libdir" "$scratch/consumer-pc" "$scratch/ckpts-pc"; else "$scratch/consumer-pc" "$scratch/ckpts-pc"; fi
unset PKG_CONFIG_PATH

# 4. The opt-in Asio consumer.
cmake -S "$src/tests/package/async_consumer" -B "$scratch/build-async" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build-async" >/dev/null
"$scratch/build-async/async_consumer" "$scratch/ckpts-async"

# 5. QUIET with liburing.pc out of reach: the system's .pc files hidden (PKG_CONFIG_LIBDIR),
#    only the prefix's own (ckpt.pc) left.
PKG_CONFIG_LIBDIR="$scratch/no-pc-files" cmake -S "$src/tests/package/quiet_consumer" -B "$scratch/build-quiet" \
  -DCMAKE_PREFIX_PATH="$prefix" > "$scratch/quiet.log" 2>&1 || fail "configure failed: $(cat "$scratch/quiet.log")"
if [ $kind = static ]; then
  grep -qE -- '-- ckpt_FOUND=(0|FALSE)$' "$scratch/quiet.log" || fail "ckpt found without liburing: $(cat "$scratch/quiet.log")"
  grep -q -- '-- ckpt_NOT_FOUND_MESSAGE=liburing not found' "$scratch/quiet.log" || fail "the reason does not name liburing: $(cat "$scratch/quiet.log")"
else
  grep -qE -- '-- ckpt_FOUND=(1|TRUE)$' "$scratch/quiet.log" || fail "a shared ckpt should not need liburing: $(cat "$scratch/quiet.log")"
  grep -q -- '-- ckpt_asio_FOUND=FALSE' "$scratch/quiet.log" || fail "ckpt::asio reported found without liburing: $(cat "$scratch/quiet.log")"
fi
# 6. The optional metrics component, when it was built.
if find "$prefix" -name 'libckpt_metrics.*' | grep -q .; then
  cmake -S "$src/tests/package/metrics_consumer" -B "$scratch/build-metrics" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$scratch/build-metrics" >/dev/null
  "$scratch/build-metrics/metrics_consumer" "$scratch/ckpts-metrics"
fi
echo "check_install: $kind package OK ($(wc -l < "$scratch/headers") headers)"
