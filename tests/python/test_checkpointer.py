# SPDX-License-Identifier: Apache-2.0
# ckpt.Checkpointer, ckpt.open_latest and the Reader, with numpy arrays and torch tensors.
import os
import threading

import numpy as np
import pytest

import ckpt
from conftest import shard_path

torch = pytest.importorskip("torch")


def sample_tensors():
    g = np.random.default_rng(7)
    return {
        "f32": g.standard_normal((3, 5)).astype(np.float32),
        "f64": g.standard_normal(4),
        "f16": g.standard_normal(6).astype(np.float16),
        "i8": np.arange(-4, 4, dtype=np.int8),
        "i16": np.arange(7, dtype=np.int16),
        "i32": np.arange(9, dtype=np.int32).reshape(3, 3),
        "i64": np.array([1 << 40, -3], dtype=np.int64),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "t_bf16": torch.linspace(-2, 2, 10, dtype=torch.bfloat16),
        "t_f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "t_i64": torch.tensor([5, 6, 7]),
        "t_bool": torch.tensor([False, True]),
    }


def as_numpy(v):
    if isinstance(v, torch.Tensor):
        return v.view(torch.int16).numpy().view(np.uint16) if v.dtype == torch.bfloat16 else v.numpy()
    return v


def test_every_dtype_round_trips_bit_for_bit_with_metadata_and_the_result_fields(root):
    tensors = sample_tensors()
    with ckpt.Checkpointer(root) as c:
        res = c.save(0, 10, tensors, metadata={"epoch": 3, "pos": [1, 2]}, training={"lr": "cosine"}).wait()
    assert res.dir.endswith("step-0000000010") and os.path.isdir(res.dir)
    assert res.step == 10 and res.bytes > sum(as_numpy(v).nbytes for v in tensors.values())
    assert res.backend in ("io_uring", "posix") and res.stall_s >= 0 and not res.deferred
    r = ckpt.open_latest(root)
    assert (r.step, r.world_size, r.dir) == (10, 1, res.dir)
    assert r.metadata(0) == {"epoch": 3, "pos": [1, 2]}
    assert r.training == {"lr": "cosine"}
    assert sorted(r.tensor_names(0)) == sorted(tensors)
    assert r.tensor_info(0)["t_bf16"] == ("BF16", (10,))
    for name, v in tensors.items():
        got = r.read(0, name)
        want = as_numpy(v)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


def test_read_is_a_read_only_view_of_the_mapped_shard_that_outlives_the_reader(root):
    a = np.arange(1000, dtype=np.float32)
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 1, {"a": a})
    r = ckpt.open_latest(root)
    got = r.read(0, "a")
    assert not got.flags["WRITEABLE"] and not got.flags["OWNDATA"]
    with pytest.raises(ValueError):
        got[0] = 1
    del r
    assert np.array_equal(got, a)


def test_load_into_fills_existing_torch_tensors_and_numpy_arrays_in_place(root):
    src = {"w": torch.randn(4, 3), "b": torch.randn(3).to(torch.bfloat16), "n": np.arange(5, dtype=np.int64)}
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 2, src)
    dst = {"w": torch.zeros(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16), "n": np.zeros(5, dtype=np.int64)}
    ptr = dst["w"].data_ptr()
    report = ckpt.open_latest(root).load_into(0, dst)
    assert report["bytes_read"] > 0
    assert dst["w"].data_ptr() == ptr and torch.equal(dst["w"], src["w"])
    assert torch.equal(dst["b"], src["b"]) and np.array_equal(dst["n"], src["n"])


def test_load_into_refuses_a_wrong_shape_a_wrong_dtype_an_unknown_name_and_a_read_only_array(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 2, {"w": np.ones((4, 3), dtype=np.float32)})
    r = ckpt.open_latest(root)
    keep = np.full((4, 3), 7, dtype=np.float32)
    with pytest.raises(ckpt.InvalidArgument) as e:
        r.load_into(0, {"w": np.zeros((3, 4), dtype=np.float32)})
    assert e.value.code == "invalid_argument" and "w" in str(e.value) and "[4,3]" in e.value.expected.replace(" ", "")
    with pytest.raises(ckpt.InvalidArgument) as e:
        r.load_into(0, {"w": np.zeros((4, 3), dtype=np.float64)})
    assert "F32" in e.value.expected and "F64" in e.value.actual
    with pytest.raises(ckpt.NotFound) as e:
        r.load_into(0, {"nope": keep})
    assert "nope" in str(e.value) and e.value.file.endswith(".safetensors")
    assert isinstance(e.value, ckpt.Error)
    ro = np.zeros((4, 3), dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises(TypeError, match="'w' is read-only"):
        r.load_into(0, {"w": ro})
    assert np.all(keep == 7)  # nothing was written by the refused loads
    r.load_into(0, {"w": keep})
    assert np.all(keep == 1)


def test_a_deferred_save_copies_after_returning_and_the_fence_lets_the_caller_modify(root):
    w = torch.arange(1 << 16, dtype=torch.float32)
    want = w.clone()
    with ckpt.Checkpointer(root) as c:
        h = c.save(0, 3, {"w": w}, deferred=True)
        h.wait_staged()
        assert h.staged()
        w.add_(1)  # after the fence: not in the checkpoint
        res = h.wait()
        assert res.deferred and h.done()
    assert np.array_equal(ckpt.open_latest(root).read(0, "w"), want.numpy())


def test_a_deferred_save_keeps_its_tensors_alive_until_they_are_copied(root):
    with ckpt.Checkpointer(root) as c:
        h = c.save(0, 4, {"w": torch.full((1 << 16,), 3.0)}, deferred=True)  # the only reference
        h.wait()
    assert np.all(ckpt.open_latest(root).read(0, "w") == 3.0)


def test_dropping_the_handle_of_a_deferred_save_waits_for_its_copy_first(root):
    w = torch.full((1 << 18,), 5.0)
    with ckpt.Checkpointer(root) as c:
        c.save(0, 4, {"w": w}, deferred=True)  # the handle is dropped at once
        w.fill_(-1)  # allowed: the dropped handle waited for the copy
    assert np.all(ckpt.open_latest(root).read(0, "w") == 5.0)


def test_leaving_the_with_block_drains_the_saves_in_flight_and_rotation_keeps_the_last_two(root):
    with ckpt.Checkpointer(root, keep_last=2) as c:
        for step in range(1, 6):
            c.save(0, step, {"x": np.full(10, step, dtype=np.int32)}, deferred=True).wait_staged()
    assert ckpt.open_latest(root).step == 5
    assert sorted(d for d in os.listdir(root) if d.startswith("step-")) == ["step-0000000004", "step-0000000005"]


def test_waits_release_the_gil_so_that_another_rank_thread_can_complete_the_checkpoint(root):
    results = {}
    with ckpt.Checkpointer(root, world_size=2) as c:
        def rank0():
            results[0] = c.save(0, 1, {"a": np.zeros(3)}).wait()  # blocks until rank 1 saved
        t = threading.Thread(target=rank0)
        t.start()
        t.join(0.3)
        assert t.is_alive()  # waiting for rank 1, without the GIL (this thread runs)
        results[1] = c.save(1, 1, {"a": np.ones(3)}).wait()
        t.join(30)
        assert not t.is_alive()
    assert results[0].dir == results[1].dir
    r = ckpt.open_latest(root, world_size=2)
    assert np.all(r.read(1, "a") == 1) and np.all(r.read(0, "a") == 0)


def test_open_latest_at_another_world_size_is_world_size_mismatch(root):
    with ckpt.Checkpointer(root, world_size=2) as c:
        h = [c.save(rank, 1, {"a": np.zeros(2)}) for rank in (0, 1)]
        [x.wait() for x in h]
    with pytest.raises(ckpt.WorldSizeMismatch) as e:
        ckpt.open_latest(root, world_size=4)
    assert e.value.code == "world_size_mismatch" and e.value.expected == "4" and e.value.actual == "2"
    assert e.value.file.endswith("manifest.json")
    assert ckpt.open_latest(root, world_size=2).step == 1


def save_two_steps(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 1, {"a": np.full(4096, 1.0)})
        c.save_sync(0, 2, {"a": np.full(4096, 2.0)})
    return ckpt.open_latest(root)


def test_a_corrupt_chunk_is_checksum_mismatch_naming_the_file_and_the_previous_checkpoint_still_loads(root):
    r = save_two_steps(root)
    path = shard_path(r, 0)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    r = ckpt.open_latest(root)
    with pytest.raises(ckpt.ChecksumMismatch) as e:
        r.read(0, "a")
    assert e.value.file == path and e.value.expected != e.value.actual
    with pytest.raises(ckpt.ChecksumMismatch):
        r.load_into(0, {"a": np.zeros(4096)})
    assert np.all(ckpt.open_step(root, 1).read(0, "a") == 1.0)
    fb = ckpt.open_latest(root, fallback=True)
    assert fb.fell_back and fb.step == 1


def test_a_manifest_index_calling_an_f32_tensor_i32_is_malformed_shard_for_read_and_load_into(root):
    # The shard is intact and its own header says F32; an index edited to say I32 must not
    # make read() or load_into() hand out the float bits as int32.
    import json
    a = np.linspace(-1, 1, 6, dtype=np.float32)
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 1, {"a": a, "b": np.arange(3, dtype=np.int64)})
    r = ckpt.open_latest(root)
    path, manifest = shard_path(r, 0), os.path.join(r.dir, "manifest.json")
    with open(manifest) as f:
        m = json.load(f)
    for t in m["tensors"]:
        if t["name"] == "a":
            t["dtype"] = "I32"
    with open(manifest, "w") as f:
        json.dump(m, f)
    for verify in ("none", "fast", "full"):
        r = ckpt.open_latest(root)
        assert r.tensor_info(0)["a"] == ("I32", (6,))
        for call in (lambda: r.read(0, "a", verify=verify), lambda: r.read(0, "b", verify=verify)):
            with pytest.raises(ckpt.MalformedShard) as e:
                call()
            assert e.value.file == path
            assert "tensor 'a' disagrees with the manifest index in its dtype" in str(e.value)
            assert (e.value.expected, e.value.actual) == ("I32", "F32")
        keep = np.full(6, 7, dtype=np.int32)
        with pytest.raises(ckpt.MalformedShard) as e:
            r.load_into(0, {"a": keep}, verify=verify)
        assert e.value.file == path and (e.value.expected, e.value.actual) == ("I32", "F32")
        assert np.all(keep == 7)  # nothing was written


def test_a_truncated_shard_is_size_mismatch_and_a_removed_one_missing_shard(root):
    r = save_two_steps(root)
    path = shard_path(r, 0)
    size = os.path.getsize(path)
    os.truncate(path, size - 10)
    with pytest.raises(ckpt.SizeMismatch) as e:
        ckpt.open_latest(root)
    assert e.value.file == path and str(size) in e.value.expected and str(size - 10) in e.value.actual
    os.remove(path)
    with pytest.raises(ckpt.MissingShard) as e:
        ckpt.open_latest(root)
    assert e.value.file == path
    assert np.all(ckpt.open_step(root, 1).read(0, "a") == 1.0)


def test_no_checkpoint_is_not_found(root):
    with pytest.raises(ckpt.NotFound):
        ckpt.open_latest(root)


def test_a_second_writer_on_the_root_is_busy_naming_the_holder_and_the_first_goes_on(root):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(ckpt.Busy) as e:
            ckpt.Checkpointer(root)
        assert str(os.getpid()) in str(e.value)
        c.save_sync(0, 1, {"a": np.zeros(2)})
    assert ckpt.open_latest(root).step == 1


def test_a_failed_save_raises_on_wait_and_latest_keeps_the_previous_checkpoint(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(0, 1, {"a": np.zeros(2)})
        with pytest.raises(ckpt.InvalidArgument) as e:
            c.save(0, 1, {"a": np.zeros(2)}).wait()  # step 1 again: refused
        assert "1" in str(e.value)
        with pytest.raises(ckpt.InvalidArgument):
            c.save(5, 2, {"a": np.zeros(2)}).wait()  # no rank 5 in a world of 1
    assert ckpt.open_latest(root).step == 1


def test_tensors_ckpt_cannot_take_are_type_errors_naming_them(root):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(TypeError, match="'nc' is not contiguous"):
            c.save(0, 1, {"nc": np.zeros((4, 4))[:, 1]})
        with pytest.raises(TypeError, match="'tnc' is not contiguous"):
            c.save(0, 1, {"tnc": torch.zeros(4, 4).t()})
        with pytest.raises(TypeError, match="'dev' is on meta"):
            c.save(0, 1, {"dev": torch.empty(3, device="meta")})
        with pytest.raises(TypeError, match="'cx' has dtype"):
            c.save(0, 1, {"cx": np.zeros(2, dtype=np.complex64)})
        with pytest.raises(TypeError, match="'s' is a str"):
            c.save(0, 1, {"s": "text"})
        with pytest.raises(TypeError, match="dict"):
            c.save(0, 1, [np.zeros(2)])
        with pytest.raises(ckpt.InvalidArgument):
            ckpt.Checkpointer(root + "2", writer="nope")
        c.save_sync(0, 1, {"ok": memoryview(bytearray(b"abc"))})  # the buffer protocol
    assert ckpt.open_latest(root).read(0, "ok").tobytes() == b"abc"


def test_metadata_must_be_json(root):
    with ckpt.Checkpointer(root) as c:
        with pytest.raises(TypeError):
            c.save(0, 1, {"a": np.zeros(1)}, metadata={"x": object()})
        circular = []
        circular.append(circular)
        with pytest.raises(ValueError, match="Circular reference"):
            c.save(0, 1, {"a": np.zeros(1)}, metadata={"x": circular})
        c.save_sync(0, 1, {"a": np.zeros(1)}, metadata={"x": 1})


def test_loads_verification_and_copying_saves_release_the_gil(root):
    # Another thread keeps noting the time; with the GIL held through a call it could note
    # none inside the call's middle third.
    import time
    big = {"w": np.ones(8 << 20, dtype=np.float32)}  # 32 MiB
    stamps, stop = [], threading.Event()

    def spin():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 64 == 0:
                stamps.append(time.perf_counter())
    t = threading.Thread(target=spin)
    t.start()
    try:
        spans = {}

        def during(name, fn):
            t0 = time.perf_counter()
            fn()
            spans[name] = (t0, time.perf_counter())
        with ckpt.Checkpointer(root) as c:
            during("save", lambda: c.save(0, 1, big).wait())
        r = ckpt.open_latest(root)
        during("load_into", lambda: r.load_into(0, {"w": np.zeros(8 << 20, dtype=np.float32)}))
        during("verify", lambda: r.verify("full"))
    finally:
        stop.set()
        t.join()
    for name, (t0, t1) in spans.items():
        lo, hi = t0 + (t1 - t0) / 3, t1 - (t1 - t0) / 3
        assert any(lo < s < hi for s in stamps), (name, t1 - t0)


def test_when_busy_skip_skips_a_step_that_arrives_while_another_is_in_flight(root):
    with ckpt.Checkpointer(root, world_size=2, when_busy="skip") as c:
        h1 = c.save(0, 1, {"a": np.zeros(2)})  # in flight until rank 1 saves step 1
        h2 = c.save(0, 2, {"a": np.zeros(2)})
        assert h2.skipped() and h2.done() and h2.wait() is None
        c.save(1, 1, {"a": np.ones(2)})
        assert h1.wait().step == 1
        assert c.save(1, 2, {"a": np.ones(2)}).skipped()  # decided once for every rank of the step
    assert ckpt.open_latest(root).step == 1


def test_every_error_code_of_the_library_has_its_exception_class_with_the_same_identifier(tmp_path):
    # One table in the C++ library (core/error.cpp) names every ckpt::Errc: the identifier the
    # tool's --json and these exceptions carry as `code`, and the words messages begin with.
    codes = ckpt._core._error_codes()
    assert len(codes) == 16
    assert {c for c, _ in codes} == set(ckpt.errors._BY_CODE)
    for code, name in codes:
        assert ckpt.errors._BY_CODE[code].code == code
        assert code == name.replace(" ", "_") or (code, name) in {("io_error", "I/O error"), ("no_space", "no space left"),
                                                                  ("comm_error", "communication error")}
    # And a real error crosses with both: its class's code, and the message's first words.
    with pytest.raises(ckpt.NotFound) as e:
        ckpt.open_latest(str(tmp_path / "nothing-here"))
    assert e.value.code == "not_found" and str(e.value).startswith("not found: ")


def test_keep_last_0_keeps_every_checkpoint(root):
    with ckpt.Checkpointer(root, keep_last=0) as c:
        for step in range(1, 6):
            c.save_sync(step, {"a": np.full(2, step)})
        assert c.stats()["rotated"] == 0
    assert sorted(d for d in os.listdir(root) if d.startswith("step-")) == [f"step-{s:010d}" for s in range(1, 6)]
    assert ckpt.open_step(root, 1).read("a")[0] == 1


def test_saves_skipped_counts_the_steps_when_busy_skip_left_out(root):
    with ckpt.Checkpointer(root, world_size=2, when_busy="skip") as c:
        h1 = c.save(0, 1, {"a": np.zeros(2)})  # in flight until rank 1 saves step 1
        assert c.save(0, 2, {"a": np.zeros(2)}).skipped() and c.save(0, 3, {"a": np.zeros(2)}).skipped()
        c.save(1, 1, {"a": np.ones(2)})
        h1.wait()
        assert c.save(1, 2, {"a": np.ones(2)}).skipped()  # one count per rank's call
        s = c.stats()
        # Every call counts as started, the skipped ones too: 5 calls, 3 skipped, 1 checkpoint.
        assert (s["saves_started"], s["saves_skipped"], s["commits"], s["failures"]) == (5, 3, 1, 0)


def test_conflict_is_the_class_of_the_library_s_conflict_code_and_a_directory_tier_never_raises_it(tmp_path):
    # Conflict needs an object store holding another run's newest checkpoint (docs/python.md);
    # a directory durable tier records no run, so a second run may share it.
    assert ckpt.errors._BY_CODE["conflict"] is ckpt.Conflict and issubclass(ckpt.Conflict, ckpt.Error)
    for run, step in (("a", 1), ("b", 2)):
        with ckpt.Checkpointer(tmp_path / run, durable_root=tmp_path / "durable") as c:
            c.save_sync(step, {"a": np.zeros(2)})
            c.wait_durable()
            assert c.stats()["durable_copies"] == 1
    assert ckpt.open_latest(tmp_path / "durable").step == 2


def test_metadata_keys_are_strings_and_save_state_keeps_other_keys(root):
    with ckpt.Checkpointer(root) as c:
        c.save_sync(1, {"a": np.zeros(2)}, metadata={"by_id": {1: "x", 2.5: "y", None: "z", False: "f"}, "t": (1, 2)})
        with pytest.raises(TypeError):
            c.save(2, {"a": np.zeros(2)}, metadata={"k": {(1, 2): 0}})
        c.save_state(3, {"by_id": {1: "x", (1, 2): "y"}, "t": (1, 2), "a": np.zeros(2)}).wait()
    assert ckpt.open_step(root, 1).metadata() == {"by_id": {"1": "x", "2.5": "y", "null": "z", "false": "f"}, "t": [1, 2]}
    back = ckpt.open_step(root, 3).state_dict()
    assert back["by_id"] == {1: "x", (1, 2): "y"} and back["t"] == (1, 2)


def test_staging_sized_for_a_state_is_allocated_at_construction_and_the_saves_do_not_grow_it(tmp_path):
    state = {"w": torch.randn(1000, 300), "b": torch.zeros(300, dtype=torch.bfloat16), "step": torch.tensor(3)}
    need = ckpt.staging_bytes(state)
    data = sum(v.numel() * v.element_size() for v in state.values())
    # The image (header, tensors, padding), and room for a split into a file per core
    # (max_file_bytes): each further file a header of at most this one's and two paddings.
    files = max(2, os.cpu_count() or 1)
    assert need % 4096 == 0 and data + 8 < need <= data + 2 * 4096 + 4096 + (files - 1) * (4096 + 8192)
    with ckpt.Checkpointer(tmp_path / "r", staging_bytes_per_rank=state) as c:
        st = c.stats()
        assert (st["staging_bytes"], st["staging_allocations"]) == (need, 1)  # before any save
        c.save_sync(0, 9_999_999_999, state)  # the longest step a checkpoint can have
        st = c.stats()
        assert (st["staging_bytes"], st["staging_allocations"]) == (need, 1)
    r = ckpt.open_latest(tmp_path / "r")
    assert torch.equal(r.read(0, "w", as_torch=True), state["w"])
    # Without it the pool is allocated inside the first save.
    with ckpt.Checkpointer(tmp_path / "s") as c:
        assert (c.stats()["staging_bytes"], c.stats()["staging_allocations"]) == (0, 0)
        c.save_sync(0, 1, state)
        st = c.stats()  # what this save needed: at most what staging_bytes sized (it allows for files)
        assert st["staging_allocations"] == 1 and data < st["staging_bytes"] <= need


def test_staging_sized_for_a_nested_state_dict_fits_save_state_and_counts_only_names_dtypes_and_shapes(tmp_path):
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 4}
    need = ckpt.staging_bytes(sd, world_size=8)
    with ckpt.Checkpointer(tmp_path / "r", world_size=1, staging_bytes_per_rank=sd) as c:
        c.save_state(5, sd).wait()
        assert (c.stats()["staging_bytes"], c.stats()["staging_allocations"]) == (ckpt.staging_bytes(sd), 1)
    assert need >= ckpt.staging_bytes(sd)  # rank and world_size strings of 8 ranks are no shorter
    meta = {"w": torch.empty(1000, 300, device="meta"), "b": torch.empty(300, dtype=torch.bfloat16, device="meta")}
    cpu = {"w": torch.empty(1000, 300), "b": torch.empty(300, dtype=torch.bfloat16)}
    assert ckpt.staging_bytes(meta) == ckpt.staging_bytes(cpu)
    assert ckpt.staging_bytes({"a": np.zeros(10, np.float32)}) == ckpt.staging_bytes({"a": torch.zeros(10)})
    with ckpt.Checkpointer(tmp_path / "n", staging_bytes_per_rank=123 * 4096) as c:
        assert c.stats()["staging_bytes"] == 123 * 4096


def test_staging_size_refuses_what_cannot_be_sized():
    with pytest.raises(TypeError, match="dict of tensors or a state_dict"):
        ckpt.staging_bytes([torch.zeros(3)])
    with pytest.raises(TypeError, match="complex"):
        ckpt.staging_bytes({"c": torch.zeros(3, dtype=torch.complex64)})
    with pytest.raises(ckpt.InvalidArgument, match="world_size"):
        ckpt.staging_bytes({"a": torch.zeros(3)}, world_size=0)
    with pytest.raises(ckpt.InvalidArgument, match="staging_bytes_per_rank"):
        ckpt.Checkpointer("/nonexistent-never-made", staging_bytes_per_rank=-1)
