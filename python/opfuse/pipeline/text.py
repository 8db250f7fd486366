"""The textual pass pipeline: splitting ``builtin.module(...)`` text into elements, and
checking upstream elements with MLIR's own parser; the opfuse pass registry."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import types
from typing import Iterator

from mlir import ir
from mlir.passmanager import PassManager

from ..errors import EXIT_INTERNAL_ERROR, OpfuseError

_MODULE_ANCHOR = "builtin.module"


# --- registry -------------------------------------------------------------------------


def registry() -> dict[str, types.ModuleType]:
    """``{name: pass module}`` of every opfuse pass (see ``opfuse.passes``)."""
    from .. import passes  # noqa: PLC0415  (opfuse.passes imports this package)

    try:
        return passes.registry()
    except OpfuseError:
        raise
    except Exception as e:  # a missing or broken pass module is a broken install
        raise OpfuseError(
            f"internal error: cannot load the opfuse pass registry: {type(e).__name__}: {e}",
            exit_code=EXIT_INTERNAL_ERROR,
        ) from e


def _pass_module(name: str, reg: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    reg = registry() if reg is None else reg
    if name not in reg:
        raise OpfuseError(f"unknown opfuse pass '{name}' (opfuse passes: {', '.join(reg)})")
    return reg[name]


# --- pipeline text ----------------------------------------------------------------------

_OPEN = {"(": ")", "{": "}", "[": "]"}


def _split_top(text: str, sep: str | None) -> list[str]:
    """Split at ``sep`` (None: whitespace) outside brackets and quotes."""
    parts, depth, start, quote = [], [], 0, None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _OPEN:
            depth.append(_OPEN[ch])
        elif ch in ")}]":
            if not depth or depth.pop() != ch:
                raise OpfuseError(f"unbalanced '{ch}' in pass pipeline: {text}")
        elif not depth and (ch == sep or (sep is None and ch.isspace())):
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if depth or quote:
        raise OpfuseError(f"unbalanced brackets or quotes in pass pipeline: {text}")
    parts.append(text[start:])
    if sep is None:
        return [p for p in parts if p]
    return [p.strip() for p in parts]


_ELEMENT = re.compile(r"([A-Za-z_][\w.\-]*)\s*(.*)", re.S)


def _split_element(element: str) -> tuple[str, str]:
    """``name{opts}`` / ``name(nested)`` / ``name`` -> (name, rest)."""
    m = _ELEMENT.fullmatch(element.strip())
    rest = m.group(2).strip() if m else ""
    if not m or (rest and not (rest[0] + rest[-1] in ("{}", "()"))):
        raise OpfuseError(f"malformed pass pipeline element '{element}'")
    return m.group(1), rest


def _strip_anchor(text: str) -> str:
    """The inside of ``builtin.module(...)``; other text is taken as that list already."""
    text = text.strip()
    if text.startswith(_MODULE_ANCHOR):
        rest = text[len(_MODULE_ANCHOR) :].strip()
        if rest.startswith("(") and rest.endswith(")"):
            inner = rest[1:-1]
            _split_top(inner, ",")  # the outer parens must close at the end
            return inner
        raise OpfuseError(f"malformed pass pipeline: {text} (expected builtin.module(...))")
    return text


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Capture what LLVM writes to fd 2 (option parse errors) so it joins our message."""
    captured: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 (embedded interpreters): nothing to capture
            yield captured
            return
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode(errors="replace"))


def _mlir_pipeline_message(text: str, pipeline: str) -> str:
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^MLIR Textual PassPipeline Parser:\d+:\d+: error: ", "", line)
        line = line.strip().lstrip(": ")  # LLVM's option errors start with an empty prog name
        # drop MLIR's echo of the pipeline and its caret; keep the messages
        if line and line != "^" and line not in pipeline:
            lines.append(line)
    return "; ".join(dict.fromkeys(lines))


def _check_upstream(element: str, reg: dict[str, types.ModuleType]) -> None:
    """Validate one upstream element with MLIR's own parser."""
    try:
        with _native_stderr() as native:
            PassManager.parse(f"{_MODULE_ANCHOR}({element})", context=_scratch_context())
    except ValueError as e:
        nested = [n for n in reg if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", element)]
        if nested:
            raise OpfuseError(
                f"opfuse pass '{nested[0]}' runs on the whole module: put it at the top level "
                f"of builtin.module(...), not inside '{element}'"
            ) from None
        message = _mlir_pipeline_message(str(e) + "\n" + "".join(native), element)
        raise OpfuseError(
            f"invalid pass '{element}' in pipeline: {message} "
            f"(opfuse passes: {', '.join(reg)})"
        ) from None


_SCRATCH: ir.Context | None = None


def _scratch_context() -> ir.Context:
    # pipelines are validated when parsed, before any module (and its context) exists
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = ir.Context()
    return _SCRATCH
