"""fuse-opt: run opfuse fusion pipelines on MLIR files, like mlir-opt.

    fuse-opt in.mlir                                   # default fusion pipeline
    fuse-opt in.mlir --opfuse-fuse-elementwise="delta=0.2" --opfuse-outline
    fuse-opt in.mlir --pass-pipeline='builtin.module(opfuse-fuse-elementwise,canonicalize)'
    fuse-opt in.mlir --opfuse-report=text              # the fusion report instead of IR
    fuse-opt in.mlir --opfuse-report=html -o report.html   # ... as a self-contained page
    fuse-opt in.mlir --fusion-fuel=3                   # apply only the first 3 fusions
    fuse-opt in.mlir --emit=ptx --target=sm_80         # GPU kernels (kernels, nvvm, ptx, cubin)
    fuse-opt in.mlir --emit=bundle -o g.opfuse         # AOT bundle (runs without MLIR)

Errors print as ``file:line:col: error: message`` on stderr; exit code 1 for bad input,
2 for internal errors (never a Python traceback unless OPFUSE_DEBUG=1).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mlir import ir

from opfuse import config
from opfuse import ir as oir
from opfuse import pipeline as pl
from opfuse.errors import EXIT_OK, OpfuseError
from opfuse.analysis import ledger as ledger_mod
from opfuse.driver import progress, stages
from opfuse.report import render as render_mod

from . import cli

# --- stages ---------------------------------------------------------------------------
# The stage graph is the driver's (opfuse.driver.stages): each stage names its parent;
# --emit=NAME computes the chain up to NAME and prints the last artifact (an ir.Module,
# text or bytes). BUILDERS turns a parent's artifact into a stage's (they must not mutate
# the parent's artifact, except "fused", which rewrites the parsed module in place and
# keeps a copy when a report needs it).


@dataclass
class Job:
    """One input chunk on its way through the stages."""

    args: argparse.Namespace
    ctx: ir.Context
    text: str
    filename: str
    pipeline: pl.Pipeline
    artifacts: dict[str, Any] = field(default_factory=dict)
    before: ir.Module | None = None
    ledger: ledger_mod.Ledger | None = None

    def get(self, stage: str) -> Any:
        if stage not in self.artifacts:
            spec = stages.get(stage)
            parent = self.get(spec.parent) if spec.parent else None
            with progress.stage(stage):
                self.artifacts[stage] = BUILDERS[stage](self, parent)
        return self.artifacts[stage]


def _parse(job: Job, _: None) -> ir.Module:
    return cli.parse_and_accept(job.text, job.filename, job.args, job.ctx)


def _fuse(job: Job, module: ir.Module) -> ir.Module:
    if job.args.opfuse_report:
        job.before = pl.clone_module(module)
    job.ledger = ledger_mod.Ledger(fuel=job.args.fusion_fuel)
    try:
        job.pipeline.run(
            module, dump_dir=job.args.dump_dir, ledger=job.ledger, name=Path(job.filename).stem
        )
    finally:
        if job.args.opfuse_remarks:
            for line in job.ledger.remarks():
                print(line, file=sys.stderr)
    return module


def _gpu(stage: str) -> Callable[[Job, Any], Any]:
    """A GPU codegen stage (opfuse.driver.compile), built from the fused module."""

    def build(job: Job, module: ir.Module) -> Any:
        from opfuse.driver import compile as gpu_stages  # noqa: PLC0415  (loaded on demand)

        if stage == "bundle":
            targets = job.args.target.split(",") if job.args.target else ["sm_80", "sm_90"]
            return gpu_stages.bundle_bytes(module, targets, options=cli.codegen_options(job.args))
        return getattr(gpu_stages, stage)(module, job.args.target or "sm_90",
                                          options=cli.codegen_options(job.args))

    return build


def _cpu(job: Job, module: ir.Module) -> ir.Module:
    """The CPU backend's LLVM-dialect module."""
    from opfuse.backends.cpu import lower as cpu_lower  # noqa: PLC0415  (loaded on demand)

    return cpu_lower.lower_to_llvm(module)


BUILDERS: dict[str, Callable[[Job, Any], Any]] = {
    "linalg": _parse,
    "fused": _fuse,
    **{name: _gpu(name) for name in ("kernels", "nvvm", "ptx", "cubin", "bundle")},
    "cpu": _cpu,
}
assert BUILDERS.keys() == stages.STAGES.keys(), "a stage without a builder"

STAGES = stages.STAGES


def _chain(stage: str) -> list[str]:
    return stages.chain(stage)


def _print_artifact(artifact: Any, debug_info: bool) -> str | bytes:
    if isinstance(artifact, bytes):  # a bundle
        return artifact
    if isinstance(artifact, ir.Module):
        text = oir.print_module(artifact, debug_info=debug_info)
    else:
        text = str(artifact)
    return text if text.endswith("\n") else text + "\n"


# --- command line ---------------------------------------------------------------------


def _epilog(registry: dict[str, Any]) -> str:
    lines = ["opfuse passes and their options (defaults):"]
    for name, mod in registry.items():
        lines.append(f"  {name}")
        for opt in pl.describe_options(mod.Options).split(", "):
            lines.append(f"      {opt}")
    lines.append("")
    lines.append(f"default pipeline:\n  {pl.Pipeline.default()}")
    lines.append("")
    lines.append("stages for --emit:")
    lines += stages.help_lines()
    lines.append("")
    lines.append("environment:")
    lines += [f"  {v.name:18} {v.doc}" for v in config.declared()]
    return "\n".join(lines)


def build_parser(registry: dict[str, Any]) -> argparse.ArgumentParser:
    """The argument parser; one flag per registered opfuse pass."""
    p = cli.Parser(
        prog="fuse-opt",
        description="Run opfuse fusion passes on an MLIR file (like mlir-opt).",
        epilog=_epilog(registry),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    cli.add_version_argument(p)
    p.add_argument("input", nargs="?", default="-", help="input .mlir file, - for stdin (default)")
    p.add_argument("-o", dest="output", default="-", metavar="FILE", help="output file (default: stdout)")
    p.add_argument("--pass-pipeline", metavar="PIPELINE",
                   help="textual pipeline of opfuse and upstream passes, e.g. "
                   "'builtin.module(opfuse-fuse-elementwise{delta=0.2},canonicalize)'")
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help="leave NAME out of the default pipeline (repeatable)")
    p.add_argument("--split-input-file", action="store_true",
                   help="split the input at '// -----' and process each chunk independently")
    p.add_argument("--emit", default="fused", metavar="STAGE",
                   help=f"stage to print: {', '.join(STAGES)} (default: fused)")
    p.add_argument("--opfuse-report", choices=list(render_mod.FORMATS), metavar="FORMAT",
                   help="print the fusion report instead of the IR: text, json, or html (a "
                   "self-contained page: the graph before and after fusion, the savings; "
                   "use -o report.html)")
    p.add_argument("--fusion-fuel", type=_fuel, metavar="N",
                   help="apply only the first N fusions (merges and duplications, in "
                   "decision order); later candidates are refused as 'fusion fuel exhausted'. "
                   "For bisecting numerics: see fuse-run --bisect")
    p.add_argument("--opfuse-remarks", action="store_true",
                   help="print every fusion decision as an MLIR remark on stderr")
    p.add_argument("--dump-dir", metavar="DIR",
                   help="write each step's IR, pipeline.txt and ledger.json under DIR "
                   f"(default: ${config.DUMP_DIR.name})")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--target", metavar="CHIP",
                   help="GPU for the kernels/nvvm/ptx/cubin stages (sm_80, sm_90; default sm_90); "
                   "for --emit=bundle a comma-separated list (default sm_80,sm_90)")
    p.add_argument("--measure-registers", action="store_true",
                   help="the fusion guard uses ptxas -v registers of each candidate kernel "
                   "instead of the estimate (needs ptxas; default pipeline only), and the "
                   "report gets every kernel's ptxas figures")
    cli.add_codegen_arguments(p)
    cli.add_timing_argument(p)
    cli.add_contract_arguments(p)
    group = p.add_argument_group(
        "opfuse passes (run in command-line order; --NAME=\"key=value ...\")"
    )
    for name, mod in registry.items():
        # handled by _take_pass_flags before argparse runs (so a flag never swallows the
        # input file); declared here for --help only
        group.add_argument(f"--{name}", metavar='"OPTIONS"', help=cli.pass_help(mod))
    return p


def _fuel(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _select_pipeline(args: argparse.Namespace, flags: list[tuple[str, str]]) -> pl.Pipeline:
    chosen = cli.select_pipeline(args, flags)
    if chosen is not None:
        return chosen
    extra = {"measure_registers": True} if args.measure_registers else {}
    if args.measure_registers:
        from opfuse.backends.gpu import measure  # noqa: PLC0415  (the GPU backend: ptxas)

        measure.install()
    return pl.Pipeline.default(disable=args.disable_pass, **extra)


# --- driver ---------------------------------------------------------------------------


def _process(job: Job) -> tuple[str | None, dict[str, Any] | None]:
    """(printed stage, report) for one chunk."""
    args = job.args
    artifact = job.get(args.emit)
    if not args.opfuse_report:
        return _print_artifact(artifact, args.mlir_print_debuginfo), None
    from opfuse.report.summary import build_report  # noqa: PLC0415  (needs the cost model)

    report = build_report(job.before, job.get("fused"), job.ledger,
                          target=pipeline_target(job.pipeline))
    report["source"] = job.filename
    report["pipeline"] = str(job.pipeline)
    if args.measure_registers:
        from opfuse.driver import compile as gpu_stages  # noqa: PLC0415
        from opfuse.report.summary import attach_measured  # noqa: PLC0415

        chip = args.target or pipeline_target(job.pipeline)
        program = gpu_stages.program(job.get("fused"), (chip,), ptxas=True)
        attach_measured(report, {k.name: {**k.resources[chip], "arch": chip}
                                 for k in program.kernels.values() if chip in k.resources})
    return None, report


def pipeline_target(pipeline: pl.Pipeline) -> str:
    """The GPU the pipeline's fusion passes plan for (the first one that says)."""
    for step in pipeline.steps:
        target = getattr(getattr(step, "options", None), "target", None)
        if isinstance(target, str):
            return target
    return "sm_90"


def _run(argv: list[str]) -> int:
    registry = pl.registry()
    parser = build_parser(registry)
    rest, flags = cli.take_pass_flags(argv, set(registry))
    args = parser.parse_args(cli.long_options(parser, rest))
    if args.emit not in STAGES:
        raise OpfuseError(f"unknown stage '{args.emit}' for --emit (stages: {', '.join(STAGES)})")
    cli.codegen_options(args)  # a bad --matmul fails before any work
    if args.opfuse_report and "fused" not in _chain(args.emit):
        raise OpfuseError(
            f"--opfuse-report needs the fusion pipeline: use --emit={args.emit} without it, "
            "or a stage from 'fused' on"
        )
    if args.emit == "bundle" and (args.output == "-" or args.split_input_file):
        raise OpfuseError("--emit=bundle writes one binary file: give -o FILE and no "
                          "--split-input-file")
    pipeline = _select_pipeline(args, flags)
    text, filename = cli.read_input(args.input)
    chunks = oir.split_input(text) if args.split_input_file else [(text, 1)]
    ctx = oir.make_context()

    timing = progress.Timing() if args.timing else None
    with progress.run("fuse-opt", timing=timing):
        status, outputs, reports = _process_chunks(args, ctx, chunks, filename, pipeline)
    if timing is not None:
        sys.stderr.write(timing.table())
    body = _assemble(args, outputs, reports)
    if body or status == EXIT_OK:
        _write_output(args.output, body)
    return status


def _process_chunks(args: argparse.Namespace, ctx: ir.Context, chunks, filename: str,
                    pipeline: pl.Pipeline) -> tuple[int, list[Any], list[dict[str, Any]]]:
    """(exit status, printed stages, reports) of every input chunk."""
    outputs: list[str] = []
    reports: list[dict[str, Any]] = []
    status = EXIT_OK
    for chunk, _line in chunks:
        job = Job(args, ctx, chunk, filename, pipeline)
        try:
            out, report = _process(job)
        except OpfuseError as e:
            status = max(status, cli.print_error(e))
            continue
        except Exception as e:  # one broken chunk must not hide the others
            status = max(status, cli.print_error(cli.internal_error(e)))
            continue
        if report is not None:
            reports.append(report)
        else:
            outputs.append(out)
    return status, outputs, reports


def _assemble(args: argparse.Namespace, outputs: list[Any], reports: list[dict[str, Any]]) -> str | bytes:
    """Chunks' outputs joined like mlir-opt's; JSON reports as one document (a list when
    the input was split); a bundle as its bytes."""
    if outputs and isinstance(outputs[0], bytes):
        return outputs[0]
    separator = oir.SPLIT_MARKER + "\n"
    if args.opfuse_report in ("json", "html"):
        if not reports:
            return ""
        render = render_mod.FORMATS[args.opfuse_report]
        return render(reports if args.split_input_file else reports[0])
    if args.opfuse_report:
        return separator.join(render_mod.render_text(r) for r in reports)
    return separator.join(outputs)


def _write_output(path: str, text: str | bytes) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        if isinstance(text, bytes):
            Path(path).write_bytes(text)
        else:
            Path(path).write_text(text)
    except OSError as e:
        raise OpfuseError(f"cannot write {path}: {e.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fuse-opt``; returns the exit code (0 ok, 1 user error, 2 internal)."""
    return cli.guarded_main(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
