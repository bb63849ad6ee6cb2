#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# confine.sh ROOT RANKS_PER_NODE PROGRAM ARGS...
# Runs PROGRAM (one MPI rank, started by mpirun) so that of ROOT it sees only its own node's
# root, ROOT/node-n (n = rank / RANKS_PER_NODE), as a process on a machine of its own would:
# in a private mount namespace, ROOT is an empty tmpfs into which only ROOT/node-n is
# bind-mounted. The other nodes' roots are then out of reach, so every byte of them the
# program reads or writes must come through the MPI coordinator.
# Exits 77 (skip) where the kernel or the sandbox refuses a mount namespace.
set -eu
root=$1 rpn=$2
shift 2
rank=${OMPI_COMM_WORLD_RANK:?confine.sh runs under mpirun}
mine="$root/node-$((rank / rpn))"
mkdir -p "$mine"   # a replaced node starts with an empty root
exec unshare --mount sh -c '
  set -e
  root=$1 mine=$2
  shift 2
  mount --make-rprivate /
  hold=$(mktemp -d /tmp/ckpt-confine-XXXXXX)
  mount --bind "$mine" "$hold"
  mount -t tmpfs -o size=1m,mode=0700 ckpt-confined "$root"
  mkdir "$mine"
  mount --move "$hold" "$mine"
  rmdir "$hold"
  exec "$@"' confine "$root" "$mine" "$@"
