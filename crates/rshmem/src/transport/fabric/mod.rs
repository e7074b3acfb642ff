//! The libfabric transport: one RDM endpoint per PE, its symmetric heap (and control block)
//! registered, addresses and keys exchanged through the bootstrap.
//!
//! * `ffi.rs`: the 1.17 structs and ops tables, by hand; `loader.rs`: the six exported
//!   functions, loaded at run time.
//! * `endpoint.rs`: fabric, domain, CQ, AV, endpoint; atomics, quiet.
//! * `xfer.rs`: puts and gets, pipelined in a window of staged chunks.
//! * `mr.rs`: registrations and the `Remote` record a peer needs.
//! * `net.rs`: a world's fabric (`Net`: control words of peers on other nodes) and the
//!   backend that sends heap operations for those peers over it (`FabricBackend`).

mod endpoint;
mod ffi;
mod loader;
mod mr;
mod net;
#[cfg(test)]
mod tests;
mod xfer;

pub(crate) use endpoint::{Endpoint, FabricConfig};
#[cfg(test)]
use loader::available;
pub use loader::{probe, LIBRARY};
pub(crate) use mr::{MemoryRegion, Remote};
pub(crate) use net::{FabricBackend, Net};

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
