"""Plain PyTorch on the lazyfuse device, then the same model compiled.

    pip install ./python && python python/examples/quickstart.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyfuse

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 10))
x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))

# 1. The fused eager device: unmodified eager code, recorded and fused.
dev_model = nn.Sequential(*[m for m in model]).to("lazyfuse")
opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-3)
xd, yd = x.to("lazyfuse"), y.to("lazyfuse")
for step in range(5):
    opt.zero_grad()
    loss = F.cross_entropy(dev_model(xd), yd)
    loss.backward()
    opt.step()
    c = lazyfuse.counters()
    print(f"device   step {step}: loss {loss.item():.4f}  compiles so far {c['compiles']}")

# 2. torch.compile with the lazyfuse backend, on CPU tensors.
cpu_model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 10))
compiled = torch.compile(cpu_model, backend="lazyfuse")
with torch.no_grad():
    print("compiled matches eager:", torch.allclose(compiled(x), cpu_model(x), atol=1e-5))
print(lazyfuse.metrics_report())
