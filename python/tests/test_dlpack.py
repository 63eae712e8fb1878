"""DLPack export of lazyfuse tensors: ``torch.from_dlpack`` and
``numpy.from_dlpack`` read the runtime's value in place (no copy), keep it
alive past the lazyfuse tensor, and agree with PyTorch CPU for every dtype."""

import gc

import numpy as np
import pytest
import torch

import lazyfuse  # noqa: F401  (the device)

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _cpu_and_device(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=g) * 10).to(dtype)
    return x, x.to("lazyfuse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_from_dlpack_gives_the_value_for_every_dtype(dtype):
    x, d = _cpu_and_device(dtype)
    y = d * 2 if dtype not in (torch.bool,) else d.logical_not()
    want = x * 2 if dtype not in (torch.bool,) else x.logical_not()
    got = torch.from_dlpack(y)
    assert got.device.type == "cpu" and got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [t for t in DTYPES if t is not torch.bfloat16], ids=str)
def test_numpy_from_dlpack_gives_the_value_read_only(dtype):
    x, d = _cpu_and_device(dtype)
    a = np.from_dlpack(d)
    np.testing.assert_array_equal(a, x.numpy())
    assert not a.flags.writeable


def test_export_is_in_place_and_outlives_the_tensor():
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    d = x.to("lazyfuse").exp()
    a = torch.from_dlpack(d)
    b = torch.from_dlpack(d)
    n = np.from_dlpack(d)
    # One buffer behind all three: nothing was copied.
    assert a.data_ptr() == b.data_ptr() == n.__array_interface__["data"][0]
    want = x.exp()
    del d
    gc.collect()
    # The program goes on; the exported value stays as it was.
    for i in range(4):
        (x.to("lazyfuse") + i).mul(3).sum().item()
    torch.testing.assert_close(a, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(b, want, rtol=1e-6, atol=0)


def test_scalars_and_empty_tensors_export():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = x.to("lazyfuse")
    assert torch.from_dlpack(d.sum()).item() == 66.0
    e = torch.from_dlpack(d[:0])
    assert e.shape == (0, 4)


def test_copy_true_is_a_copy_and_other_devices_are_refused():
    d = torch.ones(4, 4).to("lazyfuse") * 5
    v = torch.from_dlpack(d)
    c = torch.from_dlpack(d, copy=True)
    assert torch.equal(v, c) and v.data_ptr() != c.data_ptr()
    assert torch.equal(torch.from_dlpack(d, copy=False), v)
    with pytest.raises(BufferError):
        d._t.__dlpack__(dl_device=(2, 0))
    assert d.__dlpack_device__() == (1, 0)


def test_a_tensor_requiring_grad_is_refused_as_torch_does():
    d = torch.ones(3).to("lazyfuse").requires_grad_()
    with pytest.raises(RuntimeError, match="require gradient"):
        torch.from_dlpack(d)
    assert torch.equal(torch.from_dlpack(d.detach()), torch.ones(3))


def test_compiled_results_are_handed_over_and_writing_them_changes_nothing_held():
    """torch.compile(backend="lazyfuse") on CPU tensors gives its fresh
    results to PyTorch without a copy; a result that is also an input, or
    returned twice, is copied, so writing any result leaves the next call
    (and its cached uploads) as they were."""
    torch._dynamo.reset()

    def f(x, w):
        y = torch.tanh(x @ w)
        return y, y, w * 1, (x + 0).sum(0)

    cf = torch.compile(f, backend="lazyfuse")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(16, 32, generator=g), torch.randn(32, 8, generator=g)
    want = f(x, w)
    for _ in range(3):
        got = cf(x, w)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        # Writing every result must not reach lazyfuse's own values.
        for t in got:
            t.mul_(-7).add_(1000)
    torch.testing.assert_close(cf(x, w)[0], want[0], rtol=1e-5, atol=1e-5)
