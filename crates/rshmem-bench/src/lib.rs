//! rshmem's benchmarks, run by `rshmem perf`: each suite times rshmem beside a baseline
//! measured in the same run, and checks the data where it moves any. The library (`rshmem`)
//! has no benchmark types; this crate uses its public API, plus the few hooks it documents
//! as existing for benchmarks only (MoE per-kernel marks, the host MoE all-to-all-v path).
//!
//! | module | what it measures | baseline |
//! | --- | --- | --- |
//! | [`coll`] | host collectives on the CPU backend (`rshmem::coll::Coll`) | – (nccl-tests' bus factors) |
//! | [`ep`] | host MoE dispatch/combine (`rshmem::ep::HostBuffer`) | the all-to-all-v path |
//! | [`p2p`] | CUDA device and stream put/get, put-with-signal latency, device barrier | `cuMemcpyPeerAsync`, a raw flag ping-pong kernel |
//! | [`coll_cuda`] | CUDA collectives (`rshmem::cuda::GpuColl`) | NCCL on the same buffers |
//! | [`ep_cuda`] | CUDA MoE dispatch/combine (`rshmem::cuda::ep::GpuBuffer`) | NCCL all-to-all-v with its own kernels ([`ep_baseline`]) |
//! | [`fabric`] | put/get bandwidth and 8 B latency between PEs on different nodes (libfabric) | `fi_pingpong` on the same provider |
//! | [`fabric_gpu`] | 8 B put latency to a GPU on another node, device-initiated (through the proxy) | the same put from the host |
//! | [`hier`] | host all_reduce and MoE dispatch/combine across nodes on the hierarchical paths | the flat paths, call by call in the same run |
//!
//! [`nccl`] binds NCCL at run time; [`timing`] times stream work with CUDA events;
//! [`Settings`] holds the `RSHMEM_BENCH_*` variables, read once by [`Settings::from_env`].
//! The CUDA kernels of the suites and baselines are this crate's own sources (`kernels/`),
//! compiled by NVRTC with the rshmem device header; [`precompile`] builds them into the
//! kernel cache (`rshmem compile`).

pub mod coll;
pub mod coll_cuda;
pub mod ep;
pub mod ep_baseline;
mod ep_check;
pub mod ep_cuda;
pub mod ep_ll;
pub mod fabric;
pub mod fabric_gpu;
pub mod hier;
pub mod nccl;
pub mod p2p;
mod settings;
pub mod timing;

pub use settings::Settings;

use rshmem::Result;

/// Compiles every module this crate loads (the point-to-point kernels with `settings`' NVRTC
/// options, the MoE baseline's kernels with the MoE tuning's options) for `arch` (e.g.
/// `sm_90`) into the kernel cache, as `rshmem::cuda::precompile` does for the library's own.
/// Needs NVRTC only, no GPU. Returns each module's name and cubin size.
pub fn precompile(arch: &str, settings: &Settings) -> Result<Vec<(String, usize)>> {
    use rshmem::cuda::nvrtc;
    let opts: Vec<&str> = settings.nvrtc_options.iter().map(|s| s.as_str()).collect();
    let p = nvrtc::compile(&nvrtc::with_header(p2p::P2P_KERNELS), arch, &opts)?;
    let mut out = vec![("bench p2p".to_string(), p.len())];
    let tuning = rshmem::cuda::ep::EpTuning::from_env()?;
    let o = ep_baseline::kernel_options(&tuning.nvrtc_options)?;
    let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
    let src = ep_baseline::kernel_source();
    let b = nvrtc::compile(&nvrtc::with_header(&src), arch, &o)?;
    out.push(("bench ep baseline (bf16, i32)".to_string(), b.len()));
    let f = nvrtc::compile(&nvrtc::with_header(fabric_gpu::PROXY_KERNELS), arch, &[])?;
    out.push(("bench fabric-gpu".to_string(), f.len()));
    Ok(out)
}
