"""The GPU backend's driver: an outlined (fused) module in, kernels + host schedule out.

    program = compile_module(fused_module, targets=("sm_90",))
    program.kernels["fusion_0_loop"].ptx["sm_90"]; program.schedule.steps

Stages (docs/architecture.md): ``fused`` -> ``kernels`` (one host function with one
``gpu.launch`` per fused kernel, :attr:`GpuProgram.kernels_ir`) -> ``nvvm`` -> ``ptx`` ->
``cubin`` (when ptxas is there). Each fused function is given to the emitter of its kind,
then to the fallback if that emitter does not cover it (the reason is kept in
:attr:`GpuProgram.notes`; an emitter that is merely not chosen, like ``mma`` for f32
operands without TF32, leaves no note):

========  ==================================================================
kind      emitters, in order
========  ==================================================================
loop      loop (16-byte vectors per thread), fallback
input     rows (team per row, shuffles), fallback
output    wgmma (matmul=wgmma on sm_90a: warpgroup MMA), mma (tensor cores, cp.async pipeline), matmul (SIMT tile), fallback
attention attention_mma (f16/bf16 tensor cores), attention (SIMT), fallback
conv      conv (direct convolution, channels x columns per thread), fallback
scan      scan (warp/block scan per row: shuffles up, warp totals in shared memory), fallback
scatter   scatter (thread per update, atomic add into the row its index picks), fallback
columns   columns (thread per kept point walks its column: mean pooling, weight norm), fallback
horizontal horizontal_wgmma (matmul=wgmma), horizontal_mma (one tensor-core kernel over the siblings' N ranges), horizontal (SIMT), fallback
opaque    fallback (grid-stride loop)
========  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from mlir import ir

from ...errors import EXIT_INTERNAL_ERROR, OpfuseError
from ...kinds import KINDS
from ...runtime.cache import KernelCache, make_key
from ...runtime.schedule import HostSchedule, KernelSpec
from .lower import host, nvptx
from .lower import ptxas as ptxas_mod
from .emit.attention import emit_attention
from .emit.attention_mma import emit_attention_mma
from .emit.columns import emit_columns
from .emit.conv import emit_conv
from .build.group import Group, NotChosen, is_view_only, prepare
from .build.kernel import KernelBuilder, Unsupported
from .emit.horizontal import emit_horizontal_mma, emit_horizontal_simt, emit_horizontal_wgmma
from .emit.loop import emit_fallback, emit_loop
from .emit.matmul import emit_matmul, emit_mma
from .emit.matmul_wgmma import emit_wgmma
from ..options import CodegenOptions
from .emit.rows import emit_rows
from .emit.scan import emit_scan
from .emit.scatter import emit_scatter

EMITTERS: dict[str, Callable[[Group, ir.Module, str], KernelBuilder]] = {
    "loop": emit_loop,
    "rows": emit_rows,
    "wgmma": emit_wgmma,
    "mma": emit_mma,
    "matmul": emit_matmul,
    "attention_mma": emit_attention_mma,
    "attention": emit_attention,
    "conv": emit_conv,
    "scan": emit_scan,
    "scatter": emit_scatter,
    "columns": emit_columns,
    "horizontal_wgmma": emit_horizontal_wgmma,
    "horizontal_mma": emit_horizontal_mma,
    "horizontal": emit_horizontal_simt,
    "fallback": emit_fallback,
}
#: Group kind -> its emitters, most preferred first (the registry's, opfuse.kinds).
ORDER = {k.name: k.emitters for k in KINDS.values()}
PTXAS_OPTIONS = ("-O3",)


@dataclass
class GpuProgram:
    """A compiled program for the cuda runtime (and the AOT bundle).

    Attributes:
        schedule: the host schedule (calls of kernels by name).
        kernels: one KernelSpec per fused function that needs a launch.
        targets: the chips PTX (and cubins) were produced for.
        kernels_ir: the ``kernels`` stage (gpu.launch per kernel, before outlining).
        nvvm: per chip, the LLVM-dialect kernel modules (when asked for).
        notes: one line per kernel that an emitter declined, saying why.
        ptxas: the ptxas used (None: kernels were not assembled).
        outlined_ir: the kernels module after ``gpu-kernel-outlining`` (``gpu.func``s with
            the argument order the KernelSpecs record): what the emulator checks.
    """

    schedule: HostSchedule
    kernels: dict[str, KernelSpec]
    targets: tuple[str, ...]
    kernels_ir: str
    nvvm: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ptxas: str | None = None
    outlined_ir: str = ""

    def ptx_text(self, chip: str) -> str:
        """All kernels' PTX for ``chip``, one after the other (the ``ptx`` stage)."""
        parts = []
        for k in self.kernels.values():
            parts.append(
                f"// ----- kernel {k.name} (entry {k.entry}, emitter {k.emitter}, "
                f"grid {list(k.grid)}, block {list(k.block)})\n{k.ptx[chip]}"
            )
        return "\n".join(parts)

    def report(self) -> list[dict]:
        """One row per kernel: launch shape and ptxas figures per chip."""
        rows = []
        for k in self.kernels.values():
            row = {
                "name": k.name,
                "entry": k.entry,
                "emitter": k.emitter,
                "grid": list(k.grid),
                "block": list(k.block),
                "threads": k.threads_per_block,
                "vector_lanes": k.vector_lanes,
                "params": len(k.params),
                **({"meta": k.meta} if k.meta else {}),
            }
            for chip, res in k.resources.items():
                row[chip] = res
            rows.append(row)
        return rows


def compile_module(
    module: ir.Module,
    *,
    targets: Sequence[str] = ("sm_90",),
    entry: str | None = None,
    ptxas: bool | None = None,
    cache: KernelCache | None = None,
    want_nvvm: bool = False,
    isolate: bool = True,
    lower: bool = True,
    matmul: str | None = None,
    allow_tf32: bool | None = None,
) -> GpuProgram:
    """Compile an outlined module (``opfuse-outline`` output) for the GPU.

    Args:
        module: the fused module (not modified). A module without fused kernels is
            outlined one op per kernel first (the unfused baseline).
        targets: chips to produce PTX for (``sm_80``, ``sm_90``).
        entry: the host function (default: the only public function).
        ptxas: True: assemble every kernel (error without ptxas); None: when ptxas is
            found; False: never.
        cache: the kernel cache (default: ``$OPFUSE_CACHE_DIR``).
        want_nvvm: keep the NVVM (LLVM dialect) text of each kernel.
        isolate: lower in a worker subprocess (LLVM fatal errors cannot kill the caller).
        lower: False stops after outlining (no PTX: enough for the emulator).
        matmul: matmul kernel variant, for all kernels or per kernel (``auto``, ``mma``,
            ``simt``, ``fusion_3_output=simt,auto``; default ``$OPFUSE_MATMUL`` or auto):
            see :mod:`opfuse.backends.options`.
        allow_tf32: f32 matmuls may use TF32 tensor cores (default
            ``$OPFUSE_ALLOW_TF32``, off).

    Raises:
        OpfuseError: a kernel no emitter can build, a failed lowering, a ptxas error.
    """
    from ...ir import find_entry

    for chip in targets:
        if chip not in nvptx.CHIPS:
            raise OpfuseError(f"unknown GPU target '{chip}' (known: {', '.join(nvptx.CHIPS)})")
    options = CodegenOptions.resolve(
        matmul, allow_tf32, targets[0] if targets else "sm_90", tuple(targets)
    )
    module = outlined(module)
    host_func = find_entry(module, entry)
    funcs = _kernel_functions(module, host_func)
    ctx = module.context
    kmod = ir.Module.create(ir.Location.unknown(ctx))
    groups: dict[str, Group] = {}
    built: dict[str, tuple[str, KernelBuilder]] = {}
    notes: list[str] = []
    view_only: set[str] = set()
    for name, func in funcs.items():
        g = prepare(func)
        g.options = options
        groups[name] = g
        if is_view_only(g):
            view_only.add(name)
            continue
        emitter, kb = _emit(g, kmod, notes)
        built[name] = (emitter, kb)
    schedule = host.extract(host_func, view_only)
    _tidy(kmod)
    kernels_ir = str(kmod)
    infos = {i.kernel: i for i in nvptx.outline(kmod)}
    for name, (_, kb) in built.items():
        if kb.max_registers and name in infos:
            nvptx.limit_registers(kmod, infos[name], kb.max_registers)
    outlined_ir = str(kmod)
    texts = nvptx.gpu_modules(kmod)
    cache = cache if cache is not None else KernelCache()
    specs: dict[str, KernelSpec] = {}
    for name, (emitter, kb) in built.items():
        info = infos.get(name)
        if info is None:
            raise OpfuseError(
                f"kernel {name} has no gpu.launch_func after outlining",
                exit_code=EXIT_INTERNAL_ERROR,
            )
        params = [groups[name].params[p].binding for p in info.params]
        specs[name] = KernelSpec(
            name,
            info.entry,
            emitter,
            params,
            kb.grid,
            kb.block,
            0,
            vector_lanes=kb.vector_lanes,
            meta=dict(kb.meta),
        )
    nvvm: dict[str, dict[str, str]] = {}
    if not lower:
        return GpuProgram(schedule, specs, (), kernels_ir, nvvm, notes, None, outlined_ir)
    for chip in targets:
        lowered = _lower_cached(specs, infos, texts, chip, cache, want_nvvm, isolate)
        for name, low in lowered.items():
            specs[name].ptx[chip] = low.ptx
            if low.nvvm is not None:
                nvvm.setdefault(chip, {})[name] = low.nvvm
    exe = _ptxas(ptxas)
    if exe is not None:
        for chip in targets:
            _assemble_cached(specs, chip, exe, cache)
    return GpuProgram(schedule, specs, tuple(targets), kernels_ir, nvvm, notes, exe, outlined_ir)


def outlined(module: ir.Module) -> ir.Module:
    """``module`` if it has fused kernels, else a copy outlined one op per kernel."""
    if any(
        op.operation.name == "func.func" and "opfuse.kernel" in op.operation.attributes
        for op in module.body.operations
    ):
        return module
    # The outline pass itself, not a Pipeline: the backend sits below the pipeline layer.
    # Its decisions go to a ledger of their own, as in a pipeline run of its own.
    from ...analysis import ledger
    from ...analysis.opinfo import info_cache
    from ...ir import clone_module
    from ...passes import outline as outline_pass

    copy = clone_module(module)
    with ledger.collecting(None), info_cache():
        outline_pass.run(copy)
    copy.operation.verify()
    return copy


def _kernel_functions(module: ir.Module, host_func: ir.Operation) -> dict[str, ir.Operation]:
    by_name = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "opfuse.kernel" in op.attributes:
            by_name[ir.StringAttr(op.attributes["sym_name"]).value] = op
    used: dict[str, ir.Operation] = {}
    for op in host_func.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee not in by_name:
                raise OpfuseError(f"the host calls @{callee}, which is not a fused kernel")
            used.setdefault(callee, by_name[callee])
    return used


def _emit(g: Group, kmod: ir.Module, notes: list[str]) -> tuple[str, KernelBuilder]:
    reasons = []
    for emitter in ORDER.get(g.kind, ("fallback",)):
        scratch = ir.Module.create(ir.Location.unknown(kmod.context))
        try:
            # The module's context is made current: index math on rank-0 values (a scalar
            # leaf has no index expression to take a context from) needs the ambient one.
            with kmod.context:
                kb = EMITTERS[emitter](g, scratch, g.name)
        except NotChosen:
            continue
        except Unsupported as e:
            reasons.append(f"{emitter}: {e}")
            continue
        try:
            kb.func.verify()
        except ir.MLIRError as e:
            raise OpfuseError(
                f"the {emitter} emitter produced invalid IR for {g.name}: {e}",
                exit_code=EXIT_INTERNAL_ERROR,
            ) from None
        kb.func.detach_from_parent()
        ir.InsertionPoint(kmod.body).insert(kb.func)
        if reasons:
            notes.append(f"{g.name} ({g.kind}): {emitter} emitter; " + "; ".join(reasons))
        notes.extend(f"{g.name} ({g.kind}): {note}" for note in kb.notes)
        return emitter, kb
    raise OpfuseError(f"no GPU emitter can build {g.name} ({g.kind}): " + "; ".join(reasons))


def _tidy(kmod: ir.Module) -> None:
    """canonicalize + cse on the kernels: drops the unused dims of the emitters' affine
    maps and folds constants, so the ``kernels`` stage reads well (and lowers the same)."""
    from mlir.passmanager import PassManager

    try:
        PassManager.parse("builtin.module(canonicalize, cse)", kmod.context).run(kmod.operation)
    except ir.MLIRError as e:
        raise OpfuseError(
            f"cleaning up the kernels failed: {e}", exit_code=EXIT_INTERNAL_ERROR
        ) from None


def _lower_cached(specs, infos, texts, chip, cache: KernelCache, want_nvvm: bool, isolate: bool):
    out: dict[str, nvptx.Lowered] = {}
    misses = []
    keys = {}
    version = nvptx.toolchain_version()
    for name in specs:
        text = texts[infos[name].module]
        key = make_key(
            "nvptx", text, chip, nvptx.lowering_pipeline(chip), nvptx.binary_pipeline(), version
        )
        keys[name] = key
        hit = cache.get(key)
        if (
            hit is not None
            and isinstance(hit.get("ptx"), str)
            and (not want_nvvm or hit.get("nvvm"))
        ):
            out[name] = nvptx.Lowered(hit["ptx"], hit.get("nvvm"))
        else:
            misses.append((name, text))
    if misses:
        lowered = nvptx.lower(misses, chip, want_nvvm=want_nvvm, isolate=isolate)
        for name, low in lowered.items():
            cache.put(keys[name], {"ptx": low.ptx, **({"nvvm": low.nvvm} if low.nvvm else {})})
            out[name] = low
    return out


def _ptxas(ptxas: bool | None) -> str | None:
    if ptxas is False:
        return None
    exe = ptxas_mod.find_ptxas()
    if exe is None and ptxas:
        raise OpfuseError(
            "ptxas is required but was not found (PATH, /usr/local/cuda/bin, "
            "or pip install 'opfuse[ptxas]')"
        )
    return exe


#: ``.maxnreg`` of a kernel ptxas spilled at its own occupancy aim: all a thread may have.
SPILL_LIMIT = 255


def _without_spills(spec: KernelSpec, ptx: str, chip: str, exe: str, res: dict):
    """(ptx, cubin, resources, what was limited) of ``spec`` assembled again with
    ``.maxnreg`` where ptxas spilled it at an occupancy of its own choosing (no limit in
    the PTX: ``ptxas.with_register_limit``) and the limit removes spills; else None.
    Kernels that do not spill keep ptxas's choice: a limit on all of them raises G1's
    f32 matmuls from 40-53 registers to 72 and costs them occupancy."""
    r = res.get(spec.entry)
    if r is None or not (r["spill_stores"] or r["spill_loads"]):
        return None
    limited = ptxas_mod.with_register_limit(ptx, spec.entry, SPILL_LIMIT)
    if limited is None:
        return None
    cubin, parsed = ptxas_mod.assemble(limited, chip, ptxas=exe, name=spec.name,
                                       options=PTXAS_OPTIONS)
    again = {k: v.to_json() for k, v in parsed.items()}
    a = again.get(spec.entry)
    if a is None or a["spill_stores"] + a["spill_loads"] >= r["spill_stores"] + r["spill_loads"]:
        return None
    limit = {"limit": SPILL_LIMIT, "unlimited_registers": r["registers"],
             "unlimited_spill_bytes": r["spill_stores"] + r["spill_loads"]}
    return limited, cubin, again, limit


def _assemble_cached(specs: dict[str, KernelSpec], chip: str, exe: str, cache: KernelCache) -> None:
    version = ptxas_mod.version(exe)
    for spec in specs.values():
        ptx = spec.ptx[chip]
        key = make_key("ptxas", ptx, chip, version, PTXAS_OPTIONS, SPILL_LIMIT)
        hit = cache.get(key)
        if (
            hit is not None
            and isinstance(hit.get("cubin"), bytes)
            and spec.entry in hit.get("resources", {})
        ):
            cubin, res = hit["cubin"], hit["resources"]
        else:
            cubin, parsed = ptxas_mod.assemble(
                ptx, chip, ptxas=exe, name=spec.name, options=PTXAS_OPTIONS
            )
            res = {k: v.to_json() for k, v in parsed.items()}
            limit = None
            limited = _without_spills(spec, ptx, chip, exe, res)
            if limited is not None:
                ptx, cubin, res, limit = limited
            hit = {"cubin": cubin, "resources": res, "ptx": ptx, "register_limit": limit}
            cache.put(key, hit)
        if hit.get("register_limit"):  # the PTX ptxas was given again, with its limit
            spec.ptx[chip] = hit["ptx"]
            spec.meta.setdefault("register_limit", {})[chip] = hit["register_limit"]
        spec.cubin[chip] = cubin
        if spec.entry in res:
            spec.resources[chip] = res[spec.entry]
