#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a user would run instead of ckpt, on the same tensors and the same disk.

  peers.py run --layout LAYOUT.json --dir DIR --json OUT.json [--threads N]
      Builds the state ckpt-bench describes in LAYOUT.json (same names, dtypes, shapes) and
      times, in an order rotated by --round: torch.save + fsync, torch.load, dcp.save,
      dcp.async_save (time to return, time until durable, does a mutation made right after
      it returns leak into the checkpoint?), dcp.load, safetensors save_file + fsync,
      load_file, and safe_open (lazy: one small tensor, then every tensor). The page cache
      of the files is dropped before every load. With --ckpt-python DIR (the ckpt package
      built for this Python: build/torch2/python), also dcp.save and dcp.load through
      ckpt.dcp.Writer and ckpt.dcp.Reader (verify fast) on the same tensors. Each DCP writer
      saves twice through one writer object (a training loop's): first and second timed apart.

  peers.py combine --ckpt A.json [B.json ...] --peers P.json [Q.json ...] [--json OUT] [--markdown OUT]
      Medians over rounds, and ckpt's figures (from ckpt-bench --json runs interleaved with
      the peer runs) as ratios to the peers', with the targets of issue 5 as PASS/FAIL.

Needs torch >= 2.3 and safetensors (run.sh / peers.sh give it a Debian 13 root if need be).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench_json import check_schema, with_schema


# The small tensor both sides read alone (ckpt-bench: MappedShard of rank 0; here: safe_open).
SMALL_TENSOR = "model.layers.0.input_norm.weight"


def drop_cache(path):
    """fsync and drop the page cache of every file under path, so the next read hits the disk."""
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fsync_path(path):
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    d = os.open(os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path, os.O_RDONLY)
    try:
        os.fsync(d)
    finally:
        os.close(d)


def run(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import safetensors
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64, "I64": torch.int64,
              "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool}
    layout = json.load(open(args.layout))
    torch.manual_seed(1234)
    state = {}
    nbytes = 0
    for r, tensors in enumerate(layout):
        for t in tensors:
            dt = dtypes[t["dtype"]]
            x = torch.empty(t["shape"], dtype=dt)
            if dt.is_floating_point:
                x.uniform_(-1, 1)
            else:
                x.random_(0, 100)
            state[f"rank{r}.{t['name']}"] = x
            nbytes += x.numel() * x.element_size()
    threads = args.threads or len(layout)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    # DCP wants a process group for async_save; one process, gloo, a file:// rendezvous (torch
    # 2.6's TCPStore has no libuv in Debian's build).
    os.environ.setdefault("USE_LIBUV", "0")
    rdv = tempfile.mktemp(prefix="ckpt-peers-rdv-")
    dist.init_process_group("gloo", init_method="file://" + rdv, rank=0, world_size=1)

    work = os.path.join(args.dir, "peers")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = {"torch_version": torch.__version__, "safetensors_version": safetensors.__version__, "bytes": nbytes,
           "tensors": len(state), "threads": threads, "round": args.round}

    def touch(tensors):
        """Reads one byte of every page: a lazily mapped load is not done until its bytes are in."""
        acc = 0
        for t in tensors:
            if t.numel():
                acc += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
        return acc

    def settle():
        # This VM takes freed memory back after ~2 s: idle first, so every load starts like a
        # fresh resume process (ckpt-bench does the same, --load-settle-ms).
        time.sleep(args.settle)

    def timed(fn):
        t0 = time.perf_counter()
        res = fn()
        return time.perf_counter() - t0, res

    def fresh(name):
        p = os.path.join(work, name)
        shutil.rmtree(p, ignore_errors=True)
        if os.path.exists(p):
            os.remove(p)
        return p

    def torch_save():
        p = fresh("torch.pt")
        def go():
            with open(p, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(work)
        s, _ = timed(go)
        out["torch_save_fsync_s"] = s
        drop_cache(p)
        settle()
        def load():
            d = torch.load(p, weights_only=True, mmap=False)
            touch(d.values())
            return d
        s, loaded = timed(load)
        out["torch_load_s"] = s
        assert loaded.keys() == state.keys()
        del loaded
        os.remove(p)

    def safetensors_io():
        p = fresh("model.safetensors")
        def go():
            save_file(state, p)
            fsync_path(p)
        s, _ = timed(go)
        out["safetensors_save_fsync_s"] = s
        drop_cache(p)
        settle()
        def load():
            d = load_file(p)
            touch(d.values())
            return d
        s, loaded = timed(load)
        out["safetensors_load_s"] = s
        del loaded
        # safe_open: the lazy, memory-mapped reader; one small tensor (the one ckpt-bench reads
        # through MappedShard), then every tensor, each after the page cache is dropped.
        small = "rank0." + SMALL_TENSOR
        drop_cache(p)
        settle()
        def one():
            with safe_open(p, framework="pt") as f:
                t = f.get_tensor(small)
                touch([t])
                return t.numel()
        s, _ = timed(one)
        out["safe_open_one_s"] = s
        out["safe_open_one_tensor"] = small
        drop_cache(p)
        settle()
        def every():
            with safe_open(p, framework="pt") as f:
                n = 0
                for k in f.keys():
                    t = f.get_tensor(k)
                    touch([t])
                    n += 1
                return n
        s, n = timed(every)
        out["safe_open_all_s"] = s
        assert n == len(state)
        os.remove(p)

    # Both DCP writers save twice through one writer object, as a training loop saving every N
    # steps would: the first save (allocations made afresh) and the second are timed apart.
    def dcp_save_load():
        p, p2 = fresh("dcp"), fresh("dcp-2")
        writer = dcp.FileSystemWriter(p, thread_count=threads, sync_files=True)
        s, _ = timed(lambda: dcp.save(state, storage_writer=writer))
        out["dcp_save_s"] = s
        fsync_path(p)  # the directory entries: DCP syncs the files, not the directory
        shutil.rmtree(p)
        p = p2
        s, _ = timed(lambda: dcp.save(state, checkpoint_id=p, storage_writer=writer))  # the next directory
        out["dcp_save_2_s"] = s
        fsync_path(p)
        target = {k: torch.empty_like(v) for k, v in state.items()}
        drop_cache(p)
        settle()
        s, _ = timed(lambda: (dcp.load(target, storage_reader=dcp.FileSystemReader(p)), touch(target.values())))
        out["dcp_load_s"] = s
        out["dcp_load_equal"] = all(torch.equal(target[k], state[k]) for k in state)
        del target
        shutil.rmtree(p)

    def dcp_async():
        # The tensor mutated right after async_save returns, as the next training step would.
        victim = next(k for k in state if k.endswith("model.blocks.0.weight"))
        before = state[victim].clone()
        # default: what the docs show; cached_stager: DCP's persistent staging (pinned memory,
        # so it needs an accelerator); clone: the user copies the state first, so that the
        # snapshot is isolated on a CPU-only machine.
        for variant, writer_kw, clone in (("default", {}, False), ("cached_stager", {"cache_staged_state_dict": True}, False),
                                          ("clone", {}, True)):
            p = fresh("dcp-async-" + variant)
            try:
                writer = dcp.FileSystemWriter(p, thread_count=threads, sync_files=True, **writer_kw)
            except TypeError as e:  # older torch without the option
                out[f"dcp_async_{variant}_error"] = str(e)
                continue
            try:
                t0 = time.perf_counter()
                src = {k: v.clone() for k, v in state.items()} if clone else state
                fut = dcp.async_save(src, storage_writer=writer)
                t_ret = time.perf_counter() - t0
                state[victim].add_(1.0)  # the next step's update
                fut.result()
                t_durable = time.perf_counter() - t0
                del src
            except Exception as e:  # e.g. pinned memory without an accelerator
                out[f"dcp_async_{variant}_error"] = f"{type(e).__name__}: {e}"
                state[victim].copy_(before)
                shutil.rmtree(p, ignore_errors=True)
                continue
            fsync_path(p)
            saved = {victim: torch.empty_like(before)}
            dcp.load(saved, storage_reader=dcp.FileSystemReader(p))
            out[f"dcp_async_{variant}_return_s"] = t_ret
            out[f"dcp_async_{variant}_durable_s"] = t_durable
            out[f"dcp_async_{variant}_mutation_leaked"] = not torch.equal(saved[victim], before)
            state[victim].copy_(before)
            shutil.rmtree(p)

    def dcp_ckpt_save_load():
        # DCP's planner and API, ckpt's storage: the same calls as dcp_save_load with the other
        # writer and reader (the Writer fsyncs and commits; the Reader verifies every chunk).
        p = fresh("dcp-ckpt")
        writer = ckpt_dcp.Writer(p, writer="auto")  # keep_open: one Checkpointer for both saves
        s, _ = timed(lambda: dcp.save(state, storage_writer=writer))
        out["dcp_ckpt_save_s"] = s
        s, _ = timed(lambda: dcp.save(state, storage_writer=writer))  # step 2 (keep_last 3: nothing rotated)
        out["dcp_ckpt_save_2_s"] = s
        writer.close()
        target = {k: torch.empty_like(v) for k, v in state.items()}
        drop_cache(p)
        settle()
        s, _ = timed(lambda: (dcp.load(target, storage_reader=ckpt_dcp.Reader(p, verify="fast")), touch(target.values())))
        out["dcp_ckpt_load_s"] = s
        out["dcp_ckpt_load_equal"] = all(torch.equal(target[k], state[k]) for k in state)
        del target
        shutil.rmtree(p)

    jobs = [("torch.save/load", torch_save), ("dcp.save/load", dcp_save_load), ("dcp.async_save", dcp_async),
            ("safetensors", safetensors_io)]
    if args.ckpt_python:
        sys.path.insert(0, args.ckpt_python)
        import ckpt.dcp as ckpt_dcp
        jobs.append(("dcp.save/load through ckpt.dcp", dcp_ckpt_save_load))
    k = args.round % len(jobs)
    for name, job in jobs[k:] + jobs[:k]:
        t0 = time.perf_counter()
        job()
        print(f"peers: round {args.round}: {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    dist.destroy_process_group()
    if os.path.exists(rdv):
        os.remove(rdv)
    shutil.rmtree(work, ignore_errors=True)
    with open(args.json, "w") as f:
        json.dump(with_schema("peers.run", 1, out), f, indent=2)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def combine(args):
    ck = [check_schema(json.load(open(p)), "ckpt-bench", 1, p) for p in args.ckpt]
    pe = [check_schema(json.load(open(p)), "peers.run", 1, p) for p in args.peers]
    nbytes = pe[0]["bytes"]
    gb = nbytes / 1e9

    def ckv(*path):
        vals = []
        for doc in ck:
            cur = doc
            for k in path:
                cur = cur.get(k) if isinstance(cur, dict) else None
            vals.append(cur)
        return med(vals)

    def pv(key):
        return med([p.get(key) for p in pe])

    def gbps(seconds):
        return gb / seconds if seconds else None

    ck_bytes = ckv("config", "checkpoint_bytes")
    ck_state = ckv("config", "state_bytes")
    fig = {
        "state_bytes": nbytes,
        "ckpt_state_bytes": ck_state,
        "rounds": len(pe),
        "torch_version": pe[0].get("torch_version"),
        "safetensors_version": pe[0].get("safetensors_version"),
        # ckpt: a synchronous save (save_sync: both checksums, fsync, atomic commit) and the
        # async save of the same run; loads with verify none / fast / full.
        "ckpt_sync_save_gbps": (ck_state / 1e9) / (ckv("modes", "sync", "durable_ms", "median") / 1e3),
        "ckpt_async_return_ms": ckv("modes", "async_io_uring", "stall_ms", "median"),
        "ckpt_async_durable_ms": ckv("modes", "async_io_uring", "durable_ms", "median"),
        "ckpt_async_snapshot_isolated": all(d.get("load", {}).get("snapshot_isolated", False) for d in ck),
        "ckpt_load_none_gbps": ckv("load", "none", "gbps", "median"),
        "ckpt_load_fast_gbps": ckv("load", "fast", "gbps", "median"),
        "ckpt_load_full_gbps": ckv("load", "full", "gbps", "median"),
        # Resume: open_latest + load_into the model's own (warm) memory + verify fast.
        "ckpt_resume_gbps": ckv("load", "into_fast", "gbps", "median"),
        # MappedShard (verify fast): one small tensor (open_latest to its bytes), every tensor.
        "ckpt_mapped_one_ms": ckv("load", "mapped_one_tensor", "ms", "median"),
        "ckpt_mapped_all_gbps": ckv("load", "mapped", "gbps", "median"),
        "raw_write_gbps": ckv("references", "raw_write_gbps", "median"),
        "raw_read_gbps": ckv("references", "raw_read_gbps", "median"),
        "torch_save_fsync_gbps": gbps(pv("torch_save_fsync_s")),
        "torch_load_gbps": gbps(pv("torch_load_s")),
        "dcp_save_gbps": gbps(pv("dcp_save_s")),
        "dcp_load_gbps": gbps(pv("dcp_load_s")),
        "dcp_ckpt_save_gbps": gbps(pv("dcp_ckpt_save_s")),
        "dcp_save_2_gbps": gbps(pv("dcp_save_2_s")),
        "dcp_ckpt_save_2_gbps": gbps(pv("dcp_ckpt_save_2_s")),
        "dcp_ckpt_load_gbps": gbps(pv("dcp_ckpt_load_s")),
        "safetensors_save_fsync_gbps": gbps(pv("safetensors_save_fsync_s")),
        "safetensors_load_gbps": gbps(pv("safetensors_load_s")),
        "safe_open_one_ms": (pv("safe_open_one_s") or 0) * 1e3 or None,
        "safe_open_all_gbps": gbps(pv("safe_open_all_s")),
        "dcp_async_return_ms": (pv("dcp_async_default_return_s") or 0) * 1e3 or None,
        "dcp_async_durable_ms": (pv("dcp_async_default_durable_s") or 0) * 1e3 or None,
        "dcp_async_mutation_leaked": any(p.get("dcp_async_default_mutation_leaked", False) for p in pe),
        "dcp_async_cached_return_ms": (pv("dcp_async_cached_stager_return_s") or 0) * 1e3 or None,
        "dcp_async_cached_durable_ms": (pv("dcp_async_cached_stager_durable_s") or 0) * 1e3 or None,
        "dcp_async_cached_mutation_leaked": any(p.get("dcp_async_cached_stager_mutation_leaked", False) for p in pe),
        "dcp_async_clone_return_ms": (pv("dcp_async_clone_return_s") or 0) * 1e3 or None,
        "dcp_async_clone_durable_ms": (pv("dcp_async_clone_durable_s") or 0) * 1e3 or None,
        "dcp_async_clone_mutation_leaked": any(p.get("dcp_async_clone_mutation_leaked", False) for p in pe),
        "dcp_async_cached_error": next((p["dcp_async_cached_stager_error"] for p in pe if "dcp_async_cached_stager_error" in p), None),
    }

    def ratio(a, b):
        return a / b if a is not None and b else None

    r = {
        "save_vs_torch_save": ratio(fig["ckpt_sync_save_gbps"], fig["torch_save_fsync_gbps"]),
        "save_vs_dcp_save": ratio(fig["ckpt_sync_save_gbps"], fig["dcp_save_gbps"]),
        "save_vs_safetensors": ratio(fig["ckpt_sync_save_gbps"], fig["safetensors_save_fsync_gbps"]),
        "async_return_vs_dcp_async_return": ratio(fig["ckpt_async_return_ms"], fig["dcp_async_return_ms"]),
        "async_return_vs_dcp_async_clone_return": ratio(fig["ckpt_async_return_ms"], fig["dcp_async_clone_return_ms"]),
        "async_durable_vs_dcp_async_durable": ratio(fig["ckpt_async_durable_ms"], fig["dcp_async_durable_ms"]),
        "load_fast_vs_torch_load": ratio(fig["ckpt_load_fast_gbps"], fig["torch_load_gbps"]),
        "load_fast_vs_dcp_load": ratio(fig["ckpt_load_fast_gbps"], fig["dcp_load_gbps"]),
        "load_fast_vs_safetensors_load": ratio(fig["ckpt_load_fast_gbps"], fig["safetensors_load_gbps"]),
        "resume_vs_torch_load": ratio(fig["ckpt_resume_gbps"], fig["torch_load_gbps"]),
        "resume_vs_dcp_load": ratio(fig["ckpt_resume_gbps"], fig["dcp_load_gbps"]),
        "resume_vs_safetensors_load_file": ratio(fig["ckpt_resume_gbps"], fig["safetensors_load_gbps"]),
        "resume_vs_safe_open_all": ratio(fig["ckpt_resume_gbps"], fig["safe_open_all_gbps"]),
        "mapped_all_vs_safe_open_all": ratio(fig["ckpt_mapped_all_gbps"], fig["safe_open_all_gbps"]),
        # Speed-up of ckpt's one-tensor read over safe_open's (their time / ckpt's).
        "mapped_one_speedup_vs_safe_open_one": ratio(fig["safe_open_one_ms"], fig["ckpt_mapped_one_ms"]),
    }
    targets = []

    def target(text, value, op, thr, note=""):
        ok = value is not None and (value >= thr if op == ">=" else value <= thr)
        targets.append({"text": text, "value": value, "op": op, "threshold": thr, "pass": ok, "note": note})

    target("save throughput >= 3x torch.save + fsync", r["save_vs_torch_save"], ">=", 3)
    target("save throughput >= 2x dcp.save", r["save_vs_dcp_save"], ">=", 2)
    iso_note = ("ckpt snapshot isolated: %s; dcp.async_save snapshot isolated: %s" %
                ("yes" if fig["ckpt_async_snapshot_isolated"] else "NO", "no (mutation leaked)" if fig["dcp_async_mutation_leaked"] else "yes"))
    ok_iso = fig["ckpt_async_snapshot_isolated"]
    v = r["async_return_vs_dcp_async_return"]
    target("async stall <= dcp.async_save time-to-return (as documented), ckpt's snapshot isolated", v if ok_iso else None, "<=", 1,
           iso_note)
    v = r["async_return_vs_dcp_async_clone_return"]
    target("async stall <= time-to-return of an isolated dcp.async_save (state cloned first)", v if ok_iso else None, "<=", 1,
           "dcp clone variant leaked: %s" % ("YES" if fig["dcp_async_clone_mutation_leaked"] else "no"))
    target("load (fast verify) >= 2x torch.load", r["load_fast_vs_torch_load"], ">=", 2)
    target("load (fast verify) >= 2x dcp.load", r["load_fast_vs_dcp_load"], ">=", 2)
    target("resume (open + load_into + verify fast) >= 2x torch.load", r["resume_vs_torch_load"], ">=", 2)
    target("resume (open + load_into + verify fast) >= 1.2x safetensors load_file", r["resume_vs_safetensors_load_file"], ">=", 1.2)
    res = with_schema("peers.combine", 1, {"figures": fig, "ratios": r, "targets": targets})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)

    def f(x, p=2):
        return "-" if x is None else f"{x:.{p}f}"

    lines = []
    lines.append(f"Same tensors ({nbytes / 2**30:.2f} GiB, {pe[0]['tensors']} tensors), same disk, {len(pe)} interleaved rounds "
                 f"(medians); torch {fig['torch_version']}, safetensors {fig['safetensors_version']}.\n")
    lines.append("| save | GB/s | ckpt sync save / it |\n|---|---|---|")
    lines.append(f"| ckpt save_sync (XXH3 + SHA-256, fsync, atomic commit) | {f(fig['ckpt_sync_save_gbps'])} | 1.00 |")
    for name, key, rk in (("torch.save + fsync", "torch_save_fsync_gbps", "save_vs_torch_save"),
                          ("dcp.save (FileSystemWriter, sync_files)", "dcp_save_gbps", "save_vs_dcp_save"),
                          ("safetensors save_file + fsync", "safetensors_save_fsync_gbps", "save_vs_safetensors")):
        lines.append(f"| {name} | {f(fig[key])} | {f(r[rk])} |")
    lines.append(f"| raw O_DIRECT write (reference) | {f(fig['raw_write_gbps'])} | |")
    lines.append("\n| async save | returns after ms | durable after ms | mutation after return leaks into checkpoint |\n|---|---|---|---|")
    lines.append(f"| ckpt save() (io_uring) | {f(fig['ckpt_async_return_ms'], 1)} | {f(fig['ckpt_async_durable_ms'], 0)} | "
                 f"{'no' if fig['ckpt_async_snapshot_isolated'] else 'YES'} |")
    lines.append(f"| dcp.async_save (default FileSystemWriter) | {f(fig['dcp_async_return_ms'], 1)} | {f(fig['dcp_async_durable_ms'], 0)} | "
                 f"{'YES' if fig['dcp_async_mutation_leaked'] else 'no'} |")
    if fig["dcp_async_cached_error"]:
        lines.append(f"| dcp.async_save (cache_staged_state_dict=True) | failed: {fig['dcp_async_cached_error'][:80]} | | |")
    else:
        lines.append(f"| dcp.async_save (cache_staged_state_dict=True) | {f(fig['dcp_async_cached_return_ms'], 1)} | "
                     f"{f(fig['dcp_async_cached_durable_ms'], 0)} | {'YES' if fig['dcp_async_cached_mutation_leaked'] else 'no'} |")
    lines.append(f"| clone the state, then dcp.async_save | {f(fig['dcp_async_clone_return_ms'], 1)} | "
                 f"{f(fig['dcp_async_clone_durable_ms'], 0)} | {'YES' if fig['dcp_async_clone_mutation_leaked'] else 'no'} |")
    lines.append("\n| load (page cache dropped, 3 s idle first) | GB/s | ckpt fast load / it |\n|---|---|---|")
    lines.append(f"| ckpt verify none / fast / full | {f(fig['ckpt_load_none_gbps'])} / {f(fig['ckpt_load_fast_gbps'])} / "
                 f"{f(fig['ckpt_load_full_gbps'])} | 1.00 |")
    for name, key, rk in (("torch.load (weights_only)", "torch_load_gbps", "load_fast_vs_torch_load"),
                          ("dcp.load", "dcp_load_gbps", "load_fast_vs_dcp_load"),
                          ("safetensors load_file", "safetensors_load_gbps", "load_fast_vs_safetensors_load")):
        lines.append(f"| {name} | {f(fig[key])} | {f(r[rk])} |")
    lines.append(f"| raw O_DIRECT read (reference) | {f(fig['raw_read_gbps'])} | |")
    if fig["dcp_ckpt_save_gbps"] is not None:
        lines.append("\n| DCP (dcp.save / dcp.load, its default planners; one writer, two saves) | first save GB/s | "
                     "second save GB/s | load GB/s (page cache dropped) |\n|---|---|---|---|")
        lines.append(f"| FileSystemWriter (sync_files) / FileSystemReader | {f(fig['dcp_save_gbps'])} | "
                     f"{f(fig['dcp_save_2_gbps'])} | {f(fig['dcp_load_gbps'])} |")
        lines.append(f"| ckpt.dcp.Writer / ckpt.dcp.Reader (verify fast) | {f(fig['dcp_ckpt_save_gbps'])} | "
                     f"{f(fig['dcp_ckpt_save_2_gbps'])} | {f(fig['dcp_ckpt_load_gbps'])} |")
        lines.append(f"| ckpt.dcp / FileSystem | {f(ratio(fig['dcp_ckpt_save_gbps'], fig['dcp_save_gbps']))} | "
                     f"{f(ratio(fig['dcp_ckpt_save_2_gbps'], fig['dcp_save_2_gbps']))} | "
                     f"{f(ratio(fig['dcp_ckpt_load_gbps'], fig['dcp_load_gbps']))} |")
    lines.append("\n| resume and lazy reads (page cache dropped) | ckpt | peer | ckpt / peer |\n|---|---|---|---|")
    for name, a, b, rk in (("resume (open + load_into + verify fast) vs torch.load, GB/s", "ckpt_resume_gbps", "torch_load_gbps",
                            "resume_vs_torch_load"),
                           ("resume vs dcp.load, GB/s", "ckpt_resume_gbps", "dcp_load_gbps", "resume_vs_dcp_load"),
                           ("resume vs safetensors load_file, GB/s", "ckpt_resume_gbps", "safetensors_load_gbps",
                            "resume_vs_safetensors_load_file"),
                           ("every tensor: MappedShard (verify fast) vs safe_open, GB/s", "ckpt_mapped_all_gbps", "safe_open_all_gbps",
                            "mapped_all_vs_safe_open_all")):
        lines.append(f"| {name} | {f(fig[a])} | {f(fig[b])} | {f(r[rk])} |")
    lines.append(f"| one small tensor ({SMALL_TENSOR} of rank 0), open to its bytes: MappedShard (verify fast) vs safe_open, "
                 f"ms (last column: safe_open ms / ckpt ms) | {f(fig['ckpt_mapped_one_ms'])} | {f(fig['safe_open_one_ms'])} | "
                 f"{f(r['mapped_one_speedup_vs_safe_open_one'])} |")
    lines.append("\n| target | value | threshold | result | note |\n|---|---|---|---|---|")
    for t in targets:
        lines.append(f"| {t['text']} | {f(t['value'], 3)} | {t['op']} {t['threshold']} | {'PASS' if t['pass'] else '**FAIL**'} | {t['note']} |")
    md = "\n".join(lines) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(md)
    print(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("run")
    a.add_argument("--layout", required=True)
    a.add_argument("--dir", required=True)
    a.add_argument("--json", required=True)
    a.add_argument("--threads", type=int, default=0, help="DCP writer threads (default: one per rank of the layout)")
    a.add_argument("--round", type=int, default=0)
    a.add_argument("--settle", type=float, default=3.0, help="idle seconds before each load (default 3)")
    a.add_argument("--ckpt-python", help="the ckpt package's directory (build/torch2/python): also time DCP through ckpt.dcp")
    c = sub.add_parser("combine")
    c.add_argument("--ckpt", nargs="+", required=True)
    c.add_argument("--peers", nargs="+", required=True)
    c.add_argument("--json")
    c.add_argument("--markdown")
    args = ap.parse_args()
    (run if args.cmd == "run" else combine)(args)


if __name__ == "__main__":
    main()
