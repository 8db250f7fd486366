"""Context, parsing and printing around the upstream MLIR bindings.

Everything that touches ``mlir.ir`` directly for loading or printing goes through here so
that errors become :class:`OpfuseError` with MLIR locations, never tracebacks.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Iterator

from mlir import ir

from .errors import OpfuseError

SPLIT_MARKER = "// -----"
_MODULE_AT_TOP = re.compile(r"(module\b|\"builtin.module\")")
_ALIAS = re.compile(r"[#!][\w.$-]+\s*=")


def make_context() -> ir.Context:
    """A context with every upstream dialect loaded (linalg, tensor, arith, math, ...)."""
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = False
    ctx.load_all_available_dialects()
    return ctx


def format_diagnostic(diag: ir.Diagnostic) -> str:
    """Render one MLIR diagnostic as ``file:line:col: severity: message``."""
    severity = str(diag.severity).rsplit(".", 1)[-1].lower()
    return f"{format_location(diag.location)}: {severity}: {diag.message}"


def format_location(loc: ir.Location) -> str:
    """``file:line:col`` for file locations, the printed form otherwise."""
    with contextlib.suppress(Exception):
        if loc.is_a_file():
            return f"{loc.filename}:{loc.start_line}:{loc.start_col}"
        if loc.is_a_name():
            child = format_location(loc.child_loc)
            return loc.name_str if child == "loc(unknown)" else child
        if loc.is_a_fused() and loc.locations:
            return format_location(loc.locations[0])
        if loc.is_a_callsite():
            return format_location(loc.callee)
    return str(loc)


@contextlib.contextmanager
def collect_diagnostics(ctx: ir.Context) -> Iterator[list[str]]:
    """Collect every diagnostic emitted in ``ctx`` while the block runs (and swallow them)."""
    lines: list[str] = []

    def handler(diag: ir.Diagnostic) -> bool:
        lines.append(format_diagnostic(diag))
        for note in diag.notes:
            lines.append(format_diagnostic(note))
        return True

    h = ctx.attach_diagnostic_handler(handler)
    try:
        yield lines
    finally:
        h.detach()


def parse_module(text: str, ctx: ir.Context | None = None, *, filename: str = "<string>") -> ir.Module:
    """Parse MLIR text into a verified module; syntax and verifier errors raise OpfuseError."""
    ctx = ctx or make_context()
    with collect_diagnostics(ctx) as diags:
        try:
            module = _parse_named(text, ctx, filename)
        except ir.MLIRError as e:
            raise OpfuseError(f"cannot parse {filename}", diagnostics=diags + _error_lines(e)) from None
        except Exception as e:  # the bindings raise ValueError on some malformed inputs
            raise OpfuseError(f"cannot parse {filename}: {e}", diagnostics=diags) from None
    return module


def _parse_named(text: str, ctx: ir.Context, filename: str) -> ir.Module:
    # Operation.parse keeps the source name in every location, so diagnostics say
    # input.mlir:3:7 rather than -:3:7; its ops are then moved into an ir.Module
    # (ExecutionEngine and PassManager want one).
    text = _wrap_in_module(text)
    op = ir.Operation.parse(text, source_name=filename, context=ctx)
    if op.name != "builtin.module":
        raise OpfuseError(f"{filename}: expected a builtin.module at the top level, got {op.name}")
    module = ir.Module.create(op.location)
    for name in op.attributes:
        module.operation.attributes[name] = op.attributes[name]
    with ir.InsertionPoint(module.body):
        for child in list(op.regions[0].blocks[0].operations):
            child.detach_from_parent()
            ir.InsertionPoint.current.insert(child)
    return module


def _wrap_in_module(text: str) -> str:
    """Like mlir-opt, accept a bare list of top-level ops. The ``module {`` goes on the line
    of the first op, after comments and attribute/type aliases, so line numbers stay those
    of the file."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("//") or _ALIAS.match(stripped):
            continue
        if _MODULE_AT_TOP.match(stripped):
            return text
        lines[i] = "module {" + line
        return "\n".join(lines) + "\n}"
    return text


def _error_lines(e: Exception) -> list[str]:
    lines = []
    for d in getattr(e, "error_diagnostics", []) or []:
        lines.append(f"{format_location(d.location)}: error: {d.message}")
        for n in d.notes:
            lines.append(f"{format_location(n.location)}: note: {n.message}")
    return lines or [f"error: {e}"]


def load(source: str | Path, ctx: ir.Context | None = None) -> ir.Module:
    """Load a module from a path, ``-`` (stdin) or MLIR text."""
    import sys

    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and
                                     (source == "-" or source.endswith(".mlir") or Path(source).exists())):
        name = str(source)
        if name == "-":
            return parse_module(sys.stdin.read(), ctx, filename="<stdin>")
        try:
            text = Path(name).read_text()
        except OSError as e:
            raise OpfuseError(f"cannot read {name}: {e.strerror}") from None
        return parse_module(text, ctx, filename=name)
    return parse_module(str(source), ctx)


def split_input(text: str) -> list[tuple[str, int]]:
    """Split on ``// -----`` like mlir-opt --split-input-file; returns (chunk, first line)."""
    chunks, line = [], 1
    for part in text.split("\n" + SPLIT_MARKER):
        # keep line numbers: pad each chunk with the newlines that came before it
        chunks.append(("\n" * (line - 1) + part, line))
        line += part.count("\n") + 1
    return chunks


def print_module(module: ir.Module, *, debug_info: bool = False) -> str:
    """The module's text, optionally with locations."""
    return module.operation.get_asm(enable_debug_info=debug_info)


def walk_nested(op: ir.Operation) -> Iterator[ir.Operation]:
    """``op`` and every op nested in its regions, in pre-order."""
    yield op
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from walk_nested(inner.operation)
