"""Warpgroup-level tensor-core MMA (sm_90a): the building block of the wgmma matmul.

A warpgroup (four consecutive warps, 128 threads, the first warp's index a multiple of
four) multiplies a ``64 x 16`` tile of A by a ``16 x n`` tile of B into ``64 x n`` f32
accumulators with one ``wgmma.mma_async.sync.aligned.m64n<n>k16.f32.<t>.<t>`` (``t``:
f16 or bf16, ``n`` a multiple of 8 up to 256). Both operands are read from shared memory
through 64-bit matrix descriptors (PTX ISA 9.7.15.5.1.2, "Matrix Descriptor Format"):

    bits  0-13  (start address & 0x3FFFF) >> 4
    bits 16-29  leading dimension byte offset >> 4 (LBO)
    bits 32-45  stride dimension byte offset >> 4 (SBO)
    bits 49-51  matrix base offset (0: no swizzle)
    bits 62-63  swizzle mode (0: none, the interleaved layout used here)

The operand tiles are stored without swizzle, in the ISA's canonical interleaved layout:
core matrices of 8 rows x 16 bytes (8 x 8 elements), each core matrix 128 contiguous
bytes. For a K-major operand (A stored M x K row-major, B stored N x K: ``imm-trans = 0``)
a core matrix's rows run along M/N and its 16 bytes along K; for an MN-major one (A stored
K x M, B stored K x N: ``imm-trans = 1``, allowed for f16/bf16) its rows run along K and
its 16 bytes along M/N. In both, LBO is the byte distance between core matrices adjacent
along K and SBO between core matrices adjacent along M/N (the canonical layouts
``((8,m),(T,2)):((1T,SBO),(1,LBO))`` and ``((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))``, in
units of elements, T = 8). :class:`CoreLayout` places a slab this way and gives both.

The accumulators are one ``!llvm.struct`` of ``n/2`` f32 per thread, placed as the ISA's
"Matrix Fragments for wgmma.mma_async.m64nNk16" figure for D places them
(:func:`d_coords`): warp ``w`` of the warpgroup holds rows ``16w .. 16w+15``; in each
8-column block ``j``, elements ``d[4j] d[4j+1]`` at row ``groupID`` and columns
``8j + 2 threadID_in_group (+1)``, ``d[4j+2] d[4j+3]`` at row ``groupID + 8``: the
``mma.sync`` m16n8 accumulator layout (:data:`.mma.C_LAYOUT`) repeated over ``n/8``
tiles, so the matmul epilogue reads them as it reads ``mma.sync``'s.

The asynchronous protocol (PTX ISA 9.7.15.6-9.7.15.7): ``wgmma.fence`` before the first
``mma_async`` and after any other register access to its accumulators; ``mma_async``
instructions issued since the last ``wgmma.commit_group`` form a group; ``wgmma.wait_group
N`` returns when at most the ``N`` newest groups are pending. Until then the group's
accumulators must not be read and the shared memory it reads must not be written. Shared
memory written through the generic proxy (``st.shared``, ``cp.async``) is made visible to
wgmma's async proxy with ``fence.proxy.async.shared::cta`` by the writing thread, then a
barrier. The emulator checks all of it (:mod:`opfuse.testing.emulator.wgmma`).

MLIR 22's ``nvvm.wgmma.*`` ops are used (``nvvm.wgmma.mma_async`` becomes inline PTX in
``convert-nvvm-to-llvm``); descriptors are built with ``arith`` on the address
``memref.extract_aligned_pointer_as_index`` gives for the shared buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, memref

from .kernel import KernelBuilder

WARPGROUP = 128
#: A core matrix: 8 rows of 16 bytes, stored as 128 contiguous bytes.
CORE_ROWS = 8
CORE_ROW_BYTES = 16
CORE_BYTES = CORE_ROWS * CORE_ROW_BYTES
#: Instruction K for 16-bit operands.
K = 16


@dataclass(frozen=True)
class WgmmaKind:
    """One ``wgmma.mma_async`` shape: operand type ``name`` (f16 or bf16), N = ``n``."""

    name: str
    n: int

    def __post_init__(self) -> None:
        assert self.name in ("f16", "bf16") and self.n % 8 == 0 and 8 <= self.n <= 256

    @property
    def element(self) -> str:
        return self.name

    @property
    def regs(self) -> int:
        """f32 accumulators per thread."""
        return self.n // 2

    @property
    def ptx(self) -> str:
        return f"wgmma.mma_async.sync.aligned.m64n{self.n}k{K}.f32.{self.name}.{self.name}"


def kind_for(a_type: ir.Type, b_type: ir.Type, n: int) -> WgmmaKind | None:
    """The wgmma kind for these operand types and N, or None (not a wgmma type)."""
    a, b = str(a_type), str(b_type)
    if a != b or a not in ("f16", "bf16"):
        return None
    return WgmmaKind(a, n)


def d_coords(warp, g, t, i):
    """(row, col) in the 64 x n tile of accumulator ``d[i]`` of lane (``g`` = groupID,
    ``t`` = threadID_in_group) of warp ``warp`` of the warpgroup (ints or affine exprs)."""
    row = warp * 16 + g + 8 * ((i >> 1) & 1)
    col = 8 * (i >> 2) + 2 * t + (i & 1)
    return row, col


@dataclass(frozen=True)
class CoreLayout:
    """A slab of ``extent`` (along M or N) x ``depth`` (along K) 16-bit elements in the
    interleaved core-matrix layout. ``k_major``: a core matrix's 16-byte rows run along K
    (core matrices numbered along K first), else along M/N (numbered along M/N first).
    Core matrices are numbered so that the 8 threads of one 16-byte store phase that fill
    one core matrix's 8 rows write 128 contiguous bytes (no bank conflict)."""

    extent: int
    depth: int
    k_major: bool
    elem_bytes: int = 2

    def __post_init__(self) -> None:
        assert self.extent % CORE_ROWS == 0 and self.depth % CORE_ROWS == 0

    @property
    def per_row(self) -> int:
        """Elements in one core-matrix row (16 bytes)."""
        return CORE_ROW_BYTES // self.elem_bytes

    @property
    def size(self) -> int:
        return self.extent * self.depth

    def offset(self, i, k):
        """Element offset of element (``i`` along M/N, ``k`` along K): ints or affine
        expressions."""
        p = self.per_row
        cm_elems = CORE_BYTES // self.elem_bytes
        if self.k_major:
            cm = (i // CORE_ROWS if isinstance(i, int) else _div(i, CORE_ROWS)) * (self.depth // p)
            cm = cm + (k // p if isinstance(k, int) else _div(k, p))
            return cm * cm_elems + _mod_any(i, CORE_ROWS) * p + _mod_any(k, p)
        cm = (k // CORE_ROWS if isinstance(k, int) else _div(k, CORE_ROWS)) * (self.extent // p)
        cm = cm + (i // p if isinstance(i, int) else _div(i, p))
        return cm * cm_elems + _mod_any(k, CORE_ROWS) * p + _mod_any(i, p)

    @property
    def lbo(self) -> int:
        """Bytes between core matrices adjacent along K."""
        return CORE_BYTES if self.k_major else CORE_BYTES * (self.extent // self.per_row)

    @property
    def sbo(self) -> int:
        """Bytes between core matrices adjacent along M/N."""
        return CORE_BYTES * (self.depth // self.per_row) if self.k_major else CORE_BYTES


def descriptor_high(lbo: int, sbo: int) -> int:
    """The descriptor's bits other than the start address (no swizzle, base offset 0)."""
    assert lbo % 16 == 0 and sbo % 16 == 0 and lbo >> 4 < 1 << 14 and sbo >> 4 < 1 << 14
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


def encode(address: int, lbo: int, sbo: int) -> int:
    """The descriptor of an operand at shared-memory byte ``address`` (a reference for
    tests and the emulator's own decoding: the emitter computes the same in the kernel)."""
    assert address % 16 == 0
    return ((address & 0x3FFFF) >> 4) | descriptor_high(lbo, sbo)


class Warpgroup:
    """The wgmma operations of one warpgroup of the kernel being built (``kind.n`` wide)."""

    def __init__(self, kb: KernelBuilder, kind: WgmmaKind):
        self.kb = kb
        self.kind = kind
        ctx = kb.ctx
        self._f32 = ir.F32Type.get(ctx)
        self._i64 = ir.IntegerType.get_signless(64, ctx)
        fields = ", ".join(["f32"] * kind.regs)
        self.acc_type = ir.Type.parse(f"!llvm.struct<({fields})>", ctx)
        self._bases: dict = {}

    # ----- accumulators --------------------------------------------------------------
    def accumulator(self, values) -> ir.Value:
        """``n/2`` f32 values (``d[0] ..``, placed as :func:`d_coords` says) as the struct
        ``mma_async`` takes (register writes: a :meth:`fence` must follow)."""
        assert len(values) == self.kind.regs
        kb = self.kb
        acc = kb.create("llvm.mlir.undef", [self.acc_type], []).results[0]
        for i, v in enumerate(values):
            pos = ir.DenseI64ArrayAttr.get([i], kb.ctx)
            acc = kb.create("llvm.insertvalue", [self.acc_type], [acc, v], {"position": pos}).results[0]
        return acc

    def values(self, acc: ir.Value) -> list[ir.Value]:
        """The struct's f32 values (after a :meth:`wait` that covers its group)."""
        kb = self.kb
        out = []
        for i in range(self.kind.regs):
            pos = ir.DenseI64ArrayAttr.get([i], kb.ctx)
            out.append(kb.create("llvm.extractvalue", [self._f32], [acc], {"position": pos}).results[0])
        return out

    # ----- descriptors ---------------------------------------------------------------
    def descriptor(self, smem: ir.Value, byte_offset, layout: CoreLayout) -> ir.Value:
        """The descriptor of the operand at ``byte_offset`` (an affine expression over the
        kernel's dims, a multiple of 16) into shared buffer ``smem``, laid out as
        ``layout``."""
        kb = self.kb
        base = self._address(smem)
        off = kb.apply(byte_offset) if not isinstance(byte_offset, int) else kb.index(byte_offset)
        high = kb.const(self._i64, descriptor_high(layout.lbo, layout.sbo))
        with kb.emitting():
            addr = arith.addi(base, arith.index_cast(self._i64, off))
            field = arith.shrui(arith.andi(addr, kb.const(self._i64, 0x3FFFF)), kb.const(self._i64, 4))
            return arith.ori(field, high)

    def _address(self, smem: ir.Value) -> ir.Value:
        """The shared buffer's address as an i64 (computed once, at the top of the body)."""
        key = smem
        if key not in self._bases:
            kb = self.kb
            with kb.at(kb._top):
                with kb.emitting():
                    p = memref.extract_aligned_pointer_as_index(smem)
                    self._bases[key] = arith.index_cast(self._i64, p)
        return self._bases[key]

    # ----- the instructions ----------------------------------------------------------
    def fence(self) -> None:
        """``wgmma.fence.sync.aligned``: orders the warpgroup's earlier register accesses
        (the accumulators' initial values) before the following ``mma_async``."""
        self.kb.create("nvvm.wgmma.fence.aligned", [], [])

    def mma(self, desc_a: ir.Value, desc_b: ir.Value, acc: ir.Value, *, a_k_major: bool,
            b_k_major: bool) -> ir.Value:
        """``D = A B + D`` on the 64 x n tile (asynchronous: read D only after a
        :meth:`wait` covering this instruction's group). ``a_k_major`` / ``b_k_major``:
        the operands' shared layouts (False: transposed, ``imm-trans-a/b = 1``)."""
        kb, kind = self.kb, self.kind
        ctx = kb.ctx
        t = ir.Attribute.parse(f"#nvvm.wgmma_type<{kind.name}>", ctx)
        one = ir.Attribute.parse("#nvvm.wgmma_scale_in<one>", ctx)
        # nvvm's layouts: A row (K-major) / col (M-major); B col (K-major) / row (N-major)
        attrs = {
            "shape": ir.Attribute.parse(f"#nvvm.shape<m = 64, n = {kind.n}, k = {K}>", ctx),
            "typeA": t,
            "typeB": t,
            "typeD": ir.Attribute.parse("#nvvm.wgmma_type<f32>", ctx),
            "scaleD": ir.Attribute.parse("#nvvm.wgmma_scale_out<one>", ctx),
            "scaleA": one,
            "scaleB": one,
            "layoutA": ir.Attribute.parse(f"#nvvm.mma_layout<{'row' if a_k_major else 'col'}>", ctx),
            "layoutB": ir.Attribute.parse(f"#nvvm.mma_layout<{'col' if b_k_major else 'row'}>", ctx),
        }
        return kb.create("nvvm.wgmma.mma_async", [self.acc_type], [acc, desc_a, desc_b], attrs).results[0]

    def commit(self) -> None:
        """``wgmma.commit_group.sync.aligned``."""
        self.kb.create("nvvm.wgmma.commit.group.sync.aligned", [], [])

    def wait(self, pending: int) -> None:
        """``wgmma.wait_group.sync.aligned pending``."""
        i64 = ir.IntegerType.get_signless(64, self.kb.ctx)
        self.kb.create("nvvm.wgmma.wait.group.sync.aligned", [], [],
                       {"group": ir.IntegerAttr.get(i64, pending)})


def proxy_fence(kb: KernelBuilder) -> None:
    """``fence.proxy.async.shared::cta``: this thread's generic-proxy writes to shared
    memory (``st.shared``, landed ``cp.async`` copies) become visible to the async proxy
    (``wgmma`` operand reads) once a barrier follows."""
    ctx = kb.ctx
    kb.create("nvvm.fence.proxy", [], [], {
        "kind": ir.Attribute.parse("#nvvm.proxy_kind<async.shared>", ctx),
        "space": ir.Attribute.parse("#nvvm.shared_space<cta>", ctx),
    })


def _div(e, c: int):
    return ir.AffineExpr.get_floor_div(e, c)


def _mod_any(e, c: int):
    return e % c if isinstance(e, int) else ir.AffineExpr.get_mod(e, c)


__all__ = [
    "CORE_BYTES",
    "CoreLayout",
    "WARPGROUP",
    "Warpgroup",
    "WgmmaKind",
    "d_coords",
    "descriptor_high",
    "encode",
    "kind_for",
    "proxy_fence",
]
