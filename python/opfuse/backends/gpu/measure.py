"""Measured registers for the cost guard (``--measure-registers``).

The guard's ``R_fused`` is an estimate (:func:`opfuse.cost.estimate_registers`). With
ptxas installed, :func:`group_registers` replaces it by the real figure: the candidate
group (a producer group and a consumer group, merged) is outlined into a scratch module,
built by the same emitters as the final kernel, lowered, and assembled with ``ptxas -v``
for the guard's target. Every step goes through the kernel cache, so a candidate seen
before costs a lookup. ``None`` means "no measurement" (no ptxas, or no emitter for the
group): the caller keeps its estimate.
"""

from __future__ import annotations

from typing import Sequence

from mlir import ir
from mlir.dialects import func as func_d

from ... import kinds
from ...analysis import groups
from ...analysis.graph import external_values
from ...errors import OpfuseError
from ...ir import walk_nested
from .lower import ptxas as ptxas_mod


def install() -> None:
    """Let the planner's ``measure_registers`` option ask ptxas (:func:`group_registers`)."""
    groups.use_register_measure(group_registers)


def group_registers(planner, p, c) -> int | None:
    """ptxas registers per thread of the kernel for ``p`` and ``c`` merged (Planner groups),
    for the planner's target; None when it cannot be measured."""
    members = sorted(set(p.members) | set(c.members))
    ops = [planner.graph.nodes[i].op for i in members]
    kind = kinds.derive({k.value for k in (p.kinds | c.kinds)})
    return registers_of(ops, kind, planner.options.target)


def registers_of(ops: Sequence[ir.Operation], kind: str, target: str) -> int | None:
    """Registers of the kernel computing ``ops`` (top-level ops of one function, in block
    order) as one fused group of ``kind``; None without ptxas or an emitter for it."""
    if ptxas_mod.find_ptxas() is None or not ops:
        return None
    from .compiler import compile_module

    module = _outline(list(ops), kind)
    try:
        program = compile_module(module, targets=(target,), ptxas=True)
    except OpfuseError:
        return None
    regs = [k.resources.get(target, {}).get("registers") for k in program.kernels.values()]
    regs = [r for r in regs if r is not None]
    return max(regs) if regs else None


def _outline(ops: list[ir.Operation], kind: str) -> ir.Module:
    """A scratch module: ``@fusion_0_<kind>`` computing ``ops`` and a host calling it."""
    ctx = ops[0].context
    members = set(ops)
    host = ops[0].parent.operation
    free_ops, arg_list = external_values(host, ops)
    outputs = []
    for m in ops:
        for r in m.results:
            if any(
                u.owner.operation not in members and not _inside_any(u.owner.operation, members)
                for u in r.uses
            ):
                outputs.append(r)
    if not outputs:
        outputs = list(ops[-1].results)
    module = ir.Module.create(ir.Location.unknown(ctx))
    with ctx, ir.Location.unknown(ctx):
        with ir.InsertionPoint(module.body):
            kernel = func_d.FuncOp(
                f"fusion_0_{kind}",
                ([a.type for a in arg_list], [r.type for r in outputs]),
                visibility="private",
            )
            entry = kernel.add_entry_block()
            wrapper = func_d.FuncOp(
                "measure", ([a.type for a in arg_list], [r.type for r in outputs])
            )
            wentry = wrapper.add_entry_block()
        mapping = dict(zip(arg_list, entry.arguments))
        with ir.InsertionPoint(entry):
            for op in free_ops + ops:
                clone = op.clone()
                for inner in walk_nested(clone):
                    for i, v in enumerate(inner.operands):
                        if v in mapping:
                            inner.operands[i] = mapping[v]
                for old, new in zip(op.results, clone.results):
                    mapping[old] = new
                for name in ("opfuse.group", "opfuse.kind"):
                    if name in clone.attributes:
                        del clone.attributes[name]
            func_d.ReturnOp([mapping[r] for r in outputs])
        with ir.InsertionPoint(wentry):
            call = func_d.CallOp(
                [r.type for r in outputs],
                ir.FlatSymbolRefAttr.get(kernel.name.value),
                list(wentry.arguments),
            )
            func_d.ReturnOp(list(call.results))
        kernel.operation.attributes["opfuse.kernel"] = ir.UnitAttr.get(ctx)
        kernel.operation.attributes["opfuse.kind"] = ir.StringAttr.get(kind, ctx)
    return module


def _inside_any(op: ir.Operation, members: set) -> bool:
    p = op.parent
    while p is not None:
        if p.operation in members:
            return True
        p = p.parent
    return False
