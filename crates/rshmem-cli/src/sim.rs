//! `rshmem sim`: times rshmem's schedules on a modelled topology (the `rshmem-sim` crate),
//! calibrates the model against `rshmem perf --json` files, and picks tuning thresholds.

use crate::perf::CliResult;
use clap::Args;
use rshmem_sim::calibrate;
use rshmem_sim::schedule::{build, EpSpec, Op, Setup};
use rshmem_sim::{simulate, SimResult, Topology};

/// Arguments of `rshmem sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Topology TOML file (`crates/rshmem-sim/topologies/`); `--calibrate` takes one per GPU
    /// count.
    #[arg(long, required = true)]
    topology: Vec<String>,
    /// PEs (the topology's first N GPUs; default: all of them).
    #[arg(long)]
    pes: Option<usize>,
    /// Operation: all_reduce, all_to_all, all_gather, reduce_scatter, broadcast, reduce,
    /// dispatch, combine, put, get, ring_all_reduce.
    #[arg(long, default_value = "all_reduce")]
    op: String,
    /// Sizes (K/M/G suffixes), comma separated; MoE calls take their size from --ep-*.
    #[arg(long, value_delimiter = ',', default_value = "8,64K,1M,16M,256M,1G")]
    sizes: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Draw time against size as SVG here.
    #[arg(long)]
    plot: Option<String>,
    /// Busiest links listed per size.
    #[arg(long, default_value_t = 5)]
    busiest: usize,
    /// Also run the calls on the CPU backend with real data, checked, on the simulated clock.
    #[arg(long)]
    functional: bool,
    /// MoE tokens per PE.
    #[arg(long, default_value_t = 4096)]
    ep_tokens: usize,
    /// MoE hidden size.
    #[arg(long, default_value_t = 7168)]
    ep_hidden: usize,
    /// MoE top-k.
    #[arg(long, default_value_t = 8)]
    ep_topk: usize,
    /// MoE experts (a multiple of the PEs).
    #[arg(long, default_value_t = 256)]
    ep_experts: usize,
    /// MoE routing seed.
    #[arg(long, default_value_t = 1)]
    ep_seed: u64,
    /// MoE token-major receive layout (default expert-major).
    #[arg(long)]
    ep_token_major: bool,
    /// MoE routing from a file: a JSON list per PE of its tokens' top-k expert ids.
    #[arg(long)]
    ep_routing: Option<String>,
    /// Fit the model to these `rshmem perf --json` files, oldest first, and print the error
    /// table. `FILE@A|B` keeps the runs named A… or B…; `FILE!P|Q` leaves out the file's
    /// records of paths P and Q (or `OP:P`) whose kernels changed after it was measured.
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    calibrate: Vec<String>,
    /// Pick the tuning thresholds (LL sizes, pull or push) for the topology.
    #[arg(long)]
    tune: bool,
}

fn size(s: &str) -> CliResult<usize> {
    rshmem::config::parse_size(s.trim()).ok_or_else(|| format!("bad size {s:?}").into())
}

/// Runs `rshmem sim`.
pub fn run(a: SimArgs) -> CliResult<()> {
    if !a.calibrate.is_empty() {
        return run_calibration(&a);
    }
    let topo = Topology::load(&a.topology[0])?;
    let pes = a.pes.unwrap_or(topo.gpus());
    let ep = EpSpec {
        tokens: a.ep_tokens,
        hidden: a.ep_hidden,
        topk: a.ep_topk,
        experts: a.ep_experts,
        seed: a.ep_seed,
        token_major: a.ep_token_major,
        routing: match &a.ep_routing {
            Some(p) => Some(serde_json::from_str(&std::fs::read_to_string(p)?)?),
            None => None,
        },
        ..EpSpec::default()
    };
    let setup = Setup {
        ep,
        ..Setup::default()
    };
    if a.tune {
        print!("{}", rshmem_sim::tune::report(&topo, &setup, pes)?);
        return Ok(());
    }
    let op = Op::parse(&a.op)?;
    let sizes: Vec<usize> = if matches!(op, Op::Dispatch | Op::Combine) {
        vec![0]
    } else {
        a.sizes.iter().map(|s| size(s)).collect::<CliResult<_>>()?
    };
    println!("{} ({} PEs)", topo.name, pes);
    println!(
        "{:>12} {:>14} {:>14} {:>12} {:>12} {:>10} {:>10}  path",
        "bytes", "time (us)", "wall (ms)", "algbw GB/s", "busbw GB/s", "events", "flows"
    );
    let mut out = Vec::new();
    for &bytes in &sizes {
        let wall = std::time::Instant::now();
        let prog = build(&topo, &setup, op, pes, bytes)?;
        // Phases count the progress of a plan; a call of one or a few phases (a MoE call on
        // many PEs) shows a spinner and the time spent.
        let bar = if prog.phases.len() >= 8 {
            let b = indicatif::ProgressBar::new(prog.phases.len() as u64);
            b.set_style(indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} phases, {elapsed}",
            )?);
            b
        } else {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(indicatif::ProgressStyle::with_template(
                "{spinner} simulating {msg}, {elapsed}",
            )?);
            b.set_message(format!(
                "{} flows",
                prog.phases.iter().map(|p| p.xfers.len()).sum::<usize>()
            ));
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        };
        let r = simulate(&topo, &prog, &mut |d, _| bar.set_position(d as u64))?;
        bar.finish_and_clear();
        let ms = wall.elapsed().as_secs_f64() * 1e3;
        println!(
            "{:>12} {:>14.2} {:>14.1} {:>12.2} {:>12.2} {:>10} {:>10}  {}",
            r.bytes, r.time_us, ms, r.algbw_gbps, r.busbw_gbps, r.events, r.flows, r.path
        );
        for u in r.busiest(&topo, a.busiest, false) {
            println!(
                "{:>14} {:<40} {:>14.0} B  busy {:>10.2} us  utilisation {:>5.1} %",
                "",
                u.name,
                u.bytes,
                u.busy_us,
                u.utilisation * 100.0
            );
        }
        if a.functional {
            let f = rshmem_sim::functional::run(&topo, &setup, op, pes.min(8), bytes)?;
            println!(
                "{:>14} functional on {} CPU PEs: {} values checked, simulated {:.2} us",
                "", f.pes, f.checked, f.time_us
            );
        }
        out.push((r, ms));
    }
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = out.iter().map(|(r, ms)| record(&topo, r, *ms)).collect();
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    if let Some(p) = &a.plot {
        plot(p, &topo.name, op.name(), &out)?;
    }
    Ok(())
}

fn record(topo: &Topology, r: &SimResult, wall_ms: f64) -> serde_json::Value {
    let busiest: Vec<serde_json::Value> = r
        .busiest(topo, 10, true)
        .into_iter()
        .map(|u| serde_json::json!({"link": u.name, "bytes": u.bytes, "busy_us": u.busy_us, "utilisation": u.utilisation}))
        .collect();
    serde_json::json!({
        "topology": topo.name, "op": r.op, "pes": r.pes, "bytes": r.bytes, "path": r.path,
        "time_us": r.time_us, "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps,
        "events": r.events, "flows": r.flows, "wall_ms": wall_ms, "busiest_links": busiest,
    })
}

fn plot(path: &str, title: &str, op: &str, out: &[(SimResult, f64)]) -> CliResult<()> {
    use plotters::prelude::*;
    let pts: Vec<(f64, f64)> = out
        .iter()
        .filter(|(r, _)| r.bytes > 0)
        .map(|(r, _)| ((r.bytes as f64).log2(), r.time_us.max(1e-3).log10()))
        .collect();
    let (x0, x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (y0, y1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(format!("{op}: {title}"), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0 - 0.5..x1 + 0.5, y0 - 0.2..y1 + 0.2)?;
    c.configure_mesh()
        .x_desc("log2 bytes")
        .y_desc("log10 simulated us")
        .draw()?;
    c.draw_series(LineSeries::new(pts.clone(), &BLUE))?;
    c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))?;
    root.present()?;
    Ok(())
}

/// `--calibrate`: the topologies (one per GPU count) fitted to the files; prints the fitted
/// parameters, every case and the error table.
fn run_calibration(a: &SimArgs) -> CliResult<()> {
    let mut topos = Vec::new();
    for t in &a.topology {
        let topo = Topology::load(t)?;
        topos.push((topo.gpus(), topo));
    }
    let start = topos[0].1.model;
    let cases = calibrate::load_cases(&a.calibrate)?;
    let setup = Setup::default();
    let (model, rows) = calibrate::fit(&topos, &setup, &cases, start)?;
    println!(
        "[model]\nlaunch_us = {:.3}\nblock_gbps = {:.3}\nfence_us = {:.3}\npeer_us = {:.3}\n\
         late_wait_us = {:.3}\nll_efficiency = {:.3}\nep_dispatch_us = {:.3}\nep_combine_us = {:.3}\n\
         ep_expand_tail_us = {:.3}\n",
        model.launch_us,
        model.block_gbps,
        model.fence_us,
        model.peer_us,
        model.late_wait_us,
        model.ll_efficiency,
        model.ep_dispatch_us,
        model.ep_combine_us,
        model.ep_expand_tail_us
    );
    println!(
        "| op | GPUs | bytes | variant | measured us | simulated us | path taken | error | set |"
    );
    println!("| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | --- |");
    for r in &rows {
        let set = if r.stale {
            "left out"
        } else if r.train {
            "fit"
        } else {
            "validation"
        };
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {} | {:+.1} % | {set} |",
            r.case.op,
            r.case.pes,
            r.case.bytes,
            r.case.variant(),
            r.case.time_us,
            r.sim_us,
            r.path,
            r.error * 100.0
        );
    }
    println!();
    print!("{}", calibrate::table(&rows));
    Ok(())
}
