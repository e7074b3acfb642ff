//! The fabric group: two processes that play two nodes (`RSHMEM_NODE` from their rank) over
//! libfabric on one provider and domain (default tcp on loopback), and `fi_pingpong` on the
//! same provider as the baselines (`fi_pingpong`, fabtests' `fi_rma_bw` / `fi_rma_pingpong`
//! and Open MPI's OpenSHMEM where they are on PATH; `rshmem_bench::fabric`).

use super::*;

/// What the fabric world runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FabricOpts {
    /// Put/get sizes.
    pub sizes: Vec<usize>,
    /// Round trips of the latency figure.
    pub latency_iters: usize,
    /// libfabric provider.
    pub provider: String,
    /// libfabric domain.
    pub domain: Option<String>,
    /// The fabric-gpu group (CUDA backend, the proxy latency figure) rather than this one.
    #[serde(default)]
    pub gpu: bool,
}

/// Runs the fabric group: a 2-process world started through the launcher; PE 0's records.
pub(super) fn run_fabric(args: &PerfArgs) -> CliResult<Vec<Record>> {
    rshmem::transport::fabric::probe()
        .map_err(|e| format!("the fabric group needs libfabric: {e}"))?;
    let max = args
        .max_size
        .unwrap_or(if args.full { 64 << 20 } else { 4 << 20 });
    let latency_iters = if args.full { 2000 } else { 300 };
    let opts = FabricOpts {
        sizes: sizes(args.full, max),
        latency_iters,
        provider: args.fabric_provider.clone(),
        domain: args.fabric_domain.clone(),
        gpu: false,
    };
    let heap = (max + (1 << 20)).next_power_of_two().max(4 << 20);
    let recs: Vec<rshmem_bench::p2p::BenchRecord> = run_two_nodes(args, opts, heap, "fabric", 900)?
        .iter()
        .map(to_bench)
        .collect::<CliResult<_>>()?;
    // The baseline runs now, with the world gone: no PE spins beside it.
    let target = rshmem_bench::fabric::FabricTarget {
        provider: args.fabric_provider.clone(),
        domain: args.fabric_domain.clone(),
    };
    let recs = rshmem_bench::fabric::add_baselines(&recs, latency_iters, &target);
    Ok(recs.iter().map(cuda::from_cuda).collect())
}

/// The worker side: this process is the node named by its rank.
pub(super) fn worker(spec: &Spec, f: &FabricOpts) -> CliResult<()> {
    node_worker(spec, f, BackendKind::Shm, |pe| {
        rshmem_bench::fabric::bench(pe, &f.sizes, f.latency_iters)
    })
}

/// A worker of a fabric group on `backend`: this process is the node named by its rank, runs
/// `bench`, and PE 0 writes the records.
pub(super) fn node_worker(
    spec: &Spec,
    f: &FabricOpts,
    backend: BackendKind,
    bench: impl FnOnce(&rshmem::Pe) -> rshmem::Result<Vec<rshmem_bench::p2p::BenchRecord>>,
) -> CliResult<()> {
    let rank = std::env::var("RSHMEM_RANK").unwrap_or_default();
    let mut config = Config::from_env()?
        .backend(backend)
        .heap_size(spec.heap)
        .node(format!("perf-node-{rank}"))
        .fabric_provider(f.provider.clone());
    if let Some(d) = &f.domain {
        config = config.fabric_domain(d.clone());
    }
    let pe = rshmem::Launch::new().config(config).init()?;
    let recs = bench(&pe)?;
    if pe.my_pe() == 0 {
        let recs: Vec<Record> = recs.iter().map(cuda::from_cuda).collect();
        if let Some(out) = &spec.out {
            report::write_json(out, &recs)?;
        }
    }
    pe.finalize()?;
    Ok(())
}

/// A record of the world back in the suite's form, for the baseline.
fn to_bench(r: &Record) -> CliResult<rshmem_bench::p2p::BenchRecord> {
    let op = match r.op.as_str() {
        "put_latency" => "put_latency",
        "put" => "put",
        "get" => "get",
        "put_nbi" => "put_nbi",
        "get_nbi" => "get_nbi",
        o => return Err(format!("unexpected record {o:?} from the fabric world").into()),
    };
    Ok(rshmem_bench::p2p::BenchRecord {
        op,
        api: "host",
        backend: "fabric",
        mode: "processes",
        pes: r.pes,
        bytes: r.bytes,
        iters: r.iters as usize,
        time_us: r.time_us,
        gbps: r.gbps,
        baseline: "fi_pingpong",
        baseline_time_us: 0.0,
        ratio: 0.0,
    })
}

/// Starts the 2-process world of a fabric group (`what`: "fabric" or "fabric-gpu") through the
/// launcher, each process the node named by its rank, and returns PE 0's records.
pub(super) fn run_two_nodes(
    args: &PerfArgs,
    opts: FabricOpts,
    heap: usize,
    what: &str,
    timeout_s: u64,
) -> CliResult<Vec<Record>> {
    let out = tempfile_path(&format!("{what}.json"));
    let backend = if opts.gpu { " (CUDA backend)" } else { "" };
    let spec = Spec {
        label: "2 nodes".into(),
        suite: None,
        coll: None,
        ep: None,
        fabric: Some(opts),
        outside_pp_us: 0.0,
        heap,
        pp: None,
        out: Some(out.clone()),
    };
    eprintln!(
        "rshmem perf: {what} group, 2 processes as 2 nodes{backend}, provider {}, domain {}",
        args.fabric_provider,
        args.fabric_domain.as_deref().unwrap_or("(first)")
    );
    let exe = std::env::current_exe().map_err(|e| format!("finding the rshmem binary: {e}"))?;
    let mut job = Job::new(2, exe);
    job.args = vec!["perf-worker".into(), serde_json::to_string(&spec)?.into()];
    job.timeout = Some(Duration::from_secs(timeout_s));
    let o = launcher::run(&job)?;
    let read = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if o.code != 0 {
        return Err(format!("the {what} world failed (exit status {})", o.code).into());
    }
    Ok(serde_json::from_str::<Vec<Record>>(&read.map_err(
        |e| format!("reading the records of the {what} world: {e}"),
    )?)?)
}
