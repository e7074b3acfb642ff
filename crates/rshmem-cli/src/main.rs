//! The `rshmem` command: `info`, `perf` and `run`.

mod info;
mod perf;
mod run;
mod sim;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// rshmem: symmetric-memory communication between PEs.
#[derive(Debug, Parser)]
#[command(name = "rshmem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Backends found, defaults, environment variables.
    Info,
    /// Benchmarks of every operation beside same-run baselines (quick suite by default).
    Perf(perf::PerfArgs),
    /// Run a program as a job of N PEs (processes, or processes of threads).
    Run(run::RunArgs),
    /// Times rshmem's collective and MoE schedules on a modelled topology.
    Sim(sim::SimArgs),
    /// Compile rshmem's CUDA kernels into the kernel cache (`RSHMEM_CACHE_DIR`) ahead of a
    /// first run; needs NVRTC, not a GPU.
    Compile {
        /// GPU architecture, e.g. sm_90 (H100/H200).
        #[arg(long, default_value = "sm_90")]
        arch: String,
    },
    /// One process of a `perf` world (started by `rshmem perf`, not by hand).
    #[command(name = "perf-worker", hide = true)]
    PerfWorker {
        /// The world's specification (JSON).
        spec: String,
    },
}

fn compile(arch: &str) -> perf::CliResult<()> {
    for (name, bytes) in rshmem::cuda::precompile(arch)? {
        println!("{name}: {bytes} bytes ({arch})");
    }
    // The benchmarks' own kernels (`rshmem perf`).
    let settings = rshmem_bench::Settings::from_env()?;
    for (name, bytes) in rshmem_bench::precompile(arch, &settings)? {
        println!("{name}: {bytes} bytes ({arch})");
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let filter = EnvFilter::try_from_env("RSHMEM_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Info => {
            print!("{}", info::report());
            Ok(())
        }
        Command::Perf(args) => perf::run(args),
        Command::PerfWorker { spec } => perf::worker(&spec),
        Command::Compile { arch } => compile(&arch),
        Command::Sim(args) => sim::run(args),
        Command::Run(args) => {
            return std::process::ExitCode::from(run::run(args).clamp(0, 255) as u8)
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rshmem: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
