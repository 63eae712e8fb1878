"""The peer for issue 12's DDP overhead: WORKLOADS.md's `mlp_train_step`
under jax.jit on one CPU device, and data parallel over 4 logical CPU
devices (batch split over "dp", parameters replicated, XLA's SPMD
partitioner inserting the gradient all-reduce), the same global batch.

The 4 devices share the host's cores, as lazyfuse's `mlp_train_step_ddp4`
does, so the ratio is what XLA's CPU SPMD costs on this machine, against
lazyfuse's ratio of the same two workloads.

Run by hand (not in CI), with jax[cpu] installed:
    python scripts/bench_jax_ddp.py [--iters 30] [--warmup 3]
"""
import argparse
import os
import statistics
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def setup():
    key = jax.random.PRNGKey(0)
    ks = jax.random.split(key, 32)
    dims = [784, 1024, 1024, 10]
    ps = []
    for i in range(3):
        ps += [
            jax.random.normal(ks[4 + i], (dims[i], dims[i + 1])) * (1.0 / dims[i]) ** 0.5,
            jnp.zeros(dims[i + 1]),
        ]
    xb = jax.random.normal(ks[8], (256, 784))
    yb = jax.random.randint(ks[9], (256,), 0, 10)
    return ps, xb, yb


def loss_fn(ps, x, y):
    h = x
    for i in range(3):
        h = h @ ps[2 * i] + ps[2 * i + 1]
        if i < 2:
            h = jax.nn.relu(h)
    lse = jax.nn.logsumexp(h, axis=-1)
    return (lse - jnp.take_along_axis(h, y[:, None], axis=-1)[:, 0]).mean()


def step(ps, x, y):
    l, gs = jax.value_and_grad(loss_fn)(ps, x, y)
    return [p - 0.01 * g for p, g in zip(ps, gs)], l


def timeit(ps, x, y, warm, iters):
    f = jax.jit(step)
    times = []
    for i in range(warm + iters):
        t0 = time.perf_counter()
        ps, l = f(ps, x, y)
        l.block_until_ready()
        if i >= warm:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    ps, xb, yb = setup()
    one_dev = jax.devices()[0]
    one = timeit(
        [jax.device_put(p, one_dev) for p in ps],
        jax.device_put(xb, one_dev),
        jax.device_put(yb, one_dev),
        a.warmup,
        a.iters,
    )
    mesh = Mesh(jax.devices()[:4], ("dp",))
    rep = NamedSharding(mesh, P())
    ddp = timeit(
        [jax.device_put(p, rep) for p in ps],
        jax.device_put(xb, NamedSharding(mesh, P("dp", None))),
        jax.device_put(yb, NamedSharding(mesh, P("dp"))),
        a.warmup,
        a.iters,
    )
    print(f"jax {jax.__version__} mlp_train_step one device: {one:.3f} ms")
    print(f"jax {jax.__version__} mlp_train_step ddp over 4 CPU devices: {ddp:.3f} ms")
    print(f"ddp / one device: {ddp / one:.2f}x")


if __name__ == "__main__":
    main()
