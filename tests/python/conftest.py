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


