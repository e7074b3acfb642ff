//! all_to_all_v: counts on the device, host counts in several list chunks, mismatches.

use super::*;

// ---------- all_to_all_v with device counts ----------

fn dev_counts(i: usize, j: usize, r: u64) -> u64 {
    vcnt(i, j, 7000 + r) as u64 * 3
}

fn a2av_device_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let cap = 150 * n; // every count is below 150
    let src = pe.alloc::<f32>(cap)?;
    let big = pe.alloc::<f32>(cap + 64)?; // dst is the first `cap`: the rest must stay poison
    let dst = big.view::<f32>(0, cap)?;
    let counts = pe.alloc::<u64>(n)?;
    let recv = pe.alloc::<u64>(n)?;
    let s = &c.s;
    let check_round = |r: u64, want_counts: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        let rc = pe.local_vec(&recv)?;
        let got = pe.local_vec(&big)?;
        let mut want = vec![f32::poison(); cap + 64];
        let mut at = 0;
        for (j, &c_got) in rc.iter().enumerate() {
            let c = want_counts(j, me);
            assert_eq!(c_got, c, "round {r} PE {me}: count from {j}");
            let disp: u64 = (0..me).map(|k| want_counts(j, k)).sum();
            let theirs = f32::gen(j, 9000 + r, cap, ReduceOp::Sum);
            want[at..at + c as usize].copy_from_slice(&theirs[disp as usize..(disp + c) as usize]);
            at += c as usize;
        }
        check(&got, &want, &format!("a2av device round {r} PE {me}"));
        Ok(())
    };
    let set = |r: u64, cnt: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        pe.local_fill(&big, f32::poison())?;
        pe.local_fill(&recv, u64::MAX)?;
        pe.local_write(&src, 0, &f32::gen(me, 9000 + r, cap, ReduceOp::Sum))?;
        let mine: Vec<u64> = (0..n).map(|k| cnt(me, k)).collect();
        pe.local_write(&counts, 0, &mine)
    };
    let trace = |what: &str| eprintln!("[a2av_device PE {me}] {what}");
    // Direct calls.
    for r in 0..3 {
        let cnt = |i: usize, j: usize| dev_counts(i, j, r);
        set(r, &cnt)?;
        trace(&format!("round {r} launch"));
        c.coll.all_to_all_v_device(
            s,
            w,
            &dst,
            &src,
            DeviceCounts {
                send: &counts,
                recv: &recv,
            },
        )?;
        c.done()?;
        trace(&format!("round {r} done"));
        check_round(r, &cnt)?;
    }
    trace("capture");
    // Captured once, replayed with new counts and data. Every PE captures and instantiates
    // before any launches (instantiation may wait for kernels running on the GPU).
    pe.barrier_all()?;
    s.begin_capture()?;
    let cap_r = c.coll.all_to_all_v_device(
        s,
        w,
        &dst,
        &src,
        DeviceCounts {
            send: &counts,
            recv: &recv,
        },
    );
    let graph = s.end_capture();
    trace(&format!(
        "captured: {:?} / {:?}",
        cap_r,
        graph.as_ref().err()
    ));
    cap_r?;
    let graph = graph?;
    pe.barrier_all()?;
    for r in 10..22 {
        let cnt = |i: usize, j: usize| dev_counts(i, j, r);
        set(r, &cnt)?;
        graph.launch(s)?;
        c.done()?;
        check_round(r, &cnt)?;
    }
    // Overflow: PE 1 sends everything it has plus one element to PE 0 → capacity error on
    // every PE, nothing written (dst stays poison, also beyond its capacity).
    let over = |i: usize, j: usize| -> u64 {
        if i == 1 && j == 0 {
            cap as u64 + 1
        } else {
            dev_counts(i, j, 99)
        }
    };
    trace("replays checked; overflow");
    set(99, &over)?;
    graph.launch(s)?;
    s.synchronize()?;
    match c.coll.check_errors() {
        Err(Error::Capacity {
            src_pe, capacity, ..
        }) => {
            assert_eq!(src_pe, 1, "PE {me}: offending sender");
            assert_eq!(capacity, cap, "PE {me}");
        }
        other => panic!("PE {me}: expected a capacity error, got {other:?}"),
    }
    let got = pe.local_vec(&big)?;
    assert!(
        got.iter().all(|x| x.is_nan()),
        "PE {me}: data written despite overflow"
    );
    let rc = pe.local_vec(&recv)?;
    assert_eq!(rc[1], over(1, me), "PE {me}: counts seen are reported");
    trace("overflow reported");
    // The flag was cleared and the graph still works.
    let cnt = |i: usize, j: usize| dev_counts(i, j, 100);
    set(100, &cnt)?;
    graph.launch(s)?;
    c.done()?;
    check_round(100, &cnt)?;
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_all_to_all_v_device_counts() {
    // Short waits: a failure shows as an error, not a long hang.
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        a2av_device_body,
    );
}

gpu_mode_test!(
    gpu_coll_all_to_all_v_device_counts,
    gpu_config().timeout(Duration::from_secs(8)),
    a2av_device_body,
    [processes(4), mixed(4)]
);

/// all_to_all_v with host counts in several list chunks (3 members per launch, so teams of
/// 4, 3 and 2 take 2, 1 and 1 chunks), exact data; then one member passing a different source
/// object: a mismatch on every member, nothing received; then device counts against a plain
/// all_to_all on one member.
fn a2av_chunks_body(pe: &Pe) -> Result<()> {
    let mut c = Ctx::new(pe)?;
    c.coll.set_a2av_chunk(3)?;
    assert!(c.coll.set_a2av_chunk(0).is_err() && c.coll.set_a2av_chunk(65).is_err());
    let me = pe.my_pe();
    let n = pe.n_pes();
    let src = pe.alloc::<f32>(MAXC)?;
    let dst = pe.alloc::<f32>(MAXC)?;
    let other = pe.alloc::<f32>(MAXC)?;
    for (tn, team) in c.teams.list(pe) {
        for r in 0..3u64 {
            let ctx = format!("a2av chunks team {tn} round {r} (PE {me})");
            a2av_host_t::<f32>(&c, team, &src, &dst, 4000 + r, &ctx)?;
        }
    }
    let w = pe.world_team();
    let z = vec![1usize; n];
    let d: Vec<usize> = (0..n).collect();
    let v = AllToAllV {
        send_counts: &z,
        send_displs: &d,
        recv_counts: &z,
        recv_displs: &d,
    };
    pe.local_fill(&dst, f32::poison())?;
    let sr = if me == 2 { &other } else { &src };
    c.coll.all_to_all_v(&c.s, w, &dst, sr, &v)?;
    expect_mismatch(
        &c,
        2,
        "all_to_all_v float",
        "all_to_all_v float",
        "a2av object",
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MAXC],
        &format!("a2av mismatch PE {me}"),
    );
    // Device counts on PE 3, a plain all_to_all elsewhere.
    let counts = pe.alloc::<u64>(n)?;
    let recv = pe.alloc::<u64>(n)?;
    pe.local_write(&counts, 0, &vec![1u64; n])?;
    pe.local_fill(&recv, u64::MAX)?;
    pe.local_fill(&dst, f32::poison())?;
    if me == 3 {
        c.coll.all_to_all_v_device(
            &c.s,
            w,
            &dst,
            &src,
            DeviceCounts {
                send: &counts,
                recv: &recv,
            },
        )?;
    } else {
        c.coll.all_to_all(&c.s, w, &dst, &src, 1)?;
    }
    expect_mismatch(
        &c,
        3,
        "all_to_all_v_device float",
        "all_to_all float count 1",
        "a2av device",
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MAXC],
        "a2av device mismatch",
    );
    assert!(
        pe.local_vec(&recv)?.iter().all(|&x| x == u64::MAX),
        "PE {me}: recv counts written despite the mismatch"
    );
    // And in step afterwards.
    a2av_host_t::<f32>(&c, w, &src, &dst, 4100, "a2av after the mismatches")
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_all_to_all_v_chunks_and_mismatch() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        a2av_chunks_body,
    );
}
