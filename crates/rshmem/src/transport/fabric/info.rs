//! What the installed libfabric offers this transport, for `rshmem info`: every provider and
//! domain with an RDM endpoint with RMA and atomics, and whether it offers device memory.

use super::endpoint::getinfo;
use super::loader::lib;
use crate::error::Result;
use std::ffi::CStr;

/// A provider and domain the transport can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// As `RSHMEM_FABRIC_PROVIDER` names it (`tcp`, `verbs`, `efa`, `shm`, ...; layered ones
    /// as `tcp;ofi_rxm`).
    pub name: String,
    /// As `RSHMEM_FABRIC_DOMAIN` names it.
    pub domain: String,
    /// It offers device memory (`FI_HMEM`). GPU heaps are registered with it only where it
    /// also agrees to make no CUDA calls of its own, which a world learns when it opens the
    /// endpoint ([`Pe::gpu_heaps_on_fabric`](crate::Pe::gpu_heaps_on_fabric)).
    pub hmem: bool,
}

/// Every provider and domain with an RDM endpoint with RMA and atomics, in `fi_getinfo`'s
/// order of preference (the first is the default); an error where libfabric is not installed.
pub fn providers() -> Result<Vec<Provider>> {
    let lib = lib()?;
    let mut out: Vec<Provider> = Vec::new();
    for hmem in [false, true] {
        let Ok(list) = getinfo(lib, None, None, hmem) else {
            continue;
        };
        let mut i = list;
        while !i.is_null() {
            // SAFETY: a node of the list fi_getinfo returned (freed below); its names are
            // NUL-terminated strings or null.
            let (name, domain) = unsafe {
                let s = |p: *mut std::ffi::c_char| match p.is_null() {
                    true => String::new(),
                    false => CStr::from_ptr(p).to_string_lossy().into_owned(),
                };
                (
                    (s((*(*i).fabric_attr).prov_name)),
                    s((*(*i).domain_attr).name),
                )
            };
            match out
                .iter_mut()
                .find(|p| p.name == name && p.domain == domain)
            {
                Some(p) => p.hmem |= hmem,
                None => out.push(Provider { name, domain, hmem }),
            }
            // SAFETY: as above.
            i = unsafe { (*i).next };
        }
        // SAFETY: returned by fi_getinfo, freed once.
        unsafe { (lib.freeinfo)(list) };
    }
    Ok(out)
}
