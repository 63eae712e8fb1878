//! A one-line progress bar for the training examples (no dependency): a `\r`
//! line with the step, a bar, the latest loss and the rate in steps/s.

use std::io::Write;
use std::time::Instant;

/// Tracks steps since `start` and redraws the line at most every 100 ms.
pub struct Progress {
    total: usize,
    start: Instant,
    last_draw: Instant,
}

impl Progress {
    /// A bar for `total` steps, starting now.
    pub fn new(total: usize) -> Self {
        let now = Instant::now();
        Progress {
            total,
            start: now,
            last_draw: now,
        }
    }

    /// Steps per second over the whole run so far.
    pub fn rate(&self, done: usize) -> f64 {
        done as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Redraws after step `done` (1-based) with the latest `loss`.
    pub fn update(&mut self, done: usize, loss: f32) {
        if done < self.total && self.last_draw.elapsed().as_millis() < 100 {
            return;
        }
        self.last_draw = Instant::now();
        let width = 30;
        let filled = width * done / self.total.max(1);
        let bar: String = (0..width)
            .map(|i| {
                if i < filled {
                    '='
                } else if i == filled {
                    '>'
                } else {
                    ' '
                }
            })
            .collect();
        eprint!(
            "\rstep {done:>5}/{} [{bar}] loss {loss:.4}  {:.1} steps/s ",
            self.total,
            self.rate(done)
        );
        let _ = std::io::stderr().flush();
        if done == self.total {
            eprintln!();
        }
    }
}
