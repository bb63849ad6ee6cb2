# SPDX-License-Identifier: Apache-2.0
# ckpt.dcp: torch.distributed.checkpoint (DCP) saving and loading through ckpt's Writer and
# Reader, with DCP's own planners resharding: 4 ranks save DTensors sharded and replicated,
# plain tensors and non-tensor values; 3 and 2 ranks load them; async_save, damaged bytes, a
# save killed mid-way, hostile manifests, and no pickle on disk. Needs torch >= 2.4 (DCP's
# StorageWriter.reset and DTensor on the CPU); skipped on older torch.
import functools
import json
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

import ckpt
from conftest import read_safetensors, shard_path, spawn_ranks

torch = pytest.importorskip("torch")
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
NO_DCP_API = (f"torch {torch.__version__}'s torch.distributed.checkpoint lacks the API of torch >= 2.4 that "
              "ckpt.dcp implements (StorageWriter.reset, AsyncStager, StorageMeta) and DTensor on the CPU")
if TORCH >= (2, 4):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    import ckpt.dcp


@pytest.fixture(autouse=True)
def needs_the_dcp_api(request):
    if TORCH < (2, 4) and request.function.__name__ != "test_importing_it_on_an_older_torch_is_an_import_error_naming_the_version":
        pytest.skip(NO_DCP_API)


@pytest.mark.skipif(TORCH >= (2, 4), reason="this torch has the API")
def test_importing_it_on_an_older_torch_is_an_import_error_naming_the_version():
    with pytest.raises(ImportError, match=f"torch >= 2.4.*this is torch {torch.__version__}"):
        import ckpt.dcp  # noqa: F401


CKPT_TOOL = os.path.join(os.environ.get("CKPT_BIN_DIR", ""), "ckpt")


# ---- the state: what 4 ranks save and 3 and 2 ranks load -------------------------------------

def reference():
    """The global tensors and values (every rank makes the same)."""
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(10, 6, generator=g),                                  # Shard(0): 3, 3, 3, 1 rows
        "v": torch.randn(5, 7, generator=g).to(torch.bfloat16),                # Shard(1): uneven columns
        "b": torch.randn(6, generator=g, dtype=torch.float64),                 # Replicate()
        "emb": torch.arange(12, dtype=torch.int64).reshape(4, 3) * 1000003,    # a plain tensor
        "count": torch.tensor(41, dtype=torch.int32),                          # 0-d
        "extra": {"lr": 0.1, "betas": (0.9, 0.999), "name": "run-1", "nan": float("nan"),
                  "sched": [1e-300, -0.0, float("inf")], "blob": b"\x00\xff", "big": 1 << 70},
    }


def state(mesh, fill):
    """The state_dict of this rank: DTensors on `mesh`, the reference values if fill, else
    zeros and placeholders (what a load fills)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    g = reference()
    if not fill:
        g = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else {x: None for x in v}) for k, v in g.items()}
    return {"model": {"w": distribute_tensor(g["w"], mesh, [Shard(0)]),
                      "v": distribute_tensor(g["v"], mesh, [Shard(1)]),
                      "b": distribute_tensor(g["b"], mesh, [Replicate()])},
            "emb": g["emb"], "count": g["count"], "extra": g["extra"]}


def canonical(v):
    """A comparable form, floats by their bits (NaN == NaN, -0.0 != 0.0)."""
    if isinstance(v, float):
        return ("f", struct.pack("<d", v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [canonical(x) for x in v])
    if isinstance(v, dict):
        return {k: canonical(x) for k, x in v.items()}
    return v


def differences(sd, ref):
    """What of the loaded state_dict differs from the reference (empty when equal)."""
    out = []
    for name, got in [("w", sd["model"]["w"]), ("v", sd["model"]["v"]), ("b", sd["model"]["b"]),
                      ("emb", sd["emb"]), ("count", sd["count"])]:
        if hasattr(got, "full_tensor"):
            got = got.full_tensor()
        if got.dtype != ref[name].dtype or not torch.equal(got, ref[name]):
            out.append(name)
    if canonical(sd["extra"]) != canonical(ref["extra"]):
        out.append(f"extra: {sd['extra']!r}")
    return out


# ---- processes -----------------------------------------------------------------------------

def spawn(tmp_path, world, target):
    """Runs target(rank, world, init, root, out) in `world` processes, root tmp_path/root:
    (their exit codes, the JSON result each wrote)."""
    _, codes, results = spawn_ranks(tmp_path, world, target, job=f"-{target.__name__}-{world}", join_s=60)
    return codes, results


def _start(rank, world, init):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def _dump(out, rank, result):
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


def _finish(out, rank, result):
    _dump(out, rank, result)
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown, which may wait for a dead peer


def _mesh_worker(body):
    """A worker of a job over a device mesh: body(mesh, root, result) fills result; an exception
    is reported to the test as result["exception"]. (The module's attribute is the wrapper,
    under the body's name: spawn finds it by that name.)"""
    @functools.wraps(body)
    def worker(rank, world, init, root, out):
        result = {}
        try:
            body(_start(rank, world, init), root, result)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            result["exception"] = repr(e)
        _finish(out, rank, result)
    return worker


@_mesh_worker
def save_worker(mesh, root, result):
    md = dcp.save(state(mesh, True), storage_writer=ckpt.dcp.Writer(root))
    result["step"] = ckpt.open_latest(root).step
    result["fqns"] = sorted(md.state_dict_metadata)


@_mesh_worker
def load_worker(mesh, root, result):
    sd = state(mesh, False)
    dcp.load(sd, storage_reader=ckpt.dcp.Reader(root))
    result["differences"] = differences(sd, reference())
    result["local_w_rows"] = sd["model"]["w"].to_local().shape[0]


@_mesh_worker
def twice_worker(mesh, root, result):
    with ckpt.dcp.Writer(root) as w:
        dcp.save(state(mesh, True), storage_writer=w)
        first = w._c
        sd = state(mesh, True)
        sd["count"] = torch.tensor(42, dtype=torch.int32)
        dcp.save(sd, storage_writer=w)
        result["same_checkpointer"] = w._c is first
        result["steps"] = [w.committed.step, ckpt.open_latest(root).step]
    loaded_sd = state(mesh, False)
    dcp.load(loaded_sd, storage_reader=ckpt.dcp.Reader(root))
    ref = reference()
    ref["count"] = torch.tensor(42, dtype=torch.int32)
    result["differences"] = differences(loaded_sd, ref)


def module_job(tmp_path_factory, world, worker):
    """A job for a module-scoped fixture: (its directory, exit codes, results)."""
    if TORCH < (2, 4):
        pytest.skip(NO_DCP_API)
    tmp = tmp_path_factory.mktemp(f"dcp{world}")
    return (tmp, *spawn(tmp, world, worker))


@pytest.fixture(scope="module")
def saved_at_4(tmp_path_factory):
    tmp, codes, results = module_job(tmp_path_factory, 4, save_worker)
    assert codes == [0] * 4, results
    for r in range(4):
        assert "exception" not in results[r], results[r]
        assert results[r]["step"] == 1
    return tmp, str(tmp / "root")


def test_four_ranks_save_sharded_replicated_and_plain_state_as_one_ckpt_checkpoint(saved_at_4):
    _, root = saved_at_4
    r = ckpt.open_latest(root, world_size=4)
    assert r.step == 1
    r.verify("full")
    names = {rank: set(r.tensor_names(rank)) for rank in range(4)}
    # Each rank holds its rows of w and columns of v; the replicated b, emb and count once.
    for rank in range(4):
        assert {"model.w", "model.v"} <= names[rank], names
    assert sum("model.b" in n for n in names.values()) == 1
    assert sum("emb" in n for n in names.values()) == 1 and sum("count" in n for n in names.values()) == 1
    assert np.array_equal(r.read(3, "model.w"), reference()["w"][9:10].numpy())  # torch.chunk: rows 9..9
    meta = r.training["dcp"]
    assert meta["version"] == 1
    kinds = {e["fqn"]: e["kind"] for e in meta["state_dict"]}
    assert kinds["model.w"] == "tensor" and kinds["extra.lr"] == "bytes" and kinds["extra.betas"] == "bytes"


@pytest.mark.parametrize("world", [3, 2])
def test_fewer_ranks_load_it_through_dcps_resharding_equal_to_the_saved_state(saved_at_4, world):
    tmp, _ = saved_at_4
    codes, results = spawn(tmp, world, load_worker)
    assert codes == [0] * world, results
    for rank in range(world):
        assert "exception" not in results[rank], results[rank]
        assert results[rank]["differences"] == [], results[rank]
    # torch.chunk's rows at this world size, not the 4 ranks' ones: DCP resharded.
    assert [results[k]["local_w_rows"] for k in range(world)] == [len(c) for c in torch.chunk(torch.zeros(10), world)]


def test_two_ranks_save_twice_through_one_writer_each_and_load_the_second(tmp_path):
    codes, results = spawn(tmp_path, 2, twice_worker)
    assert codes == [0, 0], results
    for rank in (0, 1):
        r = results[rank]
        assert "exception" not in r, r
        assert r["same_checkpointer"] and r["steps"] == [2, 2] and r["differences"] == [], r


def test_ckpt_verify_full_and_consolidate_work_on_the_dcp_checkpoint(saved_at_4):
    tmp, root = saved_at_4
    done = subprocess.run([CKPT_TOOL, "verify", root, "--verify", "full"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp / "hf"
    done = subprocess.run([CKPT_TOOL, "consolidate", root, str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    model = read_safetensors(out / "model.safetensors")
    assert int(model["count"]) == 41 and np.array_equal(model["emb"], reference()["emb"].numpy())
    ref = reference()
    assert np.array_equal(model["model.w"], ref["w"].numpy())  # reassembled from the 4 ranks' rows
    assert np.array_equal(model["model.v"], ref["v"].view(torch.int16).numpy().view(np.uint16))  # bf16 bits
    assert np.array_equal(model["model.b"].astype(np.float64), ref["b"].numpy().astype(np.float32))


def pickle_like(path):
    with open(path, "rb") as f:
        head = f.read(2)
    return head[:1] == b"\x80" or head == b"PK"  # a pickle's PROTO opcode, a torch.save zip


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_no_file_of_the_checkpoint_is_a_pickle_where_dcps_own_writer_writes_them(saved_at_4, tmp_path):
    _, root = saved_at_4
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    assert len(files) >= 5
    assert [f for f in files if pickle_like(f)] == []
    # The same state through DCP's FileSystemWriter: its .metadata is a pickle (the check sees one).
    fs = tmp_path / "fs"
    dcp.save({"w": torch.ones(4), "extra": {"lr": 0.1}}, storage_writer=dcp.FileSystemWriter(str(fs)))
    assert pickle_like(fs / ".metadata")


# ---- one process (no process group: DCP's single-process mode) -------------------------------

def unwrap(excinfo):
    """The exception a rank raised inside DCP's CheckpointException."""
    e = excinfo.value
    assert isinstance(e, CheckpointException), repr(e)
    (exc, _), = e.failures.values()
    return exc


def flip_byte_of(path, value):
    """Flips a byte inside the stored bytes of `value` (a float32 that appears once)."""
    data = bytearray(open(path, "rb").read())
    at = data.find(struct.pack("<f", value))
    assert at >= 0 and data.find(struct.pack("<f", value), at + 1) < 0
    data[at + 1] ^= 0x40
    with open(path, "r+b") as f:
        f.write(data)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_flipped_byte_is_checksum_mismatch_naming_the_file_where_dcps_filesystem_reader_loads_a_wrong_value(tmp_path):
    w = torch.arange(4096, dtype=torch.float32)
    w[1000] = 12345.678
    root, fs = str(tmp_path / "root"), str(tmp_path / "fs")
    dcp.save({"w": w}, storage_writer=ckpt.dcp.Writer(root))
    dcp.save({"w": w}, storage_writer=dcp.FileSystemWriter(fs))
    shard = shard_path(ckpt.open_latest(root), 0)
    flip_byte_of(shard, 12345.678)
    flip_byte_of(os.path.join(fs, "__0_0.distcp"), 12345.678)

    # Into a contiguous tensor (load_into's O_DIRECT reads) and into a strided view (the mapped shard).
    for target in ({"w": torch.zeros(4096)}, {"w": torch.zeros(4096, 2)[:, 0]}):
        with pytest.raises(CheckpointException) as excinfo:
            dcp.load(target, storage_reader=ckpt.dcp.Reader(root))
        err = unwrap(excinfo)
        assert isinstance(err, ckpt.ChecksumMismatch), repr(err)
        assert os.path.basename(err.file) == os.path.basename(shard) and os.path.basename(shard) in str(err)

    target = {"w": torch.zeros(4096)}
    dcp.load(target, storage_reader=dcp.FileSystemReader(fs))  # no error...
    assert not torch.equal(target["w"], w)  # ...and a wrong value
    assert torch.equal(target["w"] != w, torch.arange(4096) == 1000)


class Opaque:
    pass


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_step_is_the_one_after_latest_or_the_checkpoint_id_and_keep_last_rotates(tmp_path):
    root = str(tmp_path / "root")
    sd = {"w": torch.arange(8, dtype=torch.float32), "meta": {"epoch": 3}}
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(root, keep_last=2))
    assert ckpt.open_latest(root).step == 1  # the first step of an empty root
    sd["w"] += 1
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(root, keep_last=2))
    assert ckpt.open_latest(root).step == 2  # the step after latest
    dcp.save({"w": sd["w"] + 1, "meta": {"epoch": 5}}, checkpoint_id=10, storage_writer=ckpt.dcp.Writer(root, keep_last=2))
    assert ckpt.open_latest(root).step == 10
    with pytest.raises(ckpt.NotFound):
        ckpt.open_step(root, 1)  # keep_last=2 rotated it
    with pytest.raises(CheckpointException) as excinfo:  # at or before latest
        dcp.save(sd, checkpoint_id="5", storage_writer=ckpt.dcp.Writer(root))
    assert isinstance(unwrap(excinfo), ckpt.InvalidArgument)
    assert ckpt.open_latest(root).step == 10
    dcp.save(sd, checkpoint_id="step-11", storage_writer=ckpt.dcp.Writer(root, step=11))
    assert ckpt.open_latest(root).step == 11
    with pytest.raises(ckpt.InvalidArgument, match="differs from the Writer's step 12"):
        dcp.save(sd, checkpoint_id=13, storage_writer=ckpt.dcp.Writer(root, step=12))
    with pytest.raises(ckpt.InvalidArgument, match="expected a step"):
        dcp.save(sd, checkpoint_id="/tmp/elsewhere", storage_writer=ckpt.dcp.Writer(root))

    target = {"w": torch.zeros(8), "meta": {"epoch": None}}
    dcp.load(target, checkpoint_id=2, storage_reader=ckpt.dcp.Reader(root))
    assert torch.equal(target["w"], torch.arange(8, dtype=torch.float32) + 1) and target["meta"]["epoch"] == 3
    dcp.load(target, checkpoint_id=10, storage_reader=ckpt.dcp.Reader(root))
    assert torch.equal(target["w"], torch.arange(8, dtype=torch.float32) + 2) and target["meta"]["epoch"] == 5


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_async_save_holds_the_values_of_the_moment_it_was_called(tmp_path):
    root = str(tmp_path / "root")
    w = torch.arange(1 << 20, dtype=torch.float32)
    sd = {"w": w, "meta": {"epoch": 3}}
    fut = dcp.async_save(sd, storage_writer=ckpt.dcp.Writer(root))
    w.add_(1000)
    sd["meta"]["epoch"] = 4
    fut.result()
    target = {"w": torch.zeros(1 << 20), "meta": {"epoch": None}}
    dcp.load(target, storage_reader=ckpt.dcp.Reader(root))
    assert torch.equal(target["w"], torch.arange(1 << 20, dtype=torch.float32))
    assert target["meta"]["epoch"] == 3


# ---- one Writer for several saves: its Checkpointer kept open --------------------------------

def loaded(root, step, n):
    target = {"w": torch.zeros(n), "meta": {"epoch": None}}
    dcp.load(target, checkpoint_id=step, storage_reader=ckpt.dcp.Reader(root))
    return target


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_writer_keeps_its_checkpointer_open_across_saves_and_each_step_loads(tmp_path):
    root = str(tmp_path / "root")
    w = ckpt.dcp.Writer(root)
    sd = {"w": torch.arange(1024, dtype=torch.float32), "meta": {"epoch": 0}}
    opened = []
    for epoch in range(3):
        sd["w"] += 1
        sd["meta"]["epoch"] = epoch
        dcp.save(sd, storage_writer=w)
        opened.append(w._c)
        assert w.committed.step == epoch + 1 and ckpt.open_latest(root).step == epoch + 1
    assert opened[0] is not None and opened[1] is opened[0] and opened[2] is opened[0]
    for step in (1, 2, 3):
        target = loaded(root, step, 1024)
        assert torch.equal(target["w"], torch.arange(1024, dtype=torch.float32) + step)
        assert target["meta"]["epoch"] == step - 1
    w.close()
    assert w._c is None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_second_writer_of_the_root_is_busy_while_the_first_is_open_and_free_once_closed(tmp_path):
    root = str(tmp_path / "root")
    sd = {"w": torch.ones(16)}
    first = ckpt.dcp.Writer(root)
    dcp.save(sd, storage_writer=first)
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(root))
    err = unwrap(excinfo)
    assert type(err) is ckpt.Busy and err.code == "busy", repr(err)
    assert str(os.getpid()) in str(err), str(err)  # the holder's pid
    assert ckpt.open_latest(root).step == 1
    first.close()
    with ckpt.dcp.Writer(root) as second:  # the root is free; `with` closes it again
        dcp.save(sd, storage_writer=second)
        assert second._c is not None
    assert second._c is None and ckpt.open_latest(root).step == 2
    dcp.save(sd, storage_writer=first)  # a closed Writer opens a new Checkpointer
    assert ckpt.open_latest(root).step == 3
    first.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_keep_open_false_closes_after_each_save_and_a_writer_per_save_still_works(tmp_path):
    root = str(tmp_path / "root")
    sd = {"w": torch.ones(16)}
    w = ckpt.dcp.Writer(root, keep_open=False)
    for step in (1, 2):
        dcp.save(sd, storage_writer=w)
        assert w._c is None and ckpt.open_latest(root).step == step
        with ckpt.Checkpointer(root) as c:  # the root is free between saves
            pass
    for step in (3, 4):  # a Writer made for each save, kept open until it is collected
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(root))
        assert ckpt.open_latest(root).step == step


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_checkpoint_id_is_for_its_save_only_and_the_next_save_takes_the_step_after_latest(tmp_path):
    root = str(tmp_path / "root")
    with ckpt.dcp.Writer(root) as w:
        dcp.save({"w": torch.ones(4)}, checkpoint_id=10, storage_writer=w)
        dcp.save({"w": torch.ones(4)}, storage_writer=w)
        assert ckpt.open_latest(root).step == 11


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_async_saves_in_a_row_with_one_writer_each_commit_in_order(tmp_path):
    root = str(tmp_path / "root")
    n = 1 << 20
    w = ckpt.dcp.Writer(root)
    x = torch.zeros(n)
    futs = []
    for epoch in range(3):
        x.fill_(epoch + 1)
        futs.append(dcp.async_save({"w": x, "meta": {"epoch": epoch}}, storage_writer=w))  # no wait between them
    x.fill_(-1)
    for f in futs:
        f.result()
    assert ckpt.open_latest(root).step == 3
    for step in (1, 2, 3):
        target = loaded(root, step, n)
        assert torch.all(target["w"] == step) and target["meta"]["epoch"] == step - 1
    first = w._c
    dcp.async_save({"w": x, "meta": {"epoch": 9}}, storage_writer=w).result()
    assert w._c is first and ckpt.open_latest(root).step == 4
    w.close()
    dcp.save({"w": x}, storage_writer=ckpt.dcp.Writer(root, keep_open=False))  # close() released the root
    assert ckpt.open_latest(root).step == 5


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_value_without_a_json_form_is_a_type_error_naming_its_fqn_and_nothing_is_saved(tmp_path):
    root = str(tmp_path / "root")
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save({"w": torch.ones(3), "opt": {"hook": Opaque()}}, storage_writer=ckpt.dcp.Writer(root))
    err = unwrap(excinfo)
    assert isinstance(err, TypeError) and "'opt.hook'" in str(err), repr(err)
    with pytest.raises(ckpt.NotFound):
        ckpt.open_latest(root)
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save({"w": torch.ones(3), "z": torch.ones(2, dtype=torch.complex64)}, storage_writer=ckpt.dcp.Writer(root))
    err = unwrap(excinfo)
    assert isinstance(err, TypeError) and "'z'" in str(err) and "complex64" in str(err), repr(err)
    with pytest.raises(ckpt.NotFound):
        ckpt.open_latest(root)
    dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.dcp.Writer(root))  # the root is free again
    assert ckpt.open_latest(root).step == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_planner_that_does_not_keep_the_global_metadata_is_a_type_error(tmp_path):
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class Forgetful(DefaultSavePlanner):
        def create_global_plan(self, all_plans):
            plans, md = super().create_global_plan(all_plans)
            del self.metadata
            return plans, md
    root = str(tmp_path / "root")
    with pytest.raises(CheckpointException) as excinfo:
        dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.dcp.Writer(root), planner=Forgetful())
    err = unwrap(excinfo)
    assert isinstance(err, TypeError) and ".metadata" in str(err), repr(err)


def test_a_rank_holding_several_chunks_of_one_fqn_names_them_by_their_offsets(tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    def chunk(fqn, offsets, sizes, size):
        return WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                         tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                                                     properties=TensorProperties(), size=torch.Size(size)))
    plans = [SavePlan([chunk("w", [0, 0], [2, 4], [4, 4]), chunk("w", [2, 0], [2, 4], [4, 4]),
                       chunk("b", [0], [4], [4]), WriteItem(index=MetadataIndex("lr"), type=WriteItemType.BYTE_IO)]),
             SavePlan([])]
    writer = ckpt.dcp.Writer(str(tmp_path / "root"), step=5)
    out = writer.prepare_global_plan(plans)
    assert [p.storage_data["step"] for p in out] == [5, 5]
    assert out[0].storage_data["names"] == {("w", (0, 0)): "w@0,0", ("w", (2, 0)): "w@2,0", ("b", (0,)): "b",
                                            ("lr", None): "lr"}


def hostile_variants(good):
    """DCP metadata a hostile (or broken) writer could put in a manifest with valid checksums."""
    def edit(f):
        js = json.loads(json.dumps(good))
        f(js)
        return js
    w = lambda js: next(e for e in js["state_dict"] if e["fqn"] == "w")  # noqa: E731
    return {
        "code for a dtype": edit(lambda js: w(js).update(dtype="__import__('os').system('touch PWNED')")),
        "a torch attribute that is no dtype": edit(lambda js: w(js).update(dtype="save")),
        "a negative size": edit(lambda js: w(js).update(size=[-1])),
        "a chunk outside the tensor": edit(lambda js: w(js)["chunks"][0].update(offsets=[4])),
        "a pickle kind": edit(lambda js: js["state_dict"].append({"fqn": "x", "kind": "pickle", "data": "gASVAA=="})),
        "planner_data naming a tensor": edit(lambda js: js.update(planner_data={"planner_data": {"__tensor__": "w"}})),
        "a rank the checkpoint lacks": edit(lambda js: js["storage_data"][0].update(rank=7)),
        "no location for a chunk": edit(lambda js: js.update(storage_data=[])),
        "another version": edit(lambda js: js.update(version=2)),
        "not an object": "gASVAA==",
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_hostile_manifest_is_malformed_manifest_and_nothing_of_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "root")
    dcp.save({"w": torch.arange(4, dtype=torch.float32), "lr": 0.5}, storage_writer=ckpt.dcp.Writer(root))
    r = ckpt.open_latest(root)
    tensors, good = {"w": np.array(r.read(0, "w"))}, r.training["dcp"]
    objects = r.metadata(0)["dcp_objects"]
    variants = hostile_variants(good)
    variants["a value that does not decode"] = None  # the BYTE_IO value below, with a good "dcp"
    for step, (what, js) in enumerate(variants.items(), start=2):
        bad_objects = {"lr": {"v": {"__int__": "not a number"}}} if js is None else objects
        with ckpt.Checkpointer(root, keep_last=0) as c:
            c.save_sync(0, step, tensors, metadata={"dcp_objects": bad_objects}, training={"dcp": js or good})
        target = {"w": torch.zeros(4), "lr": None}
        with pytest.raises(CheckpointException) as excinfo:
            dcp.load(target, storage_reader=ckpt.dcp.Reader(root))
        err = unwrap(excinfo)
        assert isinstance(err, ckpt.MalformedManifest), (what, repr(err))
        assert err.file.endswith("manifest.json"), (what, err.file)
    assert not os.path.exists(tmp_path / "PWNED")
    with ckpt.Checkpointer(root, keep_last=0) as c:  # a checkpoint that is not DCP's
        c.save_sync(0, 100, tensors)
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(4), "lr": None}, storage_reader=ckpt.dcp.Reader(root))
    assert isinstance(unwrap(excinfo), ckpt.NotFound) and "no DCP metadata" in str(unwrap(excinfo))
    target = {"w": torch.zeros(4), "lr": None}
    dcp.load(target, checkpoint_id=1, storage_reader=ckpt.dcp.Reader(root))  # the good one still loads
    assert torch.equal(target["w"], torch.arange(4, dtype=torch.float32)) and target["lr"] == 0.5


# ---- two ranks: a rank that cannot write, a committer killed mid-save -------------------------

def failures_worker(rank, world, init, root, out):
    import datetime
    import time
    import torch.distributed as dist
    result = {}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)

    class Recording(ckpt.dcp.Writer):
        """Keeps what write_data raised: torch 2.6's DCP on Python 3.13 cannot pass a rank's
        exception on (it pickles traceback frames), and raises "cannot pickle code objects"."""
        def write_data(self, plan, planner):
            try:
                return super().write_data(plan, planner)
            except Exception as e:
                result[f"write_error_{result['phase']}"] = f"{type(e).__name__}: {e}"
                raise

    def writer():
        return Recording(root, timeout=datetime.timedelta(seconds=60))
    result["phase"] = "first"
    x = torch.full((1 << 21,), float(rank + 1))  # 8 MiB a rank
    try:
        dcp.save({f"r{rank}": x, "n": 1}, storage_writer=writer())
        result["first"] = ckpt.open_latest(root).step
        # Step 2: rank 1 holds a value with no JSON form; both ranks must fail at once.
        t0 = time.monotonic()
        result["phase"] = "unencodable"
        try:
            dcp.save({f"r{rank}": x, "n": 2, f"hook{rank}": Opaque() if rank == 1 else 0}, storage_writer=writer())
            result["unencodable"] = "saved"
        except BaseException as e:  # noqa: BLE001
            result["unencodable"] = str(e)
        result["unencodable_s"] = time.monotonic() - t0
        result["after_unencodable"] = ckpt.open_latest(root).step
        _dump(out, rank, result)
        # Step 2 again: the committer dies with its shard being written.
        result["phase"] = "killed"
        if rank == 0:
            save = ckpt.Checkpointer.save

            def save_then_die(self, *args, **kwargs):
                h = save(self, *args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
                return h
            ckpt.Checkpointer.save = save_then_die
        try:
            dcp.save({f"r{rank}": x * 10, "n": 3}, storage_writer=writer())
            result["killed"] = "saved"
        except BaseException as e:  # noqa: BLE001
            result["killed"] = repr(e)
    except BaseException as e:  # noqa: BLE001
        result["exception"] = repr(e)
    _finish(out, rank, result)


@pytest.fixture(scope="module")
def two_rank_failures(tmp_path_factory):
    tmp, codes, results = module_job(tmp_path_factory, 2, failures_worker)
    return str(tmp / "root"), codes, results


def test_a_rank_that_cannot_write_fails_the_save_on_every_rank_at_once(two_rank_failures):
    _, codes, results = two_rank_failures
    for rank in (0, 1):
        r = results[rank]
        assert "exception" not in r, r
        assert r["first"] == 1 and r["after_unencodable"] == 1 and r["unencodable"] != "saved", r
        assert r["unencodable_s"] < 30, r  # not the coordinator's 60 s timeout
    assert results[1]["write_error_unencodable"].startswith("TypeError") and "'hook1'" in results[1]["write_error_unencodable"]
    # Rank 0's commit refused the shard rank 1 saved in its place, which says why.
    err = results[0]["write_error_unencodable"]
    assert err.startswith("MalformedManifest") and "rank 1 failed before writing its shard (TypeError)" in err, err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_save_killed_mid_way_leaves_the_previous_checkpoint_latest_and_loadable(two_rank_failures):
    root, codes, results = two_rank_failures
    assert codes[0] == -signal.SIGKILL and codes[1] == 0, (codes, results)
    assert results[1]["killed"] != "saved", results
    assert ckpt.open_latest(root).step == 1
    target = {"r0": torch.zeros(1 << 21), "r1": torch.zeros(1 << 21), "n": None}
    dcp.load(target, storage_reader=ckpt.dcp.Reader(root, verify="full"))  # one process reads both ranks'
    assert torch.all(target["r0"] == 1) and torch.all(target["r1"] == 2) and target["n"] == 1
