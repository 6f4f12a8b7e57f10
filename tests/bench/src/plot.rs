//! Small hand-drawn SVG charts (no plotting dependency): line charts of throughput and latency
//! over time for each run of each target, and bar charts of medians with their min/max range.

use std::fmt::Write;

/// One line of a chart.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// An SVG line chart of `series`, `width` x `height` pixels.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (width, height) = (900.0, 420.0);
    let (left, right, top, bottom) = (70.0, 200.0, 40.0, 50.0);
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1e-9f64, f64::max)
        * 1.1;
    let sx = |x: f64| left + x / x_max * (width - left - right);
    let sy = |y: f64| height - bottom - y / y_max * (height - top - bottom);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" font-size="15">{}</text>"#,
        left,
        escape(title)
    );
    // Axes and grid.
    for i in 0..=5 {
        let y = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{py}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            width - right,
            left - 5.0,
            sy(y) + 4.0,
            fmt_num(y),
            py = sy(y)
        );
    }
    for i in 0..=5 {
        let x = x_max * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            sx(x),
            height - bottom + 16.0,
            fmt_num(x)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        (left + width - right) / 2.0,
        height - 12.0,
        escape(x_label),
        height / 2.0,
        height / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            width - right + 10.0,
            width - right + 30.0,
            width - right + 35.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// One bar of a [`bar_chart`]: a median and the range of the runs it is the median of.
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// Height of the bar.
    pub median: f64,
    /// Lowest run (bottom of the whisker).
    pub min: f64,
    /// Highest run (top of the whisker).
    pub max: f64,
}

/// An SVG bar chart of `bars`, left to right, each a filled bar up to its median with a whisker
/// from its min to its max and the median written above it; `note` is a smaller second line
/// under the title (what was measured, how many runs).
pub fn bar_chart(title: &str, note: &str, y_label: &str, bars: &[Bar]) -> String {
    let (left, right, top, bottom) = (70.0, 30.0, 60.0, 60.0);
    let slot = 140.0;
    let width = (left + right + slot * bars.len() as f64).max(640.0);
    let height = 420.0;
    let y_max = bars.iter().map(|b| b.max.max(b.median)).fold(1e-9f64, f64::max) * 1.15;
    let sy = |y: f64| height - bottom - y / y_max * (height - top - bottom);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" font-size="15">{}</text>"#,
        left,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{left}" y="40" font-size="11" fill="#555">{}</text>"##,
        escape(note)
    );
    for i in 0..=5 {
        let y = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{py}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            width - right,
            left - 5.0,
            sy(y) + 4.0,
            fmt_num(y),
            py = sy(y)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        height / 2.0,
        height / 2.0,
        escape(y_label)
    );
    let bar_width = slot * 0.6;
    for (i, b) in bars.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let cx = left + slot * (i as f64 + 0.5);
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{bar_width:.1}" height="{:.1}" fill="{color}" fill-opacity="0.8"/>"#,
            cx - bar_width / 2.0,
            sy(b.median),
            (sy(0.0) - sy(b.median)).max(0.0)
        );
        // The whisker: min to max, with caps.
        let (lo, hi) = (sy(b.min), sy(b.max));
        let cap = bar_width / 6.0;
        let _ = writeln!(
            svg,
            r#"<path d="M{:.1},{lo:.1}V{hi:.1}M{:.1},{lo:.1}H{:.1}M{:.1},{hi:.1}H{:.1}" stroke="black" stroke-width="1.5" fill="none"/>"#,
            cx,
            cx - cap,
            cx + cap,
            cx - cap,
            cx + cap
        );
        let _ = writeln!(
            svg,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            hi.min(sy(b.median)) - 6.0,
            fmt_num(b.median),
            height - bottom + 18.0,
            escape(&b.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn fmt_num(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_one_polyline_per_series_and_escapes_labels() {
        let svg = line_chart(
            "t<1>",
            "s",
            "ops/s",
            &[
                Series {
                    label: "a&b".into(),
                    points: vec![(0.0, 1.0), (1.0, 2.0)],
                },
                Series {
                    label: "c".into(),
                    points: vec![(0.0, 3.0)],
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a&amp;b"));
        assert!(svg.contains("t&lt;1&gt;"));
        assert!(svg.starts_with("<svg"));
    }

    #[test]
    fn bar_chart_has_one_bar_and_whisker_per_bar_and_escapes_labels() {
        let bar = |label: &str, median: f64| Bar {
            label: label.into(),
            median,
            min: median * 0.9,
            max: median * 1.1,
        };
        let svg = bar_chart(
            "rows/s <med>",
            "1 run",
            "rows/s",
            &[bar("bulk", 300_000.0), bar("put & co", 80_000.0)],
        );
        // The background is a rect too.
        assert_eq!(svg.matches("<rect").count(), 3);
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("put &amp; co"));
        assert!(svg.contains("rows/s &lt;med&gt;"));
        assert!(svg.contains(">300k<"));
        assert!(svg.ends_with("</svg>\n"));
    }
}
