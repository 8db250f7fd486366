"""PyTorch in: ``torch.export`` (core ATen) -> the opfuse graph builder -> linalg on tensors.

``import_module(model, example_inputs)`` exports the model (non-strict), runs the program
through opfuse's decomposition table (``torch_decompositions``) and replays every ATen op
on an ``opfuse.builder.Graph``. The builder writes the IR the fusion passes expect, so an
imported model fuses exactly like the same model written with the builder
(``opfuse.frontends.graphs``), and its ``reference()`` evaluates the imported graph in numpy.

Calling convention of the imported function (``ImportedGraph.inputs``):

* the user inputs first, in the order of the model's flattened ``example_inputs``;
* then the parameters, buffers and lifted tensor constants the graph reads, in the order
  of the exported program's graph signature (``ImportedGraph.params`` holds the tensors,
  the module's own, not copies). They are arguments, never constants in the module.
  Parameters and buffers that the graph does not read are left out.

Static shapes only; float32, float16 and bfloat16 tensors. An ATen op without a rule here
raises :class:`UnsupportedOpError` (an ``OpfuseError``) naming the op and the module path
where the model calls it.

torch is imported lazily: ``import opfuse`` works without it.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from . import printer as _printer
from .builder import Graph, Tensor
from .torch_decompositions import decomposition_table

_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
# Export bookkeeping nodes that compute nothing (runtime checks of static facts).
_IGNORED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
            "aten.sym_constrain_range_for_size.default"}


class UnsupportedOpError(OpfuseError):
    """An ATen op (or an argument of one) the importer has no rule for.

    Attributes:
        op: The ATen overload, e.g. ``aten.cumsum.default``.
        where: The module path and source line that call it.
    """

    def __init__(self, op: str, where: str, detail: str = ""):
        super().__init__(f"unsupported op {op}{': ' + detail if detail else ''} (at {where})")
        self.op = op
        self.where = where


@dataclass(frozen=True)
class GraphInput:
    """One argument of the imported function.

    Attributes:
        name: The builder input's name (the exported program's placeholder name).
        kind: ``user``, ``parameter``, ``buffer`` or ``constant``.
        target: The parameter/buffer/constant's fully qualified name; None for user inputs.
        shape: Static shape.
        dtype: ``f32``, ``f16`` or ``bf16``.
    """

    name: str
    kind: str
    target: str | None
    shape: tuple[int, ...]
    dtype: str


@dataclass
class ImportedGraph:
    """A model imported into a builder :class:`Graph`, and how to call it.

    Attributes:
        graph: The builder graph; ``graph.to_mlir()`` is the linalg module.
        inputs: The function's arguments in order (user inputs, then ``params``).
        params: The tensors passed after the user inputs, one per non-user input.
        outputs: The exported program's output node names, one per function result.
        in_spec: ``torch.utils._pytree`` spec of the model's ``(args, kwargs)``.
        out_spec: pytree spec that rebuilds the model's output structure from the results.
        aten_ops: How many times each ATen op was imported.
    """

    graph: Graph
    inputs: list[GraphInput]
    params: list[Any]
    outputs: list[str]
    in_spec: Any = None
    out_spec: Any = None
    aten_ops: Counter = field(default_factory=Counter)

    @property
    def user_inputs(self) -> list[GraphInput]:
        """The arguments the caller provides."""
        return [i for i in self.inputs if i.kind == "user"]

    def to_mlir(self) -> str:
        """The linalg module's text."""
        return self.graph.to_mlir()

    def arguments(self, *user_inputs: Any) -> list[np.ndarray]:
        """Numpy arrays for every function argument: ``user_inputs``, then ``params``.

        Args:
            *user_inputs: torch tensors or numpy arrays, one per user input.
        """
        if len(user_inputs) != len(self.user_inputs):
            raise OpfuseError(
                f"expected {len(self.user_inputs)} user inputs, got {len(user_inputs)}"
            )
        return [_to_numpy(a) for a in (*user_inputs, *self.params)]

    def reference(self, *user_inputs: Any) -> list[np.ndarray]:
        """The builder's numpy evaluation of the imported graph (see ``Graph.reference``)."""
        return self.graph.reference(*self.arguments(*user_inputs))


def import_module(
    model: Any, example_inputs: Any, *, name: str = "forward"
) -> ImportedGraph:
    """Import ``model`` called on ``example_inputs`` (shapes and dtypes are taken from them).

    Args:
        model: A ``torch.nn.Module`` (put it in eval mode first: training-mode dropout and
            batch norm are not supported).
        example_inputs: A tensor or a sequence of tensors (positional arguments).
        name: The function's symbol name.

    Returns:
        The imported graph (see the module docstring for the calling convention).

    Raises:
        OpfuseError: export failed, or the program has an unsupported op, dtype or shape
            (:class:`UnsupportedOpError` for an op).
    """
    import torch

    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise OpfuseError(f"example input {i} is a {type(a).__name__}: only tensors")
    return import_exported_program(_export(model, args), name=name)


def import_fx(gm: Any, example_inputs: Sequence[Any], *, name: str = "forward") -> ImportedGraph:
    """Import an FX graph, e.g. the one Dynamo hands a ``torch.compile`` backend.

    Dynamo's graphs are torch-level (``torch.nn.functional.linear``, ``operator.add``);
    they are exported like any module, so they reach the same ATen rules. Every placeholder
    is a user input (Dynamo already lifts parameters to inputs); attributes the graph
    module reads directly become ``params``.

    Args:
        gm: A ``torch.fx.GraphModule``.
        example_inputs: One tensor per placeholder (the backend's ``example_inputs``;
            static shapes only).
        name: The function's symbol name.
    """
    import torch

    inputs = list(example_inputs)
    for i, a in enumerate(inputs):
        if not isinstance(a, torch.Tensor):
            raise OpfuseError(
                f"graph input {i} is a {type(a).__name__}: only static-shape tensors "
                "(compile with dynamic=False)"
            )
    return import_exported_program(_export(gm, tuple(inputs)), name=name)


def import_exported_program(program: Any, *, name: str = "forward") -> ImportedGraph:
    """Import an ``ExportedProgram`` already run through ``decomposition_table()``."""
    return _Importer(program, name).run()


def _export(model: Any, args: tuple) -> Any:
    import torch

    try:
        program = torch.export.export(model, args, strict=False)
        return program.run_decompositions(decomposition_table())
    except Exception as e:  # export's own errors are long; keep the first line, chain the rest
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise OpfuseError(
            f"torch.export failed on {type(model).__name__}: {type(e).__name__}: {first}"
        ) from e


# --------------------------------------------------------------------------- the walk


class _Importer:
    """Replays one exported program's nodes on a builder graph."""

    def __init__(self, program: Any, name: str):
        self.program = program
        self.g = _TorchGraph(name)
        self.env: dict[Any, Any] = {}
        self.ops: Counter = Counter()
        self.node: Any = None  # the node being imported (for names and errors)

    def run(self) -> ImportedGraph:
        inputs, params = self._inputs()
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                self._call(node)
        outputs = self._outputs()
        return ImportedGraph(
            self.g, inputs, params, [n.name for n in outputs],
            self.program.call_spec.in_spec, self.program.call_spec.out_spec, self.ops,
        )

    # ------------------------------------------------------------- edges

    def _inputs(self) -> tuple[list[GraphInput], list[Any]]:
        from torch.export.graph_signature import InputKind

        kinds = {InputKind.USER_INPUT: "user", InputKind.PARAMETER: "parameter",
                 InputKind.BUFFER: "buffer", InputKind.CONSTANT_TENSOR: "constant"}
        nodes = {n.name: n for n in self.program.graph.nodes if n.op == "placeholder"}
        specs = []
        for spec in self.program.graph_signature.input_specs:
            node = nodes[spec.arg.name]
            if spec.kind not in kinds:
                raise OpfuseError(f"input {spec.arg.name!r} of kind {spec.kind.name} unsupported")
            if kinds[spec.kind] != "user" and not node.users:
                continue  # a parameter the graph never reads is not an argument
            specs.append((kinds[spec.kind], spec.target, node))
        ordered = [s for s in specs if s[0] == "user"] + [s for s in specs if s[0] != "user"]
        inputs, params = [], []
        for kind, target, node in ordered:
            shape, dtype = _tensor_meta(node, f"{kind} input {node.name!r}")
            self.env[node] = self.g.input(node.name, shape, dtype)
            inputs.append(GraphInput(node.name, kind, target, shape, dtype))
            if kind != "user":
                params.append(self._state(target))
        return inputs, params

    def _state(self, target: str) -> Any:
        if target in self.program.state_dict:
            return self.program.state_dict[target]
        return self.program.constants[target]

    def _outputs(self) -> list[Any]:
        from torch.export.graph_signature import OutputKind

        out_node = next(n for n in self.program.graph.nodes if n.op == "output")
        values = list(out_node.args[0])
        nodes = []
        for spec, v in zip(self.program.graph_signature.output_specs, values):
            if spec.kind != OutputKind.USER_OUTPUT:
                what = spec.target or spec.arg.name
                raise OpfuseError(f"in-place update of {what!r} ({spec.kind.name}) unsupported")
            if not hasattr(v, "op") or not isinstance(self.env.get(v), Tensor):
                raise OpfuseError(f"output {spec.arg} is not a tensor: only tensor outputs")
            nodes.append(v)
        self.g.output(*(self.env[n] for n in nodes))
        return nodes

    # ------------------------------------------------------------- nodes

    def _call(self, node: Any) -> None:
        op = _op_name(node.target)
        if op in _IGNORED:
            return
        rule = _RULES.get(op)
        if rule is None:
            raise UnsupportedOpError(op, _where(node))
        self.node = node
        try:
            args = [self._arg(a) for a in node.args]
            kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
            value = rule(self, *args, **kwargs)
        except OpfuseError as e:
            if isinstance(e, UnsupportedOpError):
                raise
            raise OpfuseError(f"{op} ({node.name}) at {_where(node)}: {e}") from e
        except Exception as e:  # a bug here: report it as ours, with the node, not a crash
            raise OpfuseError(
                f"internal error importing {op} ({node.name}) at {_where(node)}: "
                f"{type(e).__name__}: {e}",
                exit_code=EXIT_INTERNAL_ERROR,
            ) from e
        _check_result(node, op, value)
        self.env[node] = value
        self.ops[op] += 1

    def _arg(self, a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        if hasattr(a, "op") and hasattr(a, "users"):  # an fx.Node
            return self.env[a]
        return a

    @property
    def name(self) -> str:
        """The current node's name: the builder name of the op it becomes."""
        return self.node.name

    def unsupported(self, detail: str) -> UnsupportedOpError:
        """An error for an argument of the current op that has no rule."""
        op = _op_name(self.node.target)
        return UnsupportedOpError(op, _where(self.node), detail)


def _op_name(target: Any) -> str:
    if getattr(target, "__name__", None) == "getitem" and getattr(target, "__module__", "") in (
        "_operator", "operator"
    ):
        return "getitem"
    return str(target)


def _tensor_meta(node: Any, what: str) -> tuple[tuple[int, ...], str]:
    val = node.meta.get("val")
    if not hasattr(val, "shape") or not hasattr(val, "dtype"):
        raise OpfuseError(f"{what} is a {type(val).__name__}: only tensors")
    dtype = _DTYPES.get(str(val.dtype))
    if dtype is None:
        raise OpfuseError(f"{what} has dtype {val.dtype}: only float32, float16, bfloat16")
    try:
        shape = tuple(int(d) for d in val.shape)
    except TypeError:
        raise OpfuseError(f"{what} has a dynamic shape {tuple(val.shape)}: static only") from None
    return shape, dtype


def _check_result(node: Any, op: str, value: Any) -> None:
    """The builder's result must have the shape and dtype torch says the node has."""
    val = node.meta.get("val")
    if isinstance(value, (list, tuple)) and isinstance(val, (list, tuple)):
        pairs = list(zip(value, val))
    else:
        pairs = [(value, val)]
    for got, want in pairs:
        if not isinstance(got, Tensor) or not hasattr(want, "shape"):
            continue
        shape, dtype = tuple(int(d) for d in want.shape), _DTYPES.get(str(want.dtype))
        if got.shape != shape or got.dtype != dtype:
            raise OpfuseError(
                f"internal error importing {op} ({node.name}) at {_where(node)}: built "
                f"{got.shape} {got.dtype}, torch says {shape} {want.dtype}",
                exit_code=EXIT_INTERNAL_ERROR,
            )


def _module(path: str, kind: Any) -> str:
    path = re.sub(r"^L\['[^']*'\]\.?", "", path)  # Dynamo's spelling: L['self'].fc -> fc
    kind = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
    if "<locals>" in kind:  # export's wrapper around a graph module: no user module
        return f"module '{path or '<root>'}'"
    return f"module '{path or '<root>'}' ({kind})"


def _where(node: Any) -> str:
    """``module 'path' (type), file:line: code`` of the user code that produced ``node``."""
    trace = node.meta.get("stack_trace") or ""
    stack = node.meta.get("nn_module_stack") or {}
    where = _module(*list(stack.values())[-1]) if stack else "module '<root>'"
    frames = [f for f in trace.splitlines() if f.strip()]
    files = [i for i, f in enumerate(frames) if f.strip().startswith("File ")]
    user = [i for i in files if "/torch/" not in frames[i]] or files
    if user:
        i = user[-1]
        loc = frames[i].strip().replace("File ", "", 1)
        code = frames[i + 1].strip() if i + 1 < len(frames) else ""
        where += f", {loc}: {code}" if code else f", {loc}"
    return where


def _to_numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    t = a.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()  # numpy has no bf16: the builder keeps bf16 values in float32
    return t.numpy()


# --------------------------------------------------------------------------- slices


class _TorchGraph(Graph):
    """The builder graph plus ``slice`` (``tensor.extract_slice``), which the builder lacks.

    Stopgap: ``nn.MultiheadAttention`` selects Q, K and V out of one packed projection
    (``aten.select``), and ``split``/``chunk`` need slices too. Move ``slice`` into
    ``Graph`` (printer and reference) and this class goes away.
    """

    def slice(
        self,
        x: Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        strides: Sequence[int] | None = None,
        *,
        drop: Sequence[int] = (),
        name: str | None = None,
    ) -> Tensor:
        """``x[offsets : offsets + sizes*strides : strides]`` per dim; ``drop`` removes dims
        of size 1 from the result (a rank-reducing ``tensor.extract_slice``)."""
        x = self._materialize(self._own(x))
        strides = list(strides or [1] * x.ndim)
        offsets, sizes = [int(o) for o in offsets], [int(s) for s in sizes]
        for k in range(x.ndim):
            last = offsets[k] + (sizes[k] - 1) * strides[k]
            if not (0 <= offsets[k] and sizes[k] >= 1 and strides[k] >= 1 and last < x.shape[k]):
                raise OpfuseError(f"slice: dim {k} out of range for shape {x.shape}")
        if any(sizes[k] != 1 for k in drop):
            raise OpfuseError(f"slice: only size-1 dims can be dropped, got {list(drop)}")
        shape = tuple(s for k, s in enumerate(sizes) if k not in drop)
        node = self._node(
            "slice", name, shape, x.dtype, (x,), offsets=offsets, sizes=sizes, strides=strides
        )
        return Tensor(self, node, shape)

    def to_mlir(self, comment: str | None = None) -> str:
        if not self.outputs:
            raise OpfuseError(f"graph {self.name!r} has no outputs")
        return _TorchPrinter(self).module(comment or self.doc)

    @staticmethod
    def _eval(node: Any, env: dict[int, np.ndarray]) -> np.ndarray:
        if node.op != "slice":
            return Graph._eval(node, env)
        (x,) = node.args
        at = node.attrs
        index = tuple(
            slice(o, o + (s - 1) * st + 1, st)
            for o, s, st in zip(at["offsets"], at["sizes"], at["strides"])
        )
        return env[id(x.node)].reshape(x.shape)[index].reshape(node.shape)


class _TorchPrinter(_printer.Printer):
    def _slice(self, node: Any) -> str:
        (x,) = node.args
        at = node.attrs
        out = _printer._tensor_type(node.shape, node.dtype)
        return self.emit(
            f"tensor.extract_slice {self.val(x)}{at['offsets']}{at['sizes']}{at['strides']} : "
            f"{_printer._ty(x)} to {out}",
            node,
        )


# --------------------------------------------------------------------------- rules

Rule = Callable[..., Any]
_RULES: dict[str, Rule] = {}


def _rule(*ops: str) -> Callable[[Rule], Rule]:
    """Register a rule for ATen overloads; it is called as ``rule(importer, *args, **kwargs)``
    with the node's arguments (fx nodes replaced by their builder values)."""

    def register(fn: Rule) -> Rule:
        for op in ops:
            _RULES[op] = fn
        return fn

    return register



def _const_dtype(imp: _Importer, x: Tensor, dtype: Any) -> None:
    """Reject a ``dtype=`` argument that would cast (the builder has no cast op)."""
    if dtype is not None and _DTYPES.get(str(dtype)) != x.dtype:
        raise imp.unsupported(f"dtype={dtype} on a {x.dtype} tensor (no cast op)")


def _scaled(imp: _Importer, y: Any, alpha: Any) -> Any:
    """``alpha * y`` for the ``alpha=`` of add/sub."""
    if alpha == 1:
        return y
    if isinstance(y, Tensor):
        return imp.g.mul(y, alpha, name=f"{imp.name}.alpha")
    return y * alpha


# ----------------------------------------------------------------- elementwise


@_rule("aten.add.Tensor", "aten.add.Scalar")
def _add(imp: _Importer, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    return imp.g.add(x, _scaled(imp, y, alpha), name=imp.name)


@_rule("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(imp: _Importer, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    return imp.g.sub(x, _scaled(imp, y, alpha), name=imp.name)


@_rule("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(imp: _Importer, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    return imp.g.sub(y, _scaled(imp, x, alpha), name=imp.name)


@_rule("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(imp: _Importer, x: Any, y: Any) -> Tensor:
    return imp.g.mul(x, y, name=imp.name)


@_rule("aten.div.Tensor", "aten.div.Scalar")
def _div(imp: _Importer, x: Any, y: Any) -> Tensor:
    return imp.g.div(x, y, name=imp.name)


@_rule("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(imp: _Importer, x: Any, y: Any, *, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode is not None:
        raise imp.unsupported(f"rounding_mode={rounding_mode!r}")
    return imp.g.div(x, y, name=imp.name)


@_rule("aten.maximum.default")
def _maximum(imp: _Importer, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.maximum(x, y, name=imp.name)


@_rule("aten.minimum.default")
def _minimum(imp: _Importer, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.minimum(x, y, name=imp.name)


@_rule("aten.clamp.default", "aten.clamp_min.default")
def _clamp(imp: _Importer, x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        raise imp.unsupported("tensor bounds")
    y = x
    if min is not None:
        y = imp.g.maximum(y, min, name=imp.name if max is None else f"{imp.name}.min")
    if max is not None:
        y = imp.g.minimum(y, max, name=imp.name)
    return y


@_rule("aten.clamp_max.default")
def _clamp_max(imp: _Importer, x: Tensor, max: Any) -> Tensor:
    return _clamp(imp, x, None, max)


_UNARY = {
    "aten.neg.default": "neg",
    "aten.exp.default": "exp",
    "aten.log.default": "log",
    "aten.tanh.default": "tanh",
    "aten.erf.default": "erf",
    "aten.sqrt.default": "sqrt",
    "aten.rsqrt.default": "rsqrt",
    "aten.relu.default": "relu",
    "aten.sigmoid.default": "sigmoid",
}


def _unary(fn: str, imp: _Importer, x: Tensor) -> Tensor:
    return getattr(imp.g, fn)(x, name=imp.name)


for _op, _fn in _UNARY.items():
    _RULES[_op] = functools.partial(_unary, _fn)
del _op, _fn


@_rule("aten.abs.default")
def _abs(imp: _Importer, x: Tensor) -> Tensor:
    return imp.g.maximum(x, imp.g.neg(x, name=f"{imp.name}.neg"), name=imp.name)


@_rule("aten.reciprocal.default")
def _reciprocal(imp: _Importer, x: Tensor) -> Tensor:
    return imp.g.div(1.0, x, name=imp.name)


@_rule("aten.pow.Tensor_Scalar")
def _pow(imp: _Importer, x: Tensor, exponent: Any) -> Tensor:
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise imp.unsupported(f"exponent {exponent!r}")
    return imp.g.pow(x, exponent, name=imp.name)


@_rule("aten.gelu.default")
def _gelu(imp: _Importer, x: Tensor, *, approximate: str = "none") -> Tensor:
    return imp.g.gelu(x, approximate, name=imp.name)


@_rule("aten.silu.default")
def _silu(imp: _Importer, x: Tensor) -> Tensor:
    return imp.g.silu(x, name=imp.name)


@_rule("aten._to_copy.default")
def _to_copy(imp: _Importer, x: Tensor, *, dtype: Any = None, **_: Any) -> Tensor:
    _const_dtype(imp, x, dtype)  # device/layout/memory format do not change values
    return x


@_rule(
    "aten.clone.default", "aten.alias.default", "aten.detach.default",
    "aten.lift_fresh_copy.default", "aten.contiguous.default",
)
def _identity(imp: _Importer, x: Tensor, **_: Any) -> Tensor:
    return x  # value semantics: copies and memory formats are not ops


@_rule("aten.dropout.default")
def _dropout(imp: _Importer, x: Tensor, p: float, train: bool) -> Tensor:
    if train and p > 0:
        raise imp.unsupported("training-mode dropout (call model.eval())")
    return x


@_rule("aten.native_dropout.default")
def _native_dropout(imp: _Importer, x: Tensor, p: float, train: bool | None) -> tuple:
    if train and p > 0:
        raise imp.unsupported("training-mode dropout (call model.eval())")
    if any(u.args[1] == 1 for u in imp.node.users):
        raise imp.unsupported("the dropout mask (a bool tensor)")
    return x, None


# ----------------------------------------------------------------- reductions


def _dims(dim: Any) -> Any:
    """ATen's reduction dims (None or [] mean all) as the builder's ``axis``."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


@_rule("aten.sum.dim_IntList", "aten.sum.default")
def _sum(imp: _Importer, x: Tensor, dim: Any = None, keepdim: bool = False, *,
         dtype: Any = None) -> Tensor:
    _const_dtype(imp, x, dtype)
    return imp.g.sum(x, _dims(dim), keepdim, name=imp.name)


@_rule("aten.mean.dim", "aten.mean.default")
def _mean(imp: _Importer, x: Tensor, dim: Any = None, keepdim: bool = False, *,
          dtype: Any = None) -> Tensor:
    _const_dtype(imp, x, dtype)
    return imp.g.mean(x, _dims(dim), keepdim, name=imp.name)


@_rule("aten.amax.default")
def _amax(imp: _Importer, x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return imp.g.max(x, _dims(dim), keepdim, name=imp.name)


@_rule("aten.var.correction")
def _var(imp: _Importer, x: Tensor, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> Tensor:
    g, n = imp.g, imp.name
    axes = g._axes(x, _dims(dim))
    count = math.prod(x.shape[a] for a in axes)
    ddof = 1 if correction is None else correction
    if count - ddof <= 0:
        raise imp.unsupported(f"correction={ddof} with {count} elements")
    d = g.sub(x, g.mean(x, axes, keepdims=True, name=f"{n}.mean"), name=f"{n}.sub")
    s = g.sum(g.mul(d, d, name=f"{n}.sq"), axes, keepdim, name=f"{n}.sum")
    return g.mul(s, 1.0 / (count - ddof), name=n)


@_rule("aten._softmax.default")
def _softmax(imp: _Importer, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    if half_to_float:
        raise imp.unsupported("half_to_float=True (no cast op)")
    return imp.g.softmax(x, dim, name=imp.name)


@_rule("aten._safe_softmax.default", "aten.softmax.int")
def _safe_softmax(imp: _Importer, x: Tensor, dim: int, dtype: Any = None) -> Tensor:
    # _safe_softmax gives 0 instead of NaN on a row that is all -inf (a fully masked
    # attention row); with no masks such rows do not occur, and softmax is what G5/G6 use.
    _const_dtype(imp, x, dtype)
    return imp.g.softmax(x, dim, name=imp.name)


@_rule("aten._log_softmax.default")
def _log_softmax(imp: _Importer, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    if half_to_float:
        raise imp.unsupported("half_to_float=True (no cast op)")
    g, n = imp.g, imp.name
    s = g.sub(x, g.max(x, dim, keepdims=True, name=f"{n}.max"), name=f"{n}.sub")
    total = g.sum(g.exp(s, name=f"{n}.exp"), dim, keepdims=True, name=f"{n}.sum")
    return g.sub(s, g.log(total, name=f"{n}.log"), name=n)


# ----------------------------------------------------------------- normalizations


def _fold_trailing(imp: _Importer, x: Tensor | None, k: int, what: str) -> Tensor | None:
    """``x`` with its last ``k`` dims folded into one (norms over several dims)."""
    if x is None or k == 1:
        return x
    return imp.g.reshape(x, (*x.shape[:-k], -1), name=f"{imp.name}.{what}")


@_rule("aten.native_layer_norm.default")
def _native_layer_norm(imp: _Importer, x: Tensor, normalized_shape: Sequence[int],
                       weight: Tensor | None, bias: Tensor | None, eps: float) -> tuple:
    g, n, k = imp.g, imp.name, len(normalized_shape)
    xf = _fold_trailing(imp, x, k, "flat")
    wf, bf = _fold_trailing(imp, weight, k, "wflat"), _fold_trailing(imp, bias, k, "bflat")
    y = g.layernorm(xf, wf, bf, eps, name=n)
    y = y if k == 1 else g.reshape(y, x.shape, name=f"{n}.unflat")
    if not any(u.args[1] in (1, 2) for u in imp.node.users):
        return y, None, None
    # mean and 1/std, which only training graphs read: the same math as layernorm's
    stats = (*x.shape[:-k], *[1] * k)
    mean = g.mean(xf, -1, keepdims=True, name=f"{n}.mean")
    d = g.sub(xf, mean, name=f"{n}.d")
    var = g.mean(g.mul(d, d, name=f"{n}.sq"), -1, keepdims=True, name=f"{n}.var")
    rstd = g.rsqrt(g.add(var, eps, name=f"{n}.eps"), name=f"{n}.rstd")
    return y, g.reshape(mean, stats, name=f"{n}.mean_out"), g.reshape(rstd, stats,
                                                                      name=f"{n}.rstd_out")


@_rule("aten.rms_norm.default")
def _rms_norm(imp: _Importer, x: Tensor, normalized_shape: Sequence[int],
              weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    import torch

    if eps is None:  # torch's default: the dtype's machine epsilon
        eps = torch.finfo({"f32": torch.float32, "f16": torch.float16,
                           "bf16": torch.bfloat16}[x.dtype]).eps
    k = len(normalized_shape)
    xf = _fold_trailing(imp, x, k, "flat")
    y = imp.g.rms_norm(xf, _fold_trailing(imp, weight, k, "wflat"), eps, name=imp.name)
    return y if k == 1 else imp.g.reshape(y, x.shape, name=f"{imp.name}.unflat")


# ----------------------------------------------------------------- contractions


@_rule("aten.mm.default", "aten.bmm.default")
def _mm(imp: _Importer, x: Tensor, y: Tensor) -> Tensor:
    return imp.g.matmul(x, y, name=imp.name)


@_rule("aten.addmm.default")
def _addmm(imp: _Importer, bias: Tensor, x: Tensor, y: Tensor, *, beta: Any = 1,
           alpha: Any = 1) -> Tensor:
    g, n = imp.g, imp.name
    mm = g.matmul(x, y, name=f"{n}.mm")
    if alpha != 1:
        mm = g.mul(mm, alpha, name=f"{n}.alpha")
    if beta != 1:
        bias = g.mul(bias, beta, name=f"{n}.beta")
    return g.add(mm, bias, name=n)


@_rule("aten.linear.default")
def _linear(imp: _Importer, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    # x @ Wᵀ (+ b) on 2-D operands, as the builder graphs write Linear: the transpose of
    # the weight fuses into the matmul's kernel; leading dims of x are folded and restored.
    g, n = imp.g, imp.name
    w_t = g.transpose(weight, (1, 0), name=f"{n}.wt") if weight.ndim == 2 else weight
    lead = x.shape[:-1]
    x2 = x if x.ndim == 2 else g.reshape(x, (-1, x.shape[-1]), name=f"{n}.flat")
    if w_t.ndim == 1:
        w_t = g.reshape(w_t, (w_t.shape[0], 1), name=f"{n}.wcol")
    y = g.matmul(x2, w_t, name=n if bias is None and x.ndim == 2 else f"{n}.mm")
    out = (*lead, weight.shape[0]) if weight.ndim == 2 else lead
    if y.shape != out:
        y = g.reshape(y, out, name=n if bias is None else f"{n}.unflat")
    return y if bias is None else g.add(y, bias, name=n)


@_rule("aten.matmul.default")
def _matmul(imp: _Importer, x: Tensor, y: Tensor) -> Tensor:
    return _matmul_nd(imp.g, x, y, imp.name)


def _matmul_nd(g: Graph, x: Tensor, y: Tensor, n: str) -> Tensor:
    """``torch.matmul`` semantics on builder ops: 1-D promotion, folding, batch broadcast."""
    out_shape = (
        *np.broadcast_shapes(x.shape[:-2], y.shape[:-2]),
        *(x.shape[-2:-1] if x.ndim > 1 else ()),
        *(y.shape[-1:] if y.ndim > 1 else ()),
    )
    if x.ndim == 1:
        x = g.reshape(x, (1, x.shape[0]), name=f"{n}.lhs_row")
    if y.ndim == 1:
        y = g.reshape(y, (y.shape[0], 1), name=f"{n}.rhs_col")
    if y.ndim == 2 and x.ndim > 2:  # fold x's batch dims into its rows: one 2-D matmul
        x = g.reshape(x, (-1, x.shape[-1]), name=f"{n}.flat")
        r = g.matmul(x, y, name=n)
    elif x.ndim == y.ndim == 2:
        r = g.matmul(x, y, name=n)
    else:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
        x = g.broadcast_to(x, (*batch, *x.shape[-2:]), name=f"{n}.lhs_b")
        y = g.broadcast_to(y, (*batch, *y.shape[-2:]), name=f"{n}.rhs_b")
        if len(batch) > 2:
            x = g.reshape(x, (-1, *x.shape[-2:]), name=f"{n}.lhs3")
            y = g.reshape(y, (-1, *y.shape[-2:]), name=f"{n}.rhs3")
        r = g.matmul(x, y, name=n)
    return r if r.shape == tuple(out_shape) else g.reshape(r, out_shape, name=f"{n}.out")


@_rule("aten.scaled_dot_product_attention.default")
def _sdpa(imp: _Importer, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
          dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
          enable_gqa: bool = False) -> Tensor:
    # softmax(Q Kᵀ · scale) V, written like opfuse.frontends.graphs._attention (G5, G6)
    if dropout_p:
        raise imp.unsupported(f"dropout_p={dropout_p} (call model.eval())")
    if is_causal:
        raise imp.unsupported("is_causal=True (the builder has no iota/select to build the mask)")
    if k.shape[:-2] != q.shape[:-2]:
        raise imp.unsupported(f"key batch/heads {k.shape[:-2]} != query's {q.shape[:-2]}")
    g, n = imp.g, imp.name
    perm = (*range(k.ndim - 2), k.ndim - 1, k.ndim - 2)
    scores = _matmul_nd(g, q, g.transpose(k, perm, name=f"{n}.k_t"), f"{n}.qk")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = g.mul(scores, scale, name=f"{n}.scale")
    if attn_mask is not None:  # an additive float mask (bool masks stop at their producer)
        scores = g.add(scores, attn_mask, name=f"{n}.mask")
    return _matmul_nd(g, g.softmax(scores, -1, name=f"{n}.softmax"), v, n)


# ----------------------------------------------------------------- data movement


@_rule("aten.permute.default")
def _permute(imp: _Importer, x: Tensor, dims: Sequence[int]) -> Tensor:
    perm = [d % x.ndim for d in dims]
    return x if perm == list(range(x.ndim)) else imp.g.transpose(x, perm, name=imp.name)


@_rule("aten.transpose.int")
def _transpose(imp: _Importer, x: Tensor, dim0: int, dim1: int) -> Tensor:
    perm = list(range(x.ndim))
    perm[dim0 % x.ndim], perm[dim1 % x.ndim] = perm[dim1 % x.ndim], perm[dim0 % x.ndim]
    return _permute(imp, x, perm)


@_rule("aten.t.default")
def _t(imp: _Importer, x: Tensor) -> Tensor:
    return _permute(imp, x, list(range(x.ndim))[::-1])


@_rule("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(imp: _Importer, x: Tensor, size: Sequence[int]) -> Tensor:
    return imp.g.reshape(x, size, name=imp.name)


@_rule("aten.unsqueeze.default")
def _unsqueeze(imp: _Importer, x: Tensor, dim: int) -> Tensor:
    shape = list(x.shape)
    shape.insert(dim % (x.ndim + 1), 1)
    return imp.g.reshape(x, shape, name=imp.name)


@_rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(imp: _Importer, x: Tensor, dim: Any = None) -> Tensor:
    dims = range(x.ndim) if dim is None else dim if isinstance(dim, (list, tuple)) else [dim]
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1} if x.ndim else set()
    return imp.g.reshape(x, [s for k, s in enumerate(x.shape) if k not in drop], name=imp.name)


@_rule("aten.expand.default")
def _expand(imp: _Importer, x: Tensor, size: Sequence[int], *, implicit: bool = False) -> Tensor:
    lead = len(size) - x.ndim
    shape = [x.shape[k - lead] if s == -1 else s for k, s in enumerate(size)]
    return imp.g.broadcast_to(x, shape, name=imp.name)


@_rule("aten.select.int")
def _select(imp: _Importer, x: Tensor, dim: int, index: int) -> Tensor:
    dim = dim % x.ndim
    offsets = [index % x.shape[dim] if k == dim else 0 for k in range(x.ndim)]
    sizes = [1 if k == dim else s for k, s in enumerate(x.shape)]
    return imp.g.slice(x, offsets, sizes, drop=[dim], name=imp.name)


@_rule("aten.slice.Tensor")
def _slice(imp: _Importer, x: Tensor, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Tensor:
    dim = dim % x.ndim
    begin, stop, step = slice(start, end, step).indices(x.shape[dim])  # python's clamping
    size = len(range(begin, stop, step))
    if size == x.shape[dim]:
        return x
    if size == 0:
        raise imp.unsupported("an empty slice")
    return _slice_dim(imp.g, x, dim, begin, size, step, imp.name)


def _slice_dim(g: Graph, x: Tensor, dim: int, begin: int, size: int, step: int,
               name: str) -> Tensor:
    offsets = [begin if k == dim else 0 for k in range(x.ndim)]
    sizes = [size if k == dim else s for k, s in enumerate(x.shape)]
    strides = [step if k == dim else 1 for k in range(x.ndim)]
    return g.slice(x, offsets, sizes, strides, name=name)


@_rule("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(imp: _Importer, x: Tensor, split: Any, dim: int = 0) -> list[Tensor]:
    dim = dim % x.ndim
    if isinstance(split, int):  # split.Tensor: equal chunks, the last one shorter
        split = [min(split, x.shape[dim] - b) for b in range(0, x.shape[dim], split)]
    pieces, begin = [], 0
    for i, size in enumerate(split):
        pieces.append(_slice_dim(imp.g, x, dim, begin, size, 1, f"{imp.name}.{i}"))
        begin += size
    return pieces


@_rule("aten.unbind.int")
def _unbind(imp: _Importer, x: Tensor, dim: int = 0) -> list[Tensor]:
    dim = dim % x.ndim
    sizes = [1 if k == dim else s for k, s in enumerate(x.shape)]
    return [
        imp.g.slice(x, [i if k == dim else 0 for k in range(x.ndim)], sizes, drop=[dim],
                    name=f"{imp.name}.{i}")
        for i in range(x.shape[dim])
    ]


@_rule("getitem")
def _getitem(imp: _Importer, values: Sequence[Any], index: int) -> Any:
    return values[index]


@_rule("aten.hardtanh.default")
def _hardtanh(imp: _Importer, x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return _clamp(imp, x, min_val, max_val)


@_rule("aten.repeat.default")
def _repeat(imp: _Importer, x: Tensor, repeats: Sequence[int]) -> Tensor:
    # tile: view x as (1, s0, 1, s1, ...), broadcast to (r0, s0, r1, s1, ...), fold pairs
    g, n = imp.g, imp.name
    shape = (1,) * (len(repeats) - x.ndim) + x.shape
    spread = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(repeats, shape) for d in (r, s)]
    y = g.broadcast_to(g.reshape(x, spread, name=f"{n}.spread"), tiled, name=f"{n}.tile")
    return g.reshape(y, [r * s for r, s in zip(repeats, shape)], name=n)
