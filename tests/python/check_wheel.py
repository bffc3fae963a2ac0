#!/usr/bin/env python3
"""Builds the kvarn wheel from a source tree and checks it on its own.

    check_wheel.py <source dir> <work dir>

`pip wheel` (scikit-build-core, without build isolation: this Python must have
scikit-build-core) -> the wheel holds the package, its stubs, the SWIG module and
libkvarn.so.<ABI>, the module's RUNPATH is $ORIGIN -> unpacked alone (no build tree on the path),
`import kvarn; kvarn.selftest()` passes and the package's version is the C library's.
Not collected by pytest (no test_ prefix); CTest runs it as python.packaging.wheel.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile


def main() -> int:
    source, work = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    shutil.rmtree(work, ignore_errors=True)
    wheels, unpacked = work / "wheels", work / "site"
    env = dict(
        os.environ,
        CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get(
            "CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2)
        ),
    )
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(wheels),
            "-C",
            f"build-dir={work / 'build'}",
        ],
        check=True,
        env=env,
    )
    (wheel,) = wheels.glob("kvarn-*.whl")
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
    assert not [n for n in names if n.endswith((".h", ".cmake", ".pc"))], "C development files"
    zipfile.ZipFile(wheel).extractall(unpacked)
    if shutil.which("readelf"):
        dynamic = subprocess.run(
            ["readelf", "-d", str(unpacked / modules[0])],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert re.search(r"(RUNPATH|RPATH).*\[\$ORIGIN\]", dynamic), dynamic
        assert f"libkvarn.so.{abi}" in dynamic, dynamic
    script = (
        "import kvarn, pathlib, sys; "
        f"assert pathlib.Path(kvarn.__file__).parent == pathlib.Path({str(unpacked / 'kvarn')!r}); "
        f"assert kvarn.__version__ == {version!r}; "
        "print(kvarn.selftest())"
    )
    subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        cwd=work,
        env=dict(env, PYTHONPATH=str(unpacked)),
    )
    print("wheel OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
