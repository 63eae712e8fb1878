"""Shared helpers: run a function on PyTorch's CPU eager and on the lazyfuse
device, and compare values and gradients."""

import pytest
import torch

import lazyfuse  # noqa: F401  (registers the device)


def on_device(x):
    if isinstance(x, torch.Tensor):
        return x.to("lazyfuse")
    if isinstance(x, (list, tuple)):
        return type(x)(on_device(v) for v in x)
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def assert_close(got, want, atol=1e-5, rtol=1e-5):
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, atol, rtol)
        return
    if isinstance(want, torch.Tensor):
        got = to_cpu(got)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert got.shape == want.shape, (got.shape, want.shape)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    else:
        assert got == want


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
