"""ptxas: assemble PTX to a cubin and read its resource usage (``ptxas -v``).

ptxas is looked for on PATH, in ``/usr/local/cuda/bin``, and in the ``nvidia-cuda-nvcc``
wheel (``pip install 'opfuse[ptxas]'``: ``nvidia/cu13/bin/ptxas``). Without it, kernels
are still emitted as PTX (the driver JIT-compiles PTX on a GPU); with it every kernel is
assembled at compile time and its registers, spills and shared memory are reported.

A failure raises :class:`OpfuseError` with the exact command line (the PTX is kept on disk
for it) and ptxas's log.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from .... import tempdirs
from ....errors import EXIT_INTERNAL_ERROR, OpfuseError

_WHEEL_DIRS = ("cu13/bin", "cu12/bin", "cuda_nvcc/bin")


def find_ptxas() -> str | None:
    """The ptxas to use, or None."""
    found = shutil.which("ptxas")
    if found:
        return found
    cuda = Path("/usr/local/cuda/bin/ptxas")
    if cuda.is_file() and os.access(cuda, os.X_OK):
        return str(cuda)
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in _WHEEL_DIRS:
            p = Path(root) / sub / "ptxas"
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


@functools.lru_cache(maxsize=8)
def version(ptxas: str) -> str:
    """``ptxas --version``'s release line (part of cache keys)."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise OpfuseError(f"cannot run {ptxas} --version: {e}") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown"


@dataclass(frozen=True)
class Resources:
    """``ptxas -v`` figures for one kernel entry.

    Attributes:
        arch: the chip (``sm_90``).
        registers: registers per thread.
        spill_stores, spill_loads: bytes spilled to local memory.
        stack: stack frame bytes.
        smem: static shared memory bytes.
        cmem: constant bank 0 bytes (kernel parameters).
    """

    arch: str
    registers: int
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0
    cmem: int = 0

    def to_json(self) -> dict:
        return asdict(self)


_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_verbose(log: str, arch: str) -> dict[str, Resources]:
    """Resources per entry from ``ptxas -v`` output."""
    out: dict[str, Resources] = {}
    current = None
    frame = (0, 0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            frame = (0, 0, 0)
            continue
        m = _SPILL.search(line)
        if m and current:
            frame = tuple(int(x) for x in m.groups())  # type: ignore[assignment]
            continue
        m = _USED.search(line)
        if m and current:
            smem = _SMEM.search(line)
            cmem = _CMEM.search(line)
            out[current] = Resources(
                arch,
                int(m.group(1)),
                frame[1],
                frame[2],
                frame[0],
                int(smem.group(1)) if smem else 0,
                int(cmem.group(1)) if cmem else 0,
            )
    return out


def assemble(
    ptx: str,
    arch: str,
    *,
    ptxas: str | None = None,
    name: str = "kernel",
    options: tuple[str, ...] = ("-O3",),
) -> tuple[bytes, dict[str, Resources]]:
    """Assemble ``ptx`` for ``arch``; returns the cubin and the resources per entry.

    Raises:
        OpfuseError: no ptxas, or ptxas rejected the PTX (command line and log included;
            the PTX file is kept for the command).
    """
    exe = ptxas or find_ptxas()
    if exe is None:
        raise OpfuseError(
            "ptxas not found (PATH, /usr/local/cuda/bin, or " "pip install 'opfuse[ptxas]')"
        )
    folder = tempdirs.new_folder("ptxas")
    src = folder / f"{_safe(name)}.{arch}.ptx"
    dst = folder / f"{_safe(name)}.{arch}.cubin"
    src.write_text(ptx)
    cmd = [exe, f"-arch={arch}", "-v", *options, str(src), "-o", str(dst)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise OpfuseError(
            f"cannot run ptxas: {e}\n  command: {shlex.join(cmd)}", exit_code=EXIT_INTERNAL_ERROR
        ) from None
    log = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or not dst.is_file():
        raise OpfuseError(
            f"ptxas failed for kernel {name} ({arch}), exit code {proc.returncode}",
            diagnostics=[f"error: ptxas: {ln}" for ln in log.splitlines()[:40]]
            + [f"note: command: {shlex.join(cmd)}"],
            exit_code=EXIT_INTERNAL_ERROR,
        )
    cubin = dst.read_bytes()
    shutil.rmtree(folder, ignore_errors=True)
    return cubin, parse_verbose(log, arch)


def with_register_limit(ptx: str, entry: str, registers: int) -> str | None:
    """``ptx`` with ``.maxnreg registers`` on kernel ``entry`` (before its body), or None
    when it has a limit already or no such entry.

    Without a limit ptxas sizes a kernel for an occupancy it picks from ``.maxntid`` and
    may spill to reach it (a 32-thread column kernel held to 72 registers with 56 bytes
    of spills, where it needs 119); with one, it takes what the kernel needs up to it."""
    lines = ptx.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if line.lstrip().startswith((".visible .entry", ".entry"))
                  and f" {entry}(" in line), None)
    if start is None:
        return None
    for i in range(start, len(lines)):
        text = lines[i].strip()
        if text.startswith(".maxnreg"):
            return None
        if text == "{":
            return "".join(lines[:i] + [f".maxnreg {registers}\n"] + lines[i:])
    return None


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name) or "kernel"
