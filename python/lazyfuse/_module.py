"""``model.to("lazyfuse")`` keeps tied parameters tied, and an optimizer
step on lazyfuse parameters ends the step's graph.

PyTorch moves a parameter to a device it cannot share storage with by
making a new ``Parameter`` per module, so a weight two modules share (tied
embeddings) would become two. The package wraps ``nn.Module.to`` to tie
them again: parameters (and buffers) that were one object before the move
are one after it.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _C
from ._core import LazyTensor
from ._mode import is_ours

_orig_to = torch.nn.Module.to


def _slots(model):
    """(module, kind, name, id of the tensor) for every parameter and
    buffer slot, shared ones included."""
    out = []
    for mod in model.modules():
        for kind, d in (("_parameters", mod._parameters), ("_buffers", mod._buffers)):
            for name, t in d.items():
                if t is not None:
                    out.append((mod, kind, name, id(t)))
    return out


def to(self, *args, **kwargs):
    dev = torch._C._nn._parse_to(*args, **kwargs)[0]
    if not is_ours(dev):
        return _orig_to(self, *args, **kwargs)
    before = _slots(self)
    out = _orig_to(self, *args, **kwargs)
    first = {}
    for mod, kind, name, key in before:
        t = getattr(mod, kind)[name]
        if key in first:
            getattr(mod, kind)[name] = first[key]
        else:
            first[key] = t
    return out


to.__doc__ = _orig_to.__doc__
torch.nn.Module.to = to


def _step_boundary(optimizer, args, kwargs):
    """After ``optimizer.step()`` on lazyfuse parameters: hand the step's
    graph to the runtime (without waiting), as the Rust optimizers do. A
    loop that reads nothing between steps (the loss printed every 10 steps)
    would otherwise grow one graph over many steps."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if type(p) is LazyTensor:
                _C.flush()
                return


register_optimizer_step_post_hook(_step_boundary)
