//! Samples images with a diffusers UNet2DModel and a DDIM or DDPM
//! scheduler, and writes them as a PNG grid.
//!
//! Run: `cargo run --release --example sample_unet -- [--model DIR]
//! [--sampler ddim|ddpm] [--steps N] [--eta E] [--n IMAGES] [--seed S]
//! [--out grid.png]`
//!
//! DIR is a diffusers pipeline directory (`unet/` and `scheduler/`, as in
//! `google/ddpm-cifar10-32`) or a UNet directory (`config.json` and
//! `diffusion_pytorch_model.safetensors`) with the scheduler config beside
//! it. Without `--model` it samples the tiny random test UNet in
//! `tests/fixtures/unet/small` (so the images are structured noise: the
//! run shows the machinery, not a trained model). Each denoising step is
//! one fused, cached program: the first step compiles, the rest reuse it.

#[path = "support/progress.rs"]
mod progress;

use lazyfuse::{metrics, Device, Key, Tensor};
use lazyfuse_models::diffusion::{self, Ddim, Ddpm, Scheduler, SchedulerConfig};
use lazyfuse_models::UNet2DModel;
use plotters::prelude::{BitMapBackend, Color, DrawingBackend, RGBColor};
use progress::Progress;
use std::path::{Path, PathBuf};

struct Args {
    model: PathBuf,
    sampler: String,
    steps: usize,
    eta: f64,
    n: usize,
    seed: u64,
    out: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        model: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unet/small"),
        sampler: "ddim".into(),
        steps: 50,
        eta: 0.0,
        n: 16,
        seed: 0,
        out: "unet_samples.png".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |s: String| s.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--model" => a.model = val()?.into(),
            "--sampler" => a.sampler = val()?,
            "--steps" => a.steps = num(val()?)? as usize,
            "--eta" => a.eta = num(val()?)?,
            "--n" => a.n = (num(val()?)? as usize).max(1),
            "--seed" => a.seed = num(val()?)? as u64,
            "--out" => a.out = val()?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other:?} (see the file's header)"
                ))
            }
        }
    }
    Ok(a)
}

/// The UNet directory and the scheduler config of a pipeline or UNet dir.
fn locate(dir: &Path, sampler: &str) -> (PathBuf, SchedulerConfig) {
    let unet = if dir.join("unet/config.json").is_file() {
        dir.join("unet")
    } else {
        dir.to_path_buf()
    };
    let candidates = [
        dir.join("scheduler"),
        unet.join("../scheduler"),
        unet.join(sampler),
    ];
    let cfg = candidates
        .iter()
        .find(|d| d.join("scheduler_config.json").is_file())
        .map(|d| SchedulerConfig::load(d).expect("a readable scheduler_config.json"))
        .unwrap_or_default();
    (unet, cfg)
}

/// Tiles `[n, c, s, s]` samples in [-1, 1] into a grid PNG at `out`.
fn write_grid(x: &[f32], n: usize, c: usize, s: usize, out: &Path) -> Result<(), String> {
    let cols = (n as f64).sqrt().ceil() as usize;
    let rows = n.div_ceil(cols);
    let zoom = (128 / s).max(1);
    let (gap, tile) = (2, s * zoom);
    let (w, h) = (cols * (tile + gap) + gap, rows * (tile + gap) + gap);
    let mut root = BitMapBackend::new(out, (w as u32, h as u32));
    let px = |v: f32| ((v / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8;
    for i in 0..n {
        let (ox, oy) = (
            gap + (i % cols) * (tile + gap),
            gap + (i / cols) * (tile + gap),
        );
        for y in 0..tile {
            for xx in 0..tile {
                let at = |ch: usize| x[((i * c + ch.min(c - 1)) * s + y / zoom) * s + xx / zoom];
                let col = RGBColor(px(at(0)), px(at(1)), px(at(2)));
                root.draw_pixel(((ox + xx) as i32, (oy + y) as i32), col.to_backend_color())
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    root.present().map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let dev = Device::cpu()?;
    let (unet_dir, cfg) = locate(&a.model, &a.sampler);
    let unet = UNet2DModel::load(&unet_dir, &dev)?;
    let scheduler: Box<dyn Scheduler> = match a.sampler.as_str() {
        "ddim" => {
            let mut s = Ddim::new(cfg, a.steps)?;
            s.eta = a.eta;
            Box::new(s)
        }
        "ddpm" => Box::new(Ddpm::new(cfg, a.steps)?),
        other => return Err(format!("--sampler {other:?}: ddim or ddpm").into()),
    };
    let (c, s) = (unet.config.out_channels, unet.config.sample_size);
    if unet.config.in_channels != c || unet.config.num_class_embeds.is_some() {
        return Err(
            "this example samples unconditional UNets whose input and output channels agree".into(),
        );
    }
    println!(
        "{} images of {c}x{s}x{s}, {} {} steps, UNet from {}",
        a.n,
        scheduler.timesteps().len(),
        a.sampler,
        unet_dir.display()
    );
    let key = Key::from(a.seed);
    let x = Tensor::randn(&[a.n, c, s, s], key.fold_in(u64::MAX), &dev)?;
    let compiles_before = metrics::snapshot().compiles;
    let mut bar = Progress::with_unit(scheduler.timesteps().len(), "steps");
    let t0 = std::time::Instant::now();
    let x = diffusion::sample(&unet, scheduler.as_ref(), x, key, |i| bar.advance(i + 1))?;
    let pixels = x.to_vec::<f32>()?;
    let secs = t0.elapsed().as_secs_f64();
    let compiles = metrics::snapshot().compiles - compiles_before;
    write_grid(&pixels, a.n, c, s, &a.out)?;
    println!(
        "sampled in {secs:.2} s ({:.1} ms per step, {} compiles); wrote {}",
        1e3 * secs / scheduler.timesteps().len() as f64,
        compiles,
        a.out.display()
    );
    Ok(())
}
