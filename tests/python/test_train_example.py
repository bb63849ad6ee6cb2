# SPDX-License-Identifier: Apache-2.0
# examples/pytorch/train.py, a 4-process DDP job: an uninterrupted run and a run SIGKILLed at a
# random step then resumed give the same losses and final parameters bit for bit; a resume at
# another world size is refused with WorldSizeMismatch.
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ckpt
from conftest import read_safetensors

pytest.importorskip("torch")
SRC = os.environ.get("CKPT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(SRC, "examples", "pytorch", "train.py")
STEPS, EVERY, WORLD = 12, 3, 4


def cmd(d, metrics, *extra):
    return [sys.executable, TRAIN, "--dir", str(d), "--steps", str(STEPS), "--save-every", str(EVERY),
            "--world-size", str(WORLD), "--metrics", str(metrics), *extra]


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def kill_when_logged(p, metrics, step):
    """SIGKILLs the job `p` (its whole session) once its metrics file has logged `step`."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        if metrics.exists() and any(x.get("step") == step for x in lines(metrics) if "loss_hex" in x):
            break
        time.sleep(0.01)
    assert p.poll() is None, "the run ended before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_a_run_killed_at_a_random_step_and_resumed_equals_an_uninterrupted_run_bit_for_bit(tmp_path):
    full = subprocess.run(cmd(tmp_path / "a", tmp_path / "a.jsonl"), capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    want = lines(tmp_path / "a.jsonl")
    assert [x["step"] for x in want[:-1]] == list(range(1, STEPS + 1)) and want[-1]["final"]

    kill_at = random.Random(os.environ.get("CKPT_TEST_SEED")).randint(7, STEPS - 1)
    print("killing at step", kill_at)
    b = tmp_path / "b.jsonl"
    p = subprocess.Popen(cmd(tmp_path / "b", b), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kill_when_logged(p, b, kill_at)
    latest = ckpt.open_latest(tmp_path / "b" / "ckpt", world_size=WORLD).step
    assert latest % EVERY == 0 and kill_at - EVERY <= latest <= kill_at

    res = subprocess.run(cmd(tmp_path / "b", tmp_path / "c.jsonl", "--resume"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    got = [x for x in lines(b) if x["step"] <= latest] + lines(tmp_path / "c.jsonl")
    assert [x["loss_hex"] for x in got[:-1]] == [x["loss_hex"] for x in want[:-1]]
    assert got[-1]["params_sha256"] == want[-1]["params_sha256"]

    two = [sys.executable, TRAIN, "--dir", str(tmp_path / "b"), "--steps", str(STEPS), "--save-every", str(EVERY),
           "--world-size", "2", "--resume"]
    other = subprocess.run(two, capture_output=True, text=True, timeout=300)
    assert other.returncode == 3, other.stderr
    assert "WorldSizeMismatch" in other.stderr and "world size 4" in other.stderr
    assert ckpt.open_latest(tmp_path / "b" / "ckpt", world_size=WORLD).step == STEPS

    check_model_export(tmp_path / "b" / "ckpt", tmp_path / "hf")


def load_train_module():
    spec = importlib.util.spec_from_file_location("ckpt_example_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_model_export(root, out):
    # The model's tensors, saved under "model." + its state_dict() names, load into the same
    # torch model by name and shape.
    import torch
    model = load_train_module().GPT()
    r = ckpt.open_latest(root)
    saved = {n[len("model."):]: r.read(0, n) for n in r.tensor_names(0) if n.startswith("model.")}
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: v.shape for k, v in saved.items()}
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in saved.items()}, strict=True)
    # `ckpt consolidate` (Hugging Face layout): the model, saved whole by rank 0, under its
    # global names; the optimizer state and the per-rank RNG states left out.
    tool = os.path.join(os.environ.get("CKPT_BIN_DIR", ""), "ckpt")
    assert os.path.exists(tool), tool
    res = subprocess.run([tool, "consolidate", str(root), str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    files = sorted(out.glob("*.safetensors"))
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    names = {k[len("model."):] if k.startswith("model.") else k: v for k, v in tensors.items()}
    sd = model.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: v.shape for k, v in names.items() if k in sd}
    for k in sd:  # the same values as the checkpoint holds
        assert np.array_equal(names[k], saved[k]), k
    model.load_state_dict({k: torch.from_numpy(np.array(names[k], dtype=np.float32)) for k in sd}, strict=True)
    # `ckpt reshard`: every tensor is described (the RNG states rank_local), so the job's
    # checkpoint goes to another world size, and its model compares equal there.
    res = subprocess.run([tool, "reshard", str(root), str(out) + "-at2", "--world-size", "2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    r2 = ckpt.open_latest(str(out) + "-at2", world_size=2)
    for n in saved:
        assert np.array_equal(r2.read(0, "model." + n), saved[n]), n


def test_a_run_saving_to_memory_killed_at_a_random_step_resumes_from_memory_bit_for_bit(tmp_path):
    """The root mem://NAME: generations in shared memory outlive the SIGKILLed processes."""
    mem = f"mem://pytest-train-{os.getpid()}"
    full = subprocess.run(cmd(tmp_path / "a", tmp_path / "a.jsonl"), capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    want = lines(tmp_path / "a.jsonl")
    kill_at = random.Random(os.environ.get("CKPT_TEST_SEED")).randint(7, STEPS - 1)
    b = tmp_path / "b.jsonl"
    p = subprocess.Popen(cmd(tmp_path / "b", b, "--root", mem), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kill_when_logged(p, b, kill_at)
    try:
        latest = ckpt.open_latest(mem, world_size=WORLD).step
        assert latest % EVERY == 0 and kill_at - EVERY <= latest <= kill_at
        res = subprocess.run(cmd(tmp_path / "b", tmp_path / "c.jsonl", "--root", mem, "--resume"), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        got = [x for x in lines(b) if x["step"] <= latest] + lines(tmp_path / "c.jsonl")
        assert [x["loss_hex"] for x in got[:-1]] == [x["loss_hex"] for x in want[:-1]]
        assert got[-1]["params_sha256"] == want[-1]["params_sha256"]
    finally:
        import shutil
        shutil.rmtree(os.path.join(os.environ.get("CKPT_MEMORY_DIR") or "/dev/shm", f"ckpt-{os.geteuid()}", mem[len("mem://"):]),
                      ignore_errors=True)
