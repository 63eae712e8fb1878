"""The wrapper tensor and the conversions every other module uses.

A ``LazyTensor`` is a ``torch.Tensor`` wrapper subclass on the ``lazyfuse``
device holding a handle (``_t``) to a tensor of the Rust runtime. The Rust
tensor is an immutable value; an in-place op swaps the handle. PyTorch's
own autograd never sees a ``LazyTensor`` (its torch-level ``requires_grad``
stays False): gradients are the runtime's, recorded with the forward ops.
"""

from __future__ import annotations

import os

import torch

from . import _C

DEVICE_NAME = "lazyfuse"
# The device string: PyTorch's out-of-tree device slot, renamed.
if torch._C._get_privateuse1_backend_name() == "privateuseone":
    torch.utils.rename_privateuse1_backend(DEVICE_NAME)
# ``x.device`` answers ``lazyfuse:0`` (the function mode intercepts the
# property), but to PyTorch's C++ a ``LazyTensor`` is a meta tensor: a
# device C++ knows, with no storage, so device guards and checks pass on
# the way to ``__torch_dispatch__`` without a C++ extension.

TORCH_TO_NAME = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
NAME_TO_TORCH = {v: k for k, v in TORCH_TO_NAME.items()}
FLOATS = {"float32", "float64", "bfloat16", "float16"}
INTS = {"int32", "int64", "uint8"}


class LazyfuseError(_C.LazyfuseError):
    """Raised for what lazyfuse cannot do (an op it has no lowering for, a
    mix of devices, an unsupported dtype); the message names the user's line."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return TORCH_TO_NAME[dtype]
    except KeyError:
        raise LazyfuseError(
            f"lazyfuse has no dtype {dtype} (it has {', '.join(TORCH_TO_NAME.values())})"
            f" at {where()}"
        ) from None


class LazyTensor(torch.Tensor):
    """A tensor on the ``lazyfuse`` device: ops on it are recorded, fused and
    compiled by the runtime; reading it (``.item()``, ``.cpu()``, ``print``)
    is a sync point."""

    __slots__ = ("_t",)
    # View aliasing (``_views``): a view's root, step chain and layout, and
    # a root's weak references to its live views; set on the instance's
    # ``__dict__`` only for views and for tensors that have some.
    _view = None
    _views = None
    # ``x.grad``'s tensor (one per parameter), and on it a weak reference
    # to the parameter whose gradient it is (``_mode._grad_get``).
    _grad_w = None
    _grad_of = None
    # Functions are intercepted by the device's TorchFunctionMode; the
    # subclass itself adds no per-call hook.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from ._dispatch import dispatch

        return dispatch(func, args, kwargs or {})

    def __deepcopy__(self, memo):
        """A copy (``copy.deepcopy(model)``): the same immutable value
        behind a new tensor, a leaf that requires grad as this one does,
        its gradient copied too, as PyTorch's deep copy gives."""
        if id(self) in memo:
            return memo[id(self)]
        t = self._t
        h = t.unary("detach")
        if t.requires_grad:
            h.set_requires_grad(True)
            g = t.grad()
            if g is not None:
                h.set_grad(g)
        out = memo[id(self)] = wrap(h)
        return out

    def __reduce_ex__(self, protocol):
        """Pickling (``torch.save``) writes the value as a CPU tensor, as
        torch_xla's ``xm.save`` does: the checkpoint loads anywhere (with
        ``weights_only``), and ``load_state_dict`` copies it back onto the
        device. A sync point."""
        cpu = download(self._t)
        if self._t.requires_grad:
            cpu.requires_grad_(True)
        return cpu.__reduce_ex__(protocol)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export (``torch.from_dlpack``, ``numpy.from_dlpack``): the
        value on the CPU, lent in place where the runtime keeps it in host
        memory, else copied. A sync point. The memory is the runtime's
        immutable value: read it, do not write it."""
        if self.requires_grad:
            raise RuntimeError(
                "Can't export tensors that require gradient, use tensor.detach()"
            )
        return self._t.__dlpack__(
            stream=stream, max_version=max_version, dl_device=dl_device, copy=copy
        )

    def __dlpack_device__(self):
        """``(kDLCPU, 0)``: exported values are host memory."""
        return self._t.__dlpack_device__()


# Wrapping (``wrap``) and finding the user's line (``set_site``, ``where``)
# run in Rust, on every op: see ``python/src/fast.rs``.
_PKG = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP = (_PKG, _TORCH, "<frozen", "<string>")
_META = torch.device("meta")
_C.install(
    LazyTensor,
    torch.Tensor._make_wrapper_subclass,
    {name: dt for dt, name in TORCH_TO_NAME.items()},
    torch.strided,
    _META,
    torch.Tensor,
    torch.is_grad_enabled,
    list(_SKIP),
)

wrap = _C.wrap
"""``wrap(h)``: the ``LazyTensor`` around runtime handle ``h``."""


def upload(x: torch.Tensor):
    """A runtime handle holding a copy of CPU tensor ``x``."""
    if x.device.type != "cpu":
        x = x.cpu()
    x = x.detach()
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    x = x.contiguous()
    return _C.from_buffer(
        x.data_ptr(), x.numel() * x.element_size(), tuple(x.shape), dtype_name(x.dtype)
    )


def download(h) -> torch.Tensor:
    """A CPU tensor with the values of handle ``h`` (a sync point)."""
    out = torch.empty(h.shape, dtype=NAME_TO_TORCH[h.dtype])
    _C.read_into(h, out.data_ptr(), out.numel() * out.element_size())
    return out


# --- the user's line ------------------------------------------------------

set_site = _C.set_site_here
"""``set_site(op)``: declares the user's Python line (the innermost frame
outside this package and PyTorch) as the site of the ops recorded next for
PyTorch op ``op``: errors, output selection and dynamic-shape buckets key
on it."""


def where() -> str:
    """``file:line`` of the user's Python line, for error messages."""
    w = _C.user_line()
    return "<unknown>" if w is None else f"{w[0]}:{w[1]}"


# --- grad mode --------------------------------------------------------------

def sync_grad_mode() -> None:
    """Mirrors ``torch.is_grad_enabled()`` into the runtime."""
    _C.set_grad_enabled(torch.is_grad_enabled())
