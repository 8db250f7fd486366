"""A model called at several shapes through ``torch.compile(backend="opfuse")`` stays
compiled: Dynamo's symbolic graph is specialized at each call's shapes
(``opfuse.torch_shapes``), checked against eager PyTorch."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import opfuse.api  # noqa: E402
import opfuse.torch  # noqa: E402
from opfuse import torch_backend, torch_shapes  # noqa: E402
from opfuse.errors import OpfuseError  # noqa: E402
from torch_models import CausalEncoderLayer  # noqa: E402


@pytest.fixture
def compiles(monkeypatch):
    """``torch.compile(backend="opfuse")`` registered, counting the graphs opfuse compiles
    (each ``opfuse.compile`` of a partition) and the calls served compiled. The compile
    time budget is lifted: what these tests check must not depend on the machine's speed
    (the budget itself: test_past_the_time_budget_new_shapes_run_eagerly)."""
    monkeypatch.setenv("OPFUSE_TORCH_SHAPE_SECONDS", "100000")
    opfuse.torch.register()
    torch._dynamo.reset()
    counts = {"compile": 0, "compiled_calls": 0}
    real_compile, real_call = opfuse.api.compile, torch_backend._DynamoGraph.__call__

    def counting_compile(*args, **kwargs):
        counts["compile"] += 1
        return real_compile(*args, **kwargs)

    def counting_call(self, *args):
        counts["compiled_calls"] += 1
        return real_call(self, *args)

    monkeypatch.setattr(opfuse.api, "compile", counting_compile)
    monkeypatch.setattr(torch_backend._DynamoGraph, "__call__", counting_call)
    yield counts
    torch._dynamo.reset()


def test_transformer_block_at_five_shapes_stays_compiled(compiles):
    """The issue's case: default options (automatic dynamic), five (batch, sequence)
    shapes, the first repeated last. Before, the second shape sent every call eagerly."""
    torch.manual_seed(0)
    model = CausalEncoderLayer(d=32, heads=4, ff=64).eval()
    fast = torch.compile(model, backend="opfuse")
    shapes = [(4, 64), (4, 77), (2, 100), (3, 50), (4, 64)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        for b, t in shapes:
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    assert compiles["compiled_calls"] == len(shapes)  # every call ran opfuse's kernels
    # Dynamo's first graph is static (4, 64); from the second shape on its symbolic graph
    # serves every call, (4, 64) again included: one compile per shape it sees
    assert compiles["compile"] == 5


def test_dynamic_true_compiles_each_shape_once(compiles):
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)).eval()
    fast = torch.compile(model, backend="opfuse", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        for n in (3, 5, 1, 3, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert compiles["compiled_calls"] == 5
    assert compiles["compile"] == 3


def test_sizes_used_as_values_follow_each_call(compiles):
    """A SymInt input (the batch size in a reshape) is specialized per call: the second
    shape reshapes with its own size, not the first's."""

    class Reshaping(nn.Module):
        def forward(self, x):
            return torch.tanh(x).reshape(x.shape[0], 2, -1).sum(-1)

    fast = torch.compile(Reshaping(), backend="opfuse")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        for n in (4, 6, 9):
            x = torch.randn(n, 8)
            torch.testing.assert_close(fast(x), Reshaping()(x))
    assert compiles["compiled_calls"] == 3


def test_past_the_shape_limit_new_shapes_run_eagerly_once_warned():
    """The limit with a stand-in compiler: compiled shapes stay compiled, a new shape past
    the limit runs ``gm.forward``, and the warning comes once."""
    calls = []

    class Gm:
        def forward(self, x):
            calls.append(("eager", tuple(x.shape)))
            return x

    def compile_static(gm, args):
        def run(x):
            calls.append(("compiled", tuple(x.shape)))
            return x
        return run

    graph = torch_shapes.ShapeSpecializedGraph(Gm(), compile_static, limit=2)
    graph(torch.zeros(1))
    graph(torch.zeros(2))
    with pytest.warns(opfuse.torch.FallbackWarning, match=r"shape \(3,\).*2 shapes"):
        graph(torch.zeros(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        graph(torch.zeros(4))  # warned once
        graph(torch.zeros(1))  # still compiled
    assert calls == [("compiled", (1,)), ("compiled", (2,)), ("eager", (3,)), ("eager", (4,)),
                     ("compiled", (1,))]
    assert graph.compiles == 2


def test_shape_key_tells_shapes_dtypes_and_scalars_apart():
    key = torch_shapes.shape_key
    a = torch.zeros(2, 3)
    assert key([a, 3]) == key([torch.ones(2, 3), 3])
    assert key([a, 3]) != key([a, 4])
    assert key([a]) != key([a.half()])
    assert key([a]) != key([torch.zeros(3, 2)])


def test_symbolic_inputs_are_recognized():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        x = mode.from_tensor(torch.zeros(4, 8), symbolic_context=None)
    assert not torch_shapes.is_symbolic([torch.zeros(4, 8), 3])
    sym = mode.shape_env.create_unbacked_symint()
    assert torch_shapes.is_symbolic([x, sym])


def test_unknown_option_raises_and_names_the_valid_ones():
    model = nn.Linear(4, 4)
    gm = torch.fx.symbolic_trace(model)
    with pytest.raises(OpfuseError, match=r"unknown option\(s\) 'detla'.*backend.*delta.*threads"):
        torch_backend.opfuse_backend(gm, [torch.zeros(2, 4)], options={"detla": 0.2})
    # every documented one is accepted (and a pass option with a dash, as on the CLI)
    fn = torch_backend.opfuse_backend(gm, [torch.zeros(2, 4)],
                                      options={"backend": "cpu", "threads": 1, "r-limit": 200,
                                               "delta": 0.2, "target": "sm_80"})
    with torch.no_grad():
        x = torch.randn(2, 4)
        torch.testing.assert_close(fn(x)[0] if isinstance(fn(x), tuple) else fn(x), model(x))


def test_an_unused_mode_is_named_once():
    gm = torch.fx.symbolic_trace(nn.Linear(4, 4))
    torch_backend._MODES_NOTED.discard("max-autotune")
    with pytest.warns(UserWarning, match=r"mode='max-autotune'\) changes nothing"):
        torch_backend.opfuse_backend(gm, [torch.zeros(2, 4)], options={"backend": "cpu"},
                                     mode="max-autotune")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        torch_backend.opfuse_backend(gm, [torch.zeros(2, 4)], options={"backend": "cpu"},
                                     mode="max-autotune")


def test_past_the_time_budget_new_shapes_run_eagerly():
    """A graph whose compiles took the budget (``OPFUSE_TORCH_SHAPE_SECONDS``) compiles no
    new shape: a ``generate()`` loop must not compile at every token."""
    ran = []

    class Gm:
        def forward(self, x):
            ran.append("eager")
            return x

    def compile_static(gm, args):
        return lambda x: ran.append("compiled") or x

    graph = torch_shapes.ShapeSpecializedGraph(Gm(), compile_static, seconds=0.0)
    graph(torch.zeros(1))  # the first shape always compiles
    with pytest.warns(opfuse.torch.FallbackWarning, match="OPFUSE_TORCH_SHAPE_SECONDS=0"):
        graph(torch.zeros(2))
    graph(torch.zeros(1))
    assert ran == ["compiled", "eager", "compiled"]


@pytest.mark.parametrize("kind", ["nonzero", "boolean_index"])
def test_data_dependent_shapes_stay_eager_with_a_note(kind):
    """A size read from tensor data (torch.export's unbacked SymInt) was a
    GuardOnDataDependentSymNode traceback out of opfuse.torch.compile; now the op and what
    reads it run eagerly, named, and the rest is compiled."""

    class Model(nn.Module):
        def forward(self, x):
            y = torch.tanh(x) * 2
            if kind == "nonzero":
                return y.sum() + torch.nonzero(y > 0).shape[0]
            return torch.tanh(y[x > 0] * 3).sum()

    x = torch.randn(4, 8)
    with pytest.warns(opfuse.torch.FallbackWarning, match="left eager"):
        fast = opfuse.torch.compile(Model(), (x,), backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(fast(x), Model()(x))
    ops = [e["op"] for e in fast.report["eager"]]
    assert ops[0] == ("aten.nonzero.default" if kind == "nonzero" else "aten.index.Tensor"), ops
    assert fast.report["totals"]["after"]["kernels"] >= 1  # tanh(x) * 2 is compiled


def test_dims_through_opfuse_torch_compile():
    """torch.export's Dim API: the declared-dynamic batch dim is compiled per call's shape;
    every call matches eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16)).eval()
    batch = torch.export.Dim("batch")
    fast = opfuse.torch.compile(model, (torch.randn(4, 16),), backend="cpu",
                                dynamic_shapes=({0: batch},))
    with torch.no_grad():
        for n in (4, 1, 9, 4):
            x = torch.randn(n, 16)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(fast.specializations) == 3
    assert fast.report["totals"]["after"]["kernels"] <= fast.report["totals"]["before"]["kernels"]


def test_dims_the_model_specializes_are_refused_by_name():
    class FixedBatch(nn.Module):
        def forward(self, x):
            return x.reshape(4, -1).tanh()  # batch must be 4

    batch = torch.export.Dim("batch")
    with pytest.raises(OpfuseError, match="dynamic_shapes: torch.export refuses them"):
        opfuse.torch.compile(FixedBatch(), (torch.randn(4, 16),), backend="cpu",
                             dynamic_shapes=({0: batch},))


def test_a_compiled_model_writes_fuse_runs_report(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU()).eval()
    fast = opfuse.torch.compile(model, (torch.randn(4, 8),), backend="cpu")
    (html,) = fast.write_report(tmp_path / "r")
    assert html == tmp_path / "r" / "report.html"
    assert "<html" in html.read_text() and (tmp_path / "r" / "report.json").exists()
    text = (tmp_path / "r" / "report.txt").read_text()
    assert text.startswith("kernels:")
