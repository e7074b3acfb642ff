//! One reliable-datagram endpoint (`FI_EP_RDM`) with its fabric, domain, address vector and
//! completion queue, and the one-sided operations on it.
//!
//! Every posted operation carries the index of its peer as its context, so a failed completion
//! names the peer. Blocking operations post and then reap completions until everything this
//! endpoint posted has completed (a quiet), each wait bounded by the configured deadline.
//! Providers with manual data progress (tcp;ofi_rxm) only move incoming RMA and atomics while
//! someone reads the completion queue, so a progress thread reads it whenever no operation of
//! this endpoint is doing so.

use super::ffi::*;
use super::loader::{lib, Lib};
use super::mr::{MemoryRegion, Remote};
use super::xfer::{Dir, Pool, BURST_HOLD, CHUNK, WINDOW};
use crate::backend::AtomicOp;
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How the fabric is chosen and how long its operations may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// Provider name as `fi_info` prints it (`tcp`, `verbs`, `efa`, `cxi`, `shm`); `None`:
    /// the first one `fi_getinfo` offers.
    pub provider: Option<String>,
    /// Domain (interface) name, e.g. `lo` for loopback tcp; `None`: the provider's first.
    pub domain: Option<String>,
    /// Deadline of every wait for a completion.
    pub timeout: Duration,
    /// Ask the provider chosen for device memory (`FI_HMEM`) too, for a GPU heap registered
    /// with it; where it does not offer it, the endpoint is opened without.
    pub hmem: bool,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            provider: None,
            domain: None,
            timeout: Duration::from_secs(60),
            hmem: false,
        }
    }
}

/// The raw handles, closed in reverse order of opening.
pub(super) struct Handles {
    info: *mut fi_info,
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    av: *mut fid_av,
    cq: *mut fid_cq,
    pub(super) ep: *mut fid_ep,
}

/// Mutable state behind the endpoint's lock: the handles are used by one thread at a time
/// (libfabric's FI_THREAD_DOMAIN contract, the cheapest every provider offers).
pub(super) struct State {
    lib: &'static Lib,
    pub(super) h: Handles,
    /// Id of the next operation posted (its completion context; never 0).
    pub(super) next_id: u64,
    /// Completed operations not yet collected by their waiter: id → error text, if it failed.
    pub(super) done: HashMap<u64, Option<String>>,
    /// Operations whose waiter gave up (peer lost, deadline): their completions are dropped.
    pub(super) abandoned: HashSet<u64>,
    /// Chunks of non-blocking operations in flight (`nbi.rs`): their completions go to
    /// `nbi_done`, which the operations' table collects.
    pub(super) nbi_ids: HashSet<u64>,
    /// Completions of non-blocking chunks not yet collected: id → error text, if it failed.
    pub(super) nbi_done: Vec<(u64, Option<String>)>,
    /// Addresses of the peers, by peer index (after `insert_peers`).
    pub(super) peers: Vec<fi_addr_t>,
}

// SAFETY: the raw handles are only used under the endpoint's mutex.
unsafe impl Send for State {}

/// An open endpoint; see the module documentation.
pub(crate) struct Endpoint {
    lib: &'static Lib,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    progress: Option<std::thread::JoinHandle<()>>,
    /// The domain's memory-registration mode (FI_MR_* bits).
    pub mr_mode: c_int,
    /// Largest message the endpoint carries in one operation.
    max_msg: usize,
    /// Name of the provider chosen.
    pub provider: String,
    /// The endpoint takes device memory (`FI_HMEM`): GPU heaps can be registered.
    pub hmem: bool,
    /// Chunks of one put or get in flight at once.
    window: usize,
    /// The provider places RMA writes to a peer in posting order (see `xfer.rs`).
    ordered_writes: AtomicBool,
    /// Staging slots of puts and gets, free for reuse: full chunks, and small ones.
    pool: Arc<Mutex<Pool>>,
    small_pool: Mutex<Pool>,
    /// Non-blocking operations in flight (`nbi.rs`). Lock order: this table, then the pools,
    /// then the state; never the other way round.
    pub(super) nbi: Mutex<super::nbi::Table>,
    /// A small registered buffer for atomic operands and results.
    bounce: Mutex<Option<MemoryRegion>>,
    timeout: Duration,
    /// Peers known lost (`mark_lost`): operations waiting on them give up at once.
    lost: Mutex<HashSet<usize>>,
    any_lost: AtomicBool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("mr_mode", &self.mr_mode)
            .field("hmem", &self.hmem)
            .finish()
    }
}

/// Bytes of the bounce buffer (atomic operands and results).
const BOUNCE: usize = 4096;

pub(super) fn fail(op: &'static str, pe: Option<usize>, msg: String) -> Error {
    Error::Fabric { op, pe, msg }
}

fn check(lib: &Lib, op: &'static str, rc: isize) -> Result<()> {
    if rc < 0 {
        return Err(fail(op, None, lib.strerror(rc)));
    }
    Ok(())
}

/// `fi_getinfo` for an RDM endpoint with RMA and atomics from `provider` on `domain` (`None`:
/// any), with device memory (`FI_HMEM`, registrations of it required) when `hmem`; the list
/// (the caller frees it) or libfabric's error code.
pub(super) fn getinfo(
    lib: &Lib,
    provider: Option<&str>,
    domain: Option<&str>,
    hmem: bool,
) -> std::result::Result<*mut fi_info, c_int> {
    // SAFETY: fi_dupinfo(NULL) allocates zeroed hints with every attr struct.
    let hints = unsafe { (lib.dupinfo)(std::ptr::null()) };
    if hints.is_null() {
        return Err(-libc::ENOMEM);
    }
    struct FreeHints<'a>(&'a Lib, *mut fi_info);
    impl Drop for FreeHints<'_> {
        fn drop(&mut self) {
            // SAFETY: allocated by fi_dupinfo; strings in it were strdup'ed.
            unsafe { (self.0.freeinfo)(self.1) };
        }
    }
    let _free = FreeHints(lib, hints);
    let dup = |s: &str| -> std::result::Result<*mut std::ffi::c_char, c_int> {
        let c = CString::new(s).map_err(|_| -libc::EINVAL)?;
        // SAFETY: strdup of a valid C string; fi_freeinfo frees it.
        Ok(unsafe { libc::strdup(c.as_ptr()) })
    };
    // SAFETY: hints and its attr structs were allocated by fi_dupinfo.
    unsafe {
        let i = &mut *hints;
        i.caps =
            FI_RMA | FI_ATOMIC | FI_MSG | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        (*i.ep_attr).type_ = FI_EP_RDM;
        let d = &mut *i.domain_attr;
        d.mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        if hmem {
            i.caps |= FI_HMEM;
            d.mr_mode |= FI_MR_HMEM;
        }
        d.threading = 3; // FI_THREAD_DOMAIN: the endpoint's mutex serialises every call
        d.av_type = FI_AV_TABLE;
        if let Some(name) = domain {
            d.name = dup(name)?;
        }
        if let Some(p) = provider {
            (*i.fabric_attr).prov_name = dup(p)?;
        }
    }
    let mut info = std::ptr::null_mut();
    // SAFETY: valid hints; info receives a list the caller frees.
    let rc = unsafe {
        (lib.getinfo)(
            fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION),
            std::ptr::null(),
            std::ptr::null(),
            0,
            hints,
            &mut info,
        )
    };
    match (rc, info.is_null()) {
        (0, false) => Ok(info),
        (0, true) => Err(-libc::ENODATA),
        _ => Err(rc),
    }
}

impl Handles {
    /// Closes what is open, endpoint first.
    fn close(&mut self, lib: &Lib) {
        let fids: [*mut fid; 5] = [
            self.ep.cast(),
            self.av.cast(),
            self.cq.cast(),
            self.domain.cast(),
            self.fabric.cast(),
        ];
        for f in fids {
            if !f.is_null() {
                // SAFETY: an open fid (every fid starts with `struct fid`), closed once.
                unsafe { ((*(*f).ops).close)(f) };
            }
        }
        self.ep = std::ptr::null_mut();
        self.av = std::ptr::null_mut();
        self.cq = std::ptr::null_mut();
        self.domain = std::ptr::null_mut();
        self.fabric = std::ptr::null_mut();
        if !self.info.is_null() {
            // SAFETY: returned by fi_getinfo, freed once.
            unsafe { (lib.freeinfo)(self.info) };
            self.info = std::ptr::null_mut();
        }
    }
}

impl State {
    /// Files the completion of operation `id` (`err`: its error text) for its waiter.
    fn completed(&mut self, id: u64, err: Option<String>) {
        if self.abandoned.remove(&id) {
            return;
        }
        if self.nbi_ids.remove(&id) {
            self.nbi_done.push((id, err));
        } else {
            self.done.insert(id, err);
        }
    }

    /// The open domain.
    pub(super) fn domain(&self) -> *mut fid_domain {
        self.h.domain
    }

    /// Reads completions until none is ready; records the first error.
    pub(super) fn reap(&mut self, lib: &Lib) {
        let mut entries = [const {
            fi_cq_entry {
                op_context: std::ptr::null_mut(),
            }
        }; 16];
        loop {
            // SAFETY: an open CQ of format CONTEXT; the buffer holds 16 entries.
            let n = unsafe {
                ((*(*self.h.cq).ops).read)(self.h.cq, entries.as_mut_ptr().cast(), entries.len())
            };
            if n > 0 {
                for e in &entries[..n as usize] {
                    self.completed(e.op_context as u64, None);
                }
                continue;
            }
            if n == -FI_EAVAIL {
                // SAFETY: zeroed is a valid error entry (plain data and null pointers).
                let mut e: fi_cq_err_entry = unsafe { std::mem::zeroed() };
                // SAFETY: open CQ, valid entry to fill.
                let r = unsafe { ((*(*self.h.cq).ops).readerr)(self.h.cq, &mut e, 0) };
                if r > 0 {
                    let id = e.op_context as u64;
                    // SAFETY: open CQ; the provider returns a string valid until the next read.
                    let prov = unsafe {
                        let p = ((*(*self.h.cq).ops).strerror)(
                            self.h.cq,
                            e.prov_errno,
                            e.err_data,
                            std::ptr::null_mut(),
                            0,
                        );
                        if p.is_null() {
                            String::new()
                        } else {
                            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                        }
                    };
                    let msg = format!("{} (provider: {prov})", lib.strerror(e.err as isize));
                    self.completed(id, Some(msg));
                    continue;
                }
            }
            return;
        }
    }
}

impl Endpoint {
    /// Opens fabric, domain, completion queue, address vector and an enabled RDM endpoint on
    /// the provider `config` names.
    pub fn open(config: &FabricConfig) -> Result<Endpoint> {
        let lib = lib()?;
        let mut h = Handles {
            info: std::ptr::null_mut(),
            fabric: std::ptr::null_mut(),
            domain: std::ptr::null_mut(),
            av: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            ep: std::ptr::null_mut(),
        };
        match Self::open_handles(lib, config, &mut h) {
            Ok(()) => {}
            Err(e) => {
                h.close(lib);
                return Err(e);
            }
        }
        // SAFETY: info is valid until freed in close.
        let (mr_mode, provider, max_msg, tx_size, ordered_writes, hmem) = unsafe {
            let i = &*h.info;
            let max_msg = (*i.ep_attr).max_msg_size.max(4096);
            (
                (*i.domain_attr).mr_mode,
                std::ffi::CStr::from_ptr((*i.fabric_attr).prov_name)
                    .to_string_lossy()
                    .into_owned(),
                max_msg,
                (*i.tx_attr).size,
                (*i.tx_attr).msg_order & (FI_ORDER_WAW | FI_ORDER_RMA_WAW) != 0
                    && (*i.ep_attr).max_order_waw_size >= max_msg.min(CHUNK),
                i.caps & FI_HMEM != 0,
            )
        };
        let state = Arc::new(Mutex::new(State {
            lib,
            h,
            next_id: 1,
            done: HashMap::new(),
            abandoned: HashSet::new(),
            nbi_ids: HashSet::new(),
            nbi_done: Vec::new(),
            peers: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let pool = Arc::new(Mutex::new(Pool::new(false)));
        let progress = {
            let state = state.clone();
            let stop = stop.clone();
            let pool = pool.clone();
            std::thread::Builder::new()
                .name("rshmem-fabric".into())
                .spawn(move || {
                    let mut trimmed = std::time::Instant::now();
                    while !stop.load(Ordering::Acquire) {
                        if let Ok(mut s) = state.try_lock() {
                            s.reap(lib);
                        }
                        // Staging kept for a burst goes back once it is over (freed here,
                        // outside both locks: a registered slot locks the state to close).
                        if trimmed.elapsed() >= BURST_HOLD / 4 {
                            trimmed = std::time::Instant::now();
                            let extra = pool.try_lock().map(|mut p| p.trim());
                            drop(extra);
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                })
                .map_err(|e| fail("starting the progress thread", None, e.to_string()))?
        };
        let mut ep = Endpoint {
            lib,
            state,
            stop,
            progress: Some(progress),
            mr_mode,
            max_msg,
            provider,
            hmem,
            // A queue of unknown size (0) still takes one operation at a time.
            window: WINDOW.min(tx_size).max(1),
            ordered_writes: AtomicBool::new(ordered_writes),
            pool,
            small_pool: Mutex::new(Pool::new(true)),
            nbi: Mutex::new(super::nbi::Table::default()),
            bounce: Mutex::new(None),
            timeout: config.timeout,
            lost: Mutex::new(HashSet::new()),
            any_lost: AtomicBool::new(false),
        };
        let buf = vec![0u8; BOUNCE].into_boxed_slice();
        let mr = MemoryRegion::register_owned(&ep, buf)?;
        ep.bounce = Mutex::new(Some(mr));
        Ok(ep)
    }

    fn open_handles(lib: &'static Lib, config: &FabricConfig, h: &mut Handles) -> Result<()> {
        for name in [&config.provider, &config.domain].into_iter().flatten() {
            if name.contains('\0') {
                return Err(Error::invalid(format!("NUL in {name:?}")));
            }
        }
        let info = getinfo(
            lib,
            config.provider.as_deref(),
            config.domain.as_deref(),
            false,
        )
        .map_err(|rc| {
            fail(
                "fi_getinfo",
                None,
                format!(
                    "no RDM endpoint with RMA and atomics from provider {} on domain {}: {}",
                    config.provider.as_deref().unwrap_or("(any)"),
                    config.domain.as_deref().unwrap_or("(any)"),
                    lib.strerror(rc as isize)
                ),
            )
        })?;
        h.info = info;
        if config.hmem {
            // Asked again of the provider and domain just chosen: wanting device memory must
            // never move a job to another provider (shm offers FI_HMEM, tcp does not).
            // SAFETY: info is a valid fi_getinfo result; its names are NUL-terminated.
            let (prov, dom) = unsafe {
                let i = &*info;
                let s = |p: *mut std::ffi::c_char| {
                    (!p.is_null())
                        .then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
                };
                (s((*i.fabric_attr).prov_name), s((*i.domain_attr).name))
            };
            let prov_name = prov.as_deref().unwrap_or("?").to_string();
            match getinfo(lib, prov.as_deref(), dom.as_deref(), true) {
                Ok(hi) => {
                    h.info = hi;
                    match Self::open_on(lib, h, true) {
                        Ok(()) => {
                            // SAFETY: returned by fi_getinfo, freed once (replaced by `hi`).
                            unsafe { (lib.freeinfo)(info) };
                            return Ok(());
                        }
                        Err(e) => {
                            tracing::debug!(
                                provider = prov_name,
                                reason = %e,
                                "GPU heaps are staged: the provider takes device memory only \
                                 with CUDA calls of its own"
                            );
                            h.close(lib);
                            h.info = info;
                        }
                    }
                }
                Err(rc) => tracing::debug!(
                    provider = prov_name,
                    reason = %lib.strerror(rc as isize),
                    "the provider does not offer FI_HMEM: GPU heaps are staged"
                ),
            }
        }
        Self::open_on(lib, h, false)
    }

    /// Opens fabric, domain, CQ, AV and an enabled endpoint on `h.info`. `hmem`: the info
    /// offers device memory, and the provider must then agree not to call CUDA itself
    /// (`FI_OPT_CUDA_API_PERMITTED`, as NCCL's libfabric plugin asks): a provider that copies
    /// device memory with the CUDA runtime issues synchronous copies that wait for the GPU,
    /// where rshmem's kernels spin on waits for the very data being copied (shm's progress
    /// thread blocks in `cudaMemcpy` behind them until their device timeout).
    /// Providers that move device memory by DMA (verbs and EFA with GPUDirect RDMA, cxi)
    /// agree.
    fn open_on(lib: &'static Lib, h: &mut Handles, hmem: bool) -> Result<()> {
        let info = h.info;
        // SAFETY: every call below gets handles opened just before, and valid out-pointers;
        // each result code is checked before the handle is used.
        unsafe {
            let i = &mut *info;
            let rc = (lib.fabric)(i.fabric_attr, &mut h.fabric, std::ptr::null_mut());
            check(lib, "fi_fabric", rc as isize)?;
            let rc =
                ((*(*h.fabric).ops).domain)(h.fabric, info, &mut h.domain, std::ptr::null_mut());
            check(lib, "fi_domain", rc as isize)?;
            let mut cq_attr: fi_cq_attr = std::mem::zeroed();
            cq_attr.format = FI_CQ_FORMAT_CONTEXT;
            cq_attr.wait_obj = FI_WAIT_NONE;
            cq_attr.size = 0;
            let rc = ((*(*h.domain).ops).cq_open)(
                h.domain,
                &mut cq_attr,
                &mut h.cq,
                std::ptr::null_mut(),
            );
            check(lib, "fi_cq_open", rc as isize)?;
            let mut av_attr: fi_av_attr = std::mem::zeroed();
            av_attr.type_ = FI_AV_TABLE;
            let rc = ((*(*h.domain).ops).av_open)(
                h.domain,
                &mut av_attr,
                &mut h.av,
                std::ptr::null_mut(),
            );
            check(lib, "fi_av_open", rc as isize)?;
            let rc = ((*(*h.domain).ops).endpoint)(h.domain, info, &mut h.ep, std::ptr::null_mut());
            check(lib, "fi_endpoint", rc as isize)?;
            if hmem {
                let permitted = false;
                let rc = ((*(*h.ep).ops).setopt)(
                    h.ep.cast(),
                    FI_OPT_ENDPOINT,
                    FI_OPT_CUDA_API_PERMITTED,
                    (&permitted as *const bool).cast(),
                    std::mem::size_of::<bool>(),
                );
                check(lib, "fi_setopt(FI_OPT_CUDA_API_PERMITTED)", rc as isize)?;
            }
            let epf: *mut fid = h.ep.cast();
            let rc = ((*(*epf).ops).bind)(epf, h.cq.cast(), FI_TRANSMIT | FI_RECV);
            check(lib, "fi_ep_bind(cq)", rc as isize)?;
            let rc = ((*(*epf).ops).bind)(epf, h.av.cast(), 0);
            check(lib, "fi_ep_bind(av)", rc as isize)?;
            let rc = ((*(*epf).ops).control)(epf, FI_ENABLE, std::ptr::null_mut());
            check(lib, "fi_enable", rc as isize)?;
        }
        Ok(())
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared state (memory registrations keep it, so the domain outlives them).
    pub(super) fn state(&self) -> &Arc<Mutex<State>> {
        &self.state
    }

    /// The library (for error texts).
    pub(super) fn lib(&self) -> &'static Lib {
        self.lib
    }

    /// This endpoint's address, to hand to the peers.
    pub fn name(&self) -> Result<Vec<u8>> {
        let s = self.lock();
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: an enabled endpoint; buf holds len bytes.
        let rc =
            unsafe { ((*(*s.h.ep).cm).getname)(s.h.ep.cast(), buf.as_mut_ptr().cast(), &mut len) };
        check(self.lib, "fi_getname", rc as isize)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts every peer's address (by peer index; this endpoint's own included).
    pub fn insert_peers(&self, names: &[Vec<u8>]) -> Result<()> {
        let mut s = self.lock();
        let mut out = Vec::with_capacity(names.len());
        for (pe, n) in names.iter().enumerate() {
            let mut a: fi_addr_t = u64::MAX;
            // SAFETY: open AV; the address bytes are the peer's getname output.
            let rc = unsafe {
                ((*(*s.h.av).ops).insert)(
                    s.h.av,
                    n.as_ptr().cast(),
                    1,
                    &mut a,
                    0,
                    std::ptr::null_mut(),
                )
            };
            if rc != 1 {
                return Err(fail(
                    "fi_av_insert",
                    Some(pe),
                    format!("address of {} bytes not accepted ({rc})", n.len()),
                ));
            }
            out.push(a);
        }
        s.peers = out;
        Ok(())
    }

    /// Reads the completion queue if no other thread holds the endpoint (never blocks).
    pub fn progress(&self) {
        if let Ok(mut s) = self.state.try_lock() {
            s.reap(self.lib);
        }
    }

    /// Takes `pe` as lost: operations waiting for it give up (their memory is left to the
    /// provider), and new ones to it fail at once.
    pub fn mark_lost(&self, pe: usize) {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pe);
        self.any_lost.store(true, Ordering::Release);
    }

    pub(super) fn is_lost(&self, pe: usize) -> bool {
        self.any_lost.load(Ordering::Acquire)
            && self
                .lost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&pe)
    }

    /// Posts one operation with `post` (retrying while the provider's queue is full) and waits
    /// for its completion, at most `timeout`, giving up early when `pe` is lost. The lock is
    /// held only to post and to read the queue, so a wait on a dead peer holds up no other.
    ///
    /// On an error the operation may still be in the provider's hands: the caller must then
    /// leave every buffer it passed alive for good (`std::mem::forget`).
    fn op(
        &self,
        op: &'static str,
        pe: usize,
        timeout: Duration,
        mut post: impl FnMut(&State, fi_addr_t, *mut c_void) -> isize,
    ) -> Result<()> {
        let start = Instant::now();
        let gave_up = |lost: bool| {
            if lost {
                fail(op, Some(pe), "the peer is lost".into())
            } else {
                Error::Timeout {
                    op,
                    pe: Some(pe),
                    after: start.elapsed(),
                }
            }
        };
        let id = {
            let mut s = self.lock();
            let addr = *s
                .peers
                .get(pe)
                .ok_or_else(|| fail(op, Some(pe), "peer has no fabric address".into()))?;
            loop {
                let id = s.next_id;
                let rc = post(&s, addr, id as *mut c_void);
                if rc == 0 {
                    s.next_id += 1;
                    break id;
                }
                if rc != -FI_EAGAIN {
                    return Err(fail(op, Some(pe), self.lib.strerror(rc)));
                }
                s.reap(self.lib);
                let lost = self.is_lost(pe);
                if lost || start.elapsed() > timeout {
                    return Err(gave_up(lost));
                }
            }
        };
        let mut i = 0u32;
        loop {
            {
                let mut s = self.lock();
                if !s.done.contains_key(&id) {
                    s.reap(self.lib);
                }
                if let Some(r) = s.done.remove(&id) {
                    return match r {
                        None => Ok(()),
                        Some(msg) => Err(fail(op, Some(pe), msg)),
                    };
                }
                if i.is_multiple_of(64) {
                    let lost = self.is_lost(pe);
                    if lost || start.elapsed() > timeout {
                        s.abandoned.insert(id);
                        return Err(gave_up(lost));
                    }
                }
            }
            i = i.wrapping_add(1);
            if i > 256 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    pub(super) fn needs_local_mr(&self) -> bool {
        self.mr_mode & FI_MR_LOCAL != 0
    }

    /// Runs `f` with staging memory of `n` bytes and its descriptor: the registered bounce
    /// buffer where the provider wants local buffers registered (lost for good when `f` fails,
    /// since the provider may still use it), else a fresh allocation (leaked when `f` fails).
    fn staged<R>(
        &self,
        op: &'static str,
        pe: usize,
        n: usize,
        f: impl FnOnce(&mut [u8], *mut c_void) -> Result<R>,
    ) -> Result<R> {
        if self.needs_local_mr() {
            let mut bounce = self.bounce.lock().unwrap_or_else(|e| e.into_inner());
            let b = bounce.as_mut().ok_or_else(|| {
                fail(
                    op,
                    Some(pe),
                    "the staging buffer was lost with an abandoned operation".into(),
                )
            })?;
            let desc = b.desc();
            let r = f(&mut b.bytes_mut()[..n], desc);
            if r.is_err() {
                std::mem::forget(bounce.take());
            }
            r
        } else {
            let mut buf = vec![0u8; n];
            let r = f(&mut buf, std::ptr::null_mut());
            if r.is_err() {
                std::mem::forget(buf);
            }
            r
        }
    }

    /// Deadline of every wait for a completion.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Largest chunk one operation moves.
    pub(super) fn chunk(&self) -> usize {
        self.max_msg.min(CHUNK)
    }

    /// Chunks of one transfer in flight at once.
    pub(super) fn window(&self) -> usize {
        self.window
    }

    /// Whether the provider places RMA writes to a peer in posting order.
    pub(super) fn ordered_writes(&self) -> bool {
        self.ordered_writes.load(Ordering::Relaxed)
    }

    /// Takes the provider's writes as ordered whatever it declares, to exercise the
    /// transmit-complete path on a provider that declares none.
    #[cfg(test)]
    pub(super) fn assume_ordered_writes(&self) {
        self.ordered_writes.store(true, Ordering::Relaxed);
    }

    /// The pool of free staging slots of full chunks (`small`: of small ones).
    pub(super) fn pool_of(&self, small: bool) -> MutexGuard<'_, Pool> {
        let p = if small { &self.small_pool } else { &*self.pool };
        p.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `src` to `offset` of `remote` on peer `pe`; `delivery` asks for delivery
    /// completion (the data is in the target's memory when this returns).
    pub fn write(
        &self,
        pe: usize,
        remote: &Remote,
        offset: usize,
        src: &[u8],
        delivery: bool,
    ) -> Result<()> {
        let dir = Dir::Put { src, delivery };
        self.transfer("fabric put", pe, remote, offset, dir, self.timeout)
    }

    /// Reads from `offset` of `remote` on peer `pe` into `dst`.
    pub fn read(&self, pe: usize, remote: &Remote, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.read_within(pe, remote, offset, dst, self.timeout)
    }

    /// [`read`](Self::read) with its own deadline.
    pub fn read_within(
        &self,
        pe: usize,
        remote: &Remote,
        offset: usize,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<()> {
        self.transfer("fabric get", pe, remote, offset, Dir::Get { dst }, timeout)
    }

    /// Moves `len` bytes between byte `at` of `local` (a registration on this endpoint) and
    /// `offset` of `remote` on peer `pe`, in place: a write (`put`; in the target's memory on
    /// return) or a read.
    pub fn transfer_registered(
        &self,
        pe: usize,
        remote: &Remote,
        offset: usize,
        (local, at, len): (&MemoryRegion, usize, usize),
        put: bool,
    ) -> Result<()> {
        let (ptr, desc) = (local.at(at, len)?, local.desc());
        let (op, dir) = match put {
            true => (
                "fabric put",
                Dir::PutFrom {
                    ptr,
                    len,
                    desc,
                    delivery: true,
                },
            ),
            false => ("fabric get", Dir::GetInto { ptr, len, desc }),
        };
        self.transfer(op, pe, remote, offset, dir, self.timeout)
    }

    /// An atomic on the 8-byte (`wide`) or 4-byte word at `offset` of `remote` on peer `pe`;
    /// returns the old value (0 for `Set`).
    pub fn atomic(
        &self,
        pe: usize,
        remote: &Remote,
        offset: usize,
        wide: bool,
        op: AtomicOp,
    ) -> Result<u64> {
        let dt = if wide { FI_UINT64 } else { FI_UINT32 };
        let raddr = remote.addr(offset);
        let key = remote.key;
        let (fop, v, cond, fetch) = match op {
            AtomicOp::Fetch => (FI_ATOMIC_READ, 0, None, true),
            AtomicOp::Set(v) => (FI_ATOMIC_WRITE, v, None, false),
            AtomicOp::Swap(v) => (FI_ATOMIC_WRITE, v, None, true),
            AtomicOp::CompareSwap { cond, value } => (FI_CSWAP, value, Some(cond), true),
            AtomicOp::FetchAdd(v) => (FI_SUM, v, None, true),
            AtomicOp::FetchAnd(v) => (FI_BAND, v, None, true),
            AtomicOp::FetchOr(v) => (FI_BOR, v, None, true),
            AtomicOp::FetchXor(v) => (FI_BXOR, v, None, true),
        };
        // Operand at 0, compare at 8, result at 16, each in the byte order of the host.
        self.staged("fabric atomic", pe, 24, |buf, desc| {
            let put = |b: &mut [u8], at: usize, x: u64| {
                if wide {
                    b[at..at + 8].copy_from_slice(&x.to_ne_bytes());
                } else {
                    b[at..at + 4].copy_from_slice(&(x as u32).to_ne_bytes());
                }
            };
            put(buf, 0, v);
            put(buf, 8, cond.unwrap_or(0));
            put(buf, 16, 0);
            let base = buf.as_mut_ptr();
            let (operand, compare, result) = (base, base.wrapping_add(8), base.wrapping_add(16));
            self.op("fabric atomic", pe, self.timeout, |s, addr, ctx| {
                // SAFETY: enabled endpoint; operand, compare and result lie in the staging
                // memory, which outlives the operation (kept on failure by `staged`).
                unsafe {
                    let a = &*(*s.h.ep).atomic;
                    match (cond, fetch) {
                        (Some(_), _) => (a.compwrite)(
                            s.h.ep,
                            operand.cast(),
                            1,
                            desc,
                            compare.cast(),
                            desc,
                            result.cast(),
                            desc,
                            addr,
                            raddr,
                            key,
                            dt,
                            fop,
                            ctx,
                        ),
                        (None, true) => (a.readwrite)(
                            s.h.ep,
                            operand.cast(),
                            1,
                            desc,
                            result.cast(),
                            desc,
                            addr,
                            raddr,
                            key,
                            dt,
                            fop,
                            ctx,
                        ),
                        (None, false) => (a.write)(
                            s.h.ep,
                            operand.cast(),
                            1,
                            desc,
                            addr,
                            raddr,
                            key,
                            dt,
                            fop,
                            ctx,
                        ),
                    }
                }
            })?;
            Ok(if wide {
                u64::from_ne_bytes(buf[16..24].try_into().unwrap_or([0; 8]))
            } else {
                u32::from_ne_bytes(buf[16..20].try_into().unwrap_or([0; 4])) as u64
            })
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
        // Non-blocking chunks still in flight keep their staging for good: the provider may
        // touch it until its handles close.
        self.nbi
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .forget_in_flight();
        // The handles close when the last registration holding them is gone (State's drop).
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.small_pool
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.bounce
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

impl Drop for State {
    fn drop(&mut self) {
        self.h.close(self.lib);
    }
}
