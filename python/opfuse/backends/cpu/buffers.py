"""Buffers planned once per executable, not allocated on every call.

After bufferization every intermediate is a ``memref.alloc``: the host function's
buffers between kernels, a kernel's own temporaries, the matmul packing buffers, the
per-tile scratch of a tiled kernel. Left alone, each becomes a ``malloc``/``free`` per call
(per tile, inside tile loops), and a large one is fresh ``mmap``'ed memory whose every page
faults on first touch: at 4096^2 that is tens of milliseconds per call. Three rewrites, on
buffers, before the deallocation pipeline (which then has only dynamic sizes left to
free), except the third, which runs after it:

1. :func:`elide_result_copies`: a result the public function computes into a buffer of its
   own and then copies into the caller's output array is computed into the output array.
2. :func:`plan_workspaces`: each function's statically sized buffers outside loops become
   views of one workspace, a ``memref.global`` allocated with the program, at offsets
   that reuse the bytes of buffers no longer live (first fit over live ranges).
3. :func:`stack_scratch`: in-loop buffers of static size up to :data:`STACK_LIMIT`
   bytes (a tile's scratch) become stack allocations, the loop body between a stack save
   and restore: freed at the end of each iteration, private to the thread running it.

A workspace belongs to the compiled program, so one program must not run twice at once:
the CPU runtime serializes calls (``CpuProgram`` holds a lock).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, memref

#: Largest in-loop buffer put on the stack (per thread, per tile), bytes.
STACK_LIMIT = 256 * 1024

#: Alignment of every workspace slice (a cache line; AVX-512 loads).
ALIGNMENT = 64

_WORKSPACE = "__opfuse_workspace_"
_LOOPS = ("scf.for", "scf.forall", "scf.parallel")
# ops whose memref result is a view of their first memref operand
_VIEWS = ("memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
          "memref.reinterpret_cast", "memref.transpose", "memref.view")


def _functions(module: ir.Module) -> list[ir.Operation]:
    return [op.operation for op in module.body.operations
            if op.operation.name == "func.func" and op.operation.regions[0].blocks]


def elide_result_copies(module: ir.Module) -> int:
    """Replace ``%b = memref.alloc; ...; memref.copy %b, %out`` by writing into ``%out``
    where ``%out`` is a function argument used by nothing else, ``%b`` a buffer of the
    same type allocated in the function's entry block and not used after the copy."""
    count = 0
    for fn in _functions(module):
        # one at a time, the block re-read after each: erased ops must not be looked up
        while _elide_one(fn.regions[0].blocks[0]):
            count += 1
    return count


def _elide_one(block: ir.Block) -> bool:
    args = list(block.arguments)
    ops = [o.operation for o in block.operations]
    position = {o: i for i, o in enumerate(ops)}
    for copy in [o for o in ops if o.name == "memref.copy"]:
        src, dst = copy.operands
        if dst not in args or len(list(dst.uses)) != 1 or src.type != dst.type:
            continue
        owner = src.owner
        if isinstance(owner, ir.Block) or owner.name != "memref.alloc":
            continue
        if owner.operation not in position:
            continue
        tops = [_top(u.owner.operation, block) for u in src.uses]
        if any(t is not None and position[t] > position[copy] for t in tops):
            continue
        copy.erase()
        src.replace_all_uses_with(dst)
        owner.erase()
        return True
    return False


def _top(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of ``op`` (itself included) that is an op of ``block``."""
    op = op.operation if op is not None else None
    while op is not None and op.name != "builtin.module":
        if op.block == block:
            return op
        op = op.parent
    return None


def _static_bytes(t: ir.MemRefType) -> int | None:
    """Bytes of a statically shaped memref with an identity layout, else None."""
    if not t.has_static_shape or not isinstance(t.layout, ir.AffineMapAttr):
        return None
    if ir.AffineMapAttr(t.layout).value != ir.AffineMap.get_identity(t.rank):
        return None
    et = t.element_type
    if not isinstance(et, (ir.FloatType, ir.IntegerType)):
        return None
    n = 1
    for d in t.shape:
        n *= d
    return n * max(1, et.width // 8)


@dataclass
class _Buffer:
    alloc: ir.Operation
    size: int
    start: int
    end: int
    offset: int = 0


def plan_workspaces(module: ir.Module) -> int:
    """Static buffers of each function's entry block into one workspace global per
    function (module docstring, 2); returns how many allocations it replaced. Runs before
    the deallocation pipeline, so that none of them gets a ``free``."""
    moved = 0
    with module.context:
        for fn in _functions(module):
            moved += _workspace(module, fn)
    return moved


def stack_scratch(module: ir.Module) -> int:
    """In-loop static buffers of at most :data:`STACK_LIMIT` bytes onto the stack
    (module docstring, 3); returns how many. Runs after the deallocation pipeline (its
    canonicalization would move the allocas): their deallocs are erased."""
    moved = 0
    with module.context:
        for fn in _functions(module):
            moved += _stack_allocs(fn)
    return moved


def _workspace(module: ir.Module, fn: ir.Operation) -> int:
    block = fn.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    buffers = []
    for i, op in enumerate(ops):
        if op.name != "memref.alloc" or len(op.operands):
            continue
        t = ir.MemRefType(op.results[0].type)
        size = _static_bytes(t)
        if size is None:
            continue
        end = _last_use(op.results[0], block, ops)
        buffers.append(_Buffer(op, size, i, end))
    if not buffers:
        return 0
    total = _pack(buffers)
    ctx = module.context
    name = _WORKSPACE + ir.StringAttr(fn.attributes["sym_name"]).value
    with ctx, fn.location:
        i8 = ir.IntegerType.get_signless(8)
        ws_type = ir.MemRefType.get([total], i8)
        with ir.InsertionPoint(fn):
            memref.GlobalOp(sym_name=name, type_=ws_type, sym_visibility="private",
                            initial_value=ir.UnitAttr.get(), alignment=ALIGNMENT)
        with ir.InsertionPoint.at_block_begin(block):
            ws = memref.get_global(ws_type, name)
        index = ir.IndexType.get()
        for b in buffers:
            with ir.InsertionPoint(b.alloc), b.alloc.location:
                offset = arith.constant(index, b.offset)
                view = memref.view(b.alloc.results[0].type, ws, offset, [])
            b.alloc.results[0].replace_all_uses_with(view)
            b.alloc.erase()
    return len(buffers)


def _last_use(value: ir.Value, block: ir.Block, ops: list[ir.Operation]) -> int:
    """Index in ``ops`` of the last op of ``block`` using ``value`` or a view of it."""
    position = {o: i for i, o in enumerate(ops)}
    last = position.get(value.owner.operation if not isinstance(value.owner, ir.Block) else None, 0)
    work = [value]
    seen = set()
    while work:
        v = work.pop()
        for use in v.uses:
            user = use.owner.operation
            top = _top(user, block)
            if top is not None:
                last = max(last, position[top])
            if user.name in _VIEWS and user not in seen:
                seen.add(user)
                work += list(user.results)
    return last


def _pack(buffers: list[_Buffer]) -> int:
    """First fit: each buffer, in allocation order, at the lowest aligned offset that
    overlaps no buffer live at the same time. Returns the workspace size."""
    placed: list[_Buffer] = []
    total = 0
    for b in buffers:
        busy = sorted((p.offset, p.offset + p.size) for p in placed
                      if not (p.end < b.start or b.end < p.start))
        offset = 0
        for lo, hi in busy:
            if offset + b.size <= lo:
                break
            offset = max(offset, _align(hi))
        b.offset = offset
        placed.append(b)
        total = max(total, offset + b.size)
    return max(_align(total), ALIGNMENT)


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _stack_allocs(fn: ir.Operation) -> int:
    """In-loop static allocs of at most STACK_LIMIT bytes, freed by ``memref.dealloc``
    only, -> allocas, their innermost loop's body between a stack save and restore."""
    found: list[tuple[ir.Operation, ir.Block]] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "memref.alloc" and not len(op.operands):
            t = ir.MemRefType(op.results[0].type)
            size = _static_bytes(t)
            loop = op.parent
            if (size is not None and size <= STACK_LIMIT and loop is not None
                    and loop.name in _LOOPS and not _escapes(op.results[0])):
                found.append((op.operation, op.operation.block))
        return ir.WalkResult.ADVANCE

    fn.walk(visit)
    scoped: list[ir.Block] = []
    for op, block in found:
        if block not in scoped:
            with op.location:
                _scope(block)
            scoped.append(block)
        for dealloc in [u.owner.operation for u in op.results[0].uses
                        if u.owner.operation.name == "memref.dealloc"]:
            dealloc.erase()
        with ir.InsertionPoint(op), op.location:
            alloca = memref.alloca(op.results[0].type, [], [])
            if "alignment" in op.attributes:
                alloca.owner.attributes["alignment"] = op.attributes["alignment"]
        op.results[0].replace_all_uses_with(alloca)
        op.erase()
    return len(found)


def _escapes(value: ir.Value) -> bool:
    """Whether a buffer (or a view of it) leaves its block: yielded, returned, stored."""
    work, seen = [value], set()
    while work:
        v = work.pop()
        for use in v.uses:
            user = use.owner.operation
            if user.name in ("scf.yield", "func.return", "memref.store", "llvm.store"):
                return True
            if user.name in _VIEWS and user not in seen:
                seen.add(user)
                work += list(user.results)
    return False


def _scope(block: ir.Block) -> None:
    """Bracket a loop body with ``llvm.intr.stacksave``/``stackrestore``: its stack
    allocations end with each iteration. (Not ``memref.alloca_scope``: its region must stay
    one block, and the loops inside it become several when lowered to branches.)"""
    ops = [o.operation for o in block.operations]
    ptr = ir.Type.parse("!llvm.ptr")
    with ir.InsertionPoint(ops[0]):
        saved = ir.Operation.create("llvm.intr.stacksave", results=[ptr]).results[0]
    with ir.InsertionPoint(ops[-1]):
        ir.Operation.create("llvm.intr.stackrestore", operands=[saved])
