//! The pull all_to_all and all_gather (loads and stores), the LL flag, pull mismatches.

use super::*;

// ---------- pull all_to_all ----------

/// A context whose LL area is on (all_reduce 64 KiB) with the LL all_to_all up to `ll_a2a`
/// bytes (0: off, so every out-of-place all_to_all of whole 16-byte shares pulls).
pub(crate) fn pull_ctx(pe: &Pe, ll_a2a: usize) -> Result<Ctx<'_>> {
    let g = CudaPe::new(pe)?;
    let sizes = cuda::LlSizes {
        all_reduce: 64 << 10,
        all_to_all: ll_a2a,
    };
    let coll = GpuColl::new(
        g,
        CollConfig::default(),
        CollTuning::from_env()?.with_ll(sizes),
    )?;
    Ok(Ctx {
        pe,
        s: g.stream()?,
        coll,
        teams: Teams::new(pe)?,
    })
}

/// Shares in bytes: one vector, a block's part plus a tail, ten blocks with a short last one,
/// 256 KiB (32 blocks on the world).
pub(crate) const PULL_SHARES: [usize; 4] = [16, 4096 + 16, 3 * 16384 + 48, 256 << 10];

/// What member `me` of `m` receives in an all_to_all of `gc` elements per pair whose inputs
/// are `T::gen(pe, seed, n·gc)`.
pub(crate) fn a2a_want<T: TElem>(m: &[usize], me: usize, seed: u64, gc: usize) -> Vec<T> {
    let n = m.len();
    m.iter()
        .flat_map(|&w| T::gen(w, seed, n * gc, ReduceOp::Sum)[me * gc..(me + 1) * gc].to_vec())
        .collect()
}

/// The pull all_to_all, or with `gather` the pull all_gather (the same kernel, every share a
/// member's whole input; in place too when it stores): every team shape, the pull shares, by
/// loads or by stores, exact.
pub(crate) fn pull_t<T: TElem>(c: &Ctx<'_>, push: bool, gather: bool) -> Result<()> {
    let pe = c.pe;
    let most = 4 * (256 << 10) / std::mem::size_of::<T>();
    let src = pe.alloc::<T>(most)?;
    let dst = pe.alloc::<T>(most)?;
    let name = if gather { "all_gather" } else { "all_to_all" };
    for (tn, team) in c.teams.list(pe) {
        let (me, n, m) = (team.my_pe(), team.n_pes(), team.members());
        for (si, share) in PULL_SHARES.into_iter().enumerate() {
            let gc = share / std::mem::size_of::<T>();
            for ip in [false, true] {
                if ip && !(gather && push) {
                    continue;
                }
                let seed = 7000 + si as u64 * 4 + tn.len() as u64 + 50 * u64::from(ip);
                let ctx = format!(
                    "pull {name} {} team {tn} share {share} B push {push} in place {ip} (PE {})",
                    T::KIND.name(),
                    pe.my_pe()
                );
                if !ip {
                    let (pull, pushes) = if gather {
                        let g = |b| c.coll.path(CollKind::AllGather, team, b).pulls();
                        (
                            g(n * share),
                            c.coll
                                .path(CollKind::AllGather, team, n * share)
                                .eq(&CollPath::Push),
                        )
                    } else {
                        let a = |b| c.coll.path(CollKind::AllToAll, team, b).pulls();
                        (
                            a(n * share),
                            c.coll
                                .path(CollKind::AllToAll, team, n * share)
                                .eq(&CollPath::Push),
                        )
                    };
                    assert!(pull, "{ctx}: not the pull path");
                    assert_eq!(pushes, push, "{ctx}");
                }
                pe.local_fill(&dst, T::poison())?;
                let mut want = if gather {
                    let obj = if ip { &dst } else { &src };
                    let mine = T::gen(pe.my_pe(), seed, gc, ReduceOp::Sum);
                    pe.local_write(obj, if ip { me * gc } else { 0 }, &mine)?;
                    c.coll.all_gather(&c.s, team, &dst, obj, gc)?;
                    m.iter()
                        .flat_map(|&w| T::gen(w, seed, gc, ReduceOp::Sum))
                        .collect()
                } else {
                    pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, n * gc, ReduceOp::Sum))?;
                    c.coll.all_to_all(&c.s, team, &dst, &src, gc)?;
                    a2a_want::<T>(m, me, seed, gc)
                };
                c.done()?;
                want.resize(most, T::poison());
                check(&pe.local_vec(&dst)?, &want, &ctx);
            }
        }
    }
    pe.free(dst)?;
    pe.free(src)
}

/// The pull all_to_all: every team shape, shares from one vector to 256 KiB (1 to 32 blocks),
/// four element types, exact data, no host barrier between the calls, by loads and by stores,
/// and the pull all_gather likewise; then a captured graph (a pull all_to_all, a pull
/// all_gather and an LL all_reduce) replayed with new data, by loads and by stores.
pub(crate) fn pull_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    if std::env::var_os("RSHMEM_CUDA_COLL_PUSH_A2A_BYTES").is_none() {
        assert_eq!(c.coll.tuning().push_all_to_all, cuda::COLL_PUSH_A2A_BYTES);
    }
    c.coll.retune(|t| t.push_all_to_all = 0)?;
    pull_t::<u8>(&c, false, false)?;
    pull_t::<bf16>(&c, false, false)?;
    pull_t::<f32>(&c, false, false)?;
    pull_t::<f64>(&c, false, false)?;
    pull_t::<bf16>(&c, false, true)?;
    pull_t::<f64>(&c, false, true)?;
    // Every member storing its shares, at every size.
    c.coll.retune(|t| t.push_all_to_all = 1)?;
    pull_t::<u8>(&c, true, false)?;
    pull_t::<bf16>(&c, true, false)?;
    pull_t::<f64>(&c, true, false)?;
    pull_t::<u8>(&c, true, true)?;
    pull_t::<f32>(&c, true, true)?;
    for push in [0, 1] {
        c.coll.retune(|t| t.push_all_to_all = push)?;
        pull_graph(pe, &c, push == 1)?;
    }
    Ok(())
}

pub(crate) fn pull_graph(pe: &Pe, c: &Ctx<'_>, push: bool) -> Result<()> {
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    const GC: usize = 16 << 10; // f32 per pair: 64 KiB shares
    let src = pe.alloc::<f32>(n * GC)?;
    let dst = pe.alloc::<f32>(n * GC)?;
    let g_dst = pe.alloc::<f32>(n * GC)?;
    let r_dst = pe.alloc::<f32>(1000)?;
    pe.barrier_all()?;
    let s = &c.s;
    let graph = capture(s, || {
        c.coll.all_to_all(s, w, &dst, &src, GC)?;
        c.coll
            .all_gather(s, w, &g_dst, &src.view::<f32>(0, GC)?, GC)?;
        c.coll.all_reduce(
            s,
            w,
            &r_dst,
            &src.view::<f32>(0, 1000)?,
            1000,
            ReduceOp::Sum,
        )
    })?;
    pe.barrier_all()?;
    let all: Vec<usize> = (0..n).collect();
    for r in 0..4u64 {
        let seed = 8000 + r + 10 * u64::from(push);
        pe.local_fill(&dst, f32::poison())?;
        pe.local_fill(&g_dst, f32::poison())?;
        pe.local_fill(&r_dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * GC, ReduceOp::Sum))?;
        pe.barrier_all()?; // a replay reads the peers' new inputs
        graph.launch(s)?;
        c.done()?;
        let ctx = format!("pull graph replay {r} push {push} PE {me}");
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, GC),
            &ctx,
        );
        let gathered: Vec<f32> = all
            .iter()
            .flat_map(|&p| f32::gen(p, seed, n * GC, ReduceOp::Sum)[..GC].to_vec())
            .collect();
        check(
            &pe.local_vec(&g_dst)?,
            &gathered,
            &format!("{ctx}: all_gather"),
        );
        let x: Vec<Vec<f32>> = all
            .iter()
            .map(|&p| f32::gen(p, seed, n * GC, ReduceOp::Sum)[..1000].to_vec())
            .collect();
        let want: Vec<f32> = (0..1000).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(&pe.local_vec(&r_dst)?, &want, &format!("{ctx}: all_reduce"));
        pe.barrier_all()?; // nobody rewrites its input while a peer's replay may read it
    }
    drop(graph);
    pe.free(r_dst)?;
    pe.free(g_dst)?;
    pe.free(dst)?;
    pe.free(src)
}

/// The LL flag of a pair does not come back: an LL all_to_all of 256 KiB shares, then 32767
/// LL calls of one element per pair (replays of a captured graph), then the large call again
/// with new data, PE 1 entering it 5 ms after PE 0. The former flag (16 bits of the barrier
/// expectation, 15 of the pair's sequence; `-DRSHMEMI_LL_FLAG_15=1` in
/// `RSHMEM_TEST_COLL_NVRTC_OPTS` builds it again) was the same at the 32768th call: PE 0 took
/// the header and lines PE 1 had left from the first large call for this one's, so its dst
/// held the first call's data.
pub(crate) fn ll_flag_body(pe: &Pe) -> Result<()> {
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    let g = CudaPe::new(pe)?;
    let coll = GpuColl::new(g, CollConfig::default(), ll_tuning(256 << 10)?)?;
    let s = g.stream()?;
    const BIG: usize = 64 << 10; // f32 per pair: 256 KiB shares
    let src = pe.alloc::<f32>(n * BIG)?;
    let dst = pe.alloc::<f32>(n * BIG)?;
    let one_src = pe.alloc::<f32>(n)?;
    let one_dst = pe.alloc::<f32>(n)?;
    assert!(coll
        .path(CollKind::AllToAll, w, n * BIG * 4)
        .eq(&CollPath::Ll));
    assert!(coll.path(CollKind::AllToAll, w, n * 4).eq(&CollPath::Ll));
    let all: Vec<usize> = (0..n).collect();
    let big = |seed: u64| -> Result<()> {
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * BIG, ReduceOp::Sum))?;
        pe.barrier_all()?;
        if me == 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
        coll.all_to_all(&s, w, &dst, &src, BIG)?;
        s.synchronize()?;
        coll.check_errors()?;
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, BIG),
            &format!("LL all_to_all of seed {seed} (PE {me})"),
        );
        pe.barrier_all()
    };
    big(70)?;
    pe.local_fill(&one_src, 1.0)?;
    pe.barrier_all()?;
    // 7 replays of 4681 calls: 32767 LL calls of the pair between the two large ones.
    let graph = capture(&s, || {
        for _ in 0..4681 {
            coll.all_to_all(&s, w, &one_dst, &one_src, 1)?;
        }
        Ok(())
    })?;
    for _ in 0..7 {
        graph.launch(&s)?;
    }
    s.synchronize()?;
    coll.check_errors()?;
    check(
        &pe.local_vec(&one_dst)?,
        &vec![1.0f32; n],
        &format!("one-element calls (PE {me})"),
    );
    drop(graph);
    big(71)?;
    pe.free(one_dst)?;
    pe.free(one_src)?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_ll_flag_does_not_come_back() {
    on_gpus(2, ll_flag_body);
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_pull_all_to_all() {
    on_gpus(4, pull_body);
}

gpu_mode_test!(
    gpu_coll_pull_all_to_all_modes,
    gpu_config(),
    pull_body,
    [processes(4), mixed(4)]
);

/// A pull all_to_all (by stores, the default) beside other calls: a member on the
/// barrier-based path (pull off there), a member on the LL all_to_all (its LL all_to_all size
/// covers the call), a member loading instead of storing, each reported on every PE with
/// nothing written; a correct pull after each, exact.
pub(crate) fn pull_mismatch_body(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let w = pe.world_team();
    let mut c = pull_ctx(pe, 0)?;
    // The same LL area (region 64 KiB) everywhere; PE 2's LL all_to_all covers 64 KiB inputs.
    let c2 = pull_ctx(pe, if me == 2 { 128 << 10 } else { 0 })?;
    let n = pe.n_pes();
    const GC: usize = 4096; // f32 per pair: 16 KiB shares, 64 KiB in all
    let src = pe.alloc::<f32>(n * GC)?;
    let dst = pe.alloc::<f32>(n * GC)?;
    let all: Vec<usize> = (0..n).collect();
    let good = |c: &Ctx<'_>, seed: u64, ctx: &str| -> Result<()> {
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * GC, ReduceOp::Sum))?;
        pe.barrier_all()?;
        c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
        c.done()?;
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, GC),
            &format!("good pull after {ctx} (PE {me})"),
        );
        pe.barrier_all()
    };
    let poisoned = |ctx: &str| -> Result<()> {
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); n * GC],
            &format!("{ctx}: dst (PE {me})"),
        );
        Ok(())
    };
    good(&c, 9000, "nothing")?;

    let ctx = "pull against barrier-based all_to_all";
    if me == 1 {
        c.coll.retune(|t| t.pull_all_to_all = 0)?;
    }
    assert_eq!(
        c.coll.path(CollKind::AllToAll, w, n * GC * 4).pulls(),
        me != 1
    );
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
    expect_mismatch_with(
        &c,
        1,
        ["algo -", "no collective signature"],
        ["algo push", "algo -"],
        ctx,
    );
    poisoned(ctx)?;
    c.coll
        .retune(|t| t.pull_all_to_all = cuda::COLL_PULL_A2A_BYTES)?;
    good(&c, 9001, ctx)?;

    let ctx = "pull against LL all_to_all";
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c2.coll.all_to_all(&c2.s, w, &dst, &src, GC)?;
    expect_mismatch(&c2, 2, "algo ll", "algo push", ctx);
    poisoned(ctx)?;
    good(&c, 9002, ctx)?;

    // Storing and loading members in one call: each would leave the other's dst short.
    let ctx = "push against pull all_to_all";
    if me == 1 {
        c.coll.retune(|t| t.push_all_to_all = 0)?;
    }
    assert_eq!(
        c.coll
            .path(CollKind::AllToAll, w, n * GC * 4)
            .eq(&CollPath::Push),
        me != 1
    );
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
    expect_mismatch(&c, 1, "algo pull", "algo push", ctx);
    poisoned(ctx)?;
    c.coll.retune(|t| t.push_all_to_all = 0)?;
    good(&c, 9003, ctx)?;
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_pull_mismatch_is_an_error_on_every_pe() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_mismatch_body,
    );
}
