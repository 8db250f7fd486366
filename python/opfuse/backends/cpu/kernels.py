"""Kernel preparation for the CPU lowering, on tensors, before bufferization.

Per private ``fusion_*`` function of an outlined module (one fused kernel), the ops that
fuse into one loop nest are merged (upstream ``linalg-fuse-elementwise-ops`` after the
named elementwise ops are generalized); the public (host) function keeps its call
structure, and a plain module (no ``fusion_*`` functions) keeps one loop nest per op,
which is what the unfused baseline must measure. Contractions (matmul family,
convolutions, pooling) stay named ops: upstream fusion would otherwise fold elementwise
producers into their bodies and recompute them once per output column.

Matmuls that no opfuse kernel takes (:mod:`opfuse.backends.cpu.matmul`: e.g. integer ones)
loop as (m, k, n) so that LLVM vectorizes their inner loop (same summation order).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import func as func_d
from mlir.dialects import linalg

from ... import kinds
from . import matmul as cpu_matmul
from .attention import lower_attention_kernels
from .pipeline import apply_transform_script, run_pipeline

#: Private functions whose name starts with this are fused kernels (``opfuse-outline``).
KERNEL_PREFIX = "fusion_"

#: Unit attribute put on the ops the kernel pipeline generalizes (removed afterwards).
_GENERALIZE_MARK = "opfuse.cpu.generalize"

#: Named linalg ops that are never generalized before elementwise fusion: fusing a producer
#: into them recomputes it for every element of a reduced or sliding dimension.
_KEEP_NAMED_PREFIXES = (
    "linalg.matmul",
    "linalg.batch_matmul",
    "linalg.batch_reduce_matmul",
    "linalg.matvec",
    "linalg.vecmat",
    "linalg.batch_matvec",
    "linalg.batch_vecmat",
    "linalg.dot",
    "linalg.contract",
    "linalg.mmt4d",
    "linalg.batch_mmt4d",
    "linalg.conv",
    "linalg.depthwise_conv",
    "linalg.pooling",
)

#: Runs on each private ``fusion_*`` function (anchored on ``func.func``), after the
#: marked named ops were generalized. canonicalize + cse clean up the fused bodies (dead
#: results of fused producers, duplicated constants).
KERNEL_PIPELINE = "func.func(linalg-fuse-elementwise-ops, canonicalize, cse)"

#: Marks for matmuls whose loops get reordered (m, n, k) -> (m, k, n); value: loop count.
_INTERCHANGE_MARK = "opfuse.cpu.interchange"

_INTERCHANGE_SCRIPT = f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %mm = transform.structured.match attributes{{"{_INTERCHANGE_MARK}" = 3 : i64}} in %root
      : (!transform.any_op) -> !transform.any_op
    %g = transform.structured.generalize %mm : (!transform.any_op) -> !transform.any_op
    %i = transform.structured.interchange %g iterator_interchange = [0, 2, 1]
      : (!transform.any_op) -> !transform.any_op
    %bmm = transform.structured.match attributes{{"{_INTERCHANGE_MARK}" = 4 : i64}} in %root
      : (!transform.any_op) -> !transform.any_op
    %bg = transform.structured.generalize %bmm : (!transform.any_op) -> !transform.any_op
    %bi = transform.structured.interchange %bg iterator_interchange = [0, 1, 3, 2]
      : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}
"""

_GENERALIZE_SCRIPT = f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %ops = transform.structured.match attributes{{"{_GENERALIZE_MARK}"}} in %root
      : (!transform.any_op) -> !transform.any_op
    %g = transform.structured.generalize %ops : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}
"""


def prepare_loops(module: ir.Module, *, fuse_kernels: bool = True, threads: int = 1) -> None:
    """Loop order and per-kernel fusion, in place, before bufferization.

    Matmuls first take their (m, k, n) loop order, which later rewrites keep: elementwise
    fusion folding a reshape of the result into a matmul made it a 3-D generic with the
    reduction innermost (G6 fused ran 3x slower than unfused).
    """
    lower_attention_kernels(module, threads)  # S stays a tile (backends/cpu/attention.py)
    interchange_matmuls(module)
    if fuse_kernels:
        fuse_kernel_functions(module)


def kernel_functions(module: ir.Module) -> list[ir.Operation]:
    """The private ``fusion_*`` functions (with a body) of an outlined module."""
    funcs = []
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or len(op.regions[0].blocks) == 0:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if is_private(op) and name.startswith(KERNEL_PREFIX):
            funcs.append(op)
    return funcs


def fuse_kernel_functions(module: ir.Module) -> None:
    """Run :data:`KERNEL_PIPELINE` on each private ``fusion_*`` function, in place.

    In kernels with a contraction (kind ``output``) only the epilogue fuses: upstream
    elementwise fusion would also fold the matmul's producers (transposes, head splits) into
    its indexing maps, which leaves the reduction innermost and unvectorized (G5 fused ran
    3x slower than unfused). It fuses only single-use producers, so each contraction input
    made in the kernel gets a second, temporary use for the duration of the pipeline.
    """
    kernels = kernel_functions(module)
    if not kernels:
        return
    marked = 0
    for func in kernels:
        marked += _mark_generalizable(func)
    if marked:
        _generalize_marked(module)
    for func in kernel_functions(module):
        matmul = _kind(func) is not None and kinds.get(_kind(func)).registers == "matmul"
        pins = _pin_contraction_inputs(module, func) if matmul else []
        run_pipeline(func, KERNEL_PIPELINE)
        if matmul:
            _unshare_inits(func)
        for pin in pins:
            pin.erase()
    for op in list(module.body.operations):
        fn = op.operation
        if fn.name == "func.func" and fn.attributes["sym_name"].value.startswith(_PIN):
            fn.erase()


_PIN = "__opfuse_cpu_pin"


def _pin_contraction_inputs(module: ir.Module, func: ir.Operation) -> list[ir.Operation]:
    """Call a declared no-op ``_PIN<k>(v)`` on every contraction input ``v`` made inside
    ``func``, and on every contraction result (a reshape of a matmul's result would
    otherwise be folded into it, making it a generic the micro-kernel cannot take: G6's
    per-head projections); returns the calls (and leaves the declarations) for the
    caller to erase."""
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    values = []
    for op in ops:
        if op.name.startswith("linalg.") and linalg.isa_contraction_op(op):
            n_in = len(op.operands) - len(op.results)
            values += [v for v in list(op.operands)[:n_in] if not isinstance(v.owner, ir.Block)]
            values += list(op.results)
    pins = []
    with func.context, func.location:
        for v in values:
            name = f"{_PIN}{len(pins)}_{func.attributes['sym_name'].value}"
            with ir.InsertionPoint.at_block_begin(module.body):
                func_d.FuncOp(name, ([v.type], []), visibility="private")
            with ir.InsertionPoint(ops[-1]):
                pins.append(func_d.CallOp([], name, [v]).operation)
    return pins


def _unshare_inits(func: ir.Operation) -> None:
    """Give each op that starts from another op's result (``outs``) its own copy of that op:
    a horizontal kernel's sibling matmuls start from one zero fill once CSE has merged
    theirs. Two ops writing into one filled tensor make bufferization copy it
    (``memref.copy``, a call to ``memrefCopy``, which a bundle's library, unlike the JIT,
    does not have); two fills cost nothing."""
    for op in [o.operation for o in func.regions[0].blocks[0].operations]:
        if len(op.results) != 1 or not op.name.startswith("linalg."):
            continue
        inits = []
        for u in op.results[0].uses:
            owner = u.owner
            n_in = len(owner.operands) - len(owner.results)
            if owner.name.startswith("linalg.") and u.operand_number >= n_in:
                inits.append((owner, u.operand_number))
        for owner, number in inits[1:]:
            with ir.InsertionPoint(owner):
                clone = op.clone()
            owner.operands[number] = clone.results[0]


def _kind(func: ir.Operation) -> str | None:
    attrs = func.attributes
    return ir.StringAttr(attrs["opfuse.kind"]).value if "opfuse.kind" in attrs else None


def _mark_generalizable(func: ir.Operation) -> int:
    count = 0

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        name = op.name
        if (
            name.startswith("linalg.")
            and name not in ("linalg.generic", "linalg.yield", "linalg.index")
            and not name.startswith(_KEEP_NAMED_PREFIXES)
            and len(op.regions) > 0  # structured ops carry a body region
        ):
            op.attributes[_GENERALIZE_MARK] = ir.UnitAttr.get(op.context)
            count += 1
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    return count


def interchange_matmuls(module: ir.Module) -> None:
    """Reorder the loops of every row-major matmul / batch_matmul the micro-kernel does not
    take (:mod:`opfuse.backends.cpu.matmul`: integer ones) to (m, k, n), in place.

    With k innermost (linalg's order) the inner loop is a strided dot product LLVM cannot
    vectorize (no reassociation); with n innermost it is ``C[i, :] += A[i, k] * B[k, :]``
    over contiguous rows, which LLVM vectorizes. Each output element still sums over k in
    increasing order, so results are bit-identical. Applies to the host function too: it
    changes no op boundaries, only the loop order inside one op.
    """
    count = 0

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        loops = {"linalg.matmul": 3, "linalg.batch_matmul": 4}.get(op.name)
        if loops is not None and not cpu_matmul.takes(op) and _n_innermost(op, loops):
            op.attributes[_INTERCHANGE_MARK] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64, op.context), loops
            )
            count += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if count:
        apply_transform_script(module, _INTERCHANGE_SCRIPT, _INTERCHANGE_MARK)


def _n_innermost(op: ir.Operation, loops: int) -> bool:
    # Only when B and C are contiguous along n (the default maps): a transposed B is
    # contiguous along k, where linalg's order is already the better one.
    if "indexing_maps" not in op.attributes or len(op.results) != 1:
        return False
    maps = [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n = f"d{loops - 2})>"
    return len(maps) == 3 and maps[1].endswith(n) and maps[2].endswith(n)


def _generalize_marked(module: ir.Module) -> None:
    apply_transform_script(module, _GENERALIZE_SCRIPT, _GENERALIZE_MARK)


def is_private(func: ir.Operation) -> bool:
    """Whether a ``func.func`` has private visibility."""
    if "sym_visibility" not in func.attributes:
        return False
    return ir.StringAttr(func.attributes["sym_visibility"]).value == "private"
