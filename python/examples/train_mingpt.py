"""minGPT trained in plain PyTorch on the lazyfuse device.

    python python/examples/train_mingpt.py [--steps N] [--compile] [--cpu]

A character-level GPT on a small built-in text: nn.Embedding, causal
self-attention, LayerNorm, GELU MLPs, AdamW. Nothing here is lazyfuse
specific except the device string (or, with --compile,
``torch.compile(model, backend="lazyfuse")`` on CPU tensors); --cpu runs
PyTorch's own CPU eager for comparison. Each step is one fused program.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = (
    "the quick brown fox jumps over the lazy dog. " * 20
    + "a lazy runtime records every op and runs them fused. " * 20
)


class SelfAttention(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, block)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d=64, heads=4, layers=2, block=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.Sequential(*[Block(d, heads, block) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()

    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    torch.manual_seed(0)
    model = GPT(len(chars))
    device = "cpu"
    if a.compile:
        import lazyfuse  # noqa: F401  (registers the backend's device side)

        run = torch.compile(model, backend="lazyfuse")
    elif a.cpu:
        run = model
    else:
        import lazyfuse  # noqa: F401

        device = "lazyfuse"
        model.to(device)
        run = model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for step in range(a.steps):
        ix = torch.randint(0, len(data) - 33, (16,), generator=g)
        x = torch.stack([data[i : i + 32] for i in ix]).to(device)
        y = torch.stack([data[i + 1 : i + 33] for i in ix]).to(device)
        opt.zero_grad()
        loss = run(x, y)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == a.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}  {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
