# SPDX-License-Identifier: Apache-2.0
# bench/python_bench.py runs end to end on a tiny state (the figures themselves are not judged).
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
SRC = os.environ.get("CKPT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_python_benchmark_reports_every_figure_and_ratio_on_a_tiny_state(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(SRC, "bench", "python_bench.py"), "--dir", str(tmp_path / "b"),
                          "--mb", "2", "--tensors", "4", "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["schema"] == "python_bench/1"  # docs/json-output.md
    assert r["bytes"] == 2 << 20
    assert set(r["median_s"]) == {"clone", "stall_deferred", "stall_copy", "durable_ckpt", "durable_torch", "load_ckpt",
                                  "load_torch", "first_cold", "first_prefaulted", "construct"}
    assert all(v > 0 for v in r["median_s"].values())
    assert set(r["ratios"]) == {"stall_deferred / clone", "durable torch / ckpt", "load torch / ckpt",
                                "first save (pre-faulted pool) / steady"}
    assert not (tmp_path / "b").exists()
