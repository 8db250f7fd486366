"""opfuse fusion passes: one module per pass, registered by name.

Each module exports ``NAME`` (the flag, e.g. ``opfuse-fuse-elementwise``), ``Options`` (a
frozen dataclass: every field is a pass option, settable as ``NAME{field=value}`` in a
pipeline string or ``--NAME=field=value,...`` on fuse-opt) and ``run(module, options)``,
which rewrites ``module`` in place and raises OpfuseError on failure.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Order here is only the registry's; the default pipeline's order lives in opfuse.pipeline.
_MODULES = (
    "fold_unit_dims", "fuse_elementwise", "fuse_producer_consumer", "fuse_reduction",
    "fuse_columns", "fuse_column_sums", "fuse_scan", "fuse_epilogue", "fuse_horizontal", "fuse_attention", "fuse_grouped", "fuse_recompute", "outline",
)


def registry() -> dict[str, ModuleType]:
    """``{pass name: module}`` for every opfuse pass."""
    mods = [importlib.import_module(f"{__name__}.{m}") for m in _MODULES]
    return {m.NAME: m for m in mods}
