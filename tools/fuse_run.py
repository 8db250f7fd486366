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
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from mlir import ir

import opfuse  # noqa: F401  (tests patch fuse_run.opfuse.compile)
from opfuse import config
from opfuse import pipeline as pl
from opfuse.api import BACKENDS
from opfuse.driver import progress
from opfuse.errors import EXIT_OK, OpfuseError
from opfuse.report import render as render_mod
from opfuse.ir import find_entry, prune_to_entry
from opfuse.runtime.signature import Signature, signature_of
from opfuse.harness.bisect import Bisection
from opfuse.harness.compare import (
    EXIT_MISMATCH,
    INT_HIGH,
    INT_LOW,
    RANDOM_HIGH,
    RANDOM_LOW,
    TOLERANCES,
    check_memory,
    compare,
    default_tolerance,
    input_paths,
    load_inputs,
    random_inputs,
)
from opfuse.harness.programs import Program, build_program  # noqa: F401  (Program: re-exported)
from opfuse.harness.run_summary import Result, _json_safe, _num, summary_json, summary_lines
from opfuse.harness.timing import time_interleaved

# Imported here, not on first use inside opfuse.compile, so that the "compile + JIT" row
# of the first program compiled measures compilation rather than module imports.
from opfuse.backends.cpu import lower as _cpu_codegen  # noqa: F401
from opfuse.runtime import cpu as _cpu_runtime  # noqa: F401

from . import cli

DEFAULT_REPEAT = 3
DEFAULT_WARMUP = 0


# --- dumps and saved files ------------------------------------------------------------------


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
    cli.codegen_options(args)  # a bad --matmul fails before any work
    timing = progress.Timing() if args.timing else None
    try:
        with progress.run("fuse-run", timing=timing):
            return _run_checked(args, flags)
    finally:
        if timing is not None:
            sys.stderr.write(timing.table())


def _run_checked(args: argparse.Namespace, flags: list[tuple[str, str]]) -> int:
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
                  max_tensor_bytes=args.max_tensor_bytes, threads=args.threads,
                  matmul=args.matmul, allow_tf32=args.allow_tf32)
    if pipeline is not None:
        fused_args: dict[str, Any] = dict(pipeline=pipeline)
    else:
        fused_args = dict(disable=tuple(args.disable_pass))

    def where(name: str) -> dict[str, Any]:
        return dict(dump_dir=dumps / name) if dumps is not None else {}

    if args.bisect:
        run = Bisection(args, filename, signature, inputs, inputs_from, module, where,
                        {**common, **fused_args}, common)
        error = run.report(run.search())
        return cli.print_error(error) if error is not None else EXIT_OK
    with progress.stage("unfused program"):
        unfused = build_program("unfused", module, inputs, fusion=False, **common,
                                **where("unfused"))
    with progress.stage("fused program"):
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
    with progress.stage("timed runs"):
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


def write_report_dir(folder: Path, report: dict[str, Any]) -> None:
    """``report.html``, ``report.json`` and ``report.txt`` in ``folder`` (created)."""
    try:
        render_mod.write_report_dir(folder, report)
    except OpfuseError as e:
        raise OpfuseError(f"--report: {e}") from None


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
    cli.add_codegen_arguments(p)
    cli.add_timing_argument(p)
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
