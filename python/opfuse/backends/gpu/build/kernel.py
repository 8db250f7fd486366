"""One GPU kernel under construction: a host function holding one ``gpu.launch``.

The emitters (loop, rows, matmul, fallback) build kernels through :class:`KernelBuilder`:
it parses the launch skeleton (grid, block and shared memory are fixed when the kernel is
created: the launch shape is a decision, not a by-product), then offers the few building
blocks every emitter needs: cached constants, affine index math over the kernel's index
variables, loads/stores, ``scf.if``/``scf.for`` regions with their own value scopes.

Kernel parameters are memrefs with static shapes, one per buffer the kernel touches; with
bare-pointer lowering each becomes one ``.u64`` pointer, so a parameter may be declared
with any shape that has the same bytes as the host buffer (reshapes are free).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

from mlir import ir
from mlir.dialects import affine, arith, scf

from ....analysis.indexing import delinearize, linearize, numel  # noqa: F401  (re-exported)

#: Index arguments of a ``gpu.launch`` body: block ids, thread ids, grid dims, block dims.
_LAUNCH_INDEX_ARGS = 12


class Unsupported(Exception):
    """An emitter cannot build this group; the driver tries the next emitter."""


@dataclass(frozen=True)
class Param:
    """One kernel parameter: a device buffer of a fusion function.

    Attributes:
        binding: ``("arg", i)`` or ``("result", i)`` of the fusion function.
        shape: the static shape the kernel sees.
        element_type: MLIR spelling (``f32``).
    """

    binding: tuple[str, int]
    shape: tuple[int, ...]
    element_type: str

    @property
    def type_text(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"memref<{dims}{self.element_type}>"


@dataclass(frozen=True)
class Shared:
    """A statically sized shared-memory (workgroup) buffer."""

    size: int
    element_type: str = "f32"

    @property
    def type_text(self) -> str:
        # NVVM's shared address space by number, not `#gpu.address_space<workgroup>`:
        # convert-vector-to-llvm runs before convert-gpu-to-nvvm and cannot map the GPU
        # attribute, so a vector.load from shared memory would not lower.
        return f"memref<{self.size}x{self.element_type}, 3>"

    @property
    def bytes(self) -> int:
        return self.size * _bits(self.element_type) // 8


def _bits(element_type: str) -> int:
    digits = "".join(ch for ch in element_type if ch.isdigit())
    return int(digits) if digits else 64


class KernelBuilder:
    """A ``func.func @<name>(memref params) { gpu.launch ... }`` being filled in.

    Args:
        module: the module the kernel function is appended to.
        name: kernel name (also the host function's symbol).
        params: the buffers, in declaration order.
        grid, block: launch shape (x, y, z), fixed here.
        shared: workgroup buffers (static shared memory).
    """

    def __init__(
        self,
        module: ir.Module,
        name: str,
        params: Sequence[Param],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: Sequence[Shared] = (),
    ):
        if min(grid) < 1 or min(block) < 1:
            raise ValueError(f"kernel {name}: empty launch {grid} x {block}")
        self.name = name
        self.grid = tuple(int(g) for g in grid)
        self.block = tuple(int(b) for b in block)
        self.param_specs = list(params)
        self.shared_specs = list(shared)
        ctx = module.context
        self.ctx = ctx
        args = ", ".join(f"%p{i}: {p.type_text}" for i, p in enumerate(params))
        wg = ""
        if shared:
            wg = (
                " workgroup("
                + ", ".join(f"%sm{i} : {s.type_text}" for i, s in enumerate(shared))
                + ")"
            )
        g, b = self.grid, self.block
        text = f"""
func.func @{name}({args}) {{
  %gx = arith.constant {g[0]} : index
  %gy = arith.constant {g[1]} : index
  %gz = arith.constant {g[2]} : index
  %bx = arith.constant {b[0]} : index
  %by = arith.constant {b[1]} : index
  %bz = arith.constant {b[2]} : index
  gpu.launch blocks(%i0, %i1, %i2) in (%s0 = %gx, %s1 = %gy, %s2 = %gz)
             threads(%t0, %t1, %t2) in (%s3 = %bx, %s4 = %by, %s5 = %bz){wg} {{
    gpu.terminator
  }}
  return
}}"""
        scratch = ir.Module.parse(text, ctx)
        func = scratch.body.operations[0].operation
        func.detach_from_parent()
        ir.InsertionPoint(module.body).insert(func)
        self.func = func
        entry = func.regions[0].blocks[0]
        self.params: list[ir.Value] = list(entry.arguments)
        self.launch = next(
            o.operation for o in entry.operations if o.operation.name == "gpu.launch"
        )
        self.body = self.launch.regions[0].blocks[0]
        a = list(self.body.arguments)
        self.block_id = a[0:3]
        self.thread_id = a[3:6]
        self.shared: list[ir.Value] = a[_LAUNCH_INDEX_ARGS : _LAUNCH_INDEX_ARGS + len(shared)]
        self._init_body(self.body, ctx)

    def _init_body(self, body: ir.Block, ctx: ir.Context) -> None:
        """Emit into ``body``, before its last op (the terminator). Also how code that is
        not a GPU launch (the CPU's attention loops) reuses the builder."""
        self.ctx = ctx
        self._terminator = list(body.operations)[-1]
        self._ips: list[ir.InsertionPoint] = [ir.InsertionPoint(self._terminator)]
        # Prologue: constants and hoisted values go before this anchor, in creation order,
        # so they dominate everything the emitters put before the terminator.
        with ir.InsertionPoint.at_block_begin(body), ir.Location.unknown(ctx):
            self._anchor = arith.ConstantOp(ir.IndexType.get(ctx), 0).operation
        self._top = ir.InsertionPoint(self._anchor)
        self._consts: dict[tuple[str, str], ir.Value] = {}
        #: Index variables the affine expressions of the emitters refer to (d0, d1, ...).
        self.dims: list[ir.Value] = []
        self._scopes: list[dict] = [{}]
        self.index_type = ir.IndexType.get(ctx)
        #: Elements per thread along the vector dim (recorded in the KernelSpec).
        self.vector_lanes = 1
        #: What the kernel leaves out of the group's semantics (a dropped ``cf.assert``):
        #: the driver adds each line to the program's notes.
        self.notes: list[str] = []
        #: What the emitter chose (tile, stages, ...: KernelSpec.meta).
        self.meta: dict = {}
        #: Registers per thread ptxas may use (``.maxnreg``); None: its own choice, which
        #: for a ``.maxntid`` block size may aim at an occupancy and spill to reach it.
        self.max_registers: int | None = None

    # ----- insertion and scopes -------------------------------------------------------
    @property
    def ip(self) -> ir.InsertionPoint:
        return self._ips[-1]

    @contextlib.contextmanager
    def at(self, ip: ir.InsertionPoint) -> Iterator[None]:
        """Emit at ``ip`` inside a new value scope (values created there stay there)."""
        self._ips.append(ip)
        self._scopes.append({})
        n_dims = len(self.dims)
        try:
            with self.ctx, ip, ir.Location.unknown(self.ctx):
                yield
        finally:
            self._ips.pop()
            self._scopes.pop()
            del self.dims[n_dims:]

    @contextlib.contextmanager
    def emitting(self) -> Iterator[None]:
        """Emit at the current insertion point (the top level of the launch body)."""
        with self.ctx, self.ip, ir.Location.unknown(self.ctx):
            yield

    def memo_get(self, key) -> object | None:
        for scope in reversed(self._scopes):
            if key in scope:
                return scope[key]
        return None

    def memo_set(self, key, value) -> None:
        self._scopes[-1][key] = value

    def memo_set_outer(self, key, value) -> None:
        """Record in the scope where the value was created (the top-level scope)."""
        self._scopes[0][key] = value

    # ----- constants (hoisted to the top of the launch body) ---------------------------
    def index(self, value: int) -> ir.Value:
        return self.const(self.index_type, int(value))

    def const(self, type_: ir.Type, value) -> ir.Value:
        key = (str(type_), repr(value))
        v = self._consts.get(key)
        if v is None:
            with self.ctx, self._top, ir.Location.unknown(self.ctx):
                if isinstance(type_, ir.VectorType):
                    elem = type_.element_type
                    attr = ir.DenseElementsAttr.get_splat(type_, _scalar_attr(elem, value))
                    v = arith.ConstantOp(type_, attr).result
                else:
                    v = arith.ConstantOp(type_, _scalar_attr(type_, value)).result
            self._consts[key] = v
        return v

    def const_attr(self, attr: ir.Attribute) -> ir.Value:
        """A constant from an attribute (e.g. a payload's ``arith.constant`` value)."""
        key = ("attr", str(attr))
        v = self._consts.get(key)
        if v is None:
            with self.ctx, self._top, ir.Location.unknown(self.ctx):
                v = ir.Operation.create(
                    "arith.constant", results=[attr.type], attributes={"value": attr}
                ).result
            self._consts[key] = v
        return v

    # ----- index math --------------------------------------------------------------------
    def add_dim(self, value: ir.Value) -> ir.AffineExpr:
        """Register an index variable; returns its affine dim expression."""
        self.dims.append(value)
        return ir.AffineDimExpr.get(len(self.dims) - 1, value.context)

    def apply(self, expr: ir.AffineExpr) -> ir.Value:
        """The index value of ``expr`` over the registered dims (memoized per scope)."""
        expr = expr.maybe_downcast()
        if isinstance(expr, ir.AffineConstantExpr):
            return self.index(expr.value)
        if isinstance(expr, ir.AffineDimExpr):
            return self.dims[expr.position]
        key = ("apply", expr)
        v = self.memo_get(key)
        if v is None:
            with self.emitting():
                amap = ir.AffineMap.get(len(self.dims), 0, [expr], self.ctx)
                v = affine.apply(amap, list(self.dims))
            self.memo_set(key, v)
        return v

    # ----- control flow ------------------------------------------------------------------
    @contextlib.contextmanager
    def if_(self, cond: ir.Value) -> Iterator[None]:
        """``scf.if cond { ... }`` without results; the body is emitted in the block."""
        with self.emitting():
            op = scf.IfOp(cond, [], has_else=False)
        block = op.then_block
        with self.at(ir.InsertionPoint(block)):
            yield
            scf.YieldOp([])

    def for_(self, lb: ir.Value, ub: ir.Value, step: ir.Value, inits: Sequence[ir.Value], body):
        """``scf.for`` whose body is ``body(iv, iter_args) -> yielded values``; returns the
        loop results. The body runs in its own scope."""
        with self.emitting():
            loop = scf.ForOp(lb, ub, step, list(inits))
        with self.at(ir.InsertionPoint(loop.body)):
            out = body(loop.induction_variable, list(loop.inner_iter_args))
            scf.YieldOp(list(out))
        return list(loop.results)

    # ----- small arithmetic helpers -------------------------------------------------------
    def cmp_lt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        with self.emitting():
            return arith.cmpi(arith.CmpIPredicate.ult, a, b)

    def min_index(self, a: ir.Value, b: ir.Value) -> ir.Value:
        with self.emitting():
            return arith.minui(a, b)

    def and_(self, a: ir.Value | None, b: ir.Value | None) -> ir.Value | None:
        """``a and b``; None stands for "no condition" (a full tile, a whole row)."""
        if a is None or b is None:
            return b if a is None else a
        with self.emitting():
            return arith.andi(a, b)

    def create(
        self,
        name: str,
        results: list[ir.Type],
        operands: list[ir.Value],
        attributes: dict | None = None,
    ) -> ir.Operation:
        with self.emitting():
            return ir.Operation.create(
                name, results=results, operands=operands, attributes=attributes or {}
            )

    # ----- finishing -----------------------------------------------------------------------
    @property
    def shared_bytes(self) -> int:
        return sum(s.bytes for s in self.shared_specs)


def _scalar_attr(type_: ir.Type, value) -> ir.Attribute:
    if isinstance(type_, (ir.IndexType, ir.IntegerType)):
        return ir.IntegerAttr.get(type_, int(value))
    return ir.FloatAttr.get(type_, float(value))


def shape_of(t: ir.Type) -> tuple[int, ...]:
    return tuple(ir.ShapedType(t).shape)



def element_type_text(t: ir.Type) -> str:
    return str(ir.ShapedType(t).element_type)


def element_bytes(elem: ir.Type) -> int:
    if isinstance(elem, ir.IntegerType):
        return max(1, elem.width // 8)
    if isinstance(elem, ir.IndexType):
        return 8
    for cls, size in ((ir.F64Type, 8), (ir.F32Type, 4), (ir.F16Type, 2), (ir.BF16Type, 2)):
        if isinstance(elem, cls):
            return size
    return 4


def vector_width(elem: ir.Type, inner: int) -> int:
    """Lanes per thread: one 16-byte vector, halved until it divides ``inner``."""
    v = max(1, 16 // element_bytes(elem))
    while v > 1 and inner % v:
        v //= 2
    return v
