# SPDX-License-Identifier: Apache-2.0
# save(..., sharding=...): tensor-parallel slices, replicated and rank-local tensors, as the
# manifest records them, and what `ckpt consolidate` makes of them.
import os
import subprocess

import numpy as np
import pytest

import ckpt
from conftest import read_safetensors, shard_path

CKPT_TOOL = os.path.join(os.environ.get("CKPT_BIN_DIR", ""), "ckpt")


def save_tp(root, world):
    """W [5, 4] row-sliced over `world` ranks (uneven), V [3, 6] column-sliced, a bias
    replicated on every rank, a rank-local seed."""
    W = np.arange(20, dtype=np.float32).reshape(5, 4)
    V = np.arange(18, dtype=np.float64).reshape(3, 6) + 100
    bias = np.array([0.5, 1.5, 2.5], dtype=np.float32)
    with ckpt.Checkpointer(root, world_size=world) as c:
        handles = []
        for r in range(world):
            w = ckpt.row_slice("W", 5, 4, r, world)
            v = ckpt.column_slice("V", 3, 6, r, world)
            wo, wl = w["slice"]["offsets"], w["slice"]["lengths"]
            vo, vl = v["slice"]["offsets"], v["slice"]["lengths"]
            tensors = {"w.part": np.ascontiguousarray(W[wo[0]:wo[0] + wl[0]]),
                       "v.part": np.ascontiguousarray(V[:, vo[1]:vo[1] + vl[1]]),
                       "bias": bias, "seed": np.array([r * 11], dtype=np.int64)}
            sharding = {"w.part": w, "v.part": v, "bias": ckpt.replicated(range(world)), "seed": ckpt.rank_local()}
            handles.append(c.save(r, 7, tensors, sharding=sharding))
        for h in handles:
            h.wait()
    return W, V, bias


def test_row_and_column_slices_follow_numpy_array_split():
    assert ckpt.row_slice("W", 5, 4, 0, 3) == ckpt.slice_of("W", [5, 4], [0, 0], [2, 4])
    assert ckpt.row_slice("W", 5, 4, 2, 3) == ckpt.slice_of("W", [5, 4], [4, 0], [1, 4])
    assert ckpt.column_slice("V", 3, 6, 1, 4) == ckpt.slice_of("V", [3, 6], [0, 2], [3, 2])
    with pytest.raises(ckpt.InvalidArgument):
        ckpt.row_slice("W", 5, 4, 3, 3)


def test_sliced_replicated_and_rank_local_tensors_consolidate_to_the_global_tensors(root, tmp_path):
    W, V, bias = save_tp(root, 3)
    r = ckpt.open_latest(root)
    assert r.world_size == 3
    # The replicated bias is written once, in rank 0's shard; the seed stays on each rank.
    for k in range(3):
        assert "bias" in r.tensor_names(k)
    assert "bias" in read_safetensors(shard_path(r, 0))
    assert "bias" not in read_safetensors(shard_path(r, 1)) and "bias" not in read_safetensors(shard_path(r, 2))
    assert [int(r.read(k, "seed")[0]) for k in range(3)] == [0, 11, 22]
    out = tmp_path / "model"
    done = subprocess.run([CKPT_TOOL, "consolidate", root, str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    model = read_safetensors(out / "model.safetensors")
    assert sorted(model) == ["V", "W", "bias"]  # rank-local: left out
    assert np.array_equal(model["W"], W)
    assert np.array_equal(model["V"], V.astype(np.float32))  # float tensors in their own dtype but F64 -> F32
    assert np.array_equal(model["bias"], bias)


def test_every_holder_of_a_replicated_tensor_reads_it_though_only_the_lowest_holder_wrote_it(root):
    torch = pytest.importorskip("torch")
    # A DDP job: the model is the same on every rank, saved as replicated; each rank has its own RNG.
    model = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}
    with ckpt.Checkpointer(root, world_size=3) as c:
        handles = []
        for r in (0, 1, 2):
            state = {"model": model if r else {"w": model["w"]}, "rng": torch.tensor([r])}
            sharding = {"model.w": ckpt.replicated([0, 1, 2])}
            if r:
                sharding["model.b"] = ckpt.replicated([1, 2])
            handles.append(c.save_state(1, state, rank=r, sharding=sharding))
        for h in handles:
            h.wait()
    r = ckpt.open_latest(root)
    assert r.tensor_info(2) == {"model.w": ("F32", (2, 3)), "model.b": ("BF16", (2,)), "rng": ("I64", (1,))}
    for k in (1, 2):  # holders that wrote nothing of the model
        assert np.array_equal(r.read(k, "model.w"), model["w"].numpy())
        flat = r.read_all(k)
        state = ckpt.tensors_to_state_dict(flat, r.metadata(k)["state_dict"])
        assert torch.equal(state["model"]["w"], model["w"]) and torch.equal(state["model"]["b"], model["b"])
        assert int(state["rng"][0]) == k
        into = {"model.w": torch.zeros(2, 3), "model.b": torch.zeros(2, dtype=torch.bfloat16), "rng": torch.zeros(1, dtype=torch.int64)}
        r.load_into(k, into)
        assert torch.equal(into["model.w"], model["w"]) and torch.equal(into["model.b"], model["b"])
        sd = {"model": {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}, "rng": torch.zeros(1, dtype=torch.int64)}
        r.load_state(sd, rank=k)
        assert torch.equal(sd["model"]["w"], model["w"]) and int(sd["rng"][0]) == k
    # Rank 0 holds w (and wrote it) but not b.
    assert "model.b" not in r.tensor_names(0)
    with pytest.raises(ckpt.NotFound, match="model.b"):
        r.read(0, "model.b")
    with pytest.raises(ckpt.NotFound, match="no tensor 'model.b' on rank 0"):
        r.load_into(0, {"model.b": torch.zeros(2, dtype=torch.bfloat16)})
    # b is stored once, in rank 1's shard (its lowest holder).
    assert "model.b" in read_safetensors(shard_path(r, 1)) and "model.b" not in read_safetensors(shard_path(r, 2))


def test_a_description_that_cannot_be_right_is_invalid_argument_and_nothing_is_saved(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 1, {"a": np.zeros(4, dtype=np.float32)})
        bad = {"a": ckpt.slice_of("A", [4], [2], [4])}  # outside the global shape
        with pytest.raises(ckpt.InvalidArgument):
            c.save_sync(0, 2, {"a": np.zeros(4, dtype=np.float32)}, sharding=bad)
        with pytest.raises(ckpt.InvalidArgument, match="not saved"):
            c.save(0, 3, {"a": np.zeros(4, dtype=np.float32)}, sharding={"b": ckpt.rank_local()})
        with pytest.raises(ckpt.InvalidArgument):
            c.save(0, 4, {"a": np.zeros(4, dtype=np.float32)}, sharding={"a": {"sliced": {}}})
    assert ckpt.open_latest(root).step == 1
