"""Makes the tiny DLRM checkpoint under tests/fixtures/dlrm/ with PyTorch.

Run by hand (not in CI; cargo test reads only the files this writes):
    python3 scripts/make_dlrm_fixture.py [--out tests/fixtures/dlrm]

The module has the reference implementation's structure and names
(facebookresearch/dlrm, dlrm_s_pytorch.py: `bot_l`, `emb_l` of sum-mode
EmbeddingBags with sparse gradients, dot interaction without self pairs,
`top_l` ending in a sigmoid). model.safetensors is its state dict;
io.safetensors holds a batch (dense features, per table ids `ids.<k>` and
offsets `offsets.<k>`), labels, the probabilities, and the binary
cross-entropy losses of 5 SGD steps (lr 0.1, dense and sparse alike) with
the first table's rows after them.
"""
import argparse, os
import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

DENSE, DIM, TABLES, BOTTOM, TOP = 13, 8, [100, 50, 200, 30], [13, 16, 8], [16, 1]


def mlp(widths, sigmoid_last):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        lin = nn.Linear(a, b)
        with torch.no_grad():  # the reference's initialisation
            lin.weight.copy_(torch.randn(b, a) * np.sqrt(2 / (a + b)))
            lin.bias.copy_(torch.randn(b) * np.sqrt(1 / b))
        layers += [lin, nn.Sigmoid() if (sigmoid_last and i == len(widths) - 2) else nn.ReLU()]
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bot_l = mlp(BOTTOM, False)
        self.emb_l = nn.ModuleList()
        for n in TABLES:
            e = nn.EmbeddingBag(n, DIM, mode="sum", sparse=True)
            with torch.no_grad():
                e.weight.uniform_(-np.sqrt(1 / n), np.sqrt(1 / n))
            self.emb_l.append(e)
        f = 1 + len(TABLES)
        self.top_l = mlp([DIM + f * (f - 1) // 2] + TOP, True)

    def forward(self, dense, ids, offsets):
        x = self.bot_l(dense)
        ly = [e(i, o) for e, i, o in zip(self.emb_l, ids, offsets)]
        b, d = x.shape
        t = torch.cat([x] + ly, dim=1).view((b, -1, d))
        z = torch.bmm(t, torch.transpose(t, 1, 2))
        _, ni, nj = z.shape
        li = torch.tensor([i for i in range(ni) for j in range(i)])
        lj = torch.tensor([j for i in range(ni) for j in range(i)])
        r = torch.cat([x, z[:, li, lj]], dim=1)
        return self.top_l(r).view(-1)


def main(out):
    torch.manual_seed(0)
    m = DLRM()
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()},
              os.path.join(out, "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    b = 8
    dense = torch.randn(b, DENSE, generator=g)
    ids, offsets = [], []
    for n in TABLES:
        counts = torch.randint(0, 4, (b,), generator=g)  # bags of 0 to 3 ids
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]]))
        ids.append(torch.randint(0, n, (int(counts.sum()),), generator=g))
    labels = torch.randint(0, 2, (b,), generator=g).float()
    with torch.no_grad():
        probs = m(dense, ids, offsets)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy(m(dense, ids, offsets), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    io = {"dense": dense, "labels": labels, "probs": probs, "losses": torch.tensor(losses),
          "table0_after": m.emb_l[0].weight.detach().clone()}
    for k, (i, o) in enumerate(zip(ids, offsets)):
        io[f"ids.{k}"], io[f"offsets.{k}"] = i, o
    save_file(io, os.path.join(out, "io.safetensors"))
    print("losses", losses)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/dlrm")
    main(ap.parse_args().out)
