//! DDPM and DDIM sampling, as diffusers' `DDPMScheduler` and
//! `DDIMScheduler` compute it, read from their `scheduler_config.json`.
//!
//! A scheduler is host arithmetic over the noise schedule (`betas`,
//! `alphas_cumprod`, the inference timesteps); each step is a few
//! elementwise tensor ops with host coefficients, recorded like any other
//! ops, so one denoising step (the UNet and the update) fuses and runs as
//! one cached program. Noise is an argument, not drawn inside, so a caller
//! can replay another implementation's noise exactly; [`sample`] draws it
//! from lazyfuse's counter-based generator.

use crate::unet::UNet2DModel;
use crate::{ModelError, Result};
use lazyfuse::{Device, Key, Tensor};
use serde_json::Value;
use std::path::Path;

fn cfg(msg: impl Into<String>) -> ModelError {
    ModelError::Config(msg.into())
}

/// What the model predicts (`prediction_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prediction {
    /// The added noise (`"epsilon"`).
    Epsilon,
    /// The clean sample (`"sample"`).
    Sample,
    /// `sqrt(a) * noise - sqrt(1 - a) * x0` (`"v_prediction"`).
    V,
}

/// How inference timesteps are spread over the training ones
/// (`timestep_spacing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spacing {
    /// `round(linspace(0, T - 1, n))`, descending.
    Linspace,
    /// Multiples of `T / n` from 0, plus `steps_offset`, descending.
    Leading,
    /// `round(T - k * T / n) - 1`, descending.
    Trailing,
}

/// The keys of a diffusers scheduler config that DDPM and DDIM read, with
/// diffusers' defaults.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Training timesteps `T`.
    pub num_train_timesteps: usize,
    /// Noise variance at the first step (linear schedules).
    pub beta_start: f64,
    /// Noise variance at the last step (linear schedules).
    pub beta_end: f64,
    /// `"linear"`, `"scaled_linear"` or `"squaredcos_cap_v2"`.
    pub beta_schedule: String,
    /// Clip the predicted clean sample to `±clip_sample_range`.
    pub clip_sample: bool,
    /// See `clip_sample`.
    pub clip_sample_range: f64,
    /// What the model predicts.
    pub prediction_type: Prediction,
    /// Added to leading-spaced timesteps.
    pub steps_offset: usize,
    /// Inference timestep spacing.
    pub timestep_spacing: Spacing,
    /// DDIM: the cumulative alpha past the last step is 1 (else
    /// `alphas_cumprod[0]`).
    pub set_alpha_to_one: bool,
    /// DDPM: `"fixed_small"`, `"fixed_small_log"` or `"fixed_large"`.
    pub variance_type: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            num_train_timesteps: 1000,
            beta_start: 1e-4,
            beta_end: 0.02,
            beta_schedule: "linear".into(),
            clip_sample: true,
            clip_sample_range: 1.0,
            prediction_type: Prediction::Epsilon,
            steps_offset: 0,
            timestep_spacing: Spacing::Leading,
            set_alpha_to_one: true,
            variance_type: "fixed_small".into(),
        }
    }
}

impl SchedulerConfig {
    /// Reads `scheduler_config.json` from `dir` (a pipeline's
    /// `scheduler/` folder).
    pub fn load(dir: &Path) -> Result<SchedulerConfig> {
        let p = dir.join("scheduler_config.json");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| cfg(format!("cannot read {}: {e}", p.display())))?;
        SchedulerConfig::from_json(&text).map_err(|e| cfg(format!("{}: {e}", p.display())))
    }

    /// Parses a scheduler config body; unknown keys are ignored, as
    /// diffusers ignores the other schedulers' keys.
    pub fn from_json(text: &str) -> Result<SchedulerConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| cfg(e.to_string()))?;
        let mut c = SchedulerConfig::default();
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        let bad = |k: &str| cfg(format!("{k:?} has the wrong type"));
        if let Some(x) = get("num_train_timesteps") {
            c.num_train_timesteps = x.as_u64().ok_or_else(|| bad("num_train_timesteps"))? as usize;
        }
        for (k, slot) in [
            ("beta_start", &mut c.beta_start),
            ("beta_end", &mut c.beta_end),
            ("clip_sample_range", &mut c.clip_sample_range),
        ] {
            if let Some(x) = get(k) {
                *slot = x.as_f64().ok_or_else(|| bad(k))?;
            }
        }
        for (k, slot) in [
            ("clip_sample", &mut c.clip_sample),
            ("set_alpha_to_one", &mut c.set_alpha_to_one),
        ] {
            if let Some(x) = get(k) {
                *slot = x.as_bool().ok_or_else(|| bad(k))?;
            }
        }
        if let Some(x) = get("steps_offset") {
            c.steps_offset = x.as_u64().ok_or_else(|| bad("steps_offset"))? as usize;
        }
        let string = |k: &str| get(k).map(|x| x.as_str().map(str::to_string).ok_or_else(|| bad(k)));
        if let Some(s) = string("beta_schedule").transpose()? {
            c.beta_schedule = s;
        }
        if let Some(s) = string("variance_type").transpose()? {
            c.variance_type = s;
        }
        if let Some(s) = string("prediction_type").transpose()? {
            c.prediction_type = match s.as_str() {
                "epsilon" => Prediction::Epsilon,
                "sample" => Prediction::Sample,
                "v_prediction" => Prediction::V,
                o => return Err(cfg(format!("prediction_type {o:?} is not supported"))),
            };
        }
        if let Some(s) = string("timestep_spacing").transpose()? {
            c.timestep_spacing = match s.as_str() {
                "linspace" => Spacing::Linspace,
                "leading" => Spacing::Leading,
                "trailing" => Spacing::Trailing,
                o => return Err(cfg(format!("timestep_spacing {o:?} is not supported"))),
            };
        }
        if get("thresholding").and_then(Value::as_bool) == Some(true) {
            return Err(cfg("dynamic thresholding is not supported"));
        }
        if get("trained_betas").is_some() {
            return Err(cfg("trained_betas is not supported"));
        }
        c.alphas_cumprod()?;
        Ok(c)
    }

    /// `alphas_cumprod[t]`, in float32 as diffusers keeps it.
    pub fn alphas_cumprod(&self) -> Result<Vec<f32>> {
        let n = self.num_train_timesteps;
        if n < 2 {
            return Err(cfg("num_train_timesteps must be at least 2"));
        }
        let lin = |a: f64, b: f64| -> Vec<f32> {
            (0..n)
                .map(|i| (a + (b - a) * i as f64 / (n - 1) as f64) as f32)
                .collect()
        };
        let betas: Vec<f32> = match self.beta_schedule.as_str() {
            "linear" => lin(self.beta_start, self.beta_end),
            "scaled_linear" => lin(self.beta_start.sqrt(), self.beta_end.sqrt())
                .into_iter()
                .map(|b| b * b)
                .collect(),
            "squaredcos_cap_v2" => {
                let bar = |t: f64| {
                    ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2)
                        .cos()
                        .powi(2)
                };
                (0..n)
                    .map(|i| {
                        let (t1, t2) = (i as f64 / n as f64, (i + 1) as f64 / n as f64);
                        (1.0 - bar(t2) / bar(t1)).min(0.999) as f32
                    })
                    .collect()
            }
            o => return Err(cfg(format!("beta_schedule {o:?} is not supported"))),
        };
        let mut acc = 1f32;
        Ok(betas
            .iter()
            .map(|b| {
                acc *= 1.0 - b;
                acc
            })
            .collect())
    }

    /// The `steps` inference timesteps, descending.
    pub fn timesteps(&self, steps: usize) -> Result<Vec<usize>> {
        let t = self.num_train_timesteps;
        if steps == 0 || steps > t {
            return Err(cfg(format!(
                "inference steps must be in 1..={t} (the training timesteps), got {steps}"
            )));
        }
        let ts: Vec<usize> = match self.timestep_spacing {
            Spacing::Linspace => (0..steps)
                .map(|i| {
                    let x = if steps == 1 {
                        0.0
                    } else {
                        (t - 1) as f64 * i as f64 / (steps - 1) as f64
                    };
                    x.round_ties_even() as usize
                })
                .rev()
                .collect(),
            Spacing::Leading => (0..steps)
                .map(|i| i * (t / steps) + self.steps_offset)
                .rev()
                .collect(),
            Spacing::Trailing => {
                let r = t as f64 / steps as f64;
                (0..steps)
                    .map(|k| {
                        ((t as f64 - k as f64 * r).round_ties_even() as usize).saturating_sub(1)
                    })
                    .collect()
            }
        };
        if ts.iter().any(|&x| x >= t) {
            return Err(cfg(format!(
                "steps_offset {} puts a timestep past {t}",
                self.steps_offset
            )));
        }
        Ok(ts)
    }
}

/// The update of one denoising step: the predicted clean sample and noise.
fn predict(p: Prediction, out: &Tensor, x: &Tensor, a: f64) -> Result<(Tensor, Tensor)> {
    let (sa, sb) = (a.sqrt(), (1.0 - a).sqrt());
    Ok(match p {
        Prediction::Epsilon => (x.sub(&out.mul(sb)?)?.div(sa)?, out.clone()),
        Prediction::Sample => (out.clone(), x.sub(&out.mul(sa)?)?.div(sb)?),
        Prediction::V => (
            x.mul(sa)?.sub(&out.mul(sb)?)?,
            out.mul(sa)?.add(&x.mul(sb)?)?,
        ),
    })
}

/// A sampler over a fixed list of inference timesteps.
pub trait Scheduler {
    /// The inference timesteps, descending.
    fn timesteps(&self) -> &[usize];
    /// Whether [`Scheduler::step`] at `t` consumes noise.
    fn needs_noise(&self, t: usize) -> bool;
    /// The sample at the next (smaller) timestep from the model output
    /// `out` at timestep `t` of the sample `x`; `noise` (shaped like `x`)
    /// where [`Scheduler::needs_noise`] says so.
    fn step(&self, out: &Tensor, t: usize, x: &Tensor, noise: Option<&Tensor>) -> Result<Tensor>;
}

fn need(noise: Option<&Tensor>) -> Result<&Tensor> {
    noise.ok_or_else(|| ModelError::Input("this step adds noise: pass it".into()))
}

/// diffusers' `DDIMScheduler` with its `eta` (0: deterministic).
pub struct Ddim {
    cfg: SchedulerConfig,
    acp: Vec<f32>,
    timesteps: Vec<usize>,
    /// The stochasticity `eta` (0 for DDIM proper, 1 for DDPM-like noise).
    pub eta: f64,
}

impl Ddim {
    /// `steps` inference steps of the schedule `cfg`.
    pub fn new(cfg: SchedulerConfig, steps: usize) -> Result<Ddim> {
        Ok(Ddim {
            acp: cfg.alphas_cumprod()?,
            timesteps: cfg.timesteps(steps)?,
            cfg,
            eta: 0.0,
        })
    }

    fn alphas(&self, t: usize) -> (f64, f64, f64) {
        let a = self.acp[t] as f64;
        let prev = t as i64 - (self.cfg.num_train_timesteps / self.timesteps.len()) as i64;
        let ap = if prev >= 0 {
            self.acp[prev as usize] as f64
        } else if self.cfg.set_alpha_to_one {
            1.0
        } else {
            self.acp[0] as f64
        };
        let var = (1.0 - ap) / (1.0 - a) * (1.0 - a / ap);
        (a, ap, self.eta * var.sqrt())
    }
}

impl Scheduler for Ddim {
    fn timesteps(&self) -> &[usize] {
        &self.timesteps
    }

    fn needs_noise(&self, _t: usize) -> bool {
        self.eta > 0.0
    }

    fn step(&self, out: &Tensor, t: usize, x: &Tensor, noise: Option<&Tensor>) -> Result<Tensor> {
        let (a, ap, std) = self.alphas(t);
        let (mut x0, eps) = predict(self.cfg.prediction_type, out, x, a)?;
        if self.cfg.clip_sample {
            let r = self.cfg.clip_sample_range;
            x0 = x0.clamp(-r, r)?;
        }
        let dir = eps.mul((1.0 - ap - std * std).max(0.0).sqrt())?;
        let prev = x0.mul(ap.sqrt())?.add(&dir)?;
        Ok(if self.eta > 0.0 {
            prev.add(&need(noise)?.mul(std)?)?
        } else {
            prev
        })
    }
}

/// diffusers' `DDPMScheduler` (ancestral sampling).
pub struct Ddpm {
    cfg: SchedulerConfig,
    acp: Vec<f32>,
    timesteps: Vec<usize>,
}

impl Ddpm {
    /// `steps` inference steps (`num_train_timesteps` for the full chain).
    pub fn new(cfg: SchedulerConfig, steps: usize) -> Result<Ddpm> {
        if !["fixed_small", "fixed_small_log", "fixed_large"].contains(&cfg.variance_type.as_str())
        {
            return Err(self::cfg(format!(
                "variance_type {:?} is not supported (fixed_small, fixed_small_log, fixed_large)",
                cfg.variance_type
            )));
        }
        Ok(Ddpm {
            acp: cfg.alphas_cumprod()?,
            timesteps: cfg.timesteps(steps)?,
            cfg,
        })
    }

    fn prev(&self, t: usize) -> Option<usize> {
        let i = self.timesteps.iter().position(|&x| x == t)?;
        self.timesteps.get(i + 1).copied()
    }
}

impl Scheduler for Ddpm {
    fn timesteps(&self) -> &[usize] {
        &self.timesteps
    }

    fn needs_noise(&self, t: usize) -> bool {
        t > 0
    }

    fn step(&self, out: &Tensor, t: usize, x: &Tensor, noise: Option<&Tensor>) -> Result<Tensor> {
        let a = self.acp[t] as f64;
        let ap = self.prev(t).map_or(1.0, |p| self.acp[p] as f64);
        let (b, bp) = (1.0 - a, 1.0 - ap);
        let cur_alpha = a / ap;
        let cur_beta = 1.0 - cur_alpha;
        let (mut x0, _) = predict(self.cfg.prediction_type, out, x, a)?;
        if self.cfg.clip_sample {
            let r = self.cfg.clip_sample_range;
            x0 = x0.clamp(-r, r)?;
        }
        let mean = x0
            .mul(ap.sqrt() * cur_beta / b)?
            .add(&x.mul(cur_alpha.sqrt() * bp / b)?)?;
        if t == 0 {
            return Ok(mean);
        }
        let var = (bp / b * cur_beta).max(1e-20);
        let std = match self.cfg.variance_type.as_str() {
            "fixed_large" => cur_beta.sqrt(),
            _ => var.sqrt(),
        };
        Ok(mean.add(&need(noise)?.mul(std)?)?)
    }
}

/// Runs `scheduler`'s whole chain from `x` (pure noise at the first
/// timestep), the model predicting at each step, drawing the step noise
/// from `key`. Each step is computed before the next is recorded (a
/// sync point per step), so all steps share one compiled program. Calls
/// `progress` after each step (a progress bar).
pub fn sample(
    unet: &UNet2DModel,
    scheduler: &dyn Scheduler,
    x: Tensor,
    key: Key,
    mut progress: impl FnMut(usize),
) -> Result<Tensor> {
    // Sampling never differentiates: no tape, so no step keeps the UNet's
    // intermediates alive.
    let _no_grad = lazyfuse::NoGradGuard::new();
    let dev: Device = x.device().clone();
    let mut x = x;
    for (i, &t) in scheduler.timesteps().iter().enumerate() {
        let ts = Tensor::from_slice(&[t as f32], &[1], &dev)?;
        let out = unet.forward(&x, &ts)?;
        let noise = if scheduler.needs_noise(t) {
            Some(Tensor::randn(x.dims(), key.fold_in(i as u64), &dev)?)
        } else {
            None
        };
        x = scheduler.step(&out, t, &x, noise.as_ref())?;
        // One step per program: the same cached executable every step,
        // instead of one ever-larger graph of the whole chain.
        x.realize()?;
        progress(i);
    }
    Ok(x)
}
