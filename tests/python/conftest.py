# SPDX-License-Identifier: Apache-2.0
# Shared by the Python tests (run by ctest through pytest, with PYTHONPATH=<build>/python).
import os
import sys

import pytest

# Keep each test process light on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


def shard_path(reader, rank):
    import glob
    files = sorted(glob.glob(os.path.join(reader.dir, f"rank-{rank:05d}*")))
    assert files, f"no shard file of rank {rank} in {reader.dir}: {os.listdir(reader.dir)}"
    return files[0]




def read_safetensors(path):
    """name -> numpy array of a safetensors file, parsed from the file alone (an 8-byte
    little-endian header length, the JSON header, the data); BF16 as uint16 bits."""
    import json
    import numpy as np
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32, "F64": np.float64, "I32": np.int32,
              "I64": np.int64}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtypes[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def spawn_ranks(tmp_path, world, target, *extra, job="", join_s=90):
    """Runs target(rank, world, init, root, out, *extra) in `world` torch.multiprocessing
    processes ("spawn"), root tmp_path/root, each writing its JSON result to f"{out}.{rank}";
    `job` tells apart several jobs in one tmp_path. (root, their exit codes, the results).
    A job still running after `join_s` seconds is killed and fails the test."""
    import json
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    root, out = str(tmp_path / "root"), str(tmp_path / f"out{job}")
    init = f"file://{tmp_path}/init{job}"
    procs = [ctx.Process(target=target, args=(r, world, init, root, out, *extra)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(join_s)
        if p.is_alive():
            for q in procs:
                q.kill()
            pytest.fail("a worker hung")
    results = {}
    for r in range(world):
        if os.path.exists(f"{out}.{r}"):
            with open(f"{out}.{r}") as f:
                results[r] = json.load(f)
    return root, [p.exitcode for p in procs], results


def python_env():
    """The environment of a python3 child: this package and tests/python on its path."""
    here = os.path.dirname(os.path.abspath(__file__))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), here) if p))


def run_python(code, *args, timeout=60):
    """Runs `code` in a fresh python3 (python_env()) with `args`, within `timeout` seconds (a
    hang fails the test, the process killed): the CompletedProcess, stdout and stderr as text."""
    import subprocess
    try:
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=python_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process did not end within {timeout} s (hung); stdout: {e.stdout!r}; stderr: {e.stderr!r}")


def result_of(proc):
    """The JSON object a script printed as its last stdout line, once it exited 0."""
    import json
    assert proc.returncode == 0, f"exit status {proc.returncode}; stderr: {proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {proc.stderr[-4000:]}"
    return json.loads(lines[-1])
