"""opfuse: an operator-fusion compiler in Python on the upstream MLIR bindings."""

from .errors import OpfuseError

__all__ = ["OpfuseError"]
__version__ = "0.1.0"
