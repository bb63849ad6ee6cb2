# SPDX-License-Identifier: Apache-2.0
"""ckpt: asynchronous, sharded, verified checkpoints for Python and PyTorch training loops.

    with ckpt.Checkpointer("/ckpts/run1") as c:
        h = c.save(0, step, {"w": w, "b": b}, metadata={"epoch": 3}, deferred=True)
        ...                      # forward, backward
        h.wait_staged()          # before the optimizer step modifies w and b
    r = ckpt.open_latest("/ckpts/run1")
    r.load_into(0, {"w": w, "b": b})

A nested state_dict in one call: ckpt.save(state_dict, root, step=...) / ckpt.load(state_dict,
root) in one process, Checkpointer.save_state / Reader.load_state in a training loop.

The whole API is in docs/python.md. Tensors are torch CPU tensors or numpy arrays, contiguous;
no copy is made on the way in (a deferred save copies on ckpt's threads) nor on the way out
(read() maps the shard). The GIL is released while ckpt copies, waits, loads and verifies.
"""

import time as _time
from collections.abc import Mapping as _Mapping

import numpy as _np

from . import _args
from . import _core
from . import _device
from . import state as _state
from ._tensors import TORCH_DTYPE as _TORCH_DTYPE
from ._tensors import describe_all as _describe_all
from ._tensors import is_torch_tensor as _is_torch_tensor
from ._tensors import spec as _tensor_spec
from .errors import (Aborted, Busy, ChecksumMismatch, CommError, Conflict, Error, IoError,  # noqa: F401
                     InvalidArgument, MalformedManifest, MalformedShard, MissingShard, NoSpace, NotFound,
                     SizeMismatch, Timeout, UnsafePath, UnsupportedSchema, WorldSizeMismatch)
from .errors import _compose, _invalid, _timeout
from .state import rng_state, set_rng_state, state_dict_to_tensors, tensors_to_state_dict  # noqa: F401

__version__ = _core.__version__

_MAX_STEP = _core.MAX_STEP  # the largest step a checkpoint directory name holds
_MAX_INT = (1 << 31) - 1
_STATE_KEY = "state_dict"  # the metadata key save_state keeps the state_dict's skeleton under
_UNSET = object()  # save(step, tensors=...): a step not given (None given is a bad step)


# ---- sharding descriptions (docs/format.md, "Sharded tensors") -------------------------------

def slice_of(global_name, global_shape, offsets, lengths):
    """This tensor is the box (offsets, lengths) of the global tensor `global_name` of shape
    `global_shape` (its own shape is `lengths`)."""
    return {"slice": {"global": str(global_name), "global_shape": [int(d) for d in global_shape],
                      "offsets": [int(o) for o in offsets], "lengths": [int(n) for n in lengths]}}


def row_slice(global_name, rows, cols, part, parts):
    """Rows of part `part` of `parts` (numpy.array_split's rule) of the global [rows, cols]
    tensor: a tensor-parallel row split."""
    first, count = _core.split_range(int(rows), int(part), int(parts))
    return slice_of(global_name, [rows, cols], [first, 0], [count, cols])


def column_slice(global_name, rows, cols, part, parts):
    """Columns of part `part` of `parts` of the global [rows, cols] tensor."""
    first, count = _core.split_range(int(cols), int(part), int(parts))
    return slice_of(global_name, [rows, cols], [0, first], [rows, count])


def replicated(holders):
    """Identical on the ranks `holders`; only the lowest holder's copy is written."""
    return {"replicated": {"holders": sorted({int(h) for h in holders})}}


def rank_local():
    """Meaningful only for the rank that saves it (an RNG state, a data-loader position)."""
    return {"rank_local": True}


class SaveResult:
    """What a committed save reports: ``dir`` (the committed checkpoint directory), ``step``,
    ``bytes`` (this rank's shard size), ``backend`` ("io_uring" or "posix"), ``stall_s``
    (seconds save() waited for the previous checkpoint), ``stage_s`` (the copy into staging),
    ``deferred``, ``write_s``, ``hash_s``, ``fsync_s``, ``commit_s``, ``total_s``."""

    def __init__(self, d):
        self.__dict__.update(d)

    def __repr__(self):
        return f"SaveResult(step={self.step}, dir={self.dir!r}, bytes={self.bytes}, backend={self.backend!r})"


class SaveHandle:
    """Completion of one rank's save (returned by Checkpointer.save).

    The waits release the GIL and look for signals every 50 ms: Ctrl-C raises
    KeyboardInterrupt in the waiting (main) thread, and the save goes on (a later wait gets
    its outcome; closing the Checkpointer drains it). With ``timeout`` (seconds, or a
    datetime.timedelta) a wait that runs out raises ckpt.Timeout, and the save goes on too."""

    def __init__(self, core):
        self._h = core

    @property
    def step(self):
        return self._h.step

    def done(self):
        """True once the checkpoint is committed, has failed, or the save was skipped. Never blocks."""
        return self._h.done()

    def staged(self):
        """True once the tensors are copied into staging (at once for a non-deferred save)."""
        return self._h.staged()

    def skipped(self):
        """True if the save was skipped (when_busy="skip")."""
        return self._h.skipped()

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed; returns its SaveResult or raises the save's
        ckpt.Error. None for a skipped save. ckpt.Timeout after `timeout` seconds."""
        t = _args.timeout(timeout)
        if self._h.skipped():
            return None
        if not self._h.wait_for(t):
            raise _timeout(f"SaveHandle.wait() of step {self.step}", f"done within {t:g} s",
                           "not done (the save goes on)")
        return SaveResult(self._h.result())

    def wait_staged(self, timeout=None):
        """The fence of a deferred save: blocks until the tensors are copied; after it the caller
        may modify them. Returns at once for a non-deferred save. Raises the copy's error;
        ckpt.Timeout after `timeout` seconds (the tensors must then stay untouched still)."""
        t = _args.timeout(timeout)
        if not self._h.wait_staged_for(t):
            raise _timeout(f"SaveHandle.wait_staged() of step {self.step}", f"staged within {t:g} s",
                           "not staged (the copy goes on: do not modify the tensors yet)")
        self._h.staged_result()


def _file_limit(max_file_bytes):
    """Checkpointer(max_file_bytes=) as the C++ option: None -> 0 (automatic), 0 -> one file per rank."""
    if max_file_bytes is None:
        return 0
    n = _args.integer(max_file_bytes, "max_file_bytes", 0, (1 << 50))
    return (1 << 64) - 1 if n == 0 else n


class Checkpointer:
    """The asynchronous checkpointer of a root directory (a context manager: exit drains).

    root: the checkpoint root (created if missing). world_size: ranks saving each checkpoint
    (ranks are threads of this process, or with ``coordinator`` processes of a
    torch.distributed job: see ckpt.distributed). keep_last: rotation (0 keeps all).
    writer: "auto", "io_uring" or "posix". when_busy: "wait" (a save blocks while the previous
    checkpoint persists) or "skip". durable_root: a second, durable tier each committed
    checkpoint is copied to in the background (durable_keep_last of them kept).
    allow_older_than_latest: allow saving a step at or before `latest` (a resumed run that
    fell back). allow_empty: allow a save with no tensors (refused otherwise).
    staging_bytes_per_rank: the staging buffer of each of this process's ranks, allocated and
    touched here rather than inside the first save (on a VM the first touch of fresh memory
    costs more than the copy): the state a rank will save (the dict of tensors save() takes,
    or the state_dict save_state() takes; sized with ckpt.staging_bytes), or a byte count
    (None: at the first save; a save that needs more grows the buffer then).
    max_file_bytes: the most tensor bytes in one shard file; a rank's tensors are split across
    files at tensor boundaries, each hashed on its own core (None: automatic, cores / ranks - 1
    files of at least 64 MiB when that is 2 or more; 0: one file per rank). Raises ckpt.Busy if another writer holds the root.
    """

    def __init__(self, root, world_size=None, keep_last=3, writer="auto", when_busy="wait", durable_root=None,
                 durable_keep_last=10, allow_older_than_latest=False, coordinator=None, allow_empty=False,
                 staging_bytes_per_rank=None, max_file_bytes=None):
        self._coordinator = coordinator
        core_coord = None
        if coordinator is not None:
            core_coord = coordinator._core
            if world_size is None:
                world_size = coordinator.world_size
            elif world_size != coordinator.world_size:
                raise InvalidArgument(f"world_size {world_size} differs from the coordinator's {coordinator.world_size}",
                                      expected=str(coordinator.world_size), actual=str(world_size))
        if world_size is None:
            world_size = 1
        self.root = _args.path(root, "root")
        self.world_size = _args.integer(world_size, "world_size", 1, _MAX_INT)
        self._start = _time.monotonic()
        if staging_bytes_per_rank is None:
            staging = 0
        elif isinstance(staging_bytes_per_rank, _Mapping):
            staging = staging_bytes(staging_bytes_per_rank, self.world_size)
        else:
            staging = _args.integer(staging_bytes_per_rank, "staging_bytes_per_rank", 0, 1 << 50)
        self._c = _core.Checkpointer(self.root, self.world_size, _args.integer(keep_last, "keep_last", 0, _MAX_INT),
                                     _args.text(writer, "writer"), _args.text(when_busy, "when_busy"),
                                     None if durable_root is None else _args.path(durable_root, "durable_root"),
                                     _args.integer(durable_keep_last, "durable_keep_last", 0, _MAX_INT),
                                     bool(allow_older_than_latest), bool(allow_empty), core_coord, staging,
                                     _file_limit(max_file_bytes))
        self._stagers = {}        # rank -> _device.RankStager: host buffers of device tensors
        self._device_saves = []   # deferred saves of device tensors whose thread may still run

    def _rank(self, rank, what):
        """`rank` checked, or the one rank this process can mean: the coordinator's, or 0 in a
        Checkpointer of world_size 1."""
        if rank is not None:
            return _args.integer(rank, what, 0, self.world_size - 1)
        if self._coordinator is not None:
            return self._coordinator.rank
        if self.world_size == 1:
            return 0
        raise _invalid(what, f"a rank in 0..{self.world_size - 1} (world_size {self.world_size}, no coordinator: "
                       "the rank is not implied)", "None")

    def save(self, rank=None, step=_UNSET, tensors=None, metadata=None, deferred=False, training=None, sharding=None,
             _staging=None):
        """Saves rank's shard of checkpoint `step`: `tensors` a flat dict name -> tensor or array
        (contiguous; torch tensors on a device are copied into host buffers ckpt owns, and a
        deferred save's fence waits for that copy: docs/python.md), `metadata` a JSON-serialisable dict stored with the rank, `training`
        one stored for the whole checkpoint (rank 0's is kept). Blocks while the previous
        checkpoint is still persisting (when_busy="wait"). Without `deferred` the tensors are
        copied before this returns; with it the copy runs on ckpt's threads and the caller must
        not modify the tensors until the handle's wait_staged() returns (the handle keeps them
        alive until then). `sharding`: a dict name -> description (slice_of, row_slice,
        column_slice, replicated, rank_local) saying what a tensor is of the job's global state,
        so that `ckpt consolidate` and `ckpt reshard` work on any layout and a replicated
        tensor is written once, by its lowest holder. Returns a SaveHandle. TypeError for a
        tensor ckpt cannot take; InvalidArgument for a description that cannot be right, a rank
        or step that is not an integer in range, no tensors (unless allow_empty), a name with a
        lone surrogate, metadata or training a manifest cannot hold (docs/python.md);
        Aborted once the Checkpointer is closed (also for a save waiting for the previous
        checkpoint when close() is called).

        `rank` may be left out where it is implied (the coordinator's rank; 0 at world_size 1):
        save(step, tensors) and save(step=..., tensors=...) are save(rank, step, tensors)."""
        rank, step, tensors = _implied_rank(rank, step, tensors)
        rank = self._rank(rank, "save rank")
        if tensors is None:
            raise _invalid("tensors", "a dict name -> tensor", "None")
        step = _args.integer(step, "step", 0, _MAX_STEP)
        # _staging="overlapped" (save_sync): the copy overlaps the writes and the hashing.
        staging = _staging or ("deferred" if deferred else "copy")
        if _device.has_device_tensors(tensors):
            return self._save_device(rank, step, tensors, metadata, staging, training, sharding)
        views, keep = _describe_all(tensors)
        meta = _args.to_json(metadata, "metadata")
        train = _args.to_json(training, "training")
        shard = _args.to_json(sharding, "sharding")
        return SaveHandle(self._c.save(rank, step, views, keep, meta, train, staging,
                                       _time.monotonic() - self._start, shard))

    def _save_device(self, rank, step, tensors, metadata, staging, training, sharding):
        # Tensors on a device: copied into this rank's host buffers first (ckpt/_device.py).
        meta = _args.to_json(metadata, "metadata")
        train = _args.to_json(training, "training")
        shard = _args.to_json(sharding, "sharding")
        stager = self._stagers.setdefault(rank, _device.RankStager())
        host, waits = stager.stage(tensors)
        views, keep = _describe_all(host)
        elapsed = _time.monotonic() - self._start
        if staging != "deferred":
            for w in waits:
                w.synchronize()
            return SaveHandle(self._c.save(rank, step, views, keep, meta, train, staging, elapsed, shard))
        direct = any(not _device.is_device_tensor(v) for v in tensors.values())
        pending = _device.DeviceSave(step, waits, lambda: self._c.save(rank, step, views, keep, meta, train, "deferred",
                                                                        elapsed, shard), direct)
        stager.previous = pending
        self._device_saves = [d for d in self._device_saves if not d.done()] + [pending]
        return SaveHandle(pending)

    def save_sync(self, rank=None, step=_UNSET, tensors=None, metadata=None, training=None, sharding=None):
        """save() then wait(): returns the SaveResult once committed. The copy into staging
        overlaps the writes and the hashing (the caller waits for the checkpoint anyway)."""
        return self.save(rank, step, tensors, metadata=metadata, training=training, sharding=sharding,
                         _staging="overlapped").wait()

    def save_state(self, step, state_dict, rank=None, metadata=None, deferred=False, training=None, sharding=None,
                   _staging=None):
        """Saves a nested state_dict (a model's, an optimizer's, a scheduler's, RNG states, any
        nesting of dicts, lists and tuples): its tensors by dotted path (state_dict_to_tensors)
        and its skeleton in the rank's metadata under "state_dict", next to `metadata`'s own
        keys. Reader.load_state (or ckpt.load) loads it back in place. `rank` as for save();
        the rest as save(). TypeError naming the path of a leaf a checkpoint cannot hold;
        InvalidArgument if `metadata` has a "state_dict" key of its own."""
        tensors, skeleton = _state.state_dict_to_tensors(state_dict)
        meta = {} if metadata is None else dict(metadata)
        if _STATE_KEY in meta:
            raise _invalid("metadata", f"no key {_STATE_KEY!r} (save_state keeps the skeleton there)",
                           f"a key {_STATE_KEY!r}")
        meta[_STATE_KEY] = skeleton
        return self.save(rank, step, tensors, metadata=meta, deferred=deferred, training=training, sharding=sharding,
                         _staging=_staging)

    def wait_all(self, timeout=None):
        """Blocks until no checkpoint is in flight (does not raise save errors: handles do).
        Interruptible (Ctrl-C); ckpt.Timeout after `timeout` seconds (the saves go on)."""
        t = _args.timeout(timeout)
        if not self._c.wait_all_for(t):
            raise _timeout("Checkpointer.wait_all()", f"no checkpoint in flight within {t:g} s",
                           "one still in flight (it goes on)")

    def wait_durable(self, timeout=None):
        """wait_all(), then until the durable tier has caught up. Interruptible (Ctrl-C);
        ckpt.Timeout after `timeout` seconds (the saves and copies go on)."""
        t = _args.timeout(timeout)
        if not self._c.wait_durable_for(t):
            raise _timeout("Checkpointer.wait_durable()", f"the durable tier caught up within {t:g} s",
                           "a checkpoint or a copy still in flight (it goes on)")

    @property
    def backend(self):
        return self._c.backend

    def stats(self):
        """Counters: saves_started, saves_skipped (when_busy="skip"), saves_refused, commits,
        failures, rotated, consecutive_failures, last_failure, staging_bytes (the staging
        pool's size), staging_allocations (how often it was allocated or grown), total_stall_s,
        durable_copies."""
        return self._c.stats()

    def metrics_text(self):
        """The counters and save phase timings in the Prometheus text format (docs/metrics.md)."""
        return self._c.metrics_text()

    def serve_metrics(self, port=0, bind_address="127.0.0.1"):
        """Serves metrics_text() at http://BIND_ADDRESS:PORT/metrics (port 0: a free port) until
        this Checkpointer is garbage-collected; a second call replaces the first server. Returns
        the URL. ckpt.IoError when the port is in use; NotImplementedError when ckpt was built
        without the endpoint (prometheus-cpp)."""
        if not _core.HAVE_METRICS_SERVER:
            raise NotImplementedError("this ckpt was built without the metrics endpoint (install prometheus-cpp-dev and rebuild)")
        return self._c.serve_metrics(_args.integer(port, "port", 0, 65535), _args.text(bind_address, "bind_address"))

    def close(self):
        """Refuses new saves (they raise ckpt.Aborted, as do saves waiting for the previous
        checkpoint), drains every started save (each ends: committed, or failed with
        ckpt.Aborted when some rank never saved its step) and releases the root. Idempotent;
        safe while rank threads save. stats() still works afterwards."""
        # A deferred save of device tensors whose copies are still running is a started save:
        # its thread makes it once they are done, and the close drains it with the others.
        for d in list(self._device_saves):
            d.join()
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Reader:
    """An opened checkpoint (from open_latest, open_step or recover)."""

    plan = None  # recover(): the recovery plan it followed

    def __init__(self, core):
        self._r = core

    @property
    def step(self):
        return self._r.step

    @property
    def world_size(self):
        return self._r.world_size

    @property
    def dir(self):
        return self._r.dir

    @property
    def fell_back(self):
        """True if `latest` was unusable and an older checkpoint was opened (fallback=True)."""
        return self._r.fell_back

    def _rank(self, rank):
        """`rank` checked, or 0 for a checkpoint of world_size 1 (InvalidArgument otherwise)."""
        if rank is not None:
            return _args.integer(rank, "rank", 0, _MAX_INT)
        if self.world_size == 1:
            return 0
        raise _invalid("rank", f"a rank in 0..{self.world_size - 1} (the checkpoint has world_size {self.world_size}: "
                       "the rank is not implied)", "None")

    def metadata(self, rank=None):
        """The metadata dict rank saved (NaN and infinities as saved, bit for bit)."""
        return _args.from_json(self._r.metadata_json(self._rank(rank)))

    @property
    def training(self):
        """The checkpoint's training dict (rank 0's `training`)."""
        return _args.from_json(self._r.training_json())

    def tensor_names(self, rank=None):
        """Names of the tensors rank holds, in the manifest's order: its own and every replicated
        tensor it is a holder of (stored once, in the lowest holder's shard)."""
        return [n for n, _, _ in self._r.tensors(self._rank(rank))]

    def tensor_info(self, rank=None, as_torch=False):
        """{name: (dtype, shape)} of the tensors rank holds; dtype as ckpt names it ("F32",
        "BF16", ...), or with as_torch the torch dtype (torch.bfloat16, ...)."""
        info = {n: (d, tuple(s)) for n, d, s in self._r.tensors(self._rank(rank))}
        if as_torch:
            info = {n: (_torch_dtype(d, n), s) for n, (d, s) in info.items()}
        return info

    def read(self, rank=None, name=None, verify=None, as_torch=False):
        """Tensor `name` of rank as a read-only numpy array over the mapped shard (no copy); its
        chunks are checked per `verify` (default: the reader's) the first time they are read.
        A replicated tensor is found for every holder. BF16 comes as uint16 (its bits):
        torch.from_numpy(a.view(numpy.int16).copy()).view(torch.bfloat16) makes it torch's.
        as_torch=True returns a torch tensor instead: a writable copy (torch has no read-only
        tensors), BF16 as torch.bfloat16. read(name) where the rank is implied (world_size 1)."""
        if name is None and isinstance(rank, str):
            rank, name = None, rank
        rank = self._rank(rank)
        a = self._r.read(rank, _args.text(name, "tensor name"), _verify(verify))
        return _to_torch(a, self._dtypes(rank)[name], name) if as_torch else a

    def read_all(self, rank=None, verify=None, as_torch=False):
        """{name: read(rank, name)} for every tensor rank holds (tensor_names)."""
        rank = self._rank(rank)
        return {n: self.read(rank, n, verify, as_torch) for n in self.tensor_names(rank)}

    def load_into(self, rank=None, tensors=None, verify=None):
        """Fills the existing tensors or arrays of the dict name -> tensor in place with rank's
        tensors of those names (dtype and shape must match: ckpt.InvalidArgument otherwise;
        an unknown name is ckpt.NotFound); a replicated tensor is read from the shard that
        stores it, for any holder. Returns a dict of what the load did. load_into(tensors)
        where the rank is implied (world_size 1)."""
        if tensors is None and isinstance(rank, _Mapping):
            rank, tensors = None, rank
        views, keep = _describe_all(tensors, writable=True)
        r = self._r.load_into(self._rank(rank), views, _verify(verify))
        del keep
        return r

    def load_state(self, state_dict, rank=None, verify=None):
        """Loads what Checkpointer.save_state saved for rank into `state_dict`, in place, as
        DCP's load does: its tensors (torch tensors, writable numpy arrays) are filled where
        they are (load_into: dtype and shape must match, ckpt.InvalidArgument naming the tensor
        otherwise; one the checkpoint lacks is ckpt.NotFound; nothing is written before every
        check passed), its dicts and lists updated in place, and every other leaf (a learning
        rate, a step count, an optimizer state the fresh optimizer does not have yet) replaced
        by the saved one. Returns `state_dict`. Then call model.load_state_dict(sd["model"]),
        opt.load_state_dict(sd["optim"]), ... as after DCP's load. ckpt.NotFound if the
        rank's metadata holds no state_dict (saved with save, not save_state)."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state: state_dict must be a dict, not a {type(state_dict).__name__}")
        rank = self._rank(rank)
        template = self.metadata(rank).get(_STATE_KEY)
        if template is None:
            raise self._no_state(rank)
        saved = _state.skeleton_tensors(template)
        live = _state.live_tensors(state_dict)
        self.load_into(rank, live, verify)
        flat = dict(live)
        for name in saved:
            if name not in flat:
                flat[name] = self.read(rank, name, verify)
        _state.load_state_into(state_dict, template, flat, set(live))
        return state_dict

    def state_dict(self, rank=None, verify=None):
        """What Checkpointer.save_state saved for rank, rebuilt (tensors_to_state_dict over
        read_all): torch tensors as torch tensors (copies), bf16 as torch.bfloat16."""
        rank = self._rank(rank)
        template = self.metadata(rank).get(_STATE_KEY)
        if template is None:
            raise self._no_state(rank)
        return _state.tensors_to_state_dict(self.read_all(rank, verify), template)

    def _no_state(self, rank):
        detail = f"the metadata of rank {rank} (saved with save, not save_state)"
        expected, actual = f"a {_STATE_KEY!r} key", "none"
        return NotFound(_compose("not found", self.dir, detail, expected, actual), self.dir, detail, expected, actual)

    def _dtypes(self, rank):
        cache = self.__dict__.setdefault("_dtype_cache", {})
        if rank not in cache:
            cache[rank] = {n: d for n, d, _ in self._r.tensors(rank)}
        return cache[rank]

    def verify(self, verify="full"):
        """Reads every shard and checks its checksums."""
        self._r.verify(_verify(verify))


def staging_bytes(state, world_size=1):
    """The staging one rank of a job of `world_size` ranks needs to save `state`: the dict
    name -> tensor that Checkpointer.save takes, or the nested state_dict that save_state takes
    (its tensors on any device; only their names, dtypes and shapes count). The shard image
    with its header, padded, for any step and rank: what Checkpointer(staging_bytes_per_rank=)
    allocates. TypeError as save() for what ckpt cannot save."""
    if not isinstance(state, _Mapping):
        raise TypeError(f"state must be a dict of tensors or a state_dict, not a {type(state).__name__}")
    flat = state
    if not all(isinstance(k, str) and (_is_torch_tensor(v) or isinstance(v, _np.ndarray)) for k, v in state.items()):
        flat, _ = _state.state_dict_to_tensors(state)
    specs = [_tensor_spec(_args.text(k, "tensor name"), v) for k, v in flat.items()]
    return _core.staging_bytes_for(specs, _args.integer(world_size, "world_size", 1, _MAX_INT))


def open_latest(root, world_size=None, verify="fast", fallback=False):
    """Opens the checkpoint root's `latest` names. With world_size, another world size is
    ckpt.WorldSizeMismatch. ckpt.NotFound if there is none. `verify` ("none", "fast",
    "full") is the default of read() and load_into(). fallback: if `latest` is unusable, open
    the newest good checkpoint instead (Reader.fell_back)."""
    return Reader(_core.Reader(_args.path(root, "root"), _optional_world(world_size), _args.text(verify, "verify"),
                               bool(fallback), None))


def open_step(root, step, world_size=None, verify="fast"):
    """Opens ROOT/step-N."""
    return Reader(_core.Reader(_args.path(root, "root"), _optional_world(world_size), _args.text(verify, "verify"), False,
                               _args.integer(step, "step", 0, _MAX_STEP)))


def plan_recovery(levels, world_size=None, verify="none"):
    """Surveys a run's levels, cheapest first (mem://NAME, a directory or node set, a durable
    directory or s3://bucket/prefix), and returns the plan a resume follows, loading nothing:
    a dict with "chosen" (level, root, kind, step, fetch: "read", "rebuild" or "restore"; None
    when no level holds a usable checkpoint), "candidates" (every newer one passed over, with
    "passed_over": why), "level_errors", "discover_seconds" and "summary" (one line).
    verify: "none" reads manifests and sizes, "fast" also every chunk's XXH3."""
    return _core.plan_recovery([_args.path(x, "levels") for x in levels], _optional_world(world_size), _args.text(verify, "verify"))


def recover(levels, world_size=None, verify="fast", restore_into=None):
    """Plans the recovery over `levels` (plan_recovery), carries it out (a node set's lost
    files rebuilt from the others' redundancy; an object store's checkpoint restored into the
    directory root `restore_into`), and opens the chosen checkpoint: a Reader whose .plan is
    the plan (with "fetch_seconds" and "rebuild_seconds"). ckpt.NotFound when no level holds
    a usable checkpoint, naming why each was passed over."""
    plan = _core.recover([_args.path(x, "levels") for x in levels], _optional_world(world_size),
                         "" if restore_into is None else _args.path(restore_into, "restore_into"))
    reader = Reader(_core.Reader(plan["root"], _optional_world(world_size), _args.text(verify, "verify"), False,
                                 _args.integer(plan["step"], "step", 0, _MAX_STEP)))
    reader.plan = plan
    return reader


def save(state_dict, root, step, metadata=None, training=None, keep_last=3, writer="auto",
         allow_older_than_latest=False):
    """One call for a single process: saves `state_dict` (any nesting of dicts, lists and
    tuples of tensors and plain values) as checkpoint `step` of `root` and returns the
    SaveResult once it is committed (a Checkpointer of world_size 1 opened, save_state,
    closed). load() loads it back."""
    with Checkpointer(root, world_size=1, keep_last=keep_last, writer=writer,
                      allow_older_than_latest=allow_older_than_latest) as c:
        return c.save_state(step, state_dict, metadata=metadata, training=training, _staging="overlapped").wait()


def load(state_dict, root, step=None, rank=None, coordinator=None, verify="fast"):
    """Loads checkpoint `step` of `root` (default: `latest`) into `state_dict` in place
    (Reader.load_state) and returns it. The rank: `rank`, else the coordinator's, else 0 for
    a checkpoint of world_size 1."""
    if rank is None and coordinator is not None:
        rank = coordinator.rank
    r = open_latest(root, verify=verify) if step is None else open_step(root, step, verify=verify)
    return r.load_state(state_dict, rank=rank)


def _implied_rank(rank, step, tensors):
    """save(step, tensors) and save(step, tensors=...) as save(None, step, tensors): a dict is
    never a step, and a step alone is never a rank."""
    if tensors is None and isinstance(step, _Mapping):
        return None, rank, step
    if step is _UNSET:
        return None, rank, tensors
    return rank, step, tensors


def _torch_dtype(name, tensor):
    import torch
    attr = _TORCH_DTYPE.get(name) or {"U16": "uint16", "U32": "uint32", "U64": "uint64"}.get(name)
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        raise TypeError(f"tensor {tensor!r} has dtype {name}, which torch {torch.__version__} does not have")
    return dt


def _to_torch(a, dtype, name):
    """A writable torch copy of read()'s array; BF16 (uint16 bits in numpy) as torch.bfloat16."""
    import torch
    if dtype == "BF16":
        return torch.from_numpy(a.view(_np.int16).copy()).view(torch.bfloat16)
    _torch_dtype(dtype, name)  # TypeError naming the tensor for a dtype this torch lacks
    return torch.from_numpy(_np.array(a))


def _verify(verify):
    return None if verify is None else _args.text(verify, "verify")


def _optional_world(world_size):
    return None if world_size is None else _args.integer(world_size, "world_size", 1, _MAX_INT)


def __getattr__(name):
    # ckpt.distributed imports torch: only when asked for.
    if name in ("distributed", "TorchCoordinator"):
        import importlib
        distributed = importlib.import_module(__name__ + ".distributed")
        return distributed if name == "distributed" else distributed.TorchCoordinator
    raise AttributeError(f"module 'ckpt' has no attribute {name!r}")
