#!/usr/bin/env python3
"""Checks the contents of a kvarn wheel.

    check_wheel.py <source dir> <wheel>

The wheel (of this source tree's version) holds the package, its stubs, the SWIG module and
libkvarn.so.<ABI>, the C++ torch ops' sources (kvarn/csrc), no other C development files, and the module finds the library through RUNPATH
$ORIGIN. scripts/wheel-ci.sh runs it on the wheel `pip wheel .` built, before auditwheel and before
installing it into a fresh venv. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile


def main() -> int:
    source, wheel = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    names = zipfile.ZipFile(wheel).namelist()
    print(wheel.name, *names, sep="\n  ")
    header = (source / "capi/include/kvarn/kvarn.h").read_text()
    version = ".".join(
        re.search(rf"#define KVARN_VERSION_{p} (\d+)", header).group(1)
        for p in ("MAJOR", "MINOR", "PATCH")
    )
    abi = re.search(r"#define KVARN_ABI_VERSION (\d+)", header).group(1)
    assert wheel.name.startswith(f"kvarn-{version}-"), wheel.name
    for required in (
        "kvarn/__init__.py",
        "kvarn/__init__.pyi",
        "kvarn/py.typed",
        "kvarn/capi.py",
        f"kvarn/libkvarn.so.{abi}",
    ):
        assert required in names, f"{required} missing from the wheel"
    modules = [n for n in names if re.fullmatch(r"kvarn/_capi\..*\.so", n)]
    assert len(modules) == 1, names
    # The headers allowed: kvarn/csrc's copies of kvarn.h and kvarn_experimental.h, which the
    # C++ torch ops (kvarn.torch_ops_cpp) compile against on first use. No CMake or pkg-config
    # files.
    torch_ops_sources = {"kvarn/csrc/torch_ops.cpp", "kvarn/csrc/include/kvarn/kvarn.h",
                         "kvarn/csrc/include/kvarn/kvarn_experimental.h"}
    assert torch_ops_sources <= set(names), "the C++ torch ops sources are missing"
    development = [
        n for n in names if n.endswith((".h", ".cmake", ".pc")) and n not in torch_ops_sources
    ]
    assert not development, f"C development files: {development}"
    if shutil.which("readelf"):
        with tempfile.TemporaryDirectory() as unpacked:
            module = zipfile.ZipFile(wheel).extract(modules[0], unpacked)
            dynamic = subprocess.run(
                ["readelf", "-d", module], check=True, capture_output=True, text=True
            ).stdout
        assert re.search(r"(RUNPATH|RPATH).*\[\$ORIGIN\]", dynamic), dynamic
        assert f"libkvarn.so.{abi}" in dynamic, dynamic
    print("wheel contents OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
