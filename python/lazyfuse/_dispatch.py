"""ATen ops on ``LazyTensor``s (``__torch_dispatch__``): unwrap to runtime
handles, run the op's lowering, wrap the results. In-place ops compute the
out-of-place value and swap the tensor's handle. An op with no lowering
runs on the CPU (a graph break, with a warning naming it), unless its
inputs need gradients, which the CPU cannot carry: then it is an error."""

from __future__ import annotations

import warnings

import torch

from . import _C, _views
from ._core import (
    LazyTensor,
    download,
    dtype_name,
    set_site,
    sync_grad_mode,
    upload,
    where,
    wrap,
)
from ._lower import H, cast, lookup
from ._lower import factory, shape

LazyfuseError = _C.LazyfuseError


class LazyfuseFallbackWarning(UserWarning):
    """An op lazyfuse has no lowering for ran on the CPU (a graph break)."""


_warned: set = set()


def unwrap(x):
    """Runtime handles for ``LazyTensor``s (also inside lists); CPU 0-dim
    tensors are uploaded, as PyTorch lets CPU scalars mix with any device."""
    t = type(x)
    if t is LazyTensor:
        return x._t
    if t is list or t is tuple:
        return t(unwrap(v) for v in x)
    if isinstance(x, torch.Tensor):
        if isinstance(x, LazyTensor):
            return x._t
        if x.dim() == 0 and x.device.type == "cpu":
            return upload(x)
        if x.device.type == "meta":
            raise LazyfuseError(
                "PyTorch made a meta tensor (a Python scalar it wrapped for a lazyfuse op) whose"
                f" value cannot be read; this call needs a function-level lowering (at {where()})"
            )
        raise LazyfuseError(
            f"expected all tensors on the lazyfuse device, but got one on {x.device}"
            f" ({tuple(x.shape)}); move it with .to('lazyfuse') (at {where()})"
        )
    return x


def wrap_out(r):
    t = type(r)
    if t is H:
        return wrap(r)
    if t is tuple or t is list:
        return t(wrap_out(v) for v in r)
    return r


_INPLACE_BASE = {
    "fill_": lambda x, v: (
        cast(v, x.dtype).expand(list(x.shape)) if type(v) is H and x.shape else
        cast(v, x.dtype) if type(v) is H else _C.full(float(v), x.shape, x.dtype)
    ),
    "zero_": lambda x: _C.full(0.0, x.shape, x.dtype),
    "copy_": lambda x, src, non_blocking=False: shape.expand(cast(src, x.dtype), x.shape),
    "normal_": lambda x, mean=0.0, std=1.0, generator=None: factory.normal(x.shape, x.dtype, mean, std),
    "uniform_": lambda x, a=0.0, b=1.0, generator=None: factory.uniform(x.shape, x.dtype, a, b),
    "bernoulli_": lambda x, p=0.5, generator=None: factory.bernoulli_p(x, p),
}


def _special(name, func, args, kwargs):
    """Ops that read values or cross devices; None when not one of them."""
    if name == "_local_scalar_dense":
        return args[0]._t.item()
    if name == "_to_copy":
        x = args[0]
        dev = kwargs.get("device")
        dt = kwargs.get("dtype")
        if dev is not None and torch.device(dev).type != "lazyfuse":
            cpu = download(x._t)
            return cpu if dt is None else cpu.to(dt)
        if dt is None:
            return wrap(x._t.unary("detach"))
        return wrap(cast(x._t, dtype_name(dt)))
    if name == "equal":
        a, b = args
        if tuple(a.shape) != tuple(b.shape):
            return False
        return bool(a._t.binary("eq", unwrap(b)).reduce("min", None, False).item())
    if name == "copy_":
        dst, src = args[0], args[1]
        if type(dst) is not LazyTensor:  # device to host
            return dst.copy_(download(src._t))
        if type(src) is not LazyTensor and isinstance(src, torch.Tensor):  # host to device
            return _inplace(func, name, (dst, wrap(upload(src))) + tuple(args[2:]), kwargs)
        return _inplace(func, name, args, kwargs)
    if name in ("native_batch_norm", "_native_batch_norm_legit") and len(args) >= 8:
        return _batch_norm(args, kwargs)
    if name == "is_same_size":
        return tuple(args[0].shape) == tuple(args[1].shape)
    return None


_SPECIAL_NAMES = {"_local_scalar_dense", "_to_copy", "equal", "copy_", "is_same_size",
                  "native_batch_norm", "_native_batch_norm_legit"}
# Per ATen overload: (name, kind, lowering, site label, is a view); kind 0
# plain, 1 special, 2 foreach, 3 in-place.
_PLANS: dict = {}


def _plan(func):
    name = func._opname
    if name in _SPECIAL_NAMES:
        kind = 1
    elif name.startswith("_foreach_"):
        kind = 2
    elif func._schema.is_mutable and name.endswith("_"):
        kind = 3
    else:
        kind = 0
    p = _PLANS[func] = (name, kind, lookup(func), f"aten::{name}", kind == 0 and func.is_view)
    return p


def _batch_norm(args, kwargs):
    """Batch norm in training updates its running statistics in place."""
    from ._lower import more

    x, w, b, rm, rv, training, momentum, eps = args[:8]
    u = unwrap
    out = more.native_batch_norm(u(x), u(w), u(b), u(rm), u(rv), training, momentum, eps)
    if training and type(rm) is LazyTensor and type(rv) is LazyTensor:
        new_m, new_v = more.batch_stats_update(u(x), out[1], out[2], rm._t, rv._t, momentum, eps)
        _views.write(rm, new_m, "batch_norm")
        _views.write(rv, new_v, "batch_norm")
    return wrap_out(out)


# Ops whose index tensors (argument 1, a list) may stay on the CPU, as
# PyTorch lets CPU indices index a tensor on any device.
_CPU_INDICES = {"index", "index_put", "index_put_", "_unsafe_index", "_unsafe_index_put",
                "_index_put_impl_"}


def _upload_cpu_indices(args):
    def up(i):
        if isinstance(i, torch.Tensor) and type(i) is not LazyTensor and i.device.type == "cpu":
            return wrap(upload(i))
        return i
    return (args[0], [up(i) for i in args[1]], *args[2:])


def dispatch(func, args, kwargs):
    p = _PLANS.get(func) or _plan(func)
    name, kind, low, site, view = p
    set_site(site)
    sync_grad_mode()
    if name in _CPU_INDICES and len(args) > 1 and isinstance(args[1], (list, tuple)):
        args = _upload_cpu_indices(args)
    if kind == 1:
        r = _special(name, func, args, kwargs)
        if r is not None:
            return r
    elif kind == 2:
        done, r = _foreach(func, name, args, kwargs)
        if done:
            return r
    elif kind == 3 and args and type(args[0]) is LazyTensor:
        return _inplace(func, name, args, kwargs)
    if "out" in kwargs:
        return _out(func, name, low, args, kwargs)
    if low is not None:
        a = [x._t if type(x) is LazyTensor else unwrap(x) for x in args]
        k = {k: unwrap(v) for k, v in kwargs.items()} if kwargs else {}
        r = low(*a, **k)
        if r is not None:
            out = wrap(r) if type(r) is H else wrap_out(r)
            if view and type(args[0]) is LazyTensor:
                _views.mark_aten(low, out, args[0], a[1:], k)
            return out
    return _fallback(func, args, kwargs)


def _out(func, name, low, args, kwargs):
    """``op(..., out=t)``: the functional lowering's value written into
    ``t`` (an in-place write, reaching ``t``'s views); the CPU fallback,
    which writes its result back too, where there is none or the shapes
    differ (PyTorch would resize ``t``)."""
    dst = kwargs["out"]
    if low is not None and type(dst) is LazyTensor:
        rest = {k: unwrap(v) for k, v in kwargs.items() if k != "out"}
        r = low(*[unwrap(x) for x in args], **rest)
        if type(r) is H and tuple(r.shape) == tuple(dst._t.shape):
            _views.write(dst, cast(r, dst._t.dtype), name)
            return dst
    return _fallback(func, args, kwargs)


def _foreach(func, name, args, kwargs):
    """``torch._foreach_<op>(lists, ...)``: the op on each element, recorded
    like any other (the runtime fuses them); in-place forms update each
    tensor. Lists (tensors or scalars) are taken element by element, other
    arguments broadcast."""
    base = name[len("_foreach_"):]
    inplace = base.endswith("_")
    op = getattr(torch.ops.aten, base[:-1] if inplace else base, None)
    if op is None:
        return False, None
    n = len(args[0])
    if not all(type(t) is LazyTensor for t in args[0]):
        return False, None

    def pick(v, i):
        return v[i] if isinstance(v, (list, tuple)) and len(v) == n else v

    overload = _overload_for(op, args)
    if overload is None or (lookup(overload) is None and base not in _INPLACE_BASE):
        return False, None
    outs = []
    for i in range(n):
        a = tuple(pick(v, i) for v in args)
        k = {key: pick(v, i) for key, v in kwargs.items()}
        if inplace:
            _inplace(getattr(torch.ops.aten, base), base, a, k, overload)
        else:
            outs.append(dispatch(overload, a, k))
    return True, (None if inplace else outs)


def _overload_for(op, args):
    """The overload of a per-element op matching a foreach call's second
    argument (a tensor, a scalar, or none)."""
    second = args[1] if len(args) > 1 else None
    if isinstance(second, (list, tuple)) and second:
        second = second[0]
    names = op.overloads()
    if isinstance(second, torch.Tensor) and "Tensor" in names:
        return op.Tensor
    if second is not None and not isinstance(second, torch.Tensor) and "Scalar" in names:
        return op.Scalar
    return getattr(op, "default", None) or getattr(op, names[0])


def _inplace(func, name, args, kwargs, overload=None, fallback=True):
    """In-place ATen op ``name`` (``add_``): the out-of-place value swapped
    into ``args[0]``. Without a lowering: the CPU fallback, or
    ``NotImplemented`` when ``fallback`` is False (the function-level path
    then gives way)."""
    self = args[0]
    base = _INPLACE_BASE.get(name)
    uargs = unwrap(args)
    ukw = {k: unwrap(v) for k, v in kwargs.items()}
    if base is None:
        if overload is None:
            op = getattr(torch.ops.aten, name[:-1], None)
            overload = getattr(op, func._overloadname, None) if op is not None else None
        low = lookup(overload) if overload is not None else None
        new = low(*uargs, **ukw) if low is not None else None
    else:
        new = base(*uargs, **ukw)
    if new is None:
        return _fallback(func, args, kwargs) if fallback else NotImplemented
    _swap(self, new, name)
    return self


# In-place ops that change their tensor's shape (the device's wrappers
# keep theirs): an error, not a broadcast.
_RESHAPING = {"unsqueeze_", "squeeze_", "transpose_", "t_", "swapdims_", "swapaxes_",
              "resize_", "resize_as_", "as_strided_", "set_"}


def _swap(self, new, name):
    """``new`` (a handle) becomes ``self``'s value, as an in-place op
    writes it: broadcast to ``self``'s shape and cast to its dtype; a leaf
    that requires grad stays a leaf and keeps its gradient (and may not be
    written while grad is on, as in PyTorch). The write reaches the memory
    ``self`` shares: its base when it is a view, its views (``_views``)."""
    old = self._t
    if tuple(new.shape) != tuple(old.shape):
        if name in _RESHAPING:
            _views.write(self, new, name)  # the error naming the shape change
        new = shape.expand(new, old.shape)
    new = cast(new, old.dtype)
    if old.requires_grad and old.is_leaf and torch.is_grad_enabled():
        raise LazyfuseError(
            f"a leaf tensor that requires grad is used in an in-place {name} (at {where()});"
            " wrap the update in torch.no_grad()"
        )
    _views.write(self, new, name)


def setitem_method(self, idx, value):
    """``x[idx] = value`` on the device, taken at the function level:
    ``shape.setitem``'s functional value swapped into ``x``; a
    ``LazyfuseError`` naming the user's line where it has none."""

    def arg(v):
        if type(v) is LazyTensor:
            return v._t
        if isinstance(v, torch.Tensor):
            return upload(v)
        if type(v) is tuple:
            return tuple(arg(e) for e in v)
        return v

    new = shape.setitem(self._t, arg(idx), arg(value))
    if new is None:
        # ATen's path cannot write through the wrapper either (PyTorch
        # copies out of its meta storage): say what is missing.
        raise LazyfuseError(
            f"x[{idx!r}] = ... is not supported on lazyfuse (at {where()}): it takes ints,"
            " slices, ... and one integer index or a boolean mask of x's shape with one"
            " value"
        )
    _swap(self, new, "__setitem__")
    return None


def inplace_method(name):
    """``x.<name>(...)`` for in-place method ``name`` (``add_``), taken at
    the function level (one Python call, not ATen's dispatch): the same
    ``_inplace`` as ATen's path, which handles what this declines."""
    op = getattr(torch.ops.aten, name[:-1], None)
    if name not in _INPLACE_BASE and op is None:
        return None

    def run(self, *args, **kwargs):
        full = (self,) + args
        overload = None if op is None else _overload_for(op, full)
        return _inplace(None, name, full, kwargs, overload, fallback=False)

    return run


def _fallback(func, args, kwargs):
    """Runs ``func`` on CPU copies of its lazyfuse inputs, then moves the
    results back: a graph break, never a wrong answer."""
    name = str(func)
    flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    if torch.is_grad_enabled() and any(
        type(x) is LazyTensor and x._t.requires_grad for x in flat
    ):
        raise LazyfuseError(
            f"{name} has no lazyfuse lowering and its inputs require grad, so it cannot run on"
            f" the CPU instead (at {where()}); see the README's list of unsupported ops"
        )
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"lazyfuse: {name} has no lowering; it runs on the CPU (a graph break) at {where()}",
            LazyfuseFallbackWarning,
            stacklevel=3,
        )

    def to_cpu(x):
        if type(x) is LazyTensor:
            return download(x._t)
        if isinstance(x, torch.device) and x.type == "lazyfuse":
            return torch.device("cpu")
        return x

    cargs, ckw = torch.utils._pytree.tree_map(to_cpu, (args, kwargs))
    if "device" in ckw and ckw["device"] is not None and "lazyfuse" in str(ckw["device"]):
        ckw["device"] = "cpu"
    out = func(*cargs, **ckw)
    if "out" in kwargs:
        dsts = kwargs["out"] if isinstance(kwargs["out"], (list, tuple)) else [kwargs["out"]]
        cpus = ckw["out"] if isinstance(ckw["out"], (list, tuple)) else [ckw["out"]]
        for dst, cpu in zip(dsts, cpus):
            if type(dst) is LazyTensor:
                if tuple(cpu.shape) != tuple(dst._t.shape):
                    raise LazyfuseError(
                        f"{name} would resize its out= tensor from {tuple(dst._t.shape)} to"
                        f" {tuple(cpu.shape)}; lazyfuse tensors keep their shape (at {where()})"
                    )
                _views.write(dst, upload(cpu), func._opname)
        return kwargs["out"]
    if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor):
        if type(args[0]) is LazyTensor:
            _views.write(args[0], upload(cargs[0]), func._opname)
        return args[0]

    def back(x):
        return wrap(upload(x)) if isinstance(x, torch.Tensor) else x

    return torch.utils._pytree.tree_map(back, out)
