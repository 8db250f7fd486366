"""What the opfuse command-line tools share: argument parsing that never exits with a
traceback, the pipeline flags (``--pass-pipeline``, ``--disable-pass``, one flag per
opfuse pass), input reading, and the ``main`` wrapper that turns every failure into one
``error:`` line and an exit code (0 ok, 1 user error, 2 internal error; see
:mod:`opfuse.errors`).

Both fuse-run and fuse-opt use this module (fuse-opt declares its own ``--pass-pipeline``
and ``--disable-pass`` flags); :func:`select_pipeline` returns None for "the default
pipeline", so that each tool adds its own defaults.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from typing import Any, Callable, Sequence

from opfuse import config
from opfuse import ir as oir
from opfuse import pipeline as pl
from opfuse.errors import EXIT_INTERNAL_ERROR, EXIT_OK, OpfuseError


class Parser(argparse.ArgumentParser):
    """argparse that raises OpfuseError (exit 1) instead of exiting with status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise OpfuseError(f"{message} (see {self.prog} --help)")


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """``--version``: opfuse's version and the MLIR wheels it compiles with."""
    import opfuse
    from opfuse.backends.gpu.lower.nvptx import toolchain_version

    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {opfuse.__version__} ({toolchain_version().replace(';', ', ')})",
    )


# --- codegen flags ----------------------------------------------------------------------


def add_codegen_arguments(parser: argparse.ArgumentParser) -> None:
    """``--matmul`` and ``--allow-tf32``: the GPU backend's choices
    (:class:`opfuse.backends.options.CodegenOptions`; default: the environment's)."""
    from opfuse.backends.options import MATMUL_MODES  # noqa: PLC0415

    parser.add_argument(
        "--matmul", metavar="MODE",
        help=f"GPU matmul kernels: {', '.join(MATMUL_MODES)}, or per kernel "
        f"'fusion_3_output=simt,auto' (default ${config.MATMUL.name}, else auto)")
    parser.add_argument(
        "--allow-tf32", action="store_true", default=None,
        help=f"f32 GPU matmuls may use TF32 tensor cores (default ${config.ALLOW_TF32.name}, off)")


def add_timing_argument(parser: argparse.ArgumentParser) -> None:
    """``--timing``: wall time per compile stage on stderr at the end (like --mlir-timing)."""
    parser.add_argument("--timing", action="store_true",
                        help="print the wall time of every compile stage on stderr at the end")


def codegen_options(args: argparse.Namespace):
    """The CodegenOptions the flags ask for; None when neither flag is given (the
    environment decides, when the GPU program is built). A bad --matmul fails here."""
    from opfuse.backends.options import CodegenOptions  # noqa: PLC0415

    if args.matmul is None and args.allow_tf32 is None:
        return None
    return CodegenOptions.resolve(args.matmul, args.allow_tf32)


# --- pipeline flags ---------------------------------------------------------------------


def pass_help(mod: Any) -> str:
    """One line of --help for a pass: its docstring's first line."""
    doc = (mod.__doc__ or "").strip().split("\n", 1)[0]
    doc = re.sub(rf"^{re.escape(mod.NAME)}:\s*", "", doc)
    return f"{doc} (options below)".replace("%", "%%")


def add_pipeline_arguments(
    parser: argparse.ArgumentParser, registry: dict[str, Any], title: str | None = None
) -> None:
    """``--pass-pipeline``, ``--disable-pass`` (in a group named ``title`` if given) and,
    for --help, one flag per opfuse pass (those are taken out of argv by
    :func:`take_pass_flags` before argparse runs)."""
    group = parser.add_argument_group(title) if title else parser
    group.add_argument(
        "--pass-pipeline",
        metavar="PIPELINE",
        help="textual pipeline of opfuse and upstream passes, e.g. "
        "'builtin.module(opfuse-fuse-elementwise{delta=0.2},canonicalize)'",
    )
    group.add_argument(
        "--disable-pass",
        action="append",
        default=[],
        metavar="NAME",
        help="leave NAME out of the default pipeline (repeatable)",
    )
    passes = parser.add_argument_group(
        "opfuse passes (run in command-line order; --NAME=\"key=value ...\")"
    )
    for name, mod in registry.items():
        passes.add_argument(f"--{name}", metavar='"OPTIONS"', help=pass_help(mod))


def passes_epilog(registry: dict[str, Any]) -> list[str]:
    """--help lines: every opfuse pass with its options, and the default pipeline."""
    lines = ["opfuse passes and their options (defaults):"]
    for name, mod in registry.items():
        lines.append(f"  {name}")
        lines += [f"      {opt}" for opt in pl.describe_options(mod.Options).split(", ")]
    lines += ["", f"default pipeline:\n  {pl.Pipeline.default()}"]
    return lines


def environment_epilog() -> list[str]:
    """--help lines: every environment variable opfuse reads."""
    return ["environment:", *(f"  {v.name:18} {v.doc}" for v in config.declared())]


def take_pass_flags(
    argv: Sequence[str], names: set[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Pull ``--NAME`` / ``--NAME=OPTIONS`` (or ``-NAME``) out of argv, in order, so that a
    pass flag never swallows the input file."""
    rest, flags = [], []
    for i, arg in enumerate(argv):
        if arg == "--":
            rest += argv[i:]
            break
        m = re.fullmatch(r"--?([A-Za-z][\w.-]*)(?:=(.*))?", arg, re.S)
        if m and m.group(1) in names:
            flags.append((m.group(1), m.group(2) or ""))
        else:
            rest.append(arg)
    return rest, flags


def long_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Accept mlir-opt's single-dash spelling of long options (``-split-input-file``)."""
    known = {s for s in parser._option_string_actions if s.startswith("--")}
    out = []
    for arg in argv:
        head = arg.split("=", 1)[0]
        single_dash = re.fullmatch(r"-[A-Za-z][\w-]+", head) and "-" + head in known
        out.append("-" + arg if single_dash else arg)
    return out


def select_pipeline(
    args: argparse.Namespace, flags: list[tuple[str, str]]
) -> pl.Pipeline | None:
    """The pipeline the flags ask for; None when they ask for the default one (with
    ``args.disable_pass`` left out), so the caller can add its own default options."""
    if args.pass_pipeline is not None and flags:
        raise OpfuseError(
            "--pass-pipeline cannot be combined with individual pass flags "
            f"({', '.join('--' + n for n, _ in flags)})"
        )
    if args.disable_pass and (args.pass_pipeline is not None or flags):
        raise OpfuseError("--disable-pass applies to the default pipeline only")
    if args.pass_pipeline is not None:
        return pl.Pipeline.parse(args.pass_pipeline)
    if flags:
        pipeline = pl.Pipeline()
        for name, options in flags:
            text = f"{name}{{{options}}}" if options else name
            pipeline.append(pl.Pipeline.parse(text).steps[0])
        return pipeline
    return None


# --- input and errors -------------------------------------------------------------------


def add_contract_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-tensor-bytes``: the input contract's size limit (opfuse.frontends.mlir.contract)."""
    parser.add_argument(
        "--max-tensor-bytes", type=_size, metavar="SIZE",
        help="refuse inputs with a tensor (argument, result or intermediate) larger than "
        f"SIZE (bytes, or 512MiB, 16GiB; default ${config.MAX_TENSOR_BYTES.name} or "
        f"{config.MAX_TENSOR_BYTES.default})")
    parser.add_argument(
        "--dim-size", type=_positive, metavar="N",
        help="compile an entry function with ? dims (tensor<?x...>) at N for every ? dim of "
        "its arguments; the sizes derived from them are folded through the program")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a size of 1 or more, got {text!r}")
    return value


def _size(text: str) -> int:
    from opfuse.frontends.mlir.contract import parse_bytes  # noqa: PLC0415

    try:
        return parse_bytes(text, "--max-tensor-bytes")
    except OpfuseError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_and_accept(text: str, filename: str, args: argparse.Namespace, ctx: Any = None):
    """Parse the input and check it against the input contract (before any pass runs)."""
    from opfuse.frontends.mlir import contract  # noqa: PLC0415

    module = oir.parse_module(text, ctx, filename=filename)
    size = getattr(args, "dim_size", None)
    if size is not None:
        module = _at_dim_size(module, text, filename, getattr(args, "entry", None), size, ctx)
    return contract.accept(module, filename=filename,
                           limits=contract.Limits(getattr(args, "max_tensor_bytes", None)),
                           entry=getattr(args, "entry", None))


def _at_dim_size(module: Any, text: str, filename: str, entry: str | None, size: int,
                 ctx: Any) -> Any:
    """``--dim-size``: the module with its entry's ``?`` dims at ``size`` (unchanged when
    the entry has none)."""
    from opfuse.frontends.mlir import specialize  # noqa: PLC0415

    func = oir.find_entry(module, entry)
    if not specialize.is_dynamic(func):
        return module
    static = specialize.specialize(text, specialize.uniform_shapes(func, size), entry=entry,
                                   filename=filename, ctx=ctx)
    return oir.parse_module(static, ctx, filename=filename)


def read_input(path: str) -> tuple[str, str]:
    """(text, name for locations) of a file, or of stdin for ``-``."""
    if path == "-":
        try:
            return sys.stdin.read(), "<stdin>"
        except UnicodeDecodeError:
            raise OpfuseError("cannot read <stdin>: not UTF-8 text") from None
    return oir.read_text(path), path


def internal_error(e: BaseException) -> OpfuseError:
    """An unexpected exception as an exit-2 OpfuseError (traceback only with OPFUSE_DEBUG)."""
    hint = "" if config.DEBUG.flag() else f" (set {config.DEBUG.name}=1 for the traceback)"
    if config.DEBUG.flag():
        traceback.print_exception(e, file=sys.stderr)
    return OpfuseError(
        f"internal error: {type(e).__name__}: {e}{hint}", exit_code=EXIT_INTERNAL_ERROR
    )


def print_error(error: OpfuseError) -> int:
    """Print the error as the tools do (``error: ...`` and diagnostics); its exit code."""
    if config.DEBUG.flag() and error.__cause__ is not None:
        traceback.print_exception(error.__cause__, file=sys.stderr)
    print(error.render(), file=sys.stderr)
    return error.exit_code


def guarded_main(run: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    """Run a tool's body; every failure becomes a message on stderr and an exit code
    (0 ok, 1 user error, 2 internal error, 130 interrupted), never a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(argv)
    except OpfuseError as e:
        return print_error(e)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else EXIT_OK
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fuse-run ... | head`
        return EXIT_OK
    except Exception as e:
        return print_error(internal_error(e))
