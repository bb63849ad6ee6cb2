#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# ckpt-demo under mpirun, preempted: one rank's process gets SIGTERM (as a node's scheduler
# would send it) at a seeded instant; every rank agrees on the step, mpirun exits 0 with the
# line naming `latest`, `ckpt verify --full` accepts it, and a --resume under mpirun matches
# an uninterrupted run loss for loss (exact hex floats):
#   demo_preempt.sh MPIRUN CKPT_DEMO NP SEED
set -eu
mpirun=$1 demo=$2 np=$3 seed=$4
tool=$(dirname "$demo")/ckpt
d=$(mktemp -d /var/tmp/ckpt-demo-preempt-XXXXXX)
trap 'rm -rf "$d"' EXIT
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss_hex":"\([^"]*\)".*/\1 \2/p' "$1" | awk -v from="$2" '$1 > from'; }

"$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --steps 100000 --save-every 50 --dir "$d/root" --metrics "$d/m.jsonl" >"$d/out" 2>&1 &
pid=$!
i=0
while [ ! -d "$d/root" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i + 1)); done
sleep "$(awk -v s="$seed" 'BEGIN { srand(s); printf "%.3f", 0.2 + rand() * 0.8 }')"
ranks=$(pgrep -P "$pid" || true)
[ -n "$ranks" ] || { echo "no rank processes under mpirun $pid"; kill -KILL "$pid"; cat "$d/out"; exit 1; }
victim=$(echo "$ranks" | awk -v s="$seed" 'BEGIN { srand(s) } { p[NR] = $1 } END { print p[int(rand() * NR) + 1] }')
kill -TERM "$victim"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { echo "mpirun exited $rc after SIGTERM to rank process $victim"; tail -20 "$d/out"; exit 1; }
line=$(tail -1 "$d/out")
echo "$line"
step=$(echo "$line" | sed -n 's/^preempted by SIGTERM at step \([0-9]*\): latest is step-0*\([0-9]*\)$/\1 \2/p')
[ -n "$step" ] || { echo "unexpected last line"; tail -5 "$d/out"; exit 1; }
set -- $step
[ "$1" = "$2" ] || { echo "latest is not the emergency step"; exit 1; }
[ "$(cat "$d/root/latest")" = "$(printf 'step-%010d' "$1")" ] || { echo "latest on disk: $(cat "$d/root/latest")"; exit 1; }
[ "$(wc -l <"$d/m.jsonl")" -eq "$1" ] || { echo "metrics do not hold steps 1..$1"; exit 1; }
"$tool" verify --full "$d/root" >/dev/null || { "$tool" verify --full "$d/root"; exit 1; }

to=$(($1 + 5))
"$mpirun" --oversubscribe -np "$np" "$demo" --backend mpi --save-every 50 --resume --steps "$to" --dir "$d/root" --metrics "$d/r.jsonl" >"$d/r.out" 2>&1 ||
  { tail -20 "$d/r.out"; exit 1; }
grep -q "resumed from step $1\$" "$d/r.out" || { tail -20 "$d/r.out"; exit 1; }
"$demo" --world-size "$np" --save-every 50 --steps "$to" --dir "$d/ref" --metrics "$d/ref.jsonl" >/dev/null
losses "$d/ref.jsonl" "$1" >"$d/ref.txt"
losses "$d/r.jsonl" "$1" >"$d/r.txt"
[ "$(wc -l <"$d/ref.txt")" -eq 5 ] || { echo "reference has no steps $(($1 + 1))..$to"; exit 1; }
cmp "$d/ref.txt" "$d/r.txt" || { echo "resumed losses differ"; diff "$d/ref.txt" "$d/r.txt"; exit 1; }
echo "preempted at step $1 under mpirun -np $np: resumed steps $(($1 + 1))..$to equal an uninterrupted run bit for bit"
