//! rshmem's CUDA API in one place, gathered from the layers that implement it: the backend
//! (`backend/cuda`: driver calls, per-GPU contexts, heaps, stream-ordered operations, NVRTC
//! kernels with the device header), the GPU collectives and the GPU MoE buffers. Loaded at run
//! time: a machine without CUDA gets [`crate::Error::Backend`] from the first call, never a
//! panic.

use crate::error::Result;

// The backend: stream-ordered and device-initiated operations, kernels, events, facts.
pub use crate::backend::cuda::nvrtc;
pub use crate::backend::cuda::{info, GpuInfo, Info};
pub use crate::device::{
    ContextGuard, CudaPe, DeviceTeam, Event, Graph, Kernel, KernelArg, Stream,
};
// The collectives on GPUs.
pub use crate::coll::cuda::traffic;
pub use crate::coll::cuda::{
    coll_kernel_names, compile_coll_modules, default_ll_sizes, CallFacts, CollModule, CollPath,
    CollTuning, DeviceCounts, GpuColl, LlGrid, LlSizes, PathRules, PerTeam, COLL_CHAIN_BCAST_BYTES,
    COLL_FUSED_BYTES, COLL_LL_A2A_BYTES, COLL_LL_BYTES, COLL_MODULES, COLL_NET_CHUNK_BYTES,
    COLL_PULL_A2A_BYTES, COLL_PULL_ALL_REDUCE_BYTES, COLL_PULL_ALL_REDUCE_PAIR_BYTES,
    COLL_PULL_BCAST_BYTES, COLL_PULL_RS_BYTES, COLL_PUSH_A2A_BYTES, COLL_PUSH_ALL_REDUCE_BYTES,
    COLL_TWO_SHOT_PULL_BYTES, COLL_TWO_SHOT_PULL_PAIR_BYTES, LL_MAX_MEMBERS, WRONG_RESULT_SWITCHES,
};
pub use crate::coll::cuda::{copy_grid, plan_fused, reduce_grid, PLAN_COPIES_PER_KERNEL};
// MoE dispatch/combine on GPUs.
#[doc(inline)]
pub use crate::ep::cuda as ep;

/// Compiles every module rshmem itself loads (its internal kernels, the collectives' modules
/// with `RSHMEM_CUDA_COLL_NVRTC_OPTS`, the MoE kernels for each hidden-state and id type) for
/// `arch` (e.g. `sm_90`) into the kernel cache (`RSHMEM_CACHE_DIR`), so that a first run on
/// a GPU machine skips NVRTC (`rshmem compile`); the modules on parallel threads
/// ([`nvrtc::compile_all`]). Needs NVRTC only, no GPU. Returns each module's name and cubin
/// size.
///
/// ```no_run
/// for (name, bytes) in rshmem::cuda::precompile("sm_90")? {
///     println!("{name}: {bytes} bytes");
/// }
/// # Ok::<(), rshmem::Error>(())
/// ```
pub fn precompile(arch: &str) -> Result<Vec<(String, usize)>> {
    use crate::elem::ElemKind;
    // (name, full source, options), the collectives' first: they take longest.
    let mut mods: Vec<(String, String, Vec<String>)> = Vec::new();
    let co = CollTuning::from_env()?.nvrtc_options;
    for m in COLL_MODULES {
        let src = nvrtc::with_header(&m.source());
        mods.push((format!("coll ({})", m.name()), src, co.clone()));
    }
    let et = ep::EpTuning::from_env()?;
    for t in [ElemKind::Bf16, ElemKind::F32, ElemKind::F16] {
        for id in [ElemKind::I32, ElemKind::I64] {
            let o = ep::kernel_options(t, id, &et.nvrtc_options)?;
            let src = nvrtc::with_header(ep::EP_KERNELS);
            mods.push((format!("ep ({}, {})", t.name(), id.name()), src, o));
        }
    }
    // The low-latency buffer's, with the options LowLatencyBuffer::new is given by programs
    // that pass EpTuning's.
    let src = nvrtc::with_header(ep::LL_KERNELS);
    mods.push(("ep low latency".to_string(), src, et.nvrtc_options.clone()));
    let src = nvrtc::with_header(nvrtc::INTERNAL_KERNELS);
    mods.push(("internal".to_string(), src, Vec::new()));
    let opts: Vec<Vec<&str>> = mods
        .iter()
        .map(|(_, _, o)| o.iter().map(|s| s.as_str()).collect())
        .collect();
    let programs: Vec<(&str, &[&str])> = mods
        .iter()
        .zip(&opts)
        .map(|((_, src, _), o)| (src.as_str(), o.as_slice()))
        .collect();
    let cubins = nvrtc::compile_all(&programs, arch)?;
    Ok(mods
        .into_iter()
        .zip(cubins)
        .map(|((name, _, _), c)| (name, c.len()))
        .collect())
}
