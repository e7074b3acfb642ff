//! The pull all_reduce (one-shot, two-shot, pushes), reduce_scatter and broadcast.

use super::*;

// ---------- pull all_reduce ----------

/// Counts of the pull all_reduce cases: just past the LL size (3 blocks), 1 MiB (32 blocks),
/// 3 MiB and a vector (96 blocks, several rounds per thread), whole 16-byte vectors each.
fn pull_ar_counts(es: usize) -> [usize; 3] {
    [
        ((64 << 10) + 16) / es,
        (1 << 20) / es,
        ((3 << 20) + 16) / es,
    ]
}

fn pull_ar_t<T: TElem>(c: &Ctx<'_>, op: ReduceOp) -> Result<()> {
    let pe = c.pe;
    // Two-shot at every pull size or never (then one-shot; pairs by stores where set).
    let two = c.coll.tuning().two_shot_pull.of(pe.n_pes()) == 1;
    let es = std::mem::size_of::<T>();
    let counts = pull_ar_counts(es);
    let most = counts[2];
    let src = pe.alloc::<T>(most)?;
    let dst = pe.alloc::<T>(most)?;
    for (tn, team) in c.teams.list(pe) {
        for (ci, &count) in counts.iter().enumerate() {
            let seed = 7500 + ci as u64 * 4 + tn.len() as u64;
            let ctx = format!(
                "pull all_reduce {} {op:?} team {tn} count {count} (PE {})",
                T::KIND.name(),
                pe.my_pe()
            );
            assert!(
                c.coll.path(CollKind::AllReduce, team, count * es).pulls(),
                "{ctx}: not the pull path"
            );
            assert_eq!(
                c.coll
                    .path(CollKind::AllReduce, team, count * es)
                    .eq(&CollPath::PullTwoShot),
                two,
                "{ctx}: two-shot"
            );
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, count, op))?;
            c.coll.all_reduce(&c.s, team, &dst, &src, count, op)?;
            c.done()?;
            let x = ins::<T>(team, seed, count, op);
            let mut want: Vec<T> = (0..count).map(|i| fold_at(op, &x, i)).collect();
            want.resize(most, T::poison());
            check(&pe.local_vec(&dst)?, &want, &ctx);
        }
    }
    // In place is not the pull path (a member's input would change under its peers' reads):
    // the barrier-based plan, exact.
    let count = counts[1];
    let w = pe.world_team();
    pe.local_write(&dst, 0, &T::gen(pe.my_pe(), 7600, count, op))?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &dst, count, op)?;
    c.done()?;
    let x = ins::<T>(w, 7600, count, op);
    let want: Vec<T> = (0..count).map(|i| fold_at(op, &x, i)).collect();
    check(
        &pe.local_vec(&dst)?[..count],
        &want,
        "pull all_reduce in place",
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

/// The pull all_reduce (LL all_reduce to 64 KiB, pull beyond): every team shape, four types
/// and ops, 3 to 128 blocks, exact data, no host barrier between calls; in place on the
/// barrier-based plan; a captured graph replayed with new data; a member with the pull path
/// off (two-shot) reported on every PE, then a correct pull.
fn pull_ar_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    // The defaults: pairs store their data only from 256 MiB.
    if std::env::var_os("RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES").is_none() {
        assert_eq!(
            c.coll.tuning().push_all_reduce,
            cuda::COLL_PUSH_ALL_REDUCE_BYTES
        );
    }
    let defaults = (
        c.coll.tuning().two_shot_pull.of(2),
        c.coll.tuning().two_shot_pull.of(3),
    );
    if std::env::var_os("RSHMEM_CUDA_COLL_TWO_SHOT_PULL_BYTES").is_none() {
        assert_eq!(
            defaults,
            (
                cuda::COLL_TWO_SHOT_PULL_PAIR_BYTES,
                cuda::COLL_TWO_SHOT_PULL_BYTES
            )
        );
    }
    c.coll.retune(|t| t.push_all_reduce = 0)?;
    // One-shot on every team, then two-shot on every team (pairs too).
    for two in [0, 1] {
        c.coll.retune(|t| t.two_shot_pull = PerTeam::all(two))?;
        pull_ar_t::<f32>(&c, ReduceOp::Sum)?;
        pull_ar_t::<bf16>(&c, ReduceOp::Max)?;
        pull_ar_t::<i8>(&c, ReduceOp::Xor)?;
        pull_ar_t::<f64>(&c, ReduceOp::Min)?;
    }
    // Pairs by stores at every size (the strided team is a pair; the other teams still load).
    c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    c.coll.retune(|t| t.push_all_reduce = 1)?;
    pull_ar_t::<f32>(&c, ReduceOp::Sum)?;
    pull_ar_t::<bf16>(&c, ReduceOp::Max)?;
    pull_ar_t::<i8>(&c, ReduceOp::Xor)?;
    let (w, me) = (pe.world_team(), pe.my_pe());
    // 12 MiB of f32, past the one-shot limit of larger teams (the 128 blocks go three times
    // round; by stores, two steps per block), exact. Way 0: pairs one-shot by loads, larger
    // teams on the barrier-based plan; 1: pairs by stores; 2: every team two-shot.
    const BIG: usize = 3 << 20;
    let big_src = pe.alloc::<f32>(BIG)?;
    let big_dst = pe.alloc::<f32>(BIG)?;
    for way in [0, 1, 2] {
        c.coll
            .retune(|t| t.push_all_reduce = if way == 1 { 1 } else { 0 })?;
        c.coll
            .retune(|t| t.two_shot_pull = PerTeam::all(if way == 2 { 1 } else { 0 }))?;
        for (tn, team) in c.teams.list(pe) {
            let bytes = BIG * 4;
            let pull = c.coll.path(CollKind::AllReduce, team, bytes).pulls();
            let two = c
                .coll
                .path(CollKind::AllReduce, team, bytes)
                .eq(&CollPath::PullTwoShot);
            assert_eq!(
                (pull, two),
                (team.n_pes() == 2 || way == 2, way == 2),
                "team {tn} of {} members, {bytes} bytes: pull {pull}, two-shot {two}",
                team.n_pes()
            );
            assert_eq!(
                c.coll
                    .path(CollKind::AllReduce, team, bytes)
                    .eq(&CollPath::Push),
                team.n_pes() == 2 && way == 1,
                "team {tn}, {bytes} bytes, way {way}"
            );
            let seed = 7650 + team.n_pes() as u64 + 10 * way as u64;
            pe.local_fill(&big_dst, f32::poison())?;
            pe.local_write(&big_src, 0, &f32::gen(me, seed, BIG, ReduceOp::Sum))?;
            c.coll
                .all_reduce(&c.s, team, &big_dst, &big_src, BIG, ReduceOp::Sum)?;
            c.done()?;
            let x = ins::<f32>(team, seed, BIG, ReduceOp::Sum);
            let want: Vec<f32> = (0..BIG).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
            check(
                &pe.local_vec(&big_dst)?,
                &want,
                &format!("12 MiB all_reduce team {tn} way {way} (PE {me})"),
            );
        }
    }
    c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    // A pair whose members differ (one stores, one loads): a mismatch on both, dst untouched.
    if let Some(pair) = c.teams.list(pe).into_iter().find(|(_, t)| t.n_pes() == 2) {
        let (_, team) = pair;
        let first = team.my_pe() == 0;
        c.coll
            .retune(|t| t.push_all_reduce = if first { 1 } else { 0 })?;
        pe.local_fill(&big_dst, f32::poison())?;
        pe.local_write(&big_src, 0, &f32::gen(me, 7690, BIG, ReduceOp::Sum))?;
        c.coll
            .all_reduce(&c.s, team, &big_dst, &big_src, BIG, ReduceOp::Sum)?;
        c.s.synchronize()?;
        let ctx = format!("pair push against pull (PE {me})");
        match c.coll.check_errors() {
            Err(Error::CollectiveMismatch { mine, theirs, .. }) => {
                let (m, t) = if first {
                    ("algo push", "algo pull")
                } else {
                    ("algo pull", "algo push")
                };
                assert!(mine.contains(m), "{ctx}: mine {mine:?} lacks {m:?}");
                assert!(theirs.contains(t), "{ctx}: theirs {theirs:?} lacks {t:?}");
            }
            other => panic!("{ctx}: expected a collective mismatch, got {other:?}"),
        }
        check(
            &pe.local_vec(&big_dst)?,
            &vec![f32::poison(); BIG],
            &format!("{ctx}: dst"),
        );
    }
    c.coll.retune(|t| t.push_all_reduce = 0)?;
    c.coll
        .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    pe.barrier_all()?;
    pe.barrier_all()?;
    pe.free(big_dst)?;
    pe.free(big_src)?;
    const C: usize = 1 << 18; // f32: 1 MiB
    let src = pe.alloc::<f32>(C)?;
    let dst = pe.alloc::<f32>(C)?;
    pe.barrier_all()?;
    let s = &c.s;
    let graph = capture(s, || c.coll.all_reduce(s, w, &dst, &src, C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    for r in 0..4u64 {
        let seed = 7700 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let x = ins::<f32>(w, seed, C, ReduceOp::Sum);
        let want: Vec<f32> = (0..C).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull all_reduce replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // A member on the one-shot pull where the others run two-shot (on teams of more than
    // two; a pair runs one-shot by default): reported on every PE, nothing written.
    if pe.n_pes() > 2 {
        let ctx = "one-shot pull all_reduce against two-shot pull";
        if me == 1 {
            c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
        }
        pe.local_fill(&dst, f32::poison())?;
        pe.barrier_all()?;
        c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
        let (one, two) = ("algo pull ", "algo pull_two_shot");
        expect_mismatch_with(&c, 1, [one, two], [two, one], ctx);
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); C],
            &format!("{ctx}: dst (PE {me})"),
        );
        c.coll
            .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    }
    let ctx = "pull all_reduce against two-shot";
    if me == 1 {
        c.coll.retune(|t| t.pull_all_reduce = PerTeam::all(0))?;
        c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    expect_mismatch_with(
        &c,
        1,
        ["algo two_shot", "no collective signature"],
        ["algo pull", "algo two_shot"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); C],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_all_reduce = PerTeam::all(cuda::COLL_PULL_ALL_REDUCE_BYTES))?;
    c.coll
        .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    pe.local_write(&src, 0, &f32::gen(me, 7800, C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 7800, C, ReduceOp::Sum);
    let want: Vec<f32> = (0..C).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
    check(
        &pe.local_vec(&dst)?,
        &want,
        &format!("good pull after {ctx} (PE {me})"),
    );
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_all_reduce() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_ar_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_all_reduce_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_ar_body,
    [processes(4), mixed(4)]
);

// ---------- pull reduce_scatter ----------

/// The pull reduce_scatter on every team shape: parts of one vector, a block's worth plus a
/// vector and 1 MiB + 16 B (past 32 blocks), exact data, poisoned outputs, no host barrier
/// between calls.
fn pull_rs_t<T: TElem>(c: &Ctx<'_>, op: ReduceOp) -> Result<()> {
    let pe = c.pe;
    let es = std::mem::size_of::<T>();
    let parts = [16, (32 << 10) + 16, (1 << 20) + 16];
    let most = parts[2] / es;
    let src = pe.alloc::<T>(most * pe.n_pes())?;
    let dst = pe.alloc::<T>(most)?;
    for (tn, team) in c.teams.list(pe) {
        let (n, me) = (team.n_pes(), team.my_pe());
        for (pi, &part) in parts.iter().enumerate() {
            let count = part / es;
            let seed = 8100 + pi as u64 * 4 + tn.len() as u64;
            let ctx = format!(
                "pull reduce_scatter {} {op:?} team {tn} count {count} (PE {})",
                T::KIND.name(),
                pe.my_pe()
            );
            assert!(
                c.coll
                    .path(CollKind::ReduceScatter, team, part * n)
                    .eq(&CollPath::Pull),
                "{ctx}: not the pull path"
            );
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, n * count, op))?;
            c.coll.reduce_scatter(&c.s, team, &dst, &src, count, op)?;
            c.done()?;
            let x = ins::<T>(team, seed, n * count, op);
            let mut want: Vec<T> = (0..count)
                .map(|i| fold_at(op, &x, me * count + i))
                .collect();
            want.resize(most, T::poison());
            check(&pe.local_vec(&dst)?, &want, &ctx);
        }
    }
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

/// The pull reduce_scatter (the LL all_to_all off, so every out-of-place call of whole
/// 16-byte parts pulls): four types and ops on every team shape; in place on the
/// barrier-based plan, exact; a captured graph replayed with new data; a member with the pull
/// reduce_scatter off reported on every PE, then a correct pull.
fn pull_rs_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    assert_eq!(
        c.coll.tuning().pull_reduce_scatter,
        cuda::COLL_PULL_RS_BYTES
    );
    pull_rs_t::<f32>(&c, ReduceOp::Sum)?;
    pull_rs_t::<bf16>(&c, ReduceOp::Min)?;
    pull_rs_t::<i8>(&c, ReduceOp::Xor)?;
    pull_rs_t::<f64>(&c, ReduceOp::Max)?;
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    const C: usize = 1 << 16; // f32 per member: 256 KiB
    let src = pe.alloc::<f32>(n * C)?;
    let dst = pe.alloc::<f32>(n * C)?;
    // In place: not the pull path (the plan), exact.
    let mine = f32::gen(me, 8200, n * C, ReduceOp::Sum);
    pe.local_write(&dst, 0, &mine)?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &dst, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 8200, n * C, ReduceOp::Sum);
    let mut want = mine.clone();
    for i in 0..C {
        want[me * C + i] = fold_at(ReduceOp::Sum, &x, me * C + i);
    }
    check(&pe.local_vec(&dst)?, &want, "pull reduce_scatter in place");
    pe.barrier_all()?;
    // A graph replayed with new data.
    let s = &c.s;
    let graph = capture(s, || {
        c.coll.reduce_scatter(s, w, &dst, &src, C, ReduceOp::Sum)
    })?;
    pe.barrier_all()?;
    for r in 0..3u64 {
        let seed = 8300 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let x = ins::<f32>(w, seed, n * C, ReduceOp::Sum);
        let mut want: Vec<f32> = (0..C)
            .map(|i| fold_at(ReduceOp::Sum, &x, me * C + i))
            .collect();
        want.resize(n * C, f32::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull reduce_scatter replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // One member on the barrier-based plan: a mismatch on every PE, nothing written.
    let ctx = "pull reduce_scatter against barrier-based";
    if me == 1 {
        c.coll.retune(|t| t.pull_reduce_scatter = 0)?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    expect_mismatch_with(
        &c,
        1,
        ["reduce_scatter", "no collective signature"],
        ["algo pull", "reduce_scatter"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); n * C],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_reduce_scatter = cuda::COLL_PULL_RS_BYTES)?;
    pe.local_write(&src, 0, &f32::gen(me, 8400, n * C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 8400, n * C, ReduceOp::Sum);
    let want: Vec<f32> = (0..C)
        .map(|i| fold_at(ReduceOp::Sum, &x, me * C + i))
        .collect();
    check(
        &pe.local_vec(&dst)?[..C],
        &want,
        &format!("good pull reduce_scatter after {ctx} (PE {me})"),
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_reduce_scatter() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_rs_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_reduce_scatter_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_rs_body,
    [processes(4)]
);

/// The pull broadcast (LL broadcast to 64 KiB, pull beyond; on every size here): every team
/// shape (the chain of 3 and 4 members, a pair), the first and last member as root, in and out
/// of place, 64 KiB + 16 B (one block), 1 MiB + 48 B and 3 MiB (several, 4 steps each on the
/// chains), and 12 MiB + 16 B (the 128 blocks with uneven parts of up to 7 steps), each with every
/// member reading the root and along a chain; exact data, poisoned outputs, inputs left alone;
/// then a captured graph (a chain) replayed with new data, and a member on a chain where the
/// others are not, or with the pull path off, reported on every PE.
fn pull_bcast_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    c.coll
        .retune(|t| t.pull_broadcast = PerTeam::all(usize::MAX))?;
    let me = pe.my_pe();
    const MOST: usize = (3 << 20) + 4; // f32: 12 MiB + 16 B
    let src = pe.alloc::<f32>(MOST)?;
    let dst = pe.alloc::<f32>(MOST)?;
    for (tn, team) in c.teams.list(pe) {
        // Seeds by team name: a PE outside a team skips it, so a running count would differ.
        let ti = ["world", "strided", "tri"].iter().position(|&t| t == tn);
        let mut seed = 7000 + 300 * ti.unwrap_or(3) as u64;
        let n = team.n_pes();
        let counts = [(64 << 10) / 4 + 4, (1 << 20) / 4 + 12, 3 << 18, MOST];
        for (root, chain) in [(0, false), (n - 1, false), (0, true), (n - 1, true)] {
            // Every size both ways: everyone reading the root, and (teams of three or more)
            // along a chain.
            c.coll
                .retune(|t| t.chain_broadcast = if chain { 0 } else { usize::MAX })?;
            let from = team.members()[root];
            for in_place in [false, true] {
                for &count in &counts {
                    seed += 1;
                    let ctx = format!(
                        "pull broadcast team {tn} root {root} chain {chain} in place {in_place} count {count} (PE {me})"
                    );
                    assert!(
                        c.coll.path(CollKind::Broadcast, team, count * 4).pulls(),
                        "{ctx}: not pull"
                    );
                    assert_eq!(
                        c.coll
                            .path(CollKind::Broadcast, team, count * 4)
                            .eq(&CollPath::Chain),
                        chain && n > 2,
                        "{ctx}: chain"
                    );
                    let mine = f32::gen(me, seed, count, ReduceOp::Sum);
                    pe.local_fill(&dst, f32::poison())?;
                    if in_place {
                        pe.local_write(&dst, 0, &mine)?;
                        c.coll.broadcast(&c.s, team, &dst, &dst, count, root)?;
                    } else {
                        pe.local_write(&src, 0, &mine)?;
                        c.coll.broadcast(&c.s, team, &dst, &src, count, root)?;
                    }
                    c.done()?;
                    let mut want = f32::gen(from, seed, count, ReduceOp::Sum);
                    want.resize(MOST, f32::poison());
                    check(&pe.local_vec(&dst)?, &want, &ctx);
                    if !in_place {
                        check(&pe.local_vec(&src)?[..count], &mine, &format!("{ctx}: src"));
                    }
                }
            }
        }
    }
    // A captured graph replayed with new data (world, root 1, out of place; a chain on
    // more than two PEs).
    let (w, n) = (pe.world_team(), pe.n_pes());
    const C: usize = (1 << 20) / 4 + 12;
    let s = &c.s;
    pe.barrier_all()?;
    let graph = capture(s, || c.coll.broadcast(s, w, &dst, &src, C, 1 % n))?;
    pe.barrier_all()?;
    for r in 0..3u64 {
        let seed = 7990 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let mut want = f32::gen(1 % n, seed, C, ReduceOp::Sum);
        want.resize(MOST, f32::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull broadcast replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // A member on a chain where the others read the root (more than two PEs): a mismatch on
    // every PE, nothing written.
    if n > 2 {
        let ctx = "chain broadcast against pull";
        c.coll
            .retune(|t| t.chain_broadcast = if me == 1 { 0 } else { usize::MAX })?;
        pe.local_fill(&dst, f32::poison())?;
        pe.barrier_all()?;
        c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
        expect_mismatch(&c, 1, "algo chain", "algo pull", ctx);
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); MOST],
            &format!("{ctx}: dst (PE {me})"),
        );
        pe.barrier_all()?;
    }
    c.coll.retune(|t| t.chain_broadcast = usize::MAX)?;
    // A member with the pull path off runs the barrier-based plan: a mismatch on every PE,
    // nothing written; then a good pull broadcast.
    let ctx = "pull broadcast against barrier-based";
    if me == 1 {
        c.coll.retune(|t| t.pull_broadcast = PerTeam::all(0))?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
    expect_mismatch_with(
        &c,
        1,
        ["broadcast", "no collective signature"],
        ["algo pull", "broadcast"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MOST],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_broadcast = PerTeam::all(usize::MAX))?;
    pe.local_write(&src, 0, &f32::gen(me, 7999, C, ReduceOp::Sum))?;
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
    c.done()?;
    let mut want = f32::gen(0, 7999, C, ReduceOp::Sum);
    want.resize(MOST, f32::poison());
    check(
        &pe.local_vec(&dst)?,
        &want,
        &format!("good pull broadcast after {ctx} (PE {me})"),
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_broadcast() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_bcast_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_broadcast_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_bcast_body,
    [processes(4), mixed(4)]
);
