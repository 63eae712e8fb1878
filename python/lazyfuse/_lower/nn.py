"""Contractions and the neural-network ops: linear layers, normalisation,
attention, losses, dropout and convolution."""

from __future__ import annotations

import math

from . import H, cast, const, dims_list, lowering, promote
from .. import _C
from .._core import FLOATS
from .elementwise import binary


def _same(a, b):
    d = promote(a, b)
    return cast(a, d), cast(b, d)


@lowering("matmul", "mm", "bmm")
def matmul(a, b):
    a, b = _same(a, b)
    ra, rb = len(a.shape), len(b.shape)
    if ra == 1 and rb == 1:
        return a.binary("mul", b).reduce("sum", None, False)
    if ra == 1:
        return a.unsqueeze(0).matmul(b).squeeze(-2)
    if rb == 1:
        return a.matmul(b.unsqueeze(1)).squeeze(-1)
    return a.matmul(b)


@lowering("addmm")
def addmm(bias, a, b, beta=1, alpha=1):
    p = matmul(a, b)
    if alpha != 1:
        p = p.binary("mul", alpha)
    if beta == 0:
        return p
    return binary("add", binary("mul", bias, beta) if beta != 1 else bias, p)


@lowering("baddbmm")
def baddbmm(bias, a, b, beta=1, alpha=1):
    return addmm(bias, a, b, beta, alpha)


@lowering("linear")
def linear(x, w, b=None):
    y = matmul(x, w.transpose(0, 1) if len(w.shape) == 2 else w)
    return y if b is None else binary("add", y, b)


@lowering("dot", "vdot")
def dot(a, b):
    return matmul(a, b)


@lowering("native_layer_norm")
def native_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    k = len(normalized_shape)
    r = len(x.shape)
    axes = list(range(r - k, r))
    mean = x.reduce("mean", axes, True)
    xc = x.binary("sub", mean)
    var = xc.binary("mul", xc).reduce("mean", axes, True)
    rstd = var.binary("add", eps).unary("rsqrt")
    if k == 1:
        out = x.layer_norm(weight, bias, eps)
    else:
        out = xc.binary("mul", rstd)
        if weight is not None:
            out = out.binary("mul", weight)
        if bias is not None:
            out = out.binary("add", bias)
    return out, mean, rstd


@lowering("layer_norm")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return native_layer_norm(x, normalized_shape, weight, bias, eps)[0]


@lowering("rms_norm")
def rms_norm(x, normalized_shape, weight=None, eps=None):
    k = len(normalized_shape)
    axes = list(range(len(x.shape) - k, len(x.shape)))
    if eps is None:
        eps = {"float64": 2.220446049250313e-16, "float16": 0.0009765625,
               "bfloat16": 0.0078125}.get(x.dtype, 1.1920928955078125e-07)
    ms = x.binary("mul", x).reduce("mean", axes, True)
    out = x.binary("mul", ms.binary("add", eps).unary("rsqrt"))
    return out if weight is None else out.binary("mul", weight)


@lowering("native_dropout")
def native_dropout(x, p, train=True):
    if not train or p == 0:
        return x, const(True, "bool").expand(list(x.shape)) if x.shape else const(True, "bool")
    keep = _C.rand(x.shape, x.dtype if x.dtype in FLOATS else "float32").binary("ge", p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    zero = const(0, x.dtype)
    return keep.where_(x.binary("mul", scale), zero), keep


@lowering("dropout")
def dropout(x, p=0.5, train=True):
    return native_dropout(x, p, train)[0]


@lowering("native_dropout_backward")
def native_dropout_backward(grad, mask, scale):
    return grad.binary("mul", cast(mask, grad.dtype)).binary("mul", scale)


@lowering("nll_loss_forward", "nll_loss2d_forward")
def nll_loss_forward(logp, target, weight=None, reduction=1, ignore_index=-100):
    if weight is not None:
        return None
    c_axis = 1 if len(logp.shape) > 1 else 0
    t = cast(target, "int64")
    valid = t.binary("ne", ignore_index)
    safe = valid.where_(t, const(0, "int64"))
    picked = logp.gather(c_axis, safe.unsqueeze(c_axis)).squeeze(c_axis)
    zero = const(0, logp.dtype)
    loss = valid.where_(picked.unary("neg"), zero)
    w = cast(valid, logp.dtype)
    total = w.reduce("sum", None, False)
    if reduction == 0:
        return loss, total
    s = loss.reduce("sum", None, False)
    return (s.binary("div", total) if reduction == 1 else s), total


@lowering("nll_loss", "nll_loss_nd")
def nll_loss(logp, target, weight=None, reduction=1, ignore_index=-100):
    r = nll_loss_forward(logp, target, weight, reduction, ignore_index)
    return None if r is None else r[0]


@lowering("cross_entropy_loss")
def cross_entropy(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if label_smoothing or target.dtype in FLOATS:
        return None
    return nll_loss(x.softmax(1 if len(x.shape) > 1 else 0, True), target, weight, reduction,
                    ignore_index)


@lowering("mse_loss")
def mse_loss(a, b, reduction=1):
    d = binary("sub", a, b)
    sq = d.binary("mul", d)
    return sq if reduction == 0 else sq.reduce("mean" if reduction == 1 else "sum", None, False)


@lowering("binary_cross_entropy")
def binary_cross_entropy(p, y, weight=None, reduction=1):
    """PyTorch's formula: ``-(y log p + (1 - y) log(1 - p))`` with each log
    clamped at -100, so p of exactly 0 or 1 gives a finite loss."""
    if p.dtype not in FLOATS:
        return None
    log_p = p.unary("log").binary("maximum", -100.0)
    log_q = const(1.0, p.dtype).binary("sub", p).unary("log").binary("maximum", -100.0)
    one_minus_y = const(1.0, y.dtype).binary("sub", y)
    loss = binary("add", binary("mul", y, log_p), binary("mul", one_minus_y, log_q)).unary("neg")
    if weight is not None:
        loss = binary("mul", loss, weight)
    return loss if reduction == 0 else loss.reduce("mean" if reduction == 1 else "sum", None, False)


@lowering("scaled_dot_product_attention")
def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Attention as PyTorch's math reference computes it: one fused region
    with its neighbours, not a separate kernel."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = _repeat_heads(k, rep)
        v = _repeat_heads(v, rep)
    s = q.matmul(k.transpose(-2, -1)).binary("mul", scale)
    if is_causal:
        rows = _C.arange(0.0, float(L), 1.0, "int64").unsqueeze(1)
        cols = _C.arange(0.0, float(S), 1.0, "int64").unsqueeze(0)
        keep = cols.binary("le", rows)
        s = keep.where_(s, const(-math.inf, s.dtype))
    if attn_mask is not None:
        if attn_mask.dtype == "bool":
            s = attn_mask.where_(s, const(-math.inf, s.dtype))
        else:
            s = binary("add", s, attn_mask)
    p = s.softmax(-1, False)
    if dropout_p > 0:
        p = dropout(p, dropout_p, True)
    return p.matmul(v)


@lowering("_scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None,
                      scale=None):
    """The gradients of the attention above with respect to q, k and v,
    from the runtime's own rules (``out`` and ``logsumexp`` are not read:
    the forward is recomputed and fuses with the backward)."""
    if dropout_p:
        return None

    def f(t):
        return sdpa(t[0], t[1], t[2], attn_mask, 0.0, is_causal, scale)
    return tuple(_C.vjp(f, [q, k, v], grad_out))


def _repeat_heads(x, rep):
    *b, h, s, d = x.shape
    y = x.unsqueeze(-3).expand(list(b) + [h, rep, s, d])
    return y.reshape(list(b) + [h * rep, s, d])


def _ints(v, n):
    """A per-spatial-dim argument (an int or a list) as a list of ``n``."""
    v = [int(v)] if isinstance(v, int) else [int(a) for a in v]
    return v * n if len(v) == 1 else v


def _same_padding(x, w, stride, dilation):
    """``padding="same"``/``"valid"`` as per-side pads: PyTorch puts the odd
    element of "same" padding after the input."""
    pads = []
    for i, k in enumerate(w.shape[2:]):
        total = dilation[i] * (k - 1)
        pads.append((total // 2, total - total // 2))
    return pads


@lowering("convolution", "conv1d", "conv2d", "conv3d", "conv1d.padding", "conv2d.padding",
          "conv3d.padding")
def convolution(x, w, b=None, stride=1, padding=0, dilation=1, transposed=False,
                output_padding=0, groups=1):
    """``aten.convolution`` (forward and transposed) and the ``convNd``
    overloads: one runtime convolution op, lowered to XLA's convolution."""
    if isinstance(transposed, int) and not isinstance(transposed, bool):
        groups, transposed = transposed, False  # convNd(x, w, b, stride, padding, dilation, groups)
    n = len(w.shape) - 2
    unbatched = len(x.shape) == n + 1
    if unbatched:
        x = x.unsqueeze(0)
    x, w = _same(x, w)
    stride, dilation = _ints(stride, n), _ints(dilation, n)
    if isinstance(padding, str):
        if padding == "valid":
            padding = [0] * n
        else:
            pads = _same_padding(x, w, stride, dilation)
            y = _C.convolution_general(
                x, w, (stride, pads, [1] * n, dilation, int(groups), 1))
            if b is not None:
                y = binary("add", y, cast(b, y.dtype).reshape([w.shape[0]] + [1] * n))
            return y.squeeze(0) if unbatched else y
    b = cast(b, x.dtype) if b is not None else None
    args = (stride, _ints(padding, n), dilation, bool(transposed), _ints(output_padding, n),
            int(groups))
    y = _C.convolution(x, w, b, args)
    return y.squeeze(0) if unbatched else y


@lowering("convolution_backward")
def convolution_backward(gy, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """The gradients of ``aten.convolution`` that ``output_mask`` asks for,
    computed by the runtime's own gradient rule (a vector-Jacobian product)."""
    n = len(w.shape) - 2
    args = (_ints(stride, n), _ints(padding, n), _ints(dilation, n), bool(transposed),
            _ints(output_padding, n), int(groups))
    return _C.convolution_backward(gy, x, w, args, tuple(bool(m) for m in output_mask))


@lowering("threshold_backward")
def threshold_backward(grad, x, threshold):
    return x.binary("gt", threshold).where_(grad, const(0, grad.dtype))


@lowering("tanh_backward")
def tanh_backward(grad, y):
    return grad.binary("mul", binary("sub", 1.0, y.binary("mul", y)))


@lowering("sigmoid_backward")
def sigmoid_backward(grad, y):
    return grad.binary("mul", y.binary("mul", binary("sub", 1.0, y)))


@lowering("embedding_dense_backward")
def embedding_dense_backward(grad, idx, num_weights, padding_idx, scale_grad_by_freq):
    """The weight gradient of an embedding as a one-hot contraction."""
    n = 1
    for s in idx.shape:
        n *= s
    flat = cast(idx, "int64").reshape([n])
    classes = _C.arange(0.0, float(num_weights), 1.0, "int64")
    onehot = cast(classes.unsqueeze(1).binary("eq", flat.unsqueeze(0)), grad.dtype)
    if padding_idx is not None and padding_idx >= 0:
        onehot = onehot.binary("mul", cast(classes.binary("ne", padding_idx).unsqueeze(1), grad.dtype))
    g = grad.reshape([n, grad.shape[-1]])
    return onehot.matmul(g)


_ = (H, dims_list)
