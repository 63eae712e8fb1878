"""Elementwise ATen ops: arithmetic with PyTorch's type promotion,
comparisons, activations and the fused-multiply helpers optimizers use."""

from __future__ import annotations

import math

from . import INTS, H, cast, category, const, default_float, lowering, promote, scalar_kind
from .._core import FLOATS


_BOOL_OPS = {"mul": "and", "minimum": "and", "add": "or", "maximum": "or"}


def binary(op: str, a, b):
    """``a <op> b`` for handles and scalars, promoted as PyTorch does."""
    if type(a) is H:
        da = a.dtype
        if type(b) is not H:
            if scalar_kind(b) > category(da):
                return a.to_dtype(promote(a, b)).binary(op, b)
            if da == "bool" and op in _BOOL_OPS:
                return _bool_op(op, a, b)
            return a.binary(op, b)
        if b.dtype == da and da != "bool":
            return a.binary(op, b)
    d = promote(a, b)
    if d == "bool" and op in _BOOL_OPS:
        return _bool_op(op, a, b)
    a = cast(a, d) if type(a) is H else const(a, d)
    return a.binary(op, cast(b, d))


def _bool_op(op, a, b):
    """Logical and/or for PyTorch's bool ``*``, ``+``, min and max."""
    a, b = (x if type(x) is H else const(x, "bool") for x in (a, b))
    if _BOOL_OPS[op] == "and":
        return a.where_(b, const(False, "bool"))
    return a.where_(const(True, "bool"), b)


def _scaled(b, alpha):
    if alpha is None or alpha == 1:
        return b
    return binary("mul", b, alpha)


@lowering("add")
def add(a, b, alpha=None):
    return binary("add", a, _scaled(b, alpha))


@lowering("sub")
def sub(a, b, alpha=None):
    return binary("sub", a, _scaled(b, alpha))


@lowering("rsub")
def rsub(a, b, alpha=None):
    return binary("sub", b, _scaled(a, alpha))


@lowering("mul")
def mul(a, b):
    return binary("mul", a, b)


def _to_float(x):
    if type(x) is H and x.dtype not in FLOATS:
        return cast(x, default_float())
    return x


@lowering("div")
def div(a, b, rounding_mode=None):
    if rounding_mode is None:
        if type(a) is H and type(b) is H:
            if a.dtype not in FLOATS and b.dtype not in FLOATS:
                a = _to_float(a)
        elif type(a) is H and a.dtype not in FLOATS:
            a = _to_float(a)
        elif type(b) is H and b.dtype not in FLOATS:
            b = _to_float(b)
        return binary("div", a, b)
    d = promote(a, b)
    if d in FLOATS:
        q = binary("div", a, b)
        return q.unary("floor") if rounding_mode == "floor" else trunc(q)
    # Integers: exact through f64 below 2^53.
    q = binary("div", _as(a, "float64"), _as(b, "float64"))
    q = q.unary("floor") if rounding_mode == "floor" else trunc(q)
    return cast(q, d)


def _as(x, d):
    return cast(x, d) if type(x) is H else float(x)


@lowering("floor_divide")
def floor_divide(a, b):
    return div(a, b, rounding_mode="floor")


@lowering("remainder")
def remainder(a, b):
    d = promote(a, b)
    w = d if d in FLOATS else "float64"
    a2, b2 = _as(a, w), _as(b, w)
    r = binary("sub", a2, binary("mul", binary("div", a2, b2).unary("floor"), b2))
    return cast(r if type(r) is H else const(r, w), d)


@lowering("pow")
def pow_(a, b):
    if type(a) is H and type(b) is not H:
        x = cast(a, promote(a, b))
        special = {
            1: lambda: x,
            2: lambda: x.binary("mul", x),
            3: lambda: x.binary("mul", x).binary("mul", x),
            0.5: lambda: x.unary("sqrt"),
            -0.5: lambda: x.unary("rsqrt"),
            -1: lambda: const(1, x.dtype).binary("div", x),
            -2: lambda: const(1, x.dtype).binary("div", x.binary("mul", x)),
        }
        if b in special and x.dtype in FLOATS:
            return special[b]()
    return binary("pow", a, b)


for _name, _op in [
    ("maximum", "maximum"),
    ("minimum", "minimum"),
    ("eq", "eq"),
    ("ne", "ne"),
    ("lt", "lt"),
    ("le", "le"),
    ("gt", "gt"),
    ("ge", "ge"),
]:
    lowering(_name)(lambda a, b, _op=_op: binary(_op, a, b))

# Unary ops the runtime has; integer inputs of float-only functions are
# promoted to the default float dtype, as PyTorch does.
_FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "erf"}
for _name in ["neg", "abs", "relu", "floor", *_FLOAT_ONLY]:
    if _name in _FLOAT_ONLY:
        lowering(_name)(lambda x, _n=_name: _to_float(x).unary(_n))
    else:
        lowering(_name)(lambda x, _n=_name: x.unary(_n))


@lowering("gelu")
def gelu(x, approximate="none"):
    return x.unary("gelu" if approximate == "tanh" else "gelu_exact")


@lowering("silu")
def silu(x):
    return x.binary("mul", x.unary("sigmoid"))


@lowering("reciprocal")
def reciprocal(x):
    x = _to_float(x)
    return const(1, x.dtype).binary("div", x)


@lowering("square")
def square(x):
    return x.binary("mul", x)


@lowering("log1p")
def log1p(x):
    return _to_float(x).binary("add", 1.0).unary("log")


@lowering("expm1")
def expm1(x):
    return _to_float(x).unary("exp").binary("sub", 1.0)


@lowering("log2")
def log2(x):
    return _to_float(x).unary("log").binary("div", math.log(2.0))


@lowering("exp2")
def exp2(x):
    return _to_float(x).binary("mul", math.log(2.0)).unary("exp")


@lowering("tan")
def tan(x):
    x = _to_float(x)
    return x.unary("sin").binary("div", x.unary("cos"))


@lowering("ceil")
def ceil(x):
    return x.unary("neg").unary("floor").unary("neg")


@lowering("trunc")
def trunc(x):
    return x.binary("lt", 0.0).where_(ceil(x), x.unary("floor"))


@lowering("sign")
def sign(x):
    d = x.dtype
    return cast(x.binary("gt", 0), d).binary("sub", cast(x.binary("lt", 0), d))


@lowering("clamp", "clip")
def clamp(x, min=None, max=None):
    d = promote(x, *(v for v in (min, max) if v is not None))
    x = cast(x, d)
    if min is not None:
        x = binary("maximum", x, min)
    if max is not None:
        x = binary("minimum", x, max)
    return x


@lowering("clamp_min")
def clamp_min(x, v):
    return clamp(x, min=v)


@lowering("clamp_max")
def clamp_max(x, v):
    return clamp(x, max=v)


@lowering("hardtanh")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return clamp(x, min_val, max_val)


@lowering("leaky_relu")
def leaky_relu(x, negative_slope=0.01):
    return x.binary("gt", 0).where_(x, x.binary("mul", negative_slope))


@lowering("softplus")
def softplus(x, beta=1.0, threshold=20.0):
    bx = x.binary("mul", beta)
    soft = bx.unary("exp").binary("add", 1.0).unary("log").binary("div", beta)
    return bx.binary("gt", threshold).where_(x, soft)


@lowering("where")
def where(cond, a, b):
    d = promote(a, b)
    a = cast(a, d) if type(a) is H else const(a, d)
    b = cast(b, d) if type(b) is H else const(b, d)
    return cast(cond, "bool").where_(a, b)


@lowering("masked_fill")
def masked_fill(x, mask, value):
    v = cast(value, x.dtype) if type(value) is H else const(value, x.dtype)
    return mask.where_(v, x)


@lowering("logical_not")
def logical_not(x):
    return x.binary("eq", False if x.dtype == "bool" else 0)


@lowering("bitwise_not")
def bitwise_not(x):
    if x.dtype != "bool":
        return None
    return logical_not(x)


def _truth(x):
    return x if x.dtype == "bool" else x.binary("ne", 0)


def _truth_of(v):
    """A handle's truth, or a Python scalar's as a bool constant."""
    return _truth(v) if type(v) is H else const(bool(v), "bool")


def _bools(a, b) -> bool:
    """Both operands bool (bitwise ops on bools are the logical ones; on
    integers the runtime has no bitwise ops, so those are a graph break)."""
    return all(v.dtype == "bool" if type(v) is H else type(v) is bool for v in (a, b))


@lowering("logical_and")
def logical_and(a, b):
    a, b = _truth_of(a), _truth_of(b)
    return a.where_(b, const(False, "bool"))


@lowering("logical_or")
def logical_or(a, b):
    a, b = _truth_of(a), _truth_of(b)
    return a.where_(const(True, "bool"), b)


def _bit_with_bool(op, a, b):
    """``op`` (``and``/``or``/``xor``) of an integer tensor and a bool
    tensor (``unfinished & ~done`` in Hugging Face's ``generate``),
    exactly, in integer arithmetic: the bool meets bit 0 only. None for
    other operands."""
    if type(a) is H and a.dtype == "bool" and type(b) is H and b.dtype in INTS:
        a, b = b, a
    if not (type(a) is H and a.dtype in INTS and type(b) is H and b.dtype == "bool"):
        return None
    d = a.dtype
    two = const(2, d)
    lo = a.binary("sub", a.binary("div", two).binary("mul", two))  # bit 0, sign of a
    lo = lo.binary("lt", const(0, d)).where_(lo.binary("add", two), lo)
    t = cast(b, d)
    one = const(1, d)
    if op == "and":
        return lo.binary("mul", t)
    if op == "or":
        return a.binary("add", t.binary("mul", one.binary("sub", lo)))
    return a.binary("add", t.binary("mul", one.binary("sub", lo.binary("mul", two))))


@lowering("bitwise_and")
def bitwise_and(a, b):
    return logical_and(a, b) if _bools(a, b) else _bit_with_bool("and", a, b)


@lowering("bitwise_or")
def bitwise_or(a, b):
    return logical_or(a, b) if _bools(a, b) else _bit_with_bool("or", a, b)


@lowering("isnan")
def isnan(x):
    return x.binary("ne", x)


@lowering("isinf")
def isinf(x):
    return x.unary("abs").binary("eq", math.inf)


@lowering("isfinite")
def isfinite(x):
    return x.unary("abs").binary("lt", math.inf)


@lowering("lerp")
def lerp(a, b, w):
    diff = binary("sub", b, a)
    if type(w) is not H:
        if abs(w) < 0.5:
            return binary("add", a, binary("mul", diff, w))
        return binary("sub", b, binary("mul", diff, 1.0 - w))
    small = w.unary("abs").binary("lt", 0.5)
    lo = binary("add", a, binary("mul", w, diff))
    hi = binary("sub", b, binary("mul", diff, binary("sub", 1.0, w)))
    return small.where_(lo, hi)


@lowering("addcmul")
def addcmul(s, t1, t2, value=1):
    return binary("add", s, binary("mul", binary("mul", t1, value), t2))


@lowering("addcdiv")
def addcdiv(s, t1, t2, value=1):
    return binary("add", s, binary("div", binary("mul", t1, value), t2))
