"""Matmul kernels ("output" groups): a SIMT tiled contraction with the epilogue in registers.

The group's contraction (``linalg.matmul`` / ``batch_matmul`` generalized, or any generic
whose payload is ``acc + a * b`` with one M, one N, one K loop and any batch loops) gets a
``16 x 16`` thread block; each thread accumulates a ``4 x V`` tile of C in registers
(``V = 4`` columns as one vector when N allows it), so a block covers ``64 x 16V`` of C and
``grid.z`` runs over the batch. The K loop reads A and B through the evaluator: producers
fused into the group (transposes, head splits, reshapes, elementwise prologues) become
address arithmetic or register math on the fly. After the loop the accumulators are the
contraction's values at the thread's points, and every output of the group (bias, GELU,
residual: the epilogue) is evaluated from them and stored once.

Partial tiles clamp the rows and columns a thread reads (all loads stay in bounds) and
mask its stores. No shared-memory staging yet: operands are re-read through L1/L2.
"""

from __future__ import annotations

from mlir import ir

from .evaluate import Evaluator, Val, generic_domain, iterators_of, maps_of, n_inputs
from .group import Group, require
from .kernel import KernelBuilder, delinearize, numel, shape_of

THREADS = (16, 16)
TILE_M = 4
TILE_N = 4
K_UNROLL = 4


def _contraction(group: Group) -> ir.Operation:
    reds = [
        op for op in group.ops() if op.name == "linalg.generic" and "reduction" in iterators_of(op)
    ]
    require(len(reds) == 1, "not exactly one contraction")
    op = reds[0]
    require(n_inputs(op) == 2 and len(op.results) == 1, "a contraction that is not A x B -> C")
    block = op.regions[0].blocks[0]
    out_arg = block.arguments[2]
    yielded = [o.operation for o in block.operations][-1].operands[0]
    add = yielded.owner
    add = add.operation if hasattr(add, "operation") else add
    require(
        not isinstance(add, ir.Block)
        and add.name in ("arith.addf", "arith.addi")
        and out_arg in list(add.operands),
        "a contraction payload that is not acc + a*b",
    )
    return op


def emit_matmul(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    op = _contraction(group)
    its = iterators_of(op)
    maps = maps_of(op)
    uses = []
    for m in maps:
        dims = [r.maybe_downcast() for r in m.results]
        require(all(isinstance(d, ir.AffineDimExpr) for d in dims), "non-projected indexing")
        uses.append({d.position for d in dims})
    a_dims, b_dims, c_dims = uses
    batch, m_dims, n_dims, k_dims = [], [], [], []
    for loop, it in enumerate(its):
        where = (loop in a_dims, loop in b_dims, loop in c_dims)
        if where == (True, True, True) and it == "parallel":
            batch.append(loop)
        elif where == (True, False, True) and it == "parallel":
            m_dims.append(loop)
        elif where == (False, True, True) and it == "parallel":
            n_dims.append(loop)
        elif where == (True, True, False) and it == "reduction":
            k_dims.append(loop)
        else:
            require(False, "a contraction loop of unknown role")
    require(
        len(m_dims) == 1 and len(n_dims) == 1 and len(k_dims) == 1,
        "a contraction without exactly one M, N and K loop",
    )
    dom = generic_domain(op)
    M, N, K = dom[m_dims[0]], dom[n_dims[0]], dom[k_dims[0]]
    c_shape = shape_of(op.results[0].type)
    for o in group.outputs:
        require(o.shape == c_shape, f"an output of shape {o.shape}, the contraction is {c_shape}")
    lanes = TILE_N if N % TILE_N == 0 else 1
    tn = lanes
    bm, bn = THREADS[1] * TILE_M, THREADS[0] * tn
    n_batch = numel([dom[b] for b in batch])
    grid = (-(-N // bn), -(-M // bm), n_batch)
    require(grid[2] <= 65535 and grid[1] <= 65535, "too many tiles")
    kb = KernelBuilder(module, name, group.params, grid, (THREADS[0], THREADS[1], 1))
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=lanes)

    bx, by, bz = (kb.add_dim(v) for v in kb.block_id)
    tx, ty = kb.add_dim(kb.thread_id[0]), kb.add_dim(kb.thread_id[1])
    # columns: one vector of `tn` per thread, clamped so partial tiles read in bounds
    col = kb.apply(bx * bn + tx * tn)
    col_ok = None
    if N % bn:
        col_ok = kb.cmp_lt(col, kb.index(N))
        col = kb.min_index(col, kb.index(N - tn))
    n_expr = kb.add_dim(col)
    if lanes > 1:
        ev.vdim = frozenset([n_expr.position])
    rows, row_ok = [], []
    for i in range(TILE_M):
        r = kb.apply(by * bm + ty * TILE_M + i)
        ok = None
        if M % bm:
            ok = kb.cmp_lt(r, kb.index(M))
            r = kb.min_index(r, kb.index(M - 1))
        rows.append(kb.add_dim(r))
        row_ok.append(ok)
    batch_exprs = delinearize(bz, [dom[b] for b in batch]) if batch else []

    def point(i: int, k_expr) -> list:
        p: list = [None] * len(its)
        for b, e in zip(batch, batch_exprs):
            p[b] = e
        p[m_dims[0]] = rows[i]
        p[n_dims[0]] = n_expr
        p[k_dims[0]] = k_expr
        return p

    c_map = maps[2]
    zero = ir.AffineConstantExpr.get(0, kb.ctx)
    c_points = []
    for i in range(TILE_M):
        p = point(i, zero)
        c_points.append(tuple(p[r.maybe_downcast().position] for r in c_map.results))
    inits = [ev.value(op.operands[2], c_points[i]) for i in range(TILE_M)]
    init_ssa = [ev.as_vector(v) for v in inits]
    unroll = K_UNROLL if K % K_UNROLL == 0 else 1

    def body(iv, accs):
        k = kb.add_dim(iv)
        accs = [Val(a, lanes == 1) for a in accs]
        ev.contract = True
        for kk in range(unroll):
            for i in range(TILE_M):
                res = ev.payload(op, point(i, k + kk if kk else k), [accs[i]])[0]
                accs[i] = Val(ev.as_vector(res), lanes == 1)
        ev.contract = False
        return [a.ssa for a in accs]

    finals = kb.for_(kb.index(0), kb.index(K), kb.index(unroll), init_ssa, body)
    for i in range(TILE_M):
        ev.preset(op.results[0], c_points[i], Val(finals[i], lanes == 1))
    for o in group.outputs:
        leaf = group.output_leaf(o, group.result_param(kb.params, o.index))
        for i in range(TILE_M):
            val = ev.value(o.value, c_points[i])
            pred = _and(kb, row_ok[i], col_ok)
            if pred is None:
                ev.store(leaf, c_points[i], val)
            else:
                with kb.if_(pred):
                    ev.store(leaf, c_points[i], val)
    kb.vector_lanes = lanes
    return kb


def _and(kb: KernelBuilder, a, b):
    if a is None:
        return b
    if b is None:
        return a
    return kb.and_(a, b)


__all__ = ["emit_matmul"]
