//! `rshmem perf`: the benchmark suites, their baselines and reports.
//!
//! Every figure is printed beside a baseline measured in the same run (memcpy for bandwidth, a
//! raw atomic-flag ping-pong between two threads for latency) and the ratio
//! `baseline_time / time` (above 1: faster than the baseline).

pub mod measure;
pub mod record;
pub mod report;
pub mod suite;

use indicatif::{ProgressBar, ProgressStyle};
use measure::Timing;
use record::Record;
use rshmem::{BackendKind, Config};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use suite::{CliResult, Op, SuiteOpts};

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The best backend present (CUDA when built and a GPU is usable, else shm).
    Auto,
    /// CPU shared memory.
    Shm,
    /// NVIDIA GPUs.
    Cuda,
}

/// How the PEs are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Every PE is a thread of this process.
    Threads,
}

impl ModeArg {
    fn label(self) -> &'static str {
        match self {
            ModeArg::Threads => "threads",
        }
    }
}

/// Arguments of `rshmem perf`.
#[derive(Debug, clap::Args)]
pub struct PerfArgs {
    /// The quick suite (the default): fewer sizes and short samples, under 30 s on 2 cores.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// The full suite: every power of two from 8 B to 64 MiB and longer samples.
    #[arg(long)]
    pub full: bool,
    /// Backend to measure.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Placement of the PEs.
    #[arg(long, value_enum, default_value_t = ModeArg::Threads)]
    pub mode: ModeArg,
    /// Operations to run, comma separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub ops: Vec<Op>,
    /// Largest put/get size, e.g. 1M (default 64M).
    #[arg(long, value_parser = parse_size_arg)]
    pub max_size: Option<usize>,
    /// World sizes of the barrier figures, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4])]
    pub barrier_pes: Vec<usize>,
    /// Write the records as a JSON list to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw bandwidth and latency against size into FILE (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Also print the table as Markdown.
    #[arg(long)]
    pub markdown: bool,
}

fn parse_size_arg(s: &str) -> Result<usize, String> {
    match rshmem::config::parse_size(s) {
        Some(n) if n >= 8 => Ok(n),
        _ => Err(format!(
            "{s:?}: expected a size of at least 8 bytes, like 1M"
        )),
    }
}

/// Payload sizes: quick takes every factor of 8 plus 1 MiB and the largest; full every power of
/// two. All are multiples of 8 and at most `max`.
pub fn sizes(full: bool, max: usize) -> Vec<usize> {
    let max = max.max(8);
    let mut v: Vec<usize> = (3..40)
        .map(|p| 1usize << p)
        .filter(|&s| s <= max && (full || (s.trailing_zeros() % 3 == 0)))
        .collect();
    if !full && max >= 1 << 20 {
        v.push(1 << 20);
    }
    v.push(max / 8 * 8);
    v.sort_unstable();
    v.dedup();
    v
}

/// The timing of one figure.
pub fn timing(full: bool) -> Timing {
    Timing {
        sample_time: Duration::from_micros(100),
        samples: if full { 1001 } else { 201 },
        budget: Duration::from_millis(if full { 1500 } else { 300 }),
    }
}

/// Runs the suite on a world of `n` PEs placed as `mode`; returns PE 0's records.
///
/// Process and mixed modes add an arm here that starts the world through `rshmem::launch`
/// (or `rshmem run`) and calls the same [`suite::run`] on every PE with their mode label;
/// `outside_pp_us` is then the latency baseline, since PEs in different processes cannot run
/// the in-process raw ping-pong.
fn run_world(
    mode: ModeArg,
    n: usize,
    config: &Config,
    opts: &SuiteOpts,
    outside_pp_us: f64,
    pb: &ProgressBar,
) -> CliResult<Vec<Record>> {
    let label = mode.label();
    let per_pe = match mode {
        ModeArg::Threads => rshmem::threads_with(config.clone(), n, |pe| {
            suite::run(pe, label, opts, outside_pp_us, Some(pb))
        })?,
    };
    let mut out = Vec::new();
    for r in per_pe {
        out.extend(r?);
    }
    Ok(out)
}

/// `rshmem perf`.
pub fn run(args: PerfArgs) -> CliResult<()> {
    let backend = match args.backend {
        BackendArg::Shm => BackendKind::Shm,
        // The CUDA suite joins `Auto` once the CUDA backend is merged.
        BackendArg::Auto => BackendKind::Shm,
        BackendArg::Cuda => {
            let why = match crate::info::cuda_probe() {
                Ok(v) => format!("the driver is present ({v}) but this build has no CUDA suite"),
                Err(e) => e,
            };
            return Err(format!("CUDA backend not available: {why}").into());
        }
    };
    let full = args.full;
    let max = args.max_size.unwrap_or(64 << 20);
    let ops = if args.ops.is_empty() {
        Op::ALL.to_vec()
    } else {
        args.ops.clone()
    };
    let timing = timing(full);
    let opts = SuiteOpts {
        sizes: sizes(full, max),
        timing,
        ops: ops.clone(),
    };
    let config = Config::from_env()?
        .backend(backend)
        .heap_size(opts.heap_bytes());
    let mut barrier_pes: Vec<usize> = args
        .barrier_pes
        .iter()
        .copied()
        .filter(|&n| n >= 1)
        .collect();
    barrier_pes.dedup();
    let extra: Vec<usize> = if ops.contains(&Op::Barrier) {
        barrier_pes.iter().copied().filter(|&n| n != 2).collect()
    } else {
        Vec::new()
    };
    let main_opts = SuiteOpts {
        ops: ops
            .iter()
            .copied()
            .filter(|&o| o != Op::Barrier || barrier_pes.contains(&2))
            .collect(),
        ..opts.clone()
    };
    let barrier_opts = SuiteOpts {
        ops: vec![Op::Barrier],
        sizes: vec![8],
        timing,
    };
    let steps = main_opts.steps(2) + extra.iter().map(|&n| barrier_opts.steps(n)).sum::<u64>();

    eprintln!(
        "rshmem perf: {} suite, backend {}, mode {}, {} put/get sizes {}..{}",
        if full { "full" } else { "quick" },
        backend.name(),
        args.mode.label(),
        opts.sizes.len(),
        report::human_bytes(opts.sizes[0]),
        report::human_bytes(*opts.sizes.last().unwrap_or(&8)),
    );
    let start = Instant::now();
    let worlds: Vec<(usize, &SuiteOpts)> = std::iter::once((2, &main_opts))
        .chain(extra.iter().map(|&n| (n, &barrier_opts)))
        .collect();
    let pb = ProgressBar::new(steps + worlds.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let mut records = Vec::new();
    let mut outside = Vec::new();
    for (n, o) in worlds {
        // Measured just before each world; the latency baseline where the PEs cannot measure
        // it themselves (more than two PEs, or PEs in several processes).
        pb.set_message(format!("raw ping-pong baseline before the {n}-PE world"));
        let pp = measure::raw_ping_pong_us(&timing);
        pb.inc(1);
        outside.push(format!("{pp:.3}"));
        records.extend(run_world(args.mode, n, &config, o, pp, &pb)?);
    }
    pb.finish_and_clear();
    eprintln!(
        "done in {:.1} s; raw ping-pong (one way, us) measured before each world: {}",
        start.elapsed().as_secs_f64(),
        outside.join(", ")
    );

    print!("{}", report::table(&records));
    if args.markdown {
        print!("\n{}", report::markdown(&records));
    }
    if let Some(p) = &args.json {
        report::write_json(p, &records)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.plot {
        report::write_svg(p, &records)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lists() {
        let q = sizes(false, 64 << 20);
        assert_eq!(q.first(), Some(&8));
        assert_eq!(q.last(), Some(&(64 << 20)));
        assert!(q.contains(&(1 << 20)));
        assert!(q.iter().all(|s| s % 8 == 0));
        let f = sizes(true, 64 << 20);
        assert_eq!(f.len(), 24);
        assert_eq!(sizes(false, 100), vec![8, 64, 96]);
        assert_eq!(sizes(true, 8), vec![8]);
    }

    #[test]
    fn tiny_suite_runs_and_checks_data() {
        let opts = SuiteOpts {
            sizes: vec![8, 4096],
            timing: Timing {
                sample_time: Duration::from_micros(200),
                samples: 3,
                budget: Duration::from_millis(5),
            },
            ops: Op::ALL.to_vec(),
        };
        let config = Config::default()
            .heap_size(opts.heap_bytes())
            .timeout(Duration::from_secs(20));
        let pb = ProgressBar::hidden();
        let recs = run_world(ModeArg::Threads, 2, &config, &opts, 1.0, &pb).unwrap();
        let ops: Vec<(&str, usize)> = recs.iter().map(|r| (r.op.as_str(), r.bytes)).collect();
        assert_eq!(
            ops,
            vec![
                ("put", 8),
                ("put", 4096),
                ("get", 8),
                ("get", 4096),
                ("put_signal", 8),
                ("fetch_add", 8),
                ("barrier", 0)
            ]
        );
        for r in &recs {
            assert_eq!(
                (r.pes, r.mode.as_str(), r.backend.as_str()),
                (2, "threads", "shm")
            );
            assert!(r.iters > 0 && r.time_us > 0.0 && r.baseline_time_us > 0.0);
        }
    }
}
