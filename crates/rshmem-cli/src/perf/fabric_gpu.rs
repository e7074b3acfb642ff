//! The fabric-gpu group: two processes that play two nodes over libfabric (as the fabric group)
//! with the CUDA backend, timing an 8-byte put to the other node's GPU issued by a kernel
//! through the proxy beside the same put from the host (`rshmem_bench::fabric_gpu`).

use super::*;

/// Runs the group: a 2-process CUDA world started through the launcher; PE 0's records.
pub(super) fn run_fabric_gpu(args: &PerfArgs) -> CliResult<Vec<Record>> {
    rshmem::transport::fabric::probe()
        .map_err(|e| format!("the fabric-gpu group needs libfabric: {e}"))?;
    let opts = fabric::FabricOpts {
        sizes: vec![8],
        latency_iters: if args.full { 2000 } else { 300 },
        provider: args.fabric_provider.clone(),
        domain: args.fabric_domain.clone(),
        gpu: true,
    };
    let recs = fabric::run_two_nodes(args, opts, 4 << 20, "fabric-gpu", 600)?;
    for r in recs.iter().filter(|r| r.api == "device") {
        eprintln!(
            "  {} (device-initiated, 8 B to the other node): {:.2} us, {:.2} us above the host's",
            r.op,
            r.time_us,
            r.time_us - r.baseline_time_us
        );
    }
    Ok(recs)
}

/// The worker side: this process is the node named by its rank, on the CUDA backend (PEs
/// share GPUs round robin where there are fewer GPUs than PEs).
pub(super) fn worker(spec: &Spec, f: &fabric::FabricOpts) -> CliResult<()> {
    fabric::node_worker(spec, f, BackendKind::Cuda, |pe| {
        rshmem_bench::fabric_gpu::bench(pe, f.latency_iters)
    })
}
