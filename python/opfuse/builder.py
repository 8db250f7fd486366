"""The Python graph builder: ``from opfuse.builder import Graph`` (see frontends/builder.py)."""

from .frontends.builder import DTYPES, Graph, Tensor  # noqa: F401
