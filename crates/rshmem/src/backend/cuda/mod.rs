//! CUDA backend: the symmetric heap in GPU memory, one GPU per PE.
//!
//! Layered as cudarc is: [`ffi`] makes every raw driver/NVRTC call (and probes the libraries
//! first, so a machine without CUDA gets [`Error::Backend`], never a panic); `gpu` holds the
//! safe per-device types (contexts made current per call, streams, modules); `heap` the static
//! and VMM heaps; this file the [`Backend`] implementation for the host API; the public modules
//! the stream-ordered API, the device API (kernels compiled by NVRTC), `info` and benchmarks.
//!
//! Device choice: `Config::devices` / `RSHMEM_DEVICES` (world rank → GPU ordinal), else the
//! world rank modulo the number of visible GPUs (one node: the PE's index among its process's
//! PEs in thread mode, the local rank in process mode).
//!
//! # PEs sharing a GPU
//! Several PEs of one world may share a GPU (threads of one process share its CUDA context).
//! Kernels that wait for peers are one block each and data kernels never wait, so waiting
//! kernels cannot starve the peers' kernels of SMs, and every module a world needs is loaded
//! (all kernels at once, not lazily) before any of its PEs can launch a waiting kernel
//! ([`CudaPe::kernel`], [`GpuColl::new`] and [`ep::Buffer::new`] meet the other PEs after
//! loading). What a shared context adds: its streams are spread over a fixed number of
//! hardware work queues (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default), a queue runs its work in
//! order, and streams beyond that number share queues. A kernel that waits for a peer then
//! holds back the later work (kernels and copies) of every other stream on its queue, which
//! may be exactly the peer work it waits for: it spins until the device timeout, after which
//! everything proceeds and the wait is reported ([`Error::Timeout`]). Each PE uses a stream for
//! host operations plus its users' streams ([`GpuColl`] one more), so 4 PEs with a
//! collectives context and a stream each already use 12. rshmem therefore sets `CUDA_DEVICE_MAX_CONNECTIONS=32` (the maximum)
//! before initialising the driver unless it is set already; with more live streams than that
//! in the process (many PEs or streams per GPU, several worlds at once), or a smaller value
//! chosen by the user, waits can still stall until the timeout. Run one GPU world at a time per
//! process (the GPU tests serialise theirs).

mod api;
pub mod bench;
mod coll;
mod coll_bench;
pub mod ep;
mod ep_base;
pub(crate) mod ffi;
pub(crate) mod gpu;
mod heap;
mod info;
pub mod nccl;
pub mod nvrtc;

pub use api::{CudaPe, DeviceTeam, Graph, Kernel, KernelArg, Stream};
pub use bench::{bench, BenchRecord};
pub use coll::{coll_kernel_names, GpuColl, COLL_FUSED_BYTES};
pub use coll_bench::{coll_bench, CollBenchRecord};
pub use info::{info, GpuInfo, Info};

use super::{AtomicOp, Backend};
use crate::bootstrap::Bootstrap;
use crate::config::{BackendKind, Config, HeapKind};
use crate::error::{Error, Result};
use crate::world::agree;
use gpu::{DevBuf, Func, Gpu, Module, RawStream};
use heap::{OwnHeap, PeerMap, HANDLE_BYTES};
use std::sync::{Arc, Mutex};

/// Must match RSHMEM_MAX_PES / RSHMEM_SYNC_WORDS of the device header.
pub(crate) const MAX_PES: usize = 64;
pub(crate) const MAX_TEAMS: usize = 64;
pub(crate) const SYNC_ERR: usize = 2 * MAX_TEAMS * MAX_PES;
pub(crate) const SYNC_BYTES: usize = (SYNC_ERR + 16) * 8;

/// The device state layout of the header's `rshmem_state`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DeviceState {
    pub base: [u64; MAX_PES],
    pub heap_size: u64,
    pub timeout_ns: u64,
    pub my_pe: i32,
    pub n_pes: i32,
}

/// The CUDA backend of one PE.
pub(crate) struct CudaBackend {
    pub me: usize,
    pub n: usize,
    pub gpu: Arc<Gpu>,
    /// GPU ordinal of each PE (as seen by its own process).
    pub ordinals: Vec<usize>,
    /// Each PE's heap base as mapped in this process / on this GPU.
    pub bases: Vec<u64>,
    /// User heap bytes (the sync area follows at this offset).
    pub heap_size: usize,
    pub timeout: std::time::Duration,
    pub heap_kind: HeapKind,
    /// Host-API operations run on this stream under `lock`.
    pub stream: RawStream,
    scratch: DevBuf,
    _internal: Arc<Module>,
    pub f_amo: Func,
    pub f_signal_add: Func,
    pub f_wait: Func,
    pub f_team_sync: Func,
    lock: Mutex<()>,
    pub modules: Mutex<std::collections::HashMap<u64, Arc<Module>>>,
    _peers: Vec<PeerMap>,
    _own: OwnHeap,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("me", &self.me)
            .field("gpu", &self.gpu.ordinal)
            .field("heap_kind", &self.heap_kind)
            .finish()
    }
}

/// Parses `RSHMEM_DEVICES` style maps: `0,1,2,3` (rank i → ordinal).
pub(crate) fn parse_devices(s: &str) -> Option<Vec<usize>> {
    s.split(',').map(|x| x.trim().parse().ok()).collect()
}

fn pick_device(config: &Config, me: usize, pids: &[u32]) -> Result<usize> {
    let from_env = std::env::var("RSHMEM_DEVICES")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let map = match (&config.devices, from_env) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(v)) => Some(parse_devices(&v).ok_or_else(|| {
            Error::invalid(format!(
                "RSHMEM_DEVICES={v:?}: expected GPU ordinals like 0,1,2,3"
            ))
        })?),
        _ => None,
    };
    if let Some(m) = map {
        return m.get(me).copied().ok_or_else(|| {
            Error::invalid(format!(
                "the device map has {} entries, PE {me} has none",
                m.len()
            ))
        });
    }
    // One node: world rank modulo the visible GPUs. In thread mode that is the PE's index among
    // its process's PEs; in process mode the local rank (also right when each process sees
    // only its own GPU through CUDA_VISIBLE_DEVICES).
    let _ = pids;
    let count = gpu::device_count()?;
    if count == 0 {
        return Err(ffi::err("no CUDA GPU is visible"));
    }
    Ok(me % count)
}

fn enc(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
fn word(b: &[u8], i: usize) -> u64 {
    b.get(i * 8..i * 8 + 8)
        .and_then(|c| c.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// Loads rshmem's internal kernels on `gpu` and fills their device state.
fn load_internal(gpu: &Arc<Gpu>, state: &DeviceState) -> Result<Module> {
    let src = nvrtc::with_header(nvrtc::INTERNAL_KERNELS);
    let cubin = nvrtc::compile(&src, &gpu.arch(), &[])?;
    let m = Module::load(gpu, &cubin)?;
    set_state(&m, state)?;
    Ok(m)
}

/// Writes `state` into a module's `rshmem_dstate` (a module without it is left alone).
pub(crate) fn set_state(m: &Module, state: &DeviceState) -> Result<()> {
    let Ok((p, n)) = m.global("rshmem_dstate") else {
        return Ok(());
    };
    if n != std::mem::size_of::<DeviceState>() {
        return Err(ffi::err(format!(
            "rshmem_dstate is {n} bytes, expected {} (header and library disagree)",
            std::mem::size_of::<DeviceState>()
        )));
    }
    let _g = m.gpu.bind()?;
    // SAFETY: copies the plain struct into a device global of the same size.
    ffi::check(
        unsafe { ffi::cu::cuMemcpyHtoD_v2(p, state as *const DeviceState as *const _, n) },
        "cuMemcpyHtoD (device state)",
    )
}

impl CudaBackend {
    /// Collective: creates this PE's GPU heap, maps every peer's, loads the internal kernels.
    pub fn create(
        config: &Config,
        me: usize,
        n: usize,
        pids: &[u32],
        boot: &dyn Bootstrap,
    ) -> Result<CudaBackend> {
        // Step 1: device choice, exchanged so VMM heaps can grant same-process peers access.
        let first = (|| -> Result<Arc<Gpu>> {
            ffi::driver()?;
            if n > MAX_PES {
                return Err(ffi::err(format!(
                    "{n} PEs: the CUDA backend supports at most {MAX_PES}"
                )));
            }
            gpu::gpu(pick_device(config, me, pids)?)
        })();
        let ord = first.as_ref().map(|g| g.ordinal as u64).unwrap_or(u64::MAX);
        agree(
            boot,
            first.as_ref().map(|_| ()).map_err(Clone::clone),
            "CUDA device",
        )?;
        let gpu = first?;
        let ords: Vec<usize> = boot
            .allgather(&enc(&[ord]))?
            .iter()
            .map(|b| word(b, 0) as usize)
            .collect();
        let my_pid = pids[me];
        let local_ords: Vec<usize> = (0..n)
            .filter(|&p| pids[p] == my_pid)
            .map(|p| ords[p])
            .collect();

        // Step 2: my heap.
        let kind = config.heap_kind;
        let bytes = (|| -> Result<usize> {
            let raw = config.heap_size.div_ceil(4096) * 4096 + SYNC_BYTES;
            Ok(match kind {
                HeapKind::Static => raw,
                HeapKind::Vmm => {
                    let g = heap::vmm_granularity(gpu.ordinal)?;
                    raw.div_ceil(g) * g
                }
            })
        })();
        let heap_size = config.heap_size.div_ceil(4096) * 4096;
        let own = bytes.and_then(|b| OwnHeap::create(&gpu, kind, b, &local_ords));
        let exported = own.as_ref().map_err(Clone::clone).and_then(|o| {
            let other_procs = pids.iter().any(|&p| p != my_pid);
            if other_procs {
                o.export()
            } else {
                Ok([0u8; HANDLE_BYTES])
            }
        });
        agree(
            boot,
            exported.as_ref().map(|_| ()).map_err(Clone::clone),
            "allocating the GPU heap",
        )?;
        let mut own = own?;
        let exported = exported?;
        let mut rec = enc(&[own.ptr, own.bytes as u64]);
        rec.extend_from_slice(&exported);
        let all = boot.allgather(&rec)?;

        // Step 3: map peers.
        let mut peers = Vec::new();
        let mut bases = vec![0u64; n];
        let mapped = (|| -> Result<()> {
            for p in 0..n {
                let r = &all[p];
                if r.len() != 16 + HANDLE_BYTES {
                    return Err(ffi::err(format!("malformed heap record from PE {p}")));
                }
                if word(r, 1) as usize != own.bytes {
                    return Err(ffi::err(format!(
                        "PE {p} has a GPU heap of {} bytes, this PE {}",
                        word(r, 1),
                        own.bytes
                    )));
                }
                if p == me {
                    bases[p] = own.ptr;
                } else if pids[p] == my_pid {
                    bases[p] = word(r, 0);
                    if kind == HeapKind::Static {
                        gpu.enable_peer(&*gpu::gpu(ords[p])?)?;
                    }
                } else {
                    let m = PeerMap::open(&gpu, kind, &r[16..], own.bytes, pids[p])?;
                    bases[p] = m.ptr;
                    peers.push(m);
                }
            }
            Ok(())
        })();
        agree(boot, mapped.clone(), "mapping peer GPU heaps")?;
        own.close_export();

        // Step 4: internal kernels and host-op resources.
        let state = DeviceState {
            base: {
                let mut b = [0u64; MAX_PES];
                b[..n].copy_from_slice(&bases);
                b
            },
            heap_size: heap_size as u64,
            timeout_ns: config.timeout.as_nanos().min(u64::MAX as u128) as u64,
            my_pe: me as i32,
            n_pes: n as i32,
        };
        let rest = (|| -> Result<_> {
            let internal = Arc::new(load_internal(&gpu, &state)?);
            let stream = RawStream::new(&gpu)?;
            let scratch = DevBuf::zeroed(&gpu, 64)?;
            Ok((
                internal.func("rshmemi_host_amo")?,
                internal.func("rshmemi_signal_add")?,
                internal.func("rshmemi_wait")?,
                internal.func("rshmemi_team_sync")?,
                internal,
                stream,
                scratch,
            ))
        })();
        agree(
            boot,
            rest.as_ref().map(|_| ()).map_err(Clone::clone),
            "loading rshmem's kernels",
        )?;
        let (f_amo, f_signal_add, f_wait, f_team_sync, internal, stream, scratch) = rest?;
        tracing::debug!(
            pe = me,
            gpu = gpu.ordinal,
            ?kind,
            bytes = own.bytes,
            "CUDA heap up"
        );
        Ok(CudaBackend {
            me,
            n,
            gpu,
            ordinals: ords,
            bases,
            heap_size,
            timeout: config.timeout,
            heap_kind: kind,
            stream,
            scratch,
            _internal: internal,
            f_amo,
            f_signal_add,
            f_wait,
            f_team_sync,
            lock: Mutex::new(()),
            modules: Mutex::new(Default::default()),
            _peers: peers,
            _own: own,
        })
    }

    /// The device state every module loaded for this PE gets.
    pub(crate) fn state(&self) -> DeviceState {
        let mut b = [0u64; MAX_PES];
        b[..self.n].copy_from_slice(&self.bases);
        DeviceState {
            base: b,
            heap_size: self.heap_size as u64,
            timeout_ns: self.timeout.as_nanos().min(u64::MAX as u128) as u64,
            my_pe: self.me as i32,
            n_pes: self.n as i32,
        }
    }

    /// Address of `offset` in PE `pe`'s heap, as mapped here.
    #[inline]
    pub(crate) fn addr(&self, pe: usize, offset: usize) -> u64 {
        self.bases[pe] + offset as u64
    }

    /// Address of this PE's sync word `w`.
    pub(crate) fn sync_addr(&self, pe: usize, w: usize) -> u64 {
        self.bases[pe] + (self.heap_size + w * 8) as u64
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads and clears the device error word (set by device waits that timed out).
    pub(crate) fn take_device_error(&self) -> Result<()> {
        let mut v = 0u64;
        let a = self.sync_addr(self.me, SYNC_ERR);
        {
            let _l = self.guard();
            let _g = self.gpu.bind()?;
            // SAFETY: 8 bytes from this PE's sync area into a local.
            ffi::check(
                unsafe {
                    ffi::cu::cuMemcpyDtoHAsync_v2(
                        &mut v as *mut u64 as *mut _,
                        a,
                        8,
                        self.stream.raw,
                    )
                },
                "cuMemcpyDtoHAsync",
            )?;
            self.stream.sync()?;
        }
        if v != 0 {
            let z = 0u64;
            let _l = self.guard();
            let _g = self.gpu.bind()?;
            // SAFETY: 8 bytes from a local into this PE's sync area.
            ffi::check(
                unsafe {
                    ffi::cu::cuMemcpyHtoDAsync_v2(
                        a,
                        &z as *const u64 as *const _,
                        8,
                        self.stream.raw,
                    )
                },
                "cuMemcpyHtoDAsync",
            )?;
            self.stream.sync()?;
            return Err(Error::Timeout {
                op: "device-side wait (kernel or stream)",
                pe: None,
                after: self.timeout,
            });
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn put(&self, pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _l = self.guard();
        let _g = self.gpu.bind()?;
        // SAFETY: the destination range was checked against the heap by the caller; the source
        // is a live slice; the copy completes before return (stream synchronised).
        ffi::check(
            unsafe {
                ffi::cu::cuMemcpyHtoDAsync_v2(
                    self.addr(pe, offset),
                    src.as_ptr() as *const _,
                    src.len(),
                    self.stream.raw,
                )
            },
            "cuMemcpyHtoDAsync (put)",
        )?;
        self.stream.sync()
    }
    fn get(&self, pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _l = self.guard();
        let _g = self.gpu.bind()?;
        // SAFETY: as in put, reversed; the destination slice outlives the synchronised copy.
        ffi::check(
            unsafe {
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    dst.as_mut_ptr() as *mut _,
                    self.addr(pe, offset),
                    dst.len(),
                    self.stream.raw,
                )
            },
            "cuMemcpyDtoHAsync (get)",
        )?;
        self.stream.sync()
    }
    fn atomic(&self, pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        let (code, a, b): (i32, u64, u64) = match op {
            AtomicOp::Fetch => (0, 0, 0),
            AtomicOp::Set(v) => (1, v, 0),
            AtomicOp::Swap(v) => (2, v, 0),
            AtomicOp::CompareSwap { cond, value } => (3, cond, value),
            AtomicOp::FetchAdd(v) => (4, v, 0),
            AtomicOp::FetchAnd(v) => (5, v, 0),
            AtomicOp::FetchOr(v) => (6, v, 0),
            AtomicOp::FetchXor(v) => (7, v, 0),
        };
        let mut addr = self.addr(pe, offset);
        let mut wide_i = wide as i32;
        let (mut code, mut a, mut b) = (code, a, b);
        let mut out = self.scratch.ptr;
        let _l = self.guard();
        let mut params = [
            &mut addr as *mut u64 as *mut std::ffi::c_void,
            &mut wide_i as *mut i32 as *mut _,
            &mut code as *mut i32 as *mut _,
            &mut a as *mut u64 as *mut _,
            &mut b as *mut u64 as *mut _,
            &mut out as *mut u64 as *mut _,
        ];
        // SAFETY: the parameters match rshmemi_host_amo(u64, int, int, u64, u64, u64*); addr is
        // an in-heap, aligned word (checked by the caller); out is our 64-byte scratch buffer.
        unsafe { gpu::launch(&self.stream, self.f_amo, 1, 32, 0, &mut params)? };
        let mut v = 0u64;
        let _g = self.gpu.bind()?;
        // SAFETY: 8 bytes of scratch into a local, synchronised below.
        ffi::check(
            unsafe {
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    &mut v as *mut u64 as *mut _,
                    self.scratch.ptr,
                    8,
                    self.stream.raw,
                )
            },
            "cuMemcpyDtoHAsync (atomic result)",
        )?;
        self.stream.sync()?;
        Ok(if wide { v } else { v & 0xffff_ffff })
    }
    fn fence(&self) {
        // Host operations complete before they return; nothing is outstanding to order.
    }
    fn quiet(&self) -> Result<()> {
        self.stream.sync()?;
        self.take_device_error()
    }
    fn as_cuda(&self) -> Option<&CudaBackend> {
        Some(self)
    }
}
