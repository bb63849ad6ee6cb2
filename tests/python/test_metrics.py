# SPDX-License-Identifier: Apache-2.0
# Checkpointer.metrics_text and Checkpointer.serve_metrics (docs/metrics.md): the Prometheus
# metrics of a Python training loop, fetched over HTTP with curl.
import re
import subprocess

import numpy as np
import pytest

import ckpt


def save_three(c):
    for step in (1, 2, 3):
        c.save_sync(0, step, {"w": np.full(256, step, dtype=np.float32)})


def value(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    assert m, f"{name} not in the metrics"
    return float(m.group(1))


def test_metrics_text_counts_the_saves(tmp_path):
    with ckpt.Checkpointer(str(tmp_path / "root")) as c:
        save_three(c)
        text = c.metrics_text()
    assert "# TYPE ckpt_checkpoints_committed_total counter\n" in text
    assert "# TYPE ckpt_save_phase_seconds histogram\n" in text
    assert value(text, "ckpt_checkpoints_committed_total") == 3
    assert value(text, "ckpt_last_committed_step") == 3
    assert value(text, 'ckpt_save_phase_seconds_count{phase="total"}') == 3


@pytest.mark.skipif(not ckpt._core.HAVE_METRICS_SERVER, reason="built without the metrics endpoint (prometheus-cpp)")
def test_serve_metrics_answers_curl_on_loopback(tmp_path):
    with ckpt.Checkpointer(str(tmp_path / "root")) as c:
        url = c.serve_metrics()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url)
        save_three(c)
        body = subprocess.run(["curl", "-sS", "--max-time", "10", url], check=True, capture_output=True, text=True).stdout
        assert value(body, "ckpt_checkpoints_committed_total") == 3
        assert "# HELP ckpt_saves_total " in body
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with ckpt.Checkpointer(str(tmp_path / "other")) as other:
            with pytest.raises(ckpt.IoError):
                other.serve_metrics(port)
