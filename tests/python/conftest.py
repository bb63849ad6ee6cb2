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
    dtypes = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32, "F64": np.float64, "I64": np.int64}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtypes[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}
