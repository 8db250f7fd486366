"""Attention groups on the CPU: the tiled kernel, or the online softmax as one-row loops.

The CPU lowering (:mod:`opfuse.backends.cpu.lower`) would otherwise turn an ``attention`` group
into its ops' loop nests, materializing the batch x heads x queries x keys scores inside
the function. :func:`lower_attention_kernels` replaces the body of each such function (one
call from :func:`opfuse.backends.cpu.lower.prepare_loops`) by the tiled, threaded kernel of
:mod:`opfuse.backends.cpu.attention_tiles`, or, where that kernel's per-thread workspace would be too
large, by these loops over memrefs (single-threaded, scalar: slow, and said so):

    for each (batch, head), for each query row m:
        q = Q[m, :] (f32), acc = 0, m_run = -inf, l = 0
        for each tile of BLOCK_N keys (up to the causal bound when there is one):
            x_j = X(Q·K_j)            the graph's scale and masks, at (m, j)
            m_new = max(m_run, max_j x_j); alpha = exp(m_run - m_new)
            p_j = exp(x_j - m_new); l = l * alpha + sum_j p_j
            acc = acc * alpha + sum_j p_j V_j
        O[m, :] = acc / l            (0 when every key is masked, like PyTorch's SDPA)

so only one row's tile of scores (BLOCK_N floats) exists at a time. Loads and the scores
``X`` go through the same evaluator the GPU emitters use (:mod:`opfuse.backends.gpu.build.attention_plan`), so the
graph's views, broadcasts (grouped-query heads), masks and element types mean the same on
both backends. A group this cannot handle keeps its ops (correct, but with S in memory).
"""

from __future__ import annotations

import math
import warnings

from mlir import ir
from mlir.dialects import arith, memref

from ...analysis.indexing import delinearize, numel
from ..gpu.build.attention_plan import (
    AttentionEvaluator,
    Plan,
    at,
    binary,
    elem_type,
    exp,
    fma,
    from_f32,
    plan,
    reciprocal_or_zero,
    rescale,
    to_f32,
)
from . import attention_tiles as tiles
from ..gpu.build.evaluate import Val
from ..gpu.build.group import Group, prepare
from ..gpu.build.kernel import KernelBuilder, Unsupported

#: Keys per tile: the scores of one row's tile live in a small stack buffer.
BLOCK_N = 64


def lower_attention_kernels(module: ir.Module, threads: int = 1) -> int:
    """Rewrite every ``attention`` kernel function of ``module`` in place, for ``threads``
    threads: the tiled fast path of :mod:`opfuse.backends.cpu.attention_tiles` where its workspace fits,
    else the online-softmax loops of this module (with a warning naming the kernel; the
    function's ``opfuse.cpu_attention`` attribute says which). Returns how many were
    rewritten."""
    done = 0
    texts: dict[str, str] = {}
    for op in list(module.body.operations):
        fn = op.operation
        if fn.name != "func.func" or not fn.regions[0].blocks:
            continue
        attrs = fn.attributes
        if "opfuse.kind" not in attrs or ir.StringAttr(attrs["opfuse.kind"]).value != "attention":
            continue
        name = ir.StringAttr(attrs["sym_name"]).value
        try:
            group = prepare(fn)
            p = plan(group)
        except Unsupported as e:
            # correct (the ops' own loops), but the scores go through memory: several
            # times slower than the kernel, so the user hears of it
            warnings.warn(f"opfuse: attention kernel @{name} runs as its ops' loops on the "
                          f"cpu (scores in memory, slow): {e}", stacklevel=2)
            continue
        t = tiles.tiling(p, threads)
        if t.bytes_per_thread <= tiles.WORKSPACE_LIMIT:
            texts.update(tiles.helper_texts(p))
            _rewrite(fn, group, lambda kb: tiles.Tiles(kb, group, p, t).emit())
            how = "tiles"
        else:
            warnings.warn(
                f"opfuse: attention kernel @{name} runs as one-row loops on the cpu (slow): "
                f"its tiles would need {t.bytes_per_thread >> 20} MiB per thread, more than "
                f"{tiles.WORKSPACE_LIMIT >> 20} MiB", stacklevel=2)
            _rewrite(fn, group, lambda kb: _Loops(kb, group, p).emit())
            how = "rows"
        fn.attributes["opfuse.cpu_attention"] = ir.StringAttr.get(how, fn.context)
        done += 1
    if texts:
        with module.context:
            library = ir.Module.parse("".join(texts.values()))
            ip = ir.InsertionPoint(module.body)
            for f in list(library.body.operations):
                f.operation.clone(ip=ip)
    return done


class _LoopBuilder(KernelBuilder):
    """A KernelBuilder that emits into a plain function body (no launch)."""

    def __init__(self, body: ir.Block, ctx: ir.Context, params: list[ir.Value], name: str):
        self.name = name
        self.params = params
        self._init_body(body, ctx)


def _rewrite(fn: ir.Operation, group: Group, emit) -> None:
    """Replace ``fn``'s body: tensors to buffers, the loops, buffers back to tensors."""
    ctx = fn.context
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    block = fn.regions[0].blocks[0]
    old_ops = [o.operation for o in block.operations]
    with ctx, ir.Location.unknown(ctx):
        ip = ir.InsertionPoint(old_ops[0])
        flat = []
        for arg in block.arguments:
            t = ir.RankedTensorType(arg.type)
            mt = ir.MemRefType.get(t.shape, t.element_type)
            buf = ir.Operation.create("bufferization.to_buffer", results=[mt], operands=[arg],
                                      attributes={"read_only": ir.UnitAttr.get()}, ip=ip)
            flat.append(_flatten(buf.results[0], ip))
        outs = []
        for t in ftype.results:
            t = ir.RankedTensorType(t)
            buf = memref.AllocOp(ir.MemRefType.get(t.shape, t.element_type), [], [], ip=ip)
            outs.append(buf.result)
            flat.append(_flatten(buf.result, ip))
        results = []
        for buf, t in zip(outs, ftype.results):
            results.append(ir.Operation.create(
                "bufferization.to_tensor", results=[t], operands=[buf],
                attributes={"restrict": ir.UnitAttr.get(), "writable": ir.UnitAttr.get()},
                ip=ip).results[0])
        ret = ir.Operation.create("func.return", operands=results, ip=ip)
    for op in reversed(old_ops):
        op.erase()
    emit(_LoopBuilder(block, ctx, flat, ir.StringAttr(fn.attributes["sym_name"]).value))
    del ret


def _flatten(buf: ir.Value, ip: ir.InsertionPoint) -> ir.Value:
    """``buf`` as the 1-D memref the evaluator's leaves are (a kernel parameter's view)."""
    t = ir.MemRefType(buf.type)
    shape = list(t.shape)
    n = numel(shape)
    flat_t = ir.MemRefType.get([n], t.element_type)
    if len(shape) == 1:
        return buf
    if not shape:
        return memref.ExpandShapeOp(flat_t, buf, [], [], [1], ip=ip).result
    return memref.CollapseShapeOp(flat_t, buf, [list(range(len(shape)))], ip=ip).result


class _Loops:
    """The loop nest of one attention group (see the module docstring)."""

    def __init__(self, kb: _LoopBuilder, group: Group, p: Plan):
        self.kb, self.group, self.p, self.att = kb, group, p, p.att
        self.ev = AttentionEvaluator(kb, group.func, group.leaves(kb.params))
        self.f32 = ir.F32Type.get(kb.ctx)
        self.neg_inf = kb.const(self.f32, -math.inf)
        self.zero = kb.const(self.f32, 0.0)
        self.batch: list[ir.AffineExpr] = []
        self.row: ir.AffineExpr | None = None

    def _at(self, exprs, **roles):
        return at(self.kb, self.att, exprs, roles, self.batch)

    def _load(self, value, exprs, **roles) -> ir.Value:
        return to_f32(self.kb, self.ev.value(value, self._at(exprs, **roles)).ssa)

    def _loop(self, lb, ub, inits, body, step=1):
        kb = self.kb
        lb = kb.index(lb) if isinstance(lb, int) else lb
        ub = kb.index(ub) if isinstance(ub, int) else ub
        return kb.for_(lb, ub, kb.index(step), inits, body)

    def _buffer(self, n: int) -> ir.Value:
        with self.kb.ctx, self.kb._top, ir.Location.unknown(self.kb.ctx):
            return memref.AllocaOp(ir.MemRefType.get([n], self.f32), [], []).result

    def emit(self) -> None:
        att = self.att
        self.q_buf = self._buffer(att.head_dim)
        self.acc_buf = self._buffer(att.value_dim)
        self.s_buf = self._buffer(BLOCK_N)

        def per_batch(iv, _):
            g = self.kb.add_dim(iv)
            self.batch = delinearize(g, list(att.batch)) if att.batch else []
            self._loop(0, att.queries, [], per_row)
            return []

        def per_row(iv, _):
            self.row = self.kb.add_dim(iv)
            self._row()
            return []

        self._loop(0, max(1, numel(att.batch)), [], per_batch)

    def _store_buf(self, buf, i, x) -> None:
        with self.kb.emitting():
            memref.store(x, buf, [i])

    def _load_buf(self, buf, i) -> ir.Value:
        with self.kb.emitting():
            return memref.load(buf, [i])

    def _row(self) -> None:
        kb, att = self.kb, self.att

        def stage_q(iv, _):
            h = kb.add_dim(iv)
            self._store_buf(self.q_buf, iv, self._load(att.q, att.q_idx, m=self.row, head=h))
            return []

        self._loop(0, att.head_dim, [], stage_q)

        def clear(iv, _):
            self._store_buf(self.acc_buf, iv, self.zero)
            return []

        self._loop(0, att.value_dim, [], clear)
        ub = self._key_bound()
        _, l = self._loop(0, ub, [self.neg_inf, self.zero],
                          lambda iv, st: self._tile(iv, st, ub), step=BLOCK_N)
        inv = reciprocal_or_zero(kb, l, self.zero)

        def store(iv, _):
            col = kb.add_dim(iv)
            o = binary(kb, "arith.mulf", self._load_buf(self.acc_buf, iv), inv)
            self.ev.held = {self.p.o: Val(from_f32(kb, o, elem_type(self.p.o)), True)}
            for out, o_idx in self.p.outputs:
                idx = self._at(o_idx, m=self.row, n=col)
                leaf = self.group.output_leaf(out, self.group.result_param(kb.params, out.index))
                self.ev.store(leaf, idx, self.ev.value(out.value, idx))
            self.ev.held = {}
            return []

        self._loop(0, att.value_dim, [], store)

    def _key_bound(self) -> ir.Value:
        """N, or with a causal mask (keys ``n > m + c`` masked) ``clamp(m + 1 + c, 0, N)``."""
        kb, c = self.kb, self.att.causal
        if c is None:
            return kb.index(self.att.keys)
        if c + 1 >= 0:
            end = kb.apply(self.row + (c + 1))
        else:
            with kb.emitting():
                end = arith.subi(arith.maxsi(kb.apply(self.row), kb.index(-c - 1)),
                                 kb.index(-c - 1))
        return kb.min_index(end, kb.index(self.att.keys))

    def _tile(self, iv, state, ub):
        """One tile of keys ``[n0, min(n0 + BLOCK_N, ub))``: scores, rescaling, P·V."""
        kb, att = self.kb, self.att
        m_old, l_old = state
        n0 = kb.add_dim(iv)
        with kb.emitting():
            count = arith.subi(kb.min_index(kb.apply(n0 + BLOCK_N), ub), iv)

        def score(jv, st):
            key = kb.add_dim(kb.apply(n0 + kb.add_dim(jv)))

            def dot(hv, acc):
                h = kb.add_dim(hv)
                k = self._load(att.k, att.k_idx, k=key, head=h)
                return [fma(kb, acc[0], self._load_buf(self.q_buf, hv), k, False)]

            (s,) = self._loop(0, att.head_dim, [self.zero], dot)
            self.ev.held = {att.s: Val(from_f32(kb, s, elem_type(att.s)), True)}
            x = to_f32(kb, self.ev.value(att.score, self._at(att.score_idx, m=self.row, k=key)).ssa)
            self.ev.held = {}
            self._store_buf(self.s_buf, jv, x)
            return [binary(kb, "arith.maximumf", st[0], x)]

        (m_tile,) = self._loop(0, count, [self.neg_inf], score)
        m_new, m_use, alpha = rescale(kb, m_old, m_tile, self.neg_inf, self.zero)

        def probs(jv, st):
            p = exp(kb, binary(kb, "arith.subf", self._load_buf(self.s_buf, jv), m_use))
            if att.probs_type is not None:  # P as P·V reads it in the graph's type
                p = to_f32(kb, from_f32(kb, p, att.probs_type))
            self._store_buf(self.s_buf, jv, p)
            return [binary(kb, "arith.addf", st[0], p)]

        (l_tile,) = self._loop(0, count, [self.zero], probs)

        def rescale_acc(dv, _):
            a = self._load_buf(self.acc_buf, dv)
            self._store_buf(self.acc_buf, dv, binary(kb, "arith.mulf", a, alpha))
            return []

        self._loop(0, att.value_dim, [], rescale_acc)

        def pv(jv, _):
            key = kb.add_dim(kb.apply(n0 + kb.add_dim(jv)))
            p = self._load_buf(self.s_buf, jv)

            def column(dv, _):
                d = kb.add_dim(dv)
                v = self._load(att.v, att.v_idx, k=key, n=d)
                self._store_buf(self.acc_buf, dv, fma(kb, self._load_buf(self.acc_buf, dv), p, v, False))
                return []

            self._loop(0, att.value_dim, [], column)
            return []

        self._loop(0, count, [], pv)
        return [m_new, fma(kb, l_tile, l_old, alpha, False)]


__all__ = ["lower_attention_kernels"]
