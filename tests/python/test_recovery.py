# SPDX-License-Identifier: Apache-2.0
# ckpt.plan_recovery and ckpt.recover: the recovery planner over a run's levels (a memory root,
# then a durable directory), from Python.
import os
import shutil

import numpy as np
import pytest

import ckpt


@pytest.fixture
def mem():
    name = f"pytest-recovery-{os.getpid()}"
    path = os.path.join(os.environ.get("CKPT_MEMORY_DIR") or "/dev/shm", f"ckpt-{os.geteuid()}", name)
    shutil.rmtree(path, ignore_errors=True)
    yield "mem://" + name, path
    shutil.rmtree(path, ignore_errors=True)


def save_steps(root, durable, steps):
    with ckpt.Checkpointer(root, world_size=1, keep_last=2, durable_root=durable) as c:
        for s in steps:
            c.save(0, s, {"w": np.full(1000, s, dtype=np.float32)}).wait()
        c.wait_durable()


def test_the_plan_takes_memory_first_then_the_disk_and_recover_opens_what_it_chose(mem, tmp_path):
    root, path = mem
    durable = str(tmp_path / "durable")
    save_steps(root, durable, [1, 2, 3])
    plan = ckpt.plan_recovery([root, durable], world_size=1)
    assert plan["chosen"]["kind"] == "memory" and plan["chosen"]["step"] == 3 and plan["chosen"]["fetch"] == "read"
    assert plan["summary"] == f"step 3 from memory {root} (read in place)"
    r = ckpt.recover([root, durable], world_size=1)
    assert r.step == 3 and r.plan["root"] == root
    assert (r.read(0, "w") == 3).all()
    # A flipped bit in memory's newest shard: a verifying survey passes it over, naming the
    # file, and the disk's copy of the same step is taken.
    shard = os.path.join(path, "step-0000000003", "rank-00000-of-00001.safetensors")
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) - 8)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    plan = ckpt.plan_recovery([root, durable], verify="fast")
    assert plan["chosen"]["root"] == durable and plan["chosen"]["step"] == 3
    assert "checksum mismatch" in plan["candidates"][0]["passed_over"] and shard in plan["candidates"][0]["passed_over"]
    # All memory gone (a reboot): the disk's newest.
    shutil.rmtree(path)
    r = ckpt.recover([root, durable], world_size=1)
    assert r.step == 3 and r.plan["chosen"]["kind"] == "disk"
    assert "holds no committed checkpoint" in r.plan["summary"]


def test_nothing_to_recover_is_not_found_naming_every_level(mem, tmp_path):
    root, _ = mem
    with pytest.raises(ckpt.NotFound) as e:
        ckpt.recover([root, str(tmp_path / "missing")])
    assert "holds no committed checkpoint" in str(e.value)
    plan = ckpt.plan_recovery([root])
    assert plan["chosen"] is None and plan["level_errors"][0]["code"] == "not_found"
