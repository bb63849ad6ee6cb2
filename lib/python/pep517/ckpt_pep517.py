# SPDX-License-Identifier: Apache-2.0
"""The PEP 517 build backend of `pip install .` and `python3 -m build --wheel` (pyproject.toml).

It runs the project's own CMake for the Python module (the library ckpt::ckpt and the
extension ckpt._core, nothing else: no tests, no programs, no MPI) with the interpreter that
runs the build, so the extension matches the interpreter of the venv it is installed into,
and packs build/python/ckpt into a wheel. It needs nothing from the network or from PyPI (no
build requirements: pip's isolated build environment stays empty), only what scripts/setup
installs for the module: a compiler, CMake, the library's dependencies, pybind11-dev and the
interpreter's headers (python3-dev). docs/python.md, "Installing with pip".

The build tree is build/pip-python3.X under the source tree, kept between builds (a second
`pip install .` rebuilds only what changed); config setting `build-dir` picks another
(pip install . -C build-dir=/tmp/b, or python3 -m build -C build-dir=...), `cmake-args` adds
CMake arguments (space-separated). CMAKE_BUILD_PARALLEL_LEVEL sets the compile jobs (default:
the CPUs).
"""

import base64
import hashlib
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import zipfile

_SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_NAME = "ckpt"


def _version():
    """The version of CMakeLists.txt's project() line, the one ckpt.__version__ reports."""
    with open(os.path.join(_SOURCE, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*ckpt\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError(f"{_SOURCE}/CMakeLists.txt: no `project(ckpt VERSION x.y.z ...)` line")
    return m.group(1)


def _tag():
    """The wheel's tag: this interpreter and ABI (the extension is built for them) and platform."""
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    abi = impl + sys.abiflags
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{abi}-{plat}"


def _metadata(version):
    with open(os.path.join(_SOURCE, "README.md"), encoding="utf-8") as f:
        first = next((line.strip() for line in f if line.strip() and not line.startswith("#")), "")
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {_NAME}",
        f"Version: {version}",
        "Summary: Asynchronous, sharded, verified checkpoints for training jobs (Python module of ckpt)",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Requires-Dist: numpy",
        "Description-Content-Type: text/markdown",
        "",
        first,
        "",
    ])


def _run(cmd, log):
    log.write(("$ " + shlex.join(cmd) + "\n").encode())
    log.flush()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        log.flush()
        with open(log.name, "rb") as f:
            tail = f.read()[-6000:].decode(errors="replace")
        raise RuntimeError(f"ckpt's build failed: `{shlex.join(cmd)}` exited {proc.returncode} "
                           f"(whole log: {log.name}):\n{tail}")


def _build_module(config_settings):
    settings = config_settings or {}
    build = settings.get("build-dir") or os.path.join(
        _SOURCE, "build", f"pip-python{sys.version_info[0]}.{sys.version_info[1]}")
    build = os.path.abspath(build)
    os.makedirs(build, exist_ok=True)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    configure = ["cmake", "-S", _SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DCKPT_PYTHON=ON",
                 "-DCKPT_BUILD_TESTS=OFF", "-DCKPT_BUILD_APPS=OFF", "-DCKPT_MPI=OFF",
                 # The interpreter running this build (a venv's), not Debian's /usr/bin/python3
                 # that lib/python/CMakeLists.txt prefers when it is not told.
                 f"-DPython3_EXECUTABLE={sys.executable}"]
    configure += shlex.split(settings.get("cmake-args", ""))
    with open(os.path.join(build, "pip-build.log"), "ab") as log:
        _run(configure, log)
        _run(["cmake", "--build", build, "--target", "ckpt_python", "-j", jobs], log)
    return os.path.join(build, "python", _NAME)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _is_module_file(name):
    return name.endswith(".py") or (name.startswith("_core") and name.endswith(".so"))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    package = _build_module(config_settings)
    files = sorted(f for f in os.listdir(package) if _is_module_file(f))
    if not any(f.startswith("_core") for f in files):
        raise RuntimeError(f"ckpt's build made no extension module in {package}")
    dist_info = f"{_NAME}-{version}.dist-info"
    wheel_name = f"{_NAME}-{version}-{_tag()}.whl"
    entries = []
    for f in files:
        with open(os.path.join(package, f), "rb") as src:
            entries.append((f"{_NAME}/{f}", src.read()))
    with open(os.path.join(_SOURCE, "LICENSE"), "rb") as src:
        entries.append((f"{dist_info}/LICENSE", src.read()))
    entries.append((f"{dist_info}/METADATA", _metadata(version).encode()))
    entries.append((f"{dist_info}/WHEEL", "\n".join([
        "Wheel-Version: 1.0", "Generator: ckpt_pep517", "Root-Is-Purelib: false", f"Tag: {_tag()}", ""]).encode()))
    record = [_record_line(name, data) for name, data in entries] + [f"{dist_info}/RECORD,,"]
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, wheel_name)
    tmp = path + ".partial"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, path)
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []  # CMake, the compiler and pybind11 come from the system (scripts/setup)
