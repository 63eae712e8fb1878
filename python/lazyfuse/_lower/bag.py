"""Embedding bags: ``aten._embedding_bag`` (what ``nn.EmbeddingBag`` and
``F.embedding_bag`` call) on the runtime's gather and scatter ops, and
its backward ops, whose per-id row gradients come from the runtime's own
rule (``_C.vjp`` of the bag reduction). A sparse gradient
(``sparse=True``) is built as PyTorch builds it: an uncoalesced COO tensor
of one row per id, so ``torch.optim.SGD`` updates only the rows read and
no table-sized gradient exists."""

from __future__ import annotations

import torch

from . import lowering
from .. import _C
from .._core import download

SUM, MEAN = 0, 1


def _supported(mode, scale_grad_by_freq, padding_idx):
    # max mode, frequency scaling and padding ids stay graph breaks.
    return mode in (SUM, MEAN) and not scale_grad_by_freq and (padding_idx is None or padding_idx < 0)


def _bags_of(offsets, include_last_offset):
    return offsets.narrow(0, 0, offsets.shape[0] - 1) if include_last_offset else offsets


def _offset2bag(indices, offsets):
    """The bag of each id: the bag starts at or before it, less one."""
    n, b = indices.shape[0], offsets.shape[0]
    starts = _C.full(0.0, (n + 1,), "int64").index_add(0, offsets, _C.full(1.0, (b,), "int64"))
    return starts.narrow(0, 0, n).cumsum(0).binary("sub", 1)


def _bag_sizes(n, offsets):
    ends = _C.full(float(n), (1,), "int64")
    nxt = _C.cat([offsets.narrow(0, 1, offsets.shape[0] - 1), ends], 0) if offsets.shape[0] else offsets
    return nxt.binary("sub", offsets)


@lowering("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    if not _supported(mode, scale_grad_by_freq, padding_idx) or len(indices.shape) != 1:
        return None
    bags = _bags_of(offsets, include_last_offset)
    out = weight.embedding_bag(indices, bags, per_sample_weights, mode == MEAN)
    n = indices.shape[0]
    # The side outputs in the shapes PyTorch's CPU kernel gives them (the
    # backward lowerings below recompute what they need from the offsets).
    fast = mode == SUM and weight.dtype in ("float32", "float16")
    offset2bag = _C.full(0.0, (0,), "int64") if fast else _offset2bag(indices, bags)
    bag_size = _bag_sizes(n, bags)
    return out, offset2bag, bag_size, _C.full(0.0, tuple(bag_size.shape), "int64")


def _row_grads(grad, indices, offsets, mode, per_sample_weights):
    """``[n ids, dim]``: each id's share of its bag's gradient."""
    rows = _C.full(0.0, (indices.shape[0], grad.shape[1]), grad.dtype)
    return _C.vjp(lambda t: t[0].bags(offsets, per_sample_weights, mode == MEAN), [rows], grad)[0]


def _dense(rows, indices, num_weights):
    return _C.full(0.0, (num_weights, rows.shape[1]), rows.dtype).index_add(0, indices, rows)


def _sparse(rows, indices, num_weights):
    values = download(rows)
    return torch.sparse_coo_tensor(download(indices).view(1, -1), values,
                                   (num_weights, values.shape[1]))


@lowering("_embedding_bag_backward")
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse,
                           per_sample_weights=None, padding_idx=-1):
    if not _supported(mode, scale_grad_by_freq, padding_idx):
        return None
    bags = offsets.narrow(0, 0, grad.shape[0])  # include_last_offset's extra start dropped
    rows = _row_grads(grad, indices, bags, mode, per_sample_weights)
    return (_sparse if sparse else _dense)(rows, indices, num_weights)


@lowering("_embedding_bag_sparse_backward")
def embedding_bag_sparse_backward(grad, indices, offsets, offset2bag, bag_size, num_weights,
                                  scale_grad_by_freq, mode, per_sample_weights=None,
                                  padding_idx=-1):
    if not _supported(mode, scale_grad_by_freq, padding_idx):
        return None
    bags = offsets.narrow(0, 0, grad.shape[0])
    return _sparse(_row_grads(grad, indices, bags, mode, per_sample_weights), indices, num_weights)


@lowering("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                 num_weights, scale_grad_by_freq, mode, per_sample_weights=None,
                                 padding_idx=-1):
    # No offsets here: each id's bag comes from offset2bag, which PyTorch
    # fills before calling this (the forward's fast path leaves it empty).
    if not _supported(mode, scale_grad_by_freq, padding_idx) or offset2bag.shape[0] != indices.shape[0]:
        return None
    rows = grad.index_select(0, offset2bag)
    if mode == MEAN:
        sizes = bag_size.to_dtype(grad.dtype).index_select(0, offset2bag)
        rows = rows.binary("div", sizes.binary("maximum", 1.0).unsqueeze(1))
    if per_sample_weights is not None:
        rows = rows.binary("mul", per_sample_weights.unsqueeze(1))
    return _dense(rows, indices, num_weights)
