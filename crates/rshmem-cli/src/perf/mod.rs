//! `rshmem perf`: the benchmark suites, their baselines and reports.
//!
//! Every figure is printed beside a baseline measured in the same run (memcpy for bandwidth, a
//! raw atomic-flag ping-pong between the same two PEs for latency: threads of this process, or
//! processes over a shared mapping; all-to-all-v for MoE dispatch/combine, NCCL all-to-all-v on
//! CUDA) and the ratio
//! `baseline_time / time` (above 1: faster than the baseline). Process and mixed worlds are
//! processes of this binary (`rshmem perf-worker`) started through [`rshmem::launcher`].

pub mod coll;
mod cuda;
pub mod ep;
mod fabric;
mod fabric_gpu;
mod flags;
pub mod measure;
pub mod record;
pub mod report;
pub mod suite;

use cuda::*;
use flags::*;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use measure::Timing;
use record::Record;
use rshmem::launcher::{self, Job};
use rshmem::{BackendKind, Config, Pe};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};
pub use suite::CliResult;
use suite::{Op, SuiteOpts};

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The best backend present: CUDA when 2 GPUs are usable, else shm.
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
    /// One PE per process (2 processes; the barrier also at `--barrier-pes` processes).
    Processes,
    /// 2 processes of 2 thread-PEs each; PE 0 pairs with PE 2 (the other process).
    Mixed,
    /// threads, then processes, then mixed.
    All,
}

impl ModeArg {
    fn label(self) -> &'static str {
        match self {
            ModeArg::Threads => "threads",
            ModeArg::Processes => "processes",
            ModeArg::Mixed => "mixed",
            ModeArg::All => "all",
        }
    }
    fn each(self) -> Vec<ModeArg> {
        match self {
            ModeArg::All => vec![ModeArg::Threads, ModeArg::Processes, ModeArg::Mixed],
            m => vec![m],
        }
    }
}

/// A group of benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SuiteArg {
    /// put, get, put_signal, fetch_add, barrier (`--ops`).
    P2p,
    /// all_reduce, all_gather, reduce_scatter, all_to_all, broadcast.
    Coll,
    /// MoE dispatch and combine (`--ep-*`).
    Ep,
    /// put/get bandwidth and 8 B latency between two processes playing two nodes over
    /// libfabric, beside `fi_pingpong` on the same provider (`--fabric-provider`,
    /// `--fabric-domain`); only when asked for.
    Fabric,
    /// 8 B put latency to a GPU on another node, device-initiated through the proxy beside
    /// host-initiated (two processes as two nodes, CUDA backend, `--fabric-provider`,
    /// `--fabric-domain`); only when asked for.
    FabricGpu,
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
    /// Backend to measure (auto: CUDA when 2 GPUs are usable, else shm).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Placement of the PEs (shm backend; default all). The CUDA PEs are threads: there only
    /// `threads` is accepted.
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Benchmark groups, comma separated (default p2p,coll,ep; `--coll` / `--ep` alone pick one).
    #[arg(long, value_enum, value_delimiter = ',', conflicts_with_all = ["coll", "ep"])]
    pub suites: Vec<SuiteArg>,
    /// Only the collectives (with `--ep`: collectives and MoE).
    #[arg(long)]
    pub coll: bool,
    /// Only MoE dispatch/combine (with `--coll`: both).
    #[arg(long)]
    pub ep: bool,
    /// MoE: tokens per PE T (shm: one value, default 256 full, 64 quick; CUDA: comma
    /// separated, default 4096,128 full, 1024,128 quick).
    #[arg(long, value_delimiter = ',')]
    pub ep_tokens: Vec<usize>,
    /// MoE: hidden size H (bf16 elements; default shm 1024, CUDA 7168).
    #[arg(long)]
    pub ep_hidden: Option<usize>,
    /// MoE: experts per token k (default shm 4, CUDA 8).
    #[arg(long)]
    pub ep_topk: Option<usize>,
    /// MoE: experts E, a multiple of the number of PEs (default shm 16, CUDA 256).
    #[arg(long)]
    pub ep_experts: Option<usize>,
    /// MoE: timed calls (shm: medians, default 5, full 20; CUDA: mean, default 10, full 50).
    #[arg(long)]
    pub ep_iters: Option<usize>,
    /// Operations of the p2p group, comma separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub ops: Vec<Op>,
    /// Largest put/get size, e.g. 1M (default 64M; collectives: 1M quick, 64M full).
    #[arg(long, value_parser = parse_size_arg)]
    pub max_size: Option<usize>,
    /// World sizes of the barrier figures, comma separated (shm backend, threads and processes
    /// modes; default 2,4).
    #[arg(long, value_delimiter = ',')]
    pub barrier_pes: Vec<usize>,
    /// CUDA: PEs, one per GPU (GPUs 0..N, or `RSHMEM_DEVICES`), for the collectives, MoE and
    /// the device barrier (default 2, sharing a GPU where there is one; device put/get and
    /// put-with-signal run between PEs 0 and 1).
    #[arg(long, value_name = "N")]
    pub gpus: Option<usize>,
    /// CUDA: the p2p group on every pair of GPUs (a 2-PE world per pair, the pair in `mode`),
    /// instead of once between the first two.
    #[arg(long)]
    pub pairs: bool,
    /// Fabric group: libfabric provider (`fi_info -l`).
    #[arg(long, default_value = "tcp")]
    pub fabric_provider: String,
    /// Fabric group: libfabric domain, the interface or device (default `lo`: loopback).
    #[arg(long, default_value = "lo")]
    pub fabric_domain: Option<String>,
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

/// What one world runs, on every PE; also what `rshmem perf` passes to the processes it starts
/// (as JSON on the command line of the hidden `perf-worker` subcommand).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    /// Mode label of the records.
    pub label: String,
    /// The point-to-point suite.
    pub suite: Option<SuiteOpts>,
    /// The collectives.
    pub coll: Option<coll::CollOpts>,
    /// MoE dispatch/combine.
    pub ep: Option<ep::EpOpts>,
    /// The fabric group (a world of its own).
    #[serde(default)]
    pub fabric: Option<fabric::FabricOpts>,
    /// Raw thread ping-pong measured before the world, one way, microseconds.
    pub outside_pp_us: f64,
    /// Symmetric heap bytes per PE.
    pub heap: usize,
    /// File of the shared raw ping-pong flags (process and mixed mode).
    pub pp: Option<PathBuf>,
    /// Where PE 0 writes its records (process and mixed mode).
    pub out: Option<PathBuf>,
}

impl Spec {
    fn steps(&self, n: usize) -> u64 {
        self.suite.as_ref().map_or(0, |s| s.steps(n))
            + self.coll.as_ref().map_or(0, |c| c.steps())
            + u64::from(self.ep.is_some())
    }
}

/// Runs the parts of `spec` on this PE; PE 0 returns the records.
fn run_parts(
    pe: &Pe,
    spec: &Spec,
    shared: Option<&measure::PingPong>,
    pb: Option<&ProgressBar>,
) -> CliResult<Vec<Record>> {
    let mut out = Vec::new();
    if let Some(s) = &spec.suite {
        out.extend(suite::run(
            pe,
            &spec.label,
            s,
            spec.outside_pp_us,
            shared,
            pb,
        )?);
    }
    if let Some(c) = &spec.coll {
        out.extend(coll::run(pe, &spec.label, c, pb)?);
    }
    if let Some(e) = &spec.ep {
        if let Some(pb) = pb.filter(|_| pe.my_pe() == 0) {
            pb.set_message(format!("ep dispatch/combine {} PEs", pe.n_pes()));
        }
        out.extend(ep::run(pe, &spec.label, e)?);
        if let Some(pb) = pb.filter(|_| pe.my_pe() == 0) {
            pb.inc(1);
        }
    }
    Ok(out)
}

/// The hidden `rshmem perf-worker SPEC`: one process of a process- or mixed-mode world started
/// by `rshmem perf` through the launcher. PE 0 writes its records to `spec.out`.
pub fn worker(spec: &str) -> CliResult<()> {
    let spec: Spec = serde_json::from_str(spec).map_err(|e| format!("perf-worker spec: {e}"))?;
    if !rshmem::launched() {
        return Err("perf-worker runs only as a process started by `rshmem perf`".into());
    }
    if let Some(f) = &spec.fabric {
        return match f.gpu {
            true => fabric_gpu::worker(&spec, f),
            false => fabric::worker(&spec, f),
        };
    }
    let shared = match &spec.pp {
        Some(p) => Some(
            measure::SharedPingPong::open(p)
                .map_err(|e| format!("raw ping-pong mapping {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let config = Config::from_env()?
        .backend(BackendKind::Shm)
        .heap_size(spec.heap);
    let per_pe = rshmem::Launch::new()
        .config(config)
        .run(2, |pe| {
            run_parts(pe, &spec, shared.as_ref().map(|s| s.flags()), None).map(|r| (pe.my_pe(), r))
        })
        .values()?;
    for r in per_pe {
        let (me, recs) = r?;
        if me == 0 {
            if let Some(out) = &spec.out {
                report::write_json(out, &recs)?;
            }
        }
    }
    Ok(())
}

/// Runs `spec` on a world of `n` PEs placed as `mode`; returns PE 0's records.
fn run_world(
    mode: ModeArg,
    n: usize,
    config: &Config,
    spec: &Spec,
    pb: &ProgressBar,
) -> CliResult<Vec<Record>> {
    let config = config.clone().heap_size(spec.heap);
    let tpp = match mode {
        ModeArg::Threads | ModeArg::All => {
            let per_pe = rshmem::Launch::new()
                .config(config)
                .threads()
                .run(n, |pe| run_parts(pe, spec, None, Some(pb)))
                .values()?;
            let mut out = Vec::new();
            for r in per_pe {
                out.extend(r?);
            }
            return Ok(out);
        }
        ModeArg::Processes => 1,
        ModeArg::Mixed => 2,
    };
    let shared = measure::SharedPingPong::create()
        .map_err(|e| format!("creating the raw ping-pong mapping: {e}"))?;
    let out = tempfile_path("records.json");
    let spec = Spec {
        pp: Some(shared.path().to_path_buf()),
        out: Some(out.clone()),
        ..spec.clone()
    };
    let exe = std::env::current_exe().map_err(|e| format!("finding the rshmem binary: {e}"))?;
    let mut job = Job::new(n, exe);
    job.threads_per_proc = tpp;
    job.args = vec!["perf-worker".into(), serde_json::to_string(&spec)?.into()];
    job.timeout = Some(Duration::from_secs(900));
    let steps = spec.steps(n);
    pb.set_message(format!(
        "{} world of {n} PEs ({} processes)",
        mode.label(),
        n / tpp
    ));
    let o = launcher::run(&job)?;
    let read = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if o.code != 0 {
        return Err(format!(
            "the {} world of {n} PEs failed (exit status {}{})",
            mode.label(),
            o.code,
            if o.timed_out { ", timed out" } else { "" }
        )
        .into());
    }
    let recs: Vec<Record> = serde_json::from_str(
        &read.map_err(|e| format!("reading the records of the {} world: {e}", mode.label()))?,
    )?;
    pb.inc(steps);
    Ok(recs)
}

fn tempfile_path(what: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!(
        "rshmem-perf-{}-{nanos:08x}-{what}",
        std::process::id()
    ))
}

/// The backend a run measures, `auto` resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Shm,
    Cuda,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Shm => "shm",
            Backend::Cuda => "cuda",
        }
    }
}

/// `rshmem perf`.
pub fn run(args: PerfArgs) -> CliResult<()> {
    // Every flag is checked before anything is measured, and with `--backend cuda` before CUDA
    // is loaded: a flag the chosen backend would not honour is an error, never ignored.
    check_group_flags(&args)?;
    let mut groups = groups(&args);
    // The fabric group is a world of its own, whatever the backend of the others.
    let mut fabric_records = Vec::new();
    if groups.contains(&SuiteArg::Fabric) {
        fabric_records = fabric::run_fabric(&args)?;
        groups.retain(|&g| g != SuiteArg::Fabric);
    }
    if groups.contains(&SuiteArg::FabricGpu) {
        fabric_records.extend(fabric_gpu::run_fabric_gpu(&args)?);
        groups.retain(|&g| g != SuiteArg::FabricGpu);
    }
    if groups.is_empty() {
        return report_records(&args, &fabric_records);
    }
    // The backend, its GPUs, and why `auto` fell back to shm.
    let (backend, gpus, auto_note) = match args.backend {
        BackendArg::Shm => (Backend::Shm, 0, None),
        BackendArg::Cuda => {
            check_backend_flags(&args, Backend::Cuda, false)?;
            // Bad MoE flags are reported as such, GPU or not.
            cuda_default_ep(&args, &mut groups)?;
            match cuda_usable() {
                Ok(i) => (Backend::Cuda, i.gpus.len(), None),
                Err(why) => return Err(format!("CUDA backend not available: {why}").into()),
            }
        }
        BackendArg::Auto => match cuda_usable().and_then(|i| {
            if i.gpus.len() >= 2 {
                Ok(i)
            } else {
                Err("the CUDA suite needs 2 GPUs, this machine has 1".into())
            }
        }) {
            Ok(i) => (Backend::Cuda, i.gpus.len(), None),
            Err(why) => (
                Backend::Shm,
                0,
                Some(format!(
                    "rshmem perf: CUDA not available ({why}); measuring the shm backend"
                )),
            ),
        },
    };
    if args.backend != BackendArg::Cuda {
        check_backend_flags(&args, backend, args.backend == BackendArg::Auto)?;
    }
    let records = match backend {
        Backend::Cuda => {
            if args.backend == BackendArg::Auto {
                cuda_default_ep(&args, &mut groups)?;
            }
            run_cuda(&args, &groups, gpus)?
        }
        Backend::Shm => {
            if let Some(n) = auto_note {
                eprintln!("{n}");
            }
            run_shm(&args, &groups)?
        }
    };
    let mut records = records;
    records.extend(fabric_records);
    report_records(&args, &records)
}

/// Prints the table (and Markdown) and writes the files asked for.
fn report_records(args: &PerfArgs, records: &[Record]) -> CliResult<()> {
    let records = records.to_vec();
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

/// A progress bar on stderr (elapsed time, bar, steps done, what runs now), drawn only where
/// stderr is a terminal, so that logs and pipes get no bar lines.
fn progress_bar(steps: u64, prefix: &str) -> CliResult<ProgressBar> {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(Some(steps), target);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} [{prefix}] {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    pb.set_prefix(prefix.to_string());
    Ok(pb)
}

/// The CPU-backend suites over the chosen modes.
fn run_shm(args: &PerfArgs, groups: &[SuiteArg]) -> CliResult<Vec<Record>> {
    let full = args.full;
    let mode = args.mode.unwrap_or(ModeArg::All);
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
    let coll_opts = groups.contains(&SuiteArg::Coll).then(|| {
        coll::CollOpts::new(
            full,
            args.max_size
                .unwrap_or(if full { 64 << 20 } else { 1 << 20 }),
        )
    });
    let ep_opts = if groups.contains(&SuiteArg::Ep) {
        let tokens = match args.ep_tokens.as_slice() {
            // Quick: a size whose dispatch and combine take about a second over the three modes
            // in a debug build, so MoE fits the default run.
            [] if full => 256,
            [] => 64,
            [t] => *t,
            more => {
                return Err(
                    format!("--ep-tokens {more:?}: the shm backend takes one token count").into(),
                )
            }
        };
        Some(ep::EpOpts {
            tokens,
            hidden: args.ep_hidden.unwrap_or(1024),
            top_k: args.ep_topk.unwrap_or(4),
            experts: args.ep_experts.unwrap_or(16),
            iters: args.ep_iters.unwrap_or(if full { 20 } else { 5 }),
        })
    } else {
        None
    };
    let p2p = groups.contains(&SuiteArg::P2p);
    let config = Config::from_env()?.backend(BackendKind::Shm);
    let mut barrier_pes = if args.barrier_pes.is_empty() {
        vec![2, 4]
    } else {
        args.barrier_pes.clone()
    };
    barrier_pes.dedup();
    let with_barrier = p2p && ops.contains(&Op::Barrier);
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

    // The worlds: (mode, PEs, spec).
    let mut worlds: Vec<(ModeArg, usize, Spec)> = Vec::new();
    for mode in mode.each() {
        let (n, suite) = match mode {
            ModeArg::Mixed => (4, p2p.then(|| opts.clone())),
            _ => (2, p2p.then(|| main_opts.clone())),
        };
        let mut heap = suite.as_ref().map_or(1 << 20, |s| s.heap_bytes());
        if let Some(c) = &coll_opts {
            heap = heap.max(c.heap_bytes());
        }
        if let Some(e) = &ep_opts {
            e.check(n)?;
            heap = heap.max(e.heap_bytes(n)?);
        }
        worlds.push((
            mode,
            n,
            Spec {
                label: mode.label().into(),
                suite,
                coll: coll_opts.clone(),
                ep: ep_opts,
                fabric: None,
                outside_pp_us: 0.0,
                heap,
                pp: None,
                out: None,
            },
        ));
        if with_barrier && mode != ModeArg::Mixed {
            for &b in barrier_pes.iter().filter(|&&b| b != 2) {
                worlds.push((
                    mode,
                    b,
                    Spec {
                        label: mode.label().into(),
                        suite: Some(barrier_opts.clone()),
                        coll: None,
                        ep: None,
                        fabric: None,
                        outside_pp_us: 0.0,
                        heap: barrier_opts.heap_bytes(),
                        pp: None,
                        out: None,
                    },
                ));
            }
        }
    }
    let steps: u64 = worlds.iter().map(|(_, n, s)| s.steps(*n) + 1).sum();
    eprintln!(
        "rshmem perf: {} suite, backend shm, mode {}, groups {}, {} put/get sizes {}..{}",
        if full { "full" } else { "quick" },
        mode.label(),
        group_names(groups),
        opts.sizes.len(),
        report::human_bytes(opts.sizes[0]),
        report::human_bytes(*opts.sizes.last().unwrap_or(&8)),
    );
    let start = Instant::now();
    let pb = progress_bar(steps, "shm")?;
    let mut records = Vec::new();
    let mut outside = Vec::new();
    for (mode, n, mut spec) in worlds {
        pb.set_prefix(format!("shm {}", mode.label()));
        // Measured just before each world: the latency baseline where the PEs cannot measure
        // it themselves (more than two thread-PEs), and a reference beside the process-mode
        // raw ping-pong.
        pb.set_message(format!("raw ping-pong baseline before the {n}-PE world"));
        let pp = measure::raw_ping_pong_us(&timing);
        pb.inc(1);
        outside.push(format!("{pp:.3}"));
        spec.outside_pp_us = pp;
        let mut recs = run_world(mode, n, &config, &spec, &pb)?;
        if mode != ModeArg::Threads {
            for r in recs
                .iter_mut()
                .filter(|r| r.baseline == suite::PING_PONG_NAME)
            {
                r.note.push_str(&format!(
                    "; raw thread ping-pong before the world: {pp:.3} us"
                ));
            }
        }
        records.extend(recs);
    }
    pb.finish_and_clear();
    eprintln!(
        "done in {:.1} s; raw thread ping-pong (one way, us) measured before each world: {}",
        start.elapsed().as_secs_f64(),
        outside.join(", ")
    );
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_records_convert() {
        let b = rshmem_bench::p2p::BenchRecord {
            op: "device_put",
            api: "device",
            backend: "cuda",
            mode: "threads",
            pes: 2,
            bytes: 1 << 20,
            iters: 100,
            time_us: 4.0,
            gbps: (1 << 20) as f64 / 4e3,
            baseline: "cuMemcpyPeerAsync",
            baseline_time_us: 5.0,
            ratio: 1.25,
        };
        let r = from_cuda(&b);
        assert_eq!(
            (
                r.op.as_str(),
                r.api.as_str(),
                r.backend.as_str(),
                r.mode.as_str()
            ),
            ("device_put", "device", "cuda", "threads")
        );
        assert_eq!((r.pes, r.bytes, r.iters), (2, 1 << 20, 100));
        assert_eq!(r.kind(), record::Kind::Bandwidth);
        assert!((r.gbps - b.gbps).abs() < 1e-9 && (r.ratio - 1.25).abs() < 1e-12);
        let bar = rshmem_bench::p2p::BenchRecord {
            op: "device_barrier",
            bytes: 0,
            baseline: "none",
            baseline_time_us: 0.0,
            ratio: 0.0,
            gbps: 0.0,
            ..b
        };
        let r = from_cuda(&bar);
        assert_eq!(
            (r.kind(), r.ratio, r.gbps),
            (record::Kind::Latency, 0.0, 0.0)
        );
    }

    #[test]
    fn cuda_ep_records_convert() {
        let a = rshmem_bench::ep_cuda::EpBenchArgs::default();
        let b = rshmem_bench::ep_cuda::EpBenchRecord {
            op: "ep_dispatch",
            api: "device",
            backend: "cuda",
            mode: "capturable",
            pes: 2,
            tokens: 4096,
            bytes: 58_000_000,
            iters: 20,
            time_us: 200.0,
            gbps: 290.0,
            baseline: rshmem_bench::ep_cuda::EP_BASELINE.into(),
            baseline_note: None,
            baseline_time_us: 500.0,
            ratio: 2.5,
        };
        let r = from_cuda_ep(&b, &a);
        assert_eq!(
            (r.op.as_str(), r.mode.as_str(), r.baseline.as_str()),
            ("ep_dispatch", "capturable", "nccl-a2av")
        );
        assert!((r.gbps - 290.0).abs() < 1e-9 && (r.ratio - 2.5).abs() < 1e-12);
        assert!(r.note.contains("T=4096 H=7168 k=8 E=256") && r.note.contains("graph"));
        let missing = rshmem_bench::ep_cuda::EpBenchRecord {
            baseline_note: Some("PEs share a GPU".into()),
            baseline_time_us: 0.0,
            ratio: 0.0,
            ..b
        };
        let r = from_cuda_ep(&missing, &a);
        assert_eq!((r.ratio, r.baseline_time_us), (0.0, 0.0));
        assert!(r.note.contains("baseline missing: PEs share a GPU"));
    }

    #[test]
    fn cuda_ep_sizes() {
        let p = |v: &[&str]| {
            #[derive(clap::Parser)]
            struct W {
                #[command(flatten)]
                a: PerfArgs,
            }
            <W as clap::Parser>::try_parse_from(std::iter::once("perf").chain(v.iter().copied()))
                .map(|w| w.a)
                .unwrap()
        };
        let q = cuda_ep_args(&p(&["--ep"]), 2).unwrap();
        assert_eq!(
            (q.tokens, q.hidden, q.top_k, q.experts, q.iters),
            (vec![1024, 128], 7168, 8, 256, 10)
        );
        let f = cuda_ep_args(&p(&["--ep", "--full"]), 2).unwrap();
        assert_eq!((f.tokens, f.iters), (vec![4096, 128], 50));
        let c = cuda_ep_args(
            &p(&["--ep", "--ep-tokens", "64,8", "--ep-hidden", "256"]),
            2,
        )
        .unwrap();
        assert_eq!((c.tokens, c.hidden), (vec![64, 8], 256));
        assert!(cuda_ep_args(&p(&["--ep", "--ep-experts", "255"]), 2).is_err());
        assert!(cuda_ep_args(&p(&["--ep", "--ep-topk", "300"]), 2).is_err());
        // E must split evenly over the PEs `--gpus` asks for.
        assert!(cuda_ep_args(&p(&["--ep", "--ep-experts", "254"]), 2).is_ok());
        assert!(cuda_ep_args(&p(&["--ep", "--ep-experts", "254"]), 4).is_err());
        // --gpus: at least 2, at most the GPUs there are; default 2.
        assert_eq!(cuda_pes(&p(&[]), 8).unwrap(), 2);
        assert_eq!(
            cuda_pes(&p(&[]), 1).unwrap(),
            2,
            "the default on one GPU: 2 PEs share it"
        );
        assert_eq!(cuda_pes(&p(&["--gpus", "4"]), 4).unwrap(), 4);
        let e = cuda_pes(&p(&["--gpus", "4"]), 2).unwrap_err().to_string();
        assert!(e.contains("2 GPU(s)"), "{e}");
        assert!(cuda_pes(&p(&["--gpus", "1"]), 8).is_err());
        assert!(p(&["--pairs"]).pairs);
    }

    #[test]
    fn default_groups_and_the_cuda_default_moe() {
        let p = |v: &[&str]| {
            #[derive(clap::Parser)]
            struct W {
                #[command(flatten)]
                a: PerfArgs,
            }
            <W as clap::Parser>::try_parse_from(std::iter::once("perf").chain(v.iter().copied()))
                .map(|w| w.a)
                .unwrap()
        };
        let all = vec![SuiteArg::P2p, SuiteArg::Coll, SuiteArg::Ep];
        assert_eq!(groups(&p(&[])), all);
        assert_eq!(groups(&p(&["--ep"])), vec![SuiteArg::Ep]);
        assert_eq!(groups(&p(&["--suites", "p2p,coll"])), all[..2]);
        // The default MoE shape (E = 256) does not split over 3 GPUs: the default run leaves
        // MoE out, a run that asks for it fails.
        let mut g = groups(&p(&["--gpus", "3"]));
        cuda_default_ep(&p(&["--gpus", "3"]), &mut g).unwrap();
        assert_eq!(g, all[..2]);
        let mut g = groups(&p(&["--gpus", "4"]));
        cuda_default_ep(&p(&["--gpus", "4"]), &mut g).unwrap();
        assert_eq!(g, all);
        for asked in [
            &["--gpus", "3", "--ep"][..],
            &["--gpus", "3", "--ep-iters", "2"],
        ] {
            let a = p(asked);
            let mut g = groups(&a);
            let e = cuda_default_ep(&a, &mut g).unwrap_err().to_string();
            assert!(e.contains("--ep-experts 256"), "{asked:?}: {e}");
        }
    }

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
        let spec = Spec {
            label: "threads".into(),
            heap: opts.heap_bytes(),
            suite: Some(opts),
            coll: None,
            ep: None,
            fabric: None,
            outside_pp_us: 1.0,
            pp: None,
            out: None,
        };
        let recs = run_world(ModeArg::Threads, 2, &config, &spec, &pb).unwrap();
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
