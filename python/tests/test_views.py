"""Views share their base's memory, as in PyTorch: a write through a view
(``x[:, 1].zero_()``, ``w.data.mul_(2)``, ``x.t()[0] = 1``) changes the
base, a write to the base changes its live views, gradients follow, and
a view that cannot be written back is an error, never a silent copy."""

import pytest
import torch

import lazyfuse
from lazyfuse import _mode

D = "lazyfuse"


def _base(d):
    return torch.arange(24.0, device=d).reshape(4, 6)


def _programs():
    def sel_zero(d):
        x = _base(d)
        x[:, 1].zero_()
        return x

    def view_iadd(d):
        x = _base(d)
        v = x[0]
        v += 1
        return x, v

    def data_mul(d):
        x = _base(d)
        x.data.mul_(2)
        return x

    def detach_add(d):
        x = _base(d)
        x.detach().add_(1)
        return x

    def base_write_seen(d):
        x = _base(d)
        a, b = x[1:], x[:, 2]
        x.add_(10)
        return a, b

    def view_setitem(d):
        x = _base(d)
        v = x.view(6, 4)
        v[0, 0] = 100
        return x, v

    def t_row(d):
        x = _base(d)
        t = x.t()
        t[0].fill_(-1)
        return x, t

    def unbind(d):
        x = torch.arange(24.0, device=d).reshape(2, 3, 4)
        a, b = x.unbind(0)
        a.mul_(0)
        return x, b

    def diagonal(d):
        x = torch.zeros(3, 5, device=d)
        x.diagonal(1).fill_(1)
        x.diagonal(-1).add_(2)
        return x

    def chunk(d):
        x = _base(d)
        c = x.chunk(3, dim=1)
        c[1].add_(5)
        return x, c[0], c[2]

    def split(d):
        x = _base(d)
        p = torch.split(x, [1, 3], dim=0)
        p[1][:, 0] = -7
        return x, p[0]

    def narrow_copy(d):
        x = _base(d)
        x.narrow(1, -2, 2).copy_(torch.ones(4, 2, device=d))
        return x

    def chained_setitem(d):
        x = _base(d)
        x[1][2] = 7
        return x

    def unsqueeze_setitem(d):
        x = _base(d)
        x.unsqueeze(0)[0, 1, 1] = 3
        return x

    def stepped(d):
        x = torch.arange(10.0, device=d)
        x[::3].mul_(10)
        return x

    def view_of_view(d):
        x = torch.zeros(8, device=d)
        y = x[1:7]
        z = y[1:].view(5)
        z.fill_(2)
        w = y[:2]
        return x, y, z, w

    def siblings(d):
        x = _base(d)
        a, b = x[0], x[:, 1]
        x.mul_(2)
        a.fill_(5)
        return x, a, b

    def permute_squeeze_flatten(d):
        x = torch.zeros(2, 1, 3, device=d)
        x.permute(2, 0, 1)[0].add_(1)
        x.squeeze(1)[1].sub_(4)
        x.flatten()[-1] = 9
        return x

    def aten_views(d):
        x = torch.zeros(3, 4, device=d)
        x.select(1, 2).add_(1)
        x.movedim(0, 1)[0].add_(2)
        x.swapaxes(0, 1)[3, 2] = 5
        x.unflatten(1, (2, 2))[:, 1, 0].sub_(3)
        return x

    def reshape_of_transposed_is_a_copy(d):
        x = _base(d)
        y = x.t().reshape(-1)
        y.zero_()
        return x, y

    def contiguous(d):
        x = _base(d)
        same = x.contiguous()
        same[0, 0] = -1
        other = x.t().contiguous()
        other[0, 0] = -2
        return x, other

    def embedding_padding(d):
        torch.manual_seed(0)
        e = torch.nn.Embedding(5, 3, padding_idx=1, device=d)
        with torch.no_grad():
            e.weight.fill_(2.0)
            e.weight[e.padding_idx].fill_(0)
            e.weight.data[:, 0] = 0.5
        return e.weight.detach()

    def setitem_through_method_view(d):
        x = _base(d)
        x[:, 1:3] *= 2
        return x

    def other_dtypes(d):
        x = torch.arange(12, device=d).reshape(3, 4)
        x[1].fill_(-1)
        m = torch.zeros(2, 3, dtype=torch.bool, device=d)
        m[:, 1] = True
        return x, m

    return {f.__name__: f for f in [
        sel_zero, view_iadd, data_mul, detach_add, base_write_seen, view_setitem, t_row,
        unbind, diagonal, chunk, split, narrow_copy, chained_setitem, unsqueeze_setitem,
        stepped, view_of_view, siblings, permute_squeeze_flatten, aten_views,
        reshape_of_transposed_is_a_copy, contiguous, embedding_padding,
        setitem_through_method_view, other_dtypes]}


def _same(want, got):
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.device.type == "lazyfuse"
        g = g.cpu()
        assert w.dtype == g.dtype and w.shape == g.shape
        assert torch.equal(w, g), (w, g)


@pytest.mark.parametrize("name", list(_programs()))
def test_writes_reach_the_memory_views_share_as_in_pytorch(name):
    fn = _programs()[name]
    _same(fn("cpu"), fn(D))


# (Indexed assignment is the fast path's alone: these write with methods.)
@pytest.mark.parametrize("name", ["sel_zero", "t_row", "unbind", "view_of_view", "siblings",
                                  "diagonal", "chunk", "narrow_copy", "data_mul"])
def test_the_python_path_marks_views_as_the_fast_path_does(name, monkeypatch):
    monkeypatch.setattr(_mode, "_rust_fast", lambda func, args, kwargs: NotImplemented)
    fn = _programs()[name]
    _same(fn("cpu"), fn(D))


def _grads():
    def scale_row(x):
        h = x * 2
        h[0].mul_(3)
        return (h * h).sum()

    def transposed_rows(x):
        h = x * 3
        h.t()[1].add_(1.5)
        h.t()[2].mul_(h[0, 1].clone())
        return (h * x).sum()

    def stepped_view(x):
        h = x + 1
        v = h.view(12)
        v[::3] = 0
        return (h ** 2).sum()

    def narrow_mul(x):
        h = x * 1
        h.narrow(1, 0, 2).mul_(h[:, 2:].clone())
        return (h * h).sum()

    return {f.__name__: f for f in [scale_row, transposed_rows, stepped_view, narrow_mul]}


@pytest.mark.parametrize("name", list(_grads()))
def test_gradients_flow_through_writes_into_views(name):
    fn = _grads()[name]
    torch.manual_seed(0)
    x0 = torch.randn(3, 4)
    out = []
    for d in ("cpu", D):
        x = x0.clone().to(d).requires_grad_()
        loss = fn(x)
        loss.backward()
        out.append((loss.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-6, atol=1e-6)


def test_a_view_of_a_leaf_that_requires_grad_cannot_be_written_while_grad_is_on():
    w = torch.zeros(3, 4, device=D, requires_grad=True)
    with pytest.raises(lazyfuse.LazyfuseError, match="view of a leaf"):
        w[0].add_(1)
    with torch.no_grad():
        w[0].add_(1)
    w.data[1] = 2  # .data is PyTorch's way around the rule
    assert w.is_leaf and w.requires_grad
    assert torch.equal(w.cpu(), torch.tensor([[1.0] * 4, [2.0] * 4, [0.0] * 4]))


def test_a_view_that_cannot_be_written_back_is_an_error_naming_the_line():
    x = torch.zeros(2, 3, device=D)
    y = x.expand(4, 2, 3)
    with pytest.raises(lazyfuse.LazyfuseError, match="test_views.py"):
        y.add_(1)
    assert torch.equal(x.cpu(), torch.zeros(2, 3))


def test_writing_detach_of_a_tensor_with_history_warns_and_keeps_the_gradient():
    x = torch.ones(3, device=D, requires_grad=True)
    h = x * 2
    p = h.detach()
    with pytest.warns(lazyfuse.LazyfuseViewWarning, match="test_views.py"):
        p.sigmoid_()
    torch.testing.assert_close(p.cpu(), torch.sigmoid(torch.full((3,), 2.0)))
    (h * x).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 4.0))


def test_data_assignment_unlinks_the_old_views():
    x = torch.zeros(3, device=D)
    v = x[1:]
    x.data = torch.ones(3, device=D)
    v.fill_(5)
    assert torch.equal(x.cpu(), torch.ones(3))
    assert torch.equal(v.cpu(), torch.full((2,), 5.0))


def test_views_of_a_long_lived_tensor_do_not_pile_up():
    w = torch.zeros(64, 64, device=D)
    for _ in range(1000):
        w.t()
        w[0]
    assert len(w._views) < 64


@pytest.mark.parametrize("op", ["unsqueeze_(0)", "transpose_(0, 1)", "t_()", "resize_(6)"])
def test_an_in_place_op_that_changes_the_shape_is_an_error(op):
    x = torch.arange(6.0, device=D).reshape(2, 3)
    with pytest.raises(lazyfuse.LazyfuseError, match="keep their shape"):
        eval("x." + op)
    assert x.shape == (2, 3) and torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3))
