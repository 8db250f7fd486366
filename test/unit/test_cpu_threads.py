"""Threads on the CPU backend (backends/cpu/threads.py): the tile loops of a program compiled
for N > 1 threads run as tasks of MLIR's async runtime; the results are the same bits as
on one thread (tiles are independent and each computes exactly what it computed before),
and both match numpy float64. The thread count: compile(threads=), else
OPFUSE_CPU_THREADS, else every usable core."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import opfuse
from opfuse.backends.cpu import lower as cpu_codegen
from opfuse.backends.cpu import threads as cpu_threads
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graphs import example_inputs, graphs
from opfuse.ir import parse_module
from opfuse.runtime.cpu import CpuProgram

SMALL = graphs(scale=16)


def test_thread_count_resolution(monkeypatch):
    monkeypatch.delenv("OPFUSE_CPU_THREADS", raising=False)
    cores = cpu_threads.usable_cores()
    assert cpu_threads.resolve_threads() == cores
    assert cpu_threads.resolve_threads(0) == cores
    assert cpu_threads.resolve_threads(3) == 3
    monkeypatch.setenv("OPFUSE_CPU_THREADS", "1")
    assert cpu_threads.resolve_threads() == 1
    assert cpu_threads.resolve_threads(2) == 2  # the caller's choice wins
    monkeypatch.setenv("OPFUSE_CPU_THREADS", "0")
    assert cpu_threads.resolve_threads() == cores
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv("OPFUSE_CPU_THREADS", bad)
        with pytest.raises(OpfuseError, match="OPFUSE_CPU_THREADS"):
            cpu_threads.resolve_threads()
    for bad in (-1, 1.5, True):
        with pytest.raises(OpfuseError, match="threads must be"):
            cpu_threads.resolve_threads(bad)


@pytest.fixture
def every_loop_parallel(monkeypatch):
    """These graphs are small (scale 16): without this, cpu_grain keeps them on one thread."""
    monkeypatch.setenv("OPFUSE_CPU_PARALLEL_MIN_US", "0")


def test_threads_lower_to_the_async_runtime(every_loop_parallel):
    module = parse_module(opfuse.compile(SMALL["g3_softmax"], backend="cpu").ir("fused"))
    one = cpu_codegen.lower_to_llvm(module, threads=1)
    two = cpu_codegen.lower_to_llvm(module, threads=2)
    assert cpu_codegen.compiled_threads(one) == 1 and cpu_codegen.compiled_threads(two) == 2
    assert "mlirAsyncRuntime" not in str(one)
    text = str(two)
    # tasks handed to the runtime, and the caller waiting for the group of them
    assert "llvm.call @mlirAsyncRuntimeExecute" in text
    assert "llvm.call @mlirAsyncRuntimeAwaitAllInGroup(" in text


@pytest.mark.parametrize("name", ["g1_mlp", "g3_softmax", "g6_encoder_layer", "g7_rmsnorm_swiglu"])
def test_threaded_results_are_the_single_threaded_bits(name, every_loop_parallel):
    g = SMALL[name]
    arrays = list(example_inputs(g).values())
    fused = opfuse.compile(g, backend="cpu", threads=1)
    module = parse_module(fused.ir("fused"))
    single = fused(*arrays)
    threaded = cpu_codegen.jit(module, threads=2)
    assert threaded.threads == 2
    for out, want, ref in zip(threaded(*arrays), [single], g.reference(*arrays)):
        np.testing.assert_array_equal(out, want)
        scale = max(1.0, float(np.max(np.abs(ref))))
        assert float(np.max(np.abs(out.astype(np.float64) - ref))) <= 1e-5 * scale


def test_compile_records_threads_and_programs_outlive_each_other(every_loop_parallel):
    """Freeing one threaded program must not take the runtime's thread pool from another
    (the runtime is loaded once into the process, not per ExecutionEngine)."""
    g = SMALL["g2_elementwise_chain"]
    arrays = list(example_inputs(g).values())
    want = g.reference(*arrays)[0]
    first = opfuse.compile(g, backend="cpu", threads=2)
    second = opfuse.compile(g, backend="cpu", threads=2)
    assert first.threads == 2
    np.testing.assert_allclose(first(*arrays), want, atol=1e-6)
    del first
    gc.collect()
    np.testing.assert_allclose(second(*arrays), want, atol=1e-6)
