//! MoE dispatch/combine benchmark on the CPU backend (`rshmem perf --ep` measures the same
//! through `rshmem_bench::ep::bench`):
//! `cargo run --release -p rshmem-bench --example ep_bench -- T H K E [PES] [ITERS]`, or as a job:
//! `rshmem run -n 2 target/release/examples/ep_bench T H K E` (PES is then the job's size).
//!
//! Prints (PE 0), over all PEs of the world, the slowest PE's median times and the bandwidth
//! (hidden-state bytes sent to other PEs, mean over PEs / time) of dispatch and combine, and of
//! the all-to-all-v baseline.

use rshmem::ep::{EpMode, RecvLayout};
use rshmem::{bf16, Config, Pe};
use rshmem_bench::ep::{bench, BenchArgs, BenchReport};

/// Gathers every PE's report on PE 0 (a collective); `Some(reports)` on PE 0.
fn gather(pe: &Pe, r: &BenchReport) -> rshmem::Result<Option<Vec<BenchReport>>> {
    const W: usize = 7;
    let n = pe.n_pes();
    let slots = pe.alloc::<u64>(W * n)?;
    let mine = [
        r.buffer_bytes as u64,
        r.dispatch_s.to_bits(),
        r.combine_s.to_bits(),
        r.a2av_dispatch_s.to_bits(),
        r.a2av_combine_s.to_bits(),
        r.dispatch_bytes as u64,
        r.combine_bytes as u64,
    ];
    pe.put(&slots, W * pe.my_pe(), &mine, 0)?;
    pe.barrier_all()?;
    let out = if pe.my_pe() == 0 {
        let mut all = vec![0u64; W * n];
        pe.get(&slots, 0, &mut all, 0)?;
        Some(
            all.chunks(W)
                .map(|v| BenchReport {
                    buffer_bytes: v[0] as usize,
                    dispatch_s: f64::from_bits(v[1]),
                    combine_s: f64::from_bits(v[2]),
                    a2av_dispatch_s: f64::from_bits(v[3]),
                    a2av_combine_s: f64::from_bits(v[4]),
                    dispatch_bytes: v[5] as usize,
                    combine_bytes: v[6] as usize,
                })
                .collect(),
        )
    } else {
        None
    };
    pe.barrier_all()?;
    pe.free(slots)?;
    Ok(out)
}

fn main() -> rshmem::Result<()> {
    let mut a = Vec::new();
    for s in std::env::args().skip(1) {
        match s.parse::<usize>() {
            Ok(v) => a.push(v),
            Err(_) => {
                eprintln!("ep_bench: {s:?}: numeric arguments expected: T H K E [PES] [ITERS]");
                std::process::exit(2);
            }
        }
    }
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
        layout: RecvLayout::ExpertMajor,
    };
    // Without a launcher: PES thread-PEs (RSHMEM_PES overrides); launched: this process's PEs.
    let cfg = Config::from_env()?.heap_size(4 << 30);
    let per_pe = rshmem::Launch::new()
        .config(cfg)
        .run(get(4, 2), |pe| {
            let r = bench::<bf16>(pe, &args)?;
            gather(pe, &r)
        })
        .values()?;
    for r in per_pe {
        let Some(r) = r? else { continue };
        let pes = r.len();
        let max = |f: fn(&BenchReport) -> f64| r.iter().map(f).fold(0.0, f64::max);
        let bytes =
            |f: fn(&BenchReport) -> usize| r.iter().map(f).sum::<usize>() as f64 / pes as f64;
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
    }
    Ok(())
}
