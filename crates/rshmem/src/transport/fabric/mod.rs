//! The libfabric transport: one RDM endpoint per PE, its symmetric heap (and control block)
//! registered, addresses and keys exchanged through the bootstrap.
//!
//! * `ffi.rs`: the 1.17 structs and ops tables, by hand; `loader.rs`: the six exported
//!   functions, loaded at run time; `info.rs`: the providers offered (`rshmem info`).
//! * `endpoint.rs`: fabric, domain, CQ, AV, endpoint; atomics.
//! * `xfer.rs`: puts and gets, pipelined in a window of staged chunks.
//! * `nbi.rs`: non-blocking puts and gets, posted and completed later; fence and quiet.
//! * `mr.rs`: registrations and the `Remote` record a peer needs.
//! * `net.rs`: a world's fabric (`Net`: control words of peers on other nodes) and the
//!   backend that sends heap operations for those peers over it (`FabricBackend`).
//! * `hmem.rs`: GPU heaps registered with the fabric (`FI_HMEM_CUDA`) where the provider
//!   takes device memory; `staging.rs`: GPU heaps of peers on other nodes, reached by requests
//!   staged through registered host memory otherwise (and for atomics); `proxy.rs`: the CUDA
//!   backend of such a world and its proxy threads (serving other nodes' requests, draining
//!   the device's request ring).

mod endpoint;
mod ffi;
mod hmem;
mod info;
mod loader;
mod mr;
mod nbi;
#[cfg(test)]
mod nbi_tests;
mod net;
mod proxy;
mod staging;
#[cfg(test)]
mod tests;
mod xfer;

pub(crate) use endpoint::{Endpoint, FabricConfig};
pub use info::{providers, Provider};
#[cfg(test)]
use loader::available;
pub use loader::{probe, LIBRARY};
pub(crate) use mr::{MemoryRegion, Remote};
pub(crate) use net::{FabricBackend, Net};

/// Bytes of the staging area a PE of a CUDA world spanning nodes adds to its registered
/// segment (after the control block), for `n` PEs.
pub(crate) fn staging_bytes(n: usize) -> usize {
    staging::StageLayout::new(n).bytes()
}

/// The CUDA backend of PE `cuda.me` in a world spanning nodes: `cuda` for PEs of this node,
/// staged requests over `net` for the others, and the proxy threads.
///
/// Collective over `boot` (the GPU heaps' registration with the fabric, [`hmem`]).
///
/// # Safety
/// `area` must be this PE's staging area (`staging_bytes(n)` bytes at `base` in its segment
/// registered with `net`), mapped for the life of the returned backend.
pub(crate) unsafe fn gpu_backend(
    cuda: crate::backend::cuda::CudaBackend,
    net: std::sync::Arc<Net>,
    boot: &dyn Bootstrap,
    area: *mut u8,
    base: usize,
    timeout: std::time::Duration,
) -> Result<proxy::GpuFabricBackend> {
    let (me, n) = (cuda.me, cuda.n);
    // SAFETY: this PE's heap and sync area, allocated and mapped for the life of `cuda`, which
    // the backend returned owns (it drops the registration first: its fields drop in order).
    let hmem = unsafe {
        hmem::Hmem::open_cuda(
            net.clone(),
            boot,
            me,
            cuda.bases[me],
            cuda.heap_size + cuda.layout.bytes(),
            cuda.ordinals[me],
        )
    }?;
    // The proxy copies requests' data between the staging area and the GPU heap: page-locked,
    // those copies are DMA rather than the driver's pageable path. Where the driver refuses
    // (memory it cannot lock), they stay correct on the pageable path.
    // SAFETY: the caller's contract: the area stays mapped for the life of the backend, which
    // owns the registration (dropped after its proxy threads stopped).
    let pin = match unsafe {
        crate::backend::cuda::gpu::HostPin::register(&cuda.gpu, area, staging_bytes(n))
    } {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(pe = me, %e, "the staging area stays pageable");
            None
        }
    };
    // SAFETY: the caller's contract (the segment is page-aligned, `base` a multiple of pages).
    let area = unsafe { staging::Area::new(area, staging_bytes(n)) };
    let staged = staging::Staged::new(net, me, n, area, base, timeout);
    proxy::GpuFabricBackend::start(cuda, staged, hmem, pin)
}

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// Every PE's endpoint address and the `Remote` of each of its registered ranges, exchanged in
/// one allgather; inserts the addresses into `ep`. `regions` are this PE's registrations, in
/// the same order on every PE.
pub(crate) fn exchange(
    boot: &dyn Bootstrap,
    ep: &Endpoint,
    regions: &[&MemoryRegion],
) -> Result<Vec<Vec<Remote>>> {
    let name = ep.name()?;
    let mut rec = Vec::with_capacity(8 + name.len() + 24 * regions.len());
    rec.extend_from_slice(&(name.len() as u32).to_le_bytes());
    rec.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    rec.extend_from_slice(&name);
    for r in regions {
        rec.extend_from_slice(&r.remote().to_bytes());
    }
    let all = boot.allgather(&rec)?;
    let bad = |pe: usize| Error::Bootstrap {
        pe: Some(pe),
        msg: "malformed fabric address record".into(),
    };
    let mut names = Vec::with_capacity(all.len());
    let mut remotes = Vec::with_capacity(all.len());
    for (pe, r) in all.iter().enumerate() {
        if r.len() < 8 {
            return Err(bad(pe));
        }
        let nl = u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as usize;
        let nr = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as usize;
        if nr != regions.len() || r.len() != 8 + nl + 24 * nr {
            return Err(bad(pe));
        }
        names.push(r[8..8 + nl].to_vec());
        let rs = r[8 + nl..]
            .chunks(24)
            .map(|c| Remote::from_bytes(c).ok_or_else(|| bad(pe)))
            .collect::<Result<Vec<_>>>()?;
        remotes.push(rs);
    }
    ep.insert_peers(&names)?;
    Ok(remotes)
}
