# SPDX-License-Identifier: Apache-2.0
"""torch.distributed.checkpoint (DCP) storage through ckpt: a StorageWriter and a StorageReader.

    import torch.distributed.checkpoint as dcp
    import ckpt.dcp
    dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("/ckpts/run1"))
    dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("/ckpts/run1"))

DCP's planners decide what each rank writes and reads (sharded DTensors and ShardedTensors,
replicated tensors written once, resharding on load); ckpt stores it. Each rank's write items
become that rank's shard of one ckpt checkpoint: hashed while written, committed atomically
(by rank 0 once every rank's shard is durable, over ckpt.distributed.TorchCoordinator in a
multi-process job), then `latest` moves and rotation runs. Nothing on disk is a pickle:

- a tensor chunk is a ckpt tensor named by its DCP fqn (fqn@o0,o1,... when a rank holds several
  chunks of one fqn), described as ckpt.slice_of(fqn, global size, offsets, sizes), so
  `ckpt consolidate` and `ckpt verify --full` work on the checkpoint;
- DCP's Metadata (every fqn's dtype, size, chunks and properties, the planner's flattening
  map, where each chunk is) is JSON in the manifest's `training` dict, key "dcp";
- a non-tensor value (DCP's BYTE_IO item, which DCP itself would torch.save) is JSON in its
  rank's `metadata` dict (key "dcp_objects"), encoded as ckpt.state_dict_to_tensors encodes a
  leaf (floats bit exact, tuples, bytes, dicts with non-string keys); on load it is rebuilt
  from the JSON and handed to DCP as the bytes it expects (a torch.save made in memory).

Reader.read_metadata validates that JSON field by field (dtypes and memory formats from a
fixed list, sizes and chunk boxes as non-negative integers within the tensor) and refuses
anything else with ckpt.MalformedManifest: a checkpoint is never executed, only parsed.
Reads go through ckpt's verified reader: a damaged chunk is ckpt.ChecksumMismatch naming the
shard file. docs/python.md, "PyTorch DCP: ckpt.dcp", has the whole contract.
"""

import copy
import dataclasses
import datetime
import io
import re
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as _dist
from torch.futures import Future

try:
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, StorageMeta, TensorProperties,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    if not hasattr(StorageWriter, "reset"):
        raise ImportError("StorageWriter has no reset()")
except ImportError as e:
    raise ImportError(f"ckpt.dcp needs the torch.distributed.checkpoint of torch >= 2.4 (StorageWriter.reset, "
                      f"AsyncStager, StorageMeta); this is torch {torch.__version__}: {e}") from None

from . import Checkpointer, Error, InvalidArgument, MalformedManifest, NotFound, CommError, open_latest, open_step, slice_of
from . import _args
from .state import state_dict_to_tensors, tensors_to_state_dict

FORMAT_VERSION = 1
_MAX_STEP = 9999999999

# The dtypes ckpt stores, by the name of their torch attribute (the only names read back).
_DTYPES = {name: getattr(torch, name) for name in
           ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}
# ckpt's dtype names (Reader.tensor_info) -> torch dtypes.
_CKPT_DTYPE = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
               "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
               "BOOL": torch.bool}
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format}


# ---- the step a save writes, the one a load reads --------------------------------------------

def _step_of(checkpoint_id, what):
    """A DCP checkpoint_id (or a step= argument) as a ckpt step: an int, or a str of digits
    (optionally "step-N")."""
    v = checkpoint_id
    if isinstance(v, str):
        m = re.fullmatch(r"(?:step-)?([0-9]{1,10})", v)
        if m is None:
            raise InvalidArgument(f"invalid argument: {what} {v!r}: expected a step (an integer, or a string of "
                                  "digits), actual something else", "", f"{what} {v!r}", "a step", repr(v))
        v = int(m.group(1))
    return _args.integer(v, what, 0, _MAX_STEP)


def _latest_step(root):
    try:
        return open_latest(root, verify="none").step
    except NotFound:
        return None


# ---- the coordinator a multi-process save commits through -----------------------------------

_coordinator_lock = threading.Lock()
_coordinator = None  # (default process group, TorchCoordinator): one per process, reused by every Writer


def _shared_coordinator(timeout):
    """The process's TorchCoordinator over the default group (made the first time: a collective
    every process reaches in write order, since every rank sets up its Writer in DCP's local
    planning step)."""
    global _coordinator
    from .distributed import TorchCoordinator
    group = _dist.distributed_c10d._get_default_group()
    with _coordinator_lock:
        if _coordinator is None or _coordinator[0] is not group:
            _coordinator = (group, TorchCoordinator(timeout=timeout))
        return _coordinator[1]


def _drop_shared_coordinator(coord):
    """After a failed collective the channel is broken: the next Writer makes a new one."""
    global _coordinator
    with _coordinator_lock:
        if _coordinator is not None and _coordinator[1] is coord:
            _coordinator = None
        else:
            return
    coord.close()


# ---- DCP's Metadata <-> JSON -----------------------------------------------------------------

def _ints(v):
    return [int(x) for x in v]


def _index_key(index):
    return (index.fqn, None if index.offset is None else tuple(int(x) for x in index.offset))


def _metadata_to_json(md, locations):
    """JSON of a DCP Metadata; `locations` {index key: (rank, ckpt name)} is its storage_data."""
    entries = []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            entries.append({"fqn": fqn, "kind": "bytes"})
            continue
        if not isinstance(m, TensorStorageMetadata):
            raise TypeError(f"ckpt.dcp.Writer: {fqn!r} has storage metadata of type {type(m).__name__}, "
                            "neither TensorStorageMetadata nor BytesStorageMetadata")
        p = m.properties
        dtype = str(p.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"ckpt.dcp.Writer: tensor {fqn!r} has dtype {p.dtype}: ckpt stores " + ", ".join(_DTYPES))
        if p.layout != torch.strided:
            raise TypeError(f"ckpt.dcp.Writer: tensor {fqn!r} has layout {p.layout}: ckpt stores strided tensors")
        fmt = next((k for k, f in _MEMORY_FORMATS.items() if f == p.memory_format), None)
        if fmt is None:
            raise TypeError(f"ckpt.dcp.Writer: tensor {fqn!r} has memory format {p.memory_format}")
        entries.append({"fqn": fqn, "kind": "tensor", "dtype": dtype, "size": _ints(m.size),
                        "requires_grad": bool(p.requires_grad), "memory_format": fmt, "pin_memory": bool(p.pin_memory),
                        "chunks": [{"offsets": _ints(c.offsets), "sizes": _ints(c.sizes)} for c in m.chunks]})
    planner_data = None
    if md.planner_data is not None:
        tensors, planner_data = state_dict_to_tensors({"planner_data": md.planner_data})
        if tensors:
            raise TypeError("ckpt.dcp.Writer: the planner's planner_data holds tensors: " + ", ".join(tensors))
    sm = md.storage_meta
    storage_meta = None if sm is None else {
        "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
        "save_id": sm.save_id, "load_id": sm.load_id}
    where = [{"fqn": fqn, "offset": None if off is None else list(off), "rank": rank, "name": name}
             for (fqn, off), (rank, name) in locations.items()]
    return {"version": FORMAT_VERSION, "state_dict": entries, "planner_data": planner_data,
            "storage_meta": storage_meta, "storage_data": where}


class _Refuse(Exception):
    pass


def _need(cond, what):
    if not cond:
        raise _Refuse(what)


def _uint_list(v, what, length=None):
    _need(isinstance(v, list) and all(type(x) is int and 0 <= x < (1 << 63) for x in v),
          f"{what} is not a list of non-negative integers")
    _need(length is None or len(v) == length, f"{what} has {len(v)} dimensions, the tensor {length}")
    return v


def _text(v, what):
    _need(isinstance(v, str), f"{what} is not a string")
    return v


def _object_list(js, key):
    v = js.get(key)
    _need(isinstance(v, list) and all(isinstance(x, dict) for x in v), f"{key} is not a list of objects")
    return v


def _metadata_from_json(js):
    """The DCP Metadata and the locations {index key: (rank, name)} of the JSON
    _metadata_to_json wrote; _Refuse naming the first field that is not what it wrote."""
    _need(isinstance(js, dict), "the \"dcp\" entry is not an object")
    _need(js.get("version") == FORMAT_VERSION, f"version {js.get('version')!r} is not {FORMAT_VERSION}")
    sdm = {}
    for e in _object_list(js, "state_dict"):
        fqn = _text(e.get("fqn"), "an entry's fqn")
        _need(fqn not in sdm, f"fqn {fqn!r} appears twice")
        kind = e.get("kind")
        if kind == "bytes":
            sdm[fqn] = BytesStorageMetadata()
            continue
        _need(kind == "tensor", f"{fqn!r}: kind {kind!r} is neither \"tensor\" nor \"bytes\"")
        dtype = e.get("dtype")
        _need(isinstance(dtype, str) and dtype in _DTYPES, f"{fqn!r}: dtype {dtype!r} is not one of " + ", ".join(_DTYPES))
        fmt = e.get("memory_format")
        _need(isinstance(fmt, str) and fmt in _MEMORY_FORMATS, f"{fqn!r}: memory_format {fmt!r} is not one of "
              + ", ".join(_MEMORY_FORMATS))
        _need(type(e.get("requires_grad")) is bool and type(e.get("pin_memory")) is bool,
              f"{fqn!r}: requires_grad or pin_memory is not a bool")
        size = _uint_list(e.get("size"), f"{fqn!r}: size")
        chunks = e.get("chunks")
        _need(isinstance(chunks, list), f"{fqn!r}: chunks is not a list")
        cs = []
        for c in chunks:
            _need(isinstance(c, dict), f"{fqn!r}: a chunk is not an object")
            off = _uint_list(c.get("offsets"), f"{fqn!r}: a chunk's offsets", len(size))
            n = _uint_list(c.get("sizes"), f"{fqn!r}: a chunk's sizes", len(size))
            _need(all(o + k <= s for o, k, s in zip(off, n, size)), f"{fqn!r}: chunk at {off} of sizes {n} is outside {size}")
            cs.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(n)))
        props = TensorProperties(dtype=_DTYPES[dtype], layout=torch.strided, requires_grad=e["requires_grad"],
                                 memory_format=_MEMORY_FORMATS[fmt], pin_memory=e["pin_memory"])
        sdm[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(size), chunks=cs)
    planner_data = None
    if js.get("planner_data") is not None:
        try:
            planner_data = tensors_to_state_dict({}, js["planner_data"])["planner_data"]
        except (KeyError, TypeError, ValueError, OverflowError, IndexError) as e:
            raise _Refuse(f"planner_data does not decode: {e}") from None
    sm = js.get("storage_meta")
    storage_meta = None
    if sm is not None:
        _need(isinstance(sm, dict) and all(sm.get(k) is None or isinstance(sm.get(k), str)
                                           for k in ("checkpoint_id", "save_id", "load_id")),
              "storage_meta is not an object of strings")
        storage_meta = StorageMeta(checkpoint_id=sm.get("checkpoint_id"), save_id=sm.get("save_id"),
                                   load_id=sm.get("load_id"))
    locations = {}
    for w in _object_list(js, "storage_data"):
        fqn = _text(w.get("fqn"), "a storage_data entry's fqn")
        _need(fqn in sdm, f"storage_data names {fqn!r}, which the state_dict does not")
        off = w.get("offset")
        if off is not None:
            off = tuple(_uint_list(off, f"{fqn!r}: a storage_data offset"))
        _need(type(w.get("rank")) is int and 0 <= w["rank"] < (1 << 31), f"{fqn!r}: storage_data rank is not a rank")
        locations[(fqn, off)] = (w["rank"], _text(w.get("name"), f"{fqn!r}: storage_data name"))
    for fqn, m in sdm.items():
        keys = [(fqn, None)] if isinstance(m, BytesStorageMetadata) else [(fqn, tuple(c.offsets)) for c in m.chunks]
        for k in keys:
            _need(k in locations, f"{fqn!r}: no storage_data entry for the chunk at {k[1]}")
    return Metadata(state_dict_metadata=sdm, planner_data=planner_data, storage_meta=storage_meta), locations


def _encode_object(fqn, obj):
    """The JSON skeleton of a non-tensor value; TypeError naming the fqn if it has no JSON form."""
    try:
        tensors, skeleton = state_dict_to_tensors({"v": obj})
    except (TypeError, ValueError) as e:
        raise TypeError(f"ckpt.dcp.Writer: {fqn!r} cannot be stored as JSON ({e}); store it as a tensor, or "
                        "turn it into JSON-representable values in the state_dict") from None
    if tensors:
        raise TypeError(f"ckpt.dcp.Writer: {fqn!r} is a non-tensor value holding tensors ({', '.join(tensors)})")
    return skeleton


def _lookup_object(planner, index):
    if hasattr(planner, "lookup_object"):
        return planner.lookup_object(index)
    from torch.distributed.checkpoint.utils import find_state_dict_object
    return find_state_dict_object(planner.state_dict, index)


def _dist_rank_and_size():
    if _dist.is_available() and _dist.is_initialized():
        return _dist.get_rank(), _dist.get_world_size()
    return 0, 1


# ---- the writer ------------------------------------------------------------------------------

def _snapshot(v):
    """A copy of a state_dict that later updates of the original do not reach: tensors (DTensors
    too, their local shard) cloned on the CPU, containers rebuilt, other values deep-copied."""
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.clone() if v.device.type == "cpu" else v.to("cpu")
    if isinstance(v, dict):
        return type(v)((k, _snapshot(x)) for k, x in v.items()) if type(v) is not dict else \
            {k: _snapshot(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_snapshot(x) for x in v]
    if isinstance(v, tuple) and type(v) is tuple:
        return tuple(_snapshot(x) for x in v)
    return copy.deepcopy(v)


class Writer(StorageWriter, AsyncStager):
    """A DCP StorageWriter that saves into the ckpt root `root`, one ckpt checkpoint per DCP save.

    step: the checkpoint's step; else the `checkpoint_id` given to dcp.save (an int, or a
    string of digits); else the step after `latest` (1 for an empty root). Decided by the
    coordinator rank and sent to every rank with the plan. A step at or before `latest` is
    refused (ckpt.InvalidArgument) unless allow_older_than_latest. keep_last, writer,
    durable_root, durable_keep_last, allow_older_than_latest: as ckpt.Checkpointer's.
    coordinator: a ckpt.distributed.TorchCoordinator to commit through; by default, in a
    job of several processes, one made over the default process group the first time and
    shared by every Writer of the process (timeout: how long rank 0 waits for the others).
    keep_open (default True): the Checkpointer opened by the first save (with its staging
    pool, already touched) stays open for the next saves through this Writer, reopened only
    when the world size or rank changed or the last save failed; the Writer then holds the
    root's writer lock between saves (another writer of the root is ckpt.Busy) until close(),
    the end of a `with` block, or its collection. keep_open=False: the Checkpointer is closed
    when write_data returns (after the commit) and the root is free between saves. A Writer
    made for each save works either way.

    One save at a time: a save through this Writer waits until the previous one (an async_save
    running on DCP's thread) has ended, so saves commit in the order they were made.

    dcp.async_save: the Writer is DCP's AsyncStager; stage() copies the state_dict (tensors
    cloned) before async_save returns, so updates made after it do not reach the checkpoint
    (DCP's default staging keeps CPU tensors as they are)."""

    _synchronize_after_execute = False  # stage() has copied everything when it returns

    def __init__(self, root, step=None, keep_last=3, writer="auto", durable_root=None, durable_keep_last=10,
                 allow_older_than_latest=False, coordinator=None, timeout=datetime.timedelta(minutes=10),
                 keep_open=True):
        super().__init__()
        # Before anything can fail: __del__ and close() read these.
        self._c = None
        self._cv = threading.Condition()
        self._busy = False   # a save is between stage() or set_up_storage_writer and its end
        self._owner = None   # the thread running it, once known
        self._stager = None  # the thread whose stage() reserved it, until its save starts
        self.root = _args.path(root, "root")
        self._step_arg = None if step is None else _step_of(step, "step")
        self._checkpoint_step = None
        self._options = dict(keep_last=keep_last, writer=writer, durable_root=durable_root,
                             durable_keep_last=durable_keep_last, allow_older_than_latest=allow_older_than_latest)
        self._coordinator_arg = coordinator
        self._timeout = timeout
        self._keep_open = bool(keep_open)
        self._opened_for = None  # (rank, world size, coordinator) the open Checkpointer was made for
        self._save_step = None
        self._coord = None
        self._locations = None
        self.committed = None  # the ckpt.SaveResult of the last save

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- one save at a time: async_save runs each save on a thread of its own -----------------

    _CLAIM_S = 60  # a save stage() reserved that no thread takes up within this is given up

    def _free(self, me):
        """No save holds the Writer, or the one holding it can no longer end it: its thread is
        gone, or it is this thread (a save of it failed where no hook of the Writer saw it), or
        stage() reserved it and no thread of DCP took it up."""
        if not self._busy:
            return True
        if self._owner is not None:
            return self._owner is me or not self._owner.is_alive()
        return time.monotonic() - self._staged_at > self._CLAIM_S

    def _claimable(self, me):
        """A save stage() reserved on another thread, which DCP's thread (this one) runs."""
        return self._busy and self._owner is None and self._stager is not me

    def _wait_free(self, me):
        while not self._free(me):
            self._cv.wait(0.05)

    def _begin_save(self, staged):
        """Waits for the previous save, then holds the Writer for this one: from stage() (on
        the caller's thread, staged) or set_up_storage_writer (on the thread saving)."""
        me = threading.current_thread()
        with self._cv:
            if not staged and self._claimable(me):
                self._owner = me
                return
            self._wait_free(me)
            self._busy = True
            self._owner, self._stager = (None, me) if staged else (me, None)
            self._staged_at = time.monotonic()

    def _end_save(self):
        with self._cv:
            self._busy, self._owner, self._stager = False, None, None
            self._cv.notify_all()

    def stage(self, state_dict):
        self._begin_save(staged=True)
        try:
            return _snapshot(state_dict)
        except BaseException:
            self._end_save()
            raise

    @property
    def should_synchronize_after_execute(self):
        return False

    def synchronize_staging(self):
        pass

    # 0) checkpoint_id: the step (after the previous save has ended: it may still read the last one's)
    def reset(self, checkpoint_id=None):
        me = threading.current_thread()
        with self._cv:
            if not self._claimable(me):
                self._wait_free(me)
        self._checkpoint_step = None if checkpoint_id is None else _step_of(checkpoint_id, "checkpoint_id")
        if self._step_arg is not None and self._checkpoint_step is not None and self._step_arg != self._checkpoint_step:
            raise InvalidArgument(f"invalid argument: checkpoint_id {checkpoint_id!r} differs from the Writer's "
                                  f"step {self._step_arg}", "", "checkpoint_id", str(self._step_arg), str(checkpoint_id))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            _step_of(checkpoint_id, "checkpoint_id")
            return True
        except (InvalidArgument, TypeError):
            return False

    # 1) every rank: open the Checkpointer (in a multi-process job, its start is collective)
    def set_up_storage_writer(self, is_coordinator):
        self._begin_save(staged=False)
        try:
            self._set_up(is_coordinator)
        except BaseException:
            self._close()
            self._end_save()
            raise

    def _set_up(self, is_coordinator):
        self._save_step, self._checkpoint_step = self._checkpoint_step, None  # this save's, not the next's
        rank, world = _dist_rank_and_size()
        self._rank, self._world = rank, world
        self._is_coordinator = bool(is_coordinator)
        coord = None
        if world > 1:
            coord = self._coordinator_arg or _shared_coordinator(self._timeout)
        self._coord = coord
        if self._c is not None and self._opened_for is not None and self._opened_for[:2] == (rank, world) \
                and self._opened_for[2] is coord:
            return  # the previous save's Checkpointer, its staging pool warm
        self._close()
        try:
            self._c = Checkpointer(self.root, world_size=world, coordinator=coord, allow_empty=True, **self._options)
        except CommError:
            self._forget_coordinator()
            raise
        self._opened_for = (rank, world, coord)

    def prepare_local_plan(self, plan):
        return plan

    # 3) the coordinator: the step, and each item's name in its rank's shard
    def prepare_global_plan(self, plans):
        step = self._step_arg if self._step_arg is not None else self._save_step
        if step is None:
            latest = _latest_step(self.root)
            step = 1 if latest is None else latest + 1
        locations, out = {}, []
        for rank, plan in enumerate(plans):
            count = {}
            for item in plan.items:
                count[item.index.fqn] = count.get(item.index.fqn, 0) + 1
            names = {}
            for item in plan.items:
                key = _index_key(item.index)
                name = item.index.fqn
                if count[name] > 1 and key[1] is not None:
                    name += "@" + ",".join(str(o) for o in key[1])
                names[key] = name
                locations[key] = (rank, name)
            out.append(dataclasses.replace(plan, storage_data={"step": step, "names": names}))
        self._locations = locations
        return out

    # 4) every rank: its items as its shard of the checkpoint, committed before it returns
    def write_data(self, plan, planner):
        try:
            results = self._write(plan, planner)
        except BaseException:
            self._close()  # the next save opens a new one
            self._end_save()
            raise
        if not self._keep_open:
            self._close()
        if not self._is_coordinator:
            self._end_save()  # the coordinator's ends in finish()
        fut = Future()
        fut.set_result(results)
        return fut

    def _write(self, plan, planner):
        step = plan.storage_data["step"]
        try:
            tensors, metadata, training, sharding, results = self._prepare(plan, planner)
            handle = self._c.save(self._rank, step, tensors, metadata=metadata, training=training, sharding=sharding)
        except Exception as e:
            self._fail_step(step, e)
            raise
        try:
            self.committed = handle.wait()
        except CommError:
            self._forget_coordinator()
            raise
        return results

    def _fail_step(self, step, error):
        """This rank cannot write its shard: it saves one that fails the commit at once on every
        rank (a slice that does not tile its global tensor, named after the failure), instead of
        leaving the other ranks waiting for its vote until the coordinator's timeout."""
        if self._world == 1 or self._c is None:
            return
        name = f"ckpt.dcp: rank {self._rank} failed before writing its shard ({type(error).__name__})"
        try:
            self._c.save(self._rank, step, {"ckpt.dcp.failed": torch.zeros(1)},
                         sharding={"ckpt.dcp.failed": slice_of(name, [2], [0], [1])}).wait()
        except CommError:
            self._forget_coordinator()
        except Error:
            pass  # the step failed, as it had to

    def _prepare(self, plan, planner):
        """This rank's tensors, their slice descriptions, its non-tensor values and (on the
        coordinator) the DCP metadata, as Checkpointer.save takes them; and DCP's WriteResults."""
        names = plan.storage_data["names"]
        tensors, sharding, objects, results = {}, {}, {}, []
        for item in plan.items:
            key = _index_key(item.index)
            name = names[key]
            if item.type == WriteItemType.BYTE_IO:
                objects[name] = _encode_object(item.index.fqn, _lookup_object(planner, item.index))
                size = 0
            else:
                t = planner.resolve_data(item)
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"ckpt.dcp.Writer: the planner resolved tensor item {item.index.fqn!r} to a "
                                    f"{type(t).__name__}")
                t = t.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                t = t.contiguous()
                td = item.tensor_data
                if tuple(t.shape) != tuple(td.chunk.sizes):
                    raise ValueError(f"ckpt.dcp.Writer: {item.index.fqn!r}: the planner resolved a tensor of shape "
                                     f"{tuple(t.shape)} for a chunk of sizes {tuple(td.chunk.sizes)}")
                tensors[name] = t
                sharding[name] = slice_of(item.index.fqn, _ints(td.size), _ints(td.chunk.offsets), _ints(td.chunk.sizes))
                size = t.numel() * t.element_size()
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=(self._rank, name)))
        training = None
        if self._is_coordinator:
            md = getattr(planner, "metadata", None)
            if not isinstance(md, Metadata):
                raise TypeError("ckpt.dcp.Writer needs a planner that keeps the global Metadata as .metadata "
                                "(DefaultSavePlanner and its subclasses do)")
            self._metadata_json = _metadata_to_json(md, self._locations)
            training = {"dcp": self._metadata_json}
        metadata = {"dcp_objects": objects} if objects else None
        return tensors, metadata, training, sharding, results

    # 5) the coordinator: the checkpoint is already committed; DCP's Metadata gets its storage_data
    def finish(self, metadata, results):
        try:
            storage = {wr.index: wr.storage_data for wrs in results for wr in wrs}
            metadata.storage_data = storage
            if _metadata_to_json(metadata, self._locations)["state_dict"] != self._metadata_json["state_dict"]:
                raise RuntimeError("ckpt.dcp.Writer: the Metadata DCP finished with differs from the planner's "
                                   f"(.metadata), which step {self.committed.step} holds")
        finally:
            self._end_save()

    def storage_meta(self):
        return None

    def _forget_coordinator(self):
        if self._coord is not None and self._coordinator_arg is None:
            _drop_shared_coordinator(self._coord)
        self._coord = None

    def _close(self):
        c, self._c, self._opened_for = self._c, None, None
        if c is not None:
            c.close()

    def close(self):
        """Waits for a save in progress (an async_save's) to end, then closes the Checkpointer
        kept open between saves, releasing the root. The Writer can save again afterwards
        (it opens a new one)."""
        with self._cv:
            self._wait_free(threading.current_thread())
        self._close()

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001 - a destructor must not raise
            pass


# ---- the reader ------------------------------------------------------------------------------

class Reader(StorageReader):
    """A DCP StorageReader of the ckpt root `root`: the checkpoint `latest` names, or `step`
    (or dcp.load's checkpoint_id, a step). verify: ckpt's verification of every chunk read
    ("none", "fast": XXH3 of each chunk, "full": also each shard file's SHA-256)."""

    def __init__(self, root, step=None, verify="fast"):
        super().__init__()
        self.root = _args.path(root, "root")
        self._step = None if step is None else _step_of(step, "step")
        self._verify = _args.text(verify, "verify")
        self._r = None
        self.step = None

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self._step = _step_of(checkpoint_id, "checkpoint_id")
        self._r = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return Writer.validate_checkpoint_id(checkpoint_id)

    def read_metadata(self):
        r = open_latest(self.root, verify=self._verify) if self._step is None else \
            open_step(self.root, self._step, verify=self._verify)
        manifest = f"{r.dir}/manifest.json"
        js = r.training.get("dcp") if isinstance(r.training, dict) else None
        if js is None:
            raise NotFound(f"not found: {manifest}: step {r.step} holds no DCP metadata (it was not written by "
                           "ckpt.dcp.Writer)", manifest, "no DCP metadata")
        try:
            md, locations = _metadata_from_json(js)
            for rank, _ in locations.values():
                _need(rank < r.world_size, f"storage_data names rank {rank}, the checkpoint has {r.world_size}")
        except _Refuse as e:
            raise MalformedManifest(f"malformed manifest: {manifest}: DCP metadata: {e}", manifest,
                                    f"DCP metadata: {e}") from None
        self._r, self._locations, self.step = r, locations, r.step
        self._manifest = manifest
        self._infos, self._objects = {}, {}
        md.storage_data = {MetadataIndex(fqn, off): loc for (fqn, off), loc in locations.items()}
        return md

    def set_up_storage_reader(self, metadata, is_coordinator):
        self._metadata = metadata

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        whole = {}  # rank -> {name: (item, target)}: whole stored tensors into contiguous CPU targets
        for item in plan.items:
            key = _index_key(item.storage_index)
            if key not in self._locations:
                raise NotFound(f"not found: {self._manifest}: no stored chunk {key}", self._manifest, str(key))
            rank, name = self._locations[key]
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(self._object(rank, name), buf)
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            shape, dtype = self._stored(rank, name, item.storage_index.fqn)
            dst = planner.resolve_tensor(item).detach()
            if tuple(dst.shape) != tuple(item.lengths):
                raise ValueError(f"ckpt.dcp.Reader: {item.dest_index.fqn!r}: the planner's target has shape "
                                 f"{tuple(dst.shape)}, the read item {tuple(item.lengths)}")
            if (tuple(item.lengths) == shape and not any(item.storage_offsets) and dst.dtype == dtype
                    and dst.device.type == "cpu" and dst.is_contiguous() and name not in whole.get(rank, {})):
                whole.setdefault(rank, {})[name] = (item, dst)  # read by load_into below, in one pass a rank
                continue
            src = self._mapped(rank, name, dtype)
            dst.copy_(src[tuple(slice(o, o + n) for o, n in zip(item.storage_offsets, item.lengths))])
            planner.commit_tensor(item, dst)
        for rank, targets in whole.items():
            # O_DIRECT reads (io_uring), each chunk's checksum checked as it is copied.
            self._r.load_into(rank, {name: dst for name, (_, dst) in targets.items()})
            for item, dst in targets.values():
                planner.commit_tensor(item, dst)
        fut = Future()
        fut.set_result(None)
        return fut

    def _stored(self, rank, name, fqn):
        """(shape, dtype) of the stored tensor `name` of rank, its dtype checked against the DCP
        metadata's."""
        if rank not in self._infos:
            self._infos[rank] = self._r.tensor_info(rank)
        info = self._infos[rank].get(name)
        if info is None:
            raise MalformedManifest(f"malformed manifest: {self._manifest}: DCP metadata: rank {rank} holds no "
                                    f"tensor {name!r}", self._manifest, f"DCP metadata: {fqn!r}")
        expected = self._metadata.state_dict_metadata[fqn].properties.dtype
        stored = _CKPT_DTYPE.get(info[0])
        if stored != expected:
            raise MalformedManifest(f"malformed manifest: {self._manifest}: DCP metadata: {fqn!r} is {expected}, "
                                    f"its stored tensor {name!r} of rank {rank} {info[0]}", self._manifest,
                                    f"DCP metadata: {fqn!r}", str(expected), info[0])
        return tuple(info[1]), expected

    def _mapped(self, rank, name, dtype):
        """The stored tensor as a torch tensor over the mapped shard (verified as it is read)."""
        a = self._r.read(rank, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only mapping: only copied from
            if dtype == torch.bfloat16:
                return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(a)

    def _object(self, rank, name):
        if rank not in self._objects:
            meta = self._r.metadata(rank)
            self._objects[rank] = meta.get("dcp_objects", {}) if isinstance(meta, dict) else {}
        objects = self._objects[rank]
        if not isinstance(objects, dict) or name not in objects:
            raise MalformedManifest(f"malformed manifest: {self._manifest}: DCP metadata: rank {rank} holds no "
                                    f"value {name!r}", self._manifest, f"DCP value {name!r}")
        try:
            return tensors_to_state_dict({}, objects[name])["v"]
        except (KeyError, TypeError, ValueError, OverflowError, IndexError) as e:
            raise MalformedManifest(f"malformed manifest: {self._manifest}: DCP value {name!r} of rank {rank} does "
                                    f"not decode: {e}", self._manifest, f"DCP value {name!r}") from None
