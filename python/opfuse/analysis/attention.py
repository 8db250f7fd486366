"""Attention, recognized from the linalg: ``matmul(Q, Kᵀ)`` → pointwise ops (scale,
additive or boolean masks, a causal mask from iota and a comparison, ``where``) → a row
softmax → ``matmul(P, V)``.

Recognition is structural, never by op names or locations: from a contraction ``PV``, the
value its left operand reads is expanded into a *scalar expression tree* at one symbolic
point (through reshapes, slices and the payloads of pointwise generics, with their indexing
maps composed), and the tree must have the form of a softmax over the contraction's
reduction loop::

    P = exp(X - max_n X) / sum_n exp(X - max_n X)      (or E * (1 / sum))

where the two reductions are row reductions whose element trees equal ``X`` and
``exp(X - max X)`` at the same point, and ``X`` reads the result ``S`` of a second
contraction ``QK`` pointwise: at the key index of ``PV``. So the builder's form (a
transpose of K, batch dims collapsed around ``batch_matmul``), the torch importer's, a
torch-mlir ``linalg.generic`` contraction with Kᵀ in its indexing map, a hand-written
fused ``exp(x - m)`` payload, or grouped-query heads (K and V broadcast to every query
head) all match, while anything whose rows or keys do not line up does not.

The result, :class:`Attention`, holds what a code generator needs, as affine expressions
over *attention dims*: the loops of ``PV`` (batch..., query ``m``, value column, key
``n``: in ``PV``'s own order) plus one more for the head dim of ``QK``. Where Q, K and V
are read, where ``X`` is evaluated, and, when the masks make every key ``n > m + c``
``-inf`` (a causal mask), the offset ``c``: key tiles above the diagonal can be skipped.

Works on the original function (fusion passes: named ops are described by their
generalized twins, data flow by the originals) and on prepared kernels (all generics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from mlir import ir

from .causal_mask import CASTS as _CASTS, causal_offset, causal_selects, float_value as _float
from .indexing import (
    Index,
    collapse_source,
    compose,
    dims_of,
    expand_source,
    iterators_of,
    maps_of,
    n_inputs,
    op_of,
    point_of,
    reshape_source,
    slice_source,
)

Twin = Callable[[ir.Operation], "ir.Operation | None"]
Tree = tuple

_MAX_COMBINERS = ("arith.maximumf", "arith.maxnumf")


@dataclass(frozen=True)
class Contraction:
    """A contraction ``C[batch, m, n] += A[batch, m, k] * B[batch, k, n]`` (any layout):
    the positions of its loops by role, its loop sizes and indexing maps."""

    op: ir.Operation
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    dom: tuple[int, ...]
    maps: tuple[ir.AffineMap, ...]


@dataclass
class Attention:
    """One recognized attention. Index expressions are over :attr:`n_dims` dims: the
    loops of ``pv`` in its order, then the head dim of ``qk`` (:attr:`head`)."""

    qk: Contraction
    pv: Contraction
    q: ir.Value
    q_idx: Index
    k: ir.Value
    k_idx: Index
    v: ir.Value
    v_idx: Index
    score: ir.Value  # X: what the row max reduces
    score_idx: Index
    n_dims: int
    causal: int | None  # every key n > m + causal is masked (-inf), when known
    probs_type: ir.Type | None  # the element type P is cast to before PV (None: no cast)
    ops: list[ir.Operation] = field(default_factory=list)  # every op of the pattern
    #: The causal mask's payload selects and the operand each keeps where its predicate
    #: holds: on a key tile wholly at or below the diagonal (every key ``n <= m + causal``
    #: for every row) each one is that operand, and a kernel need not evaluate the mask.
    causal_selects: dict[ir.Operation, int] = field(default_factory=dict)

    @property
    def head(self) -> int:
        return self.n_dims - 1

    @property
    def s(self) -> ir.Value:
        """The result of ``QK`` (the scores before scaling and masking)."""
        return self.qk.op.results[0]

    @property
    def head_dim(self) -> int:
        return self.qk.dom[self.qk.k]

    @property
    def value_dim(self) -> int:
        return self.pv.dom[self.pv.n]

    @property
    def queries(self) -> int:
        return self.pv.dom[self.pv.m]

    @property
    def keys(self) -> int:
        return self.pv.dom[self.pv.k]

    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(self.pv.dom[b] for b in self.pv.batch)


def _strip_casts(v: ir.Value, block: ir.Block) -> ir.Value:
    while (op := op_of(v)) is not None and op.block == block and op.name in _CASTS + (
        "arith.extsi", "arith.extui", "arith.sitofp"
    ):
        v = op.operands[0]
    return v


def contraction(op: ir.Operation, twin: ir.Operation | None) -> Contraction | None:
    """The roles of ``op``'s loops when its generic form ``twin`` is a plain contraction
    (``acc + a * b``, casts of ``a`` and ``b`` allowed; one M, N and K loop); else None."""
    if twin is None or twin.name != "linalg.generic" or len(twin.results) != 1:
        return None
    if n_inputs(twin) != 2:
        return None
    block = twin.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if any(o.name == "linalg.index" for o in body):
        return None
    add = op_of(body[-1].operands[0])
    if add is None or add.name not in ("arith.addf", "arith.addi"):
        return None
    acc = block.arguments[2]
    operands = list(add.operands)
    if acc not in operands or len(operands) != 2:
        return None
    mul = op_of(operands[1 - operands.index(acc)])
    if mul is None or mul.name not in ("arith.mulf", "arith.muli"):
        return None
    factors = {_strip_casts(x, block) for x in mul.operands}
    if factors != {block.arguments[0], block.arguments[1]}:
        return None
    maps = maps_of(twin)
    its = iterators_of(twin)
    uses = []
    for m in maps:
        dims = [r.maybe_downcast() for r in m.results]
        if not all(isinstance(d, ir.AffineDimExpr) for d in dims):
            return None
        uses.append({d.position for d in dims})
    roles: dict[tuple[bool, bool, bool, str], list[int]] = {}
    for loop, it in enumerate(its):
        roles.setdefault((loop in uses[0], loop in uses[1], loop in uses[2], it), []).append(loop)
    batch = roles.pop((True, True, True, "parallel"), [])
    m = roles.pop((True, False, True, "parallel"), [])
    n = roles.pop((False, True, True, "parallel"), [])
    k = roles.pop((True, True, False, "reduction"), [])
    if roles or len(m) != 1 or len(n) != 1 or len(k) != 1:
        return None
    dom = [0] * len(its)
    for value, amap in zip(twin.operands, maps):
        for size, res in zip(ir.ShapedType(value.type).shape, amap.results):
            dom[res.maybe_downcast().position] = size
    return Contraction(op, tuple(batch), m[0], n[0], k[0], tuple(dom), tuple(maps))


class _Trees:
    """Scalar expression trees of tensor values at symbolic points.

    A tree is a nested tuple: ``("op", name, attributes, *children)``, ``("const", id)``,
    ``("index", id)`` (a loop index: an affine expression), ``("ext", id)`` (a read of a
    tensor no pointwise op produces: an argument, a dense constant) or ``("red", id)`` (a
    read of a reduction's or contraction's result). Ids index :attr:`consts`,
    :attr:`indices` and :attr:`reads`, and are the same for the same constant, expression
    or (value, index) read, so trees compare with ``==``.
    """

    def __init__(self, twin: Twin, n_dims: int, ctx, unit_dims: tuple[int, ...] = ()):
        self.twin, self.n_dims, self.ctx = twin, n_dims, ctx
        self.visited: dict[ir.Operation, None] = {}
        self.consts: dict[str, ir.Attribute] = {}
        self.indices: dict[str, ir.AffineExpr] = {}
        self.reads: dict[tuple, tuple[ir.Value, Index]] = {}
        self.selects: dict[Tree, list[ir.Operation]] = {}  # the payload ops of select trees
        # dims of extent 1 are 0: a view may have dropped one (delinearizing over a unit
        # dim gives the constant 0), and the same read must give the same tree
        with ctx:
            subst = [ir.AffineConstantExpr.get(0) if i in unit_dims else ir.AffineDimExpr.get(i)
                     for i in range(n_dims)]
        self._unit = ir.AffineMap.get(n_dims, 0, subst, ctx) if unit_dims else None

    def norm(self, e: ir.AffineExpr) -> ir.AffineExpr:
        return e.compose(self._unit).maybe_downcast() if self._unit is not None else e

    def _read(self, tag: str, v: ir.Value, idx: Index) -> Tree:
        idx = tuple(self.norm(e) for e in idx)
        key = (tag, v, tuple(str(e) for e in idx))
        self.reads.setdefault(key, (v, idx))
        return (tag, key)

    def _const(self, attr: ir.Attribute) -> Tree:
        key = str(attr)
        self.consts.setdefault(key, attr)
        return ("const", key)

    def tensor(self, v: ir.Value, idx: Index) -> Tree:
        """The tree of tensor ``v`` at ``idx``."""
        v, idx = self.through_views(v, idx)
        op = op_of(v)
        if op is None:
            return self._read("ext", v, idx)
        if op.name == "arith.constant":
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
                return self._const(attr.get_splat_value())
            return self._read("ext", v, idx)
        twin = self.twin(op) if op.name.startswith("linalg.") else None
        if twin is None or twin.name != "linalg.generic":
            return self._read("ext", v, idx)
        if "reduction" in iterators_of(twin):
            return self._read("red", v, idx)
        r = ir.OpResult(v).result_number
        point = point_of(maps_of(twin)[n_inputs(twin) + r], idx)
        if point is None:
            return self._read("ext", v, idx)
        self.visited[op] = None
        block = twin.regions[0].blocks[0]
        yielded = [o.operation for o in block.operations][-1].operands[r]
        return self.payload(op, twin, point, yielded)

    def through_views(self, v: ir.Value, idx: Index) -> tuple[ir.Value, Index]:
        """Follow reshapes and static slices from ``v`` read at ``idx`` to their source."""
        while (op := op_of(v)) is not None:
            if op.name == "tensor.expand_shape":
                idx = expand_source(op, idx)
            elif op.name == "tensor.collapse_shape":
                idx = collapse_source(op, idx)
            elif op.name == "tensor.reshape" and len(op.operands) == 2:
                src = reshape_source(op, idx)
                if src is None:
                    break
                idx = src
            elif op.name == "tensor.extract_slice":
                try:
                    idx = slice_source(op, idx)
                except ValueError:
                    break
            else:
                break
            self.visited[op] = None
            v = op.operands[0]
        return v, idx

    def payload(self, op: ir.Operation, twin: ir.Operation, point: list, value: ir.Value,
                acc: ir.Value | None = None) -> Tree:
        """The tree of payload value ``value`` of ``op`` (generic form ``twin``) at loop
        point ``point``; ``acc`` (a reduction's accumulator argument) becomes ``("acc",)``."""
        block = twin.regions[0].blocks[0]
        maps = maps_of(twin)
        operands = list(op.operands)  # the original's: the twin's may be scratch arguments
        env: dict[ir.Value, Tree] = {}

        def get(x: ir.Value) -> Tree:
            if x in env:
                return env[x]
            if acc is not None and x == acc:
                return ("acc",)
            owner = x.owner
            if isinstance(owner, ir.Block) and owner == block:
                j = ir.BlockArgument(x).arg_number
                operand = operands[j]
                if not isinstance(operand.type, ir.ShapedType):
                    return self.scalar(operand)
                return self.tensor(operand, compose(maps[j], point, self.n_dims, self.ctx))
            inner = op_of(x)
            if inner is None or inner.block != block:
                return self.scalar(x)
            return compute(inner)[ir.OpResult(x).result_number]

        def compute(inner: ir.Operation) -> list[Tree]:
            if inner.name == "linalg.index":
                e = self.norm(point[ir.IntegerAttr(inner.attributes["dim"]).value])
                self.indices.setdefault(str(e), e)
                trees = [("index", str(e))]
            elif inner.name == "arith.constant":
                trees = [self._const(inner.attributes["value"])]
            else:
                attrs = inner.attributes
                key = tuple(sorted((attrs[i].name, str(attrs[i].attr)) for i in range(len(attrs))))
                children = tuple(get(o) for o in inner.operands)
                n = len(inner.results)
                trees = [("op", inner.name, key, *children) if n == 1 else
                         ("op", inner.name, key + (("#", str(k)),), *children) for k in range(n)]
                if inner.name == "arith.select":
                    self.selects.setdefault(trees[0], []).append(inner)
            for res, t in zip(inner.results, trees):
                env[res] = t
            return trees

        return get(value)

    def scalar(self, v: ir.Value) -> Tree:
        op = op_of(v)
        if op is not None and op.name == "arith.constant":
            return self._const(op.attributes["value"])
        return self._read("ext", v, ())


def match(pv_op: ir.Operation, twin: Twin) -> Attention | str | None:
    """The attention ending in contraction ``pv_op``: an :class:`Attention`, a reason
    (a softmax feeds ``pv_op`` but the rest does not fit), or None (no softmax at all)."""
    pv = contraction(pv_op, twin(pv_op))
    if pv is None:
        return None
    ctx = pv_op.context
    n_dims = len(pv.dom) + 1
    with ctx:
        dims = [ir.AffineDimExpr.get(i) for i in range(n_dims)]
    trees = _Trees(twin, n_dims, ctx, tuple(i for i, d in enumerate(pv.dom) if d == 1))
    p_tree = trees.tensor(pv_op.operands[0], compose(pv.maps[0], dims[:-1], n_dims, ctx))
    # P as P·V reads it: in f16/bf16 it is rounded before the product
    probs_type = _cast_result_type(pv_op)
    probs_type = None if isinstance(probs_type, ir.F32Type) else probs_type
    normalized = _normalization(_uncast(p_tree), trees)
    if normalized is None:
        return None
    # f16/bf16 softmaxes round between their steps (a sum accumulated in f32, rounded):
    # the kernel computes in f32, so the roundings do not change what is computed
    e_tree, l_read = _uncast(normalized[0]), _uncast(normalized[1])
    if not (_is_op(e_tree, "math.exp") and _is_op(_uncast(e_tree[3]), "arith.subf")):
        return None
    sub = _uncast(e_tree[3])
    x_tree, m_read = _uncast(sub[3]), _uncast(sub[4])
    if m_read[0] != "red" or l_read[0] != "red":
        return None
    key = trees.norm(dims[pv.k])
    row_max = _row_reduction(trees, m_read, key, _MAX_COMBINERS)
    row_sum = _row_reduction(trees, l_read, key, ("arith.addf",))
    if row_max is None or row_sum is None:
        return "the softmax's max or sum is not a reduction over the keys of P @ V"
    if _uncast(row_max[0]) != x_tree or _uncast(row_sum[0]) != e_tree:
        return "the softmax's reductions do not reduce the scores P is made of"
    score, score_idx = row_max[1]
    if score is None:
        return "the row max reduces a computed value, not a tensor of scores"
    qk_reads = {trees.reads[k] for t in _leaves(x_tree) if t[0] == "red" for k in [t[1]]}
    if len({(v, tuple(str(e) for e in i)) for v, i in qk_reads}) != 1:
        return "the scores do not read exactly one matmul result at one index"
    ((s_value, s_idx),) = qk_reads
    qk_op = op_of(s_value)
    qk = contraction(qk_op, twin(qk_op)) if qk_op is not None else None
    if qk is None:
        return "the scores are not the result of a matmul Q @ Kᵀ"
    qk_point = _output_point(qk, s_idx)
    if qk_point is None or str(trees.norm(qk_point[qk.n])) != str(key):
        return "the scores are not read at the keys P @ V reduces over"
    if any(pv.k in dims_of(qk_point[b]) for b in (*qk.batch, qk.m)):
        return "the query rows of Q @ Kᵀ depend on the key index"
    if not (qk.dom[qk.n] == pv.dom[pv.k] == row_max[2] == row_sum[2]):
        return "Q @ Kᵀ, the softmax and P @ V do not run over the same keys"
    qk_point[qk.k] = dims[-1]
    q_idx = compose(qk.maps[0], qk_point, n_dims, ctx)
    k_idx = compose(qk.maps[1], qk_point, n_dims, ctx)
    v_idx = compose(pv.maps[1], dims[:-1], n_dims, ctx)
    ops = [qk_op, *trees.visited, pv_op]
    return Attention(
        qk, pv, qk_op.operands[0], q_idx, qk_op.operands[1], k_idx, pv_op.operands[1], v_idx,
        score, score_idx, n_dims, causal_offset(x_tree, trees, pv.m, pv.k), probs_type,
        list(dict.fromkeys(ops)), causal_selects(x_tree, trees, pv.m, pv.k),
    )


def _output_point(c: Contraction, idx: Index) -> list | None:
    """The loop point (K loop left None) at which contraction ``c`` writes ``idx``."""
    point: list = [None] * len(c.dom)
    for t, res in enumerate(c.maps[2].results):
        point[res.maybe_downcast().position] = idx[t]
    return point if all(p is not None for i, p in enumerate(point) if i != c.k) else None


def reductions_read(v: ir.Value, idx: Index, twin: Twin, n_dims: int) -> list[tuple[ir.Value, Index]]:
    """The results of reductions (and contractions) that computing ``v`` at ``idx`` reads,
    with their indices, through views and pointwise ops."""
    trees = _Trees(twin, n_dims, v.context)
    tree = trees.tensor(v, idx)
    return [trees.reads[t[1]] for t in _leaves(tree) if t[0] == "red"]


def generic_twin(op: ir.Operation) -> ir.Operation | None:
    """The twin function of a generalized function: a generic is its own twin."""
    return op if op.name == "linalg.generic" else None


def _is_cast(t: Tree) -> bool:
    return t[0] == "op" and t[1] in _CASTS


def _uncast(t: Tree) -> Tree:
    """``t`` without the float casts (extf, truncf) on top."""
    while _is_cast(t):
        t = t[3]
    return t


def _is_op(t: Tree, name: str) -> bool:
    return t[0] == "op" and t[1] == name


def _cast_result_type(pv_op: ir.Operation) -> ir.Type:
    return ir.ShapedType(pv_op.operands[0].type).element_type


def _normalization(p: Tree, trees: _Trees) -> tuple[Tree, Tree] | None:
    """(E, read of the row sum) when ``p`` is ``E / L`` or ``E * (1 / L)``."""
    if _is_op(p, "arith.divf") and _uncast(p[4])[0] == "red":
        return p[3], p[4]
    if _is_op(p, "arith.mulf"):
        for e, r in ((p[3], p[4]), (p[4], p[3])):
            r = _uncast(r)
            if _is_op(r, "arith.divf") and r[3][0] == "const" and _uncast(r[4])[0] == "red":
                if _float(trees.consts[r[3][1]]) == 1.0:
                    return e, r[4]
    return None


def _row_reduction(trees: _Trees, read: Tree, key: ir.AffineExpr, combiners: tuple[str, ...]):
    """For a read of a reduction's result: (its element tree at the read's row with the
    reduced loop at ``key``, (the reduced tensor and its index, or (None, None) when the
    element is computed), the reduced extent); None unless it is a single-loop row
    reduction folding with one of ``combiners``."""
    value, idx = trees.reads[read[1]]
    op = op_of(value)
    twin = trees.twin(op) if op is not None else None
    if twin is None or len(twin.results) != 1:
        return None
    its = iterators_of(twin)
    reduced = [i for i, it in enumerate(its) if it == "reduction"]
    if len(reduced) != 1:
        return None
    maps = maps_of(twin)
    n_in = n_inputs(twin)
    point: list = [None] * len(its)
    for t, res in enumerate(maps[n_in].results):
        res = res.maybe_downcast()
        if isinstance(res, ir.AffineConstantExpr):  # a kept unit dim (keepdim)
            continue
        if not isinstance(res, ir.AffineDimExpr):
            return None
        point[res.position] = idx[t]
    if sum(p is None for p in point) != 1 or point[reduced[0]] is not None:
        return None
    point[reduced[0]] = key
    block = twin.regions[0].blocks[0]
    acc = block.arguments[n_in]
    comb = op_of([o.operation for o in block.operations][-1].operands[0])
    if comb is None or comb.name not in combiners or acc not in list(comb.operands):
        return None
    operands = list(comb.operands)
    elem = operands[1 - operands.index(acc)]
    if elem == acc:
        return None
    tree = trees.payload(op, twin, point, elem, acc)
    if ("acc",) in _leaves(tree) or ("acc",) == tree:
        return None
    trees.visited[op] = None
    tensor = (None, None)
    if isinstance(elem.owner, ir.Block) and ir.BlockArgument(elem).arg_number < n_in:
        j = ir.BlockArgument(elem).arg_number
        tensor = (op.operands[j], compose(maps[j], point, trees.n_dims, trees.ctx))
    extent = 0
    for value_, amap in zip(op.operands, maps):
        for size, res in zip(ir.ShapedType(value_.type).shape, amap.results):
            res = res.maybe_downcast()
            if isinstance(res, ir.AffineDimExpr) and res.position == reduced[0]:
                extent = size
    return tree, tensor, extent


def _leaves(t: Tree):
    if t[0] == "op":
        for c in t[3:]:
            yield from _leaves(c)
    else:
        yield t
