"""Every environment variable opfuse reads, declared once (docs/knobs.md lists them).

Nothing else in the package reads ``os.environ``: code asks the variable declared here,
at the moment it needs the value (``DUMP_DIR.get()``), so tests and tools that set the
environment after import still see the change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_DECLARED: list[EnvVar] = []


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, what it does, and its default.

    Attributes:
        name: the variable, e.g. ``OPFUSE_DUMP_DIR``.
        doc: one line for ``--help`` and the docs.
        default: the value when the variable is unset or empty.
    """

    name: str
    doc: str
    default: str | None = None

    def get(self) -> str | None:
        """The value now (an empty value counts as unset)."""
        return os.environ.get(self.name) or self.default

    def path(self) -> Path | None:
        """The value as a path with ``~`` expanded, or None."""
        value = self.get()
        return Path(value).expanduser() if value else None

    def flag(self) -> bool:
        """The value as a switch: set and not one of ``0``, ``false``, ``no``, ``off``."""
        value = (self.get() or "").strip().lower()
        return value not in ("", "0", "false", "no", "off")


def env(name: str, doc: str, default: str | None = None) -> EnvVar:
    """Declare an environment variable (module level only, so the list stays complete)."""
    var = EnvVar(name, doc, default)
    _DECLARED.append(var)
    return var


def declared() -> list[EnvVar]:
    """Every variable declared here, in declaration order."""
    return list(_DECLARED)


DUMP_DIR = env(
    "OPFUSE_DUMP_DIR",
    "default for --dump-dir: write each stage's IR, the pipeline and the ledger there",
)
CACHE_DIR = env(
    "OPFUSE_CACHE_DIR",
    "on-disk kernel cache",
    default="~/.cache/opfuse",
)
DEBUG = env(
    "OPFUSE_DEBUG",
    "print Python tracebacks for internal errors (tools print one line otherwise)",
)
CUDA_BINDING = env(
    "OPFUSE_CUDA_BINDING",
    "CUDA driver binding of the cuda backend: pycuda or cuda-python (default: PyCUDA when "
    "it imports, else cuda-python)",
)
MATMUL_ROWS = env(
    "OPFUSE_MATMUL_ROWS",
    "rows of C per thread in GPU matmul kernels: 4 (default) or 8 (a tuning knob)",
)
MATMUL = env(
    "OPFUSE_MATMUL",
    "GPU matmul kernels: auto (tensor cores for f16/bf16, and for f32 with TF32 allowed), "
    "mma, wgmma (sm_90a targets), simt, or per kernel: fusion_3_output=simt,auto",
)
ALLOW_TF32 = env(
    "OPFUSE_ALLOW_TF32",
    "let f32 GPU matmuls use TF32 tensor cores (off by default, like PyTorch's allow_tf32)",
)
PROGRESS = env(
    "OPFUSE_PROGRESS",
    "1: fuse-opt and fuse-run print a line per compile stage on stderr once a compile has "
    "run over a second; 0: never (default: only when stderr is a terminal)",
)
MAX_TENSOR_BYTES = env(
    "OPFUSE_MAX_TENSOR_BYTES",
    "the input contract refuses any tensor (argument, result, intermediate) larger than "
    "this: bytes, or with a unit (16GiB, 512MiB); --max-tensor-bytes, "
    "opfuse.compile(max_tensor_bytes=)",
    default="16GiB",
)
CPU = env(
    "OPFUSE_CPU",
    "the CPU the CPU backend tunes for, an LLVM -mcpu name (sapphirerapids, znver4, "
    "x86-64-v3, ...): LLVM's tuning and the vector width (at most the host's); the "
    "instruction set stays the host's (default: the host)",
)
CPU_THREADS = env(
    "OPFUSE_CPU_THREADS",
    "threads of the CPU backend's parallel tile loops (0 or unset: every usable core; 1: "
    "single-threaded code that needs no runtime library); opfuse.compile(threads=), "
    "fuse-run --threads",
)
CPU_PARALLEL_MIN_US = env(
    "OPFUSE_CPU_PARALLEL_MIN_US",
    "a kernel whose estimated one-thread time is under this many microseconds keeps its "
    "tile loop on the calling thread even when the program has more than one (handing "
    "work to the async runtime's workers cost 50-200 us per loop on the 2-vCPU machines "
    "measured: backends/cpu/grain.py); 0 parallelizes every tile loop",
    default="800",
)
TORCH_SHAPE_SECONDS = env(
    "OPFUSE_TORCH_SHAPE_SECONDS",
    "torch.compile: a graph Dynamo traced with symbolic sizes is compiled again at each new "
    "shape until its compiles have taken this many seconds (or 8 shapes); new shapes then "
    "run eagerly, named by one FallbackWarning (a generate() loop's cache grows every "
    "token: compiling each step costs more than it saves)",
    default="15",
)
TEMP_DIR = env(
    "OPFUSE_TEMP_DIR",
    "root of opfuse's temporary folders (reproducers of internal errors, libraries "
    "extracted from bundles, ptxas work); the oldest are pruned (default: "
    "<system temp>/opfuse-<user>)",
)
CHECK_ANALYSES = env(
    "OPFUSE_CHECK_ANALYSES",
    "check every analysis a pass reuses from an earlier pass of the pipeline run (the "
    "function graphs) against a fresh build, and fail with an internal error where they "
    "differ; the tests set it",
)
RANDOM_PROGRAMS = env(
    "OPFUSE_RANDOM_PROGRAMS",
    "how many random linalg programs test/unit/test_random_linalg.py checks against numpy "
    "(seeds 0..N-1; 150 in CI, 1500 for the full run)",
    default="150",
)


def knobs_markdown() -> str:
    """docs/knobs.md: every variable above, generated so the page cannot drift
    (``python -m opfuse.config > docs/knobs.md``; test_knobs_doc.py checks it)."""
    lines = [
        "# Knobs",
        "",
        "Every environment variable opfuse reads, generated from `python/opfuse/config.py`",
        "(`python -m opfuse.config > docs/knobs.md`). An empty value counts as unset.",
        "",
        "| variable | default | what it does |",
        "| --- | --- | --- |",
    ]
    for var in _DECLARED:
        default = f"`{var.default}`" if var.default else ""
        lines.append(f"| `{var.name}` | {default} | {var.doc.replace('|', '&#124;')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(knobs_markdown(), end="")
