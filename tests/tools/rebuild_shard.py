#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Rebuilds one rank's shard of a checkpoint across node roots, written only from
docs/format.md ("Nodes and redundancy"), sharing no code with ckpt: the test that the
specification is enough for an independent decoder.

    rebuild_shard.py DIR STEP RANK OUT [--lost N ...]

DIR holds the node roots DIR/node-0, DIR/node-1, ...; STEP is the checkpoint's directory
name (step-0000000010). Nodes named by --lost (and nodes whose checkpoint directory is
missing) are not read. Writes the rebuilt shard to OUT and exits 0 if its SHA-256 is the
manifest's; exits 1 otherwise, with the reason on stderr.
"""
import argparse
import hashlib
import json
import os
import sys

# ---- GF(2^8), polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) ---------------------------------


def gf_mul(a, b):
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        if a & 0x100:
            a ^= 0x11D
        b >>= 1
    return r


def gf_inv(a):
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^8)")
    for x in range(1, 256):
        if gf_mul(a, x) == 1:
            return x
    raise AssertionError("unreachable")


def code_matrix(k, m):
    """Rows 0..k-1 the identity; row k+p, column j: the inverse of ((k + p) xor j)."""
    rows = [[1 if j == i else 0 for j in range(k)] for i in range(k)]
    for p in range(m):
        rows.append([gf_inv((k + p) ^ j) for j in range(k)])
    return rows


def invert(matrix):
    """Gauss-Jordan over GF(2^8)."""
    n = len(matrix)
    a = [list(row) + [1 if i == j else 0 for j in range(n)] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if a[r][col])
        a[col], a[pivot] = a[pivot], a[col]
        inv = gf_inv(a[col][col])
        a[col] = [gf_mul(inv, x) for x in a[col]]
        for r in range(n):
            if r != col and a[r][col]:
                f = a[r][col]
                a[r] = [x ^ gf_mul(f, y) for x, y in zip(a[r], a[col])]
    return [row[n:] for row in a]


def combine(coefficients, pieces, length):
    """sum_j coefficients[j] * pieces[j], byte by byte (addition is xor)."""
    out = bytearray(length)
    for c, piece in zip(coefficients, pieces):
        if c == 0:
            continue
        table = bytes(gf_mul(c, x) for x in range(256))
        scaled = piece.translate(table)
        out = bytearray(x ^ y for x, y in zip(out, scaled))
    return bytes(out)


# ---- the layout ------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("step")
    ap.add_argument("rank", type=int)
    ap.add_argument("out")
    ap.add_argument("--lost", type=int, action="append", default=[])
    a = ap.parse_args()

    def node_dir(n):
        return os.path.join(a.dir, "node-%d" % n, a.step)

    manifest = None
    n = 0
    while manifest is None:
        path = os.path.join(node_dir(n), "manifest.json")
        if n not in a.lost and os.path.exists(path):
            manifest = json.load(open(path))
        n += 1
        if n > 1 << 20:
            sys.exit("no manifest")
    nodes = manifest["nodes"]["count"]
    per = manifest["nodes"]["ranks_per_node"]
    scheme = manifest["nodes"]["redundancy"]
    lost = set(a.lost) | {n for n in range(nodes) if not os.path.isdir(node_dir(n))}
    shards = sorted(manifest["shards"], key=lambda s: s["rank"])
    node_of = lambda r: r // per
    ranks_of = lambda n: range(n * per, (n + 1) * per)
    want = shards[a.rank]
    node = node_of(a.rank)
    lost.add(node)  # its own files are what is rebuilt, never read
    # Node data: its shard files back to back, rank order; the rank's offset in it.
    size = {n: sum(shards[r]["size"] for r in ranks_of(n)) for n in range(nodes)}
    start = sum(shards[r]["size"] for r in ranks_of(node) if r < a.rank)

    def node_bytes(n, offset, length):
        """Bytes [offset, offset + length) of good node n's data, zeros past its end."""
        out = bytearray()
        at = 0
        for r in ranks_of(n):
            s = shards[r]["size"]
            lo, hi = max(offset, at), min(offset + length, at + s)
            if lo < hi:
                with open(os.path.join(node_dir(n), shards[r]["path"]), "rb") as f:
                    f.seek(lo - at)
                    out += f.read(hi - lo)
            at += s
        return bytes(out) + bytes(length - len(out))

    if scheme.startswith("replicate:"):
        blocks = [b for b in manifest["redundancy_blocks"] if b["rank"] == a.rank and b["node"] not in lost]
        if not blocks:
            sys.exit("no surviving replica of rank %d" % a.rank)
        data = open(os.path.join(node_dir(blocks[0]["node"]), blocks[0]["path"]), "rb").read()
    elif scheme.startswith("rs:"):
        k, m = (int(x) for x in scheme[3:].split("+"))
        matrix = code_matrix(k, m)
        d = size[node]
        piece = (d + k - 1) // k
        rebuilt = b""
        for i in range(k):
            s = (node - i) % nodes  # the stripe holding piece i of this node
            members = []  # (row, node, offset, length) of each data member
            for j in range(k):
                n = (s + j) % nodes
                pj = (size[n] + k - 1) // k
                begin = min(size[n], j * pj)
                members.append((j, n, begin, min(size[n], begin + pj) - begin))
            length = max(x[3] for x in members)
            have_rows, have = [], []
            for row, n, off, ln in members:
                if n not in lost and len(have) < k:
                    have_rows.append(row)
                    have.append(node_bytes(n, off, ln) + bytes(length - ln))
            for p in range(m):
                n = (s + k + p) % nodes
                if n in lost or len(have) == k:
                    continue
                block = next(b for b in manifest["redundancy_blocks"] if b["stripe"] == s and b["index"] == p)
                assert block["node"] == n and block["size"] == length, block
                have_rows.append(k + p)
                have.append(open(os.path.join(node_dir(n), block["path"]), "rb").read())
            if len(have) < k:
                sys.exit("stripe %d: %d survivors, %d needed" % (s, len(have), k))
            inverse = invert([matrix[r] for r in have_rows])
            # data piece i = row i of the inverse applied to the survivors
            rebuilt += combine(inverse[i], have, length)[: members[i][3]]
        data = rebuilt[start : start + want["size"]]
    else:
        sys.exit("no redundancy: " + scheme)

    with open(a.out, "wb") as f:
        f.write(data)
    got = hashlib.sha256(data).hexdigest()
    if got != want["sha256"]:
        sys.exit("SHA-256 %s, the manifest says %s" % (got, want["sha256"]))


if __name__ == "__main__":
    main()
