# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# The Debian 13 (trixie) root that bench/peers.sh runs the peers in and scripts/test-torch2 runs
# the Python suite in: python3-torch 2.6 and python3-safetensors, which Debian 12 lacks. Built
# once with debootstrap and cached in $CKPT_PEERS_ROOT (default /var/tmp/ckpt-peers-root);
# packages a caller needs beyond those are installed into the cached root with apt-get.
# Sourced, not run:
#   . scripts/lib/debian13-root.sh
#   debian13_root_ensure NAME [PACKAGE...]   builds the root if missing, installs missing packages
# NAME prefixes the messages. Needs root; returns 77 (skip) when the root cannot be made here
# (not root, no debootstrap, the mirror unreachable), 1 on other failures.

debian13_root=${CKPT_PEERS_ROOT:-/var/tmp/ckpt-peers-root}

# What every user of the root needs: the peers' Python side.
debian13_root_base=(python3 python3-torch python3-safetensors python3-numpy)

debian13_root_mirror() {
  local mirror
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  echo "$mirror"
}

# The packages of "$@" that the root lacks (one per line).
debian13_root_missing() {
  local p
  for p in "$@"; do
    # shellcheck disable=SC2016 # ${Status} is dpkg-query's format, not the shell's
    chroot "$debian13_root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

debian13_root_ensure() {
  local name=$1
  shift
  local want=("${debian13_root_base[@]}" "$@")
  # Root for chroot itself, and for debootstrap and the mounts of the callers.
  if [ "$(id -u)" -ne 0 ]; then
    echo "$name: the Debian 13 root ($debian13_root) is entered with chroot, which needs root" >&2
    return 77
  fi
  if [ -x "$debian13_root/usr/bin/python3" ] && [ -z "$(debian13_root_missing "${want[@]}")" ]; then
    return 0
  fi
  local mirror
  mirror=$(debian13_root_mirror)
  if command -v curl >/dev/null && ! curl -fsS -o /dev/null --max-time 20 "$mirror/dists/trixie/Release"; then
    echo "$name: the Debian mirror $mirror is not reachable: no Debian 13 root can be made here" >&2
    return 77
  fi
  if ! command -v debootstrap >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
      { echo "$name: debootstrap is not installed and could not be" >&2; return 77; }
  fi
  if [ ! -x "$debian13_root/usr/bin/python3" ]; then
    local partial="$debian13_root.partial"
    if [ -e "$partial" ]; then
      # Never remove a tree something is still mounted in.
      if findmnt -rn -o TARGET | grep -q "^$partial\(/\|$\)"; then
        echo "$name: $partial has mounts; unmount them first" >&2
        return 1
      fi
      rm -rf "$partial"
    fi
    echo "== building the Debian 13 root in $debian13_root (from $mirror; about 1.5 GB, once)" >&2
    local include
    include=$(IFS=,; echo "${want[*]}")
    # shellcheck disable=SC2086 # PEERS_DEBOOTSTRAP_ARGS may hold several options (e.g. --no-check-gpg)
    debootstrap --variant=minbase --include="$include" ${PEERS_DEBOOTSTRAP_ARGS:-} trixie "$partial" "$mirror" >&2 ||
      return 1
    mv "$partial" "$debian13_root"
    return 0
  fi
  # A root made for fewer packages (an older peers.sh, another caller): add what is missing.
  local missing
  mapfile -t missing < <(debian13_root_missing "${want[@]}")
  echo "== installing into $debian13_root: ${missing[*]}" >&2
  local proc=0 rc=0
  if ! mountpoint -q "$debian13_root/proc"; then
    mount -t proc proc "$debian13_root/proc" && proc=1
  fi
  cp -L /etc/resolv.conf "$debian13_root/etc/resolv.conf" 2>/dev/null || true
  chroot "$debian13_root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null' sh "${missing[@]}" >&2 || rc=1
  if [ "$proc" = 1 ]; then umount "$debian13_root/proc" || umount -l "$debian13_root/proc"; fi
  return $rc
}
