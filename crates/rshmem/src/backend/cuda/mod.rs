//! CUDA backend: the symmetric heap in GPU memory, one GPU per PE.
//!
//! Layered as cudarc is: `ffi` makes every raw driver/NVRTC call (and probes the libraries
//! first, so a machine without CUDA gets [`Error::Backend`], never a panic); `gpu` holds the
//! safe per-device types (contexts made current per call, streams, modules); `heap` the static
//! and VMM heaps; this file the `Backend` implementation for the host API; the public modules
//! the stream-ordered API, the device API (kernels compiled by NVRTC), `info` and benchmarks.
//!
//! Device choice: `Config::devices` (`RSHMEM_DEVICES` through `Config::from_env`; world rank →
//! GPU ordinal), else the world rank modulo the number of visible GPUs (one node: the PE's
//! index among its process's PEs in thread mode, the local rank in process mode), so PEs
//! beyond the GPU count share GPUs.
//!
//! # Sizes
//! Nothing is compiled in: each PE's GPU heap is the user heap followed by a sync area sized
//! from the job (`SyncLayout`: barrier counters for every team slot and the stream barrier,
//! the device error word, the table of heap bases that device code translates addresses
//! with), `n_pes × (max_teams + 1) × 16 + 64 + 8 × n_pes` bytes; the device state
//! (`rshmem_state`, in each module's constant memory) points at the table and carries the
//! layout. [`CudaPe::sync_area_bytes`] reports it, the `CUDA heap up` debug event logs it, and
//! a warning says when it outgrows the heap (`RSHMEM_MAX_TEAMS` sizes it).
//!
//! # PEs sharing a GPU
//! Several PEs of one world may share a GPU (threads of one process share its CUDA context).
//! Kernels that wait for peers stay well within what the GPU holds at once (one block each, or
//! at most 128 blocks of 256 threads for the collectives' LL and pull kernels), and where PEs
//! share a GPU they let the next kernel become resident only after their waits, so waiting
//! kernels cannot starve the peers' kernels of SMs; every module a world needs is loaded (all
//! kernels at once, not lazily) before any of its PEs can launch a waiting kernel
//! ([`CudaPe::kernel`](crate::cuda::CudaPe::kernel), [`GpuColl::new`](crate::cuda::GpuColl::new)
//! and [`crate::cuda::ep::GpuBuffer::new`] meet the other PEs after loading).
//!
//! What a shared context adds: its streams are spread over a fixed number of hardware work
//! queues (`CUDA_DEVICE_MAX_CONNECTIONS`), a queue runs its work in order, and streams beyond
//! that number share queues. A kernel that waits for a peer then holds back the later work of
//! every other stream on its queue, which may be exactly the peer work it waits for: it spins
//! until the device timeout, after which everything proceeds and the wait is reported
//! ([`Error::Timeout`]). rshmem therefore sets `CUDA_DEVICE_MAX_CONNECTIONS=32` (the maximum)
//! and `CUDA_MODULE_LOADING=EAGER` (a lazy load waits for the GPU's work to drain, which a
//! spinning kernel never does) before initialising the driver, unless they are set. Even so,
//! thread-PEs sharing a GPU have been seen to stall now and then: the GPU's front end held a
//! launched kernel back with SMs idle (BENCHMARKS.md, Known gaps, and git history have the
//! measurements). Treat several thread-PEs on one GPU as a development setup (a stall ends in
//! [`Error::Timeout`], never a hang); one PE per GPU, or one process per PE sharing a GPU (each
//! process has its own context and queues), has not shown it. Heaps of a world's thread-PEs are
//! freed together, after every one of them has ended and each GPU has been synchronised
//! (`grave.rs`), so a PE that runs on after such a timeout never reaches a freed peer heap.

pub(crate) mod ffi;
pub(crate) mod gpu;
mod grave;
mod heap;
mod info;
pub(crate) mod knobs;
mod lock;
pub mod nvrtc;
pub(crate) mod remote;
#[cfg(test)]
pub(crate) mod srcparse;

pub use info::{info, GpuInfo, Info};

use super::{AtomicOp, Backend};
use crate::bootstrap::agree;
use crate::bootstrap::Bootstrap;
use crate::config::{BackendKind, Config, HeapKind};
use crate::error::{Error, Result};
use gpu::{DevBuf, Func, Gpu, Module, RawStream};
use heap::{OwnHeap, PeerMap, HANDLE_BYTES};
use std::sync::{Arc, Mutex};

/// Layout of the sync area that follows each PE's heap, in 64-bit words, sized from the job
/// (the device header reads it from `rshmem_state`; no limit is compiled in):
///
/// | words | what |
/// | --- | --- |
/// | `slots × n_pes` from [`bar`](Self::bar) | barrier counters: slot `s`, member `p` at `s × n_pes + p` |
/// | `slots × n_pes` from [`exp`](Self::exp) | barrier expectations, same indexing |
/// | 8 from [`err`](Self::err) | the device error word (`RSHMEM_ERR_*` bits), the PE a timed-out wait named, the proxy ring's address and head (`remote.rs`), 4 reserved |
/// | `n_pes` from [`bases`](Self::bases) | this PE's table of heap bases as mapped on its GPU |
///
/// `slots` is `max_teams + 1`: a slot per host team slot (slot 0 the world's) plus the last,
/// [`stream_slot`](Self::stream_slot), for [`CudaPe::barrier_on_stream`]. That is
/// `n_pes × (max_teams + 1) × 16 + 64 + 8 × n_pes` bytes per PE (72 PEs, 64 teams: 75 KB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyncLayout {
    /// PEs of the world.
    pub n_pes: usize,
    /// Barrier slots (`max_teams + 1`).
    pub slots: usize,
}

impl SyncLayout {
    /// Words of the error line.
    const ERR_WORDS: usize = 8;

    /// The layout for `n_pes` PEs and `max_teams` team slots; an error when it overflows or
    /// the device's `int` PE and slot numbers cannot hold it.
    pub fn new(n_pes: usize, max_teams: usize) -> Result<SyncLayout> {
        let l = SyncLayout {
            n_pes,
            slots: max_teams.saturating_add(1),
        };
        let fits = n_pes >= 1
            && max_teams >= 1
            && i32::try_from(n_pes).is_ok()
            && i32::try_from(l.slots).is_ok()
            && l.checked_bytes().is_some();
        if !fits {
            return Err(Error::invalid(format!(
                "cannot lay out the CUDA sync area for {n_pes} PEs and {max_teams} teams (none, or too many)"
            )));
        }
        Ok(l)
    }

    fn checked_bytes(&self) -> Option<usize> {
        self.slots
            .checked_mul(self.n_pes)?
            .checked_mul(2)?
            .checked_add(Self::ERR_WORDS)?
            .checked_add(self.n_pes)?
            .checked_mul(8)
    }

    /// First word of the barrier counters.
    pub fn bar(&self) -> usize {
        0
    }
    /// First word of the barrier expectations.
    pub fn exp(&self) -> usize {
        self.slots * self.n_pes
    }
    /// The error word.
    pub fn err(&self) -> usize {
        2 * self.slots * self.n_pes
    }
    /// First word of the base table.
    pub fn bases(&self) -> usize {
        self.err() + Self::ERR_WORDS
    }
    /// Words of the whole area.
    pub fn words(&self) -> usize {
        self.bases() + self.n_pes
    }
    /// Bytes of the whole area (what each PE's heap allocation adds to the user heap).
    pub fn bytes(&self) -> usize {
        self.words() * 8
    }
    /// The slot of the stream barrier (the last).
    pub fn stream_slot(&self) -> usize {
        self.slots - 1
    }
    /// Word of the counter member `pe` bumps in slot `slot` of whoever owns the area.
    #[cfg(test)]
    pub fn bar_word(&self, slot: usize, pe: usize) -> usize {
        self.bar() + slot * self.n_pes + pe
    }
    /// Word of the owner's expectation for member `pe` in slot `slot`.
    #[cfg(test)]
    pub fn exp_word(&self, slot: usize, pe: usize) -> usize {
        self.exp() + slot * self.n_pes + pe
    }
}

/// The device state layout of the header's `rshmem_state` (checked by size when set).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceState {
    /// Device address of the base table (in this PE's sync area).
    pub base: u64,
    pub my_base: u64,
    pub heap_size: u64,
    pub timeout_ns: u64,
    pub sync_bar: u64,
    pub sync_exp: u64,
    pub sync_err: u64,
    pub my_pe: i32,
    pub n_pes: i32,
    pub team_slots: i32,
    pub stream_slot: i32,
}

const _: () = assert!(std::mem::size_of::<DeviceState>() == 72);

/// `RSHMEM_ERR_BAD_TEAM` of the header (`RSHMEM_ERR_TIMEOUT` is 1).
const ERR_BAD_TEAM: u64 = 2;
/// `RSHMEM_ERR_REMOTE_OP` of the header.
const ERR_REMOTE_OP: u64 = 4;

impl DeviceState {
    /// The state of PE `me` whose heap of `heap_size` bytes (then the sync area) is at
    /// `bases[me]`, with `bases` as mapped on its GPU.
    fn new(
        layout: &SyncLayout,
        bases: &[u64],
        me: usize,
        heap_size: usize,
        timeout: std::time::Duration,
    ) -> DeviceState {
        let my_base = bases.get(me).copied().unwrap_or(0);
        let sync = my_base + heap_size as u64;
        DeviceState {
            base: sync + layout.bases() as u64 * 8,
            my_base,
            heap_size: heap_size as u64,
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            sync_bar: layout.bar() as u64,
            sync_exp: layout.exp() as u64,
            sync_err: layout.err() as u64,
            my_pe: me as i32,
            n_pes: layout.n_pes as i32,
            team_slots: layout.slots as i32,
            stream_slot: layout.stream_slot() as i32,
        }
    }
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
    /// Layout of the sync area.
    pub layout: SyncLayout,
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
    /// `rshmemi_proxy_op`: a stream-ordered request to a PE on another node.
    pub f_proxy: Func,
    /// Per PE: true when it runs on another node (base 0 in the table; reached through the
    /// proxy's ring).
    pub remote: Vec<bool>,
    /// The ring kernels post requests for PEs on other nodes into (a world on several nodes).
    pub ring: Option<remote::DeviceRing>,
    /// `rshmemi_take_error`: takes the device error word and its info word atomically.
    f_take_error: Func,
    lock: lock::TicketLock,
    pub modules: Mutex<std::collections::HashMap<u64, Arc<Module>>>,
    _peers: Vec<PeerMap>,
    /// This PE's heap (taken by `Drop`, see [`grave`]).
    own: Option<OwnHeap>,
    /// The world's key and its PEs in this process (see [`grave`]).
    grave_key: u64,
    local_pes: usize,
}

/// Heaps of ended thread PEs (see [`grave`]).
static GRAVEYARD: grave::Graveyard<OwnHeap> = grave::Graveyard::new();

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let Some(own) = self.own.take() else { return };
        if let Some(heaps) = GRAVEYARD.bury(self.grave_key, self.local_pes, own) {
            // Every local PE of the world has ended: quiesce each GPU the heaps live on
            // (peers' kernels that still reach them from other GPUs included), then free.
            for h in &heaps {
                h.quiesce();
            }
            drop(heaps);
        }
    }
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

/// The PEs of `me`'s process on `me`'s GPU (`me` included; ascending): thread-PEs that share
/// one CUDA context (see the module docs, "PEs sharing a GPU").
fn same_context_pes(pids: &[u32], ords: &[usize], me: usize) -> Vec<usize> {
    (0..pids.len().min(ords.len()))
        .filter(|&p| pids[p] == pids[me] && ords[p] == ords[me])
        .collect()
}

fn pick_device(config: &Config, me: usize, pids: &[u32]) -> Result<usize> {
    // The map is the configuration's (Config::from_env reads RSHMEM_DEVICES at the edge).
    let map = config.devices.clone();
    // One node: world rank modulo the visible GPUs. In thread mode that is the PE's index among
    // its process's PEs; in process mode the local rank (also right when each process sees
    // only its own GPU through CUDA_VISIBLE_DEVICES).
    let _ = pids;
    device_of(map.as_deref(), me, gpu::device_count)
}

/// PE `me`'s GPU: its entry of the device map when there is one (entries may repeat: PEs
/// sharing a GPU), else `me` modulo the number of visible GPUs (`count`, asked only then), so
/// with fewer GPUs than PEs the PEs share them round robin.
fn device_of(
    map: Option<&[usize]>,
    me: usize,
    count: impl FnOnce() -> Result<usize>,
) -> Result<usize> {
    if let Some(m) = map {
        return m.get(me).copied().ok_or_else(|| {
            Error::invalid(format!(
                "the device map has {} entries, PE {me} has none",
                m.len()
            ))
        });
    }
    let count = count()?;
    if count == 0 {
        return Err(ffi::err("no CUDA GPU is visible"));
    }
    if me >= count {
        tracing::debug!(
            pe = me,
            gpus = count,
            gpu = me % count,
            "more PEs than visible GPUs: PEs share GPUs"
        );
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
        remote: &[bool],
        boot: &dyn Bootstrap,
    ) -> Result<CudaBackend> {
        // Step 1: device choice, exchanged so VMM heaps can grant same-process peers access.
        let layout = SyncLayout::new(n, config.max_teams);
        let first = (|| -> Result<Arc<Gpu>> {
            ffi::driver()?;
            layout.as_ref().map_err(Clone::clone)?;
            gpu::gpu(pick_device(config, me, pids)?)
        })();
        let ord = first.as_ref().map(|g| g.ordinal as u64).unwrap_or(u64::MAX);
        agree(
            boot,
            first.as_ref().map(|_| ()).map_err(Clone::clone),
            "CUDA device",
        )?;
        let gpu = first?;
        let layout = layout?;
        let ords: Vec<usize> = boot
            .allgather(&enc(&[ord]))?
            .iter()
            .map(|b| word(b, 0) as usize)
            .collect();
        let my_pid = pids[me];
        let sharing = same_context_pes(pids, &ords, me);
        if sharing.len() > 1 && sharing[0] == me {
            tracing::warn!(
                "PEs {sharing:?} are threads of one process on GPU {}: they share its CUDA \
                 context and hardware queues, where a device wait can stall until the timeout \
                 (Error::Timeout) in a small share of runs; use one GPU per thread-PE, or one \
                 process per PE, outside development",
                gpu.ordinal
            );
        }
        let local_ords: Vec<usize> = (0..n)
            .filter(|&p| pids[p] == my_pid)
            .map(|p| ords[p])
            .collect();

        // Step 2: my heap.
        let kind = config.heap_kind;
        let bytes = (|| -> Result<usize> {
            let raw = config.heap_size.div_ceil(4096) * 4096 + layout.bytes();
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
        let grave_key = grave::world_key(&all);
        let local_pes = pids.iter().filter(|&&p| p == pids[me]).count();

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
                } else if remote.get(p).copied().unwrap_or(false) {
                    // Another node: reached through the proxy (base 0 tells kernels so).
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

        // Step 4: the base table, internal kernels and host-op resources.
        let state = DeviceState::new(&layout, &bases, me, heap_size, config.timeout);
        let rest = (|| -> Result<_> {
            let stream = RawStream::new(&gpu)?;
            let table = enc(&bases);
            let _g = gpu.bind()?;
            // SAFETY: the table's n_pes words lie at the end of this PE's own sync area, inside
            // its heap allocation (layout.bytes() counts them); the source is a live vector and
            // the copy completes before it is dropped (stream synchronised).
            ffi::check(
                unsafe {
                    ffi::cu::cuMemcpyHtoDAsync_v2(
                        state.base,
                        table.as_ptr() as *const _,
                        table.len(),
                        stream.raw,
                    )
                },
                "cuMemcpyHtoDAsync (heap base table)",
            )?;
            stream.sync()?;
            drop(_g);
            let ring = match remote.iter().any(|&r| r) {
                true => Some(remote::DeviceRing::new(&gpu)?),
                false => None,
            };
            if let Some(ring) = &ring {
                // The ring's address and a zero head, in this PE's error line.
                let words = enc(&[ring.dev, 0]);
                let at =
                    bases[me] + (heap_size + (layout.err() + remote::ERR_LINE_RING) * 8) as u64;
                let _g = gpu.bind()?;
                // SAFETY: two words of this PE's own error line (reserved words, inside its heap
                // allocation); the source lives until the synchronised copy is done.
                ffi::check(
                    unsafe {
                        ffi::cu::cuMemcpyHtoDAsync_v2(
                            at,
                            words.as_ptr() as *const _,
                            words.len(),
                            stream.raw,
                        )
                    },
                    "cuMemcpyHtoDAsync (proxy ring address)",
                )?;
                stream.sync()?;
            }
            let internal = Arc::new(load_internal(&gpu, &state)?);
            let scratch = DevBuf::zeroed(&gpu, 64)?;
            Ok((
                internal.func("rshmemi_host_amo")?,
                internal.func("rshmemi_signal_add")?,
                internal.func("rshmemi_wait")?,
                internal.func("rshmemi_team_sync")?,
                internal.func("rshmemi_take_error")?,
                internal.func("rshmemi_proxy_op")?,
                ring,
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
        let (
            f_amo,
            f_signal_add,
            f_wait,
            f_team_sync,
            f_take_error,
            f_proxy,
            ring,
            internal,
            stream,
            scratch,
        ) = rest?;
        tracing::debug!(
            pe = me,
            gpu = gpu.ordinal,
            ?kind,
            bytes = own.bytes,
            heap_bytes = heap_size,
            sync_bytes = layout.bytes(),
            team_slots = layout.slots,
            "CUDA heap up"
        );
        if me == 0 && layout.bytes() > heap_size {
            tracing::warn!(
                sync_bytes = layout.bytes(),
                heap_bytes = heap_size,
                n_pes = n,
                max_teams = config.max_teams,
                "the CUDA sync area (n_pes x (max_teams + 1) x 16 B per PE) is larger than the \
                 heap; lower RSHMEM_MAX_TEAMS to shrink it"
            );
        }
        Ok(CudaBackend {
            me,
            n,
            gpu,
            ordinals: ords,
            bases,
            heap_size,
            layout,
            timeout: config.timeout,
            heap_kind: kind,
            stream,
            scratch,
            _internal: internal,
            f_amo,
            f_signal_add,
            f_wait,
            f_team_sync,
            f_take_error,
            f_proxy,
            remote: remote.to_vec(),
            ring,
            lock: Default::default(),
            modules: Mutex::new(Default::default()),
            _peers: peers,
            own: Some(own),
            grave_key,
            local_pes,
        })
    }

    /// Whether no other PE of the world runs on this PE's GPU (by ordinal, so PEs of other
    /// processes numbering GPUs differently count as sharing it: the safe side).
    pub(crate) fn gpu_alone(&self) -> bool {
        let mine = self.ordinals[self.me];
        self.ordinals.iter().filter(|&&o| o == mine).count() == 1
    }

    /// The device state every module loaded for this PE gets.
    pub(crate) fn state(&self) -> DeviceState {
        DeviceState::new(
            &self.layout,
            &self.bases,
            self.me,
            self.heap_size,
            self.timeout,
        )
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

    /// Sets `words` 32-bit words of this process's GPU memory from device address `addr` to
    /// `value` (the host-API stream, synchronised before return).
    pub(crate) fn fill_u32(&self, addr: u64, value: u32, words: usize) -> Result<()> {
        let _l = self.guard();
        let _g = self.gpu.bind()?;
        // SAFETY: the caller passes a range of its own symmetric object (4-byte aligned); the
        // memset completes before return (stream synchronised).
        ffi::check(
            unsafe { ffi::cu::cuMemsetD32Async(addr, value, words, self.stream.raw) },
            "cuMemsetD32Async",
        )?;
        self.stream.sync()
    }

    fn guard(&self) -> lock::TicketGuard<'_> {
        self.lock.lock()
    }

    /// Sets the 64-bit word at device address `addr` to `v` by a stream memory operation on the
    /// host-API stream (synchronised before return); false where the device refuses 64-bit
    /// stream memory operations (the caller then takes the atomic kernel).
    ///
    /// No SM is involved: a set a proxy serves for another node (a signal a kernel here is
    /// waiting for) then never needs a kernel of this context to become resident beside kernels
    /// that may fill the GPU while they wait for it.
    fn write_word(&self, addr: u64, v: u64) -> Result<bool> {
        let _l = self.guard();
        let _g = self.gpu.bind()?;
        // SAFETY: an aligned word inside a mapped heap (checked by the caller); default flags
        // keep the memory barrier, so earlier copies on the stream are visible before it.
        let r = unsafe {
            ffi::cu::cuStreamWriteValue64_v2(
                self.stream.raw,
                addr,
                v,
                ffi::cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        };
        if r == ffi::cu::CUresult::CUDA_ERROR_NOT_SUPPORTED {
            return Ok(false);
        }
        ffi::check(r, "cuStreamWriteValue64 (host atomic set)")?;
        self.stream.sync()?;
        Ok(true)
    }

    /// Takes the device error word (set by device waits that timed out and device barriers
    /// given a team outside the job or one this PE is not a member of) and reports what it
    /// held, once: a plain read first (no kernel while the word is 0), then, when it is set,
    /// `rshmemi_take_error` exchanges it and its info word with 0 on the device and the taken
    /// values are reported. A bit a running kernel sets meanwhile is either in what was taken
    /// or left for the next call (a host copy of zeros, as before, could erase it unseen), and
    /// of several threads of this PE checking at once exactly one gets the error.
    pub(crate) fn take_device_error(&self) -> Result<()> {
        let a = self.sync_addr(self.me, self.layout.err());
        // Held throughout: the stream and the scratch buffer are shared with other host ops.
        let _l = self.guard();
        let _g = self.gpu.bind()?;
        let mut v = 0u64;
        // SAFETY: 8 bytes from this PE's sync area (the error word) into a local; the copy
        // completes before it is read (stream synchronised).
        ffi::check(
            unsafe {
                ffi::cu::cuMemcpyDtoHAsync_v2(&mut v as *mut u64 as *mut _, a, 8, self.stream.raw)
            },
            "cuMemcpyDtoHAsync (device error word)",
        )?;
        self.stream.sync()?;
        if v == 0 {
            return Ok(());
        }
        let mut out = self.scratch.ptr;
        let mut params = [&mut out as *mut u64 as *mut std::ffi::c_void];
        // SAFETY: the parameters match rshmemi_take_error(rshmem_u64*); out is our 64-byte
        // scratch buffer (the kernel writes 16 bytes), used under `lock` only.
        unsafe { gpu::launch(&self.stream, self.f_take_error, 1, 32, 0, &mut params)? };
        // The error word and the word naming the PE a timed-out wait waited for (+1).
        let mut t = [0u64; 2];
        // SAFETY: 16 bytes of scratch into a local, synchronised below.
        ffi::check(
            unsafe {
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    t.as_mut_ptr() as *mut _,
                    self.scratch.ptr,
                    16,
                    self.stream.raw,
                )
            },
            "cuMemcpyDtoHAsync (taken device error)",
        )?;
        self.stream.sync()?;
        if t[0] == 0 {
            return Ok(());
        }
        Err(device_error(t[0], t[1], self.layout.n_pes, self.timeout))
    }
}

/// The error of a device error word `word` and its info word `named` (the PE a timed-out
/// wait waited for, plus 1; 0 or out of range: not named).
fn device_error(word: u64, named: u64, n_pes: usize, after: std::time::Duration) -> Error {
    if word & ERR_BAD_TEAM != 0 {
        return Error::Team(
            "a device barrier was given a team whose slot or members lie outside this \
             job, or that this PE is not a member of (a DeviceTeam not made by \
             CudaPe::device_team on this PE?); it synchronised nothing"
                .into(),
        );
    }
    let pe = named
        .checked_sub(1)
        .map(|p| p as usize)
        .filter(|&p| p < n_pes);
    if word & ERR_REMOTE_OP != 0 {
        let whom = pe.map_or_else(|| "a PE".to_string(), |p| format!("PE {p}"));
        return Error::InvalidArgument(format!(
            "a kernel issued a device atomic or `g` to {whom} on another node: kernels reach \
             PEs of other nodes by put, put-with-signal, signal, get and quiet only; it \
             touched nothing and returned 0"
        ));
    }
    Error::Timeout {
        op: "device-side wait (kernel or stream)",
        pe,
        after,
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
        if let (AtomicOp::Set(v), true) = (op, wide) {
            if self.write_word(self.addr(pe, offset), v)? {
                return Ok(0);
            }
        }
        let (code, a, b) = op.encode();
        let code = code as i32;
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

#[cfg(test)]
mod tests;
