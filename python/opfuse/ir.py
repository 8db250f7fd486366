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


#: Dialects loaded when a context is made: every dialect whose ops opfuse builds from
#: Python (``mlir.dialects.<name>`` builders, ``Operation.create``). Building an op of a
#: registered dialect that is not loaded yet aborts the process ("created with
#: unregistered dialect"), so this list must cover them all; test_ir_context checks it
#: against the imports. Every other registered dialect (transform, spirv, omp, ...) is
#: loaded by the parser when a text first uses it. Loading all ~60 of them costs ~20 ms
#: per context, which compiles of small programs paid several times over.
LOADED_DIALECTS = (
    "builtin", "func", "linalg", "tensor", "arith", "math", "scf", "memref", "llvm",
    "gpu", "nvvm", "nvgpu", "vector", "affine", "bufferization", "cf", "ub", "index",
    "complex", "async",
)


def make_context() -> ir.Context:
    """A context with the dialects opfuse builds ops in loaded (see LOADED_DIALECTS);
    the others load when parsed text uses them."""
    ctx = ir.Context(load_on_create_dialects=list(LOADED_DIALECTS))
    ctx.allow_unregistered_dialects = False
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
            lines.append(_one_line(format_diagnostic(note)))
        return True

    h = ctx.attach_diagnostic_handler(handler)
    try:
        yield lines
    finally:
        h.detach()


def _one_line(note: str) -> str:
    # "see current operation: <the whole op, generic form>" notes are IR dumps
    return note.split("\n", 1)[0].rstrip(": ") if "see current operation" in note else note


def parse_module(text: str, ctx: ir.Context | None = None, *, filename: str = "<string>") -> ir.Module:
    """Parse MLIR text into a verified module; syntax and verifier errors raise OpfuseError."""
    ctx = ctx or make_context()
    _check_text(text, filename)
    wrapped, shifts = _wrap_in_module(text)
    with collect_diagnostics(ctx) as diags:
        try:
            module = _parse_named(wrapped, ctx, filename)
        except ir.MLIRError as e:
            lines = [_unshift(d, filename, shifts) for d in diags + _error_lines(e)]
            raise OpfuseError(f"cannot parse {filename}", diagnostics=lines) from None
        except OpfuseError:
            raise
        except Exception as e:  # the bindings raise ValueError on some malformed inputs
            lines = [_unshift(d, filename, shifts) for d in diags]
            raise OpfuseError(f"cannot parse {filename}: {e}", diagnostics=lines) from None
    if shifts:
        _unshift_locations(module, shifts)
    return module


#: Deepest bracket nesting (``{ ( [ <``) the parser is given: MLIR's parser recurses once
#: per level and overflows the C++ stack (a segfault) somewhere past 10,000; real
#: programs nest a handful of levels.
MAX_BRACKET_DEPTH = 1000
_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|->|[{}()\[\]<>]')
_OPEN, _CLOSE = frozenset("{([<"), frozenset("})]>")


def _position(text: str, at: int) -> tuple[int, int]:
    line = text.count("\n", 0, at) + 1
    return line, at - (text.rfind("\n", 0, at) + 1) + 1


def _check_text(text: str, filename: str) -> None:
    # MLIR's lexer stops at a NUL byte: a file of NULs (or with one in the middle) would
    # parse as an empty (or truncated) module and pass silently.
    at = text.find("\0")
    if at >= 0:
        line, col = _position(text, at)
        raise OpfuseError(
            f"{filename} is not MLIR text: it contains a NUL byte",
            diagnostics=[f"{filename}:{line}:{col}: error: NUL byte in the input (a binary "
                         "file?)"])
    depth = 0
    for m in _BRACKETS.finditer(text):
        ch = m.group()
        if ch in _OPEN:
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                line, col = _position(text, m.start())
                raise OpfuseError(
                    f"{filename}: brackets nest deeper than {MAX_BRACKET_DEPTH} levels",
                    diagnostics=[f"{filename}:{line}:{col}: error: brackets nest deeper than "
                                 f"{MAX_BRACKET_DEPTH} levels (the parser would overflow its "
                                 "stack)"])
        elif ch in _CLOSE:
            depth = max(0, depth - 1)


def _parse_named(text: str, ctx: ir.Context, filename: str) -> ir.Module:
    # Operation.parse keeps the source name in every location, so diagnostics say
    # input.mlir:3:7 rather than -:3:7; its ops are then moved into an ir.Module
    # (ExecutionEngine and PassManager want one).
    op = ir.Operation.parse(text, source_name=filename, context=ctx)
    if op.name != "builtin.module":
        raise OpfuseError(f"{filename}: expected a builtin.module at the top level, got {op.name}")
    module = ir.Module.create(op.location)
    copy_attributes(op, module.operation)
    with ir.InsertionPoint(module.body):
        for child in list(op.regions[0].blocks[0].operations):
            child.detach_from_parent()
            ir.InsertionPoint.current.insert(child)
    return module


_WRAP = "module {"
_RESOURCES = "{-#"


def _wrap_in_module(text: str) -> tuple[str, dict[int, int]]:
    """Like mlir-opt, accept a bare list of top-level ops. The ``module {`` goes on the line
    of the first op, after comments and attribute/type aliases, so line numbers stay those
    of the file; its ``}`` at the end, or in front of a file-level resource section
    (``{-# dialect_resources: ... #-}``, which follows the top-level op: inside the module
    it does not parse). Returns the text and the columns added per line (1-based; empty
    when nothing was added), which :func:`_unshift` and :func:`_unshift_locations` take
    back."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("//") or _ALIAS.match(stripped):
            continue
        if _MODULE_AT_TOP.match(stripped):
            return text, {}
        lines[i] = _WRAP + line
        shifts = {i + 1: len(_WRAP)}
        resources = next((j for j in range(i + 1, len(lines))
                          if lines[j].lstrip().startswith(_RESOURCES)), None)
        if resources is None:
            return "\n".join(lines) + "\n}", shifts
        lines[resources] = "}" + lines[resources]
        shifts[resources + 1] = 1
        return "\n".join(lines), shifts
    return text, {}


def _unshift(diagnostic: str, filename: str, shifts: dict[int, int]) -> str:
    """A diagnostic's column on a line the wrapping shifted, as it is in the file."""
    for line, added in shifts.items():
        prefix = f"{filename}:{line}:"
        if not diagnostic.startswith(prefix):
            continue
        col, sep, rest = diagnostic[len(prefix):].partition(":")
        if not (sep and col.isdigit()):
            return diagnostic
        return f"{prefix}{max(1, int(col) - added)}:{rest}"
    return diagnostic


def _unshift_locations(module: ir.Module, shifts: dict[int, int]) -> None:
    """Op locations on lines the wrapping shifted, as they are in the file (later
    diagnostics of passes and backends point at them)."""
    ctx = module.context

    def fix(loc: ir.Location) -> ir.Location:
        try:
            if loc.is_a_file() and loc.start_line in shifts:
                col = max(1, loc.start_col - shifts[loc.start_line])
                return ir.Location.file(loc.filename, loc.start_line, col, context=ctx)
            if loc.is_a_name():
                child = fix(loc.child_loc)
                return ir.Location.name(loc.name_str, childLoc=child, context=ctx)
        except Exception:  # noqa: BLE001  (other location kinds are left as they are)
            pass
        return loc

    stack = [module.operation]
    while stack:
        op = stack.pop()
        new = fix(op.location)
        if new != op.location:
            op.location = new
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    if hasattr(arg, "set_location"):
                        arg.set_location(fix(arg.location))
                stack.extend(o.operation for o in block.operations)


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
        return parse_module(read_text(name), ctx, filename=name)
    return parse_module(str(source), ctx)


def read_text(path: str | Path) -> str:
    """A file's text; unreadable or non-UTF-8 files raise OpfuseError (the first bad byte
    located as ``file:line:col``)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise OpfuseError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise OpfuseError(
            f"cannot read {path}: not UTF-8 text",
            diagnostics=[f"{path}:{line}:{col}: error: byte 0x{raw[e.start]:02x} is not "
                         "UTF-8 (is this a binary file?)"]) from None


def split_input(text: str) -> list[tuple[str, int]]:
    """Split on ``// -----`` like mlir-opt --split-input-file; returns (chunk, first line)."""
    chunks, line = [], 1
    for part in text.split("\n" + SPLIT_MARKER):
        # keep line numbers: pad each chunk with the newlines that came before it
        chunks.append(("\n" * (line - 1) + part, line))
        line += part.count("\n") + 1
    return chunks


def clone_module(module: ir.Module) -> ir.Module:
    """A deep copy of ``module`` in the same context: its ops, locations and attributes
    (a named module's ``sym_name``, ``module @m attributes {...}`` as IREE and torch-mlir
    print them)."""
    with module.context, module.operation.location:
        copy = ir.Module.create()
        copy_attributes(module.operation, copy.operation)
        ip = ir.InsertionPoint(copy.body)
        for op in module.body.operations:
            op.operation.clone(ip=ip)
    return copy


def copy_attributes(src: ir.Operation, dst: ir.Operation) -> None:
    """Every attribute of ``src`` onto ``dst`` (iterating an op's attributes yields their
    names in these bindings; indexing yields NamedAttributes)."""
    attrs = src.attributes
    for i in range(len(attrs)):
        dst.attributes[attrs[i].name] = attrs[i].attr


def print_module(module: ir.Module, *, debug_info: bool = False) -> str:
    """The module's text, optionally with locations."""
    return module.operation.get_asm(enable_debug_info=debug_info)


def walk_nested(op: ir.Operation) -> Iterator[ir.Operation]:
    """``op`` and every op nested in its regions, in pre-order. (An explicit stack: nested
    generators cost a frame per level and op, 1.6x the time on linalg bodies.) Each op's
    children are listed when it is reached: callers may change operands as they go, not
    add or erase ops."""
    stack = [op]
    while stack:
        op = stack.pop()
        yield op
        if len(op.regions):
            children = [inner.operation for region in op.regions for block in region.blocks
                        for inner in block.operations]
            children.reverse()
            stack.extend(children)


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


def find_entry(module: ir.Module, entry: str | None = None) -> ir.Operation:
    """The entry ``func.func``: ``entry`` by name, else the only public function with a body.

    Raises:
        OpfuseError: no such function, or several public candidates and no name given.
    """
    funcs = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and len(op.regions[0].blocks) > 0:
            funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
    if entry is not None:
        if entry not in funcs:
            raise OpfuseError(f"no function @{entry} in the module (have: {_names(funcs)})")
        return funcs[entry]
    public = [
        name
        for name, op in funcs.items()
        if "sym_visibility" not in op.attributes
        or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"
    ]
    if len(public) != 1:
        what = f"several public functions ({_names(public)})" if public else "no public function"
        raise OpfuseError(f"cannot choose an entry function: {what}; name one with entry=")
    return funcs[public[0]]


def _names(names) -> str:
    return ", ".join("@" + n for n in names) or "none"
