//! Reports: the table on stdout, `--json`, and the `--plot` SVG.

use super::record::CliResult;
use super::record::{Kind, Record};
use std::fmt::Write as _;
use std::path::Path;

/// `1536` → `1.5 KiB`, `8` → `8 B`.
pub fn human_bytes(b: usize) -> String {
    const U: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn us(t: f64) -> String {
    if t >= 1000.0 {
        format!("{:.2} ms", t / 1000.0)
    } else if t >= 1.0 {
        format!("{t:.2} us")
    } else {
        format!("{:.1} ns", t * 1000.0)
    }
}

/// The baseline's time and the ratio, or "missing" when the baseline could not run.
fn base(r: &Record) -> (String, String) {
    if r.baseline_time_us > 0.0 {
        (us(r.baseline_time_us), format!("{:.2}", r.ratio))
    } else {
        ("missing".into(), "-".into())
    }
}

fn cols(r: &Record) -> (String, String, String) {
    let bw = r.kind() == Kind::Bandwidth;
    if bw {
        (
            format!("{:.2}", r.gbps),
            if r.baseline_time_us > 0.0 {
                format!("{:.2}", r.bytes as f64 / (r.baseline_time_us * 1e3))
            } else {
                "-".into()
            },
            r.busbw_gbps.map_or("-".into(), |b| format!("{b:.2}")),
        )
    } else {
        ("-".into(), "-".into(), "-".into())
    }
}

/// What the ratio column means, the first line of every table.
pub const RATIO_LINE: &str = "ratio = baseline time / rshmem time (above 1: rshmem is faster)";

/// The table: each figure beside its same-run baseline and their ratio, under the line that
/// says what the ratio is. The op and mode columns are as wide as their longest entry (e.g.
/// `capturable+tokens`), so columns line up.
pub fn table(records: &[Record]) -> String {
    let mut s = format!("{RATIO_LINE}\n");
    let ow = records
        .iter()
        .map(|r| r.op.len())
        .max()
        .unwrap_or(0)
        .max(17);
    let mw = records
        .iter()
        .map(|r| r.mode.len())
        .max()
        .unwrap_or(0)
        .max(9);
    let _ = writeln!(
        s,
        "{:<ow$} {:<mw$} {:>4} {:>9} {:>10} {:>8} {:>7}   {:<13} {:>10} {:>9}  {:>6}",
        "op",
        "mode",
        "pes",
        "bytes",
        "time",
        "GB/s",
        "busbw",
        "baseline",
        "base time",
        "base GB/s",
        "ratio"
    );
    for r in records {
        let (g, bg, bus) = cols(r);
        let _ = writeln!(
            s,
            "{:<ow$} {:<mw$} {:>4} {:>9} {:>10} {:>8} {:>7}   {:<13} {:>10} {:>9}  {:>6}",
            r.op,
            r.mode,
            r.pes,
            human_bytes(r.bytes),
            us(r.time_us),
            g,
            bus,
            r.baseline,
            base(r).0,
            bg,
            base(r).1
        );
    }
    s
}

/// The same table as Markdown (for BENCHMARKS.md).
pub fn markdown(records: &[Record]) -> String {
    // The blank line keeps the ratio line a paragraph of its own in Markdown renderers.
    let mut s = format!("{RATIO_LINE}\n\n");
    s.push_str(
        "| op | mode | PEs | bytes | time | GB/s | busbw GB/s | baseline | baseline time | baseline GB/s | ratio |\n\
         |---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in records {
        let (g, bg, bus) = cols(r);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.op,
            r.mode,
            r.pes,
            human_bytes(r.bytes),
            us(r.time_us),
            g,
            bus,
            r.baseline,
            base(r).0,
            bg,
            base(r).1
        );
    }
    s
}

/// Writes the records as a JSON list.
pub fn write_json(path: &Path, records: &[Record]) -> CliResult<()> {
    let s = serde_json::to_string_pretty(records)?;
    std::fs::write(path, s + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}

/// Draws bandwidth (left) and time per operation (right) against size, each operation beside
/// its baseline; latency figures appear as points at their payload size.
pub fn write_svg(path: &Path, records: &[Record]) -> CliResult<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let bw: Vec<&Record> = records
        .iter()
        .filter(|r| r.kind() == Kind::Bandwidth && r.bytes > 0)
        .collect();
    let lat: Vec<&Record> = records
        .iter()
        .filter(|r| r.kind() == Kind::Latency)
        .collect();
    let xmax = bw.iter().map(|r| r.bytes).max().unwrap_or(64).max(64) as f64 * 1.5;
    let xmin = 4.0;
    let root = SVGBackend::new(path, (1300, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(650);
    let palette = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

    // Series: (label, points) for op and baseline of each (op, pes) group.
    // (bytes, time_us, baseline_time_us) per point.
    type Points = Vec<(f64, f64, f64)>;
    let mut groups: Vec<(String, Points)> = Vec::new();
    for r in &bw {
        let label = format!("{} ({} PEs, {})", r.op, r.pes, r.mode);
        let pt = (r.bytes as f64, r.time_us, r.baseline_time_us);
        match groups.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => v.push(pt),
            None => groups.push((label, vec![pt])),
        }
    }

    let gbps = |b: f64, t: f64| b / (t * 1e3);
    let ys: Vec<f64> = groups
        .iter()
        .flat_map(|(_, v)| {
            v.iter()
                .flat_map(move |&(b, t, bt)| [gbps(b, t), gbps(b, bt)])
        })
        .filter(|y| y.is_finite() && *y > 0.0)
        .collect();
    let (ymin, ymax) = bounds(&ys, 0.01, 100.0);
    let mut c = size_chart(
        &left,
        "Bandwidth (GB/s) vs size",
        (xmin..xmax, ymin..ymax),
        ("bytes", "GB/s"),
        &err,
    )?;
    for (i, (label, v)) in groups.iter().enumerate() {
        let col = palette[i % palette.len()];
        c.draw_series(LineSeries::new(
            v.iter().map(|&(b, t, _)| (b, gbps(b, t))),
            col,
        ))
        .map_err(|e| err(&e))?
        .label(label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
        let dashed = col.mix(0.45);
        c.draw_series(LineSeries::new(
            v.iter().map(|&(b, _, bt)| (b, gbps(b, bt))),
            dashed,
        ))
        .map_err(|e| err(&e))?
        .label(format!("memcpy baseline for {label}"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], dashed));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()
        .map_err(|e| err(&e))?;

    let ts: Vec<f64> = groups
        .iter()
        .flat_map(|(_, v)| v.iter().flat_map(|&(_, t, bt)| [t, bt]))
        .chain(lat.iter().flat_map(|r| [r.time_us, r.baseline_time_us]))
        .filter(|y| y.is_finite() && *y > 0.0)
        .collect();
    let (tmin, tmax) = bounds(&ts, 0.001, 1e5);
    let mut c = size_chart(
        &right,
        "Time per operation (us) vs size",
        (xmin..xmax, tmin..tmax),
        ("bytes (barrier drawn at 4)", "microseconds"),
        &err,
    )?;
    for (i, (label, v)) in groups.iter().enumerate() {
        let col = palette[i % palette.len()];
        c.draw_series(LineSeries::new(v.iter().map(|&(b, t, _)| (b, t)), col))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    for (i, r) in lat.iter().enumerate() {
        let col = palette[(groups.len() + i) % palette.len()];
        let x = (r.bytes as f64).max(xmin);
        c.draw_series(std::iter::once(Circle::new(
            (x, r.time_us),
            5,
            col.filled(),
        )))
        .map_err(|e| err(&e))?
        .label(format!("{} ({} PEs)", r.op, r.pes))
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, col.filled()));
        c.draw_series(std::iter::once(Cross::new(
            (x, r.baseline_time_us),
            5,
            col.mix(0.6),
        )))
        .map_err(|e| err(&e))?;
    }
    if !lat.is_empty() {
        c.draw_series(std::iter::empty::<Cross<(f64, f64), i32>>())
            .map_err(|e| err(&e))?
            .label("x: raw ping-pong baseline of the same colour")
            .legend(|(x, y)| Cross::new((x + 10, y), 4, BLACK.mix(0.6)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// A chart of log-scaled values against log₂-scaled sizes, drawn into an SVG.
type SizeChart<'a, 'b> = plotters::prelude::ChartContext<
    'a,
    plotters::prelude::SVGBackend<'b>,
    plotters::prelude::Cartesian2d<
        plotters::coord::combinators::LogCoord<f64>,
        plotters::coord::combinators::LogCoord<f64>,
    >,
>;

/// A chart on `area` of log-scaled `y` against log₂-scaled size `x`, with its mesh drawn.
fn size_chart<'a, 'b>(
    area: &'a plotters::drawing::DrawingArea<
        plotters::prelude::SVGBackend<'b>,
        plotters::coord::Shift,
    >,
    caption: &str,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
    err: &dyn Fn(&dyn std::fmt::Display) -> String,
) -> CliResult<SizeChart<'a, 'b>> {
    use plotters::prelude::*;
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale().base(2.0), y.log_scale())
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| human_bytes(*x as usize))
        .draw()
        .map_err(|e| err(&e))?;
    Ok(c)
}

fn bounds(v: &[f64], lo: f64, hi: f64) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    if min.is_finite() && max > 0.0 {
        (min / 2.0, max * 2.0)
    } else {
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
    }

    fn rec(op: &str, bytes: usize, t: f64, bt: f64) -> Record {
        Record {
            op: op.into(),
            api: "host".into(),
            backend: "shm".into(),
            mode: "threads".into(),
            pes: 2,
            bytes,
            iters: 1,
            time_us: t,
            gbps: 0.0,
            baseline: "memcpy".into(),
            baseline_time_us: bt,
            ratio: 0.0,
            busbw_gbps: None,
            note: String::new(),
        }
        .finish()
    }

    #[test]
    fn json_svg_and_tables() {
        let recs = vec![
            rec("put", 8, 0.004, 0.002),
            rec("put", 1 << 20, 30.0, 29.0),
            rec("put_signal", 8, 0.15, 0.14),
            rec("barrier", 0, 0.2, 0.14),
        ];
        let dir = std::env::temp_dir().join(format!("rshmem-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (j, p) = (dir.join("r.json"), dir.join("r.svg"));
        write_json(&j, &recs).unwrap();
        let back: Vec<Record> =
            serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
        assert_eq!(back, recs);
        write_svg(&p, &recs).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("put_signal") && svg.contains("memcpy"));
        let t = table(&recs);
        assert_eq!(t.lines().count(), 6);
        assert_eq!(t.lines().next(), Some(RATIO_LINE));
        // Columns line up whatever the widths of op and mode.
        let mut wide = recs.clone();
        wide[0].mode = "capturable+tokens".into();
        let t2 = table(&wide);
        let cols: Vec<Option<usize>> = t2
            .lines()
            .skip(1)
            .map(|l| l.find("memcpy").or(l.find("baseline")))
            .collect();
        assert!(cols.iter().all(|c| c.is_some() && *c == cols[0]), "{t2}");
        assert!(t.contains("1 MiB") && t.contains("0.97"));
        let md = markdown(&recs);
        assert_eq!(md.lines().count(), 8);
        assert_eq!(md.lines().next(), Some(RATIO_LINE));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(write_json(&dir.join("missing/x.json"), &recs).is_err());
    }
}
