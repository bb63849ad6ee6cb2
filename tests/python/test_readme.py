# SPDX-License-Identifier: Apache-2.0
# The README's "From PyTorch" snippet runs as written (taken from README.md, so it cannot drift).
import os
import re

import pytest

pytest.importorskip("torch")
README = os.path.join(os.environ.get("CKPT_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")), "README.md")


def test_the_readme_from_pytorch_snippet_runs_and_resumes_at_its_last_step(tmp_path, monkeypatch):
    with open(README) as f:
        text = f.read()
    blocks = re.findall(r"<!-- run by tests/python/test_readme.py -->\s*```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    env = {}
    exec(compile(blocks[0], "README.md", "exec"), env)
    assert env["r"].step == 3
    assert sorted(os.listdir(tmp_path / "ckpts" / "run1"))[-1] == "step-0000000003"
