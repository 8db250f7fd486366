"""Training through ``torch.compile(backend="opfuse")``: ``loss.backward()`` runs opfuse's
forward and backward graphs (``opfuse.torch_training``), against eager PyTorch's gradients.

Gradients: max |opfuse - eager| <= 1e-4 * max(|eager grad|, 1e-3 * the largest gradient of
the model) per parameter (f32). The floor matters where a gradient is zero in exact
arithmetic: BERT's attention key bias shifts every score of a row equally, so softmax
cancels it and its gradient is rounding noise (1e-9 against 1e-1 elsewhere). Measured
worst: 8.6e-7 (the small CNN), 4.3e-7 (tiny Llama).

Also here: each backward decomposition (``frontends/torch/backward_decompositions``)
against autograd in eager PyTorch, the save-or-recompute decision, and the importer rules
the backward graphs brought (``slice_scatter``, ``constant_pad_nd``, max-pool indices).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import opfuse.torch  # noqa: E402
from opfuse import torch_backend, torch_training  # noqa: E402
from opfuse.cost.guard import GuardOptions  # noqa: E402
from opfuse.frontends.torch import backward_decompositions as bd  # noqa: E402
from opfuse.frontends.torch.decompositions import decomposition_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a top-level folder, not part of the package
    sys.path.insert(0, str(ROOT))

REL = 1e-4

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train_step(model, loss_of, inputs):
    """One compiled and one eager ``loss.backward()``: (compiled loss, eager loss,
    compiled grads, eager grads, the opfuse warnings, the compiled graphs)."""
    fast = torch.compile(model, backend="opfuse", options={"backend": "cpu"})
    before = torch_backend.compiled_graphs()
    model.zero_grad()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss = loss_of(fast(**inputs))
        loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    want_loss = loss_of(model(**inputs))
    want_loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    graphs = [g for g in torch_backend.compiled_graphs() if not any(g is b for b in before)]
    messages = [str(w.message) for w in seen if "opfuse" in str(w.message)]
    return loss, want_loss, got, want, messages, graphs


def _assert_grads_match(got, want):
    assert got.keys() == want.keys()
    scale = max(g.abs().max().item() for g in want.values())
    for name, g in want.items():
        err = (got[name] - g).abs().max().item()
        bound = REL * max(g.abs().max().item(), 1e-3 * scale)
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"


def _assert_compiled(messages, graphs):
    assert messages == [], messages
    assert graphs and all(isinstance(g, torch_training.TrainingGraph) for g in graphs)
    for g in graphs:
        report = g.report
        assert report["eager"] == []
        assert report["forward"] and report["backward"], "both graphs compiled"
        for side in ("forward", "backward"):
            totals = report[side]["totals"]
            assert totals["after"]["kernels"] < totals["before"]["kernels"]


def test_mlp_backward_is_compiled_and_matches_eager():
    """The issue's MLP: linear, LayerNorm, GELU (erf), linear, cross-entropy."""
    from bench.train import BY_NAME

    entry = BY_NAME["mlp"]
    loss, want_loss, got, want, messages, graphs = _train_step(
        entry.build(), entry.loss, entry.inputs())
    _assert_compiled(messages, graphs)
    assert abs(loss.item() - want_loss.item()) <= 1e-6 * abs(want_loss.item())
    _assert_grads_match(got, want)
    report = graphs[0].report
    assert report["saved"] and report["saved_bytes"] == sum(s["bytes"] for s in report["saved"])
    decision = report["recompute"]
    assert decision["pass_name"] == torch_training.PASS_NAME
    assert {"q_unfused", "q_fused", "w_extra", "delta"} <= set(decision["numbers"])
    total = report["totals"]["after"]["kernels"]
    assert total == (report["forward"]["totals"]["after"]["kernels"]
                     + report["backward"]["totals"]["after"]["kernels"])


def test_bias_and_norm_gradients_join_the_kernels_that_compute_what_they_sum():
    """The MLP's backward: LayerNorm's weight and bias gradients and the first linear's
    bias gradient are added up in LayerNorm's backward row kernel (opfuse-fuse-column-sums),
    4 kernels with the first linear's dX, dW pair in one (opfuse-fuse-grouped); under
    torch.use_deterministic_algorithms (no atomics) each sum is its own, 7."""
    from bench.train import BY_NAME

    entry = BY_NAME["mlp"]
    counts = {}
    for deterministic in (False, True):
        torch._dynamo.reset()
        torch.use_deterministic_algorithms(deterministic)
        try:
            _, _, got, want, messages, graphs = _train_step(entry.build(), entry.loss,
                                                            entry.inputs())
        finally:
            torch.use_deterministic_algorithms(False)
        _assert_compiled(messages, graphs)
        _assert_grads_match(got, want)
        counts[deterministic] = graphs[0].report["backward"]["totals"]["after"]["kernels"]
    assert counts == {False: 4, True: 7}  # the first dX, dW pair shares a launch (fuse-grouped)


def test_attention_gradients_match_eager():
    """Regression: core ATen's decomposition of the CPU flash-attention op returns the
    attention weights in its log-sum-exp slot; differentiated through it, q/k/v gradients
    were off by 30-100 (absolute) with no warning. SDPA is now differentiated as math."""
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in (
        decomposition_table())

    class Attend(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x, mask):
            q, k, v = (t.view(2, 6, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return causal + masked

    torch.manual_seed(0)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[1, :, :, 4:] = False
    x = torch.randn(2, 6, 16)
    _, _, got, want, messages, graphs = _train_step(
        Attend(), lambda out: out.square().mean(), {"x": x, "mask": mask})
    _assert_compiled(messages, graphs)
    _assert_grads_match(got, want)


def test_a_second_shape_compiles_again_and_stays_correct():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
    fast = torch.compile(model, backend="opfuse", options={"backend": "cpu"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (8, 5, 12, 5):
            x = torch.randn(batch, 16)
            model.zero_grad()
            fast(x).square().mean().backward()
            got = {n: p.grad.clone() for n, p in model.named_parameters()}
            model.zero_grad()
            model(x).square().mean().backward()
            _assert_grads_match(got, {n: p.grad for n, p in model.named_parameters()})
    assert [str(w.message) for w in seen if "opfuse" in str(w.message)] == []
    symbolic = torch_backend.compiled_graphs()[-1]
    assert symbolic.compiles == 2  # 5 and 12, on Dynamo's symbolic graph
    assert all(r["forward"] and r["backward"] for r in symbolic.reports)


def test_small_cnn_backward_is_compiled_and_matches_eager():
    """Convolutions (stride 1 and 2, with and without bias), eval-mode batch norm, max
    pooling (its indices) and global average pooling, differentiated."""
    from bench.train import BY_NAME

    entry = BY_NAME["small_cnn"]
    _, _, got, want, messages, graphs = _train_step(entry.build(), entry.loss, entry.inputs())
    _assert_compiled(messages, graphs)
    _assert_grads_match(got, want)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_hugging_face_training_step_is_compiled(name):
    """Token ids, a padded attention mask and labels (``bench/train.py``'s models): the loss
    (cross-entropy with ignore_index, GPT-2/Llama's label shift through ``F.pad``), the
    embeddings' gradients, attention, RoPE's slices (Llama) all compile; gradients match
    eager."""
    pytest.importorskip("transformers", reason="needs the zoo extra (transformers)")
    from bench.train import BY_NAME

    entry = BY_NAME[name]
    loss, want_loss, got, want, messages, graphs = _train_step(
        entry.build(), entry.loss, entry.inputs())
    _assert_compiled(messages, graphs)
    assert abs(loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    _assert_grads_match(got, want)


# --------------------------------------------------------------------------- decompositions


@pytest.mark.parametrize("kernel, stride, padding, dilation, size", [
    (2, 2, 0, 1, 8), (3, 2, 1, 1, 9), (3, 1, 1, 1, 7), (2, 1, 0, 1, 5), (3, 2, 1, 2, 11)])
def test_max_pool_backward_decomposition(kernel, stride, padding, dilation, size):
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size + 1, requires_grad=True)
    y, indices = F.max_pool2d(x, kernel, stride, padding, dilation, return_indices=True)
    g = torch.randn_like(y)
    y.backward(g)
    got = bd.max_pool2d_with_indices_backward(g, x.detach(), [kernel] * 2, [stride] * 2,
                                              [padding] * 2, [dilation] * 2, False, indices)
    torch.testing.assert_close(got, x.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel, stride, padding, dilation, size", [
    (3, 1, 1, 1, 8), (3, 2, 1, 1, 8), (3, 2, 1, 1, 9), (1, 1, 0, 1, 5), (5, 2, 2, 1, 10),
    (3, 1, 2, 2, 9), (3, 2, 0, 1, 9), (1, 1, 1, 1, 5)])
def test_convolution_backward_decomposition(kernel, stride, padding, dilation, size):
    """Every case the forward's floor division leaves rows over (size 8 against 9 at
    stride 2), and a padding larger than the window (a crop: 1x1 with padding 1)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size + 1, requires_grad=True)
    w = torch.randn(4, 3, kernel, kernel, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    y = F.conv2d(x, w, b, stride, padding, dilation)
    g = torch.randn_like(y)
    y.backward(g)
    gi, gw, gb = bd.convolution_backward(g, x.detach(), w.detach(), [4], [stride] * 2,
                                         [padding] * 2, [dilation] * 2, False, [0, 0], 1,
                                         [True, True, True])
    for got, want in ((gi, x.grad), (gw, w.grad), (gb, b.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert bd.convolution_backward(g, x, w, [4], [stride] * 2, [padding] * 2, [dilation] * 2,
                                   False, [0, 0], 2, [True] * 3) is NotImplemented


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_decompositions(reduction, weighted):
    torch.manual_seed(0)
    logits = torch.randn(6, 5, requires_grad=True)
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    weight = torch.rand(5) if weighted else None
    loss = F.nll_loss(logits, target, weight, ignore_index=-100,
                      reduction=["none", "mean", "sum"][reduction])
    g = torch.randn_like(loss)
    loss.backward(g)
    out, total = bd.nll_loss_forward(logits.detach(), target, weight, reduction, -100)
    torch.testing.assert_close(out, loss.detach())
    got = bd.nll_loss_backward(g, logits.detach(), target, weight, reduction, -100, total)
    torch.testing.assert_close(got, logits.grad)


class _EmbeddingGrad(nn.Module):
    def __init__(self, rows: int, padding_idx: int):
        super().__init__()
        self.rows, self.padding_idx = rows, padding_idx

    def forward(self, grad, ids):
        return torch.ops.aten.embedding_dense_backward(grad, ids, self.rows, self.padding_idx,
                                                       False)


@pytest.mark.parametrize("padding_idx", [-1, 0])
def test_embedding_backward_is_one_scatter_kernel_matching_autograd(padding_idx):
    """``embedding_dense_backward`` stays whole (the table keeps it from core ATen's
    ``index_put``) and imports as the builder's scatter_add: one ``scatter`` kernel, the
    gradient equal to autograd's (repeated ids, the padding row left zero)."""
    torch.manual_seed(0)
    ids = torch.tensor([[0, 3, 3, 7], [1, 0, 7, 7]])
    table = torch.randn(9, 5, requires_grad=True)
    out = F.embedding(ids, table, padding_idx=None if padding_idx < 0 else padding_idx)
    g = torch.randn_like(out)
    out.backward(g)
    assert bd.embedding_dense_backward(g, ids, 9, padding_idx, False) is NotImplemented
    fast = opfuse.torch.compile(_EmbeddingGrad(9, padding_idx), (g, ids), backend="cpu")
    got = fast(g, ids)
    assert fast.report["eager"] == []
    assert [k["kind"] for p in fast.report["partitions"] for k in p["report"]["kernels"]] \
        == ["scatter"]
    torch.testing.assert_close(got, table.grad, rtol=1e-6, atol=1e-6)


def test_a_large_vocabulary_embedding_trains_without_eager_ops():
    """GPT-2's vocabulary (50257 rows): the gradient is a scatter kernel (each token's
    gradient read once), not an eager ``index_put`` and not a one-hot matmul."""
    torch.manual_seed(0)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50257, 16)
            self.out = nn.Linear(16, 3)

        def forward(self, ids):
            return self.out(torch.tanh(self.embed(ids)))

    ids = torch.randint(0, 50257, (2, 24))
    ids[0, :6] = ids[0, 0]  # a repeated id: its row sums six gradients
    _, _, got, want, messages, graphs = _train_step(
        Tagger(), lambda y: y.square().mean(), {"ids": ids})
    _assert_compiled(messages, graphs)
    _assert_grads_match(got, want)
    kinds = [k["kind"] for g in graphs for p in g.report["backward"]["partitions"]
             for k in p["report"]["kernels"]]
    assert "scatter" in kinds and graphs[0].report["eager"] == []


# --------------------------------------------------------------------------- the decision


def _saved(*sizes):
    return [{"name": f"t{i}", "shape": [n], "dtype": "float32", "bytes": 4 * n}
            for i, n in enumerate(sizes)]


def test_recompute_is_taken_when_it_saves_round_trips():
    """Recomputing an elementwise chain that lets the forward save 1 MB instead of 4 MB
    clears delta; one that saves nothing (or costs more bytes) is refused."""
    graph = torch.fx.symbolic_trace(lambda a: torch.relu(a) * 2)
    nodes = [n for n in graph.graph.nodes if n.op in ("call_function", "call_method")]
    for n in nodes:
        n.meta["val"] = torch.empty(1 << 18)
    taken = torch_training.judge_recompute(_saved(1 << 18, 1 << 18, 1 << 18, 1 << 18),
                                           _saved(1 << 18), nodes, GuardOptions())
    assert taken.fused and "time saving" in taken.reason
    assert taken.numbers["q_unfused"] == 2 * 4 * (1 << 20)
    refused = torch_training.judge_recompute(_saved(1 << 18), _saved(1 << 18), nodes,
                                             GuardOptions())
    assert not refused.fused
    nothing = torch_training.judge_recompute(_saved(1 << 18), _saved(1 << 10), [],
                                             GuardOptions())
    assert not nothing.fused and nothing.reason == "min-cut recomputes nothing"


# --------------------------------------------------------------------------- importer rules


class _Rules(nn.Module):
    def forward(self, x, labels):
        grad = torch.zeros(4, 10)
        scattered = torch.slice_scatter(grad, x[:, :3] * 2, dim=1, start=2, end=5)
        padded = F.pad(labels, (0, 1), value=-100)  # int64, as the causal-LM loss pads
        cropped = F.pad(x, (-1, 2, 1, 0), value=0.5)
        pooled, indices = F.max_pool2d(x.view(1, 1, 4, 10), 3, 2, 1, return_indices=True)
        return scattered, padded, cropped, pooled, indices


def test_backward_graph_rules_match_torch():
    torch.manual_seed(0)
    x, labels = torch.randn(4, 10), torch.tensor([[3, 1, 4], [1, 5, 9]])
    x[2, 3] = x[2, 4]  # a tie inside a window: the first offset's index wins, as in torch
    fast = opfuse.torch.compile(_Rules(), (x, labels), backend="cpu")
    with torch.no_grad():
        got, want = fast(x, labels), _Rules()(x, labels)
    assert fast.report["eager"] == []
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- GPU kernels


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_emulated_gpu_kernels_of_both_graphs_match(name, monkeypatch):
    """Every partition of the forward and the backward graph, built by the GPU code
    generator and run by the emulator (race check on) on the inputs the training step
    gave it, matches the CPU backend's results (which match eager's gradients above).
    Regressions (the MLP): the bias and norm-weight gradients (lone column reductions)
    took the sequential fallback emitter, their "columns" kind lost; and the forward's
    first matmul did too, because it also wrote the weight's transpose saved for the
    backward, which is now a view torch makes of the weight."""
    from bench.train import BY_NAME, step
    from opfuse import torch_partitions
    from opfuse.backends.gpu.compiler import compile_module
    from opfuse.testing.emulator import emulate

    calls = []
    real = torch_partitions.Program.run

    def recording(self, tensors):
        results = real(self, tensors)
        calls.append((self, [t.detach().clone() for t in tensors],
                      [r.detach().clone() for r in results]))
        return results

    monkeypatch.setattr(torch_partitions.Program, "run", recording)
    # imported as the GPU backend imports them (views of results made by torch)
    monkeypatch.setattr(torch_partitions, "GPU_LAYOUT_ON_CPU", True)
    entry = BY_NAME[name]
    model = entry.build()
    step(model, torch.compile(model, backend="opfuse", options={"backend": "cpu"}), entry,
         entry.inputs())
    assert len(calls) >= 2  # a forward and a backward partition at least
    for program, inputs, want in calls:
        gpu = compile_module(program.executable._source, lower=False)
        assert gpu.kernels
        if name == "mlp":  # the CNN's pooled features saved beside the head's matmul, and
            # its cropped, transposed weight gradient, still take the fallback emitter
            assert all(k.emitter != "fallback" for k in gpu.kernels.values()), gpu.notes
        arrays = emulate.run_program(gpu, [torch_partitions.to_numpy(t) for t in inputs])
        got = program.as_results(arrays, inputs)  # viewed as the graph's results
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            w = w.double()
            scale = max(1.0, w.abs().max().item()) if w.numel() else 1.0
            torch.testing.assert_close(g.double(), w, rtol=0, atol=1e-4 * scale)


class _NormWithStatistics(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(128)), nn.Parameter(torch.randn(128))

    def forward(self, x):
        return torch.native_layer_norm(x, (128,), self.weight, self.bias, 1e-5)


def test_layer_norm_statistics_come_from_its_row_kernel():
    """A training forward's layer norm also returns its mean and 1/std (N x 1). They were
    computed by a second pair of reductions and copied into their N x 1 shape by a kernel
    each: 4 kernels. Now one: the statistics share the normalization's reductions, and a
    result whose only difference from the value behind it is a trailing 1 is returned
    as that value and viewed in torch."""
    torch.manual_seed(0)
    x = torch.randn(32, 128)
    model = _NormWithStatistics()
    fast = opfuse.torch.compile(model, (x,), backend="cpu")
    assert fast.report["totals"]["after"]["kernels"] == 1
    with torch.no_grad():
        got, want = fast(x), model(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_training_mode_dropout_runs_in_pytorch_and_the_rest_compiles():
    """Dropout draws PyTorch's random numbers, so it stays eager (named once); the
    matmuls and GELU around it, and its backward (the saved mask times the gradient),
    compile. Seeded alike, eager and compiled draw the same mask: gradients match."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.5), nn.Linear(32, 4))
    model.train()
    x = torch.randn(8, 16)
    fast = torch.compile(model, backend="opfuse", options={"backend": "cpu"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.manual_seed(1)
        fast(x).square().mean().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.manual_seed(1)
    model(x).square().mean().backward()
    _assert_grads_match(got, {n: p.grad for n, p in model.named_parameters()})
    messages = [str(w.message) for w in seen if "opfuse" in str(w.message)]
    assert len(messages) == 1 and "native_dropout" in messages[0]
    assert "PyTorch's random numbers" in messages[0]
    report = torch_backend.compiled_graphs()[-1].report
    assert [e["op"] for e in report["eager"]] == ["aten.native_dropout.default"]
    assert report["backward"]["eager"] == []


# --------------------------------------------------------------------------- optimizers


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
], ids=["sgd", "adam", "adamw"])
def test_compiled_optimizer_step_updates_like_eager(make):
    """``torch.compile``d ``optimizer.step()``: the graph updates its inputs in place
    (parameters, moments, the step count), which opfuse writes back after computing the
    new values; nothing eager (Adam's ``beta ** step`` and ``lerp``'s ``fma`` have rules).
    Regression: the backend raised on the in-place updates ("PARAMETER_MUTATION
    unsupported"), failing the user's step, instead of compiling it. (The invalid IR
    opfuse-fuse-recompute made of Adam's step while those two ops were eager is
    test/regressions/recompute-clone-before-its-operands.mlir.)"""
    torch.manual_seed(0)

    def mlp():
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    model, twin = mlp(), mlp()
    twin.load_state_dict(model.state_dict())
    opt, twin_opt = make(model.parameters()), make(twin.parameters())

    @torch.compile(backend="opfuse", options={"backend": "cpu"})
    def step():
        opt.step()

    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            for m, o, s in ((model, opt, step), (twin, twin_opt, twin_opt.step)):
                o.zero_grad()
                m(x).square().mean().backward()
                s()
    assert [str(w.message) for w in seen if "opfuse" in str(w.message)] == []
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    report = torch_backend.compiled_graphs()[-1].report
    assert report["eager"] == []
    assert report["totals"]["after"]["kernels"] < report["totals"]["before"]["kernels"]


class _Counts(nn.Module):
    def forward(self, mask, x):
        return mask.sum(), mask.sum(1), mask.sum(dim=0, keepdim=True), (x > 0).sum(-1)


def test_boolean_counts_compile_exactly(monkeypatch):
    """``mask.sum()`` (torch: an int64 count) was left eager ("a reduction of i8 values"):
    it is summed as float32, exact up to 2**24 booleans, and refused (eager, named) above."""
    from opfuse.frontends.torch import aten_reductions

    torch.manual_seed(0)
    mask, x = torch.rand(3, 7) > 0.4, torch.randn(3, 5, 6)
    fast = opfuse.torch.compile(_Counts(), (mask, x), backend="cpu")
    assert fast.report["eager"] == []
    with torch.no_grad():
        for got, want in zip(fast(mask, x), _Counts()(mask, x)):
            assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)
    monkeypatch.setattr(aten_reductions, "COUNT_LIMIT", 6)  # mask.sum() counts 21
    with pytest.warns(opfuse.torch.FallbackWarning, match="a count of 21 booleans"):
        partial = opfuse.torch.compile(_Counts(), (mask, x), backend="cpu")
    with torch.no_grad():
        for got, want in zip(partial(mask, x), _Counts()(mask, x)):
            assert torch.equal(got, want)
