"""Attention groups on the CPU, the fast path: query tiles on the threads, both products on
the packed micro-kernel (:mod:`opfuse.backends.cpu.matmul`), the softmax vectorized.

Per (batch·head, tile of ``bm`` query rows) — a *unit* — with every buffer a slice of a
per-thread workspace planned once per program (:mod:`opfuse.backends.cpu.buffers`)::

    K and V of the unit's (batch, head) packed into the micro-kernel's f32 panels
        (K as the B of Q·Kᵀ, i.e. Kᵀ; V as the B of P·V), once per head, not per tile
    Qt = Q[m0 : m0 + bm, :] (f32)
    S  = Qt · Kᵀ[:, :kend]               micro-kernel; kend = N, or the causal bound of
                                          the tile (key blocks above the diagonal skipped)
    S  = X(S)                             the graph's own scale and masks, pointwise
    P  = exp(S - rowmax) (rounded to P's type), l = rowsum(P)     vector loops (an exp
                                          for x <= 0: cpu_math's exp_le0)
    Ot = P · V                            micro-kernel
    O[m0 + i, :] = Ot[i, :] / l_i         (0 where l_i = 0: every key masked, like SDPA)

S is one tile of full rows (``bm`` x N), never the whole bh x M x N: the row softmax runs
once over keys in cache, without the online softmax's rescaling (measured against the
online form: see the notes of issue #13; the two products dominate either way and full
rows let them run with the whole key length as N and K). Units are split into one
contiguous range per thread (``scf.forall`` over threads: the threads of
:mod:`opfuse.backends.cpu.threads`); a thread re-packs K and V only when its next unit is
another head, so each thread's workspace (its slice ``t``) is private and allocated once.
Every unit computes the same way whatever the thread count: results do not depend on it.

Loads of Q, K, V, the scores ``X`` and the outputs go through the evaluator the other
attention kernels use (:mod:`opfuse.backends.gpu.build.attention_plan`): views, grouped-query broadcasts, masks,
element types mean the same. The fixed parts (the products, the softmax) are MLIR text
generated here. A group whose per-thread workspace would exceed :data:`WORKSPACE_LIMIT`
keeps the one-row loops of :mod:`opfuse.backends.cpu.attention` (the caller says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, memref, scf
from mlir.dialects import func as func_d

from ...analysis.indexing import delinearize, numel
from ..gpu.build.attention_plan import (
    AttentionEvaluator,
    Plan,
    at,
    binary,
    elem_type,
    from_f32,
    key_bound,
    to_f32,
)
from . import math as cpu_math
from .matmul import Blocking, blocking, mm_text
from ..gpu.build.evaluate import Val
from ..gpu.build.group import Group
from ..gpu.build.kernel import KernelBuilder

#: Most query rows per unit (a multiple of the micro-kernel's rows).
BLOCK_M = 96

#: Largest per-thread workspace (bytes) of the fast path.
WORKSPACE_LIMIT = 64 << 20

_PREFIX = "__opfuse_att_"
_PANELS = "att"  # the micro-kernel variant with explicit panel offset and stride
_FLAT = "memref<?xf32>"
_VIEW = "memref<?x?xf32, strided<[?, ?], offset: ?>>"


def _fdiv(e: ir.AffineExpr, n: int) -> ir.AffineExpr:
    return ir.AffineExpr.get_floor_div(e, ir.AffineConstantExpr.get(n, e.context))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Tiling:
    """Sizes of one attention group's fast path (elements are f32).

    Attributes:
        threads: workers (contiguous ranges of units); bh: batch x heads.
        bm: query rows per unit; tiles: units per head.
        lds: row stride of the score tile (keys rounded up to the vector width).
        sizes: per-thread elements of each workspace buffer, by name.
    """

    threads: int
    bh: int
    bm: int
    tiles: int
    lds: int
    sizes: dict

    @property
    def units(self) -> int:
        return self.bh * self.tiles

    @property
    def bytes_per_thread(self) -> int:
        return 4 * sum(self.sizes.values())


def tiling(p: Plan, threads: int, b: Blocking | None = None) -> Tiling:
    """The fast path's sizes for ``p`` on ``threads`` threads."""
    b = b or blocking()
    att = p.att
    m, n, d, dv = att.queries, att.keys, att.head_dim, att.value_dim
    bh = max(1, numel(att.batch))
    tiles = -(-m // BLOCK_M)
    bm = min(_round_up(-(-m // tiles), b.mr), _round_up(BLOCK_M, b.mr))
    lds = _round_up(n, b.lanes)
    sizes = {
        "kp": _round_up(n, b.nr) * d,  # Kᵀ: ceil(N / nr) panels of D x nr
        "vp": _round_up(dv, b.nr) * n,  # V: ceil(Dv / nr) panels of N x nr
        "q": bm * d,
        "s": bm * lds,
        "o": bm * dv,
        "l": _round_up(bm, b.lanes),
    }
    units = bh * tiles
    return Tiling(max(1, min(threads, units)), bh, bm, tiles, lds, sizes)


def helper_texts(p: Plan, b: Blocking | None = None) -> dict[str, str]:
    """The fixed functions the fast path of ``p`` calls, by name (MLIR text)."""
    b = b or blocking()
    ptype = str(p.att.probs_type) if p.att.probs_type is not None else "f32"
    return {
        f"mm_{_PANELS}": mm_text("f32", "f32", b, panels=_PANELS),
        "scores": _products_text("scores", b),
        "pv": _products_text("pv", b),
        f"softmax_{ptype}": _softmax_text(ptype, b),
        "exp": cpu_math.helper_text("exp_le0", f"vector<{b.lanes}xf32>"),
    }


def _mm_name() -> str:
    return f"__opfuse_mm_{_PANELS}_f32_f32"


def _view(name: str, src: str, off: str, rows: str, cols: str, ld: str) -> str:
    """``name``: a rows x cols view of flat ``src`` at ``off`` with row stride ``ld``."""
    return (f"  {name}s = memref.reinterpret_cast {src} to offset: [{off}], sizes: [{rows}, {cols}],"
            f" strides: [{ld}, 1] : {_FLAT} to memref<?x?xf32, strided<[?, 1], offset: ?>>\n"
            f"  {name} = memref.cast {name}s : memref<?x?xf32, strided<[?, 1], offset: ?>> to {_VIEW}\n")


def _products_text(which: str, b: Blocking) -> str:
    """``@__opfuse_att_scores(Q, qoff, rows, D, Kp, kpoff, S, soff, kend, lds)``: S[:rows,
    :kend] = Qt · Kᵀ; ``@__opfuse_att_pv(S, soff, rows, kend, lds, Vp, vpoff, vstride, O,
    ooff, dv)``: O[:rows, :dv] = P · V (panels ``vstride`` apart: packed for every key)."""
    if which == "scores":
        sig = (f"%a: {_FLAT}, %aoff: index, %rows: index, %k: index, %bp: {_FLAT}, %boff: index, "
               f"%c: {_FLAT}, %coff: index, %n: index, %ldc: index")
        lda, stride = "%k", f"%stride = arith.muli %k, %cNR : index"
    else:
        sig = (f"%a: {_FLAT}, %aoff: index, %rows: index, %k: index, %lda: index, %bp: {_FLAT}, "
               f"%boff: index, %stride: index, %c: {_FLAT}, %coff: index, %n: index")
        lda, stride = "%lda", ""
    ldc = "%ldc" if which == "scores" else "%n"
    return (
        f"func.func private @{_PREFIX}{which}({sig}) {{\n"
        "  %c0 = arith.constant 0 : index\n  %c1 = arith.constant 1 : index\n"
        f"  %cNR = arith.constant {b.nr} : index\n  %zero = arith.constant 0.0 : f32\n"
        f"  {stride}\n"
        + _view("%A", "%a", "%aoff", "%rows", "%k", lda)
        + _view("%C", "%c", "%coff", "%rows", "%n", ldc)
        + "  scf.for %i = %c0 to %rows step %c1 {\n"
        "    scf.for %j = %c0 to %n step %c1 {\n"
        f"      memref.store %zero, %C[%i, %j] : {_VIEW}\n"
        "    }\n  }\n"
        f"  func.call @{_mm_name()}(%A, %bp, %boff, %stride, %C) : ({_VIEW}, {_FLAT}, index, index, "
        f"{_VIEW}) -> ()\n"
        "  return\n}\n"
    )


def _softmax_text(ptype: str, b: Blocking) -> str:
    """``@__opfuse_att_softmax_<p>(S, soff, rows, n, lds, L, loff)``: each row of S[:rows,
    :n] becomes exp(x - max) (rounded to ``ptype`` as P·V reads it), L[loff + i] =
    1 / sum (0 when every score is -inf). Vectors of the host's width, the tail masked
    (its lanes read -inf: exp gives 0); exp is cpu_math's ``exp_le0`` (x - max <= 0)."""
    vl = b.lanes
    vf, vm = f"vector<{vl}xf32>", f"vector<{vl}xi1>"
    rnd = ""
    value = "%e"
    if ptype != "f32":
        rnd = (f"        %eh = arith.truncf %e : {vf} to vector<{vl}x{ptype}>\n"
               f"        %er = arith.extf %eh : vector<{vl}x{ptype}> to {vf}\n")
        value = "%er"
    return f"""
func.func private @{_PREFIX}softmax_{ptype}(%s: {_FLAT}, %soff: index, %rows: index, %n: index, %lds: index, %l: {_FLAT}, %loff: index) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cVL = arith.constant {vl} : index
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %vninf = arith.constant dense<0xFF800000> : {vf}
  %vzero = arith.constant dense<0.0> : {vf}
  scf.for %i = %c0 to %rows step %c1 {{
    %ro = arith.muli %i, %lds : index
    %row = arith.addi %soff, %ro : index
    %mx = scf.for %j = %c0 to %n step %cVL iter_args(%acc = %vninf) -> ({vf}) {{
      %left = arith.subi %n, %j : index
      %mask = vector.create_mask %left : {vm}
      %o = arith.addi %row, %j : index
      %x = vector.maskedload %s[%o], %mask, %vninf : {_FLAT}, {vm}, {vf} into {vf}
      %a = arith.maximumf %acc, %x : {vf}
      scf.yield %a : {vf}
    }}
    %m = vector.reduction <maximumf>, %mx : {vf} into f32
    %dead = arith.cmpf oeq, %m, %ninf : f32
    %mu = arith.select %dead, %zero, %m : f32
    %vmu = vector.broadcast %mu : f32 to {vf}
    %sm = scf.for %j = %c0 to %n step %cVL iter_args(%acc = %vzero) -> ({vf}) {{
      %left = arith.subi %n, %j : index
      %mask = vector.create_mask %left : {vm}
      %o = arith.addi %row, %j : index
      %x = vector.maskedload %s[%o], %mask, %vninf : {_FLAT}, {vm}, {vf} into {vf}
      %d = arith.subf %x, %vmu : {vf}
      %e = func.call @{cpu_math.helper_name("exp_le0", vf)}(%d) : ({vf}) -> {vf}
{rnd}      vector.maskedstore %s[%o], %mask, {value} : {_FLAT}, {vm}, {vf}
      %a = arith.addf %acc, {value} : {vf}
      scf.yield %a : {vf}
    }}
    %sum = vector.reduction <add>, %sm : {vf} into f32
    %live = arith.cmpf ogt, %sum, %zero : f32
    %inv = arith.divf %one, %sum : f32
    %r = arith.select %live, %inv, %zero : f32
    %lo = arith.addi %loff, %i : index
    memref.store %r, %l[%lo] : {_FLAT}
  }}
  return
}}
"""


class Tiles:
    """The fast path's code for one attention group (module docstring), emitted into an
    empty function body by ``kb`` (the caller made the buffers and the return)."""

    def __init__(self, kb: KernelBuilder, group: Group, p: Plan, t: Tiling):
        self.kb, self.group, self.p, self.att, self.t = kb, group, p, p.att, t
        self.ev = AttentionEvaluator(kb, group.func, group.leaves(kb.params))
        self.f32 = ir.F32Type.get(kb.ctx)
        self.batch: list[ir.AffineExpr] = []
        self.off: dict[str, ir.AffineExpr] = {}

    # ----- small helpers ---------------------------------------------------------------
    def _at(self, exprs, **roles):
        return at(self.kb, self.att, exprs, roles, self.batch)

    def _load(self, value, exprs, **roles) -> ir.Value:
        return to_f32(self.kb, self.ev.value(value, self._at(exprs, **roles)).ssa)

    def _loop(self, ub, body, lb=0):
        kb = self.kb
        lb = kb.index(lb) if isinstance(lb, int) else lb
        ub = kb.index(ub) if isinstance(ub, int) else ub
        kb.for_(lb, ub, kb.index(1), [], lambda iv, _: (body(kb.add_dim(iv)), [])[1])

    def _store(self, buf: str, e: ir.AffineExpr, x: ir.Value) -> None:
        with self.kb.emitting():
            memref.store(x, self.ws[buf], [self.kb.apply(self.off[buf] + e)])

    def _read(self, buf: str, e: ir.AffineExpr) -> ir.Value:
        with self.kb.emitting():
            return memref.load(self.ws[buf], [self.kb.apply(self.off[buf] + e)])

    def _call(self, name: str, args: list) -> None:
        kb = self.kb
        vals = [kb.apply(a) if isinstance(a, ir.AffineExpr) else
                kb.index(a) if isinstance(a, int) else a for a in args]
        with kb.emitting():
            func_d.CallOp([], name, vals)

    # ----- the code --------------------------------------------------------------------
    def emit(self) -> None:
        kb, t = self.kb, self.t
        self.ws = {}
        with kb.ctx, kb._top, ir.Location.unknown(kb.ctx):
            flat = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()], self.f32)
            for name, size in t.sizes.items():
                buf = memref.AllocOp(ir.MemRefType.get([t.threads * size], self.f32), [], [])
                self.ws[name] = memref.cast(flat, buf.result)
        with kb.emitting():
            loop = scf.ForallOp([0], [t.threads], [1])
            term = loop.terminator()
        with kb.at(ir.InsertionPoint(term)):
            w = kb.add_dim(loop.induction_variables[0])
            self.off = {name: w * size for name, size in t.sizes.items()}
            u0 = kb.apply(_fdiv(w * t.units, t.threads))
            u1 = kb.apply(_fdiv((w + 1) * t.units, t.threads))
            kb.for_(u0, u1, kb.index(1), [kb.index(t.bh)], self._unit)

    def _unit(self, iv, state) -> list[ir.Value]:
        kb, att, t = self.kb, self.att, self.t
        (packed,) = state
        u = kb.add_dim(iv)
        bh = kb.apply(_fdiv(u, t.tiles))
        g = kb.add_dim(bh)
        self.batch = delinearize(g, list(att.batch)) if att.batch else []
        with kb.emitting():
            fresh = arith.cmpi(arith.CmpIPredicate.ne, bh, packed)
        with kb.if_(fresh):
            self._pack()
        m0 = (u % t.tiles) * t.bm
        rows = kb.min_index(kb.index(t.bm), kb.apply(m0 * -1 + att.queries))
        kend = key_bound(kb, att.causal, m0, t.bm, att.keys)
        d, dv = att.head_dim, att.value_dim

        def q_row(i):
            self._loop(d, lambda h: self._store(
                "q", i * d + h, self._load(att.q, att.q_idx, m=m0 + i, head=h)))

        self._loop(rows, q_row)
        ws, off = self.ws, self.off
        self._call(f"{_PREFIX}scores", [ws["q"], off["q"], rows, d, ws["kp"], off["kp"],
                                        ws["s"], off["s"], kend, t.lds])
        self._loop(rows, lambda i: self._loop(kend, lambda j: self._score(i, j, m0)))
        ptype = str(att.probs_type) if att.probs_type is not None else "f32"
        self._call(f"{_PREFIX}softmax_{ptype}", [ws["s"], off["s"], rows, kend, t.lds,
                                                 ws["l"], off["l"]])
        self._call(f"{_PREFIX}pv", [ws["s"], off["s"], rows, kend, t.lds, ws["vp"], off["vp"],
                                    att.keys * blocking().nr, ws["o"], off["o"], dv])
        self._loop(rows, lambda i: self._write_row(i, m0))
        return [bh]

    def _pack(self) -> None:
        """K and V of the current (batch, head) into the micro-kernel's panels:
        ``kp[(n / nr) * D * nr + h * nr + n % nr] = K[n, h]``,
        ``vp[(c / nr) * N * nr + n * nr + c % nr] = V[n, c]``."""
        att, nr = self.att, blocking().nr
        d, n = att.head_dim, att.keys

        def k_row(key):
            self._loop(d, lambda h: self._store(
                "kp", _fdiv(key, nr) * (d * nr) + h * nr + key % nr,
                self._load(att.k, att.k_idx, k=key, head=h)))

        def v_row(key):
            self._loop(att.value_dim, lambda c: self._store(
                "vp", _fdiv(c, nr) * (n * nr) + key * nr + c % nr,
                self._load(att.v, att.v_idx, k=key, n=c)))

        self._loop(n, k_row)
        self._loop(n, v_row)

    def _score(self, i, j, m0) -> None:
        """S[i, j] = X(S[i, j]) at query m0 + i, key j: the graph's scale and masks."""
        kb, att = self.kb, self.att
        s = self._read("s", i * self.t.lds + j)
        self.ev.held = {att.s: Val(from_f32(kb, s, elem_type(att.s)), True)}
        x = to_f32(kb, self.ev.value(att.score, self._at(att.score_idx, m=m0 + i, k=j)).ssa)
        self.ev.held = {}
        self._store("s", i * self.t.lds + j, x)

    def _write_row(self, i, m0) -> None:
        """O[m0 + i, :] = Ot[i, :] / l_i through the group's outputs."""
        kb, p = self.kb, self.p
        inv = self._read("l", i)

        def column(c):
            o = binary(kb, "arith.mulf", self._read("o", i * self.att.value_dim + c), inv)
            self.ev.held = {p.o: Val(from_f32(kb, o, elem_type(p.o)), True)}
            for out, o_idx in p.outputs:
                idx = self._at(o_idx, m=m0 + i, n=c)
                leaf = self.group.output_leaf(out, self.group.result_param(kb.params, out.index))
                self.ev.store(leaf, idx, self.ev.value(out.value, idx))
            self.ev.held = {}

        self._loop(self.att.value_dim, column)


__all__ = ["BLOCK_M", "WORKSPACE_LIMIT", "Tiles", "Tiling", "helper_texts", "tiling"]
