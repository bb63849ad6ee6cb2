#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# nodes_lost.sh MPIRUN MPI_NODES CKPT NP NODES SCHEME LOST [confine|durable]
# Checkpoints across node roots under mpirun, one rank per process: an uninterrupted run to
# step 20 (the reference); a run to step 10 into DIR; node root LOST deleted (its disk is
# gone); a run resumed from DIR to step 20, whose Checkpointer rebuilds the lost node over
# the MPI coordinator before any process resumes. Passes when the resumed steps 11..20 and the
# final parameters of every rank equal the reference's bit for bit, rank 0 names what it
# rebuilt, and `ckpt verify --full` passes on every node root afterwards. With `confine`,
# every process sees only its own node's root (tests/mpi/confine.sh), so nothing can have
# moved through a shared file system. With `durable`, the runs into DIR also copy every
# checkpoint to a durable tier (from rank 0's process, through the coordinator), which must
# hold step 20, verified, at the end.
set -u
mpirun=$1 prog=$2 ckpt=$3 np=$4 nodes=$5 scheme=$6 lost=$7 mode=${8:-}
confine= tier=
[ "$mode" = confine ] && confine=1
[ "$mode" = durable ] && tier="durable=$(mktemp -d /var/tmp/ckpt-mpi-durable-XXXXXX)/tier"
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d /var/tmp/ckpt-mpi-nodes-XXXXXX)
trap 'rm -rf "$d" ${tier:+"$(dirname "${tier#durable=}")"}' EXIT
rpn=$((np / nodes))
run() {  # run ROOT ARGS...
  r=$1
  shift
  if [ -n "$confine" ]; then
    "$mpirun" --oversubscribe -np "$np" "$here/confine.sh" "$r" "$rpn" "$prog" train "$r" "$nodes" "$scheme" "$@"
  else
    "$mpirun" --oversubscribe -np "$np" "$prog" train "$r" "$nodes" "$scheme" "$@"
  fi
}
fail() { echo "FAILED: $*"; exit 1; }
if [ -n "$confine" ]; then
  mkdir -p "$d/probe"
  if ! unshare --mount sh -c "mount --make-rprivate / && mount -t tmpfs -o size=1m probe '$d/probe'" 2>"$d/why"; then
    echo "skipped: no mount namespace here ($(cat "$d/why"))"
    exit 77
  fi
fi

run "$d/ref" 20 "$d/ref.txt" > "$d/ref.log" 2>&1 || { cat "$d/ref.log"; fail "the reference run"; }
run "$d/run" 10 "$d/first.txt" $tier > "$d/first.log" 2>&1 || { cat "$d/first.log"; fail "the run to step 10"; }
for n in $(seq 0 $((nodes - 1))); do
  [ -f "$d/run/node-$n/latest" ] || fail "node-$n has no latest after the first run"
done
# Each node holds its own ranks' shards and no other's.
for r in $(seq 0 $((np - 1))); do
  f=$(printf 'rank-%05d-of-%05d.safetensors' "$r" "$np")
  n=$((r / rpn))
  [ -f "$d/run/node-$n/step-0000000010/$f" ] || fail "rank $r's shard is not on node $n"
done
rm -rf "$d/run/node-$lost"
run "$d/run" 20 "$d/resumed.txt" resume $tier > "$d/resume.log" 2>&1 || { cat "$d/resume.log"; fail "the resumed run"; }
cat "$d/resume.log"
case "$scheme" in
  rs:*) want="rebuilt from parity" ;;
  *) want="rebuilt from its replica" ;;
esac
grep -q "^step-0000000010: rank .*(node-$lost/step-0000000010/.*) $want" "$d/resume.log" || fail "rank 0 did not report node $lost's shards $want"
grep -q "^resumed from step 10$" "$d/resume.log" || fail "the run did not resume from step 10"
# Steps 11..20 and the final parameters of every rank, bit for bit.
tail -n 11 "$d/ref.txt" > "$d/want.txt"
cmp -s "$d/want.txt" "$d/resumed.txt" || { diff "$d/want.txt" "$d/resumed.txt"; fail "the resumed run differs from the uninterrupted one"; }
"$ckpt" verify --full "$d/run" > "$d/verify.txt" 2>&1 || { cat "$d/verify.txt"; fail "ckpt verify --full after the rebuild"; }
if [ -n "$tier" ]; then
  t=${tier#durable=}
  [ "$(cat "$t/latest")" = step-0000000020 ] || fail "the durable tier's latest is $(cat "$t/latest" 2>&1), expected step-0000000020"
  "$ckpt" verify --full "$t" > "$d/verify-tier.txt" 2>&1 || { cat "$d/verify-tier.txt"; fail "ckpt verify --full of the durable tier"; }
  grep -q " 0 failed attempts" "$d/resume.log" || fail "the durable tier's copies failed (or no durable tier line)"
fi
echo "node $lost of $nodes rebuilt ($scheme, $np processes${confine:+, each confined to its node root}${tier:+, with a durable tier}); steps 11..20 and the final parameters equal the uninterrupted run's"
