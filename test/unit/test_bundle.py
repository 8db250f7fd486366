"""AOT bundles, the host schedule and buffer plan, and the kernel cache.

The bundle of every G-graph (1/8 size) is run on the CPU backend by a fresh Python
process that never imports ``mlir`` (it asserts so) and must match the direct run of the
same fused program through the ExecutionEngine (same kernels compiled ahead of time by
llc instead of JIT: the results are expected bit for bit; the check allows 1e-6 relative).
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from opfuse.builder import Graph
from opfuse.backends.gpu.lower import ptxas
from opfuse.backends.gpu.compiler import compile_module
from opfuse.errors import OpfuseError
from opfuse.frontends.builder.graphs import graphs
from opfuse.runtime import bundle as rb
from opfuse.runtime.cache import KernelCache, make_key
from opfuse.runtime.schedule import Buffer, Call, HostSchedule, View, plan_buffers

from test_codegen_common import as_tuple, compile_cpu, inputs_of, run_bundle_without_mlir

G_NAMES = list(graphs(small=True))

# f16 (regression, issue #10): its CPU library failed at mlir-translate (the half-float
# extension's `fastmath<contract>` reached llvm.fpext/fptrunc as an #arith attribute)
@pytest.mark.parametrize("name, dtype", [(n, "f32") for n in G_NAMES] + [("g1_mlp", "f16")])
def test_bundle_runs_on_cpu_without_mlir_and_matches_direct_run(name, dtype, tmp_path):
    graph = graphs(small=True, dtype=dtype)[name]
    exe = compile_cpu(graph)
    args = inputs_of(graph)
    want = as_tuple(exe(*args))
    path = exe.save_bundle(tmp_path / f"{name}.opfuse")
    got = run_bundle_without_mlir(path, args, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0)


def test_bundle_contents(tmp_path):
    exe = compile_cpu(graphs(small=True)["g1_mlp"])
    path = exe.save_bundle(tmp_path / "g1.opfuse")
    names = zipfile.ZipFile(path).namelist()
    assert "manifest.json" in names and "cpu/program.so" in names
    b = rb.load(path)
    assert b.entry == "g1_mlp" and b.targets == ["sm_80", "sm_90"]
    assert len(b.kernels) == 2 and [type(s).__name__ for s in b.schedule.steps] == ["Call", "Call"]
    for k in b.kernels.values():
        assert set(k.ptx) == {"sm_80", "sm_90"} and ".entry " + k.entry in k.ptx["sm_90"]
        if ptxas.find_ptxas():
            assert set(k.cubin) == {"sm_80", "sm_90"}
            assert k.resources["sm_90"]["spill_stores"] == 0
    assert b.manifest["signature"]["inputs"][0] == [[256, 32], "f32"]
    assert b.manifest["report"]["totals"]["after"]["kernels"] == 2


def test_bundle_errors(tmp_path):
    bad = tmp_path / "bad.opfuse"
    bad.write_text("not a zip")
    with pytest.raises(OpfuseError, match="cannot read bundle"):
        rb.load(bad)
    exe = compile_cpu(graphs(small=True)["g2_elementwise_chain"])
    b = rb.load(exe.save_bundle(tmp_path / "g2.opfuse"))
    with pytest.raises(OpfuseError, match="unknown backend"):
        b.program("tpu")
    prog = b.program("cpu")
    with pytest.raises(OpfuseError, match="input #0"):
        prog(
            np.zeros((3, 3), np.float32), *inputs_of(graphs(small=True)["g2_elementwise_chain"])[1:]
        )


def _schedule() -> HostSchedule:
    f32 = "f32"
    bufs = [Buffer(0, (64,), f32, "input", 0)] + [
        Buffer(i, (64,), f32, "temp") for i in range(1, 6)
    ]
    bufs.append(Buffer(6, (8, 8), f32, "temp"))
    steps = [
        Call("a", (0,), (1,)),
        Call("b", (1,), (2,)),
        Call("c", (2,), (3,)),
        Call("d", (3, 1), (4,)),
        Call("e", (4,), (5,)),
        View(6, 5),
    ]
    return HostSchedule("main", bufs, [0], [6], steps)


def test_buffer_plan_reuses_dead_intermediates():
    plan = plan_buffers(_schedule())
    # 1 lives until d; 2 dies at c, 3 at d, 4 at e: three 256-byte slots are enough
    assert len(plan.slots) == 3 and plan.temp_bytes == 3 * 256
    assert plan.slot_of[2] != plan.slot_of[1]
    assert plan.slot_of[4] in (plan.slot_of[2], plan.slot_of[3])
    assert plan.root[6] == 5 and 5 in plan.pinned and 5 not in plan.slot_of


def test_schedule_json_round_trip():
    s = _schedule()
    back = HostSchedule.from_json(json.loads(json.dumps(s.to_json())))
    assert back.steps == s.steps and back.buffers == s.buffers and back.outputs == s.outputs


def test_kernel_cache_atomic_entries_and_corruption(tmp_path):
    cache = KernelCache(tmp_path)
    key = make_key("nvptx", "module {}", "sm_90")
    assert cache.get(key) is None
    cache.put(key, {"ptx": "// ptx", "cubin": b"\x7fELF\x00"})
    assert cache.get(key) == {"ptx": "// ptx", "cubin": b"\x7fELF\x00"}
    files = list((tmp_path / "kernels").rglob("*"))
    assert not [f for f in files if f.suffix == ".tmp"]  # written by rename, nothing left over
    entry = next(f for f in files if f.suffix == ".json")
    entry.write_text(entry.read_text().replace("// ptx", "// tampered"))
    assert cache.get(key) is None and cache.corrupt == 1  # checksum mismatch: never trusted
    entry.write_text("{ truncated")
    assert cache.get(key) is None and cache.corrupt == 2
    assert make_key("a", "b") != make_key("ab") and make_key("x", 1) == make_key("x", 1)


def test_compiler_uses_and_repairs_the_cache(tmp_path):
    g = Graph("chain")
    x = g.input("x", (32, 64))
    g.output(g.tanh(x) * x)
    module = compile_cpu(g)._source
    cache = KernelCache(tmp_path)
    first = compile_module(module, ptxas=False, cache=cache)
    assert cache.misses >= 1 and cache.hits == 0
    again = compile_module(module, ptxas=False, cache=cache)
    assert cache.hits == 1
    for f in (tmp_path / "kernels").rglob("*.json"):
        f.write_text("garbage")
    repaired = compile_module(module, ptxas=False, cache=cache)
    assert cache.corrupt >= 1
    ptx = [p.kernels["fusion_0_loop"].ptx["sm_90"] for p in (first, again, repaired)]
    assert ptx[0] == ptx[1] == ptx[2]
