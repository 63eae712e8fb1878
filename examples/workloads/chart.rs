//! `--chart PATH`: a PNG bar chart of the ratios the runner prints.
//!
//! The table is exact, but a picture shows at a glance where lazyfuse wins and
//! by how much: one group of bars per workload, one bar per other system, each
//! the system's median time divided by lazyfuse's fused median time (the
//! table's `X / lazyfuse` columns), with a line at 1.0. When there is nothing
//! to divide (only one lazyfuse mode ran and no peers, or fused did not run)
//! the bars are the absolute median ms instead.
//!
//! plotters is used without its default features, which would bring font-kit
//! and through it the system's fontconfig and freetype; its `ab_glyph` feature
//! draws text from a font handed to it as bytes, DejaVu Sans as embedded by the
//! `dejavu` crate, so the example builds and draws with the Rust toolchain alone.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::ops::Range;
use std::path::Path;

/// The system every ratio is taken against, as in the table's ratio columns.
pub const BASE: &str = "lazyfuse";

/// What the bars measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `system_ms / lazyfuse_fused_ms`, one series per system other than [`BASE`].
    Ratio,
    /// Median ms per iteration, one series per system.
    AbsoluteMs,
}

/// One system's bars, one value per workload (`None`: it has no figure there).
#[derive(Debug, PartialEq)]
pub struct Series {
    pub system: String,
    pub values: Vec<Option<f64>>,
}

/// Everything the chart shows, computed from the runner's figures (kept apart
/// from the drawing so it can be tested without rendering).
#[derive(Debug)]
pub struct ChartData {
    pub kind: Kind,
    pub workloads: Vec<String>,
    pub series: Vec<Series>,
}

impl ChartData {
    /// `figures` are `(workload, system, median_ms)`; systems keep the order
    /// of their first figure, as the table's columns do.
    pub fn from_figures(figures: &[(&str, &str, f64)], names: &[String]) -> ChartData {
        let mut systems: Vec<&str> = Vec::new();
        for &(_, s, _) in figures {
            if !systems.contains(&s) {
                systems.push(s);
            }
        }
        let get = |w: &str, s: &str| {
            figures
                .iter()
                .find(|f| f.0 == w && f.1 == s)
                .map(|f| f.2)
                .filter(|ms| ms.is_finite() && *ms > 0.0)
        };
        let ratios: Vec<Series> = systems
            .iter()
            .filter(|s| **s != BASE)
            .map(|s| Series {
                system: s.to_string(),
                values: names
                    .iter()
                    .map(|n| Some(get(n, s)? / get(n, BASE)?))
                    .collect(),
            })
            .filter(|s| s.values.iter().any(Option::is_some))
            .collect();
        if !ratios.is_empty() {
            return ChartData {
                kind: Kind::Ratio,
                workloads: names.to_vec(),
                series: ratios,
            };
        }
        ChartData {
            kind: Kind::AbsoluteMs,
            workloads: names.to_vec(),
            series: systems
                .iter()
                .map(|s| Series {
                    system: s.to_string(),
                    values: names.iter().map(|n| get(n, s)).collect(),
                })
                .collect(),
        }
    }

    fn title(&self) -> &'static str {
        match self.kind {
            Kind::Ratio => "time relative to lazyfuse (fused); >1 means lazyfuse is faster",
            Kind::AbsoluteMs => "median time per iteration (ms); lower is faster",
        }
    }

    fn y_desc(&self, log: bool) -> String {
        let base = match self.kind {
            Kind::Ratio => "system ms / lazyfuse fused ms",
            Kind::AbsoluteMs => "median ms per iteration",
        };
        if log {
            format!("{base} (log scale)")
        } else {
            base.to_string()
        }
    }

    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
    }
}

/// The y axis: linear from 0, or logarithmic when the values span so much
/// that the small bars would be invisible next to the large ones. Plotting is
/// on a linear axis of `log10(value)` in the log case, so both share one code path.
#[derive(Debug)]
struct Scale {
    log: bool,
    lo: f64,
    hi: f64,
    /// Tick positions, in plot coordinates.
    ticks: Vec<f64>,
}

/// Above this max/min spread the axis goes logarithmic.
const LOG_SPREAD: f64 = 30.0;

impl Scale {
    fn new(values: &[f64]) -> Scale {
        let max = values.iter().copied().fold(f64::MIN, f64::max);
        let min = values.iter().copied().fold(f64::MAX, f64::min);
        if min > 0.0 && max / min > LOG_SPREAD {
            // Room below the smallest bar so it still shows, and above the
            // largest for its value label.
            let lo = min.log10() - 0.3;
            let hi = max.log10() + 0.15;
            let mut ticks = Vec::new();
            for decade in (lo.floor() as i32)..=(hi.ceil() as i32) {
                for m in [1.0, 2.0, 5.0] {
                    let t = (m * 10f64.powi(decade)).log10();
                    if (lo..=hi).contains(&t) {
                        ticks.push(t);
                    }
                }
            }
            Scale {
                log: true,
                lo,
                hi,
                ticks,
            }
        } else {
            let hi = max * 1.12;
            Scale {
                log: false,
                lo: 0.0,
                hi,
                ticks: linear_ticks(hi),
            }
        }
    }

    fn to_plot(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    fn label(&self, y: f64) -> String {
        fmt_num(if self.log { 10f64.powf(y) } else { y })
    }
}

/// Ticks from 0 to `hi` at a 1-2-5 step, five to nine of them.
fn linear_ticks(hi: f64) -> Vec<f64> {
    let raw = hi / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (0..)
        .map(|i| i as f64 * step)
        .take_while(|t| *t <= hi)
        .collect()
}

/// Three significant digits, trailing zeros dropped: 0.0005, 0.123, 2.35, 12.3, 123.
fn fmt_num(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A linear f64 axis with ticks exactly where we say: workload names at group
/// centres on x, [`Scale`]'s ticks on y. (plotters' own `with_key_points`
/// cannot be used here: its f64 form has no label formatting for the mesh.)
struct Ticked {
    inner: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ticked {
    fn new(range: Range<f64>, ticks: Vec<f64>) -> Ticked {
        Ticked {
            inner: range.into(),
            ticks,
        }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// Fixed colours for the systems the runner knows, so charts compare across
/// runs; others take the rest of the palette in order.
fn color(system: &str, index: usize) -> RGBColor {
    const OTHERS: [RGBColor; 5] = [
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    match system {
        "lazyfuse" => RGBColor(0, 128, 128),
        "lazyfuse-nofusion" => RGBColor(255, 127, 14),
        "torch" => RGBColor(214, 39, 40),
        "xla" => RGBColor(44, 160, 44),
        "jaxjit" => RGBColor(31, 119, 180),
        "jaxeager" => RGBColor(148, 103, 189),
        _ => OTHERS[index % OTHERS.len()],
    }
}

/// Rejects, before any workload runs, a path the chart could not be written
/// to, so a typo does not cost a whole run.
pub fn check_path(path: &Path) -> Result<(), String> {
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"))
    {
        return Err(format!(
            "--chart {}: the chart is a PNG; give a path ending in .png",
            path.display()
        ));
    }
    if path.is_dir() {
        return Err(format!("--chart {}: is a directory", path.display()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(format!(
                "--chart {}: directory {} does not exist",
                path.display(),
                dir.display()
            ));
        }
    }
    Ok(())
}

/// plotters' `ab_glyph` text looks fonts up by family name; the chart uses
/// "sans-serif", regular and bold.
fn register_fonts() -> Result<(), Box<dyn Error>> {
    let bad = |_| "the embedded DejaVu Sans font did not parse";
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(bad)?;
    plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
        .map_err(bad)?;
    Ok(())
}

/// Draws `data` as grouped bars and writes it to `path` as a PNG.
pub fn write_png(path: &Path, data: &ChartData) -> Result<(), Box<dyn Error>> {
    let values: Vec<f64> = data.values().collect();
    if values.is_empty() {
        return Err("no figures to chart".into());
    }
    register_fonts()?;
    let reference = (data.kind == Kind::Ratio).then_some(1.0);
    let scale = Scale::new(&values);

    let n = data.workloads.len();
    let k = data.series.len().max(1);
    let group_px = (k as u32 * 60 + 40).max(180);
    let legend_px = 250;
    let width = (130 + n as u32 * group_px + legend_px).max(900);
    let height = 640;

    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    // (The tuple form: `FontDesc::style` would keep the regular face.)
    let body = root.titled(data.title(), ("sans-serif", 24, FontStyle::Bold))?;
    let (plot, legend) = body.split_horizontally(width - legend_px);

    let centers: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
    let mut chart = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(90)
        .build_cartesian_2d(
            Ticked::new(0.0..n as f64, centers),
            Ticked::new(scale.lo..scale.hi, scale.ticks.clone()),
        )?;
    let x_label = |x: &f64| {
        data.workloads
            .get(x.floor() as usize)
            .cloned()
            .unwrap_or_default()
    };
    let y_label = |y: &f64| scale.label(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(0)
        .bold_line_style(BLACK.mix(0.12))
        .x_desc("workload")
        .y_desc(data.y_desc(scale.log))
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()?;

    // Each group takes the middle 80% of its workload's unit; each bar a
    // slot of that, with a gap either side.
    let slot = 0.8 / k as f64;
    let value_style = ("sans-serif", 13)
        .into_text_style(&plot)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for (j, s) in data.series.iter().enumerate() {
        let fill = color(&s.system, j);
        let x0 = |i: usize| i as f64 + 0.1 + j as f64 * slot;
        let bars: Vec<(f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((x0(i), (*v)?)))
            .collect();
        // A system with no figure for a workload (its run failed) says so
        // where its bar would be, rather than leaving a gap to puzzle over.
        let missing = s.values.iter().enumerate().filter(|(_, v)| v.is_none());
        chart.draw_series(missing.map(|(i, _)| {
            EmptyElement::at((x0(i) + slot * 0.5, scale.lo))
                + Text::new("n/a", (0, -3), value_style.clone())
        }))?;
        chart.draw_series(bars.iter().map(|&(x0, v)| {
            Rectangle::new(
                [
                    (x0 + slot * 0.06, scale.lo),
                    (x0 + slot * 0.94, scale.to_plot(v)),
                ],
                fill.filled(),
            )
        }))?;
        chart.draw_series(bars.iter().map(|&(x0, v)| {
            let text = match data.kind {
                Kind::Ratio => format!("{}x", fmt_num(v)),
                Kind::AbsoluteMs => fmt_num(v),
            };
            EmptyElement::at((x0 + slot * 0.5, scale.to_plot(v)))
                + Text::new(text, (0, -3), value_style.clone())
        }))?;
    }
    if let Some(r) = reference {
        let y = scale.to_plot(r);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, y), (n as f64, y)],
            BLACK.stroke_width(2),
        )))?;
    }

    // The legend has a panel of its own, right of the plot, so it never
    // covers a bar.
    let entry = ("sans-serif", 16).into_font();
    let mut y = 40;
    for (j, s) in data.series.iter().enumerate() {
        legend.draw(&Rectangle::new(
            [(10, y), (30, y + 20)],
            color(&s.system, j).filled(),
        ))?;
        legend.draw(&Text::new(s.system.clone(), (40, y + 2), entry.clone()))?;
        y += 30;
    }
    if reference.is_some() {
        legend.draw(&PathElement::new(
            vec![(10, y + 10), (30, y + 10)],
            BLACK.stroke_width(2),
        ))?;
        legend.draw(&Text::new(
            "1.0 = lazyfuse (fused)",
            (40, y + 2),
            entry.clone(),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ratios_are_against_fused_and_skip_missing_figures() {
        let figs = [
            ("a", "lazyfuse", 2.0),
            ("a", "lazyfuse-nofusion", 5.0),
            ("b", "lazyfuse", 4.0),
            ("b", "lazyfuse-nofusion", 2.0),
            ("a", "torch", 1.0),
            ("a", "xla", f64::NAN),
        ];
        let d = ChartData::from_figures(&figs, &names(&["a", "b"]));
        assert_eq!(d.kind, Kind::Ratio);
        assert_eq!(
            d.series,
            vec![
                Series {
                    system: "lazyfuse-nofusion".into(),
                    values: vec![Some(2.5), Some(0.5)],
                },
                Series {
                    system: "torch".into(),
                    values: vec![Some(0.5), None],
                },
            ]
        );
    }

    #[test]
    fn without_a_ratio_the_bars_are_absolute_ms() {
        let figs = [("a", "lazyfuse", 2.0), ("b", "lazyfuse", 3.0)];
        let d = ChartData::from_figures(&figs, &names(&["a", "b"]));
        assert_eq!(d.kind, Kind::AbsoluteMs);
        assert_eq!(
            d.series,
            vec![Series {
                system: "lazyfuse".into(),
                values: vec![Some(2.0), Some(3.0)],
            }]
        );
        // Unfused alone (`--fusion off`) has no base either.
        let figs = [("a", "lazyfuse-nofusion", 2.0), ("a", "torch", 1.0)];
        let d = ChartData::from_figures(&figs, &names(&["a"]));
        assert_eq!(d.kind, Kind::AbsoluteMs);
        assert_eq!(d.series.len(), 2);
    }

    #[test]
    fn scale_goes_log_only_for_a_wide_spread() {
        let lin = Scale::new(&[0.5, 3.0]);
        assert!(!lin.log);
        assert_eq!(lin.lo, 0.0);
        assert!(lin.hi >= 3.0);
        assert_eq!(lin.ticks.first(), Some(&0.0));
        let log = Scale::new(&[0.5, 100.0]);
        assert!(log.log);
        assert!(log.lo < 0.5f64.log10() && log.hi > 2.0);
        let labels: Vec<String> = log.ticks.iter().map(|t| log.label(*t)).collect();
        assert_eq!(labels, ["0.5", "1", "2", "5", "10", "20", "50", "100"]);
    }

    #[test]
    fn numbers_and_ticks_read_well() {
        assert_eq!(fmt_num(0.0005), "0.0005");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(2.345), "2.35");
        assert_eq!(fmt_num(2.0), "2");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(123.4), "123");
        assert_eq!(linear_ticks(3.36), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    }

    #[test]
    fn writes_a_png_and_reports_a_bad_path() {
        let figs = [
            ("a", "lazyfuse", 1.0),
            ("a", "lazyfuse-nofusion", 3.0),
            ("b", "lazyfuse", 2.0),
            ("b", "jaxeager", 200.0),
        ];
        let d = ChartData::from_figures(&figs, &names(&["a", "b"]));
        let path = std::env::temp_dir().join(format!("workloads_chart_{}.png", std::process::id()));
        write_png(&path, &d).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(write_png(Path::new("/no/such/dir/chart.png"), &d).is_err());
    }

    #[test]
    fn bad_paths_are_refused_up_front() {
        assert!(check_path(Path::new("chart.png")).is_ok());
        assert!(check_path(Path::new("/tmp/chart.PNG")).is_ok());
        assert!(check_path(Path::new("/tmp/chart.svg")).is_err());
        assert!(check_path(Path::new("/no/such/dir/chart.png")).is_err());
    }
}
