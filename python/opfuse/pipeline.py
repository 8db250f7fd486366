"""The pass pipeline: the default fusion order, pipeline strings, and the stage driver.

A :class:`Pipeline` is data: an ordered list of steps, each an opfuse pass (its module and
an ``Options`` instance) or a run of upstream MLIR passes. It prints as the textual
pipeline ``fuse-opt --pass-pipeline=`` takes, and parses back from it, so every Python run
can be replayed on the command line::

    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise{delta=0.2},canonicalize)")
    ledger = p.run(module, dump_dir="dumps")

``run`` verifies the module after each step, turns every failure into one
:class:`OpfuseError` with MLIR locations, and writes a reproducer for internal errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import itertools
import json
import os
import re
import shlex
import tempfile
import traceback
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

from mlir import ir
from mlir.passmanager import PassManager

from . import tempdirs
from . import config
from . import ir as oir
from .ir import clone_module
from .errors import EXIT_INTERNAL_ERROR, OpfuseError
from .analysis.opinfo import info_cache, invalidate_cache
from .report import ledger as ledger_mod

# The default fusion pipeline, written once. Each pass only sees the groups the earlier
# ones formed (groups live in the IR as attributes), so the order is a design decision:
DEFAULT_PIPELINE: tuple[str, ...] = (
    # Size-1 dims folded away before any pass compares iteration spaces: other producers
    # (torch-mlir, IREE) keep reduced dims as size 1 ((d0, d1) -> (d0, 0), or a reduction
    # expanded to 32x1 and read at (d0, 0)), and 32x1 glue next to a reduction over 32 rows
    # would look like another domain. First, because it rewrites ops (and would drop
    # the groups later passes record); it leaves functions without unit dims untouched.
    "opfuse-fold-unit-dims",
    # Elementwise/broadcast chains first, so every later pass reasons about whole loop
    # groups rather than single ops (one candidate per chain, not one per op pair).
    "opfuse-fuse-elementwise",
    # Injective (transpose, reshape, slice, broadcast) and cheap producers next, so a
    # reduction sees its real producers rather than a copy in between.
    "opfuse-fuse-producer-consumer",
    # Reductions absorb the loop groups around them ("reduce while computing", and the
    # row consumers of softmax/layernorm) once those groups are final.
    "opfuse-fuse-reduction",
    # A column reduction (a sum over the sequence of B x S x H, a weight norm over a
    # filter's leading axes) takes its consumers over its results or its domain and the
    # small producers it reads through a broadcast: one thread per kept point walks its
    # column. After the reductions, which built its producers' group and the row kernels
    # its broadcast producers may be; before the epilogues, which would claim a consumer
    # that is also a matmul's.
    "opfuse-fuse-columns",
    # A scan (cumsum) takes the loop groups over its domain on both sides (the mask it
    # counts, the position arithmetic after it); after the reductions, which do not take a
    # scan, so that a loop group both could claim goes to the reduction first.
    "opfuse-fuse-scan",
    # Matmul roots take the elementwise consumers the reductions did not claim (bias, GELU,
    # residual: the epilogue runs on the accumulators in registers). After the reductions,
    # so that softmax after QK^T stays one row kernel instead of becoming a matmul epilogue.
    "opfuse-fuse-epilogue",
    # Sibling matmuls over one LHS (Q/K/V, SwiGLU's W1 and W3) once each has its epilogue:
    # one kernel whose tiles each read their own weight and apply their own epilogue.
    "opfuse-fuse-horizontal",
    # Recomputation after the other loop fusions, on their final groups: a small loop group read
    # through a broadcast by a larger kernel (position ids, position embeddings, mask
    # pieces) is computed again inside it where the time model says so. Before attention, so that
    # a mask shared by every layer is each softmax's own and does not keep S in memory.
    "opfuse-fuse-recompute",
    # Attention last among the fusions: it merges whole groups (Q·Kᵀ with its prologue, the
    # softmax row kernel, P·V with its epilogue) once each is final, into one kernel that
    # keeps S and P on chip.
    "opfuse-fuse-attention",
    # Outlining last: it turns the final groups into functions and cannot be undone.
    "opfuse-outline",
)

_MODULE_ANCHOR = "builtin.module"


# --- registry -------------------------------------------------------------------------


def registry() -> dict[str, types.ModuleType]:
    """``{name: pass module}`` of every opfuse pass (see ``opfuse.passes``)."""
    from . import passes  # noqa: PLC0415  (opfuse.passes imports this package)

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


# --- options --------------------------------------------------------------------------


def option_fields(options_cls: type) -> dict[str, Any]:
    """``{field name: resolved type}`` of an Options dataclass, in declaration order."""
    hints = typing.get_type_hints(options_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(options_cls) if f.init}


def option_key(field_name: str) -> str:
    """The kebab-case spelling used in pipeline strings: ``r_limit`` -> ``r-limit``."""
    return field_name.replace("_", "-")


def describe_type(tp: Any) -> str:
    """A short name for an option type, for help and error messages."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "|".join(str(m.value) for m in tp)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"comma-separated {describe_type(typing.get_args(tp)[0])}s"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1].replace("\\" + text[0], text[0])
    return text


def _convert(text: str, tp: Any) -> Any:
    """Convert an option's text to ``tp``; ValueError when it does not fit."""
    text = text.strip()
    origin = typing.get_origin(tp)
    if tp is Any or tp is str:
        return _unquote(text)
    if tp is bool:
        low = text.lower()
        if low in ("true", "1", "on", "yes"):
            return True
        if low in ("false", "0", "off", "no"):
            return False
        raise ValueError(text)
    if tp is int:
        return int(text, 0)
    if tp is float:
        return float(text)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if text in (str(member.value), member.name):
                return member
        raise ValueError(text)
    if origin is typing.Literal:
        for arg in typing.get_args(tp):
            if text == str(arg):
                return arg
        raise ValueError(text)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and text.lower() in ("none", ""):
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ValueError):
                    return _convert(text, arg)
        raise ValueError(text)
    if origin is tuple:
        args = typing.get_args(tp)
        items = [t for t in _unquote(text).split(",") if t.strip()] if text else []
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(t, args[0]) for t in items)
        if len(items) != len(args):
            raise ValueError(text)
        return tuple(_convert(t, a) for t, a in zip(items, args))
    raise ValueError(f"unsupported option type {tp}")


def _coerce(value: Any, tp: Any) -> Any:
    """A Python value for an option of type ``tp``: text is converted, numbers widened."""
    if isinstance(value, str) and tp is not str:
        return _convert(value, tp)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ValueError(value)
    if typing.get_origin(tp) is tuple and isinstance(value, list):
        return tuple(value)
    if typing.get_origin(tp) is None and isinstance(tp, type) and not isinstance(value, tp):
        if issubclass(tp, enum.Enum):
            return _convert(str(value), tp)
        raise ValueError(value)
    return value


def format_value(value: Any) -> str:
    """An option value as pipeline text (the inverse of the parser)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if re.fullmatch(r"[\w.+\-/:]+", text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


def make_options(
    pass_name: str, options_cls: type, values: dict[str, Any], *, text: bool = False
) -> Any:
    """An Options instance from ``{key: value}`` (keys kebab or snake case; values typed,
    or strings converted to the field's type; all pipeline text when ``text``). Unknown
    keys and bad values raise OpfuseError listing the valid options."""
    fields = option_fields(options_cls)
    kwargs = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise OpfuseError(
                f"unknown option '{key}' for {pass_name}; valid options: "
                f"{describe_options(options_cls)}"
            )
        try:
            kwargs[name] = _convert(value, fields[name]) if text else _coerce(value, fields[name])
        except ValueError:
            raise OpfuseError(
                f"invalid value '{value}' for option '{option_key(name)}' of {pass_name}: "
                f"expected {describe_type(fields[name])}; valid options: "
                f"{describe_options(options_cls)}"
            ) from None
    try:
        return options_cls(**kwargs)
    except (TypeError, ValueError) as e:  # an Options.__post_init__ rejecting a value
        raise OpfuseError(f"invalid options for {pass_name}: {e}") from None


def describe_options(options_cls: type) -> str:
    """``delta=0.1 (float), r-limit=0 (int), ...``: every option with its default."""
    defaults = options_cls()
    return ", ".join(
        f"{option_key(name)}={format_value(getattr(defaults, name))} ({describe_type(tp)})"
        for name, tp in option_fields(options_cls).items()
    ) or "(none)"


def format_options(options: Any) -> str:
    """``{delta=0.2 r-limit=32}`` for the fields that differ from the defaults, or ``""``."""
    defaults = type(options)()
    parts = [
        f"{option_key(name)}={format_value(getattr(options, name))}"
        for name in option_fields(type(options))
        if getattr(options, name) != getattr(defaults, name)
    ]
    return "{" + " ".join(parts) + "}" if parts else ""


def parse_option_text(text: str) -> list[tuple[str, str | None]]:
    """Split ``delta=0.2 r-limit=32`` (or ``delta=0.2,r-limit=32``) into (key, value) pairs;
    a bare ``key`` has value None (a boolean switched on)."""
    pairs = []
    for token in _split_top(text, None):
        for part in re.split(r",(?=\s*[A-Za-z_][\w-]*\s*=)", token):
            if not part.strip():
                continue
            key, eq, value = part.partition("=")
            pairs.append((key.strip(), value if eq else None))
    return pairs


def _options_from_text(pass_name: str, options_cls: type, text: str) -> Any:
    values: dict[str, Any] = {}
    fields = option_fields(options_cls)
    for key, value in parse_option_text(text):
        if value is None:
            if fields.get(key.replace("-", "_")) is not bool:
                raise OpfuseError(
                    f"option '{key}' of {pass_name} needs a value (key=value); valid options: "
                    f"{describe_options(options_cls)}"
                )
            value = "true"
        values[key] = value
    return make_options(pass_name, options_cls, values, text=True)


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


# --- steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OpfuseStep:
    """One opfuse pass with its options."""

    name: str
    module: types.ModuleType
    options: Any

    def __str__(self) -> str:
        return self.name + format_options(self.options)

    @property
    def stage(self) -> str:
        """The name used for dump files."""
        return self.name

    def run(self, module: ir.Module) -> None:
        self.module.run(module, self.options)


@dataclass(frozen=True)
class UpstreamStep:
    """Consecutive upstream MLIR passes, run by one ``builtin.module(...)`` PassManager.

    ``elements`` are the top-level pipeline elements as written (``canonicalize``,
    ``func.func(cse)``); they are validated by :meth:`Pipeline.parse` / :func:`upstream`.
    """

    elements: tuple[str, ...]

    def __str__(self) -> str:
        return ",".join(self.elements)

    @property
    def names(self) -> list[str]:
        return [_split_element(e)[0] for e in self.elements]

    @property
    def name(self) -> str:
        return "+".join(self.names)

    @property
    def stage(self) -> str:
        return re.sub(r"[^\w.+-]", "_", self.name)

    def run(self, module: ir.Module) -> None:
        pm = PassManager.parse(f"{_MODULE_ANCHOR}({self})", context=module.context)
        pm.run(module.operation)


Step = Union[OpfuseStep, UpstreamStep]


def make_step(name: str, options: Any = None, **values: Any) -> OpfuseStep:
    """The opfuse pass ``name`` with ``options`` (an Options instance, default: defaults),
    overridden by ``values`` (typed, or text as in a pipeline string)."""
    mod = _pass_module(name)
    base = options if options is not None else mod.Options()
    if not isinstance(base, mod.Options):
        raise OpfuseError(f"options for {name} must be {mod.__name__}.Options, got {type(base)}")
    if values:
        merged = {f: getattr(base, f) for f in option_fields(mod.Options)}
        merged.update({k.replace("-", "_"): v for k, v in values.items()})
        base = make_options(name, mod.Options, merged)
    return OpfuseStep(name, mod, base)


def upstream(*elements: str) -> UpstreamStep:
    """An upstream step, validated: ``upstream("canonicalize", "func.func(cse)")``."""
    reg = registry()
    for element in elements:
        _check_upstream(element, reg)
    return UpstreamStep(tuple(e.strip() for e in elements))


# --- the pipeline -----------------------------------------------------------------------


class Pipeline:
    """An ordered list of steps: opfuse passes and runs of upstream passes."""

    def __init__(self, steps: typing.Iterable[Step] = ()) -> None:
        self.steps: list[Step] = list(steps)

    @classmethod
    def parse(cls, text: str) -> Pipeline:
        """Parse ``builtin.module(opfuse-fuse-elementwise{delta=0.2},canonicalize,...)``.

        opfuse names become opfuse steps (options from ``{key=value ...}``); consecutive
        other elements become one upstream step, checked by MLIR's parser. A bare list
        without the ``builtin.module(...)`` anchor is accepted too.

        Raises:
            OpfuseError: malformed text, an unknown pass or option, a bad option value.
        """
        reg = registry()
        steps: list[Step] = []
        run: list[str] = []
        inner = _strip_anchor(text)
        elements = _split_top(inner, ",") if inner.strip() else []
        for element in elements:
            if not element:
                raise OpfuseError(f"empty element in pass pipeline: {text}")
            name, rest = _split_element(element)
            if name not in reg:
                _check_upstream(element, reg)
                run.append(element)
                continue
            if rest.startswith("("):
                raise OpfuseError(
                    f"opfuse pass '{name}' takes options in {{...}}, not a nested pipeline"
                )
            if run:
                steps.append(UpstreamStep(tuple(run)))
                run = []
            mod = reg[name]
            steps.append(OpfuseStep(name, mod, _options_from_text(name, mod.Options, rest[1:-1])))
        if run:
            steps.append(UpstreamStep(tuple(run)))
        return cls(steps)

    @classmethod
    def default(cls, disable: typing.Iterable[str] = (), **options: Any) -> Pipeline:
        """The default fusion pipeline (``DEFAULT_PIPELINE``).

        Args:
            disable: pass names to leave out.
            **options: shared options (``delta=0.2``, ``r_limit=32``, ``target="sm_80"``),
                applied to every pass whose Options has that field.

        Raises:
            OpfuseError: an unknown pass in ``disable`` or an option no pass has.
        """
        reg = registry()
        disable = set(disable)
        unknown = disable - set(DEFAULT_PIPELINE)
        if unknown:
            raise OpfuseError(
                f"cannot disable {', '.join(sorted(unknown))}: not in the default pipeline "
                f"({', '.join(DEFAULT_PIPELINE)})"
            )
        mods = {name: _pass_module(name, reg) for name in DEFAULT_PIPELINE}
        fields = {name: option_fields(m.Options) for name, m in mods.items()}
        options = {k.replace("-", "_"): v for k, v in options.items()}
        known = {f for fs in fields.values() for f in fs}
        for key in options:
            if key not in known:
                raise OpfuseError(
                    f"unknown option '{option_key(key)}' for the default pipeline; valid options: "
                    f"{', '.join(sorted(option_key(k) for k in known))}"
                )
        steps: list[Step] = []
        for name in DEFAULT_PIPELINE:
            if name in disable:
                continue
            mine = {k: v for k, v in options.items() if k in fields[name]}
            steps.append(OpfuseStep(name, mods[name], make_options(name, mods[name].Options, mine)))
        return cls(steps)

    # -- editing (each returns self, so edits chain) --

    def append(self, step: Step | str) -> Pipeline:
        """Append a step, or the steps of a pipeline string (``"canonicalize"``)."""
        self.steps.extend(self._steps_of(step))
        return self

    def insert(self, index: int, step: Step | str) -> Pipeline:
        """Insert a step (or the steps of a pipeline string) before ``index``."""
        self.steps[index:index] = self._steps_of(step)
        return self

    def remove(self, name: str) -> Pipeline:
        """Remove every step (or upstream element) named ``name``."""
        kept: list[Step] = []
        found = False
        for step in self.steps:
            if isinstance(step, OpfuseStep):
                found |= step.name == name
                if step.name != name:
                    kept.append(step)
                continue
            elements = tuple(e for e in step.elements if _split_element(e)[0] != name)
            found |= len(elements) != len(step.elements)
            if elements:
                kept.append(UpstreamStep(elements))
        if not found:
            raise OpfuseError(
                f"no pass '{name}' in pipeline {self} (passes: {', '.join(self.names)})"
            )
        self.steps = kept
        return self

    @staticmethod
    def _steps_of(step: Step | str) -> list[Step]:
        if isinstance(step, str):
            return Pipeline.parse(step).steps
        if not isinstance(step, (OpfuseStep, UpstreamStep)):
            raise TypeError(f"not a pipeline step: {step!r}")
        return [step]

    # -- views --

    @property
    def names(self) -> list[str]:
        """The pass names in order (upstream elements by their top-level name)."""
        out: list[str] = []
        for step in self.steps:
            out.extend([step.name] if isinstance(step, OpfuseStep) else step.names)
        return out

    def __str__(self) -> str:
        return f"{_MODULE_ANCHOR}({','.join(str(s) for s in self.steps)})"

    def __repr__(self) -> str:
        return f"Pipeline({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pipeline) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def command(self, input_path: str | os.PathLike) -> str:
        """The one-line ``fuse-opt`` command that replays this pipeline on a file."""
        pipeline, path = shlex.quote(str(self)), shlex.quote(str(input_path))
        return f"fuse-opt --mlir-print-debuginfo --pass-pipeline={pipeline} {path}"

    # -- running --

    def run(
        self,
        module: ir.Module,
        *,
        dump_dir: str | os.PathLike | None = None,
        ledger: ledger_mod.Ledger | None = None,
        name: str | None = None,
    ) -> ledger_mod.Ledger:
        """Run every step on ``module`` in place, verifying after each.

        Args:
            module: the module to transform.
            dump_dir: write ``NN-<stage>.mlir`` after each step, ``pipeline.txt`` and
                ``ledger.json`` into a fresh subfolder ``<name>-<pid>-<n>`` of it.
                Default: ``$OPFUSE_DUMP_DIR``, else no dumps.
            ledger: the ledger to append to (default: a new one).
            name: the input's name for the dump folder (default: from the module's location).

        Returns:
            The ledger with every decision the passes recorded.

        Raises:
            OpfuseError: a step failed (exit code 1), or a pass crashed or produced invalid
                IR (exit code 2, with a reproducer path among the diagnostics).
        """
        root = Path(dump_dir) if dump_dir is not None else config.DUMP_DIR.path()
        # The input is saved before running (for reproducers) as a C++ clone, which is far
        # cheaper than printing (0.5 s at 10,000 ops); it is printed only when needed.
        saved_input = module.operation.clone()
        stem = name if name is not None else _module_stem(module)
        dumps = _Dumps.create(root, stem) if root is not None else None
        with ledger_mod.collecting(ledger) as led, info_cache(), _no_cyclic_gc():
            try:
                if dumps:
                    dumps.write("pipeline.txt", f"{self}\n")
                    dumps.write("00-input.mlir", _print_op(saved_input))
                for index, step in enumerate(self.steps, 1):
                    _run_step(step, module)
                    if dumps:
                        text = oir.print_module(module, debug_info=True)
                        dumps.write(f"{index:02d}-{step.stage}.mlir", text)
            except OpfuseError as e:
                self._attach_reproducer(e, saved_input, dumps)
                raise
            finally:
                if dumps:  # also after a failure: the decisions made so far
                    with contextlib.suppress(OpfuseError):
                        dumps.write("ledger.json", json.dumps(led.to_json(), indent=2) + "\n")
        return led

    def _attach_reproducer(self, error: OpfuseError, saved_input: ir.Operation,
                           dumps: _Dumps | None) -> None:
        """Save input + pipeline + command for internal errors (always) and dumped runs."""
        if dumps is None and error.exit_code != EXIT_INTERNAL_ERROR:
            return
        with contextlib.suppress(OSError):
            folder = dumps.folder if dumps else tempdirs.new_folder("repro")
            target = folder / "00-input.mlir"
            if not target.exists():
                target.write_text(_print_op(saved_input))
                (folder / "pipeline.txt").write_text(f"{self}\n")
            if error.__cause__ is not None:
                tb = traceback.format_exception(error.__cause__)
                (folder / "traceback.txt").write_text("".join(tb))
            command = self.command(target)
            (folder / "reproduce.sh").write_text(f"#!/bin/sh\n{command}\n")
            error.diagnostics.append(f"note: reproduce with: {command}")


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while passes run. They allocate many small,
    acyclic objects (freed by reference counting), and each collection walks the whole heap:
    with torch and jax loaded, planning a 10,000-op graph took 2.4 s with it, 1.7 s without.
    Cycles made meanwhile are collected once it is back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _print_op(op: ir.Operation) -> str:
    return op.get_asm(enable_debug_info=True)


def _run_step(step: Step, module: ir.Module) -> None:
    """One step, then the verifier; every failure becomes an OpfuseError."""
    ctx = module.context
    label = step.name if isinstance(step, OpfuseStep) else str(step)
    if isinstance(step, UpstreamStep):
        invalidate_cache()  # upstream passes may rewrite any op
    with oir.collect_diagnostics(ctx) as diags:
        try:
            step.run(module)
        except OpfuseError as e:
            e.diagnostics[:0] = [d for d in diags if d not in e.diagnostics]
            raise
        except ir.MLIRError as e:
            raise OpfuseError(
                f"pass '{label}' failed", diagnostics=diags + mlir_error_lines(e)
            ) from None
        except Exception as e:  # a bug in a pass, not in the input
            raise OpfuseError(
                f"internal error in pass '{label}': {type(e).__name__}: {e}",
                diagnostics=diags,
                exit_code=EXIT_INTERNAL_ERROR,
            ) from e
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise OpfuseError(
                f"internal error: pass '{label}' produced invalid IR",
                diagnostics=diags + mlir_error_lines(e),
                exit_code=EXIT_INTERNAL_ERROR,
            ) from None


def mlir_error_lines(e: ir.MLIRError) -> list[str]:
    """``file:line:col: error: message`` lines of an MLIRError (first line of each
    message: notes like "see current operation" carry whole IR dumps)."""
    lines = []
    for d in getattr(e, "error_diagnostics", None) or []:
        lines.append(f"{oir.format_location(d.location)}: error: {_first_line(d.message)}")
        for n in d.notes:
            lines.append(f"{oir.format_location(n.location)}: note: {_first_line(n.message)}")
    return lines or [f"error: {_first_line(str(e))}"]


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].rstrip(": ")


def _module_stem(module: ir.Module) -> str:
    with contextlib.suppress(Exception):
        loc = module.operation.location
        if loc.is_a_file():
            return Path(loc.filename).stem
        for op in module.body.operations:
            if op.location.is_a_file():
                return Path(op.location.filename).stem
    return "module"


_RUNS = itertools.count()


@dataclass
class _Dumps:
    """One run's dump folder: ``<root>/<stem>-<pid>-<n>``, never shared between runs."""

    folder: Path

    @classmethod
    def create(cls, root: Path, stem: str) -> _Dumps:
        stem = re.sub(r"[^\w.-]+", "_", stem).strip("_.") or "module"
        try:
            root.mkdir(parents=True, exist_ok=True)
            while True:
                folder = root / f"{stem}-{os.getpid()}-{next(_RUNS)}"
                with contextlib.suppress(FileExistsError):
                    folder.mkdir()
                    return cls(folder)
        except OSError as e:
            raise OpfuseError(f"cannot create dump folder in {root}: {e.strerror}") from None

    def write(self, name: str, text: str) -> None:
        try:
            (self.folder / name).write_text(text)
        except OSError as e:
            raise OpfuseError(f"cannot write {self.folder / name}: {e.strerror}") from None


__all__ = [
    "DEFAULT_PIPELINE",
    "OpfuseStep",
    "Pipeline",
    "Step",
    "UpstreamStep",
    "clone_module",
    "describe_options",
    "make_step",
    "registry",
    "upstream",
]
