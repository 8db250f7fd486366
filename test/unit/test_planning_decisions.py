"""The fusion decisions of two medium random graphs (about 300 linalg ops each), pinned.

Planning is made faster from time to time (analyses kept between passes, fewer previews per
candidate), and none of that may change a decision. The property tests check that fused
programs compute the right numbers, not that the same ops are fused for the same reasons;
this test does: every ledger entry of the default pipeline (pass, producer, consumer, fused
or not, the reason with its numbers) and the kernels it ends with, against
``Inputs/planning_decisions.txt``.

The graphs mix what the passes look at: elementwise chains with broadcast operands, row and
column reductions, softmax and layernorm, transposes and reshapes (movers), matmuls that
share an LHS (epilogues, horizontal fusion), cumsums, values read by several consumers.
A change that is meant to change decisions regenerates the file:
``python test/unit/test_planning_decisions.py > test/unit/Inputs/planning_decisions.txt``
(and says why in its commit).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from opfuse import ir as oir
from opfuse.builder import Graph, Tensor
from opfuse.pipeline import Pipeline

GOLDEN = Path(__file__).parent / "Inputs" / "planning_decisions.txt"
SEEDS = (0, 1)
BASE = (4, 8, 16)
STEPS = 200  # each step adds 1-12 linalg ops


def medium_graph(seed: int) -> Graph:
    """A random DAG whose every value broadcasts to ``BASE``."""
    rng = np.random.default_rng(seed)
    g = Graph(f"medium_{seed}")
    pool: list[Tensor] = [g.input("x", BASE), g.input("row", BASE[-1:]), g.input("col", (4, 8, 1))]
    w1, w2 = g.input("w1", (16, 16)), g.input("w2", (16, 16))

    def pick(recent: int = 8) -> Tensor:
        return pool[-1 - int(rng.integers(0, min(recent, len(pool))))]

    def full(t: Tensor) -> Tensor:
        return t if t.shape == BASE else g.broadcast_to(t, BASE)

    for _ in range(STEPS):
        x = pick()
        step = rng.choice(["unary", "binary", "binary", "reduce", "softmax", "norm", "move",
                           "matmul", "cumsum", "fanout"])
        if step == "unary":
            y = getattr(g, rng.choice(["tanh", "relu", "sigmoid", "neg"]))(x)
        elif step == "binary":
            y = getattr(g, rng.choice(["add", "sub", "mul", "maximum"]))(x, pick(len(pool)))
        elif step == "reduce":
            axis = int(rng.integers(0, len(x.shape)))
            y = getattr(g, rng.choice(["sum", "max", "mean"]))(x, axis=axis, keepdims=True)
        elif step == "softmax":
            y = g.softmax(full(x))
        elif step == "norm":
            y = g.layernorm(full(x))
        elif step == "move":
            x = full(x)
            if rng.integers(0, 2):
                y = g.transpose(g.tanh(g.transpose(x, (0, 2, 1))), (0, 2, 1))
            else:
                y = g.reshape(g.exp(g.tanh(g.reshape(x, (32, 16)))), BASE)
        elif step == "matmul":
            x = g.reshape(full(x), (32, 16))
            a, b = g.matmul(x, w1), g.matmul(x, w2)  # one LHS: a horizontal pair
            y = g.reshape(g.silu(a) * b if rng.integers(0, 2) else g.relu(a + pool[1]), BASE)
        elif step == "cumsum":
            y = g.cumsum(full(x), axis=int(rng.integers(1, 3)))
        else:  # several consumers of one value
            y = g.tanh(x) + g.relu(x) * x
        pool.append(y)
    g.output(pool[-1], pool[len(pool) // 2])
    return g


def decisions(seed: int) -> list[str]:
    """The default pipeline's ledger and resulting kernels for ``medium_graph(seed)``."""
    module = oir.parse_module(medium_graph(seed).to_mlir(), filename=f"medium_{seed}.mlir")
    ledger = Pipeline.default().run(module)
    lines = [f"# medium_graph({seed})"]
    for d in ledger.to_json():
        verdict = "fused" if d["fused"] else "not fused"
        lines.append(f"{d['pass_name']}: {d['action']} {d['producer']} -> {d['consumer']}: "
                     f"{verdict}: {d['reason']}")
    kernels = [op.attributes["opfuse.kind"].value for op in module.body.operations
               if "opfuse.kernel" in op.operation.attributes]
    lines.append(f"kernels: {len(kernels)} " + " ".join(sorted(kernels)))
    return lines


def all_decisions() -> list[str]:
    return [line for seed in SEEDS for line in decisions(seed)]


def test_the_decisions_of_medium_random_graphs_are_unchanged():
    got = all_decisions()
    want = GOLDEN.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(want, got, "golden", "now", lineterm="", n=1))
    assert got == want, f"fusion decisions changed:\n{diff}"


def test_the_graphs_are_medium_sized_and_exercise_every_planning_pass():
    text = medium_graph(SEEDS[0]).to_mlir()
    assert 200 <= text.count("= linalg.") <= 600
    passes = {line.split(":")[0] for line in GOLDEN.read_text().splitlines() if not line.startswith(("#", "kernels"))}
    assert {"opfuse-fuse-elementwise", "opfuse-fuse-producer-consumer", "opfuse-fuse-reduction",
            "opfuse-fuse-epilogue", "opfuse-fuse-horizontal"} <= passes


if __name__ == "__main__":
    print("\n".join(all_decisions()))


def test_the_medium_random_graphs_compute_what_they_say():
    """The decisions above change the kernels: each graph, fused, against its unfused
    program on the CPU and against its fused kernels in the GPU emulator."""
    from opfuse import compile as compile_graph
    from opfuse.backends.gpu.compiler import compile_module
    from opfuse.testing.emulator import emulate

    for seed in SEEDS:
        g = medium_graph(seed)
        args = [np.random.default_rng(seed).uniform(-1, 1, t.shape).astype(np.float32)
                for t in g.inputs]
        fused = compile_graph(g, backend="cpu")
        want = fused(*args)
        want = want if isinstance(want, tuple) else (want,)
        plain = compile_graph(g, backend="cpu", fusion=False)(*args)
        plain = plain if isinstance(plain, tuple) else (plain,)
        emulated = emulate.run_program(compile_module(fused._source, lower=False), args)
        for a, b, c in zip(want, plain, emulated):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(c, a, rtol=1e-4, atol=1e-4)
