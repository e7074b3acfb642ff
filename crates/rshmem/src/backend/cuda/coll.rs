//! Stream-ordered collectives on the CUDA backend ([`GpuColl`]).
//!
//! The algorithms are the host collectives' plans ([`crate::coll::plan`]), run by a GPU
//! executor: every [`Step::Sync`] becomes a one-block team barrier kernel (monotonically
//! increasing counters in device memory, so a captured graph replays correctly), and the
//! copy or reduce steps between two syncs become one kernel (`kernels/coll.cu`) that reads the
//! peers' symmetric buffers directly through the peer mappings, spread over the GPU's SMs.
//! Data kernels never wait for peers, so PEs that share a GPU cannot deadlock.
//!
//! * **Algorithms.** all_reduce and broadcast: one-shot (every member reads every input;
//!   2 barriers) below [`CollConfig::two_shot_bytes`], two-shot (reduce-scatter then
//!   all-gather, resp. scatter then all-gather; 3 barriers) from there up; overridable with
//!   [`CollConfig`] or `RSHMEM_COLL_ALGO` / `RSHMEM_COLL_TWO_SHOT_BYTES` (see
//!   [`crate::coll`]). Large messages are split over every SM by the kernels (grid-stride, 16-byte
//!   vectors); the plan's host chunking is not used on the GPU.
//! * **Small messages** ([`GpuColl::fused_bytes`], default 64 KiB read per PE, environment
//!   `RSHMEM_CUDA_COLL_FUSED_BYTES`): a plan with a single data phase (one-shot all_reduce,
//!   reduce, reduce_scatter, all_gather, all_to_all, one-shot broadcast, out of place) runs as
//!   one kernel of one block with both barriers inside: one launch instead of three.
//! * **No host synchronisation** inside a collective: launches only, so every collective can
//!   be captured in a CUDA graph ([`Stream::begin_capture`]) and replayed. Staging memory (in-place
//!   one-shot all_reduce, in-place all_to_all) is allocated outside capture; a capture that
//!   would need more than [`GpuColl::reserve`]d is an error.
//!   Capture and instantiate on every PE before any PE launches its graph (as with kernel
//!   loading, the driver may make graph instantiation wait for kernels running on the GPU,
//!   and a launched collective waits for its peers).
//! * **Validation before launch**: lengths against the objects, root inside the team, the
//!   operation against the element type, strided team, stream of this GPU → [`Error`]. What
//!   only the GPU knows (device-side counts of [`GpuColl::all_to_all_v_device`], peers' counts
//!   of [`GpuColl::all_to_all_v`]) is checked on the GPU: a violation copies nothing for the
//!   offending pairs and raises a flag that [`GpuColl::check_errors`] turns into an error.
//! * **Contract** as for [`crate::coll::Coll`]: every member calls the same collectives in the
//!   same order with the same arguments; one stream at a time per [`GpuColl`] and team.
//!
//! Reductions fold in team order; integers wrap; f16/bf16 accumulate in f32 and round once;
//! min/max ignore a NaN operand (minNum/maxNum) — the same bits as the host collectives.

use super::api::{CudaPe, DeviceTeam, Stream};
use super::gpu::{self, DevBuf, Func, Module, RawStream};
use super::{ffi, nvrtc};
use crate::coll::plan::{self, Algo, Buf, CollKind, Plan, Shape, Step};
use crate::coll::{AllToAllV, CollConfig, ReduceOp};
use crate::elem::{Elem, ElemKind};
use crate::error::{Error, Result};
use crate::sym::{AsSym, Sym};
use crate::team::Team;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Copies per copy-kernel launch (`RSHMEMI_COLL_MAX_COPIES`).
const MAX_COPIES: usize = 64;
/// Largest team of the all_to_all_v kernels (`RSHMEMI_A2AV_MAX`).
const A2AV_MAX: usize = 64;
const THREADS: u32 = 512;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CopyDesc {
    dst: u64,
    src: u64,
    bytes: u64,
    pe: i64,
}

#[repr(C)]
struct Copies {
    d: [CopyDesc; MAX_COPIES],
}

#[repr(C)]
struct A2avList {
    count: [u64; A2AV_MAX],
    displ: [u64; A2AV_MAX],
}

const ELEMS: [ElemKind; 12] = [
    ElemKind::I8,
    ElemKind::I16,
    ElemKind::I32,
    ElemKind::I64,
    ElemKind::U8,
    ElemKind::U16,
    ElemKind::U32,
    ElemKind::U64,
    ElemKind::F16,
    ElemKind::Bf16,
    ElemKind::F32,
    ElemKind::F64,
];

fn reduce_name(k: ElemKind, op: ReduceOp) -> String {
    format!("rshmemi_coll_reduce_{}_{}", k.name(), op.name())
}

/// The kernel names of `kernels/coll.cu` (every one is compiled and loaded by [`GpuColl::new`]).
pub fn coll_kernel_names() -> Vec<String> {
    let mut v = vec![
        "rshmemi_coll_copy".to_string(),
        "rshmemi_coll_a2av_dev".to_string(),
        "rshmemi_coll_a2av_meta".to_string(),
        "rshmemi_coll_a2av_host".to_string(),
    ];
    for k in ELEMS {
        for op in ReduceOp::ALL {
            if op.supports(k) {
                v.push(reduce_name(k, op));
            }
        }
    }
    v
}

/// Stream-ordered collectives of one PE on the CUDA backend (see the [module docs](self)).
///
/// ```no_run
/// # fn f(pe: &rshmem::Pe) -> rshmem::Result<()> {
/// use rshmem::coll::{CollConfig, ReduceOp};
/// let g = rshmem::cuda::CudaPe::new(pe)?;
/// let coll = rshmem::cuda::GpuColl::new(g, CollConfig::from_env()?)?; // collective (world)
/// let x = pe.alloc::<f32>(1 << 20)?;
/// let s = g.stream()?;
/// coll.all_reduce(&s, pe.world_team(), &x, &x, 1 << 20, ReduceOp::Sum)?; // in place
/// s.synchronize()?;
/// coll.check_errors()?;
/// # Ok(()) }
/// ```
pub struct GpuColl<'a> {
    g: CudaPe<'a>,
    config: CollConfig,
    _module: Arc<Module>,
    funcs: HashMap<String, Func>,
    f_copy: Func,
    f_a2av_dev: Func,
    f_a2av_meta: Func,
    f_a2av_host: Func,
    /// Staging memory; earlier (smaller) buffers stay alive for graphs that captured them.
    temp: Mutex<Vec<(DevBuf, usize)>>,
    /// Device error record: flags (bit 1: device counts beyond capacity; bit 2: a2av
    /// mismatch), then sender, receiver, needed, capacity of the first capacity violation.
    err: DevBuf,
    /// Symmetric u64[2·64]: this PE's all_to_all_v send counts and displacements (released
    /// with the world: freeing is collective).
    meta: Sym<u64>,
    sms: u32,
    /// Bytes read per PE up to which a one-phase plan runs as one fused kernel.
    fused_bytes: usize,
    /// Private stream for the error record (never the legacy default stream: it must not
    /// interact with other PEs' graph captures on the same GPU).
    own: RawStream,
}

impl std::fmt::Debug for GpuColl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuColl")
            .field("config", &self.config)
            .field("kernels", &self.funcs.len())
            .finish()
    }
}

fn is_capturing(s: &Stream) -> Result<bool> {
    let _g = s.raw.gpu.bind()?;
    let mut st = ffi::cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; writes one status.
    ffi::check(
        unsafe { ffi::cu::cuStreamIsCapturing(s.raw.raw, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(st != ffi::cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

impl<'a> GpuColl<'a> {
    /// Compiles (NVRTC, cached per GPU architecture on disk and per PE in memory) and loads
    /// every collective kernel, allocates a small symmetric object (all_to_all_v metadata,
    /// 1 KiB) and meets the other PEs. Collective over the world: every PE calls it before any
    /// PE launches a collective (loading a module waits for kernels running on the GPU).
    pub fn new(g: CudaPe<'a>, config: CollConfig) -> Result<GpuColl<'a>> {
        let names = coll_kernel_names();
        let k = g.kernel(nvrtc::COLL_KERNELS, &names[0], &[])?;
        let module = k.module.clone();
        let mut funcs = HashMap::new();
        for n in &names {
            funcs.insert(n.clone(), module.func(n)?);
        }
        let b = g.backend();
        let own = RawStream::new(&b.gpu)?;
        let err = DevBuf::zeroed_on(&own, 40)?;
        let meta = g.pe_ref().alloc::<u64>(2 * A2AV_MAX)?;
        g.pe_ref().barrier_all()?;
        Ok(GpuColl {
            f_copy: funcs["rshmemi_coll_copy"],
            f_a2av_dev: funcs["rshmemi_coll_a2av_dev"],
            f_a2av_meta: funcs["rshmemi_coll_a2av_meta"],
            f_a2av_host: funcs["rshmemi_coll_a2av_host"],
            funcs,
            _module: module,
            g,
            config,
            temp: Mutex::new(Vec::new()),
            err,
            meta,
            sms: b.gpu.sms().max(1) as u32,
            fused_bytes: fused_bytes_from_env()?,
            own,
        })
    }

    /// The configuration (algorithm choice).
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// Makes sure `bytes` of staging memory exist (call before capturing an in-place one-shot
    /// all_reduce or in-place all_to_all of that size; calls outside capture grow it on demand).
    pub fn reserve(&self, bytes: usize) -> Result<()> {
        self.temp_addr(None, bytes).map(|_| ())
    }

    fn temp_addr(&self, s: Option<&Stream>, bytes: usize) -> Result<u64> {
        let mut t = self.temp.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((b, cap)) = t.last() {
            if *cap >= bytes {
                return Ok(b.ptr);
            }
        }
        if let Some(s) = s {
            if is_capturing(s)? {
                return Err(Error::invalid(format!(
                    "this collective needs {bytes} bytes of staging memory, more than reserved; \
                     call GpuColl::reserve({bytes}) (or run it once) before capturing"
                )));
            }
        }
        let cap = bytes.next_power_of_two().max(1 << 16);
        let b = DevBuf::zeroed_on(&self.own, cap)?;
        let p = b.ptr;
        t.push((b, cap));
        Ok(p)
    }

    /// Reads and clears the device error flags; call after the stream is synchronised, outside
    /// capture. Device-side count violations become [`Error::Capacity`] (device counts beyond
    /// the objects) or [`Error::InvalidArgument`] (counts that do not pair up); device wait
    /// timeouts become [`Error::Timeout`]. After a device wait of this PE timed out, its
    /// collectives move no data (barriers still run) until this check or [`Pe::quiet`](crate::Pe::quiet) clears
    /// the flag: a PE that gave up on a barrier never overwrites what its peers may still read.
    pub fn check_errors(&self) -> Result<()> {
        self.g.check_device_errors()?;
        let b = self.g.backend();
        let mut v = [0u64; 5];
        let _g = b.gpu.bind()?;
        // SAFETY: 40 bytes of our own error record into a local, on our own stream (then
        // synchronised); cleared the same way.
        unsafe {
            ffi::check(
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    v.as_mut_ptr() as *mut _,
                    self.err.ptr,
                    40,
                    self.own.raw,
                ),
                "cuMemcpyDtoHAsync",
            )?;
            self.own.sync()?;
            if v[0] != 0 {
                ffi::check(
                    ffi::cu::cuMemsetD8Async(self.err.ptr, 0, 40, self.own.raw),
                    "cuMemsetD8Async",
                )?;
                self.own.sync()?;
            }
        }
        let v = v.map(|x| x as usize);
        if v[0] & 1 != 0 {
            return Err(Error::Capacity {
                op: "cuda all_to_all_v (device counts)",
                src_pe: v[1],
                dst_pe: v[2],
                needed: v[3],
                capacity: v[4],
            });
        }
        if v[0] & 2 != 0 {
            return Err(Error::invalid(
                "cuda all_to_all_v: counts or displacements did not pair up between members \
                 or exceeded the objects; nothing was copied for those pairs",
            ));
        }
        Ok(())
    }

    // ----- validation helpers -----

    fn team(&self, s: &Stream, team: &Team) -> Result<DeviceTeam> {
        self.g.check_stream_pub(s)?;
        let dt = self.g.device_team(team)?;
        if team.job != self.g.pe_ref().inner.job {
            return Err(Error::WorldEnded);
        }
        Ok(dt)
    }

    fn buf<T: Elem>(&self, x: &(impl AsSym<T> + ?Sized), need: usize) -> Result<u64> {
        let r = x.raw();
        if need > r.len {
            return Err(Error::OutOfBounds {
                start: 0,
                end: need,
                len: r.len,
            });
        }
        self.g.ptr(x)
    }

    /// `Some(true)`: same object; `Some(false)`: disjoint; error when they partly overlap.
    fn in_place<T: Elem>(
        src: &(impl AsSym<T> + ?Sized),
        dst: &(impl AsSym<T> + ?Sized),
    ) -> Result<bool> {
        let (a, b) = (src.raw(), dst.raw());
        let es = std::mem::size_of::<T>();
        if a.offset == b.offset && a.len == b.len {
            return Ok(true);
        }
        let (a0, a1) = (a.offset, a.offset + a.len * es);
        let (b0, b1) = (b.offset, b.offset + b.len * es);
        if a0 < b1 && b0 < a1 {
            return Err(Error::invalid(
                "src and dst partly overlap (in place means the same object)",
            ));
        }
        Ok(false)
    }

    fn shape(dt: &DeviceTeam, in_place: bool) -> Shape {
        Shape {
            n: dt.size as usize,
            me: dt.my_index as usize,
            in_place,
            chunk: usize::MAX,
        }
    }

    fn reduce_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        op.check(T::KIND)?;
        self.funcs
            .get(&reduce_name(T::KIND, op))
            .copied()
            .ok_or_else(|| Error::invalid("no reduction kernel for this type"))
    }

    // ----- launches -----

    fn sync(&self, s: &Stream, dt: DeviceTeam) -> Result<()> {
        let mut t = dt;
        let mut p = [&mut t as *mut DeviceTeam as *mut std::ffi::c_void];
        let threads = (dt.size as u32).div_ceil(32) * 32;
        // SAFETY: matches rshmemi_team_sync(rshmem_team) (five ints, repr(C)).
        unsafe { gpu::launch(&s.raw, self.g.backend().f_team_sync, 1, threads, 0, &mut p) }
    }

    fn flush(
        &self,
        s: &Stream,
        copies: &mut Vec<CopyDesc>,
        dt: DeviceTeam,
        fused: bool,
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let n = copies.len();
        let max = copies.iter().map(|c| c.bytes).max().unwrap_or(0);
        let per_block = (THREADS as u64) * 64;
        let limit = ((4 * self.sms) as usize / n).max(1) as u64;
        let per = max.div_ceil(per_block).clamp(1, limit) as u32;
        let grid = if fused { 1 } else { n as u32 * per };
        let (mut t, mut fu) = (dt, fused as i32);
        let mut c = Copies {
            d: [CopyDesc::default(); MAX_COPIES],
        };
        c.d[..n].copy_from_slice(copies);
        let mut ni = n as i32;
        let mut p = [
            &mut c as *mut Copies as *mut std::ffi::c_void,
            &mut ni as *mut i32 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut fu as *mut i32 as *mut _,
        ];
        copies.clear();
        // SAFETY: matches rshmemi_coll_copy(rshmemi_copies, int, rshmem_team, int): every
        // descriptor's source is a checked range of a symmetric object (translated on the
        // device) or our staging buffer, its destination a checked range of this PE's memory.
        unsafe { gpu::launch(&s.raw, self.f_copy, grid, THREADS, 0, &mut p) }
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_launch(
        &self,
        s: &Stream,
        f: Func,
        dst: u64,
        src: u64,
        len: usize,
        es: usize,
        dt: DeviceTeam,
        fused: bool,
    ) -> Result<()> {
        let vecs = (len * es / 16 + 1) as u64;
        let blocks = vecs.div_ceil(THREADS as u64).clamp(1, 4 * self.sms as u64) as u32;
        let blocks = if fused { 1 } else { blocks };
        let (mut d, mut sr, mut n, mut t) = (dst, src, len as u64, dt);
        let mut fu = fused as i32;
        let mut p = [
            &mut d as *mut u64 as *mut std::ffi::c_void,
            &mut sr as *mut u64 as *mut _,
            &mut n as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut fu as *mut i32 as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_reduce_*(T*, const T*, u64, rshmem_team, int); ranges
        // checked.
        unsafe { gpu::launch(&s.raw, f, blocks, THREADS, 0, &mut p) }
    }

    /// Runs `plan` on the stream: barriers for syncs, one kernel per phase.
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        plan: &Plan,
        src: u64,
        dst: u64,
        es: usize,
        reduce: Option<Func>,
    ) -> Result<()> {
        let temp = if plan.temp_len > 0 {
            self.temp_addr(Some(s), plan.temp_len * es)?
        } else {
            0
        };
        let addr = |b: Buf, at: usize| -> u64 {
            (match b {
                Buf::Src => src,
                Buf::Dst => dst,
                Buf::Temp => temp,
            }) + (at * es) as u64
        };
        let fused = self.fusable(plan, es);
        let steps = if fused {
            &plan.steps[1..plan.steps.len() - 1]
        } else {
            &plan.steps[..]
        };
        let mut copies = Vec::new();
        for step in steps {
            match *step {
                Step::Sync => {
                    self.flush(s, &mut copies, dt, false)?;
                    self.sync(s, dt)?;
                }
                Step::Copy {
                    peer,
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    if len == 0 {
                        continue;
                    }
                    let pe = if from == Buf::Temp {
                        -1
                    } else {
                        (dt.start as i64) + peer as i64 * dt.stride as i64
                    };
                    copies.push(CopyDesc {
                        dst: addr(to, to_at),
                        src: addr(from, from_at),
                        bytes: (len * es) as u64,
                        pe,
                    });
                    if copies.len() == MAX_COPIES {
                        self.flush(s, &mut copies, dt, fused)?;
                    }
                }
                Step::Reduce {
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    self.flush(s, &mut copies, dt, fused)?;
                    if len > 0 {
                        let f = reduce.ok_or_else(|| Error::invalid("plan reduces without op"))?;
                        self.reduce_launch(
                            s,
                            f,
                            addr(to, to_at),
                            addr(from, from_at),
                            len,
                            es,
                            dt,
                            fused,
                        )?;
                    }
                }
            }
        }
        self.flush(s, &mut copies, dt, fused)
    }

    fn fusable(&self, plan: &Plan, es: usize) -> bool {
        fusable(plan, es, self.fused_bytes)
    }

    /// Bytes read per PE up to which a one-phase collective runs as one fused launch.
    pub fn fused_bytes(&self) -> usize {
        self.fused_bytes
    }

    /// Sets [`GpuColl::fused_bytes`] (0: never fuse).
    pub fn set_fused_bytes(&mut self, bytes: usize) {
        self.fused_bytes = bytes;
    }

    // ----- the collectives -----

    /// Stream-ordered barrier of `team` (earlier work on the stream completes first).
    pub fn barrier(&self, s: &Stream, team: &Team) -> Result<()> {
        let dt = self.team(s, team)?;
        self.sync(s, dt)
    }

    /// `count` elements of member `root`'s `src` into every member's `dst`.
    pub fn broadcast<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        root: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        check_root(root, dt)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let es = std::mem::size_of::<T>();
        let algo = self.config.choose(CollKind::Broadcast, count * es);
        let plan = plan::broadcast(Self::shape(&dt, ip), root, count, algo);
        self.exec(s, dt, &plan, sr, d, es, None)
    }

    /// The fold of every member's `src[..count]` into member `root`'s `dst[..count]`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        check_root(root, dt)?;
        let f = self.reduce_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let plan = plan::reduce(Self::shape(&dt, ip), root, count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), Some(f))
    }

    /// The fold of every member's `src[..count]` into every member's `dst[..count]`.
    pub fn all_reduce<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let algo = self.config.choose(CollKind::AllReduce, count * es);
        self.all_reduce_with(s, team, dst, src, count, op, algo)
    }

    /// [`GpuColl::all_reduce`] with a forced algorithm.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_with<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        algo: Algo,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let f = self.reduce_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let plan = plan::all_reduce(Self::shape(&dt, ip), count, algo);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), Some(f))
    }

    /// Member j's `src[..count]` into every member's `dst[j·count..]` (in place: the input is
    /// already at `dst[me·count..]`).
    pub fn all_gather<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, if ip { mul(n, count)? } else { count })?;
        let plan = plan::all_gather(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), None)
    }

    /// The fold of every member's `src[k·count..]` into member k's `dst[..count]` (in place:
    /// into `dst[k·count..]`).
    pub fn reduce_scatter<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let f = self.reduce_func::<T>(op)?;
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let d = self.buf(dst, if ip { mul(n, count)? } else { count })?;
        let plan = plan::reduce_scatter(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), Some(f))
    }

    /// Member j's `src[k·count..]` into member k's `dst[j·count..]`.
    pub fn all_to_all<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        let ip = Self::in_place(src, dst)?;
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let plan = plan::all_to_all(Self::shape(&dt, ip), count);
        self.exec(s, dt, &plan, sr, d, std::mem::size_of::<T>(), None)
    }

    /// All-to-all with per-pair counts and displacements known on the host (see
    /// [`AllToAllV`]; the arrays are baked into the launches, so a captured graph replays them).
    /// Own ranges are checked here; whether the members' counts pair up is checked on the GPU
    /// (a mismatch copies nothing for that pair; [`GpuColl::check_errors`] reports it).
    /// `src` and `dst` must be different objects.
    pub fn all_to_all_v<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        v: &AllToAllV<'_>,
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        check_a2av_team(n)?;
        if Self::in_place(src, dst)? {
            return Err(Error::invalid(
                "cuda all_to_all_v: src and dst must be different objects",
            ));
        }
        let (sl, dl) = (src.raw().len, dst.raw().len);
        v.check(n, sl, dl)?;
        let sr = self.g.ptr(src)?;
        let d = self.g.ptr(dst)?;
        let mp = self.g.ptr(&self.meta)?;
        let list = |c: &[usize], d: &[usize]| {
            let mut l = A2avList {
                count: [0; A2AV_MAX],
                displ: [0; A2AV_MAX],
            };
            for i in 0..n {
                l.count[i] = c[i] as u64;
                l.displ[i] = d[i] as u64;
            }
            l
        };
        let mut send = list(v.send_counts, v.send_displs);
        let mut recv = list(v.recv_counts, v.recv_displs);
        // The previous all_to_all_v's readers of `meta` finished at its closing barrier.
        let (mut m, mut ni) = (mp, n as i32);
        let mut p = [
            &mut m as *mut u64 as *mut std::ffi::c_void,
            &mut send as *mut A2avList as *mut _,
            &mut ni as *mut i32 as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_a2av_meta(u64*, rshmemi_a2av_list, int); meta holds 128 words.
        unsafe { gpu::launch(&s.raw, self.f_a2av_meta, 1, 64, 0, &mut p)? };
        self.sync(s, dt)?;
        let es = std::mem::size_of::<T>() as u64;
        let max = v.recv_counts.iter().max().copied().unwrap_or(0) as u64 * es;
        let per = self.per(max, n);
        let (mut dd, mut ss, mut mm, mut e) = (d, sr, mp, self.err.ptr);
        let (mut el, mut sc, mut dc, mut t) = (es, sl as u64, dl as u64, dt);
        let mut p = [
            &mut dd as *mut u64 as *mut std::ffi::c_void,
            &mut ss as *mut u64 as *mut _,
            &mut mm as *mut u64 as *mut _,
            &mut recv as *mut A2avList as *mut _,
            &mut e as *mut u64 as *mut _,
            &mut el as *mut u64 as *mut _,
            &mut sc as *mut u64 as *mut _,
            &mut dc as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_a2av_host; the kernel bounds every copy by src/dst lengths.
        unsafe { gpu::launch(&s.raw, self.f_a2av_host, n as u32 * per, THREADS, 0, &mut p)? };
        self.sync(s, dt)
    }

    fn per(&self, max_bytes: u64, n: usize) -> u32 {
        let limit = ((4 * self.sms) as usize / n.max(1)).max(1) as u64;
        max_bytes.div_ceil(THREADS as u64 * 64).clamp(1, limit) as u32
    }

    /// All-to-all with counts known only on the GPU: member j sends `send_counts[k]` (this
    /// PE's copy of the symmetric `send_counts`, ≥ team-size u64 words, written by earlier
    /// stream work) elements to member k, packed in member order from `src[0]`; member k
    /// receives them packed in member order from `dst[0]` and gets the per-sender counts in its
    /// `recv_counts` (≥ team-size words). The counts are exchanged on the device (each member
    /// reads every member's counts after a barrier), so the call captures into a graph; the
    /// capacity bound is the objects' lengths. If any sender's total exceeds `src`'s length or
    /// any receiver's total exceeds `dst`'s, every member copies nothing, writes the counts it
    /// saw to `recv_counts`, and raises a device flag: [`GpuColl::check_errors`] (after a
    /// synchronize, outside capture) returns [`Error::Capacity`]. Never an out-of-bounds write.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v_device<T: Elem>(
        &self,
        s: &Stream,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        send_counts: &(impl AsSym<u64> + ?Sized),
        recv_counts: &(impl AsSym<u64> + ?Sized),
    ) -> Result<()> {
        let dt = self.team(s, team)?;
        let n = dt.size as usize;
        check_a2av_team(n)?;
        if Self::in_place(src, dst)? {
            return Err(Error::invalid(
                "cuda all_to_all_v_device: src and dst must be different objects",
            ));
        }
        let c = self.buf(send_counts, n)?;
        let rc = self.buf(recv_counts, n)?;
        let (sl, dl) = (src.raw().len, dst.raw().len);
        let (sr, d) = (self.g.ptr(src)?, self.g.ptr(dst)?);
        self.sync(s, dt)?;
        let es = std::mem::size_of::<T>() as u64;
        // Sizes are unknown on the host: spread the capacity's worth over the grid.
        let per = self.per(dl as u64 * es / n as u64, n);
        let (mut dd, mut ss, mut cc, mut rr, mut e) = (d, sr, c, rc, self.err.ptr);
        let (mut el, mut sc, mut dc, mut t) = (es, sl as u64, dl as u64, dt);
        let mut p = [
            &mut dd as *mut u64 as *mut std::ffi::c_void,
            &mut ss as *mut u64 as *mut _,
            &mut cc as *mut u64 as *mut _,
            &mut rr as *mut u64 as *mut _,
            &mut e as *mut u64 as *mut _,
            &mut el as *mut u64 as *mut _,
            &mut sc as *mut u64 as *mut _,
            &mut dc as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_a2av_dev; the kernel checks every count against the
        // lengths passed before it copies.
        unsafe { gpu::launch(&s.raw, self.f_a2av_dev, n as u32 * per, THREADS, 0, &mut p)? };
        self.sync(s, dt)
    }
}

/// True for a plan `Sync, (copies | one reduce), Sync` that reads something and at most
/// `limit` bytes and uses no staging: it runs as one kernel of one block with the barriers
/// inside. Every member runs exactly two barriers either way, so members may differ.
fn fusable(plan: &Plan, es: usize, limit: usize) -> bool {
    let st = &plan.steps;
    if plan.temp_len > 0 || st.len() < 3 || st[0] != Step::Sync || st[st.len() - 1] != Step::Sync {
        return false;
    }
    let (mut bytes, mut copies, mut reduces) = (0usize, 0, 0);
    for x in &st[1..st.len() - 1] {
        match *x {
            Step::Sync => return false,
            Step::Copy { len, .. } => {
                copies += 1;
                bytes = bytes.saturating_add(len.saturating_mul(es));
            }
            Step::Reduce { len, .. } => {
                reduces += 1;
                bytes = bytes.saturating_add(len.saturating_mul(es * plan.shape.n));
            }
        }
    }
    let shape_ok = (reduces == 0 && copies <= MAX_COPIES) || (reduces == 1 && copies == 0);
    shape_ok && bytes > 0 && bytes <= limit
}

/// Default of [`GpuColl::fused_bytes`].
pub const COLL_FUSED_BYTES: usize = 64 << 10;

fn fused_bytes_from_env() -> Result<usize> {
    match std::env::var("RSHMEM_CUDA_COLL_FUSED_BYTES") {
        Ok(v) if !v.trim().is_empty() => crate::config::parse_size(v.trim()).ok_or_else(|| {
            Error::invalid(format!(
                "RSHMEM_CUDA_COLL_FUSED_BYTES={v:?}: expected a size like 64K"
            ))
        }),
        _ => Ok(COLL_FUSED_BYTES),
    }
}

fn mul(n: usize, count: usize) -> Result<usize> {
    n.checked_mul(count)
        .ok_or_else(|| Error::invalid("count times team size overflows"))
}

fn check_root(root: usize, dt: DeviceTeam) -> Result<()> {
    if root >= dt.size as usize {
        return Err(Error::PeOutOfRange {
            pe: root,
            n_pes: dt.size as usize,
            what: "team",
        });
    }
    Ok(())
}

fn check_a2av_team(n: usize) -> Result<()> {
    if n > A2AV_MAX {
        return Err(Error::invalid(format!(
            "cuda all_to_all_v supports teams of at most {A2AV_MAX} members"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize, me: usize, in_place: bool) -> Shape {
        Shape {
            n,
            me,
            in_place,
            chunk: usize::MAX,
        }
    }

    #[test]
    fn which_plans_fuse() {
        let lim = COLL_FUSED_BYTES;
        // one-shot all_reduce out of place: 4 members × 1000 f32 = 16 000 bytes read
        let p = plan::all_reduce(shape(4, 1, false), 1000, Algo::OneShot);
        assert!(fusable(&p, 4, lim));
        assert!(!fusable(&p, 4, 15_999));
        assert!(!fusable(&p, 4, 0));
        // in place one-shot stages in Temp; two-shot has three syncs
        assert!(!fusable(
            &plan::all_reduce(shape(4, 1, true), 10, Algo::OneShot),
            4,
            lim
        ));
        assert!(!fusable(
            &plan::all_reduce(shape(4, 1, false), 10, Algo::TwoShot),
            4,
            lim
        ));
        // all_to_all / all_gather out of place fuse, in-place all_to_all does not
        assert!(fusable(&plan::all_to_all(shape(3, 2, false), 10), 8, lim));
        assert!(!fusable(&plan::all_to_all(shape(3, 2, true), 10), 8, lim));
        assert!(fusable(&plan::all_gather(shape(3, 0, true), 10), 8, lim));
        // reduce: the root fuses, the others have nothing between their two syncs
        assert!(fusable(&plan::reduce(shape(3, 1, false), 1, 10), 8, lim));
        assert!(!fusable(&plan::reduce(shape(3, 0, false), 1, 10), 8, lim));
        // nothing to move: not fused (the barriers still run as kernels)
        assert!(!fusable(&plan::all_gather(shape(3, 0, false), 0), 8, lim));
        // every plan keeps two or more syncs, so fused and unfused members agree
        for p in [
            plan::reduce(shape(3, 0, false), 1, 10),
            plan::broadcast(shape(3, 0, false), 1, 10, Algo::OneShot),
        ] {
            assert!(p.syncs() >= 2);
        }
    }

    #[test]
    fn kernel_names_cover_every_type_and_op() {
        let names = coll_kernel_names();
        assert_eq!(names.len(), 4 + 8 * 7 + 4 * 4);
        assert!(names.contains(&"rshmemi_coll_reduce_bfloat16_max".to_string()));
        assert!(names.contains(&"rshmemi_coll_reduce_uint8_xor".to_string()));
        assert!(!names.contains(&"rshmemi_coll_reduce_float_xor".to_string()));
    }
}
