//! Cross-PE argument checks: signatures carried by the first barrier (fused, unfused, LL, captured graphs).

use super::*;

// ---------- cross-PE argument check: signatures carried by the first barrier ----------

/// The member PE `me` reports as differing when only world member `odd` differs (the first
/// member in team order whose signature is not `me`'s).
pub(crate) fn first_other(me: usize, odd: usize) -> usize {
    match (me == odd, odd) {
        (true, 0) => 1,
        (true, _) => 0,
        (false, _) => odd,
    }
}

/// After a call where only member `odd` differed: the stream completed without a host error,
/// `check_errors` is a mismatch naming the right member, and the descriptions show `odd_has`
/// for the odd member's call and `rest_has` for the others'.
pub(crate) fn expect_mismatch(c: &Ctx<'_>, odd: usize, odd_has: &str, rest_has: &str, ctx: &str) {
    expect_mismatch_with(c, odd, [odd_has, rest_has], [rest_has, odd_has], ctx);
}

/// As [`expect_mismatch`] with what each side's own and reported signatures hold given apart
/// (`[mine, theirs]` of member `odd`, then of the others; a barrier-based member sees no
/// signature of an LL member: "no collective signature").
pub(crate) fn expect_mismatch_with(
    c: &Ctx<'_>,
    odd: usize,
    odd_has: [&str; 2],
    rest_has: [&str; 2],
    ctx: &str,
) {
    let me = c.pe.my_pe();
    c.s.synchronize()
        .unwrap_or_else(|e| panic!("{ctx} PE {me}: {e}"));
    match c.coll.check_errors() {
        Err(Error::CollectiveMismatch {
            pe, mine, theirs, ..
        }) => {
            assert_eq!(pe, first_other(me, odd), "{ctx} PE {me}: differing member");
            let [m, t] = if me == odd { odd_has } else { rest_has };
            assert!(mine.contains(m), "{ctx} PE {me}: mine {mine:?} lacks {m:?}");
            assert!(
                theirs.contains(t),
                "{ctx} PE {me}: theirs {theirs:?} lacks {t:?}"
            );
        }
        other => panic!("{ctx} PE {me}: expected a collective mismatch, got {other:?}"),
    }
    // Reported once: the record is clear now.
    assert!(
        c.coll.check_errors().is_ok(),
        "{ctx} PE {me}: flag not cleared"
    );
}

/// Poisons `dst`, writes this PE's seeded `src[..len]`; returns what `src` holds.
pub(crate) fn arm(
    pe: &Pe,
    src: &rshmem::Sym<f32>,
    dst: &rshmem::Sym<f32>,
    s: u64,
) -> Result<Vec<f32>> {
    pe.local_fill(dst, f32::poison())?;
    let v = f32::gen(pe.my_pe(), s, src.len(), ReduceOp::Sum);
    pe.local_write(src, 0, &v)?;
    Ok(v)
}

/// Nothing moved on this PE after a mismatch: `dst` still poison, `src` still `mine_src`.
pub(crate) fn unmoved(
    pe: &Pe,
    src: &rshmem::Sym<f32>,
    dst: &rshmem::Sym<f32>,
    mine_src: &[f32],
    ctx: &str,
) -> Result<()> {
    check(
        &pe.local_vec(dst)?,
        &vec![f32::poison(); dst.len()],
        &format!("{ctx}: dst"),
    );
    check(&pe.local_vec(src)?, mine_src, &format!("{ctx}: src"));
    Ok(())
}

/// A correct all_reduce after a mismatch: exact data.
pub(crate) fn good_all_reduce(
    c: &Ctx<'_>,
    src: &rshmem::Sym<f32>,
    dst: &rshmem::Sym<f32>,
    s: u64,
    count: usize,
    ctx: &str,
) -> Result<()> {
    let pe = c.pe;
    arm(pe, src, dst, s)?;
    c.coll
        .all_reduce(&c.s, pe.world_team(), dst, src, count, ReduceOp::Sum)?;
    c.done()?;
    let x: Vec<Vec<f32>> = (0..pe.n_pes())
        .map(|w| f32::gen(w, s, src.len(), ReduceOp::Sum))
        .collect();
    let mut want: Vec<f32> = (0..count).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
    want.resize(dst.len(), f32::poison());
    check(
        &pe.local_vec(dst)?,
        &want,
        &format!("good all_reduce after {ctx}"),
    );
    Ok(())
}

pub(crate) fn mismatch_body(pe: &Pe, fused: bool) -> Result<()> {
    let mut c = Ctx::new(pe)?;
    if !fused {
        c.coll.retune(|t| t.fused_bytes = 0)?;
    }
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 20_000; // 80 KB of f32: two-shot all_reduce at the context's 64 KiB
                             // Staging for the in-place case below, allocated now: a cuMemAlloc while the peers'
                             // kernels already wait in a collective may wait for them (PEs sharing one GPU).
    c.coll.reserve(100 * 4)?;
    pe.barrier_all()?;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    let other = pe.alloc::<f32>(N)?;
    let seed = std::cell::Cell::new(500 + fused as u64 * 100);
    let after = |c: &Ctx<'_>, ctx: &str, mine_src: &[f32]| -> Result<()> {
        unmoved(pe, &src, &dst, mine_src, ctx)?;
        seed.set(seed.get() + 1);
        good_all_reduce(c, &src, &dst, seed.get(), 1000, ctx)
    };
    // Different lengths (the same algorithm).
    let ctx = format!("count mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 1 { 99 } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch(&c, 1, "count 99 ", "count 100 ", &ctx);
    after(&c, &ctx, &v)?;
    // Different lengths that choose different algorithms (3 barriers against 2): the members
    // pad to the same barrier count, so nothing hangs and the next call is in step.
    let ctx = format!("algorithm mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 0 { N } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch(
        &c,
        0,
        "algo two_shot barriers 3",
        "algo one_shot barriers 2",
        &ctx,
    );
    after(&c, &ctx, &v)?;
    // Different operations.
    let ctx = format!("op mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let op = if me == 2 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    c.coll.all_reduce(s, w, &dst, &src, 100, op)?;
    expect_mismatch(&c, 2, "float max count", "float sum count", &ctx);
    after(&c, &ctx, &v)?;
    // Different roots: reduce and broadcast.
    let ctx = format!("reduce root mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let root = if me == 3 { 1 } else { 0 };
    c.coll.reduce(
        s,
        w,
        &dst,
        &src,
        100,
        ToRoot {
            op: ReduceOp::Sum,
            root,
        },
    )?;
    expect_mismatch(&c, 3, "root 1 ", "root 0 ", &ctx);
    after(&c, &ctx, &v)?;
    let ctx = format!("broadcast root mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let root = if me == 0 { 2 } else { 3 };
    c.coll.broadcast(s, w, &dst, &src, 100, root)?;
    expect_mismatch(&c, 0, "root 2 ", "root 3 ", &ctx);
    after(&c, &ctx, &v)?;
    // Different collectives.
    let ctx = format!("kind mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 1 {
        c.coll.all_gather(s, w, &dst, &src, 25)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(
        &c,
        1,
        "all_gather float count 25",
        "all_reduce float sum count 100",
        &ctx,
    );
    after(&c, &ctx, &v)?;
    // Different element types (same bytes).
    let ctx = format!("type mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 2 {
        let (d, sr) = (dst.view::<i32>(0, N)?, src.view::<i32>(0, N)?);
        c.coll.all_reduce(s, w, &d, &sr, 100, ReduceOp::Sum)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(&c, 2, "all_reduce int32 sum", "all_reduce float sum", &ctx);
    after(&c, &ctx, &v)?;
    // A different source object.
    let ctx = format!("object mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let sr = if me == 3 { &other } else { &src };
    c.coll.all_reduce(s, w, &dst, sr, 100, ReduceOp::Sum)?;
    expect_mismatch(&c, 3, "", "", &ctx);
    after(&c, &ctx, &v)?;
    // In place on one member only.
    let ctx = format!("in-place mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 0 {
        c.coll.all_reduce(s, w, &src, &src, 100, ReduceOp::Sum)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(&c, 0, "in_place true", "in_place false", &ctx);
    after(&c, &ctx, &v)?;
    // On a sub-team (strided {1, 3}): member 1 of the team (PE 3) differs.
    if let Some(t) = c.teams.strided.as_ref() {
        let ctx = format!("strided team mismatch (fused {fused})");
        let v = arm(pe, &src, &dst, seed.get())?;
        let n = if me == 3 { 7 } else { 8 };
        c.coll.all_reduce(s, t, &dst, &src, n, ReduceOp::Sum)?;
        s.synchronize()?;
        match c.coll.check_errors() {
            Err(Error::CollectiveMismatch { pe: p, .. }) => {
                assert_eq!(p, if me == 3 { 1 } else { 3 }, "{ctx} PE {me}")
            }
            other => panic!("{ctx} PE {me}: {other:?}"),
        }
        check(&pe.local_vec(&dst)?, &vec![f32::poison(); N], &ctx);
        check(&pe.local_vec(&src)?, &v, &ctx);
    }
    pe.barrier_all()?;
    good_all_reduce(&c, &src, &dst, seed.get() + 1, N, "everything")
}

/// The LL all_reduce's cross-member check: LL against LL with another count, LL against a
/// barrier-based all_reduce (two-shot beyond the LL size: 3 barriers against the LL's 2) and
/// against another collective. Each is a `CollectiveMismatch` on every member with nothing
/// written, and the next LL and barrier-based calls are in step (exact results).
pub(crate) fn ll_mismatch_body(pe: &Pe) -> Result<()> {
    LL_BYTES.store(LL_TEST_BYTES, std::sync::atomic::Ordering::Relaxed);
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 20_000; // 80 KB of f32: beyond the LL size
    pe.barrier_all()?;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    let seed = std::cell::Cell::new(900);
    let after = |ctx: &str, mine_src: &[f32]| -> Result<()> {
        unmoved(pe, &src, &dst, mine_src, ctx)?;
        seed.set(seed.get() + 2);
        good_all_reduce(&c, &src, &dst, seed.get(), 1000, ctx)?;
        good_all_reduce(&c, &src, &dst, seed.get() + 1, N, ctx)
    };
    let ctx = "LL count mismatch";
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 1 { 99 } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch(&c, 1, "count 99 ", "count 100 ", ctx);
    after(ctx, &v)?;
    let ctx = "LL against two-shot";
    let v = arm(pe, &src, &dst, seed.get())?;
    // (Past the LL size an out-of-place all_reduce would run the pull way: forced two-shot.)
    if me == 0 {
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            N,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch_with(
        &c,
        0,
        ["algo two_shot barriers 3", "no collective signature"],
        ["algo ll barriers 2", "algo two_shot barriers 3"],
        ctx,
    );
    after(ctx, &v)?;
    let ctx = "LL against all_gather";
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 3 {
        c.coll
            .all_gather(s, w, &dst, &src.view::<f32>(0, 25)?, 25)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    // (A small all_gather runs the LL way too: each side reads the other's header.)
    expect_mismatch(&c, 3, "all_gather", "all_reduce", ctx);
    after(ctx, &v)?;
    // An LL broadcast whose members name different roots: nothing is waited for or written.
    let ctx = "LL broadcast with different roots";
    let v = arm(pe, &src, &dst, seed.get())?;
    c.coll
        .broadcast(s, w, &dst, &src, 100, if me == 2 { 1 } else { 0 })?;
    expect_mismatch(&c, 2, "root 1", "root 0", ctx);
    after(ctx, &v)?;
    // The LL all_to_all (26 f32 = 104 bytes per pair: whole words) shares the LL areas: an
    // LL all_reduce beside it reads its header and reports the difference.
    let ctx = "LL all_to_all against LL all_reduce";
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 2 {
        c.coll.all_to_all(s, w, &dst, &src, 26)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(&c, 2, "all_to_all", "all_reduce", ctx);
    after(ctx, &v)?;
    // 9001 f32 per pair (144 KB in all) is beyond the LL all_to_all size (128 KiB) and its
    // shares are not whole 16-byte vectors (no pull): the barrier-based all_to_all, against
    // LL ones of 27 f32 per pair (108 bytes: not whole words, which the LL data kernel moves
    // too).
    let ctx = "LL all_to_all against a barrier-based one";
    let v = arm(pe, &src, &dst, seed.get())?;
    let big_src = pe.alloc::<f32>(4 * 9001)?;
    let big_dst = pe.alloc::<f32>(4 * 9001)?;
    pe.local_fill(&big_dst, f32::poison())?;
    let n = if me == 1 { 9001 } else { 27 };
    c.coll.all_to_all(s, w, &big_dst, &big_src, n)?;
    expect_mismatch_with(
        &c,
        1,
        ["count 9001 ", "no collective signature"],
        ["count 27 ", "count 9001 "],
        ctx,
    );
    check(
        &pe.local_vec(&big_dst)?,
        &vec![f32::poison(); 4 * 9001],
        &format!("{ctx}: dst"),
    );
    pe.barrier_all()?;
    pe.free(big_dst)?;
    pe.free(big_src)?;
    after(ctx, &v)?;
    // And a correct LL all_to_all after them, out of place then in place: exact data.
    let ctx = "LL all_to_all after the mismatches";
    const K: usize = 26;
    let n = pe.n_pes();
    let mine: Vec<f32> = (0..n * K).map(|i| (me * 1000 + i) as f32).collect();
    let want: Vec<f32> = (0..n * K)
        .map(|i| ((i / K) * 1000 + me * K + i % K) as f32)
        .collect();
    pe.local_write(&src, 0, &mine)?;
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(s, w, &dst, &src, K)?;
    c.done()?;
    check(&pe.local_vec(&dst)?[..n * K], &want, ctx);
    pe.local_write(&dst, 0, &mine)?;
    pe.barrier_all()?;
    c.coll.all_to_all(s, w, &dst, &dst, K)?;
    c.done()?;
    check(
        &pe.local_vec(&dst)?[..n * K],
        &want,
        &format!("{ctx}, in place"),
    );
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_ll_mismatch_is_an_error_on_every_pe() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        ll_mismatch_body,
    );
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_mismatch_fused_is_an_error_on_every_pe() {
    on_gpus_cfg(gpu_config().timeout(Duration::from_secs(8)), 4, |pe| {
        mismatch_body(pe, true)
    });
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_mismatch_unfused_is_an_error_on_every_pe() {
    on_gpus_cfg(gpu_config().timeout(Duration::from_secs(8)), 4, |pe| {
        mismatch_body(pe, false)
    });
}

/// moves nothing), one that agrees (every replay exact), replayed alternately.
pub(crate) fn mismatch_graph_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 1000;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    pe.barrier_all()?;
    // Fused one-shot, then a two-shot one (separate kernels): PE 1 differs in both.
    let bad = capture(s, || {
        let n = if me == 1 { N - 1 } else { N };
        c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            n,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )
    })?;
    let good = capture(s, || {
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            N,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )
    })?;
    pe.barrier_all()?; // every PE has its graphs before any launches
    for r in 0..4u64 {
        let ctx = format!("graph replay {r}");
        let v = arm(pe, &src, &dst, 800 + r)?;
        bad.launch(s)?;
        expect_mismatch(&c, 1, "count 999 ", "count 1000 ", &ctx);
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); N],
            &format!("{ctx}: dst"),
        );
        check(&pe.local_vec(&src)?, &v, &format!("{ctx}: src"));
        good.launch(s)?;
        c.done()?;
        let x: Vec<Vec<f32>> = (0..pe.n_pes())
            .map(|w| f32::gen(w, 800 + r, N, ReduceOp::Sum))
            .collect();
        let want: Vec<f32> = (0..N).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(&pe.local_vec(&dst)?, &want, &format!("{ctx}: good graph"));
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_coll_mismatch_in_captured_graph() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        mismatch_graph_body,
    );
}
