# SPDX-License-Identifier: Apache-2.0
"""Tensors on a device (a GPU): copied into host buffers ckpt owns before ckpt saves them.

Checkpointer.save takes a dict that may hold torch tensors on any device. CPU tensors and numpy
arrays go to ckpt as before, without a copy. Each tensor on another device is copied, with
torch's own non-blocking copy, into a host buffer of this rank's stager (pinned memory where
the device has it, so the copy is DMA and asynchronous), allocated on the rank's first save
of that name, dtype and shape and reused by every later one. ckpt then saves the host
buffers.

For CUDA the copies run on a stream of the stager's own, which first waits for the work
already queued on the current stream (the copy sees the values the training computed), and
each source is kept alive for that stream (record_stream). A deferred save returns as soon as
the copies are queued: the device copies while the training goes on (the next forward runs
beside them), and a thread of the stager waits for them and hands the host buffers to ckpt.
The fence, SaveHandle.wait_staged(), returns once the device copies are done: after it the
device tensors may be modified. The next save of the same rank waits until ckpt has staged
the previous one's host buffers before copying into them again. A save that is not deferred
waits for the copies before it returns, as for CPU tensors.

Devices without streams here (anything but CUDA) are copied with a blocking copy_. A device
type can register its own copier (register_device): tests/python/test_device.py runs all of
the above with a fake device whose copies complete when the test says.
"""

import threading
import time

_COPIERS = {}


def register_device(device_type, factory):
    """factory(device) -> a copier: .host_buffer(src) -> a host tensor like src (pinned where
    possible); .copy(pairs) -> a waitable with .synchronize(), after queuing dst.copy_(src) for
    each (src, dst) of pairs."""
    _COPIERS[str(device_type)] = factory


def is_device_tensor(v):
    dev = getattr(v, "device", None)
    return dev is not None and hasattr(v, "data_ptr") and getattr(dev, "type", "cpu") != "cpu"


def has_device_tensors(tensors):
    return isinstance(tensors, dict) and any(is_device_tensor(v) for v in tensors.values())


class _Done:
    def synchronize(self):
        pass


class _BlockingCopier:
    """Any device torch can copy from: a blocking copy_ into a plain host tensor."""

    def __init__(self, device):
        self.device = device

    def host_buffer(self, src):
        import torch
        return torch.empty(tuple(src.shape), dtype=src.dtype, device="cpu")

    def copy(self, pairs):
        for src, dst in pairs:
            dst.copy_(src)
        return _Done()


class _CudaCopier:
    """CUDA: pinned host buffers and non-blocking copies on a stream of the stager's own."""

    def __init__(self, device):
        import torch
        self.torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def host_buffer(self, src):
        return self.torch.empty(tuple(src.shape), dtype=src.dtype, device="cpu", pin_memory=True)

    def copy(self, pairs):
        torch = self.torch
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for src, dst in pairs:
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.stream)
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


register_device("cuda", _CudaCopier)


class RankStager:
    """One rank's host buffers and copiers (Checkpointer keeps one per rank)."""

    def __init__(self):
        self._buffers = {}   # name -> host tensor
        self._copiers = {}   # str(device) -> copier
        self.previous = None  # the last deferred save's DeviceSave: ckpt may still read the buffers

    def _copier(self, device):
        key = str(device)
        c = self._copiers.get(key)
        if c is None:
            c = _COPIERS.get(device.type, _BlockingCopier)(device)
            self._copiers[key] = c
        return c

    def buffer_of(self, name):
        """The host buffer of tensor `name` (tests: it is reused)."""
        return self._buffers.get(name)

    def stage(self, tensors):
        """Queues the copies of the device tensors of `tensors` into this rank's host buffers;
        returns (the dict ckpt saves, [waitables])."""
        if self.previous is not None:
            self.previous.wait_buffers_free()
            self.previous = None
        out, per_device = {}, {}
        for name, v in tensors.items():
            if not is_device_tensor(v):
                out[name] = v
                continue
            if str(v.layout) != "torch.strided" or not v.is_contiguous():
                raise TypeError(f"tensor {name!r} on {v.device} is not a contiguous dense tensor: "
                                "call .contiguous() first")
            copier = self._copier(v.device)
            buf = self._buffers.get(name)
            if buf is None or buf.dtype != v.dtype or tuple(buf.shape) != tuple(v.shape):
                try:
                    buf = copier.host_buffer(v)
                except (RuntimeError, NotImplementedError) as e:
                    raise TypeError(f"tensor {name!r} on {v.device}: no host buffer for it ({e})") from e
                self._buffers[name] = buf
            per_device.setdefault(str(v.device), (copier, []))[1].append((name, v, buf))
            out[name] = buf
        waits = []
        for copier, items in per_device.values():
            try:
                waits.append(copier.copy([(v, buf) for _, v, buf in items]))
            except (RuntimeError, NotImplementedError) as e:
                names = ", ".join(repr(n) for n, _, _ in items)
                which = f"tensor {names} is" if len(items) == 1 else f"tensors {names} are"
                raise TypeError(f"{which} on {items[0][1].device} and cannot be copied to the host: {e}") from e
        return out, waits


class DeviceSave:
    """The core handle's stand-in for a deferred save of device tensors: a thread waits for the
    device copies, then makes the save of the host buffers; until then the waits wait for it.
    Same methods as the core handle SaveHandle wraps."""

    def __init__(self, step, waits, start_save, direct):
        self.step = step
        # direct: the save also has CPU tensors ckpt reads in place: the fence waits for ckpt's
        # copy of those too (for device tensors alone, the device copies are the fence).
        self._direct = direct
        self._copied = threading.Event()   # the device copies are done (or failed)
        self._ready = threading.Event()    # the save of the host buffers is made (or failed)
        self._copy_error = None
        self._save_error = None
        self._core = None
        self._thread = threading.Thread(target=self._run, args=(waits, start_save), name="ckpt-device-stage",
                                        daemon=True)
        self._thread.start()

    def _run(self, waits, start_save):
        try:
            for w in waits:
                w.synchronize()
        except BaseException as e:  # noqa: B036 (the copy's error, whatever it is, goes to the waits)
            self._copy_error = e
        self._copied.set()
        if self._copy_error is None:
            try:
                self._core = start_save()
            except BaseException as e:  # noqa: B036
                self._save_error = e
        self._ready.set()

    def join(self):
        self._thread.join()

    def wait_buffers_free(self):
        """Until ckpt has copied the host buffers (or the save ended without reading them)."""
        self._ready.wait()
        if self._core is not None:
            self._core.wait_staged_for(None)

    # -- the core handle's interface ------------------------------------------------------
    def done(self):
        return self._ready.is_set() and (self._core is None or self._core.done())

    def staged(self):
        if not self._copied.is_set():
            return False
        if not self._direct:
            return True
        return self._ready.is_set() and (self._core is None or self._core.staged())

    def skipped(self):
        return self._ready.is_set() and self._core is not None and self._core.skipped()

    def wait_staged_for(self, t):
        start = time.monotonic()
        if not self._copied.wait(t):
            return False
        if not self._direct:
            return True
        if not self._ready.wait(None if t is None else max(0.0, t - (time.monotonic() - start))):
            return False
        return self._core is None or self._core.wait_staged_for(None if t is None else max(0.0, t - (time.monotonic() - start)))

    def staged_result(self):
        if self._copy_error is not None:
            raise self._copy_error
        if self._direct:
            if self._save_error is not None:
                raise self._save_error
            if self._core is not None:
                self._core.staged_result()

    def wait_for(self, t):
        start = time.monotonic()
        if not self._ready.wait(t):
            return False
        if self._core is None:
            return True
        return self._core.wait_for(None if t is None else max(0.0, t - (time.monotonic() - start)))

    def result(self):
        if self._copy_error is not None:
            raise self._copy_error
        if self._save_error is not None:
            raise self._save_error
        return self._core.result()
