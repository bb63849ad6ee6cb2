#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ckpt against what users run today, on the same tensors and the same disk, interleaved:
# each round runs ckpt-bench (sync and async io_uring saves, loads) and then bench/peers.py
# (torch.save + fsync, torch.load, dcp.save, dcp.async_save, dcp.load, safetensors load_file and
# safe_open), and the end prints ckpt's figures as ratios to theirs; then bench/python_bench.py
# measures the Python module against Debian 12's torch on the host. See bench/README.md.
#
#   bench/peers.sh [--size 1G] [--rounds 5] [--dir DIR] [--out DIR] [--bench PATH]
#
# Python: $PEERS_PYTHON if set (needs torch >= 2.3 and safetensors); otherwise a Debian 13
# root made with debootstrap (python3-torch 2.6, python3-safetensors), cached in
# $CKPT_PEERS_ROOT (default /var/tmp/ckpt-peers-root, ~1.5 GB), run with chroot; the data
# directory is bind-mounted into it so both sides use the same disk. Needs root for that.
set -euo pipefail
cd "$(dirname "$0")/.."

size=1G
rounds=5
dir=""
out=bench/out/peers
bench=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "peers.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

if [ -z "$bench" ]; then
  bench=build/release/bin/ckpt-bench
  [ -x "$bench" ] || scripts/setup build/release
fi
[ -x "$bench" ] || { echo "peers.sh: no ckpt-bench at $bench" >&2; exit 1; }

own_dir=0
if [ -z "$dir" ]; then
  dir=$(mktemp -d "${TMPDIR:-/var/tmp}/ckpt-peers-data-XXXXXX")
  own_dir=1
fi
mkdir -p "$dir" "$out"
dir=$(cd "$dir" && pwd)
out=$(cd "$out" && pwd)

# The Debian 13 root (scripts/lib/debian13-root.sh, shared with scripts/test-torch2).
# shellcheck source=scripts/lib/debian13-root.sh
. scripts/lib/debian13-root.sh
root=$debian13_root
mnt=/mnt/ckpt-peers
ckpt_python=()
mounted=()

cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" 2>/dev/null || true
  done
  mounted=()
  if [ "$own_dir" = 1 ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${PEERS_PYTHON:-}" ]; then
  "$PEERS_PYTHON" - <<'EOF'
import sys, torch, safetensors
v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if v >= (2, 3) else "PEERS_PYTHON has torch %s; need >= 2.3" % torch.__version__)
EOF
  py=("$PEERS_PYTHON")
  inside=$dir
  cp bench/peers.py bench/bench_json.py "$dir/"
else
  debian13_root_ensure peers.sh || { echo "peers.sh: no Debian 13 root (or set PEERS_PYTHON)" >&2; exit 1; }
  mkdir -p "$root$mnt"
  mount --bind "$dir" "$root$mnt"
  mounted+=("$root$mnt")
  if ! mountpoint -q "$root/proc"; then
    mount -t proc proc "$root/proc"
    mounted+=("$root/proc")
  fi
  cp bench/peers.py bench/bench_json.py "$dir/"
  # DCP through ckpt.dcp too, with the module scripts/test-torch2 built for the root's Python.
  if compgen -G "build/torch2/python/ckpt/_core*.so" >/dev/null; then
    rm -rf "$dir/ckpt-python"
    cp -r build/torch2/python "$dir/ckpt-python"
    ckpt_python=(--ckpt-python "$mnt/ckpt-python")
  else
    echo "== no build/torch2/python (scripts/test-torch2 builds it): DCP through ckpt.dcp is left out" >&2
  fi
  py=(chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USE_LIBUV=0 OMP_NUM_THREADS="$(nproc)" python3)
  inside=$mnt
fi

echo "== $rounds interleaved rounds of ckpt-bench and the peers, $size, in $dir" >&2
ck=()
pe=()
for ((r = 1; r <= rounds; r++)); do
  "$bench" --size "$size" --repeats 1 --saves 1 --every 1 --step-ms 0 --modes sync,async_io_uring --soak 0 --no-cold-pool \
    --dir "$dir/ckpt" --json "$dir/ckpt-$r.json" --layout "$dir/layout.json" > "$out/ckpt-$r.txt"
  echo "== round $r: ckpt-bench done" >&2
  "${py[@]}" "$inside/peers.py" run --layout "$inside/layout.json" --dir "$inside" --json "$inside/peers-$r.json" --round "$r" \
    "${ckpt_python[@]}"
  echo "== round $r: peers done" >&2
  cp "$dir/ckpt-$r.json" "$dir/peers-$r.json" "$out/"
  ck+=("$inside/ckpt-$r.json")
  pe+=("$inside/peers-$r.json")
done
"${py[@]}" "$inside/peers.py" combine --ckpt "${ck[@]}" --peers "${pe[@]}" --json "$inside/peers.json" --markdown "$inside/peers.md"
# The Python module against Debian 12's torch on the host (a module built for this host's
# Python cannot be imported in the Debian 13 root), same disk, appended to the table.
pymod=$(cd "$(dirname "$bench")/.." && pwd)/python
if [ -d "$pymod/ckpt" ] && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  mb=$(( $(numfmt --from=iec "$size") / 1048576 ))
  PYTHONPATH=$pymod /usr/bin/python3 bench/python_bench.py --dir "$dir/python" --mb "$mb" --repeat "$rounds" --drop-caches \
    --markdown "$dir/python.md" > "$out/python.txt"
  cat "$dir/python.md" >> "$dir/peers.md"
  echo "== the Python module's figures: $out/python.txt" >&2
else
  echo "== no Python module at $pymod (or no torch for /usr/bin/python3): its figures are left out" >&2
fi
cp "$dir/peers.json" "$dir/peers.md" "$dir/layout.json" "$out/"
echo "== written: $out/peers.md, $out/peers.json" >&2
