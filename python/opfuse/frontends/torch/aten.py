"""The ATen op table: which rule imports each ATen overload (``RULES``), and which export
bookkeeping ops are skipped (``IGNORED``).

The rules live in families, one module each: ``aten_pointwise``,
``aten_reductions``, ``aten_matmul``, ``aten_views``,
``aten_factories``, ``aten_gather`` and ``aten_conv`` (how a rule is written: ``aten_rule``). To support an op, add its rule to the family it belongs to;
an op in neither table stops the import with ``UnsupportedOpError``
(``opfuse.frontends.torch.importer``).
"""

from __future__ import annotations

from types import ModuleType

from . import aten_conv
from . import aten_factories
from . import aten_gather
from . import aten_matmul
from . import aten_pointwise
from . import aten_reductions
from . import aten_views
from .aten_rule import Rule

# Export bookkeeping nodes that compute nothing (runtime checks of static facts).
IGNORED = {
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
}


def _merged(*families: ModuleType) -> dict[str, Rule]:
    # Two families claiming one op is a bug: fail on import rather than let one win silently.
    table: dict[str, Rule] = {}
    for family in families:
        for op, rule in family.RULES.items():
            if op in table:
                raise AssertionError(f"{op} has rules in two families ({family.__name__})")
            table[op] = rule
    return table


RULES = _merged(
    aten_pointwise,
    aten_reductions,
    aten_matmul,
    aten_views,
    aten_factories,
    aten_gather,
    aten_conv,
)
