# SPDX-License-Identifier: Apache-2.0
# What save() and the readers refuse, as ckpt.InvalidArgument naming the argument (never
# pybind's list of signatures, never a silent truncation), and what metadata may hold.
import json
import math
import os
import struct

import numpy as np
import pytest

import ckpt


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def from_bits(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def temporaries(root):
    return [n for n in os.listdir(root) if n.startswith(".tmp-")]


@pytest.mark.parametrize("step", [2.9, 3.0, np.float64(4.0), "5", None])
def test_a_step_that_is_not_an_integer_is_invalid_argument_and_never_truncated(root, step):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, step, {"a": np.zeros(2)})
        assert e.value.code == "invalid_argument"
        assert e.value.detail == "step" and e.value.expected == "an integer in 0..9999999999"
        assert e.value.actual == f"{step!r} ({type(step).__name__})"
        assert str(e.value) == f"invalid argument: step: expected an integer in 0..9999999999, actual {step!r} ({type(step).__name__})"
        assert c.stats()["saves_started"] == 0
        # Integers of any kind are steps: numpy's too.
        assert c.save(0, np.int64(3), {"a": np.zeros(2)}).wait().step == 3
        assert c.save(0, np.uint8(4), {"a": np.zeros(2)}).wait().step == 4


@pytest.mark.parametrize("step", [-1, 10 ** 10, 1 << 64, 1 << 70])
def test_a_step_out_of_range_is_invalid_argument_naming_it(root, step):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, step, {"a": np.zeros(2)})
        assert (e.value.detail, e.value.expected, e.value.actual) == ("step", "an integer in 0..9999999999", str(step))
    with pytest.raises(ckpt.InvalidArgument) as e:
        ckpt.open_step(root, step)
    assert e.value.detail == "step" and e.value.actual == str(step)


@pytest.mark.parametrize("rank", [1.0, -1, 2, 1 << 40, "0"])
def test_a_rank_that_is_not_an_integer_of_the_world_is_invalid_argument_naming_it(root, rank):
    with ckpt.Checkpointer(root, world_size=2) as c:
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(rank, 1, {"a": np.zeros(2)})
        assert e.value.detail == "save rank" and e.value.expected == "an integer in 0..1"
        assert e.value.actual.startswith(repr(rank) if not isinstance(rank, int) else str(rank))


def test_a_name_with_a_lone_surrogate_is_invalid_argument_naming_it(root):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 1, {"w\udc80": np.zeros(2)})
        assert e.value.detail == "tensor name" and e.value.expected == "text encodable as UTF-8 (no lone surrogate)"
        assert e.value.actual == "'w\\udc80' (a lone surrogate at index 1)"
        for where, kwargs in (("metadata", {"metadata": {"k\ud800": 1}}), ("metadata", {"metadata": {"k": ["\udfff"]}}),
                              ("training", {"training": {"k": "\ud800"}})):
            with pytest.raises(ckpt.InvalidArgument) as e:
                c.save(0, 1, {"w": np.zeros(2)}, **kwargs)
            assert e.value.detail == where and "lone surrogate" in e.value.actual
        c.save_sync(0, 1, {"w\u00e9\U0001F600": np.zeros(2)}, metadata={"k\u00e9": "\U0001F600"})  # any valid text
    r = ckpt.open_latest(root)
    assert r.tensor_names(0) == ["w\u00e9\U0001F600"] and r.metadata(0) == {"k\u00e9": "\U0001F600"}
    with pytest.raises(ckpt.InvalidArgument) as e:
        r.read(0, "w\udc80")
    assert e.value.detail == "tensor name"
    with pytest.raises(ckpt.InvalidArgument) as e:
        ckpt.Checkpointer(root + "\udc80")
    assert e.value.detail == "root"


def nested(levels):
    v = 0
    for _ in range(levels):
        v = [v]
    return v


def test_metadata_a_manifest_cannot_hold_is_refused_by_save_before_anything_is_written(root):
    with ckpt.Checkpointer(root) as c:
        refusals = [({"metadata": {"note": "x" * ((1 << 20) + 1)}}, "length of the string at shards[0].metadata",
                     "at most 1048576 bytes", "more than 1048576 bytes"),
                    ({"training": {"note": "x" * ((1 << 20) + 1)}}, "length of the string at training",
                     "at most 1048576 bytes", "more than 1048576 bytes"),
                    ({"metadata": {"deep": nested(29)}}, "nesting of objects and arrays", "at most 32 levels", "more"),
                    ({"training": {"deep": nested(31)}}, "nesting of objects and arrays", "at most 32 levels", "more"),
                    ({"metadata": {"k" * 4097: 0}}, "length of a key in shards[0].metadata", "at most 4096 bytes",
                     "more than 4096 bytes")]
        for kwargs, detail, expected, actual in refusals:
            with pytest.raises(ckpt.InvalidArgument) as e:
                c.save(0, 1, {"a": np.zeros(2)}, **kwargs)  # from save() itself, not from wait()
            assert e.value.detail == "metadata and training of rank 0 (step 1) cannot be held by a manifest: " + detail
            assert (e.value.expected, e.value.actual) == (expected, actual)
            assert temporaries(root) == []
        assert c.stats()["saves_started"] == 0 and c.stats()["failures"] == 0
        # Up to the limits, it is saved: a 1 MiB string, 28 levels below the metadata dict, 30
        # below the training dict.
        c.save_sync(0, 1, {"a": np.zeros(2)}, metadata={"note": "x" * (1 << 20), "deep": nested(28)},
                    training={"deep": nested(30)})
    r = ckpt.open_latest(root)
    assert r.metadata(0)["deep"] == nested(28) and len(r.metadata(0)["note"]) == 1 << 20


def test_nan_and_infinities_in_metadata_round_trip_bit_for_bit(root):
    negative_nan, payload_nan = from_bits(0xFFF8000000000000), from_bits(0x7FF0000000000123)
    metadata = {"loss": math.nan, "neg": negative_nan, "payload": payload_nan, "bounds": [math.inf, -math.inf, 1.5],
                "nested": {"t": (math.nan, 2)}, "np": np.float64("inf")}
    with ckpt.Checkpointer(root) as c:
        res = c.save_sync(0, 1, {"a": np.zeros(2)}, metadata=metadata, training={"scale": -math.inf})
    r = ckpt.open_latest(root)
    got = r.metadata(0)
    assert bits(got["loss"]) == 0x7FF8000000000000
    assert bits(got["neg"]) == 0xFFF8000000000000 and bits(got["payload"]) == 0x7FF0000000000123
    assert got["bounds"] == [math.inf, -math.inf, 1.5] and got["np"] == math.inf
    assert math.isnan(got["nested"]["t"][0]) and got["nested"]["t"][1] == 2
    assert r.training == {"scale": -math.inf}
    # The manifest stays JSON any reader takes (no NaN literal), the floats tagged.
    with open(os.path.join(res.dir, "manifest.json")) as f:
        manifest = json.load(f, parse_constant=lambda name: pytest.fail(f"non-JSON literal {name}"))
    md = manifest["shards"][0]["metadata"]
    assert md["loss"] == {"__float__": "nan"} and md["neg"] == {"__float__": "nan:0xfff8000000000000"}
    assert md["bounds"] == [{"__float__": "inf"}, {"__float__": "-inf"}, 1.5]
    assert manifest["training"] == {"scale": {"__float__": "-inf"}}


def test_a_save_with_no_tensors_is_refused_unless_allow_empty(root):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 1, {})
        assert e.value.file == root and e.value.expected == "at least one tensor" and e.value.actual == "none"
        assert e.value.detail == "save of step 1 by rank 0: no tensors (an empty save is refused unless CheckpointerOptions::allow_empty)"
        assert c.stats()["saves_started"] == 0 and c.stats()["failures"] == 0
    with ckpt.Checkpointer(root, allow_empty=True) as c:
        assert c.save_sync(0, 1, {}).step == 1
    assert ckpt.open_latest(root).tensor_names(0) == []


def test_a_save_at_or_before_latest_is_refused_and_not_counted_as_a_failed_save(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 5, {"a": np.zeros(2)})
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 5, {"a": np.zeros(2)}).wait()
        assert e.value.detail == "checkpoint for step 5 already exists"
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 2, {"a": np.zeros(2)}).wait()
        assert e.value.expected == "a step after 5" and e.value.actual == "step 2"
        st = c.stats()
        assert (st["saves_refused"], st["failures"], st["consecutive_failures"], st["last_failure"]) == (2, 0, 0, "")
        assert c.save_sync(0, 6, {"a": np.zeros(2)}).step == 6
    assert ckpt.open_latest(root).step == 6


def test_the_free_form_parts_hold_1_mi_values_and_64_mib_plus_the_allowance_of_one_rank(root):
    # One rank: 1 Mi + 256 values (the metadata dict, its list, the empty training dict count
    # one each) and 64 MiB + 4 KiB of compact JSON, as docs/python.md says.
    with ckpt.Checkpointer(root, keep_last=1) as c:
        c.save_sync(0, 1, {"a": np.zeros(2)}, metadata={"v": [0] * ((1 << 20) + 256 - 3)})
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 2, {"a": np.zeros(2)}, metadata={"v": [0] * ((1 << 20) + 256 - 2)})
        assert e.value.expected == f"at most {(1 << 20) + 256} values"
        mib = "x" * (1 << 20)
        c.save_sync(0, 3, {"a": np.zeros(2)}, metadata={"v": [mib] * 64})
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 4, {"a": np.zeros(2)}, metadata={"v": [mib] * 64, "w": "y" * 4096})
        assert e.value.expected == f"at most {(64 << 20) + 4096} bytes" and "size of the free-form parts" in e.value.detail
    assert len(ckpt.open_latest(root).metadata()["v"]) == 64
