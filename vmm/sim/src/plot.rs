//! The sweep's curve as SVG, with plotters: no font files (the SVG names
//! a font family and the viewer draws the text).

use anyhow::Result;

/// A line chart with plotters: the metric against CPUs, one line (with
/// its points marked) per variant, and a legend.
pub fn plot_svg(
    title: &str,
    ylabel: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<String> {
    use plotters::prelude::*;

    let finite = |p: &&(usize, f64)| p.1.is_finite();
    let pts = series.iter().flat_map(|s| s.1.iter()).filter(finite);
    let xmax = pts.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    let ymax = pts.map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0 as f64))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..xmax * 1.05, 0f64..ymax)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("CPUs")
            .y_desc(ylabel)
            .x_labels(xs.len().clamp(2, 12))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| short(*v))
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, p)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line: Vec<(f64, f64)> = p
                .iter()
                .filter(finite)
                .map(|&(n, v)| (n as f64, v))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&q| Circle::new(q, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

/// plotters' errors carry the backend's error type; the message is what
/// a user needs.
fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
