"""tools/gpu-check and tools/pycuda_build.py without a GPU: what can go wrong before a
kernel runs (finding the CUDA toolkit and a driver library to link PyCUDA against, a
machine with no binding) must end in a JSON that says so, never in a lost run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from opfuse.tools import pycuda_build as pb

GPU_CHECK = Path(__file__).parents[2] / "tools" / "gpu-check"


def test_cuda_root_is_the_toolkit_with_cuda_h(tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda.h").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert pb.cuda_root() == tmp_path


def test_libcuda_prefers_an_unversioned_library(tmp_path, monkeypatch):
    root, driver = tmp_path / "cuda", tmp_path / "driver"
    (root / "lib64" / "stubs").mkdir(parents=True)
    driver.mkdir()
    (driver / "libcuda.so.1").write_text("")
    monkeypatch.setattr(pb, "LIBCUDA_DIRS", ("{root}/lib64/stubs", str(driver)))
    # only the driver's versioned library: a folder with a libcuda.so link to it
    found = pb.libcuda_dir(root, tmp_path / "scratch")
    assert found == tmp_path / "scratch" / "libcuda"
    assert (found / "libcuda.so").resolve() == (driver / "libcuda.so.1").resolve()
    # the toolkit's stub wins when there is one
    (root / "lib64" / "stubs" / "libcuda.so").write_text("")
    assert pb.libcuda_dir(root, tmp_path / "scratch") == root / "lib64" / "stubs"


def test_build_without_an_sdist_says_so(tmp_path, capsys):
    assert pb.build(tmp_path / "wheels", tmp_path / "site", tmp_path / "scratch") == 1
    assert "no pycuda sdist carried" in capsys.readouterr().out


def test_run_without_a_gpu_still_writes_the_json(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(GPU_CHECK), "run", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OPFUSE_CUDA_BINDING": "cuda-python"},
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((out / "gpu-check.json").read_text())
    assert result["graphs"] == {}
    assert result["pycuda"] == "no sdist carried: the cuda-python binding runs every check"
    (error,) = result["errors"]
    assert "cuda backend not available" in error or "CUDA driver call" in error
