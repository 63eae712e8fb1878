//! The load benchmark's numbers: per-request samples, the summary per
//! request rate (throughput and latency percentiles), its table row and
//! JSON, and a latency-against-throughput chart of several runs.

use plotters::prelude::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Words for text prompts (`--prompt-kind words`, chat).
pub const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away",
    "a", "of", "to", "in", "is", "it", "on", "for", "with", "as", "at", "by", "from", "up", "red",
    "green", "blue", "cat", "bird", "fish", "tree", "river", "hill", "sky", "sun", "moon", "star",
    "rain", "snow", "wind", "fire", "stone", "sand", "sea", "ship", "road", "town", "house",
];

/// One request's timings, in seconds.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Send to first token.
    pub ttft: f64,
    /// Send to last byte.
    pub e2e: f64,
    /// Gaps between consecutive streamed tokens.
    pub itl: Vec<f64>,
    /// Tokens generated.
    pub output_tokens: usize,
}

/// The summary of one rate.
#[derive(Clone, Debug)]
pub struct Report {
    /// Which server.
    pub label: String,
    /// Requests per second (infinite: a burst).
    pub rate: f64,
    /// Wall time of the run.
    pub duration: f64,
    /// Requests answered in full.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Completed requests per second.
    pub req_per_s: f64,
    /// Generated tokens per second.
    pub out_tok_per_s: f64,
    /// p50, p90, p99 of time to first token (ms).
    pub ttft_ms: [f64; 3],
    /// p50, p90, p99 of time per output token after the first (ms).
    pub tpot_ms: [f64; 3],
    /// p50, p90, p99 of inter-token latency (ms).
    pub itl_ms: [f64; 3],
}

fn percentiles(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] * 1e3;
    [at(0.5), at(0.9), at(0.99)]
}

impl Report {
    /// Summarises `samples` of a run that took `duration` seconds.
    pub fn new(
        label: &str,
        rate: f64,
        duration: f64,
        samples: Vec<Sample>,
        failed: usize,
    ) -> Report {
        let tokens: usize = samples.iter().map(|s| s.output_tokens).sum();
        let tpot = samples
            .iter()
            .filter(|s| s.output_tokens > 1)
            .map(|s| (s.e2e - s.ttft) / (s.output_tokens - 1) as f64)
            .collect();
        Report {
            label: label.into(),
            rate,
            duration,
            completed: samples.len(),
            failed,
            req_per_s: samples.len() as f64 / duration,
            out_tok_per_s: tokens as f64 / duration,
            ttft_ms: percentiles(samples.iter().map(|s| s.ttft).collect()),
            tpot_ms: percentiles(tpot),
            itl_ms: percentiles(samples.iter().flat_map(|s| s.itl.iter().copied()).collect()),
        }
    }

    /// The table's header.
    pub fn header() -> String {
        format!(
            "{:<18} {:>6} {:>6} {:>7} {:>9} {:>26} {:>20} {:>20}",
            "server",
            "rate",
            "ok/err",
            "req/s",
            "out tok/s",
            "TTFT p50/p90/p99 ms",
            "TPOT p50/p90/p99",
            "ITL p50/p90/p99"
        )
    }

    /// This report as a table row.
    pub fn row(&self) -> String {
        let f = |p: &[f64; 3]| format!("{:.1}/{:.1}/{:.1}", p[0], p[1], p[2]);
        let rate = if self.rate.is_finite() {
            format!("{}", self.rate)
        } else {
            "burst".into()
        };
        format!(
            "{:<18} {:>6} {:>6} {:>7.2} {:>9.1} {:>26} {:>20} {:>20}",
            self.label,
            rate,
            format!("{}/{}", self.completed, self.failed),
            self.req_per_s,
            self.out_tok_per_s,
            f(&self.ttft_ms),
            f(&self.tpot_ms),
            f(&self.itl_ms)
        )
    }

    /// The report as JSON (what `--json` writes and `--chart` reads).
    pub fn to_json(&self) -> Value {
        json!({
            "label": self.label, "rate": if self.rate.is_finite() { json!(self.rate) } else { json!("inf") },
            "duration_s": self.duration, "completed": self.completed, "failed": self.failed,
            "req_per_s": self.req_per_s, "output_tokens_per_s": self.out_tok_per_s,
            "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "itl_ms": self.itl_ms,
        })
    }
}

/// A run's points: (output tokens/s, p99 TTFT ms, p50 TPOT ms).
type Points = Vec<(f64, f64, f64)>;

/// Two panels, p99 time to first token and p50 time per output token,
/// against output tokens/s, one line per label, from `--json` files.
pub fn chart(out: &Path, files: &[PathBuf]) -> Result<(), String> {
    let mut series: Vec<(String, Points)> = vec![];
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let runs: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        for r in runs {
            let label = r["label"].as_str().unwrap_or("?").to_string();
            let point = (
                r["output_tokens_per_s"].as_f64().unwrap_or(0.0),
                r["ttft_ms"][2].as_f64().unwrap_or(0.0),
                r["tpot_ms"][0].as_f64().unwrap_or(0.0),
            );
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, pts)) => pts.push(point),
                None => series.push((label, vec![point])),
            }
        }
    }
    for (_, pts) in &mut series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    // Text is drawn from a font embedded in the binary: no system fonts.
    let _ =
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    let root = BitMapBackend::new(out, (1100, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 2));
    let max_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max)
        * 1.1;
    for (panel, (title, pick)) in panels.iter().zip([
        ("p99 time to first token (ms)", 1usize),
        ("p50 time per output token (ms)", 2),
    ]) {
        let y = |q: &(f64, f64, f64)| if pick == 1 { q.1 } else { q.2 };
        let max_y = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(y))
            .fold(1.0, f64::max)
            * 1.1;
        let mut c = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc("output tokens/s")
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            c.draw_series(LineSeries::new(
                pts.iter().map(|q| (q.0, y(q))),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
            c.draw_series(
                pts.iter()
                    .map(|q| Circle::new((q.0, y(q)), 4, color.filled())),
            )
            .map_err(|e| e.to_string())?;
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
