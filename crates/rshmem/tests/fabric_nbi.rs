//! Non-blocking puts and gets across "nodes" of this machine over loopback tcp (processes
//! through the launcher, as `fabric.rs`): many in flight at once of odd sizes, completions with
//! their tags, handles dropped early, fence ordering, and a node killed with operations in
//! flight. Without libfabric the tests say so and pass.

#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use fabric_data::config;
use rshmem::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Reproducible random bytes of stream `seed`.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Odd sizes: bytes, around the fabric's small staging slot (4 KiB), around and past one
/// chunk (256 KiB).
const SIZES: &[usize] = &[1, 3, 8, 61, 4095, 4097, 65_537, 262_143, 262_153, 700_001];
const POISON: u8 = 0xA5;
const ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "fabric-nbi"),
    ("RSHMEM_TIMEOUT", "20"),
    ("RSHMEM_HEAP_SIZE", "16M"),
];
const GAP: usize = 64;

/// Offset of size `i` inside a source's region, and the region's length.
fn layout() -> (Vec<usize>, usize) {
    let mut at = Vec::new();
    let mut off = GAP + 1;
    for &s in SIZES {
        at.push(off);
        off += s + GAP;
    }
    (at, off)
}

fn seed(src: usize, dst: usize, i: usize) -> u64 {
    (src * 1000 + dst * 100 + i) as u64
}

/// PEs of other nodes than this one, in world order.
fn far_pes(pe: &Pe) -> Vec<usize> {
    let me = pe.my_pe();
    let node = pe.placements()[me].node;
    (0..pe.n_pes())
        .filter(|&p| pe.placements()[p].node != node)
        .collect()
}

fn non_blocking_operations(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (at, region) = layout();
    let x = pe.alloc::<u8>(region * n)?;
    pe.local_fill(&x, POISON)?;
    pe.barrier_all()?;
    let far = far_pes(pe);
    // Every size to every PE of another node, all in flight at once; half the handles dropped
    // at once (a put's source is copied: dropping waits for nothing).
    let data: Vec<Vec<Vec<u8>>> = far
        .iter()
        .map(|&t| {
            (0..SIZES.len())
                .map(|i| bytes(seed(me, t, i), SIZES[i]))
                .collect()
        })
        .collect();
    let mut kept = Vec::new();
    let mut want = BTreeSet::new();
    for (j, &t) in far.iter().enumerate() {
        for (i, d) in data[j].iter().enumerate() {
            let tag = (t * 100 + i) as u64;
            let h = pe.put_nbi(&x, me * region + at[i], d, t, tag)?;
            want.insert((true, t, tag));
            if i % 2 == 1 {
                kept.push(h);
            }
        }
    }
    pe.quiet()?;
    assert!(kept.iter().all(|h| h.is_done()), "quiet ends every put");
    drop(kept);
    let mut got = Vec::new();
    pe.completions(&mut got);
    let seen: BTreeSet<_> = got
        .iter()
        .map(|c| (c.kind == OpKind::Put, c.pe, c.tag))
        .collect();
    assert_eq!(got.len(), want.len(), "one entry per put: {got:?}");
    assert_eq!(seen, want, "entries with their tags");
    let ids: BTreeSet<_> = got.iter().map(|c| c.id).collect();
    assert_eq!(ids.len(), got.len(), "distinct ids");
    pe.barrier_all()?;
    let mine = pe.local_vec(&x)?;
    // The PEs of other nodes are the ones that put into this PE.
    for &s in &far {
        for (i, &size) in SIZES.iter().enumerate() {
            let lo = s * region + at[i];
            assert!(
                mine[lo..lo + size] == bytes(seed(s, me, i), size)[..],
                "PE {me}: size {size} from PE {s}"
            );
            assert_eq!(mine[lo - 1], POISON, "before size {size} from PE {s}");
            assert_eq!(mine[lo + size], POISON, "after size {size} from PE {s}");
        }
    }
    for s in (0..n).filter(|s| !far.contains(s)) {
        assert!(
            mine[s * region..(s + 1) * region]
                .iter()
                .all(|&b| b == POISON),
            "PE {me}: region of PE {s} of this node untouched"
        );
    }
    pe.barrier_all()?;
    // Gets of what this PE put, all in flight: a third dropped at once (the drop waits and
    // the bytes land), a third waited one by one, a third seen done after quiet.
    let mut outs: Vec<Vec<u8>> = far
        .iter()
        .flat_map(|_| SIZES.iter().map(|&s| vec![0x5Au8; s + 2]))
        .collect();
    {
        let mut later = Vec::new();
        for (k, out) in outs.iter_mut().enumerate() {
            let (j, i) = (k / SIZES.len(), k % SIZES.len());
            let s = SIZES[i];
            let tag = 10_000 + k as u64;
            let h = pe.get_nbi(&x, me * region + at[i], &mut out[1..1 + s], far[j], tag)?;
            match k % 3 {
                0 => drop(h),
                1 => h.wait()?,
                _ => later.push(h),
            }
        }
        pe.quiet()?;
        assert!(later.iter().all(|h| h.is_done()));
    }
    for (k, out) in outs.iter().enumerate() {
        let (j, i) = (k / SIZES.len(), k % SIZES.len());
        let s = SIZES[i];
        assert!(
            out[1..1 + s] == data[j][i][..],
            "get of size {s} from PE {}",
            far[j]
        );
        assert_eq!(
            (out[0], out[s + 1]),
            (0x5A, 0x5A),
            "around the get of size {s}"
        );
    }
    got.clear();
    pe.completions(&mut got);
    let tags: BTreeSet<u64> = got.iter().map(|c| c.tag).collect();
    assert_eq!(tags, (10_000..10_000 + outs.len() as u64).collect());
    assert!(got.iter().all(|c| c.kind == OpKind::Get));
    pe.barrier_all()?;
    // Fence: data put without waiting, a fence, then a flag (a plain put, an atomic or a
    // non-blocking put by turns); the PE that sees the flag sees the data. Pairs across nodes.
    let partner = (me + n / 2) % n;
    let big = 600_000;
    let buf = pe.alloc::<u8>(big)?;
    let flag = pe.alloc::<u64>(1)?;
    pe.barrier_all()?;
    for r in 1..=24u64 {
        let len = big - r as usize;
        let d = bytes(seed(me, partner, 50) + r, len);
        drop(pe.put_nbi(&buf, 0, &d, partner, r)?);
        pe.fence();
        match r % 3 {
            0 => pe.p(&flag, 0, r, partner)?,
            1 => pe.atomic_set(&flag, 0, r, partner)?,
            _ => drop(pe.put_nbi(&flag, 0, &[r], partner, r)?),
        }
        pe.wait_until(&flag, 0, Cmp::Eq, r)?;
        let seen = pe.local_vec(&buf)?;
        assert!(
            seen[..len] == bytes(seed(partner, me, 50) + r, len)[..],
            "PE {me} round {r}: the flag came before the data"
        );
        pe.barrier_all()?;
    }
    let mut drain = Vec::new();
    pe.completions(&mut drain);
    pe.free(flag)?;
    pe.free(buf)?;
    pe.free(x)?;
    Ok(())
}

#[test]
fn non_blocking_operations_across_two_nodes_of_two_processes() {
    if fabric_data::skip() {
        return;
    }
    let test = "non_blocking_operations_across_two_nodes_of_two_processes";
    fabric_data::two_pe_nodes(test, ENV, 4, 1, non_blocking_operations);
}

#[test]
fn non_blocking_operations_across_two_nodes_of_two_threads() {
    if fabric_data::skip() {
        return;
    }
    let test = "non_blocking_operations_across_two_nodes_of_two_threads";
    fabric_data::two_pe_nodes(test, ENV, 2, 2, non_blocking_operations);
}

#[test]
fn a_node_killed_with_non_blocking_operations_in_flight_is_an_error_naming_it() {
    if fabric_data::skip() {
        return;
    }
    let test = "a_node_killed_with_non_blocking_operations_in_flight_is_an_error_naming_it";
    if !harness::is_child() {
        return fabric_data::second_node_killed(test, "kill-nbi");
    }
    // Two nodes of one process; node 1 is killed while PE 0 keeps windows of 32 puts and 32
    // gets of 256 KiB in flight to it, each window ended by quiet.
    let pe = Launch::new().config(config(1)).init().expect("init");
    let chunk = 256 << 10;
    let buf = pe.alloc::<u8>(64 * chunk).expect("alloc");
    pe.barrier_all().expect("first barrier");
    if pe.my_pe() == 1 {
        fabric_data::die_soon();
    }
    let data = bytes(1, chunk);
    let mut backs = vec![vec![0u8; chunk]; 32];
    let t0 = Instant::now();
    let mut submitted = 0usize;
    let mut entries = Vec::new();
    let e = 'run: loop {
        let mut puts = Vec::new();
        let mut gets = Vec::new();
        // Poisoned: the gets must bring the target's zeros back.
        backs.iter_mut().for_each(|b| b.fill(0xa5));
        for (i, back) in backs.iter_mut().enumerate() {
            match pe.put_nbi(&buf, i * chunk, &data, 1, i as u64) {
                Ok(h) => puts.push(h),
                Err(e) => break 'run e,
            }
            submitted += 1;
            match pe.get_nbi(&buf, (32 + i) * chunk, back, 1, 100 + i as u64) {
                Ok(h) => gets.push(h),
                Err(e) => break 'run e,
            }
            submitted += 1;
        }
        let q = pe.quiet();
        // Each handle ends at once after quiet (ended well, or failed).
        let t1 = Instant::now();
        let waits: Vec<Result<()>> = puts.into_iter().chain(gets).map(|h| h.wait()).collect();
        assert!(t1.elapsed() < Duration::from_secs(5), "handles after quiet");
        pe.completions(&mut entries);
        if let Err(e) = q {
            assert!(waits.iter().any(|w| w.is_err()) || entries.len() == submitted);
            break e;
        }
        assert!(waits.iter().all(|w| w.is_ok()), "{waits:?}");
        assert!(
            backs.iter().all(|b| b.iter().all(|&v| v == 0)),
            "gets of zeros"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no error after the kill"
        );
    };
    fabric_data::assert_pe_1_lost(&e, t0);
    // No entry is dropped: every operation that was submitted has its entry (a failed one too)
    // once quiet ended them all.
    let _ = pe.quiet();
    pe.completions(&mut entries);
    assert_eq!(entries.len(), submitted, "an entry per submitted operation");
    // The first error may be the transport's (a reset connection); the monitor takes the
    // peer as lost within its probe's limit, and quiet then says so.
    let t1 = Instant::now();
    loop {
        match pe.quiet() {
            Err(Error::PeerLost { pe: 1, .. }) => break,
            r => assert!(t1.elapsed() < Duration::from_secs(10), "quiet: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Later operations to it fail at once, never a hang.
    let t2 = Instant::now();
    let mut one = [0u8; 8];
    let r = pe.get_nbi(&buf, 0, &mut one, 1, 0).and_then(|h| h.wait());
    assert!(matches!(r, Err(Error::PeerLost { pe: 1, .. })), "{r:?}");
    let r = pe.put_nbi(&buf, 0, &one, 1, 0).and_then(|h| h.wait());
    assert!(matches!(r, Err(Error::PeerLost { pe: 1, .. })), "{r:?}");
    assert!(t2.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_get_handle_kept_past_the_end_of_its_world_is_exact_or_world_ended() {
    if fabric_data::skip() {
        return;
    }
    // Thread-PEs of one process on two nodes: PE 0 keeps a get's handle while it finalizes.
    fabric_data::thread_nodes(
        2,
        |r| r,
        |c| c.heap_size(4 << 20).timeout(Duration::from_secs(20)),
        |r, init| {
            let pe = init.expect("world");
            let n = 300_001;
            let x = pe.alloc::<u8>(n).expect("alloc");
            pe.local_write(&x, 0, &bytes(r as u64 + 7, n))
                .expect("fill");
            pe.barrier_all().expect("barrier");
            let mut dst = vec![0x5Au8; n];
            let h = pe.get_nbi(&x, 0, &mut dst, 1 - r, 1).expect("get_nbi");
            pe.finalize().expect("finalize");
            // Finalize's quiet ended the get; its bytes land if the fabric is still there,
            // else the handle says the world ended and the buffer is untouched.
            match h.wait() {
                Ok(()) => assert!(dst == bytes((1 - r) as u64 + 7, n), "landed exactly"),
                Err(Error::WorldEnded) => assert!(dst.iter().all(|&b| b == 0x5A)),
                Err(e) => panic!("{e}"),
            }
        },
    );
}

#[test]
fn a_full_completion_queue_refuses_a_submission_across_nodes_before_it_starts() {
    if fabric_data::skip() {
        return;
    }
    // Thread-PEs on two nodes, a queue of 4 entries: operations in flight hold their places.
    fabric_data::thread_nodes(
        2,
        |r| r,
        |c| {
            c.heap_size(4 << 20)
                .timeout(Duration::from_secs(20))
                .completion_queue(4)
        },
        |r, init| {
            let pe = init.expect("world");
            let other = 1 - r;
            let x = pe.alloc::<u8>(1 << 20).expect("alloc");
            pe.local_fill(&x, POISON).expect("fill");
            pe.barrier_all().expect("barrier");
            let data = bytes(r as u64, 200_000);
            let mut hs = Vec::new();
            for i in 0..4 {
                hs.push(
                    pe.put_nbi(&x, i * 200_000, &data, other, i as u64)
                        .expect("put"),
                );
            }
            let mut dst = [7u8; 16];
            let full = pe.get_nbi(&x, 0, &mut dst, other, 9).map(|h| h.id());
            assert!(
                matches!(full, Err(Error::QueueFull { capacity: 4 })),
                "{full:?}"
            );
            assert_eq!(dst, [7u8; 16], "a refused get wrote its destination");
            let full = pe
                .put_nbi(&x, 900_000, &data[..8], other, 9)
                .map(|h| h.id());
            assert!(matches!(full, Err(Error::QueueFull { .. })), "{full:?}");
            pe.quiet().expect("quiet");
            drop(hs);
            let mut got = Vec::new();
            assert_eq!(pe.completions(&mut got), 4);
            let tags: Vec<u64> = got.iter().map(|c| c.tag).collect();
            assert_eq!(
                tags.iter().copied().collect::<BTreeSet<_>>(),
                (0..4).collect()
            );
            // Room again once drained.
            pe.put_nbi(&x, 900_000, &data[..8], other, 10)
                .expect("room after drain")
                .wait()
                .expect("put");
            pe.barrier_all().expect("barrier");
            let mine = pe.local_vec(&x).expect("read");
            let from = bytes(other as u64, 200_000);
            for i in 0..4 {
                assert!(
                    mine[i * 200_000..(i + 1) * 200_000] == from[..],
                    "block {i}"
                );
            }
            assert_eq!(mine[900_000..900_008], from[..8]);
            assert_eq!(
                mine[900_008], POISON,
                "the refused put moved nothing past its end"
            );
            pe.finalize().expect("finalize");
        },
    );
}
