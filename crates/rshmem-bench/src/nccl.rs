//! A tiny run-time binding of NCCL (`libnccl.so.2` or `libnccl.so`), the benchmarks' baseline.
//! Absent library → [`Error::Backend`]; nothing is ever emulated.
//!
//! Hand-written rather than cudarc's `nccl` module (cudarc 0.19, the workspace's): cudarc's
//! dynamic loading looks for `libnccl.so` and `libnccl.so.<CUDA major>` (13, 12, ...), never
//! `libnccl.so.2`, the only name NCCL's runtime packages install (pip `nvidia-nccl-cu*`,
//! Debian's `libnccl2`); and it panics where the library or a symbol is missing, where the
//! benchmarks report the baseline missing with the reason. Its safe layer works on cudarc's
//! own contexts, streams and slices, while the benchmarks hold rshmem streams and symmetric
//! addresses.

use rshmem::cuda::CudaPe;
use rshmem::{Error, Pe, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

/// A CUDA backend error (what NCCL failures and failed data checks are reported as).
pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Backend {
        backend: "cuda",
        msg: msg.into(),
    }
}

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

type Comm = *mut c_void;
type Res = c_int;

/// NCCL data types used here (`ncclDataType_t`).
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
pub enum DataType {
    /// ncclInt8
    I8 = 0,
    /// ncclInt32
    I32 = 2,
    /// ncclFloat16
    F16 = 6,
    /// ncclFloat32
    F32 = 7,
    /// ncclFloat64
    F64 = 8,
    /// ncclBfloat16
    Bf16 = 9,
}

/// ncclSum.
pub const SUM: c_int = 0;

/// The loaded library and its entry points.
pub struct Nccl {
    _lib: libloading::Library,
    /// Which file was loaded.
    pub path: &'static str,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> Res,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Res,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> Res,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("path", &self.path).finish()
    }
}

fn missing(msg: String) -> Error {
    err(format!("NCCL unavailable: {msg}"))
}

impl Nccl {
    /// Loads NCCL; [`Error::Backend`] when neither library name can be loaded.
    pub fn load() -> Result<Nccl> {
        let mut why = Vec::new();
        for path in ["libnccl.so.2", "libnccl.so"] {
            // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => return Self::bind(lib, path),
                Err(e) => why.push(format!("{path}: {e}")),
            }
        }
        Err(missing(why.join("; ")))
    }

    fn bind(lib: libloading::Library, path: &'static str) -> Result<Nccl> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol has the C signature of the field it is stored in (nccl.h).
                let s = unsafe { lib.get($name) }.map_err(|e| missing(format!("{path}: {e}")))?;
                *s
            }};
        }
        Ok(Nccl {
            get_unique_id: sym!(b"ncclGetUniqueId\0"),
            comm_init_rank: sym!(b"ncclCommInitRank\0"),
            comm_destroy: sym!(b"ncclCommDestroy\0"),
            error_string: sym!(b"ncclGetErrorString\0"),
            all_reduce: sym!(b"ncclAllReduce\0"),
            all_gather: sym!(b"ncclAllGather\0"),
            reduce_scatter: sym!(b"ncclReduceScatter\0"),
            broadcast: sym!(b"ncclBroadcast\0"),
            send: sym!(b"ncclSend\0"),
            recv: sym!(b"ncclRecv\0"),
            group_start: sym!(b"ncclGroupStart\0"),
            group_end: sym!(b"ncclGroupEnd\0"),
            _lib: lib,
            path,
        })
    }

    fn check(&self, r: Res, what: &str) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr((self.error_string)(r)) }
            .to_string_lossy()
            .into_owned();
        Err(err(format!("{what} failed: NCCL error {r}: {s}")))
    }

    /// `ncclGetUniqueId`.
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: writes 128 bytes into id.
        self.check(unsafe { (self.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `ncclCommInitRank` (the caller's CUDA context must be current).
    pub fn comm(&self, n: usize, id: UniqueId, rank: usize) -> Result<NcclComm<'_>> {
        let mut c = std::ptr::null_mut();
        // SAFETY: writes one communicator handle; blocks until every rank joined.
        self.check(
            unsafe { (self.comm_init_rank)(&mut c, n as c_int, id, rank as c_int) },
            "ncclCommInitRank",
        )?;
        Ok(NcclComm {
            nccl: self,
            comm: c,
        })
    }
}

/// A communicator, destroyed on drop.
pub struct NcclComm<'a> {
    nccl: &'a Nccl,
    comm: Comm,
}

impl std::fmt::Debug for NcclComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclComm")
    }
}

impl Drop for NcclComm<'_> {
    fn drop(&mut self) {
        // SAFETY: a live communicator, destroyed once.
        unsafe { (self.nccl.comm_destroy)(self.comm) };
    }
}

/// Stream-ordered NCCL calls on raw device addresses. Safety for every method: the addresses
/// are device memory of this communicator's GPU holding the sizes NCCL reads and writes, and
/// `stream` is a live stream of that GPU.
impl NcclComm<'_> {
    /// `ncclAllReduce` (sum).
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn all_reduce(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        t: DataType,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: upheld by the caller.
        let r = unsafe {
            (self.nccl.all_reduce)(
                src as _, dst as _, count, t as c_int, SUM, self.comm, stream,
            )
        };
        self.nccl.check(r, "ncclAllReduce")
    }
    /// `ncclAllGather` (`count` per rank).
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn all_gather(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        t: DataType,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: upheld by the caller.
        let r = unsafe {
            (self.nccl.all_gather)(src as _, dst as _, count, t as c_int, self.comm, stream)
        };
        self.nccl.check(r, "ncclAllGather")
    }
    /// `ncclReduceScatter` (sum, `count` per rank received).
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn reduce_scatter(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        t: DataType,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: upheld by the caller.
        let r = unsafe {
            (self.nccl.reduce_scatter)(
                src as _, dst as _, count, t as c_int, SUM, self.comm, stream,
            )
        };
        self.nccl.check(r, "ncclReduceScatter")
    }
    /// `ncclBroadcast`.
    ///
    /// # Safety
    /// See the impl block.
    pub unsafe fn broadcast(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        t: DataType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: upheld by the caller.
        let r = unsafe {
            (self.nccl.broadcast)(
                src as _,
                dst as _,
                count,
                t as c_int,
                root as c_int,
                self.comm,
                stream,
            )
        };
        self.nccl.check(r, "ncclBroadcast")
    }
    /// All-to-all of `count` elements per pair: grouped `ncclSend`/`ncclRecv` to every rank.
    ///
    /// # Safety
    /// See the impl block.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        es: usize,
        t: DataType,
        n: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        let nc = self.nccl;
        // SAFETY: group calls have no preconditions.
        nc.check(unsafe { (nc.group_start)() }, "ncclGroupStart")?;
        let mut r = Ok(());
        for p in 0..n {
            let off = (p * count * es) as u64;
            // SAFETY: upheld by the caller (p-th block of each buffer).
            let a = unsafe {
                (nc.send)(
                    (src + off) as _,
                    count,
                    t as c_int,
                    p as c_int,
                    self.comm,
                    stream,
                )
            };
            // SAFETY: as above.
            let b = unsafe {
                (nc.recv)(
                    (dst + off) as _,
                    count,
                    t as c_int,
                    p as c_int,
                    self.comm,
                    stream,
                )
            };
            if r.is_ok() {
                r = nc.check(a, "ncclSend").and(nc.check(b, "ncclRecv"));
            }
        }
        // SAFETY: closes the group opened above.
        let e = nc.check(unsafe { (nc.group_end)() }, "ncclGroupEnd");
        r.and(e)
    }
}

/// One point-to-point transfer of a group ([`NcclComm::group_send_recv`]): `bytes` at device
/// address `ptr`, to or from rank `peer`.
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    /// Device address.
    pub ptr: u64,
    /// Bytes (sent as `ncclInt8`).
    pub bytes: usize,
    /// The other rank.
    pub peer: usize,
}

impl NcclComm<'_> {
    /// `ncclSend` of every entry of `sends` and `ncclRecv` of every entry of `recvs`, in one
    /// group (an all-to-all-v when every rank posts one send and one receive per peer with
    /// matching sizes). Entries of 0 bytes are left out (their peers leave out the matching
    /// ones).
    ///
    /// # Safety
    /// See the impl block above (every `ptr` holds `bytes` bytes of this GPU's memory).
    pub unsafe fn group_send_recv(
        &self,
        sends: &[P2p],
        recvs: &[P2p],
        stream: *mut c_void,
    ) -> Result<()> {
        let nc = self.nccl;
        let i8 = DataType::I8 as c_int;
        // SAFETY: group calls have no preconditions.
        nc.check(unsafe { (nc.group_start)() }, "ncclGroupStart")?;
        let mut r = Ok(());
        for p in sends.iter().filter(|p| p.bytes > 0) {
            // SAFETY: upheld by the caller.
            let e =
                unsafe { (nc.send)(p.ptr as _, p.bytes, i8, p.peer as c_int, self.comm, stream) };
            if r.is_ok() {
                r = nc.check(e, "ncclSend");
            }
        }
        for p in recvs.iter().filter(|p| p.bytes > 0) {
            // SAFETY: upheld by the caller.
            let e =
                unsafe { (nc.recv)(p.ptr as _, p.bytes, i8, p.peer as c_int, self.comm, stream) };
            if r.is_ok() {
                r = nc.check(e, "ncclRecv");
            }
        }
        // SAFETY: closes the group opened above.
        let e = nc.check(unsafe { (nc.group_end)() }, "ncclGroupEnd");
        r.and(e)
    }
}

/// An NCCL communicator over the world (rank = PE), made where every PE has NCCL and its own
/// GPU (agreed through a symmetric flag word per PE, so all make one or none). Collective.
/// `Ok((None, why))` when the baseline cannot run (NCCL missing somewhere, or PEs sharing a
/// GPU: NCCL needs one GPU per rank).
pub fn world_comm<'a>(
    pe: &Pe,
    g: &CudaPe<'_>,
    lib: &'a Result<Nccl>,
) -> Result<(Option<NcclComm<'a>>, Option<String>)> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let mut devs = Vec::new();
    for p in 0..n {
        devs.push(g.device_of(p)?);
    }
    // (By ordinal: in process mode with per-process CUDA_VISIBLE_DEVICES this is conservative.)
    let distinct = {
        let mut d = devs.clone();
        d.sort_unstable();
        d.dedup();
        d.len() == n
    };
    let flags = pe.alloc::<u64>(n)?;
    let ok = (lib.is_ok() && distinct) as u64;
    for p in 0..n {
        pe.put(&flags, me, &[ok], p)?;
    }
    pe.barrier_all()?;
    let all_ok = pe.local_vec(&flags)?.iter().all(|&x| x == 1);
    pe.barrier_all()?;
    pe.free(flags)?;
    let note = (!all_ok).then(|| match (lib, distinct) {
        (Err(e), _) => format!("NCCL missing: {e}"),
        (Ok(_), false) => {
            format!("NCCL needs one distinct GPU per rank; the PEs use GPUs {devs:?}")
        }
        _ => "NCCL unavailable on another PE".to_string(),
    });
    let idsym = pe.alloc::<u8>(128)?;
    let comm = match (lib, all_ok) {
        (Ok(nc), true) => (|| {
            if me == 0 {
                let id = nc.unique_id()?;
                pe.local_write(&idsym, 0, &id.0)?;
            }
            pe.barrier_all()?;
            let mut id = [0u8; 128];
            pe.get(&idsym, 0, &mut id, 0)?;
            // ncclCommInitRank joins the current device.
            let _ctx = g.make_current()?;
            nc.comm(n, UniqueId(id), me).map(Some)
        })(),
        _ => pe.barrier_all().map(|_| None),
    };
    pe.barrier_all()?;
    pe.free(idsym)?;
    Ok((comm?, note))
}
