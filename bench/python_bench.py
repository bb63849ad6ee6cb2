#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ckpt's Python module against torch's own ways, on the same tensors, in one run.

    PYTHONPATH=build/release/python python3 bench/python_bench.py --dir /var/tmp/pybench --mb 1024

Measures, for a state of --mb MiB in --tensors float32 tensors:
  clone          {k: v.clone()}: torch's cheapest isolated snapshot
  stall/deferred time ckpt's save(deferred=True) blocks the caller (the copy runs after)
  stall/copy     time ckpt's save() blocks the caller (copy into staging before returning)
  durable/ckpt   save_sync() call to checkpoint committed (fsynced, manifest, latest), steady
                 state (the staging pool warm)
  first/cold     the same for the first save of a Checkpointer made without a staging size
                 (the pool is allocated and first touched inside that save)
  first/prefaulted  the first save of a Checkpointer made with staging_bytes_per_rank=state
                 (the pool touched at construction: `construct` is that Checkpointer's making)
  durable/torch  torch.save to a file + fsync
  load/ckpt      Reader.load_into into existing tensors (verify="fast"; allocated and touched
                 before the load, as a model's are)
  load/torch     torch.load of that file
and the ratios the issue sets as targets: deferred stall <= 0.2x clone, durable >= 3x faster
than torch.save + fsync, load_into >= 2x faster than torch.load. Each figure is the median of
--repeat runs. The page cache is not dropped (run as root with --drop-caches to drop it
before each load). --json prints one JSON object instead of the table ("schema":
"python_bench/1"; its fields: docs/json-output.md).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch

import ckpt
from bench_json import with_schema


def passes(value, target):
    op, bound = target.split()
    return value <= float(bound) if op == "<=" else value >= float(bound)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--mb", type=float, default=1024)
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--drop-caches", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", help="also write the tables as markdown to this file (bench/peers.sh appends it)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    numel = max(1, int(a.mb * (1 << 20) / 4 / a.tensors))
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(numel, generator=g) for i in range(a.tensors)}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())

    res = {k: [] for k in ("clone", "stall_deferred", "stall_copy", "durable_ckpt", "durable_torch", "load_ckpt",
                           "load_torch", "first_cold", "first_prefaulted", "construct")}
    root = os.path.join(a.dir, "ckpt")
    step = 0
    for i in range(a.repeat):
        # A first save each way, each Checkpointer on a root of its own (removed after); the
        # steady state: the pre-faulted one's next saves, back to back.
        cold = os.path.join(a.dir, "cold")
        with ckpt.Checkpointer(cold, keep_last=1) as c:
            res["first_cold"].append(timed(lambda: c.save_sync(0, 1, state))[0])
        shutil.rmtree(cold)
        t, c = timed(lambda: ckpt.Checkpointer(cold, keep_last=1, staging_bytes_per_rank=state))
        res["construct"].append(t)
        with c:
            res["first_prefaulted"].append(timed(lambda: c.save_sync(0, 1, state))[0])
            for s in (2, 3):
                res["durable_ckpt"].append(timed(lambda: c.save_sync(0, s, state))[0])
        shutil.rmtree(cold)
    with ckpt.Checkpointer(root, keep_last=2, staging_bytes_per_rank=state) as c:
        backend = c.backend
        for _ in range(a.repeat):
            res["clone"].append(timed(lambda: {k: v.clone() for k, v in state.items()})[0])
            step += 1
            t0 = time.perf_counter()
            h = c.save(0, step, state, deferred=True)
            res["stall_deferred"].append(time.perf_counter() - t0)
            h.wait()
            step += 1
            t0 = time.perf_counter()
            h = c.save(0, step, state)
            res["stall_copy"].append(time.perf_counter() - t0)
            h.wait()

            path = os.path.join(a.dir, "state.pt")

            def torch_save():
                with open(path, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
            res["durable_torch"].append(timed(torch_save)[0])

            # Existing tensors, as a model's are: allocated and touched before the load.
            dst = {k: torch.zeros_like(v) for k, v in state.items()}
            if a.drop_caches:
                drop_caches()
            r = ckpt.open_latest(root)
            res["load_ckpt"].append(timed(lambda: r.load_into(0, dst))[0])
            if a.drop_caches:
                drop_caches()
            res["load_torch"].append(timed(lambda: torch.load(path))[0])
            assert all(torch.equal(dst[k], state[k]) for k in state)
    med = {k: statistics.median(v) for k, v in res.items()}
    ratios = {
        "stall_deferred / clone": (med["stall_deferred"] / med["clone"], "<= 0.2"),
        "durable torch / ckpt": (med["durable_torch"] / med["durable_ckpt"], ">= 3"),
        "first save (pre-faulted pool) / steady": (med["first_prefaulted"] / med["durable_ckpt"], "<= 1.1"),
        "load torch / ckpt": (med["load_torch"] / med["load_ckpt"], ">= 2"),
    }
    if a.json:
        print(json.dumps(with_schema("python_bench", 1, {"bytes": nbytes, "tensors": a.tensors, "median_s": med,
                                                         "ratios": {k: v[0] for k, v in ratios.items()}, "backend": backend})))
    else:
        print(f"state: {a.tensors} float32 tensors, {nbytes / (1 << 20):.1f} MiB; writer {backend}; median of {a.repeat}")
        for k, v in med.items():
            print(f"  {k:16s} {v * 1e3:10.2f} ms  {nbytes / v / (1 << 30) if v else float('inf'):8.2f} GiB/s")
        for k, (v, target) in ratios.items():
            print(f"  {'PASS' if passes(v, target) else 'FAIL'}  {k:24s} {v:8.2f}x  (target {target})")
    if a.markdown:
        names = {"clone": "clone() of the state (torch's cheapest isolated snapshot)",
                 "stall_deferred": "ckpt save(deferred=True): the caller blocked",
                 "stall_copy": "ckpt save() (copy before return): the caller blocked",
                 "durable_ckpt": "ckpt save_sync() to committed (fsynced, manifest, latest), steady state",
                 "first_cold": "ckpt first save_sync(), pool allocated inside it (no staging_bytes_per_rank)",
                 "first_prefaulted": "ckpt first save_sync(), pool touched at construction (staging_bytes_per_rank)",
                 "construct": "ckpt Checkpointer(staging_bytes_per_rank=state): the construction",
                 "durable_torch": "torch.save + fsync",
                 "load_ckpt": "ckpt open_latest().load_into (verify fast)",
                 "load_torch": "torch.load"}
        with open(a.markdown, "w") as f:
            f.write(f"\nThe Python module (bench/python_bench.py, Debian 12's torch {torch.__version__}, writer {backend}): "
                    f"{a.tensors} float32 tensors, {nbytes / (1 << 30):.2f} GiB, median of {a.repeat}"
                    f"{', page cache dropped before each load' if a.drop_caches else ''}.\n\n")
            f.write("| python | ms | GiB/s |\n|---|---|---|\n")
            for k, v in med.items():
                f.write(f"| {names[k]} | {v * 1e3:.1f} | {nbytes / v / (1 << 30) if v else float('inf'):.2f} |\n")
            f.write("\n| target | value | threshold | result |\n|---|---|---|---|\n")
            for k, (v, target) in ratios.items():
                f.write(f"| {k} | {v:.3f} | {target} | {'PASS' if passes(v, target) else '**FAIL**'} |\n")
    shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
