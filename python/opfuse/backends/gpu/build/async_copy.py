"""``cp.async``: global-to-shared copies that run while the thread computes.

Each thread issues its copies (:func:`copy`: 4, 8 or 16 bytes, the rest zero-filled past
``valid`` elements: tails cost no branch), commits them as a group (:func:`commit`, one per
pipeline stage, also when a thread had nothing to copy so every thread counts the same
groups), and before reading a stage waits until at most ``n`` newer groups are pending
(:func:`wait`), then a ``gpu.barrier`` makes every thread's copies visible to the block.
The emulator checks this protocol (:mod:`opfuse.testing.emulator.mma`: reading a copy in flight is an
error). The copy is the upstream ``nvgpu.device_async_copy`` (it lowers to
``cp.async.{ca,cg}.shared.global`` and takes memrefs); commit and wait are the NVVM ops
``nvvm.cp.async.commit.group`` / ``nvvm.cp.async.wait.group N``, which are the PTX
instructions (``nvgpu``'s token-based forms cannot commit a group whose copies sit in an
``scf.if``, and their empty-operand form does not survive printing and parsing).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from .kernel import KernelBuilder


def _token(ctx: ir.Context) -> ir.Type:
    return ir.Type.parse("!nvgpu.device.async.token", ctx)


def copy(
    kb: KernelBuilder,
    dst: ir.Value,
    dst_index: ir.Value,
    src: ir.Value,
    src_index: ir.Value,
    elements: int,
    valid: ir.Value | None = None,
) -> None:
    """Copy ``elements`` consecutive elements (4, 8 or 16 bytes) of ``src`` (a global
    memref) at ``src_index`` to ``dst`` (shared) at ``dst_index``; with ``valid`` (an
    index value, 0..elements), only that many are read and the rest are zeros. Both
    addresses must be aligned to the copy's size."""
    ctx = kb.ctx
    esize = ir.MemRefType(dst.type).element_type
    nbytes = elements * (esize.width if isinstance(esize, ir.IntegerType) else _bits(esize)) // 8
    assert nbytes in (4, 8, 16), nbytes
    attrs = {
        "dstElements": ir.IntegerAttr.get(ir.IndexType.get(ctx), elements),
        "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1, 1, 1, 0 if valid is None else 1], ctx),
    }
    if nbytes == 16:  # .cg: cache in L2 only (operands are read once per block)
        attrs["bypassL1"] = ir.UnitAttr.get(ctx)
    operands = [dst, dst_index, src, src_index] + ([valid] if valid is not None else [])
    kb.create("nvgpu.device_async_copy", [_token(ctx)], operands, attrs)


def copy_if(
    kb: KernelBuilder,
    dst: ir.Value,
    dst_index: ir.Value,
    src: ir.Value,
    src_index: ir.Value,
    elements: int,
    ok: ir.Value | None,
) -> None:
    """:func:`copy`, reading all ``elements`` where ``ok`` (an i1; None: always) holds and
    none (zeros in ``dst``) where it does not: a tile's rows or columns past the tensor."""
    valid = None
    if ok is not None:
        with kb.emitting():
            valid = arith.select(ok, kb.index(elements), kb.index(0))
    copy(kb, dst, dst_index, src, src_index, elements, valid)


def commit(kb: KernelBuilder) -> None:
    """``cp.async.commit_group``: the thread's copies since the last commit become a group
    (an empty one if there were none)."""
    kb.create("nvvm.cp.async.commit.group", [], [])


def wait(kb: KernelBuilder, pending: int) -> None:
    """``cp.async.wait_group pending``: the thread's groups but the ``pending`` newest are
    complete (their data is in shared memory, visible to this thread)."""
    i32 = ir.IntegerType.get_signless(32, kb.ctx)
    kb.create("nvvm.cp.async.wait.group", [], [], {"n": ir.IntegerAttr.get(i32, pending)})


def _bits(t: ir.Type) -> int:
    for cls, bits in ((ir.F64Type, 64), (ir.F32Type, 32), (ir.F16Type, 16), (ir.BF16Type, 16)):
        if isinstance(t, cls):
            return bits
    raise ValueError(f"cp.async of {t}")


__all__ = ["commit", "copy", "wait"]
