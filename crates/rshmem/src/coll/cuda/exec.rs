//! The GPU executor of the collectives' plans (barrier, copy and reduce kernels), the staging
//! memory, the error record, and the size limits that choose between paths.

use super::*;

impl GpuColl<'_> {
    /// The configuration (algorithm choice).
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// Makes sure `bytes` of staging memory exist (call before capturing an in-place one-shot
    /// all_reduce or in-place all_to_all of that size; calls outside capture grow it on demand,
    /// but best before the first collective: see the [`GpuColl`] docs). 64 KiB exist from
    /// [`GpuColl::new`].
    pub fn reserve(&self, bytes: usize) -> Result<()> {
        self.temp_addr(None, bytes).map(|_| ())
    }

    pub(super) fn temp_addr(&self, s: Option<&Stream>, bytes: usize) -> Result<u64> {
        let mut t = self.temp.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((b, cap)) = t.last() {
            if *cap >= bytes {
                return Ok(b.ptr);
            }
        }
        if let Some(s) = s {
            if s.is_capturing()? {
                return Err(Error::invalid(format!(
                    "this collective needs {bytes} bytes of staging memory, more than reserved; \
                     call GpuColl::reserve({bytes}) (or run it once) before capturing"
                )));
            }
        }
        let cap = bytes.next_power_of_two().max(MIN_STAGING);
        let b = DevBuf::zeroed_on(&self.own, cap)?;
        let p = b.ptr;
        t.push((b, cap));
        Ok(p)
    }

    /// Reads and clears the device error flags; call after the stream is synchronised, outside
    /// capture. Members whose calls differ (the signatures their first barriers carried)
    /// become [`Error::CollectiveMismatch`] naming the first differing member and both calls
    /// (reported in preference to the others; those calls moved no data on any member).
    /// Device-side count violations become [`Error::Capacity`] (device counts beyond
    /// the objects) or [`Error::InvalidArgument`] (counts that do not pair up); device wait
    /// timeouts become [`Error::Timeout`]. After a device wait of this PE timed out, its
    /// collectives move no data (barriers still run) until this check or [`Pe::quiet`](crate::Pe::quiet) clears
    /// the flag: a PE that gave up on a barrier never overwrites what its peers may still read.
    ///
    /// In a world spanning nodes, a call that ended in an error while a PE was lost (a node
    /// killed: the proxy failed a request to it, or a wait for it gave up) is
    /// [`Error::PeerLost`] naming the lost PE.
    pub fn check_errors(&self) -> Result<()> {
        let r = self.take_errors();
        if r.is_err() && self.net.is_some() {
            let inner = &self.g.pe_ref().inner;
            inner.check_all_peers("cuda collective")?;
            if let Err(Error::Timeout { pe: Some(p), .. }) = r {
                if self.g.backend().is_remote(p) {
                    // A wait for a PE of another node gave up (or the proxy failed a request to
                    // it): the monitor establishes within its probe of the PE's header whether
                    // it is lost, the cause to report then.
                    let until = std::time::Instant::now()
                        + crate::world::HEADER_PROBE
                        + std::time::Duration::from_millis(100);
                    while std::time::Instant::now() < until {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        inner.check_all_peers("cuda collective")?;
                    }
                }
            }
        }
        r
    }

    fn take_errors(&self) -> Result<()> {
        // The device timeout flag is read (and cleared) after the record: a mismatch, which
        // makes members pad their barriers, is the cause to report before any timeout.
        let timeout = self.g.check_device_errors();
        let b = self.g.backend();
        let mut w = [0u64; ERR_SKIP];
        let bytes = ERR_SKIP * 8;
        let _g = b.gpu.bind()?;
        // SAFETY: the record proper (the skip flags stay) of our own error record into a
        // local, on our own stream (then synchronised); cleared the same way.
        unsafe {
            ffi::check(
                ffi::cu::cuMemcpyDtoHAsync_v2(
                    w.as_mut_ptr() as *mut _,
                    self.err.ptr,
                    bytes,
                    self.own.raw,
                ),
                "cuMemcpyDtoHAsync",
            )?;
            self.own.sync()?;
            if w[0] != 0 {
                ffi::check(
                    ffi::cu::cuMemsetD8Async(self.err.ptr, 0, bytes, self.own.raw),
                    "cuMemsetD8Async",
                )?;
                self.own.sync()?;
            }
        }
        if let Some(e) = mismatch_error(&w) {
            return Err(e);
        }
        timeout?;
        let v = [w[0], w[1], w[2], w[3], w[4]].map(|x| x as usize);
        if w[0] & ERR_CAPACITY != 0 {
            return Err(Error::Capacity {
                op: "cuda all_to_all_v (device counts)",
                src_pe: v[1],
                dst_pe: v[2],
                needed: v[3],
                capacity: v[4],
            });
        }
        if w[0] & ERR_A2AV != 0 {
            return Err(Error::invalid(
                "cuda all_to_all_v: counts or displacements did not pair up between members \
                 or exceeded the objects; nothing was copied for those pairs",
            ));
        }
        Ok(())
    }

    // ----- validation helpers -----

    pub(super) fn team(&self, s: &Stream, team: &Team) -> Result<DeviceTeam> {
        self.g.check_stream_pub(s)?;
        self.g.device_team(team)
    }

    pub(super) fn buf<T: Elem>(&self, x: &(impl AsSym<T> + ?Sized), need: usize) -> Result<u64> {
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
    pub(super) fn in_place<T: Elem>(
        src: &(impl AsSym<T> + ?Sized),
        dst: &(impl AsSym<T> + ?Sized),
    ) -> Result<bool> {
        let (a, b) = (src.raw(), dst.raw());
        if a.offset == b.offset && a.len == b.len {
            return Ok(true);
        }
        if a.overlaps(&b, std::mem::size_of::<T>()) {
            return Err(Error::invalid(
                "src and dst partly overlap (in place means the same object)",
            ));
        }
        Ok(false)
    }

    pub(super) fn shape(dt: &DeviceTeam, in_place: bool) -> Shape {
        Shape {
            n: dt.size as usize,
            me: dt.my_index as usize,
            in_place,
            chunk: usize::MAX,
        }
    }

    /// The LL all_reduce kernel of `T` and `op` (checked by [`GpuColl::reduce_func`] first).
    pub(super) fn ll_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        self.typed[typed_index(T::KIND, op)][1]
            .ok_or_else(|| Error::invalid("no LL kernel for this type"))
    }

    /// The pull all_reduce kernel of `T` and `op` (checked by [`GpuColl::reduce_func`] first).
    pub(super) fn pull_ar_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        self.typed[typed_index(T::KIND, op)][2]
            .ok_or_else(|| Error::invalid("no pull all_reduce kernel for this type"))
    }

    pub(super) fn reduce_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        op.check(T::KIND)?;
        self.typed[typed_index(T::KIND, op)][0]
            .ok_or_else(|| Error::invalid("no reduction kernel for this type"))
    }

    // ----- launches -----

    pub(super) fn sync(&self, s: &Stream, dt: DeviceTeam) -> Result<()> {
        let mut t = dt;
        let mut p = [&mut t as *mut DeviceTeam as *mut std::ffi::c_void];
        let threads = dt.sync_threads();
        // SAFETY: matches rshmemi_team_sync(rshmem_team) (five ints, repr(C)).
        unsafe { gpu::launch(&s.raw, self.g.backend().f_team_sync, 1, threads, 0, &mut p) }
    }

    /// The check argument of a call on `dt` with signature `sig` (default: data kernels that
    /// only read the skip flag).
    pub(super) fn check(&self, dt: DeviceTeam, sig: [u64; SIG_WORDS]) -> Result<Check> {
        let row = (dt.slot as usize) * self.n_pes * SIG_WORDS * 8;
        Ok(Check {
            sig,
            slots: self.g.ptr(&self.sigs)? + row as u64,
            err: self.err.ptr,
        })
    }

    /// The first barrier of a call: carries and checks the signature (`rshmemi_coll_sync_sig`).
    pub(super) fn sig_sync(&self, s: &Stream, dt: DeviceTeam, ck: Check) -> Result<()> {
        let (mut t, mut c) = (dt, ck);
        let mut p = [
            &mut t as *mut DeviceTeam as *mut std::ffi::c_void,
            &mut c as *mut Check as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_sync_sig(rshmem_team, rshmemi_check) (repr(C)); the
        // slot row is ours (symmetric, n_pes × SIG_WORDS words), err our record.
        unsafe { gpu::launch(&s.raw, self.f_sync_sig, 1, dt.sync_threads(), 0, &mut p) }
    }

    pub(super) fn flush(
        &self,
        s: &Stream,
        copies: &mut Vec<CopyDesc>,
        dt: DeviceTeam,
        fused: bool,
        ck: Check,
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let n = copies.len();
        let max = copies.iter().map(|c| c.bytes).max().unwrap_or(0);
        let grid = if fused {
            1
        } else {
            copy_grid(n, max, self.sms)
        };
        let (mut t, mut fu, mut k) = (dt, fused as i32, ck);
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
            &mut k as *mut Check as *mut _,
        ];
        copies.clear();
        // SAFETY: matches rshmemi_coll_copy(rshmemi_copies, int, rshmem_team, int,
        // rshmemi_check): every
        // descriptor's source is a checked range of a symmetric object (translated on the
        // device) or our staging buffer, its destination a checked range of this PE's memory.
        unsafe { gpu::launch(&s.raw, self.f_copy, grid, THREADS, 0, &mut p) }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_launch(
        &self,
        s: &Stream,
        f: Func,
        dst: u64,
        src: u64,
        len: usize,
        es: usize,
        dt: DeviceTeam,
        fused: bool,
        ck: Check,
    ) -> Result<()> {
        let blocks = if fused {
            1
        } else {
            reduce_grid(len * es, self.sms)
        };
        let (mut d, mut sr, mut n, mut t) = (dst, src, len as u64, dt);
        let (mut fu, mut k) = (fused as i32, ck);
        let mut p = [
            &mut d as *mut u64 as *mut std::ffi::c_void,
            &mut sr as *mut u64 as *mut _,
            &mut n as *mut u64 as *mut _,
            &mut t as *mut DeviceTeam as *mut _,
            &mut fu as *mut i32 as *mut _,
            &mut k as *mut Check as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_reduce_*(T*, const T*, u64, rshmem_team, int,
        // rshmemi_check); ranges checked.
        unsafe { gpu::launch(&s.raw, f, blocks, THREADS, 0, &mut p) }
    }

    /// Runs `plan` on the stream: barriers for syncs (the first carries `sig`), one kernel per
    /// phase.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn exec(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        plan: &Plan,
        src: u64,
        dst: u64,
        es: usize,
        reduce: Option<Func>,
        sig: CallSig,
    ) -> Result<()> {
        if !plan.groups.is_empty() {
            // Hierarchical plans are for teams spanning nodes, which GPU heaps do not reach.
            return Err(Error::invalid(
                "internal: hierarchical collective plans run on the host executor only",
            ));
        }
        if plan.steps.first() != Some(&Step::Sync) || plan.syncs() < 2 {
            return Err(Error::invalid(
                "internal: a collective plan must start with a barrier and have two",
            ));
        }
        let ck = self.check(
            dt,
            CallSig {
                syncs: plan.syncs(),
                ..sig
            }
            .pack()?,
        )?;
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
        let mut first = true;
        for step in steps {
            match *step {
                Step::Sync => {
                    self.flush(s, &mut copies, dt, false, ck)?;
                    if std::mem::take(&mut first) {
                        self.sig_sync(s, dt, ck)?;
                    } else {
                        self.sync(s, dt)?;
                    }
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
                        self.flush(s, &mut copies, dt, fused, ck)?;
                    }
                }
                Step::Reduce {
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    self.flush(s, &mut copies, dt, fused, ck)?;
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
                            ck,
                        )?;
                    }
                }
                Step::ReduceGroup { .. } => {
                    return Err(Error::invalid(
                        "internal: hierarchical collective plans run on the host executor only",
                    ))
                }
            }
        }
        self.flush(s, &mut copies, dt, fused, ck)
    }

    pub(super) fn fusable(&self, plan: &Plan, es: usize) -> bool {
        fusable(plan, es, self.tuning.fused_bytes)
    }

    /// The tuning this [`GpuColl`] runs with (its LL sizes resolved).
    pub fn tuning(&self) -> &CollTuning {
        &self.tuning
    }

    /// Changes the size limits and grids of later calls: `f` edits a copy of
    /// [`GpuColl::tuning`], which is checked and applied. What the constructor sized memory or
    /// compiled kernels for (the LL sizes, `ll_threads`, `ll_ctrl_lines`, `early_launch`,
    /// `nvrtc_options`) cannot change: an error, and nothing changes. Every member of a team
    /// must run its calls with the same values (a call that runs another way on one member is
    /// reported as a mismatch).
    pub fn retune(&mut self, f: impl FnOnce(&mut CollTuning)) -> Result<()> {
        let mut t = self.tuning.clone();
        f(&mut t);
        t.check()?;
        let fixed = |x: &CollTuning| {
            (
                x.ll_all_reduce,
                x.ll_all_to_all,
                x.ll_threads,
                x.ll_ctrl_lines,
                x.early_launch,
                x.nvrtc_options.clone(),
                x.net_chunk_bytes,
            )
        };
        if fixed(&t) != fixed(&self.tuning) {
            return Err(Error::invalid(
                "GpuColl::retune: the LL sizes, ll_threads, ll_ctrl_lines, early_launch, \
                 nvrtc_options and net_chunk_bytes are fixed when the GpuColl is created",
            ));
        }
        self.tuning = t;
        Ok(())
    }

    /// Members per [`GpuColl::all_to_all_v`] list launch, 1 to 64 (the default, and the most
    /// a launch's arguments hold): smaller values only add launches. For tests, which cover
    /// several chunks with small teams this way.
    #[doc(hidden)]
    pub fn set_a2av_chunk(&mut self, members: usize) -> Result<()> {
        if !(1..=A2AV_CHUNK).contains(&members) {
            return Err(Error::invalid(format!(
                "all_to_all_v chunk of {members} members: 1 to {A2AV_CHUNK}"
            )));
        }
        self.a2av_chunk = members;
        Ok(())
    }

    /// Entries per list of a cross-node round launch (partners of a call; puts, waits and
    /// acknowledgements of a round), 1 to 64 (the default, and the most a launch's arguments
    /// hold): longer lists take several launches. For tests, which split small teams' calls
    /// this way.
    #[doc(hidden)]
    pub fn set_net_list(&mut self, entries: usize) -> Result<()> {
        if !(1..=super::net::NET_MAX).contains(&entries) {
            return Err(Error::invalid(format!(
                "cross-node list of {entries} entries: 1 to {}",
                super::net::NET_MAX
            )));
        }
        self.net_list = entries;
        Ok(())
    }

    /// The largest team [`GpuColl::all_to_all_v_device`] serves on this GPU.
    pub fn all_to_all_v_device_max_team(&self) -> usize {
        self.a2av_dev_max
    }

    /// Launches `rshmemi_coll_a2av_dev` on `dt` (arguments checked by the caller); `net`: the
    /// rows, row stride and plan of a team spanning nodes (zeros on one node).
    pub(super) fn a2av_dev_launch<T: Elem>(
        &self,
        s: &Stream,
        dt: DeviceTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        counts: DeviceCounts<'_>,
        net: [u64; 3],
    ) -> Result<()> {
        let n = dt.size as usize;
        let c = self.buf(counts.send, n)?;
        let rc = self.buf(counts.recv, n)?;
        let (sl, dl) = (src.raw().len, dst.raw().len);
        let (sr, d) = (self.g.ptr(src)?, self.g.ptr(dst)?);
        let es = std::mem::size_of::<T>() as u64;
        // Sizes are unknown on the host: spread the capacity's worth over the grid.
        let per = self.per(dl as u64 * es / n as u64, n);
        let (mut dd, mut ss, mut cc, mut rr, mut e) = (d, sr, c, rc, self.err.ptr);
        let (mut el, mut sc, mut dc, mut t) = (es, sl as u64, dl as u64, dt);
        let [mut rows, mut stride, mut plan] = net;
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
            &mut rows as *mut u64 as *mut _,
            &mut stride as *mut u64 as *mut _,
            &mut plan as *mut u64 as *mut _,
        ];
        let shmem = (n * n * 8) as u32;
        // SAFETY: matches rshmemi_coll_a2av_dev; the kernel checks every count against the
        // lengths passed before it copies; n² words of shared memory fit (n <= a2av_dev_max,
        // checked by the caller); `rows` holds a row of `stride` >= n words per world PE and
        // `plan` 3 words per world PE (net.rs), or both are 0.
        unsafe {
            gpu::launch(
                &s.raw,
                self.f_a2av_dev,
                n as u32 * per,
                THREADS,
                shmem,
                &mut p,
            )
        }
    }
}

/// True for a plan `Sync, (copies | one reduce), Sync` that reads something and at most
/// `limit` bytes and uses no staging: it runs as one kernel of one block with the barriers
/// inside. Every member runs exactly two barriers either way, so members may differ.
pub(super) fn fusable(plan: &Plan, es: usize, limit: usize) -> bool {
    let st = &plan.steps;
    if plan.temp_len > 0 || st.len() < 3 || st[0] != Step::Sync || st[st.len() - 1] != Step::Sync {
        return false;
    }
    let (mut bytes, mut copies, mut reduces) = (0usize, 0, 0);
    for x in &st[1..st.len() - 1] {
        match *x {
            Step::Sync | Step::ReduceGroup { .. } => return false,
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

/// Dynamic shared memory a block may use without opting in (48 KiB less 1 KiB kept for the
/// kernel's static shared memory).
pub(super) const SHARED_DEFAULT: usize = (48 << 10) - 1024;

/// Prepares `rshmemi_coll_a2av_dev`'s dynamic shared memory (the team's count matrix, n² words)
/// for teams up to the world's size where the GPU allows; returns the largest team it serves.
pub(super) fn a2av_dev_shared(gpu: &gpu::Gpu, f: Func, n_pes: usize) -> Result<usize> {
    let optin = gpu
        .attr(ffi::cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    let (want, max) = a2av_dev_limit(optin, n_pes);
    if want > SHARED_DEFAULT {
        let _g = gpu.bind()?;
        // SAFETY: a loaded function of this GPU's context; raises its dynamic shared memory
        // limit within what the device allows.
        ffi::check(
            unsafe {
                ffi::cu::cuFuncSetAttribute(
                    f.0,
                    ffi::cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    want as i32,
                )
            },
            "cuFuncSetAttribute",
        )?;
    }
    Ok(max)
}

/// For a device opt-in limit (`optin` bytes, −1 unknown) and a world of `n_pes`: the dynamic
/// shared memory to allow `rshmemi_coll_a2av_dev` (bytes) and the largest team it then serves.
pub(super) fn a2av_dev_limit(optin: i32, n_pes: usize) -> (usize, usize) {
    let avail = usize::try_from(optin)
        .map_or(0, |x| x.saturating_sub(1024))
        .max(SHARED_DEFAULT);
    let want = n_pes.saturating_mul(n_pes).saturating_mul(8).min(avail);
    let words = want.max(SHARED_DEFAULT) / 8;
    let max = (1..).take_while(|k| k * k <= words).last().unwrap_or(1);
    (want, max)
}
