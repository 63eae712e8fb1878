"""Plain PyTorch training idioms on the device, against CPU eager: the
optimizers of ``torch.optim`` (``out=`` forms included), gradient clipping
(in-place writes to ``p.grad``), ``padding_idx``, attention modules,
recurrent layers, ``copy.deepcopy`` and ``torch.save``/``torch.load``."""

import copy
import io

import pytest
import torch
import torch.nn as nn

D = "lazyfuse"


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def _train(model, make_opt, inputs, device, clip=None, sched=False):
    m = copy.deepcopy(model).to(device)
    opt = make_opt(m.parameters())
    sch = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) if sched else None
    losses = []
    for x in inputs:
        opt.zero_grad()
        out = m(x.to(device))
        loss = (out.float() ** 2).mean()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        if sch is not None:
            sch.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in m.parameters()]


def _check(model, make_opt, inputs, tol=1e-5, **kw):
    want = _train(model, make_opt, inputs, "cpu", **kw)
    got = _train(model, make_opt, inputs, D, **kw)
    for w, g in zip(want[0], got[0]):
        assert abs(w - g) <= tol * max(1.0, abs(w))
    for w, g in zip(want[1], got[1]):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def _inputs(*shape, n=3, ints=None):
    torch.manual_seed(1)
    if ints is not None:
        return [torch.randint(0, ints, shape) for _ in range(n)]
    return [torch.randn(*shape) for _ in range(n)]


OPTIMIZERS = {
    "adam_amsgrad": lambda p: torch.optim.Adam(p, 1e-2, amsgrad=True),
    "adamax": lambda p: torch.optim.Adamax(p, 1e-2),
    "adamw_forloop": lambda p: torch.optim.AdamW(p, 1e-2, foreach=False),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, 0.1, momentum=0.9, nesterov=True,
                                              weight_decay=1e-2),
    "rmsprop": lambda p: torch.optim.RMSprop(p, 1e-2, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, 1e-2),
    "nadam": lambda p: torch.optim.NAdam(p, 1e-2),
    "radam": lambda p: torch.optim.RAdam(p, 1e-2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_follow_cpu_eager(name):
    torch.manual_seed(0)
    _check(_mlp(), OPTIMIZERS[name], _inputs(8, 16))


def test_gradient_clipping_scales_the_gradients_the_optimizer_reads():
    torch.manual_seed(0)
    _check(_mlp(), lambda p: torch.optim.SGD(p, 0.1), _inputs(8, 16), clip=0.1, sched=True)


def test_p_grad_is_one_tensor_and_writing_it_writes_the_gradient():
    w = torch.ones(3, device=D, requires_grad=True)
    (w * torch.tensor([1.0, 2.0, 3.0], device=D)).sum().backward()
    g = w.grad
    assert g is w.grad
    g.mul_(2)
    w.grad[0] = -1
    w.grad.data.add_(1)
    assert torch.equal(w.grad.cpu(), torch.tensor([0.0, 5.0, 7.0]))
    w.grad = None
    assert w.grad is None


def test_padding_idx_rows_get_no_gradient():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16, padding_idx=0), nn.Linear(16, 4))
    _check(model, lambda p: torch.optim.Adam(p, 1e-2), _inputs(4, 6, ints=20))


@pytest.mark.parametrize("layer", ["mha", "encoder", "lstm"])
def test_attention_and_recurrent_modules_train_like_cpu_eager(layer):
    torch.manual_seed(0)
    if layer == "mha":
        class SelfAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.MultiheadAttention(16, 4, batch_first=True)

            def forward(self, x):
                return self.a(x, x, x, need_weights=False)[0]

        model = SelfAttention()
    elif layer == "encoder":
        model = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    else:
        class Last(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(16, 8, batch_first=True)

            def forward(self, x):
                return self.rnn(x)[0]

        model = Last()
    # SGD: Adam's tiny eps turns last-bit gradient differences into
    # visible parameter differences.
    _check(model, lambda p: torch.optim.SGD(p, 1e-2), _inputs(2, 5, 16), tol=2e-5)


def test_a_fully_masked_attention_row_gives_zeros_not_nans():
    x = torch.tensor([[float("-inf")] * 3, [0.0, 1.0, float("-inf")]])
    want = torch.ops.aten._safe_softmax(x, -1)
    got = torch.ops.aten._safe_softmax(x.to(D), -1).cpu()
    assert torch.equal(got, want)


def test_deepcopy_and_save_load_of_a_device_model():
    torch.manual_seed(0)
    m = _mlp().to(D)
    m[0].weight.detach().t()  # a view of a parameter, as optimizers make
    twin = copy.deepcopy(m)
    assert twin[0].weight is not m[0].weight and twin[0].weight.requires_grad
    x = torch.randn(2, 16)
    assert torch.equal(twin(x.to(D)).cpu(), m(x.to(D)).cpu())
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)  # weights_only: plain CPU tensors
    assert all(v.device.type == "cpu" for v in sd.values())
    cpu = _mlp()
    cpu.load_state_dict(sd)
    back = _mlp().to(D)
    back.load_state_dict(cpu.state_dict())
    torch.testing.assert_close(back(x.to(D)).cpu(), cpu(x), rtol=1e-6, atol=1e-6)


def test_out_arguments_write_their_tensor():
    got = []
    for d in ("cpu", D):
        a = torch.tensor([1.0, 5.0, 2.0], device=d)
        b = torch.tensor([3.0, 1.0, 4.0], device=d)
        m = a.clone()
        torch.maximum(m, b, out=m)
        o = torch.empty(3, device=d)
        torch.add(a, b, alpha=2, out=o)
        v = torch.zeros(2, 3, device=d)
        torch.mul(a, b, out=v[1])
        c = torch.zeros(3, device=d)
        torch.cumsum(a, 0, out=c)
        got.append([t.cpu() for t in (m, o, v, c)])
    for w, g in zip(*got):
        assert torch.equal(w, g)
