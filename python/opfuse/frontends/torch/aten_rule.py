"""How an ATen rule is written: what it is called with, how it registers, shared checks.

A rule imports one ATen overload. The importer calls it as ``rule(imp, *args, **kwargs)``
with the FX node's arguments, every fx node among them replaced by its builder value
(a :class:`~opfuse.frontends.builder.graph.Tensor`, or a list of them for multi-result ops), and
keeps what it returns as the node's value. ``imp`` is a :class:`RuleContext`: the graph
being built, the node, its name, and the error for an argument the rule cannot import.

Each rule family (``aten_pointwise``, ``aten_reductions``, ``aten_matmul``,
``aten_views``, ``aten_factories``) fills its own table through :func:`registrar`;
``aten`` merges the tables into the one the importer looks ops up in.

Dtypes follow torch's: a rule casts its tensor operands to the dtype torch computes in
(:func:`promote`; ``bool * 1.0`` multiplies in f32), and the importer checks that every
result has the dtype torch gives the node. torch's bools are the builder's i8 booleans and
its int64 the builder's i64.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from ...errors import OpfuseError
from ..builder.graph import Tensor
from .graph import TorchGraph

Rule = Callable[..., Any]

# torch dtypes the importer builds values of, as builder dtypes: floats, and the booleans
# and integers that masks are made of.
DTYPES = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.bool": "i8",
    "torch.int64": "i64",
    "torch.int32": "i32",
}
# The dtypes a graph argument (user input, parameter, buffer, constant) may have: a bool
# argument is passed as int8 (0 or 1), the i8 booleans the builder stores; int64 (token
# ids, position ids, attention masks) as it is.
INPUT_DTYPES = {
    "torch.float32", "torch.float16", "torch.bfloat16", "torch.bool", "torch.int64", "torch.int32"
}


class RuleContext(Protocol):
    """What a rule may use of the importer (``opfuse.frontends.torch.importer``) that calls it.

    Attributes:
        g: The graph being built.
        node: The FX node being imported (its ``users`` tell which results are read).
    """

    g: TorchGraph
    node: Any

    @property
    def name(self) -> str:
        """The node's name: the builder name of the op it becomes."""

    def unsupported(self, detail: str) -> OpfuseError:
        """The error to raise for an argument of the node that has no rule."""


def registrar(table: dict[str, Rule]) -> Callable[..., Callable[[Rule], Rule]]:
    """A decorator factory that registers rules in ``table``: ``@rule("aten.add.Tensor")``."""

    def rule(*ops: str) -> Callable[[Rule], Rule]:
        """Register a rule for ATen overloads (``str(torch.ops.aten.add.Tensor)``)."""

        def register(fn: Rule) -> Rule:
            for op in ops:
                table[op] = fn
            return fn

        return register

    return rule


def builder_dtype(imp: RuleContext, dtype: Any) -> str:
    """The builder dtype of a torch dtype; one without a builder dtype is ``imp``'s error."""
    if str(dtype) not in DTYPES:
        raise imp.unsupported(f"dtype {dtype}")
    return DTYPES[str(dtype)]


def result_dtype(imp: RuleContext) -> str:
    """The builder dtype torch gives the node's (first) result."""
    val = imp.node.meta.get("val")
    val = val[0] if isinstance(val, (list, tuple)) else val
    return builder_dtype(imp, val.dtype)


def operand_dtype(imp: RuleContext, count: int = 2) -> str:
    """The dtype torch computes the node's first ``count`` arguments in
    (``torch.result_type``: ``int_tensor < 0.5`` compares in f32)."""
    import torch

    args = [a.meta["val"] if hasattr(a, "meta") else a for a in imp.node.args[:count]]
    return builder_dtype(imp, torch.result_type(*args))


def promote(imp: RuleContext, *operands: Any, dtype: str | None = None) -> Sequence[Any]:
    """``operands`` with every tensor cast to ``dtype`` (default: the node's result dtype);
    python numbers are left as they are."""
    dtype = dtype or result_dtype(imp)
    return [
        imp.g.cast(o, dtype, name=f"{imp.name}.cast") if isinstance(o, Tensor) else o
        for o in operands
    ]


def with_dtype(imp: RuleContext, x: Tensor, dtype: Any) -> Tensor:
    """``x`` cast to a ``dtype=`` argument (sum, softmax): torch converts the input first."""
    return x if dtype is None else imp.g.cast(x, builder_dtype(imp, dtype), name=f"{imp.name}.cast")
