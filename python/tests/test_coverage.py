"""Every op of PyTorch's core ATen opset is either lowered onto the runtime
or listed, with its reason, as a graph break."""

import torch

from lazyfuse._lower import lookup
from lazyfuse._lower.more import UNLOWERED


def core_aten_ops():
    """Every core-tagged ATen overload. The names come from the registered
    schemas, not ``dir(torch.ops.aten)``, which lists only packets already
    loaded, so the set would depend on which tests ran first."""
    ops = []
    names = {s.name[len("aten::"):] for s in torch._C._jit_get_all_schemas()}
    for name in sorted(n for n in names if "::" not in n):
        try:
            packet = getattr(torch.ops.aten, name)
            overloads = packet.overloads()
        except Exception:
            continue
        for o in overloads:
            op = getattr(packet, o)
            if torch.Tag.core in op.tags:
                ops.append(op)
    return ops


def test_every_core_aten_op_is_lowered_or_a_listed_graph_break():
    ops = core_aten_ops()
    assert len(ops) > 150
    missing = [str(op) for op in ops if lookup(op) is None and op._opname not in UNLOWERED]
    assert not missing, f"core ATen ops neither lowered nor listed: {missing}"
    lowered = sum(lookup(op) is not None for op in ops)
    print(f"core ATen: {lowered} of {len(ops)} overloads lowered")
    # Nothing listed as a graph break has a lowering after all.
    stale = [n for n in UNLOWERED if any(op._opname == n and lookup(op) for op in ops)]
    assert not stale, stale
