"""PyTorch in: ``torch.export`` (core ATen) -> the opfuse graph builder -> linalg on tensors.

``import_module(model, example_inputs)`` exports the model (non-strict), runs the program
through opfuse's decomposition table (``torch_decompositions``) and replays every ATen op
on an ``opfuse.builder.Graph``. The builder writes the IR the fusion passes expect, so an
imported model fuses exactly like the same model written with the builder
(``opfuse.frontends.builder.graphs``), and its ``reference()`` evaluates the imported graph in numpy.

Calling convention of the imported function (``ImportedGraph.inputs``):

* the user inputs first, in the order of the model's flattened ``example_inputs``;
* then the parameters, buffers and lifted tensor constants the graph reads, in the order
  of the exported program's graph signature (``ImportedGraph.params`` holds the tensors,
  the module's own, not copies). They are arguments, never constants in the module.
  Parameters and buffers that the graph does not read are left out.

Static shapes only. Arguments are float32, float16, bfloat16 or bool tensors (a bool
argument is passed as int8 0/1: the builder's i8 booleans); inside the graph, the bool and
int64 tensors that masks are built from (comparisons, ``arange``) are i8 and i64 values.
An ATen op without a rule here raises :class:`UnsupportedOpError` (an ``OpfuseError``)
naming the op and the module path where the model calls it.

torch is imported lazily: ``import opfuse`` works without it.

This module is the driver: export, the walk over the program's nodes, inputs and outputs,
and the errors that name the op and the user code. What each ATen op becomes is in the op
table (``aten``, its rules in ``aten_*`` families); the graph they build is a
``torch_graph.TorchGraph``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...errors import EXIT_INTERNAL_ERROR, OpfuseError
from ..builder.graph import Graph, Tensor
from .aten import IGNORED, RULES
from .aten_rule import DTYPES, INPUT_DTYPES
from .decompositions import decomposition_table
from .graph import TorchGraph


class UnsupportedOpError(OpfuseError):
    """An ATen op (or an argument of one) the importer has no rule for.

    Attributes:
        op: The ATen overload, e.g. ``aten.cumsum.default``.
        where: The module path and source line that call it.
        detail: The argument the rule refuses ("" when the op has no rule at all).
    """

    def __init__(self, op: str, where: str, detail: str = ""):
        super().__init__(f"unsupported op {op}{': ' + detail if detail else ''} (at {where})")
        self.op = op
        self.where = where
        self.detail = detail


@dataclass(frozen=True)
class GraphInput:
    """One argument of the imported function.

    Attributes:
        name: The builder input's name (the exported program's placeholder name).
        kind: ``user``, ``parameter``, ``buffer`` or ``constant``.
        target: The parameter/buffer/constant's fully qualified name; None for user inputs.
        shape: Static shape.
        dtype: ``f32``, ``f16``, ``bf16`` or ``i8`` (a bool tensor, passed as int8).
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
        output_shapes: The returned results' shapes as the caller sees them (see the field).
        input_views: The results made in torch from the inputs (see the field).
        result_views: The views torch applies to returned results (see the field).
    """

    graph: Graph
    inputs: list[GraphInput]
    params: list[Any]
    outputs: list[str]
    in_spec: Any = None
    out_spec: Any = None
    aten_ops: Counter = field(default_factory=Counter)
    #: Each result's shape as the caller sees it, where the function returns it without
    #: trailing or inner 1s (None: as the function returns them).
    output_shapes: list[tuple[int, ...]] | None = None
    #: Results torch makes from the inputs (an input, or a view of one), by result
    #: position: the function does not return them (its results are the others, in order).
    input_views: dict[int, Callable[[Sequence[Any]], Any]] = field(default_factory=dict)
    #: Per returned result: None, or the views torch applies to it (the function returns
    #: the value a result views, not the view).
    result_views: list[Callable[[Any], Any] | None] | None = None

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


def import_module(model: Any, example_inputs: Any, *, name: str = "forward") -> ImportedGraph:
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
    return import_exported_program(export(model, example_args(example_inputs)), name=name)


def example_args(example_inputs: Any) -> tuple:
    """``example_inputs`` (a tensor or a sequence of them) as a tuple of tensors."""
    import torch

    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise OpfuseError(f"example input {i} is a {type(a).__name__}: only tensors")
    return args


#: Keyword values a program may be specialized on (torch.export keeps them as constants).
_CONSTANT_TYPES = (bool, int, float, str, type(None))


def example_kwargs(kwargs: Any) -> dict[str, Any]:
    """``kwargs`` (keyword inputs: tensors, or constants such as ``use_cache=True``) as a
    dict; None is no keyword inputs."""
    import torch

    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise OpfuseError(f"example_kwargs is a {type(kwargs).__name__}: a dict of names to "
                          "tensors or constants")
    for k, v in kwargs.items():
        if not isinstance(v, (torch.Tensor, *_CONSTANT_TYPES)):
            raise OpfuseError(f"example keyword input {k!r} is a {type(v).__name__}: only "
                              "tensors and constants (bool, int, float, str, None)")
    return dict(kwargs)


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
    return import_exported_program(export_fx(gm, example_inputs), name=name)


def export_fx(gm: Any, example_inputs: Sequence[Any]) -> Any:
    """:func:`export` of a Dynamo FX graph at the shapes of ``example_inputs``: tensors
    and the Python scalars of one call (a ``SymInt`` input's value, which the export
    specializes on); symbolic sizes themselves are refused."""
    import torch

    inputs = list(example_inputs)
    for i, a in enumerate(inputs):
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) or not isinstance(
                a, (torch.Tensor, int, float, bool)):
            raise OpfuseError(
                f"graph input {i} is a {type(a).__name__}: only tensors and the scalars of "
                "one call (opfuse specializes a symbolic graph at each call's shapes)"
            )
    return export(gm, tuple(inputs))


def import_exported_program(program: Any, *, name: str = "forward") -> ImportedGraph:
    """Import an ``ExportedProgram`` already run through ``decomposition_table()``."""
    return _Importer(program, name).run()


def import_graph_module(gm: Any, *, name: str = "forward", views_in_torch: bool = True
                        ) -> ImportedGraph:
    """Import a plain ATen FX graph: one partition of an exported program
    (``torch_partition``), every placeholder a user input (its ``meta["val"]`` gives the
    shape and dtype), the results those of its output node (a single value or a tuple).

    ``views_in_torch``: results that are inputs or views (of inputs, or of values a
    kernel reads) are made by torch at each call instead of written by a kernel. The GPU
    needs it (its matmul emitters write only their product); on the CPU it costs a
    Python-level op per view and call (0.7 ms of a tiny Llama's 2.7 ms training step),
    where the JIT code writes them in the kernels at no cost worth the name.
    """
    return _GraphImporter(gm, name, views_in_torch).run()


def export(model: Any, args: tuple, kwargs: dict[str, Any] | None = None) -> Any:
    """``torch.export`` (non-strict) of ``model(*args, **kwargs)``, then
    ``decomposition_table()``; errors as OpfuseError.

    A Hugging Face model's cache classes (``DynamicCache``, which every decoder returns with
    the default ``use_cache=True``) are registered as pytree nodes first, the way
    ``transformers``' own exporter does for torch.export, so that they can be outputs.
    """
    import torch

    _register_cache_pytrees(model)
    try:
        program = torch.export.export(model, args, kwargs or None, strict=False)
        return program.run_decompositions(decomposition_table())
    except Exception as e:  # export's own errors are long; keep the first line, chain the rest
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise OpfuseError(
            f"torch.export failed on {type(model).__name__}: {type(e).__name__}: {first}"
        ) from e


def _register_cache_pytrees(model: Any) -> None:
    """``transformers``' pytree registration of its cache classes, for its models only
    (opfuse never imports ``transformers`` itself: a model of it has)."""
    if not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # an older transformers: DynamicCache only
        try:
            from transformers.integrations.executorch import register_dynamic_cache_export_support
        except ImportError:
            return
        register_dynamic_cache_export_support()
        return
    register_cache_pytrees_for_model(model)


# --------------------------------------------------------------------------- the walk


class _Importer:
    """Replays one exported program's nodes on a builder graph; every rule gets it as its
    ``RuleContext`` (``aten_rule``)."""

    def __init__(self, program: Any, name: str):
        self.program = program
        self.g = TorchGraph(name)
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
            self.g,
            inputs,
            params,
            [n.name for n in outputs],
            self.program.call_spec.in_spec,
            self.program.call_spec.out_spec,
            self.ops,
        )

    # ------------------------------------------------------------- edges

    def _inputs(self) -> tuple[list[GraphInput], list[Any]]:
        from torch.export.graph_signature import InputKind

        kinds = {
            InputKind.USER_INPUT: "user",
            InputKind.PARAMETER: "parameter",
            InputKind.BUFFER: "buffer",
            InputKind.CONSTANT_TENSOR: "constant",
        }
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
        if op in IGNORED:
            return
        rule = RULES.get(op)
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


class _GraphImporter(_Importer):
    """Imports a plain ATen graph (a partition): placeholders are the user inputs."""

    def __init__(self, gm: Any, name: str, views_in_torch: bool = True):
        super().__init__(None, name)
        self.gm = gm
        self.views_in_torch = views_in_torch

    def run(self) -> ImportedGraph:
        inputs = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                shape, dtype = _tensor_meta(node, f"input {node.name!r}")
                self.env[node] = self.g.input(node.name, shape, dtype)
                inputs.append(GraphInput(node.name, "user", None, shape, dtype))
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                result = node.args[0]
                nodes = list(result) if isinstance(result, (list, tuple)) else [result]
                for v in nodes:
                    if not isinstance(self.env.get(v), Tensor):
                        raise OpfuseError(f"output {v} is not a tensor: only tensor outputs")
                # a result that is an input or a view of one (a training forward saves a
                # weight's transpose for the backward) is made by torch from the input, as
                # the view it is: no kernel copies it
                placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
                views = {k: view for k, v in enumerate(nodes) if self.views_in_torch
                         and (view := input_view(v, placeholders)) is not None}
                if len(views) == len(nodes):
                    views = {}  # nothing left to compile: the views are its only results
                computed = [v for k, v in enumerate(nodes) if k not in views]
                # a result that views a computed value (the activation a matmul reads,
                # viewed as the backward saves it) is returned as that value and viewed in
                # torch: the view stays inside the kernel that reads it, which then writes
                # only its own result (a matmul kernel cannot also write its operand)
                bases, replays = [], []
                for v in computed:
                    source, chain = view_chain(v) if self.views_in_torch else (v, [])
                    if chain and source.op == "call_function" and \
                            isinstance(self.env.get(source), Tensor):
                        bases.append(source)
                        replays.append(replay(chain))
                    else:
                        bases.append(v)
                        replays.append(None)
                # a result with pending keepdims 1s (a layer norm's saved mean) is returned
                # as the value behind it and viewed in torch: no kernel copies it
                shapes = [tuple(self.env[b].shape) for b in bases]
                self.g.output(*(self.g.unexpanded(self.env[b]) for b in bases))
        imported = ImportedGraph(self.g, inputs, [], [n.name for n in nodes], None, None,
                                 self.ops)
        imported.output_shapes = shapes
        imported.input_views = views
        imported.result_views = replays
        return imported


#: ATen ops that only view their first argument (torch makes them without a copy).
VIEW_OPS = frozenset({
    "aten.alias.default", "aten.permute.default", "aten.t.default", "aten.transpose.int",
    "aten.view.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.expand.default",
    "aten.slice.Tensor", "aten.select.int",
})


def view_chain(node: Any) -> tuple[Any, list[Any]]:
    """``node``'s source and the :data:`VIEW_OPS` from it to ``node`` (empty when ``node``
    is not a view): the ops make the view from the source alone."""
    chain = []
    while node.op == "call_function" and _op_name(node.target) in VIEW_OPS \
            and node.all_input_nodes == [node.args[0]]:  # the source is its only node
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def replay(chain: list[Any]) -> Callable[[Any], Any]:
    """A function that applies the view ops ``chain`` (:func:`view_chain`) to a tensor.

    ``view`` is applied as ``reshape`` (a view where the strides allow, else a copy):
    AOTAutograd's graphs are written for a compiler and ``view`` a permuted tensor, which
    eager ``view`` refuses."""
    import torch

    aten = torch.ops.aten
    reshapes = (aten.view.default, aten._unsafe_view.default)
    steps = [(aten.reshape.default if n.target in reshapes else n.target, n.args[1:], n.kwargs)
             for n in chain]

    def view(t: Any) -> Any:
        for target, args, kwargs in steps:
            t = target(t, *args, **kwargs)
        return t

    return view


def input_view(node: Any, placeholders: list[Any]) -> Callable[[Sequence[Any]], Any] | None:
    """For an FX node that is a graph input or a chain of :data:`VIEW_OPS` from one: a
    function of the graph's input tensors that makes it with torch (the same views);
    None for anything computed."""
    source, chain = view_chain(node)
    if source.op != "placeholder" or source not in placeholders:
        return None
    index, view = placeholders.index(source), replay(chain)
    return lambda tensors: view(tensors[index])


def _op_name(target: Any) -> str:
    if getattr(target, "__name__", None) == "getitem" and getattr(target, "__module__", "") in (
        "_operator",
        "operator",
    ):
        return "getitem"
    return str(target)


def _tensor_meta(node: Any, what: str) -> tuple[tuple[int, ...], str]:
    val = node.meta.get("val")
    if not hasattr(val, "shape") or not hasattr(val, "dtype"):
        raise OpfuseError(f"{what} is a {type(val).__name__}: only tensors")
    if str(val.dtype) not in INPUT_DTYPES:
        raise OpfuseError(
            f"{what} has dtype {val.dtype}: only float32, float16, bfloat16, int64, int32, bool"
        )
    dtype = DTYPES[str(val.dtype)]
    try:
        shape = tuple(int(d) for d in val.shape)
    except Exception:  # noqa: BLE001  TypeError; torch's GuardOnDataDependentSymNode
        # (a size computed from tensor data: nonzero, boolean indexing) is no TypeError
        raise OpfuseError(f"{what} has a dynamic shape {tuple(val.shape)} (a size that "
                          "depends on tensor data): static only") from None
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
        shape, dtype = tuple(int(d) for d in want.shape), DTYPES.get(str(want.dtype))
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
    if str(t.dtype) == "torch.bool":
        return t.numpy().view(np.int8)  # the builder's booleans are i8 0/1
    return t.numpy()
