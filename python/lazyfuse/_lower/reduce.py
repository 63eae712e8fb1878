"""Reductions, softmax and their relatives."""

from __future__ import annotations

from . import H, cast, const, default_float, dim, dims_list, lowering
from .._core import FLOATS


def _sum_dtype(x, dtype):
    if dtype is not None:
        from .._core import TORCH_TO_NAME

        return TORCH_TO_NAME[dtype]
    return x.dtype if x.dtype in FLOATS else "int64"


@lowering("sum")
def sum_(x, dim=None, keepdim=False, dtype=None):
    x = cast(x, _sum_dtype(x, dtype))
    return x.reduce("sum", dims_list(dim, len(x.shape)), keepdim)


@lowering("mean")
def mean(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = cast(x, _sum_dtype(x, dtype))
    return x.reduce("mean", dims_list(dim, len(x.shape)), keepdim)


def _minmax(x, op, dims, keepdim):
    """max/min; bools through int32, as the runtime reduces numbers."""
    if x.dtype == "bool":
        return cast(x, "int32").reduce(op, dims, keepdim).binary("ne", 0)
    return x.reduce(op, dims, keepdim)


@lowering("amax")
def amax(x, dim=(), keepdim=False):
    return _minmax(x, "max", dims_list(dim, len(x.shape)), keepdim)


@lowering("amin")
def amin(x, dim=(), keepdim=False):
    return _minmax(x, "min", dims_list(dim, len(x.shape)), keepdim)


@lowering("max.dim")
def max_dim(x, d, keepdim=False):
    return _minmax(x, "max", [dim(d, len(x.shape))], keepdim), argmax(x, d, keepdim)


@lowering("min.dim")
def min_dim(x, d, keepdim=False):
    return _minmax(x, "min", [dim(d, len(x.shape))], keepdim), argmin(x, d, keepdim)


@lowering("max.default")
def max_all(x):
    return _minmax(x, "max", None, False)


@lowering("min.default")
def min_all(x):
    return _minmax(x, "min", None, False)


@lowering("max.other", "maximum")
def max_other(a, b):
    from .elementwise import binary

    return binary("maximum", a, b)


@lowering("min.other", "minimum")
def min_other(a, b):
    from .elementwise import binary

    return binary("minimum", a, b)


@lowering("argmax")
def argmax(x, dim=None, keepdim=False):
    if x.dtype == "bool":
        x = cast(x, "int32")
    if dim is None:
        r = x.reshape([_numel(x)]).argmax(0, False)
        return r.reshape([1] * len(x.shape)) if keepdim else r
    return x.argmax(dim, keepdim)


@lowering("argmin")
def argmin(x, dim=None, keepdim=False):
    neg = x.unary("neg") if x.dtype != "bool" else x.binary("eq", False)
    return argmax(neg, dim, keepdim)


def _numel(x):
    n = 1
    for s in x.shape:
        n *= s
    return n


def _count(x, dims):
    n = 1
    for a in dims if dims is not None else range(len(x.shape)):
        n *= x.shape[a]
    return n


@lowering("var")
def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    if x.dtype not in FLOATS:
        x = cast(x, default_float())
    dims = dims_list(dim, len(x.shape))
    xc = x.binary("sub", x.reduce("mean", dims, True))
    ss = xc.binary("mul", xc).reduce("sum", dims, keepdim)
    return ss.binary("div", float(max(_count(x, dims) - correction, 0)))


@lowering("std")
def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    return var(x, dim, unbiased, keepdim, correction).unary("sqrt")


@lowering("var_mean")
def var_mean(x, dim=None, unbiased=None, keepdim=False, correction=None):
    return var(x, dim, unbiased, keepdim, correction), mean(x, dim, keepdim)


@lowering("any")
def any_(x, dim=None, keepdim=False):
    b = x if x.dtype == "bool" else x.binary("ne", 0)
    r = cast(b, "int32").reduce("max", dims_list(dim, len(x.shape)), keepdim)
    return r.binary("gt", 0)


@lowering("all")
def all_(x, dim=None, keepdim=False):
    b = x if x.dtype == "bool" else x.binary("ne", 0)
    r = cast(b, "int32").reduce("min", dims_list(dim, len(x.shape)), keepdim)
    return r.binary("gt", 0)


@lowering("prod")
def prod(x, dim=None, keepdim=False, dtype=None):
    return None  # no product reduction in the runtime: a graph break


@lowering("_softmax", "softmax")
def softmax(x, dim, half_to_float=None, dtype=None):
    if dtype is not None and not isinstance(dtype, bool):
        x = cast(x, _sum_dtype(x, dtype))
    return x.softmax(dim, False)


@lowering("_safe_softmax")
def safe_softmax(x, dim, dtype=None):
    """Softmax that gives 0, not NaN, on a slice that is all ``-inf`` (a
    fully masked attention row: ``nn.MultiheadAttention``'s)."""
    s = softmax(x, dim, dtype=dtype)
    alive = cast(x.binary("ne", float("-inf")), "int32").reduce("max", [dim % len(x.shape)], True)
    return alive.binary("eq", 0).where_(const(0.0, s.dtype), s)


@lowering("_log_softmax", "log_softmax")
def log_softmax(x, dim, half_to_float=None, dtype=None):
    if dtype is not None and not isinstance(dtype, bool):
        x = cast(x, _sum_dtype(x, dtype))
    return x.softmax(dim, True)


@lowering("_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype=None):
    gy = grad.binary("mul", out)
    return gy.binary("sub", out.binary("mul", gy.reduce("sum", [dim % len(out.shape)], True)))


@lowering("_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype=None):
    s = grad.reduce("sum", [dim % len(out.shape)], True)
    return grad.binary("sub", out.unary("exp").binary("mul", s))


@lowering("logsumexp")
def logsumexp(x, dim, keepdim=False):
    dims = dims_list(dim, len(x.shape))
    if dims is None or len(dims) != 1:
        m = x.reduce("max", dims, True)
        r = x.binary("sub", m).unary("exp").reduce("sum", dims, True).unary("log").binary("add", m)
        return r if keepdim else r.reshape([s for i, s in enumerate(r.shape) if i not in (dims or range(len(r.shape)))])
    return x.logsumexp(dims[0], keepdim)


@lowering("cumsum")
def cumsum(x, dim, dtype=None):
    """Inclusive prefix sum as a masked matmul (exact for integers, one
    contraction for floats): ``x @ triu(ones)`` along ``dim``."""
    d = _sum_dtype(x, dtype)
    r = len(x.shape)
    a = dim % max(r, 1)
    n = x.shape[a] if r else 1
    if r == 0:
        return cast(x, d)
    idx = _C_arange(n)
    tri = idx.unsqueeze(1).binary("le", idx.unsqueeze(0))  # [n, n], i <= j
    w = "float64" if d not in FLOATS else d
    if r == 1:
        # A row vector: the runtime's matmul takes rank 2 and up.
        return cast(cast(x, w).unsqueeze(0).matmul(cast(tri, w)).squeeze(0), d)
    xt = cast(x, w).transpose(a, -1)
    out = xt.matmul(cast(tri, w)).transpose(a, -1)
    return cast(out, d)


def _C_arange(n):
    from .. import _C

    return _C.arange(0.0, float(n), 1.0, "int64")




@lowering("linalg_vector_norm", "norm")
def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    import math as _m

    if dtype is not None:
        x = cast(x, _sum_dtype(x, dtype))
    dims = dims_list(dim, len(x.shape))
    a = x.unary("abs")
    if ord == _m.inf:
        return a.reduce("max", dims, keepdim)
    if ord == 1:
        return a.reduce("sum", dims, keepdim)
    if ord == 2:
        return x.binary("mul", x).reduce("sum", dims, keepdim).unary("sqrt")
    return a.binary("pow", float(ord)).reduce("sum", dims, keepdim).binary("pow", 1.0 / ord)
