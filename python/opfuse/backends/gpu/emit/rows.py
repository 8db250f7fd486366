"""Row-reduction kernels ("input" groups: softmax, layernorm, rmsnorm, x - mean(x)).

Every reduction of the group reduces the trailing dims of one domain ``rows x cols``; the
kernel gives each row to a team of ``T`` threads. A thread holds its share of the row in
registers: chunk ``c`` is the ``V``-vector at column ``(c * T + t) * V``, all chunks
unrolled, so each input element is loaded once and every later use (the second pass of
softmax, the centred values of layernorm) reads registers. The reductions run in order
(a later one may use an earlier one: variance after mean): per thread over its chunks,
across the team with ``gpu.shuffle xor`` butterflies and, for teams larger than a warp,
one shared-memory exchange between warps (one barrier). The group's elementwise producers
are inlined into the chunk values and its consumers are evaluated from the registers;
each output element is written once.

Launch shape: ``T <= 32`` (warp per row, or less for short rows): blocks of ``T x R``
threads, ``R = 256 / T`` rows per block; otherwise block per row with ``T`` threads
(64..1024) so that a thread holds at most four vectors. Rows longer than eight vectors per
thread of a 1024-thread team are streamed: each pass is a loop over the thread's chunks
that reads them again (correct at any length; the row is read once per pass). Tails (a row
length that is not a multiple of ``T * V``, a row count that is not a multiple of ``R``)
clamp addresses so every load stays in bounds and mask what is reduced and stored;
synchronization never sits under divergent control flow.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, gpu, memref

from ..build.evaluate import Evaluator, Val, generic_domain, iterators_of, maps_of, n_inputs
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, Shared, delinearize, numel, vector_width
from ....analysis.scatter import reads_in_update_order, token_and_width_loops
from ....analysis.scatter import recognize as recognize_scatter
from .column_sums import accumulate, column_sum, is_column_sum
from .scatter import scatter_rows

#: Vectors per thread a row team aims for (registers hold them all).
CHUNKS_PER_THREAD = 4
#: Longest row per thread held in registers (chunks); longer rows are streamed.
MAX_CHUNKS = 8
WARP = 32
BLOCK_THREADS = 256

# combining op -> (vector.reduction kind, identity for float, identity for int)
_COMBINERS = {
    "arith.addf": ("add", 0.0),
    "arith.mulf": ("mul", 1.0),
    "arith.maximumf": ("maximumf", float("-inf")),
    "arith.minimumf": ("minimumf", float("inf")),
    "arith.maxnumf": ("maxnumf", float("-inf")),
    "arith.minnumf": ("minnumf", float("inf")),
    "arith.addi": ("add", 0),
    "arith.muli": ("mul", 1),
    "arith.ori": ("or", 0),
    "arith.xori": ("xor", 0),
    "arith.andi": ("and", -1),
}


@dataclass
class Reduction:
    op: ir.Operation
    combine: ir.Operation  # the payload op folding an element into the accumulator
    x_operand: int  # which operand of ``combine`` is the element (the other is the acc)
    kind: str
    identity: float | int
    result: int = 0  # the result computed (the others have no uses)

    @property
    def value(self) -> ir.Value:
        return self.op.results[self.result]


def _reduction(op: ir.Operation, n_rows: int) -> Reduction:
    # torch-mlir's max (softmax, amax) also tracks the argmax in a second result that
    # nothing reads: only the used result is computed
    used = [k for k, res in enumerate(op.results) if list(res.uses)]
    require(len(used) <= 1, "a reduction with several used results")
    r = used[0] if used else 0
    block = op.regions[0].blocks[0]
    out_arg = block.arguments[n_inputs(op) + r]
    ops = [o.operation for o in block.operations]
    yielded = ops[-1].operands[r]
    comb = yielded.owner
    comb = comb.operation if hasattr(comb, "operation") else comb
    require(
        not isinstance(comb, ir.Block) and comb.name in _COMBINERS,
        "a reduction payload that is not a known associative combiner",
    )
    operands = list(comb.operands)
    require(
        len(operands) == 2 and out_arg in operands, "a combiner that does not fold the accumulator"
    )
    x = 1 - operands.index(out_arg)
    require(operands[x] != out_arg, "a combiner of the accumulator with itself")
    accumulators = set(list(block.arguments)[n_inputs(op):])
    require(
        not _reads_any(block, operands[x], accumulators),
        "a payload that reads the accumulator elsewhere",
    )
    out_map = maps_of(op)[n_inputs(op) + r]
    dims = [e.maybe_downcast() for e in out_map.results]
    require(
        all(isinstance(d, ir.AffineDimExpr) and d.position == i for i, d in enumerate(dims))
        and len(dims) == n_rows,
        "a reduction output that is not the row index",
    )
    kind, identity = _COMBINERS[comb.name]
    return Reduction(op, comb, x, kind, identity, r)


def _reads_any(block: ir.Block, v: ir.Value, values: set) -> bool:
    """Whether payload value ``v`` is computed from any of ``values`` (block arguments)."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if x in values:
            return True
        owner = x.owner
        if isinstance(owner, ir.Block) or x in seen:
            continue
        seen.add(x)
        o = owner.operation if hasattr(owner, "operation") else owner
        if o.parent is not None and o.parent.operation == block.owner.operation:
            stack.extend(o.operands)
    return False


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def emit_rows(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    # scatter-adds (an embedding's gradient, opfuse-fuse-column-sums) ride along too:
    # each element added into the row its index picks (scatter.py)
    scatters = {op.results[0]: s for op in group.ops() if op.name == "linalg.generic"
                for s in [recognize_scatter(op)] if s is not None}
    all_reds = [
        op for op in group.ops() if op.name == "linalg.generic" and "reduction" in iterators_of(op)
        and op.results[0] not in scatters
    ]
    # column sums (opfuse-fuse-column-sums) ride along: column_sums.py
    sum_ops = [op for op in all_reds if is_column_sum(op)]
    reds_ops = [op for op in all_reds if not is_column_sum(op)]
    require(bool(reds_ops), "a column reduction without a row reduction (the columns emitter's)"
            if sum_ops else "no reduction")
    shapes = set()
    for op in reds_ops:
        its = iterators_of(op)
        p = its.count("parallel")
        require(
            its == ["parallel"] * p + ["reduction"] * (len(its) - p),
            "a reduction over leading dims (column reduction)",
        )
        dom = generic_domain(op)
        shapes.add((tuple(dom[:p]), tuple(dom[p:])))
    require(len(shapes) == 1, "reductions over different domains")
    rows_shape, cols_shape = shapes.pop()
    reds = [_reduction(op, len(rows_shape)) for op in reds_ops]
    full = rows_shape + cols_shape
    n_rows, n_cols = numel(rows_shape), numel(cols_shape)
    sums = {op.results[0]: column_sum(op, n_rows, cols_shape) for op in sum_ops}
    for v, s in scatters.items():
        dom = generic_domain(s.op)
        t_loops, w_loops = token_and_width_loops(s)
        require(reads_in_update_order(s)
                and numel(tuple(dom[d] for d in t_loops)) == n_rows
                and tuple(dom[d] for d in w_loops) == cols_shape,
                f"a scatter-add whose updates are not the kernel's {n_rows} rows of {list(cols_shape)}")
    for o in group.outputs:
        require(o.value in sums or o.value in scatters or o.shape in (full, rows_shape),
                f"an output of shape {o.shape} in a row kernel")
    require(n_rows > 0 and n_cols > 0, "empty rows")
    elem = (
        ir.ShapedType(reds[0].op.operands[0].type).element_type
        if isinstance(reds[0].op.operands[0].type, ir.ShapedType)
        else ir.F32Type.get(module.context)
    )
    lanes = vector_width(elem, cols_shape[-1])
    for o in group.outputs:
        if o.shape == full:
            lanes = min(lanes, vector_width(o.element_type, cols_shape[-1]))
    n_vec = n_cols // lanes
    if n_vec <= WARP * CHUNKS_PER_THREAD:
        team = min(WARP, _next_pow2(n_vec))
        rows_per_block = max(1, BLOCK_THREADS // team)
        block = (team, rows_per_block, 1)
        grid = (-(-n_rows // rows_per_block), 1, 1)
    else:
        team = min(1024, max(64, _next_pow2(-(-n_vec // CHUNKS_PER_THREAD))))
        rows_per_block = 1
        block = (team, 1, 1)
        grid = (n_rows, 1, 1)
    chunks = -(-n_vec // team)
    stream = chunks > MAX_CHUNKS  # too long to hold: loop over the row once per pass
    require(grid[0] <= 2**31 - 1, "too many rows")
    warps = team // WARP if team > WARP else 1
    shared = [Shared(warps, _shuffle_type_text(r)) for r in reds] if warps > 1 else []
    kb = KernelBuilder(module, name, group.params, grid, block, shared)
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=lanes)

    tx, ty, r, row_ok = team_row(kb, rows_per_block, n_rows)
    row_idx = tuple(delinearize(r, rows_shape))

    row_chunks = _Chunks(kb, ev, tx, team, lanes, n_cols, cols_shape, chunks, stream)

    for k, red in enumerate(reds):
        total = _reduce(kb, ev, red, row_idx, row_chunks, team, k)
        init = ev.value(red.op.operands[n_inputs(red.op) + red.result], row_idx)
        final = _combine_scalar(kb, red, init.ssa, total)
        ev.preset(red.value, row_idx, Val(final, True))

    is_first = None
    for o in group.outputs:
        if o.value in sums:
            accumulate(kb, ev, group, sums[o.value], o, r, row_chunks, row_ok)
            continue
        if o.value in scatters:
            scatter_rows(kb, ev, group, scatters[o.value], o, r, row_chunks, row_ok)
            continue
        leaf = group.output_leaf(o, group.result_param(kb.params, o.index))
        if o.shape == full:

            def store(idx, ok, accs, o=o, leaf=leaf):
                val = ev.value(o.value, row_idx + idx)
                pred = kb.and_(ok, row_ok)
                if pred is None:
                    ev.store(leaf, row_idx + idx, val)
                else:
                    with kb.if_(pred):
                        ev.store(leaf, row_idx + idx, val)
                return []

            row_chunks.fold([], store)
        else:
            val = ev.value(o.value, row_idx)
            if is_first is None:
                is_first = kb.cmp_lt(kb.thread_id[0], kb.index(1))
            with kb.if_(kb.and_(is_first, row_ok)):
                ev.store(leaf, row_idx, val)
    kb.vector_lanes = lanes
    if sums or scatters:
        kb.meta["zeroed"] = sorted(o.index for o in group.outputs
                                   if o.value in sums or o.value in scatters)
        kb.meta["atomics"] = n_rows * n_cols * (len(sums) + len(scatters))
    return kb



def team_row(kb: KernelBuilder, rows_per_block: int, n_rows: int):
    """The row a team of threads owns, for a block of ``rows_per_block`` teams (threadIdx.y)
    of threadIdx.x lanes: ``(tx, ty, row, row_ok)`` as kernel dims. In a last block past
    the end the row is clamped to the last one and ``row_ok`` says it is not real (None
    when every block is full), so loads stay in bounds and stores are masked."""
    bx = kb.add_dim(kb.block_id[0])
    tx = kb.add_dim(kb.thread_id[0])
    ty = kb.add_dim(kb.thread_id[1])
    row = kb.apply(bx * rows_per_block + ty) if rows_per_block > 1 else kb.block_id[0]
    row_ok = None
    if n_rows % rows_per_block:
        row_ok = kb.cmp_lt(row, kb.index(n_rows))
        row = kb.min_index(row, kb.index(n_rows - 1))
    return tx, ty, kb.add_dim(row), row_ok

class _Chunks:
    """A thread's share of its row: chunk ``c`` is the ``V``-vector at column
    ``(c * team + t) * V``. Unrolled, every chunk is straight-line code (values stay in
    registers across passes); streamed (rows too long to hold), each pass is an
    ``scf.for`` over the chunks and re-reads them."""

    def __init__(self, kb, ev, tx, team, lanes, n_cols, cols_shape, count, stream):
        self.kb, self.ev, self.tx, self.team, self.lanes = kb, ev, tx, team, lanes
        self.n_cols, self.cols_shape, self.count, self.stream = n_cols, cols_shape, count, stream
        self.unrolled = [] if stream else [self._chunk(c) for c in range(count)]

    def _chunk(self, c):
        kb = self.kb
        col = kb.apply((self.tx + c * self.team) * self.lanes)
        ok = None
        tail = self.count * self.team * self.lanes > self.n_cols
        if tail and (self.stream or (c + 1) * self.team * self.lanes > self.n_cols):
            ok = kb.cmp_lt(col, kb.index(self.n_cols))
            col = kb.min_index(col, kb.index(self.n_cols - self.lanes))
        d = kb.add_dim(col)
        self.ev.vdim = self.ev.vdim | {d.position}
        return tuple(delinearize(d, self.cols_shape)), ok, d.position

    def fold(self, init: list, step) -> list:
        """``step(idx, ok, accs) -> accs`` over every chunk; returns the final ``accs``.
        ``ok`` is None for chunks that are in the row for every thread."""
        if not self.stream:
            accs = init
            for idx, ok, _ in self.unrolled:
                accs = step(idx, ok, accs)
            return accs
        kb = self.kb

        def body(iv, accs):
            c = kb.add_dim(iv)
            idx, ok, pos = self._chunk(c)
            out = step(idx, ok, accs)
            self.ev.vdim = self.ev.vdim - {pos}  # the dim dies with the loop body
            return out

        return kb.for_(kb.index(0), kb.index(self.count), kb.index(1), init, body)


def _shuffle_type_text(red: Reduction) -> str:
    t = red.value.type
    et = ir.ShapedType(t).element_type
    return str(_shuffle_type(et))


def _shuffle_type(et: ir.Type) -> ir.Type:
    if isinstance(et, (ir.F16Type, ir.BF16Type)):
        return ir.F32Type.get(et.context)
    if isinstance(et, ir.IntegerType) and et.width < 32:
        return ir.IntegerType.get_signless(32, et.context)
    return et


def _comb(kb: KernelBuilder, red: Reduction, a: ir.Value, b: ir.Value) -> ir.Value:
    attrs = {
        red.combine.attributes[i].name: red.combine.attributes[i].attr
        for i in range(len(red.combine.attributes))
    }
    return kb.create(red.combine.name, [a.type], [a, b], attrs).results[0]


def _identity(kb: KernelBuilder, red: Reduction, t: ir.Type) -> ir.Value:
    return kb.const(t, red.identity)


def _reduce(
    kb: KernelBuilder,
    ev: Evaluator,
    red: Reduction,
    row_idx,
    chunks: _Chunks,
    team: int,
    slot: int,
) -> ir.Value:
    """The row's reduction, combined across the team; every thread gets it."""
    op = red.op
    # the accumulators are not read before the combiner (checked by _reduction)
    dummy = [Val(a, True) for a in list(op.regions[0].blocks[0].arguments)[n_inputs(op):]]

    def step(idx, ok, accs):
        operands = ev.payload(op, row_idx + idx, dummy, upto=red.combine)
        xv = ev.as_vector(operands[red.x_operand])
        if ok is not None:
            ident = _identity(kb, red, xv.type)
            with kb.emitting():
                xv = arith.select(ok, xv, ident)
        return [xv if accs[0] is None else _comb(kb, red, accs[0], xv)]

    if chunks.stream:
        et0 = ir.ShapedType(red.value.type).element_type
        loc = ir.Location.unknown(kb.ctx)
        t = ir.VectorType.get([chunks.lanes], et0, loc=loc) if chunks.lanes > 1 else et0
        (acc,) = chunks.fold([_identity(kb, red, t)], step)
    else:
        (acc,) = chunks.fold([None], step)
    et = ir.VectorType(acc.type).element_type if isinstance(acc.type, ir.VectorType) else acc.type
    if isinstance(acc.type, ir.VectorType):
        with kb.emitting():
            kind = ir.Attribute.parse(f"#vector.kind<{red.kind}>", kb.ctx)
            s = ir.Operation.create(
                "vector.reduction", results=[et], operands=[acc], attributes={"kind": kind}
            ).results[0]
    else:
        s = acc
    st = _shuffle_type(et)
    if st != et:
        with kb.emitting():
            s = arith.extf(st, s) if isinstance(st, ir.F32Type) else arith.extsi(st, s)
    s = _butterfly(kb, red, s, min(team, WARP))
    if team > WARP:
        s = _across_warps(kb, red, s, team // WARP, kb.shared[slot])
    if st != et:
        with kb.emitting():
            s = arith.truncf(et, s) if isinstance(et, ir.FloatType) else arith.trunci(et, s)
    return s


def _butterfly(kb: KernelBuilder, red: Reduction, s: ir.Value, width: int) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32, kb.ctx)
    off = width // 2
    while off >= 1:
        with kb.emitting():
            other = gpu.shuffle(s, kb.const(i32, off), kb.const(i32, WARP), gpu.ShuffleMode.XOR)[0]
        s = _comb(kb, red, s, other)
        off //= 2
    return s


def _across_warps(
    kb: KernelBuilder, red: Reduction, s: ir.Value, warps: int, smem: ir.Value
) -> ir.Value:
    """Lane 0 of each warp publishes its warp's value; after one barrier every thread
    folds the ``warps`` values in the same order (so all agree bit for bit)."""
    tx = kb.thread_id[0]
    d = kb.add_dim(tx)
    warp = kb.apply(ir.AffineExpr.get_floor_div(d, WARP))
    lane = kb.apply(ir.AffineExpr.get_mod(d, WARP))
    with kb.emitting():
        is_lane0 = arith.cmpi(arith.CmpIPredicate.eq, lane, kb.index(0))
    with kb.if_(is_lane0):
        memref.store(s, smem, [warp])
    with kb.emitting():
        gpu.barrier()
    total = None
    for w in range(warps):
        with kb.emitting():
            v = memref.load(smem, [kb.index(w)])
        total = v if total is None else _comb(kb, red, total, v)
    return total


def _combine_scalar(kb: KernelBuilder, red: Reduction, init: ir.Value, total: ir.Value) -> ir.Value:
    return _comb(kb, red, init, total) if init is not None else total


__all__ = ["emit_rows"]
