"""The checkpoint commit across the processes of a torch.distributed job.

    dist.init_process_group("gloo", ...)          # or nccl for the training: any backend
    coord = ckpt.distributed.TorchCoordinator()   # collective: every process calls it
    with ckpt.Checkpointer(root, coordinator=coord) as c:
        h = c.save(dist.get_rank(), step, tensors, deferred=True)
    coord.close()

Protocol (the C++ CommitCoordinator is ckpt._core.QueueCoordinator; this module is its
channel). TorchCoordinator creates a gloo process group of its own (dist.new_group), so
checkpoint traffic never interleaves with the training's collectives, and one daemon thread
per process that does all of its traffic. Each process hosts one rank (its torch.distributed
rank). When the Checkpointer starts, rank 0 cleans the root up and broadcasts a run id (or
its error). For each checkpoint, once a rank's shard is durable (or has failed) ckpt's thread
queues the rank's report (the shard's manifest part, encoded as the MPI backend encodes it)
and returns at once; the coordination thread gathers every rank's report on rank 0
(gather_object), where the commit runs once all are in, and broadcasts the outcome, which
each process hands to its Checkpointer. Every process saves the same steps in the same order
(a Checkpointer saves one checkpoint at a time), so the collectives of the thread match.
Nothing waits with the GIL held: the thread waits for items, runs the commit and delivers
outcomes with the GIL released, and the training thread's save() and close() release it.

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
        self._core = _core.QueueCoordinator(self.rank, self.world_size)
        self.broken = None  # why the channel failed, once it has
        self._thread = threading.Thread(target=self._run, name="ckpt-commit", daemon=True)
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

    def _run(self):
        while True:
            item = self._core.next_item()
            if item is None:
                return
            kind, step, text = item
            if self.broken is not None:
                self._core.fail(kind, step, self.broken)
                continue
            try:
                if kind == "start":
                    self._start(text)
                else:
                    self._commit(step, text)
            except Exception as e:  # noqa: BLE001 - any failure of the channel fails the step
                self.broken = f"torch.distributed checkpoint coordination failed at step {step}: {type(e).__name__}: {e}"
                self._core.fail(kind, step, self.broken)

    def _start(self, text):
        box = [text if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, group=self.group)
        self._core.answer_start(box[0])

    def _commit(self, step, text):
        dist = self._dist
        gathered = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object((step, text), gathered, dst=0, group=self.group)
        box = [None]
        if self.rank == 0:
            steps = [s for s, _ in gathered]
            if any(s != step for s in steps):
                box[0] = self._core.failed_outcome(step, f"ranks reported different steps: {steps}")
            else:
                box[0] = self._core.commit(step, [t for _, t in gathered])
        dist.broadcast_object_list(box, src=0, group=self.group)
        self._core.deliver(step, box[0])
