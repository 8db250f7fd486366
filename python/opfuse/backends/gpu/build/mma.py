"""Warp-level tensor-core MMA: the building block of the matmul and attention kernels.

One warp multiplies a ``16 x k`` tile of A by a ``k x 8`` tile of B into a ``16 x 8`` tile
of f32 accumulators with one ``mma.sync.aligned`` instruction: ``m16n8k16`` for f16 and
bf16 operands, ``m16n8k8`` for f32 operands rounded to TF32 (only where the user allowed
it: ``allow_tf32``). Operands come from shared memory, 8x8 matrices at a time through
``ldmatrix`` (``nvgpu.ldmatrix``; ``.trans`` when the tile is stored the other way round),
or element by element where ``ldmatrix`` cannot transpose (32-bit elements stored along
M or N). Every fragment is placed exactly as the PTX ISA's tables place it
("Matrix Fragments for mma.m16n8k16 / mma.m16n8k8", section 9.7.14.5): :data:`A_LAYOUT`,
:data:`B_LAYOUT`, :data:`C_LAYOUT` give, per kind, the (row, col) of each element a lane
holds, as functions of ``groupID = lane >> 2`` and ``threadID_in_group = lane % 4``.

Usage (inside a :class:`~opfuse.backends.gpu.build.kernel.KernelBuilder`, in a warp-uniform region):

    kind = mma.kind_for(a_type, b_type, allow_tf32=False)   # None: no tensor-core path
    warp = mma.Warp(kb, kind, lane)            # lane: affine expr of the lane id (tid mod 32)
    a = warp.load_a(tile_a, row0, k0)          # A[row0 : row0+16, k0 : k0+kind.k]
    b0, b1 = warp.load_b(tile_b, col0, k0, 2)  # B[k0 : k0+k, col0 : col0+16], two 8-col tiles
    acc = warp.zeros()                         # or warp.accumulator(values)
    acc = warp.mma(a, b0, acc)
    for (row, col), pair in warp.pairs(acc):   # accumulator pairs: D[row, col], D[row, col+1]
        ...                                    # (the epilogue: evaluate and store them)
    p = warp.a_from_acc(acc0, acc1)            # two 16x8 accumulators as one 16x16 A
                                               # fragment (FlashAttention's P @ V)

``row0``/``col0``/``k0`` are affine expressions over the kernel's dims (warp-uniform), the
``(row, col)`` of :meth:`Warp.pairs` affine expressions of the lane added to the tile
origin. Fragments are plain tuples of SSA values (the mma instruction's registers:
``vector<2xf16>`` for f16, ``i32`` for bf16 and tf32), accumulators tuples of four ``f32``
values, so loops carry them as ``scf.for`` iter_args.

The operations: ``nvgpu.ldmatrix`` (lowers to ``ldmatrix.sync.aligned.m8n8.x{1,2,4}``) and
``nvvm.mma.sync`` (``mma.sync.aligned.m16n8k{16,8}.row.col.f32.<t>.<t>.f32``): the
``nvgpu.mma.sync`` lowering of MLIR 22 cannot type bf16 operands, so the NVVM op, whose
operand PTX types are explicit, is used for all three kinds. TF32 operands are rounded with
``cvt.rna.tf32.f32`` (``nvvm.convert.float.to.tf32``), as cuBLAS does for PyTorch's
``allow_tf32``.

Shared-memory layouts without bank conflicts: :func:`padded_ld` pads every row so that the
eight 16-byte rows one ``ldmatrix`` phase reads fall in eight different bank groups;
:func:`shared_ld` picks it, or the stride that element loads of TF32 fragments need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from mlir import ir
from mlir.dialects import arith, memref, vector

from .kernel import KernelBuilder, element_bytes

WARP = 32
#: Bytes of shared memory one bank-cycle serves (32 banks of 4 bytes).
BANK_BYTES = 128
#: Bytes of one ldmatrix row (eight 16-bit elements) and of one cp.async chunk.
ROW_BYTES = 16

Coord = Callable[[object, object, int], object]  # (groupID, threadID_in_group, i) -> index


@dataclass(frozen=True)
class MmaKind:
    """One ``mma.sync`` shape and operand type.

    Attributes:
        name: ``f16``, ``bf16`` or ``tf32``.
        element: MLIR element type of the operands in memory (``f16``, ``bf16``, ``f32``).
        m, n, k: the instruction's shape (16, 8, 16 or 8).
        a_regs, b_regs: registers per lane of the A and B fragments (4 and 2 for all three).
        per_reg: operand elements per register (2 for 16-bit types, 1 for tf32).
    """

    name: str
    element: str
    m: int
    n: int
    k: int
    a_regs: int = 4
    b_regs: int = 2

    @property
    def per_reg(self) -> int:
        return 1 if self.name == "tf32" else 2

    @property
    def element_bytes(self) -> int:
        return 4 if self.name == "tf32" else 2

    @property
    def ptx(self) -> str:
        """The instruction, as it appears in the PTX."""
        return f"mma.sync.aligned.m{self.m}n{self.n}k{self.k}.row.col.f32.{self.name}.{self.name}.f32"


KINDS = {
    "f16": MmaKind("f16", "f16", 16, 8, 16),
    "bf16": MmaKind("bf16", "bf16", 16, 8, 16),
    "tf32": MmaKind("tf32", "f32", 16, 8, 8),
}


def kind_for(a_type: ir.Type, b_type: ir.Type, *, allow_tf32: bool) -> MmaKind | None:
    """The MMA kind for operands of these element types, or None (SIMT only)."""
    a, b = str(a_type), str(b_type)
    if a != b:
        return None
    if a in ("f16", "bf16"):
        return KINDS[a]
    if a == "f32" and allow_tf32:
        return KINDS["tf32"]
    return None


# ----- fragment layouts (PTX ISA 9.7.14.5.7 / 9.7.14.5.8) ------------------------------
# Per kind: for element i of the fragment (elements numbered low to high across the
# lane's registers, ``per_reg`` to a register), its (row, col) in the operand tile, from
# g = groupID = lane >> 2 and t = threadID_in_group = lane % 4. A is m x k, B is k x n
# (row = k), C/D is m x n.


def _a16(g, t, i):  # m16n8k16 .f16/.bf16, a0..a7
    row = g if i in (0, 1, 4, 5) else g + 8
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def _b16(g, t, i):  # m16n8k16 .f16/.bf16, b0..b3
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def _a_tf32(g, t, i):  # m16n8k8 .tf32, a0..a3
    return (g if i in (0, 2) else g + 8), (t if i in (0, 1) else t + 4)


def _b_tf32(g, t, i):  # m16n8k8 .tf32, b0, b1
    return (t if i == 0 else t + 4), g


def _c(g, t, i):  # .f32 accumulators of m16n8k16 and m16n8k8, c0..c3
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


A_LAYOUT: dict[str, Coord] = {"f16": _a16, "bf16": _a16, "tf32": _a_tf32}
B_LAYOUT: dict[str, Coord] = {"f16": _b16, "bf16": _b16, "tf32": _b_tf32}
C_LAYOUT: Coord = _c


def padded_ld(row_elems: int, elem_bytes: int) -> int:
    """Elements per shared-memory row for rows of ``row_elems`` elements: the row rounded
    up to 16 bytes, plus 16 bytes of padding where needed so that the row stride is an odd
    multiple of 16 bytes modulo 128. Eight consecutive rows (one ``ldmatrix`` phase, or
    eight lanes reading one 16-byte chunk each) then cover all 32 banks once."""
    per16 = ROW_BYTES // elem_bytes
    ld = -(-row_elems // per16) * per16
    while (ld * elem_bytes // ROW_BYTES) % 2 == 0:
        ld += per16
    return ld


def shared_ld(row_elems: int, kind: "MmaKind", k_contiguous: bool) -> int:
    """Elements per shared row of an operand tile this kind reads: :func:`padded_ld` where
    ldmatrix reads it; for the element loads of TF32 tiles stored along M/N (lane ``l``
    reads row ``k = l % 4`` (+4), column ``l / 4``) a stride of 8 banks modulo 32, so the
    four rows x eight columns a warp reads fall in 32 different banks."""
    if kind.per_reg == 2 or k_contiguous:
        return padded_ld(row_elems, kind.element_bytes)
    ld = -(-row_elems // 4) * 4  # rows stay 16-byte aligned for cp.async
    while ld % 32 != 8:
        ld += 4
    return ld


def conflict_free(ld: int, elem_bytes: int) -> bool:
    """Eight rows at stride ``ld`` (16 bytes read from each, at one column) touch eight
    different 16-byte bank groups."""
    slots = {((r * ld * elem_bytes) % BANK_BYTES) // ROW_BYTES for r in range(8)}
    return len(slots) == 8


@dataclass(frozen=True)
class SharedTile:
    """An operand tile in shared memory.

    Element ``(i, k)`` (``i`` along M for A, along N for B) is at ``base + i * ld + k``
    when ``k_contiguous`` (K runs along each shared row), else at ``base + k * ld + i``.

    Attributes:
        smem: the workgroup buffer (a flat ``memref<N x T, 3>``).
        ld: elements per shared row (:func:`padded_ld`).
        k_contiguous: the layout (see above).
        base: element offset of the tile (an affine expression: a pipeline stage).
    """

    smem: ir.Value
    ld: int
    k_contiguous: bool
    base: ir.AffineExpr

    def offset(self, i, k) -> ir.AffineExpr:
        return self.base + (i * self.ld + k if self.k_contiguous else k * self.ld + i)


class Warp:
    """The MMA operations of one warp in the kernel being built.

    Args:
        kb: the kernel.
        kind: the MMA kind (:func:`kind_for`).
        lane: the lane id as an affine expression over ``kb``'s dims (``tid mod 32``).
    """

    def __init__(self, kb: KernelBuilder, kind: MmaKind, lane: ir.AffineExpr):
        self.kb = kb
        self.kind = kind
        self.lane = lane
        self.g = _div(lane, 4)
        self.t = _mod(lane, 4)
        ctx = kb.ctx
        self._f32 = ir.F32Type.get(ctx)
        self._i32 = ir.IntegerType.get_signless(32, ctx)
        self._elem = ir.Type.parse(kind.element, ctx)
        self._acc_struct = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>", ctx)

    # ----- operands ----------------------------------------------------------------------
    def load_a(self, tile: SharedTile, row0, k0) -> tuple:
        """The A fragment of ``A[row0 : row0 + 16, k0 : k0 + k]``."""
        kind = self.kind
        if kind.per_reg == 2 or tile.k_contiguous:
            # four 8x8 matrices, register j: rows +8 if j is odd, cols +8 (tf32: +4) if j >= 2
            kstep = 8 if kind.per_reg == 2 else 4
            return self._ldmatrix(tile, 4, lambda j: (row0 + _mod(j, 2) * 8, k0 + _div(j, 2) * kstep))
        return self._scalar(tile, A_LAYOUT[kind.name], row0, k0, kind.a_regs, a_operand=True)

    def load_b(self, tile: SharedTile, col0, k0, tiles: int = 1) -> list[tuple]:
        """The B fragments of ``B[k0 : k0 + k, col0 + 8j : col0 + 8j + 8]``, j < ``tiles``
        (1, or 2: one ``ldmatrix.x4`` loads two 8-column tiles)."""
        assert tiles in (1, 2)
        kind = self.kind
        if kind.per_reg == 2 or tile.k_contiguous:
            kstep = 8 if kind.per_reg == 2 else 4
            # matrix j: tile j // 2, register j % 2 (k +8, tf32: +4)
            regs = self._ldmatrix(
                tile, 2 * tiles, lambda j: (col0 + _div(j, 2) * 8, k0 + _mod(j, 2) * kstep)
            )
            return [regs[2 * j : 2 * j + 2] for j in range(tiles)]
        return [
            self._scalar(tile, B_LAYOUT[kind.name], col0 + 8 * j, k0, kind.b_regs, a_operand=False)
            for j in range(tiles)
        ]

    def _ldmatrix(self, tile: SharedTile, count: int, origin) -> tuple:
        """``count`` 8x8 matrices (of 16-bit elements, or 8x4 of 32-bit ones) in one
        ``ldmatrix``: matrix ``j`` starts at operand coordinates ``origin(j) = (i, k)``
        (``j`` an affine expression); lane ``l`` gives the address of row ``l % 8`` of
        matrix ``l // 8`` (lanes past ``8 * count`` are ignored by the instruction). A tile
        stored along K is read as is (its rows run along i), one stored along i with
        ``.trans`` (its rows run along k)."""
        kb, kind = self.kb, self.kind
        j = _mod(_div(self.lane, 8), count)
        r = _mod(self.lane, 8)
        i0, k0 = origin(j)
        addr = tile.offset(i0 + r, k0) if tile.k_contiguous else tile.offset(i0, k0 + r)
        idx = kb.apply(addr)
        vt = ir.VectorType.get([count, kind.per_reg], self._elem, loc=ir.Location.unknown(kb.ctx))
        attrs = {
            "numTiles": ir.IntegerAttr.get(self._i32, count),
            "transpose": ir.BoolAttr.get(not tile.k_contiguous),
        }
        loaded = kb.create("nvgpu.ldmatrix", [vt], [tile.smem, idx], attrs).results[0]
        return tuple(self._pack_row(loaded, m) for m in range(count))

    def _pack_row(self, frag: ir.Value, m: int) -> ir.Value:
        """Register ``m`` of an ldmatrix result as the mma instruction's operand."""
        kb, kind = self.kb, self.kind
        with kb.emitting():
            row = vector.extract(frag, [], [m])  # vector<per x elem>
            if kind.name == "f16":
                return row
            if kind.name == "bf16":
                bits = vector.bitcast(ir.VectorType.get([1], self._i32), row)
                return vector.extract(bits, [], [0])
            x = vector.extract(row, [], [0])
        return self._tf32(x)

    def _scalar(self, tile: SharedTile, layout: Coord, i0, k0, regs: int, a_operand: bool):
        """A fragment read element by element from shared memory, each element where the
        PTX table puts it (for layouts ``ldmatrix`` cannot transpose)."""
        kb, kind = self.kb, self.kind
        out = []
        for reg in range(regs):
            elems = []
            for e in range(kind.per_reg):
                row, col = layout(self.g, self.t, reg * kind.per_reg + e)
                i, k = (row, col) if a_operand else (col, row)
                idx = kb.apply(tile.offset(i0 + i, k0 + k))
                with kb.emitting():
                    elems.append(memref.load(tile.smem, [idx]))
            out.append(self._pack(elems))
        return tuple(out)

    def _pack(self, elems: Sequence[ir.Value]) -> ir.Value:
        """Operand elements of one register (their element type) as the register."""
        kb, kind = self.kb, self.kind
        if kind.name == "tf32":
            return self._tf32(elems[0])
        with kb.emitting():
            row = vector.from_elements(ir.VectorType.get([2], self._elem), list(elems))
            if kind.name == "f16":
                return row
            bits = vector.bitcast(ir.VectorType.get([1], self._i32), row)
            return vector.extract(bits, [], [0])

    def _tf32(self, x: ir.Value) -> ir.Value:
        """``cvt.rna.tf32.f32``: an f32 rounded to TF32 (nearest, ties away), as bits."""
        rna = ir.Attribute.parse("#nvvm.fp_rnd_mode<rna>", self.kb.ctx)
        return self.kb.create("nvvm.convert.float.to.tf32", [self._i32], [x], {"rnd": rna}).results[0]

    # ----- accumulators ------------------------------------------------------------------
    def zeros(self) -> tuple:
        zero = self.kb.const(self._f32, 0.0)
        return (zero,) * 4

    def accumulator(self, values: Sequence[ir.Value]) -> tuple:
        """Four f32 values (c0..c3, placed as :meth:`coords` says) as an accumulator."""
        assert len(values) == 4
        return tuple(values)

    def mma(self, a: tuple, b: tuple, acc: tuple) -> tuple:
        """``D = A B + C`` on one 16x8 tile; returns D (four f32 values)."""
        kb, kind = self.kb, self.kind
        ctx = kb.ctx
        ptx_type = ir.Attribute.parse(f"#nvvm.mma_type<{kind.name}>", ctx)
        attrs = {
            "layoutA": ir.Attribute.parse("#nvvm.mma_layout<row>", ctx),
            "layoutB": ir.Attribute.parse("#nvvm.mma_layout<col>", ctx),
            "multiplicandAPtxType": ptx_type,
            "multiplicandBPtxType": ptx_type,
            "shape": ir.Attribute.parse(f"#nvvm.shape<m = 16, n = 8, k = {kind.k}>", ctx),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(a), len(b), len(acc)], ctx),
        }
        d = kb.create("nvvm.mma.sync", [self._acc_struct], [*a, *b, *acc], attrs).results[0]
        out = []
        for i in range(4):
            pos = ir.DenseI64ArrayAttr.get([i], ctx)
            out.append(kb.create("llvm.extractvalue", [self._f32], [d], {"position": pos}).results[0])
        return tuple(out)

    def coords(self) -> list[tuple[ir.AffineExpr, ir.AffineExpr]]:
        """(row, col) in the 16x8 tile of each accumulator element c0..c3 of this lane."""
        return [C_LAYOUT(self.g, self.t, i) for i in range(4)]

    def pairs(self, acc: tuple, row0=0, col0=0) -> Iterator[tuple[tuple, tuple]]:
        """``((row, col), (x, y))``: the lane's accumulator elements two by two (c0 c1,
        then c2 c3), each pair at columns ``col`` and ``col + 1`` of one row, ``row0`` and
        ``col0`` added (the tile's origin)."""
        coords = self.coords()
        for h in (0, 2):
            row, col = coords[h]
            yield (row0 + row, col0 + col), (acc[h], acc[h + 1])

    def a_from_acc(self, left: tuple, right: tuple) -> tuple:
        """The A fragment (16x16, this kind's 16-bit element type) holding the values of two
        16x8 accumulators side by side (``left`` columns 0-7, ``right`` 8-15), rounded to
        the element type: register 0 is ``left``'s c0 c1, 1 its c2 c3, 2 and 3 ``right``'s
        (the C and A tables place these elements identically)."""
        kind, kb = self.kind, self.kb
        assert kind.per_reg == 2, "accumulators become A fragments of 16-bit kinds only"
        regs = []
        for acc in (left, right):
            for h in (0, 2):
                with kb.emitting():
                    lo = arith.truncf(self._elem, acc[h])
                    hi = arith.truncf(self._elem, acc[h + 1])
                regs.append(self._pack([lo, hi]))
        return tuple(regs)


def _div(e: ir.AffineExpr, c: int) -> ir.AffineExpr:
    return ir.AffineExpr.get_floor_div(e, c)


def _mod(e: ir.AffineExpr, c: int) -> ir.AffineExpr:
    return ir.AffineExpr.get_mod(e, c)


__all__ = [
    "A_LAYOUT",
    "B_LAYOUT",
    "C_LAYOUT",
    "KINDS",
    "MmaKind",
    "SharedTile",
    "Warp",
    "conflict_free",
    "kind_for",
    "padded_ld",
    "shared_ld",
]
