"""diffusers' UNet2DModel (the committed fixtures of
``scripts/make_unet_fixtures.py``, and a fresh model) on the lazyfuse device
and under ``torch.compile(backend="lazyfuse")``: the denoiser output, a
DDIM sampling loop driven by diffusers' own scheduler, and training steps
along PyTorch's CPU eager loss curve without graph breaks."""

import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import lazyfuse  # noqa: F401  (registers the device and the backend)

diffusers = pytest.importorskip("diffusers")

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "unet")


def load(name):
    return diffusers.UNet2DModel.from_pretrained(os.path.join(FIXTURES, name)).eval()


def inputs(name):
    from safetensors.torch import load_file
    return load_file(os.path.join(FIXTURES, name, "io.safetensors"))


def close(got, want, tol=1e-4):
    torch.testing.assert_close(got, want, atol=tol * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("name", ["small", "variant"])
def test_denoiser_matches_cpu_eager_on_the_device_and_compiled(name):
    io = inputs(name)
    kw = {"class_labels": io["class_labels"]} if "class_labels" in io else {}
    with torch.no_grad():
        want = load(name)(io["sample"], io["timesteps"], **kw).sample
        close(want, io["out"])
        dev = load(name).to("lazyfuse")
        dkw = {k: v.to("lazyfuse") for k, v in kw.items()}
        got = dev(io["sample"].to("lazyfuse"), io["timesteps"].to("lazyfuse"), **dkw).sample
        close(got.cpu(), want)
        torch._dynamo.reset()  # count this model's frames only
        counter = CompileCounterWithBackend("lazyfuse")
        cm = torch.compile(load(name), backend=counter)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unlowered op warns: fail on it
            close(cm(io["sample"], io["timesteps"], **kw).sample, want)
        assert counter.frame_count == 1, counter.frame_count


def test_ddim_sampling_loop_on_the_device_matches_the_fixture():
    """diffusers' DDIMScheduler stepping on lazyfuse tensors: the loop a
    pipeline runs, unmodified."""
    io = inputs("small")
    sched = diffusers.DDIMScheduler.from_pretrained(os.path.join(FIXTURES, "small", "ddim"))
    sched.set_timesteps(6)
    model = load("small").to("lazyfuse")
    x = io["ddim_x"].to("lazyfuse")
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(model(x, t.to("lazyfuse")).sample, t, x, eta=0.0).prev_sample
    close(x.cpu(), io["ddim_out"])


def curve(model, run, steps=4):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for s in range(steps):
        g = torch.Generator().manual_seed(s)
        x0 = torch.randn(2, 3, 16, 16, generator=g)
        noise = torch.randn(2, 3, 16, 16, generator=g)
        t = torch.randint(0, 1000, (2,), generator=g)
        opt.zero_grad()
        loss = run(x0, noise, t)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_training_steps_follow_cpu_eager_on_the_device_and_compiled():
    """The denoising objective (predict the noise added to a sample),
    AdamW, on a fresh model with attention at both levels."""
    torch.manual_seed(0)
    ref = diffusers.UNet2DModel(
        sample_size=16, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D"),
        norm_num_groups=4, attention_head_dim=8,
    )
    sched = diffusers.DDPMScheduler(num_train_timesteps=1000)

    def objective(model, dev):
        def run(x0, noise, t):
            noisy = sched.add_noise(x0, noise, t)
            pred = model(noisy.to(dev), t.to(dev)).sample
            return F.mse_loss(pred, noise.to(dev))
        return run

    dev_model = copy.deepcopy(ref).to("lazyfuse")
    compiled = copy.deepcopy(ref)
    want = curve(ref, objective(ref, "cpu"))
    got = curve(dev_model, objective(dev_model, "lazyfuse"))
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("lazyfuse")
    cm = torch.compile(compiled, backend=counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = curve(compiled, objective(cm, "cpu"))
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)
    assert counter.frame_count == 1, counter.frame_count


@pytest.mark.parametrize("causal,mask", [(False, False), (True, False), (False, True)])
def test_compiled_attention_gradients_match_cpu_eager(causal, mask):
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward`` (what
    AOT autograd emits for attention) lowered through the runtime's rules."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, requires_grad=True) for _ in range(3))
    m = torch.randn(5, 5, generator=g) if mask else None

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal).square().sum()

    f(q, k, v).backward()
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.compile(f, backend="lazyfuse")(q, k, v).backward()
    for t, w in zip((q, k, v), want):
        close(t.grad, w, 1e-5)
