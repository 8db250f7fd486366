"""Loop kernels (elementwise/broadcast/injective groups) and the grid-stride fallback.

Loop: every output has the iteration space of the largest one; thread ``t`` computes the
``V`` consecutive elements starting at flat position ``t * V`` (``V`` = one 16-byte vector
of the output's element type, halved until it divides the innermost dimension, so a vector
never crosses a row and rows stay aligned). Operands indexed contiguously along the
innermost dimension are read with one ``V``-wide load, operands that do not vary along it
(row broadcasts) with one scalar load, anything else (transposed reads) lane by lane.
Blocks of 256 threads; the last block is guarded.

Fallback: any group (reductions included: each output point computes them sequentially)
as a grid-stride loop over each output, 256 threads per block, one element per iteration.
Correct for everything the evaluator can express; fast for nothing in particular.
"""

from __future__ import annotations

from typing import NamedTuple

from mlir import ir

from ....analysis.scatter import reads_in_update_order, update_loops
from ....analysis.scatter import recognize as recognize_scatter
from ..build.evaluate import Evaluator, generic_domain, op_of
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize, numel, vector_width
from .column_sums import add_at, is_partial_sum, partial_sum

BLOCK = 256
#: Grid cap of the fallback's grid-stride loops (enough blocks to fill any current GPU).
FALLBACK_MAX_BLOCKS = 4096
MAX_GRID_X = 2**31 - 1


def block_for(threads: int) -> int:
    """256, or fewer (a multiple of 32) when there is less work: never a 1-thread block."""
    return max(32, min(BLOCK, -(-threads // 32) * 32))


class Launch1D(NamedTuple):
    kb: KernelBuilder
    index: ir.AffineExpr  # the thread's flat index, block_id.x * block + thread_id.x
    launched: int  # threads launched (grid * block): more than asked when the last block is partial


def launch_1d(group: Group, module: ir.Module, name: str, threads: int) -> Launch1D:
    """A kernel of ``threads`` threads in one dimension: :func:`block_for`'s block, as many
    blocks as it takes (the caller guards the last block when ``launched`` exceeds what it
    needs)."""
    block = block_for(threads)
    grid = -(-threads // block)
    require(grid <= MAX_GRID_X, "too many blocks")
    kb = KernelBuilder(module, name, group.params, (grid, 1, 1), (block, 1, 1))
    bx = kb.add_dim(kb.block_id[0])
    tx = kb.add_dim(kb.thread_id[0])
    return Launch1D(kb, bx * block + tx, grid * block)


def emit_loop(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    # column sums of the loop's values (opfuse-fuse-column-sums) are added in, each
    # element where the thread computes it: column_sums.py
    ops = {o.index: op_of(o.value) for o in group.outputs}
    # scatter-adds (an embedding's gradient) too, each update added into its row: scatter.py
    scatters = {i: s for i, op in ops.items() if op is not None and op.name == "linalg.generic"
                for s in [recognize_scatter(op)] if s is not None}
    sums = {i: op for i, op in ops.items() if i not in scatters
            and op is not None and op.name == "linalg.generic" and is_partial_sum(op)}
    outs = [o for o in group.outputs if o.index not in sums and o.index not in scatters]
    require(bool(outs), "no outputs")
    sizes = {numel(o.shape) for o in outs}
    require(len(sizes) == 1, "outputs of different sizes")
    primary = max(outs, key=lambda o: len(o.shape))
    n = numel(primary.shape)
    require(n > 0, "an empty output")
    lanes = vector_width(primary.element_type, primary.shape[-1] if primary.shape else 1)
    for o in outs:
        if o.shape:
            lanes = min(lanes, vector_width(o.element_type, o.shape[-1]))
    column = {}
    for i, op in sums.items():
        dom = tuple(generic_domain(op))
        require(numel(dom) == n, f"a column sum over {list(dom)}, not over the loop's "
                                 f"{list(primary.shape)}")
        column[i] = partial_sum(op)
        # a vector's lanes are consecutive points of the sum's innermost loop (each lane
        # adds on its own: into one element where that loop is reduced)
        lanes = min(lanes, vector_width(ir.F32Type.get(module.context), dom[-1]))
    from .scatter import add_update  # (scatter.py builds on this module's launch_1d)

    updates = {}
    for i, s in scatters.items():
        dom = tuple(generic_domain(s.op))
        shape = tuple(dom[d] for d in update_loops(s))
        require(reads_in_update_order(s) and numel(shape) == n,
                f"a scatter-add of {list(shape)} updates, not the loop's {list(primary.shape)}")
        updates[i] = (s, shape)
        lanes = min(lanes, vector_width(ir.F32Type.get(module.context), shape[-1]))
    launch = launch_1d(group, module, name, -(-n // lanes))
    kb = launch.kb
    first = kb.apply(launch.index * lanes)
    d0 = kb.add_dim(first)
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=lanes, vdim=d0.position)

    def body():
        for o in outs:
            idx = delinearize(d0, o.shape) if o.shape else []
            val = ev.value(o.value, idx)
            ev.store(group.output_leaf(o, group.result_param(kb.params, o.index)), tuple(idx), val)
        for o in group.outputs:
            if o.index in column:  # the sum's point at the thread's flat position
                cs = column[o.index]
                point = tuple(delinearize(d0, tuple(generic_domain(cs.op))))
                add_at(kb, ev, group, cs, o, point, cs.at(point), None)
            if o.index in updates:  # the update at the thread's flat position
                s, shape = updates[o.index]
                at = dict(zip(update_loops(s), delinearize(d0, shape)))
                add_update(kb, ev, group, s, o, at)

    if launch.launched * lanes != n:
        with kb.if_(kb.cmp_lt(first, kb.index(n))):
            body()
    else:
        body()
    kb.vector_lanes = lanes
    if column or updates:
        kb.meta.update(zeroed=sorted([*column, *updates]), atomics=n * (len(column) + len(updates)))
    return kb


def emit_fallback(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    outs = group.outputs
    require(bool(outs), "no outputs")
    n_max = max(numel(o.shape) for o in outs)
    block = block_for(n_max)
    grid = max(1, min(FALLBACK_MAX_BLOCKS, -(-n_max // block)))
    kb = KernelBuilder(module, name, group.params, (grid, 1, 1), (block, 1, 1))
    ev = Evaluator(kb, group.func, group.leaves(kb.params), sequential=True)
    b = kb.add_dim(kb.block_id[0])
    t = kb.add_dim(kb.thread_id[0])
    start = kb.apply(b * block + t)
    stride = kb.index(grid * block)
    for o in outs:

        def body(iv, _):
            d = kb.add_dim(iv)
            idx = delinearize(d, o.shape) if o.shape else []
            val = ev.value(o.value, idx)
            ev.store(group.output_leaf(o, group.result_param(kb.params, o.index)), tuple(idx), val)
            return []

        kb.for_(start, kb.index(numel(o.shape)), stride, [], body)
    kb.vector_lanes = 1
    return kb
