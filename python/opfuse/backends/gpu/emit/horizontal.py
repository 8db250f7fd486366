"""Horizontal matmul kernels ("horizontal" groups): sibling contractions over one A, one
kernel.

``opfuse-fuse-horizontal`` groups matmuls that read the same LHS (Q, K and V projections;
SwiGLU's ``x @ W1`` and ``x @ W3``). The kernel's grid covers the concatenation of their N
ranges: blocks ``[0, t0)`` compute the first sibling's tiles, ``[t0, t0 + t1)`` the next
one's, and so on. Each range reads its own weight pointer (no weight is copied or
concatenated) and applies its own epilogue, writing its own outputs. The branch on the
block index is uniform per block, so barriers and tensor-core warps are unaffected.

``opfuse-fuse-grouped`` groups independent matmuls that share an operand in any role (a
backward's dX = dY·W and dW = dYᵀ·X): their M and K differ, so each range's blocks are
all its (M, N) tiles laid along x (:class:`Blocks`, ``flat``), row-major over the range's
N tiles, and each range runs its own K loop.

Siblings that one epilogue reads together (SwiGLU's ``silu(x @ W1) * (x @ W3)``) form one
range: its tile runs both K loops, keeping the first's accumulators in registers while
the second runs, and applies the product from both.

The tiles are the matmul emitters' own (:class:`~opfuse.backends.gpu.emit.matmul_simt.SimtTile`,
:class:`~opfuse.backends.gpu.emit.matmul_mma` kernels with a block index override): every range of
one kernel gets the same tile shape (one block size, one shared-memory layout), chosen
for the whole concatenated N.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mlir import ir

from ..build.evaluate import iterators_of, op_of
from ..build.group import Group, NotChosen, Output, computed_from, require
from ..build.kernel import KernelBuilder
from .column_sums import is_column_sum
from .matmul import Contraction


@dataclass
class Part(Group):
    """One N range of a horizontal group: the group restricted to the outputs of one
    sibling (or one pair) and the ops they are computed from."""

    members: frozenset = field(default_factory=frozenset)

    def ops(self) -> list[ir.Operation]:
        return [op for op in super().ops() if op in self.members]


@dataclass
class Range:
    """The siblings one range of blocks computes (one, or a pair its epilogue reads
    together) and the part of the group that writes their outputs."""

    contractions: list[Contraction]
    part: Part

    @property
    def N(self) -> int:
        return self.contractions[0].N


def ranges(group: Group) -> list[Range]:
    """The group's N ranges in output order.

    Raises:
        Unsupported: an output reads no contraction, or siblings read together differ in
            M, N, K or batch, or not exactly one A is shared by all.
    """
    top = set(group.ops())
    slices = {o.index: computed_from(o.value, top) for o in group.outputs}
    contractions_of = {
        i: [op for op in ops if op.name == "linalg.generic" and "reduction" in iterators_of(op)
            and not is_column_sum(op)]
        for i, ops in slices.items()
    }
    # outputs that read a common contraction go to one range (union of their siblings)
    found: list[tuple[list[ir.Operation], list[Output]]] = []
    for o in group.outputs:
        cs = contractions_of[o.index]
        require(bool(cs), "a horizontal group output that reads no contraction")
        hits = [r for r in found if any(c in r[0] for c in cs)]
        merged_cs = list(dict.fromkeys([c for r in hits for c in r[0]] + cs))
        merged_os = [x for r in hits for x in r[1]] + [o]
        found = [r for r in found if r not in hits] + [(merged_cs, merged_os)]
    out = []
    for cs, outs in found:
        members = frozenset(op for o in outs for op in slices[o.index])
        part = Part(group.name, group.kind, group.func, group.scratch, group.params, outs,
                    group.options, members)
        contractions = []
        for c_op in cs:
            own = frozenset(op for op in members if op not in cs or op == c_op)
            contractions.append(Contraction.of(replace(part, members=own),
                                               siblings=[c for c in cs if c != c_op]))
            require(len(cs) == 1 or not contractions[-1].sums, "a column sum in a paired range")
        first = contractions[0]
        for c in contractions[1:]:
            require((c.M, c.N, c.K, c.batch_shape) == (first.M, first.N, first.K, first.batch_shape),
                    "siblings read by one epilogue with different M, N, K or batch")
            require(str(c.op.operands[2].type) == str(first.op.operands[2].type)
                    and [str(m) for m in _maps(c)[2:]] == [str(m) for m in _maps(first)[2:]],
                    "siblings read by one epilogue with different result layouts")
        out.append(Range(contractions, part))
    cs = [c for r in out for c in r.contractions]
    require(len({tuple(c.batch_shape) for c in cs}) == 1, "siblings with different batch loops")
    return out


@dataclass(frozen=True)
class Blocks:
    """How the grid's x blocks are split between the ranges, for tiles of ``bm x bn``.

    Where every range has one M (the siblings of one LHS), range ``i`` has ``n_tiles[i]``
    blocks along x and the M tiles are the grid's y. Otherwise (``flat``: a grouped
    kernel) range ``i`` has ``n_tiles[i] * m_tiles[i]`` blocks along x and y is 1."""

    n_tiles: tuple[int, ...]
    m_tiles: tuple[int, ...]
    flat: bool

    @classmethod
    def of(cls, rs: list[list[Contraction]], bm: int, bn: int) -> "Blocks":
        ms = [r[0].M for r in rs]
        return cls(tuple(-(-r[0].N // bn) for r in rs), tuple(-(-m // bm) for m in ms),
                   len(set(ms)) > 1)

    @property
    def tiles(self) -> list[int]:
        """Blocks along x per range."""
        if self.flat:
            return [n * m for n, m in zip(self.n_tiles, self.m_tiles)]
        return list(self.n_tiles)

    def grid(self, n_batch: int) -> tuple[int, int, int]:
        grid = (sum(self.tiles), 1 if self.flat else self.m_tiles[0], n_batch)
        require(grid[1] <= 65535 and grid[2] <= 65535, "too many tiles")
        return grid

    def block(self, kb: KernelBuilder, i: int, bx) -> list:
        """Range ``i``'s tile index (x, y, z) as affine dims, ``bx`` its x within the range."""
        bz = kb.add_dim(kb.block_id[2])
        if self.flat:
            n = self.n_tiles[i]
            return [ir.AffineExpr.get_mod(bx, n), ir.AffineExpr.get_floor_div(bx, n), bz]
        return [bx, kb.add_dim(kb.block_id[1]), bz]


def _maps(c: Contraction) -> list:
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(c.op.attributes["indexing_maps"])]


def _dispatch(kb: KernelBuilder, tiles: list[int], build) -> None:
    """``build(i, bx)`` for range ``i`` under ``first_i <= block_id.x < first_i + tiles[i]``
    (``bx``: the block's x index within its range, an affine dim)."""
    bid = kb.block_id[0]
    first = 0
    for i, t in enumerate(tiles):
        cond = None
        if i + 1 < len(tiles):
            cond = kb.cmp_lt(bid, kb.index(first + t))
        if i > 0:
            cond = kb.and_(cond, kb.cmp_lt(kb.index(first - 1), bid))
        with kb.if_(cond) if cond is not None else kb.at(kb.ip):
            bx = kb.add_dim(kb.apply(kb.add_dim(bid) - first)) if first else kb.add_dim(bid)
            build(i, bx)
        first += t


def emit_horizontal_simt(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """The SIMT (FFMA) horizontal kernel: one :class:`SimtTile` per range."""
    from .matmul_simt import THREADS, SimtTile, TileShape

    rs = ranges(group)
    cs = [c for r in rs for c in r.contractions]
    shape = TileShape.of(cs)
    first = rs[0].contractions[0]
    blocks = Blocks.of([r.contractions for r in rs], shape.bm, shape.bn)
    kb = KernelBuilder(module, name, group.params, blocks.grid(first.n_batch),
                       (THREADS[0], THREADS[1], 1), shape.shared(cs))

    def build(i: int, bx) -> None:
        r = rs[i]
        tile = SimtTile(kb, r.part, r.contractions[0], shape, blocks.block(kb, i, bx))
        tile.store([(c, tile.mainloop(c)) for c in r.contractions])

    _dispatch(kb, blocks.tiles, build)
    kb.vector_lanes = shape.lanes
    kb.meta.update({"tile": [shape.bm, shape.bn, shape.bk],  # beside a column sum's zeroed
                    "problem": [first.n_batch, first.M, sum(r.N for r in rs), first.K],
                    "ranges": [r.N for r in rs], "products": [len(r.contractions) for r in rs],
                    "operands": str(first.a_type)})
    if blocks.flat:
        kb.meta["problems"] = [[c.M, c.N, c.K] for c in cs]
    return kb


def emit_horizontal_mma(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """The tensor-core horizontal kernel: one :mod:`.matmul_mma` kernel body per range
    (per sibling of a pair, one after the other), on tiles chosen for the whole N."""
    from . import matmul_mma

    opts = group.options
    if opts.matmul_mode(name) == "simt":
        raise NotChosen("matmul=simt")
    rs = ranges(group)
    return matmul_mma.emit_ranges(group, module, name, [r.contractions for r in rs],
                                  [r.part for r in rs], _dispatch)


def emit_horizontal_wgmma(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """The warpgroup-MMA horizontal kernel (``matmul=wgmma``, sm_90a: :mod:`.matmul_wgmma`)."""
    from . import matmul_wgmma

    rs = ranges(group)
    return matmul_wgmma.emit_ranges(group, module, name, [r.contractions for r in rs],
                                    [r.part for r in rs], _dispatch)


__all__ = ["Blocks", "Part", "Range", "emit_horizontal_mma", "emit_horizontal_simt", "emit_horizontal_wgmma",
           "ranges"]
