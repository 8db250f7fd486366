"""gpu-check, there: PyCUDA built from the carried sdist in the background while the
checks run on cuda-python, then a few graphs run through it (tools/gpu/gpu_check.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu" / "gpu-check"
PYCUDA_CHECK_S = 60
PYCUDA_GRAPHS = ("g1_mlp.f32", "g2_elementwise_chain.f32", "g3_softmax.f32")
PYCUDA_SITE = Path("/tmp/opfuse-site")
PYCUDA_SCRATCH = Path("/tmp/opfuse-pycuda")
PYCUDA_LOG = "/tmp/opfuse-pycuda-build.log"


def start_pycuda_build(folder: Path, result: dict):
    """Start building PyCUDA from the carried sdist in the background (tools/gpu/pycuda_build.py,
    about a minute of one core) and run the main checks on the image's cuda-python binding
    meanwhile; None when PyCUDA imports already or no sdist was carried."""
    if importlib.util.find_spec("pycuda") is not None:
        result["pycuda"] = "already installed"
        return None
    wheels = folder / "wheels"
    if not sorted(wheels.glob("pycuda-*.tar.gz")):
        result["pycuda"] = "no sdist carried: the cuda-python binding runs every check"
        return None
    os.environ["OPFUSE_CUDA_BINDING"] = "cuda-python"
    log = open(PYCUDA_LOG, "w")  # noqa: SIM115  (the child writes it until it exits)
    cmd = [sys.executable, str(ROOT / "tools" / "gpu" / "pycuda_build.py"), "build", str(wheels)]
    proc = subprocess.Popen(cmd + [str(PYCUDA_SITE), str(PYCUDA_SCRATCH)], stdout=log,
                            stderr=subprocess.STDOUT)
    proc.started = time.time()  # type: ignore[attr-defined]
    result["pycuda"] = "built in the background; checked on a few graphs after the main run"
    return proc


def finish_pycuda(proc, folder: Path, clock) -> dict:
    """Wait for the PyCUDA build (as long as the budget allows), then run a few graphs
    through PyCUDA in a child run; what it saw, for the JSON."""
    out: dict = {}
    try:
        rc = proc.wait(timeout=max(1.0, clock.left() - PYCUDA_CHECK_S))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    out["build_s"] = round(time.time() - proc.started, 1)
    log = Path(PYCUDA_LOG).read_text(errors="replace") if Path(PYCUDA_LOG).exists() else ""
    if rc != 0:
        out["built"] = False
        out["why"] = "build still running: stopped" if rc is None else f"build exit {rc}"
        out["log_tail"] = log[-2000:]
        return out
    out["built"] = True
    budget = int(clock.left() - 10)
    if budget < 30:
        out["checked"] = "no time left for the PyCUDA run"
        return out
    env = dict(os.environ, OPFUSE_CUDA_BINDING="pycuda")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYCUDA_SITE), env.get("PYTHONPATH")) if p)
    sub_out = PYCUDA_SCRATCH / "out"
    cmd = [sys.executable, str(SCRIPT), "run", str(folder), "--no-pycuda", "--only",
           ",".join(PYCUDA_GRAPHS), "--out", str(sub_out), "--budget", str(budget)]
    try:
        sub = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget + 20)
        out["exit"] = sub.returncode
        out["output_tail"] = (sub.stdout + sub.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        out["exit"] = "timed out"
    report = sub_out / "gpu-check.json"
    if report.exists():
        data = json.loads(report.read_text())
        out["binding"] = data.get("binding")
        keep = ("correct", "fused_vs_unfused", "program", "error", "not_run")
        out["graphs"] = {n: {k: e[k] for k in keep if k in e} for n, e in data.get("graphs", {}).items()}
    return out


