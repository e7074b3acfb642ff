//! Data tests that matter most across processes: run on threads, processes and mixed mode by
//! the harness (one suite, parameterized over modes).

#[path = "harness/mod.rs"]
mod harness;

use rshmem::Signal;
use rshmem::*;

/// Placement map: consistent with the mode and the `p * T + t` convention; same-process peers
/// are exactly those with my process index.
fn placement_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.placement(pe.my_pe())?;
    assert_eq!(me.pid, std::process::id());
    let t = pe
        .placements()
        .iter()
        .filter(|p| p.process == me.process)
        .count();
    for (i, p) in pe.placements().iter().enumerate() {
        assert_eq!(p.pe, i);
        assert_eq!(pe.is_same_process(i)?, p.process == me.process, "PE {i}");
        assert_eq!(p.pid == me.pid, p.process == me.process);
        if pe.mode() != Mode::Threads {
            assert_eq!(i, p.process * t + p.thread, "PE {i}: {p:?}");
            assert_eq!(p.device, i, "single node: device = node-local PE index");
        }
    }
    let want = match (t, n / t) {
        (_, 1) => Mode::Threads,
        (1, _) => Mode::Processes,
        _ => Mode::Mixed,
    };
    assert_eq!(pe.mode(), want);
    for bad in [n, n + 1, usize::MAX] {
        let r = pe.placement(bad);
        assert!(
            matches!(r, Err(Error::PeOutOfRange { pe, n_pes, what: "world" }) if pe == bad && n_pes == n),
            "placement({bad}): {r:?}"
        );
    }
    Ok(())
}
mode_test!(placement_map, [1, 2, 4], placement_body);

/// Every PE puts a random block into every other PE (all pairs), then checks all blocks.
fn all_pairs_body(pe: &Pe) -> Result<()> {
    let (n, me) = (pe.n_pes(), pe.my_pe());
    const L: usize = 33;
    let x = pe.alloc::<i64>(L * n)?;
    pe.local_fill(&x, i64::MIN)?;
    pe.barrier_all()?;
    let mine: Vec<i64> = harness::rand_vec(me, 7, L);
    for dst in 0..n {
        pe.put(&x, me * L, &mine, dst)?;
    }
    pe.barrier_all()?;
    let got = pe.local_vec(&x)?;
    for src in 0..n {
        let want: Vec<i64> = harness::rand_vec(src, 7, L);
        assert_eq!(
            &got[src * L..(src + 1) * L],
            &want[..],
            "block from PE {src}"
        );
    }
    // get back the block this PE wrote into the next PE
    let mut back = vec![0i64; L];
    pe.get(&x, me * L, &mut back, (me + 1) % n)?;
    assert_eq!(back, mine);
    pe.free(x)
}
mode_test!(all_pairs_put_get, [2, 4], all_pairs_body);

/// Atomics and signals across processes: everyone adds into PE 0, counts with fetch_inc, and
/// signals the next PE after a put; the waiter checks the data behind the signal.
fn atomics_signal_body(pe: &Pe) -> Result<()> {
    let (n, me) = (pe.n_pes(), pe.my_pe());
    let acc = pe.alloc::<u64>(2)?;
    let data = pe.alloc::<u32>(64)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_fill(&acc, 0)?;
    pe.local_fill(&data, 0xffff_ffff)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    let mut tickets = Vec::new();
    for _ in 0..10 {
        pe.atomic_add(&acc, 0, me as u64 + 1, 0)?;
        tickets.push(pe.atomic_fetch_inc(&acc, 1, 0)?);
    }
    // every ticket is unique across PEs (checked below through PE 0's copy): here, each PE's
    // are increasing and below the total
    assert!(
        tickets.windows(2).all(|w| w[0] < w[1]) && tickets[9] < 10 * n as u64,
        "tickets of PE {me}: {tickets:?}"
    );
    let payload: Vec<u32> = harness::rand_vec(me, 3, 64);
    let next = (me + 1) % n;
    pe.put_signal(&data, 0, &payload, Signal::add(&sig, 0, 1), next)?;
    pe.wait_until(&sig, 0, Cmp::Ge, 1u64)?;
    let prev = (me + n - 1) % n;
    assert_eq!(pe.local_vec(&data)?, harness::rand_vec::<u32>(prev, 3, 64));
    pe.barrier_all()?;
    // every PE checks PE 0's counters, and that nobody else's copy was touched
    let total = (1..=n as u64).sum::<u64>() * 10;
    for p in 0..n {
        let mut got = [u64::MAX; 2];
        pe.get(&acc, 0, &mut got, p)?;
        let want = if p == 0 {
            [total, 10 * n as u64]
        } else {
            [0, 0]
        };
        assert_eq!(got, want, "counters of PE {p} seen by PE {me}");
    }
    // the signal was added exactly once
    assert_eq!(pe.signal_fetch(&sig, 0)?, 1);
    pe.barrier_all()?;
    pe.free(sig)?;
    pe.free(data)?;
    pe.free(acc)
}
mode_test!(atomics_and_signals, [2, 3, 4], atomics_signal_body);

/// Non-blocking puts and gets with tags, and the completion queue, across processes.
fn nbi_cq_body(pe: &Pe) -> Result<()> {
    let (n, me) = (pe.n_pes(), pe.my_pe());
    const L: usize = 16;
    let x = pe.alloc::<f64>(L * n)?;
    pe.local_fill(&x, f64::NAN)?;
    pe.barrier_all()?;
    let src: Vec<f64> = harness::rand_vec(me, 11, L);
    let mut ids = Vec::new();
    for dst in 0..n {
        let h = pe.put_nbi(&x, me * L, &src, dst, 1000 + dst as u64)?;
        ids.push(h.id());
        h.wait()?;
    }
    pe.quiet()?;
    let mut done = Vec::new();
    assert_eq!(pe.completions(&mut done), n);
    for (dst, c) in done.iter().enumerate() {
        assert_eq!(
            (c.id, c.kind, c.pe, c.tag),
            (ids[dst], OpKind::Put, dst, 1000 + dst as u64)
        );
    }
    pe.barrier_all()?;
    let from = (me + 1) % n;
    let mut dst = vec![f64::NAN; L * n];
    let h = pe.get_nbi(&x, 0, &mut dst, from, 7)?;
    let id = h.id();
    h.wait()?;
    for s in 0..n {
        let want: Vec<f64> = harness::rand_vec(s, 11, L);
        assert_eq!(
            &dst[s * L..(s + 1) * L],
            &want[..],
            "block {s} read from PE {from}"
        );
    }
    done.clear();
    assert_eq!(pe.completions(&mut done), 1);
    assert_eq!(
        (done[0].id, done[0].kind, done[0].pe, done[0].tag),
        (id, OpKind::Get, from, 7)
    );
    pe.barrier_all()?;
    pe.free(x)
}
mode_test!(nbi_and_completion_queue, [2, 4], nbi_cq_body);

/// Collective mismatch is reported on every PE across processes too.
fn mismatch_body(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let r = pe.alloc::<u8>(if me == 1 { 10 } else { 20 });
    // PE 1 names the first PE that disagrees with it (PE 0); the others name PE 1
    let other = if me == 1 { 0 } else { 1 };
    assert!(
        matches!(&r, Err(Error::CollectiveMismatch { op: "alloc", pe, .. }) if *pe == other),
        "PE {me}: {r:?}"
    );
    // the world is still usable afterwards: an object at the same offset, data through it
    let x = pe.alloc::<u16>(4)?;
    pe.local_fill(&x, u16::MAX)?;
    pe.barrier_all()?;
    let next = (me + 1) % pe.n_pes();
    pe.p(&x, 1, me as u16 + 1, next)?;
    pe.barrier_all()?;
    let prev = (me + pe.n_pes() - 1) % pe.n_pes();
    assert_eq!(
        pe.local_vec(&x)?,
        [u16::MAX, prev as u16 + 1, u16::MAX, u16::MAX]
    );
    pe.barrier_all()?;
    pe.free(x)
}
mode_test!(alloc_mismatch_all_modes, [2, 4], mismatch_body);
