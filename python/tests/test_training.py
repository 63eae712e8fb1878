"""Training in plain PyTorch on the device and under torch.compile follows
PyTorch's CPU eager loss curve, and compiles nothing after warm-up."""

import copy
import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import lazyfuse
from models import MiniGPT, batch

STEPS = 12


def cpu_curve(model, opt_fn, steps=STEPS):
    opt = opt_fn(model.parameters())
    losses = []
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=3e-3),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=3e-3, foreach=True),
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_device_training_matches_cpu_eager(opt):
    torch.manual_seed(0)
    ref = MiniGPT()
    model = copy.deepcopy(ref).to("lazyfuse")
    want = cpu_curve(ref, OPTIMIZERS[opt])
    o = OPTIMIZERS[opt](model.parameters())
    for s in range(STEPS):
        x, y = batch(s)
        o.zero_grad()
        loss = model(x.to("lazyfuse"), y.to("lazyfuse"))
        loss.backward()
        o.step()
        assert abs(loss.item() - want[s]) < 1e-4, (s, loss.item(), want[s])
    for p, q in zip(model.parameters(), ref.parameters()):
        # Adam divides by sqrt(v): last-bit gradient differences in tiny
        # entries grow over the steps, so parameters agree more loosely.
        torch.testing.assert_close(p.cpu(), q.detach(), atol=2e-3, rtol=1e-2)


def test_compiled_training_matches_cpu_eager():
    torch.manual_seed(0)
    ref = MiniGPT()
    model = copy.deepcopy(ref)
    want = cpu_curve(ref, OPTIMIZERS["adamw"])
    counter = CompileCounterWithBackend("lazyfuse")
    cm = torch.compile(model, backend=counter)
    o = OPTIMIZERS["adamw"](model.parameters())
    compiles = []
    for s in range(STEPS):
        x, y = batch(s)
        o.zero_grad()
        loss = cm(x, y)
        loss.backward()
        o.step()
        assert abs(loss.item() - want[s]) < 1e-4, (s, loss.item(), want[s])
        compiles.append((counter.frame_count, lazyfuse.counters()["compiles"]))
    # Warm-up: the first steps teach the runtime which outputs each graph
    # needs and which inputs vary; then no step compiles.
    assert compiles[-1] == compiles[-5], compiles


def test_compiled_model_on_the_device_trains_like_cpu_eager():
    """``torch.compile`` of a model moved to the device: the steps run as
    the fused eager device (Dynamo skips the device ops, without warnings
    from inside lazyfuse), follow the CPU eager loss curve, and compile
    nothing after warm-up."""
    torch.manual_seed(0)
    ref = MiniGPT()
    model = copy.deepcopy(ref).to("lazyfuse")
    want = cpu_curve(ref, OPTIMIZERS["adamw"])
    cm = torch.compile(model, backend="lazyfuse")
    o = OPTIMIZERS["adamw"](model.parameters())
    compiles = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*Dynamo does not know how to trace.*")
        for s in range(STEPS):
            x, y = batch(s)
            o.zero_grad()
            loss = cm(x.to("lazyfuse"), y.to("lazyfuse"))
            assert loss.device.type == "lazyfuse"
            loss.backward()
            o.step()
            assert abs(loss.item() - want[s]) < 1e-4, (s, loss.item(), want[s])
            compiles.append(lazyfuse.counters()["compiles"])
    assert compiles[-1] == compiles[-5], compiles


def test_compile_follows_dynamic_shape_buckets():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    cm = torch.compile(model, backend="lazyfuse", dynamic=True)
    before = lazyfuse.counters()["compiles"]
    for n in range(3, 40, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-5)
    # 13 batch sizes: far fewer executables than sizes.
    assert lazyfuse.counters()["compiles"] - before < 13


WARM = """
import sys, torch, lazyfuse
sys.path.insert(0, {here!r})
from models import MiniGPT, batch
torch.manual_seed(0)
model = MiniGPT().to("lazyfuse")
o = torch.optim.AdamW(model.parameters(), lr=3e-3)
counts = []
for s in range(12):
    x, y = batch(s)
    o.zero_grad()
    loss = model(x.to("lazyfuse"), y.to("lazyfuse"))
    loss.backward()
    o.step()
    loss.item()
    c = lazyfuse.counters()
    counts.append((c["compiles"], c["flushes"]))
print(counts)
"""


def test_device_training_compiles_nothing_after_warm_up():
    """In a fresh process: one flush per step, and no compile after the
    first steps (the optimizer's state appears at step 1, output selection
    is learned over the next ones)."""
    import ast
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", WARM.format(here=here)], capture_output=True,
                       text=True, check=True)
    counts = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    assert counts[-1][0] == counts[5][0], counts
    flushes = [b[1] - a[1] for a, b in zip(counts, counts[1:])]
    assert all(f == 1 for f in flushes[5:]), counts
