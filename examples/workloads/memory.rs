//! Peak memory of a workload's timed steps, for the report: the process's
//! resident-set peak (`VmHWM`) over the steps, less its resident size
//! (`VmRSS`) just before them. So a step that makes a table-sized
//! temporary (a dense gradient of a 10M-row embedding) shows it, while the
//! table itself, resident before and after, does not. Linux only (the
//! peak is reset by writing 5 to /proc/self/clear_refs); elsewhere `None`.

fn status_kb(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A measurement in progress: the resident size at its start.
pub struct StepPeak {
    before_kb: Option<f64>,
}

impl StepPeak {
    /// Resets the process's peak to its current resident size and notes it.
    pub fn start() -> StepPeak {
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        StepPeak {
            before_kb: if reset { status_kb("VmRSS:") } else { None },
        }
    }

    /// MB the peak rose above the resident size at the start.
    pub fn finish(self) -> Option<f64> {
        let peak = status_kb("VmHWM:")?;
        Some((peak - self.before_kb?).max(0.0) / 1024.0)
    }
}
