//! One PE as Python sees it: how it joins a world (the environment, an explicit address or
//! unique id, or a hub of thread-PEs), its symmetric allocations, and finalize.
//!
//! The entry points that read a launcher's environment are called in [`World::from_env`]
//! only; everything else goes through `Pe::init` with an explicit bootstrap.

use crate::errors::{invalid, IntoPy};
use crate::registry::{Block, Export, Registry, ZOMBIE_WINDOW};
use pyo3::prelude::*;
use rshmem::coll::{Coll, CollConfig};
use rshmem::{BackendKind, Config, Error, InProcBootstrap, Pe, Sym, TcpBootstrap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

/// Per-PE state that borrows the PE: its collectives (host and GPU).
pub(crate) struct Deps<'a> {
    pub(crate) coll: Mutex<Coll<'a>>,
    pub(crate) gpu: Mutex<Option<crate::gpu::GpuSide<'a>>>,
}

self_cell::self_cell!(
    /// A PE with what borrows it.
    pub(crate) struct Live {
        owner: Pe,
        #[not_covariant]
        dependent: Deps,
    }
);

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("pe", &self.borrow_owner().my_pe())
            .finish()
    }
}

/// Words of one record of the package's own agreement step.
const W: usize = 8;
const OP_ALLOC: u64 = 1;
const OP_FREE: u64 = 2;
const OP_FINALIZE: u64 = 3;
const OP_AGREE: u64 = 4;
/// Record word holding the flags of reclaimable allocations (not compared across PEs).
const MASK: usize = 5;

/// A PE of a world, as the Python package holds it.
#[pyclass(frozen, weakref, module = "rshmem._rshmem")]
pub struct World {
    pub(crate) live: RwLock<Option<Arc<Live>>>,
    pub(crate) reg: Mutex<Registry>,
    /// Symmetric `u64[n_pes * W]`: the records of the agreement step.
    meta: Sym<u64>,
    /// Agreement calls so far (the same count on every PE while they are in step).
    calls: AtomicU64,
    /// One alloc/free/finalize at a time on this PE (they share the agreement records).
    excl: Mutex<()>,
    me: usize,
    n: usize,
    cuda: bool,
    /// This PE's GPU ordinal (CUDA backend).
    ordinal: Option<usize>,
    ended: AtomicBool,
    _count: PeCount,
}

/// PEs of this process whose `World` object exists.
static PES_IN_PROCESS: AtomicUsize = AtomicUsize::new(0);

/// One count in [`PES_IN_PROCESS`] while its `World` exists (over-counting a finalized PE
/// only makes calls release the GIL where they need not).
struct PeCount;

impl PeCount {
    fn new() -> PeCount {
        PES_IN_PROCESS.fetch_add(1, Ordering::Relaxed);
        PeCount
    }
}

impl Drop for PeCount {
    fn drop(&mut self) {
        PES_IN_PROCESS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether this process holds one PE only: then no other PE's thread here needs the GIL to
/// make progress, so a call that only enqueues work on a stream may keep it.
pub(crate) fn only_pe_in_process() -> bool {
    PES_IN_PROCESS.load(Ordering::Relaxed) == 1
}

/// An in-process hub that `n` Python threads join, one PE each (thread mode).
#[pyclass(frozen, module = "rshmem._rshmem")]
pub struct Hub {
    hub: InProcBootstrap,
    config: Config,
}

fn config_from(
    heap_size: Option<usize>,
    timeout: Option<f64>,
    backend: Option<&str>,
) -> PyResult<Config> {
    let mut c = Config::from_env().py()?;
    if let Some(h) = heap_size {
        c = c.heap_size(h);
    }
    if let Some(t) = timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(invalid(format!("timeout {t}: expected seconds > 0")));
        }
        c = c.timeout(Duration::from_secs_f64(t));
    }
    match backend {
        None => {}
        Some("shm") | Some("cpu") => c = c.backend(BackendKind::Shm),
        Some("cuda") => c = c.backend(BackendKind::Cuda),
        Some(b) => return Err(invalid(format!("backend {b:?}: expected 'shm' or 'cuda'"))),
    }
    Ok(c)
}

#[pymethods]
impl Hub {
    /// A hub for `n` thread-PEs.
    #[new]
    #[pyo3(signature = (n, heap_size=None, timeout=None, backend=None))]
    fn new(
        n: usize,
        heap_size: Option<usize>,
        timeout: Option<f64>,
        backend: Option<&str>,
    ) -> PyResult<Hub> {
        let config = config_from(heap_size, timeout, backend)?;
        Ok(Hub {
            hub: InProcBootstrap::new(n, config.timeout).py()?,
            config,
        })
    }

    /// Joins as PE `rank` (collective over the hub's threads; the GIL is released).
    fn join(&self, py: Python<'_>, rank: usize) -> PyResult<World> {
        let config = self.config.clone();
        py.allow_threads(|| {
            let ep = self.hub.join(rank)?;
            World::start(Pe::init(config, Box::new(ep))?)
        })
        .py()
    }
}

impl World {
    /// Sets up the package's per-PE state (collective: allocates the agreement records and
    /// the collectives' scratch).
    fn start(pe: Pe) -> rshmem::Result<World> {
        let (me, n, cuda) = (pe.my_pe(), pe.n_pes(), pe.backend() == BackendKind::Cuda);
        let ordinal = if cuda {
            Some(rshmem::cuda::CudaPe::new(&pe)?.device())
        } else {
            None
        };
        let meta = pe.alloc::<u64>(n * W)?;
        let live = Live::try_new(pe, |pe| -> rshmem::Result<Deps<'_>> {
            Ok(Deps {
                coll: Mutex::new(Coll::new(pe, CollConfig::from_env()?)?),
                gpu: Mutex::new(None),
            })
        })?;
        Ok(World {
            live: RwLock::new(Some(Arc::new(live))),
            reg: Mutex::new(Registry::default()),
            meta,
            calls: AtomicU64::new(0),
            excl: Mutex::new(()),
            me,
            n,
            cuda,
            ordinal,
            ended: AtomicBool::new(false),
            _count: PeCount::new(),
        })
    }

    /// The number of PEs.
    pub(crate) fn world_size(&self) -> usize {
        self.n
    }

    /// Whether the heap is GPU memory.
    pub(crate) fn is_cuda(&self) -> bool {
        self.cuda
    }

    /// Whether finalize has run (or the PE was abandoned).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// This PE's GPU ordinal (CUDA backend), else None.
    pub(crate) fn ordinal(&self) -> Option<usize> {
        self.ordinal
    }

    /// The live PE (read-locked for the duration of a call), or `WorldEnded`.
    pub(crate) fn live(&self) -> rshmem::Result<LiveGuard<'_>> {
        let g = self.live.read().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            return Err(Error::WorldEnded);
        }
        Ok(LiveGuard(g))
    }

    /// Exchanges `rec` with every PE; checks that every PE's words other than the mask are
    /// the same (else `CollectiveMismatch` on every PE, naming the first that differs) and
    /// returns the AND of the masks.
    fn agree(&self, pe: &Pe, rec: [u64; W], show: fn(&[u64]) -> String) -> rshmem::Result<u64> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        for p in 0..self.n {
            pe.put(&self.meta, self.me * W, &rec, p)?;
        }
        pe.barrier_all()?;
        let all = pe.local_vec(&self.meta)?;
        pe.barrier_all()?;
        let mut mask = u64::MAX;
        for (p, row) in all.chunks(W).enumerate() {
            let same = (0..W).all(|i| i == MASK || row[i] == rec[i]);
            if !same {
                return Err(Error::CollectiveMismatch {
                    op: "rshmem (python)",
                    pe: p,
                    mine: show(&rec),
                    theirs: show(row),
                });
            }
            mask &= row[MASK];
        }
        Ok(mask)
    }

    /// Returns to the heap the released allocations that no PE views any more (`mask`, agreed).
    fn reclaim(&self, pe: &Pe, mask: u64) -> rshmem::Result<()> {
        let mut reg = self.reg.lock().unwrap_or_else(|e| e.into_inner());
        let mut keep = Vec::new();
        let zombies = std::mem::take(&mut reg.zombies);
        let mut first_err = Ok(());
        for (i, b) in zombies.into_iter().enumerate() {
            if i >= ZOMBIE_WINDOW || mask & (1 << i) == 0 {
                keep.push(b);
                continue;
            }
            let sym = b.sym.write().unwrap_or_else(|e| e.into_inner()).take();
            reg.remove(b.addr);
            if let Some(s) = sym {
                if let Err(e) = pe.free(s) {
                    first_err = first_err.and(Err(e));
                }
            }
        }
        reg.zombies = keep;
        first_err
    }

    fn mask(&self) -> u64 {
        self.reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reclaimable_mask()
    }

    fn address(&self, pe: &Pe, sym: &Sym<u8>) -> rshmem::Result<u64> {
        if self.cuda {
            rshmem::cuda::CudaPe::new(pe)?.ptr(sym)
        } else {
            Ok(pe.host_ptr(sym, 0, self.me)? as u64)
        }
    }

    /// The address of PE `pe`'s copy of the allocation at this PE's `addr + offset`, where
    /// loads and stores of this PE reach it.
    fn peer_address(
        &self,
        live: &Live,
        block: &Block,
        offset: usize,
        pe: usize,
    ) -> rshmem::Result<u64> {
        let p = live.borrow_owner();
        let g = block.sym.read().unwrap_or_else(|e| e.into_inner());
        let sym = g.as_ref().ok_or(Error::WorldEnded)?;
        if self.cuda {
            rshmem::cuda::CudaPe::new(p)?.peer_ptr(&sym.view::<u8>(offset, 0)?, 0, pe)
        } else {
            Ok(p.host_ptr(sym, offset, pe)? as u64)
        }
    }
}

/// A read-locked live PE.
pub(crate) struct LiveGuard<'a>(RwLockReadGuard<'a, Option<Arc<Live>>>);

impl LiveGuard<'_> {
    pub(crate) fn get(&self) -> &Live {
        // Checked to be Some when the guard was made; the lock keeps it so.
        self.0.as_deref().expect("LiveGuard holds a live PE")
    }
    pub(crate) fn arc(&self) -> Arc<Live> {
        self.0.clone().expect("LiveGuard holds a live PE")
    }
}

fn show_alloc(r: &[u64]) -> String {
    match r[0] {
        OP_ALLOC => format!(
            "alloc #{} of {} bytes (shape/dtype hash {:#x})",
            r[1], r[2], r[3]
        ),
        OP_FREE if r[2] == u64::MAX => format!("free #{} of a tensor not freeable here", r[1]),
        OP_FREE => format!("free #{} of allocation {}", r[1], r[2]),
        OP_FINALIZE => format!("finalize #{}", r[1]),
        OP_AGREE => format!("agreement #{} on {:#x}", r[1], r[2]),
        _ => format!("call #{}", r[1]),
    }
}

#[pymethods]
impl World {
    /// Joins the job described by the environment (`rshmem run`, torchrun, Open MPI), or a
    /// world of one PE without one. The GIL is released.
    #[staticmethod]
    #[pyo3(signature = (heap_size=None, timeout=None, backend=None))]
    fn from_env(
        py: Python<'_>,
        heap_size: Option<usize>,
        timeout: Option<f64>,
        backend: Option<&str>,
    ) -> PyResult<World> {
        let config = config_from(heap_size, timeout, backend)?;
        py.allow_threads(|| World::start(rshmem::Launch::new().config(config).init()?))
            .py()
    }

    /// Joins as `rank` of `size` through rank 0's `address` (`host:port`, or a string from
    /// `unique_id()` made in rank 0's process). The GIL is released.
    #[staticmethod]
    #[pyo3(signature = (address, rank, size, heap_size=None, timeout=None, backend=None))]
    fn connect(
        py: Python<'_>,
        address: String,
        rank: usize,
        size: usize,
        heap_size: Option<usize>,
        timeout: Option<f64>,
        backend: Option<&str>,
    ) -> PyResult<World> {
        let config = config_from(heap_size, timeout, backend)?;
        py.allow_threads(|| {
            let boot = TcpBootstrap::connect(&address, rank, size, config.timeout)?;
            World::start(Pe::init(config, Box::new(boot))?)
        })
        .py()
    }

    #[getter]
    fn my_pe(&self) -> usize {
        self.me
    }
    #[getter]
    fn n_pes(&self) -> usize {
        self.n
    }
    /// "shm" or "cuda".
    #[getter]
    fn backend(&self) -> &'static str {
        if self.cuda {
            "cuda"
        } else {
            "shm"
        }
    }
    /// The GPU ordinal of this PE (CUDA backend), else None.
    #[getter]
    fn device(&self) -> PyResult<Option<usize>> {
        if !self.cuda {
            return Ok(None);
        }
        let l = self.live().py()?;
        Ok(Some(
            rshmem::cuda::CudaPe::new(l.get().borrow_owner())
                .py()?
                .device(),
        ))
    }
    /// (heap bytes per PE, bytes allocated).
    fn heap_usage(&self) -> PyResult<(usize, usize)> {
        Ok(self.live().py()?.get().borrow_owner().heap_usage())
    }
    /// Whether finalize has run (or the PE was abandoned).
    #[getter]
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Collectively allocates `nbytes` (every PE passes the same size and `shape_hash`, a hash
    /// of shape and dtype: a difference is `CollectiveMismatch` on every PE); returns this
    /// PE's address. The GIL is released.
    fn alloc(&self, py: Python<'_>, nbytes: usize, shape_hash: u64) -> PyResult<u64> {
        py.allow_threads(|| -> rshmem::Result<u64> {
            let _one = self.excl.lock().unwrap_or_else(|e| e.into_inner());
            let l = self.live()?;
            let pe = l.get().borrow_owner();
            let calls = self.calls.load(Ordering::Relaxed);
            let mut rec = [OP_ALLOC, calls, nbytes as u64, shape_hash, 0, 0, 0, 0];
            rec[MASK] = self.mask();
            let mask = self.agree(pe, rec, show_alloc)?;
            self.reclaim(pe, mask)?;
            // A zero-byte allocation takes a byte so that every allocation has its own address.
            let sym = pe.alloc_aligned::<u8>(nbytes.max(1), 256)?;
            let addr = self.address(pe, &sym)?;
            let mut reg = self.reg.lock().unwrap_or_else(|e| e.into_inner());
            let seq = reg.next_seq;
            reg.next_seq += 1;
            reg.insert(Arc::new(Block {
                sym: RwLock::new(Some(sym)),
                addr,
                nbytes,
                seq,
                released: AtomicBool::new(false),
                exports: AtomicUsize::new(0),
            }));
            Ok(addr)
        })
        .py()
    }

    /// Collectively releases the allocation starting at `addr` (every PE frees the same one).
    /// Its memory is reused only once no PE has a view of it left. The GIL is released.
    fn free(&self, py: Python<'_>, addr: u64) -> PyResult<()> {
        py.allow_threads(|| -> rshmem::Result<()> {
            let _one = self.excl.lock().unwrap_or_else(|e| e.into_inner());
            let l = self.live()?;
            let pe = l.get().borrow_owner();
            let found = {
                let reg = self.reg.lock().unwrap_or_else(|e| e.into_inner());
                match reg.locate(addr, 0, "the tensor passed to free") {
                    Ok(loc) if loc.offset == 0 => Ok(loc.block),
                    Ok(_) => Err(Error::InvalidArgument(
                        "free takes the tensor rshmem.empty/zeros returned, not a view into it"
                            .into(),
                    )),
                    Err(e) => Err(e),
                }
            };
            let calls = self.calls.load(Ordering::Relaxed);
            let seq = found.as_ref().map_or(u64::MAX, |b| b.seq);
            let mut rec = [OP_FREE, calls, seq, 0, 0, 0, 0, 0];
            rec[MASK] = self.mask();
            let agreed = self.agree(pe, rec, show_alloc);
            let block = found?;
            let mask = agreed?;
            self.reclaim(pe, mask)?;
            block.released.store(true, Ordering::Release);
            self.reg
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .zombies
                .push(block);
            Ok(())
        })
        .py()
    }

    /// Collectively checks that every PE passed the same `value` (e.g. a hash of a call's
    /// shapes); `CollectiveMismatch` on every PE otherwise. The GIL is released.
    fn agree_on(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        py.allow_threads(|| -> rshmem::Result<()> {
            let _one = self.excl.lock().unwrap_or_else(|e| e.into_inner());
            let l = self.live()?;
            let calls = self.calls.load(Ordering::Relaxed);
            self.agree(
                l.get().borrow_owner(),
                [OP_AGREE, calls, value, 0, 0, 0, 0, 0],
                show_alloc,
            )
            .map(|_| ())
        })
        .py()
    }

    /// The largest of every PE's `value` (collective). The GIL is released.
    fn max_of(&self, py: Python<'_>, value: u64) -> PyResult<u64> {
        py.allow_threads(|| -> rshmem::Result<u64> {
            let _one = self.excl.lock().unwrap_or_else(|e| e.into_inner());
            let l = self.live()?;
            let pe = l.get().borrow_owner();
            for p in 0..self.n {
                pe.put(&self.meta, self.me * W, &[value], p)?;
            }
            pe.barrier_all()?;
            let all = pe.local_vec(&self.meta)?;
            pe.barrier_all()?;
            Ok(all.chunks(W).map(|r| r[0]).max().unwrap_or(value))
        })
        .py()
    }

    /// A view of `shape` elements of `typestr` at this PE's `addr`, or of PE `pe`'s copy of
    /// the same bytes where this PE reaches it by loads and stores.
    #[pyo3(signature = (addr, nbytes, shape, typestr, pe=None))]
    fn export(
        &self,
        py: Python<'_>,
        addr: u64,
        nbytes: usize,
        shape: Vec<usize>,
        typestr: &str,
        pe: Option<usize>,
    ) -> PyResult<Export> {
        let l = self.live().py()?;
        let loc = self
            .reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .locate(addr, nbytes, "the tensor")
            .py()?;
        let at = match pe {
            None => addr,
            Some(p) => self.peer_address(l.get(), &loc.block, loc.offset, p).py()?,
        };
        Export::new(py, loc.block, l.arc(), at, shape, typestr, self.cuda)
    }

    /// Whether `[addr, addr + nbytes)` lies inside one live symmetric allocation of this PE.
    pub(crate) fn on_heap(&self, addr: u64, nbytes: usize) -> bool {
        let reg = self.reg.lock().unwrap_or_else(|e| e.into_inner());
        reg.locate(addr, nbytes, "").is_ok()
    }

    /// (address, bytes) of the live allocation holding `[addr, addr + nbytes)`.
    fn block_of(&self, addr: u64, nbytes: usize) -> PyResult<(u64, usize)> {
        let loc = self
            .reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .locate(addr, nbytes, "the tensor")
            .py()?;
        Ok((loc.block.addr, loc.block.nbytes))
    }

    /// Finalizes this PE (collective): quiet, a barrier, the PE is gone. Where any PE still
    /// has array views of the heap, the heaps stay mapped until those views end (the PEs are
    /// then released without the finalize mark, as nothing waits on them any more). The GIL
    /// is released.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| -> rshmem::Result<()> {
            let _one = self.excl.lock().unwrap_or_else(|e| e.into_inner());
            let live = {
                let l = self.live()?;
                let pe = l.get().borrow_owner();
                let views = self
                    .reg
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .has_views();
                let calls = self.calls.load(Ordering::Relaxed);
                // The mask word carries "no views here"; every PE finalizes the same way.
                let rec = [OP_FINALIZE, calls, 0, 0, 0, u64::from(!views), 0, 0];
                let none_anywhere = self.agree(pe, rec, show_alloc)? == 1;
                drop(l);
                let taken = self.live.write().unwrap_or_else(|e| e.into_inner()).take();
                self.ended.store(true, Ordering::Release);
                (taken, none_anywhere)
            };
            match live {
                (Some(arc), true) => match Arc::try_unwrap(arc) {
                    Ok(live) => live.into_owner().finalize(),
                    Err(arc) => {
                        let pe = arc.borrow_owner();
                        pe.quiet().and_then(|_| pe.sync_all())
                    }
                },
                (Some(arc), false) => {
                    let pe = arc.borrow_owner();
                    let r = pe.quiet().and_then(|_| pe.sync_all());
                    drop(arc);
                    r
                }
                (None, _) => Err(Error::WorldEnded),
            }
        })
        .py()
    }

    /// Leaves without finalize (after an exception in the PE's code): peers waiting on this
    /// PE get `PeerLost` instead of matching a barrier it never meant.
    fn abandon(&self) {
        let taken = self.live.write().unwrap_or_else(|e| e.into_inner()).take();
        self.ended.store(true, Ordering::Release);
        drop(taken);
    }
}

/// A unique id for `World.connect`: rank 0's process makes it and hands it to every rank.
#[pyfunction]
pub(crate) fn unique_id() -> PyResult<String> {
    rshmem::unique_id().py()
}

/// Whether the environment says this process belongs to a launched job.
#[pyfunction]
pub(crate) fn launched() -> bool {
    rshmem::launched()
}
