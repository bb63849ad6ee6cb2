#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A checkpoint written by one backend resumes under the other, bit for bit:
#   demo_cross_backend.sh MPIRUN CKPT_DEMO NP
# runs the thread demo for 20 steps (the reference), then
#   threads 10 steps -> mpirun -np NP --resume to step 20, and
#   mpirun -np NP 10 steps -> threads --resume to step 20,
# and requires the losses of steps 11..20 (exact hex floats) to equal the reference's.
set -eu
mpirun=$1 demo=$2 np=$3
d=$(mktemp -d /var/tmp/ckpt-demo-cross-XXXXXX)
trap 'rm -rf "$d"' EXIT
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss_hex":"\([^"]*\)".*/\1 \2/p' "$1" | awk '$1 > 10'; }

"$demo" --world-size "$np" --steps 20 --dir "$d/ref" --metrics "$d/ref.jsonl" >/dev/null
losses "$d/ref.jsonl" >"$d/ref.txt"
[ "$(wc -l <"$d/ref.txt")" -eq 10 ] || { echo "reference run has no steps 11..20"; exit 1; }

"$demo" --world-size "$np" --steps 10 --dir "$d/t2m" >/dev/null
"$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --resume --steps 20 --dir "$d/t2m" --metrics "$d/t2m.jsonl" >"$d/t2m.out"
grep -q "resumed from step 10" "$d/t2m.out" || { cat "$d/t2m.out"; exit 1; }
losses "$d/t2m.jsonl" >"$d/t2m.txt"
cmp "$d/ref.txt" "$d/t2m.txt" || { echo "threads -> mpi: losses differ"; diff "$d/ref.txt" "$d/t2m.txt"; exit 1; }

"$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --steps 10 --dir "$d/m2t" >/dev/null
"$demo" --world-size "$np" --resume --steps 20 --dir "$d/m2t" --metrics "$d/m2t.jsonl" >"$d/m2t.out"
grep -q "resumed from step 10" "$d/m2t.out" || { cat "$d/m2t.out"; exit 1; }
losses "$d/m2t.jsonl" >"$d/m2t.txt"
cmp "$d/ref.txt" "$d/m2t.txt" || { echo "mpi -> threads: losses differ"; diff "$d/ref.txt" "$d/m2t.txt"; exit 1; }
echo "cross-backend resume at $np ranks: steps 11..20 equal bit for bit both ways"
