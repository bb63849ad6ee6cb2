# SPDX-License-Identifier: Apache-2.0
# `cmake --install` puts the package where the prefix's interpreter looks, and it imports from there.
import os
import subprocess
import sys
import sysconfig

import pytest

BUILD = os.environ.get("CKPT_BUILD_DIR")


@pytest.mark.skipif(not BUILD, reason="CKPT_BUILD_DIR not set (ctest sets it)")
def test_the_installed_package_imports_from_the_prefix_and_saves(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    pkgs = list(prefix.glob("lib/python3*/*-packages/ckpt/__init__.py"))
    assert len(pkgs) == 1, list(prefix.rglob("ckpt"))
    site = pkgs[0].parent.parent
    # Where this interpreter looks for packages under a prefix: the same relative directory.
    assert os.path.relpath(site, prefix) == os.path.relpath(sysconfig.get_path("platlib"), sysconfig.get_path("data"))
    code = ("import ckpt, numpy as np, sys; assert ckpt.__file__.startswith(sys.argv[1]), ckpt.__file__; "
            "c = ckpt.Checkpointer(sys.argv[2]); c.save_sync(0, 1, {'a': np.arange(3)}); c.close(); "
            "assert list(ckpt.open_latest(sys.argv[2]).read(0, 'a')) == [0, 1, 2]")
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", code, str(site), str(tmp_path / "root")], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
