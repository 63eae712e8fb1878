"""``lazyfuse.custom_op``: a StableHLO softplus kernel on the lazyfuse
device against ``torch.nn.functional.softplus`` on the CPU (values and,
through its Python gradient, gradients), inside a training step, and its
errors naming the user's line."""

import pytest
import torch

import lazyfuse

SOFTPLUS = """
module @softplus {
  func.func public @main(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
    %e = stablehlo.exponential %x : tensor<4x3xf32>
    %y = stablehlo.log_plus_one %e : tensor<4x3xf32>
    return %y : tensor<4x3xf32>
  }
}
"""


def line_of(marker):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, l in enumerate(src) if marker in l and "line_of" not in l)


def make_softplus():
    return lazyfuse.custom_op(
        "softplus",
        SOFTPLUS,
        [((4, 3), torch.float32)],
        ((4, 3), torch.float32),
        grad=lambda xs, y, g: [g * torch.sigmoid(xs[0])],
    )


def test_values_and_gradient_match_torch():
    softplus = make_softplus()
    x = torch.linspace(-4, 4, 12).reshape(4, 3)
    xl = x.to("lazyfuse").requires_grad_()
    y = softplus(xl * 2.0) + 1.0
    (y * y).sum().backward()
    xc = x.clone().requires_grad_()
    yc = torch.nn.functional.softplus(xc * 2.0) + 1.0
    (yc * yc).sum().backward()
    torch.testing.assert_close(y.cpu(), yc.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xl.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)


def test_a_training_step_through_the_kernel():
    softplus = make_softplus()
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    wl = w.to("lazyfuse").requires_grad_()
    wc = w.clone().requires_grad_()
    for p, sp in ((wl, softplus), (wc, torch.nn.functional.softplus)):
        opt = torch.optim.SGD([p], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            loss = sp(p).sum()
            loss.backward()
            opt.step()
    torch.testing.assert_close(wl.detach().cpu(), wc.detach(), rtol=1e-5, atol=1e-5)


def test_errors_name_the_users_line():
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        lazyfuse.custom_op(  # BAD-TEXT
            "broken", "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { oops",
            [((2,), torch.float32)], ((2,), torch.float32))
    assert f"test_custom_op.py:{line_of('BAD-TEXT')}" in str(e.value)
    softplus = make_softplus()
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        softplus(torch.ones(3, 4, device="lazyfuse"))  # BAD-SHAPE
    assert f"test_custom_op.py:{line_of('BAD-SHAPE')}" in str(e.value)
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        softplus(torch.ones(4, 3))
    assert "lazyfuse device" in str(e.value)
