# SPDX-License-Identifier: Apache-2.0
"""The checkpoint commit across the processes of a torch.distributed job.

    dist.init_process_group("gloo", ...)          # or nccl for the training: any backend
    coord = ckpt.distributed.TorchCoordinator()   # collective: every process calls it
    with ckpt.Checkpointer(root, coordinator=coord) as c:
        h = c.save(dist.get_rank(), step, tensors, deferred=True)
    coord.close()

Protocol: ckpt's own (the C++ ChannelCoordinator, ckpt._core.ProcessCoordinator; the same as
the MPI backend's and the threads'); this module is only its transport. TorchCoordinator
creates a gloo process group of its own (dist.new_group), so checkpoint traffic never
interleaves with the training's collectives, and one daemon thread per process that runs the
protocol's rounds over it: two collectives, gather (gather_object to rank 0) and broadcast
(broadcast_object_list from rank 0), of bytes. Each process hosts one rank (its
torch.distributed rank). When the Checkpointer starts, rank 0 cleans the root up and
broadcasts a run id (or its error). For each checkpoint, once a rank's shard is durable (or
has failed) ckpt queues the rank's vote and returns at once; the thread gathers every vote on
rank 0, where the commit runs once all are in, and broadcasts the outcome, which each process
hands to its Checkpointer. Every process saves the same steps in the same order (a
Checkpointer saves one checkpoint at a time), so the collectives of the thread match.
Nothing waits with the GIL held: the thread runs the protocol with the GIL released and takes
it only for the collectives, and the training thread's save() and close() release it.
A process that dies (or whose gloo connection breaks) makes the collective fail on the
others: the step fails there with ckpt.CommError, its temporary directory is removed, and
`latest` keeps naming the previous checkpoint; the channel is then broken and every later
checkpoint of this coordinator fails the same way (restart the job). A rank that is merely
slow is waited for up to `timeout`.
"""

import datetime
import threading

from . import _core


class TorchCoordinator:
    """The commit coordinator of one process of a torch.distributed job (see the module doc).
    Collective: every process of the default group creates one, in the same order relative to
    other new_group calls. torch.distributed must be initialised. Use with one Checkpointer
    at a time; close() it after the Checkpointer (Checkpointer.close, or leaving its `with`)."""

    def __init__(self, timeout=datetime.timedelta(minutes=10), group=None):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ckpt.distributed.TorchCoordinator: torch.distributed is not initialised "
                               "(call dist.init_process_group first)")
        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.group = group if group is not None else dist.new_group(backend="gloo", timeout=timeout)
        self._core = _core.ProcessCoordinator(self.rank, self.world_size, _Transport(dist, self.rank, self.world_size, self.group))
        self._thread = threading.Thread(target=self._core.serve, name="ckpt-commit", daemon=True)
        self._thread.start()

    def close(self):
        """Stops the coordination thread (after the Checkpointer using it is closed)."""
        self._core.close()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Transport:
    """The two collectives of the protocol, over a gloo group of the job's own."""

    def __init__(self, dist, rank, world_size, group):
        self._dist = dist
        self._rank = rank
        self._world_size = world_size
        self._group = group

    def gather(self, mine):
        gathered = [None] * self._world_size if self._rank == 0 else None
        self._dist.gather_object(bytes(mine), gathered, dst=0, group=self._group)
        return gathered

    def broadcast(self, text):
        box = [bytes(text) if self._rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]
