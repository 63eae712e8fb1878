"""The device's view functions at the function level (``x[0]``,
``x.view(...)``, ``x.transpose(...)``, ``x.detach()``, ...), for the Rust
fast path's table: each the lowering of the call, its result marked as a
view of its operand (``_views``), so that a write through either reaches
the other as in PyTorch. A spelling these do not take goes to ATen's path,
which marks ATen's view ops the same way."""

from __future__ import annotations

import torch

from . import _views
from ._core import LazyTensor, wrap
from ._lower import TABLE, shape

T = torch.Tensor


def _contiguous(x, memory_format=None):
    """``x`` itself when it is laid out contiguously (as PyTorch returns
    it), else a copy."""
    if type(x) is not LazyTensor:
        return NotImplemented
    return x if _views.contiguous(x) else wrap(x._t)


def detach_view(x):
    """``x.detach()`` and ``x.data``: the value without its gradient
    history, sharing ``x``'s memory (a write to it writes ``x``)."""
    out = wrap(x._t.unary("detach"))
    _views.mark_view(out, x, _views.DETACH)
    return out


def view_functions() -> dict:
    """Function -> ``(lowering, kind)`` for the fast path's table: kind
    ``("view", rule)`` marks the result a view when ``rule`` (``""``
    always, ``"index"`` basic indices, ``"contiguous"`` a contiguous
    operand) says so."""
    always, contig = ("view", ""), ("view", "contiguous")
    f = {T.__getitem__: (shape.getitem, ("view", "index")), T.view: (_views.reshape, always)}
    for g in (T.reshape, torch.reshape):
        f[g] = (_views.reshape, contig)
    for g in (T.flatten, torch.flatten):
        f[g] = (TABLE["flatten"], contig)
    for n in ("unsqueeze", "squeeze", "transpose", "t", "split", "chunk"):
        for g in (getattr(T, n), getattr(torch, n)):
            f[g] = (TABLE[n], always)
    for g in (T.permute, torch.permute):
        f[g] = (_views.permute, always)
    f[T.expand] = (_views.expand, always)
    f[T.contiguous] = (_contiguous, ("raw", ""))
    return f
