"""The attention kernel (opfuse-fuse-attention, backends/gpu/emit/attention.py, backends/cpu/attention.py).

Property tests over the issue's shapes — sequence lengths 1, 3, 127, 129, 512; 1-8 heads;
head dims 32, 64, 80, 128; causal or not; masked (boolean, additive float) or not;
grouped-query ratios 1, 2, 4; f32, f16, bf16 — against a float64 reference with PyTorch
SDPA's semantics (attention_cases.py), on the GPU emulator (race check on) and on the CPU
backend. CI runs a fixed subset that covers every value of every axis; ``--runslow`` runs
the whole cross product (thousands of cases: a benchmark-sized job).

Plus what the kernels must not do: the fused G5 kernel's PTX stores only O (no S-sized
buffer), the CPU's attention function allocates nothing quadratic, ptxas assembles every
tile with 0 spills, and the report's bytes for G5 drop by Q_S.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
from mlir import ir

import opfuse
from opfuse import pipeline as pl
from opfuse.testing.emulator import emulate
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.cpu.attention import lower_attention_kernels
from opfuse.backends.gpu.compiler import compile_module
from opfuse.frontends.builder.graphs import graphs
from opfuse.ir import parse_module

from attention_cases import Case, assert_matches, device_args, graph, inputs, mask_branches

HAVE_PTXAS = ptxas.find_ptxas() is not None

# Always fuse attention here (delta -1): with one query or key the guard may keep the
# three kernels (S is tiny), and these tests are about the attention kernel.
ALWAYS = pl.Pipeline.parse(
    "builtin.module("
    + ",".join(n if n != "opfuse-fuse-attention" else f"{n}{{delta=-1.0}}" for n in pl.DEFAULT_PIPELINE)
    + ")"
)

SEQS = (1, 3, 127, 129, 512)
HEADS = (1, 2, 4, 8)
HEAD_DIMS = (32, 64, 80, 128)
GQA = (1, 2, 4)
DTYPES = ("f32", "f16", "bf16")
MASKS = (None, "bool", "float")


def _sweep() -> list[Case]:
    out = []
    for seq, heads, d, ratio, dtype, causal, mask in itertools.product(
        SEQS, HEADS, HEAD_DIMS, GQA, DTYPES, (False, True), MASKS
    ):
        if heads % ratio:
            continue
        out.append(Case(1, heads, heads // ratio, seq, 0, d, 0, dtype, causal, mask))
    return out


def _ci_subset() -> list[Case]:
    """Every value of every axis at least once, on cheap shapes (the emulator runs every
    thread of the grid): corners first, then a seeded sample of small cases."""
    corners = [
        Case(queries=1, head_dim=32),
        Case(queries=1, keys=77, head_dim=64, causal=True),  # one decode step
        Case(queries=3, head_dim=64, causal=True),
        Case(queries=127, keys=129, head_dim=32, mask="bool"),
        Case(queries=129, head_dim=32, causal=True, dtype="f16"),
        Case(heads=1, queries=512, head_dim=32, causal=True),
        Case(heads=8, kv_heads=2, queries=3, head_dim=32),
        Case(heads=4, kv_heads=1, queries=33, head_dim=80, mask="float"),
        Case(heads=2, kv_heads=1, queries=20, head_dim=128, dtype="bf16", causal=True),
        Case(queries=40, keys=70, head_dim=64, dtype="bf16", mask="bool"),
        Case(queries=6, keys=10, head_dim=32, causal=True, mask="float", dtype="f16"),
    ]
    small = [c for c in _sweep() if c.queries <= 3 and c.heads <= 4]
    return corners + random.Random(11).sample(small, 6)


CI_CASES = _ci_subset()
SLOW_CASES = [c for c in _sweep() if c not in CI_CASES]


def _compiled(c: Case):
    g = graph(c)
    exe = opfuse.compile(g, backend="cpu", pipeline=ALWAYS)
    kinds = [k["kind"] for k in exe.report["kernels"]]
    if c.n == 1:
        # One key: the unit-dim fold (first in the pipeline) turns the softmax's row max
        # and sum over that key into pointwise ops, so no softmax is left to recognize
        # (and none is needed: S has one element per row). Numerics are still checked.
        assert "attention" not in kinds, exe.report["kernels"]
    else:
        assert kinds == ["attention"], exe.report["kernels"]
    return g, exe


def _check(c: Case, backend: str) -> None:
    g, exe = _compiled(c)
    args = inputs(g, c)
    if backend == "cpu":
        out = exe(*device_args(c, args))
    else:
        # the SIMT kernel (f16/bf16 default to tensor cores: test_attention_mma.py)
        program = compile_module(exe._source, lower=False, matmul="simt")
        if c.n > 1:
            assert [k.emitter for k in program.kernels.values()] == ["attention"]
        (out,) = emulate.run_program(program, device_args(c, args))
    assert_matches(c, out, args)


@pytest.mark.parametrize("backend", ["emulator", "cpu"])
@pytest.mark.parametrize("case", CI_CASES, ids=str)
def test_attention_matches_float64_sdpa(case, backend):
    _check(case, backend)


@pytest.mark.parametrize("case", [
    Case(heads=2, queries=128, keys=128, head_dim=32, causal=True),
    Case(heads=2, queries=129, keys=129, head_dim=64, causal=True),
    Case(heads=1, queries=100, keys=130, head_dim=32, causal=True, mask="float"),
    Case(heads=2, queries=70, head_dim=64, dtype="bf16", causal=True),
], ids=str)
def test_simt_tiles_below_the_diagonal_skip_the_causal_mask(case):
    """As the tensor-core kernel (test_attention_mma.py): the thread's scores of a tile
    below the causal diagonal are evaluated without the mask (no compare, no select),
    the other tiles' with it; numerics = float64 with key tails."""
    g, exe = _compiled(case)
    program = compile_module(exe._source, lower=False, matmul="simt")
    (k,) = program.kernels.values()
    assert k.emitter == "attention" and k.meta["causal"] == 0
    (branches,) = mask_branches(program)
    below, other = branches
    scores = below["arith.mulf"]  # the scale, once per score, in both
    assert scores == other["arith.mulf"] > 0
    assert other["arith.select"] - below["arith.select"] == scores
    assert other["arith.cmpi"] - below["arith.cmpi"] == scores
    if case.mask is None and case.n % k.meta["tile"][1] == 0:
        assert below["arith.cmpi"] == below["arith.select"] == 0
    args = inputs(g, case)
    (out,) = emulate.run_program(program, device_args(case, args))
    assert_matches(case, out, args)


def pytest_generate_tests(metafunc):
    # the sweep's cases exist only with --runslow: thousands of skipped ids otherwise
    if metafunc.function.__name__ == "test_attention_sweep":
        cases = SLOW_CASES if metafunc.config.getoption("--runslow") else []
        metafunc.parametrize("case", cases, ids=str)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["emulator", "cpu"])
def test_attention_sweep(case, backend):
    _check(case, backend)


def test_ci_subset_covers_every_axis():
    for values, get in ((SEQS, lambda c: c.queries), (HEADS, lambda c: c.heads),
                        (HEAD_DIMS, lambda c: c.head_dim), (GQA, lambda c: c.heads // c.kvh),
                        (DTYPES, lambda c: c.dtype), ((False, True), lambda c: c.causal),
                        (MASKS, lambda c: c.mask)):
        assert set(values) <= {get(c) for c in CI_CASES}


# --- what the kernels keep on chip ---------------------------------------------------------


@pytest.fixture(scope="module")
def g5_full():
    fused = opfuse.compile(graphs()["g5_attention"], backend="cpu").ir("fused")
    return compile_module(parse_module(fused), targets=("sm_90",), ptxas=False)


def _store_bases(ptx: str) -> set[str]:
    """The kernel parameters the addresses of its ``st.global`` instructions derive from
    (following mov/add/mad/cvta/shl chains back to ``ld.param``)."""
    defs: dict[str, list[str]] = {}
    params: dict[str, str] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*ld\.param\.\w+\s+(%\w+),\s*\[(\w+)\]", line)
        if m:
            params[m.group(1)] = m.group(2)
            continue
        m = re.match(r"\s*[\w.]+\s+(%\w+),\s*(.*);", line)
        if m:
            defs.setdefault(m.group(1), []).extend(re.findall(r"%\w+", m.group(2)))
    bases: set[str] = set()
    for line in ptx.splitlines():
        m = re.match(r"\s*st\.global[\w.]*\s+\[(%\w+)", line)
        if not m:
            continue
        stack, seen = [m.group(1)], set()
        while stack:
            r = stack.pop()
            if r in seen:
                continue
            seen.add(r)
            if r in params:
                bases.add(params[r])
            stack.extend(defs.get(r, []))
    return bases


def test_g5_kernel_stores_only_o(g5_full):
    """The fused G5 kernel writes O and nothing else: every global store's address comes
    from the output parameter, the stores per thread times the threads are O's size (an
    S-sized buffer is 8x that), and no parameter is S-sized."""
    (k,) = g5_full.kernels.values()
    assert k.emitter == "attention"
    b, h, t, d = 8, 8, 512, 64
    o_param = f"{k.entry}_param_{list(k.params).index(('result', 0))}"
    ptx = k.ptx["sm_90"]
    assert _store_bases(ptx) == {o_param}
    stores = re.findall(r"^\s*st\.global\.(?:v(\d)\.)?b32", ptx, re.M)
    per_thread = sum(int(v or 1) for v in stores)
    threads = k.threads_per_block * k.grid[0] * k.grid[1] * k.grid[2]
    assert per_thread * threads == b * h * t * d
    assert len(k.params) == 4  # Q, K, V, O: no S-sized buffer to write


def test_g5_report_bytes_drop_by_q_s():
    g = graphs()["g5_attention"]
    three = pl.Pipeline.default(disable=("opfuse-fuse-attention",))
    unfused_attention = opfuse.compile(g, backend="cpu", pipeline=three).report
    fused = opfuse.compile(g, backend="cpu").report
    assert unfused_attention["totals"]["after"]["kernels"] == 3
    (k,) = fused["kernels"]
    q_s = k["attention"]["q_s"]
    assert q_s == 4 * 64 * 512 * 512 * 4  # S and P: each written once and read once
    assert fused["totals"]["after"]["bytes"] == unfused_attention["totals"]["after"]["bytes"] - q_s
    assert k["attention"]["q_fused"] == k["bytes"] == 4 * 8 * 8 * 512 * 64 * 4  # Q K V O


def test_cpu_attention_function_allocates_no_scores():
    """The CPU's attention function is the tiled fast path (backends/cpu/attention_tiles.py):
    no linalg op left, no buffer as large as S — its score buffer holds one query tile's
    rows per thread — and the output O is allocated once."""
    from opfuse.backends.cpu import attention_tiles as tiles

    c = Case(heads=2, queries=128, head_dim=32)
    _, exe = _compiled(c)
    module = parse_module(exe.ir("fused"))
    assert lower_attention_kernels(module, threads=2) == 1
    (fn,) = [op.operation for op in module.body.operations
             if "fusion_" in ir.StringAttr(op.operation.attributes["sym_name"]).value]
    assert ir.StringAttr(fn.attributes["opfuse.cpu_attention"]).value == "tiles"
    sizes, names = [], set()

    def visit(op):
        names.add(op.name)
        if op.name in ("memref.alloc", "memref.alloca"):
            sizes.append(int(np.prod(ir.MemRefType(op.results[0].type).shape)))
        return ir.WalkResult.ADVANCE

    fn.walk(visit)
    assert not any(n.startswith("linalg.") for n in names)
    s_elems = c.heads * c.queries * c.n
    o_elems = c.heads * c.queries * c.dv
    assert o_elems in sizes and all(n < s_elems for n in sizes)
    bm = tiles.tiling(lower_plan(exe), 2).bm
    assert 2 * bm * c.n in sizes and bm < c.queries  # S: one tile of rows per thread


def lower_plan(exe):
    """The attention plan of ``exe``'s one attention kernel (as the CPU lowering sees it)."""
    from opfuse.backends.gpu.build.attention_plan import plan
    from opfuse.backends.gpu.build.group import prepare

    module = parse_module(exe.ir("fused"))
    (fn,) = [op.operation for op in module.body.operations
             if "fusion_" in ir.StringAttr(op.operation.attributes["sym_name"]).value]
    return plan(prepare(fn))


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128])
def test_tiles_assemble_without_spills(head_dim, dtype):
    c = Case(heads=2, queries=70, head_dim=head_dim, dtype=dtype, causal=True)
    _, exe = _compiled(c)
    program = compile_module(exe._source, targets=("sm_80", "sm_90"), ptxas=True)
    (k,) = program.kernels.values()
    for chip in ("sm_80", "sm_90"):
        res = k.resources[chip]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (chip, res)
        assert res["registers"] <= 255 and res["smem"] <= 48 * 1024, (chip, res)
