"""The rest of the core ATen opset the runtime can express: hyperbolic
functions, rounding, remainders, diagonals, scatters into slices,
normalisations and their backward formulas, padding, pooling and
nearest upsampling. Each composes runtime ops; see ``UNLOWERED`` for the
core ops that stay graph breaks and why."""

from __future__ import annotations

import math

from . import H, cast, const, dim, lowering, promote
from .. import _C
from .._core import FLOATS
from .elementwise import _to_float, binary
from .shape import cat, expand, reshape

# Core ATen ops with no lowering: each runs on the CPU (a graph break)
# with a warning, or is an error when its inputs need gradients.
UNLOWERED = {
    "acos": "no inverse trigonometric op in the runtime",
    "acosh": "no inverse hyperbolic op in the runtime",
    "asin": "no inverse trigonometric op in the runtime",
    "asinh": "no inverse hyperbolic op in the runtime",
    "atan": "no inverse trigonometric op in the runtime",
    "atan2": "no inverse trigonometric op in the runtime",
    "atanh": "no inverse hyperbolic op in the runtime",
    "nonzero": "data-dependent output shape",
    "masked_scatter": "data-dependent element order",
    "sort": "no sort in the runtime",
    "topk": "no sort in the runtime",
    "randperm": "no permutation sampling in the runtime",
    "as_strided": "aliasing strides: the runtime's tensors are values",
    "_fft_r2c": "no FFT in the runtime",
    "_cdist_forward": "not yet lowered",
    "_pdist_forward": "not yet lowered",
    "col2im": "not yet lowered",
    "grid_sampler_2d": "data-dependent gather pattern, not yet lowered",
    "_adaptive_avg_pool3d": "not yet lowered",
    "avg_pool3d": "not yet lowered",
    "max_pool3d_with_indices": "not yet lowered",
    "avg_pool2d_backward": "not yet lowered",
    "_adaptive_avg_pool2d_backward": "not yet lowered",
    "native_group_norm_backward": "not yet lowered",
    "reflection_pad3d": "not yet lowered",
    "replication_pad3d": "not yet lowered",
    "scatter_reduce": "not yet lowered",
    "_local_scalar_dense": "a read of a value: the device's sync point, a graph break when compiled",
    "sym_numel": "size arithmetic, evaluated by PyTorch",
    "sym_size": "size arithmetic, evaluated by PyTorch",
    "sym_storage_offset": "size arithmetic, evaluated by PyTorch",
    "sym_stride": "size arithmetic, evaluated by PyTorch",
    "sym_is_contiguous": "size arithmetic, evaluated by PyTorch",
    "resize_": "resizes storage in place: the runtime's tensors are values",
    "avg_pool1d": "not yet lowered",
    "adaptive_avg_pool1d": "not yet lowered",
}


@lowering("cosh")
def cosh(x):
    x = _to_float(x)
    e, m = x.unary("exp"), x.unary("neg").unary("exp")
    return e.binary("add", m).binary("mul", 0.5)


@lowering("sinh")
def sinh(x):
    x = _to_float(x)
    e, m = x.unary("exp"), x.unary("neg").unary("exp")
    return e.binary("sub", m).binary("mul", 0.5)


@lowering("log10")
def log10(x):
    return _to_float(x).unary("log").binary("div", math.log(10.0))


@lowering("round.default")
def round_(x):
    """Half to even, as PyTorch rounds."""
    if x.dtype not in ("float32", "float64", "bfloat16", "float16"):
        return x
    f = x.binary("add", 0.5).unary("floor")
    tie = f.binary("sub", x).binary("eq", 0.5)
    odd = f.binary("sub", f.binary("div", 2.0).unary("floor").binary("mul", 2.0)).binary("ne", 0.0)
    return tie.where_(odd, const(False, "bool")).where_(f.binary("sub", 1.0), f)


@lowering("fmod")
def fmod(a, b):
    """``a - trunc(a / b) * b`` (the sign of ``a``)."""
    from .elementwise import trunc

    d = promote(a, b)
    w = d if d in ("float32", "float64") else "float64"
    a2 = cast(a, w) if type(a) is H else float(a)
    b2 = cast(b, w) if type(b) is H else float(b)
    q = trunc(binary("div", a2, b2))
    return cast(binary("sub", a2, binary("mul", q, b2)), d)


@lowering("logical_xor")
def logical_xor(a, b):
    from .elementwise import _truth_of

    return _truth_of(a).binary("ne", _truth_of(b))


@lowering("bitwise_xor")
def bitwise_xor(a, b):
    """On bools the logical xor; on integers a graph break (no runtime op)."""
    from .elementwise import _bit_with_bool, _bools

    return logical_xor(a, b) if _bools(a, b) else _bit_with_bool("xor", a, b)


@lowering("copy.default")
def copy(x, src, non_blocking=False):
    return expand(cast(src, x.dtype), x.shape)


@lowering("fill.Scalar", "fill.Tensor")
def fill(x, value):
    if type(value) is H:
        return expand(cast(value, x.dtype), x.shape)
    return _C.full(float(value), x.shape, x.dtype)


@lowering("diagonal", "diagonal_copy")
def diagonal(x, offset=0, dim1=0, dim2=1):
    r = len(x.shape)
    d1, d2 = dim(dim1, r), dim(dim2, r)
    rest = [i for i in range(r) if i not in (d1, d2)]
    y = x.permute(rest + [d1, d2]) if rest + [d1, d2] != list(range(r)) else x
    n1, n2 = x.shape[d1], x.shape[d2]
    i0, j0 = (0, offset) if offset >= 0 else (-offset, 0)
    n = max(0, min(n1 - i0, n2 - j0))
    flat = reshape(y, [x.shape[i] for i in rest] + [n1 * n2])
    idx = _C.arange(float(i0 * n2 + j0), float(i0 * n2 + j0 + n * (n2 + 1)), float(n2 + 1), "int64")
    return flat.index_select(len(rest), idx) if n else reshape(flat, [x.shape[i] for i in rest] + [0])


@lowering("diagonal_scatter")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """``x`` with ``src`` written on its diagonal (``diagonal``'s inverse):
    each position picks its diagonal's value, a ``where`` keeps the rest."""
    r = len(x.shape)
    d1, d2 = dim(dim1, r), dim(dim2, r)
    rest = [i for i in range(r) if i not in (d1, d2)]
    order = rest + [d1, d2]
    y = x.permute(order) if order != list(range(r)) else x
    n1, n2 = x.shape[d1], x.shape[d2]
    i0 = 0 if offset >= 0 else -offset
    n = max(0, min(n1 - i0, n2 - (offset if offset >= 0 else 0)))
    if n == 0:
        return x
    i = _C.arange(0.0, float(n1), 1.0, "int64").reshape([n1, 1])
    j = _C.arange(0.0, float(n2), 1.0, "int64").reshape([1, n2])
    on = j.binary("sub", i).binary("eq", offset)
    k = i.binary("sub", i0).binary("maximum", 0).binary("minimum", n - 1).expand([n1, n2])
    lead = [x.shape[a] for a in rest]
    picked = reshape(cast(src, x.dtype).index_select(len(rest), k.reshape([n1 * n2])),
                     lead + [n1, n2])
    out = on.where_(picked, y)
    back = [order.index(a) for a in range(r)]
    return out.permute(back) if order != list(range(r)) else out


@lowering("slice_scatter")
def slice_scatter(x, src, d=0, start=None, end=None, step=1):
    r = len(x.shape)
    d = dim(d, r)
    s, e, st = slice(start, end, step).indices(x.shape[d])
    if st != 1:
        return None
    parts = []
    if s > 0:
        parts.append(x.narrow(d, 0, s))
    parts.append(cast(src, x.dtype))
    if e < x.shape[d]:
        parts.append(x.narrow(d, e, x.shape[d] - e))
    return cat(parts, d)


@lowering("select_scatter")
def select_scatter(x, src, d, index):
    d = dim(d, len(x.shape))
    i = index + x.shape[d] if index < 0 else index
    return slice_scatter(x, src.unsqueeze(d), d, i, i + 1)


@lowering("scatter_add")
def scatter_add(x, d, index, src):
    """Adds ``src`` where ``index`` points (repeated indices add up): a
    one-hot contraction along ``d``."""
    from .shape import _scatter_mask

    hit, d = _scatter_mask(x, d, index)
    sub = src.narrow(d, 0, index.shape[d]) if src.shape[d] != index.shape[d] else src
    w = x.dtype if x.dtype in ("float32", "float64") else "float64"
    contrib = cast(hit, w).binary("mul", cast(sub, w).unsqueeze(d + 1)).reduce("sum", [d], False)
    return cast(cast(x, w).binary("add", contrib), x.dtype)


@lowering("elu")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = x.binary("mul", input_scale).unary("exp").binary("sub", 1.0).binary("mul", alpha)
    return x.binary("gt", 0).where_(x, neg).binary("mul", scale)


@lowering("_native_batch_norm_legit_no_training")
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    view = [1, x.shape[1]] + [1] * (len(x.shape) - 2)
    mean = reshape(running_mean, view)
    rstd = reshape(running_var, view).binary("add", eps).unary("rsqrt")
    out = x.binary("sub", mean).binary("mul", rstd)
    if weight is not None:
        out = out.binary("mul", reshape(weight, view))
    if bias is not None:
        out = out.binary("add", reshape(bias, view))
    empty = _C.full(0.0, (0,), x.dtype)
    return out, empty, empty


def batch_stats_update(x, mean, rstd, running_mean, running_var, momentum, eps):
    """The running statistics after a training batch (unbiased variance, as
    PyTorch keeps them)."""
    n = numel_of(x.shape) // x.shape[1]
    var = const(1.0, rstd.dtype).binary("div", rstd.binary("mul", rstd)).binary("sub", eps)
    unbiased = var.binary("mul", n / max(n - 1, 1))
    rm = running_mean.binary("mul", 1 - momentum).binary("add", mean.binary("mul", momentum))
    rv = running_var.binary("mul", 1 - momentum).binary("add", unbiased.binary("mul", momentum))
    return rm, rv


@lowering("native_batch_norm", "_native_batch_norm_legit.default", "_native_batch_norm_legit")
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm's value and saved statistics. The running statistics a
    training batch updates are written by the device's dispatch (these
    are in-place updates of its inputs) or returned by the functional form."""
    if not training:
        out, _, _ = batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)
        empty = _C.full(0.0, (0,), x.dtype)
        return out, empty, empty
    return batch_norm_batch_stats(x, weight, bias, training, momentum, eps)


@lowering("_native_batch_norm_legit_functional")
def native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum,
                                 eps):
    out, mean, rstd = native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                        momentum, eps)
    if not training:
        return out, mean, rstd, running_mean, running_var
    rm, rv = batch_stats_update(x, mean, rstd, running_mean, running_var, momentum, eps)
    return out, mean, rstd, rm, rv


@lowering("_native_batch_norm_legit.no_stats")
def batch_norm_batch_stats(x, weight, bias, training, momentum, eps):
    axes = [0] + list(range(2, len(x.shape)))
    mean = x.reduce("mean", axes, True)
    xc = x.binary("sub", mean)
    rstd = xc.binary("mul", xc).reduce("mean", axes, True).binary("add", eps).unary("rsqrt")
    out = xc.binary("mul", rstd)
    view = [1, x.shape[1]] + [1] * (len(x.shape) - 2)
    if weight is not None:
        out = out.binary("mul", reshape(weight, view))
    if bias is not None:
        out = out.binary("add", reshape(bias, view))
    return out, reshape(mean, [x.shape[1]]), reshape(rstd, [x.shape[1]])


@lowering("native_group_norm")
def group_norm(x, weight, bias, N, C, HxW, group, eps):
    g = reshape(x, [N, group, (C // group) * HxW])
    mean = g.reduce("mean", [2], True)
    gc = g.binary("sub", mean)
    rstd = gc.binary("mul", gc).reduce("mean", [2], True).binary("add", eps).unary("rsqrt")
    out = reshape(gc.binary("mul", rstd), list(x.shape))
    view = [1, C] + [1] * (len(x.shape) - 2)
    if weight is not None:
        out = out.binary("mul", reshape(weight, view))
    if bias is not None:
        out = out.binary("add", reshape(bias, view))
    return out, reshape(mean, [N, group]), reshape(rstd, [N, group])


@lowering("native_layer_norm_backward")
def layer_norm_backward(gy, x, normalized_shape, mean, rstd, weight, bias, mask):
    k = len(normalized_shape)
    axes = list(range(len(x.shape) - k, len(x.shape)))
    n = float(numel_of(normalized_shape))
    xhat = x.binary("sub", mean).binary("mul", rstd)
    g = gy.binary("mul", weight) if weight is not None else gy
    a = g.reduce("sum", axes, True)
    b = g.binary("mul", xhat).reduce("sum", axes, True)
    dx = rstd.binary("div", n).binary(
        "mul", g.binary("mul", n).binary("sub", a).binary("sub", xhat.binary("mul", b)))
    lead = list(range(len(x.shape) - k))
    dw = gy.binary("mul", xhat).reduce("sum", lead, False) if weight is not None else None
    db = gy.reduce("sum", lead, False) if bias is not None else None
    return (dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None)


def numel_of(dims):
    n = 1
    for s in dims:
        n *= s
    return n


def _pad_index(n, before, after, mode):
    """Source indices of a reflection or replication pad along one dim."""
    idx = _C.arange(float(-before), float(n + after), 1.0, "int64")
    if mode == "replicate":
        return idx.binary("maximum", 0).binary("minimum", n - 1)
    # reflect: |i| then mirror past the end.
    a = idx.unary("abs")
    over = a.binary("sub", n - 1)
    return over.binary("gt", 0).where_(const(n - 1, "int64").binary("sub", over), a)


def _make_pad(mode):
    def pad(x, padding):
        r = len(x.shape)
        for i in range(len(padding) // 2):
            d = r - 1 - i
            before, after = int(padding[2 * i]), int(padding[2 * i + 1])
            x = x.index_select(d, _pad_index(x.shape[d], before, after, mode))
        return x

    return pad


for _n in ("reflection_pad1d", "reflection_pad2d"):
    lowering(_n)(_make_pad("reflect"))
for _n in ("replication_pad1d", "replication_pad2d"):
    lowering(_n)(_make_pad("replicate"))


@lowering("avg_pool2d")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if ceil_mode or divisor_override is not None:
        return None
    k = tuple(kernel_size) if not isinstance(kernel_size, int) else (kernel_size, kernel_size)
    k = (k[0], k[-1])
    s = tuple(stride) if stride else k
    s = (s[0], s[-1]) if not isinstance(s, int) else (s, s)
    p = (padding, padding) if isinstance(padding, int) else (padding[0], padding[-1])
    if p != (0, 0) and not count_include_pad:
        return None
    return x.pool2d("avg", k, tuple(s), p)


@lowering("_adaptive_avg_pool2d")
def adaptive_avg_pool2d(x, output_size):
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    if h % oh or w % ow:
        return None
    lead = list(x.shape[:-2])
    y = reshape(x, lead + [oh, h // oh, ow, w // ow])
    return y.reduce("mean", [len(lead) + 1, len(lead) + 3], False)


@lowering("upsample_nearest2d", "upsample_nearest2d.vec")
def upsample_nearest2d(x, output_size, scales=None, *rest):
    if output_size is None:
        if scales is None:
            return None
        output_size = [int(x.shape[-2] * scales[0]), int(x.shape[-1] * scales[1])]
    for d, out in ((-2, output_size[0]), (-1, output_size[1])):
        n = x.shape[d]
        idx = _C.arange(0.0, float(out), 1.0, "float64").binary("mul", n / out).unary("floor")
        x = x.index_select(len(x.shape) + d, cast(idx, "int64").binary("minimum", n - 1))
    return x



@lowering("upsample_bilinear2d", "upsample_bilinear2d.vec")
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    """Bilinear resizing (the runtime's: two gathers and a blend per axis).
    PyTorch computes source positions from a scale factor when given one;
    that equals the sizes' ratio only when the factor makes a whole size,
    so other factors are a graph break."""
    if len(x.shape) != 4 or x.dtype not in FLOATS:
        return None
    if isinstance(scales_h, (list, tuple)):  # the .vec overload: scale_factors
        scales_h, scales_w = scales_h
    if output_size is None:
        if scales_h is None or scales_w is None:
            return None
        output_size = [x.shape[2] * scales_h, x.shape[3] * scales_w]
    elif scales_h is not None or scales_w is not None:
        output_size = [x.shape[2] * (scales_h or output_size[0] / x.shape[2]),
                       x.shape[3] * (scales_w or output_size[1] / x.shape[3])]
    if any(abs(s - round(s)) > 1e-9 for s in output_size):
        return None
    return _C.upsample_bilinear(x, (int(output_size[0]), int(output_size[1])), bool(align_corners))


def _pool_args(kernel_size, stride, padding, dilation, ceil_mode):
    """``(kernel, stride, padding)`` pairs, or None where the runtime's
    pooling does not apply (dilation, ceil mode)."""
    pair = lambda v: (v, v) if isinstance(v, int) else (v[0], v[-1])  # noqa: E731
    if ceil_mode or pair(dilation) != (1, 1):
        return None
    k = pair(kernel_size)
    s = pair(stride) if stride not in (None, [], ()) else k
    return k, s, pair(padding)


@lowering("max_pool2d_with_indices")
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    args = _pool_args(kernel_size, stride, padding, dilation, ceil_mode)
    if args is None or len(x.shape) != 4:
        return None
    return _C.max_pool2d_with_indices(x, *args)


@lowering("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(gy, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    """The gradient at each window's first maximum (the indices PyTorch
    passes are the ones the forward lowering computed, so they are not
    read: the runtime differentiates the same pooling)."""
    args = _pool_args(kernel_size, stride, padding, dilation, ceil_mode)
    if args is None or len(x.shape) != 4:
        return None
    return _C.max_pool2d_backward(gy, x, *args)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """``F.max_pool2d`` values (the device sees the function, so no window
    indices are needed; ``return_indices=True`` is a graph break)."""
    pair = lambda v: (v, v) if isinstance(v, int) else (v[0], v[-1])  # noqa: E731
    if return_indices or ceil_mode or pair(dilation) != (1, 1):
        return None
    k = pair(kernel_size)
    s = pair(stride) if stride not in (None, [], ()) else k
    return x.pool2d("max", k, s, pair(padding))
