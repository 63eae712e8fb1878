"""Differential fuzzing: random programs of PyTorch ops on the lazyfuse
device (fused) against PyTorch's CPU eager. ``LAZYFUSE_PY_FUZZ_CASES``
sets the number of programs (small by default, for CI)."""

import os
import random

import pytest
import torch

CASES = int(os.environ.get("LAZYFUSE_PY_FUZZ_CASES", "40"))

UNARY = [
    torch.tanh, torch.sigmoid, torch.relu, torch.neg, torch.abs, torch.sin, torch.cos, torch.erf,
    lambda x: x.exp().clamp(max=50.0), lambda x: x.abs().add(1e-3).log(),
    lambda x: x.abs().sqrt(), lambda x: torch.nn.functional.gelu(x), lambda x: x.square(),
    lambda x: x.softmax(-1), lambda x: x - x.mean(-1, keepdim=True),
    lambda x: torch.where(x > 0, x, x * 0.1), lambda x: x.clamp(-1.0, 1.0),
]
BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum,
          lambda a, b: a / (b.abs() + 0.5), lambda a, b: torch.lerp(a, b, 0.25)]
REDUCE = [lambda x: x.sum(-1), lambda x: x.mean(0), lambda x: x.amax(-1),
          lambda x: x.logsumexp(-1), lambda x: x.var(-1)]


def program(rng):
    """A random straight-line program over two inputs of one shape."""
    steps = []
    for _ in range(rng.randint(2, 9)):
        k = rng.random()
        if k < 0.45:
            steps.append(("u", rng.randrange(len(UNARY)), rng.randrange(2)))
        elif k < 0.85:
            steps.append(("b", rng.randrange(len(BINARY)), rng.randrange(2), rng.randrange(2)))
        else:
            steps.append(("t",))
    steps.append(("r", rng.randrange(len(REDUCE))))
    return steps


def run(steps, a, b):
    vals = [a, b]
    for s in steps:
        if s[0] == "u":
            vals[s[2]] = UNARY[s[1]](vals[s[2]])
        elif s[0] == "b":
            vals[s[2]] = BINARY[s[1]](vals[s[2]], vals[s[3]])
        else:
            vals = [v.transpose(0, 1).contiguous().transpose(0, 1) for v in vals]
    return REDUCE[steps[-1][1]](vals[0] + vals[1])


@pytest.mark.parametrize("seed", range(CASES))
def test_random_programs_match_cpu_eager(seed):
    rng = random.Random(seed)
    steps = program(rng)
    shape = (rng.randint(1, 9), rng.randint(1, 17))
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    want = run(steps, a, b)
    got = run(steps, a.to("lazyfuse"), b.to("lazyfuse")).cpu()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5, equal_nan=True,
                               msg=lambda m: f"{m}\nprogram {steps} on {shape}")


def test_the_same_programs_agree_with_fusion_off():
    """The fuzzer again in a process with ``LAZYFUSE_FUSION=0`` (read at
    start-up): op-by-op execution agrees with PyTorch too."""
    import subprocess
    import sys

    if os.environ.get("LAZYFUSE_FUSION") == "0":
        pytest.skip("already the unfused run")
    env = dict(os.environ, LAZYFUSE_FUSION="0")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "random_programs"],
        env=env, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:]
