"""Tensor factories and random draws. Random values come from the device's
generator (seeded by ``torch.manual_seed``), drawn on the device: a new
draw never recompiles. They are not PyTorch's CPU stream."""

from __future__ import annotations

import math

import torch

from . import H, cast, const, default_float, lowering
from .. import _C
from .._core import FLOATS, TORCH_TO_NAME


def _dt(dtype, default=None):
    if dtype is None:
        return default or default_float()
    return TORCH_TO_NAME[dtype]


def _size(size):
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = size[0]
    return tuple(int(s) for s in size)


def full(size, value, dtype=None, **_):
    if dtype is None:
        dtype_name = (
            "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else default_float()
        )
    else:
        dtype_name = _dt(dtype)
    return _C.full(float(value), _size(size), dtype_name)


lowering("full")(full)


@lowering("zeros", "empty.memory_format", "empty", "empty_strided", "empty_permuted")
def zeros(size, *rest, dtype=None, **_):
    return _C.full(0.0, _size(size), _dt(dtype))


@lowering("ones")
def ones(size, dtype=None, **_):
    return _C.full(1.0, _size(size), _dt(dtype))


@lowering("scalar_tensor")
def scalar_tensor(v, dtype=None, **_):
    return _C.full(float(v), (), _dt(dtype))


@lowering("zeros_like", "empty_like")
def zeros_like(x, dtype=None, **_):
    return _C.full(0.0, x.shape, _dt(dtype, x.dtype))


@lowering("ones_like")
def ones_like(x, dtype=None, **_):
    return _C.full(1.0, x.shape, _dt(dtype, x.dtype))


@lowering("full_like")
def full_like(x, value, dtype=None, **_):
    return _C.full(float(value), x.shape, _dt(dtype, x.dtype))


@lowering("new_zeros", "new_empty", "new_empty_strided")
def new_zeros(x, size, *rest, dtype=None, **_):
    return _C.full(0.0, _size(size), _dt(dtype, x.dtype))


@lowering("new_ones")
def new_ones(x, size, dtype=None, **_):
    return _C.full(1.0, _size(size), _dt(dtype, x.dtype))


@lowering("new_full")
def new_full(x, size, value, dtype=None, **_):
    return _C.full(float(value), _size(size), _dt(dtype, x.dtype))


@lowering("arange")
def arange(*args, dtype=None, start=None, end=None, step=None, **_):
    nums = [a for a in args if isinstance(a, (int, float))]
    if start is None and end is None and step is None:
        start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums + [1])[:3]
    else:
        # The keyword form, torch.arange(start=0, end=n): positionals first.
        given = dict(zip(("start", "end", "step"), nums))
        given.update({k: v for k, v in (("start", start), ("end", end), ("step", step)) if v is not None})
        start, end, step = given.get("start", 0), given["end"], given.get("step", 1)
    if dtype is None:
        dtype_name = "int64" if all(isinstance(v, int) for v in (start, end, step)) else default_float()
    else:
        dtype_name = _dt(dtype)
    return _C.arange(float(start), float(end), float(step), dtype_name)


# --- random draws -------------------------------------------------------------


def uniform(shape, dtype, low=0.0, high=1.0):
    work = dtype if dtype in FLOATS else "float32"
    u = _C.rand(tuple(shape), work)
    if low != 0.0 or high != 1.0:
        u = u.binary("mul", high - low).binary("add", low)
    return cast(u, dtype)


def normal(shape, dtype, mean=0.0, std=1.0):
    """Box-Muller over two uniform draws."""
    work = dtype if dtype in ("float32", "float64") else "float32"
    u1 = _C.rand(tuple(shape), work)
    u2 = _C.rand(tuple(shape), work)
    r = const(1.0, work).binary("sub", u1).unary("log").binary("mul", -2.0).unary("sqrt")
    z = r.binary("mul", u2.binary("mul", 2 * math.pi).unary("cos"))
    if std != 1.0:
        z = z.binary("mul", std)
    if mean != 0.0:
        z = z.binary("add", mean)
    return cast(z, dtype)


@lowering("rand")
def rand(size, *_, dtype=None, **__):
    return uniform(_size(size), _dt(dtype))


@lowering("randn")
def randn(size, *_, dtype=None, **__):
    return normal(_size(size), _dt(dtype))


@lowering("rand_like")
def rand_like(x, dtype=None, **_):
    return uniform(x.shape, _dt(dtype, x.dtype))


@lowering("randn_like")
def randn_like(x, dtype=None, **_):
    return normal(x.shape, _dt(dtype, x.dtype))


@lowering("randint")
def randint(*args, dtype=None, **_):
    if len(args) == 2:
        low, high, size = 0, args[0], args[1]
    else:
        low, high, size = args[0], args[1], args[2]
    u = _C.rand(_size(size), "float64")
    v = u.binary("mul", float(high - low)).unary("floor").binary("add", float(low))
    return cast(v, _dt(dtype, "int64"))


@lowering("bernoulli.p")
def bernoulli_p(x, p=0.5, generator=None):
    return cast(uniform(x.shape, "float32").binary("lt", p), x.dtype)


@lowering("bernoulli.default", "bernoulli")
def bernoulli(x, generator=None):
    if type(x) is not H:
        return None
    return cast(uniform(x.shape, "float32").binary("lt", cast(x, "float32")), x.dtype)


@lowering("normal_functional")
def normal_functional(x, mean=0.0, std=1.0, generator=None):
    return normal(x.shape, x.dtype, mean, std)


@lowering("uniform")
def uniform_functional(x, low=0.0, high=1.0, generator=None):
    return uniform(x.shape, x.dtype, low, high)


@lowering("_to_copy", "to")
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None, copy=False):
    if device is not None and torch.device(device).type not in ("lazyfuse", "meta"):
        return None  # leaving the device: the caller downloads
    return x if dtype is None else cast(x, TORCH_TO_NAME[dtype])


@lowering("convert_element_type")
def convert_element_type(x, dtype):
    """``prims.convert_element_type`` (what decompositions leave for a cast)."""
    return cast(x, TORCH_TO_NAME[dtype])
