"""The input contract: what opfuse accepts, checked once, right after parsing.

fuse-opt, fuse-run and ``opfuse.compile`` run :func:`accept` on every module they parse,
before any pass: a module outside the contract is refused here with
``file:line:col: error:`` naming the op and the reason (exit 1), instead of failing later
inside a pass or the JIT (a traceback, exit 2, an LLVM assertion, a segfault). The
contract (docs/architecture.md), derived from what the passes and both
backends handle:

* functions (``func.func``) of one block; calls only to functions defined in the module,
  never recursive (the CPU code would recurse until the stack overflows);
* tensors with static shapes, no dimension of ``2**40`` or more, none (argument, result or
  intermediate) larger than :attr:`Limits.max_tensor_bytes` (``OPFUSE_MAX_TENSOR_BYTES``);
* element types f64, f32, f16, bf16, i64, i32, i16, i8 and i1 (widened to i8 inside
  functions, :mod:`opfuse.frontends.mlir.widen`; public functions take and return i8 booleans);
* the ops in :mod:`opfuse.frontends.mlir.ops`: linalg structured ops, the tensor ops the passes
  know, constants, calls and returns at the top level of a function; arith, math and a
  few others inside linalg bodies. ``arith``/``math`` ops applied to whole tensors are
  rewritten as ``linalg.generic`` (upstream ``convert-elementwise-to-linalg``) rather than
  refused.

Modules may be named and carry attributes (``module @m attributes {...}``, as IREE and
torch-mlir print them).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.passmanager import PassManager

from ... import config
from ...errors import OpfuseError
from ...ir import collect_diagnostics, format_location, prune_to_entry
from . import ops as known
from .widen import is_i1_tensor, widen_i1

#: No dimension may reach this (2**40 elements along one axis is far past any real model,
#: and products of such dimensions overflow int64 byte counts).
MAX_DIM = 2**40

#: Nesting deeper than this (regions in regions) is refused: the passes walk IR
#: recursively, and no linalg program nests more than a few levels.
MAX_NESTING = 64

ELEMENT_TYPES = ("f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "i1")


@dataclass(frozen=True)
class Limits:
    """Size limits of the contract.

    Attributes:
        max_tensor_bytes: the largest tensor (argument, result or intermediate) accepted;
            None: ``OPFUSE_MAX_TENSOR_BYTES`` (default 16 GiB).
        max_dim: every dimension must be below this.
    """

    max_tensor_bytes: int | None = None
    max_dim: int = MAX_DIM

    def tensor_bytes_limit(self) -> int:
        if self.max_tensor_bytes is not None:
            return self.max_tensor_bytes
        return parse_bytes(config.MAX_TENSOR_BYTES.get() or "", config.MAX_TENSOR_BYTES.name)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
          "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40,
          "tib": 2**40}


def parse_bytes(text: str, what: str = "size") -> int:
    """``"16GiB"``, ``"512M"``, ``"1000000"`` -> bytes (binary units)."""
    s = text.strip().lower().replace(" ", "")
    digits = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(digits):]
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value <= 0:
        raise OpfuseError(f"{what}: expected a size such as 16GiB, 512MiB or 1000000, "
                          f"got {text!r}")
    return int(value * _UNITS[unit])


class _Refusal:
    """Collects refusals (the first few are reported, each located)."""

    LIMIT = 20

    def __init__(self, filename: str):
        self.filename = filename
        self.lines: list[str] = []
        self.first: str | None = None

    def add(self, op_or_loc, message: str) -> None:
        loc = op_or_loc if isinstance(op_or_loc, ir.Location) else op_or_loc.location
        if self.first is None:
            self.first = message
        if len(self.lines) < self.LIMIT:
            self.lines.append(f"{format_location(loc)}: error: {message}")

    def raise_if_any(self) -> None:
        if self.first is not None:
            more = len(self.lines) - 1
            suffix = f" (and {more} more)" if more > 0 else ""
            raise OpfuseError(f"{self.filename}: outside what opfuse accepts: {self.first}"
                              f"{suffix}", diagnostics=self.lines)


def accept(module: ir.Module, *, filename: str = "<input>", limits: Limits | None = None,
           entry: str | None = None) -> ir.Module:
    """Check ``module`` against the contract and normalize it in place (elementwise ops on
    tensors become linalg.generic; i1 tensors become i8). Returns ``module``.

    ``entry``: the function to compile; the functions it does not call (directly or not)
    are erased first, so only what it reaches is checked (a test file that mixes static
    and dynamic functions compiles its static one). An unknown name is left for
    :func:`opfuse.ir.find_entry` to report.

    Raises:
        OpfuseError: (exit 1) every violation found, one located line each.
    """
    limits = limits or Limits()
    if entry is not None and entry in _functions(module):
        prune_to_entry(module, entry)
    refusal = _Refusal(filename)
    _check_structure(module, refusal)
    refusal.raise_if_any()
    _tensor_ops_to_linalg(module, refusal)
    refusal.raise_if_any()
    _check_ops_and_types(module, refusal, limits)
    refusal.raise_if_any()
    widen_i1(module)
    _unread_inits_to_empty(module)
    _unit_slice_strides(module)
    return module


def _unit_slice_strides(module: ir.Module) -> None:
    """The stride of a slice dimension of size 1 does not matter (one element is taken,
    at the offset): it becomes 1. A rank-reducing slice that drops such a dimension with a
    stride other than 1 aborts MLIR's CPU lowering (``memref.subview`` cannot tell which
    dimension was dropped: an assertion, SIGABRT)."""
    for fn in _functions(module).values():
        if not fn.regions[0].blocks:
            continue
        for op in fn.regions[0].blocks[0].operations:
            op = op.operation
            if op.name not in ("tensor.extract_slice", "tensor.insert_slice"):
                continue
            sizes = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
            strides = list(ir.DenseI64ArrayAttr(op.attributes["static_strides"]))
            fixed = [1 if size == 1 and stride > 0 else stride for size, stride in zip(sizes, strides)]
            if fixed != strides:
                op.attributes["static_strides"] = ir.DenseI64ArrayAttr.get(fixed, module.context)


def _unread_inits_to_empty(module: ir.Module) -> None:
    for fn in _functions(module).values():
        unread_inits_to_empty(fn)


def unread_inits_to_empty(fn: ir.Operation) -> None:
    """An ``outs`` operand the op never reads (``linalg.exp ... outs(%prev)``) only names
    the shape of the result; made by another op it would be a dependency the fusion
    analysis does not see (it follows reads), and outlining would leave the operand behind
    in another kernel. It becomes a ``tensor.empty`` of its type, as upstream's elementwise
    fusion does (RemoveOutsDependency). So does a ``linalg.fill``'s ``outs`` (a fill is
    cloned into every kernel that uses it). Also run after opfuse-fold-unit-dims, whose
    rewritten ops get reshapes of their old ``outs`` (of an argument: harmless before)."""
    from mlir.dialects import tensor  # noqa: PLC0415

    from ...analysis.opinfo import describe_all, is_free_op  # noqa: PLC0415

    if not fn.regions[0].blocks:
        return
    ops = [o.operation for o in fn.regions[0].blocks[0].operations]
    linalg_ops = [o for o in ops if o.name.startswith("linalg.") and o.regions]
    if not linalg_ops:
        return
    for op, info in zip(linalg_ops, describe_all(fn, linalg_ops)):
        n_in = len(op.operands) - len(op.results)
        if op.name == "linalg.fill":
            used_outputs = [False]
        elif info.payload is None:
            continue
        else:
            used_outputs = info.payload.used_outputs
        for k, used in enumerate(used_outputs):
            v = op.operands[n_in + k]
            owner = v.owner
            if used or isinstance(owner, ir.Block) or is_free_op(owner.operation):
                continue
            t = ir.RankedTensorType(v.type)
            with ir.InsertionPoint(op), op.location:
                empty = tensor.EmptyOp(list(t.shape), t.element_type)
            op.operands[n_in + k] = empty.result


def _functions(module: ir.Module) -> dict[str, ir.Operation]:
    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func":
            out[ir.StringAttr(op.attributes["sym_name"]).value] = op
    return out


def _is_public(fn: ir.Operation) -> bool:
    return ("sym_visibility" not in fn.attributes
            or ir.StringAttr(fn.attributes["sym_visibility"]).value == "public")


def _check_structure(module: ir.Module, refusal: _Refusal) -> None:
    """Top-level ops, blocks per function, nesting depth, calls and recursion."""
    funcs = _functions(module)
    calls: dict[str, set[str]] = {}
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func":
            refusal.add(op, f"'{op.name}' at the top level of the module: opfuse takes "
                        "modules of func.func")
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        blocks = list(op.regions[0].blocks)
        if len(blocks) > 1:
            refusal.add(op, f"@{name} has {len(blocks)} blocks: opfuse takes functions of "
                        "one block (no branches)")
            continue
        if not blocks:
            continue  # a declaration: only an error if something calls it
        depth = _max_depth(op, refusal)
        if depth > MAX_NESTING:
            continue
        calls[name] = set()
        for inner in _walk(op):
            if inner.name == "func.call":
                callee = ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
                if callee not in funcs or not funcs[callee].regions[0].blocks:
                    refusal.add(inner, f"call of @{callee}, which is not defined in the module "
                                "(opfuse compiles self-contained modules)")
                calls[name].add(callee)
    for name in _recursive(calls):
        refusal.add(funcs[name], f"@{name} calls itself (directly or through other "
                    "functions): recursion is not supported")


def _walk(op: ir.Operation):
    """Pre-order walk without Python recursion (input nesting can be arbitrarily deep)."""
    stack = [op]
    while stack:
        cur = stack.pop()
        yield cur
        children = []
        for region in cur.regions:
            for block in region.blocks:
                children.extend(o.operation for o in block.operations)
        stack.extend(reversed(children))


def _max_depth(fn: ir.Operation, refusal: _Refusal) -> int:
    deepest = 0
    stack = [(fn, 0)]
    while stack:
        cur, depth = stack.pop()
        if depth > MAX_NESTING:
            refusal.add(cur, f"'{cur.name}' is nested {depth} regions deep (at most "
                        f"{MAX_NESTING})")
            return depth
        deepest = max(deepest, depth)
        for region in cur.regions:
            for block in region.blocks:
                stack.extend((o.operation, depth + 1) for o in block.operations)
    return deepest


def _recursive(calls: dict[str, set[str]]) -> list[str]:
    """Functions on a call cycle (iterative DFS)."""
    on_cycle: list[str] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    for root in calls:
        if state.get(root):
            continue
        stack = [(root, iter(sorted(calls.get(root, ()))))]
        state[root] = 1
        path = [root]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            if state.get(nxt) == 1:
                for n in path[path.index(nxt):]:
                    if n not in on_cycle:
                        on_cycle.append(n)
            elif not state.get(nxt) and nxt in calls:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(calls.get(nxt, ())))))
    return on_cycle


def _tensor_ops_to_linalg(module: ir.Module, refusal: _Refusal) -> None:
    """arith/math ops on whole tensors -> linalg.generic, the one upstream rewrite that is
    exact and cheap; only when there are some (the pass leaves other IR alone)."""
    found = False
    for fn in _functions(module).values():
        if not fn.regions[0].blocks:
            continue
        for op in fn.regions[0].blocks[0].operations:
            op = op.operation
            if known.is_elementwise_on_tensors(op):
                found = True
                break
    if not found:
        return
    ctx = module.context
    with collect_diagnostics(ctx) as diags:
        try:
            PassManager.parse("builtin.module(func.func(convert-elementwise-to-linalg))",
                              ctx).run(module.operation)
        except ir.MLIRError:
            refusal.add(module.operation, "arith/math ops on tensors that "
                        "convert-elementwise-to-linalg cannot rewrite: "
                        + "; ".join(diags[:3]))


def _check_ops_and_types(module: ir.Module, refusal: _Refusal, limits: Limits) -> None:
    max_bytes = limits.tensor_bytes_limit()
    for name, fn in _functions(module).items():
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        public = _is_public(fn) and bool(fn.regions[0].blocks)
        for what, types in (("argument", ftype.inputs), ("result", ftype.results)):
            for i, t in enumerate(types):
                why = _type_problem(t, limits.max_dim, max_bytes)
                if why:
                    refusal.add(fn, f"{why}: {what} {i} of @{name} has type {t}")
                elif public and is_i1_tensor(t):
                    refusal.add(fn, f"{what} {i} of @{name} has type {t}: public functions "
                                "take and return booleans as i8 (opfuse widens i1 inside "
                                "functions only)")
        if not fn.regions[0].blocks:
            continue
        for op in fn.regions[0].blocks[0].operations:
            _check_top_op(op.operation, refusal, limits.max_dim, max_bytes)


def _check_top_op(op: ir.Operation, refusal: _Refusal, max_dim: int, max_bytes: int) -> None:
    why = known.top_level_problem(op)
    if why:
        refusal.add(op, f"'{op.name}' {why}")
        return
    for v in op.results:  # operands are results of earlier ops, or arguments
        problem = _type_problem(v.type, max_dim, max_bytes)
        if problem == _DYNAMIC:  # inside a function --dim-size cannot help
            problem = ("a ? dim inside a function is supported where it follows from a "
                       "dynamic entry's argument sizes")
        if problem:
            refusal.add(op, f"{problem}: '{op.name}' produces {v.type}")
            return
    for region in op.regions:
        for block in region.blocks:
            for inner in _walk_block(block):
                why = known.payload_problem(op, inner)
                if why:
                    refusal.add(inner, f"'{inner.name}' {why}")
                    return


def _walk_block(block: ir.Block):
    for o in block.operations:
        yield from _walk(o.operation)


_DYNAMIC = ("dynamic shapes are compiled at given sizes (--dim-size N; opfuse.compile "
            "specializes an entry with ? dims at each call's shapes)")


def _type_problem(t: ir.Type, max_dim: int, max_bytes: int) -> str | None:
    """Why tensor type ``t`` is outside the contract (None for scalars and good tensors)."""
    if not isinstance(t, ir.ShapedType):
        return None
    if not isinstance(t, ir.RankedTensorType):
        return "only ranked tensors are supported"
    if not t.has_static_shape:
        return _DYNAMIC
    shape = list(t.shape)
    if any(d >= max_dim for d in shape):
        return "a dimension of 2**40 or more is not supported"
    elem = str(t.element_type)
    if elem not in ELEMENT_TYPES:
        return f"element type {elem} is not supported (supported: {', '.join(ELEMENT_TYPES)})"
    n = 1
    for d in shape:
        n *= d
    size = n * max(1, _bits(elem) // 8)
    if size > max_bytes:
        return (f"{_human(size)} tensor over the size limit of {_human(max_bytes)} (set "
                f"{config.MAX_TENSOR_BYTES.name} or --max-tensor-bytes to raise it)")
    return None


def _bits(elem: str) -> int:
    return int("".join(ch for ch in elem if ch.isdigit()) or 8)


def _human(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


__all__ = ["ELEMENT_TYPES", "Limits", "MAX_DIM", "accept", "parse_bytes", "widen_i1"]
