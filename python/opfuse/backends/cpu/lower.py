"""The ``cpu`` stage: lower a (fused or plain) linalg-on-tensors module to the LLVM dialect.

The result runs under MLIR's ExecutionEngine (:mod:`opfuse.runtime.cpu`). The steps, in
order (each a module of its own where it is opfuse's):

1. kernel preparation on tensors (:mod:`opfuse.backends.cpu.kernels`): inside each private
   ``fusion_*`` function the ops of a fused group merge into as few loop nests as
   upstream elementwise fusion allows; the host function keeps its calls, and a plain
   module (no ``fusion_*`` functions) keeps one loop nest per op: the unfused baseline.
2. tile loops (:mod:`opfuse.backends.cpu.tiling`): each kernel's last op tiled by rows,
   its producers fused into the tile loop, so a kernel is one pass over memory (a
   softmax computes each row's max, exponentials, sum and quotient while the row is in
   cache; a matmul's epilogue runs on the block of rows just computed).
3. :func:`lowering_stages`, a list of stages (pass pipelines and Python rewrites, each
   with the reason it sits where it does): bufferize across function boundaries, turn
   every memref result into an out-parameter (the public function's too, so the runtime
   passes numpy-owned output buffers and nothing leaks), matmuls to the packed
   micro-kernel (:mod:`opfuse.backends.cpu.matmul`), free temporaries, reductions to
   vectorized register loops (:mod:`opfuse.backends.cpu.reductions`), the rest of linalg
   to loops, math ops to vectorizable approximations (:mod:`opfuse.backends.cpu.math`),
   and everything to LLVM.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import linalg, tensor

from ...errors import OpfuseError
from ...ir import clone_module, format_location  # noqa: F401  (clone_module re-exported)
# The lowered module's ABI with the runtime: symbol names and the threads attribute.
from ...runtime.cpu import (  # noqa: F401  (re-exported)
    SYMBOL_PREFIX, THREADS_ATTR, CpuProgram, compiled_threads, jit_symbol)
from ...runtime.signature import signature_of
from . import bf16 as cpu_bf16
from . import buffers as cpu_buffers
from . import grain as cpu_grain
from . import math as cpu_math
from . import matmul as cpu_matmul
from . import reductions as cpu_reductions
from . import scatter as cpu_scatter
from . import target as cpu_target
from . import threads as cpu_threads
from . import tiling as cpu_tiling
from .kernels import (  # noqa: F401  (re-exported: the tests and tools use them here)
    KERNEL_PIPELINE,
    KERNEL_PREFIX,
    fuse_kernel_functions,
    interchange_matmuls,
    is_private,
    kernel_functions,
    prepare_loops,
)
from .pipeline import (  # noqa: F401  (re-exported)
    Stage,
    llvm_tool,
    mlir_opt,
    pipeline_text,
    run_pipeline,
    run_stages,
)

STAGE = "cpu"

# The mlir-opt next to the bindings (nvptx.py imports it from here).
_mlir_opt = mlir_opt


def drop_conversion_fastmath(module: ir.Module) -> None:
    """Remove the ``fastmath`` flags of every ``arith.extf``/``arith.truncf``, in place."""

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in ("arith.extf", "arith.truncf") and "fastmath" in op.attributes:
            del op.attributes["fastmath"]
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def lowering_stages(threads: int = 1) -> list[Stage]:
    """The whole-module lowering after kernel preparation, in order, for ``threads``
    threads (:mod:`opfuse.backends.cpu.threads`)."""
    return [
        # Tensors to buffers through calls: identity layouts at function boundaries so
        # every argument is a plain contiguous memref the runtime can describe from a
        # numpy array (a strided view, e.g. a callee that only reshapes its argument, is
        # copied instead).
        Stage("bufferize", "one-shot-bufferize{bufferize-function-boundaries "
                           "function-boundary-type-conversion=identity-layout-map}"),
        # The kernels' tile loops (tiling.py), now on buffers: in order on one
        # thread, parallel loops for the async runtime on more (threads.py) except in
        # kernels too small to pay for the hand-off (grain.py); what a
        # tile reads whole (a matmul's B: a subview with constant offsets) moves out of
        # the loop, where the matmul kernels pack it once.
        Stage("tile-loops", "scf-forall-to-for" if threads == 1 else cpu_grain.lower_tile_loops),
        Stage("hoist-invariants", "loop-invariant-code-motion"),
        # Memref results become out-parameters, the public function's too: the runtime
        # allocates outputs as numpy arrays and the JIT code writes into them. A callee
        # result that aliases an argument (a reshape-only kernel) is copied into its
        # out-parameter here. Must precede deallocation so that no returned buffer needs
        # ownership transfer.
        Stage("results-to-out-params",
              "buffer-results-to-out-params{hoist-static-allocs modify-public-functions}"),
        # A result computed into a buffer of the function's own and then copied into the
        # caller's output array is computed into the output array (buffers.py).
        Stage("elide-result-copies", cpu_buffers.elide_result_copies),
        # f32/f16/bf16 matmuls become calls of the packed micro-kernel (matmul.py),
        # which allocate their packing buffers: before the buffer plan.
        Stage("matmul-kernels", cpu_matmul.replace_matmuls),
        # Static buffers outside loops into each function's workspace (allocated once,
        # with the program: buffers.py); the deallocation pipeline frees the rest.
        Stage("buffer-plan", cpu_buffers.plan_workspaces),
        Stage("deallocate", "buffer-deallocation-pipeline"),
        Stage("bufferization-to-memref", "convert-bufferization-to-memref"),
        # A tile's small scratch buffers onto the stack, saved and restored per iteration
        # (after deallocation: its canonicalization would move the allocas).
        Stage("stack-scratch", cpu_buffers.stack_scratch),
        # Scatter-adds (an embedding's gradient) as one visit per update, added into the
        # row its index picks (scatter.py), not the one-hot reduction they are written as:
        # before the reductions' rewrite, which would take them for a row reduction.
        Stage("scatters", cpu_scatter.lower_scatters),
        # Row reductions with their accumulator in a vector register (reductions.py):
        # convert-linalg-to-loops would load and store it in every iteration.
        Stage("reductions", cpu_reductions.lower_reductions),
        # The other loops over memrefs; LLVM at O3 vectorizes the innermost ones.
        Stage("linalg-to-loops", "convert-linalg-to-loops"),
        Stage("lower-affine", "lower-affine"),
        # More than one thread: each parallel tile loop becomes blocks of iterations run
        # as tasks of MLIR's async runtime, the caller waiting for all of them (after the
        # loops inside a tile are scf.for, before scf-to-cf: the pass wants scf.parallel).
        *(Stage(f"threads-{i}", p) for i, p in enumerate(cpu_threads.async_stages(threads))),
        Stage("scf-to-cf", "convert-scf-to-cf"),
        # f16/bf16: every op computes in f32 and rounds its result (like numpy's float16).
        # bf16 extf/truncf become integer bit operations (arith-expand): no runtime helper.
        # f16 conversions become F16C instructions on x86 hosts that have them (the JIT
        # targets the host CPU), else libgcc's __extendhfsf2/__truncsfhf2.
        Stage("extend-half-floats",
              "func.func(math-extend-to-supported-types{target-type=f32}, "
              "arith-emulate-unsupported-floats{source-types=bf16,f16 target-type=f32})"),
        Stage("f64-to-bf16", cpu_bf16.f64_to_bf16_through_odd_f32),
        Stage("arith-expand", "arith-expand{include-bf16}"),
        # The extension marks its extf/truncf `contract`, which convert-arith-to-llvm copies
        # onto llvm.fpext/fptrunc as an #arith attribute that mlir-translate (a bundle's
        # CPU library) cannot parse. A conversion has nothing to contract: it goes.
        Stage("conversions-without-fastmath", drop_conversion_fastmath),
        # exp, log, log1p, tanh, erf, powf as straight-line f32 arithmetic that LLVM
        # vectorizes (the libm calls they were stop the loop vectorizer): after the
        # half-float extension, so every such op is f32 by now, and before the math
        # lowering. G2 fused (tanh), 4096^2: 63 ms -> 41 ms, the same run as IREE's 37 ms.
        Stage("approximate-math", cpu_math.approximate_math),
        # What is left: LLVM intrinsics first (sqrt, rsqrt, abs, fma, ...), libm calls for
        # what has no intrinsic (sin, cos, f64 erf, ...): both before func-to-llvm, which
        # lowers the calls.
        Stage("math-to-llvm", "convert-math-to-llvm"),
        Stage("math-to-libm", "convert-math-to-libm"),
        # The micro-kernels' and reductions' vector ops, while memrefs are still memrefs.
        Stage("vector-to-llvm", "convert-vector-to-llvm"),
        # Subviews (tiles, batch slices) become offset arithmetic, itself affine.apply.
        Stage("strided-metadata", "expand-strided-metadata"),
        Stage("lower-affine-again", "lower-affine"),
        Stage("memref-to-llvm", "finalize-memref-to-llvm"),
        Stage("arith-to-llvm", "convert-arith-to-llvm"),
        Stage("func-to-llvm", "convert-func-to-llvm"),
        Stage("cf-to-llvm", "convert-cf-to-llvm"),
        Stage("reconcile-casts", "reconcile-unrealized-casts"),
        # bf16 values left (loaded, stored, selected, loop-carried) as i16: LLVM would
        # promote them and call __truncsfbf2, which a bundle's library cannot resolve.
        Stage("bf16-as-bits", cpu_bf16.bf16_as_bits),
    ]


#: The lowering as one line (Python stages shown as ``<python:name>``), for the tools.
LOWERING_PIPELINE = pipeline_text(lowering_stages())


#: ... and how many of its kernels have their tile loops on the threads, of how many
#: (with more than one thread: the rest are under ``OPFUSE_CPU_PARALLEL_MIN_US``).
THREADED_KERNELS_ATTR = "opfuse.cpu_threaded_kernels"
KERNELS_ATTR = "opfuse.cpu_kernels"


def lower_to_llvm(module: ir.Module, *, fuse_kernels: bool = True,
                  threads: int | None = None, host_target: bool = True) -> ir.Module:
    """Lower a linalg-on-tensors module to the LLVM dialect, ready for the ExecutionEngine.

    Args:
        module: a plain or outlined module; it is not modified (the work happens on a copy
            in the same context).
        fuse_kernels: merge the ops of each private ``fusion_*`` function into as few loop
            nests as upstream elementwise fusion allows (see :data:`KERNEL_PIPELINE`).
        threads: threads the tile loops run on (:func:`opfuse.backends.cpu.threads.
            resolve_threads`: None reads ``OPFUSE_CPU_THREADS``, default every usable
            core); recorded as the module attribute :data:`THREADS_ATTR`.
        host_target: give every function the host's target attributes
            (:func:`opfuse.backends.cpu.target.mark_functions`: CPU, tuning, vector width);
            False for code built for another machine (a bundle's portable library).

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
    threads = cpu_threads.resolve_threads(threads)
    copy = clone_module(module)
    protect_arguments(copy)
    _add_c_interfaces(copy)
    serial = cpu_grain.mark_sequential_kernels(copy, threads)
    kernels = len(kernel_functions(copy))
    prepare_loops(copy, fuse_kernels=fuse_kernels, threads=threads)
    cpu_tiling.tile_kernels(copy)
    copy_shared_results(copy)
    prefix_symbols(copy)
    run_stages(copy, lowering_stages(threads))
    _check_lowered(copy)
    if host_target:
        cpu_target.mark_functions(copy)
    i64 = ir.IntegerType.get_signless(64, copy.context)
    copy.operation.attributes[THREADS_ATTR] = ir.IntegerAttr.get(i64, threads)
    copy.operation.attributes[THREADED_KERNELS_ATTR] = ir.IntegerAttr.get(i64, kernels - serial)
    copy.operation.attributes[KERNELS_ATTR] = ir.IntegerAttr.get(i64, kernels)
    return copy


def threaded_kernels(llvm_module: ir.Module) -> tuple[int, int]:
    """(kernels whose tile loops run on the threads, kernels) of a lowered module."""
    attrs = llvm_module.operation.attributes
    if KERNELS_ATTR not in attrs:
        return (0, 0)
    return (ir.IntegerAttr(attrs[THREADED_KERNELS_ATTR]).value,
            ir.IntegerAttr(attrs[KERNELS_ATTR]).value)


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
        if fn.name != "func.func" or not fn.regions[0].blocks or is_private(fn):
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
        if op.name == "func.func" and len(op.regions[0].blocks) > 0 and not is_private(op):
            op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get(module.context)


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


def jit(module: ir.Module, entry: str | None = None, *, opt_level: int | None = None,
        threads: int | None = None) -> CpuProgram:
    """Lower a tensor-level module (plain or outlined) for ``threads`` threads (None:
    ``OPFUSE_CPU_THREADS``, default every usable core) and JIT it (the runtime's
    :class:`~opfuse.runtime.cpu.CpuProgram`)."""
    from ...ir import find_entry  # noqa: PLC0415

    signature = signature_of(find_entry(module, entry))
    llvm = lower_to_llvm(module, threads=threads)
    if opt_level is None:
        return CpuProgram(llvm, signature)
    return CpuProgram(llvm, signature, opt_level=opt_level)


def run_module(module: ir.Module, *arrays, entry: str | None = None,
               threads: int | None = None) -> list:
    """Lower, JIT and run ``module`` once (a convenience for tests and tools)."""
    return jit(module, entry, threads=threads)(*arrays)
