"""Dynamic dims in: a module with ``tensor<?x...>`` arguments, specialized at given sizes.

IREE's and torch-mlir's exports write batch and sequence dims as ``?`` and derive every
other size from them (``tensor.dim``, ``tensor.empty(%d)``, index arithmetic). opfuse's
kernels are compiled for static shapes, so a dynamic entry function is compiled at the
sizes of a call (:class:`opfuse.driver.specialized.SpecializedExecutable`) or of a
``--dim-size`` on the command line: its arguments get those static types and upstream
canonicalization folds the sizes through the program (``tensor.dim`` of a static tensor
is a constant, ``tensor.empty(%c)`` a static tensor, a ``tensor.cast`` to a less static
type folds into its consumers). What cannot be derived from the argument sizes (a size
read from tensor data) stays ``?`` and is refused by name.

The fused program is then the static program's, kernel for kernel; the sizes are a
specialization, not a guess: an argument whose size contradicts another (two ``?`` an
indexing map equates) fails verification with the op named.
"""

from __future__ import annotations

from typing import Sequence

from mlir import ir
from mlir.dialects import tensor
from mlir.passmanager import PassManager

from ...errors import OpfuseError
from ...ir import collect_diagnostics, find_entry, parse_module, print_module
from ...ir import _error_lines as error_lines

# Callees are inlined first so that the sizes reach them; canonicalize folds dims and casts.
_REFINE = "builtin.module(inline, func.func(canonicalize, cse, canonicalize))"


def is_dynamic(func: ir.Operation) -> bool:
    """Whether ``func``'s signature has a tensor with a ``?`` dim."""
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    return any(isinstance(t, ir.RankedTensorType) and not t.has_static_shape
               for t in [*ftype.inputs, *ftype.results])


def argument_shapes(func: ir.Operation) -> list[list[int | None]]:
    """Each argument's dims, None for ``?`` (an empty list for a scalar)."""
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    out = []
    for t in ftype.inputs:
        if isinstance(t, ir.RankedTensorType):
            out.append([None if ir.ShapedType(t).is_dynamic_dim(i) else d
                        for i, d in enumerate(t.shape)])
        else:
            out.append([])
    return out


def uniform_shapes(func: ir.Operation, size: int) -> list[tuple[int, ...]]:
    """The argument shapes with every ``?`` dim ``size`` (``fuse-run --dim-size``)."""
    return [tuple(size if d is None else d for d in dims) for dims in argument_shapes(func)]


def specialize(text: str, shapes: Sequence[Sequence[int]], *, entry: str | None = None,
               filename: str = "<input>", ctx: ir.Context | None = None) -> str:
    """The module ``text`` with its entry function's arguments at ``shapes`` and every size
    derived from them folded; returned as text (the caller parses it for the contract).

    Raises:
        OpfuseError: a shape of another rank or against a static dim, sizes that
            contradict each other, or a size not derivable from the arguments.
    """
    module = parse_module(text, ctx, filename=filename)
    func = find_entry(module, entry)
    name = ir.StringAttr(func.attributes["sym_name"]).value
    declared = argument_shapes(func)
    if len(shapes) != len(declared):
        raise OpfuseError(f"@{name} takes {len(declared)} arguments, got {len(shapes)} shapes")
    for i, (want, got) in enumerate(zip(declared, shapes)):
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            shown = "x".join("?" if w is None else str(w) for w in want) or "a scalar"
            raise OpfuseError(f"@{name} argument {i} is {shown}, got shape {tuple(got)}")
        if any(g < 0 for g in got):
            raise OpfuseError(f"@{name} argument {i}: negative size in {tuple(got)}")
    with module.context, func.location:
        _retype_arguments(func, shapes)
        with collect_diagnostics(module.context) as diags:
            try:
                PassManager.parse(_REFINE).run(module.operation)
            except ir.MLIRError as e:
                raise OpfuseError(
                    f"@{name} at argument shapes {', '.join(map(str, map(tuple, shapes)))}: "
                    f"the sizes contradict the program ({_first(e, diags)})") from None
        _refine_results(func)
    _refuse_remaining(func, name, shapes)
    return print_module(module, debug_info=True)


def _retype_arguments(func: ir.Operation, shapes: Sequence[Sequence[int]]) -> None:
    """Give the arguments static types; their uses see a ``tensor.cast`` back to the
    declared type until canonicalization folds it away."""
    block = func.regions[0].blocks[0]
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    new_inputs = []
    for arg, shape in zip(block.arguments, shapes):
        old = arg.type
        if not isinstance(old, ir.RankedTensorType) or old.has_static_shape:
            new_inputs.append(old)
            continue
        static = ir.RankedTensorType.get(list(shape), ir.RankedTensorType(old).element_type)
        arg.set_type(static)
        with ir.InsertionPoint.at_block_begin(block):
            cast = tensor.CastOp(old, arg)
        arg.replace_all_uses_except(cast.result, cast.operation)
        new_inputs.append(static)
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(new_inputs, ftype.results))


def _refine_results(func: ir.Operation) -> None:
    """Return the static values behind the final casts, and say so in the signature."""
    block = func.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1].operation
    results = []
    for i, v in enumerate(list(ret.operands)):
        owner = v.owner if not isinstance(v.owner, ir.Block) else None
        if owner is not None and owner.name == "tensor.cast":
            src = owner.operands[0]
            if isinstance(src.type, ir.RankedTensorType) and src.type.has_static_shape:
                ret.operands[i] = src
                v = src
        results.append(v.type)
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs), results))
    for op in list(block.operations):  # casts nothing reads any more
        op = op.operation
        if op.name == "tensor.cast" and not list(op.results[0].uses):
            op.erase()


def _refuse_remaining(func: ir.Operation, name: str, shapes: Sequence[Sequence[int]]) -> None:
    """A ``?`` left after folding is a size read from data: name the op that makes it."""
    block = func.regions[0].blocks[0]
    for op in block.operations:
        op = op.operation
        for r in op.results:
            if isinstance(r.type, ir.RankedTensorType) and not r.type.has_static_shape:
                raise OpfuseError(
                    f"@{name} at argument shapes {', '.join(map(str, map(tuple, shapes)))}: "
                    f"the size of '{op.name}' ({r.type}) does not follow from the argument "
                    f"sizes (a size read from tensor data is not supported)")


def _first(e: ir.MLIRError, diags: list[str]) -> str:
    """The first error: MLIR's diagnostics on ``e`` (``oir.error_lines``), else those
    collected while the passes ran."""
    lines = [line for line in error_lines(e) if not line.startswith("error: ")] + diags
    return (lines or [str(e).strip()])[0].splitlines()[0]


__all__ = ["argument_shapes", "is_dynamic", "specialize", "uniform_shapes"]
