"""The pass pipeline: the default fusion order, pipeline strings, and the stage driver.

A :class:`Pipeline` is data: an ordered list of steps, each an opfuse pass (its module and
an ``Options`` instance) or a run of upstream MLIR passes. It prints as the textual
pipeline ``fuse-opt --pass-pipeline=`` takes, and parses back from it, so every Python run
can be replayed on the command line::

    p = Pipeline.parse("builtin.module(opfuse-fuse-elementwise{delta=0.2},canonicalize)")
    ledger = p.run(module, dump_dir="dumps")

``run`` verifies the module after each step, turns every failure into one
:class:`OpfuseError` with MLIR locations, and writes a reproducer for internal errors.

The package: ``options`` (typed pass options), ``text`` (parsing the textual pipeline,
the pass registry), ``run`` (steps, :class:`Pipeline`, running and dumps).
"""

from __future__ import annotations

from ..ir import clone_module
from .options import (
    _coerce,
    _convert,
    _options_from_text,
    _unquote,
    describe_options,
    describe_type,
    format_options,
    format_value,
    make_options,
    option_fields,
    option_key,
    parse_option_text,
)
from .run import (
    DEFAULT_PIPELINE,
    OpfuseStep,
    Pipeline,
    Step,
    UpstreamStep,
    _Dumps,
    _first_line,
    _module_stem,
    _no_cyclic_gc,
    _print_op,
    _run_step,
    default_option_names,
    make_step,
    mlir_error_lines,
    upstream,
)
from .text import (
    _MODULE_ANCHOR,
    _check_upstream,
    _mlir_pipeline_message,
    _native_stderr,
    _pass_module,
    _scratch_context,
    _split_element,
    _split_top,
    _strip_anchor,
    registry,
)

__all__ = [
    "DEFAULT_PIPELINE",
    "default_option_names",
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
