"""Vectorizable f32 approximations of the math ops, for the CPU lowering.

LLVM lowers ``math.exp``, ``math.log``, ``math.erf``, ... to calls of the C library's
scalar ``expf``/``logf``/``erff``: a call in a loop body stops LLVM's loop vectorizer, so
every fused kernel with a transcendental ran one element at a time. The upstream MLIR
polynomial-approximation patterns are not exposed by the 22.1.8 bindings (no pass, no
transform op), so opfuse has its own: each op becomes straight-line ``arith`` code
(polynomials, selects, integer bit operations on the float's exponent), which LLVM
vectorizes at the host's full width (16 f32 lanes with AVX-512).

How it is wired: :func:`approximate_math` replaces each f32 math op by a call of a
private helper function (``@__opfuse_math_<op>_<type>``, generated here as MLIR text, one
per op and type in the module, marked ``alwaysinline`` for LLVM: the vectorizer must see
its body, not a call). It runs after
``math-extend-to-supported-types`` in the CPU lowering (so f16/bf16 math is f32 math by
then) and before ``convert-math-to-llvm``; f64 and any op not listed here keep their
libm call.

Accuracy (f32, against float64; measured over dense sweeps of every binade by
``test/unit/test_cpu_math.py``, which holds the bounds in :data:`ULP_BOUNDS`): exp, log,
log1p, tanh, erf within a few ulp; ``pow(x, y)`` within a few ulp plus the error every
f32 pow through ``exp(y log x)`` carries, 2 ulp per unit of ``|y ln x|`` (the roundings of
``ln x`` and of ``y ln x``, amplified by the exponential: 7e-6 relative at the overflow
threshold, inside the f32 tolerance the tests state, 1e-5).
Special values follow C99/numpy: ``exp(-inf) = 0``, ``exp(inf) = inf``, ``log(0) = -inf``,
``log(x < 0) = nan``, ``tanh(±inf) = ±1``, ``erf(±inf) = ±1``, NaN in -> NaN out; subnormal
inputs are handled (``log`` rescales them) and subnormal results are produced (``exp``
scales by two powers of two). Coefficients: Cephes' single-precision ones (expf, logf,
tanhf, erff/erfcf), evaluated with Horner's rule.
"""

from __future__ import annotations

from typing import Callable

from mlir import ir


#: ops this module approximates (the ``math.`` names).
APPROXIMATED = ("exp", "log", "log1p", "tanh", "erf", "powf")

#: The tested error bounds, in units in the last place of the float64 result rounded to
#: f32 (measured maxima: exp 0.97, log 0.76, log1p 2.35, tanh 1.23, erf 2.22; exp_le0 0.86
#: over x in [-87, 0]).
ULP_BOUNDS = {"exp": 2, "log": 2, "log1p": 3, "tanh": 2, "erf": 3, "powf": 4, "exp_le0": 2}
#: ``pow``'s extra error, in ulp per unit of ``|y ln x|`` (module docstring).
POW_ULP_PER_LOG = 2.0

_HELPER = "__opfuse_math_"

# Cephes single-precision coefficients, highest degree first.
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
          1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
          3.3333331174e-1)
_TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
           -3.33332819422e-1)
_ERF_T = (7.853861353153693e-5, -8.010193625184903e-4, 5.188327685732524e-3,
          -2.685381193529856e-2, 1.128358514861418e-1, -3.761262582423300e-1,
          1.128379165726710e0)
_ERFC_P = (2.326819970068386e-2, -1.387039388740657e-1, 3.687424674597105e-1,
           -5.824733027278666e-1, 6.210004621745983e-1, -4.944515323274145e-1,
           3.404879937665872e-1, -2.741127028184656e-1, 5.638259427386472e-1)
_ERFC_R = (-1.047766399936249e1, 1.297719955372516e1, -7.495518717768503e0,
           2.921019019210786e0, -1.015265279202700e0, 4.218463358204948e-1,
           -2.820767439740514e-1, 5.641895067754075e-1)


class _Body:
    """SSA lines of one helper function over float type ``t`` (``f32`` or a vector of it);
    ``i``/``b`` are the matching i32 and i1 types."""

    def __init__(self, t: str):
        self.t = t
        shape = t[len("vector<"):t.rindex("x")] + "x" if t.startswith("vector<") else ""
        self.i = f"vector<{shape}i32>" if shape else "i32"
        self.b = f"vector<{shape}i1>" if shape else "i1"
        self.lines: list[str] = []
        self._consts: dict[tuple[str, str], str] = {}
        self._n = 0

    def op(self, text: str) -> str:
        name = f"%v{self._n}"
        self._n += 1
        self.lines.append(f"    {name} = {text}")
        return name

    def _const(self, literal: str, ty: str) -> str:
        key = (literal, ty)
        if key not in self._consts:
            value = literal if ty in ("f32", "i32") else f"dense<{literal}>"
            self._consts[key] = self.op(f"arith.constant {value} : {ty}")
        return self._consts[key]

    def f(self, value: float) -> str:
        """An f32 constant (exact: the literal is the float's f32 rounding, in hex)."""
        import struct

        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        return self._const(f"0x{bits:08X}", self.t)

    def int_(self, value: int) -> str:
        return self._const(str(value), self.i)

    # Plain IEEE arithmetic, no `contract`: with FMA contraction the results would depend on
    # the host (a bundle's portable x86-64 library has no FMA, the JIT on an AVX-512 host
    # has), and the same program must give the same bits wherever it runs.
    def add(self, a, b): return self.op(f"arith.addf {a}, {b} : {self.t}")
    def sub(self, a, b): return self.op(f"arith.subf {a}, {b} : {self.t}")
    def mul(self, a, b): return self.op(f"arith.mulf {a}, {b} : {self.t}")
    def div(self, a, b): return self.op(f"arith.divf {a}, {b} : {self.t}")
    def neg(self, a): return self.op(f"arith.negf {a} : {self.t}")
    def fma(self, a, b, c): return self.op(f"math.fma {a}, {b}, {c} : {self.t}")
    def abs(self, a): return self.op(f"math.absf {a} : {self.t}")
    def floor(self, a): return self.op(f"math.floor {a} : {self.t}")
    def copysign(self, a, b): return self.op(f"math.copysign {a}, {b} : {self.t}")

    def cmp(self, pred: str, a, b) -> str:
        return self.op(f"arith.cmpf {pred}, {a}, {b} : {self.t}")

    def select(self, c, a, b, ty: str | None = None) -> str:
        return self.op(f"arith.select {c}, {a}, {b} : {self.b}, {ty or self.t}")

    def clamp(self, x, lo: float, hi: float) -> str:
        # maxnumf/minnumf return the non-NaN operand: the clamped value is always finite,
        # so the integer conversions below never see a NaN (callers select NaN back in).
        lo_ = self.op(f"arith.maxnumf {x}, {self.f(lo)} : {self.t}")
        return self.op(f"arith.minnumf {lo_}, {self.f(hi)} : {self.t}")

    def horner(self, x, coeffs) -> str:
        acc = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.add(self.mul(acc, x), self.f(c))
        return acc

    def bits(self, x) -> str:
        return self.op(f"arith.bitcast {x} : {self.t} to {self.i}")

    def from_bits(self, n) -> str:
        return self.op(f"arith.bitcast {n} : {self.i} to {self.t}")

    def ipow2(self, n) -> str:
        """2**n for an i32 n in [-126, 127], built from the exponent bits."""
        biased = self.op(f"arith.addi {n}, {self.int_(127)} : {self.i}")
        return self.from_bits(self.op(f"arith.shli {biased}, {self.int_(23)} : {self.i}"))

    def to_int(self, x) -> str:
        return self.op(f"arith.fptosi {x} : {self.t} to {self.i}")

    def to_float(self, n) -> str:
        return self.op(f"arith.sitofp {n} : {self.i} to {self.t}")

    def isnan(self, x) -> str:
        return self.cmp("uno", x, x)


def _exp(b: _Body, x: str) -> str:
    """e**x = 2**k * e**r, k = round(x log2 e), |r| <= ln2/2 (Cephes expf)."""
    xc = b.clamp(x, -104.0, 89.0)  # beyond: 0 and inf, reached through the scaling below
    k = b.floor(b.add(b.mul(xc, b.f(1.44269504088896341)), b.f(0.5)))
    r = b.sub(xc, b.mul(k, b.f(0.693359375)))  # ln 2 in two parts: k*C1 is exact
    r = b.sub(r, b.mul(k, b.f(-2.12194440e-4)))
    p = b.add(b.add(b.mul(b.horner(r, _EXP_P), b.mul(r, r)), r), b.f(1.0))
    # 2**k for k in [-150, 129] as two factors 2**(k>>1) * 2**(k - k>>1), each a normal
    # float: results in the subnormal range and the overflow to inf come out right.
    ki = b.to_int(k)
    half = b.op(f"arith.shrsi {ki}, {b.int_(1)} : {b.i}")
    rest = b.op(f"arith.subi {ki}, {half} : {b.i}")
    y = b.mul(b.mul(p, b.ipow2(half)), b.ipow2(rest))
    return b.select(b.isnan(x), x, y)


def _exp_le0(b: _Body, x: str) -> str:
    """e**x for x <= 0 (a softmax's x - max), not an op of its own: called directly by the
    CPU attention kernel's softmax (:mod:`opfuse.backends.cpu.attention_tiles`). expf's
    reduction and polynomial as FMAs, one power of two; results below e**-87 (< 1.7e-38,
    nothing next to the row's largest term, 1) are 0. NaN in -> NaN out. About half the
    instructions of :func:`_exp`."""
    xc = b.op(f"arith.maxnumf {x}, {b.f(-87.0)} : {b.t}")
    k = b.floor(b.fma(xc, b.f(1.44269504088896341), b.f(0.5)))
    r = b.fma(k, b.f(-0.693359375), xc)
    r = b.fma(k, b.f(2.12194440e-4), r)
    h = b.f(_EXP_P[0])
    for c in _EXP_P[1:]:
        h = b.fma(h, r, b.f(c))
    p = b.add(b.fma(h, b.mul(r, r), r), b.f(1.0))
    y = b.mul(p, b.ipow2(b.to_int(k)))
    y = b.select(b.cmp("olt", x, b.f(-87.0)), b.f(0.0), y)
    return b.select(b.isnan(x), x, y)


def _log(b: _Body, x: str) -> str:
    """ln x = e ln 2 + ln m, x = m 2**e with m in [sqrt(1/2), sqrt(2)) (Cephes logf)."""
    # subnormal x: scale by 2**23 first so that the exponent field holds all of it
    tiny = b.cmp("olt", x, b.f(1.17549435e-38))
    xs = b.select(tiny, b.mul(x, b.f(8388608.0)), x)
    bias = b.select(tiny, b.f(-23.0), b.f(0.0))
    n = b.bits(xs)
    e_bits = b.op(f"arith.shrui {n}, {b.int_(23)} : {b.i}")
    e_int = b.op(f"arith.andi {e_bits}, {b.int_(0xFF)} : {b.i}")
    e_int = b.op(f"arith.subi {e_int}, {b.int_(126)} : {b.i}")
    m_bits = b.op(f"arith.andi {n}, {b.int_(0x007FFFFF)} : {b.i}")
    m = b.from_bits(b.op(f"arith.ori {m_bits}, {b.int_(0x3F000000)} : {b.i}"))  # [0.5, 1)
    e = b.add(b.to_float(e_int), bias)
    low = b.cmp("olt", m, b.f(0.707106781186547524))
    e = b.select(low, b.sub(e, b.f(1.0)), e)
    f = b.sub(b.select(low, b.add(m, m), m), b.f(1.0))
    z = b.mul(f, f)
    y = b.mul(b.mul(b.horner(f, _LOG_P), f), z)
    y = b.add(y, b.mul(e, b.f(-2.12194440e-4)))
    y = b.sub(y, b.mul(z, b.f(0.5)))
    r = b.add(b.add(f, y), b.mul(e, b.f(0.693359375)))
    # special values: log(0) = -inf, log(x < 0) = nan, log(inf) = inf, log(nan) = nan
    r = b.select(b.cmp("oeq", x, b.f(float("inf"))), x, r)
    r = b.select(b.cmp("oeq", x, b.f(0.0)), b.f(float("-inf")), r)
    return b.select(b.cmp("ult", x, b.f(0.0)), b.f(float("nan")), r)


def _log1p(b: _Body, x: str) -> str:
    """ln(1 + x) = ln(u) * x / (u - 1), u = 1 + x rounded (Goldberg's trick): exact for
    tiny x, where u - 1 == 0 and the result is x."""
    u = b.add(x, b.f(1.0))
    d = b.sub(u, b.f(1.0))
    r = b.mul(_log(b, u), b.div(x, d))
    r = b.select(b.cmp("oeq", d, b.f(0.0)), x, r)
    return b.select(b.cmp("oeq", u, b.f(float("inf"))), u, r)


def _tanh(b: _Body, x: str) -> str:
    """|x| < 0.625: an odd polynomial; else sign(x) (1 - 2 / (e**(2|x|) + 1)) (Cephes tanhf)."""
    a = b.abs(x)
    z = b.mul(x, x)
    small = b.add(b.mul(b.mul(b.horner(z, _TANH_P), z), x), x)
    e = _exp(b, b.add(a, a))
    large = b.copysign(b.sub(b.f(1.0), b.div(b.f(2.0), b.add(e, b.f(1.0)))), x)
    return b.select(b.cmp("olt", a, b.f(0.625)), small, large)


def _erf(b: _Body, x: str) -> str:
    """|x| < 1: x T(x²); else sign(x) (1 - erfc|x|), erfc a = e**(-a²)/a R(1/a²) with one
    rational fit below 2 and one above (Cephes erff/erfcf); |x| >= 4 rounds to ±1."""
    a = b.abs(x)
    small = b.mul(x, b.horner(b.mul(x, x), _ERF_T))
    ac = b.clamp(a, 1.0, 4.0)
    q = b.div(b.f(1.0), ac)
    q2 = b.mul(q, q)
    tail = b.select(b.cmp("olt", ac, b.f(2.0)), b.horner(q2, _ERFC_P), b.horner(q2, _ERFC_R))
    erfc = b.mul(b.mul(_exp(b, b.neg(b.mul(ac, ac))), q), tail)
    large = b.copysign(b.sub(b.f(1.0), erfc), x)
    large = b.select(b.isnan(x), x, large)
    return b.select(b.cmp("olt", a, b.f(1.0)), small, large)


def _powf(b: _Body, x: str, y: str) -> str:
    """x**y = e**(y ln|x|), with C99's (and numpy's) rules: negative x needs an integral
    y (odd y keeps the sign), x**0 = 1**y = (-1)**(+-inf) = 1 even for NaN, 0**y by the
    sign of y."""
    ax = b.abs(x)
    r = _exp(b, b.mul(y, _log(b, ax)))
    y_int = b.cmp("oeq", b.floor(y), y)
    half = b.mul(y, b.f(0.5))
    # odd: integral, and y/2 not integral (|y| >= 2**24 is always even in f32)
    y_odd = b.op(f"arith.andi {y_int}, {b.cmp('one', b.floor(half), half)} : {b.b}")
    # x < 0: odd y negates, a non-integral y has no real result (but (-inf)**y does:
    # it is 0 or inf, like (-0)**y)
    neg = b.cmp("olt", x, b.f(0.0))
    real = b.op(f"arith.ori {y_int}, {b.cmp('oeq', x, b.f(float('-inf')))} : {b.b}")
    signed = b.select(y_odd, b.neg(r), r)
    r = b.select(neg, b.select(real, signed, b.f(float("nan"))), r)
    # 0**y: +-0 for y > 0 (sign kept for odd y), inf for y < 0 (exp(y * -inf) covers both
    # magnitudes); 0**0 and x**0 and 1**y are 1
    zero = b.cmp("oeq", x, b.f(0.0))
    zero_r = b.select(b.cmp("olt", y, b.f(0.0)), b.f(float("inf")), b.f(0.0))
    zero_r = b.select(y_odd, b.copysign(zero_r, x), zero_r)
    zero_r = b.select(b.isnan(y), y, zero_r)
    r = b.select(zero, zero_r, r)
    # x**0 = 1**y = (-1)**(+-inf) = 1, NaNs included
    one = b.op(f"arith.ori {b.cmp('oeq', y, b.f(0.0))}, {b.cmp('oeq', x, b.f(1.0))} : {b.b}")
    inf_y = b.cmp("oeq", b.abs(y), b.f(float("inf")))
    minus_one = b.op(f"arith.andi {b.cmp('oeq', x, b.f(-1.0))}, {inf_y} : {b.b}")
    one = b.op(f"arith.ori {one}, {minus_one} : {b.b}")
    return b.select(one, b.f(1.0), r)


#: math op name -> (arity, builder of the result from the argument names).
_BUILDERS: dict[str, tuple[int, Callable[..., str]]] = {
    "exp": (1, _exp), "log": (1, _log), "log1p": (1, _log1p), "tanh": (1, _tanh),
    "erf": (1, _erf), "powf": (2, _powf),
    "exp_le0": (1, _exp_le0),  # no math op: the attention softmax calls its helper
}


def helper_name(op: str, type_text: str) -> str:
    """The private helper computing ``math.<op>`` on ``type_text`` values."""
    suffix = type_text.replace("<", "").replace(">", "").replace("x", "_")
    return f"{_HELPER}{op}_{suffix}"


def helper_text(op: str, type_text: str) -> str:
    """The MLIR text of the helper function for ``math.<op>`` on ``type_text`` (``f32`` or
    ``vector<Nxf32>``)."""
    arity, build = _BUILDERS[op]
    b = _Body(type_text)
    args = [f"%a{i}" for i in range(arity)]
    result = build(b, *args)
    params = ", ".join(f"{a}: {type_text}" for a in args)
    body = "\n".join(b.lines)
    # always inlined by LLVM: its loop vectorizer must see the body, not a call
    return (f"func.func private @{helper_name(op, type_text)}({params}) -> {type_text} "
            f"attributes {{passthrough = [\"alwaysinline\"]}} {{\n"
            f"{body}\n    return {result} : {type_text}\n}}\n")


def _is_f32(t: ir.Type) -> bool:
    if isinstance(t, ir.VectorType):
        t = t.element_type
    return isinstance(t, ir.F32Type)


def approximate_math(module: ir.Module) -> int:
    """Replace every f32 ``math.exp/log/log1p/tanh/erf/powf`` of ``module`` by its
    approximation, in place; returns how many ops were replaced."""
    ctx = module.context
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        if name.startswith("math.") and name[5:] in _BUILDERS and _is_f32(op.results[0].type):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if not found:
        return 0
    helpers: dict[str, str] = {}
    with ctx:
        for op in found:
            t = str(op.results[0].type)
            name = helper_name(op.name[5:], t)
            if name not in helpers:
                helpers[name] = helper_text(op.name[5:], t)
        library = ir.Module.parse("".join(helpers.values()))
        ip = ir.InsertionPoint(module.body)
        for fn in list(library.body.operations):
            fn.operation.clone(ip=ip)
        from mlir.dialects import func as func_d

        for op in found:
            t = op.results[0].type
            with ir.InsertionPoint(op), op.location:
                call = func_d.CallOp([t], helper_name(op.name[5:], str(t)), list(op.operands))
            op.results[0].replace_all_uses_with(call.results[0])
            op.erase()
    return len(found)
