"""The host schedule of an outlined module: the entry function as buffers and steps.

After ``opfuse-outline`` the entry function holds only ``func.call``s of fused kernels
(plus free ops and data constants); :func:`extract` turns it into a
:class:`~opfuse.runtime.schedule.HostSchedule`. A kernel whose results are all reshapes of
its arguments (``view_only``) becomes ``View`` steps: no launch, no copy. An output that is
an input, a constant or a value returned twice is copied, so every output the caller gets
is a fresh array.
"""

from __future__ import annotations

import re

import numpy as np
from mlir import ir

from ....errors import OpfuseError
from ....ir import format_location
from ....runtime.schedule import Buffer, Call, Copy, HostSchedule, View, dtype_of
from ..build.kernel import element_type_text, shape_of


def extract(entry: ir.Operation, view_only: set[str]) -> HostSchedule:
    """The schedule of ``entry`` (a function of an outlined module).

    Args:
        entry: the host function.
        view_only: names of kernels whose results are views of their arguments.

    Raises:
        OpfuseError: the host holds an op other than calls, constants and returns.
    """
    name = ir.StringAttr(entry.attributes["sym_name"]).value
    buffers: list[Buffer] = []
    of: dict[ir.Value, int] = {}
    consts: dict[int, np.ndarray] = {}
    steps = []

    def new(v: ir.Value | None, t: ir.Type, role: str, index: int | None = None) -> int:
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            raise OpfuseError(f"@{name}: the GPU backend needs static tensors, got {t}")
        b = Buffer(len(buffers), shape_of(t), element_type_text(t), role, index)
        buffers.append(b)
        if v is not None:
            of[v] = b.id
        return b.id

    block = entry.regions[0].blocks[0]
    inputs = [new(a, a.type, "input", i) for i, a in enumerate(block.arguments)]
    outputs: list[int] = []
    for op in block.operations:
        op = op.operation
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            args = tuple(_buffer(of, v, op, name, new, consts) for v in op.operands)
            if callee in view_only:
                results = []
                for r in op.results:
                    results.append(new(r, r.type, "temp"))
                for r, src in zip(results, _view_sources(op, args)):
                    steps.append(View(r, src))
                continue
            results = tuple(new(r, r.type, "temp") for r in op.results)
            steps.append(Call(callee, args, results))
        elif op.name == "func.return":
            taken: set[int] = set()
            root = {s.dst: s.src for s in steps if isinstance(s, View)}
            for i, v in enumerate(op.operands):
                b = _buffer(of, v, op, name, new, consts)
                r = b
                while r in root:
                    r = root[r]
                if buffers[r].role != "temp" or r in taken:
                    dst = new(None, v.type, "temp")
                    steps.append(Copy(dst, b))
                    b = r = dst
                taken.add(r)
                outputs.append(b)
        elif op.name in ("arith.constant", "tensor.empty", "ub.poison"):
            continue  # materialized when a call uses it
        else:
            raise OpfuseError(
                f"@{name}: '{op.name}' in the host function; the GPU backend runs outlined "
                "programs (calls of fused kernels) only",
                diagnostics=[
                    f"{format_location(op.location)}: error: '{op.name}' is not a kernel call"
                ],
            )
    return HostSchedule(name, buffers, inputs, outputs, steps, consts)


def _buffer(of: dict, v: ir.Value, user: ir.Operation, name: str, new, consts) -> int:
    if v in of:
        return of[v]
    owner = v.owner
    op = owner.operation if hasattr(owner, "operation") else owner
    if not isinstance(op, ir.Block) and op.name == "arith.constant":
        b = new(v, v.type, "const")
        consts[b] = _constant_data(op, v.type)
        return b
    if not isinstance(op, ir.Block) and op.name == "tensor.empty":
        return new(v, v.type, "temp")
    raise OpfuseError(
        f"@{name}: operand of {user.name} comes from "
        f"'{getattr(op, 'name', 'a block argument')}', which the host cannot run"
    )


def _constant_data(op: ir.Operation, t: ir.Type) -> np.ndarray:
    attr = op.attributes["value"]
    dtype = dtype_of(element_type_text(t))
    shape = shape_of(t)
    if not isinstance(attr, ir.DenseElementsAttr):  # dense_resource: a blob (holds_data)
        return resource_data(op, dtype, shape)
    dense = ir.DenseElementsAttr(attr)
    if dense.is_splat:
        value = dense.get_splat_value()
        scalar = value.value if hasattr(value, "value") else float(str(value).split(":")[0])
        return np.full(shape, scalar, dtype=dtype)
    try:
        arr = np.array(attr, copy=True)
    except Exception as e:  # pragma: no cover - exotic element types
        raise OpfuseError(f"cannot read a dense constant of type {t}: {e}") from None
    return arr.reshape(shape).astype(dtype, copy=False)


_BLOB = re.compile(r'^\s*"?([^":\s]+)"?\s*:\s*"0x([0-9A-Fa-f]*)"', re.M)


def resource_data(op: ir.Operation, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The data of a ``dense_resource<...>`` constant (torch-mlir's weights).

    The bindings give no access to a resource's blob, but the printer writes it: printing a
    scratch module that holds only a clone of ``op`` prints just the blob ``op`` uses, as
    hex (a 4-byte alignment header, then the elements' bytes in the element type's layout).
    """
    with op.context, ir.Location.unknown(op.context):
        scratch = ir.Module.create()
        op.clone(ip=ir.InsertionPoint(scratch.body))
    found = _BLOB.search(scratch.operation.get_asm())
    if found is None:
        raise OpfuseError(
            f"{format_location(op.location)}: the dense_resource constant has no data "
            "(its blob is missing from the module)"
        )
    raw = bytes.fromhex(found.group(2))[4:]
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != count * dtype.itemsize:
        raise OpfuseError(
            f"{format_location(op.location)}: the dense_resource blob has {len(raw)} bytes, "
            f"its type {count} x {dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _view_sources(op: ir.Operation, args: tuple[int, ...]) -> list[int]:
    """For a view-only kernel call, the argument buffer each result views."""
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    module = op.parent
    while module is not None and module.operation.name != "builtin.module":
        module = module.parent
    func = None
    for top in module.regions[0].blocks[0].operations:
        top = top.operation
        if top.name == "func.func" and ir.StringAttr(top.attributes["sym_name"]).value == callee:
            func = top
    entry = func.regions[0].blocks[0]
    ret = list(entry.operations)[-1]
    out = []
    for v in ret.operands:
        while not isinstance(v.owner, ir.Block):
            v = v.owner.operands[0]
        out.append(args[ir.BlockArgument(v).arg_number])
    return out
