# SPDX-License-Identifier: Apache-2.0
# ckpt across the processes of a torch.distributed job (ckpt.distributed.TorchCoordinator):
# one shard per process, rank 0 commits; a process killed mid-save leaves the previous latest.
import datetime
import json
import os
import signal
import sys

import numpy as np
import pytest

import ckpt
from conftest import spawn_ranks

torch = pytest.importorskip("torch")


def worker(rank, world, init, root, out, kill_at):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    result = {"rank": rank}
    coord = ckpt.distributed.TorchCoordinator(timeout=datetime.timedelta(seconds=60))
    try:
        with ckpt.Checkpointer(root, coordinator=coord) as c:
            for step in (2, 4):
                x = torch.full((1 << 20,), float(rank * 100 + step))  # 4 MiB: the kill comes before it is durable
                if step == kill_at and rank == 1:
                    c.save(rank, step, {"x": x}, deferred=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                h = c.save(rank, step, {"x": x}, metadata={"rank": rank, "step": step}, deferred=True)
                if kill_at is None:
                    dist.all_reduce(torch.ones(1))  # the training's collective, meanwhile
                h.wait_staged()
                try:
                    result[step] = h.wait().dir
                except ckpt.Error as e:
                    result[step] = {"error": type(e).__name__, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - reported to the test
        result["exception"] = repr(e)
    finally:
        coord.close()
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
        sys.stdout.flush()
        os._exit(0)  # skip gloo's teardown, which may wait for a dead peer


def run(tmp_path, world, kill_at=None):
    return spawn(tmp_path, world, worker, kill_at)


def spawn(tmp_path, world, target, *extra):
    return spawn_ranks(tmp_path, world, target, *extra)


def test_each_process_saves_its_shard_and_rank_0_commits_every_step(tmp_path):
    root, codes, results = run(tmp_path, 2)
    assert codes == [0, 0]
    assert results[0]["4"] == results[1]["4"] and results[0]["4"].endswith("step-0000000004")
    r = ckpt.open_latest(root, world_size=2)
    assert r.step == 4
    for rank in (0, 1):
        assert r.metadata(rank) == {"rank": rank, "step": 4}
        assert np.all(r.read(rank, "x") == rank * 100 + 4)


def test_a_process_killed_mid_save_leaves_the_previous_latest(tmp_path):
    root, codes, results = run(tmp_path, 2, kill_at=4)
    assert codes[1] == -signal.SIGKILL and 1 not in results
    assert codes[0] == 0
    err = results[0]["4"]
    assert err["error"] == "CommError" and "coordination failed" in err["message"]
    assert results[0]["2"].endswith("step-0000000002")
    r = ckpt.open_latest(root, world_size=2)
    assert r.step == 2
    r.verify("full")
    assert np.all(r.read(1, "x") == 102)


def closed_coordinator_worker(rank, world, init, root, out):
    import time
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    result = {"rank": rank}
    coord = ckpt.distributed.TorchCoordinator(timeout=datetime.timedelta(seconds=60))
    try:
        c = ckpt.Checkpointer(root, coordinator=coord)
        result[2] = c.save(rank, 2, {"x": torch.full((16,), float(rank))}).wait(timeout=60).dir
        coord.close()  # the misuse: before the Checkpointer
        t0 = time.monotonic()
        h = c.save(rank, 4, {"x": torch.full((16,), float(rank))}, deferred=True)
        try:
            h.wait(timeout=60)
            result[4] = "committed"
        except ckpt.Error as e:
            result[4] = {"error": type(e).__name__, "message": str(e)}
        result["done"] = h.done()
        c.close()
        result["seconds"] = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - reported to the test
        result["exception"] = repr(e)
    finally:
        report(out, rank, result)


def report(out, rank, result):
    """Writes a worker's result for the test and ends the process, skipping gloo's teardown."""
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    os._exit(0)


def test_a_coordinator_closed_before_the_checkpointer_fails_the_next_save_on_every_rank_instead_of_hanging(tmp_path):
    root, codes, results = spawn(tmp_path, 2, closed_coordinator_worker)
    assert codes == [0, 0]
    for r in range(2):
        res = results[r]
        assert "exception" not in res, res
        assert res["2"].endswith("step-0000000002")
        assert res["4"]["error"] == "CommError", res
        assert "the checkpoint coordinator was closed before the Checkpointer" in res["4"]["message"]
        assert res["done"] is True and res["seconds"] < 30
    assert ckpt.open_latest(root, world_size=2).step == 2


def state_worker(rank, world, init, root, out):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    result = {"rank": rank}
    coord = ckpt.distributed.TorchCoordinator(timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)  # DDP: the same model on every rank, saved once (replicated)
        model = torch.nn.Linear(3, 2)
        sd = {"model": model.state_dict(), "seen": torch.tensor([rank * 10])}
        sharding = {"model." + k: ckpt.replicated(range(world)) for k in model.state_dict()}
        with ckpt.Checkpointer(root, coordinator=coord) as c:
            c.save_state(1, sd, sharding=sharding, deferred=True).wait()  # no rank: the coordinator's
        torch.manual_seed(1 + rank)
        fresh = torch.nn.Linear(3, 2)
        sd2 = {"model": fresh.state_dict(), "seen": torch.zeros(1, dtype=torch.int64)}
        ckpt.load(sd2, root, coordinator=coord)
        result["equal"] = all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
        result["seen"] = int(sd2["seen"][0])
    except Exception as e:  # noqa: BLE001 - reported to the test
        result["exception"] = repr(e)
    finally:
        coord.close()
        report(out, rank, result)


def test_every_rank_loads_the_replicated_model_rank_0_wrote_with_the_rank_taken_from_the_coordinator(tmp_path):
    root, codes, results = spawn(tmp_path, 2, state_worker)
    assert codes == [0, 0]
    for r in range(2):
        assert results[r] == {"rank": r, "equal": True, "seen": r * 10}, results[r]
    assert ckpt.open_latest(root).tensor_names(1) == ["model.weight", "model.bias", "seen"]
