"""Partitioning, never all-or-nothing (``opfuse.frontends.torch.partition`` and
``opfuse.torch_partitions``): a model with an op opfuse does not support runs with that op
eager and everything around it compiled and fused, through ``opfuse.torch.compile`` and
``torch.compile(backend="opfuse")``; the report names every partition and every eager op
with its reason; one warning per graph names the eager ops.

Numerics: max |opfuse - eager| <= 1e-5 * max |eager| (f32), as in test_torch_backend.py.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import opfuse.api  # noqa: E402
import opfuse.torch  # noqa: E402
from opfuse.errors import OpfuseError  # noqa: E402
from opfuse.frontends.torch.importer import export  # noqa: E402
from opfuse.frontends.torch.partition import partition  # noqa: E402
from opfuse.driver.executable import Executable  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class SvdInTheMiddle(nn.Module):
    """Linear + GELU + scale, an SVD opfuse has no rule for, then Linear + ReLU + scale."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = F.gelu(self.a(x)) * 2 + 1
        s = torch.linalg.svdvals(h)
        return torch.relu(self.b(h) + s.sum()) * 3


def _close(got, want):
    err = (got - want).abs().max().item()
    assert err <= 1e-5 * want.abs().max().item(), err


def _eager_ops(report):
    return [e["op"] for e in report["eager"]]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_partitions_split_around_an_unsupported_op():
    program = export(SvdInTheMiddle().eval(), (torch.randn(8, 16),))
    split = partition(program)
    assert [e.op for e in split.eager] == ["aten._linalg_svd.default"]
    assert split.eager[0].reason == "no rule for this op"
    assert "torch.linalg.svdvals(h)" in split.eager[0].where  # the user's line
    assert [name for name, _ in split.partitions] == ["opfuse_0", "opfuse_1"]
    called = [n.target for n in split.gm.graph.nodes if n.op in ("call_module", "call_function")]
    assert "opfuse_0" in called and "opfuse_1" in called


@pytest.mark.parametrize("path", ["opfuse.torch.compile", "torch.compile"])
def test_one_unsupported_op_keeps_every_other_fusion(path, fresh_dynamo):
    torch.manual_seed(0)
    model, x = SvdInTheMiddle().eval(), torch.randn(8, 16)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if path == "torch.compile":
            fast = torch.compile(model, backend="opfuse", options={"backend": "cpu"})
            got = fast(x)
            report = _dynamo_report(fast)
        else:
            fast = opfuse.torch.compile(model, (x,), backend="cpu")
            got = fast(x)
            report = fast.report
        want = model(x)
    _close(got, want)
    fallbacks = [str(w.message) for w in seen if w.category is opfuse.torch.FallbackWarning]
    assert len(fallbacks) == 1 and "aten._linalg_svd.default" in fallbacks[0], fallbacks
    assert _eager_ops(report) == ["aten._linalg_svd.default"]
    kernels = [(p["kernels"]["before"], p["kernels"]["after"]) for p in report["partitions"]]
    # before the SVD: matmul + bias + GELU (6 ops) + mul + add as one matmul kernel with its
    # epilogue; after it: the sum of the singular values, then matmul + bias + add + ReLU +
    # mul (the sum's broadcast add joins the epilogue)
    assert len(kernels) == 2, kernels
    assert kernels[0][1] == 1 and kernels[0][0] > 1
    assert kernels[1][1] < kernels[1][0]
    assert report["totals"]["after"]["kernels"] == sum(k[1] for k in kernels)


def _dynamo_report(fast):
    """The report of the one graph opfuse compiled for ``fast``."""
    compiled = [g for g in _GRAPHS]
    assert len(compiled) == 1
    return compiled[0].report


_GRAPHS: list = []


@pytest.fixture(autouse=True)
def _spy(monkeypatch):
    """Keeps every graph the Dynamo backend returns (their reports)."""
    from opfuse import torch_backend

    _GRAPHS.clear()
    real = torch_backend._DynamoGraph

    def keep(*args, **kwargs):
        graph = real(*args, **kwargs)
        _GRAPHS.append(graph)
        return graph

    monkeypatch.setattr(torch_backend, "_DynamoGraph", keep)
    yield


class TokenArithmetic(nn.Module):
    """int64 token ids in: positions, comparisons and casts to float, all compiled."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, ids, mask):
        pos = torch.arange(ids.shape[1]).expand_as(ids) * 2 + 1
        keep = (ids > 3) & (mask != 0)
        return torch.where(keep, (ids + pos).float() * self.scale, -1.0), ids * mask + pos


@pytest.mark.parametrize("path", ["opfuse.torch.compile", "torch.compile"])
def test_int64_inputs_compile_with_nothing_eager(path, fresh_dynamo):
    model = TokenArithmetic().eval()
    ids = torch.randint(0, 10, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        if path == "torch.compile":
            got = torch.compile(model, backend="opfuse", options={"backend": "cpu"})(ids, mask)
            report = _dynamo_report(None)
        else:
            fast = opfuse.torch.compile(model, (ids, mask), backend="cpu")
            got = fast(ids, mask)
            report = fast.report
        want = model(ids, mask)
    assert report["eager"] == [] and len(report["partitions"]) == 1
    _close(got[0], want[0])
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])


class EmptyCache(nn.Module):
    """A key cache of length 0 concatenated to the new keys, as Hugging Face models do."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 0, 4))

    def forward(self, k):
        keys = torch.cat([self.cache, k], dim=1)
        return keys * 2, keys


def test_empty_concat_operands_are_dropped():
    model, k = EmptyCache().eval(), torch.randn(2, 3, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", opfuse.torch.FallbackWarning)
        fast = opfuse.torch.compile(model, (k,), backend="cpu")
        got, want = fast(k), model(k)
    assert fast.report["eager"] == []
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_a_partition_that_does_not_compile_runs_eagerly(fresh_dynamo, monkeypatch):
    """Under torch.compile a partition's compile error leaves its ops eager, named with the
    error; the other partition is still compiled."""
    real = opfuse.api.compile
    calls = []

    def second_fails(graph, **kwargs):
        calls.append(graph)
        if len(calls) == 2:
            raise OpfuseError("simulated compile failure")
        return real(graph, **kwargs)

    monkeypatch.setattr(opfuse.api, "compile", second_fails)
    torch.manual_seed(0)
    model, x = SvdInTheMiddle().eval(), torch.randn(8, 16)
    with torch.no_grad(), pytest.warns(opfuse.torch.FallbackWarning, match="simulated"):
        got = torch.compile(model, backend="opfuse", options={"backend": "cpu"})(x)
    _close(got, model(x))
    report = _dynamo_report(None)
    assert len(report["partitions"]) == 1
    eager = report["eager"]
    assert eager[0]["op"] == "aten._linalg_svd.default"
    assert len(eager) > 1 and all("simulated" in e["reason"] for e in eager[1:])
    # opfuse.torch.compile is the explicit API: there the error is raised
    calls.clear()
    with pytest.raises(OpfuseError, match="simulated"):
        opfuse.torch.compile(model, (x,), backend="cpu")


def test_a_partition_failing_at_its_first_call_runs_eagerly(fresh_dynamo, monkeypatch):
    def broken(self, *arrays):
        raise OpfuseError("cannot JIT-compile for the CPU: (simulated)")

    # the JIT compile both call paths (numpy arrays, tensors' data pointers) go through
    monkeypatch.setattr(Executable, "_compiled", broken)
    torch.manual_seed(0)
    model, x = SvdInTheMiddle().eval(), torch.randn(8, 16)
    fast = opfuse.torch.compile(model, (x,), backend="cpu")
    with torch.no_grad():
        with pytest.warns(opfuse.torch.FallbackWarning, match="partition opfuse_0 runs eagerly"):
            _close(fast(x), model(x))
        with warnings.catch_warnings():
            warnings.simplefilter("error", opfuse.torch.FallbackWarning)
            _close(fast(x), model(x))  # stays eager, warned once
    assert all(p["eager_at_run_time"] for p in fast.report["partitions"])


class MaskedScale(nn.Module):
    """bf16, bool and f32 inputs: a masked, scaled sum in f32."""

    def forward(self, x, mask, scale):
        return (torch.where(mask, x.float(), 0.0) * scale).sum(-1)


def test_partitions_run_on_the_tensors_memory_and_fall_back_for_other_layouts(monkeypatch):
    """A partition's CPU program is called on its tensors' data pointers (no numpy arrays:
    to_numpy is never reached) when every input is contiguous with the signature's dtype
    and shape (bf16 and bool included); a transposed input takes the checked numpy path.
    Both give eager's results."""
    from opfuse import torch_partitions

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g).to(torch.bfloat16)
    mask = torch.randn(6, 10, generator=g) > 0
    scale = torch.randn(10, generator=g)
    model = MaskedScale()
    fast = opfuse.torch.compile(model, (x, mask, scale), backend="cpu")
    converted = []
    real = torch_partitions.to_numpy
    monkeypatch.setattr(torch_partitions, "to_numpy", lambda t: converted.append(t) or real(t))
    torch.testing.assert_close(fast(x, mask, scale), model(x, mask, scale), rtol=1e-6, atol=1e-6)
    assert converted == []  # the pointer path
    xt = x.t().contiguous().t()  # same values and shape, column-major
    assert not xt.is_contiguous()
    torch.testing.assert_close(fast(xt, mask, scale), model(x, mask, scale), rtol=1e-6, atol=1e-6)
    assert converted  # the numpy path, which copies it contiguous
