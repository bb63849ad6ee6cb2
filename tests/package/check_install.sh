#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the built ckpt into a scratch prefix and checks the package other projects consume,
# as they would consume it:
#   1. every installed header compiles on its own against the installed tree (so the headers
#      include only installed headers), and none but runtime/async_wait.hpp includes Asio;
#   2. tests/package/consumer builds with find_package(ckpt) + ckpt::ckpt + <ckpt/ckpt.hpp>
#      alone, and its compile line carries no definition of ckpt's (BOOST_ASIO_*, CKPT_*);
#      against a shared libckpt.so its link line names neither liburing nor OpenSSL;
#      it opens no s3:// root (the typed error) and loads no libcurl; with ckpt::s3
#      (COMPONENTS s3, tests/package/s3_consumer) the same program's S3 client answers;
#   3. the same main.cpp builds with pkg-config alone (g++ main.cpp $(pkg-config --cflags
#      --libs ckpt), and ckpt-s3), static or shared;
#   4. tests/package/async_consumer (COMPONENTS asio, ckpt::asio) co_awaits saves;
#   5. find_package(ckpt QUIET) with liburing.pc out of reach reports instead of failing:
#      ckpt not found, naming liburing, for a static libckpt.a (which links it); found, without
#      its asio component, for a shared one;
#   6. find_package(ckpt COMPONENTS mpi) from a C++-only project: not found, saying why;
#   7. add_subdirectory(ckpt) (tests/package/subdir_consumer): the parent's build type, all
#      and install stay its own;
#   8. where the build has the Prometheus endpoint (libckpt_metrics), tests/package/
#      metrics_consumer builds with find_package(ckpt COMPONENTS metrics) + ckpt::metrics.
#   check_install.sh BUILD_DIR SOURCE_DIR
#   HEADERS_ALONE=generated check_install.sh ...   step 1 for the headers the build generates
#       alone (version.hpp): the others are the source tree's files, which the Release suite's
#       package/find_package_consumer compiles one by one (99 s of one core here)
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
  if [ "${HEADERS_ALONE:-all}" = generated ] && [ -e "$src/lib/$h" ]; then continue; fi
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
    # Nor any other part of Boost: the metadata is a ckpt::JsonObject, Boost.JSON stays inside.
    grep -q '/boost/' "$scratch/one.d" && fail "installed header $h includes Boost: $(tr ' ' '\n' < "$scratch/one.d" | grep -m1 '/boost/')"
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
  echo "$link" | grep -qE 'uring|crypto|ssl|boost' && fail "a private dependency of the shared libckpt on the consumer's link line: $link"
fi
# No S3 client without ckpt::s3: an s3:// root is the typed error saying how to get it, and
# the program links no libcurl.
"$scratch/build/consumer" "$scratch/ckpts-cmake" no-s3
ldd "$scratch/build/consumer" | grep -q libcurl && fail "the consumer of ckpt::ckpt alone loads libcurl: $(ldd "$scratch/build/consumer" | grep libcurl)"
# No credentials for the S3 consumers below: their client must answer with its own error.
s3env=(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE
       -u AWS_CONTAINER_CREDENTIALS_FULL_URI HOME="$scratch" AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent)
s3=no; [ -n "$(find "$libdir" -maxdepth 1 -name 'libckpt_s3.*')" ] && s3=yes
if [ $s3 = yes ]; then  # 2b. COMPONENTS s3, ckpt::s3
  cmake -S "$src/tests/package/s3_consumer" -B "$scratch/build-s3" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release >/dev/null || fail "find_package(ckpt COMPONENTS s3) failed"
  cmake --build "$scratch/build-s3" >/dev/null
  "${s3env[@]}" "$scratch/build-s3/s3_consumer" "$scratch/ckpts-s3" s3 || fail "the ckpt::s3 consumer does not open s3:// roots"
fi

# 3. pkg-config alone, the README's line as it is (no --static: a static package's ckpt.pc
#    names its dependencies in Requires and Libs).
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --cflags ckpt | grep -qE -- '(^| )-D' && fail "pkg-config --cflags ckpt defines something: $(pkg-config --cflags ckpt)"
run() { if [ $kind = shared ]; then LD_LIBRARY_PATH="$libdir" "$@"; else "$@"; fi; }
# shellcheck disable=SC2046
g++ -std=c++20 -O1 "$src/tests/package/consumer/main.cpp" $(pkg-config --cflags --libs ckpt) -o "$scratch/consumer-pc" ||
  fail "the consumer does not build with pkg-config --cflags --libs ckpt"
run "$scratch/consumer-pc" "$scratch/ckpts-pc" no-s3
if [ $s3 = yes ]; then
  # shellcheck disable=SC2046
  g++ -std=c++20 -O1 "$src/tests/package/consumer/main.cpp" $(pkg-config --cflags --libs ckpt-s3) -o "$scratch/consumer-pc-s3" ||
    fail "the consumer does not build with pkg-config --cflags --libs ckpt-s3"
  run "${s3env[@]}" "$scratch/consumer-pc-s3" "$scratch/ckpts-pc-s3" s3 || fail "the pkg-config ckpt-s3 consumer does not open s3:// roots"
fi
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
# 5b. A shared libckpt.so: its soname carries major.minor, and it exports ckpt's API alone
#     (no instantiation of Asio, Boost.JSON or another dependency, no global C symbol).
if [ $kind = shared ]; then
  soname=$(objdump -p "$libdir/libckpt.so" | awk '$1 == "SONAME" { print $2 }')
  [[ "$soname" =~ ^libckpt\.so\.[0-9]+\.[0-9]+$ ]] || fail "libckpt.so's soname is '$soname', not libckpt.so.MAJOR.MINOR"
  nm -D --defined-only -C "$libdir/libckpt.so" | awk '$2 ~ /^[TWVDBRu]$/' | cut -d' ' -f3- > "$scratch/exported"
  foreign=$(grep -vE '^(ckpt::|typeinfo (name )?for ckpt::|vtable for ckpt::|VTT for ckpt::|guard variable for ckpt::|non-virtual thunk to ckpt::|virtual thunk to ckpt::|_init$|_fini$|CKPT_[0-9.]+$)' "$scratch/exported" | head -20 || true)
  [ -n "$foreign" ] && fail "libckpt.so exports symbols that are not ckpt's: $foreign"
  # (A symbol of Boost's own, or an instantiation over it, begins with boost:: and is refused
  # above. ckpt's helpers over Boost.JSON, format/boost_json.hpp, are exported for the
  # library's own programs and tests; no installed header declares them, as step 1 checks.)
  echo "check_install: libckpt.so ($soname) exports $(wc -l < "$scratch/exported") symbols"
fi

# 6. COMPONENTS mpi from a C++-only project: not found, saying that MPI needs the C language.
if [ -n "$(find "$libdir" -maxdepth 1 -name 'libckpt_mpi.*')" ]; then
  cmake -S "$src/tests/package/mpi_cxx_consumer" -B "$scratch/build-mpi-cxx" -DCMAKE_PREFIX_PATH="$prefix" \
    > "$scratch/mpi-cxx.log" 2>&1 || fail "configure failed: $(cat "$scratch/mpi-cxx.log")"
  grep -qE -- '-- ckpt_FOUND=(0|FALSE)$' "$scratch/mpi-cxx.log" || fail "COMPONENTS mpi found without the C language: $(cat "$scratch/mpi-cxx.log")"
  grep -q -- '-- ckpt_NOT_FOUND_MESSAGE=component mpi: .*enable the C language' "$scratch/mpi-cxx.log" ||
    fail "the reason does not name the C language: $(cat "$scratch/mpi-cxx.log")"
fi

# 7. add_subdirectory(ckpt) leaves the parent as it was: its build type (none), its `all`
#    (its own program alone is built) and its install (its own program alone).
cmake -S "$src/tests/package/subdir_consumer" -B "$scratch/build-subdir" -DCKPT_SOURCE_DIR="$src" \
  > "$scratch/subdir.log" 2>&1 || fail "the add_subdirectory consumer does not configure: $(tail -20 "$scratch/subdir.log")"
cmake --build "$scratch/build-subdir" > "$scratch/subdir-build.log" 2>&1 || fail "its all does not build: $(tail -20 "$scratch/subdir-build.log")"
[ -x "$scratch/build-subdir/own" ] || fail "the parent's own program was not built"
built=$(find "$scratch/build-subdir" -name '*.a' -o -name '*.so' -o -name '*.o' | grep -v '/own.dir/' || true)
[ -n "$built" ] && fail "the parent's all built ckpt's targets: $built"
cmake --install "$scratch/build-subdir" --prefix "$scratch/subdir-prefix" >/dev/null
installed=$(cd "$scratch/subdir-prefix" && find . -type f | sort | tr '\n' ' ')
[ "$installed" = "./bin/own " ] || fail "the parent's install installed more than its program: $installed"

# 8. The optional metrics component, when it was built.
if find "$prefix" -name 'libckpt_metrics.*' | grep -q .; then
  cmake -S "$src/tests/package/metrics_consumer" -B "$scratch/build-metrics" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$scratch/build-metrics" >/dev/null
  "$scratch/build-metrics/metrics_consumer" "$scratch/ckpts-metrics"
fi
echo "check_install: $kind package OK ($(wc -l < "$scratch/headers") headers)"
