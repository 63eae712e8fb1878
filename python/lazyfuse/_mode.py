"""The device's ``TorchFunctionMode``: what must be seen before ATen.

Creating tensors on ``device="lazyfuse"``, moving them (``.to``, ``.cpu``),
reading them (``.item()``, ``print``, ``.numpy()``) and autograd
(``backward``, ``.grad``, ``requires_grad``) are intercepted at the
function level: the runtime's autograd records gradients with the forward
ops, so PyTorch's autograd engine never runs on lazyfuse tensors. Hot
functions go straight to their lowering (about a microsecond of Python per
op); everything else continues to ATen and ``__torch_dispatch__``.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _C, _views
from ._core import LazyTensor, download, dtype_name, set_site, sync_grad_mode, upload, where, wrap
from ._dispatch import inplace_method, setitem_method, unwrap, wrap_out
from ._viewfns import detach_view, view_functions
from ._views import contiguous, forget
from ._lower import TABLE, cast, elementwise as ew, factory, more, nn, reduce, shape

LazyfuseError = _C.LazyfuseError
T = torch.Tensor


def is_ours(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type == "lazyfuse"
    return isinstance(device, str) and device.startswith("lazyfuse")


# --- reading and moving -------------------------------------------------------


def _repr(x, *_, **__):
    s = repr(download(x._t))
    return s[:-1] + ", device='lazyfuse:0')" if s.endswith(")") else s


def _to(x, *args, **kwargs):
    copy = kwargs.pop("copy", False)
    dev, dt, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    if type(x) is not LazyTensor:
        if not is_ours(dev):
            return None
        if dt is not None:
            x = x.to(dt)
        return wrap(upload(x))
    if dev is not None and not is_ours(dev):
        cpu = download(x._t)
        return cpu if dt is None else cpu.to(dt)
    if dt is None or dtype_name(dt) == x._t.dtype:
        return wrap(x._t.unary("detach")) if copy else x
    return wrap(cast(x._t, dtype_name(dt)))


def _backward(x, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    if create_graph or inputs is not None:
        raise LazyfuseError(
            f"backward(create_graph=..., inputs=...) is not supported on lazyfuse (at {where()})"
        )
    if gradient is not None:
        g = unwrap(gradient)
        x = wrap(x._t.binary("mul", g).reduce("sum", None, False))
    x._t.backward(bool(retain_graph))


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
                   allow_unused=None, **_):
    """``torch.autograd.grad`` for leaf inputs: the runtime accumulates into
    leaves, so their gradients are set aside, the backward pass runs, its
    gradients are read and the old ones put back."""
    outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if create_graph or len(outs) != 1 or any(not x._t.is_leaf for x in ins):
        raise LazyfuseError(
            "torch.autograd.grad on lazyfuse takes one output and leaf inputs, without"
            f" create_graph (at {where()})"
        )
    saved = [x._t.grad() for x in ins]
    for x in ins:
        x._t.set_grad(None)
    gout = None
    if grad_outputs is not None:
        gout = grad_outputs[0] if isinstance(grad_outputs, (list, tuple)) else grad_outputs
    _backward(outs[0], gout, retain_graph)
    res = []
    for x, old in zip(ins, saved):
        g = x._t.grad()
        x._t.set_grad(old)
        res.append(None if g is None else wrap(g))
    return tuple(res)


def _autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                       inputs=None, **_):
    ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    gs = [None] * len(ts) if grad_tensors is None else (
        [grad_tensors] if isinstance(grad_tensors, torch.Tensor) else list(grad_tensors))
    for t, g in zip(ts, gs):
        _backward(t, g, retain_graph, create_graph, inputs)


def _grad_get(x):
    """``x.grad``: one tensor per parameter, as in PyTorch (``x.grad is
    x.grad``), holding the runtime's current gradient; an in-place write
    to it (``clip_grad_norm_``'s ``_foreach_mul_``, ``p.grad.zero_()``)
    sets the parameter's gradient (``_views.write``)."""
    g = x._t.grad()
    if g is None:
        x._grad_w = None
        return None
    w = x._grad_w
    if w is None:
        w = wrap(g)
        w._grad_of = weakref.ref(x)
        x._grad_w = w
    else:
        w._t = g
        if w._views:
            _views.refresh(w)
    return w


def _grad_set(x, g):
    x._t.set_grad(None if g is None else unwrap(g))
    x._grad_w = g if type(g) is LazyTensor else None
    if type(g) is LazyTensor:
        g._grad_of = weakref.ref(x)


def _requires_grad_(x, on=True):
    if on or x._t.requires_grad:
        x._t.set_requires_grad(bool(on))
    return x


def _data_set(x, v):
    forget(x)
    x._t = unwrap(v)


def _new_tensor(x, data, dtype=None, device=None, requires_grad=False, **_):
    """``x.new_tensor(data)``: a copy of ``data`` with ``x``'s dtype, on
    ``x``'s device unless ``device`` says otherwise."""
    if type(data) is LazyTensor:
        data = download(data._t)
    t = torch.tensor(data, dtype=dtype or x.dtype)
    if device is not None and not is_ours(device):
        return t.to(device).requires_grad_(requires_grad)
    out = wrap(upload(t))
    if requires_grad:
        out._t.set_requires_grad(True)
    return out


def _one_hot(x, num_classes=-1):
    """``F.one_hot``: ``num_classes=-1`` reads the largest class (a sync
    point, as in PyTorch, which reads it too)."""
    if x._t.dtype != "int64":
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    n = num_classes if num_classes >= 0 else int(x._t.reduce("max", None, False).item()) + 1
    classes = _C.arange(0.0, float(n), 1.0, "int64")
    return wrap(cast(x._t.unsqueeze(len(x.shape)).binary("eq", classes), "int64"))


_DEVICE = torch.device("lazyfuse", 0)
_PLAIN = {int, float, bool, str, type(None)}
H = _C.Tensor

SPECIAL = {
    T.__repr__: _repr,
    T.__str__: _repr,
    T.__format__: lambda x, spec="": _repr(x) if not spec else format(x.item(), spec),
    T.to: _to,
    T.cpu: lambda x, *a, **k: download(x._t),
    T.numpy: lambda x, *a, **k: download(x._t).numpy(),
    T.tolist: lambda x: download(x._t).tolist(),
    T.item: lambda x: x._t.item(),
    T.backward: _backward,
    torch.autograd.grad: _autograd_grad,
    torch.autograd.backward: _autograd_backward,
    T.grad.__get__: _grad_get,
    T.grad.__set__: _grad_set,
    T.requires_grad.__get__: lambda x: x._t.requires_grad,
    T.requires_grad.__set__: lambda x, on: _requires_grad_(x, on) and None,
    T.requires_grad_: _requires_grad_,
    T.is_leaf.__get__: lambda x: x._t.is_leaf,
    T.grad_fn.__get__: lambda x: None,
    T.data.__get__: detach_view,
    T.data.__set__: _data_set,
    T.detach: detach_view,
    T.retain_grad: lambda x: None,
    T.device.__get__: lambda x: _DEVICE,
    T.is_cpu.__get__: lambda x: False,
    T.is_meta.__get__: lambda x: False,
    T.get_device: lambda x: 0,
    T.new_tensor: _new_tensor,
    F.one_hot: _one_hot,
}

_LIST_FIRST = {torch.autograd.grad, torch.autograd.backward}

# Functions whose lowering takes the function's own arguments: recorded
# here, without the trip through ATen.
FAST = {}
# The float elementwise ones Rust records without calling the lowering
# (``python/src/fast.rs``): ``("unary", op)`` or ``("binary", op)``, the
# runtime op the lowering itself would record for float operands.
NATIVE = {}


def _fast(funcs, low, native=None):
    for f in funcs:
        FAST[f] = low
        if native is not None:
            NATIVE[f] = native


_fast([T.add, T.__add__, torch.add, T.__radd__], ew.add, ("binary", "add"))
_fast([T.sub, T.__sub__, torch.sub], ew.sub, ("binary", "sub"))
_fast([T.__rsub__], lambda a, b: ew.binary("sub", b, a))
_fast([T.mul, T.__mul__, torch.mul, T.__rmul__], ew.mul, ("binary", "mul"))
_fast([T.div, T.__truediv__, torch.div], ew.div, ("binary", "div"))
_fast([T.__rtruediv__], lambda a, b: ew.div(b, a))
_fast([T.__neg__, T.neg, torch.neg], lambda x: x.unary("neg"), ("unary", "neg"))
_fast([T.__matmul__, T.matmul, torch.matmul], nn.matmul)
_fast([T.pow, T.__pow__, torch.pow], ew.pow_)
for _n in ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "abs"]:
    _fast([getattr(T, _n), getattr(torch, _n)], TABLE[_n], ("unary", _n))
_fast([torch.relu, T.relu, F.relu], lambda x, inplace=False: x.unary("relu"), ("unary", "relu"))
_fast([F.gelu], ew.gelu)
_fast([F.silu], lambda x, inplace=False: ew.silu(x))
_fast([F.linear], lambda input, weight, bias=None: nn.linear(input, weight, bias))
_fast([F.scaled_dot_product_attention], nn.sdpa)
_fast([F.softmax, T.softmax, torch.softmax],
      lambda x, dim=None, _stacklevel=3, dtype=None: reduce.softmax(x, dim, dtype=dtype))
_fast([F.layer_norm], lambda input, normalized_shape, weight=None, bias=None, eps=1e-5:
      nn.layer_norm(input, normalized_shape, weight, bias, eps))
_fast([F.dropout], lambda x, p=0.5, training=True, inplace=False: nn.dropout(x, p, training))
# Scalars stay Python numbers here; through ATen, PyTorch would wrap them
# as 0-dim tensors on the meta device, which hold no value.
_fast([torch.where, T.where], lambda condition, input=None, other=None: ew.where(condition, input, other)
      if input is not None else None)
_fast([T.masked_fill, torch.masked_fill], ew.masked_fill)
_fast([T.clamp, torch.clamp, T.clip, torch.clip], ew.clamp)
for _n, _op in [("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")]:
    _fast([getattr(T, _n), getattr(T, f"__{_n}__"), getattr(torch, _n)],
          lambda a, b, _op=_op: ew.binary(_op, a, b))
_fast([T.maximum, torch.maximum], lambda a, b: ew.binary("maximum", a, b), ("binary", "maximum"))
# Same-signature functions: the ATen lowering of the same name.
for _n in ["square", "reciprocal", "log1p", "expm1", "ceil", "trunc", "sign", "floor", "rsqrt",
           "amax", "amin", "argmax",
           "var", "std", "logsumexp", "tril", "triu", "erf", "index_select", "gather", "repeat"]:
    _funcs = [f for f in (getattr(T, _n, None), getattr(torch, _n, None)) if f is not None]
    _fast(_funcs, TABLE[_n])
_fast([F.silu], lambda x, inplace=False: ew.silu(x))
_fast([T.float], lambda x, memory_format=None: cast(x, "float32"))
_fast([F.max_pool2d], more.max_pool2d)
_fast([F.avg_pool2d], TABLE["avg_pool2d"])
_fast([T.type_as], lambda x, other: cast(x, other.dtype))
_fast([T.minimum, torch.minimum], lambda a, b: ew.binary("minimum", a, b),
      ("binary", "minimum"))
_fast([T.sum, torch.sum], reduce.sum_)
_fast([T.mean, torch.mean], reduce.mean)

_fast([torch.cat, torch.concat, torch.concatenate], shape.cat)
_fast([torch.stack], shape.stack)

# Taken by the Rust path only (``_intercept`` never calls these): in-place
# methods (on the call's own ``LazyTensor``s) and metadata.
RUST_ONLY = {}

# Views (``x[i]`` with basic indices, ``view``, ``transpose``, ...): the
# lowering's value, marked as a view of its base (``_views``) so that
# writes reach the memory they share; the rest of ``x[i]`` (CPU index
# tensors, masks) through ATen, so ``_intercept`` must not take them.
RUST_ONLY.update(view_functions())
# ``x[idx] = value``: the written value swapped in, as in-place methods are.
RUST_ONLY[T.__setitem__] = (setitem_method, ("raw", ""))

# In-place methods: the out-of-place lowering's value swapped into the
# tensor, called with the method's own arguments.
for _n, _also in [("add_", ["__iadd__"]), ("sub_", ["__isub__"]), ("mul_", ["__imul__"]),
                  ("div_", ["__itruediv__"]), ("addcmul_", []), ("addcdiv_", []), ("lerp_", []),
                  ("clamp_", []), ("clamp_min_", []), ("clamp_max_", []), ("sqrt_", []),
                  ("exp_", []), ("neg_", []), ("pow_", []), ("abs_", []), ("relu_", []),
                  ("tanh_", []), ("sigmoid_", []), ("masked_fill_", []), ("zero_", []),
                  ("fill_", [])]:
    _run = inplace_method(_n)
    if _run is not None:
        for _m in [_n, *_also]:
            if hasattr(T, _m):
                RUST_ONLY[getattr(T, _m)] = (_run, ("raw", ""))

# Metadata PyTorch answers from the wrapper itself: called as they are.
# (Property getters by their descriptor: see ``fast.rs``.)
for _f in [T.shape, T.dtype, T.ndim, T.layout, T.size, T.dim,
           T.numel, T.nelement, T.ndimension, T.element_size, T.__len__, T.is_floating_point,
           T.is_complex, T.is_contiguous, T.stride]:
    RUST_ONLY[_f] = (None, ("pass", ""))

# Getters answered by the runtime's tensor (a ``None`` gradient declines to
# the Python path, which gives the same None).
RUST_ONLY[T.device] = (lambda x: _DEVICE, ("raw", ""))
RUST_ONLY[T.requires_grad] = (lambda x: x._t.requires_grad, ("raw", ""))
RUST_ONLY[T.is_leaf] = (lambda x: x._t.is_leaf, ("raw", ""))
RUST_ONLY[T.grad] = (_grad_get, ("raw", ""))

# Factories: with ``device="lazyfuse"`` they create on the device.
FACTORIES = {
    torch.zeros: factory.zeros,
    torch.ones: factory.ones,
    torch.empty: factory.zeros,
    torch.full: factory.full,
    torch.rand: factory.rand,
    torch.randn: factory.randn,
    torch.arange: factory.arange,
    torch.randint: factory.randint,
}

_SIZED = {torch.zeros, torch.ones, torch.empty, torch.rand, torch.randn}

_FACTORY_VIA_CPU = {torch.tensor, torch.as_tensor, torch.eye, torch.linspace, torch.randperm,
                    torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
                    torch.rand_like, torch.randn_like, torch.scalar_tensor}


class LazyfuseMode(TorchFunctionMode):
    """Pushed once when the package is imported (``lazyfuse.disable()``
    pops it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _is_compiling():
            return _while_compiling(self, func, types, args, kwargs)
        r = _rust_fast(func, args, kwargs)
        if r is not NotImplemented:
            return r
        return self._intercept(func, types, args, kwargs)

    def _intercept(self, func, types, args=(), kwargs=None):
        if args and type(args[0]) is LazyTensor:
            low = FAST.get(func)
            if low is not None:
                set_site(func.__name__)
                sync_grad_mode()
                a = [x._t if type(x) is LazyTensor else (x if type(x) in _PLAIN else unwrap(x))
                     for x in args]
                try:
                    if kwargs:
                        r = low(*a, **{k: unwrap(v) for k, v in kwargs.items()})
                    else:
                        r = low(*a)
                except TypeError:
                    # A spelling the fast lowering does not take (a keyword
                    # it names otherwise): ATen's path handles every one.
                    r = None
                if r is not None:
                    return wrap(r) if type(r) is H else wrap_out(r)
        kwargs = kwargs or {}
        if args and type(args[0]) is LazyTensor:
            if low is None:
                sp = SPECIAL.get(func)
                if sp is not None:
                    set_site(getattr(func, "__name__", "op"))
                    sync_grad_mode()
                    return sp(*args, **kwargs)
        elif func in _LIST_FIRST and args and isinstance(args[0], (list, tuple)) and args[0] \
                and type(args[0][0]) is LazyTensor:
            set_site(func.__name__)
            sync_grad_mode()
            return SPECIAL[func](*args, **kwargs)
        elif func is T.to and args and isinstance(args[0], torch.Tensor):
            r = _to(*args, **kwargs)
            if r is not None:
                return r
        elif "device" in kwargs and is_ours(kwargs["device"]):
            return self._factory(func, args, kwargs)
        return func(*args, **kwargs)

    def _factory(self, func, args, kwargs):
        set_site(getattr(func, "__name__", "factory"))
        kw = dict(kwargs)
        kw.pop("device")
        kw.pop("requires_grad", None)
        kw.pop("pin_memory", None)
        kw.pop("layout", None)
        kw.pop("generator", None)
        low = FACTORIES.get(func)
        if low is not None:
            if func in _SIZED and (not args or not isinstance(args[0], (list, tuple, torch.Size))):
                args = (args,)  # torch.ones(2, 3) as ones([2, 3])
            out = wrap(low(*args, **kw))
        else:
            kw["device"] = "cpu"
            out = wrap(upload(func(*args, **kw)))
        if kwargs.get("requires_grad"):
            out._t.set_requires_grad(True)
        return out


_is_compiling = torch.compiler.is_compiling
# The hot functions on the device run in Rust: the user's line, grad mode,
# unwrapping, recording and wrapping (``python/src/fast.rs``), as do calls
# that touch nothing on the device; ``NotImplemented`` from there sends the
# call to ``_intercept``, whose lowerings are the same. SPECIAL's functions,
# ``.to`` and the autograd entry points always take the Python path.
for _f in [*SPECIAL, T.to, *_LIST_FIRST]:
    if type(_f).__name__ != "method-wrapper" and _f not in RUST_ONLY:
        RUST_ONLY[_f] = (None, ("python", ""))
_rust_fast = _C.fast
_C.install_fast_path(wrap_out, contiguous, [
    (f, getattr(f, "__name__", "op"), low, NATIVE.get(f)) for f, low in FAST.items()
] + [(f, getattr(f, "__name__", "op"), low, kind) for f, (low, kind) in RUST_ONLY.items()])


def _touches_device(args, kwargs) -> bool:
    """True when a call has a ``LazyTensor`` operand (or a list of them) or
    makes one (``device="lazyfuse"``)."""
    for a in args:
        if type(a) is LazyTensor or (
                isinstance(a, (list, tuple)) and a and type(a[0]) is LazyTensor):
            return True
    if kwargs:
        if any(type(v) is LazyTensor for v in kwargs.values()):
            return True
        d = kwargs.get("device")
        return d is not None and is_ours(d)
    return False


def _while_compiling(mode, func, types, args, kwargs):
    """What the mode does while Dynamo traces: a call on CPU tensors is
    traced as it stands (the ``torch.compile`` path for models left on the
    CPU); a call on the device runs through ``_DEVICE_OP``, which Dynamo
    skips instead of tracing (a ``LazyTensor`` holds a runtime handle, not
    data a FakeTensor can stand for): a model moved to the device runs
    under ``torch.compile`` as the fused eager device, with one clean skip
    per op rather than breaks inside the mode's own Python."""
    if _touches_device(args, kwargs):
        return _DEVICE_OP[0](mode, func, types, args, kwargs)
    return func(*args, **(kwargs or {}))


def _device_op(mode, func, types, args, kwargs):
    return mode._intercept(func, types, args, kwargs)


# Replaced by a ``torch._dynamo.disable``-d ``_device_op`` when the
# ``lazyfuse`` backend loads (importing Dynamo here would add most of a
# second to ``import lazyfuse``).
_DEVICE_OP = [_device_op]


def skip_device_ops_in_dynamo() -> None:
    """Makes Dynamo skip the mode's device path (see ``_while_compiling``)."""
    import torch._dynamo
    _DEVICE_OP[0] = torch._dynamo.disable(_device_op, recursive=True)
