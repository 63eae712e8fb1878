"""The Python cost of one recorded op on the fused eager device, against
PyTorch's CPU eager running the same small op.

    python python/benches/record_cost.py [--ops N]

Records N ops (no sync inside the timed loop) for ops on the function-level
fast path (``x * c``, ``torch.tanh``) and one through ATen dispatch
(``x.clamp_min(c)``); prints microseconds per op.
"""

import argparse
import time

import torch

import lazyfuse


def per_op(fn, x, n):
    y = x
    t0 = time.perf_counter()
    for _ in range(n):
        y = fn(y)
    dt = time.perf_counter() - t0
    return dt / n * 1e6, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=2000)
    n = ap.parse_args().ops
    cases = {
        "mul (function-level fast path)": lambda y: y * 1.0001,
        "clamp_min (through ATen dispatch)": lambda y: y.clamp_min(-10.0),
        "tanh (function-level fast path)": torch.tanh,
    }
    print(f"{'op':36} {'lazyfuse record us/op':>22} {'torch cpu eager us/op':>22}")
    for name, fn in cases.items():
        xc = torch.randn(16, 16)
        xd = xc.to("lazyfuse")
        # Record in chunks with a sync between, as a program would.
        rec = []
        for _ in range(3):
            us, y = per_op(fn, xd, n)
            y.sum().item()
            rec.append(us)
        cpu = min(per_op(fn, xc, n)[0] for _ in range(3))
        print(f"{name:36} {min(rec):22.2f} {cpu:22.2f}")


if __name__ == "__main__":
    main()
