"""Convolution kernels ("conv" groups): a direct convolution, register-tiled, with the
group's producers (the padding, the bias in the init, reshapes of the input and the
filter) computed where they are read, and its epilogue (bias, BatchNorm's scale and shift,
ReLU, a residual add) applied to the accumulators before the one store.

The group's convolution is any ``linalg.generic`` that linalg recognizes as one
(``linalg.isa_convolution_op``: ``conv_2d_nchw_fchw``, ``depthwise_conv_2d_nchw_chw``,
``conv_2d_ngchw_gfchw``/``fgchw`` generalized, with strides and dilations in their maps)
whose payload is ``acc + a * b`` (with ``arith.extf`` for f16/bf16 operands: the
accumulator's type, f32, is the sum's). Its loops are read from
``linalg.infer_convolution_dimensions``: the output's innermost dim (an output column)
runs along the ``V`` lanes of a thread (one 16-byte vector of the accumulator type,
halved until it divides the row: no tail), and when there is an output-channel loop that
the input does not depend on (not depthwise), a thread also covers ``TF`` consecutive
output channels, so each input vector it loads serves ``TF`` accumulators and each
filter value (one scalar, the same for every lane) serves ``V``. A thread thus holds a
``TF x V`` tile of the output in registers; threads are numbered along the output's dims
in order, so consecutive threads take consecutive output columns (coalesced loads and
stores) of the same channels (the filter values are the same across the warp).

The reduction (input channels, filter rows and columns) runs as ``scf.for`` loops with the
innermost ones unrolled (at most ``UNROLL`` points: a 3x3 window is straight-line code per
input channel). The input is read through the evaluator: a fused ``tensor.pad`` becomes
a bounds test and a clamped load per lane (``Evaluator._pad``), a stride or dilation an
address step. After the reduction the accumulators are the convolution's values at the
thread's points, and every output of the group is evaluated from them (through reshapes:
torch-mlir's grouped convolutions collapse ``N x G x F/G`` back to ``N x F``) and stored.
"""

from __future__ import annotations

import itertools
import math

from mlir import ir
from mlir.dialects import linalg

from ..build.evaluate import (
    Evaluator,
    Val,
    compose,
    generic_domain,
    iterators_of,
    maps_of,
    n_inputs,
)
from ..build.group import Group, require
from ..build.kernel import KernelBuilder, delinearize, linearize, numel, shape_of, vector_width
from .loop import launch_1d

#: Output channels per thread (fewer when the channel count is not a multiple).
TILE_CHANNELS = 4
#: Output columns per thread at most (one 16-byte vector of f32 accumulators).
TILE_COLUMNS = 4
#: Reduction points unrolled into straight-line code per iteration of the loops around them.
UNROLL = 16


def _convolution(group: Group) -> ir.Operation:
    reds = [
        op for op in group.ops() if op.name == "linalg.generic" and "reduction" in iterators_of(op)
    ]
    require(len(reds) == 1, "not exactly one convolution")
    op = reds[0]
    require(linalg.isa_convolution_op(op.opview), "a reduction that is not a convolution")
    require(n_inputs(op) == 2 and len(op.results) == 1, "a convolution that is not I * F -> O")
    block = op.regions[0].blocks[0]
    out_arg = block.arguments[2]
    ops = [o.operation for o in block.operations]
    add = ops[-1].operands[0].owner
    add = add.operation if hasattr(add, "operation") else add
    require(
        not isinstance(add, ir.Block)
        and add.name in ("arith.addf", "arith.addi")
        and out_arg in list(add.operands)
        and not any(o.name == "linalg.index" for o in ops),
        "a convolution payload that is not acc + a*b",
    )
    return op


def emit_conv(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    op = _convolution(group)
    its, maps, dom = iterators_of(op), maps_of(op), generic_domain(op)
    out_map = maps[2]
    out_loops = [r.maybe_downcast() for r in out_map.results]
    require(
        all(isinstance(r, ir.AffineDimExpr) for r in out_loops),
        "a convolution output map that is not a projection",
    )
    par = [r.position for r in out_loops]
    red = [d for d, it in enumerate(its) if it == "reduction"]
    require(sorted(par + red) == list(range(len(its))), "a convolution loop of unknown role")
    dims = linalg.infer_convolution_dimensions(op.opview)
    c_type = ir.ShapedType(op.results[0].type).element_type
    vec = par[-1]
    lanes = min(TILE_COLUMNS, vector_width(c_type, dom[vec])) if vec in dims.output_image else 1
    # a channel loop the input does not read: every input value serves TF accumulators
    input_loops = _loops_of(maps[0])
    channels = [d for d in dims.output_channel if d not in input_loops and d != vec]
    ch = channels[0] if channels else None
    tf = 1 if ch is None else next(t for t in (TILE_CHANNELS, 2, 1) if dom[ch] % t == 0)
    per_thread = {vec: lanes, **({ch: tf} if ch is not None else {})}
    sizes = [dom[p] // per_thread.get(p, 1) for p in par]
    tiles = numel(sizes)
    launch = launch_1d(group, module, name, tiles)
    kb = launch.kb
    ev = Evaluator(kb, group.func, group.leaves(kb.params), lanes=lanes)
    placements = {o.index: ev.placement(o.value, op.results[0]) for o in group.outputs}
    for o in group.outputs:
        require(
            placements[o.index] is not None,
            f"an output of shape {o.shape} that is not the convolution's result "
            f"{shape_of(op.results[0].type)} seen through elementwise ops and reshapes",
        )
    tile = kb.apply(launch.index)

    def body() -> None:
        point: list = [ir.AffineConstantExpr.get(0, kb.ctx)] * len(its)  # reductions: set below
        for p, e in zip(par, delinearize(kb.add_dim(tile), sizes)):
            point[p] = e * per_thread[p] if p in per_thread else e
        # the lanes run along the first output column of the thread: an index variable
        first = kb.add_dim(kb.apply(point[vec]))
        point[vec] = first
        ev.vdim = frozenset([first.position]) if lanes > 1 else frozenset()
        points = [_at_channel(point, ch, i) for i in range(tf)]
        out_idx = [compose(out_map, p, len(kb.dims), kb.ctx) for p in points]
        uniform = lanes == 1
        inits = [ev.value(op.operands[2], idx) for idx in out_idx]
        accs = [v.ssa if uniform else ev.as_vector(v) for v in inits]
        finals = _reduce(kb, ev, op, point, ch, tf, red, dom, accs, uniform)
        for idx, acc in zip(out_idx, finals):
            ev.preset(op.results[0], idx, Val(acc, uniform))
        for o in group.outputs:
            leaf = group.output_leaf(o, group.result_param(kb.params, o.index))
            for idx in out_idx:
                at = _output_index(placements[o.index], idx, shape_of(op.results[0].type), kb.ctx)
                ev.store(leaf, at, ev.value(o.value, at))

    if launch.launched != tiles:
        with kb.if_(kb.cmp_lt(tile, kb.index(tiles))):
            body()
    else:
        body()
    kb.vector_lanes = lanes
    return kb


def _loops_of(amap: ir.AffineMap) -> set[int]:
    """The loops an indexing map's results depend on."""
    found = set()
    for d in range(amap.n_dims):
        zero = [ir.AffineDimExpr.get(k, amap.context) for k in range(amap.n_dims)]
        zero[d] = ir.AffineConstantExpr.get(0, amap.context)
        sub = ir.AffineMap.get(amap.n_dims, 0, zero, amap.context)
        if any(r.compose(sub) != r for r in amap.results):
            found.add(d)
    return found


def _at_channel(point: list, ch: int | None, i: int) -> list:
    if ch is None:
        return list(point)
    p = list(point)
    p[ch] = p[ch] + i if i else p[ch]
    return p


def _reduce(kb, ev, op, point, ch, tf, red, dom, accs, uniform) -> list[ir.Value]:
    """The reduction loops around the payload: ``scf.for`` over the outer ones, the inner
    ones (at most UNROLL points) unrolled; returns the final accumulators."""
    n_unrolled = 0
    while n_unrolled < len(red) and math.prod(dom[r] for r in red[len(red) - n_unrolled - 1 :]) <= UNROLL:
        n_unrolled += 1
    looped, unrolled = red[: len(red) - n_unrolled], red[len(red) - n_unrolled :]
    ctx = kb.ctx

    def straight(accs: list[ir.Value]) -> list[ir.Value]:
        accs = list(accs)
        for values in itertools.product(*(range(dom[r]) for r in unrolled)):
            for r, v in zip(unrolled, values):
                point[r] = ir.AffineConstantExpr.get(v, ctx)
            for i in range(tf):
                res = ev.payload(op, _at_channel(point, ch, i), [Val(accs[i], uniform)])[0]
                accs[i] = res.ssa if uniform else ev.as_vector(res)
        return accs

    def nest(level: int, accs: list[ir.Value]) -> list[ir.Value]:
        if level == len(looped):
            return straight(accs)

        def body(iv, iter_args):
            point[looped[level]] = kb.add_dim(iv)
            return nest(level + 1, iter_args)

        return kb.for_(kb.index(0), kb.index(dom[looped[level]]), kb.index(1), accs, body)

    ev.contract = True
    try:
        return nest(0, accs)
    finally:
        ev.contract = False


def _output_index(place: list, c_idx: tuple, c_shape: tuple, ctx) -> tuple:
    """An output's index at the convolution's index ``c_idx``: each output dim is the
    row-major position of the convolution dims it is made of (``placement``)."""
    zero = ir.AffineConstantExpr.get(0, ctx)
    out = []
    for conv_dims in place:
        if not conv_dims:
            out.append(zero)
            continue
        out.append(linearize([c_idx[j] for j in conv_dims], [c_shape[j] for j in conv_dims]))
    return tuple(out)


__all__ = ["emit_conv"]
