//! Hierarchical against flat collectives (barrier, all_reduce, reduce, reduce_scatter) and MoE
//! across nodes (`rshmem_bench::hier`), in one run: 4 processes as 2 nodes of 2 PEs over
//! libfabric's tcp provider on loopback.
//!
//! `cargo run --release -p rshmem-bench --example fabric_hier [-- ITERS [quick]]` (`quick`:
//! one small size of each, a smaller heap).
//!
//! The program starts itself through the launcher; each process names its node from its rank.
//! PE 0 prints a Markdown table.

use rshmem::launcher::{self, Job};
use rshmem::{Config, Launch};
use rshmem_bench::hier::{bench, HierOpts};
use std::time::Duration;

const CHILD: &str = "RSHMEM_FABRIC_HIER_CHILD";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20);
    let quick = std::env::args().nth(2).as_deref() == Some("quick");
    if std::env::var_os(CHILD).is_none() {
        rshmem::transport::fabric::probe()?;
        let mut job = Job::new(4, std::env::current_exe()?);
        job.args = std::env::args_os().skip(1).collect();
        let heap = if quick { "64M" } else { "512M" };
        job.env = vec![
            (CHILD.into(), "1".into()),
            ("RSHMEM_HEAP_SIZE".into(), heap.into()),
        ];
        job.prefix = true;
        job.timeout = Some(Duration::from_secs(1200));
        let o = launcher::run(&job)?;
        std::process::exit(o.code);
    }
    let rank: usize = std::env::var("RSHMEM_RANK")?.parse()?;
    let config = Config::from_env()?
        .node(format!("hier-node-{}", rank / 2))
        .fabric_provider("tcp")
        .fabric_domain("lo");
    let pe = Launch::new().config(config).init()?;
    let opts = if quick {
        HierOpts {
            sizes: vec![8 << 10],
            moe: vec![(16, 256)],
            iters,
        }
    } else {
        HierOpts {
            sizes: vec![8 << 10, 256 << 10, 4 << 20, 32 << 20],
            moe: vec![(128, 2048), (512, 4096)],
            iters,
        }
    };
    let recs = bench(&pe, &opts)?;
    if pe.my_pe() == 0 {
        println!(
            "| op | bytes per PE | path | time (µs) | bytes across nodes per PE | messages across nodes per PE |"
        );
        println!("| --- | ---: | --- | ---: | ---: | ---: |");
        for r in &recs {
            let msgs = if r.net_msgs.is_nan() {
                "–".to_string()
            } else {
                format!("{:.1}", r.net_msgs)
            };
            println!(
                "| {} | {} | {} | {:.1} | {:.0} | {msgs} |",
                r.op, r.bytes, r.path, r.time_us, r.net_bytes
            );
        }
    }
    pe.finalize()?;
    Ok(())
}
