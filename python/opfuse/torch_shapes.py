"""Dynamo's symbolic graphs on opfuse: one static specialization per shape the model is
called with.

Called at a second shape, ``torch.compile`` (automatic dynamic, or ``dynamic=True``) hands
the backend a graph whose sizes are symbols: ``SymInt`` inputs and tensors of symbolic
shape. opfuse's kernels are compiled for static shapes, so the backend compiles the
graph again at each concrete shape it is called with, on that call, and keeps what it
compiled for the next call with the same sizes (XLA's answer to new shapes; Inductor
instead compiles one kernel for the symbolic sizes). Nothing runs eagerly while at most
:data:`SHAPE_LIMIT` shapes have been seen: a model called at a few batch sizes or
sequence lengths stays compiled for all of them, each new shape costs one compile.

Each compile costs time (with the first call's JIT: about 3 s for a small transformer
block, 5 s for a tiny Hugging Face decoder, on a 2-vCPU machine), so a graph stops
compiling new shapes once its compiles have taken ``OPFUSE_TORCH_SHAPE_SECONDS`` (15 s)
or :data:`SHAPE_LIMIT` shapes: a ``generate()`` loop, whose cache grows by one position per token, would
otherwise compile at every step and never reuse a kernel. A new shape past the limit
runs the graph eagerly, named once by a :class:`FallbackWarning`; the shapes already
compiled stay compiled. Every specialization's report is in :attr:`reports`.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import torch

from . import config
from .torch_partitions import warn

#: Shapes compiled per graph before a new one runs eagerly (Dynamo's own recompile limit).
SHAPE_LIMIT = 8


def is_symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo traced the graph with symbolic sizes (a ``SymInt``/``SymFloat``/
    ``SymBool`` input, or a tensor with a symbolic size)."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for a in example_inputs:
        if isinstance(a, sym):
            return True
        if isinstance(a, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in a.shape):
            return True
    return False


def shape_key(args: Sequence[Any], scalars: Sequence[int] = ()) -> tuple:
    """What a static specialization is keyed on: each tensor's shape, dtype and device,
    each scalar's value (a ``SymInt`` input arrives as the int of this call), and the
    value of the 0-d tensors at positions ``scalars`` (:func:`item_inputs`)."""
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            value = a.item() if i in scalars else None
            key.append(("tensor", tuple(a.shape), a.dtype, a.device.type, value))
        else:
            key.append(("value", type(a).__name__, a))
    return tuple(key)


def item_inputs(gm: Any) -> list[int]:
    """The inputs ``gm`` reads only through ``.item()``: Dynamo passes a float it made
    dynamic (``dynamic=True``: a LayerNorm's ``eps``) as a 0-d tensor and reads it back
    with ``item()``, which ``torch.export`` cannot trace (a data-dependent value)."""
    graph = getattr(gm, "graph", None)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"] if graph is not None else []
    return [i for i, p in enumerate(placeholders)
            if p.users and all(u.op == "call_method" and u.target == "item" for u in p.users)]


def with_items_as_constants(gm: Any, args: Sequence[Any], scalars: Sequence[int]) -> Any:
    """A copy of ``gm`` whose ``.item()`` reads of inputs ``scalars`` return this call's
    values as Python constants (so the export specializes on them, as on the shapes)."""
    if not scalars:
        return gm
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i in scalars:
        value = args[i].item()
        for user in list(placeholders[i].users):
            user.op, user.target = "call_function", _constant
            user.args, user.kwargs = (placeholders[i], value), {}
    return torch.fx.GraphModule(gm, graph)


def _constant(_tensor: Any, value: Any) -> Any:
    return value


def describe_shapes(args: Sequence[Any]) -> str:
    """The call's tensor shapes and scalars, for messages: ``(4, 77), s=77``."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(str(tuple(a.shape)))
        elif isinstance(a, (int, float, bool)):
            parts.append(repr(a))
    return ", ".join(parts)


class ShapeSpecializedGraph:
    """What the backend returns for a symbolic graph: Dynamo calls it with each call's
    concrete inputs; it runs the specialization compiled for their shapes.

    Attributes:
        gm: Dynamo's graph (run eagerly past :data:`SHAPE_LIMIT`).
        specializations: the compiled callables by :func:`shape_key`.
        compiles: how many specializations were compiled (shapes seen within the limit).
    """

    def __init__(self, gm: Any, compile_static: Callable[[Any, Sequence[Any]], Callable],
                 limit: int = SHAPE_LIMIT, seconds: float | None = None):
        self.gm = gm
        self.specializations: dict[tuple, Callable] = {}
        self.compiles = 0
        self._compile = compile_static
        self._limit = limit
        self._seconds = float(config.TORCH_SHAPE_SECONDS.get()) if seconds is None else seconds
        self.compile_seconds = 0.0
        self._warned = False
        self._scalars = item_inputs(gm)

    @property
    def reports(self) -> list[dict]:
        """The report of every compiled specialization (``{"shapes": ..., **report}``)."""
        out = []
        for key, fn in self.specializations.items():
            report = getattr(fn, "report", None)
            if report is not None:
                shapes = [k[1] for k in key if k[0] == "tensor"]
                out.append({"shapes": shapes, **report})
        return out

    def __call__(self, *args: Any) -> Any:
        key = shape_key(args, self._scalars)
        fn = self.specializations.get(key)
        if fn is None:
            spent = self._spent()
            if spent:
                if not self._warned:
                    self._warned = True
                    warn(f"running eagerly at shape {_short(describe_shapes(args))}, not "
                         f"compiled: {spent} (opfuse compiles a static kernel per shape; "
                         "the shapes compiled so far stay compiled)")
                return self.gm.forward(*args)
            # the first call is timed with the compile: the CPU code is JIT-compiled there
            start = time.perf_counter()
            fn = self._compile(with_items_as_constants(self.gm, args, self._scalars), args)
            self.compiles += 1
            self.specializations[key] = fn
            try:
                return fn(*args)
            finally:
                self.compile_seconds += time.perf_counter() - start
        return fn(*args)


    def _spent(self) -> str:
        """Why no new shape is compiled any more ("" while one may be)."""
        if self.compiles >= self._limit:
            return f"{self.compiles} shapes of this graph are compiled already"
        if self.compiles and self.compile_seconds >= self._seconds:
            return (f"compiling this graph's {self.compiles} shape(s) took "
                    f"{self.compile_seconds:.1f} s, the budget of OPFUSE_TORCH_SHAPE_SECONDS="
                    f"{self._seconds:g}")
        return ""


class DimCompiledModule:
    """``opfuse.torch.compile(model, example, dynamic_shapes=...)``: a model whose dims
    the user declared dynamic with torch.export's ``Dim`` API, compiled at each call's
    shapes (the example's is compiled up front; every new shape on its first call).

    ``dynamic_shapes`` is checked by ``torch.export`` once, against the example: a
    declared-dynamic dim the model specializes, or a constraint the example breaks, is an
    OpfuseError naming it. A call at new shapes compiles that static program; the
    compiled shapes are in :attr:`specializations`, the latest one's report in
    :attr:`report`.
    """

    def __init__(self, model: Any, compile_at: Callable[[tuple, dict], Any],
                 example_args: tuple, example_kwargs: dict):
        self.model = model
        self.specializations: dict[tuple, Any] = {}
        self._compile_at = compile_at
        self._latest: Any = None
        self._get(example_args, example_kwargs)

    def _get(self, args: tuple, kwargs: dict) -> Any:
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        key = shape_key(leaves)
        compiled = self.specializations.get(key)
        if compiled is None:
            compiled = self._compile_at(args, kwargs)
            self.specializations[key] = compiled
        self._latest = compiled
        return compiled

    @property
    def report(self) -> dict:
        """The report of the specialization of the latest call (with its ``shapes``)."""
        return self._latest.report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get(args, kwargs)(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"DimCompiledModule({type(self.model).__name__}, "
                f"{len(self.specializations)} shape(s) compiled)")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + ", ..."


__all__ = ["SHAPE_LIMIT", "DimCompiledModule", "ShapeSpecializedGraph", "describe_shapes", "is_symbolic", "item_inputs",
           "shape_key", "with_items_as_constants"]
