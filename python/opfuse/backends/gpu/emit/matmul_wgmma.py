"""Warpgroup tensor-core matmul kernels (sm_90a): ``wgmma.mma_async`` fed by ``cp.async``.

The second tensor-core variant (``matmul=wgmma``, :mod:`opfuse.backends.options`; every compile target
``sm_90a``). It is the ``mma.sync`` kernel of :mod:`.matmul_mma` with three parts
replaced, everything else (the contraction, operand staging with ``cp.async`` or
evaluator stores, tails, the initial accumulators, the epilogue, the horizontal ranges)
shared:

* the block: one or two warpgroups stacked along M (``bm`` = 64 or 128), each computing
  a ``64 x bn`` piece with ``wgmma.mma_async.m64n<bn>k16`` (:mod:`opfuse.backends.gpu.build.wgmma`). As
  :class:`opfuse.backends.gpu.build.matmul_tiles.Tiles` it is a ``bm/16 x 1`` warp grid of 16-row warps: the
  wgmma accumulator layout is the m16n8 one repeated over ``bn/8`` columns, so the
  epilogue and the initial accumulators of :mod:`.matmul_mma` read it unchanged;
* the slabs: the interleaved core-matrix layout of :class:`opfuse.backends.gpu.build.wgmma.CoreLayout` (no
  padding, no swizzle), each thread slot of a copy round mapped so that the 8 threads of
  one store phase fill one core matrix (:meth:`_WgmmaKernel._row_col`);
* the main loop, over K in slabs of ``bk`` with ``S`` stages and ``lag`` wgmma groups
  left in flight across steps (1 when ``S >= 3``, else 0)::

      prologue: stage slabs 0 .. S-2-lag (cp.async), one commit per slab
      for kt in 0 .. KT-1:
          cp.async.wait_group S-2-lag   # slab kt has landed (this thread's copies)
          fence.proxy.async             # ... and is visible to the async proxy
          barrier                       # everyone's; and every warpgroup's wgmma of
                                        # slab kt-1-lag has completed
          stage slab kt+S-1-lag into that slab's buffer; commit
          wgmma.fence; bk/16 x wgmma.mma_async over slab kt; wgmma.commit_group
          wgmma.wait_group lag          # this warpgroup's group of slab kt-lag is done
      wgmma.wait_group 0

  The barrier that publishes slab ``kt`` comes after every warpgroup's wait for the group
  of slab ``kt-1-lag``, whose buffer is the one refilled: a wgmma never reads a buffer
  being refilled, and with ``lag = 1`` each step's MMAs run while the next step's copies
  are issued.
"""

from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import gpu

from ..build import async_copy, wgmma
from . import matmul_mma
from ..build.group import Group, NotChosen, require
from ..build.kernel import KernelBuilder
from .matmul import Contraction
from .matmul_mma import _Kernel, _Operand
from ..build.matmul_tiles import Rules, Tiles

#: (bm, bn, warps_m, warps_n): one or two warpgroups of 16-row warps, largest first.
CANDIDATES = ((128, 128, 8, 1), (128, 64, 8, 1), (64, 128, 4, 1), (64, 64, 4, 1), (64, 32, 4, 1))


def _stage_bytes(bm: int, bn: int, bk: int, kind, a_k_major: bool, b_k_major: bool) -> int:
    return (bm + bn) * bk * kind.element_bytes  # core matrices are not padded


def _registers(t: Tiles, kind) -> int:
    """Registers per thread: the ``bn/2`` accumulators and ~48 for addresses, descriptors
    and the epilogue (no operand fragments: wgmma reads both from shared memory)."""
    return t.bn // 2 + 48


RULES = Rules(CANDIDATES, _stage_bytes, _registers, instruction="wgmma")


class _WgmmaKernel(_Kernel):
    RULES = RULES
    # A range running two products (SwiGLU) keeps the first's accumulators while the second
    # runs: no operand fragments here, so 2 x 64 f32 fit at 128 x 128 (G7: 162 registers,
    # no spills), where mma.sync's pair stops at 64 x 64
    PAIR_TILE = (128, 128, 8, 1)
    META = {"instruction": "wgmma"}

    @classmethod
    def operand(cls, j: int, extent: int, size: int, k_major: bool, t: Tiles, kind) -> _Operand:
        layout = wgmma.CoreLayout(extent, t.bk, k_major, kind.element_bytes)
        return _Operand(j, extent, size, k_major, 0, layout.size)

    def _layout(self, o: _Operand) -> wgmma.CoreLayout:
        return wgmma.CoreLayout(o.extent, self.t.bk, o.k_major, self.kind.element_bytes)

    def _dst(self, o: _Operand, i, k):
        return self._layout(o).offset(i, k)

    def _row_col(self, s, per_row: int) -> tuple:
        """Thread slot ``s``: eight consecutive slots take eight consecutive shared rows
        (the rows of one core matrix: 128 contiguous bytes, one store phase without bank
        conflicts) at one copy of the row; a warp still reads whole 32-byte sectors of
        eight rows."""
        div, mod = ir.AffineExpr.get_floor_div, ir.AffineExpr.get_mod
        row = mod(s, wgmma.CORE_ROWS) + div(s, wgmma.CORE_ROWS * per_row) * wgmma.CORE_ROWS
        return row, mod(div(s, wgmma.CORE_ROWS), per_row)

    def mainloop(self) -> list:
        """The pipeline over K (module docstring); returns the accumulators as f32 values
        in :mod:`.matmul_mma`'s order (tile ``j`` of the warp's row: ``4j .. 4j+3``)."""
        kb, t, c = self.kb, self.t, self.c
        KT = -(-c.K // t.bk)
        S = t.stages
        lag = 1 if S >= 3 else 0
        ahead = S - 1 - lag
        for s in range(ahead):
            if s < KT:
                for o in self.ops:
                    self._stage(o, s * t.bk, s * o.stage)
            async_copy.commit(kb)
        wg = wgmma.Warpgroup(kb, wgmma.WgmmaKind(self.kind.name, t.bn))
        acc0 = wg.accumulator(self._initial_accumulators(1, t.bn // 8))
        group = ir.AffineExpr.get_floor_div(self.tid, wgmma.WARPGROUP)

        def body(iv, accs):
            kt = kb.add_dim(iv)
            async_copy.wait(kb, ahead - 1)
            wgmma.proxy_fence(kb)
            with kb.emitting():
                gpu.barrier()
            if KT > ahead:
                nxt = kt + ahead
                slot = ir.AffineExpr.get_mod(nxt, S)
                with kb.if_(kb.cmp_lt(kb.apply(nxt), kb.index(KT))):
                    for o in self.ops:
                        self._stage(o, nxt * t.bk, slot * o.stage)
            async_copy.commit(kb)
            wg.fence()
            acc = accs[0]
            slot = ir.AffineExpr.get_mod(kt, S)
            a_op, b_op = self.ops
            for kk in range(0, t.bk, wgmma.K):
                da = self._descriptor(wg, a_op, slot, group * 64, kk)
                db = self._descriptor(wg, b_op, slot, 0, kk)
                acc = wg.mma(da, db, acc, a_k_major=a_op.k_major, b_k_major=b_op.k_major)
            wg.commit()
            wg.wait(lag)
            return [acc]

        final = kb.for_(kb.index(0), kb.index(KT), kb.index(1), [acc0], body)[0]
        wg.wait(0)
        async_copy.wait(kb, 0)  # nothing is left in flight at exit
        return wg.values(final)

    def _descriptor(self, wg: wgmma.Warpgroup, o: _Operand, slot, i0, k0) -> ir.Value:
        """The descriptor of operand ``o``'s ``64 x 16`` (A) or ``bn x 16`` (B) piece at
        (``i0``, ``k0``) of the slab in buffer ``slot``."""
        layout = self._layout(o)
        elems = slot * o.stage + layout.offset(i0, k0)
        return wg.descriptor(o.smem, elems * self.kind.element_bytes, layout)


def _check(group: Group, name: str, contraction: Callable[[], Contraction]) -> None:
    """Why this emitter steps aside: another mode chosen (NotChosen, before anything is
    looked at), a target without wgmma or operands it does not take (Unsupported)."""
    opts = group.options
    mode = opts.matmul_mode(name)
    if mode != "wgmma":
        raise NotChosen(f"matmul={mode}")
    require(opts.wgmma_targets,
            f"wgmma runs on sm_90a only (targets: {', '.join(opts.targets)})")
    c = contraction()
    require(wgmma.kind_for(c.a_type, c.b_type, 8) is not None,
            f"{c.a_type} x {c.b_type} operands (wgmma here: f16 or bf16)")


def emit_wgmma(group: Group, module: ir.Module, name: str) -> KernelBuilder:
    """An output group's kernel on warpgroup MMA (``matmul=wgmma`` only)."""
    _check(group, name, lambda: Contraction.of(group))
    return matmul_mma.emit_mma(group, module, name, _WgmmaKernel)


def emit_ranges(group: Group, module: ir.Module, name: str, ranges, parts, dispatch) -> KernelBuilder:
    """A horizontal group's kernel on warpgroup MMA (:func:`.matmul_mma.emit_ranges`)."""
    _check(group, name, lambda: ranges[0][0])
    return matmul_mma.emit_ranges(group, module, name, ranges, parts, dispatch, _WgmmaKernel)


__all__ = ["CANDIDATES", "RULES", "emit_ranges", "emit_wgmma"]
