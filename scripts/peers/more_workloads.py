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
Usage: python more_workloads.py [workload ...] [--systems torch,jaxjit]
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


SYSTEMS = {"torch": torch_moe, "jaxjit": jax_moe}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--systems", default="torch,jaxjit")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    names = a.names or ["moe_layer_fwd"]
    for system in a.systems.split(","):
        if system not in SYSTEMS or "moe_layer_fwd" not in names:
            continue
        for label, fn in SYSTEMS[system]().items():
            ms = timeit(fn, a.warmup, a.iters)
            print(f"moe_layer_fwd\t{label}\t{ms:.3f} ms", flush=True)
