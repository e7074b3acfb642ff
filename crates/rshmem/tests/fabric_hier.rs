//! Hierarchical collectives and the internode MoE path on several "nodes" of this machine over
//! libfabric's tcp provider on loopback (as tests/fabric.rs: the launcher re-executes this
//! binary, each child names its node from its rank). Every check is exact: integers, and f32
//! values that are multiples of 1/8 and small enough that every sum is exact whatever its
//! grouping. The hierarchical and the flat paths run in the same world on the same inputs,
//! and the network traffic of each is counted ([`Pe::net_traffic`]). Without libfabric the
//! tests say so and pass.

#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use rshmem::coll::{Coll, CollConfig, ReduceOp, ToRoot};
use rshmem::ep::{Dispatched, EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::*;
use std::time::Duration;

const ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "fabric_hier"),
    ("RSHMEM_TIMEOUT", "30"),
    ("RSHMEM_HEAP_SIZE", "16M"),
];

/// Runs `test` as one process per PE on the nodes `nodes` (by rank); every process must exit 0.
fn processes(test: &str, nodes: &[usize], body: fn(&Pe) -> Result<()>) {
    if !harness::is_child() {
        let out = harness::spawn_self(test, nodes.len(), 1, ENV, Duration::from_secs(5));
        assert_eq!(out.code, 0, "{test}: {:?}", out.exits);
        return;
    }
    let pe = Launch::new()
        .config(fabric_data::config_of(|r| nodes[r]))
        .init()
        .expect("init");
    body(&pe).expect("body");
    pe.finalize().expect("finalize");
}

fn traffic(pe: &Pe) -> u64 {
    pe.net_traffic().bytes
}

/// Bytes of the argument records a collective reads from members of other nodes.
fn record_bytes(pe: &Pe) -> u64 {
    let nm = pe.node_map(pe.world_team());
    let mine = nm.node(pe.my_pe());
    let far = (0..pe.n_pes()).filter(|&p| nm.node(p) != mine).count();
    far as u64 * 12 * 8
}

/// Bytes of the hierarchical collectives' partials scratch in these tests.
const SCRATCH: usize = 4 << 10;

/// Part `q` of `p` of `count` elements: its length (as `coll::plan::part`).
fn part_len(q: usize, p: usize, count: usize) -> usize {
    (q + 1) * count / p - q * count / p
}

/// reduce from every root and out-of-place reduce_scatter, hierarchical (through the partials
/// scratch, in several windows) and flat: random integers and exactly representable f32,
/// poisoned outputs (a non-root's stays poisoned), the bytes each PE reads across nodes exact
/// for both paths, and fewer in all for the hierarchical one.
fn reductions(pe: &Pe, hier: &Coll<'_>, flat: &Coll<'_>) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let world = pe.world_team();
    let nm = pe.node_map(world);
    let (nn, p) = (nm.n_nodes(), nm.max_local());
    let mine = nm.node(me);
    let ln = nm.members(mine).len();
    let owned: Vec<usize> = (0..p).filter(|q| q % ln == nm.local(me)).collect();
    // Bytes the hierarchical reduce of `count` elements of `es` bytes reads across nodes on
    // this PE: its parts of every window of the root's node, from each other node.
    let hier_reduce = |root: usize, count: usize, es: usize| -> u64 {
        if nm.node(root) != mine {
            return 0;
        }
        let w = SCRATCH / es;
        let elems: usize = (0..count)
            .step_by(w)
            .map(|a| {
                let len = w.min(count - a);
                owned.iter().map(|&q| part_len(q, p, len)).sum::<usize>()
            })
            .sum();
        ((nn - 1) * elems * es) as u64
    };
    let far = |pe_k: usize| n - nm.members(nm.node(pe_k)).len();
    for count in [1usize, 1001, 3000] {
        let x = pe.alloc::<u64>(count)?;
        let y = pe.alloc::<u64>(count)?;
        let want = (0..n).fold(vec![0u64; count], |mut acc, s| {
            for (a, v) in acc.iter_mut().zip(harness::rand_vec::<u64>(s, 40, count)) {
                *a = a.wrapping_add(v);
            }
            acc
        });
        pe.local_write(&x, 0, &harness::rand_vec::<u64>(me, 40, count))?;
        let (mut total_hier, mut total_flat) = (0u64, 0u64);
        for root in 0..n {
            for (name, coll) in [("hier", hier), ("flat", flat)] {
                pe.local_fill(&y, u64::MAX)?; // poison
                let before = traffic(pe);
                coll.reduce(
                    world,
                    &y,
                    &x,
                    count,
                    ToRoot {
                        op: ReduceOp::Sum,
                        root,
                    },
                )?;
                let moved = traffic(pe) - before - record_bytes(pe);
                let got = pe.local_vec(&y)?;
                if me == root {
                    assert_eq!(got, want, "{name} reduce of {count} to {root}");
                } else {
                    assert!(
                        got.iter().all(|&v| v == u64::MAX),
                        "{name}: non-root written"
                    );
                }
                let expect = if name == "hier" {
                    hier_reduce(root, count, 8)
                } else if me == root {
                    (far(root) * count * 8) as u64
                } else {
                    0
                };
                assert_eq!(
                    moved, expect,
                    "{name} reduce bytes across nodes, root {root}"
                );
            }
            // In all, over the team: each other node's partial once, against every PE of
            // other nodes once.
            total_hier += ((nn - 1) * count * 8) as u64;
            total_flat += (far(root) * count * 8) as u64;
            // In place, the root's input is overwritten with the result.
            pe.local_write(&y, 0, &harness::rand_vec::<u64>(me, 40, count))?;
            hier.reduce(
                world,
                &y,
                &y,
                count,
                ToRoot {
                    op: ReduceOp::Sum,
                    root,
                },
            )?;
            let got = pe.local_vec(&y)?;
            if me == root {
                assert_eq!(got, want, "hier in-place reduce to {root}");
            } else {
                assert_eq!(got, harness::rand_vec::<u64>(me, 40, count), "input kept");
            }
        }
        assert!(total_hier < total_flat, "{total_hier} vs {total_flat}");
        pe.free(y)?;
        pe.free(x)?;
    }
    // f32 (exact values): reduce to every root, and reduce_scatter out of place.
    let count = 1500;
    let f = pe.alloc::<f32>(count * n)?;
    let g = pe.alloc::<f32>(count)?;
    let ins: Vec<Vec<f32>> = (0..n)
        .map(|s| harness::rand_vec::<f32>(s, 41, count * n))
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    pe.local_write(&f, 0, &ins[me])?;
    for (name, coll) in [("hier", hier), ("flat", flat)] {
        for root in 0..n {
            pe.local_fill(&g, f32::NAN)?;
            coll.reduce(
                world,
                &g,
                &f,
                count,
                ToRoot {
                    op: ReduceOp::Sum,
                    root,
                },
            )?;
            if me == root {
                let want: Vec<f32> = (0..count).map(|i| ins.iter().map(|v| v[i]).sum()).collect();
                assert_eq!(bits(&pe.local_vec(&g)?), bits(&want), "{name} f32 reduce");
            }
        }
        pe.local_fill(&g, f32::NAN)?;
        let before = traffic(pe);
        coll.reduce_scatter(world, &g, &f, count, ReduceOp::Sum)?;
        let moved = traffic(pe) - before - record_bytes(pe);
        let want: Vec<f32> = (0..count)
            .map(|i| ins.iter().map(|v| v[me * count + i]).sum())
            .collect();
        assert_eq!(
            bits(&pe.local_vec(&g)?),
            bits(&want),
            "{name} f32 reduce_scatter"
        );
        // Each block crosses to its member once per other node (hier), once per PE of
        // another node (flat).
        let expect = if name == "hier" {
            (nn - 1) * count * 4
        } else {
            far(me) * count * 4
        };
        assert_eq!(
            moved, expect as u64,
            "{name} reduce_scatter bytes across nodes"
        );
    }
    pe.free(g)?;
    pe.free(f)?;
    Ok(())
}

/// Barriers across nodes: only the node leaders touch other nodes' control blocks, one
/// arrival per round of their dissemination and one read per other node, fewer messages
/// in all than the flat dissemination (an arrival per round whose partner is on another node,
/// a call-word read per member of other nodes); puts before a barrier are seen after it.
fn barriers(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let world = pe.world_team();
    let nm = pe.node_map(world);
    let nn = nm.n_nodes();
    let rounds = |k: usize| (usize::BITS - k.saturating_sub(1).leading_zeros()) as usize;
    let hier_msgs = |m: usize| {
        if nm.leader(nm.node(m)) == m {
            rounds(nn) + nn - 1
        } else {
            0
        }
    };
    let flat_msgs = |m: usize| {
        let k = nm.node(m);
        let arrivals = (0..rounds(n))
            .filter(|&r| nm.node((m + (1 << r)) % n) != k)
            .count();
        arrivals + n - nm.members(k).len()
    };
    let total_hier: usize = (0..n).map(hier_msgs).sum();
    let total_flat: usize = (0..n).map(flat_msgs).sum();
    assert!(total_hier < total_flat, "{total_hier} vs {total_flat}");
    let x = pe.alloc::<u64>(n)?;
    for round in 0..3u64 {
        for (name, ctrl_ops) in [("barrier_all", 0), ("team_barrier", 1), ("sync_all", 2)] {
            // Each PE puts its mark into slot `me` of every PE, then the barrier.
            for t in 0..n {
                pe.put(&x, me, &[round * 100 + me as u64 + ctrl_ops], t)?;
            }
            let before = pe.net_traffic().ctrl_ops;
            match ctrl_ops {
                0 => pe.barrier_all()?,
                1 => pe.team_barrier(world)?,
                _ => {
                    pe.quiet()?;
                    pe.sync_all()?
                }
            }
            let msgs = pe.net_traffic().ctrl_ops - before;
            assert_eq!(msgs, hier_msgs(me) as u64, "{name}: messages across nodes");
            let want: Vec<u64> = (0..n).map(|s| round * 100 + s as u64 + ctrl_ops).collect();
            assert_eq!(pe.local_vec(&x)?, want, "{name}: puts before it");
            pe.barrier_all()?; // nobody writes the next marks before everyone read these
        }
    }
    pe.free(x)?;
    Ok(())
}

/// all_reduce, all_gather, broadcast and reduce_scatter, hierarchical and flat, checked
/// exactly; the hierarchical all_reduce reads exactly its parts' node partials across nodes,
/// fewer bytes than the flat plan.
fn collectives(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let world = pe.world_team();
    let nm = pe.node_map(world);
    assert!(nm.is_hierarchical(), "{nm:?}");
    // A small partials scratch, so reduce and reduce_scatter run in several windows.
    let hier = Coll::new(
        pe,
        CollConfig::default()
            .hier_bytes(0)
            .hier_scratch_bytes(SCRATCH),
    )?;
    let flat = Coll::new(pe, CollConfig::default().hierarchical(false))?;
    // Only the hierarchical collectives hold the partials scratch.
    assert_eq!(flat.scratch_bytes(), 8 * (16 + 2 * n));
    assert_eq!(hier.scratch_bytes(), 8 * (16 + 2 * n) + SCRATCH);
    reductions(pe, &hier, &flat)?;
    // Several chunks (64 KiB chunk) and a count not divisible by the parts.
    for (ci, count) in [1usize, 1001, 40_003].into_iter().enumerate() {
        let stream = 100 + ci as u64;
        let x = pe.alloc::<u64>(count)?;
        let y = pe.alloc::<u64>(count)?;
        let mut want = vec![0u64; count];
        for s in 0..n {
            for (w, v) in want
                .iter_mut()
                .zip(harness::rand_vec::<u64>(s, stream, count))
            {
                *w = w.wrapping_add(v);
            }
        }
        for (name, coll) in [("hier", &hier), ("flat", &flat)] {
            pe.local_write(&x, 0, &harness::rand_vec::<u64>(me, stream, count))?;
            pe.local_fill(&y, u64::MAX)?; // poison
            let before = traffic(pe);
            coll.all_reduce(world, &y, &x, count, ReduceOp::Sum)?;
            let moved = traffic(pe) - before - record_bytes(pe);
            assert_eq!(pe.local_vec(&y)?, want, "{name} all_reduce of {count}");
            if name == "hier" {
                // Parts: as many as the largest node has members; this PE owns those whose
                // index maps to its local index, and reads each from one PE per other node.
                let p = nm.max_local();
                let ln = nm.members(nm.node(me)).len();
                let owned: usize = (0..p)
                    .filter(|q| q % ln == nm.local(me))
                    .map(|q| (q + 1) * count / p - q * count / p)
                    .sum();
                let want_bytes = ((nm.n_nodes() - 1) * owned * 8) as u64;
                assert_eq!(moved, want_bytes, "hier all_reduce bytes across nodes");
            } else {
                let far = n - nm.members(nm.node(me)).len();
                assert!(
                    moved >= (far * count * 8 / n) as u64,
                    "flat all_reduce moved {moved}"
                );
            }
            // in place
            pe.local_write(&x, 0, &harness::rand_vec::<u64>(me, stream, count))?;
            coll.all_reduce(world, &x, &x, count, ReduceOp::Sum)?;
            assert_eq!(
                pe.local_vec(&x)?,
                want,
                "{name} in-place all_reduce of {count}"
            );
        }
        pe.free(y)?;
        pe.free(x)?;
    }
    // Fewer bytes across nodes than the flat plan, for one size, on this PE.
    let count = 20_000;
    let x = pe.alloc::<u32>(count)?;
    pe.local_write(&x, 0, &harness::rand_vec::<u32>(me, 7, count))?;
    let mut moved = Vec::new();
    for coll in [&hier, &flat] {
        let before = traffic(pe);
        coll.all_reduce(world, &x, &x, count, ReduceOp::Xor)?;
        moved.push(traffic(pe) - before);
    }
    assert!(
        moved[0] < moved[1],
        "hier {} vs flat {}",
        moved[0],
        moved[1]
    );
    let mut want = harness::rand_vec::<u32>(0, 7, count);
    for s in 1..n {
        for (w, v) in want.iter_mut().zip(harness::rand_vec::<u32>(s, 7, count)) {
            *w ^= v;
        }
    }
    // Two xor all_reduces in a row: the xor of every input, then that xored n times.
    let expect: Vec<u32> = if n % 2 == 0 { vec![0; count] } else { want };
    assert_eq!(pe.local_vec(&x)?, expect, "two xor all_reduces");
    pe.free(x)?;
    // f32 (exact values) with max and sum; i32 min.
    let count = 3000;
    let f = pe.alloc::<f32>(count)?;
    let g = pe.alloc::<f32>(count)?;
    let ins: Vec<Vec<f32>> = (0..n)
        .map(|s| harness::rand_vec::<f32>(s, 9, count))
        .collect();
    for (name, coll) in [("hier", &hier), ("flat", &flat)] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            pe.local_write(&f, 0, &ins[me])?;
            pe.local_fill(&g, f32::NAN)?;
            coll.all_reduce(world, &g, &f, count, op)?;
            let want: Vec<f32> = (0..count)
                .map(|i| {
                    let it = ins.iter().map(|v| v[i]);
                    match op {
                        ReduceOp::Sum => it.sum(),
                        _ => it.fold(f32::MIN, f32::max),
                    }
                })
                .collect();
            let got = pe.local_vec(&g)?;
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} f32 {op:?}"
            );
        }
    }
    pe.free(g)?;
    pe.free(f)?;
    let count = 777;
    let a = pe.alloc::<i32>(count)?;
    let b = pe.alloc::<i32>(count * n)?;
    for (name, coll) in [("hier", &hier), ("flat", &flat)] {
        // all_gather out of place and in place
        pe.local_write(&a, 0, &harness::rand_vec::<i32>(me, 11, count))?;
        pe.local_fill(&b, i32::MIN)?;
        let before = traffic(pe);
        coll.all_gather(world, &b, &a, count)?;
        let moved = traffic(pe) - before - record_bytes(pe);
        let want: Vec<i32> = (0..n)
            .flat_map(|s| harness::rand_vec::<i32>(s, 11, count))
            .collect();
        assert_eq!(pe.local_vec(&b)?, want, "{name} all_gather");
        if name == "hier" {
            // The inputs of the other nodes' PEs whose local index maps to this PE.
            let mine = nm.node(me);
            let fetched = (0..n)
                .filter(|&j| nm.node(j) != mine && nm.peer(mine, nm.local(j)) == me)
                .count();
            assert_eq!(moved, (fetched * count * 4) as u64, "hier all_gather bytes");
        }
        pe.local_fill(&b, i32::MIN)?;
        pe.local_write(&b, me * count, &harness::rand_vec::<i32>(me, 11, count))?;
        coll.all_gather(world, &b, &b, count)?;
        assert_eq!(pe.local_vec(&b)?, want, "{name} in-place all_gather");
        // broadcast from every root
        for root in 0..n {
            pe.local_fill(&b, -1)?;
            coll.broadcast(world, &b, &a, count, root)?;
            let got = pe.local_vec(&b)?;
            assert_eq!(
                got[..count],
                harness::rand_vec::<i32>(root, 11, count)[..],
                "{name} broadcast from {root}"
            );
            assert!(
                got[count..].iter().all(|&v| v == -1),
                "beyond count untouched"
            );
        }
        // min, in place
        pe.local_write(&a, 0, &harness::rand_vec::<i32>(me, 12, count))?;
        coll.all_reduce(world, &a, &a, count, ReduceOp::Min)?;
        let want: Vec<i32> = (0..count)
            .map(|i| {
                (0..n)
                    .map(|s| harness::rand_vec::<i32>(s, 12, count)[i])
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        assert_eq!(pe.local_vec(&a)?, want, "{name} min");
    }
    // reduce_scatter: hierarchical in place (the buffer holds the node partials), flat out of
    // place; block `me` of the sum either way. In place each block crosses to its member once
    // per other node.
    let rc = 1001;
    let v = pe.alloc::<u64>(rc * n)?;
    let r = pe.alloc::<u64>(rc)?;
    let mut want = vec![0u64; rc];
    for s in 0..n {
        let input = harness::rand_vec::<u64>(s, 14, rc * n);
        for (w, x) in want.iter_mut().zip(&input[me * rc..(me + 1) * rc]) {
            *w = w.wrapping_add(*x);
        }
    }
    for (name, coll) in [("hier", &hier), ("flat", &flat)] {
        pe.local_write(&v, 0, &harness::rand_vec::<u64>(me, 14, rc * n))?;
        let before = traffic(pe);
        coll.reduce_scatter(world, &v, &v, rc, ReduceOp::Sum)?;
        let moved = traffic(pe) - before - record_bytes(pe);
        assert_eq!(
            pe.local_vec(&v)?[me * rc..(me + 1) * rc],
            want[..],
            "{name} in-place reduce_scatter"
        );
        if name == "hier" {
            let want_bytes = ((nm.n_nodes() - 1) * rc * 8) as u64;
            assert_eq!(moved, want_bytes, "hier reduce_scatter bytes across nodes");
        }
        pe.local_write(&v, 0, &harness::rand_vec::<u64>(me, 14, rc * n))?;
        pe.local_fill(&r, u64::MAX)?; // poison
        coll.reduce_scatter(world, &r, &v, rc, ReduceOp::Sum)?;
        assert_eq!(pe.local_vec(&r)?, want, "{name} reduce_scatter");
    }
    pe.free(r)?;
    pe.free(v)?;
    // A team of one PE per node stays flat (nothing to gain inside nodes), and works.
    let (l0, l1) = (nm.leader(0), nm.leader(1));
    let leaders = pe.team_split_strided(world, l0, l1 - l0, nm.n_nodes())?;
    if let Some(t) = leaders {
        assert!(!pe.node_map(&t).is_hierarchical());
        pe.local_write(&a, 0, &harness::rand_vec::<i32>(me, 13, count))?;
        hier.all_reduce(&t, &a, &a, count, ReduceOp::Sum)?;
        let want: Vec<i32> = (0..count)
            .map(|i| {
                t.members()
                    .iter()
                    .map(|&s| harness::rand_vec::<i32>(s, 13, count)[i])
                    .fold(0i32, i32::wrapping_add)
            })
            .collect();
        assert_eq!(pe.local_vec(&a)?, want, "leaders' all_reduce");
        pe.team_destroy(t)?;
    }
    pe.free(b)?;
    pe.free(a)?;
    pe.free(hier)?;
    pe.free(flat)?;
    Ok(())
}

/// The expert-major rows of identity experts.
fn expert_rows(d: &Dispatched<f32>, layout: RecvLayout, h: usize) -> Vec<f32> {
    match layout {
        RecvLayout::ExpertMajor => d.x.clone(),
        RecvLayout::TokenMajor => d
            .handle
            .row_token()
            .iter()
            .flat_map(|&i| d.x[i as usize * h..(i as usize + 1) * h].to_vec())
            .collect(),
    }
}

/// The received tokens, each once, in receive order.
fn token_rows(d: &Dispatched<f32>, layout: RecvLayout, h: usize) -> Vec<f32> {
    match layout {
        RecvLayout::TokenMajor => d.x.clone(),
        RecvLayout::ExpertMajor => {
            let mut out = vec![0f32; d.handle.num_recv_tokens() * h];
            for (r, &i) in d.handle.row_token().iter().enumerate() {
                let i = i as usize;
                out[i * h..(i + 1) * h].copy_from_slice(&d.x[r * h..(r + 1) * h]);
            }
            out
        }
    }
}

/// Deterministic routing: token `t` of PE `s` to up to `k` experts, some `-1`, often several
/// on one PE or one node.
fn route(s: usize, t: usize, j: usize, e: usize) -> i32 {
    let x = (s * 7919 + t * 104_729 + j * 1_299_709) % 1000;
    if x % 7 == 3 {
        return -1;
    }
    ((x * 31 + j * (e / 2 + 1)) % e) as i32
}

/// The MoE body: dispatch and combine (and combine_tokens) on the internode path and on the
/// flat path, the same inputs; outputs identical bit for bit, and equal to the exact result
/// of identity experts; each token crosses to each other node it has experts on once.
fn moe_case(pe: &Pe, mode: EpMode, layout: RecvLayout) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let world = pe.world_team();
    let nm = pe.node_map(world);
    let e = 2 * n;
    let (max_t, h, k) = (9usize, 24usize, 3usize);
    let cfg = EpConfig::new(e, max_t, h, k)
        .with_mode(mode)
        .with_layout(layout);
    let mut hb = HostBuffer::<f32>::new(pe, world, cfg)?;
    let mut fb = HostBuffer::<f32>::new(pe, world, cfg)?;
    fb.set_hierarchical(false);
    assert!(hb.is_hierarchical() && !fb.is_hierarchical());
    assert_eq!(
        hb.bytes(),
        HostBuffer::<f32>::bytes_for_nodes(&cfg, &nm)?,
        "internode areas"
    );
    // A bad expert id on one PE: an error on every PE before anything moves; the buffer
    // stays usable (the rounds below).
    let bad = if me == n - 1 { e as i32 } else { 0 };
    let r = hb.dispatch(pe, &[1f32; 24], &[bad, -1, -1], &[1.0, 0.0, 0.0], k);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "bad id: {r:?}");
    for round in 0..3usize {
        let tokens = (me + round * 2) % (max_t + 1);
        let x: Vec<f32> = harness::rand_vec::<f32>(me, 30 + round as u64, tokens * h)
            .into_iter()
            .map(|v| (v / 64.0).round() / 8.0)
            .collect();
        let ids: Vec<i32> = (0..tokens * k)
            .map(|i| route(me + 10 * round, i / k, i % k, e))
            .collect();
        let ws: Vec<f32> = (0..tokens * k)
            .map(|i| [0.5f32, 0.25, 2.0][i % k])
            .collect();
        let before = traffic(pe);
        let dh = hb.dispatch(pe, &x, &ids, &ws, k)?;
        let hier_bytes = traffic(pe) - before;
        let before = traffic(pe);
        let df = fb.dispatch(pe, &x, &ids, &ws, k)?;
        let flat_bytes = traffic(pe) - before;
        assert_eq!(dh.x, df.x, "round {round}: dispatched rows");
        assert!(dh.handle.same_routing(&df.handle), "round {round}: handles");
        // One crossing per token and other node with experts of it: rows, their records,
        // a count per other node, the agreement records to other nodes' PEs.
        let mine = nm.node(me);
        let mut rows_to = vec![0usize; nm.n_nodes()];
        for t in 0..tokens {
            let mut seen = vec![false; nm.n_nodes()];
            for &id in &ids[t * k..(t + 1) * k] {
                if id >= 0 {
                    let j = nm.node(id as usize / (e / n));
                    if j != mine && !std::mem::replace(&mut seen[j], true) {
                        rows_to[j] += 1;
                    }
                }
            }
        }
        let rmw = 1 + 2 * k;
        let mw = 8 + 2 * n + e / n;
        let far_pes = (0..n).filter(|&p| nm.node(p) != mine).count();
        let want: usize = rows_to.iter().map(|c| c * (h * 4 + rmw * 4)).sum::<usize>()
            + (nm.n_nodes() - 1) * 8
            + far_pes * mw * 8;
        assert_eq!(
            hier_bytes, want as u64,
            "round {round}: dispatch bytes across nodes"
        );
        assert!(
            hier_bytes <= flat_bytes,
            "{hier_bytes} vs flat {flat_bytes}"
        );
        // Identity experts: combine gives x · Σ weights of the slots with an expert.
        let want: Vec<f32> = (0..tokens * h)
            .map(|i| {
                let t = i / h;
                let w: f32 = (0..k)
                    .filter(|&j| ids[t * k + j] >= 0)
                    .map(|j| ws[t * k + j])
                    .sum();
                x[i] * w
            })
            .collect();
        let ch = hb.combine(pe, &dh.handle, &expert_rows(&dh, layout, h))?;
        let cf = fb.combine(pe, &df.handle, &expert_rows(&df, layout, h))?;
        assert_eq!(ch, want, "round {round}: combine (internode)");
        assert_eq!(cf, want, "round {round}: combine (flat)");
        // combine_tokens: each PE returns its received tokens times the number of its slots.
        let per_tok = |d: &Dispatched<f32>| -> Vec<f32> {
            let hd = &d.handle;
            let rows = token_rows(d, layout, h);
            let mut out = Vec::with_capacity(rows.len());
            for (i, row) in rows.chunks(h).enumerate() {
                let c = (0..k)
                    .filter(|&j| hd.recv_topk_local()[i * k + j] >= 0)
                    .count();
                out.extend(row.iter().map(|v| v * c as f32));
            }
            out
        };
        let th = hb.combine_tokens(pe, &dh.handle, &per_tok(&dh))?;
        let tf = fb.combine_tokens(pe, &df.handle, &per_tok(&df))?;
        let want: Vec<f32> = (0..tokens * h)
            .map(|i| {
                let t = i / h;
                x[i] * (0..k).filter(|&j| ids[t * k + j] >= 0).count() as f32
            })
            .collect();
        assert_eq!(th, want, "round {round}: combine_tokens (internode)");
        assert_eq!(tf, want, "round {round}: combine_tokens (flat)");
    }
    // A PE taking the other path than its peers: a mismatch on every PE, nothing moves.
    if me == n - 1 {
        hb.set_hierarchical(false);
    }
    let r = hb.dispatch(pe, &[0f32; 24], &[0i32, -1, -1], &[1.0, 0.0, 0.0], k);
    assert!(
        matches!(r, Err(Error::CollectiveMismatch { .. })),
        "path mismatch: {r:?}"
    );
    pe.free(fb)?;
    pe.free(hb)?;
    Ok(())
}

fn moe(pe: &Pe) -> Result<()> {
    moe_case(pe, EpMode::Normal, RecvLayout::ExpertMajor)?;
    moe_case(
        pe,
        EpMode::Capturable { capacity: 9 },
        RecvLayout::TokenMajor,
    )
}

fn everything(pe: &Pe) -> Result<()> {
    barriers(pe)?;
    collectives(pe)?;
    moe(pe)
}

#[test]
fn hierarchical_collectives_and_moe_on_two_nodes_of_two_processes() {
    if fabric_data::skip() {
        return;
    }
    processes(
        "hierarchical_collectives_and_moe_on_two_nodes_of_two_processes",
        &[0, 0, 1, 1],
        everything,
    );
}

#[test]
fn hierarchical_collectives_and_moe_on_three_nodes_of_two_processes() {
    if fabric_data::skip() {
        return;
    }
    processes(
        "hierarchical_collectives_and_moe_on_three_nodes_of_two_processes",
        &[0, 0, 1, 1, 2, 2],
        everything,
    );
}

#[test]
fn hierarchical_collectives_and_moe_on_a_node_of_one_beside_a_node_of_three() {
    if fabric_data::skip() {
        return;
    }
    processes(
        "hierarchical_collectives_and_moe_on_a_node_of_one_beside_a_node_of_three",
        &[0, 1, 1, 1],
        everything,
    );
}

#[test]
fn hierarchical_collectives_and_moe_on_interleaved_nodes_of_thread_pes() {
    if fabric_data::skip() {
        return;
    }
    // Team order alternates nodes (PEs 0 and 2 on one node, 1 and 3 on the other).
    fabric_data::thread_nodes(
        4,
        |r| r % 2,
        |c| c.heap_size(16 << 20).timeout(Duration::from_secs(30)),
        |_, init| {
            let pe = init.expect("world");
            everything(&pe).expect("body");
            pe.finalize().expect("finalize");
        },
    );
}

#[test]
fn a_node_killed_before_an_internode_dispatch_is_an_error_on_every_survivor() {
    if fabric_data::skip() {
        return;
    }
    let test = "a_node_killed_before_an_internode_dispatch_is_an_error_on_every_survivor";
    let nodes = [0, 0, 1, 1, 2, 2];
    if !harness::is_child() {
        let env = [
            (harness::CHILD_VAR, "fabric_hier_kill"),
            ("RSHMEM_TIMEOUT", "30"),
            ("RSHMEM_HEAP_SIZE", "4M"),
        ];
        let out = harness::spawn_self(test, 6, 1, &env, Duration::from_secs(15));
        for (p, e) in out.exits.iter().enumerate() {
            let want = if nodes[p] == 1 {
                rshmem::launcher::Exit::Signal(9)
            } else {
                rshmem::launcher::Exit::Code(0)
            };
            assert_eq!(*e, want, "process {p}: {:?}", out.exits);
        }
        return;
    }
    let pe = Launch::new()
        .config(fabric_data::config_of(|r| nodes[r]))
        .init()
        .expect("init");
    let cfg = EpConfig::new(12, 4, 8, 2);
    let mut buf = HostBuffer::<f32>::new(&pe, pe.world_team(), cfg).expect("buffer");
    assert!(buf.is_hierarchical());
    pe.barrier_all().expect("barrier");
    if nodes[pe.my_pe()] == 1 {
        fabric_data::die_soon();
    }
    // Every token goes to every node.
    let ids: Vec<i32> = (0..4).flat_map(|t| [t % 4, 4 + t % 4]).collect();
    let t0 = std::time::Instant::now();
    let r = buf.dispatch(&pe, &[1f32; 32], &ids, &[1.0; 8], 2);
    match &r {
        Err(Error::PeerLost { pe: lost, .. }) => assert!(*lost == 2 || *lost == 3, "{r:?}"),
        Err(Error::Fabric { .. }) => {}
        other => panic!("dispatch with a node gone: {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    // Stay a while: a survivor of another node that exits at once can be taken for lost
    // itself by a PE still waiting on it (its header, with the cause it saw, is then
    // unreadable across nodes), and be named instead of the dead node.
    std::thread::sleep(Duration::from_secs(3));
    drop(buf);
}

/// A PE that stays out of a barrier across nodes (alive, asleep) is named by every other PE's
/// timeout, whether it is a node's leader, another member, or alone on its node: the
/// hierarchical barrier finds the member whose first signal is missing (in its node, or to the
/// next node's leader), not the member this PE happened to wait on.
#[test]
fn a_pe_missing_from_a_barrier_across_nodes_is_named_by_every_timeout() {
    if fabric_data::skip() {
        return;
    }
    let cases: [(&[usize], usize); 4] = [
        (&[0, 0, 1, 1, 2, 2], 0),
        (&[0, 0, 1, 1, 2, 2], 3),
        (&[0, 1, 1, 1], 0),
        (&[0, 1, 1, 1], 2),
    ];
    for (layout, sleeper) in cases {
        let n = layout.len();
        let done = std::sync::Barrier::new(n);
        let results: Vec<Result<()>> = fabric_data::thread_nodes(
            n,
            |r| layout[r],
            |c| c.heap_size(1 << 20).timeout(Duration::from_millis(1500)),
            |r, init| {
                let pe = init.expect("world");
                pe.barrier_all().expect("first barrier");
                let res = if r == sleeper {
                    Ok(())
                } else {
                    pe.barrier_all()
                };
                // The sleeper wakes only once every other PE has its error.
                done.wait();
                let _ = pe.finalize();
                res
            },
        );
        for (p, r) in results.iter().enumerate() {
            if p == sleeper {
                continue;
            }
            assert!(
                matches!(r, Err(Error::Timeout { op: "barrier_all", pe: Some(q), .. }) if *q == sleeper),
                "{layout:?}: PE {p} expected a timeout naming PE {sleeper}, got {r:?}"
            );
        }
    }
}
