"""Matmuls on the CPU: a packed, register-blocked, vectorized micro-kernel (opfuse's own).

Every ``linalg.matmul`` and ``linalg.batch_matmul`` on buffers whose operands are f32,
f16 or bf16 (any of their transposed forms: they are strided views here) becomes two calls
of functions generated in this module as MLIR text:

* ``pack``: the right-hand side B (K x N) copied into panels of :attr:`Blocking.nr`
  columns, K rows each, contiguous and zero-padded, in f32. Placed before the outermost
  loop B does not change in, so a kernel tiled by rows packs its weights once, not once
  per tile.
* ``mm``: ``C += A @ Bpacked``, blocked like GotoBLAS/BLIS: K in slices of ``kc`` (a
  ``kc`` x ``nr`` panel slice stays in L1), M in blocks of ``mc`` rows (an ``mc`` x ``kc``
  block of A stays in L2), and per ``mr`` x ``nr`` tile of C a micro-kernel keeping
  ``mr * nr / lanes`` accumulators in vector registers: per k, ``nr / lanes`` vector
  loads of the panel, ``mr`` broadcasts of A and ``mr * nr / lanes`` FMAs. Columns past N
  are masked, rows past the last whole ``mr`` block run a one-row micro-kernel.

Why not a library: the numpy wheel's OpenBLAS (``libscipy_openblas64_``) picks its
Haswell (AVX2) kernels on this AMD EPYC host (``scipy_openblas_get_corename64_`` =
"Haswell"), 130 GFLOP/s single-threaded on 2048x256x256 f32, while this micro-kernel
with AVX-512 reaches about 240 (IREE 3.13: about 175), needs no library at run time (the
AOT bundle's library stays libc-only), takes f16/bf16 operands, and leaves the epilogue
where the tiling put it: on the rows just computed (:mod:`opfuse.backends.cpu.tiling`).
Measured with the shared machine busy; see the issue notes.

f16/bf16 operands are widened to f32 when loaded (B when packed), accumulation is f32,
and a half-precision C is rounded once when stored. Each element of C is summed over k in
increasing order with fused multiply-adds, whatever the blocking: the results depend
neither on the host's vector width nor on the tile sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from mlir import ir
from mlir.dialects import func as func_d
from mlir.dialects import memref

from .target import HostCpu, host_cpu

_PREFIX = "__opfuse_mm_"
_STRIDED = "memref<?x?x{t}, strided<[?, ?], offset: ?>>"
_FLOATS = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Blocking:
    """Register and cache blocking of the micro-kernel.

    Attributes:
        lanes: f32 lanes per vector register.
        mr: rows of C per micro-kernel tile.
        nv: vectors per row of the tile (``nr = nv * lanes`` columns).
        kc: K per slice (panel slice ``kc * nr * 4`` bytes: L1).
        mc: rows of A per block (``mc * kc * 4`` bytes: L2); a multiple of ``mr``.
    """

    lanes: int
    mr: int
    nv: int
    kc: int
    mc: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def blocking() -> Blocking:
    """The blocking of the CPU compiled for (:func:`host_cpu`): accumulators, panel
    vectors and one broadcast fit in the vector registers (32 with AVX-512, 16 otherwise)."""
    return _blocking(host_cpu())


@lru_cache(maxsize=4)
def _blocking(host: HostCpu) -> Blocking:
    lanes = host.lanes(32)
    if host.vector_bits >= 512:
        return Blocking(lanes=lanes, mr=6, nv=4, kc=256, mc=132)  # 24 + 4 + 1 of 32 zmm
    return Blocking(lanes=lanes, mr=6, nv=2, kc=256, mc=132)  # 12 + 2 + 1 of 16 ymm/xmm


def _load_f32(t: str, value: str, vec: str | None = None) -> str:
    """MLIR converting ``value`` of element type ``t`` (scalar, or a vector type) to f32."""
    if t == "f32":
        return ""
    src = f"vector<{vec}x{t}>" if vec else t
    dst = f"vector<{vec}xf32>" if vec else "f32"
    return f"arith.extf {value} : {src} to {dst}"


def pack_text(t: str, b: Blocking) -> str:
    """``@__opfuse_mm_pack_<t>(B: K x N, Bp)``: B into zero-padded f32 panels of ``nr``
    columns, panel-major (``Bp[p][k][j] = B[k][p * nr + j]``)."""
    s = _STRIDED.format(t=t)
    convert = _load_f32(t, "%x")
    value = "%xf" if convert else "%x"
    return f"""
func.func private @{_PREFIX}pack_{t}(%B: {s}, %Bp: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cNR = arith.constant {b.nr} : index
  %zero = arith.constant 0.0 : f32
  %K = memref.dim %B, %c0 : {s}
  %N = memref.dim %B, %c1 : {s}
  %np = arith.ceildivui %N, %cNR : index
  %KNR = arith.muli %K, %cNR : index
  scf.for %p = %c0 to %np step %c1 {{
    %j0 = arith.muli %p, %cNR : index
    %base = arith.muli %p, %KNR : index
    scf.for %k = %c0 to %K step %c1 {{
      %kr = arith.muli %k, %cNR : index
      %row = arith.addi %base, %kr : index
      scf.for %j = %c0 to %cNR step %c1 {{
        %col = arith.addi %j0, %j : index
        %inside = arith.cmpi ult, %col, %N : index
        %v = scf.if %inside -> f32 {{
          %x = memref.load %B[%k, %col] : {s}
          {"%xf = " + convert if convert else ""}
          scf.yield {value} : f32
        }} else {{
          scf.yield %zero : f32
        }}
        %o = arith.addi %row, %j : index
        memref.store %v, %Bp[%o] : memref<?xf32>
      }}
    }}
  }}
  return
}}
"""


def mm_text(ta: str, tc: str, b: Blocking, panels: str | None = None) -> str:
    """``@__opfuse_mm_<ta>_<tc>(A: M x K, Bp, C: M x N)``: ``C += A @ B`` for B packed by
    :func:`pack_text` (module docstring).

    With ``panels`` (a name suffix), ``@__opfuse_mm_<panels>_<ta>_<tc>(A, Bp, off, stride,
    C)`` instead: B's panels start at element ``off`` of ``Bp`` and lie ``stride`` elements
    apart (B packed for more rows than A's K uses, in a slice of a larger buffer: the CPU
    attention kernel's K and V, packed once per head, read by every query tile)."""
    sa, sc = _STRIDED.format(t=ta), _STRIDED.format(t=tc)
    vl, nv, nr = b.lanes, b.nv, b.nr
    vf, vm, vc = f"vector<{vl}xf32>", f"vector<{vl}xi1>", f"vector<{vl}x{tc}>"
    out: list[str] = []
    emit = out.append
    if panels is None:
        emit(f"func.func private @{_PREFIX}{ta}_{tc}(%A: {sa}, %Bp: memref<?xf32>, %C: {sc}) {{")
    else:
        emit(f"func.func private @{_PREFIX}{panels}_{ta}_{tc}(%A: {sa}, %Bp: memref<?xf32>, "
             f"%boff: index, %KNR: index, %C: {sc}) {{")
    emit("  %c0 = arith.constant 0 : index\n  %c1 = arith.constant 1 : index")
    emit(f"  %cMR = arith.constant {b.mr} : index\n  %cNR = arith.constant {nr} : index")
    emit(f"  %cKC = arith.constant {b.kc} : index\n  %cMC = arith.constant {b.mc} : index")
    emit(f"  %M = memref.dim %A, %c0 : {sa}\n  %K = memref.dim %A, %c1 : {sa}")
    emit(f"  %N = memref.dim %C, %c1 : {sc}")
    emit(f"  %pass = arith.constant dense<0.0> : {vc}")
    emit("  %np = arith.ceildivui %N, %cNR : index")
    emit("  %mrem = arith.remui %M, %cMR : index\n  %mfull = arith.subi %M, %mrem : index")
    if panels is None:
        emit("  %KNR = arith.muli %K, %cNR : index")
    for j in range(nv):
        emit(f"  %jo{j} = arith.constant {j * vl} : index")
    for i in range(1, b.mr):
        emit(f"  %ci{i} = arith.constant {i} : index")

    def panel_setup(indent: str) -> None:
        emit(f"{indent}%j0 = arith.muli %p, %cNR : index")
        if panels is None:
            emit(f"{indent}%bb = arith.muli %p, %KNR : index")
        else:
            emit(f"{indent}%bp = arith.muli %p, %KNR : index")
            emit(f"{indent}%bb = arith.addi %bp, %boff : index")
        emit(f"{indent}%cols = arith.subi %N, %j0 : index")
        for j in range(nv):
            emit(f"{indent}%cj{j} = arith.subi %cols, %jo{j} : index")
            emit(f"{indent}%m{j} = vector.create_mask %cj{j} : {vm}")
            emit(f"{indent}%jc{j} = arith.addi %j0, %jo{j} : index")

    def tile(mr: int, i0: str, indent: str) -> None:
        """One mr x nr tile of C at rows i0..: load, k loop of FMAs, store."""
        for i in range(mr):
            emit(f"{indent}%r{i} = arith.addi {i0}, {'%c0' if i == 0 else f'%ci{i}'} : index")
            for j in range(nv):
                name = f"%cl{i}_{j}"
                emit(f"{indent}{name} = vector.maskedload %C[%r{i}, %jc{j}], %m{j}, %pass "
                     f": {sc}, {vm}, {vc} into {vc}")
                if tc != "f32":
                    emit(f"{indent}%cf{i}_{j} = arith.extf {name} : {vc} to {vf}")
        init = ", ".join(f"%a{i}_{j} = %{'cf' if tc != 'f32' else 'cl'}{i}_{j}"
                         for i in range(mr) for j in range(nv))
        types = ", ".join([vf] * (mr * nv))
        emit(f"{indent}%acc:{mr * nv} = scf.for %k = %k0 to %k1 step %c1 iter_args({init}) "
             f"-> ({types}) {{")
        emit(f"{indent}  %kb = arith.muli %k, %cNR : index")
        emit(f"{indent}  %bk = arith.addi %bb, %kb : index")
        for j in range(nv):
            emit(f"{indent}  %bo{j} = arith.addi %bk, %jo{j} : index")
            emit(f"{indent}  %b{j} = vector.load %Bp[%bo{j}] : memref<?xf32>, {vf}")
        new = []
        for i in range(mr):
            emit(f"{indent}  %as{i} = memref.load %A[%r{i}, %k] : {sa}")
            scalar = f"%as{i}"
            if ta != "f32":
                emit(f"{indent}  %asf{i} = {_load_f32(ta, scalar)}")
                scalar = f"%asf{i}"
            emit(f"{indent}  %ab{i} = vector.broadcast {scalar} : f32 to {vf}")
            for j in range(nv):
                # math.fma: always fused (llvm.fma), never at the backend's choice
                # (vector.fma is llvm.fmuladd): the JIT on this host and a bundle's
                # portable library (fmaf calls) compute the same bits
                emit(f"{indent}  %n{i}_{j} = math.fma %ab{i}, %b{j}, %a{i}_{j} : {vf}")
                new.append(f"%n{i}_{j}")
        emit(f"{indent}  scf.yield {', '.join(new)} : {types}")
        emit(f"{indent}}}")
        for i in range(mr):
            for j in range(nv):
                value = f"%acc#{i * nv + j}"
                if tc != "f32":
                    emit(f"{indent}%t{i}_{j} = arith.truncf {value} : {vf} to {vc}")
                    value = f"%t{i}_{j}"
                emit(f"{indent}vector.maskedstore %C[%r{i}, %jc{j}], %m{j}, {value} "
                     f": {sc}, {vm}, {vc}")

    emit("  scf.for %k0 = %c0 to %K step %cKC {")
    emit("    %k0e = arith.addi %k0, %cKC : index\n    %k1 = arith.minui %k0e, %K : index")
    emit("    scf.for %ic = %c0 to %mfull step %cMC {")
    emit("      %ice = arith.addi %ic, %cMC : index\n      %ie = arith.minui %ice, %mfull : index")
    emit("      scf.for %p = %c0 to %np step %c1 {")
    panel_setup("        ")
    emit("        scf.for %i0 = %ic to %ie step %cMR {")
    tile(b.mr, "%i0", "          ")
    emit("        }\n      }\n    }")
    # the rows after the last whole mr block, one at a time
    emit("    scf.for %p = %c0 to %np step %c1 {")
    panel_setup("      ")
    emit("      scf.for %i1 = %mfull to %M step %c1 {")
    tile(1, "%i1", "        ")
    emit("      }\n    }\n  }\n  return\n}")
    return "\n".join(out) + "\n"


def bmm_text(ta: str, tb: str, tc: str, b: Blocking) -> str:
    """``@__opfuse_mm_batch_<ta>_<tb>_<tc>(A, B, C)``: per batch, pack B and multiply (one
    packing buffer for all batches)."""
    s3 = "memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>"
    sa, sb, sc = (s3.format(t=t) for t in (ta, tb, tc))
    da, db, dc = (_STRIDED.format(t=t) for t in (ta, tb, tc))
    return f"""
func.func private @{_PREFIX}batch_{ta}_{tb}_{tc}(%A: {sa}, %B: {sb}, %C: {sc}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %cNR = arith.constant {b.nr} : index
  %nb = memref.dim %A, %c0 : {sa}
  %M = memref.dim %A, %c1 : {sa}
  %K = memref.dim %A, %c2 : {sa}
  %N = memref.dim %B, %c2 : {sb}
  %np = arith.ceildivui %N, %cNR : index
  %w = arith.muli %np, %cNR : index
  %size = arith.muli %w, %K : index
  %Bp = memref.alloc(%size) : memref<?xf32>
  scf.for %i = %c0 to %nb step %c1 {{
    %a = memref.subview %A[%i, 0, 0] [1, %M, %K] [1, 1, 1] : {sa} to {da}
    %b = memref.subview %B[%i, 0, 0] [1, %K, %N] [1, 1, 1] : {sb} to {db}
    %c = memref.subview %C[%i, 0, 0] [1, %M, %N] [1, 1, 1] : {sc} to {dc}
    func.call @{_PREFIX}pack_{tb}(%b, %Bp) : ({db}, memref<?xf32>) -> ()
    func.call @{_PREFIX}{ta}_{tc}(%a, %Bp, %c) : ({da}, memref<?xf32>, {dc}) -> ()
  }}
  return
}}
"""


# Indexing maps (as loop-dim tuples per operand) this module takes, per op: A's, B's,
# C's; a transposed A or B is a transposed view.
_MATMUL_A = {(0, 2): False, (2, 0): True}
_MATMUL_B = {(2, 1): False, (1, 2): True}
_BATCH_A = {(0, 1, 3): False, (0, 3, 1): True}
_BATCH_B = {(0, 3, 2): False, (0, 2, 3): True}


def _dims(op: ir.Operation) -> list[tuple[int, ...]] | None:
    if "indexing_maps" not in op.attributes:
        return ([(0, 2), (2, 1), (0, 1)] if op.name == "linalg.matmul"
                else [(0, 1, 3), (0, 3, 2), (0, 1, 2)])
    out = []
    for attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
        amap = ir.AffineMapAttr(attr).value
        if not all(isinstance(e, ir.AffineDimExpr) for e in amap.results):
            return None
        out.append(tuple(e.position for e in amap.results))
    return out


def takes(op: ir.Operation) -> bool:
    """Whether this module's kernels run ``op`` (on tensors or on buffers)."""
    return _plan(op) is not None


def _plan(op: ir.Operation) -> tuple[bool, bool] | None:
    """(A transposed, B transposed) for a matmul this module takes, else None."""
    if op.name not in ("linalg.matmul", "linalg.batch_matmul") or len(op.operands) != 3:
        return None
    if any(not isinstance(v.type, (ir.MemRefType, ir.RankedTensorType)) for v in op.operands):
        return None
    if any(_element(v) not in _FLOATS for v in op.operands):
        return None
    # a body other than the plain multiply-add (a cast-and-accumulate variant) stays loops
    ops = [o.name for o in op.regions[0].blocks[0].operations]
    if [n for n in ops if n not in ("arith.extf", "arith.truncf")] != [
            "arith.mulf", "arith.addf", "linalg.yield"]:
        return None
    dims = _dims(op)
    if dims is None:
        return None
    a_maps, b_maps, c_map = ((_MATMUL_A, _MATMUL_B, (0, 1)) if op.name == "linalg.matmul"
                             else (_BATCH_A, _BATCH_B, (0, 1, 2)))
    if dims[0] not in a_maps or dims[1] not in b_maps or dims[2] != c_map:
        return None
    return a_maps[dims[0]], b_maps[dims[1]]


def _element(v: ir.Value) -> str:
    return str(ir.ShapedType(v.type).element_type)


def _dynamic_view(v: ir.Value, transpose: bool) -> ir.Value:
    """``v`` as a fully dynamic strided memref, its last two dimensions swapped if asked."""
    t = ir.MemRefType(v.type)
    rank = t.rank
    if transpose:
        strides, offset = t.get_strides_and_offset()
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        shape = [t.shape[p] for p in perm]
        new_strides = [strides[p] for p in perm]
        layout = ir.StridedLayoutAttr.get(offset, new_strides)
        tt = ir.MemRefType.get(shape, t.element_type, layout, t.memory_space)
        amap = ir.AffineMap.get_permutation(perm)
        v = memref.TransposeOp(tt, v, ir.AffineMapAttr.get(amap)).result
    dyn = ir.ShapedType.get_dynamic_size()
    dyn_stride = ir.ShapedType.get_dynamic_stride_or_offset()
    layout = ir.StridedLayoutAttr.get(dyn_stride, [dyn_stride] * rank)
    target = ir.MemRefType.get([dyn] * rank, t.element_type, layout, t.memory_space)
    return memref.cast(target, v)


_LOOPS = ("scf.for", "scf.forall", "scf.parallel")


def _ancestors(op: ir.Operation) -> list[ir.Operation]:
    out = []
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        out.append(parent)
        parent = parent.parent
    return out


def _hoist_point(op: ir.Operation, value: ir.Value) -> ir.Operation:
    """The outermost loop around ``op`` that ``value`` is defined outside of (``op``
    itself when there is none): where B is packed once for every iteration."""
    owner = value.owner
    defining = owner.owner if isinstance(owner, ir.Block) else owner
    inside = set()
    if defining is not None and defining.name != "func.func":
        inside = {a.operation for a in [defining, *_ancestors(defining)]}
    best = op
    for a in _ancestors(op):
        if a.name in _LOOPS and a.operation not in inside:
            best = a
    return best


def replace_matmuls(module: ir.Module) -> int:
    """Replace every matmul :func:`_plan` takes by calls of the generated kernels, in
    place (on buffers, before deallocation: the packing buffers get their deallocs from
    the deallocation pipeline); returns how many."""
    found = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        p = _plan(op) if all(isinstance(v.type, ir.MemRefType) for v in op.operands) else None
        if p is not None:
            found.append((op, p))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if not found:
        return 0
    b = blocking()
    texts: dict[str, str] = {}
    ctx = module.context
    for op, (ta_t, tb_t) in found:
        a, bb, c = op.operands
        ta, tb, tc = _element(a), _element(bb), _element(c)
        with ctx, op.location:
            if op.name == "linalg.batch_matmul":
                texts[f"pack_{tb}"] = pack_text(tb, b)
                texts[f"{ta}_{tc}"] = mm_text(ta, tc, b)
                texts[f"batch_{ta}_{tb}_{tc}"] = bmm_text(ta, tb, tc, b)
                with ir.InsertionPoint(op):
                    args = [_dynamic_view(a, ta_t), _dynamic_view(bb, tb_t), _dynamic_view(c, False)]
                    func_d.CallOp([], f"{_PREFIX}batch_{ta}_{tb}_{tc}", args)
            else:
                texts[f"pack_{tb}"] = pack_text(tb, b)
                texts[f"{ta}_{tc}"] = mm_text(ta, tc, b)
                with ir.InsertionPoint(_hoist_point(op, bb)):
                    b_view = _dynamic_view(bb, tb_t)
                    bp = _packed_buffer(bb, tb_t, b)
                    func_d.CallOp([], f"{_PREFIX}pack_{tb}", [b_view, bp])
                with ir.InsertionPoint(op):
                    args = [_dynamic_view(a, ta_t), bp, _dynamic_view(c, False)]
                    func_d.CallOp([], f"{_PREFIX}{ta}_{tc}", args)
        op.erase()
    with ctx:
        library = ir.Module.parse("".join(texts.values()))
        ip = ir.InsertionPoint(module.body)
        for fn in list(library.body.operations):
            fn.operation.clone(ip=ip)
    return len(found)


def _packed_buffer(bmat: ir.Value, transposed: bool, b: Blocking) -> ir.Value:
    """An f32 buffer for B (K x N) in panels: ceil(N / nr) * nr * K elements."""
    t = ir.MemRefType(bmat.type)
    k, n = (t.shape[1], t.shape[0]) if transposed else (t.shape[0], t.shape[1])
    dyn = ir.ShapedType.get_dynamic_size()
    f32 = ir.F32Type.get()
    if k != dyn and n != dyn:
        size = -(-n // b.nr) * b.nr * k
        buffer = memref.alloc(ir.MemRefType.get([size], f32), [], [])
        return memref.cast(ir.MemRefType.get([dyn], f32), buffer)
    from mlir.dialects import arith

    index = ir.IndexType.get()
    def dim(i: int) -> ir.Value:
        return memref.dim(bmat, arith.constant(index, i))
    kv, nv = (dim(1), dim(0)) if transposed else (dim(0), dim(1))
    nr = arith.constant(index, b.nr)
    width = arith.muli(arith.ceildivui(nv, nr), nr)
    return memref.alloc(ir.MemRefType.get([dyn], f32), [arith.muli(width, kv)], [])
