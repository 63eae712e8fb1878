"""``lazyfuse.custom_op``: a StableHLO kernel as an op on the lazyfuse device."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from . import _C
from ._core import LazyfuseError, LazyTensor, dtype_name, set_site, where, wrap

Spec = Tuple[Sequence[int], torch.dtype]


def custom_op(
    name: str,
    text: str,
    params: Sequence[Spec],
    result: Spec,
    grad: Optional[Callable] = None,
) -> Callable[..., torch.Tensor]:
    """A StableHLO function (text whose entry is ``func.func @main``, alone
    or in a module, as ``jax.jit(f).lower(...).as_text()`` prints it) as an
    op on tensors on the lazyfuse device, of operand shapes and dtypes
    ``params`` (``[(shape, dtype), ...]``) and result ``result``.

    It records like any op: it fuses with its neighbours, caches, and runs
    op by op under ``LAZYFUSE_FUSION=0``. ``grad(inputs, output,
    grad_output)``, when given, returns each input's gradient (or ``None``)
    written with torch ops on the lazyfuse device, so ``backward()`` goes
    through the kernel. The text is compiled once here: a malformed module
    raises ``LazyfuseError`` naming this call's line.
    """
    set_site(name)
    cgrad = None
    if grad is not None:

        def cgrad(xs, y, g):
            out = grad([wrap(x) for x in xs], wrap(y), wrap(g))
            return [None if o is None else o._t for o in out]

    spec = lambda s: (list(s[0]), dtype_name(s[1]))  # noqa: E731
    op = _C.custom_op(name, text, [spec(p) for p in params], spec(result), cgrad)

    def call(*xs: torch.Tensor) -> torch.Tensor:
        for x in xs:
            if type(x) is not LazyTensor:
                raise LazyfuseError(
                    f"custom op {name} takes tensors on the lazyfuse device, got one on"
                    f" {x.device} (at {where()})"
                )
        set_site(name)
        return wrap(op([x._t for x in xs]))

    call.__name__ = name
    return call
