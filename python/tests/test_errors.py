"""Bad input is a Python exception naming the user's line, and an op with
no lowering is a graph break with a warning, never a crash or a wrong
answer."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyfuse


def line_of(marker):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, l in enumerate(src) if marker in l and "line_of" not in l)


def test_shape_error_names_the_users_line():
    a = torch.ones(2, 3, device="lazyfuse")
    b = torch.ones(4, 5, device="lazyfuse")
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        a @ b  # MATMUL-LINE
    assert f"test_errors.py:{line_of('MATMUL-LINE')}" in str(e.value)


def test_device_mix_is_an_error_naming_the_line():
    a = torch.ones(3, device="lazyfuse")
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        torch.cat([a, torch.ones(3)])  # MIX-LINE
    assert "lazyfuse device" in str(e.value)
    assert f"test_errors.py:{line_of('MIX-LINE')}" in str(e.value)


def test_unsupported_dtype_is_an_error():
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        torch.ones(2, dtype=torch.complex64).to("lazyfuse")
    assert "complex64" in str(e.value)


def test_an_op_without_lowering_runs_on_the_cpu_with_a_warning():
    x = torch.tensor([3.0, 1.0, 2.0])
    with pytest.warns(lazyfuse.LazyfuseFallbackWarning, match="sort"):
        got = torch.sort(x.to("lazyfuse")).values
    assert got.tolist() == [1.0, 2.0, 3.0]


def test_an_op_without_lowering_cannot_carry_gradients():
    x = torch.tensor([3.0, 1.0, 2.0]).to("lazyfuse").requires_grad_()
    with pytest.raises(lazyfuse.LazyfuseError, match="require grad"):
        torch.sort(x * 2)


def test_fusion_off_gives_the_same_bits():
    """LAZYFUSE_FUSION=0 runs op by op; with LAZYFUSE_STRICT_FP=1 (no fused
    multiply-add, as in Rust) elementwise answers are the fused ones, bit
    for bit. (A reduction fused with its producer may sum in another order.)"""
    prog = textwrap.dedent(
        """
        import torch, lazyfuse
        torch.manual_seed(0)
        x = torch.randn(64, 33)
        w = torch.randn(33)
        d = x.to("lazyfuse")
        y = ((d * w.to("lazyfuse")).tanh() + d.exp() * 0.5 - d.sigmoid()).relu()
        bits = y.cpu().numpy().tobytes().hex()
        print(lazyfuse.counters()["regions_executed"], bits)
        """
    )
    outs = {}
    for fusion in ("1", "0"):
        env = {k: v for k, v in os.environ.items() if k != "LAZYFUSE_FUSION"}
        env.update(LAZYFUSE_FUSION=fusion, LAZYFUSE_STRICT_FP="1")
        r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True,
                           check=True)
        regions, bits = r.stdout.split()
        outs[fusion] = (int(regions), bits)
    assert outs["1"][1] == outs["0"][1]
    assert outs["0"][0] > outs["1"][0], outs
