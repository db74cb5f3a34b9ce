//! The soak's plot: RSS, threads, open fds and events over time, one panel each,
//! with a violet line at each runtime restart, drawn with `plotters` into a PNG.
//!
//! Text needs a font: `plotters`' `ab_glyph` backend takes TTF bytes rather than
//! looking up system fonts (no fontconfig), so the font is read from a file — the one
//! given, else DejaVu Sans where installed; with none (or `--font none`) the panels
//! are drawn without text (their order is fixed: RSS, threads, fds, events).

use std::error::Error;
use std::path::Path;

use integration_tests::soak::Sample;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

const FONT_CANDIDATES: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers the font as "sans-serif"; whether text can be drawn.
fn load_font(font: Option<&Path>) -> Result<bool, Box<dyn Error>> {
    let path = match font {
        // "none": text-free on purpose (and how that mode is tried).
        Some(p) if p == Path::new("none") => None,
        Some(p) => Some(p.to_path_buf()),
        None => FONT_CANDIDATES
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .map(Path::to_path_buf),
    };
    let Some(path) = path else {
        return Ok(false);
    };
    let bytes = std::fs::read(&path)
        .map_err(|e| format!("cannot read the font {}: {e}", path.display()))?;
    // register_font keeps the bytes for the rest of the process: leak them once.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a usable TTF font", path.display()))?;
    Ok(true)
}

struct Panel {
    title: &'static str,
    color: RGBColor,
    value: fn(&Sample) -> f64,
    /// Decimals of the axis labels.
    decimals: usize,
}

pub fn draw(samples: &[Sample], png: &Path, font: Option<&Path>) -> Result<(), Box<dyn Error>> {
    if samples.is_empty() {
        return Err("no samples to plot".into());
    }
    let text = load_font(font)?;
    let panels = [
        Panel {
            title: "RSS (MiB)",
            color: RGBColor(31, 119, 180),
            value: |s| s.rss_kb as f64 / 1024.0,
            decimals: 1,
        },
        Panel {
            title: "threads",
            color: RGBColor(255, 127, 14),
            value: |s| s.threads as f64,
            decimals: 0,
        },
        Panel {
            title: "open fds",
            color: RGBColor(44, 160, 44),
            value: |s| s.fds as f64,
            decimals: 0,
        },
        Panel {
            title: "events published (cumulative)",
            color: RGBColor(214, 39, 40),
            value: |s| s.events as f64,
            decimals: 0,
        },
    ];
    let minutes = |s: &Sample| s.time_s / 60.0;
    let t_end = samples.iter().map(minutes).fold(0.0_f64, f64::max).max(0.1);
    // A restart happened between two samples whose counts differ.
    let restarts: Vec<f64> = samples
        .windows(2)
        .filter(|w| w[1].restarts > w[0].restarts)
        .map(|w| minutes(&w[1]))
        .collect();

    let root = BitMapBackend::new(png, (1200, 1100)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = if text {
        root.titled(
            "plegd soak (violet lines: runtime restarts)",
            ("sans-serif", 24),
        )?
    } else {
        root
    };
    let areas = root.split_evenly((panels.len(), 1));
    for (i, (area, panel)) in areas.iter().zip(&panels).enumerate() {
        let values: Vec<f64> = samples.iter().map(panel.value).collect();
        let (lo, hi) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        // Some room around the data, and never a flat zero-height range.
        let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.02).max(1.0);
        let (mut y0, mut y1) = ((lo - pad).max(0.0), hi + pad);
        let mut y_labels = 5;
        if panel.decimals == 0 {
            // Whole numbers: whole bounds, and few enough labels to fall on them.
            (y0, y1) = (y0.floor(), y1.ceil());
            y_labels = ((y1 - y0) as usize + 1).min(6);
        }
        let last = i + 1 == panels.len();
        let mut builder = ChartBuilder::on(area);
        builder.margin(8);
        if text {
            builder
                .caption(panel.title, ("sans-serif", 18))
                .y_label_area_size(70)
                .x_label_area_size(if last { 40 } else { 25 });
        }
        let mut chart = builder.build_cartesian_2d(0.0..t_end, y0..y1)?;
        if text {
            let mut mesh = chart.configure_mesh();
            let decimals = panel.decimals;
            let y_format = move |v: &f64| format!("{v:.decimals$}");
            // Whole minutes once the run is long enough for them to tell apart.
            let x_decimals = usize::from(t_end < 5.0);
            let x_format = move |v: &f64| format!("{v:.x_decimals$}");
            mesh.light_line_style(WHITE.mix(0.0))
                .x_label_formatter(&x_format)
                .bold_line_style(BLACK.mix(0.08))
                .y_labels(y_labels)
                .y_label_formatter(&y_format);
            if last {
                mesh.x_desc("minutes");
            }
            mesh.draw()?;
        } else {
            area.draw(&Rectangle::new(
                [(0, 0), area.dim_in_pixel().into_signed()],
                BLACK.stroke_width(1),
            ))?;
        }
        for t in &restarts {
            chart.draw_series(LineSeries::new(
                [(*t, y0), (*t, y1)],
                RGBColor(150, 80, 190).mix(0.6).stroke_width(1),
            ))?;
        }
        chart.draw_series(LineSeries::new(
            samples.iter().map(minutes).zip(values.iter().copied()),
            panel.color.stroke_width(2),
        ))?;
    }
    root.present()?;
    Ok(())
}

trait IntoSigned {
    fn into_signed(self) -> (i32, i32);
}

impl IntoSigned for (u32, u32) {
    fn into_signed(self) -> (i32, i32) {
        (
            i32::try_from(self.0).unwrap_or(i32::MAX),
            i32::try_from(self.1).unwrap_or(i32::MAX),
        )
    }
}
