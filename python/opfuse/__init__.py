"""opfuse: an operator-fusion compiler in Python on the upstream MLIR bindings.

    exe = opfuse.compile("examples/g2_elementwise_chain.mlir", backend="cpu")
    out = exe(x, a, b, c, d)
    print(exe.report["totals"])

The MLIR bindings load on first use of ``compile`` or ``Pipeline``, so ``import opfuse``
stays cheap and needs none of the optional extras (torch, PyCUDA, a GPU).
"""

from __future__ import annotations

from typing import Any

from .errors import OpfuseError

__all__ = ["OpfuseError", "compile", "Pipeline", "Executable"]
from .version import __version__  # noqa: E402,F401


def __getattr__(name: str) -> Any:
    if name == "compile":
        from .api import compile

        return compile
    if name == "Pipeline":
        from .pipeline import Pipeline

        return Pipeline
    if name == "Executable":
        from .driver.executable import Executable

        return Executable
    raise AttributeError(f"module 'opfuse' has no attribute {name!r}")
