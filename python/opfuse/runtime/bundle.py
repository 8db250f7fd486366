"""AOT bundles: a compiled program in one file, runnable without the compiler.

``fuse-opt --emit=bundle -o g.opfuse`` (or :func:`opfuse.backends.gpu.bundle.write`) stores a
zip archive::

    manifest.json            entry, signature, host schedule, kernel specs, provenance
    kernels/<k>.<chip>.ptx   PTX per kernel and chip
    kernels/<k>.<chip>.cubin ptxas output, when ptxas was there at build time
    cpu/program.so           the kernels compiled for the build machine's CPU (libc+libm only)
    consts/<id>.npy          data constants of the host schedule

This module reads and runs bundles with numpy and the standard library only (and PyCUDA
for ``backend="cuda"``): it never imports ``mlir``. The CPU path runs the same host
schedule as the GPU path, each kernel a function of ``cpu/program.so``.

    b = load("g.opfuse")
    out = b.program("cpu")(x, w)          # or "cuda" on a GPU machine
"""

from __future__ import annotations

import io
import json
import os
import platform
import tempfile
import time as _time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import tempdirs
from ..errors import OpfuseError
from .schedule import HostSchedule, KernelSpec

FORMAT = "opfuse-bundle"
VERSION = 1
BACKENDS = ("cpu", "cuda")


def host_platform() -> str:
    return f"{platform.system().lower()}-{platform.machine().lower()}"


@dataclass
class Bundle:
    """A loaded bundle.

    Attributes:
        manifest: the parsed ``manifest.json``.
        schedule: the host schedule (constants loaded).
        kernels: kernel specs with PTX and cubins per chip.
        path: where it was loaded from.
    """

    manifest: dict[str, Any]
    schedule: HostSchedule
    kernels: dict[str, KernelSpec]
    path: Path | None = None
    _files: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def entry(self) -> str:
        return self.schedule.entry

    @property
    def targets(self) -> list[str]:
        return list(self.manifest.get("targets", []))

    def program(self, backend: str = "cpu", *, chip: str | None = None) -> "BundleProgram":
        """A callable running the bundle on ``backend`` (``cpu`` or ``cuda``)."""
        if backend == "cpu":
            cpu = self.manifest.get("cpu")
            if not cpu:
                why = self.manifest.get("cpu_missing", "built with cpu=False")
                raise OpfuseError(f"this bundle has no CPU library ({why})")
            if cpu.get("platform") != host_platform():
                raise OpfuseError(
                    f"the bundle's CPU library is for {cpu.get('platform')}, "
                    f"this machine is {host_platform()}"
                )
            from .native import NativeProgram

            lib = self._extract(cpu["library"])
            impl = NativeProgram(lib, self.schedule, cpu.get("symbols"))
        elif backend == "cuda":
            from . import cuda

            impl = cuda.CudaProgram(self.schedule, self.kernels, chip=chip)
        else:
            raise OpfuseError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
        return BundleProgram(self.schedule, impl, backend)

    def _extract(self, name: str) -> Path:
        folder = tempdirs.new_folder("bundle")
        path = folder / Path(name).name
        path.write_bytes(self._files[name])
        return path


class BundleProgram:
    """A bundle bound to a backend: call it with numpy arrays, like an Executable."""

    def __init__(self, schedule: HostSchedule, impl: Any, backend: str):
        self.schedule = schedule
        self.backend = backend
        self._impl = impl

    def __call__(self, *inputs: np.ndarray):
        from .native import check_inputs

        outs = self._impl(*check_inputs(self.schedule, inputs))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def bind(self, *inputs: np.ndarray) -> Callable[[], list[np.ndarray]]:
        from .native import check_inputs

        return self._impl.bind(*check_inputs(self.schedule, inputs))

    def time(self, *inputs: np.ndarray, repeat: int = 10, warmup: int = 2) -> list[float]:
        """Seconds per call (host wall clock; the cuda program synchronizes each call)."""
        if hasattr(self._impl, "time"):
            from .native import check_inputs

            return self._impl.time(
                *check_inputs(self.schedule, inputs), repeat=repeat, warmup=warmup
            )
        run = self.bind(*inputs)
        for _ in range(warmup):
            run()
        out: list[float] = []
        for _ in range(repeat):
            t0 = _time.perf_counter()
            run()
            out.append(_time.perf_counter() - t0)
        return out

    def kernel_times(self, *inputs: np.ndarray, repeat: int = 10) -> list[tuple[str, float]]:
        """(kernel, seconds) per kernel call, each launched alone (the cuda backend only:
        CUDA events time one launch; host timers cannot)."""
        if not hasattr(self._impl, "kernel_times"):
            raise OpfuseError(f"per-kernel times need the cuda backend, not {self.backend}")
        from .native import check_inputs

        return self._impl.kernel_times(*check_inputs(self.schedule, inputs), repeat=repeat)


def write(path: str | os.PathLike, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Write a bundle atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    manifest = {"format": FORMAT, "version": VERSION, **manifest}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        for name, data in sorted(files.items()):
            z.writestr(name, data)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)
    except OSError as e:
        raise OpfuseError(f"cannot write {path}: {e.strerror or e}") from None


def load(path: str | os.PathLike) -> Bundle:
    """Read a bundle (everything in memory; the CPU library is extracted when used)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            files = {n: z.read(n) for n in z.namelist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise OpfuseError(f"cannot read bundle {path}: {e}") from None
    try:
        manifest = json.loads(files.pop("manifest.json"))
    except (KeyError, ValueError) as e:
        raise OpfuseError(f"{path} is not an opfuse bundle (no manifest: {e})") from None
    if manifest.get("format") != FORMAT:
        raise OpfuseError(f"{path} is not an opfuse bundle")
    if manifest.get("version") != VERSION:
        raise OpfuseError(
            f"{path}: bundle version {manifest.get('version')}, this opfuse reads {VERSION}"
        )
    consts = {}
    for bid, name in manifest.get("consts", {}).items():
        consts[int(bid)] = np.load(io.BytesIO(files[name]), allow_pickle=False)
    schedule = HostSchedule.from_json(manifest["schedule"], consts)
    kernels = {}
    for name, k in manifest.get("kernels", {}).items():
        spec = KernelSpec.from_json(k)
        spec.ptx = {chip: files[f].decode() for chip, f in k.get("ptx_files", {}).items()}
        spec.cubin = {chip: files[f] for chip, f in k.get("cubin_files", {}).items()}
        kernels[name] = spec
    return Bundle(manifest, schedule, kernels, path, files)


def random_inputs(bundle: Bundle, seed: int = 0) -> list[np.ndarray]:
    """Uniform [-1, 1) inputs of the bundle's signature (integers in [-8, 8))."""
    rng = np.random.default_rng(seed)
    out = []
    for b in bundle.schedule.inputs:
        spec = bundle.schedule.buffers[b]
        if np.issubdtype(spec.dtype, np.floating):
            out.append(rng.uniform(-1.0, 1.0, spec.shape).astype(spec.dtype))
        elif spec.element_type == "bf16":
            f = rng.uniform(-1.0, 1.0, spec.shape).astype(np.float32)
            out.append((f.view(np.uint32) >> 16).astype(np.uint16))
        else:
            out.append(rng.integers(-8, 8, spec.shape, dtype=spec.dtype))
    return out


def check(
    bundle: Bundle,
    backend: str,
    inputs: list[np.ndarray] | None = None,
    *,
    repeat: int = 10,
    seed: int = 0,
    rtol: float = 1e-3,
    atol: float = 1e-4,
) -> dict[str, Any]:
    """Run ``bundle`` on ``backend``, compare with its CPU library, time both.

    Returns a JSON-able dict: backend, per-output max abs error and pass/fail, and
    seconds per run (min, median) for the backend and the CPU library (CUDA events on
    the GPU; wall clock on the CPU).
    """
    args = inputs if inputs is not None else random_inputs(bundle, seed)
    program = bundle.program(backend)
    got = program(*args)
    got = list(got) if isinstance(got, tuple) else [got]
    result: dict[str, Any] = {
        "entry": bundle.entry,
        "backend": backend,
        "kernels": len(bundle.kernels),
    }
    if backend != "cpu":
        ref = bundle.program("cpu")(*args)
        ref = list(ref) if isinstance(ref, tuple) else [ref]
        outs = []
        for g, r in zip(got, ref):
            err = np.abs(g.astype(np.float64) - r.astype(np.float64))
            ok = bool(np.all(err <= atol + rtol * np.abs(r.astype(np.float64))))
            outs.append({"max_abs_err": float(err.max()) if err.size else 0.0, "ok": ok})
        result["outputs"] = outs
        result["ok"] = all(o["ok"] for o in outs)
    if repeat > 0:
        for name, prog in ((backend, program),) + (
            (("cpu", bundle.program("cpu")),) if backend != "cpu" else ()
        ):
            t = sorted(prog.time(*args, repeat=repeat, warmup=1))
            result[f"time_{name}_s"] = {"min": t[0], "median": t[len(t) // 2]}
    return result
