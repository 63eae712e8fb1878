"""Peers of the workloads added to WORKLOADS.md after the shared peers script
(`../shared/peers/workloads.py`), with the same command line and output:
one `name<TAB>system<TAB>ms ms` line per (workload, system), the median over
the timed iterations.

moe_layer_fwd: a Mixtral-style MoE layer (512 tokens, hidden 512, 8 SwiGLU
experts of 1024, top-2 softmax routing, renormalised).
  torch     PyTorch CPU eager, Hugging Face Mixtral's loop: per expert, the
            tokens that chose it (one_hot / where), two linears, index_add_.
  jaxjit    jax.jit with jax.lax.ragged_dot over the pairs sorted by expert;
            also reported as jaxjit-masked: every expert on every token,
            weighted by the routing (zero where not chosen).
resnet18_train_step: one SGD step (momentum 0.9, weight decay 1e-4) of
torchvision's ResNet-18 (10 classes) in training mode, batch 16 of 3x64x64.
  torch     PyTorch CPU eager (torchvision.models.resnet18 when installed,
            else the same network written out below).
  inductor  the same step with the model under torch.compile (inductor).
  jaxjit    the same network and step written out in jax, jitted, state
            donated.
dlrm_train_step: one training step of a DLRM (reference layout) with eight
tables (1M, 100K, 10K, 1000, 100, 100, 10, 10 rows of 16), bottom MLP
13-64-16, top 16+36-64-1, batch 128 of one id per table: binary
cross-entropy, SGD (lr 0.1) with sparse embedding gradients.
  torch     PyTorch CPU eager, nn.EmbeddingBag(sparse=True).
  jaxjit    jax.jit of the same step (take, and the dense table gradients
            jax.grad makes of it), state donated.
unet_fwd: one call of a small diffusers UNet2DModel (DDPM-CIFAR's block
layout at 64-128-128 channels, config in examples/workloads/defs.rs) on 4
samples of 3x32x32 at timestep 500, under torch.no_grad().
  torch     PyTorch CPU eager, diffusers' UNet2DModel (skipped with a note
            on stderr when diffusers is not installed).
  inductor  the same model under torch.compile (inductor).
  jaxjit    the same network written out in jax (NCHW convolutions, group
            norms, the blocks' attention), jitted, with diffusers' weights;
            checked once against diffusers' output before timing.
embedding_bag_10m_train_step: a 10M x 16 nn.EmbeddingBag(sparse=True), 2048
bags of 8 ids summed, Linear(16, 1), sigmoid and binary cross-entropy, SGD
(lr 0.1) on both.
  torch     PyTorch CPU eager.
Usage: python more_workloads.py [workload ...] [--systems torch,jaxjit,inductor]
"""
import argparse, statistics, time

T, H, E, I, K = 512, 512, 8, 1024, 2


def timeit(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def torch_moe():
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g)
    router = torch.randn(E, H, generator=g) / H ** 0.5
    gate_up = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    down = torch.randn(E, H, I, generator=g) / I ** 0.5

    @torch.no_grad()
    def run():
        probs = F.softmax(F.linear(x, router), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = F.one_hot(chosen, num_classes=E).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            slot, tok = torch.where(mask[e].squeeze(0))
            gu = F.linear(x[tok], gate_up[e].squeeze(0))
            gt, up = gu.chunk(2, dim=-1)
            y = F.linear(F.silu(gt) * up, down[e].squeeze(0)) * weights[tok, slot, None]
            out.index_add_(0, tok, y)
        return out
    return {"torch": run}


def jax_moe():
    import jax, jax.numpy as jnp
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(ks[0], (T, H))
    router = jax.random.normal(ks[1], (H, E)) / H ** 0.5
    gate_up = jax.random.normal(ks[2], (E, H, 2 * I)) / H ** 0.5
    down = jax.random.normal(ks[3], (E, I, H)) / I ** 0.5

    def route(x):
        probs = jax.nn.softmax(x @ router, axis=-1)
        w, chosen = jax.lax.top_k(probs, K)
        return w / w.sum(-1, keepdims=True), chosen

    @jax.jit
    def ragged(x):
        w, chosen = route(x)
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
        xs = x[order // K]
        gu = jax.lax.ragged_dot(xs, gate_up, sizes)
        act = jax.nn.silu(gu[:, :I]) * gu[:, I:]
        ys = jax.lax.ragged_dot(act, down, sizes)
        back = jnp.zeros_like(ys).at[order].set(ys)
        return (back.reshape(T, K, H) * w[..., None]).sum(1)

    @jax.jit
    def masked(x):
        w, chosen = route(x)
        comb = (jax.nn.one_hot(chosen, E) * w[..., None]).sum(1)  # [T, E]
        gu = jnp.einsum("th,ehf->etf", x, gate_up)
        act = jax.nn.silu(gu[..., :I]) * gu[..., I:]
        ys = jnp.einsum("eti,eih->eth", act, down)
        return jnp.einsum("eth,te->th", ys, comb)

    return {"jaxjit": lambda: ragged(x).block_until_ready(),
            "jaxjit-masked": lambda: masked(x).block_until_ready()}


def resnet18(classes):
    """torchvision's resnet18 (basic blocks 2-2-2-2), or the same network."""
    try:
        import torchvision
        return torchvision.models.resnet18(num_classes=classes)
    except ImportError:
        pass
    import torch.nn as nn

    class Basic(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != planes:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, planes in enumerate([64, 128, 256, 512]):
        for j in range(2):
            layers.append(Basic(cin, planes, 2 if (i > 0 and j == 0) else 1))
            cin = planes
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def torch_resnet(compiled):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = resnet18(10)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(16, 3, 64, 64)
    y = torch.tensor([i * 7 % 10 for i in range(16)])
    fwd = torch.compile(model) if compiled else model

    def run():
        opt.zero_grad()
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return run


def torch_dlrm():
    import torch
    import torch.nn as nn
    torch.set_num_threads(2)
    torch.manual_seed(0)
    tables, b = [1_000_000, 100_000, 10_000, 1000, 100, 100, 10, 10], 128

    def mlp(ws, last_sigmoid):
        layers = []
        for i, (a, c) in enumerate(zip(ws, ws[1:])):
            layers += [nn.Linear(a, c), nn.Sigmoid() if last_sigmoid and i == len(ws) - 2 else nn.ReLU()]
        return nn.Sequential(*layers)

    bot = mlp([13, 64, 16], False)
    emb = nn.ModuleList(nn.EmbeddingBag(n, 16, mode="sum", sparse=True) for n in tables)
    f = 1 + len(tables)
    top = mlp([16 + f * (f - 1) // 2, 64, 1], True)
    li = torch.tensor([i for i in range(f) for j in range(i)])
    lj = torch.tensor([j for i in range(f) for j in range(i)])
    params = list(bot.parameters()) + list(emb.parameters()) + list(top.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    dense = torch.randn(b, 13)
    offsets = torch.arange(b)
    ids = [torch.tensor([(i * 7919 + k * 104_729) % n for i in range(b)]) for k, n in enumerate(tables)]
    y = torch.tensor([float(i % 3 == 0) for i in range(b)])

    def run():
        opt.zero_grad()
        x = bot(dense)
        t = torch.cat([x] + [e(i, offsets) for e, i in zip(emb, ids)], dim=1).view(b, -1, 16)
        z = torch.bmm(t, t.transpose(1, 2))
        p = top(torch.cat([x, z[:, li, lj]], dim=1)).view(-1)
        loss = nn.functional.binary_cross_entropy(p, y)
        loss.backward()
        opt.step()
        return loss.item()
    return {"torch": run}


UNET_FWD_CONFIG = dict(
    sample_size=32, in_channels=3, out_channels=3,
    block_out_channels=(64, 128, 128), layers_per_block=2,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    norm_num_groups=32, attention_head_dim=8,
)


def torch_unet(compiled):
    import sys
    import torch
    try:
        from diffusers import UNet2DModel
    except ImportError:
        print("unet_fwd: diffusers is not installed; no torch peer", file=sys.stderr)
        return {}
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = UNet2DModel(**UNET_FWD_CONFIG).eval()
    fwd = torch.compile(model) if compiled else model
    x = torch.randn(4, 3, 32, 32)
    t = torch.tensor([500])

    def run():
        with torch.no_grad():
            return fwd(x, t).sample
    return {"inductor" if compiled else "torch": run}


def jax_unet():
    """UNet2DModel's forward in jax, reading diffusers' parameters by name."""
    import sys
    import numpy as np
    import jax
    import jax.numpy as jnp
    try:
        import torch
        from diffusers import UNet2DModel
    except ImportError:
        print("unet_fwd: diffusers is not installed; no jax peer", file=sys.stderr)
        return {}
    cfg = UNET_FWD_CONFIG
    torch.manual_seed(0)
    model = UNet2DModel(**cfg).eval()
    P = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    groups, ch0 = cfg["norm_num_groups"], cfg["block_out_channels"][0]

    def conv(x, p, stride=1, pad=1):
        y = jax.lax.conv_general_dilated(
            x, P[p + ".weight"], (stride, stride), [(pad, pad), (pad, pad)],
            dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + P[p + ".bias"][None, :, None, None]

    def gn(x, p):
        n, c, h, w = x.shape
        g = x.reshape(n, groups, -1)
        mu = g.mean(-1, keepdims=True)
        var = ((g - mu) ** 2).mean(-1, keepdims=True)
        g = (g - mu) / jnp.sqrt(var + 1e-5)
        return g.reshape(n, c, h, w) * P[p + ".weight"][None, :, None, None] \
            + P[p + ".bias"][None, :, None, None]

    def linear(x, p):
        return x @ P[p + ".weight"].T + P[p + ".bias"]

    def resnet(x, temb, p):
        h = conv(jax.nn.silu(gn(x, p + ".norm1")), p + ".conv1")
        h = h + linear(jax.nn.silu(temb), p + ".time_emb_proj")[:, :, None, None]
        h = conv(jax.nn.silu(gn(h, p + ".norm2")), p + ".conv2")
        if p + ".conv_shortcut.weight" in P:
            x = conv(x, p + ".conv_shortcut", pad=0)
        return x + h

    def attention(x, p):
        n, c, hh, ww = x.shape
        heads = c // cfg["attention_head_dim"]
        h = gn(x, p + ".group_norm").reshape(n, c, hh * ww).transpose(0, 2, 1)
        split = lambda t: t.reshape(n, hh * ww, heads, -1).transpose(0, 2, 1, 3)
        q, k, v = (split(linear(h, p + ".to_" + s)) for s in "qkv")
        a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), axis=-1)
        o = (a @ v).transpose(0, 2, 1, 3).reshape(n, hh * ww, c)
        o = linear(o, p + ".to_out.0").transpose(0, 2, 1).reshape(n, c, hh, ww)
        return o + x

    def forward(x, t):
        half = ch0 // 2
        freqs = jnp.exp(-np.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
        args = t.astype(jnp.float32)[:, None] * freqs[None, :]
        temb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)  # flip_sin_to_cos
        temb = linear(jax.nn.silu(linear(temb, "time_embedding.linear_1")),
                      "time_embedding.linear_2")
        h = conv(x, "conv_in")
        skips = [h]
        layers = cfg["layers_per_block"]
        for b, kind in enumerate(cfg["down_block_types"]):
            for j in range(layers):
                h = resnet(h, temb, f"down_blocks.{b}.resnets.{j}")
                if kind.startswith("Attn"):
                    h = attention(h, f"down_blocks.{b}.attentions.{j}")
                skips.append(h)
            if f"down_blocks.{b}.downsamplers.0.conv.weight" in P:
                h = conv(h, f"down_blocks.{b}.downsamplers.0.conv", stride=2)
                skips.append(h)
        h = resnet(h, temb, "mid_block.resnets.0")
        h = attention(h, "mid_block.attentions.0")
        h = resnet(h, temb, "mid_block.resnets.1")
        for b, kind in enumerate(cfg["up_block_types"]):
            for j in range(layers + 1):
                h = jnp.concatenate([h, skips.pop()], axis=1)
                h = resnet(h, temb, f"up_blocks.{b}.resnets.{j}")
                if kind.startswith("Attn"):
                    h = attention(h, f"up_blocks.{b}.attentions.{j}")
            if f"up_blocks.{b}.upsamplers.0.conv.weight" in P:
                h = jnp.repeat(jnp.repeat(h, 2, axis=2), 2, axis=3)
                h = conv(h, f"up_blocks.{b}.upsamplers.0.conv")
        h = jax.nn.silu(gn(h, "conv_norm_out"))
        return conv(h, "conv_out")

    fwd = jax.jit(forward)
    x = torch.randn(4, 3, 32, 32)
    t = torch.tensor([500] * 4)
    xj, tj = jnp.asarray(x.numpy()), jnp.asarray(t.numpy())
    with torch.no_grad():
        want = model(x, t).sample.numpy()
    got = np.asarray(fwd(xj, tj))
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert err < 1e-3, f"the jax UNet differs from diffusers' by {err:.2e}"

    def run():
        return fwd(xj, tj).block_until_ready()
    return {"jaxjit": run}


def torch_bag10m():
    import torch
    import torch.nn as nn
    torch.set_num_threads(2)
    torch.manual_seed(0)
    rows, bags, per = 10_000_000, 2048, 8
    table = nn.EmbeddingBag(rows, 16, mode="sum", sparse=True)
    head = nn.Linear(16, 1)
    opt = torch.optim.SGD(list(table.parameters()) + list(head.parameters()), lr=0.1)
    ids = torch.tensor([(i * 7_919_993) % rows for i in range(bags * per)])
    offsets = torch.arange(0, bags * per, per)
    y = torch.tensor([float(i % 3 == 0) for i in range(bags)])

    def run():
        opt.zero_grad()
        p = torch.sigmoid(head(table(ids, offsets))).view(-1)
        loss = nn.functional.binary_cross_entropy(p, y)
        loss.backward()
        opt.step()
        return loss.item()
    return {"torch": run}


def jax_resnet():
    """ResNet-18 (basic blocks 2-2-2-2, torchvision's shapes) written out in
    jax: NCHW convolutions, batch norm with batch statistics and running
    averages, the same SGD step (momentum 0.9, weight decay 1e-4), jitted
    with the parameters, momenta and statistics donated."""
    import jax, jax.numpy as jnp
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 64))

    def conv_w(cin, cout, k):
        return jax.random.normal(next(keys), (cout, cin, k, k)) * (2.0 / (cout * k * k)) ** 0.5

    def bn_p(c):
        return {"g": jnp.ones(c), "b": jnp.zeros(c)}, {"m": jnp.zeros(c), "v": jnp.ones(c)}

    params, stats = {"stem": conv_w(3, 64, 7)}, {}
    params["bn"], stats["bn"] = bn_p(64)
    cin, blocks = 64, []
    for s, planes in enumerate([64, 128, 256, 512]):
        for b in range(2):
            stride = 2 if s > 0 and b == 0 else 1
            p, st = {"c1": conv_w(cin, planes, 3), "c2": conv_w(planes, planes, 3)}, {}
            p["b1"], st["b1"] = bn_p(planes)
            p["b2"], st["b2"] = bn_p(planes)
            if stride != 1 or cin != planes:
                p["dc"] = conv_w(cin, planes, 1)
                p["db"], st["db"] = bn_p(planes)
            blocks.append(stride)
            params[f"blk{len(blocks)}"], stats[f"blk{len(blocks)}"] = p, st
            cin = planes
    params["fc_w"] = jax.random.normal(next(keys), (512, 10)) * 512 ** -0.5
    params["fc_b"] = jnp.zeros(10)

    def conv(x, w, stride):
        k = w.shape[-1] // 2
        return jax.lax.conv_general_dilated(x, w, (stride, stride), [(k, k), (k, k)],
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def bn(x, p, st):
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
        n = x.size // x.shape[1]
        y = (x - mean[:, None, None]) * jax.lax.rsqrt(var[:, None, None] + 1e-5)
        new = {"m": 0.9 * st["m"] + 0.1 * mean, "v": 0.9 * st["v"] + 0.1 * var * n / (n - 1)}
        return y * p["g"][:, None, None] + p["b"][:, None, None], new

    def forward(params, stats, x):
        new = {}
        h, new["bn"] = bn(conv(x, params["stem"], 2), params["bn"], stats["bn"])
        h = jax.lax.reduce_window(jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 1, 3, 3),
                                  (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1)))
        for i, stride in enumerate(blocks, 1):
            p, st, ns = params[f"blk{i}"], stats[f"blk{i}"], {}
            o, ns["b1"] = bn(conv(h, p["c1"], stride), p["b1"], st["b1"])
            o, ns["b2"] = bn(conv(jax.nn.relu(o), p["c2"], 1), p["b2"], st["b2"])
            sc = h
            if "dc" in p:
                sc, ns["db"] = bn(conv(h, p["dc"], stride), p["db"], st["db"])
            h, new[f"blk{i}"] = jax.nn.relu(o + sc), ns
        return h.mean((2, 3)) @ params["fc_w"] + params["fc_b"], new

    def loss_fn(params, stats, x, y):
        logits, new = forward(params, stats, x)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1).mean(), new

    def step(params, mom, stats, x, y):
        (loss, new), g = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        g = jax.tree.map(lambda g, p: g + 1e-4 * p, g, params)
        mom = jax.tree.map(lambda m, g: 0.9 * m + g, mom, g)
        return jax.tree.map(lambda p, m: p - 0.01 * m, params, mom), mom, new, loss

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    x = jax.random.normal(next(keys), (16, 3, 64, 64))
    y = jnp.array([i * 7 % 10 for i in range(16)])
    st = {"p": params, "m": jax.tree.map(jnp.zeros_like, params), "s": stats}

    def run():
        st["p"], st["m"], st["s"], loss = step(st["p"], st["m"], st["s"], x, y)
        return float(loss)
    return {"jaxjit": run}


def jax_dlrm():
    """The DLRM step in jax: tables looked up by `take` (one id per bag),
    their gradients what jax.grad makes of a gather (a scatter into a
    table-shaped zero), SGD on everything, jitted with the state donated."""
    import jax, jax.numpy as jnp
    tables, b = [1_000_000, 100_000, 10_000, 1000, 100, 100, 10, 10], 128
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 32))

    def mlp(ws):
        return [(jax.random.normal(next(keys), (a, c)) * (2 / (a + c)) ** 0.5, jnp.zeros(c))
                for a, c in zip(ws, ws[1:])]

    f = 1 + len(tables)
    params = {"bot": mlp([13, 64, 16]), "top": mlp([16 + f * (f - 1) // 2, 64, 1]),
              "emb": [jax.random.uniform(next(keys), (n, 16), minval=-n ** -0.5, maxval=n ** -0.5)
                      for n in tables]}
    li = jnp.array([i for i in range(f) for j in range(i)])
    lj = jnp.array([j for i in range(f) for j in range(i)])

    def run_mlp(ls, x, sigmoid_last):
        for k, (w, c) in enumerate(ls):
            x = x @ w + c
            x = jax.nn.sigmoid(x) if sigmoid_last and k == len(ls) - 1 else jax.nn.relu(x)
        return x

    def loss_fn(params, dense, ids, y):
        x = run_mlp(params["bot"], dense, False)
        t = jnp.stack([x] + [jnp.take(e, i, axis=0) for e, i in zip(params["emb"], ids)], 1)
        z = jnp.einsum("bid,bjd->bij", t, t)
        p = run_mlp(params["top"], jnp.concatenate([x, z[:, li, lj]], 1), True).reshape(-1)
        p = jnp.clip(p, 1e-12, 1 - 1e-7)
        return -(y * jnp.log(p) + (1 - y) * jnp.log(1 - p)).mean()

    def step(params, dense, ids, y):
        loss, g = jax.value_and_grad(loss_fn)(params, dense, ids, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss

    step = jax.jit(step, donate_argnums=(0,))
    dense = jax.random.normal(next(keys), (b, 13))
    ids = [jnp.array([(i * 7919 + k * 104_729) % n for i in range(b)]) for k, n in enumerate(tables)]
    y = jnp.array([float(i % 3 == 0) for i in range(b)])
    st = {"p": params}

    def run():
        st["p"], loss = step(st["p"], dense, ids, y)
        return float(loss)
    return {"jaxjit": run}


SYSTEMS = {
    "embedding_bag_10m_train_step": {"torch": torch_bag10m},
    "unet_fwd": {"torch": lambda: torch_unet(False), "inductor": lambda: torch_unet(True),
                 "jaxjit": jax_unet},
    "moe_layer_fwd": {"torch": torch_moe, "jaxjit": jax_moe},
    "dlrm_train_step": {"torch": torch_dlrm, "jaxjit": jax_dlrm},
    "resnet18_train_step": {"torch": lambda: {"torch": torch_resnet(False)},
                            "inductor": lambda: {"inductor": torch_resnet(True)},
                            "jaxjit": jax_resnet},
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--systems", default="torch,jaxjit,inductor")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    names = a.names or list(SYSTEMS)
    for name in names:
        for system in a.systems.split(","):
            if system not in SYSTEMS.get(name, {}):
                continue
            for label, fn in SYSTEMS[name][system]().items():
                ms = timeit(fn, a.warmup, a.iters)
                print(f"{name}\t{label}\t{ms:.3f} ms", flush=True)
