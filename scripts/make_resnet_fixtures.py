"""Makes the tiny ResNet checkpoints under tests/fixtures/resnet/ with PyTorch.

Run by hand (not in CI; cargo test reads only the files this writes):
    python3 scripts/make_resnet_fixtures.py [--out tests/fixtures/resnet]
with torch installed (the test venv has it).

The modules below have torchvision's ResNet structure and parameter names
(`conv1`, `bn1`, `layer1.0.conv1`, `layer2.0.downsample.0`, `fc`, ...) with
narrow channels, so the checkpoints are a few hundred KB: ResNet-18's
layout (basic blocks 2-2-2-2) and ResNet-50's (bottlenecks 3-4-6-3).
Each directory holds model.safetensors (the state dict, running statistics
included, after a few training-mode forwards so they are not the initial
0/1) and io.safetensors: an input batch and labels, the eval-mode logits,
the training-mode logits, first-step gradients of a few parameters
(`grad.<name>`), the losses of up to 5 SGD steps (momentum 0.9, the learning
rate in `lr`) from the checkpoint, as many as float32 and float64 agree on,
and layer1.0.bn1's running statistics after them.
"""
import argparse, copy, os
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idn = x if self.downsample is None else self.downsample(x)
        return F.relu(out + idn)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # torchvision v1.5
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        idn = x if self.downsample is None else self.downsample(x)
        return F.relu(h + idn)


class ResNet(nn.Module):
    def __init__(self, block, counts, widths, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        cin = widths[0]
        for i, (n, w) in enumerate(zip(counts, widths)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make(out, name, block, counts, widths, classes=10, seed=0, lr=0.02):
    torch.manual_seed(seed)
    m = ResNet(block, counts, widths, classes)
    for mod in m.modules():  # torchvision's initialisation
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
    g = torch.Generator().manual_seed(seed + 1)
    m.train()
    with torch.no_grad():  # running statistics away from their initial 0 / 1
        for _ in range(3):
            m(torch.randn(6, 3, 48, 48, generator=g) * 2 + 0.5)
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.normal_(1.0, 0.2, generator=g)
                mod.bias.normal_(0.0, 0.2, generator=g)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()},
              os.path.join(d, "model.safetensors"))
    x = torch.randn(6, 3, 48, 48, generator=g)
    labels = torch.randint(0, classes, (6,), generator=g)
    m.eval()
    with torch.no_grad():
        logits_eval = m(x)
    m.train()
    with torch.no_grad():
        logits_train = copy.deepcopy(m)(x)
    # First-step gradients of a few parameters (batch statistics included).
    probe = copy.deepcopy(m)
    F.cross_entropy(probe(x), labels).backward()
    grads = {f"grad.{n}": p.grad.clone() for n, p in probe.named_parameters()
             if n in ("conv1.weight", "layer1.0.conv2.weight", "layer4.0.bn1.weight", "fc.weight")}
    # The loss curve, kept for as many steps as float32 and float64 agree
    # to 1e-6 of the first loss: the narrow bottleneck net is chaotic
    # (float32 against float64 differ by 1e-2 after two steps), so its
    # curve checks only the steps a float32 runtime can reproduce.
    def train(model, xs, steps):
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        out = []
        for _ in range(steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(xs), labels)
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    curve32 = train(copy.deepcopy(m), x, 5)
    curve64 = train(copy.deepcopy(m).double(), x.double(), 5)
    keep = 1
    while keep < 5 and abs(curve32[keep] - curve64[keep]) < 1e-6 * abs(curve32[0]):
        keep += 1
    losses = train(m, x, keep)
    bn = m.layer1[0].bn1
    save_file({
        "input": x, "labels": labels, "logits_eval": logits_eval, "logits_train": logits_train,
        "losses": torch.tensor(losses), "lr": torch.tensor([lr]), "bn_running_mean": bn.running_mean.clone(),
        "bn_running_var": bn.running_var.clone(), **grads,
    }, os.path.join(d, "io.safetensors"))
    print(name, "steps kept", keep, "of float32", curve32, "float64", curve64)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/resnet")
    a = ap.parse_args()
    make(a.out, "resnet18_tiny", BasicBlock, [2, 2, 2, 2], [4, 8, 16, 32])
    make(a.out, "resnet50_tiny", Bottleneck, [3, 4, 6, 3], [4, 8, 16, 32], seed=3, lr=0.01)
