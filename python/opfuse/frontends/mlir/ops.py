"""The ops opfuse accepts, where, derived from what the passes and backends handle.

Top level of a function (what becomes kernels and the host schedule):

* linalg structured ops (``linalg.generic`` and the named ops: every op of the dialect
  with a body region, which ``linalg-generalize-named-ops`` turns into a generic and the
  CPU lowering turns into loops); not ``linalg.softmax``, ``linalg.pack``/``unpack``,
  ``linalg.winograd_*`` (no body: they need their own decompositions first);
* the tensor ops the analysis describes (reshapes, slices, ``concat``, ``pad``:
  ``analysis.opinfo``), ``tensor.empty``, and ``cast``/``extract``/``from_elements``/``splat``
  (kernels of their own);
* ``arith.constant``, ``ub.poison``, ``func.call``, ``func.return``, and scalar ``arith``/
  ``math`` ops (scalar work between kernels, e.g. on an element ``tensor.extract`` took:
  every kernel that uses the scalar computes it again, ``analysis.opinfo.is_scalar_op``).

Inside linalg bodies (scalars): ``arith``, ``math``, ``linalg.yield``, ``linalg.index``,
``tensor.extract`` (a gather), ``cf.assert``, ``ub.poison``.

Everything else is refused with the reason: control flow (``scf``, ``cf`` branches: the
passes and the GPU emitters see straight-line tensor programs), ``tensor.generate`` and
other ops with bodies the analysis cannot see into, memrefs (opfuse bufferizes itself),
and unknown dialects.
"""

from __future__ import annotations

from mlir import ir

TOP_LEVEL = frozenset({
    "func.return", "func.call", "arith.constant", "ub.poison",
    "tensor.empty", "tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape",
    "tensor.extract_slice", "tensor.insert_slice", "tensor.concat", "tensor.pad",
    "tensor.cast", "tensor.extract", "tensor.from_elements", "tensor.splat",
})

#: linalg ops without a body region, refused by name (the rest of the dialect's
#: region-less ops are refused generically).
_LINALG_NO_BODY_HINT = {
    "linalg.softmax": "write it as linalg.generic ops (max, exp, sum, divide), as "
                      "torch-mlir prints it",
}

PAYLOAD_DIALECTS = ("arith.", "math.")
PAYLOAD_OPS = frozenset({"linalg.yield", "linalg.index", "tensor.extract", "cf.assert",
                         "ub.poison"})

_WHY = {
    "scf.": "is control flow: opfuse takes straight-line linalg programs (write loops as "
            "linalg ops over the whole iteration space)",
    "cf.": "is control flow: opfuse takes functions of one block",
    "memref.": "works on memrefs: opfuse takes linalg on tensors and bufferizes itself",
    "bufferization.": "works on buffers: opfuse takes linalg on tensors and bufferizes itself",
    "gpu.": "is GPU code: opfuse takes linalg on tensors and generates the kernels itself",
    "affine.": "is loop code: opfuse takes linalg on tensors",
    "vector.": "is vector code: opfuse takes linalg on tensors",
}


def _is_tensor(v: ir.Value) -> bool:
    return isinstance(v.type, ir.ShapedType)


def is_elementwise_on_tensors(op: ir.Operation) -> bool:
    """An arith/math op applied to whole tensors (convert-elementwise-to-linalg's job)."""
    name = op.name
    if not name.startswith(PAYLOAD_DIALECTS) or name == "arith.constant":
        return False
    return any(_is_tensor(v) for v in (*op.operands, *op.results))


def _dialect_reason(name: str) -> str:
    for prefix, why in _WHY.items():
        if name.startswith(prefix):
            return why
    return "is not an op opfuse knows (linalg, tensor, arith/math inside linalg bodies, " \
           "constants, func.call/return)"


def top_level_problem(op: ir.Operation) -> str | None:
    """Why ``op`` cannot stand at the top level of a function, or None."""
    name = op.name
    if name in TOP_LEVEL:
        return None
    if name.startswith("linalg."):
        if op.regions and len(op.regions) == 1:
            return None
        hint = _LINALG_NO_BODY_HINT.get(name)
        return ("has no body region: opfuse fuses linalg structured ops"
                + (f"; {hint}" if hint else ""))
    if name == "tensor.generate":
        return ("builds a tensor from a body opfuse cannot analyse: write it as a "
                "linalg.generic (linalg.index gives the element's position)")
    if name.startswith(PAYLOAD_DIALECTS):
        if any(_is_tensor(v) for v in (*op.operands, *op.results)):
            return "on tensors could not be rewritten as linalg.generic"
        if op.regions:
            return "has a body: not supported outside linalg bodies"
        return None  # scalar arithmetic between kernels: cloned into each kernel using it
    if name.startswith("tensor."):
        return "is not one of the tensor ops opfuse handles (" \
               + ", ".join(sorted(n for n in TOP_LEVEL if n.startswith("tensor."))) + ")"
    return _dialect_reason(name)


def payload_problem(owner: ir.Operation, inner: ir.Operation) -> str | None:
    """Why ``inner`` cannot stand in the body of top-level op ``owner``, or None."""
    name = inner.name
    if owner.name == "tensor.pad":
        if name in ("tensor.yield", "arith.constant") or name.startswith(PAYLOAD_DIALECTS):
            return None
        return "in a tensor.pad body: the padding value must be a constant or scalar arith"
    if name in PAYLOAD_OPS:
        return None
    if name.startswith(PAYLOAD_DIALECTS):
        if any(_is_tensor(v) for v in (*inner.operands, *inner.results)):
            return "on tensors inside a linalg body"
        if inner.regions:
            return "has a body: not supported inside linalg bodies"
        return None
    if name.startswith("linalg."):
        return "nested in a linalg body: opfuse fuses linalg ops at the top level of a function"
    return _dialect_reason(name) + " (inside a linalg body)"
