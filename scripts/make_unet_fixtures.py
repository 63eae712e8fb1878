"""Makes the tiny diffusers UNet2DModel checkpoints under tests/fixtures/unet/.

Run by hand (not in CI; cargo test reads only the files this writes):
    python3 scripts/make_unet_fixtures.py [--out tests/fixtures/unet]
with torch and diffusers installed (`pip install diffusers==0.35.2`).

Two narrow models, written with diffusers' own `save_pretrained` (so the
directory is what a Hugging Face UNet checkpoint looks like: config.json and
diffusion_pytorch_model.safetensors):
  small/    the default UNet2DModel recipe (DownBlock2D + AttnDownBlock2D,
            positional timesteps with cos first, group norm everywhere),
            two layers per block;
  variant/  the DDPM-CIFAR style settings and the less common switches:
            sin-first embeddings with freq_shift 1, downsample_padding 0,
            scale-shift time conditioning (so the mid-block attention has no
            group norm), resnet down/upsamplers, class embeddings, a centred
            input and mid_block_scale_factor sqrt(2).
Every parameter is jittered away from its initial value (group norms at
scale 1 and shift 0 would hide a swapped name).

Each directory also holds io.safetensors: `sample`, `timesteps`, the
output `out` (and `class_labels` where used). small/ adds two scheduler
runs, each with its scheduler_config.json in a subdirectory:
  ddim/  DDIMScheduler, 6 steps, eta 0, from `ddim_x` -> `ddim_out`;
  ddpm/  DDPMScheduler (squaredcos_cap_v2), 5 steps, from `ddpm_x`, the
         variance noise of each step in `ddpm_noise` [steps, ...] ->
         `ddpm_out`.
and 5 SGD steps (lr 0.05, momentum 0.9) of the noise-prediction loss on
fixed noised batches: `train_noisy`, `train_noise`, `train_t`, the losses
`train_losses` and `conv_in.weight` after them.
"""
import argparse, json, math, os
import torch
from diffusers import UNet2DModel, DDIMScheduler, DDPMScheduler
from safetensors.torch import save_file

CONFIGS = {
    "small": dict(
        sample_size=16, in_channels=3, out_channels=3,
        block_out_channels=(16, 32), layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=8,
    ),
    "variant": dict(
        sample_size=16, in_channels=2, out_channels=3,
        block_out_channels=(16, 32, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=None, norm_eps=1e-6,
        flip_sin_to_cos=False, freq_shift=1, downsample_padding=0,
        resnet_time_scale_shift="scale_shift", downsample_type="resnet",
        upsample_type="resnet", num_class_embeds=5, center_input_sample=True,
        mid_block_scale_factor=math.sqrt(2.0), time_embedding_dim=48,
    ),
}


def jitter(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/unet")
    args = ap.parse_args()
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        torch.manual_seed(100 + i)
        model = UNet2DModel(**cfg).eval()
        jitter(model, 200 + i)
        d = os.path.join(args.out, name)
        model.save_pretrained(d, safe_serialization=True)
        io = {}
        sample = torch.randn(2, cfg["in_channels"], 16, 16)
        timesteps = torch.tensor([7, 640], dtype=torch.long)
        kw = {}
        if cfg.get("num_class_embeds"):
            kw["class_labels"] = torch.tensor([3, 0], dtype=torch.long)
            io["class_labels"] = kw["class_labels"]
        with torch.no_grad():
            io["out"] = model(sample, timesteps, **kw).sample
        io["sample"], io["timesteps"] = sample, timesteps
        if name == "small":
            ddim = DDIMScheduler(num_train_timesteps=1000, clip_sample=True)
            ddim.save_pretrained(os.path.join(d, "ddim"))
            ddim.set_timesteps(6)
            x = torch.randn(1, 3, 16, 16)
            io["ddim_x"] = x.clone()
            with torch.no_grad():
                for t in ddim.timesteps:
                    x = ddim.step(model(x, t).sample, t, x, eta=0.0).prev_sample
            io["ddim_out"] = x
            ddpm = DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2")
            ddpm.save_pretrained(os.path.join(d, "ddpm"))
            ddpm.set_timesteps(5)
            gen = torch.Generator().manual_seed(7)
            x = torch.randn(1, 3, 16, 16)
            io["ddpm_x"] = x.clone()
            noises = []
            with torch.no_grad():
                for t in ddpm.timesteps:
                    # The step draws its variance noise from `gen`: replay it.
                    probe = torch.Generator().set_state(gen.get_state())
                    noises.append(torch.randn(x.shape, generator=probe))
                    x = ddpm.step(model(x, t).sample, t, x, generator=gen).prev_sample
            io["ddpm_noise"] = torch.stack(noises)
            io["ddpm_out"] = x
            # Training: the noise-prediction objective, SGD with momentum,
            # from the checkpoint, on fixed noised batches.
            steps = 5
            x0 = torch.randn(steps, 2, 3, 16, 16)
            noise = torch.randn(steps, 2, 3, 16, 16)
            t = torch.randint(0, 1000, (steps, 2))
            noisy = torch.stack([ddpm.add_noise(x0[i], noise[i], t[i]) for i in range(steps)])
            trained = UNet2DModel.from_pretrained(d).train()
            opt = torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9)
            losses = []
            for i in range(steps):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(trained(noisy[i], t[i]).sample, noise[i])
                loss.backward()
                opt.step()
                losses.append(loss.item())
            io["train_noisy"], io["train_noise"], io["train_t"] = noisy, noise, t
            io["train_losses"] = torch.tensor(losses)
            io["train_conv_in_weight"] = trained.conv_in.weight.detach().clone()
        save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(d, "io.safetensors"))
        print(name, "->", d, "out", tuple(io["out"].shape), "abs max", float(io["out"].abs().max()))


if __name__ == "__main__":
    main()
