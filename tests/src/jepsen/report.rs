//! Reports a person can read: `timeline.html` (one column per process, ops as boxes from invoke
//! to completion coloured ok/fail/info, nemesis windows as shaded bands, the op as a hover
//! tooltip), `latency.svg` (latency of every op over time, log scale, by outcome) and
//! `throughput.svg` (completions per second by outcome), both with nemesis bands. Jepsen draws
//! the same three (its `timeline` and `perf` checkers).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::jepsen::history::{History, OpType, Process};

/// A nemesis window: `[start_ns, end_ns]` with a label.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// Start, ns since the run started.
    pub start_ns: u64,
    /// End, ns since the run started.
    pub end_ns: u64,
    /// Fault name, e.g. `kill`.
    pub label: String,
}

/// Nemesis windows: from each `start-X` invoke to the next `stop-X` completion (or the end).
pub fn nemesis_bands(history: &History) -> Vec<Band> {
    let end = history.ops.last().map(|o| o.time_ns).unwrap_or(0);
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut bands = Vec::new();
    for op in history.ops.iter().filter(|o| o.process == Process::Nemesis) {
        if let Some(kind) = op.f.strip_prefix("start-") {
            if op.op_type == OpType::Invoke {
                open.insert(kind.to_string(), op.time_ns);
            }
        } else if let Some(kind) = op.f.strip_prefix("stop-") {
            if op.op_type != OpType::Invoke {
                if let Some(start) = open.remove(kind) {
                    bands.push(Band {
                        start_ns: start,
                        end_ns: op.time_ns,
                        label: kind.to_string(),
                    });
                }
            }
        }
    }
    for (label, start) in open {
        bands.push(Band {
            start_ns: start,
            end_ns: end,
            label,
        });
    }
    bands.sort_by_key(|b| b.start_ns);
    bands
}

fn color(t: OpType) -> &'static str {
    match t {
        OpType::Ok => "#6DB6FE",
        OpType::Fail => "#FEB5DA",
        OpType::Info => "#FFAA26",
        OpType::Invoke => "#DDDDDD",
    }
}

fn band_color(label: &str) -> &'static str {
    match label {
        "kill" => "rgba(255,0,0,0.10)",
        "pause" => "rgba(128,0,255,0.10)",
        "partition" => "rgba(255,160,0,0.15)",
        "disk" => "rgba(120,60,0,0.12)",
        _ => "rgba(0,128,0,0.10)",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `timeline.html` (self-contained, no scripts needed). `title` heads the page.
pub fn timeline_html(history: &History, title: &str) -> String {
    let pairs = history.client_pairs();
    let end_ns = history.ops.last().map(|o| o.time_ns).unwrap_or(1).max(1);
    let px_per_ms = 0.5f64; // 1 s = 500 px
    let height = (end_ns as f64 / 1e6 * px_per_ms).ceil() as u64 + 40;
    let mut processes: Vec<u64> = pairs
        .iter()
        .filter_map(|p| match history.ops[p.invoke].process {
            Process::Client(n) => Some(n),
            Process::Nemesis => None,
        })
        .collect();
    processes.sort_unstable();
    processes.dedup();
    let col: BTreeMap<u64, usize> = processes.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let col_w = 70usize;
    let width = 80 + col_w * processes.len().max(1);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
         body{{font-family:sans-serif;font-size:11px}} .op{{position:absolute;width:{w}px;overflow:hidden;\
         border:1px solid #888;border-radius:2px;box-sizing:border-box;padding:0 2px;white-space:nowrap}}\
         .op:hover{{outline:2px solid #000;z-index:5}} .band{{position:absolute;left:0;right:0}}\
         .hdr{{position:absolute;top:0;width:{w}px;text-align:center;font-weight:bold}}\
         .tick{{position:absolute;left:0;font-size:10px;color:#666}}</style></head><body>\
         <h2>{t}</h2><p>Columns are processes, time flows down (500 px per second). Blue ok, pink fail, \
         orange info (unknown). Shaded bands are nemesis faults. Hover an op for details.</p>\
         <div style=\"position:relative;width:{W}px;height:{H}px\">",
        t = esc(title),
        w = col_w - 4,
        W = width,
        H = height
    );
    for b in nemesis_bands(history) {
        let top = 20.0 + b.start_ns as f64 / 1e6 * px_per_ms;
        let hgt = ((b.end_ns - b.start_ns) as f64 / 1e6 * px_per_ms).max(2.0);
        let _ = write!(
            h,
            "<div class=\"band\" style=\"top:{top:.1}px;height:{hgt:.1}px;background:{}\" title=\"{}\"></div>",
            band_color(&b.label),
            esc(&format!("nemesis {} {:.2}s-{:.2}s", b.label, b.start_ns as f64 / 1e9, b.end_ns as f64 / 1e9))
        );
    }
    let mut s = 0u64;
    while s * 1_000_000_000 <= end_ns {
        let _ = write!(
            h,
            "<div class=\"tick\" style=\"top:{}px\">{s}s</div>",
            20.0 + s as f64 * 1000.0 * px_per_ms
        );
        s += 1;
    }
    for (p, i) in &col {
        let _ = write!(
            h,
            "<div class=\"hdr\" style=\"left:{}px\">p{p}</div>",
            40 + i * col_w
        );
    }
    for pair in &pairs {
        let inv = &history.ops[pair.invoke];
        let Process::Client(p) = inv.process else { continue };
        let done = pair.complete.map(|c| &history.ops[c]);
        let outcome = pair.outcome(history);
        let end = done.map(|d| d.time_ns).unwrap_or(end_ns);
        let top = 20.0 + inv.time_ns as f64 / 1e6 * px_per_ms;
        let hgt = ((end - inv.time_ns) as f64 / 1e6 * px_per_ms).max(3.0);
        let tip = format!(
            "index {} process {} {} {}\ninvoke {:.3}s value {}\n{} after {:.1} ms value {}{}",
            inv.index,
            p,
            inv.f,
            inv.key.as_ref().map(|k| k.to_string()).unwrap_or_default(),
            inv.time_ns as f64 / 1e9,
            inv.value,
            serde_json::to_string(&outcome).unwrap_or_default(),
            (end - inv.time_ns) as f64 / 1e6,
            done.map(|d| d.value.to_string()).unwrap_or_default(),
            done.and_then(|d| d.error.clone())
                .map(|e| format!("\nerror: {e}"))
                .unwrap_or_default()
        );
        let _ = write!(
            h,
            "<div class=\"op\" style=\"left:{}px;top:{top:.1}px;height:{hgt:.1}px;background:{}\" title=\"{}\">{} {}</div>",
            40 + col.get(&p).copied().unwrap_or(0) * col_w,
            color(outcome),
            esc(&tip),
            esc(&inv.f),
            esc(&inv.key.as_ref().map(|k| k.to_string()).unwrap_or_default())
        );
    }
    h.push_str("</div></body></html>\n");
    h
}

const PLOT_W: f64 = 900.0;
const PLOT_H: f64 = 360.0;
const MARGIN_L: f64 = 60.0;
const MARGIN_B: f64 = 40.0;

fn svg_frame(title: &str, y_label: &str, end_s: f64, bands: &[Band]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{mx}\" y=\"14\" font-size=\"13\">{t}</text>",
        w = PLOT_W + MARGIN_L + 20.0,
        h = PLOT_H + MARGIN_B + 30.0,
        mx = MARGIN_L,
        t = esc(title)
    );
    for b in bands {
        let x0 = MARGIN_L + b.start_ns as f64 / 1e9 / end_s * PLOT_W;
        let x1 = MARGIN_L + b.end_ns as f64 / 1e9 / end_s * PLOT_W;
        let _ = write!(
            s,
            "<rect x=\"{x0:.1}\" y=\"20\" width=\"{:.1}\" height=\"{PLOT_H}\" fill=\"{}\"><title>{}</title></rect>\
             <text x=\"{x0:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#555\">{}</text>",
            (x1 - x0).max(1.0),
            band_color(&b.label),
            esc(&b.label),
            30.0,
            esc(&b.label)
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{MARGIN_L}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"black\"/>\
         <line x1=\"{MARGIN_L}\" y1=\"20\" x2=\"{MARGIN_L}\" y2=\"{y}\" stroke=\"black\"/>\
         <text x=\"{cx}\" y=\"{ly}\">time (s)</text>\
         <text x=\"12\" y=\"{my}\" transform=\"rotate(-90 12 {my})\">{yl}</text>",
        y = 20.0 + PLOT_H,
        x2 = MARGIN_L + PLOT_W,
        cx = MARGIN_L + PLOT_W / 2.0,
        ly = 20.0 + PLOT_H + 32.0,
        my = 20.0 + PLOT_H / 2.0,
        yl = esc(y_label)
    );
    let step = (end_s / 10.0).ceil().max(1.0);
    let mut t = 0.0;
    while t <= end_s {
        let x = MARGIN_L + t / end_s * PLOT_W;
        let _ = write!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t}</text>",
            20.0 + PLOT_H + 14.0
        );
        t += step;
    }
    s
}

fn legend(s: &mut String) {
    for (i, (name, t)) in [("ok", OpType::Ok), ("fail", OpType::Fail), ("info", OpType::Info)]
        .iter()
        .enumerate()
    {
        let x = MARGIN_L + PLOT_W - 180.0 + i as f64 * 60.0;
        let _ = write!(
            s,
            "<rect x=\"{x}\" y=\"4\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"13\">{name}</text>",
            color(*t),
            x + 14.0
        );
    }
}

/// Renders `latency.svg`: one dot per completed client op at (invoke time, latency), log scale.
pub fn latency_svg(history: &History, title: &str) -> String {
    let end_s = (history.ops.last().map(|o| o.time_ns).unwrap_or(1) as f64 / 1e9).max(1.0);
    let bands = nemesis_bands(history);
    let mut s = svg_frame(title, "latency (ms, log scale)", end_s, &bands);
    let points: Vec<(f64, f64, OpType)> = history
        .client_pairs()
        .iter()
        .filter_map(|p| {
            let c = p.complete?;
            let inv = &history.ops[p.invoke];
            let done = &history.ops[c];
            Some((
                inv.time_ns as f64 / 1e9,
                (done.time_ns - inv.time_ns) as f64 / 1e6,
                done.op_type,
            ))
        })
        .collect();
    let max_ms = points.iter().map(|p| p.1).fold(1.0f64, f64::max);
    let (lo, hi) = (0.1f64.log10(), max_ms.max(1.0).log10().ceil().max(1.0));
    let y_of = |ms: f64| 20.0 + PLOT_H - (ms.max(0.1).log10() - lo) / (hi - lo) * PLOT_H;
    let mut decade = 0.1f64;
    while decade.log10() <= hi + 1e-9 {
        let y = y_of(decade);
        let _ = write!(
            s,
            "<line x1=\"{MARGIN_L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{decade}</text>",
            MARGIN_L + PLOT_W,
            MARGIN_L - 4.0,
            y + 4.0
        );
        decade *= 10.0;
    }
    for (t, ms, ty) in points {
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.6\" fill=\"{}\"/>",
            MARGIN_L + t / end_s * PLOT_W,
            y_of(ms),
            color(ty)
        );
    }
    legend(&mut s);
    s.push_str("</svg>\n");
    s
}

/// Renders `throughput.svg`: client completions per second by outcome.
pub fn throughput_svg(history: &History, title: &str) -> String {
    let end_s = (history.ops.last().map(|o| o.time_ns).unwrap_or(1) as f64 / 1e9).max(1.0);
    let buckets = end_s.ceil() as usize + 1;
    let mut counts: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    for op in history.ops.iter().filter(|o| o.process != Process::Nemesis) {
        let key = match op.op_type {
            OpType::Ok => "ok",
            OpType::Fail => "fail",
            OpType::Info => "info",
            OpType::Invoke => continue,
        };
        let b = ((op.time_ns as f64 / 1e9) as usize).min(buckets - 1);
        counts.entry(key).or_insert_with(|| vec![0; buckets])[b] += 1;
    }
    let max = counts
        .values()
        .flat_map(|v| v.iter())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let bands = nemesis_bands(history);
    let mut s = svg_frame(title, "ops/s", end_s, &bands);
    for frac in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = 20.0 + PLOT_H - frac * PLOT_H;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>",
            MARGIN_L - 4.0,
            y + 4.0,
            frac * max
        );
    }
    for (name, ty) in [("ok", OpType::Ok), ("fail", OpType::Fail), ("info", OpType::Info)] {
        let Some(v) = counts.get(name) else { continue };
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "{:.1},{:.1}",
                    MARGIN_L + (i as f64 + 0.5) / end_s * PLOT_W,
                    20.0 + PLOT_H - *c as f64 / max * PLOT_H
                )
            })
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            color(ty),
            pts.join(" ")
        );
    }
    legend(&mut s);
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;
    use crate::jepsen::history::Op;
    use serde_json::{json, Value};

    fn sample() -> History {
        let mut h = History::default();
        let mut push = |mut op: Op, t: u64| {
            op.time_ns = t;
            h.push(op);
        };
        push(invoke(0, "put", Some(json!(1)), json!(5)), 1_000_000);
        push(
            Op::new(Process::Nemesis, OpType::Invoke, "start-kill", None, Value::Null),
            2_000_000,
        );
        push(
            Op::new(
                Process::Nemesis,
                OpType::Info,
                "start-kill",
                None,
                json!({"killed": [1]}),
            ),
            3_000_000,
        );
        push(
            done(0, OpType::Info, "put", Some(json!(1)), json!(5)).with_error("timeout <x>"),
            900_000_000,
        );
        push(invoke(1, "get", Some(json!(1)), Value::Null), 1_000_000_000);
        push(
            done(1, OpType::Ok, "get", Some(json!(1)), json!(5)),
            1_100_000_000,
        );
        push(
            Op::new(Process::Nemesis, OpType::Invoke, "stop-kill", None, Value::Null),
            1_500_000_000,
        );
        push(
            Op::new(Process::Nemesis, OpType::Info, "stop-kill", None, Value::Null),
            1_600_000_000,
        );
        h
    }

    #[test]
    fn bands_pair_start_and_stop() {
        let b = nemesis_bands(&sample());
        assert_eq!(
            b,
            vec![Band {
                start_ns: 2_000_000,
                end_ns: 1_600_000_000,
                label: "kill".into()
            }]
        );
    }

    #[test]
    fn timeline_has_a_column_per_process_escaped_tooltips_and_bands() {
        let html = timeline_html(&sample(), "t");
        assert!(html.contains(">p0</div>") && html.contains(">p1</div>"));
        assert!(html.contains("timeout &lt;x&gt;"));
        assert!(html.contains("class=\"band\""));
        assert_eq!(html.matches("class=\"op\"").count(), 2);
    }

    #[test]
    fn plots_are_svg_with_points_lines_and_bands() {
        let lat = latency_svg(&sample(), "latency");
        assert!(lat.starts_with("<svg") && lat.trim_end().ends_with("</svg>"));
        assert_eq!(lat.matches("<circle").count(), 2);
        assert!(lat.contains("<title>kill</title>"));
        let thr = throughput_svg(&sample(), "throughput");
        assert!(thr.contains("<polyline"));
    }
}
