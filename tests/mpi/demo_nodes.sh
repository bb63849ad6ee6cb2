#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Done-when sequence of node loss, under mpirun (one rank per process):
#   demo_nodes.sh MPIRUN CKPT_DEMO NP NODES SCHEME
# runs the demo for 20 steps across NODES node roots (the reference), then 10 steps into
# another DIR, deletes DIR/node-1, and resumes to step 20: rank 0's Checkpointer must name
# what it rebuilt, check (i) must pass, and the losses of steps 11..20 (exact hex floats)
# must equal the reference's. A thread run then resumes the same node set to step 30: the
# checkpoint MPI processes wrote across node roots is the one threads read. First, options
# the world cannot take (NODES+1 node roots) are refused with exit 2, said once (by rank 0),
# before any root is made.
set -eu
mpirun=$1 demo=$2 np=$3 nodes=$4 scheme=$5
d=$(mktemp -d /var/tmp/ckpt-demo-nodes-XXXXXX)
trap 'rm -rf "$d"' EXIT
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss_hex":"\([^"]*\)".*/\1 \2/p' "$1" | awk '$1 > 10 && $1 <= 20'; }
mpi() { "$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --nodes "$nodes" --redundancy "$scheme" "$@"; }

bad=$((nodes + 1))
set +e
"$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --nodes "$bad" --redundancy "$scheme" --dir "$d/bad" >"$d/bad.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { cat "$d/bad.out"; echo "--nodes $bad with -np $np: exit $rc, expected 2"; exit 1; }
[ "$(grep -c "^ckpt-demo: --nodes $bad must divide the world size $np" "$d/bad.out")" -eq 1 ] ||
  { cat "$d/bad.out"; echo "the usage error is not said exactly once"; exit 1; }
[ ! -e "$d/bad" ] || { echo "a refused run made its root"; exit 1; }

mpi --steps 20 --dir "$d/ref" --metrics "$d/ref.jsonl" >"$d/ref.out" || { cat "$d/ref.out"; exit 1; }
grep -q '^resume verified$' "$d/ref.out" || { cat "$d/ref.out"; echo "the reference run did not verify its resume"; exit 1; }
losses "$d/ref.jsonl" >"$d/ref.txt"
[ "$(wc -l <"$d/ref.txt")" -eq 10 ] || { echo "reference run has no steps 11..20"; exit 1; }

mpi --steps 10 --dir "$d/run" >"$d/first.out" || { cat "$d/first.out"; exit 1; }
rm -rf "$d/run/node-1"
mpi --resume --steps 20 --dir "$d/run" --metrics "$d/run.jsonl" >"$d/resume.out" || { cat "$d/resume.out"; exit 1; }
cat "$d/resume.out" | grep -E "rebuilt|resumed from|\(i\)"
grep -q "node-1/step-0000000010/.* rebuilt from" "$d/resume.out" || { cat "$d/resume.out"; echo "no rebuilt shard of node 1 named"; exit 1; }
grep -q "(i) lost shards rebuilt bit-exactly *PASS" "$d/resume.out" || { cat "$d/resume.out"; echo "check (i) did not pass"; exit 1; }
grep -q "^resumed from step 10$" "$d/resume.out" || { cat "$d/resume.out"; exit 1; }
losses "$d/run.jsonl" >"$d/run.txt"
cmp "$d/ref.txt" "$d/run.txt" || { echo "losses of steps 11..20 differ from the uninterrupted run"; diff "$d/ref.txt" "$d/run.txt"; exit 1; }

"$demo" --world-size "$np" --nodes "$nodes" --redundancy "$scheme" --resume --steps 25 --dir "$d/run" >"$d/threads.out" || { cat "$d/threads.out"; exit 1; }
grep -q "^resumed from step 20$" "$d/threads.out" || { cat "$d/threads.out"; exit 1; }
echo "mpirun -np $np across $nodes node roots ($scheme): node 1 rebuilt over the coordinator, steps 11..20 bit for bit; threads resume it"
