//! The `rshmem` command.
use clap::{Parser, Subcommand};

mod run;

#[derive(Debug, Parser)]
#[command(name = "rshmem", version, about = "rshmem: launcher, info, perf")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a program as a job of N PEs (processes, or processes of threads).
    Run(run::RunArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSHMEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Run(a) => run::run(a),
    };
    std::process::exit(code);
}
