"""The ops of `examples/op_timings.rs` under jax.jit: the 10th percentile of
60 timed runs each (ms), printed in the same lines for a side-by-side
`paste` with the Rust example's output. Needs jax (CPU)."""
import time

import jax
import jax.numpy as jnp
import numpy as np

RUNS = 60


def p10(f, *args):
    for _ in range(5):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[RUNS // 10]


def main():
    r = np.random.default_rng(0)
    f32 = lambda *d: jnp.asarray(r.standard_normal(d, dtype=np.float32))
    a, g = f32(1024, 1024), f32(1024)
    idx = jnp.asarray(np.array([i * 7919 % 1024 for i in range(1024)]))
    t = jnp.asarray(np.array([i * 31 % 1000 for i in range(1024)]))
    q, k, v = f32(8, 4, 128, 64), f32(8, 4, 128, 64), f32(8, 4, 128, 64)
    s = jax.jit(lambda q, k: q @ jnp.swapaxes(k, -1, -2))(q, k)

    def layer_norm(x):
        c = x - x.mean(-1, keepdims=True)
        return c / jnp.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * g + g

    def xent(x):
        return -jnp.take_along_axis(jax.nn.log_softmax(x, -1), t[:, None], 1).mean()

    cases = [
        ("sum_rows", lambda x: x.sum(-1, keepdims=True), a),
        ("sum_cols", lambda x: x.sum(0, keepdims=True), a),
        ("max_rows", lambda x: x.max(-1, keepdims=True), a),
        ("max_cols", lambda x: x.max(0, keepdims=True), a),
        ("mean_all", lambda x: x.mean(), a),
        ("softmax", lambda x: jax.nn.softmax(x, -1), a),
        ("log_softmax", lambda x: jax.nn.log_softmax(x, -1), a),
        ("layer_norm", layer_norm, a),
        ("argmax_rows", lambda x: x.argmax(-1), a),
        ("xent", xent, a),
        ("index_select", lambda x: x[idx], a),
        ("gather", lambda x: jnp.take_along_axis(x, idx[:, None], 1), a),
        ("transpose", lambda x: x.T + 1, a),
        ("cat", lambda x: jnp.concatenate([x, x], 0), a),
        ("clamp", lambda x: jnp.clip(x, -1, 1), a),
        ("relu", lambda x: jnp.maximum(x, 0), a),
        ("gelu_exact", lambda x: jax.nn.gelu(x, approximate=False), a),
        ("to_bf16", lambda x: x.astype(jnp.bfloat16), a),
        ("sigmoid", jax.nn.sigmoid, a),
        ("masked_fill", lambda x: jnp.where(x > 0, 0.0, x), a),
        ("att_rowmax", lambda x: x.max(-1, keepdims=True), s),
        ("att_softmax", lambda x: jax.nn.softmax(x, -1), s),
    ]
    for name, f, x in cases:
        print("%-14s %.3f" % (name, p10(jax.jit(f), x)))
    att = lambda q, k, v: jax.nn.softmax((q @ jnp.swapaxes(k, -1, -2)) * 0.125, -1) @ v
    print("%-14s %.3f" % ("attention", p10(jax.jit(att), q, k, v)))
    h, dy = f32(256, 1024), f32(256, 1024)
    print("%-14s %.3f" % ("mm_fwd", p10(jax.jit(lambda h, w: h @ w), h, a)))
    print("%-14s %.3f" % ("mm_dx", p10(jax.jit(lambda d, w: d @ w.T), dy, a)))
    print("%-14s %.3f" % ("mm_dw", p10(jax.jit(lambda h, d: h.T @ d), h, dy)))


if __name__ == "__main__":
    main()
