# SPDX-License-Identifier: Apache-2.0
# Tensors on a device (ckpt/_device.py): copied into host buffers the Checkpointer owns and
# reuses, the deferred save returning before the copy, the fence waiting for it. No GPU here:
# a fake device whose copies complete when the test says runs the device-independent code;
# the CUDA test runs where torch sees a GPU.
import threading

import numpy as np
import pytest

import ckpt
from ckpt import _device

torch = pytest.importorskip("torch")


class _FakeDevice:
    type = "fake"

    def __str__(self):
        return "fake:0"


class FakeTensor:
    """A tensor on the fake device: its data is a CPU tensor the device "holds"."""

    def __init__(self, data):
        self.data = data
        self.device = _FakeDevice()
        self.dtype, self.shape, self.layout = data.dtype, data.shape, data.layout

    def data_ptr(self):
        return self.data.data_ptr()

    def is_contiguous(self):
        return self.data.is_contiguous()


class _Copy:
    def __init__(self, copier, pairs):
        self.copier, self.pairs, self.done = copier, pairs, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        self.copier.gate.wait()
        if not self.copier.fail:
            for src, dst in self.pairs:
                dst.copy_(src.data)
        self.done.set()

    def synchronize(self):
        self.done.wait()
        if self.copier.fail:
            raise RuntimeError("fake device lost")


class GateCopier:
    """Copies complete once `gate` is set (set from the start unless a test clears it)."""
    gate = threading.Event()
    fail = False
    copies = 0

    def __init__(self, device):
        pass

    def host_buffer(self, src):
        return torch.empty(tuple(src.shape), dtype=src.dtype)

    def copy(self, pairs):
        GateCopier.copies += 1
        return _Copy(GateCopier, pairs)


_device.register_device("fake", GateCopier)


@pytest.fixture(autouse=True)
def _open_gate():
    GateCopier.gate.set()
    GateCopier.fail = False
    yield
    GateCopier.gate.set()


def _read(root, step, name):
    return ckpt.open_step(root, step).read(0, name)


def test_a_deferred_save_returns_before_the_device_copy_and_the_fence_waits_for_it(tmp_path):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    b = torch.full((5,), 7, dtype=torch.int64)  # a CPU tensor beside it: taken as it is
    GateCopier.gate.clear()
    with ckpt.Checkpointer(tmp_path) as c:
        h = c.save(0, 1, {"w": FakeTensor(w), "b": b}, deferred=True)
        assert not h.staged() and not h.done()
        with pytest.raises(ckpt.Timeout):
            h.wait_staged(timeout=0.05)
        GateCopier.gate.set()
        h.wait_staged()
        w.add_(100)   # after the fence the device tensor may change: the checkpoint has the old values
        b.add_(100)   # the CPU tensor's fence is ckpt's own staging, inside the same wait
        assert h.wait().step == 1
    np.testing.assert_array_equal(_read(tmp_path, 1, "w"), np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(_read(tmp_path, 1, "b"), np.full(5, 7))


def test_a_save_that_is_not_deferred_has_copied_the_device_tensors_when_it_returns(tmp_path):
    w = torch.ones(6, dtype=torch.bfloat16)
    with ckpt.Checkpointer(tmp_path) as c:
        h = c.save(0, 1, {"w": FakeTensor(w)})
        w.zero_()
        h.wait()
    assert ckpt.open_step(tmp_path, 1).tensor_info(0)["w"] == ("BF16", (6,))
    np.testing.assert_array_equal(_read(tmp_path, 1, "w"), np.full(6, 0x3F80, dtype=np.uint16))  # bf16 1.0


def test_host_buffers_are_reused_across_saves_and_made_anew_for_a_new_shape(tmp_path):
    with ckpt.Checkpointer(tmp_path, keep_last=0) as c:
        c.save(0, 1, {"w": FakeTensor(torch.full((4,), 1.0))}, deferred=True).wait()
        first = c._stagers[0].buffer_of("w")
        c.save(0, 2, {"w": FakeTensor(torch.full((4,), 2.0))}, deferred=True).wait()
        assert c._stagers[0].buffer_of("w") is first and c._stagers[0].buffer_of("w").data_ptr() == first.data_ptr()
        c.save(0, 3, {"w": FakeTensor(torch.full((2, 3), 3.0))}, deferred=True).wait()
        assert tuple(c._stagers[0].buffer_of("w").shape) == (2, 3)
    for step, want in ((1, np.full(4, 1.0)), (2, np.full(4, 2.0)), (3, np.full((2, 3), 3.0))):
        np.testing.assert_array_equal(_read(tmp_path, step, "w"), want.astype(np.float32))


def test_the_next_save_waits_for_the_previous_one_to_leave_the_host_buffers(tmp_path):
    # Two deferred saves in a row, the first's copy held back: the second cannot copy into the
    # buffers the first still fills, so each checkpoint has its own values.
    GateCopier.gate.clear()
    with ckpt.Checkpointer(tmp_path, keep_last=0) as c:
        h1 = c.save(0, 1, {"w": FakeTensor(torch.full((8,), 1.0))}, deferred=True)
        threading.Timer(0.2, GateCopier.gate.set).start()
        h2 = c.save(0, 2, {"w": FakeTensor(torch.full((8,), 2.0))}, deferred=True)
        assert h1.staged()  # the second save returned only once the first's copies were done
        h1.wait()
        h2.wait()
    np.testing.assert_array_equal(_read(tmp_path, 1, "w"), np.full(8, 1.0, dtype=np.float32))
    np.testing.assert_array_equal(_read(tmp_path, 2, "w"), np.full(8, 2.0, dtype=np.float32))


def test_a_failed_device_copy_is_raised_by_the_fence_and_the_wait_and_latest_stays(tmp_path):
    with ckpt.Checkpointer(tmp_path) as c:
        c.save(0, 1, {"w": FakeTensor(torch.zeros(3))}).wait()
        GateCopier.fail = True
        h = c.save(0, 2, {"w": FakeTensor(torch.ones(3))}, deferred=True)
        with pytest.raises(RuntimeError, match="fake device lost"):
            h.wait_staged()
        with pytest.raises(RuntimeError, match="fake device lost"):
            h.wait()
        GateCopier.fail = False
        c.save(0, 3, {"w": FakeTensor(torch.full((3,), 3.0))}).wait()  # the stager is usable again
    r = ckpt.open_latest(tmp_path)
    assert r.step == 3 and not (tmp_path / "step-2").exists()
    np.testing.assert_array_equal(_read(tmp_path, 1, "w"), np.zeros(3, dtype=np.float32))


def test_close_drains_a_deferred_device_save_whose_copy_is_still_running(tmp_path):
    GateCopier.gate.clear()
    c = ckpt.Checkpointer(tmp_path)
    h = c.save(0, 5, {"w": FakeTensor(torch.full((4,), 5.0))}, deferred=True)
    threading.Timer(0.2, GateCopier.gate.set).start()
    c.close()
    assert h.wait().step == 5
    assert ckpt.open_latest(tmp_path).step == 5
    np.testing.assert_array_equal(_read(tmp_path, 5, "w"), np.full(4, 5.0, dtype=np.float32))


def test_a_tensor_torch_cannot_copy_to_the_host_is_a_type_error_naming_it(tmp_path):
    with ckpt.Checkpointer(tmp_path) as c:
        with pytest.raises(TypeError, match=r"'w'.*meta"):
            c.save(0, 1, {"w": torch.empty(4, device="meta")})
        c.save(0, 2, {"w": torch.zeros(4)}).wait()   # nothing left half-done
    assert ckpt.open_latest(tmp_path).step == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_tensors_are_staged_through_pinned_buffers(tmp_path):
    w = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    with ckpt.Checkpointer(tmp_path) as c:
        h = c.save(0, 1, {"w": w}, deferred=True)
        h.wait_staged()
        w.zero_()
        h.wait()
        assert c._stagers[0].buffer_of("w").is_pinned()
    np.testing.assert_array_equal(_read(tmp_path, 1, "w"), np.arange(1 << 20, dtype=np.float32))
