"""Views that alias their base, as PyTorch's do.

The runtime's tensors are immutable values, so a view (``x[0]``,
``x.view(...)``, ``x.t()``, ``x.detach()``, ``x.data``) is a new value
computed from its base. PyTorch's semantics are that a view shares its
base's memory: writing through the view (``x[:, 1].zero_()``,
``w.data.mul_(2)``) changes the base, and writing the base changes every
view of it. This module keeps that promise on top of immutable values, as
PyTorch's own functionalization does for XLA:

- a view records its *root* (the tensor that owns the memory) and the
  chain of view steps from the root to it (``_view``); the root keeps weak
  references to its live views (``_views``). Marking is in Rust
  (``python/src/views.rs``), on every view op; a step is ``(lowering,
  args, kwargs, i)``, the call that made the view from its parent;
- an in-place write to a view (``_dispatch._swap``, the one place every
  in-place op ends) writes the new value back into the root through each
  step's inverse (``slice_scatter`` for a slice, a reshape back for a
  reshape, ...), then re-derives the root's other live views from the new
  root;
- an in-place write to a root re-derives its live views.

Only the write pays; reading a view is reading its value. A write through
a view whose step has no inverse (``expand``, ``diagonal``, ...) is a
``LazyfuseError`` naming the line, never a silent copy.
"""

from __future__ import annotations

import warnings

import torch

from . import _C
from ._core import where
from ._lower import TABLE, cast, more, shape

LazyfuseError = _C.LazyfuseError
mark_view = _C.mark_view


class LazyfuseViewWarning(UserWarning):
    """A write through a view that does not reach its base (see ``write``)."""


def forward(h, step):
    """The view's value from its parent's value ``h``."""
    low, args, kwargs, i = step
    r = low(h, *args, **kwargs) if kwargs else low(h, *args)
    return r if i is None else r[i]


def _sizes(s):
    """``view(2, 3)`` and ``view((2, 3))`` alike; None for ``view(dtype)``."""
    v = s[0] if len(s) == 1 and not isinstance(s[0], int) else s
    return None if isinstance(v, torch.dtype) else v


def reshape(x, *s):
    """``x.view(...)``/``x.reshape(...)`` at the function level."""
    v = _sizes(s)
    return None if v is None else shape.reshape(x, v)


def permute(x, *d):
    """``x.permute(...)`` at the function level."""
    return shape.permute(x, _sizes(d))


def expand(x, *s, **_):
    """``x.expand(...)`` at the function level."""
    return shape.expand(x, _sizes(s))


def _dim_arg(args, kwargs, at, rank, default=0):
    d = args[at] if len(args) > at else (kwargs or {}).get("dim", default)
    return d + rank if d < 0 else d


def _reshape_back(parent, new, args, kwargs, i):
    return shape.reshape(new, list(parent.shape))


def _permute_back(parent, new, args, kwargs, i):
    dims = [int(d) % max(len(parent.shape), 1) for d in _sizes(args)]
    back = [0] * len(dims)
    for k, p in enumerate(dims):
        back[p] = k
    return shape.permute(new, back)


def _slice_back(parent, new, args, kwargs, i):
    a = list(args) + [None] * (4 - len(args))
    d = a[0] if a[0] is not None else (kwargs or {}).get("dim", 0)
    d = d + len(parent.shape) if d < 0 else d
    s, e, st = slice(a[1], a[2], a[3] if a[3] is not None else 1).indices(parent.shape[d])
    if st == 1:
        return more.slice_scatter(parent, new, d, s, max(s, e))
    return shape._scatter_strided(parent, new, d, s, e, st)


def _narrow_back(parent, new, args, kwargs, i):
    d, start, length = args
    d = d + len(parent.shape) if d < 0 else d
    start = start + parent.shape[d] if start < 0 else start
    return more.slice_scatter(parent, new, d, start, start + length)


def _unbind_back(parent, new, args, kwargs, i):
    d = _dim_arg(args, kwargs, 0, len(parent.shape))
    return more.select_scatter(parent, new, d, i)


# Each view lowering's inverse: the parent's value once the view's value is
# ``new``. A lowering not here (``expand``) makes views that cannot be
# written through.
INVERSE = {
    reshape: _reshape_back,
    shape.reshape: _reshape_back,
    shape.flatten: _reshape_back,
    shape.unflatten: _reshape_back,
    shape.unsqueeze: _reshape_back,
    shape.squeeze: _reshape_back,
    shape.identity: lambda parent, new, args, kwargs, i: new,
    shape.detach: lambda parent, new, args, kwargs, i: new,
    shape.transpose: lambda parent, new, args, kwargs, i: shape.transpose(new, *args),
    shape.t: lambda parent, new, args, kwargs, i: shape.t(new),
    shape.permute: _permute_back,
    permute: _permute_back,
    shape.getitem: lambda parent, new, args, kwargs, i: shape.setitem(parent, args[0], new),
    shape.select: lambda parent, new, args, kwargs, i: more.select_scatter(parent, new, *args),
    shape.slice_: _slice_back,
    shape.narrow: _narrow_back,
    shape.unbind: _unbind_back,
    shape.split: lambda parent, new, args, kwargs, i: _split_back(parent, new, args, kwargs, i,
                                                                 shape.split),
    shape.chunk: lambda parent, new, args, kwargs, i: _split_back(parent, new, args, kwargs, i,
                                                                 shape.chunk),
    more.diagonal: lambda parent, new, args, kwargs, i: more.diagonal_scatter(
        parent, new, *args, **(kwargs or {})),
}


def _split_back(parent, new, args, kwargs, i, low):
    pieces = low(parent, *args, **(kwargs or {}))
    d = _dim_arg(args, kwargs, 1, len(parent.shape))
    at = sum(p.shape[d] for p in pieces[:i])
    return more.slice_scatter(parent, new, d, at, at + pieces[i].shape[d])


def inverse(parent, new, step):
    """The parent's value once the view's value is ``new`` (None where the
    step has no inverse)."""
    low, args, kwargs, i = step
    inv = INVERSE.get(low)
    return None if inv is None else inv(parent, new, args, kwargs, i)


# Steps after which a contiguous parent gives a contiguous view.
_KEEPS = {reshape, shape.reshape, shape.flatten, shape.unflatten, shape.unsqueeze,
          shape.squeeze, shape.identity, shape.detach}


def _leading(step) -> bool:
    """A step that slices or selects along dim 0 only (unit stride)."""
    low, args, kwargs, i = step
    if low is shape.getitem:
        idx = args[0] if type(args[0]) is tuple else (args[0],)
        for k, c in enumerate(idx):
            if c is Ellipsis:
                return True
            if k == 0:
                if not (type(c) is int or (type(c) is slice and c.step in (None, 1))):
                    return False
            elif c != slice(None):
                return False
        return True
    if low is shape.select or low is shape.narrow:
        return args[0] == 0
    if low is shape.slice_:
        return (args[0] if args else 0) == 0 and (len(args) < 4 or args[3] in (None, 1))
    return False


def contiguous(t) -> bool:
    """Whether ``t`` is laid out as a fresh tensor of its shape would be: a
    root, or a view through reshapes and dim-0 slices only. PyTorch's
    ``reshape``, ``flatten`` and ``contiguous`` of such a tensor are views,
    of any other a copy."""
    v = t._view
    return v is None or all(s[0] in _KEEPS or _leading(s) for s in v[1])


def mark_aten(low, out, src, args, kwargs):
    """Marks the result(s) ``out`` of an ATen view op with lowering ``low``
    (called with ``src``'s handle, then ``args`` and ``kwargs``)."""
    args = tuple(args)
    kwargs = kwargs or None
    if type(out) in (list, tuple):
        for i, o in enumerate(out):
            mark_view(o, src, (low, args, kwargs, i))
    else:
        mark_view(out, src, (low, args, kwargs, None))


DETACH = (shape.detach, (), None, None)


def write(t, new, name):
    """Makes handle ``new`` the value of ``t`` (an in-place op's result,
    already of ``t``'s shape and dtype), writing it through to the memory
    ``t`` shares: its root and the root's other views."""
    if list(new.shape) != list(t._t.shape):
        raise LazyfuseError(
            f"an in-place {name} would change a tensor's shape from {list(t._t.shape)} to"
            f" {list(new.shape)}; lazyfuse tensors keep their shape, so use its out-of-place"
            f" form (x = x.{name.rstrip('_')}(...)) (at {where()})"
        )
    v = t._view
    if v is None:
        _set(t, t._t.carry_leaf(new))
        if t._views:
            _refresh(t, None)
        return
    root, chain = v
    rt = root._t
    detached = any(s[0] is shape.detach for s in chain)
    if rt.requires_grad and rt.is_leaf and torch.is_grad_enabled() and not detached:
        raise LazyfuseError(
            f"a view of a leaf tensor that requires grad is used in an in-place {name}"
            f" (at {where()}); wrap the update in torch.no_grad()"
        )
    if rt.requires_grad and not rt.is_leaf and detached:
        # PyTorch would change the value under the gradient history; the
        # runtime's values carry their history, which a new value would
        # drop. Metrics code does this (``p = logits.detach(); p.sigmoid_()``)
        # and rarely reads the base again: the view becomes a tensor of its
        # own, with a warning rather than an error.
        warnings.warn(
            f"lazyfuse: an in-place {name} on .detach()/.data of a tensor with gradient history"
            f" does not change that tensor on lazyfuse (at {where()}); .clone() it to say so",
            LazyfuseViewWarning,
            stacklevel=4,
        )
        t._view = None
        t._t = t._t.carry_leaf(new)
        return
    parents = [rt]
    for s in chain[:-1]:
        parents.append(forward(parents[-1], s))
    val = new
    for s, p in zip(reversed(chain), reversed(parents)):
        val = inverse(p, val, s)
        if val is None:
            kind = getattr(s[0], "__name__", "this op").strip("_")
            raise LazyfuseError(
                f"an in-place {name} writes through a view made by {kind}, which lazyfuse"
                f" cannot write back into its base (at {where()}); write the base, or"
                " .clone() the view first"
            )
    t._t = t._t.carry_leaf(new)
    _set(root, rt.carry_leaf(cast(val, rt.dtype)))
    _refresh(root, t)


def _set(t, h):
    """``h`` becomes root ``t``'s value; when ``t`` is a parameter's
    ``.grad``, the parameter's gradient too."""
    t._t = h
    of = t._grad_of
    if of is not None:
        p = of()
        if p is not None:
            p._t.set_grad(h)


def refresh(root):
    """Re-derives ``root``'s live views from its value (it changed)."""
    _refresh(root, None)


def _refresh(root, skip):
    """Re-derives ``root``'s live views (but ``skip``) from its value."""
    keep = []
    for r in root._views:
        w = r()
        if w is None:
            continue
        v = w._view
        if v is None or v[0] is not root:
            continue
        keep.append(r)
        if w is skip:
            continue
        h = root._t
        for s in v[1]:
            h = forward(h, s)
        w._t = h
    root._views = keep


def forget(t):
    """``t`` no longer shares memory with its views (``t.data = other``)."""
    for r in t._views or ():
        w = r()
        if w is not None and w._view is not None and w._view[0] is t:
            w._view = None
    t._views = None
