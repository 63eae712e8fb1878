"""The peers of `cargo bench --bench decode_floor`: the matrix-vector
products of one `decode_kv` token (two blocks' QKV, output and MLP
projections and the head; 6.8 MB of f32 weights, normal(0, 0.02)) chained
as in benches/decode_floor.rs, with the next token read on the host, in
torch eager and under jax.jit. Prints microseconds per token (mean over
`--tokens` after 200 warm-up tokens).

Run by hand (not in CI), with torch and jax[cpu] installed:
    python scripts/bench_decode_floor.py [--tokens 4000]
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

C, VOCAB = 256, 512


def per_token_us(step, tokens):
    for _ in range(200):
        step()
    t0 = time.perf_counter()
    for _ in range(tokens):
        step()
    return (time.perf_counter() - t0) / tokens * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    def w(*dims):
        return rng.standard_normal(dims, dtype=np.float32) * 0.02

    blocks = [(w(C, 3 * C), w(C, C), w(C, 4 * C), w(4 * C, C)) for _ in range(2)]
    head, x = w(C, VOCAB), w(1, C)

    tb = [tuple(torch.from_numpy(a) for a in b) for b in blocks]
    th, tx = torch.from_numpy(head), torch.from_numpy(x)

    def torch_token():
        h = tx
        for qkv, out, up, down in tb:
            a = h + (h @ qkv)[:, 2 * C :] @ out
            h = a + torch.tanh(a @ up) @ down
        return int(torch.argmax(h @ th, -1)[0])

    jb = [tuple(jnp.asarray(a) for a in b) for b in blocks]
    jh, jx = jnp.asarray(head), jnp.asarray(x)

    @jax.jit
    def jax_token(h, bl, hd):
        for qkv, out, up, down in bl:
            a = h + (h @ qkv)[:, 2 * C :] @ out
            h = a + jnp.tanh(a @ up) @ down
        return jnp.argmax(h @ hd, -1)[0]

    print(f"torch eager: {per_token_us(torch_token, args.tokens):.1f} us per token")
    print(
        f"jax.jit:     {per_token_us(lambda: int(jax_token(jx, jb, jh)), args.tokens):.1f} us per token"
    )


if __name__ == "__main__":
    main()
