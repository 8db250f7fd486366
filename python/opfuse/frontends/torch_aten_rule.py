"""How an ATen rule is written: what it is called with, how it registers, shared checks.

A rule imports one ATen overload. The importer calls it as ``rule(imp, *args, **kwargs)``
with the FX node's arguments, every fx node among them replaced by its builder value
(a :class:`~opfuse.frontends.builder.Tensor`, or a list of them for multi-result ops), and
keeps what it returns as the node's value. ``imp`` is a :class:`RuleContext`: the graph
being built, the node, its name, and the error for an argument the rule cannot import.

Each rule family (``torch_aten_pointwise``, ``torch_aten_reductions``, ``torch_aten_matmul``,
``torch_aten_views``) fills its own table through :func:`registrar`; ``torch_aten`` merges
the tables into the one the importer looks ops up in.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..errors import OpfuseError
from .builder import Tensor
from .torch_graph import TorchGraph

Rule = Callable[..., Any]

# torch dtypes the importer accepts, as builder dtypes.
DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}


class RuleContext(Protocol):
    """What a rule may use of the importer (``opfuse.frontends.torch``) that calls it.

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


def const_dtype(imp: RuleContext, x: Tensor, dtype: Any) -> None:
    """Reject a ``dtype=`` argument that would cast (the builder has no cast op)."""
    if dtype is not None and DTYPES.get(str(dtype)) != x.dtype:
        raise imp.unsupported(f"dtype={dtype} on a {x.dtype} tensor (no cast op)")
