"""The host CPU the JIT compiles for: its vector width and the features opfuse's kernels
choose by.

MLIR's ExecutionEngine targets the host (LLVM's ``JITTargetMachineBuilder::detectHost``:
host CPU name and features), so LLVM's own vectorizer already uses the full width; the
kernels opfuse writes with explicit vectors (:mod:`opfuse.backends.cpu.matmul`) need the
width too. Read from ``/proc/cpuinfo`` on Linux (the same CPUID bits LLVM reads); any
other host is treated as 128-bit SIMD, a width every 64-bit CPU LLVM targets has.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class HostCpu:
    """What the code generator needs to know about the host.

    Attributes:
        vector_bits: widest SIMD register the JIT uses (512 with AVX-512F, 256 with AVX2,
            else 128).
        fma: fused multiply-add instructions (FMA3 on x86).
        features: the feature flags read (``avx512f``, ``avx512_bf16``, ...).
    """

    vector_bits: int
    fma: bool
    features: frozenset[str]

    def lanes(self, element_bits: int = 32) -> int:
        """Elements of ``element_bits`` per vector register."""
        return max(1, self.vector_bits // element_bits)

    def describe(self) -> str:
        isa = {512: "AVX-512", 256: "AVX2"}.get(self.vector_bits, f"{self.vector_bits}-bit SIMD")
        return f"{isa}, {self.lanes()} f32 lanes" + (", FMA" if self.fma else "")


def _flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@lru_cache(maxsize=1)
def host_cpu() -> HostCpu:
    """The host's :class:`HostCpu` (read once per process)."""
    flags = _flags() if platform.machine() in ("x86_64", "AMD64") else frozenset()
    if "avx512f" in flags:
        bits = 512
    elif "avx2" in flags:
        bits = 256
    else:
        bits = 128
    return HostCpu(vector_bits=bits, fma="fma" in flags, features=flags)
