"""``torch.compile(model, backend="lazyfuse")``.

Built on ``aot_autograd`` with PyTorch's core ATen decompositions: Dynamo
captures the program, AOTAutograd splits it into forward and backward ATen
graphs, and each graph is lowered node by node onto the runtime through the
same lowering table as the fused eager device. Each call records the
graph's ops; the runtime fuses them and serves the compiled executable from
its cache, so a new call compiles nothing, and a new input size compiles
once per dynamic-shape bucket. Inputs on the CPU give CPU outputs (as
inductor does); parameters are uploaded once and kept while their version
is unchanged. A node with no lowering runs on the CPU with a warning naming
it: a graph break inside the graph, never a wrong answer.
"""

from __future__ import annotations

import operator
import re
import warnings
import weakref

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import _C
from ._core import LazyTensor, download, upload
from ._dispatch import LazyfuseFallbackWarning
from ._lower import H, lookup
from ._mode import skip_device_ops_in_dynamo

# Ops on ``LazyTensor``s run as the fused eager device under any compiled
# function: Dynamo skips them instead of tracing them.
skip_device_ops_in_dynamo()


def _on_device(mod, args, kwargs) -> bool:
    """True when a compiled module's call involves the device: an input
    ``LazyTensor``, or parameters moved there."""
    for a in args:
        if type(a) is LazyTensor:
            return True
    for a in kwargs.values():
        if type(a) is LazyTensor:
            return True
    p = next(mod.parameters(), None)
    return type(p) is LazyTensor


def _device_models_run_fused_eager() -> None:
    """``torch.compile(model)`` of a model on the device calls the model
    itself: the fused eager device already records, fuses and caches whole
    steps, while Dynamo cannot stand a FakeTensor in for a ``LazyTensor``
    (it holds a runtime handle) and its guards would read PyTorch's C++
    view of one (a meta tensor). Models and inputs on the CPU are compiled
    by Dynamo and this backend as before."""
    from torch._dynamo.eval_frame import OptimizedModule

    if getattr(OptimizedModule.__call__, "_lazyfuse", False):
        return
    compiled_call = OptimizedModule.__call__

    def __call__(self, *args, **kwargs):
        if _on_device(self._orig_mod, args, kwargs):
            return self._orig_mod(*args, **kwargs)
        return compiled_call(self, *args, **kwargs)

    __call__._lazyfuse = True
    OptimizedModule.__call__ = __call__


_device_models_run_fused_eager()

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _site(node) -> "_C.Site":
    """The user's line that recorded ``node`` (from Dynamo's stack trace)."""
    st = node.meta.get("stack_trace") or ""
    from ._core import _SKIP

    frames = [f for f in _FRAME.findall(st) if not f[0].startswith(_SKIP)]
    target = getattr(node.target, "_opname", str(node.target))
    if frames:
        f, line = frames[-1]
        return _C.Site(f, int(line), f"aten::{target}")
    return _C.Site("<compiled graph>", 0, f"aten::{target}")


class _Uploads:
    """Device copies of CPU inputs, kept while the tensor lives and its
    version (bumped by every in-place write) is unchanged: parameters are
    uploaded once, not every call."""

    def __init__(self):
        self._by_id: dict = {}

    def get(self, t: torch.Tensor):
        key = id(t)
        hit = self._by_id.get(key)
        v = t._version
        if hit is not None:
            ref, version, shape, h = hit
            if ref() is t and version == v and shape == t.shape:
                return h
        h = upload(t)
        try:
            ref = weakref.ref(t, lambda _r, k=key: self._by_id.pop(k, None))
        except TypeError:
            return h
        self._by_id[key] = (ref, v, t.shape, h)
        return h

    def remember(self, t: torch.Tensor, h) -> None:
        """``h`` is ``t``'s device value already (``t`` is a compiled
        result handed over in place, its memory ``h``'s): feeding ``t`` back
        in, as AOT's backward graph does with saved activations, uploads
        nothing while ``t`` is unchanged."""
        key = id(t)
        ref = weakref.ref(t, lambda _r, k=key: self._by_id.pop(k, None))
        self._by_id[key] = (ref, t._version, t.shape, h)


_UPLOADS = _Uploads()


class LoweredGraph:
    """One ATen FX graph, run by recording its nodes on the runtime."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.nodes = []
        self.placeholders = []
        self.constants = []
        self._uploaded = False
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                # Each input is an upload site of its own: sizes that vary
                # from call to call bucket there.
                site = _C.Site(f"<lazyfuse graph {id(gm):x}>", len(self.placeholders), n.name)
                self.placeholders.append((n, site))
            elif n.op == "get_attr":
                # A constant of the graph: uploaded at the first call (the
                # backend runs under fake tensors), then kept.
                self.constants.append((n, getattr(gm, n.target)))
            elif n.op == "call_function":
                low = lookup(n.target) if isinstance(n.target, torch._ops.OpOverload) else None
                if low is None and not isinstance(n.target, torch._ops.OpOverload):
                    low = _python_call(n.target)
                if low is None and n.target is not operator.getitem:
                    warnings.warn(
                        f"lazyfuse: {n.target} has no lowering; it runs on the CPU"
                        " (a graph break)",
                        LazyfuseFallbackWarning,
                        stacklevel=2,
                    )
                self.nodes.append((n, low, _site(n)))
            elif n.op == "output":
                self.output = n

    def __call__(self, *args):
        if self.constants and not self._uploaded:
            self.constants = [
                (n, upload(v) if isinstance(v, torch.Tensor) else v) for n, v in self.constants
            ]
            self._uploaded = True
        env = dict(self.constants)
        on_device = False
        for (n, site), a in zip(self.placeholders, args):
            if type(a) is LazyTensor:
                env[n] = a._t
                on_device = True
            elif isinstance(a, torch.Tensor):
                _C.set_site(site)
                env[n] = _UPLOADS.get(a)
            else:
                env[n] = a
        was = torch.is_grad_enabled()
        _C.set_grad_enabled(False)
        try:
            for n, low, site in self.nodes:
                _C.set_site(site)
                a = torch.fx.node.map_arg(n.args, env.__getitem__)
                k = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
                if n.target is operator.getitem:
                    env[n] = a[0][a[1]]
                    continue
                r = low(*a, **k) if low is not None else None
                env[n] = r if r is not None else _cpu_node(n.target, a, k)
        finally:
            _C.set_site(None)
            _C.set_grad_enabled(was)
        outs = torch.fx.node.map_arg(self.output.args[0], env.__getitem__)
        if on_device:
            return tuple(_wrap(o) if type(o) is H else o for o in outs)
        # An input returned as it is (AOT's forward saving it for the
        # backward) is the caller's own tensor, as in eager PyTorch. Results
        # the call made, each returned once, go to PyTorch without a copy
        # when nothing else in the runtime reaches them (the graph's other
        # handles die at return); a constant returned, or a value returned
        # twice, is copied, so writing a result cannot change what lazyfuse
        # holds.
        inputs = {
            id(env[n]): a
            for (n, _), a in zip(self.placeholders, args)
            if type(env[n]) is H and isinstance(a, torch.Tensor)
        }
        held = {id(v) for v in env.values() if type(v) is H}
        made = held - {id(env[n]) for n, _ in self.placeholders if type(env[n]) is H}
        made -= {id(env[n]) for n, _ in self.constants if type(env.get(n)) is H}
        del env
        return tuple(
            (inputs[id(o)] if id(o) in inputs else _to_cpu(o, made)) if type(o) is H else o
            for o in outs
        )


def _python_call(target):
    """Arithmetic on sizes (``operator.mul`` on SymInts, ``sym_float``...):
    plain Python on plain numbers."""

    def call(*args, **kwargs):
        if any(type(a) is H for a in args):
            return None
        return target(*args, **kwargs)

    return call


def _to_cpu(h, made: set) -> torch.Tensor:
    """A CPU tensor of result ``h``: its memory itself when ``h`` was made
    by this call (``made``, ids; each id taken once) and nothing else in
    the runtime can reach it (remembered as its upload: ``h`` is read only
    while the tensor is unchanged), else a copy."""
    if id(h) in made:
        made.discard(id(h))
        cap = _C.dlpack_if_sole(h)
        if cap is not None:
            t = torch.from_dlpack(cap)
            _UPLOADS.remember(t, h)
            return t
    return download(h)


def _wrap(h):
    from ._core import wrap

    return wrap(h)


def _cpu_node(target, args, kwargs):
    """Runs one node on the CPU: downloads its runtime inputs, uploads its
    results."""

    def to_cpu(x):
        return download(x) if type(x) is H else x

    cargs, ckw = torch.utils._pytree.tree_map(to_cpu, (args, kwargs))
    if isinstance(ckw.get("device"), torch.device) and ckw["device"].type != "cpu":
        ckw["device"] = torch.device("cpu")
    out = target(*cargs, **ckw)
    return torch.utils._pytree.tree_map(
        lambda x: upload(x) if isinstance(x, torch.Tensor) else x, out
    )


def _compile(gm: torch.fx.GraphModule, example_inputs):
    # Boxed: AOTAutograd passes one list and frees inputs as they are used.
    return make_boxed_func(LoweredGraph(gm))


lazyfuse_backend = aot_autograd(
    fw_compiler=_compile,
    bw_compiler=_compile,
    decompositions=core_aten_decompositions(),
)
"""The ``torch.compile`` backend, registered as ``"lazyfuse"`` by the
package's ``torch_dynamo_backends`` entry point."""
