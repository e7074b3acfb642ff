//! MoE dispatch/combine benchmark on the CPU backend (until `rshmem perf --ep` calls
//! `rshmem::ep::bench`): `cargo run --release -p rshmem --example ep_bench -- T H K E [PES] [ITERS]`.
//!
//! Prints, over PEs, the slowest PE's median times and the bandwidth (bytes sent to other PEs /
//! time) of dispatch and combine, and of the all-to-all-v baseline.

use rshmem::ep::{bench, BenchArgs, BenchReport, EpMode};
use rshmem::{bf16, Config};

fn main() -> rshmem::Result<()> {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numeric arguments: T H K E [PES] [ITERS]"))
        .collect();
    let get = |i: usize, d: usize| a.get(i).copied().unwrap_or(d);
    let args = BenchArgs {
        tokens: get(0, 512),
        hidden: get(1, 2048),
        top_k: get(2, 8),
        num_experts: get(3, 64),
        warmup: 1,
        iters: get(5, 5),
        seed: 1,
        mode: EpMode::Normal,
    };
    let pes = get(4, 2);
    let cfg = Config::from_env()?.heap_size(4 << 30);
    let r = rshmem::threads_with(cfg, pes, |pe| bench::<bf16>(pe, &args))?;
    let r: Vec<BenchReport> = r.into_iter().collect::<rshmem::Result<_>>()?;
    let max = |f: fn(&BenchReport) -> f64| r.iter().map(f).fold(0.0, f64::max);
    let bytes = |f: fn(&BenchReport) -> usize| r.iter().map(f).sum::<usize>() as f64 / pes as f64;
    let (db, cb) = (bytes(|x| x.dispatch_bytes), bytes(|x| x.combine_bytes));
    println!("{args:?} pes={pes} buffer={} B/PE", r[0].buffer_bytes);
    for (name, t, b) in [
        ("ep_dispatch", max(|x| x.dispatch_s), db),
        ("ep_combine", max(|x| x.combine_s), cb),
        ("a2av_dispatch", max(|x| x.a2av_dispatch_s), db),
        ("a2av_combine", max(|x| x.a2av_combine_s), cb),
    ] {
        println!(
            "{name:14} {:9.1} us  {:7.2} GB/s (avg bytes to others per PE {:.0})",
            t * 1e6,
            b / t / 1e9,
            b
        );
    }
    Ok(())
}
