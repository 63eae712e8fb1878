"""ATen ops lowered onto the runtime's ops: one table, used by the fused
eager device (``__torch_dispatch__``) and by the ``torch.compile`` backend
(an FX graph of ATen ops).

A lowering takes the op's arguments with every tensor already a runtime
handle (``_C.Tensor``) and returns handles (or a tuple or list of them).
It composes runtime ops only: recording, fusion, autograd and execution
stay in Rust. Lowerings follow PyTorch's semantics (type promotion,
broadcasting, negative dims, ``alpha=``), so answers match PyTorch's CPU
eager; an op with no lowering is a graph break, never a wrong answer.
"""

from __future__ import annotations

import torch

from .. import _C
from .._core import FLOATS, INTS, NAME_TO_TORCH, TORCH_TO_NAME

H = _C.Tensor
TABLE: dict = {}


def lowering(*names):
    """Registers ``fn`` for the ATen ops ``names`` (an overload packet such
    as ``"add"`` covers every overload; ``"max.dim"`` one overload)."""

    def deco(fn):
        for n in names:
            TABLE[n] = fn
        return fn

    return deco


def lookup(func):
    """The lowering of ATen op ``func`` (an ``OpOverload``), or None."""
    name = func._opname
    return TABLE.get(f"{name}.{func._overloadname}") or TABLE.get(name)


# --- dtypes and scalars -------------------------------------------------------


def default_float() -> str:
    return TORCH_TO_NAME[torch.get_default_dtype()]


_CATEGORY = {"float32": 2, "float64": 2, "bfloat16": 2, "float16": 2,
             "int32": 1, "int64": 1, "uint8": 1, "bool": 0}
_KIND = {bool: 0, int: 1, float: 2}


def category(d: str) -> int:
    return _CATEGORY[d]


def scalar_kind(v) -> int:
    k = _KIND.get(type(v))
    if k is None:
        k = 0 if isinstance(v, bool) else 1 if isinstance(v, int) else 2
    return k


def promote(*xs) -> str:
    """PyTorch's result dtype for operands ``xs`` (handles and Python
    scalars): dimensioned tensors over 0-dim ones over scalars, unless a
    lower-priority operand has a higher category (float over int over bool)."""
    dims, zero, scal = [], [], []
    for x in xs:
        if type(x) is H:
            (dims if x.shape else zero).append(x.dtype)
        elif x is not None:
            scal.append(scalar_kind(x))
    top = max(
        [category(d) for d in dims + zero] + scal,
        default=2,
    )
    for group in (dims, zero):
        ds = [d for d in group if category(d) == top]
        if ds:
            r = NAME_TO_TORCH[ds[0]]
            for d in ds[1:]:
                r = torch.promote_types(r, NAME_TO_TORCH[d])
            return TORCH_TO_NAME[r]
    return {2: default_float(), 1: "int64", 0: "bool"}[top]


def cast(x, d: str):
    """Handle ``x`` converted to dtype ``d`` (a no-op when it already is)."""
    return x if x.dtype == d else x.to_dtype(d)


def const(v, d: str):
    """A rank-0 handle holding scalar ``v`` as dtype ``d``."""
    return _C.full(float(v), (), d)


def tensor_of(x, d: str):
    """``x`` (a handle or a scalar) as a handle of dtype ``d``."""
    return cast(x, d) if type(x) is H else const(x, d)


def dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def dims_list(d, rank: int):
    """``dim=`` arguments (None, an int, a list) as a list of non-negative
    axes, or None for all."""
    if d is None:
        return None
    if isinstance(d, int):
        d = [d]
    if len(d) == 0:
        return None
    return [dim(int(a), max(rank, 1)) for a in d]


# Register the lowerings.
from . import bag, elementwise, factory, more, nn, reduce, shape  # noqa: E402,F401
