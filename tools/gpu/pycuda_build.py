"""PyCUDA for a GPU machine with no network: fetch its sdist here, build it there.

PyCUDA ships only as an sdist: its build needs ``cuda.h`` and a ``libcuda.so`` to link
against, which machines without a GPU driver lack, and a wheel built here would be for the
wrong Python (the lent H200 runs Python 3.12). So ``tools/gpu/gpu-check prepare`` carries the
sdist (:func:`fetch`, pinned and checksummed) and ``tools/gpu/gpu-check run`` builds it on the
GPU machine in the background (:func:`build`, about a minute of one core) while the
checks run on the image's cuda-python binding; the PyCUDA path is then checked on a few
graphs if the build finished in time.

Standard library only: this runs before anything else is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "2026.1"
#: The CUDA toolkits' usual homes, after $CUDA_HOME / $CUDA_ROOT and nvcc's parent.
CUDA_ROOTS = ("/usr/local/cuda",)
#: Where a driver library to link against may be (the toolkit's stub is enough: the
#: extension records libcuda.so.1 and the loader finds the real driver at import).
LIBCUDA_DIRS = (
    "{root}/lib64/stubs",
    "{root}/lib/stubs",
    "{root}/targets/x86_64-linux/lib/stubs",
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
)


def fetch(wheels: Path) -> str:
    """Download PyCUDA's sdist (``VERSION``) into ``wheels`` from PyPI, checking the
    sha256 PyPI publishes; returns what happened (for the log)."""
    wheels.mkdir(parents=True, exist_ok=True)
    url = "https://pypi.org/pypi/pycuda/json"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            meta = json.load(r)
        sdist = next(u for u in meta["releases"][VERSION] if u["packagetype"] == "sdist")
        target = wheels / sdist["filename"]
        if not target.exists():
            with urllib.request.urlopen(sdist["url"], timeout=120) as r:
                data = r.read()
            if hashlib.sha256(data).hexdigest() != sdist["digests"]["sha256"]:
                return f"pycuda {VERSION}: checksum mismatch, not saved"
            target.write_bytes(data)
        return f"pycuda {VERSION} sdist in {target}"
    except Exception as e:  # noqa: BLE001  (offline: the check falls back to cuda-python)
        return f"pycuda {VERSION} not fetched ({type(e).__name__}: {e})"


def cuda_root() -> Path | None:
    """The CUDA toolkit holding ``include/cuda.h``."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_ROOT")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates += list(CUDA_ROOTS)
    for c in candidates:
        if c and (Path(c) / "include" / "cuda.h").is_file():
            return Path(c)
    return None


def libcuda_dir(root: Path, scratch: Path) -> Path | None:
    """A folder with a ``libcuda.so`` the linker accepts (a symlink folder in ``scratch``
    when only the versioned ``libcuda.so.1`` exists)."""
    for pattern in LIBCUDA_DIRS:
        d = Path(pattern.format(root=root))
        if (d / "libcuda.so").exists():
            return d
    for pattern in LIBCUDA_DIRS:
        d = Path(pattern.format(root=root))
        if (d / "libcuda.so.1").exists():
            link = scratch / "libcuda"
            link.mkdir(parents=True, exist_ok=True)
            target = link / "libcuda.so"
            if not target.exists():
                target.symlink_to(d / "libcuda.so.1")
            return link
    return None


def build(wheels: Path, site: Path, scratch: Path) -> int:
    """Build the carried sdist and install it into ``site`` (``--target``); prints each
    step. Returns the exit status."""
    sdists = sorted(wheels.glob("pycuda-*.tar.gz"))
    if not sdists:
        print("no pycuda sdist carried")
        return 1
    root = cuda_root()
    if root is None:
        print("no CUDA toolkit with include/cuda.h found")
        return 1
    libdir = libcuda_dir(root, scratch)
    if libdir is None:
        print(f"no libcuda.so to link against (looked under {root} and the driver folders)")
        return 1
    src = scratch / sdists[-1].name.removesuffix(".tar.gz")
    shutil.rmtree(src, ignore_errors=True)  # configure.py reads an earlier siteconf.py
    scratch.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdists[-1]) as t:
        t.extractall(scratch, filter="data")
    print(f"building {src.name} against {root} (libcuda from {libdir})", flush=True)
    steps = [
        [
            sys.executable,
            "configure.py",
            f"--cuda-root={root}",
            f"--cudadrv-lib-dir={libdir}",
            "--no-cuda-enable-curand",  # opfuse uses the driver API only
        ],
        # setup.py build, not pip: pip's wheel step needs the `wheel` package, and a
        # plain build needs only setuptools and numpy, which the GPU image has.
        [sys.executable, "setup.py", "-q", "build", f"-j{os.cpu_count() or 1}"],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
            return proc.returncode
    built = next((src / "build").glob("lib.*/pycuda"), None)
    if built is None:
        print(f"the build left no package under {src / 'build'}")
        return 1
    site.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(site / "pycuda", ignore_errors=True)
    shutil.copytree(built, site / "pycuda")
    print(f"installed pycuda into {site}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "fetch":
        print(fetch(Path(sys.argv[2])))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "build":
        sys.exit(build(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
    print("usage: pycuda_build.py fetch WHEELS | build WHEELS SITE SCRATCH", file=sys.stderr)
    sys.exit(2)
