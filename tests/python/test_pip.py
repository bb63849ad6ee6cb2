# SPDX-License-Identifier: Apache-2.0
# `pip install .` from the source tree and `python3 -m build --wheel`, each into a fresh venv,
# offline (pip --no-index: nothing may come from PyPI): the package builds with the project's
# CMake for the venv's interpreter and imports and saves from the venv, not from the build tree.
import os
import subprocess
import sys
import zipfile

import pytest

SOURCE = os.environ.get("CKPT_SOURCE_DIR")
BUILD = os.environ.get("CKPT_BUILD_DIR")
pytestmark = pytest.mark.skipif(not SOURCE or not BUILD, reason="CKPT_SOURCE_DIR/CKPT_BUILD_DIR not set (ctest sets them)")

# One build tree for both tests, kept in the ctest build tree between runs (pip's build of the
# library is then incremental); -O0: what is tested is the packaging, not the speed, and -O0
# compiles fastest; without the S3 client and the metrics endpoint, which it does not use.
CONFIG = ["--config-settings", f"build-dir={BUILD}/pip-build",
          "--config-settings", "cmake-args=-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0 -DCKPT_S3=OFF -DCKPT_METRICS=OFF"]

ROUND_TRIP = ("import ckpt, numpy as np, sys; assert ckpt.__file__.startswith(sys.prefix), (ckpt.__file__, sys.prefix); "
              "c = ckpt.Checkpointer(sys.argv[1]); c.save_sync(0, 7, {'a': np.arange(5.0)}); c.close(); "
              "r = ckpt.open_latest(sys.argv[1]); assert r.step == 7 and list(r.read(0, 'a')) == [0, 1, 2, 3, 4]; "
              "print(ckpt.__version__)")


def _env():
    # Not the build tree's package (ctest's PYTHONPATH), and no network for pip.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # One compile job: ctest runs other tests beside this one.
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "1")
    return env


def _venv(path):
    # --system-site-packages: numpy (the package's one dependency) from Debian, as nothing can
    # be downloaded here; ckpt itself must come from the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    return str(path / "bin" / "python")


def _run(cmd, **kw):
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def _version():
    import re
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        return re.search(r"project\(ckpt VERSION ([0-9.]+)", f.read()).group(1)


def _check_installed(py, tmp_path):
    out = _run([py, "-c", ROUND_TRIP, str(tmp_path / "root")], cwd=tmp_path)
    assert out.stdout.strip() == _version()


def test_pip_install_from_the_source_tree_into_a_venv(tmp_path):
    py = _venv(tmp_path / "venv")
    _run([py, "-m", "pip", "install", *CONFIG, SOURCE], cwd=tmp_path)
    _check_installed(py, tmp_path)
    show = _run([py, "-m", "pip", "show", "-f", "ckpt"]).stdout
    assert f"Version: {_version()}" in show and "ckpt/_core" in show and "ckpt/state.py" in show, show
    # It uninstalls cleanly: no file of it is left in the venv.
    _run([py, "-m", "pip", "uninstall", "-y", "ckpt"])
    gone = subprocess.run([py, "-c", "import ckpt"], env=_env(), capture_output=True, text=True, cwd=tmp_path)
    assert gone.returncode != 0 and "No module named 'ckpt'" in gone.stderr, gone.stderr


@pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import build"], capture_output=True).returncode != 0,
                    reason="python3-build is not installed (scripts/setup installs it)")
def test_a_wheel_built_with_python_m_build_installs_in_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    settings = [f"-C{c}" for c in CONFIG[1::2]]
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), *settings, SOURCE], cwd=tmp_path)
    wheels = list(dist.glob("ckpt-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert wheels[0].name.startswith(f"ckpt-{_version()}-{tag}-{tag}"), wheels[0].name
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        record = z.read(f"ckpt-{_version()}.dist-info/RECORD").decode()
    assert {"ckpt/__init__.py", "ckpt/state.py", f"ckpt-{_version()}.dist-info/METADATA"} <= names
    assert any(n.startswith("ckpt/_core") and n.endswith(".so") for n in names), names
    assert all(n in record for n in names), (names, record)
    py = _venv(tmp_path / "venv")
    _run([py, "-m", "pip", "install", str(wheels[0])], cwd=tmp_path)
    _check_installed(py, tmp_path)
