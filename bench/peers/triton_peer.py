"""Triton as a GPU peer: the same matmul and attention work as opfuse's kernels, compiled
for sm_90 and sm_80 without a GPU and estimated with opfuse's own model.

For the graphs of bench/gpu_estimate.py (G1, G5, G6, G7, at the same problem sizes: read
from the graphs' inputs), the Triton kernels a user writes (bench/peers/triton_kernels.py:
Linear + epilogue, SwiGLU with two accumulators, a FlashAttention-2 forward) are compiled
by ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (sm_90a) and ``(80)``, with the
launch specialization Triton's JIT would give them (pointers 16-byte aligned, integers
divisible by 16 marked so). From each compiled kernel: registers and spills (the ``-v`` log
of the ptxas run Triton makes, its bundled ptxas with its flags, which Triton prints when
``knobs.nvidia.dump_ptxas_log`` is on and otherwise discards), shared memory (its
metadata, dynamic), and which tensor-core instructions and copies its PTX has
(``wgmma``, ``mma.sync``, ``cp.async``, TMA's ``cp.async.bulk.tensor``).

The H200 estimate is :func:`opfuse.cost.gpu_time.matmul_kernel` /
:func:`~opfuse.cost.gpu_time.attention_kernel` — the very functions opfuse's kernels are
estimated with — fed Triton's launch shape, tile, registers, shared memory, FLOPs and bytes,
so opfuse vs Triton is one model on both sides. What that model cannot represent is said in
the row (``model_notes``): it has no ``wgmma`` rate (Hopper's warpgroup MMA, which Triton
uses on sm_90) and prices it as ``mma.sync`` (62 % of the dense peak, 8 warps to keep it
busy); ``estimate_wgmma_s`` is the same model with the dense peak and one warpgroup instead
(an assumption as well). TMA copies would not be modelled (these kernels load through
pointers, which Triton turns into ``cp.async``; the row says if a PTX has TMA).

Block sizes, warps and stages: a Triton user starts from the tutorials' autotune lists
(:data:`MATMUL_CONFIGS`, :data:`ATTENTION_CONFIGS`); Triton's autotuner picks by timing on a
GPU, which we lack, so each kernel takes the candidate with the lowest estimate among those
ptxas assembles without spills (opfuse chooses its own tiles by the same model). The rows
list every candidate's estimate.

Only this module's compile step needs triton; the rest (launch descriptions, signatures,
the estimate row) is plain Python, tested without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opfuse.cost import gpu_time as estimate

GRAPHS = ("g1_mlp", "g5_attention", "g6_encoder_layer", "g7_rmsnorm_swiglu")
#: Triton precisions per graph dtype, and the opfuse variant (bench/gpu_estimate.py) each
#: one is compared with: bf16 tensor cores vs opfuse's ``mma``; f32 IEEE (FFMA) vs
#: opfuse's default SIMT kernels; f32 TF32 vs opfuse's ``allow_tf32`` kernels.
PRECISIONS = {"bf16": ("bf16",), "f32": ("ieee", "tf32")}
COMPARE_WITH = {"bf16": "mma", "ieee": "simt", "tf32": "tf32"}
#: compute capabilities compiled for; the first is estimated (H200), the other's
#: registers, spills, shared memory and instructions are reported beside it
ARCHES = (90, 80)
G6_HEADS = 8  # graphs.g6_encoder_layer: head counts do not scale


@dataclass(frozen=True)
class Config:
    """A kernel's block sizes and launch options (``block_k`` 0 for attention)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


#: Triton tutorial 03's CUDA autotune list (f16/bf16), minus its 2-warp 32-wide entries
#: that no grid here needs; f32 operands take BLOCK_K 32 in the widest one (its 3 stages at
#: BLOCK_K 64 need 288 KB of shared memory).
MATMUL_CONFIGS = {
    "bf16": (Config(128, 256, 64, 8, 3), Config(64, 256, 32, 4, 4), Config(128, 128, 32, 4, 4),
             Config(128, 64, 32, 4, 4), Config(64, 128, 32, 4, 4), Config(64, 32, 32, 2, 5)),
    "f32": (Config(128, 256, 32, 8, 3), Config(128, 128, 32, 4, 4), Config(128, 64, 32, 4, 4),
            Config(64, 128, 32, 4, 4), Config(64, 32, 32, 2, 5)),
}
#: Triton tutorial 06's search space (BLOCK_M 64/128, BLOCK_N 32-128, 3-4 stages, 4/8 warps),
#: the entries its Hopper configs keep for head dim 64
ATTENTION_CONFIGS = {
    "bf16": (Config(128, 64, 0, 4, 3), Config(128, 128, 0, 8, 3), Config(64, 64, 0, 4, 3),
             Config(128, 32, 0, 4, 4)),
    # f32 tiles are twice the bytes and registers: the same space at half the block
    "f32": (Config(64, 64, 0, 4, 3), Config(128, 64, 0, 8, 3), Config(64, 32, 0, 4, 3),
            Config(32, 32, 0, 2, 3)),
}

CONFIG_CHOICE = (
    "candidates from Triton's tutorials' autotune lists (03 matmul, 06 attention); the one "
    "with the lowest estimate among those ptxas assembles without spills (Triton's "
    "autotuner times them on a GPU instead)"
)
METHOD = (
    "estimate, not a measurement: opfuse's own model (cost/gpu_time.py matmul_kernel / "
    "attention_kernel) fed the Triton kernel's launch shape, tile, registers and spills "
    "(the -v log of Triton's own ptxas run), shared memory (its metadata), FLOPs "
    "(2 M N K per product; attention 2 B H T T (D + Dv)) and bytes (each tensor argument "
    "read or written once); wgmma is priced as mma.sync (the model has no wgmma rate: "
    "estimate_wgmma_s assumes the dense peak and one warpgroup)"
)


@dataclass
class Launch:
    """One Triton kernel launch doing one opfuse kernel's work.

    Attributes:
        name: what it computes in the graph's words (``fc1``, ``qkv``, ``swiglu``...).
        kernel: the jit function's name in triton_kernels (``linear``...).
        pointers: pointer arguments -> element type (``bf16``/``fp32``).
        scalars: integer and float arguments by name.
        flags: the constexpr epilogue flags (``GELU``, ``RESIDUAL``, ``BIAS``, ``HEAD_DIM``).
        shape: matmul ``(M, N, K, products)``; attention ``(G, T, D)``.
        bytes_: device-memory bytes (each tensor argument once).
    """

    graph: str
    dtype: str
    precision: str
    name: str
    kernel: str
    pointers: dict[str, str]
    scalars: dict[str, int | float]
    flags: dict[str, Any]
    shape: tuple
    bytes_: float

    @property
    def is_attention(self) -> bool:
        return self.kernel == "attention"

    @property
    def flops(self) -> float:
        if self.is_attention:
            G, T, D = self.shape
            return 2.0 * G * T * T * (D + D)
        M, N, K, products = self.shape
        return 2.0 * M * N * K * products

    def configs(self) -> tuple[Config, ...]:
        table = ATTENTION_CONFIGS if self.is_attention else MATMUL_CONFIGS
        return table["bf16" if self.dtype == "bf16" else "f32"]


# ---------------------------------------------------------------------------- launches


def launches(graph: str, dtype: str, precision: str, scale: int = 1) -> list[Launch]:
    """The Triton launches for one graph's matmul and attention work, at the sizes of
    ``opfuse.frontends.builder.graphs.graphs(scale, dtype)[graph]``."""
    from opfuse.frontends.builder.graphs import graphs

    shapes = {t.name: t.shape for t in graphs(scale=scale, dtype=dtype)[graph].inputs}
    elem = 2 if dtype == "bf16" else 4
    ty = "bf16" if dtype == "bf16" else "fp32"

    def linear(name, M, N, K, *, bias=True, gelu=False, residual=False, out_ld=None):
        ptrs = {p: ty for p in ("x", "w", "bias", "res", "out")}
        nbytes = elem * (M * K + K * N + (N if bias else 0) + M * N * (2 if residual else 1))
        return Launch(graph, dtype, precision, name, "linear", ptrs,
                      {"M": M, "N": N, "K": K, "stride_xm": K, "stride_wk": N,
                       "stride_om": out_ld or N, "stride_rm": N},
                      {"BIAS": bias, "GELU": gelu, "RESIDUAL": residual}, (M, N, K, 1), nbytes)

    def attention(name, B, H, T, D, *, qkv_ld=None):
        # qkv_ld: Q/K/V are column blocks of one packed [B*T, 3 H D] tensor (G6) and O is
        # written [B, T, H, D]; otherwise [B, H, T, D] each
        if qkv_ld:
            qs = (T * qkv_ld, D, qkv_ld)
            os_ = (T * H * D, D, H * D)
        else:
            qs = os_ = (H * T * D, T * D, D)
        strides = {f"stride_{t}{d}": s for t, st in (("q", qs), ("k", qs), ("v", qs), ("o", os_))
                   for d, s in zip("bht", st)}
        return Launch(graph, dtype, precision, name, "attention",
                      {p: ty for p in ("q", "k", "v", "o")},
                      {"sm_scale": 1.0 / math.sqrt(D), "T": T, "H": H, **strides},
                      {"HEAD_DIM": D}, (B * H, T, D), float(4 * elem * B * H * T * D))

    if graph == "g1_mlp":
        n, d = shapes["x"]
        return [linear("fc1+gelu", n, d, d, gelu=True), linear("fc2+gelu", n, d, d, gelu=True)]
    if graph == "g5_attention":
        B, H, T, D = shapes["q"]
        return [attention("attention", B, H, T, D)]
    if graph == "g6_encoder_layer":
        B, T, dm = shapes["x"]
        ff = shapes["w1"][1]
        M, H = B * T, G6_HEADS
        return [
            linear("qkv", M, 3 * dm, dm),  # one matmul over [wq | wk | wv] and their biases
            attention("attention", B, H, T, dm // H, qkv_ld=3 * dm),
            linear("o_proj+residual", M, dm, dm, residual=True),
            linear("ffn1+gelu", M, ff, dm, gelu=True),
            linear("ffn2+residual", M, dm, ff, residual=True),
        ]
    if graph == "g7_rmsnorm_swiglu":
        n, d = shapes["x"]
        f = shapes["w_gate"][1]
        swiglu = Launch(graph, dtype, precision, "gate+up+swiglu", "swiglu",
                        {p: ty for p in ("x", "w_gate", "w_up", "out")},
                        {"M": n, "N": f, "K": d, "stride_xm": d, "stride_wk": f, "stride_om": f},
                        {}, (n, f, d, 2), float(elem * (n * d + 2 * d * f + n * f)))
        return [swiglu, linear("down_proj", n, d, f, bias=False)]
    raise ValueError(f"no Triton launches for graph {graph!r}")


# ------------------------------------------------------------------ what triton compiles


ARG_ORDER = {
    "linear": ("x", "w", "bias", "res", "out", "M", "N", "K", "stride_xm", "stride_wk",
               "stride_om", "stride_rm"),
    "swiglu": ("x", "w_gate", "w_up", "out", "M", "N", "K", "stride_xm", "stride_wk",
               "stride_om"),
    "attention": ("q", "k", "v", "o", "sm_scale", "T", "H",
                  *(f"stride_{t}{d}" for t in "qkvo" for d in "bht")),
}


def signature(launch: Launch, config: Config) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` for ``triton.compiler.ASTSource``, as Triton's JIT
    specializes a launch: pointers (torch allocations, 16-byte aligned; the packed Q/K/V
    offsets are multiples of 16 bytes) and integers divisible by 16 get
    ``tt.divisibility`` 16; the block sizes, flags and precision are constexprs."""
    sig: dict[str, str] = {}
    attrs: dict[tuple, list] = {}
    for i, arg in enumerate(ARG_ORDER[launch.kernel]):
        if arg in launch.pointers:
            sig[arg] = "*" + launch.pointers[arg]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            value = launch.scalars[arg]
            if isinstance(value, float):
                sig[arg] = "fp32"
            else:
                sig[arg] = "i32" if -2**31 <= value < 2**31 else "i64"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
    consts: dict[str, Any] = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                              "PRECISION": "tf32" if launch.precision == "tf32" else "ieee",
                              **launch.flags}
    if not launch.is_attention:
        consts.update(BLOCK_K=config.block_k, GROUP_M=config.group_m)
    for name in consts:
        sig[name] = "constexpr"
    return sig, consts, attrs


def grid(launch: Launch, config: Config) -> tuple[int, int, int]:
    if launch.is_attention:
        G, T, _ = launch.shape
        return (-(-T // config.block_m), G, 1)
    M, N, _, _ = launch.shape
    return (-(-M // config.block_m) * -(-N // config.block_n), 1, 1)


def estimate_meta(launch: Launch, config: Config, kind: str | None) -> dict:
    """The KernelSpec-like facts :mod:`opfuse.cost.gpu_time` reads (as opfuse's
    emitters record them): the tile, the problem, the operand type, the MMA kind."""
    operands = "bf16" if launch.dtype == "bf16" else "f32"
    if launch.is_attention:
        G, T, D = launch.shape
        return {"problem": [G, T, T, D, D], "tile": [config.block_m, config.block_n],
                "padded": (D, D), "causal": None, "operands": operands, "mma": kind}
    M, N, K, products = launch.shape
    # SwiGLU's two products on one A tile: opfuse's horizontal kernels say it the same way
    return {"problem": [1, M, N, K], "tile": [config.block_m, config.block_n, config.block_k],
            "ranges": [N], "products": [products], "shared_a": True, "operands": operands,
            "mma": kind}


_INSTRUCTIONS = {
    "wgmma": re.compile(r"^\s*wgmma\.mma_async", re.M),
    "mma.sync": re.compile(r"^\s*mma\.sync", re.M),
    "ldmatrix": re.compile(r"^\s*ldmatrix", re.M),
    "cp.async": re.compile(r"^\s*cp\.async\.c[ag]", re.M),
    "tma": re.compile(r"^\s*cp\.async\.bulk\.tensor", re.M),
    "fma.f32": re.compile(r"^\s*fma\.rn\.f32", re.M),
}


def instructions(ptx: str) -> list[str]:
    """Which of wgmma, mma.sync, ldmatrix, cp.async, TMA, f32 FMA the PTX issues."""
    return [name for name, pattern in _INSTRUCTIONS.items() if pattern.search(ptx)]


def tensor_kind(launch: Launch, found: list[str]) -> str | None:
    """The estimate's MMA kind: the precision's when the PTX has a tensor-core MMA,
    None (FFMA) otherwise (f32 IEEE always)."""
    if launch.precision == "ieee" or not ({"wgmma", "mma.sync"} & set(found)):
        return None
    return launch.precision


def estimate_row(launch: Launch, config: Config, facts: dict[int, dict],
                 dev: estimate.Device) -> dict:
    """The JSON row of one compiled launch: its facts per arch (``facts[90]``, ``[80]``:
    ``registers``, ``spills``, ``smem``, ``instructions``) and the estimate of the first
    arch's on ``dev`` by opfuse's model, with what the model cannot represent said."""
    main = facts[ARCHES[0]]
    kind = tensor_kind(launch, main["instructions"])
    meta = estimate_meta(launch, config, kind)
    g = grid(launch, config)
    block = (32 * config.num_warps, 1, 1)
    fn = estimate.attention_kernel if launch.is_attention else estimate.matmul_kernel
    args = dict(grid=g, block=block, meta=meta, flops=launch.flops, bytes_=launch.bytes_,
                registers=main["registers"], smem=main["smem"])
    est = fn(dev, **args)
    notes = []
    if "wgmma" in main["instructions"]:
        # the model prices it at mma.sync's 62 % of the dense peak with 8 warps to keep it
        # busy; estimate_wgmma_s: the dense peak and one warpgroup (4 warps) instead
        notes.append("wgmma priced as mma.sync (no wgmma rate in the model)")
        wg = dataclasses.replace(dev, mma_sync_flops=dict(dev.tensor_flops), busy_warps_mma=4)
        est["estimate_wgmma_s"] = fn(wg, **args).get("estimate_s")
    if "tma" in main["instructions"]:
        notes.append("TMA copies not modelled (priced as loads)")
    if launch.precision != "ieee" and kind is None:
        notes.append("no tensor-core MMA in the PTX: estimated as FFMA")
    if main["spills"]:
        notes.append(f"spills {main['spills']} bytes (not modelled)")
    row = {
        "graph": launch.graph, "dtype": launch.dtype, "precision": launch.precision,
        "compare_with": COMPARE_WITH[launch.precision], "name": launch.name,
        "kernel": launch.kernel, "config": config.to_json(), "grid": list(g),
        "block": list(block), "tile": meta["tile"], "smem": main["smem"],
        "spills": main["spills"], "instructions": main["instructions"],
        **{f"sm_{a}": facts[a] for a in ARCHES[1:] if a in facts},
        "model_notes": notes,
    }
    row.update({k: est[k] for k in _KEEP if k in est})
    return row


_KEEP = ("estimate_s", "estimate_wgmma_s", "roofline_s", "compute_s", "memory_s", "bound",
         "blocks", "blocks_per_sm", "waves", "occupancy", "registers", "flops",
         "executed_flops", "bytes", "not_available")


def choose(rows: list[dict]) -> dict:
    """The candidate a user keeps: the lowest estimate among those without spills; if all
    spill, the one spilling least (the model does not price spills); the first candidate
    if none fits on an SM."""
    fit = [r for r in rows if "estimate_s" in r]
    if not fit:
        return rows[0]
    return min(fit, key=lambda r: (r["spills"] > 0, r["spills"], r["estimate_s"]))


def totals(rows: list[dict]) -> list[dict]:
    """Per graph, dtype and precision: the kernels' estimates summed (and the wgmma
    variant: its estimate where a kernel has wgmma, the plain one where not)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["graph"], r["dtype"], r["precision"])
        t = out.setdefault(key, {"graph": key[0], "dtype": key[1], "precision": key[2],
                                 "compare_with": r["compare_with"], "kernels": 0,
                                 "estimate_s": 0.0, "estimate_wgmma_s": 0.0, "roofline_s": 0.0})
        t["kernels"] += 1
        t["estimate_s"] += r["estimate_s"]
        t["estimate_wgmma_s"] += r.get("estimate_wgmma_s", r["estimate_s"])
        t["roofline_s"] += r["roofline_s"]
    return list(out.values())


# ------------------------------------------------------------------------- compiling


def compile_facts(launch: Launch, config: Config, arch: int) -> dict:
    """Compile one launch with triton for ``arch`` (no GPU) and read its facts (memoized:
    G1's two layers, for one, are the same kernel)."""
    sig, consts, attrs = signature(launch, config)
    key = (launch.kernel, arch, config, tuple(sig.items()), tuple(consts.items()),
           tuple(sorted(attrs)))
    if key not in _FACTS:
        _FACTS[key] = _compile(launch.kernel, sig, consts, attrs, config, arch)
    return dict(_FACTS[key])


_FACTS: dict[tuple, dict] = {}


def _compile(kernel: str, sig: dict, consts: dict, attrs: dict, config: Config,
             arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import sm_arch_from_capability
    from triton.compiler import ASTSource

    from opfuse import tempdirs
    from opfuse.backends.gpu.lower import ptxas

    from . import triton_kernels

    chip = sm_arch_from_capability(arch)
    knobs = triton.knobs
    saved = (knobs.nvidia.dump_ptxas_log, knobs.cache.dir)
    log = io.StringIO()
    # A fresh cache, so that Triton runs its ptxas (its own flags) and prints the -v log
    # it otherwise discards: registers and spills of the very cubin it built.
    knobs.nvidia.dump_ptxas_log, knobs.cache.dir = True, str(tempdirs.new_folder("triton"))
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                ASTSource(triton_kernels.KERNELS[kernel], sig, consts, attrs),
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": config.num_warps, "num_stages": config.num_stages,
                         "enable_fp_fusion": True})
    finally:
        shutil.rmtree(knobs.cache.dir, ignore_errors=True)
        knobs.nvidia.dump_ptxas_log, knobs.cache.dir = saved
    compile_s = time.perf_counter() - t0
    name = compiled.metadata.name
    res = ptxas.parse_verbose(log.getvalue(), chip).get(name)
    if res is None:
        raise RuntimeError(f"no ptxas -v figures for {name} in Triton's log")
    return {"chip": chip, "registers": res.registers,
            "spills": res.spill_stores + res.spill_loads, "smem": int(compiled.metadata.shared),
            "instructions": instructions(compiled.asm["ptx"]), "compile_s": round(compile_s, 3)}


def section(names=GRAPHS, dtypes=("bf16", "f32"), scale: int = 1,
            dev: estimate.Device | None = None, log: Callable[[str], None] = print) -> dict:
    """The ``triton`` part of bench.json's ``gpu_estimate`` section, or why there is none."""
    try:
        import triton
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    except ImportError as e:
        return {"not_available": f"triton not installed ({e}); pip install '.[bench]'"}
    from opfuse.backends.gpu.lower import ptxas

    dev = dev or estimate.device("sm_90")
    rows, failed = [], []
    for dtype in dtypes:
        for graph in names:
            for precision in PRECISIONS[dtype]:
                for launch in launches(graph, dtype, precision, scale):
                    try:
                        rows.append(_best(launch, dev))
                    except Exception as e:  # a kernel Triton cannot build is a figure
                        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        failed.append({"graph": graph, "dtype": dtype, "precision": precision,
                                       "name": launch.name, "reason": reason[:300]})
                        log(f"  triton {graph} {dtype} {precision} {launch.name}: {reason[:200]}")
            log(f"  triton: {graph} {dtype} ({len(rows)} kernel rows so far)")
    chips = [sm_arch_from_capability(a) for a in ARCHES]
    return {"version": triton.__version__, "method": METHOD, "config_choice": CONFIG_CHOICE,
            "chips": chips, "device": dev.name,
            "ptxas": {c: ptxas.version(get_ptxas(a).path) for c, a in zip(chips, ARCHES)},
            "kernels": rows, "graphs": totals(rows), "failed": failed}


def _best(launch: Launch, dev: estimate.Device) -> dict:
    """Every candidate compiled for the first arch and estimated; the chosen one also
    compiled for the others."""
    candidates = []
    for config in launch.configs():
        facts = {ARCHES[0]: compile_facts(launch, config, ARCHES[0])}
        candidates.append((estimate_row(launch, config, facts, dev), config, facts))
    best = choose([c[0] for c in candidates])
    _, config, facts = next(c for c in candidates if c[0] is best)
    for arch in ARCHES[1:]:
        facts[arch] = compile_facts(launch, config, arch)
    row = estimate_row(launch, config, facts, dev)
    row["candidates"] = [
        {**cfg.to_json(), "estimate_s": r.get("estimate_s", r.get("not_available")),
         "spills": r["spills"],
         "registers": r.get("registers"), "smem": r["smem"]}
        for r, cfg, _ in candidates
    ]
    return row


def markdown(section: dict) -> list[str]:
    """bench.md's Triton table: one row per kernel (estimates in µs), or why there is none."""
    if "not_available" in section:
        return [f"Triton peer: n/a ({section['not_available']})."]
    lines = [
        f"Triton {section['version']} kernels for the same work, compiled for "
        f"{' and '.join(section['chips'])} without a GPU, **estimated** for an "
        f"{section['device']} with the same model (registers: Triton's ptxas -v, "
        f"{section['ptxas'][section['chips'][0]]}); blocks: {section['config_choice']}.",
        "",
        "| graph | dtype | precision | kernel | BLOCK M×N×K | warps | stages | grid | registers "
        "| spills | smem KB | PTX (sm_90a) | sm_80 registers / spills | estimate µs "
        "| at the wgmma peak µs | roofline µs | model notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in section["kernels"]:
        c, a = r["config"], r.get("sm_80", {})
        block = f"{c['block_m']}×{c['block_n']}" + (f"×{c['block_k']}" if c["block_k"] else "")
        wg = r.get("estimate_wgmma_s")
        lines.append(
            f"| {r['graph']} | {r['dtype']} | {r['precision']} | {r['name']} ({r['kernel']}) "
            f"| {block} | {c['num_warps']} | {c['num_stages']} | {'×'.join(map(str, r['grid']))} "
            f"| {r['registers']} | {r['spills']} | {r['smem'] / 1024:.0f} "
            f"| {', '.join(r['instructions'])} "
            f"| {a.get('registers', '-')} / {a.get('spills', '-')} | {r['estimate_s'] * 1e6:.1f} "
            f"| {f'{wg * 1e6:.1f}' if wg else '-'} "
            f"| {r['roofline_s'] * 1e6:.1f} | {'; '.join(r['model_notes']) or '-'} |"
        )
    for f in section["failed"]:
        lines.append(f"\nTriton failed: {f['graph']} {f['dtype']} {f['precision']} {f['name']}: "
                     f"{f['reason']}")
    return lines


__all__ = ["ARCHES", "Config", "Launch", "choose", "compile_facts", "estimate_row", "grid",
           "instructions", "launches", "section", "signature", "totals"]
