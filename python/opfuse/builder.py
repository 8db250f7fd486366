"""The Python graph builder: ``from opfuse.builder import Graph`` (see frontends/builder/graph.py)."""

from .frontends.builder.graph import DTYPES, Graph, Tensor  # noqa: F401
