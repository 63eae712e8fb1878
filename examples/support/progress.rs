//! The examples' progress bar: `indicatif`'s, with the step count, the rate
//! and (for training) the latest loss. Hidden when stderr is not a terminal,
//! so logs stay clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;

/// A bar over `total` steps, started at creation.
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
}

impl Progress {
    /// A bar for `total` steps of `unit` (e.g. "steps", "tokens"), starting now.
    pub fn with_unit(total: usize, unit: &str) -> Self {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{{pos:>5}}/{{len}} {unit} [{{bar:30}}] {{per_sec}} {{msg}}"
            ))
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Progress {
            bar,
            start: Instant::now(),
        }
    }

    /// A bar for `total` training steps.
    #[allow(dead_code)]
    pub fn new(total: usize) -> Self {
        Progress::with_unit(total, "steps")
    }

    /// Steps per second over the whole run so far.
    #[allow(dead_code)]
    pub fn rate(&self, done: usize) -> f64 {
        done as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }

    /// Seconds since the start.
    #[allow(dead_code)]
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// After step `done` (1-based), with the latest `loss`.
    #[allow(dead_code)]
    pub fn update(&mut self, done: usize, loss: f32) {
        self.bar.set_message(format!("loss {loss:.4}"));
        self.advance(done);
    }

    /// After step `done` (1-based).
    pub fn advance(&mut self, done: usize) {
        self.bar.set_position(done as u64);
        if done as u64 >= self.bar.length().unwrap_or(0) {
            self.bar.finish();
        }
    }
}
