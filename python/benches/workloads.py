"""The shared workloads (WORKLOADS.md) written in plain PyTorch, timed on
PyTorch's CPU eager, inductor, the lazyfuse device (fused and with fusion
off) and ``torch.compile(backend="lazyfuse")``.

    python python/benches/workloads.py [NAME ...] [--systems LIST] [--iters N] [--warmup N]

Prints one line per (workload, system): ``name<TAB>system<TAB>X ms``, the
median over timed iterations (the format the Rust workload runner reads:
``cargo run --release --example workloads -- --torch-frontend PYTHON``
puts these rows beside Rust lazyfuse's, measured in the same run).
Systems: torch, inductor, lf_device, lf_device_unfused, lf_compile. The
unfused device runs in a child process (``LAZYFUSE_FUSION=0`` is read at
start-up). Inductor and the compiled backend time forward-only workloads
and the MLP step (forward and backward compiled, the update eager).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

GELU_C = 0.7978845608028654
ALL = ["gelu_chain", "layernorm_gelu", "mlp_train_step", "adam_200_small",
       "transformer_block_fwd", "decode_kv"]
COMPILED = {"gelu_chain", "layernorm_gelu", "mlp_train_step", "transformer_block_fwd"}


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def layer_norm(h, g, b):
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    return (h - mu) / torch.sqrt(var + 1e-5) * g + b


def block(x, p, nh=4):
    B, T, C = x.shape
    h = layer_norm(x, p["g"], p["b"])
    q, k, v = (h @ p["wqkv"] + p["bqkv"]).split(C, dim=-1)
    q = q.view(B, T, nh, C // nh).transpose(1, 2)
    k = k.view(B, T, nh, C // nh).transpose(1, 2)
    v = v.view(B, T, nh, C // nh).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / (C // nh) ** 0.5)
    att = att.masked_fill(p["mask"], float("-inf"))
    y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + (y @ p["wo"] + p["bo"])
    return x + gelu(layer_norm(x, p["g"], p["b"]) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def mlp_loss(x, y, ps):
    h = x
    for i in range(3):
        h = h @ ps[2 * i] + ps[2 * i + 1]
        if i < 2:
            h = torch.relu(h)
    return torch.nn.functional.cross_entropy(h, y)


def workloads(dev, sync, compile_fn=None):
    """name -> a function running one iteration (and syncing its result)."""
    torch.manual_seed(0)
    put = (lambda t: t.to(dev)) if dev != "cpu" else (lambda t: t)
    c = compile_fn or (lambda f: f)
    W = {}
    x1 = put(torch.randn(1 << 20))
    f_gelu = c(gelu)
    W["gelu_chain"] = lambda: sync(f_gelu(x1))
    x2, g2, b2 = (put(torch.randn(*s)) for s in ((512, 1024), (1024,), (1024,)))
    f_ln = c(lambda x, g, b: gelu(layer_norm(x, g, b)) + x)
    W["layernorm_gelu"] = lambda: sync(f_ln(x2, g2, b2))

    dims = [784, 1024, 1024, 10]
    ps = []
    for i in range(3):
        ps.append(put(torch.randn(dims[i], dims[i + 1]) * (1.0 / dims[i]) ** 0.5).requires_grad_())
        ps.append(put(torch.zeros(dims[i + 1])).requires_grad_())
    xb, yb = put(torch.randn(256, 784)), put(torch.randint(0, 10, (256,)))
    f_loss = c(mlp_loss)

    def mlp_step():
        loss = f_loss(xb, yb, ps)
        gs = torch.autograd.grad(loss, ps)
        with torch.no_grad():
            for p, g in zip(ps, gs):
                p.sub_(0.01 * g)
        sync(loss)

    W["mlp_train_step"] = mlp_step

    P = [put(torch.randn(64, 64)) for _ in range(200)]
    G = [put(torch.randn(64, 64) * 0.01) for _ in range(200)]
    M = [put(torch.zeros(64, 64)) for _ in range(200)]
    V = [put(torch.zeros(64, 64)) for _ in range(200)]
    st = [0]

    def adam():
        st[0] += 1
        t = st[0]
        b1, b2, lr, eps, wd = 0.9, 0.999, 1e-3, 1e-8, 0.01
        for i in range(200):
            p, g = P[i], G[i]
            M[i] = b1 * M[i] + (1 - b1) * g
            V[i] = b2 * V[i] + (1 - b2) * g * g
            mh = M[i] / (1 - b1**t)
            vh = V[i] / (1 - b2**t)
            P[i] = p - lr * (mh / (torch.sqrt(vh) + eps) + wd * p)
        sync(P[-1])

    W["adam_200_small"] = adam

    B, T, C = 8, 128, 256

    def lin(i, o):
        return put(torch.randn(i, o) * (1.0 / i) ** 0.5)

    bp = dict(wqkv=lin(C, 3 * C), wo=lin(C, C), w1=lin(C, 4 * C), w2=lin(4 * C, C),
              bqkv=put(torch.zeros(3 * C)), bo=put(torch.zeros(C)), b1=put(torch.zeros(4 * C)),
              b2=put(torch.zeros(C)), g=put(torch.ones(C)), b=put(torch.zeros(C)),
              mask=put(torch.tril(torch.ones(T, T)) == 0))
    xt = put(torch.randn(B, T, C))
    f_block = c(block)
    W["transformer_block_fwd"] = lambda: sync(f_block(xt, bp))
    W["decode_kv"] = decode(dev, put, sync)
    return W


def decode(dev, put, sync, V=256, C=128, NH=4, L=2, CTX=128, NEW=32):
    """Greedy generation with a KV cache grown by torch.cat (as Hugging
    Face's DynamicCache grows it), prompts of varying length."""
    g = torch.Generator().manual_seed(1)
    hd = C // NH

    def w(*s):
        return put(torch.randn(*s, generator=g) * 0.02)

    P = dict(wte=w(V, C), wpe=w(CTX, C), head=w(C, V), g=put(torch.ones(C)), b=put(torch.zeros(C)),
             layers=[dict(wqkv=w(C, 3 * C), wo=w(C, C), w1=w(C, 4 * C), w2=w(4 * C, C))
                     for _ in range(L)])

    def forward(ids, pos0, cache):
        T = ids.shape[0]
        x = P["wte"][ids] + P["wpe"][pos0:pos0 + T]
        for li, lp in enumerate(P["layers"]):
            h = layer_norm(x, P["g"], P["b"])
            q, k, v = (h @ lp["wqkv"]).split(C, dim=-1)
            q, k, v = (t.view(T, NH, hd).transpose(0, 1) for t in (q, k, v))
            if cache[li] is not None:
                k = torch.cat([cache[li][0], k], dim=1)
                v = torch.cat([cache[li][1], v], dim=1)
            cache[li] = (k, v)
            S = k.shape[1]
            att = (q @ k.transpose(-2, -1)) * (1.0 / hd**0.5)
            if T > 1:
                att = att.masked_fill(torch.ones(T, S, device=x.device).tril(S - T) == 0,
                                      float("-inf"))
            y = (torch.softmax(att, -1) @ v).transpose(0, 1).reshape(T, C)
            x = x + y @ lp["wo"]
            x = x + gelu(layer_norm(x, P["g"], P["b"]) @ lp["w1"]) @ lp["w2"]
        return layer_norm(x[-1:], P["g"], P["b"]) @ P["head"]

    it = [0]

    def generate():
        n = 8 + (7 * it[0]) % 24
        ids = [(3 * j + it[0]) % V for j in range(n)]
        it[0] += 1
        cache = [None] * L
        logits = forward(put(torch.tensor(ids)), 0, cache)
        pos = len(ids)
        for _ in range(NEW):
            tok = int(logits.argmax(-1)[0].item())
            logits = forward(put(torch.tensor([tok])), pos, cache)
            pos += 1
        sync(logits)

    return generate


def timeit(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def run(system, names, warmup, iters):
    torch.set_num_threads(2)
    if system == "lf_device_unfused":
        env = dict(os.environ, LAZYFUSE_FUSION="0")
        cmd = [sys.executable, __file__, *names, "--systems", "lf_device",
               "--warmup", str(warmup), "--iters", str(iters)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            n, _, ms = line.split("\t")
            print(f"{n}\t{system}\t{ms}", flush=True)
        return
    if system in ("lf_device", "lf_compile"):
        import lazyfuse  # noqa: F401
    dev = "lazyfuse" if system == "lf_device" else "cpu"
    if system == "lf_device":
        import lazyfuse

        def sync(t):
            lazyfuse.sync()
    else:
        def sync(t):
            pass
    compile_fn = None
    if system == "inductor":
        compile_fn = torch.compile
    elif system == "lf_compile":
        compile_fn = lambda f: torch.compile(f, backend="lazyfuse")  # noqa: E731
    W = workloads(dev, sync, compile_fn)
    for n in names:
        if n not in W:
            continue
        if compile_fn is not None and n not in COMPILED:
            continue
        if system == "inductor" and n == "mlp_train_step":
            continue
        print(f"{n}\t{system}\t{timeit(W[n], warmup, iters):.4f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--systems", default="torch,inductor,lf_device,lf_device_unfused,lf_compile")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    names = a.names or ALL
    for s in a.systems.split(","):
        run(s, names, a.warmup, a.iters)


if __name__ == "__main__":
    main()
