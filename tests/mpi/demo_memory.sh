#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The memory level under mpirun, processes as nodes, each confined to its own node's memory:
#   demo_memory.sh MPIRUN CKPT_DEMO NP SCHEME
# A run saves every step to mem://run (NP nodes of one rank, SCHEME's parity in the other
# nodes' memory) and the whole job is SIGKILLed at a random instant; started again with
# --resume auto it continues from the newest generation in memory, and the losses of the
# steps after it equal an uninterrupted run's (exact hex floats). Killed again, with node 1's
# memory removed (a replaced node), the restart rebuilds node 1 from the other nodes' memory
# over the MPI coordinator first, then continues bit for bit. Each process sees only its
# node's memory directory (confine.sh): every byte of the others' comes over MPI.
set -eu
mpirun=$1 demo=$2 np=$3 scheme=$4
here=$(dirname "$0")
d=$(mktemp -d /var/tmp/ckpt-demo-memory-XXXXXX)
CKPT_MEMORY_DIR=$(mktemp -d /dev/shm/ckpt-mpi-memory-XXXXXX)
export CKPT_MEMORY_DIR
trap 'rm -rf "$d" "$CKPT_MEMORY_DIR"' EXIT
mkdir "$d/probe"
if ! unshare --mount sh -c "mount --make-rprivate / && mount -t tmpfs -o size=1m probe '$d/probe'" 2>"$d/why"; then
  echo "skipped: no mount namespace here ($(cat "$d/why"))"
  exit 77
fi
mem="$CKPT_MEMORY_DIR/ckpt-$(id -u)/run"
mkdir -m 0700 "$CKPT_MEMORY_DIR/ckpt-$(id -u)" "$mem"
n=0
while [ "$n" -lt "$np" ]; do mkdir -m 0700 "$mem/node-$n"; n=$((n + 1)); done
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss_hex":"\([^"]*\)".*/\1 \2/p' "$1" | awk -v from="$2" '$1 > from'; }
confined() { "$mpirun" --oversubscribe -np "$np" "$here/confine.sh" "$mem" 1 "$demo" --backend mpi --nodes "$np" --redundancy "$scheme" \
  --dir mem://run --save-every 1 --keep 2 "$@"; }
latest_step() { sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' "$mem/node-0/latest"; }

# Runs the job until a generation is in memory, then for a random 0..0.5 s, and SIGKILLs it all.
kill_job() {
  setsid "$mpirun" --oversubscribe -np "$np" "$here/confine.sh" "$mem" 1 "$demo" --backend mpi --nodes "$np" --redundancy "$scheme" \
    --dir mem://run --save-every 1 --keep 2 --steps 100000 --resume auto >"$d/killed.out" 2>&1 &
  job=$!
  i=0
  while [ ! -s "$mem/node-0/latest" ] && [ "$i" -lt 3000 ]; do sleep 0.01; i=$((i + 1)); done
  [ -s "$mem/node-0/latest" ] || { cat "$d/killed.out"; echo "no generation in memory after 30 s"; pkill -KILL -s "$job"; exit 1; }
  sleep "0.$(od -An -N1 -tu1 /dev/urandom | awk '{printf "%d", $1 % 50}')"
  pkill -KILL -s "$job" || true  # the whole session: mpirun and every rank
  wait "$job" 2>/dev/null || true
  sleep 0.2  # the ranks' exits
}

# Resumes to 6 steps past the newest generation and compares those steps with an uninterrupted run.
resume_and_compare() {
  from=$(latest_step)
  [ -n "$from" ] || { echo "no latest in node 0's memory"; exit 1; }
  to=$((from + 6))
  confined --resume auto --steps "$to" --metrics "$d/run.jsonl" >"$d/resume.out" 2>&1 || { cat "$d/resume.out"; exit 1; }
  grep -q "^recovery plan (after the checkpointer.s start-up): step $from from memory mem://run" "$d/resume.out" || { cat "$d/resume.out"; echo "the plan does not name step $from in memory"; exit 1; }
  grep -q "^resumed from step $from" "$d/resume.out" || { cat "$d/resume.out"; echo "not resumed from step $from"; exit 1; }
  grep -q "^time to recover: " "$d/resume.out" || { cat "$d/resume.out"; echo "no time to recover"; exit 1; }
  "$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --dir "$d/ref-$from" --save-every 1 --steps "$to" --metrics "$d/ref.jsonl" >"$d/ref.out" 2>&1 ||
    { cat "$d/ref.out"; exit 1; }
  losses "$d/ref.jsonl" "$from" >"$d/ref.txt"
  losses "$d/run.jsonl" "$from" >"$d/run.txt"
  [ "$(wc -l <"$d/run.txt")" -eq 6 ] || { cat "$d/run.txt"; echo "the resumed run has not 6 steps"; exit 1; }
  cmp "$d/ref.txt" "$d/run.txt" || { echo "losses after step $from differ from the uninterrupted run"; diff "$d/ref.txt" "$d/run.txt"; exit 1; }
}

kill_job
resume_and_compare
echo "killed: resumed from memory at step $from, steps $((from + 1))..$to bit for bit"
kill_job
rm -rf "$mem/node-1"
mkdir -m 0700 "$mem/node-1"  # the replaced node's memory: empty
resume_and_compare
grep -q "node-1/step-[0-9]*/.* rebuilt from" "$d/resume.out" || { cat "$d/resume.out"; echo "no rebuilt shard of node 1 named"; exit 1; }
echo "killed, node 1's memory gone: rebuilt from the others' over MPI, resumed at step $from, steps $((from + 1))..$to bit for bit"
