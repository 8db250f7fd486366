"""Pipeline steps and the :class:`Pipeline` driver: the default fusion order, parsing and
printing whole pipelines, and running them with verification, dumps and reproducers."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import re
import shlex
import traceback
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

from mlir import ir
from mlir.passmanager import PassManager

from .. import tempdirs
from .. import config
from .. import ir as oir
from ..errors import EXIT_INTERNAL_ERROR, OpfuseError
from ..analysis.opinfo import info_cache, invalidate_cache
from ..analysis import ledger as ledger_mod
from .options import format_options, make_options, option_fields, option_key, _options_from_text
from .text import (
    _MODULE_ANCHOR,
    _check_upstream,
    _pass_module,
    _split_element,
    _split_top,
    _strip_anchor,
    registry,
)

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
    # A column sum of what a row kernel or a matmul computes (a backward pass's bias and
    # LayerNorm weight gradients) joins that kernel, which adds into it atomically: after
    # opfuse-fuse-columns, which gives column groups their own consumers and producers
    # first, and after the epilogues, so that a sum of an epilogue's result finds the
    # matmul; before the horizontal joins, which leave a matmul with a sum alone.
    "opfuse-fuse-column-sums",
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
    # Independent matmuls reading one tensor (a backward's dX = dY·W and dW = dYᵀ·X) share
    # a launch: after attention, which must find its Q·Kᵀ and P·V matmuls on their own.
    "opfuse-fuse-grouped",
    # Outlining last: it turns the final groups into functions and cannot be undone.
    "opfuse-outline",
)

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


def default_option_names() -> list[str]:
    """The options of the default pipeline's passes (``delta``, ``r_limit``, ...), sorted:
    what ``Pipeline.default(**options)`` and ``opfuse.compile(**pass_options)`` take."""
    reg = registry()
    return sorted({f for name in DEFAULT_PIPELINE
                   for f in option_fields(_pass_module(name, reg).Options)})


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
        known = set(default_option_names())
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
