//! `GpuColl` on teams spanning nodes: the node-local kernels inside a node, rounds of puts with
//! signals through the proxy between nodes (`coll/cuda/net.rs`). Two "nodes" of one PE each
//! (processes), and a node of one thread-PE beside a node of two (one process), over loopback
//! tcp, every PE on GPU 0 (`RSHMEM_TEST_FABRIC_GPUS=k`: round-robin over k GPUs).
//! Random inputs, poisoned outputs, exact values (integers, and floats whose every fold is
//! exact in any grouping), in and out of place, every element type and operation, every
//! broadcast and reduce root, reduce_scatter, all_to_all, all_to_all_v, sizes spanning
//! several rounds of a small `net_chunk_bytes`, captured graphs replayed with new data,
//! all_to_all_v_device (random device counts, a graph replayed with new counts, a count past
//! the capacity), and a killed node.
//! The tests need a GPU (`--include-ignored`) and libfabric; that the kernels, the cross-node
//! ones among them, compile is `cuda_coll`'s `coll_kernels_compile_and_export_every_name`.

#[path = "harness/coll_data.rs"]
#[macro_use]
mod coll_data;
#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use coll_data::TElem;
use rshmem::coll::{AllToAllV, CollConfig, ReduceOp, ToRoot};
use rshmem::cuda::DeviceCounts;
use rshmem::cuda::{self, CollTuning, CudaPe, GpuColl, Stream};
use rshmem::launcher::Exit;
use rshmem::*;
use std::time::{Duration, Instant};

/// Bytes per round across nodes in these tests: vectors of a few KiB take several rounds.
const CHUNK: usize = 4096;

fn tuning() -> CollTuning {
    CollTuning {
        net_chunk_bytes: CHUNK,
        ..CollTuning::default()
    }
}

/// Each process its own node (from its rank), the GPUs of `fabric_data::gpu_devices`.
fn config() -> Config {
    let rank: usize = std::env::var("RSHMEM_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    base_config(2).node(format!("node{rank}"))
}

fn base_config(n: usize) -> Config {
    fabric_data::gpu_fabric(
        Config::default()
            .heap_size(64 << 20)
            .timeout(Duration::from_secs(20))
            .backend(BackendKind::Cuda)
            .devices(fabric_data::gpu_devices(n)),
    )
}

struct Ctx<'a> {
    pe: &'a Pe,
    coll: GpuColl<'a>,
    s: Stream,
}

impl<'a> Ctx<'a> {
    fn new(pe: &'a Pe) -> Result<Ctx<'a>> {
        let g = CudaPe::new(pe)?;
        let t0 = Instant::now();
        let coll = GpuColl::new(g, CollConfig::default(), tuning())?;
        // Progress for the logs (a cold kernel cache compiles the collectives' module here).
        eprintln!("PE {}: GpuColl::new took {:?}", pe.my_pe(), t0.elapsed());
        coll.reserve(1 << 20)?;
        let nodes: std::collections::BTreeSet<usize> =
            pe.placements().iter().map(|p| p.node).collect();
        assert!(nodes.len() > 1, "the world spans nodes");
        Ok(Ctx {
            pe,
            coll,
            s: g.stream()?,
        })
    }
    /// Synchronises the stream and checks the device errors.
    fn done(&self) -> Result<()> {
        self.s.synchronize()?;
        self.coll.check_errors()
    }
}

/// The fold across nodes: each node's members folded in team order (rounded to `T`, as the
/// node-local all_reduce leaves it), then the nodes' partials in node order.
fn want_fold<T: TElem>(pe: &Pe, op: ReduceOp, stream: u64, count: usize) -> Vec<T> {
    let map = pe.node_map(pe.world_team());
    let ins: Vec<Vec<T>> = (0..pe.n_pes())
        .map(|p| T::gen(p, stream, count, op))
        .collect();
    (0..count)
        .map(|i| {
            let partials: Vec<T> = (0..map.n_nodes())
                .map(|k| {
                    let xs: Vec<T> = map.members(k).iter().map(|&m| ins[m][i]).collect();
                    T::fold(op, &xs)
                })
                .collect();
            T::fold(op, &partials)
        })
        .collect()
}

/// reduce_scatter of `T` with every operation: out of place over several rounds with the
/// poison past the block checked, in place a few elements (the operations alternate which is
/// large).
fn reduce_scatter_t<T: TElem>(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let big = 2 * CHUNK / std::mem::size_of::<T>() + 3;
    let src = pe.alloc::<T>(n * big)?;
    let dst = pe.alloc::<T>(big + 4)?;
    for (k, &op) in T::ops().iter().enumerate() {
        for in_place in [false, true] {
            let count = if (k % 2 == 0) != in_place { big } else { 7 };
            let stream = 800 + 10 * k as u64 + in_place as u64;
            pe.local_fill(&src, T::poison())?;
            pe.local_write(&src, 0, &T::gen(me, stream, n * count, op))?;
            pe.local_fill(&dst, T::poison())?;
            pe.barrier_all()?;
            let out = if in_place { &src } else { &dst };
            c.coll.reduce_scatter(&c.s, w, out, &src, count, op)?;
            c.done()?;
            let got = pe.local_vec(out)?;
            let all = want_fold::<T>(pe, op, stream, n * count);
            let at = if in_place { me * count } else { 0 };
            let ctx = format!(
                "{} reduce_scatter {op:?} of {count}, in place {in_place}",
                T::KIND.name()
            );
            coll_data::check(&got[at..at + count], &all[me * count..][..count], &ctx);
            if !in_place {
                let rest = vec![T::poison(); 4 + big - count];
                coll_data::check(&got[count..], &rest, &format!("{ctx}: past the count"));
            }
            pe.barrier_all()?;
        }
    }
    Ok(())
}

/// reduce of `T` (sum and max) to every root, in and out of place, over several rounds:
/// the root's `dst` exact, the others' untouched.
fn reduce_t<T: TElem>(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let count = 2 * CHUNK / std::mem::size_of::<T>() + 5;
    let src = pe.alloc::<T>(count)?;
    let dst = pe.alloc::<T>(count)?;
    for (k, op) in [ReduceOp::Sum, ReduceOp::Max].into_iter().enumerate() {
        for root in 0..n {
            for in_place in [false, true] {
                let stream = 900 + 10 * k as u64 + 2 * root as u64 + in_place as u64;
                let mine = T::gen(me, stream, count, op);
                pe.local_write(&src, 0, &mine)?;
                pe.local_fill(&dst, T::poison())?;
                pe.barrier_all()?;
                let out = if in_place { &src } else { &dst };
                c.coll
                    .reduce(&c.s, w, out, &src, count, ToRoot { op, root })?;
                c.done()?;
                let got = pe.local_vec(out)?;
                let ctx = format!(
                    "{} reduce {op:?} of {count} to {root}, in place {in_place}",
                    T::KIND.name()
                );
                if me == root {
                    coll_data::check(&got, &want_fold::<T>(pe, op, stream, count), &ctx);
                } else if in_place {
                    coll_data::check(&got, &mine, &format!("{ctx}: a non-root's src"));
                } else {
                    let poison = vec![T::poison(); count];
                    coll_data::check(&got, &poison, &format!("{ctx}: a non-root's dst"));
                }
                pe.barrier_all()?;
            }
        }
    }
    Ok(())
}

/// all_reduce of `T` with every operation, out of place (1001 elements) and in place (a size
/// spanning several rounds plus a remainder).
fn all_reduce_t<T: TElem>(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let me = pe.my_pe();
    let big = 3 * CHUNK / std::mem::size_of::<T>() + 5;
    let src = pe.alloc::<T>(big)?;
    let dst = pe.alloc::<T>(big)?;
    for (k, &op) in T::ops().iter().enumerate() {
        for (count, in_place) in [(1001, false), (big, true), (1, false)] {
            let stream = 100 + 10 * k as u64 + in_place as u64;
            pe.local_write(&src, 0, &T::gen(me, stream, count, op))?;
            pe.local_fill(&dst, T::poison())?;
            pe.barrier_all()?;
            let out = if in_place { &src } else { &dst };
            c.coll.all_reduce(&c.s, w, out, &src, count, op)?;
            c.done()?;
            let got = pe.local_vec(out)?;
            let ctx = format!(
                "{} all_reduce {op:?} of {count}, in place {in_place}",
                T::KIND.name()
            );
            coll_data::check(&got[..count], &want_fold::<T>(pe, op, stream, count), &ctx);
            if !in_place {
                let rest = vec![T::poison(); big - count];
                coll_data::check(&got[count..], &rest, &format!("{ctx}: past the count"));
            }
            pe.barrier_all()?;
        }
    }
    Ok(())
}

/// all_gather in and out of place, broadcast from every root in and out of place.
fn movement(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let poison = 0xa5a5_a5a5u32 as i32;
    for count in [1, 2 * CHUNK / 4 + 3] {
        let src = pe.alloc::<i32>(count)?;
        let dst = pe.alloc::<i32>(n * count)?;
        for in_place in [false, true] {
            let stream = 300 + count as u64 + in_place as u64;
            let mine = harness::rand_vec::<i32>(me, stream, count);
            pe.local_fill(&dst, poison)?;
            pe.local_write(&src, 0, &mine)?;
            if in_place {
                pe.local_write(&dst, me * count, &mine)?;
            }
            pe.barrier_all()?;
            let from = if in_place {
                dst.slice(..)?
            } else {
                src.slice(..)?
            };
            c.coll.all_gather(&c.s, w, &dst, &from, count)?;
            c.done()?;
            let want: Vec<i32> = (0..n)
                .flat_map(|p| harness::rand_vec::<i32>(p, stream, count))
                .collect();
            assert_eq!(
                pe.local_vec(&dst)?,
                want,
                "all_gather of {count}, in place {in_place}"
            );
            pe.barrier_all()?;
        }
        let total = count + 7;
        let bsrc = pe.alloc::<f32>(total)?;
        let bdst = pe.alloc::<f32>(total)?;
        for root in 0..n {
            for in_place in [false, true] {
                let stream = 400 + 2 * root as u64 + in_place as u64;
                pe.local_write(&bsrc, 0, &harness::rand_vec::<f32>(me, stream, total))?;
                pe.local_fill(&bdst, f32::NAN)?;
                pe.barrier_all()?;
                let out = if in_place { &bsrc } else { &bdst };
                c.coll.broadcast(&c.s, w, out, &bsrc, total, root)?;
                c.done()?;
                let want = harness::rand_vec::<f32>(root, stream, total);
                let ctx = format!("broadcast of {total} from {root}, in place {in_place}");
                coll_data::check(&pe.local_vec(out)?, &want, &ctx);
                pe.barrier_all()?;
            }
        }
    }
    Ok(())
}

/// all_to_all in and out of place, over several rounds.
fn all_to_all(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    for count in [1, 2 * CHUNK / 2 + 5] {
        let src = pe.alloc::<u16>(n * count)?;
        let dst = pe.alloc::<u16>(n * count)?;
        for in_place in [false, true] {
            let stream = 600 + count as u64 + in_place as u64;
            pe.local_write(&src, 0, &harness::rand_vec::<u16>(me, stream, n * count))?;
            pe.local_fill(&dst, 0xa5a5)?;
            pe.barrier_all()?;
            let out = if in_place { &src } else { &dst };
            c.coll.all_to_all(&c.s, w, out, &src, count)?;
            c.done()?;
            let want: Vec<u16> = (0..n)
                .flat_map(|j| {
                    harness::rand_vec::<u16>(j, stream, n * count)[me * count..][..count].to_vec()
                })
                .collect();
            assert_eq!(
                pe.local_vec(out)?,
                want,
                "all_to_all of {count}, in place {in_place}"
            );
            pe.barrier_all()?;
        }
    }
    Ok(())
}

/// A stream barrier across nodes: every PE's put to every PE before it has landed after it.
fn barrier(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let g = CudaPe::new(pe)?;
    let slots = pe.alloc::<u64>(n)?;
    let mine = pe.alloc::<u64>(1)?;
    let seen = pe.alloc::<u64>(n)?;
    for round in 0..3u64 {
        let token = 1000 * round + me as u64 + 1;
        pe.local_fill(&slots, 0)?;
        pe.local_fill(&seen, 0)?;
        pe.local_write(&mine, 0, &[token])?;
        pe.barrier_all()?;
        for t in 0..n {
            g.put_on_stream(&c.s, &slots.slice(me..me + 1)?, &mine, t)?;
        }
        c.coll.barrier(&c.s, w)?;
        g.copy_raw_on_stream(&c.s, g.ptr(&seen)?, g.ptr(&slots)?, n * 8)?;
        c.done()?;
        let want: Vec<u64> = (0..n).map(|p| 1000 * round + p as u64 + 1).collect();
        assert_eq!(pe.local_vec(&seen)?, want, "tokens after barrier {round}");
        pe.barrier_all()?;
    }
    Ok(())
}

/// all_reduce, all_gather, an in-place broadcast, reduce_scatter, reduce and an in-place
/// all_to_all captured once and replayed with new data.
fn graph(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let count = 2 * CHUNK / 8 + 9;
    let a = pe.alloc::<u64>(count)?;
    let b = pe.alloc::<u64>(count)?;
    let gsrc = pe.alloc::<u32>(count)?;
    let gdst = pe.alloc::<u32>(n * count)?;
    let rsrc = pe.alloc::<u32>(n * count)?;
    let rdst = pe.alloc::<u32>(count)?;
    let red = pe.alloc::<u64>(count)?;
    let x = pe.alloc::<u16>(n * count)?;
    let root = n - 1;
    let to = ToRoot {
        op: ReduceOp::Sum,
        root: 0,
    };
    pe.barrier_all()?;
    c.s.begin_capture()?;
    let captured = (|| {
        c.coll.all_reduce(&c.s, w, &b, &a, count, ReduceOp::Sum)?;
        c.coll.all_gather(&c.s, w, &gdst, &gsrc, count)?;
        c.coll
            .reduce_scatter(&c.s, w, &rdst, &rsrc, count, ReduceOp::Xor)?;
        c.coll.reduce(&c.s, w, &red, &a, count, to)?;
        c.coll.all_to_all(&c.s, w, &x, &x, count)?;
        c.coll.broadcast(&c.s, w, &a, &a, count, root)
    })();
    let graph = c.s.end_capture();
    captured?;
    let graph = graph?;
    pe.barrier_all()?; // every PE has its graph before any launches
    for r in 0..3u64 {
        let st = 500 + 4 * r;
        pe.local_write(&a, 0, &harness::rand_vec::<u64>(me, st, count))?;
        pe.local_write(&gsrc, 0, &harness::rand_vec::<u32>(me, st + 1, count))?;
        pe.local_write(&rsrc, 0, &harness::rand_vec::<u32>(me, st + 2, n * count))?;
        pe.local_write(&x, 0, &harness::rand_vec::<u16>(me, st + 3, n * count))?;
        pe.local_fill(&b, u64::MAX)?;
        pe.local_fill(&red, u64::MAX)?;
        pe.local_fill(&gdst, u32::MAX)?;
        pe.local_fill(&rdst, u32::MAX)?;
        pe.barrier_all()?;
        graph.launch(&c.s)?;
        c.done()?;
        let mut sum = vec![0u64; count];
        for p in 0..n {
            for (s, v) in sum.iter_mut().zip(harness::rand_vec::<u64>(p, st, count)) {
                *s = s.wrapping_add(v);
            }
        }
        assert_eq!(pe.local_vec(&b)?, sum, "replay {r}: all_reduce");
        let want: Vec<u32> = (0..n)
            .flat_map(|p| harness::rand_vec::<u32>(p, st + 1, count))
            .collect();
        assert_eq!(pe.local_vec(&gdst)?, want, "replay {r}: all_gather");
        let mut xor = vec![0u32; count];
        for p in 0..n {
            let v = harness::rand_vec::<u32>(p, st + 2, n * count);
            for (s, v) in xor.iter_mut().zip(&v[me * count..][..count]) {
                *s ^= v;
            }
        }
        assert_eq!(pe.local_vec(&rdst)?, xor, "replay {r}: reduce_scatter");
        let want = if me == 0 { sum } else { vec![u64::MAX; count] };
        assert_eq!(pe.local_vec(&red)?, want, "replay {r}: reduce to 0");
        let a2a: Vec<u16> = (0..n)
            .flat_map(|j| {
                harness::rand_vec::<u16>(j, st + 3, n * count)[me * count..][..count].to_vec()
            })
            .collect();
        assert_eq!(pe.local_vec(&x)?, a2a, "replay {r}: all_to_all in place");
        let bc = harness::rand_vec::<u64>(root, st, count);
        assert_eq!(pe.local_vec(&a)?, bc, "replay {r}: broadcast in place");
        pe.barrier_all()?;
    }
    Ok(())
}

/// The arrays of member `me` of an all_to_all_v among `n` in which member i sends j
/// `cnt(i, j)` elements: send and receive layouts in different member orders, with gaps of 3;
/// (arrays, src length, dst length).
fn a2av_arrays(
    me: usize,
    n: usize,
    cnt: &dyn Fn(usize, usize) -> usize,
) -> ([Vec<usize>; 4], usize, usize) {
    let layout = |counts: &[usize], rot: usize| {
        let mut at = vec![0; n];
        let mut next = 3;
        for k in 0..n {
            let j = (k + rot) % n;
            at[j] = next;
            next += counts[j] + 3;
        }
        (at, next)
    };
    let sc: Vec<usize> = (0..n).map(|j| cnt(me, j)).collect();
    let rc: Vec<usize> = (0..n).map(|i| cnt(i, me)).collect();
    let (sd, sl) = layout(&sc, me);
    let (rd, dl) = layout(&rc, me + 1);
    ([sc, sd, rc, rd], sl, dl)
}

/// all_to_all_v with counts known on the host: pairs of other nodes through the proxy at the
/// receivers' displacements, over several rounds' worth of bytes and with empty pairs, the
/// gaps left poisoned; one call captured and replayed with new data; counts that do not pair
/// up between PE 0 and the last PE (on another node) an error on both, then a matching call
/// exact.
fn all_to_all_v(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let poison = 0xa5a5_a5a5u32;
    // Some pairs of other nodes empty (1 to 0 among them), others over a few KiB.
    let cnt = |i: usize, j: usize| {
        if (i + 2 * j) % 3 == 1 {
            0
        } else {
            ((i * 7 + j * 3) % 4) * 700 + (i + j) % 2
        }
    };
    let ([sc, sd, rc, rd], ..) = a2av_arrays(me, n, &cnt);
    // Symmetric objects: the longest layout of any PE (and one element past it).
    let sl = (0..n).map(|i| a2av_arrays(i, n, &cnt).1).max().unwrap_or(0);
    let dl = (0..n).map(|i| a2av_arrays(i, n, &cnt).2).max().unwrap_or(0) + 1;
    let src = pe.alloc::<u32>(sl)?;
    let dst = pe.alloc::<u32>(dl)?;
    let want = |stream: u64| {
        let mut d = vec![poison; dl];
        for i in 0..n {
            // Sender i's src and where its share for this PE starts there.
            let (a, ..) = a2av_arrays(i, n, &cnt);
            let data = harness::rand_vec::<u32>(i, stream, sl);
            d[rd[i]..rd[i] + rc[i]].copy_from_slice(&data[a[1][me]..][..rc[i]]);
        }
        d
    };
    let v = AllToAllV {
        send_counts: &sc,
        send_displs: &sd,
        recv_counts: &rc,
        recv_displs: &rd,
    };
    for stream in [1100u64, 1101] {
        pe.local_write(&src, 0, &harness::rand_vec::<u32>(me, stream, sl))?;
        pe.local_fill(&dst, poison)?;
        pe.barrier_all()?;
        c.coll.all_to_all_v(&c.s, w, &dst, &src, &v)?;
        c.done()?;
        assert_eq!(pe.local_vec(&dst)?, want(stream), "all_to_all_v {stream}");
        pe.barrier_all()?;
    }
    c.s.begin_capture()?;
    let captured = c.coll.all_to_all_v(&c.s, w, &dst, &src, &v);
    let graph = c.s.end_capture();
    captured?;
    let graph = graph?;
    pe.barrier_all()?;
    for stream in [1110u64, 1111] {
        pe.local_write(&src, 0, &harness::rand_vec::<u32>(me, stream, sl))?;
        pe.local_fill(&dst, poison)?;
        pe.barrier_all()?;
        graph.launch(&c.s)?;
        c.done()?;
        assert_eq!(
            pe.local_vec(&dst)?,
            want(stream),
            "replayed all_to_all_v {stream}"
        );
        pe.barrier_all()?;
    }
    // PE 0 expects one element more from the last PE than it sends.
    let mut rc_bad = rc.clone();
    if me == 0 {
        rc_bad[n - 1] += 1;
    }
    let bad = AllToAllV {
        recv_counts: &rc_bad,
        ..v
    };
    c.coll.all_to_all_v(&c.s, w, &dst, &src, &bad)?;
    c.s.synchronize()?;
    let r = c.coll.check_errors();
    if me == 0 || me == n - 1 {
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "PE {me}: {r:?}"
        );
    } else {
        r?;
    }
    pe.barrier_all()?;
    pe.local_write(&src, 0, &harness::rand_vec::<u32>(me, 1120, sl))?;
    pe.local_fill(&dst, poison)?;
    pe.barrier_all()?;
    c.coll.all_to_all_v(&c.s, w, &dst, &src, &v)?;
    c.done()?;
    assert_eq!(
        pe.local_vec(&dst)?,
        want(1120),
        "all_to_all_v after the mismatch"
    );
    pe.barrier_all()
}

/// Counts of all_to_all_v_device call `r` from member i to member j: random, a third of them 0
/// (a whole row on some calls), up to a few KiB of u32.
fn dev_cnt(i: usize, j: usize, r: u64) -> u64 {
    let mut h = (i as u64) << 40 ^ (j as u64) << 20 ^ r ^ 0x9e37_79b9_7f4a_7c15;
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    if h.is_multiple_of(3) || (r % 2 == 1 && i == 1) {
        0
    } else {
        h % 1500
    }
}

/// all_to_all_v_device across nodes: random device counts (some 0) over calls and a captured
/// graph replayed with new counts and data; exact `dst` (poison past the packed data) and
/// receive counts; a count past `src` on PE 0 a `Capacity` error on every PE with `dst`
/// untouched and the counts seen reported; then a good call exact.
fn all_to_all_v_device(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let poison = 0xa5a5_a5a5u32;
    let cap = 1500 * n;
    let src = pe.alloc::<u32>(cap)?;
    let big = pe.alloc::<u32>(cap + 16)?; // dst is the first `cap`: the rest must stay poison
    let dst = big.view::<u32>(0, cap)?;
    let cs = pe.alloc::<u64>(n)?;
    let cr = pe.alloc::<u64>(n)?;
    let dc = DeviceCounts {
        send: &cs,
        recv: &cr,
    };
    let set = |r: u64, cnt: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        pe.local_fill(&big, poison)?;
        pe.local_fill(&cr, u64::MAX)?;
        pe.local_write(&src, 0, &harness::rand_vec::<u32>(me, 1400 + r, cap))?;
        let mine: Vec<u64> = (0..n).map(|k| cnt(me, k)).collect();
        pe.local_write(&cs, 0, &mine)?;
        pe.barrier_all()
    };
    let check = |r: u64, cnt: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        let got_counts = pe.local_vec(&cr)?;
        let want_counts: Vec<u64> = (0..n).map(|i| cnt(i, me)).collect();
        assert_eq!(got_counts, want_counts, "call {r} PE {me}: receive counts");
        let mut want = vec![poison; cap + 16];
        let mut at = 0;
        for i in 0..n {
            let k = cnt(i, me) as usize;
            let from: u64 = (0..me).map(|j| cnt(i, j)).sum();
            let theirs = harness::rand_vec::<u32>(i, 1400 + r, cap);
            want[at..at + k].copy_from_slice(&theirs[from as usize..][..k]);
            at += k;
        }
        assert!(pe.local_vec(&big)? == want, "call {r} PE {me}: dst");
        pe.barrier_all()
    };
    for r in 0..3 {
        let cnt = |i: usize, j: usize| dev_cnt(i, j, r);
        set(r, &cnt)?;
        c.coll.all_to_all_v_device(&c.s, w, &dst, &src, dc)?;
        c.done()?;
        check(r, &cnt)?;
    }
    // Every PE captures and instantiates before any launches.
    c.s.begin_capture()?;
    let captured = c.coll.all_to_all_v_device(&c.s, w, &dst, &src, dc);
    let graph = c.s.end_capture();
    captured?;
    let graph = graph?;
    pe.barrier_all()?;
    for r in 3..5 {
        let cnt = |i: usize, j: usize| dev_cnt(i, j, r);
        set(r, &cnt)?;
        graph.launch(&c.s)?;
        c.done()?;
        check(r, &cnt)?;
    }
    // PE 0 sends the last PE (of another node) more than `src` holds.
    let over = |i: usize, j: usize| {
        if (i, j) == (0, n - 1) {
            cap as u64 + 1
        } else {
            dev_cnt(i, j, 5)
        }
    };
    set(5, &over)?;
    c.coll.all_to_all_v_device(&c.s, w, &dst, &src, dc)?;
    c.s.synchronize()?;
    let r = c.coll.check_errors();
    assert!(
        matches!(r, Err(Error::Capacity { src_pe: 0, dst_pe, .. }) if dst_pe == n - 1),
        "PE {me}: a count past src: {r:?}"
    );
    let seen: Vec<u64> = (0..n).map(|i| over(i, me)).collect();
    assert_eq!(pe.local_vec(&cr)?, seen, "PE {me}: the counts seen");
    assert!(
        pe.local_vec(&big)?.iter().all(|&x| x == poison),
        "PE {me}: dst written after a bad count"
    );
    pe.barrier_all()?;
    let cnt = |i: usize, j: usize| dev_cnt(i, j, 6);
    set(6, &cnt)?;
    c.coll.all_to_all_v_device(&c.s, w, &dst, &src, dc)?;
    c.done()?;
    check(6, &cnt)
}

/// Bad arguments of the calls served across nodes are errors before anything is launched.
fn refused(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let n = pe.n_pes();
    let x = pe.alloc::<u32>(4 * n)?;
    let y = pe.alloc::<u32>(4 * n)?;
    let cs = pe.alloc::<u64>(n)?;
    let short = pe.alloc::<u64>(n - 1)?;
    let dc = DeviceCounts {
        send: &cs,
        recv: &short,
    };
    let r = c.coll.all_to_all_v_device(&c.s, w, &y, &x, dc);
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "a2av device counts too short: {r:?}"
    );
    let dc = DeviceCounts {
        send: &cs,
        recv: &cs,
    };
    let r = c.coll.all_to_all_v_device(&c.s, w, &x, &x, dc);
    assert!(r.is_err(), "a2av device in place");
    let (counts, displs): (Vec<usize>, Vec<usize>) = (0..n).map(|j| (4, 4 * j + 1)).unzip();
    let v = AllToAllV {
        send_counts: &counts,
        send_displs: &displs,
        recv_counts: &counts,
        recv_displs: &displs,
    };
    let r = c.coll.all_to_all_v(&c.s, w, &y, &x, &v);
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "a2av past src: {r:?}"
    );
    let r = c.coll.all_to_all_v(&c.s, w, &x, &x, &v);
    assert!(r.is_err(), "a2av in place");
    let sum = |root| ToRoot {
        op: ReduceOp::Sum,
        root,
    };
    let r = c.coll.reduce(&c.s, w, &y, &x, 4, sum(n));
    assert!(
        matches!(r, Err(Error::PeOutOfRange { .. })),
        "root {n}: {r:?}"
    );
    let r = c.coll.reduce(&c.s, w, &y, &x, 4 * n + 1, sum(0));
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "reduce past src: {r:?}"
    );
    let r = c.coll.reduce_scatter(&c.s, w, &y, &x, 5, ReduceOp::Sum);
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "blocks past src: {r:?}"
    );
    let r = c.coll.all_to_all(&c.s, w, &x, &x, 5);
    assert!(
        matches!(r, Err(Error::OutOfBounds { .. })),
        "in place past dst: {r:?}"
    );
    let f = pe.alloc::<f32>(4 * n)?;
    let xor = ToRoot {
        op: ReduceOp::Xor,
        root: 0,
    };
    assert!(
        c.coll.reduce(&c.s, w, &f, &f, 4, xor).is_err(),
        "xor of floats"
    );
    let r = c.coll.reduce_scatter(&c.s, w, &f, &f, 4, ReduceOp::Or);
    assert!(r.is_err(), "or of floats");
    c.done()?;
    pe.barrier_all()
}

/// PE 0 passes another count than the others: every PE whose partner across nodes differs
/// reports `CollectiveMismatch` naming a PE of the other kind of call; the next matching call
/// moves exact data.
fn mismatch(c: &Ctx<'_>) -> Result<()> {
    let (pe, w) = (c.pe, c.pe.world_team());
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x = pe.alloc::<u32>(1000)?;
    let y = pe.alloc::<u32>(1000)?;
    pe.local_write(&x, 0, &harness::rand_vec::<u32>(me, 700, 1000))?;
    pe.barrier_all()?;
    let count = if me == 0 { 1000 } else { 999 };
    c.coll.all_reduce(&c.s, w, &y, &x, count, ReduceOp::Sum)?;
    c.s.synchronize()?;
    match c.coll.check_errors() {
        Err(Error::CollectiveMismatch { pe: other, .. }) => {
            assert_ne!(other == 0, me == 0, "PE {me} names PE {other}");
        }
        r => panic!("PE {me}: all_reduce of another count across nodes: {r:?}"),
    }
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &y, &x, 1000, ReduceOp::Sum)?;
    c.done()?;
    let mut want = vec![0u32; 1000];
    for p in 0..n {
        for (a, v) in want.iter_mut().zip(harness::rand_vec::<u32>(p, 700, 1000)) {
            *a = a.wrapping_add(v);
        }
    }
    assert_eq!(pe.local_vec(&y)?, want, "the call after the mismatch");
    pe.barrier_all()
}

/// Prints how long the part took (progress for the logs).
fn step(pe: &Pe, what: &str, t0: Instant, r: Result<()>) -> Result<()> {
    eprintln!("PE {}: {what} done after {:?}", pe.my_pe(), t0.elapsed());
    r
}

/// The steps of both worlds after their reductions: data movement, the all_to_all family,
/// graphs, refusals and a mismatch.
fn after_reductions(pe: &Pe, c: &Ctx<'_>, t0: Instant) -> Result<()> {
    step(pe, "all_gather, broadcast", t0, movement(c))?;
    step(pe, "all_to_all", t0, all_to_all(c))?;
    step(pe, "all_to_all_v", t0, all_to_all_v(c))?;
    step(pe, "all_to_all_v_device", t0, all_to_all_v_device(c))?;
    step(pe, "graph", t0, graph(c))?;
    step(pe, "refusals", t0, refused(c))?;
    step(pe, "mismatch", t0, mismatch(c))
}

fn everything(pe: &Pe) -> Result<()> {
    fabric_data::check_gpu_path(pe);
    let c = Ctx::new(pe)?;
    let t0 = Instant::now();
    step(pe, "barrier", t0, barrier(&c))?;
    step(pe, "all_reduce u64", t0, all_reduce_t::<u64>(&c))?;
    each_type!(all_reduce_t(&c));
    step(pe, "all_reduce of every type", t0, Ok(()))?;
    each_type!(reduce_scatter_t(&c));
    step(pe, "reduce_scatter of every type", t0, Ok(()))?;
    reduce_t::<u64>(&c)?;
    reduce_t::<f16>(&c)?;
    step(pe, "reduce u64, f16", t0, reduce_t::<f32>(&c))?;
    after_reductions(pe, &c, t0)?;
    pe.quiet()
}

/// On three PEs the node of two runs the node-local kernels too: a sample of the types; then
/// lists of one entry per launch (PE 0 has two partners: every call and round is split).
fn sample(pe: &Pe) -> Result<()> {
    let mut c = Ctx::new(pe)?;
    let t0 = Instant::now();
    step(pe, "barrier", t0, barrier(&c))?;
    step(pe, "all_reduce u64", t0, all_reduce_t::<u64>(&c))?;
    all_reduce_t::<bf16>(&c)?;
    step(pe, "all_reduce bf16, f32", t0, all_reduce_t::<f32>(&c))?;
    reduce_scatter_t::<u32>(&c)?;
    step(
        pe,
        "reduce_scatter u32, bf16",
        t0,
        reduce_scatter_t::<bf16>(&c),
    )?;
    reduce_t::<i64>(&c)?;
    step(pe, "reduce i64, f32", t0, reduce_t::<f32>(&c))?;
    after_reductions(pe, &c, t0)?;
    assert!(c.coll.set_net_list(0).is_err() && c.coll.set_net_list(65).is_err());
    c.coll.set_net_list(1)?;
    reduce_scatter_t::<u64>(&c)?;
    reduce_t::<u64>(&c)?;
    all_to_all(&c)?;
    all_to_all_v(&c)?;
    all_to_all_v_device(&c)?;
    step(pe, "lists of one entry", t0, graph(&c))?;
    pe.quiet()
}

/// Compiles the collectives' modules into the kernel cache (for an sm_90 GPU, H100/H200) in the
/// test's own process, before its job starts: a cold cache otherwise compiles them in every PE
/// inside `GpuColl::new`, within the job's time limit.
fn warm_kernel_cache() {
    let t0 = Instant::now();
    match cuda::compile_coll_modules("sm_90", &[]) {
        Ok(_) => eprintln!(
            "collectives' modules in the kernel cache after {:?}",
            t0.elapsed()
        ),
        Err(e) => eprintln!("kernel cache not warmed ({e}); GpuColl::new compiles"),
    }
}

/// Runs this test as a job of `n` processes of `threads` PEs, stopped after `limit`; every
/// process must exit 0.
fn job(test: &str, n: usize, threads: usize, tag: &str, limit: u64) {
    warm_kernel_cache();
    let env = [(harness::CHILD_VAR, tag)];
    let grace = Duration::from_secs(10);
    let out = harness::spawn_self_ignored_within(
        test,
        n,
        threads,
        &env,
        grace,
        Duration::from_secs(limit),
    );
    assert_eq!(out.code, 0, "{test}: {:?}", out.exits);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_collectives_across_two_nodes_of_one_pe() {
    if fabric_data::skip() {
        return;
    }
    let test = "gpu_collectives_across_two_nodes_of_one_pe";
    if !harness::is_child() {
        return job(test, 2, 1, "two", 200);
    }
    let pe = Launch::new().config(config()).init().expect("init");
    everything(&pe).unwrap_or_else(|e| panic!("PE {}: {e}", pe.my_pe()));
    pe.finalize().expect("finalize");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_collectives_across_a_node_of_one_beside_a_node_of_two() {
    if fabric_data::skip() {
        return;
    }
    let test = "gpu_collectives_across_a_node_of_one_beside_a_node_of_two";
    if !harness::is_child() {
        // A fresh process (and CUDA context) for the world of three thread-PEs.
        return job(test, 1, 1, "three", 200);
    }
    let hub = InProcBootstrap::new(3, Duration::from_secs(30)).expect("hub");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let hub = &hub;
                s.spawn(move || {
                    // PE 0 alone on node a; PEs 1 and 2 on node b.
                    let node = if r == 0 { "a" } else { "b" };
                    let config = base_config(3).node(node);
                    let pe = Pe::init(config, Box::new(hub.join(r).expect("join")))?;
                    sample(&pe).inspect_err(|e| eprintln!("PE {r}: {e}"))?;
                    pe.finalize()
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            let res = h.join().expect("a PE's thread panicked");
            res.unwrap_or_else(|e| panic!("PE {r}: {e}"));
        }
    });
}

#[test]
#[ignore = "needs a GPU"]
fn a_node_killed_before_a_gpu_all_reduce_is_peer_lost() {
    if fabric_data::skip() {
        return;
    }
    let test = "a_node_killed_before_a_gpu_all_reduce_is_peer_lost";
    if !harness::is_child() {
        warm_kernel_cache();
        let env = [(harness::CHILD_VAR, "kill")];
        let (grace, limit) = (Duration::from_secs(20), Duration::from_secs(60));
        let out = harness::spawn_self_ignored_within(test, 2, 1, &env, grace, limit);
        assert_eq!(out.exits[1], Exit::Signal(9), "the killed node");
        assert_eq!(
            out.exits[0],
            Exit::Code(0),
            "the survivor did not see the loss in time"
        );
        return;
    }
    let pe = Launch::new().config(config()).init().expect("init");
    let g = CudaPe::new(&pe).expect("cuda pe");
    let t0 = Instant::now();
    let coll = GpuColl::new(g, CollConfig::default(), tuning()).expect("GpuColl");
    eprintln!("PE {}: GpuColl::new took {:?}", pe.my_pe(), t0.elapsed());
    let count = 3 * CHUNK / 8;
    let x = pe.alloc::<u64>(count).expect("alloc");
    let y = pe.alloc::<u64>(count).expect("alloc");
    let s = g.stream().expect("stream");
    pe.local_write(&x, 0, &vec![pe.my_pe() as u64 + 1; count])
        .expect("write");
    pe.barrier_all().expect("first barrier");
    // One call that completes on both nodes first.
    coll.all_reduce(&s, pe.world_team(), &y, &x, count, ReduceOp::Sum)
        .expect("launch");
    s.synchronize().expect("synchronize");
    coll.check_errors().expect("first all_reduce");
    eprintln!("PE {}: first all_reduce done", pe.my_pe());
    assert_eq!(pe.local_vec(&y).expect("read"), vec![3u64; count]);
    pe.barrier_all().expect("second barrier");
    if pe.my_pe() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain syscall on this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::process::abort();
    }
    std::thread::sleep(Duration::from_millis(600));
    let t0 = Instant::now();
    coll.all_reduce(&s, pe.world_team(), &y, &x, count, ReduceOp::Sum)
        .expect("launch");
    s.synchronize().expect("the kernels end");
    let r = coll.check_errors();
    assert!(
        matches!(r, Err(Error::PeerLost { pe: 1, .. })),
        "all_reduce with a node gone: {r:?} after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    eprintln!("PE 1 lost, reported after {:?}", t0.elapsed());
}
