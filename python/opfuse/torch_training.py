"""Training through ``torch.compile(backend="opfuse")``: the forward and the backward graph.

Called while autograd records (grad mode on, and a graph input such as a parameter that
requires grad), Dynamo's graph goes through AOTAutograd, as Inductor's does: it traces the
joint forward-backward graph in core ATen (opfuse's decomposition table), a partitioner
splits it into a forward graph, which also returns the tensors the backward needs, and a
backward graph, which takes those and the output gradients; opfuse compiles both, each
like any other graph (split into the partitions it supports, fused, run on its backend).
Both graphs are static: a graph Dynamo traced with symbolic sizes is specialized per shape
before it reaches AOTAutograd (``torch_backend``). ``loss.backward()`` then runs opfuse's
backward kernels.

Before AOTAutograd, ``scaled_dot_product_attention`` is spelled in the ops it computes
(:func:`attention_math`: two matmuls and a softmax), so autograd differentiates those and
the backward is matmuls and a softmax backward that opfuse compiles. Differentiated whole,
SDPA would become PyTorch's CPU flash-attention kernel and its backward, which opfuse has
no rule for (a FlashAttention-2 backward kernel is not built yet); the forward, imported,
still becomes one attention kernel where the partitioner saves nothing from inside it.

What the forward saves for the backward, against what the backward recomputes from fewer
saved tensors, is a fusion decision and is judged by the cost guard
(:func:`judge_recompute`): AOTAutograd's min-cut partitioner proposes the recomputation
(it keeps cheap elementwise chains out of the saved set), the default partitioner's save-
everything split is the alternative, and ``recompute_guard`` weighs the saved tensors'
round trip (written by the forward, read by the backward) against the recomputed ops'
flops. The verdict is a ledger entry in the graph's report (``report["recompute"]``),
with the saved tensors and the recomputed ops.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from . import kinds
from .analysis.ledger import Decision
from .cost.guard import GuardOptions, estimate_registers, recompute_guard
from .frontends.torch.decompositions import decomposition_table

#: The ledger's name for the save-or-recompute decision.
PASS_NAME = "opfuse-training-partition"


def is_training(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo traced the graph while autograd records: grad mode on and an input
    (a parameter, once Dynamo lifts them, or a user tensor) that requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


@dataclass
class TrainingGraph:
    """What the backend returns for a graph traced with autograd recording: AOTAutograd's
    function (the forward runs opfuse's forward graph, ``backward()`` its backward graph)
    and what was compiled for it.

    Attributes:
        forward, backward: the compiled graphs (each has a ``report``); ``backward`` is
            None until the first ``backward()`` (AOTAutograd compiles it then).
        recompute: the ledger entry of the save-or-recompute decision.
        saved: the tensors the forward saves for the backward (name, shape, dtype, bytes).
        recomputed: the forward ops the backward computes again.
    """

    function: Callable | None = None
    forward: Any = None
    backward: Any = None
    recompute: Decision | None = None
    saved: list[dict[str, Any]] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    @property
    def report(self) -> dict[str, Any]:
        """The forward's and the backward's reports, their totals summed (``totals``), the
        saved tensors, the recomputed ops and the decision between them."""
        graphs = {"forward": self.forward, "backward": self.backward}
        reports = {k: getattr(g, "report", None) for k, g in graphs.items()}
        keys = ("kernels", "bytes", "flops")
        totals = {side: {k: sum(r["totals"][side][k] for r in reports.values() if r)
                         for k in keys} for side in ("before", "after")}
        return {
            **reports,
            "totals": totals,
            "eager": [e for r in reports.values() if r for e in r.get("eager", [])],
            "saved": self.saved,
            "saved_bytes": sum(s["bytes"] for s in self.saved),
            "recomputed": self.recomputed,
            "recompute": self.recompute.to_json() if self.recompute else None,
        }


def compile_training(gm: Any, example_inputs: Sequence[Any],
                     compile_graph: Callable[[Any, Sequence[Any]], Callable],
                     options: GuardOptions | None = None) -> TrainingGraph:
    """``gm`` through AOTAutograd, its forward and backward graphs compiled by
    ``compile_graph(graph, example_inputs)`` (the backend's compile of one graph)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    record = TrainingGraph()
    guard_options = options or GuardOptions()

    def forward(graph: Any, inputs: Sequence[Any]) -> Callable:
        record.forward = compile_graph(graph, inputs)
        return make_boxed_func(record.forward)

    def backward(graph: Any, inputs: Sequence[Any]) -> Callable:
        record.backward = compile_graph(graph, inputs)
        return make_boxed_func(record.backward)

    def partition(joint: Any, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        return _partition(record, guard_options, joint, joint_inputs,
                          num_fwd_outputs=num_fwd_outputs, **kwargs)

    gm = differentiable_attention(gm)
    record.function = aot_autograd(
        fw_compiler=forward, bw_compiler=backward, partition_fn=partition,
        decompositions=decomposition_table(),
    )(gm, example_inputs)
    return record


def attention_math(query: Any, key: Any, value: Any, attn_mask: Any = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                   enable_gqa: bool = False) -> Any:
    """``F.scaled_dot_product_attention`` in the ops PyTorch's math backend runs: scaled
    scores, the mask (causal: top-left aligned, as SDPA's), softmax, dropout, times V."""
    import torch.nn.functional as F

    length, keys = query.size(-2), key.size(-2)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa and key.size(-3) != query.size(-3):
        groups = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    scores = (query @ key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(length, keys, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    return weights @ value


def differentiable_attention(gm: Any) -> Any:
    """``gm`` with its ``scaled_dot_product_attention`` calls made :func:`attention_math`
    (``gm`` itself when it has none)."""
    import torch.nn.functional as F

    def is_sdpa(node: Any) -> bool:
        return node.op == "call_function" and node.target is F.scaled_dot_product_attention

    graph = getattr(gm, "graph", None)
    if graph is None or not any(is_sdpa(n) for n in graph.nodes):
        return gm
    graph = copy.deepcopy(graph)
    for node in graph.nodes:
        if is_sdpa(node):
            node.target = attention_math
    return torch.fx.GraphModule(gm, graph)


def _partition(record: TrainingGraph, options: GuardOptions, joint: Any, joint_inputs: Any,
               *, num_fwd_outputs: int, **kwargs: Any) -> tuple[Any, Any]:
    """The min-cut split if the guard takes its recomputation, else the default split;
    the decision and the chosen split's saved tensors go into ``record``."""
    from torch._functorch.partitioners import (
        default_partition,
        min_cut_rematerialization_partition,
    )

    forward_names = _forward_node_names(joint)
    # the default partitioner only tags nodes (as min-cut would); min-cut then rewrites the
    # joint graph (dead code, CSE), so it runs second
    saving = default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    recomputing = min_cut_rematerialization_partition(
        joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    decision = judge_recompute(saved_values(saving[0], num_fwd_outputs),
                               saved_values(recomputing[0], num_fwd_outputs),
                               recomputed_nodes(recomputing[1], forward_names), options)
    chosen = recomputing if decision.fused else saving
    record.recompute = decision
    record.saved = saved_values(chosen[0], num_fwd_outputs)
    record.recomputed = ([n.name for n in recomputed_nodes(chosen[1], forward_names)]
                         if decision.fused else [])
    return chosen


def _forward_node_names(joint: Any) -> set[str]:
    """The joint graph's forward nodes: those the output gradients (``tangents_*``) do not
    reach."""
    backward: set[str] = set()
    for node in joint.graph.nodes:
        if node.op == "placeholder" and node.name.startswith("tangents"):
            backward.add(node.name)
        elif any(getattr(a, "name", None) in backward for a in node.all_input_nodes):
            backward.add(node.name)
    return {n.name for n in joint.graph.nodes if n.name not in backward and n.op != "output"}


def saved_values(forward: Any, num_fwd_outputs: int) -> list[dict[str, Any]]:
    """The forward graph's outputs past the model's own: what it saves for the backward."""
    output = next(n for n in forward.graph.nodes if n.op == "output")
    values = output.args[0][num_fwd_outputs:]
    out = []
    for v in values:
        val = v.meta.get("val") if hasattr(v, "meta") else None
        if not isinstance(val, torch.Tensor):  # a scalar the backward needs
            continue
        out.append({"name": v.name, "shape": [int(d) for d in val.shape],
                    "dtype": str(val.dtype).removeprefix("torch."),
                    "bytes": val.numel() * val.element_size()})
    return out


def recomputed_nodes(backward: Any, forward_names: set[str]) -> list[Any]:
    """The backward graph's compute nodes that are forward nodes of the joint graph."""
    return [n for n in backward.graph.nodes
            if n.op == "call_function" and n.name in forward_names]


def judge_recompute(saved_all: list[dict], saved_fewer: list[dict], recomputed: list[Any],
                    options: GuardOptions) -> Decision:
    """The guard's verdict on recomputing ``recomputed`` in the backward so that the
    forward saves ``saved_fewer`` instead of ``saved_all``.

    Each saved tensor costs its bytes twice (the forward's kernel writes it, the
    backward's reads it), so Q is twice the saved bytes on each side; the recomputation
    adds its ops' flops (one per output element of each recomputed op) to W, and its live
    values to the backward kernels' registers (the loop kernel's register model, with a
    pointer per saved tensor a recomputed op reads and a live value per recomputed op).
    A recomputation that saves no bytes, or whose flops cost more than the round trips it
    saves, is refused, and the forward saves everything.
    """
    q_all = 2 * sum(s["bytes"] for s in saved_all)
    q_fewer = 2 * sum(s["bytes"] for s in saved_fewer)
    w = sum(_numel(n) for n in recomputed)
    registers = max((_chain_registers(c) for c in _chains(recomputed)), default=0)
    verdict = recompute_guard(registers, [(q_all, 0)], [(q_fewer, w)], options)
    ops = f"{len(recomputed)} op(s)" if recomputed else "nothing"
    return Decision(
        pass_name=PASS_NAME,
        producer=f"forward (saves {len(saved_all)} tensors, {q_all // 2} B)",
        consumer=f"backward (recomputes {ops}, forward saves {len(saved_fewer)}, "
                 f"{q_fewer // 2} B)",
        location="aot_autograd",
        fused=verdict.fuse and bool(recomputed),
        reason=verdict.reason if recomputed else "min-cut recomputes nothing",
        action="duplicate",
        numbers=verdict.numbers,
        would_fuse_with=verdict.would_fuse_with,
    )


def _chains(nodes: list[Any]) -> list[list[Any]]:
    """``nodes`` in connected chains (joined where one reads another): each chain is
    recomputed inside one backward kernel, so registers are counted per chain."""
    names = {n.name: n for n in nodes}
    parent = {name: name for name in names}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for n in nodes:
        for a in n.all_input_nodes:
            if a.name in names:
                parent[root(a.name)] = root(n.name)
    chains: dict[str, list[Any]] = {}
    for n in nodes:
        chains.setdefault(root(n.name), []).append(n)
    return list(chains.values())


def _chain_registers(chain: list[Any]) -> int:
    """The loop kernel's register model for one recomputed chain: a pointer per tensor
    it reads from outside, a live value per op, its widest element."""
    inside = {n.name for n in chain}
    reads = {a.name for n in chain for a in n.all_input_nodes} - inside
    vals = [n.meta.get("val") for n in chain]
    element = max((v.element_size() for v in vals if isinstance(v, torch.Tensor)), default=4)
    return estimate_registers(kinds.DEFAULT, max(1, len(reads)), len(chain), element)


def _numel(node: Any) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.numel()
    if isinstance(val, (tuple, list)):
        return sum(v.numel() for v in val if isinstance(v, torch.Tensor))
    return 1


__all__ = ["PASS_NAME", "TrainingGraph", "attention_math", "compile_training",
           "differentiable_attention", "is_training", "judge_recompute",
           "recomputed_nodes", "saved_values"]
