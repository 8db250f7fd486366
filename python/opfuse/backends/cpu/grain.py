"""Which kernels' tile loops are worth more than one thread.

A parallel tile loop hands its blocks to the async runtime's worker threads and waits for
them (:mod:`opfuse.backends.cpu.threads`). On the 2-vCPU machines this project runs on,
that costs 50-200 us per loop (waking an idle vCPU is a VM exit), measured with one kernel
compiled for one and for two threads (median us, one thread / two):

* ``tanh(a + b)`` on 32,768 f32: 19 / 57; 524,288: 274 / 349; 4,194,304: 2,656 / 2,404;
* f32 matmul 128^3: 21 / 60; 384x256x512: 459 / 495; 512x512x1024: 3,122 / 1,808.

Small models (the zoo's CNN and ViT, a few hundred microseconds a call) ran slower on two
threads than on one. So a kernel keeps its tile loops on the calling thread when its
estimated one-thread time is under ``OPFUSE_CPU_PARALLEL_MIN_US`` (default 800 us, where
the measurements above cross). The estimate is deliberately simple, from the kernel's
tensor-level ops before tiling: bytes of its arguments and results at
:data:`BYTES_PER_S`, contraction FLOPs at :data:`CONTRACTION_FLOPS_PER_S`, and every other
op's body operations per iteration at :data:`OPS_PER_S`, each rate measured here on one
core (Zen 4). An error only moves a kernel between one and two threads: never the result.

The decision is a unit attribute on the kernel function (:data:`SEQUENTIAL`), read when
the tile loops are lowered (:func:`lower_tile_loops`).
"""

from __future__ import annotations

import math

from mlir import ir

from ...analysis.opinfo import tensor_bytes
from ...config import CPU_PARALLEL_MIN_US
from ...errors import OpfuseError
from .kernels import kernel_functions
from .pipeline import run_pipeline
from .tiling import iterator_types, loop_sizes, structured_maps

#: One core's rates for the code this backend emits (measured, see the module docstring).
BYTES_PER_S = 20e9
CONTRACTION_FLOPS_PER_S = 200e9
OPS_PER_S = 10e9

#: Unit attribute of a kernel function whose tile loops stay on the calling thread.
SEQUENTIAL = "opfuse.cpu.sequential"


def parallel_min_us() -> float:
    """``OPFUSE_CPU_PARALLEL_MIN_US`` as a number.

    Raises:
        OpfuseError: not a number >= 0.
    """
    text = CPU_PARALLEL_MIN_US.get()
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0:
        raise OpfuseError(f"{CPU_PARALLEL_MIN_US.name}={text!r}: expected a number of "
                          "microseconds >= 0 (0: every tile loop on the threads)")
    return value


def estimated_us(func: ir.Operation) -> float:
    """One-thread time of a tensor-level kernel function, in microseconds (an estimate)."""
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    moved = sum(tensor_bytes(t) for t in (*ftype.inputs, *ftype.results))
    flops = ops = 0.0
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        if not op.name.startswith("linalg.") or len(op.results) == 0:
            continue
        contraction, work = _work(op)
        if contraction:
            flops += work
        else:
            ops += work
    return 1e6 * (moved / BYTES_PER_S + flops / CONTRACTION_FLOPS_PER_S + ops / OPS_PER_S)


def mark_sequential_kernels(module: ir.Module, threads: int) -> int:
    """Mark every kernel of ``module`` estimated under the threshold :data:`SEQUENTIAL`
    (nothing when compiling for one thread); returns how many were marked."""
    if threads == 1:
        return 0
    limit = parallel_min_us()
    marked = 0
    for func in kernel_functions(module):
        if estimated_us(func) < limit:
            func.attributes[SEQUENTIAL] = ir.UnitAttr.get(module.context)
            marked += 1
    return marked


def lower_tile_loops(module: ir.Module) -> None:
    """The tile-loops stage for more than one thread: ``scf.for`` in the kernels marked
    :data:`SEQUENTIAL`, ``scf.parallel`` (for the async runtime) elsewhere."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and SEQUENTIAL in op.attributes:
            del op.attributes[SEQUENTIAL]
            run_pipeline(op, "func.func(scf-forall-to-for)")
    run_pipeline(module, "builtin.module(scf-forall-to-parallel)")


def _elements(t: ir.Type) -> int:
    static = isinstance(t, ir.ShapedType) and t.has_static_shape
    return math.prod(t.shape) if static else 0


def _work(op: ir.Operation) -> tuple[bool, float]:
    """(is a contraction, its FLOPs or its body operations) for one linalg op."""
    maps = structured_maps(op)
    sizes = loop_sizes(op, maps) if maps is not None else None
    if sizes is None:
        elements = _elements(op.results[0].type)
        if op.name.startswith("linalg.conv") and len(op.operands) > 1:
            filt = op.operands[1].type
            per = _elements(filt) / max(1, ir.ShapedType(filt).shape[0])
            return True, 2.0 * elements * per
        return False, float(elements)
    iterations = float(math.prod(sizes))
    blocks = op.regions[0].blocks if op.regions else []
    body = [o for o in blocks[0].operations if o.operation.name != "linalg.yield"] if len(blocks) else []
    # named ops with maps but no iterator_types (linalg.elementwise, ...) reduce nothing
    named = op.name in ("linalg.matmul", "linalg.batch_matmul")
    reduces = (named or "iterator_types" in op.attributes) and \
        "reduction" in iterator_types(op, len(sizes))
    names = {o.operation.name for o in body}
    if named or (
            reduces and names & {"arith.mulf", "arith.muli"} and names & {"arith.addf", "arith.addi"}):
        return True, 2.0 * iterations
    return False, iterations * max(1, len(body))
