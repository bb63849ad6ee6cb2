# SPDX-License-Identifier: Apache-2.0
# close() on one thread while rank threads save (copying and deferred): never a crash, never
# a handle left pending. Each race runs in processes of its own (a crash is an exit status).
# CKPT_TEST_SEED fixes the timing; CKPT_CLOSE_RACE_PROCS and CKPT_CLOSE_RACE_RACES size it
# (the suite runs 4 processes of 12 races).
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import ckpt
from conftest import python_env

RACES = r'''
import json, random, sys, threading, time
import numpy as np
import ckpt

seed, races, base = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
out = {"races": 0, "handles": 0, "committed": 0, "aborted": 0, "refused": 0, "pending": 0, "other": []}
for race in range(races):
    world = rng.choice([1, 2, 3])
    c = ckpt.Checkpointer(f"{base}/race-{race}", world_size=world, keep_last=2)
    handles, lock = [], threading.Lock()
    def rank(r):
        state = {"w": np.full(rng.choice([16, 4096, 1 << 16]), r, dtype=np.float32)}
        for step in range(1, 1 << 30):
            try:
                h = c.save(r, step, state, metadata={"step": step}, deferred=bool(step % 2))
            except ckpt.Aborted:
                with lock:
                    out["refused"] += 1
                return
            except Exception as e:
                with lock:
                    out["other"].append(repr(e))
                return
            with lock:
                handles.append(h)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0, 0.03))
    if rng.random() < 0.5:
        c.close()
    else:
        try:
            with c:  # leaving the block by an exception closes it as well
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
    for t in threads:
        t.join(60)
        if t.is_alive():
            out["other"].append("a rank thread still saving 60 s after close()")
    for h in handles:
        if not h.done():
            out["pending"] += 1
            continue
        try:
            h.wait(timeout=0)
            out["committed"] += 1
        except ckpt.Aborted:
            out["aborted"] += 1
        except Exception as e:
            out["other"].append(repr(e))
    out["handles"] += len(handles)
    out["races"] += 1
print(json.dumps(out))
'''


def test_close_racing_rank_threads_that_save_never_crashes_and_every_handle_ends(tmp_path):
    seed = int(os.environ.get("CKPT_TEST_SEED", random.randrange(1 << 30)))
    procs = int(os.environ.get("CKPT_CLOSE_RACE_PROCS", 4))
    races = int(os.environ.get("CKPT_CLOSE_RACE_RACES", 12))
    running = [subprocess.Popen([sys.executable, "-c", RACES, str(seed + i), str(races), str(tmp_path / f"p{i}")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
               for i in range(procs)]
    totals = {"races": 0, "handles": 0, "committed": 0, "aborted": 0, "refused": 0}
    for i, p in enumerate(running):
        try:
            stdout, stderr = p.communicate(timeout=60 + 10 * races)
        except subprocess.TimeoutExpired:
            for q in running:
                q.kill()
            raise AssertionError(f"process {i} (seed {seed + i}) hung")
        assert p.returncode == 0, f"process {i} (seed {seed + i}) exit status {p.returncode}: {stderr[-3000:]}"
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["pending"] == 0, (seed + i, out)
        assert out["other"] == [], (seed + i, out)
        for k in totals:
            totals[k] += out[k]
    assert totals["races"] == procs * races
    assert totals["committed"] + totals["aborted"] == totals["handles"]
    assert totals["refused"] > 0 and totals["handles"] > 0
    print(f"seed {seed}: {totals}")


def test_a_save_after_close_is_aborted_and_stats_stay_readable(tmp_path):
    c = ckpt.Checkpointer(tmp_path / "root")
    c.save_sync(0, 1, {"a": np.zeros(3)})
    c.close()
    with pytest.raises(ckpt.Aborted) as e:
        c.save(0, 2, {"a": np.zeros(3)})
    assert e.value.code == "aborted" and e.value.file == str(tmp_path / "root")
    assert e.value.detail == "save of step 2 by rank 0: the Checkpointer is closed"
    c.wait_all(timeout=0)
    c.wait_durable(timeout=0)
    st = c.stats()
    assert st["commits"] == 1 and st["saves_started"] == 1 and st["staging_bytes"] == 0
    c.close()
    with ckpt.Checkpointer(tmp_path / "root") as again:  # the lock was released
        again.save_sync(0, 2, {"a": np.ones(3)})
    assert ckpt.open_latest(tmp_path / "root").step == 2
