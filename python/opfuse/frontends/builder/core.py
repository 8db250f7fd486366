"""The core of the builder :class:`~opfuse.frontends.builder.graph.Graph`: construction, inputs and
outputs, naming and scopes, operand checks, and printing.

The op families are mixins on top of :class:`GraphCore` (``builder_generics``,
``builder_elementwise``, ``builder_movement``, ``builder_reductions``,
``builder_composites``, ``builder_reference``); ``Graph`` in ``opfuse.frontends.builder.graph``
joins them and documents the IR conventions they follow.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

from ...errors import OpfuseError
from .tensor import DTYPES, Axes, Shape, Tensor, _check_dtype, _check_name, _is_int, _Node


def _reassociation(small: Shape, big: Shape) -> list[list[int]] | None:
    """Groups of ``big``'s dims whose products are ``small``'s dims, or None if none exist."""
    if math.prod(small) != math.prod(big):
        return None
    groups: list[list[int]] = []
    j = 0
    for size in small:
        if j >= len(big):
            return None
        group, prod = [j], big[j]
        j += 1
        while prod < size and j < len(big):
            group.append(j)
            prod *= big[j]
            j += 1
        if prod != size:
            return None
        groups.append(group)
    if j < len(big):  # trailing 1s join the last group
        if not groups:
            return [] if all(d == 1 for d in big) else None
        groups[-1].extend(range(j, len(big)))
    return groups


class GraphCore:
    """What every op of a :class:`~opfuse.frontends.builder.graph.Graph` builds on (see there)."""

    def __init__(self, name: str, dtype: str = "f32", *, doc: str | None = None):
        self.name = _check_name(name, "graph name")
        self.dtype = _check_dtype(dtype, DTYPES)
        self.doc = doc
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self._nodes: list[_Node] = []  # in creation order, which is a topological order
        self._used_names: set[str] = set()
        self._next_suffix: dict[str, int] = {}
        self._scopes: list[str] = []

    # ----------------------------------------------------------------- graph edges

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> Tensor:
        """Declare a function argument.

        Args:
            name: Argument name: its SSA name, location and :meth:`reference` keyword.
            shape: Static shape; every dim a positive integer.
            dtype: Element type; the graph's default if None. ``i8`` inputs hold booleans
                (0 or 1, like a numpy/torch bool array viewed as int8).

        Returns:
            The argument's tensor handle.
        """
        if _check_name(name, "input name") in self._used_names:
            raise OpfuseError(f"input name {name!r} is already used in graph {self.name!r}")
        shape = self._check_shape(shape, f"input {name!r}")
        self._used_names.add(name)
        t = Tensor(self, _Node("input", name, shape, _check_dtype(dtype or self.dtype)), shape)
        self.inputs.append(t)
        return t

    def output(self, *tensors: Tensor) -> None:
        """Append results to the function (order kept); pending keepdims are materialized."""
        for t in tensors:
            self.outputs.append(self._materialize(self._own(t)))

    def unexpanded(self, t: Tensor) -> Tensor:
        """The value behind ``t`` without its pending keepdims 1s (``t`` itself if it has
        none): a caller that views the result as ``t.shape`` outside the program saves the
        kernel that would copy it into that shape."""
        t = self._own(t)
        return Tensor(self, t.node, t.node.shape) if t.lazy else t

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[str]:
        """Name the ops built inside the block ``<scope>.<op>`` (``blk.mul``).

        Scopes nest (``blk.ln.sub``) and are made unique (``blk``, ``blk_1``).

        Yields:
            The scope's full name.
        """
        with self._scope(self._unique(self._scoped(None, _check_name(name)))) as full:
            yield full

    # ----------------------------------------------------------------- results

    def to_mlir(self, comment: str | None = None) -> str:
        """MLIR text of a module holding one ``func.func @<name>``.

        Only ops that reach an output are printed, in the form ``opfuse.frontends.builder.graph``
        documents.

        Args:
            comment: First-line comment; defaults to the graph's ``doc``.
        """
        if not self.outputs:
            raise OpfuseError(f"graph {self.name!r} has no outputs")
        from .printer import Printer  # noqa: PLC0415  (the printer imports this module)

        return Printer(self).module(comment or self.doc)

    def to_module(self, ctx: Any = None) -> Any:
        """The parsed and verified ``mlir.ir.Module`` (raises OpfuseError if invalid)."""
        from ...ir import parse_module

        return parse_module(self.to_mlir(), ctx, filename=f"{self.name}.mlir")

    # ----------------------------------------------------------------- naming

    def _unique(self, base: str) -> str:
        # remember the last suffix per base: probing from 0 every time made building an
        # n-op graph quadratic
        k = self._next_suffix.get(base, 0)
        name = base if k == 0 else f"{base}_{k}"
        while name in self._used_names:
            k += 1
            name = f"{base}_{k}"
        self._next_suffix[base] = k + 1
        self._used_names.add(name)
        return name

    def _scoped(self, name: str | None, default: str) -> str:
        """``name`` as given (checked), else ``<innermost scope>.<default>``."""
        if name is not None:
            return _check_name(name)
        return f"{self._scopes[-1]}.{default}" if self._scopes else default

    @contextlib.contextmanager
    def _scope(self, full: str) -> Iterator[str]:
        self._scopes.append(full)
        try:
            yield full
        finally:
            self._scopes.pop()

    def _composite(self, name: str | None, default: str) -> contextlib.AbstractContextManager:
        """The scope of a composite op: ``name`` as given, else nested ``default``."""
        return self._scope(self._unique(self._scoped(name, default)))

    def _node(
        self,
        op: str,
        name: str | None,
        shape: Shape,
        dtype: str,
        args: tuple,
        default: str | None = None,
        *,
        exact: str | None = None,
        **attrs: Any,
    ) -> _Node:
        """Append a node named ``exact``, else ``name``/``<scope>.<default or op>`` made unique."""
        if exact is None:
            exact = self._unique(self._scoped(name, default or op))
        node = _Node(op, exact, shape, dtype, args, attrs)
        self._nodes.append(node)
        return node

    # ----------------------------------------------------------------- checks

    def _own(self, t: Any) -> Tensor:
        if not isinstance(t, Tensor):
            raise OpfuseError(f"expected a Tensor, got {type(t).__name__}")
        if t.graph is not self:
            raise OpfuseError(f"tensor {t.name!r} belongs to graph {t.graph.name!r}")
        return t

    @staticmethod
    def _check_shape(shape: Sequence[int], what: str) -> Shape:
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise OpfuseError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
        if any(d <= 0 for d in dims):
            raise OpfuseError(f"{what}: static positive dims only, got {dims}")
        return dims

    @staticmethod
    def _axes(x: Tensor, axis: Axes) -> tuple[int, ...]:
        raw = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
        axes = []
        for a in raw:
            if not -x.ndim <= int(a) < x.ndim:
                raise OpfuseError(f"axis {a} out of range for shape {x.shape}")
            axes.append(int(a) % x.ndim)
        if len(set(axes)) != len(axes):
            raise OpfuseError(f"repeated axis in {tuple(raw)}")
        return tuple(sorted(axes))

    @staticmethod
    def _same_dtype(op: str, tensors: Sequence[Tensor]) -> str:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise OpfuseError(f"{op}: operands have different dtypes {sorted(dtypes)}")
        return dtypes.pop()

    @staticmethod
    def _float_only(op: str, tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            if _is_int(t.dtype):
                raise OpfuseError(f"{op}: {t.dtype} operands are not supported (cast first)")

    @staticmethod
    def _check_scalar(op: str, value: Any, dtype: str, what: str = "scalar") -> None:
        """A python number that an op of ``dtype`` holds as a constant."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OpfuseError(f"{op}: unsupported {what} {value!r}")
        if _is_int(dtype) and not (math.isfinite(value) and float(value).is_integer()):
            raise OpfuseError(f"{op}: {what} {value!r} is not an integer ({dtype} operands)")

    # ----------------------------------------------------------------- op construction

    def _materialize(self, t: Tensor) -> Tensor:
        """``t`` with its pending keepdims 1s made real by one ``tensor.expand_shape``."""
        if not t.lazy:
            return t
        if t._materialized is None:
            value = Tensor(self, t.node, t.node.shape)
            groups = _reassociation(t.node.shape, t.shape)
            full = self._unique(f"{t.node.name}.keepdims")
            node = self._node("expand", None, t.shape, t.dtype, (value,), exact=full, groups=groups)
            t._materialized = Tensor(self, node, t.shape)
        return t._materialized

    def _live_nodes(self) -> list[_Node]:
        """Non-input nodes that reach an output, in creation order."""
        live: set[int] = set()
        stack = [t.node for t in self.outputs]
        while stack:
            n = stack.pop()
            if id(n) not in live:
                live.add(id(n))
                stack.extend(a.node for a in n.args if isinstance(a, Tensor))
        return [n for n in self._nodes if id(n) in live]
