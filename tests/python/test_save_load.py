# SPDX-License-Identifier: Apache-2.0
# One call to save and load a state_dict (ckpt.save / ckpt.load, Checkpointer.save_state,
# Reader.load_state), the rank implied where it is unambiguous, and reads that come back as
# torch (as_torch=True, bf16 as torch.bfloat16, torch dtypes).
import math
import os

import numpy as np
import pytest

import ckpt

torch = pytest.importorskip("torch")


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def step(model, opt, sched):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def test_save_then_load_restores_model_optimizer_and_scheduler_in_place(tmp_path):
    model, opt, sched = make(0)
    for _ in range(3):
        step(model, opt, sched)
    res = ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
                     "extra": {"epoch": 2, "dtype": torch.bfloat16}}, tmp_path, step=3)
    assert res.step == 3 and res.dir.endswith("step-0000000003")

    model2, opt2, sched2 = make(1)  # fresh: other weights, no optimizer state yet
    sd = {"model": model2.state_dict(), "optim": opt2.state_dict(), "sched": sched2.state_dict(), "extra": {}}
    weight = sd["model"]["0.weight"]
    back = ckpt.load(sd, tmp_path)
    assert back is sd and sd["model"]["0.weight"] is weight  # loaded into the given tensor
    assert torch.equal(model2[0].weight, model[0].weight)  # which is the live parameter
    assert sd["extra"] == {"epoch": 2, "dtype": torch.bfloat16}
    opt2.load_state_dict(sd["optim"])
    sched2.load_state_dict(sd["sched"])
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    for m, o, s in ((model, opt, sched), (model2, opt2, sched2)):
        torch.manual_seed(7)
        step(m, o, s)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_resume_through_save_state_and_load_state_is_bit_for_bit(tmp_path):
    model, opt, sched = make(0)
    step(model, opt, sched)
    with ckpt.Checkpointer(tmp_path) as c:
        c.save_state(1, {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict()},
                     deferred=True).wait()
    torch.manual_seed(3)
    step(model, opt, sched)
    want = [p.detach().clone() for p in model.parameters()]

    model2, opt2, sched2 = make(9)
    sd = {"model": model2.state_dict(), "optim": opt2.state_dict(), "sched": sched2.state_dict()}
    ckpt.open_latest(tmp_path).load_state(sd)
    opt2.load_state_dict(sd["optim"])
    sched2.load_state_dict(sd["sched"])
    torch.manual_seed(3)
    step(model2, opt2, sched2)
    for a, b in zip(want, model2.parameters()):
        assert torch.equal(a, b)


def test_load_checks_every_tensor_before_writing_any(tmp_path):
    ckpt.save({"a": torch.ones(3), "b": torch.ones(2)}, tmp_path, step=1)
    a, b = torch.zeros(3), torch.zeros(5)
    with pytest.raises(ckpt.InvalidArgument, match="shape of the target buffer of tensor 'b'"):
        ckpt.load({"a": a, "b": b}, tmp_path)
    assert not a.any()
    with pytest.raises(ckpt.NotFound, match="no tensor 'c'"):
        ckpt.load({"a": a, "c": torch.zeros(1)}, tmp_path)
    assert not a.any()


def test_load_of_a_checkpoint_saved_without_save_state_is_not_found(tmp_path):
    with ckpt.Checkpointer(tmp_path) as c:
        c.save_sync(1, {"w": np.zeros(2, np.float32)})
    with pytest.raises(ckpt.NotFound, match="saved with save, not save_state"):
        ckpt.load({"w": np.zeros(2, np.float32)}, tmp_path)


def test_save_state_refuses_metadata_with_its_own_state_dict_key(tmp_path):
    with ckpt.Checkpointer(tmp_path) as c:
        with pytest.raises(ckpt.InvalidArgument, match="state_dict"):
            c.save_state(1, {"w": torch.zeros(1)}, metadata={"state_dict": 1})


def test_what_cannot_be_saved_is_a_type_error_naming_its_path(tmp_path):
    class Warmup:
        def __init__(self):
            self.fn = self.factor  # a bound method: LambdaLR's state_dict keeps the object's __dict__

        def factor(self, s):
            return min(1.0, (s + 1) / 4)

        def __call__(self, s):
            return self.fn(s)

    _, opt, _ = make(0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Warmup())
    with pytest.raises(TypeError, match=r"sched\.lr_lambdas\.0\.fn is a method .*leave it out"):
        ckpt.save({"sched": sched.state_dict()}, tmp_path, step=1)
    with pytest.raises(TypeError, match=r"x\.1 is a function"):
        ckpt.save({"x": [1, lambda: 0]}, tmp_path, step=1)
    # What docs/python.md says to do: leave it out, rebuild it on load.
    sd = sched.state_dict()
    sd["lr_lambdas"] = [None]
    ckpt.save({"sched": sd, "w": torch.ones(1)}, tmp_path, step=1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(make(1)[1], Warmup())
    got = ckpt.load({"sched": {}}, tmp_path)["sched"]
    sched2.load_state_dict(got)
    assert sched2.last_epoch == sched.last_epoch and callable(sched2.lr_lambdas[0].fn)


def test_the_rank_is_implied_at_world_size_1_and_needed_beyond(tmp_path):
    w = np.arange(3, dtype=np.float32)
    with ckpt.Checkpointer(tmp_path / "one") as c:
        c.save(1, {"w": w}).wait()            # save(step, tensors)
        c.save_sync(step=2, tensors={"w": w})  # keywords
        c.save(0, 3, {"w": w}).wait()         # the old signature
    r = ckpt.open_latest(tmp_path / "one")
    assert r.step == 3 and np.array_equal(r.read("w"), w) and r.tensor_names() == ["w"]
    out = np.zeros(3, np.float32)
    r.load_into({"w": out})
    assert np.array_equal(out, w) and np.array_equal(r.read_all()["w"], w) and r.metadata() == {}
    with ckpt.Checkpointer(tmp_path / "two", world_size=2) as c:
        with pytest.raises(ckpt.InvalidArgument, match="world_size 2, no coordinator"):
            c.save(1, {"w": w})
        c.save(0, 1, {"w": w})
        c.save(1, 1, {"w": w}).wait()
    with pytest.raises(ckpt.InvalidArgument, match="world_size 2"):
        ckpt.open_latest(tmp_path / "two").read("w")


def test_as_torch_reads_bf16_as_bfloat16_and_dtypes_as_torch_dtypes(tmp_path):
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    i = torch.arange(4, dtype=torch.int64)
    ckpt.save({"t": t, "i": i}, tmp_path, step=1)
    r = ckpt.open_latest(tmp_path)
    assert r.read("t").dtype == np.uint16  # numpy has no bfloat16: its bits
    got = r.read("t", as_torch=True)
    assert got.dtype == torch.bfloat16 and torch.equal(got, t)
    got[0] = 9  # a writable copy
    assert torch.equal(r.read("t", as_torch=True), t)
    every = r.read_all(as_torch=True)
    assert torch.equal(every["i"], i) and every["i"].dtype == torch.int64
    assert r.tensor_info(as_torch=True) == {"t": (torch.bfloat16, (3,)), "i": (torch.int64, (4,))}
    assert r.tensor_info() == {"t": ("BF16", (3,)), "i": ("I64", (4,))}
    assert r.state_dict()["t"].dtype == torch.bfloat16


def test_the_bf16_recipe_of_the_docs_works_and_the_unconverted_one_needs_a_torch_with_uint16(tmp_path):
    t = torch.tensor([0.5, -7.0], dtype=torch.bfloat16)
    ckpt.save({"t": t}, tmp_path, step=1)
    a = ckpt.open_latest(tmp_path).read("t")
    assert torch.equal(torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16), t)  # docs/python.md's
    if hasattr(torch, "uint16"):  # torch >= 2.3 reads numpy uint16
        assert torch.equal(torch.from_numpy(a.copy()).view(torch.bfloat16), t)
    else:  # torch 1.13: no uint16 tensors
        with pytest.raises(TypeError):
            torch.from_numpy(a.copy())


def test_model_state_dict_metadata_survives_save_and_load(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    sd = model.state_dict()
    assert sd._metadata["1"]["version"] == 2  # BatchNorm's version: what load_state_dict reads
    ckpt.save({"model": sd}, tmp_path, step=1)
    r = ckpt.open_latest(tmp_path)
    rebuilt = r.state_dict()["model"]
    assert rebuilt._metadata == sd._metadata and list(rebuilt) == list(sd)
    into = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)).state_dict()
    del into._metadata
    back = ckpt.load({"model": into}, tmp_path)["model"]
    assert back is into and back._metadata == sd._metadata
    torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)).load_state_dict(back)


def test_non_finite_floats_keep_their_bits_through_save_and_load(tmp_path):
    import struct
    odd_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000123))[0]
    ckpt.save({"x": [float("inf"), -math.inf, odd_nan, float("nan")], "w": torch.zeros(1)}, tmp_path, step=1)
    x = ckpt.load({}, tmp_path)["x"]
    bits = [struct.pack("<d", v) for v in x]
    assert x[:2] == [math.inf, -math.inf]
    assert bits[2] == struct.pack("<d", odd_nan) and bits[3] == struct.pack("<d", float("nan"))


def test_a_dtype_the_installed_torch_lacks_is_a_type_error_naming_the_tensor(tmp_path):
    with ckpt.Checkpointer(tmp_path) as c:
        c.save_sync(1, {"u": np.arange(3, dtype=np.uint16)})
    r = ckpt.open_latest(tmp_path)
    if hasattr(torch, "uint16"):  # torch >= 2.3
        assert r.tensor_info(as_torch=True) == {"u": (torch.uint16, (3,))}
        assert r.read("u", as_torch=True).tolist() == [0, 1, 2]
    else:
        with pytest.raises(TypeError, match="tensor 'u' has dtype U16, which torch .* does not have"):
            r.tensor_info(as_torch=True)
        with pytest.raises(TypeError, match="tensor 'u' has dtype U16"):
            r.read("u", as_torch=True)


def test_load_into_reads_one_file_in_parts_on_every_core_into_unaligned_arrays(tmp_path):
    # 48 MiB in one file: with verify none or fast, parts of at least 16 MiB, one per core (at
    # most 3); numpy's buffers are in general not laid out as the file is modulo 4096, so
    # their bytes come through bounce buffers, copied out by every part's thread.
    rng = np.random.default_rng(5)
    state = {"a": rng.integers(0, 255, 32 << 20, dtype=np.uint8), "b": rng.standard_normal(4 << 20).astype(np.float32)}
    with ckpt.Checkpointer(tmp_path) as c:
        c.save_sync(1, state)
    r = ckpt.open_latest(tmp_path)
    for verify, parts in (("fast", min(os.cpu_count() or 1, 3)), ("none", min(os.cpu_count() or 1, 3)), ("full", 1)):
        out = {k: np.zeros_like(v) for k, v in state.items()}
        rep = r.load_into(out, verify=verify)
        assert rep["parts"] == parts, (verify, rep)
        assert rep["bytes_read"] >= 48 << 20 and "reads_direct" in rep
        assert all(np.array_equal(out[k], state[k]) for k in state), verify


def test_a_rank_split_into_files_saves_hashes_and_loads_every_file(tmp_path):
    # max_file_bytes 1 MiB: "a" and "b" (1 MiB each) a file each, "c" (3 MiB) a file of its
    # own, "d" and "e" (small) together: four files, each verified, every reader bit-exact.
    rng = np.random.default_rng(9)
    state = {"a": rng.integers(0, 255, 1 << 20, dtype=np.uint8), "b": rng.standard_normal(1 << 18).astype(np.float32),
             "c": rng.integers(0, 255, 3 << 20, dtype=np.uint8), "d": np.arange(10, dtype=np.int64),
             "e": np.ones(3, dtype=np.float64)}
    with ckpt.Checkpointer(tmp_path, max_file_bytes=1 << 20) as c:
        c.save_sync(1, state)
    names = sorted(p for p in os.listdir(tmp_path / "step-0000000001") if p.endswith(".safetensors"))
    assert names == [f"rank-00000-of-00001.part-0000{k}-of-00004.safetensors" for k in range(4)]
    r = ckpt.open_latest(tmp_path)
    r.verify("full")
    for verify in ("none", "fast", "full"):
        out = {k: np.zeros_like(v) for k, v in state.items()}
        rep = r.load_into(out, verify=verify)
        assert all(np.array_equal(out[k], state[k]) for k in state), verify
        assert rep["bytes_read"] >= 5 << 20
    for k, v in state.items():
        assert np.array_equal(r.read(k), v), k
    # One file per rank, however large (max_file_bytes=0), is the format every earlier
    # release wrote: schema 2.
    with ckpt.Checkpointer(tmp_path / "one", max_file_bytes=0) as c:
        c.save_sync(1, state)
    assert sorted(p for p in os.listdir(tmp_path / "one" / "step-0000000001") if p.endswith(".safetensors")) == [
        "rank-00000-of-00001.safetensors"]
    import json
    assert json.loads((tmp_path / "one" / "step-0000000001" / "manifest.json").read_text())["schema_version"] == 2
    assert json.loads((tmp_path / "step-0000000001" / "manifest.json").read_text())["schema_version"] == 3
