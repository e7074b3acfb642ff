//! PEs on several "nodes" of this machine, reaching each other over libfabric's tcp provider on
//! loopback: every node of 2 PEs shares memory inside, and uses the fabric across. Each test
//! re-executes this binary through the launcher; a child names its node from its rank
//! (`Config::node`), so one machine plays several nodes. Without libfabric the tests say so and
//! pass.

#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use fabric_data::config;
use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::launcher::Exit;
use rshmem::*;
use std::time::{Duration, Instant};

const ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "fabric"),
    ("RSHMEM_TIMEOUT", "20"),
    ("RSHMEM_HEAP_SIZE", "8M"),
];

fn rand_u64(pe: usize, stream: u64, len: usize) -> Vec<u64> {
    harness::rand_vec::<u64>(pe, stream, len)
}

/// Every host operation between every pair of PEs, with exact checks.
fn every_operation(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let nodes: std::collections::BTreeSet<usize> = pe.placements().iter().map(|p| p.node).collect();
    assert_eq!(nodes.len(), n / 2, "two PEs per node");
    // put: a random block into slot `me` of every PE; 70_000 u64s cross several messages.
    let len = 70_000;
    let x = pe.alloc::<u64>(len * n)?;
    pe.local_write(&x, 0, &vec![u64::MAX; len * n])?;
    pe.barrier_all()?;
    let mine = rand_u64(me, 1, len);
    for t in 0..n {
        pe.put(&x, me * len, &mine, t)?;
    }
    pe.barrier_all()?;
    let got = pe.local_vec(&x)?;
    for s in 0..n {
        assert_eq!(
            &got[s * len..(s + 1) * len],
            &rand_u64(s, 1, len)[..],
            "PE {me}: block from PE {s}"
        );
    }
    // get: read every PE's copy of the block PE (t+1)%n wrote, compare.
    for t in 0..n {
        let mut back = vec![0u64; len];
        let s = (t + 1) % n;
        pe.get(&x, s * len, &mut back, t)?;
        assert_eq!(back, rand_u64(s, 1, len), "get from PE {t}");
    }
    // Non-blocking put and get across nodes, completed by quiet.
    let far = (me + 2) % n;
    let blk = rand_u64(me, 3, 1000);
    pe.barrier_all()?;
    let h = pe.put_nbi(&x, me * len, &blk, far, 7)?;
    pe.quiet()?;
    assert!(h.is_done(), "quiet completes the put");
    pe.barrier_all()?;
    let from = (me + n - 2) % n;
    assert_eq!(
        pe.local_vec(&x)?[from * len..from * len + 1000],
        rand_u64(from, 3, 1000)[..]
    );
    let mut back = vec![0u64; 1000];
    pe.get_nbi(&x, me * len, &mut back, far, 8)?.wait()?;
    assert_eq!(back, blk, "get_nbi of what this PE put");
    pe.barrier_all()?;
    // p / g of single elements, u8 at odd places.
    let b = pe.alloc::<u8>(n * 3)?;
    pe.barrier_all()?;
    for t in 0..n {
        pe.p(&b, me * 3 + 1, (me * 16 + t) as u8, t)?;
    }
    pe.barrier_all()?;
    for t in 0..n {
        for s in 0..n {
            assert_eq!(
                pe.g(&b, s * 3 + 1, t)?,
                (s * 16 + t) as u8,
                "g({s}) at PE {t}"
            );
            assert_eq!(pe.g(&b, s * 3, t)?, 0, "neighbours untouched");
        }
    }
    // Atomics: every PE adds into every PE's counters (u64 and u32), then swaps and
    // compare-swaps in its own slots.
    let c64 = pe.alloc::<u64>(1 + n)?;
    let c32 = pe.alloc::<u32>(1 + n)?;
    pe.barrier_all()?;
    for t in 0..n {
        for _ in 0..5 {
            pe.atomic_fetch_add(&c64, 0, (me + 1) as u64, t)?;
            pe.atomic_add(&c32, 0, (me + 1) as u32 * 1000, t)?;
        }
        let v = rand_u64(me, 2 + t as u64, 1)[0];
        pe.atomic_set(&c64, 1 + me, v, t)?;
        assert_eq!(pe.atomic_fetch(&c64, 1 + me, t)?, v);
        assert_eq!(pe.atomic_swap(&c64, 1 + me, v ^ 1, t)?, v);
        assert_eq!(
            pe.atomic_compare_swap(&c64, 1 + me, v, 7, t)?,
            v ^ 1,
            "failing cas"
        );
        assert_eq!(
            pe.atomic_compare_swap(&c64, 1 + me, v ^ 1, 7, t)?,
            v ^ 1,
            "cas"
        );
        assert_eq!(pe.atomic_fetch_xor(&c64, 1 + me, 0xf0, t)?, 7);
        assert_eq!(pe.atomic_fetch_and(&c64, 1 + me, 0x3f, t)?, 0xf7);
        assert_eq!(pe.atomic_fetch_or(&c64, 1 + me, 0x100, t)?, 0x37);
        pe.atomic_set(&c32, 1 + me, u32::MAX - me as u32, t)?;
        assert_eq!(pe.atomic_fetch_inc(&c32, 1 + me, t)?, u32::MAX - me as u32);
    }
    pe.barrier_all()?;
    let tri = (n * (n + 1) / 2) as u64;
    assert_eq!(pe.local_vec(&c64)?[0], 5 * tri);
    assert_eq!(pe.local_vec(&c32)?[0] as u64, 5 * tri * 1000);
    let v64 = pe.local_vec(&c64)?;
    let v32 = pe.local_vec(&c32)?;
    for s in 0..n {
        assert_eq!(v64[1 + s], 0x137, "slot of PE {s}");
        assert_eq!(v32[1 + s], (u32::MAX - s as u32).wrapping_add(1));
    }
    // put_signal: each PE sends a block to its right neighbour with a signal added after it;
    // the receiver waits on its own signal word, then checks the block.
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let data = pe.alloc::<u64>(4096)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.barrier_all()?;
    for round in 0..3u64 {
        let blk = rand_u64(me, 10 + round, 4096);
        pe.put_signal(&data, 0, &blk, Signal::add(&sig, 0, 1), right)?;
        pe.wait_until(&sig, 0, Cmp::Ge, round + 1)?;
        assert_eq!(
            pe.local_vec(&data)?,
            rand_u64(left, 10 + round, 4096),
            "round {round}"
        );
        pe.barrier_all()?;
    }
    // fence and quiet: a put then a flag, fenced; the flag's reader sees the data.
    let flag = pe.alloc::<u64>(1)?;
    pe.barrier_all()?;
    pe.put(&data, 0, &[me as u64 + 99; 16], right)?;
    pe.fence();
    pe.atomic_set(&flag, 0, 1, right)?;
    pe.quiet()?;
    pe.wait_until(&flag, 0, Cmp::Eq, 1)?;
    assert_eq!(pe.local_vec(&data)?[..16], [left as u64 + 99; 16]);
    pe.barrier_all()?;
    // Bad inputs stay errors across nodes.
    assert!(matches!(
        pe.put(&data, 4095, &[1, 2], far),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        pe.get(&data, 0, &mut [0u64; 1], n),
        Err(Error::PeOutOfRange { .. })
    ));
    assert!(matches!(
        pe.atomic_fetch_add(&data, 4096, 1, far),
        Err(Error::OutOfBounds { .. })
    ));
    let r = pe.host_ptr(&data, 0, far);
    assert!(
        matches!(r, Err(Error::Backend { .. })),
        "no host pointer into another node: {r:?}"
    );
    // A host pointer into a PE of this node reads its copy: what its left neighbour put.
    let near = pe.host_ptr(&data, 15, me ^ 1)?;
    // SAFETY: in range of the peer's live copy; nothing writes it until the frees below.
    let seen = unsafe { near.read_volatile() };
    assert_eq!(
        seen,
        ((me ^ 1) + n - 1) as u64 % n as u64 + 99,
        "host pointer into a PE of this node"
    );
    pe.free(flag)?;
    pe.free(sig)?;
    pe.free(data)?;
    pe.free(c32)?;
    pe.free(c64)?;
    pe.free(b)?;
    pe.free(x)?;
    Ok(())
}

#[test]
fn every_operation_across_two_nodes_of_two_processes() {
    if fabric_data::skip() {
        return;
    }
    let test = "every_operation_across_two_nodes_of_two_processes";
    fabric_data::two_pe_nodes(test, ENV, 4, 1, every_operation);
}

#[test]
fn every_operation_across_three_nodes_of_two_threads() {
    if fabric_data::skip() {
        return;
    }
    let test = "every_operation_across_three_nodes_of_two_threads";
    fabric_data::two_pe_nodes(test, ENV, 3, 2, every_operation);
}

/// Teams, allocation checks, collectives and MoE dispatch/combine across nodes.
fn teams_collectives_moe(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    // A team of one PE per node (the even ranks), and its barrier and allocation.
    let evens = pe.team_split_strided(pe.world_team(), 0, 2, n / 2)?;
    if let Some(t) = &evens {
        assert_eq!(t.n_pes(), n / 2);
        pe.team_barrier(t)?;
    }
    // An all-reduce and a broadcast over the world, random integers, checked exactly.
    let coll = Coll::new(pe, CollConfig::default())?;
    let len = 3000;
    let x = pe.alloc::<u64>(len)?;
    let y = pe.alloc::<u64>(len)?;
    pe.local_write(&x, 0, &rand_u64(me, 50, len))?;
    coll.all_reduce(pe.world_team(), &y, &x, len, ReduceOp::Sum)?;
    let mut want = vec![0u64; len];
    for s in 0..n {
        for (w, v) in want.iter_mut().zip(rand_u64(s, 50, len)) {
            *w = w.wrapping_add(v);
        }
    }
    assert_eq!(pe.local_vec(&y)?, want, "all_reduce");
    coll.broadcast(pe.world_team(), &y, &x, len, n - 1)?;
    assert_eq!(pe.local_vec(&y)?, rand_u64(n - 1, 50, len), "broadcast");
    coll.all_gather(pe.world_team(), &y, &x, len / n)?;
    let got = pe.local_vec(&y)?;
    for s in 0..n {
        let part = &got[s * (len / n)..(s + 1) * (len / n)];
        assert_eq!(
            part,
            &rand_u64(s, 50, len)[..len / n],
            "all_gather from PE {s}"
        );
    }
    // A collective allocation whose size differs on one PE of another node: an error
    // naming a PE, on every PE.
    let r = pe.alloc::<u8>(if me == n - 1 { 64 } else { 32 });
    assert!(
        matches!(r, Err(Error::CollectiveMismatch { .. })),
        "alloc mismatch: {r:?}"
    );
    // Calls of different kinds meet in a barrier: the call words (read over the fabric for
    // the other node) make it a mismatch on every PE, naming both calls.
    let r = if me == n - 1 {
        pe.sync_all()
    } else {
        pe.barrier_all()
    };
    match &r {
        Err(Error::CollectiveMismatch { mine, theirs, .. }) => {
            let both = format!("{mine} {theirs}");
            assert!(
                both.contains("sync_all") && both.contains("barrier"),
                "{both}"
            );
        }
        other => panic!("barrier against sync_all across nodes: {other:?}"),
    }
    // The world stays usable: data still moves across nodes.
    pe.barrier_all()?;
    pe.put(&x, 0, &[me as u64 + 1], (me + 2) % n)?;
    pe.barrier_all()?;
    assert_eq!(pe.g(&x, 0, me)?, ((me + n - 2) % n) as u64 + 1);
    fabric_data::moe_identity(pe, 6, 5)?;
    pe.free(x)?;
    pe.free(y)?;
    if let Some(t) = evens {
        pe.team_destroy(t)?;
    }
    Ok(())
}

#[test]
fn teams_collectives_and_moe_across_two_nodes() {
    if fabric_data::skip() {
        return;
    }
    let test = "teams_collectives_and_moe_across_two_nodes";
    fabric_data::two_pe_nodes(test, ENV, 4, 1, teams_collectives_moe);
}

#[test]
fn killing_a_whole_node_is_peer_lost_naming_it_on_every_other_pe() {
    if fabric_data::skip() {
        return;
    }
    let test = "killing_a_whole_node_is_peer_lost_naming_it_on_every_other_pe";
    if !harness::is_child() {
        let env = [
            (harness::CHILD_VAR, "kill"),
            ("RSHMEM_TIMEOUT", "30"),
            ("RSHMEM_HEAP_SIZE", "1M"),
        ];
        let out = harness::spawn_self(test, 6, 1, &env, Duration::from_secs(15));
        for (p, e) in out.exits.iter().enumerate() {
            if p == 2 || p == 3 {
                assert_eq!(*e, Exit::Signal(9), "process {p} of the killed node");
            } else {
                assert_eq!(
                    *e,
                    Exit::Code(0),
                    "survivor {p} did not see the loss in time: {:?}",
                    out.exits
                );
            }
        }
        return;
    }
    // Three nodes of two processes; node 1 (PEs 2 and 3) is killed during a barrier.
    let pe = Launch::new().config(config(2)).init().expect("init");
    pe.barrier_all().expect("first barrier");
    if pe.my_pe() / 2 == 1 {
        fabric_data::die_soon();
    }
    let t0 = Instant::now();
    let r = pe.barrier_all();
    let el = t0.elapsed();
    match r {
        Err(Error::PeerLost { pe: lost, .. }) => assert!(lost == 2 || lost == 3, "lost {lost}"),
        other => panic!("expected PeerLost of PE 2 or 3, got {other:?} after {el:?}"),
    }
    assert!(
        el < Duration::from_secs(15),
        "loss noticed after {el:?}, not by the timeout"
    );
    // Later calls fail too, at once, never a hang.
    let t0 = Instant::now();
    let r = pe.quiet();
    assert!(matches!(r, Err(Error::PeerLost { .. })), "quiet: {r:?}");
    let r = pe.alloc::<u64>(4);
    assert!(matches!(r, Err(Error::PeerLost { .. })), "alloc: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_node_killed_mid_transfer_ends_the_transfer_in_an_error_naming_it() {
    if fabric_data::skip() {
        return;
    }
    let test = "a_node_killed_mid_transfer_ends_the_transfer_in_an_error_naming_it";
    if !harness::is_child() {
        return fabric_data::second_node_killed(test, "kill-mid-transfer");
    }
    // Two nodes of one process; node 1 is killed while PE 0 puts and gets 8 MiB (many windows
    // of chunks) to and from it, over and over.
    let pe = Launch::new().config(config(1)).init().expect("init");
    let n = 8 << 20;
    let buf = pe.alloc::<u8>(n).expect("alloc");
    pe.barrier_all().expect("first barrier");
    if pe.my_pe() == 1 {
        fabric_data::die_soon();
    }
    let data = harness::rand_vec::<u8>(0, 1, n);
    let mut back = vec![0u8; n];
    let t0 = Instant::now();
    let e = loop {
        if let Err(e) = pe.put(&buf, 0, &data, 1) {
            break e;
        }
        if let Err(e) = pe.get(&buf, 0, &mut back, 1) {
            break e;
        }
        assert!(back == data, "data read back");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no error after the kill"
        );
    };
    fabric_data::assert_pe_1_lost(&e, t0);
}

#[test]
fn a_world_across_nodes_with_the_cuda_backend_gets_past_the_node_check() {
    // Thread-PEs naming two nodes: no refusal of the CUDA backend across nodes any more (GPU
    // heaps of other nodes are staged through the fabric, `tests/cuda_fabric.rs` on a GPU).
    // Where the fabric or the driver is missing, every PE fails with that error instead.
    fabric_data::thread_nodes(
        2,
        |r| r,
        |c| c.heap_size(1 << 20).backend(BackendKind::Cuda),
        |_, init| match init {
            Ok(pe) => pe.finalize().expect("finalize"),
            Err(e) => assert!(
                !e.to_string().contains("nodes"),
                "refused across nodes: {e}"
            ),
        },
    );
}

#[test]
fn thread_pes_on_two_nodes_share_memory_inside_and_use_the_fabric_across() {
    if fabric_data::skip() {
        return;
    }
    fabric_data::thread_nodes(
        4,
        |r| r / 2,
        |c| c.heap_size(1 << 20).timeout(Duration::from_secs(20)),
        |r, init| {
            let pe = init.expect("world");
            let nodes: Vec<usize> = pe.placements().iter().map(|p| p.node).collect();
            assert_eq!(nodes, [0, 0, 1, 1]);
            let x = pe.alloc::<u64>(4).expect("alloc");
            pe.barrier_all().expect("barrier");
            for t in 0..4 {
                pe.p(&x, r, (r * 10 + t) as u64, t).expect("p");
            }
            pe.barrier_all().expect("barrier");
            let got = pe.local_vec(&x).expect("read");
            assert_eq!(got, (0..4).map(|s| (s * 10 + r) as u64).collect::<Vec<_>>());
            // Host pointers reach PEs of this node only.
            let near = pe
                .host_ptr(&x, 3, r ^ 1)
                .expect("host pointer on this node");
            // SAFETY: in range of the peer's live copy; nothing writes it until the free.
            assert_eq!(unsafe { near.read_volatile() }, (3 * 10 + (r ^ 1)) as u64);
            let far = pe.host_ptr(&x, 0, (r + 2) % 4);
            assert!(matches!(far, Err(Error::Backend { .. })), "{far:?}");
            pe.free(x).expect("free");
            pe.finalize().expect("finalize");
        },
    );
}
