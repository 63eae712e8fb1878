"""The device's per-op hot path in Rust (``python/src/fast.rs``): it takes
the common calls, gives the bits the package's Python path gives, keeps
grad mode and the user's line right, and declines what it cannot take."""

import pytest
import torch
import torch.nn.functional as F

import lazyfuse
from lazyfuse import _mode



def line_of(marker):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, l in enumerate(src) if marker in l and "line_of" not in l)


def _python_path_only(monkeypatch):
    monkeypatch.setattr(_mode, "_rust_fast", lambda func, args, kwargs: NotImplemented)


def _programs():
    torch.manual_seed(0)
    f32 = torch.randn(5, 7)
    f64 = torch.randn(5, 7, dtype=torch.float64)
    i64 = torch.randint(-5, 5, (5, 7))
    b = torch.rand(5, 7) > 0.5
    s32 = torch.tensor(1.5)
    return {
        "float arithmetic with scalars": (lambda x: (x * 1.0001 + 2 - x / 3) * -x, f32),
        "reflected scalars": (lambda x: 2.0 - x + 3 * x - 1 / (x.abs() + 1), f32),
        "unary chain": (lambda x: torch.tanh(x).exp().sqrt().log() + x.sigmoid().sin().cos(), f32),
        "float64": (lambda x: torch.rsqrt(x.abs() + 1) * x - x.neg(), f64),
        "relu and friends": (lambda x: F.relu(x) + torch.relu(-x) + x.relu(), f32),
        "int tensor and float scalar promote": (lambda x: x * 1.5 + x / 2, i64),
        "int tensor and int scalar": (lambda x: x * 3 + 1 - x, i64),
        "bool arithmetic": (lambda x: (x * x) + x, b),
        "mixed float dtypes promote": (lambda x: x + x.to(torch.float64), f32),
        "0-dim operand": (lambda x: x * s32.to(x.device) + torch.maximum(x, x * 0.5), f32),
        "keywords go through the lowering": (lambda x: torch.add(x, x, alpha=2) + x.sum(-1, keepdim=True), f32),
        "views": (lambda x: x.view(35).reshape(7, 5).transpose(0, 1).permute(1, 0) * 2, f32),
    }


@pytest.mark.parametrize("name", list(_programs()))
def test_the_fast_path_gives_the_python_paths_bits_and_pytorchs_values(name, monkeypatch):
    fn, x = _programs()[name]
    want = fn(x)
    fast = fn(x.to("lazyfuse")).cpu()
    with monkeypatch.context() as m:
        _python_path_only(m)
        slow = fn(x.to("lazyfuse")).cpu()
    assert fast.dtype == slow.dtype == want.dtype
    assert torch.equal(fast, slow) or (fast.isnan() == slow.isnan()).all() and torch.equal(
        fast.nan_to_num(), slow.nan_to_num())
    torch.testing.assert_close(fast, want, equal_nan=True)


def test_common_calls_do_not_reach_the_python_path(monkeypatch):
    seen = []
    real = _mode.LazyfuseMode._intercept

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(getattr(func, "__name__", func))
        return real(self, func, types, args, kwargs)

    x = torch.randn(4, 8).to("lazyfuse")
    w = torch.randn(8, 8).to("lazyfuse")
    monkeypatch.setattr(_mode.LazyfuseMode, "_intercept", counting)
    y = torch.tanh(x * 0.5 + 1.0) - x / 2
    y = F.linear(y, w).relu()
    y = torch.softmax(y, dim=-1).view(32)
    assert seen == []
    y.sum().item()  # a read goes through the Python path
    assert seen


def test_a_native_ops_error_names_the_users_line():
    a = torch.ones(2, 3, device="lazyfuse")
    b = torch.ones(4, 5, device="lazyfuse")
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        a + b  # NATIVE-ADD-LINE
    assert f"test_fast_path.py:{line_of('NATIVE-ADD-LINE')}" in str(e.value)


def test_an_error_inside_a_torch_python_function_names_the_users_line():
    x = torch.ones(2, 3, device="lazyfuse")
    w = torch.ones(4, device="lazyfuse")
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        F.layer_norm(x, (3,), w)  # LAYER-NORM-LINE
    assert f"test_fast_path.py:{line_of('LAYER-NORM-LINE')}" in str(e.value)


def test_grad_mode_follows_torch_on_both_paths():
    x = torch.randn(3).to("lazyfuse").requires_grad_()
    assert (x * 2).requires_grad
    with torch.no_grad():
        assert not (x * 2).requires_grad  # fast path
        assert not x.clamp_min(0).requires_grad  # through ATen
    assert (x * 2).requires_grad
    assert x.clamp_min(0).requires_grad
    torch.set_grad_enabled(False)
    try:
        assert not torch.tanh(x).requires_grad
    finally:
        torch.set_grad_enabled(True)
    y = torch.tanh(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 1 - torch.tanh(x.detach().cpu()) ** 2)


def test_cpu_operands_and_lists_are_declined_not_mixed_up():
    x = torch.randn(3).to("lazyfuse")
    # A CPU 0-dim tensor mixes with any device, as in PyTorch.
    got = (x * torch.tensor(2.0)).cpu()
    torch.testing.assert_close(got, x.cpu() * 2)
    with pytest.raises(lazyfuse.LazyfuseError, match="lazyfuse device"):
        x + torch.ones(3)
    assert torch.equal(torch.cat([x, x]).cpu(), torch.cat([x.cpu(), x.cpu()]))


def _indexing_and_views():
    torch.manual_seed(1)
    x = torch.randn(4, 6, 5)
    i = torch.tensor([[0, 2], [1, 3], [4, 0], [2, 2]])
    i1 = torch.tensor([2, 3, 0, 2])
    return x, {
        "split by keyword": lambda t: t.split(2, dim=-1)[1] * 1,
        "chunk by keyword": lambda t: torch.chunk(t, 3, dim=1)[2] * 1,
        "unsqueeze and squeeze by keyword": lambda t: t.unsqueeze(dim=0).squeeze(dim=0) * 1,
        "cat and stack": lambda t: torch.cat([t, t * 2], dim=1) + torch.stack([t, t], 0).sum(0).repeat((1, 2, 1)),
        "getitem ints and slices": lambda t: t[1] + t[-1] + t[0, 1:4:2].sum() + t[:, -2:][..., 1:3].mean(),
        "getitem None and ellipsis": lambda t: t[None, ..., 2] * t[2, None, :, None, 0].sum(),
        "getitem empty and clipped slices": lambda t: t[3:100, 10:].sum() + t[:, 5:2].sum() + t[::3].sum(),
        "gather and index_select by keyword": lambda t: torch.gather(t[:, :, 0], dim=1, index=i.to(t.device)) + torch.index_select(t[:, :2, 0], dim=0, index=i1.to(t.device)).sum(),
    }


@pytest.mark.parametrize("name", list(_indexing_and_views()[1]))
def test_views_and_indexing_on_the_fast_path_match_pytorch(name, monkeypatch):
    x, progs = _indexing_and_views()
    fn = progs[name]
    want = fn(x)
    xd = x.to("lazyfuse")
    seen = []
    real = _mode.LazyfuseMode._intercept
    monkeypatch.setattr(_mode.LazyfuseMode, "_intercept",
                        lambda self, func, types, args=(), kwargs=None: seen.append(func) or real(
                            self, func, types, args, kwargs))
    got = fn(xd)
    monkeypatch.undo()
    assert [f for f in seen if f is not torch.Tensor.to] == []
    torch.testing.assert_close(got.cpu(), want)


def test_integer_list_and_tensor_indices_match_pytorch():
    x = torch.arange(60.0).reshape(3, 4, 5)
    d = x.to("lazyfuse")
    i = torch.tensor([2, 0, 2])
    for f in [lambda t, i: t[[0, 2]], lambda t, i: t[[0, 2], 1:], lambda t, i: t[:, [3, 1], 0],
              lambda t, i: t[1, [[0, 1], [2, 3]]], lambda t, i: t[..., [4, -1]],
              lambda t, i: t[i], lambda t, i: t[:, :2][i, 1], lambda t, i: t[None, [1, 0]],
              lambda t, i: t[[0, 1], [1, 2]], lambda t, i: t[[0, 1], :, [1, 2]],
              lambda t, i: t[i, :, i], lambda t, i: t[:, i][[1], 0]]:
        want = f(x, i)
        got = f(d, i.to("lazyfuse"))
        assert got.shape == want.shape
        assert torch.equal(got.cpu(), want)


def test_getitem_that_is_not_basic_or_out_of_range_goes_to_aten():
    x = torch.arange(12.0).reshape(3, 4)
    d = x.to("lazyfuse")
    assert torch.equal(d[torch.tensor([2, 0])].cpu(), x[torch.tensor([2, 0])])
    assert torch.equal(d[d > 5].cpu(), x[x > 5])
    with pytest.raises(IndexError):
        x[3]
    with pytest.raises((IndexError, lazyfuse.LazyfuseError)):
        d[3].cpu()


def test_in_place_methods_on_the_fast_path_match_pytorch(monkeypatch):
    torch.manual_seed(2)
    a, b, c = torch.randn(3, 5), torch.randn(3, 5), torch.rand(3, 5) + 0.5

    def prog(x, y, z):
        x = x.clone()
        x.add_(y, alpha=0.5)
        x.mul_(1.5).sub_(z)
        x += y
        x /= 2
        x.addcmul_(y, z, value=0.25).addcdiv_(y, z, value=-0.5)
        x.lerp_(y, 0.3).clamp_(min=-1.0, max=1.0)
        x.clamp_min_(-0.5)
        w = torch.empty(3, 5, device=x.device).fill_(2.0)
        w.zero_()
        return x + w

    want = prog(a, b, c)
    seen = []
    real = _mode.LazyfuseMode._intercept
    ad, bd, cd = (t.to("lazyfuse") for t in (a, b, c))
    monkeypatch.setattr(_mode.LazyfuseMode, "_intercept",
                        lambda self, func, types, args=(), kwargs=None: seen.append(func) or real(
                            self, func, types, args, kwargs))
    got = prog(ad, bd, cd)
    monkeypatch.undo()
    assert {getattr(f, "__name__", f) for f in seen} <= {"clone", "empty", "__get__"}
    torch.testing.assert_close(got.cpu(), want)


def test_in_place_on_a_leaf_that_requires_grad_is_an_error_and_no_grad_updates_it():
    p = torch.ones(3).to("lazyfuse").requires_grad_()
    with pytest.raises(lazyfuse.LazyfuseError, match="in-place"):
        p.add_(1.0)
    (p * 2).sum().backward()
    with torch.no_grad():
        p.sub_(0.1 * p.grad)
    assert p.requires_grad and p.is_leaf
    torch.testing.assert_close(p.cpu(), torch.full((3,), 0.8))
    torch.testing.assert_close(p.grad.cpu(), torch.full((3,), 2.0))


def test_cpu_calls_under_the_device_mode_run_once_and_as_pytorch_runs_them():
    a, b = torch.zeros(3), torch.ones(3)
    torch._foreach_add_([a, b], 1.0)  # returns None: must not run twice
    a.add_(1.0)
    b.mul_(3).sub_(1)
    assert a.tolist() == [2.0, 2.0, 2.0] and b.tolist() == [5.0, 5.0, 5.0]
    assert type(a) is torch.Tensor and a.device.type == "cpu"
    with torch.no_grad():
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    assert torch.zeros(2, device="cpu").device.type == "cpu"
    assert torch.zeros(2, device="lazyfuse").device.type == "lazyfuse"


def test_setitem_on_the_device_matches_pytorch():
    torch.manual_seed(3)
    base = torch.randn(3, 4, 5)
    i = torch.tensor([2, 0])
    cases = [
        lambda t, dev: t.__setitem__((slice(None), 0), 5.0),
        lambda t, dev: t.__setitem__(1, -2.0),
        lambda t, dev: t.__setitem__((0, slice(1, 3)), torch.arange(10.0).reshape(2, 5).to(dev)),
        lambda t, dev: t.__setitem__((Ellipsis, -1), torch.ones(4).to(dev) * 3),
        lambda t, dev: t.__setitem__((2, 3, 4), 9),
        lambda t, dev: t.__setitem__((slice(-2, None), slice(None, 2)), torch.tensor(0.5)),
        lambda t, dev: t.__setitem__(t > 1.0, -1.0),
        lambda t, dev: t.__setitem__(i.to(dev), torch.zeros(4, 5).to(dev)),
        lambda t, dev: t.__setitem__([1, 2], 7.0),
        lambda t, dev: t.__setitem__((slice(None, None, 2), 1, slice(1, None, 3)), -3.0),
        lambda t, dev: t.__setitem__((Ellipsis, slice(4, 0, 2)), 1.5),
        lambda t, dev: t.__setitem__((slice(None), slice(1, 4, 2)), torch.arange(30.0).reshape(3, 2, 5).to(dev)),
    ]
    for k, f in enumerate(cases):
        want, got = base.clone(), base.to("lazyfuse")
        f(want, "cpu")
        f(got, "lazyfuse")
        assert torch.equal(got.cpu(), want), k


def test_setitem_keeps_gradients_flowing_and_guards_leaves():
    w = torch.randn(4, 3)
    p = w.to("lazyfuse").requires_grad_()
    with pytest.raises(lazyfuse.LazyfuseError, match="in-place"):
        p[0] = 1.0
    h = p * 2
    h[:, 1] = 0.0
    h.sum().backward()
    want = torch.full((4, 3), 2.0)
    want[:, 1] = 0.0
    torch.testing.assert_close(p.grad.cpu(), want)
    with torch.no_grad():
        p[1:3] = 0.0
    assert p.is_leaf and p.requires_grad and p.cpu()[1:3].abs().sum() == 0


def test_setitem_it_cannot_do_is_a_clear_error_naming_the_line():
    # Several advanced indices in one assignment: not taken.
    x = torch.zeros(6, 4).to("lazyfuse")
    with pytest.raises(lazyfuse.LazyfuseError) as e:
        x[[0, 1], [1, 2]] = 1.0  # STEP-SETITEM-LINE
    assert "not supported" in str(e.value)
    assert f"test_fast_path.py:{line_of('STEP-SETITEM-LINE')}" in str(e.value)
