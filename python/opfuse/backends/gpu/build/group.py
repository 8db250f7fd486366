"""A fusion function as the emitters see it: generalized ops, parameters, outputs.

``opfuse-outline`` produced ``func.func private @fusion_<N>_<kind>``; :func:`prepare`
clones it into a scratch module and generalizes every named linalg op, so the emitters
deal with ``linalg.generic`` (plus reshapes and slices) only. The function's arguments
and results become kernel parameters: flat memrefs, one per buffer, in the order
``args..., results...`` (:attr:`Group.params`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlir import ir
from mlir.passmanager import PassManager

from .... import kinds
from ....errors import EXIT_INTERNAL_ERROR, OpfuseError
from ....ir import collect_diagnostics, walk_nested
from .evaluate import Leaf, op_of
from .kernel import Param, Unsupported, element_type_text, numel, shape_of
from ...options import CodegenOptions

KIND_ATTR = "opfuse.kind"
_RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


@dataclass
class Output:
    """One result of the fusion function.

    Attributes:
        index: the result number.
        value: the returned value with trailing reshapes peeled off (what is computed).
        shape: the shape of ``value`` (the output buffer is written with this shape).
        element_type: the MLIR element type.
    """

    index: int
    value: ir.Value
    shape: tuple[int, ...]
    element_type: ir.Type


@dataclass
class Group:
    """A prepared fusion function (keep the object alive while its IR is in use)."""

    name: str
    kind: str
    func: ir.Operation
    scratch: ir.Module
    params: list[Param] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    #: The user's code-generation choices (matmul variant, TF32, tuning target).
    options: CodegenOptions = field(default_factory=CodegenOptions)

    @property
    def n_args(self) -> int:
        return len(self.func.regions[0].blocks[0].arguments)

    def ops(self) -> list[ir.Operation]:
        return [o.operation for o in self.func.regions[0].blocks[0].operations]

    def output_leaf(self, out: Output, mem: ir.Value) -> Leaf:
        return Leaf(mem, out.shape, out.element_type)

    def leaves(self, params: list[ir.Value]) -> dict[int, ir.Value]:
        return {i: params[i] for i in range(self.n_args)}

    def result_param(self, params: list[ir.Value], index: int) -> ir.Value:
        return params[self.n_args + index]


def prepare(func_op: ir.Operation) -> Group:
    """Clone ``func_op`` (a ``fusion_*`` function) and generalize its named ops."""
    name = ir.StringAttr(func_op.attributes["sym_name"]).value
    kind = (
        ir.StringAttr(func_op.attributes[KIND_ATTR]).value
        if KIND_ATTR in func_op.attributes
        else kinds.OPAQUE
    )
    ctx = func_op.context
    scratch = ir.Module.create(ir.Location.unknown(ctx))
    with ir.InsertionPoint(scratch.body):
        clone = func_op.clone()
    with collect_diagnostics(ctx) as diags:
        try:
            PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))", ctx).run(
                scratch.operation
            )
        except ir.MLIRError as e:
            raise OpfuseError(
                f"cannot generalize @{name} for codegen: {e}",
                diagnostics=diags,
                exit_code=EXIT_INTERNAL_ERROR,
            ) from None
    func = clone.operation
    group = Group(name, kind, func, scratch)
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    for i, t in enumerate(ftype.inputs):
        group.params.append(_param(("arg", i), t, name))
    for i, t in enumerate(ftype.results):
        group.params.append(_param(("result", i), t, name))
    ret = group.ops()[-1]
    for i, v in enumerate(ret.operands):
        peeled = v
        while (op := op_of(peeled)) is not None and op.name in _RESHAPES:
            peeled = op.operands[0]
        t = ir.ShapedType(peeled.type)
        group.outputs.append(Output(i, peeled, tuple(t.shape), t.element_type))
    return group


def _param(binding: tuple[str, int], t: ir.Type, name: str) -> Param:
    if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
        raise OpfuseError(
            f"@{name}: kernel {binding[0]} #{binding[1]} is not a statically "
            f"shaped tensor ({t})"
        )
    return Param(binding, (numel(shape_of(t)),), element_type_text(t))


def is_view_only(group: Group) -> bool:
    """Every result is a function argument seen through reshapes: no kernel needed."""
    args = set(group.func.regions[0].blocks[0].arguments)
    return all(o.value in args for o in group.outputs)


def computed_from(v: ir.Value, top: set) -> list[ir.Operation]:
    """The ops of ``top`` (the function's) that ``v`` is computed from, with the values
    their regions capture (a generic fill's constant)."""
    seen: dict[ir.Operation, None] = {}
    stack = [v]
    while stack:
        op = op_of(stack.pop())
        if op is None or op in seen or op not in top:
            continue
        seen[op] = None
        for inner in walk_nested(op):
            stack.extend(inner.operands)
    return list(seen)


def require(cond: bool, why: str) -> None:
    if not cond:
        raise Unsupported(why)


class NotChosen(Unsupported):
    """An emitter that could build the group but is not the one chosen for it (the user's
    options, or the operand types, say another variant): the driver moves on to the next
    emitter without a note."""
