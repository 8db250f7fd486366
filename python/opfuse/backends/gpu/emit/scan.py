"""Scan kernels ("scan" groups: ``cumsum`` and the elementwise ops around it).

The group's one scan (``analysis.scan``: an inclusive running sum along ``axis``) is
computed by rows: a row is every element along the axis at one index of the other dims.
A team of ``T`` threads (a multiple of the warp, up to 256) owns a row and walks it in
tiles of ``T x I`` elements (``I`` consecutive elements per thread: 4 for rows of 128 or
more, else 1). Per tile, each thread

1. evaluates its ``I`` elements (the group's elementwise producers are inlined: each
   input element is read once) and scans them sequentially in registers;
2. scans the thread totals across its warp: five ``gpu.shuffle up`` steps (a lane adds
   the value of the lane ``2^k`` below it, lanes below ``2^k`` keep theirs);
3. for teams of several warps, the last lane of each warp publishes the warp's total in
   shared memory; after one barrier every thread adds the totals of the warps before its
   own (and all of them, for the tile's total: every thread folds them in the same order,
   so they agree bit for bit); a second barrier lets the next tile reuse the slots;
4. adds the running total of the earlier tiles (an ``scf.for`` carry), writes each
   element's sum (and the group's consumers of it, evaluated from the registers) once.

So the work is ``O(n)`` per row, not the ``O(n²)`` of the triangular reduction the IR
spells. Short rows (at most 32 x I elements) take a warp each, ``256 / T`` rows per
block; tails clamp addresses (loads stay in bounds), add 0 and mask stores; rows past the
last one are clamped too, so every barrier is reached by the whole block.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, gpu, memref

from ....analysis.scan import Scan, recognize
from ..build.evaluate import Evaluator, Val, generic_domain, iterators_of
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, Shared, delinearize, numel
from .rows import _next_pow2, team_row

WARP = 32
#: Threads a row team may have (and threads per block for short rows).
MAX_TEAM = 256
#: Elements per thread and tile for rows of at least ``LONG_ROW`` elements.
ITEMS = 4
LONG_ROW = 128


def emit_scan(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    scans: list[Scan] = []
    for op in group.ops():
        if op.name == "linalg.generic" and "reduction" in iterators_of(op):
            s = recognize(op)
            require(s is not None, "a reduction beside the scan")
            scans.append(s)
    require(len(scans) == 1, "not exactly one scan")
    scan = scans[0]
    dom = tuple(generic_domain(scan.op)[:-1])
    for o in group.outputs:
        require(o.shape == dom, f"an output of shape {o.shape} in a scan over {dom}")
    axis, n = scan.axis, dom[scan.axis]
    rows_shape = dom[:axis] + dom[axis + 1:]
    n_rows = numel(rows_shape)
    require(n > 0 and n_rows > 0, "empty rows")
    acc_type = ir.ShapedType(scan.op.results[0].type).element_type
    require(
        isinstance(acc_type, (ir.F32Type, ir.F64Type))
        or (isinstance(acc_type, ir.IntegerType) and acc_type.width in (32, 64)),
        f"a scan in {acc_type} (f32, f64, i32, i64 only)",
    )

    items = ITEMS if n >= LONG_ROW else 1
    team = min(MAX_TEAM, max(WARP, _next_pow2(-(-n // items))))
    tile = team * items
    tiles = -(-n // tile)
    rows_per_block = max(1, MAX_TEAM // team)
    warps = team // WARP
    grid = (-(-n_rows // rows_per_block), 1, 1)
    require(grid[0] <= 2**31 - 1, "too many rows")
    shared = [Shared(rows_per_block * warps, str(acc_type))] if warps > 1 else []
    kb = KernelBuilder(module, name, group.params, grid, (team, rows_per_block, 1), shared)
    kb.meta = {"team": team, "items": items, "tiles": tiles, "rows_per_block": rows_per_block}
    ev = Evaluator(kb, group.func, group.leaves(kb.params))
    tx, ty, row, row_ok = team_row(kb, rows_per_block, n_rows)
    row_idx = delinearize(row, rows_shape) if rows_shape else []
    lane = kb.apply(ir.AffineExpr.get_mod(tx, WARP))
    warp_expr = ir.AffineExpr.get_floor_div(tx, WARP)
    warp = kb.apply(warp_expr)
    ctx = kb.ctx
    zero = kb.const(acc_type, 0.0 if isinstance(acc_type, ir.FloatType) else 0)
    slots = kb.shared[0] if shared else None
    slot_base = ty * warps  # this row's warp totals: slots ty * warps ...
    dummy = [Val(a, True) for a in list(scan.op.regions[0].blocks[0].arguments)[1:]]
    x_pos = 1 - list(scan.combine.operands).index(scan.op.regions[0].blocks[0].arguments[1])

    def add(a: ir.Value, b: ir.Value) -> ir.Value:
        return kb.create(scan.combine.name, [acc_type], [a, b]).results[0]

    def index_of(col: ir.AffineExpr) -> list[ir.AffineExpr]:
        return list(row_idx[:axis]) + [col] + list(row_idx[axis:])

    def one_tile(base: ir.AffineExpr, carry: ir.Value | None) -> ir.Value | None:
        # 1. the thread's elements, scanned in registers
        cols, running = [], []
        for i in range(items):
            col = kb.apply(base + tx * items + i)
            ok = None
            if tiles * tile > n:  # a tail somewhere: clamp the address, add 0
                ok = kb.cmp_lt(col, kb.index(n))
                col = kb.min_index(col, kb.index(n - 1))
            c = kb.add_dim(col)
            idx = index_of(c)
            x = ev.payload(scan.op, idx + [c], dummy, upto=scan.combine)[x_pos].ssa
            if ok is not None:
                with kb.emitting():
                    x = arith.select(ok, x, zero)
            running.append(x if not running else add(running[-1], x))
            cols.append((idx, ok))
        total = running[-1]
        # 2. inclusive scan of the thread totals across the warp
        incl = total
        off = 1
        while off < WARP:
            other = _shuffle(kb, incl, off, gpu.ShuffleMode.UP)
            with kb.emitting():
                up = arith.cmpi(arith.CmpIPredicate.uge, lane, kb.index(off))
            incl = _select(kb, up, add(incl, other), incl)
            off *= 2
        excl = _shuffle(kb, incl, 1, gpu.ShuffleMode.UP)  # the lanes below this one
        with kb.emitting():
            first_lane = arith.cmpi(arith.CmpIPredicate.eq, lane, kb.index(0))
        excl = _select(kb, first_lane, zero, excl)
        # 3. the warps before this one, and the tile's total
        if warps > 1:
            with kb.emitting():
                last_lane = arith.cmpi(arith.CmpIPredicate.eq, lane, kb.index(WARP - 1))
            with kb.if_(last_lane):
                with kb.emitting():
                    memref.store(incl, slots, [kb.apply(slot_base + warp_expr)])
            with kb.emitting():
                gpu.barrier()
            before, tile_total = zero, None
            for w in range(warps):
                with kb.emitting():
                    v = memref.load(slots, [kb.apply(slot_base + w)])
                    earlier = arith.cmpi(arith.CmpIPredicate.ult, kb.index(w), warp)
                if w < warps - 1:
                    before = _select(kb, earlier, v if w == 0 else add(before, v), before)
                tile_total = v if tile_total is None else add(tile_total, v)
            with kb.emitting():
                gpu.barrier()
            prefix = add(before, excl)
        else:
            prefix = excl
            tile_total = _shuffle(kb, incl, WARP - 1, gpu.ShuffleMode.IDX)
        if carry is not None:
            prefix = add(carry, prefix)
        # 4. each element's sum; the outputs evaluated from it
        for (idx, ok), r in zip(cols, running):
            ev.preset(scan.op.results[0], idx, Val(add(prefix, r), True))
            pred = kb.and_(ok, row_ok)
            for o in group.outputs:
                leaf = group.output_leaf(o, group.result_param(kb.params, o.index))
                if pred is None:
                    ev.store(leaf, tuple(idx), ev.value(o.value, idx))
                else:
                    with kb.if_(pred):
                        ev.store(leaf, tuple(idx), ev.value(o.value, idx))
        if tiles == 1:
            return None
        return tile_total if carry is None else add(carry, tile_total)

    if tiles == 1:
        one_tile(ir.AffineConstantExpr.get(0, ctx), None)
    else:

        def body(iv, carried):
            return [one_tile(kb.add_dim(iv), carried[0])]

        kb.for_(kb.index(0), kb.index(tiles * tile), kb.index(tile), [zero], body)
    kb.vector_lanes = 1
    return kb


def _select(kb: KernelBuilder, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    with kb.emitting():
        return arith.select(cond, a, b)


def _shuffle(kb: KernelBuilder, v: ir.Value, offset: int, mode) -> ir.Value:
    """``gpu.shuffle`` of a 32- or 64-bit value (a 64-bit one as two 32-bit halves)."""
    i32 = ir.IntegerType.get_signless(32, kb.ctx)
    off, width = kb.const(i32, offset), kb.const(i32, WARP)
    if not (isinstance(v.type, (ir.F64Type, ir.IntegerType)) and _bits(v.type) == 64):
        with kb.emitting():
            return gpu.shuffle(v, off, width, mode)[0]
    i64 = ir.IntegerType.get_signless(64, kb.ctx)
    with kb.emitting():
        bits = v if isinstance(v.type, ir.IntegerType) else arith.bitcast(i64, v)
        lo = arith.trunci(i32, bits)
        hi = arith.trunci(i32, arith.shrui(bits, kb.const(i64, 32)))
        lo = gpu.shuffle(lo, off, width, mode)[0]
        hi = gpu.shuffle(hi, off, width, mode)[0]
        out = arith.ori(arith.extui(i64, lo), arith.shli(arith.extui(i64, hi), kb.const(i64, 32)))
        return out if isinstance(v.type, ir.IntegerType) else arith.bitcast(v.type, out)


def _bits(t: ir.Type) -> int:
    return 64 if isinstance(t, ir.F64Type) else ir.IntegerType(t).width


__all__ = ["emit_scan"]
