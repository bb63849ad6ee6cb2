# SPDX-License-Identifier: Apache-2.0
# ckpt.state_dict_to_tensors / tensors_to_state_dict: model, AdamW, LambdaLR and RNG states
# through a checkpoint and back, bit for bit, so that training resumes exactly.
import math
import random

import numpy as np
import pytest

import ckpt
from ckpt.state import rng_state, set_rng_state

torch = pytest.importorskip("torch")


def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * 0.5 * (1 + math.cos(s / 10)))
    return model, opt, sched


def train(model, opt, sched, steps):
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 8)
        noise = float(np.random.standard_normal()) + random.random()
        loss = ((model(x) - noise) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item().hex())
    return losses


def state_of(model, opt, sched):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(), "rng": rng_state()}


def test_names_follow_the_nesting_and_non_tensor_leaves_stay_json():
    model, opt, sched = make()
    train(model, opt, sched, 1)
    tensors, skel = ckpt.state_dict_to_tensors(state_of(model, opt, sched))
    assert "model.0.weight" in tensors and "optim.state.3.exp_avg" in tensors and "optim.state.0.step" in tensors
    assert "rng.torch" in tensors and "rng.numpy.1" in tensors
    assert skel["optim"]["param_groups"][0]["lr"] == {"__float__": opt.param_groups[0]["lr"].hex()}
    assert skel["optim"]["param_groups"][0]["params"] == [0, 1, 2, 3]
    # A model's state_dict carries _metadata (module versions): kept next to its entries.
    assert skel["model"]["__state_dict__"]["0.weight"]["__tensor__"] == "model.0.weight"
    assert skel["model"]["_metadata"][""] == {"version": 1}
    back = ckpt.tensors_to_state_dict(tensors, skel)
    assert set(back["optim"]["state"]) == {0, 1, 2, 3}  # int keys come back as ints
    assert back["optim"]["param_groups"][0]["betas"] == opt.param_groups[0]["betas"]
    assert isinstance(back["optim"]["param_groups"][0]["betas"], tuple)


def test_training_resumed_from_a_checkpoint_of_its_state_continues_bit_for_bit(tmp_path):
    random.seed(1)
    np.random.seed(1)
    model, opt, sched = make()
    train(model, opt, sched, 3)
    tensors, skel = ckpt.state_dict_to_tensors(state_of(model, opt, sched))
    with ckpt.Checkpointer(tmp_path / "root") as c:
        c.save(0, 3, tensors, metadata={"state": skel}, deferred=True).wait()
    want = train(model, opt, sched, 4)
    want_params = [p.detach().clone() for p in model.parameters()]

    random.seed(99)  # a fresh process: other RNG states, fresh model and optimizer
    np.random.seed(99)
    model2, opt2, sched2 = make(seed=5)
    r = ckpt.open_latest(tmp_path / "root")
    state = ckpt.tensors_to_state_dict(r.read_all(0), r.metadata(0)["state"])
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    sched2.load_state_dict(state["sched"])
    set_rng_state(state["rng"])
    assert train(model2, opt2, sched2, 4) == want
    for a, b in zip(want_params, model2.parameters()):
        assert torch.equal(a, b)


def test_load_into_the_live_model_state_dict_restores_the_parameters_in_place(tmp_path):
    model, _, _ = make(seed=1)
    tensors, _ = ckpt.state_dict_to_tensors({"model": model.state_dict()})
    with ckpt.Checkpointer(tmp_path / "root") as c:
        c.save_sync(0, 1, tensors)
    model2, _, _ = make(seed=2)
    live, _ = ckpt.state_dict_to_tensors({"model": model2.state_dict()})
    ckpt.open_latest(tmp_path / "root").load_into(0, live)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_exotic_leaves_come_back_as_they_were():
    obj = {"f": [0.1, float("inf"), -0.0], "nan": float("nan"), "t": (1, "a", None), "k": {(1, 2): b"\x00\xff", 7: True},
           "big": 1 << 70, "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "np": np.float32(2.5),
           "__odd": 1}
    tensors, skel = ckpt.state_dict_to_tensors(obj)
    import json
    back = ckpt.tensors_to_state_dict(tensors, json.loads(json.dumps(skel)))
    assert back["f"][0] == 0.1 and math.isinf(back["f"][1]) and math.copysign(1, back["f"][2]) < 0
    assert math.isnan(back["nan"]) and back["t"] == (1, "a", None) and back["k"] == {(1, 2): b"\x00\xff", 7: True}
    assert back["big"] == 1 << 70 and back["__odd"] == 1
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], obj["bf16"])
    assert back["np"] == np.float32(2.5) and back["np"].dtype == np.float32


def test_a_leaf_that_is_neither_tensor_nor_json_is_a_type_error_naming_its_path():
    with pytest.raises(TypeError, match="optim.param_groups.0.fn is a function"):
        ckpt.state_dict_to_tensors({"optim": {"param_groups": [{"fn": lambda: 0}]}})


def test_a_missing_tensor_is_a_key_error_naming_it():
    tensors, skel = ckpt.state_dict_to_tensors({"m": {"w": torch.zeros(2)}})
    with pytest.raises(KeyError, match="m.w"):
        ckpt.tensors_to_state_dict({}, skel)


def test_the_non_json_leaves_of_torch_state_dicts_round_trip_exactly_through_a_checkpoint(tmp_path):
    import struct
    neg_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
    obj = {"dtype": torch.bfloat16, "dtypes": [torch.float32, torch.int64], "device": torch.device("cpu"),
           "cuda": torch.device("cuda", 1), "set": {1, 2, 3}, "fs": frozenset({"a", (1, 2)}), "empty": set(),
           "by_id": {0: {"step": 3}, 7: [1.0]}, "by_dtype": {torch.float16: 2}, "nan": math.nan, "neg_nan": neg_nan,
           "inf": [math.inf, -math.inf], "w": torch.ones(2)}
    tensors, skeleton = ckpt.state_dict_to_tensors(obj)
    with ckpt.Checkpointer(tmp_path) as c:
        c.save_sync(0, 1, tensors, metadata={"state": skeleton})
    r = ckpt.open_latest(tmp_path)
    back = ckpt.tensors_to_state_dict(r.read_all(0), r.metadata(0)["state"])
    assert back["dtype"] is torch.bfloat16 and back["dtypes"] == [torch.float32, torch.int64]
    assert back["device"] == torch.device("cpu") and back["cuda"] == torch.device("cuda", 1)
    assert back["set"] == {1, 2, 3} and isinstance(back["set"], set)
    assert back["fs"] == frozenset({"a", (1, 2)}) and isinstance(back["fs"], frozenset) and back["empty"] == set()
    assert back["by_id"] == {0: {"step": 3}, 7: [1.0]} and back["by_dtype"] == {torch.float16: 2}
    assert struct.pack("<d", back["nan"]) == struct.pack("<d", math.nan)
    assert struct.pack("<d", back["neg_nan"]) == struct.pack("<d", neg_nan)
    assert back["inf"] == [math.inf, -math.inf] and torch.equal(back["w"], obj["w"])


def test_a_bound_method_or_an_object_is_a_type_error_naming_its_path_and_type():
    class Sched:
        def lr(self):
            return 1.0
    with pytest.raises(TypeError, match=r"sched\.lr_lambdas\.0 is a method \(<bound method"):
        ckpt.state_dict_to_tensors({"sched": {"lr_lambdas": [Sched().lr]}})
    with pytest.raises(TypeError, match=r"a\.b is a Sched"):
        ckpt.state_dict_to_tensors({"a": {"b": Sched()}})
    with pytest.raises(TypeError, match=r"an element of s is a Sched"):
        ckpt.state_dict_to_tensors({"s": {Sched()}})
