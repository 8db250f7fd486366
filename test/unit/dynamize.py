"""Dynamic versions of builder graphs, written the way dynamic exports write them.

A graph is built with *sentinel* sizes for the dims that should be dynamic: primes that
divide no other dim (``SENTINELS``), so a dim of the static module is symbolic exactly when
a sentinel divides it, and its expression is its factorization (``B*T`` is 101*103). The
static text is then rewritten as IREE and torch-mlir print dynamic programs: every such dim
becomes ``?``, each symbol is read once with ``tensor.dim`` of an argument, and every
``tensor.empty`` and ``tensor.expand_shape`` gets its sizes as SSA operands (products by
``arith.muli``). Nothing in it knows opfuse's passes: it is a test input writer.

A sentinel dim must not be reduced by a mean (the builder folds 1/N into a constant, which
a dynamic export computes from ``tensor.dim``): callers keep reduced-and-averaged dims static.
"""

from __future__ import annotations

import math
import re

SENTINELS = (101, 103, 107)

_TENSOR = re.compile(r"tensor<([0-9x]+)x([a-z][a-z0-9]*)>|tensor<([a-z][a-z0-9]*)>")


def factor(d: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``d`` as (coefficient, ((sentinel, exponent), ...))."""
    exps = []
    for p in SENTINELS:
        e = 0
        while d % p == 0:
            d //= p
            e += 1
        if e:
            exps.append((p, e))
    return d, tuple(exps)


def is_symbolic(d: int) -> bool:
    return bool(factor(d)[1])


def _dims_text(dims: list[int]) -> str:
    return "x".join("?" if is_symbolic(d) else str(d) for d in dims)


def _retype(text: str) -> str:
    def sub(m: re.Match) -> str:
        if m.group(3):
            return m.group(0)
        dims = [int(d) for d in m.group(1).split("x")]
        return f"tensor<{_dims_text(dims)}x{m.group(2)}>"
    return _TENSOR.sub(sub, text)


def dynamize(text: str) -> str:
    """The static module ``text`` (one function, built at sentinel sizes) with its sentinel
    dims dynamic."""
    head = re.search(r"func\.func (?:private )?@(\w+)\((.*?)\)\s*->", text, re.S)
    args = re.findall(r"(%[\w.]+): tensor<([0-9x]+)x([a-z][a-z0-9]*)>", head.group(2))
    sources: dict[int, tuple[str, int, str]] = {}  # sentinel -> (arg, dim, its type text)
    for name, dims, elem in args:
        for i, d in enumerate(int(x) for x in dims.split("x")):
            if d in SENTINELS and d not in sources:
                sources[d] = (name, i, f"tensor<{_dims_text([int(x) for x in dims.split('x')])}x{elem}>")
    defs: list[str] = []
    names: dict[int, str] = {}

    def size(d: int) -> str:
        """The SSA name of dim ``d``'s size, defined once at the function's start."""
        if d in names:
            return names[d]
        coeff, exps = factor(d)
        terms = [p for p, e in exps for _ in range(e)]
        if terms[0] not in sources:
            raise ValueError(f"no argument has a dim of sentinel size {terms[0]}")
        value = _symbol(terms[0])
        for p in terms[1:]:
            value = _mul(value, _symbol(p), f"{value[1:]}_{p}")
        if coeff != 1:
            c = f"%dyn_c{coeff}"
            if c not in "".join(defs):
                defs.append(f"    {c} = arith.constant {coeff} : index")
            value = _mul(value, c, f"{value[1:]}_x{coeff}")
        names[d] = value
        return value

    def _symbol(p: int) -> str:
        name = f"%dyn_s{p}"
        if name not in "".join(defs):
            arg, i, ty = sources[p]
            defs.append(f"    %dyn_i{p} = arith.constant {i} : index")
            defs.append(f"    {name} = tensor.dim {arg}, %dyn_i{p} : {ty}")
        return name

    def _mul(a: str, b: str, tag: str) -> str:
        name = f"%dyn_{tag}"
        if f"{name} =" not in "".join(defs):
            defs.append(f"    {name} = arith.muli {a}, {b} : index")
        return name

    def empty(m: re.Match) -> str:
        dims = [int(x) for x in m.group(1).split("x")]
        operands = ", ".join(size(d) for d in dims if is_symbolic(d))
        return f"tensor.empty({operands}) : tensor<{m.group(1)}x{m.group(2)}>"

    body = re.sub(r"tensor\.empty\(\) : tensor<([0-9x]+)x([a-z][a-z0-9]*)>", empty, text)

    def expand(m: re.Match) -> str:
        dims = [int(x) for x in m.group(1).split(",")]
        return "output_shape [" + ", ".join(size(d) if is_symbolic(d) else str(d)
                                            for d in dims) + "]"

    body = re.sub(r"output_shape \[([0-9, ]+)\]", expand, body)
    if re.search(r"dense<[^>]*> : tensor<[0-9x]*(%s)" % "|".join(map(str, SENTINELS)), body):
        raise ValueError("a constant tensor has a sentinel dim")
    body = _retype(body)
    # the size definitions go first in the body (after the signature's opening brace)
    start = re.search(r"func\.func (?:private )?@\w+\(.*?\)\s*->.*?\{\n", body, re.S).end()
    return body[:start] + "\n".join(defs) + ("\n" if defs else "") + body[start:]


def shape_at(dims: tuple[int, ...], values: dict[int, int]) -> tuple[int, ...]:
    """A sentinel-sized shape at concrete ``values`` of the sentinels."""
    out = []
    for d in dims:
        coeff, exps = factor(d)
        out.append(coeff * math.prod(values[p] ** e for p, e in exps))
    return tuple(out)
