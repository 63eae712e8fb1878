"""lazyfuse for PyTorch: a fused eager device and a ``torch.compile`` backend.

After ``import lazyfuse``, ``x.to("lazyfuse")``, ``model.to("lazyfuse")`` and
``torch.ones(3, device="lazyfuse")`` put tensors on the lazyfuse device:
plain eager PyTorch code runs there unmodified, each op recorded by the
Rust runtime, fused and compiled by XLA at the next read (``.item()``,
``.cpu()``, ``print``). ``torch.compile(model, backend="lazyfuse")`` lowers
the traced ATen graph onto the same runtime.
"""

from __future__ import annotations

import types as _types

import torch

from . import _C
from ._core import LazyTensor, download, upload, wrap
from ._custom import custom_op
from ._dispatch import LazyfuseFallbackWarning
from ._mode import LazyfuseMode
from ._views import LazyfuseViewWarning
from . import _module  # noqa: F401  (model.to keeps tied weights tied)

__all__ = [
    "LazyTensor",
    "LazyfuseError",
    "LazyfuseFallbackWarning",
    "LazyfuseViewWarning",
    "counters",
    "custom_op",
    "device",
    "disable",
    "enable",
    "metrics_report",
    "recompiles",
    "sync",
]

LazyfuseError = _C.LazyfuseError


def device(index: int = 0) -> torch.device:
    """The lazyfuse device, ``torch.device("lazyfuse:0")``."""
    return torch.device("lazyfuse", index)


def sync() -> None:
    """Runs everything recorded so far and waits for it."""
    _C.sync()


def counters() -> dict:
    """The runtime's counters: ``compiles``, ``cache_hits``, ``flushes``,
    ``recompiles``, ``ops_recorded``, transfers, ..."""
    return _C.counters()


def metrics_report() -> str:
    """The runtime's metrics report (as the Rust ``metrics::report()``)."""
    return _C.report()


def recompiles() -> list:
    """The recent recompiles, each with its cause, the line that recorded
    it and what changed."""
    return _C.recompiles()


# --- the device -----------------------------------------------------------------

_MODE = LazyfuseMode()
_enabled = [False]


def enable() -> None:
    """Turns the device on (done at import): pushes the function mode that
    sees ``device="lazyfuse"``, ``.to()`` and autograd calls."""
    if not _enabled[0]:
        _MODE.__enter__()
        _enabled[0] = True


def disable() -> None:
    """Turns the device off, so plain CPU code pays nothing for it."""
    if _enabled[0]:
        _MODE.__exit__(None, None, None)
        _enabled[0] = False


def _device_module():
    m = _types.ModuleType("torch.lazyfuse")
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m.manual_seed = lambda seed: _C.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    m.manual_seed_all = m.manual_seed
    m.synchronize = lambda device=None: _C.sync()
    return m


if not hasattr(torch, "lazyfuse"):
    torch._register_device_module("lazyfuse", _device_module())
enable()
