"""fuse-run: compile a graph with and without fusion, run both, compare and time them.

    fuse-run examples/g2_elementwise_chain.mlir            # random inputs, seed 0
    fuse-run graph.mlir --inputs x.npy,w.npy --save-outputs out/
    fuse-run graph.mlir --inputs out/                      # replay out/in0.npy, in1.npy, ...
    fuse-run graph.mlir --repeat 0 --json                  # check only, as JSON
    fuse-run graph.mlir --disable-pass=opfuse-fuse-reduction --report=text
    fuse-run graph.mlir --report out/                      # out/report.html, .json, .txt
    fuse-run graph.mlir --bisect                           # the first fusion that changes results

The baseline is the unfused program: the same module outlined one op per kernel
(``opfuse.compile(..., fusion=False)``), lowered, compiled and run exactly like the fused
one, so the two differ only by fusion. Both run once on the same inputs and their outputs
are compared element by element; then both are timed, calls interleaved.

``--fusion-fuel=N`` applies only the first N fusions to the fused program; ``--bisect``
searches N for the first fusion whose program differs from the unfused one beyond the
tolerance (assuming that once a fusion breaks the results, later ones do not repair them).

Exit codes: 0 ok, 1 user error, 2 internal error, 3 fused and unfused outputs differ beyond
the tolerance (the summary is printed, and --save-outputs written, before exiting; with
--bisect: the first fusion that makes them differ is printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from mlir import ir

import opfuse
from opfuse import config
from opfuse import pipeline as pl
from opfuse.api import BACKENDS
from opfuse.errors import EXIT_OK, OpfuseError
from opfuse.report import ledger as ledger_mod
from opfuse.report import render as render_mod
from opfuse.runtime.schedule import contiguous
from opfuse.runtime.executable import (
    Executable,
    Signature,
    TensorSpec,
    bf16_bits_to_float32,
    find_entry,
    float32_to_bf16_bits,
    signature_of,
)

# Imported here, not on first use inside opfuse.compile, so that the "compile + JIT" row
# of the first program compiled measures compilation rather than module imports.
from opfuse.codegen import cpu as _cpu_codegen  # noqa: F401
from opfuse.runtime import cpu as _cpu_runtime  # noqa: F401

from . import cli

EXIT_MISMATCH = 3

#: Default (rtol, atol) per element type; an element passes when
#: |fused - unfused| <= atol + rtol * |unfused| (numpy.isclose), NaN equal to NaN.
#: In f32, fused and unfused run the same ops in the same order per element today
#: (bit-identical on G1-G8); these leave room for what fusion may legitimately change:
#: reassociated reductions and contracted multiply-adds, a few ulps over a kernel. In f16
#: and bf16 a fused kernel may also skip rounding its intermediates to the element type
#: (seen: 1-ulp differences on a bf16 add-exp-mul chain), hence a few ulps of those types.
TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-12, 1e-14),
    "f32": (1e-5, 1e-6),
    "f16": (1e-2, 1e-3),
    "bf16": (2e-2, 1e-2),
}
#: Integer outputs must match exactly.
EXACT = (0.0, 0.0)

#: Random inputs: floats uniform in [RANDOM_LOW, RANDOM_HIGH), drawn in float64 and rounded
#: to the element type (as ``Graph.random_inputs`` does); integers uniform in
#: [INT_LOW, INT_HIGH). One generator per run, inputs drawn in argument order.
RANDOM_LOW, RANDOM_HIGH = -1.0, 1.0
INT_LOW, INT_HIGH = -8, 8

DEFAULT_REPEAT = 3
DEFAULT_WARMUP = 0

#: Elements compared per step (bounds the float64 temporaries on large outputs).
_CHUNK = 1 << 20


# --- inputs -------------------------------------------------------------------------------


def random_inputs(signature: Signature, seed: int) -> list[np.ndarray]:
    """Seeded random inputs for ``signature`` (see RANDOM_LOW/HIGH, INT_LOW/HIGH); bf16
    inputs are uint16 bit patterns."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in signature.inputs:
        if spec.element_type == "bf16":
            values = rng.uniform(RANDOM_LOW, RANDOM_HIGH, spec.shape).astype(np.float32)
            arrays.append(float32_to_bf16_bits(values))
        elif np.issubdtype(spec.dtype, np.floating):
            arrays.append(rng.uniform(RANDOM_LOW, RANDOM_HIGH, spec.shape).astype(spec.dtype))
        else:
            arrays.append(rng.integers(INT_LOW, INT_HIGH, spec.shape, dtype=spec.dtype))
    return arrays


def _nbytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * spec.dtype.itemsize


def available_memory() -> int | None:
    """Bytes of memory available now (MemAvailable on Linux), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(signature: Signature) -> None:
    """Refuse a run whose inputs and outputs (fused and unfused) alone need more memory
    than the machine has available, before allocating any of it (numpy would raise
    MemoryError, or the kernel's OOM killer end the process)."""
    need = sum(_nbytes(s) for s in signature.inputs) + 2 * sum(
        _nbytes(s) for s in signature.outputs)
    have = available_memory()
    if have is not None and need > have:
        gib = 2**30
        raise OpfuseError(
            f"@{signature.name}: its inputs and the fused and unfused outputs need "
            f"{need / gib:.3g} GiB, more than the {have / gib:.3g} GiB of memory available "
            "here")


def input_paths(text: str, signature: Signature) -> list[Path]:
    """The files ``--inputs`` names: a comma-separated list, or one directory holding
    ``in0.npy``, ``in1.npy``, ... (what --save-outputs writes)."""
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise OpfuseError(f"--inputs: empty file name in '{text}'")
    if len(items) == 1 and Path(items[0]).is_dir():
        return [Path(items[0]) / f"in{i}.npy" for i in range(len(signature.inputs))]
    if len(items) != len(signature.inputs):
        raise OpfuseError(
            f"--inputs: @{signature.name} takes {len(signature.inputs)} input(s) "
            f"({_types(signature.inputs)}), got {len(items)} file(s)"
        )
    return [Path(s) for s in items]


def load_inputs(paths: Sequence[Path], signature: Signature) -> list[np.ndarray]:
    """Load and check one ``.npy`` per input (exact dtype and shape, no casts)."""
    return [_check_input(_load_npy(p), spec, i, p) for i, (p, spec) in
            enumerate(zip(paths, signature.inputs))]


def _load_npy(path: Path) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic[:2] == b"PK":  # a zip archive: np.savez's .npz
            raise OpfuseError(f"--inputs: {path} is an .npz archive; pass one .npy per input")
        if magic != b"\x93NUMPY":
            raise OpfuseError(f"--inputs: {path} is not a .npy file (no .npy header)")
        return np.load(path, allow_pickle=False)
    except OSError as e:
        raise OpfuseError(f"--inputs: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # object arrays (pickles), truncated or corrupt files
        raise OpfuseError(f"--inputs: cannot load {path}: {e}") from None


def _check_input(array: np.ndarray, spec: TensorSpec, index: int, path: Path) -> np.ndarray:
    what = f"--inputs: {path} (input #{index}, {spec})"
    if spec.element_type == "bf16" and array.dtype.name == "bfloat16":
        array = array.view(np.uint16)  # ml_dtypes.bfloat16: the same bits
    if array.dtype != spec.dtype:
        hint = ""
        if spec.element_type == "bf16":
            hint = (" (bf16 inputs are uint16 bit patterns: see "
                    "opfuse.runtime.executable.float32_to_bf16_bits)")
        raise OpfuseError(f"{what}: dtype {array.dtype}, expected {spec.dtype}{hint}")
    if tuple(array.shape) != spec.shape:
        raise OpfuseError(f"{what}: shape {tuple(array.shape)}, expected {spec.shape}")
    return contiguous(array)


def _types(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(map(str, specs)) or "none"


# --- comparing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Fused against unfused for one output.

    Attributes:
        max_abs: max |fused - unfused| (NaN if only one side is NaN somewhere).
        max_rel: max |fused - unfused| / |unfused| over elements where unfused != 0
            (elements where it is 0 are judged by max_abs and atol).
        mismatches: elements outside ``atol + rtol * |unfused|``.
        elements: elements compared.
        rtol, atol: the tolerance applied.
        worst: index of the worst mismatching element, with (fused, unfused) there.
    """

    max_abs: float
    max_rel: float
    mismatches: int
    elements: int
    rtol: float
    atol: float
    worst: tuple[tuple[int, ...], float, float] | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def default_tolerance(element_type: str) -> tuple[float, float]:
    """(rtol, atol) for outputs of this element type (TOLERANCES; integers exact)."""
    return TOLERANCES.get(element_type, EXACT)


def as_float64(array: np.ndarray, element_type: str) -> np.ndarray:
    """Values as float64 (bf16 bit patterns decoded)."""
    if element_type == "bf16":
        array = bf16_bits_to_float32(array)
    return np.asarray(array, dtype=np.float64)


def compare(
    fused: np.ndarray, unfused: np.ndarray, element_type: str, rtol: float, atol: float
) -> Comparison:
    """Compare two outputs of the same shape and element type, chunk by chunk."""
    f, u = fused.reshape(-1), unfused.reshape(-1)
    max_abs = max_rel = 0.0
    mismatches, worst, worst_diff = 0, None, -1.0
    for start in range(0, f.size, _CHUNK):
        fc = as_float64(f[start : start + _CHUNK], element_type)
        uc = as_float64(u[start : start + _CHUNK], element_type)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            same = (fc == uc) | (np.isnan(fc) & np.isnan(uc))  # also equal infinities
            diff = np.where(same, 0.0, np.abs(fc - uc))  # NaN where one side is NaN
            bad = ~(same | (diff <= atol + rtol * np.abs(uc)))
            rel = np.where(~same & (uc != 0), diff / np.abs(uc), 0.0)
        max_abs = _nan_max(max_abs, float(diff.max()))
        max_rel = _nan_max(max_rel, float(rel.max()))
        n_bad = int(np.count_nonzero(bad))
        if n_bad:
            mismatches += n_bad
            score = np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0)
            i = int(np.argmax(score))
            if score[i] > worst_diff:
                worst_diff = float(score[i])
                index = tuple(int(k) for k in np.unravel_index(start + i, fused.shape))
                worst = (index, float(fc[i]), float(uc[i]))
    return Comparison(max_abs, max_rel, mismatches, int(f.size), rtol, atol, worst)


def _nan_max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


# --- programs -----------------------------------------------------------------------------


@dataclass
class Program:
    """One compiled variant (fused or unfused), bound to the run's inputs."""

    label: str
    exe: Executable
    compile_s: float
    run: Callable[[], list[np.ndarray]]
    times: list[float] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        return self.exe.report["totals"]["after"]


def build_program(
    label: str,
    module: Any,
    inputs: Sequence[np.ndarray],
    *,
    fuel: int | None = None,
    **compile_args: Any,
) -> Program:
    """Compile (``opfuse.compile``), JIT and bind ``inputs`` once: ``run()`` then calls the
    compiled code only, writing the same output arrays each time.

    Args:
        fuel: apply only the first ``fuel`` fusions (None: all).
        **compile_args: for ``opfuse.compile``; with ``dump_dir``, the lowered CPU module is
            dumped next to the pipeline's stages.
    """
    t0 = time.perf_counter()
    with ledger_mod.fuel_limit(fuel):
        exe = opfuse.compile(module, **compile_args)
    # Executable has no public bind() yet; its programs do (the CPU program, and the cuda
    # runtime's contract in executable.py). Binding once keeps validation, marshalling and
    # the first touch of fresh output pages out of every timed call.
    run = exe._compiled().bind(*inputs)
    compile_s = time.perf_counter() - t0
    if compile_args.get("dump_dir") is not None and exe.backend == "cpu":
        dump_stage(Path(compile_args["dump_dir"]), "cpu", exe.ir("cpu"))
    return Program(label, exe, compile_s, run)


def dump_stage(root: Path, stage: str, text: str) -> None:
    """Add ``NN-<stage>.mlir`` after the pipeline's last step in the one run folder the
    pipeline made under ``root`` (fuse-run gives every program a root of its own)."""
    runs = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    if len(runs) != 1:
        return
    steps = [f for f in runs[0].glob("[0-9][0-9]-*.mlir")]
    try:
        (runs[0] / f"{len(steps):02d}-{stage}.mlir").write_text(text)
    except OSError as e:
        raise OpfuseError(f"cannot write the {stage} dump under {runs[0]}: {e.strerror}") from None


def dump_folders(args: argparse.Namespace, stem: str) -> Path | None:
    """A fresh folder for this fuse-run invocation under --dump-dir (or $OPFUSE_DUMP_DIR):
    each program compiled gets a subfolder (``unfused``, ``fused``, ``fuel-N``) holding
    the pipeline's dumps and the lowered CPU module, so nothing is ever overwritten."""
    root = Path(args.dump_dir) if args.dump_dir else config.DUMP_DIR.path()
    if root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{stem}-fuse-run-", dir=root))
    except OSError as e:
        raise OpfuseError(f"cannot create dump folder in {root}: {e.strerror}") from None


def time_interleaved(programs: Sequence[Program], repeat: int, warmup: int) -> None:
    """Append ``repeat`` timed calls to each program's ``times``, alternating the order
    (A B, B A, ...) so that drift and order effects fall on both alike."""
    for _ in range(warmup):
        for p in programs:
            p.run()
    for i in range(repeat):
        for p in programs if i % 2 == 0 else programs[::-1]:
            device_time = getattr(p.run, "device_time", None)
            if device_time is not None:  # cuda: kernels only, timed with CUDA events
                p.times.append(device_time())
                continue
            t0 = time.perf_counter()
            p.run()
            p.times.append(time.perf_counter() - t0)


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OpfuseError(f"--save-outputs: cannot create {folder}: {e.strerror or e}") from None


def save_arrays(folder: Path, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
    """``in<i>.npy`` for every input and ``out<i>.npy`` for every output (bf16 as uint16)."""
    _make_folder(folder)
    try:
        for prefix, arrays in (("in", inputs), ("out", outputs)):
            for i, a in enumerate(arrays):
                np.save(folder / f"{prefix}{i}.npy", a, allow_pickle=False)
    except OSError as e:
        message = f"--save-outputs: cannot write under {folder}: {e.strerror or e}"
        raise OpfuseError(message) from None


# --- the run ------------------------------------------------------------------------------


@dataclass
class Result:
    """Everything fuse-run measured, for the table and for --json."""

    args: argparse.Namespace
    filename: str
    signature: Signature
    inputs_from: str
    unfused: Program
    fused: Program
    checks: list[Comparison]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _run_bundle(args: argparse.Namespace) -> int:
    """``--bundle``: run an AOT bundle (no compiler involved) on --backend, compare it with
    the bundle's CPU library, and time both."""
    from opfuse.runtime import bundle as bundle_mod  # noqa: PLC0415
    from opfuse.runtime import cuda  # noqa: PLC0415

    if args.input == "-":
        raise OpfuseError("--bundle needs the bundle's path")
    b = bundle_mod.load(args.input)
    backend = args.backend
    if backend == "auto":
        backend = "cuda" if cuda.available() else "cpu"
    elif backend == "cuda":
        try:
            cuda.driver()
        except OpfuseError as e:
            raise OpfuseError(f"--backend cuda: {e}") from None
    result = bundle_mod.check(b, backend, repeat=args.repeat, seed=args.seed or 0)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"fuse-run: bundle {args.input} @{b.entry} on {backend} ({len(b.kernels)} kernels)")
        for i, o in enumerate(result.get("outputs", [])):
            print(f"  output #{i}: max |{backend} - cpu| = {o['max_abs_err']:.3g} "
                  f"{'ok' if o['ok'] else 'MISMATCH'}")
        for key, t in result.items():
            if key.startswith("time_"):
                print(f"  {key[5:-2]}: min {t['min'] * 1e3:.3f} ms, median {t['median'] * 1e3:.3f} ms")
    return EXIT_OK if result.get("ok", True) else EXIT_MISMATCH


def _run(argv: list[str]) -> int:
    registry = pl.registry()
    parser = build_parser(registry)
    rest, flags = cli.take_pass_flags(argv, set(registry))
    args = parser.parse_args(cli.long_options(parser, rest))
    if args.bundle:
        return _run_bundle(args)
    _check_args(args)
    pipeline = cli.select_pipeline(args, flags)
    text, filename = cli.read_input(args.input)
    module = cli.parse_and_accept(text, filename, args)
    entry = _find_entry(module, args.entry)
    signature = signature_of(entry)
    prune_to_entry(module, signature.name)

    check_memory(signature)
    if args.save_outputs:  # fail before the slow part, not after it
        _make_folder(Path(args.save_outputs))
    inputs, inputs_from = _choose_inputs(args, signature)

    dumps = dump_folders(args, Path(filename).stem if filename != "<stdin>" else "stdin")
    common = dict(backend=args.backend, target=args.target, entry=signature.name,
                  max_tensor_bytes=args.max_tensor_bytes, threads=args.threads)
    if pipeline is not None:
        fused_args: dict[str, Any] = dict(pipeline=pipeline)
    else:
        fused_args = dict(disable=tuple(args.disable_pass))

    def where(name: str) -> dict[str, Any]:
        return dict(dump_dir=dumps / name) if dumps is not None else {}

    if args.bisect:
        run = Bisection(args, filename, signature, inputs, inputs_from, module, where,
                        {**common, **fused_args}, common)
        return run.report(run.search())
    unfused = build_program("unfused", module, inputs, fusion=False, **common, **where("unfused"))
    fused = build_program("fused", module, inputs, fuel=args.fusion_fuel, **common,
                          **fused_args, **where("fused"))
    fused.exe.report["source"] = filename

    # The checked run, each program's first call: it also warms up the JIT code and the
    # output pages. Each program writes its own bound output arrays, so these stay valid
    # (no copies of large outputs) until the timed calls below rewrite them.
    outs_unfused = unfused.run()
    outs_fused = fused.run()
    checks = [
        compare(f, u, spec.element_type, *(args.tolerance or default_tolerance(spec.element_type)))
        for f, u, spec in zip(outs_fused, outs_unfused, signature.outputs)
    ]
    if args.save_outputs:
        save_arrays(Path(args.save_outputs), inputs, outs_fused)
    time_interleaved([unfused, fused], args.repeat, args.warmup)

    result = Result(args, filename, signature, inputs_from, unfused, fused, checks)
    if args.report and args.report not in render_mod.FORMATS:
        write_report_dir(Path(args.report), fused.exe.report)
    _print(result)
    if not result.ok:
        return cli.print_error(mismatch_error(result))
    return EXIT_OK


def _choose_inputs(args: argparse.Namespace, signature: Signature) -> tuple[list[np.ndarray], str]:
    """The inputs (--inputs files, else seeded random ones) and a line saying which."""
    if args.inputs is not None:
        paths = input_paths(args.inputs, signature)
        return load_inputs(paths, signature), ", ".join(map(str, paths))
    inputs = random_inputs(signature, args.seed)
    return inputs, f"random uniform [{RANDOM_LOW:g}, {RANDOM_HIGH:g}), seed {args.seed}"


def _find_entry(module: Any, entry: str | None) -> Any:
    try:
        return find_entry(module, entry)
    except OpfuseError as e:  # its hint names the API's keyword; say the flag
        raise OpfuseError(str(e).replace("name one with entry=", "name one with --entry NAME"))


def prune_to_entry(module: ir.Module, entry: str) -> None:
    """Erase the functions ``@entry`` does not call (directly or not), so that compile
    time and the kernel and byte counts are the entry's, not the whole module's."""
    funcs = {}
    for op in module.body.operations:
        if op.operation.name == "func.func":
            funcs[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op.operation
    reachable, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in reachable or name not in funcs:
            continue
        reachable.add(name)
        todo += _callees(funcs[name])
    for name, op in funcs.items():
        if name not in reachable:
            op.erase()


def _callees(func: ir.Operation) -> list[str]:
    names = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        for key in op.attributes:  # iterating an attribute map gives the names
            attr = op.attributes[key]
            if isinstance(attr, ir.FlatSymbolRefAttr):
                names.append(attr.value)
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    return names


def _check_args(args: argparse.Namespace) -> None:
    if args.inputs is not None and args.seed is not None:
        raise OpfuseError("--seed has no effect with --inputs: give one or the other")
    if args.backend == "cuda":
        from opfuse.runtime import cuda  # noqa: PLC0415  (imports no GPU library itself)

        try:
            cuda.driver()
        except OpfuseError as e:
            raise OpfuseError(f"--backend cuda: {e}") from None
    if args.seed is None:
        args.seed = 0
    if args.json and args.report == "text":
        raise OpfuseError("--json embeds the fusion report as JSON: use --report=json with it")
    if args.report == "html":
        raise OpfuseError("--report html: the HTML report is written to a folder: "
                          "--report DIR writes DIR/report.html, report.json and report.txt")
    if args.bisect:
        clash = [f for f, on in (("--fusion-fuel", args.fusion_fuel is not None),
                                 ("--save-outputs", bool(args.save_outputs)),
                                 ("--report", bool(args.report))) if on]
        if clash:
            raise OpfuseError(f"--bisect chooses the fuel itself and only compares: "
                              f"drop {', '.join(clash)}")


def mismatch_error(result: Result) -> OpfuseError:
    """The exit-3 error: which outputs disagree, how many elements, and the worst one."""
    lines = []
    for i, (c, spec) in enumerate(zip(result.checks, result.signature.outputs)):
        if c.ok:
            continue
        line = (f"output #{i} ({spec}): {c.mismatches} of {c.elements} elements differ "
                f"beyond rtol {c.rtol:g}, atol {c.atol:g}; max abs {_num(c.max_abs)}, "
                f"max rel {_num(c.max_rel)}")
        if c.worst is not None:
            index, f, u = c.worst
            line += f"; worst at {list(index)}: fused {f!r}, unfused {u!r}"
        lines.append(line)
    message = "fused and unfused outputs differ beyond the tolerance"
    return OpfuseError(message, diagnostics=[f"error: {message}", *lines], exit_code=EXIT_MISMATCH)


# --- the fusion report as files -------------------------------------------------------------


REPORT_FILES = {"report.html": "html", "report.json": "json", "report.txt": "text"}


def write_report_dir(folder: Path, report: dict[str, Any]) -> None:
    """``report.html``, ``report.json`` and ``report.txt`` in ``folder`` (created)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, fmt in REPORT_FILES.items():
            (folder / name).write_text(render_mod.render(report, fmt), encoding="utf-8")
    except OSError as e:
        raise OpfuseError(f"--report: cannot write under {folder}: {e.strerror or e}") from None


# --- bisection over the fusion fuel -------------------------------------------------------------


@dataclass
class Trial:
    """One fused program compiled with ``fuel`` fusions, checked against the unfused one."""

    fuel: int | None
    checks: list[Comparison]
    report: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def applied(self) -> int:
        return max((d.get("step") or 0 for d in self.report["decisions"]), default=0)

    def line(self) -> str:
        fuel = "all" if self.fuel is None else str(self.fuel)
        if self.ok:
            return f"  fuel {fuel:>4}: ok"
        bad = next(c for c in self.checks if not c.ok)
        index = self.checks.index(bad)
        return (f"  fuel {fuel:>4}: MISMATCH (output #{index}: {bad.mismatches} of "
                f"{bad.elements} elements differ, max abs {_num(bad.max_abs)})")


class Bisection:
    """``fuse-run --bisect``: the smallest fuel N whose fused program differs from the
    unfused one; the N-th fusion applied is the first that changes the results."""

    def __init__(self, args: argparse.Namespace, filename: str, signature: Signature,
                 inputs: list[np.ndarray], inputs_from: str, module: Any,
                 where: Callable[[str], dict[str, Any]], fused_args: dict[str, Any],
                 common: dict[str, Any]) -> None:
        self.args, self.filename, self.signature = args, filename, signature
        self.inputs, self.inputs_from, self.module = inputs, inputs_from, module
        self.where, self.fused_args = where, fused_args
        unfused = build_program("unfused", module, inputs, fusion=False, **common,
                                **where("unfused"))
        self.reference = [a.copy() for a in unfused.run()]
        self.backend = unfused.exe.backend
        self.trials: list[Trial] = []

    def trial(self, fuel: int | None) -> Trial:
        name = "fused" if fuel is None else f"fuel-{fuel}"
        program = build_program(name, self.module, self.inputs, fuel=fuel, **self.fused_args,
                                **self.where(name))
        checks = [
            compare(f, u, spec.element_type,
                    *(self.args.tolerance or default_tolerance(spec.element_type)))
            for f, u, spec in zip(program.run(), self.reference, self.signature.outputs)
        ]
        result = Trial(fuel, checks, program.exe.report)
        self.trials.append(result)
        return result

    def search(self) -> int | None:
        """The step of the first fusion that makes the outputs differ; 0 when they differ
        with no fusion at all; None when the full fused program agrees."""
        full = self.trial(None)
        if full.ok:
            return None
        if not self.trial(0).ok:
            return 0
        lo, hi = 0, full.applied  # fuel lo agrees; fuel hi (all fusions: the full run) differs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if not self.trial(mid).ok else (mid, hi)
        return hi

    def report(self, step: int | None) -> int:
        # Planning is deterministic, so the full run's first N fusions are those of the run
        # with fuel N: the culprit's ledger entries are read from the full run.
        full = self.trials[0]
        lines = [f"fuse-run --bisect: {self.filename} @{self.signature.name} on {self.backend}",
                 f"inputs: {self.inputs_from}",
                 f"fusions applied by the full pipeline: {full.applied}", "trials:"]
        lines += [t.line() for t in self.trials]
        doc: dict[str, Any] = {"file": self.filename, "entry": self.signature.name,
                               "fusions": full.applied,
                               "trials": [{"fuel": t.fuel, "ok": t.ok} for t in self.trials],
                               "first_bad_fusion": None, "decisions": []}
        error = None
        if step is None:
            lines.append(f"all {full.applied} fusions keep the outputs within the tolerance")
        elif step == 0:
            lines.append("the outputs differ with no fusion applied (fuel 0): the difference "
                         "comes from the pipeline's other passes, not from a fusion")
            error = OpfuseError("fused and unfused outputs differ even with --fusion-fuel=0",
                                exit_code=EXIT_MISMATCH)
        else:
            culprit = [d for d in full.report["decisions"] if d.get("step") == step]
            doc["first_bad_fusion"], doc["decisions"] = step, culprit
            lines.append(f"first fusion that changes the results beyond the tolerance: "
                         f"#{step} of {full.applied}")
            lines += [f"  {render_mod.decision_line(d)}" for d in culprit]
            lines.append(f"reproduce: fuse-run {self.filename} --fusion-fuel={step} (differs), "
                         f"--fusion-fuel={step - 1} (agrees)")
            what = culprit[0] if culprit else {}
            error = OpfuseError(
                f"fusion #{step} changes the results beyond the tolerance: "
                f"[{what.get('pass_name', '?')}] {what.get('producer', '?')} -> "
                f"{what.get('consumer', '?')} at {what.get('location', '?')}",
                exit_code=EXIT_MISMATCH)
        if self.args.json:
            sys.stdout.write(json.dumps(_json_safe(doc), indent=2) + "\n")
        else:
            sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        return cli.print_error(error) if error is not None else EXIT_OK


# --- output -------------------------------------------------------------------------------


def _print(result: Result) -> None:
    args = result.args
    if args.json:
        sys.stdout.write(json.dumps(_json_safe(summary_json(result)), indent=2) + "\n")
        return
    if args.report in ("text", "json"):
        sys.stdout.write(render_mod.render(result.fused.exe.report, args.report) + "\n")
    sys.stdout.write("\n".join(summary_lines(result)) + "\n")
    if args.report and args.report not in render_mod.FORMATS:
        sys.stdout.write(f"report: {Path(args.report) / 'report.html'} "
                         "(and report.json, report.txt)\n")
    sys.stdout.flush()


def summary_lines(result: Result) -> list[str]:
    """The human-readable summary: a header line, the comparison table, the checks."""
    u, f = result.unfused, result.fused
    lines = [
        f"fuse-run: {result.filename} @{result.signature.name} on {_where(f.exe)}",
        f"inputs: {result.inputs_from}",
        "",
    ]
    rows = [
        ["", "unfused", "fused", "change"],
        ["kernels", str(u.totals["kernels"]), str(f.totals["kernels"]),
         _delta(f.totals["kernels"] - u.totals["kernels"])],
        ["device bytes", _bytes(u.totals["bytes"]), _bytes(f.totals["bytes"]),
         _percent(u.totals["bytes"], f.totals["bytes"])],
        ["flops", render_mod.human_flops(u.totals["flops"]),
         render_mod.human_flops(f.totals["flops"]),
         _percent(u.totals["flops"], f.totals["flops"])],
    ]
    if f.totals.get("copy_bytes") and f.exe.backend == "cpu":
        # arguments the program writes after reading them: copied, the caller's are read-only
        rows.append(["input copies", _bytes(u.totals.get("copy_bytes", 0)),
                     _bytes(f.totals["copy_bytes"]), ""])
    rows += [
        ["compile + JIT", _seconds(u.compile_s), _seconds(f.compile_s), ""],
    ]
    if result.args.repeat:
        for name, stat in (("median", statistics.median), ("min", min)):
            tu, tf = stat(u.times), stat(f.times)
            rows.append([f"time {name}", _seconds(tu), _seconds(tf), _speedup(tu, tf)])
    lines += _table(rows)
    if result.args.repeat:
        warmup = result.args.warmup
        extra = f" and {warmup} warm-up call{'s' if warmup != 1 else ''}" if warmup else ""
        repeat = result.args.repeat
        calls = f"{repeat} call{'s' if repeat != 1 else ''}"
        lines.append(f"timing: {calls} of each, fused and unfused interleaved, "
                     f"after the checked run{extra}")
    else:
        lines.append("timing: skipped (--repeat 0)")
    lines.append("")
    rows = [["output", "type", "max abs", "max rel", "rtol", "atol", "check"]]
    for i, (c, spec) in enumerate(zip(result.checks, result.signature.outputs)):
        check = "ok" if c.ok else f"MISMATCH ({c.mismatches} of {c.elements})"
        rows.append([f"#{i}", str(spec), _num(c.max_abs), _num(c.max_rel), f"{c.rtol:g}",
                     f"{c.atol:g}", check])
    return lines + _table(rows)


def summary_json(result: Result) -> dict[str, Any]:
    """Every figure of the run, machine-readable (times in seconds, bytes exact)."""
    args, u, f = result.args, result.unfused, result.fused

    def program(p: Program) -> dict[str, Any]:
        out: dict[str, Any] = {**p.totals, "compile_s": p.compile_s, "times_s": p.times}
        if p.times:
            out.update(median_s=statistics.median(p.times), min_s=min(p.times))
        return out

    doc: dict[str, Any] = {
        "file": result.filename,
        "entry": result.signature.name,
        "signature": str(result.signature),
        "backend": f.exe.backend,
        "threads": f.exe.threads if f.exe.backend == "cpu" else None,
        "threaded_kernels": list(f.exe.threaded_kernels) if f.exe.backend == "cpu" else None,
        "target": args.target,
        "pipeline": f.exe.report.get("pipeline"),
        "inputs": {"from": "files" if args.inputs is not None else "random",
                   "seed": None if args.inputs is not None else args.seed,
                   "description": result.inputs_from},
        "repeat": args.repeat,
        "warmup": args.warmup,
        "unfused": program(u),
        "fused": program(f),
        "outputs": [
            {"index": i, "type": str(spec), "max_abs": c.max_abs, "max_rel": c.max_rel,
             "rtol": c.rtol, "atol": c.atol, "mismatches": c.mismatches,
             "elements": c.elements, "ok": c.ok,
             "worst": None if c.worst is None else
             {"index": list(c.worst[0]), "fused": c.worst[1], "unfused": c.worst[2]}}
            for i, (c, spec) in enumerate(zip(result.checks, result.signature.outputs))
        ],
        "ok": result.ok,
    }
    if f.times:
        doc["speedup"] = {"median": statistics.median(u.times) / statistics.median(f.times),
                          "min": min(u.times) / min(f.times)}
    if args.report == "json":
        doc["report"] = f.exe.report
    elif args.report:
        doc["report_dir"] = str(args.report)
    return doc


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"), so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _where(exe: Executable) -> str:
    """``cpu, 2 threads`` (the CPU backend's thread count), or the backend's name."""
    if exe.backend != "cpu":
        return exe.backend
    label = f"cpu, {exe.threads} thread{'s' if exe.threads != 1 else ''}"
    if exe.threads > 1:
        threaded, kernels = exe.threaded_kernels
        if threaded < kernels:
            label += (f" ({threaded} of {kernels} kernels threaded; the others are under "
                      "OPFUSE_CPU_PARALLEL_MIN_US)")
    return label


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _delta(n: int) -> str:
    return f"{n:+d}" if n else "0"


def _bytes(n: int) -> str:
    return f"{render_mod.human_bytes(n)} ({n} B)" if n >= 1024 else f"{n} B"


def _percent(before: float, after: float) -> str:
    if before == after:
        return "0%"
    return f"{(after - before) / before * 100:+.1f}%" if before else "n/a"


def _seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.1f} ms"
    return f"{t * 1e6:.1f} us"


def _speedup(unfused: float, fused: float) -> str:
    if fused <= 0:
        return "n/a"
    ratio = unfused / fused
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{ratio:.2f}x (slower)"


def _num(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


# --- command line -------------------------------------------------------------------------


def _tolerance(text: str) -> tuple[float, float]:
    try:
        rtol, atol = (float(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RTOL,ATOL (two numbers), got '{text}'")
    if not (rtol >= 0 and atol >= 0):  # also refuses nan
        raise argparse.ArgumentTypeError(f"tolerances must be >= 0, got '{text}'")
    return rtol, atol


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'")
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _epilog(registry: dict[str, Any]) -> str:
    lines = [
        "exit codes:",
        "  0  ok: fused and unfused outputs agree within the tolerance",
        "  1  user error (bad input file, flag, --inputs file)",
        "  2  internal error (a reproducer path is printed where one was written)",
        f"  {EXIT_MISMATCH}  fused and unfused outputs differ beyond the tolerance",
        "",
        "comparison: an element passes when |fused - unfused| <= atol + rtol * |unfused|",
        "(NaN equals NaN). Default rtol/atol per element type:",
        *(f"  {t:5} rtol {r:g}, atol {a:g}" for t, (r, a) in TOLERANCES.items()),
        "  ints  exact",
        "max rel is taken over the elements where the unfused value is not 0.",
        "",
        f"random inputs: floats uniform in [{RANDOM_LOW:g}, {RANDOM_HIGH:g}), drawn in float64 "
        "and rounded to the",
        f"element type; integers uniform in [{INT_LOW}, {INT_HIGH}). numpy default_rng(seed), "
        "inputs in argument order.",
        "bf16 arrays (inputs and saved outputs) are uint16 bit patterns.",
        "",
        *cli.passes_epilog(registry),
        "",
        *cli.environment_epilog(),
    ]
    return "\n".join(lines)


def build_parser(registry: dict[str, Any]) -> argparse.ArgumentParser:
    """The argument parser; one flag per registered opfuse pass, like fuse-opt."""
    p = cli.Parser(
        prog="fuse-run",
        description="Compile an MLIR graph with and without fusion, run both on the same "
        "inputs, check that they agree and time them.",
        epilog=_epilog(registry),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    cli.add_version_argument(p)
    p.add_argument("input", nargs="?", default="-", help="input .mlir file, - for stdin (default)")
    p.add_argument("--entry", metavar="NAME",
                   help="function to run (default: the only public function)")
    p.add_argument("--bundle", action="store_true",
                   help="the input is an AOT bundle (fuse-opt --emit=bundle): run it on --backend "
                   "and compare with its CPU library; no compiler needed")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="where to run: auto (cuda when usable, else cpu; default), cpu, cuda")
    p.add_argument("--target", default="sm_90",
                   help="GPU the cost model plans for (default: sm_90; applies to the default "
                   "pipeline: in --pass-pipeline, give target= to each pass)")
    cli.add_contract_arguments(p)
    g = p.add_argument_group("inputs and outputs")
    g.add_argument("--seed", type=int, metavar="N",
                   help="seed of the random inputs (default: 0)")
    g.add_argument("--inputs", metavar="A.npy,B.npy",
                   help="one .npy per input instead of random ones (exact shape and dtype), "
                   "or a directory holding in0.npy, in1.npy, ...")
    g.add_argument("--save-outputs", metavar="DIR",
                   help="write the fused run's outputs as DIR/out0.npy, ... and the inputs "
                   "used as DIR/in0.npy, ...")
    g.add_argument("--tolerance", type=_tolerance, metavar="RTOL,ATOL",
                   help="tolerance for every output (default: per element type, below)")
    g = p.add_argument_group("timing")
    g.add_argument("--threads", type=_count, metavar="N",
                   help="threads of the CPU backend's parallel loops (default: "
                   f"${config.CPU_THREADS.name}, else every usable core; 0: every core)")
    g.add_argument("--repeat", type=_count, default=DEFAULT_REPEAT, metavar="N",
                   help=f"timed calls of each program; the median and min are shown "
                   f"(default: {DEFAULT_REPEAT}; 0: check only)")
    g.add_argument("--warmup", type=_count, default=DEFAULT_WARMUP, metavar="W",
                   help=f"untimed calls of each before timing (default: {DEFAULT_WARMUP}: "
                   "the checked run, each program's first call, already warms it up)")
    g = p.add_argument_group("reports")
    g.add_argument("--report", metavar="FORMAT|DIR",
                   help="also print the fusion report (text or json), or write it to the "
                   "folder DIR as report.html (the graph before and after fusion, the "
                   "savings), report.json and report.txt (a folder named text or json: "
                   "./text)")
    g.add_argument("--json", action="store_true",
                   help="print the summary (every figure) as one JSON object instead")
    g.add_argument("--dump-dir", metavar="DIR",
                   help="write each pipeline step's IR, the pipeline, the ledger and the "
                   "lowered CPU module under DIR: a fresh folder per run, a subfolder per "
                   f"program (default: ${config.DUMP_DIR.name})")
    g = p.add_argument_group("fusion fuel (numerics debugging)")
    g.add_argument("--fusion-fuel", type=_count, metavar="N",
                   help="apply only the first N fusions to the fused program (merges and "
                   "duplications, in decision order)")
    g.add_argument("--bisect", action="store_true",
                   help="find the first fusion that makes fused and unfused outputs differ "
                   "beyond the tolerance (compiles about log2(fusions) programs; no timing)")
    cli.add_pipeline_arguments(p, registry, "fusion pipeline (of the fused program only)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fuse-run``; returns the exit code (see the module docstring)."""
    return cli.guarded_main(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
