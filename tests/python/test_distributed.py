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

torch = pytest.importorskip("torch")
mp = torch.multiprocessing


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
    ctx = mp.get_context("spawn")
    root, out = str(tmp_path / "root"), str(tmp_path / "out")
    init = f"file://{tmp_path}/init"
    procs = [ctx.Process(target=worker, args=(r, world, init, root, out, kill_at)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        if p.is_alive():
            p.kill()
            pytest.fail("a worker hung")
    results = {}
    for r in range(world):
        if os.path.exists(f"{out}.{r}"):
            with open(f"{out}.{r}") as f:
                results[r] = json.load(f)
    return root, [p.exitcode for p in procs], results


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
