"""Views, reshapes, slicing, joining and indexing. The runtime's tensors are
values, so a view is a copy that fusion makes free; writes through a view
are not propagated to its base (the device says so when one happens)."""

from __future__ import annotations

from . import H, cast, dim, lowering, promote

# For lowerings whose parameter is ATen's ``dim`` (so ``x.split(n, dim=-1)``
# reaches them by keyword, as PyTorch spells it).
_axis = dim
from .. import _C


def _infer(shape, numel):
    shape = [int(s) for s in shape]
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = numel // known if known else 0
    return shape


def numel_of(dims):
    n = 1
    for s in dims:
        n *= s
    return n


def numel(x):
    n = 1
    for s in x.shape:
        n *= s
    return n


@lowering("view", "reshape", "_unsafe_view", "view_copy", "_reshape_alias")
def reshape(x, shape, *_):
    shape = _infer(shape, numel(x))
    if list(x.shape) == shape:
        return x
    return x.reshape(shape)


@lowering("flatten")
def flatten(x, start_dim=0, end_dim=-1):
    r = len(x.shape)
    if r == 0:
        return x.reshape([1])
    s, e = dim(start_dim, r), dim(end_dim, r)
    mid = 1
    for v in x.shape[s : e + 1]:
        mid *= v
    return reshape(x, list(x.shape[:s]) + [mid] + list(x.shape[e + 1 :]))


@lowering("unflatten")
def unflatten(x, d, sizes):
    d = dim(d, len(x.shape))
    sizes = _infer(sizes, x.shape[d])
    return reshape(x, list(x.shape[:d]) + sizes + list(x.shape[d + 1 :]))


@lowering("permute", "permute_copy")
def permute(x, dims):
    dims = [int(d) for d in dims]
    if dims == list(range(len(x.shape))):
        return x
    return x.permute(dims)


@lowering("transpose", "transpose_copy")
def transpose(x, a, b):
    r = len(x.shape)
    if r < 2 or dim(a, r) == dim(b, r):
        return x
    return x.transpose(a, b)


@lowering("t", "numpy_T")
def t(x):
    return x if len(x.shape) < 2 else x.transpose(0, 1)


@lowering("expand", "expand_copy", "broadcast_to")
def expand(x, size, implicit=False):
    size = [int(s) for s in size]
    lead = len(size) - len(x.shape)
    out = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    if out == list(x.shape):
        return x
    return x.expand(out)


@lowering("expand_as")
def expand_as(x, other):
    return expand(x, other.shape)


@lowering("squeeze", "squeeze_copy")
def squeeze(x, dim=None):
    r = len(x.shape)
    if dim is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    else:
        axes = [_axis(a, max(r, 1)) for a in ([dim] if isinstance(dim, int) else dim)]
        axes = [a for a in axes if a < r and x.shape[a] == 1]
    if not axes:
        return x
    return reshape(x, [s for i, s in enumerate(x.shape) if i not in axes])


@lowering("unsqueeze", "unsqueeze_copy")
def unsqueeze(x, dim):
    return x.unsqueeze(dim)


@lowering("slice", "slice_copy")
def slice_(x, d=0, start=None, end=None, step=1):
    r = len(x.shape)
    d = dim(d, r)
    n = x.shape[d]
    s, e, st = slice(start, end, step).indices(n)
    length = max(0, (e - s + st - 1) // st)
    if st == 1:
        if s == 0 and length == n:
            return x
        return x.narrow(d, s, length)
    idx = _C.arange(float(s), float(s + st * length), float(st), "int64")
    return x.index_select(d, idx)


@lowering("select", "select_copy")
def select(x, d, index):
    r = len(x.shape)
    d = dim(d, r)
    i = index + x.shape[d] if index < 0 else index
    return x.narrow(d, i, 1).squeeze(d)


def _int_list(v) -> bool:
    """A (nested) list of plain ints: an index tensor to PyTorch."""
    return type(v) is list and len(v) > 0 and all(
        (type(e) is int) or _int_list(e) for e in v)


def _as_tuple(idx):
    """An index as PyTorch reads it: a tuple of components, a list of ints
    being one index tensor; None for a list of anything else."""
    if type(idx) is list:
        return (idx,) if _int_list(idx) else None
    return idx if type(idx) is tuple else (idx,)


def getitem(x, idx):
    """``x[idx]`` as PyTorch's indexing applies it: ints (``select``),
    slices with a positive step, ``None`` and ``...`` in order, then the
    integer index tensors and lists left (``index``, on consecutive dims).
    ``None`` (ATen's path) for masks, bools, ints out of range and advanced
    indices that are not consecutive, whose handling or errors are ATen's."""
    idx = _as_tuple(idx)
    if idx is None:
        return None
    rank = len(x.shape)
    real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    ells = sum(1 for i in idx if i is Ellipsis)
    if ells > 1 or real > rank:
        return None
    out, d, adv = x, 0, {}
    for i in idx:
        t = type(i)
        if i is None:
            out = out.unsqueeze(d)
            d += 1
        elif i is Ellipsis:
            d += rank - real
        elif t is int:
            n = out.shape[d]
            if not -n <= i < n:
                return None
            out = select(out, d, i)
        elif t is slice:
            step = 1 if i.step is None else i.step
            if type(step) is not int or step <= 0 or not all(
                    v is None or type(v) is int for v in (i.start, i.stop)):
                return None
            out = slice_(out, d, i.start, i.stop, step)
            d += 1
        elif t is H and i.dtype in ("int64", "int32"):
            adv[d] = i
            d += 1
        elif _int_list(i):
            adv[d] = _index_list(i)
            d += 1
        else:
            return None
    if not adv:
        return out
    return index(out, [adv.get(k) for k in range(max(adv) + 1)])


def setitem(x, idx, value):
    """The value of ``x`` after ``x[idx] = value`` (``value`` a handle or
    a scalar): basic indices as nested select/slice scatters (as PyTorch's
    functionalization writes them), one integer index tensor or list as
    ``index_put``, a boolean mask of ``x``'s shape with one value as a
    ``where``. ``None`` for the rest (slices with a step, ``None``, more
    than one advanced index, a mask with many values)."""
    v = value if type(value) is H else _C.full(float(value), (), x.dtype)
    if type(idx) is H and idx.dtype == "bool":
        if list(idx.shape) != list(x.shape) or numel(v) != 1:
            return None
        return idx.where_(cast(v, x.dtype).reshape([]), x)
    idx = _as_tuple(idx)
    if idx is None:
        return None
    if any(type(i) is H or type(i) is list for i in idx):
        if len(idx) != 1:
            return None
        i = idx[0] if type(idx[0]) is H else _index_list(idx[0])
        if i.dtype not in ("int64", "int32"):
            return None
        return index_put(x, [i], v)
    rank = len(x.shape)
    real = sum(1 for i in idx if i is not Ellipsis)
    if any(i is None for i in idx) or sum(1 for i in idx if i is Ellipsis) > 1 or real > rank:
        return None
    full = []
    for i in idx:
        full.extend([slice(None)] * (rank - real) if i is Ellipsis else [i])
    return _scatter(x, full, 0, v)


def _scatter(x, idx, d, v):
    """``x`` with ``v`` written where basic indices ``idx`` (from dim ``d``)
    point."""
    if not idx:
        v = cast(v, x.dtype)
        return v if list(v.shape) == list(x.shape) else expand(v, list(x.shape))
    i, rest = idx[0], idx[1:]
    if type(i) is int:
        n = x.shape[d]
        if not -n <= i < n:
            return None
        inner = _scatter(select(x, d, i), rest, d, v)
        return None if inner is None else _scatter_back(x, inner.unsqueeze(d), d, i % n, i % n + 1)
    if type(i) is slice and all(e is None or type(e) is int for e in (i.start, i.stop, i.step)):
        step = 1 if i.step is None else i.step
        if step <= 0:
            return None
        s, e, _ = slice(i.start, i.stop, step).indices(x.shape[d])
        e = max(s, e)
        inner = _scatter(slice_(x, d, s, e, step), rest, d + 1, v)
        if inner is None:
            return None
        if step == 1:
            return _scatter_back(x, inner, d, s, e)
        return _scatter_strided(x, inner, d, s, e, step)
    return None


def _scatter_strided(x, src, d, s, e, step):
    """``x`` with ``src`` written at ``s, s+step, ...`` (below ``e``) along
    ``d``: ``index_put`` on ``d`` moved to the front."""
    k = len(range(s, e, step))
    if k == 0:
        return x
    perm = [d] + [a for a in range(len(x.shape)) if a != d]
    back = [perm.index(a) for a in range(len(perm))]
    rows = _C.arange(float(s), float(s + step * k), float(step), "int64")
    return index_put(x.permute(perm), [rows], src.permute(perm)).permute(back)


def _scatter_back(x, src, d, s, e):
    """``x`` with ``src`` in place of its ``[s, e)`` along ``d``."""
    from .more import slice_scatter

    return slice_scatter(x, src, d, s, e)


def _index_list(v):
    import torch

    from .._core import upload

    return upload(torch.tensor(v, dtype=torch.int64))


@lowering("narrow", "narrow_copy")
def narrow(x, d, start, length):
    if type(start) is H:
        return None
    d = dim(d, len(x.shape))
    start = start + x.shape[d] if start < 0 else start
    return x.narrow(d, start, length)


@lowering("cat", "concat", "concatenate")
def cat(tensors, dim=0):
    d = dim
    ts = [t for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)] or list(tensors[:1])
    dt = promote(*ts)
    ts = [cast(t, dt) for t in ts]
    if len(ts) == 1:
        return ts[0]
    return _C.cat(ts, d)


@lowering("stack")
def stack(tensors, dim=0):
    r = len(tensors[0].shape) + 1
    d = _axis(dim, r)
    return cat([t.unsqueeze(d) for t in tensors], d)


@lowering("split", "split_with_sizes", "split_copy", "split_with_sizes_copy", "unsafe_split",
          "unsafe_split_with_sizes")
def split(x, sizes, dim=0):
    d = _axis(dim, len(x.shape))
    n = x.shape[d]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if sizes else [n]
    out, at = [], 0
    for s in sizes:
        out.append(x.narrow(d, at, s))
        at += s
    return out


@lowering("chunk", "unsafe_chunk")
def chunk(x, chunks, dim=0):
    n = x.shape[_axis(dim, len(x.shape))]
    size = -(-n // chunks)
    return split(x, size, dim)


@lowering("unbind", "unbind_copy")
def unbind(x, d=0):
    d = dim(d, len(x.shape))
    return [x.narrow(d, i, 1).squeeze(d) for i in range(x.shape[d])]


@lowering("clone", "contiguous", "alias", "alias_copy", "lift_fresh", "lift_fresh_copy",
          "_to_dense", "positive", "resolve_conj", "resolve_neg")
def identity(x, *_, **__):
    return x


@lowering("detach", "detach_copy")
def detach(x):
    return x.unary("detach")


@lowering("index_select")
def index_select(x, dim, index):
    idx = index
    return x.index_select(dim, idx.reshape([numel(idx)]) if len(idx.shape) != 1 else idx)


@lowering("index_add")
def index_add(x, d, idx, src, alpha=1):
    """``x`` with ``alpha * src``'s slices added at ``idx`` along ``d``
    (repeats accumulate): one scatter. Out-of-range indices clamp, as the
    device's gathers do (PyTorch raises; the device cannot check)."""
    if len(x.shape) == 0:
        return None
    idx = idx.reshape([numel(idx)]) if len(idx.shape) != 1 else idx
    src = cast(src, x.dtype)
    if alpha != 1:
        src = src.binary("mul", alpha)
    return x.index_add(dim(d, len(x.shape)), idx, src)


@lowering("gather")
def gather(x, dim, index, sparse_grad=False):
    return x.gather(dim, index)


@lowering("embedding")
def embedding(weight, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight``; the ``padding_idx`` row gets no gradient (its
    rows are taken from a detached copy: the same values, no gradient)."""
    if scale_grad_by_freq:
        return None
    flat = idx.reshape([numel(idx)])
    rows = weight.index_select(0, flat)
    if padding_idx is not None and padding_idx >= 0 and weight.requires_grad:
        keep = flat.binary("ne", padding_idx).unsqueeze(1)
        rows = keep.where_(rows, rows.unary("detach"))
    return rows.reshape(list(idx.shape) + [weight.shape[1]])


@lowering("index.Tensor", "_unsafe_index.Tensor")
def index(x, indices):
    """``x[..., idx, ...]`` with integer index tensors on consecutive dims
    (broadcast together), as PyTorch's advanced indexing; a boolean mask
    has a data-dependent shape, so it is a graph break."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos or any(indices[i].dtype == "bool" for i in pos):
        return None
    if pos != list(range(pos[0], pos[-1] + 1)):
        # Not adjacent: the indexed dims go first, broadcast, as PyTorch
        # (and NumPy) order them.
        rest = [a for a in range(len(x.shape)) if a not in pos]
        x = x.permute(pos + rest)
        indices = [indices[i] for i in pos]
        pos = list(range(len(pos)))
    idx = [indices[i] for i in pos]
    bshape = _broadcast([list(t.shape) for t in idx])
    idx = [expand(cast(t, "int64"), bshape) for t in idx]
    p0, k = pos[0], len(pos)
    dims = list(x.shape)
    # Flatten the indexed dims into one, then one index_select.
    flat_idx = None
    for j, t in enumerate(idx):
        size = dims[p0 + j]
        t = t.binary("lt", 0).where_(t.binary("add", size), t)
        flat_idx = t if flat_idx is None else flat_idx.binary("mul", size).binary("add", t)
    merged = 1
    for s in dims[p0 : p0 + k]:
        merged *= s
    xm = reshape(x, dims[:p0] + [merged] + dims[p0 + k :])
    n = numel(flat_idx) if bshape else 1
    out = xm.index_select(p0, flat_idx.reshape([n]))
    return reshape(out, dims[:p0] + bshape + dims[p0 + k :])


def _broadcast(shapes):
    r = max(len(s) for s in shapes)
    out = [1] * r
    for s in shapes:
        for i, v in enumerate(s):
            j = r - len(s) + i
            if v != 1:
                out[j] = v
    return out


@lowering("tril")
def tril(x, diagonal=0):
    return _tri(x, diagonal, "le")


@lowering("triu")
def triu(x, diagonal=0):
    return _tri(x, diagonal, "ge")


def _tri(x, diagonal, cmp):
    r, c = x.shape[-2], x.shape[-1]
    rows = _C.arange(0.0, float(r), 1.0, "int64").unsqueeze(1)
    cols = _C.arange(0.0, float(c), 1.0, "int64").unsqueeze(0)
    keep = cols.binary("sub", rows).binary(cmp, diagonal)
    zero = _C.full(0.0, (), x.dtype)
    return keep.where_(x, zero)


@lowering("repeat")
def repeat(x, repeats):
    repeats = [int(v) for v in repeats]
    lead = len(repeats) - len(x.shape)
    shape = [1] * lead + list(x.shape)
    y = reshape(x, shape)
    inter, final = [], []
    for s, rep in zip(shape, repeats):
        inter += [rep, s]
        final.append(s * rep)
    y = reshape(y, [v for s in shape for v in (1, s)])
    return reshape(y.expand(inter), final)


@lowering("flip")
def flip(x, dims):
    """The runtime's reverse op (XLA's ``reverse``), not a gather."""
    return _C.flip(x, [int(d) for d in dims])


def _scatter_mask(x, d, index):
    """One-hot of ``index`` along ``d`` against ``x``'s positions: shape
    ``index.shape`` with ``x.shape[d]`` inserted after ``d``."""
    d = dim(d, len(x.shape))
    n = x.shape[d]
    classes = _C.arange(0.0, float(n), 1.0, "int64")
    view = [1] * (len(index.shape) + 1)
    view[d + 1] = n
    return cast(index, "int64").unsqueeze(d + 1).binary("eq", classes.reshape(view)), d


@lowering("scatter.value", "scatter.src", "scatter")
def scatter(x, d, index, value):
    """``x`` with ``value`` (a scalar, or ``src``'s elements) written where
    ``index`` points along ``d``; index must span ``x`` on the other dims.
    (Duplicate indices write one of the values, as PyTorch's scatter does.)"""
    if any(index.shape[k] != x.shape[k] for k in range(len(x.shape)) if k != dim(d, len(x.shape))):
        return None
    hit, d = _scatter_mask(x, d, index)
    mask = cast(hit, "int32").reduce("max", [d], False).binary("gt", 0)
    if type(value) is H:
        src = cast(value, x.dtype).narrow(d, 0, index.shape[d]) if value.shape[d] != index.shape[d] else cast(value, x.dtype)
        picked = hit.where_(src.unsqueeze(d + 1), _C.full(0.0, (), x.dtype)).reduce("sum", [d], False)
        return mask.where_(picked, x)
    return mask.where_(_C.full(float(value), (), x.dtype), x)


@lowering("index_put", "_unsafe_index_put", "index_put_")
def index_put(x, indices, values, accumulate=False):
    """``x[idx] = values`` (or ``+=`` with ``accumulate``) for one integer
    index tensor on dim 0, as embedding gradients and cache writes use:
    accumulation is a one-hot contraction, so repeated indices add up."""
    if len(indices) != 1 or indices[0] is None or indices[0].dtype == "bool":
        return None
    idx = cast(indices[0], "int64")
    k = numel(idx)
    idx = idx.reshape([k])
    n = x.shape[0]
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    rest = list(x.shape[1:])
    v = cast(values, x.dtype) if type(values) is H else _C.full(float(values), (), x.dtype)
    if list(v.shape) != [k] + rest:
        v = reshape(v, [k] + rest) if numel(v) == k * numel_of(rest) else expand(v, [k] + rest)
    rows = _C.arange(0.0, float(n), 1.0, "int64")
    onehot = rows.unsqueeze(1).binary("eq", idx.unsqueeze(0))  # [n, k]
    if accumulate:
        w = x.dtype if x.dtype in ("float32", "float64") else "float64"
        flat = cast(v, w).reshape([k, numel(v) // k if k else 0])
        add = cast(onehot, w).matmul(flat).reshape([n] + rest)
        return cast(cast(x, w).binary("add", add), x.dtype)
    hit = cast(onehot, "int32").reduce("max", [1], False).binary("gt", 0)
    last = _C.arange(0.0, float(k), 1.0, "int64").unsqueeze(0).expand([n, k])
    pos = onehot.where_(last, _C.full(-1.0, (), "int64")).reduce("max", [1], False)
    picked = v.index_select(0, pos.binary("maximum", 0))
    view = [n] + [1] * len(rest)
    return hit.reshape(view).where_(picked, x)


@lowering("constant_pad_nd", "pad")
def constant_pad_nd(x, pad, value=0.0, mode="constant"):
    """``pad`` pairs (before, after) from the last dim backwards; negative
    amounts crop."""
    if mode != "constant":
        return None
    r = len(x.shape)
    for i in range(len(pad) // 2):
        d = r - 1 - i
        before, after = int(pad[2 * i]), int(pad[2 * i + 1])
        if before < 0:
            x = x.narrow(d, -before, x.shape[d] + before)
            before = 0
        if after < 0:
            x = x.narrow(d, 0, x.shape[d] + after)
            after = 0
        parts = []
        for n in (before, after):
            shp = list(x.shape)
            shp[d] = n
            parts.append(_C.full(float(value if value is not None else 0.0), tuple(shp), x.dtype) if n else None)
        seq = [p for p in (parts[0], x, parts[1]) if p is not None]
        if len(seq) > 1:
            x = _C.cat(seq, d)
    return x


@lowering("isin")
def isin(elements, test_elements, assume_unique=False, invert=False):
    from .elementwise import binary

    if type(elements) is not H:
        return None
    t = test_elements if type(test_elements) is H else _C.full(float(test_elements), (1,), elements.dtype)
    flat = t.reshape([numel(t)])
    hit = binary("eq", elements.unsqueeze(-1), flat)
    r = cast(hit, "int32").reduce("max", [len(elements.shape)], False).binary("gt", 0)
    return r.binary("eq", False) if invert else r
