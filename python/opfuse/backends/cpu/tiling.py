"""Tile loops for the CPU kernels: each kernel's last op tiled along its outer parallel
dimensions (one ``scf.forall``), and its producers fused into the tile loop.

This is what makes a fused kernel one pass over memory on the CPU: a softmax tiled by
rows computes the max, the exponentials, the sum and the quotient of a few rows while they
sit in the L1/L2 cache, instead of four sweeps over the whole tensor; a matmul kernel
computes a block of rows of the product and applies its epilogue (bias, GELU) to that
block right away. The tile loop is also what the threads share
(:mod:`opfuse.backends.cpu.threads`): its iterations are independent.

Upstream does the tiling and fusing (``transform.structured.tile_using_forall`` and
``fuse_into_containing_op``, with CSE in between so a producer used twice in a tile is
computed once); opfuse chooses what to tile and which producers join (:func:`plan`):

* the root: the op producing the kernel's last result;
* tiled dimensions: the root's parallel dimensions except the innermost one of its
  result (which stays whole: the contiguous, vectorized loop), outer ones by 1, the last
  one by as many rows as make :data:`TILE_ELEMENTS` elements (matmul kernels: rows by
  :data:`MATMUL_ROWS`, a multiple of the micro-kernel's rows);
* a producer joins the loop only if every use of it is in the loop and its slice moves
  with the loop: a producer read whole by every tile (the right-hand side of a matmul, a
  transposed weight) would be recomputed once per tile, so it stays before the loop;
  producers whose result the kernel also returns stay outside too (fusing would compute
  them twice).
* a scatter-add (an embedding's gradient) is neither the root nor a producer in the loop:
  its rows are picked by the data, so a tile of rows would visit every update; it runs
  after the loop (``scatter.py`` lowers it).

Each kernel is tiled in a scratch module, so a kernel upstream cannot tile keeps its
untiled form (correct, one loop nest per op) instead of failing the compile.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from ...analysis import scatter
from ...errors import OpfuseError
from .kernels import kernel_functions
from .pipeline import apply_transform_script

#: Elements of the root's result per tile of a loop or row kernel (64 KiB of f32: a tile
#: and its intermediates stay in the L2 cache).
TILE_ELEMENTS = 16384

#: Rows per tile of a kernel whose root is a matmul or a matmul's epilogue.
MATMUL_ROWS = 96

#: Kernels with fewer result elements than this are not tiled (nothing to gain).
MIN_ELEMENTS = 4096

_ROOT = "opfuse.cpu.tile_root"
_PRODUCER = "opfuse.cpu.tile_producer"

_CONTRACTIONS = {
    # named op -> indexing maps (dims as ints) when it carries no indexing_maps attribute
    "linalg.matmul": ((0, 2), (2, 1), (0, 1)),
    "linalg.batch_matmul": ((0, 1, 3), (0, 3, 2), (0, 1, 2)),
}


@dataclass(frozen=True)
class Plan:
    """How one kernel is tiled: its root, tile sizes per root loop, producers to fuse
    (consumers first)."""

    root: ir.Operation
    tile_sizes: tuple[int, ...]
    producers: tuple[ir.Operation, ...]


def tile_kernels(module: ir.Module) -> int:
    """Tile every ``fusion_*`` kernel of ``module`` that :func:`plan` finds worth it, in
    place; returns how many were tiled."""
    tiled = 0
    for func in kernel_functions(module):
        p = plan(func)
        if p is not None and _apply(module, func, p):
            tiled += 1
    return tiled


def structured_maps(op: ir.Operation) -> list[list[int | None]] | None:
    """Per operand (inputs, then outputs), the loop dimension each tensor dimension is
    indexed by (None for anything but a plain dimension); None if not a structured op."""
    if "indexing_maps" in op.attributes:
        out = []
        for attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
            amap = ir.AffineMapAttr(attr).value
            out.append([e.position if isinstance(e, ir.AffineDimExpr) else None
                        for e in amap.results])
        return out
    maps = _CONTRACTIONS.get(op.name)
    return [list(m) for m in maps] if maps is not None else None


def iterator_types(op: ir.Operation, nloops: int) -> list[str]:
    if "iterator_types" in op.attributes:
        return [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    reductions = {"linalg.matmul": {2}, "linalg.batch_matmul": {3}}[op.name]
    return ["reduction" if d in reductions else "parallel" for d in range(nloops)]


def loop_sizes(op: ir.Operation, maps: list[list[int | None]]) -> list[int] | None:
    n = 1 + max((d for m in maps for d in m if d is not None), default=-1)
    sizes: list[int | None] = [None] * n
    for operand, m in zip(op.operands, maps):
        t = operand.type
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            return None
        for d, size in zip(m, t.shape):
            if d is not None:
                sizes[d] = size
    return None if any(s is None for s in sizes) else [int(s) for s in sizes]


def plan(func: ir.Operation) -> Plan | None:
    """The tiling of one kernel function, or None when it is not worth tiling or has no
    tileable root."""
    block = func.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    ret = ops[-1]
    returned = [v for v in ret.operands]
    root = None
    for v in reversed(returned):
        owner = v.owner
        if (not isinstance(owner, ir.Block) and owner.name.startswith("linalg.")
                and structured_maps(owner) and not _is_scatter(owner.operation)):
            root = owner.operation
            break
    if root is None:
        return None
    maps = structured_maps(root)
    sizes = loop_sizes(root, maps)
    if sizes is None or len(root.results) == 0:
        return None
    n_in = len(root.operands) - len(root.results)
    out_map = maps[n_in]
    iterators = iterator_types(root, len(sizes))
    elements = 1
    for d in out_map:
        elements *= sizes[d] if d is not None else 1
    if elements < MIN_ELEMENTS:
        return None
    inner = out_map[-1] if out_map and len(out_map) > 1 else None
    candidates = [d for d, it in enumerate(iterators) if it == "parallel" and d != inner
                  and sizes[d] > 1 and d in out_map]
    if not candidates:
        return None
    tiles = [0] * len(sizes)
    for d in candidates:
        tiles[d] = 1
    last = candidates[-1]
    row = 1
    for d in out_map:
        if d is not None and d not in candidates:
            row *= sizes[d]
    is_matmul = root.name in _CONTRACTIONS or _reads_a_contraction(root)
    rows = MATMUL_ROWS if is_matmul else max(1, TILE_ELEMENTS // max(1, row))
    tiles[last] = min(sizes[last], rows)
    tiled_dims = {root: {d for d in candidates}}
    producers = _fusable_producers(ops, root, tiled_dims, set(returned))
    return Plan(root, tuple(tiles), tuple(producers))


def _is_scatter(op: ir.Operation) -> bool:
    """A scatter-add (``analysis.scatter``): never tiled, never in a tile loop (its rows
    are picked by the data: a tile of rows would visit every update); it runs after the
    loop, on what the loop computed (``scatter.py`` lowers it)."""
    return op.name == "linalg.generic" and scatter.recognize(op) is not None


def _reads_a_contraction(op: ir.Operation) -> bool:
    """An epilogue: some operand is (through elementwise ops) the result of a matmul."""
    seen = set()
    work = [v for v in op.operands]
    while work:
        v = work.pop()
        owner = v.owner
        if isinstance(owner, ir.Block) or owner.operation in seen:
            continue
        seen.add(owner.operation)
        if owner.name in _CONTRACTIONS:
            return True
        if owner.name == "linalg.generic":
            work += list(owner.operands)
    return False


def _fusable_producers(ops: list[ir.Operation], root: ir.Operation,
                       tiled: dict, returned: set) -> list[ir.Operation]:
    """Producers joining the tile loop, consumers first (see the module docstring)."""
    chosen: list[ir.Operation] = []
    in_loop = {root}
    for op in reversed(ops):
        if op == root or not op.name.startswith("linalg.") or len(op.results) == 0 \
                or _is_scatter(op):
            continue
        maps = structured_maps(op)
        if maps is None:
            continue
        users = []
        for r in op.results:
            if r in returned:
                users = None
                break
            for use in r.uses:
                users.append((use.owner.operation, use.operand_number, r.result_number))
        if not users or any(u not in in_loop for u, _, _ in users):
            continue
        moving: set[int] | None = None
        n_in_op = len(op.operands) - len(op.results)
        consistent = True
        for user, operand_number, result_number in users:
            umaps = structured_maps(user)
            dims = tiled[user]
            operand_dims = umaps[operand_number]
            tiled_result_dims = {i for i, d in enumerate(operand_dims) if d in dims}
            # producer loops indexing those result dims
            out_map = maps[n_in_op + result_number]
            mine = {out_map[i] for i in tiled_result_dims if i < len(out_map) and out_map[i] is not None}
            if moving is None:
                moving = mine
            elif moving != mine:
                consistent = False
        if not consistent or not moving:
            continue
        tiled[op] = moving
        in_loop.add(op)
        chosen.append(op)
    return chosen


def _apply(module: ir.Module, func: ir.Operation, p: Plan) -> bool:
    """Tile ``func`` by ``p`` in a scratch copy; on success the copy replaces ``func``."""
    ctx = module.context
    i64 = ir.IntegerType.get_signless(64, ctx)
    p.root.attributes[_ROOT] = ir.UnitAttr.get(ctx)
    for i, op in enumerate(p.producers):
        op.attributes[_PRODUCER] = ir.IntegerAttr.get(i64, i)
    with ctx, func.location:
        scratch = ir.Module.create()
        func.clone(ip=ir.InsertionPoint(scratch.body))
    _unmark(func)
    try:
        apply_transform_script(scratch, _script(p))
    except OpfuseError:
        return False  # not tileable by upstream: the kernel keeps its loop nests
    _unmark(scratch.operation)
    tiled = next(iter(scratch.body.operations)).operation
    tiled.move_before(func)
    func.erase()
    return True


def _unmark(op: ir.Operation) -> None:
    def visit(o: ir.Operation) -> ir.WalkResult:
        for mark in (_ROOT, _PRODUCER):
            if mark in o.attributes:
                del o.attributes[mark]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def _script(p: Plan) -> str:
    any_op = "!transform.any_op"
    lines = [
        f'%root = transform.structured.match attributes{{"{_ROOT}"}} in %arg0 : ({any_op}) -> {any_op}',
        f"%tiled, %loop0 = transform.structured.tile_using_forall %root tile_sizes "
        f"[{', '.join(map(str, p.tile_sizes))}] : ({any_op}) -> ({any_op}, {any_op})",
        f'%func = transform.structured.match ops{{["func.func"]}} in %arg0 : ({any_op}) -> {any_op}',
    ]
    loop = "%loop0"
    for i in range(len(p.producers)):
        lines += [
            f'%p{i} = transform.structured.match attributes{{"{_PRODUCER}" = {i} : i64}} in %arg0 '
            f": ({any_op}) -> {any_op}",
            # CSE first: two uses of one producer in the tile are one slice, fused once
            f"transform.apply_cse to %func : {any_op}",
            f"%f{i}, %loop{i + 1} = transform.structured.fuse_into_containing_op %p{i} into {loop} "
            f": ({any_op}, {any_op}) -> ({any_op}, {any_op})",
        ]
        loop = f"%loop{i + 1}"
    lines.append(f"transform.apply_cse to %func : {any_op}")
    body = "\n    ".join(lines)
    return (
        "module attributes {transform.with_named_sequence} {\n"
        f"  transform.named_sequence @__transform_main(%arg0: {any_op} {{transform.readonly}}) {{\n"
        f"    {body}\n    transform.yield\n  }}\n}}\n"
    )
