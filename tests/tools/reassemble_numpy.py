#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An independent reader of sharded checkpoints, written from docs/format.md alone.

    reassemble_numpy.py CHECKPOINT_DIR MODEL.safetensors

Reads CHECKPOINT_DIR/manifest.json (schema 1, 2 or 3: a rank's shard in several files, each
entry of `shards` naming its `part`, each tensor the `part` holding it, 0 if absent), reassembles every global tensor of the
`slice` descriptions, and every replicated tensor, from the shard files' byte ranges, and
compares each with the tensor of the same name in MODEL.safetensors (what `ckpt
consolidate` wrote). Exit 0 if every one matches bit for bit and nothing is missing.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8", "I8": "i1", "I16": "<i2", "I32": "<i4",
          "I64": "<i8", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "u1"}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def main(ckpt_dir, model_path):
    with open(os.path.join(ckpt_dir, "manifest.json")) as f:
        m = json.load(f)
    assert m["schema_version"] in (1, 2, 3), m["schema_version"]
    paths = {(s["rank"], s.get("part", 0)): os.path.join(ckpt_dir, s["path"]) for s in m["shards"]}
    assert len(paths) == len(m["shards"]), "a (rank, part) listed twice"
    files = {}

    def stored(t):  # the entry's bytes, from the file of its rank that holds it
        key = (t["rank"], t.get("part", 0))
        if key not in files:
            with open(paths[key], "rb") as f:
                files[key] = f.read()
        b, e = t["byte_range"]
        return np.frombuffer(files[key][b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])

    globals_ = {}
    for t in m["tensors"]:
        if "slice" in t:
            s = t["slice"]
            g = globals_.setdefault(s["global"], np.zeros(s["global_shape"], dtype=DTYPES[t["dtype"]]))
            box = tuple(slice(o, o + n) for o, n in zip(s["offsets"], s["lengths"]))
            g[box] = stored(t)
        elif "replicated" in t:
            globals_[t["name"]] = stored(t).copy()
    model = read_safetensors(model_path)
    bad = 0
    for name, g in sorted(globals_.items()):
        if name not in model:
            print(f"{name}: missing from {model_path}")
            bad += 1
        elif model[name].shape != g.shape or model[name].tobytes() != g.tobytes():
            print(f"{name}: differs ({model[name].shape} vs {g.shape})")
            bad += 1
        else:
            print(f"{name}: equal {list(g.shape)}")
    if not globals_:
        print("no sliced or replicated tensors")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
