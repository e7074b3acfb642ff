//! The plans run on a model of the members' memory: data, hazards, cross-node reads.

#![allow(clippy::needless_range_loop)] // member indices index several tables

use super::*;
use std::ops::Range;

/// A model of n members' memory: runs plans phase by phase, checks that no member writes
/// what another reads in the same phase, and returns every member's Dst.
struct Model {
    n: usize,
    in_place: bool,
    src: Vec<Vec<i64>>,
    dst: Vec<Vec<i64>>,
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}

impl Model {
    /// The memory a (member, buf) names: Src and Dst are one object in place.
    fn obj(&self, b: Buf) -> u8 {
        match b {
            Buf::Src => 0,
            Buf::Dst if self.in_place => 0,
            Buf::Dst => 1,
            Buf::Temp => 2,
        }
    }
    fn read(&self, m: usize, b: Buf, at: usize, len: usize, temp: &[Vec<i64>]) -> Vec<i64> {
        let v = match self.obj(b) {
            0 => &self.src[m],
            1 => &self.dst[m],
            _ => &temp[m],
        };
        v[at..at + len].to_vec()
    }
    fn write(&mut self, m: usize, b: Buf, at: usize, x: &[i64], temp: &mut [Vec<i64>]) {
        let v = match self.obj(b) {
            0 => &mut self.src[m],
            1 => &mut self.dst[m],
            _ => &mut temp[m],
        };
        v[at..at + x.len()].copy_from_slice(x);
    }

    /// `n` members' objects of `len` elements: `src` holds member inputs, `dst` is poisoned;
    /// an in-place all_gather's input sits at the member's part of the object.
    fn with_inputs(kind: CollKind, n: usize, count: usize, len: usize, in_place: bool) -> Model {
        let mut md = Model {
            n,
            in_place,
            src: (0..n)
                .map(|m| (0..len).map(|i| input(m, i)).collect())
                .collect(),
            dst: (0..n).map(|_| vec![-1; len]).collect(),
        };
        if in_place && kind == CollKind::AllGather {
            for m in 0..n {
                let v: Vec<i64> = (0..count).map(|i| input(m, i)).collect();
                md.src[m][m * count..(m + 1) * count].copy_from_slice(&v);
            }
        }
        md
    }

    fn run(&mut self, plans: &[Plan]) {
        let n = self.n;
        let mut temp: Vec<Vec<i64>> = plans.iter().map(|p| vec![0; p.temp_len]).collect();
        let phases: Vec<Vec<&[Step]>> = plans
            .iter()
            .map(|p| {
                assert_eq!(p.steps[0], Step::Sync, "{p:?}");
                p.steps.split(|s| *s == Step::Sync).collect()
            })
            .collect();
        let np = phases[0].len();
        assert!(phases.iter().all(|p| p.len() == np), "sync counts differ");
        // Shared Temp is symmetric: peers read it, and writes to it are hazards like any.
        let shared = plans[0].temp_shared();
        assert!(plans
            .iter()
            .all(|p| p.temp_shared() == shared || p.temp_len == 0));
        for ph in 0..np {
            // (reader, owner, object, range) and (owner, object, range)
            let mut reads = Vec::new();
            let mut writes = Vec::new();
            for m in 0..n {
                for st in phases[m][ph] {
                    match *st {
                        Step::Copy {
                            peer,
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            assert!(from != Buf::Temp || peer == m || shared);
                            reads.push((m, peer, self.obj(from), from_at..from_at + len));
                            writes.push((m, self.obj(to), to_at..to_at + len));
                        }
                        Step::Reduce {
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            assert!(from != Buf::Temp || shared);
                            for p in 0..n {
                                reads.push((m, p, self.obj(from), from_at..from_at + len));
                            }
                            writes.push((m, self.obj(to), to_at..to_at + len));
                        }
                        Step::ReduceGroup {
                            group,
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            assert!(from != Buf::Temp || shared);
                            for &p in &plans[m].groups[group] {
                                reads.push((m, p, self.obj(from), from_at..from_at + len));
                            }
                            writes.push((m, self.obj(to), to_at..to_at + len));
                        }
                        Step::Sync => unreachable!(),
                    }
                }
            }
            if ph == np - 1 {
                // after the last sync nobody reads peer memory any more
                assert!(
                    reads.iter().all(|(rm, ro, _, _)| rm == ro),
                    "reads after the last sync"
                );
            }
            for (wm, wo, wr) in &writes {
                for (rm, ro, oo, rr) in &reads {
                    if rm != wm && ro == wm && oo == wo && (*wo != 2 || shared) {
                        assert!(!overlap(wr, rr), "hazard: member {wm} writes {wo}:{wr:?} while member {rm} reads it (phase {ph})");
                    }
                }
            }
            for m in 0..n {
                for st in phases[m][ph] {
                    match *st {
                        Step::Copy {
                            peer,
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            let x = self.read(peer, from, from_at, len, &temp);
                            self.write(m, to, to_at, &x, &mut temp);
                        }
                        Step::Reduce {
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            let mut acc = self.read(0, from, from_at, len, &temp);
                            for p in 1..n {
                                let x = self.read(p, from, from_at, len, &temp);
                                for (a, b) in acc.iter_mut().zip(x) {
                                    *a = a.wrapping_add(b);
                                }
                            }
                            self.write(m, to, to_at, &acc, &mut temp);
                        }
                        Step::ReduceGroup {
                            group,
                            from,
                            from_at,
                            to,
                            to_at,
                            len,
                        } => {
                            let mut acc = vec![0i64; len];
                            for &p in &plans[m].groups[group] {
                                let x = self.read(p, from, from_at, len, &temp);
                                for (a, b) in acc.iter_mut().zip(x) {
                                    *a = a.wrapping_add(b);
                                }
                            }
                            self.write(m, to, to_at, &acc, &mut temp);
                        }
                        Step::Sync => unreachable!(),
                    }
                }
            }
        }
    }
}

fn input(m: usize, i: usize) -> i64 {
    (m as i64 + 1) * 1000 + i as i64
}

/// Runs `kind` on the model and returns each member's destination object.
fn model(
    kind: CollKind,
    n: usize,
    count: usize,
    in_place: bool,
    algo: Algo,
    chunk: usize,
    root: usize,
) -> Vec<Vec<i64>> {
    let (src_len, dst_len) = match kind {
        CollKind::Broadcast | CollKind::Reduce | CollKind::AllReduce => (count, count),
        CollKind::AllGather => (count, n * count),
        CollKind::ReduceScatter => (n * count, count),
        _ => (n * count, n * count),
    };
    let mut md = Model::with_inputs(kind, n, count, src_len.max(dst_len), in_place);
    let plans: Vec<Plan> = (0..n)
        .map(|me| {
            let s = Shape {
                n,
                me,
                in_place,
                chunk,
            };
            match kind {
                CollKind::Broadcast => broadcast(s, root, count, algo),
                CollKind::Reduce => reduce(s, root, count),
                CollKind::AllReduce => all_reduce(s, count, algo),
                CollKind::AllGather => all_gather(s, count),
                CollKind::ReduceScatter => reduce_scatter(s, count),
                CollKind::AllToAll => all_to_all(s, count),
                CollKind::AllToAllV => unreachable!(),
            }
        })
        .collect();
    md.run(&plans);
    if in_place {
        md.src
    } else {
        md.dst
    }
}

#[test]
fn plans_are_correct_and_hazard_free() {
    for n in 1..=5 {
        for count in [0, 1, 3, 7, 20] {
            for in_place in [false, true] {
                for algo in [Algo::OneShot, Algo::TwoShot] {
                    for chunk in [1, 3, 1 << 20] {
                        let sum = |i: usize| (0..n).map(|m| input(m, i)).sum::<i64>();
                        let ctx = format!(
                            "n {n} count {count} in_place {in_place} {algo:?} chunk {chunk}"
                        );
                        for root in 0..n {
                            let d =
                                model(CollKind::Broadcast, n, count, in_place, algo, chunk, root);
                            for m in 0..n {
                                let want: Vec<i64> = (0..count).map(|i| input(root, i)).collect();
                                assert_eq!(d[m][..count], want[..], "broadcast root {root} {ctx}");
                            }
                            let d = model(CollKind::Reduce, n, count, in_place, algo, chunk, root);
                            let want: Vec<i64> = (0..count).map(sum).collect();
                            assert_eq!(d[root][..count], want[..], "reduce {ctx}");
                        }
                        let d = model(CollKind::AllReduce, n, count, in_place, algo, chunk, 0);
                        for m in 0..n {
                            let want: Vec<i64> = (0..count).map(sum).collect();
                            assert_eq!(d[m][..count], want[..], "all_reduce {ctx}");
                        }
                        let d = model(CollKind::AllGather, n, count, in_place, algo, chunk, 0);
                        let want: Vec<i64> = (0..n * count)
                            .map(|i| input(i / count.max(1), i % count.max(1)))
                            .collect();
                        for m in 0..n {
                            assert_eq!(d[m][..n * count], want[..], "all_gather {ctx}");
                        }
                        let d = model(CollKind::ReduceScatter, n, count, in_place, algo, chunk, 0);
                        for m in 0..n {
                            let want: Vec<i64> = (m * count..(m + 1) * count).map(sum).collect();
                            let at = if in_place { m * count } else { 0 };
                            assert_eq!(d[m][at..at + count], want[..], "reduce_scatter {ctx}");
                        }
                        let d = model(CollKind::AllToAll, n, count, in_place, algo, chunk, 0);
                        for m in 0..n {
                            let want: Vec<i64> = (0..n * count)
                                .map(|i| input(i / count.max(1), m * count + i % count.max(1)))
                                .collect();
                            assert_eq!(d[m][..n * count], want[..], "all_to_all {ctx}");
                        }
                    }
                }
            }
        }
    }
}

/// Runs the hierarchical plan of `kind` on the model for members on `nodes`.
fn model_hier(
    kind: CollKind,
    nodes: &crate::team::NodeMap,
    count: usize,
    in_place: bool,
    chunk: usize,
    root: usize,
) -> (Vec<Vec<i64>>, Vec<Plan>) {
    model_hier_scratch(kind, nodes, count, in_place, chunk, root, 0)
}

/// As [`model_hier`], with `scratch` elements of shared `Temp` (reduce, reduce_scatter out of
/// place); checks that no plan uses more.
fn model_hier_scratch(
    kind: CollKind,
    nodes: &crate::team::NodeMap,
    count: usize,
    in_place: bool,
    chunk: usize,
    root: usize,
    scratch: usize,
) -> (Vec<Vec<i64>>, Vec<Plan>) {
    let n = nodes.n_pes();
    let len = match kind {
        CollKind::AllGather | CollKind::ReduceScatter => n * count,
        _ => count,
    };
    let mut md = Model::with_inputs(kind, n, count, len, in_place);
    let plans: Vec<Plan> = (0..n)
        .map(|me| {
            let s = Shape {
                n,
                me,
                in_place,
                chunk,
            };
            match kind {
                CollKind::AllReduce => hier::all_reduce(s, nodes, count),
                CollKind::AllGather => hier::all_gather(s, nodes, count),
                CollKind::Broadcast => hier::broadcast(s, nodes, root, count),
                CollKind::ReduceScatter if in_place => hier::reduce_scatter(s, nodes, count),
                CollKind::ReduceScatter => hier::reduce_scatter_out(s, nodes, count, scratch),
                CollKind::Reduce => hier::reduce(s, nodes, root, count, scratch),
                _ => unreachable!(),
            }
        })
        .collect();
    for p in &plans {
        assert!(!p.temp_shared() || p.temp_len <= scratch, "{p:?}");
    }
    md.run(&plans);
    (if in_place { md.src } else { md.dst }, plans)
}

/// Elements member `m` reads from members of other nodes in `plan`.
fn cross_node_reads(plan: &Plan, nodes: &crate::team::NodeMap) -> usize {
    let me = plan.shape.me;
    let far = |p: usize| nodes.node(p) != nodes.node(me);
    plan.steps
        .iter()
        .map(|st| match *st {
            Step::Copy { peer, len, .. } if far(peer) => len,
            Step::Reduce { len, .. } => len * (0..plan.shape.n).filter(|&p| far(p)).count(),
            Step::ReduceGroup { group, len, .. } => {
                len * plan.groups[group].iter().filter(|&&p| far(p)).count()
            }
            _ => 0,
        })
        .sum()
}

/// Elements every member reads from members of other nodes in `plans` (one plan a member).
fn total_cross_node_reads(plans: &[Plan], nodes: &crate::team::NodeMap) -> usize {
    plans.iter().map(|p| cross_node_reads(p, nodes)).sum()
}

/// As [`total_cross_node_reads`] for the flat plans `plan` makes of each member's shape.
fn flat_cross_node_reads(
    nodes: &crate::team::NodeMap,
    in_place: bool,
    chunk: usize,
    plan: impl Fn(Shape) -> Plan,
) -> usize {
    let n = nodes.n_pes();
    (0..n)
        .map(|me| {
            let s = Shape {
                n,
                me,
                in_place,
                chunk,
            };
            cross_node_reads(&plan(s), nodes)
        })
        .sum()
}

/// Node of each member in the hierarchical plan tests: pairs, interleaved, lone members,
/// nodes of unequal sizes and node ids out of order.
const TOPOLOGIES: [&[usize]; 7] = [
    &[0, 0, 1, 1],
    &[0, 0, 1, 1, 2, 2],
    &[0, 1, 0, 1],
    &[0, 0, 0, 1],
    &[0, 1, 1, 1],
    &[0, 0, 1, 2, 2, 2],
    &[3, 1, 3, 1, 1],
];

#[test]
fn hierarchical_plans_are_correct_hazard_free_and_cross_less() {
    use crate::team::NodeMap;
    for topo in TOPOLOGIES {
        let nodes = NodeMap::from_nodes(topo);
        let n = topo.len();
        for count in [0, 1, 3, 7, 20] {
            for in_place in [false, true] {
                for chunk in [1, 3, 1 << 20] {
                    let ctx = format!("{topo:?} count {count} in_place {in_place} chunk {chunk}");
                    let sum = |i: usize| (0..n).map(|m| input(m, i)).sum::<i64>();
                    let (d, plans) =
                        model_hier(CollKind::AllReduce, &nodes, count, in_place, chunk, 0);
                    for m in 0..n {
                        let want: Vec<i64> = (0..count).map(sum).collect();
                        assert_eq!(d[m][..count], want[..], "all_reduce {ctx}");
                    }
                    // Fewer elements cross nodes than in the flat plans.
                    if count >= 7 && chunk == 1 << 20 {
                        let cross: usize = total_cross_node_reads(&plans, &nodes);
                        for algo in [Algo::OneShot, Algo::TwoShot] {
                            let flat = flat_cross_node_reads(&nodes, in_place, chunk, |s| {
                                all_reduce(s, count, algo)
                            });
                            assert!(cross < flat, "all_reduce {ctx}: {cross} vs {algo:?} {flat}");
                        }
                        assert_eq!(
                            cross,
                            nodes.n_nodes() * (nodes.n_nodes() - 1) * count,
                            "{ctx}"
                        );
                    }
                    let (d, plans) =
                        model_hier(CollKind::AllGather, &nodes, count, in_place, chunk, 0);
                    let want: Vec<i64> = (0..n * count)
                        .map(|i| input(i / count.max(1), i % count.max(1)))
                        .collect();
                    for m in 0..n {
                        assert_eq!(d[m][..n * count], want[..], "all_gather {ctx}");
                    }
                    let cross: usize = total_cross_node_reads(&plans, &nodes);
                    let per_node: usize = (0..nodes.n_nodes())
                        .map(|k| (n - nodes.members(k).len()) * count)
                        .sum();
                    assert_eq!(cross, per_node, "all_gather crossings {ctx}");
                    if in_place {
                        // Member m's block m: the sum over members of their block m.
                        let (d, plans) =
                            model_hier(CollKind::ReduceScatter, &nodes, count, true, chunk, 0);
                        for m in 0..n {
                            let want: Vec<i64> = (0..count)
                                .map(|i| (0..n).map(|p| input(p, m * count + i)).sum())
                                .collect();
                            assert_eq!(
                                d[m][m * count..(m + 1) * count],
                                want[..],
                                "reduce_scatter {ctx}"
                            );
                        }
                        let cross: usize = total_cross_node_reads(&plans, &nodes);
                        assert_eq!(
                            cross,
                            n * (nodes.n_nodes() - 1) * count,
                            "reduce_scatter crossings {ctx}"
                        );
                        if count >= 7 && chunk == 1 << 20 {
                            let flat = flat_cross_node_reads(&nodes, in_place, chunk, |s| {
                                reduce_scatter(s, count)
                            });
                            assert!(cross < flat, "reduce_scatter {ctx}: {cross} vs {flat}");
                        }
                    }
                    for root in 0..n {
                        let (d, plans) =
                            model_hier(CollKind::Broadcast, &nodes, count, in_place, chunk, root);
                        let want: Vec<i64> = (0..count).map(|i| input(root, i)).collect();
                        for m in 0..n {
                            assert_eq!(d[m][..count], want[..], "broadcast root {root} {ctx}");
                        }
                        let cross: usize = total_cross_node_reads(&plans, &nodes);
                        assert_eq!(cross, (nodes.n_nodes() - 1) * count, "broadcast {ctx}");
                    }
                }
            }
        }
    }
}

#[test]
fn hierarchical_reduce_and_out_of_place_reduce_scatter_through_scratch() {
    use crate::team::NodeMap;
    for topo in TOPOLOGIES {
        let nodes = NodeMap::from_nodes(topo);
        let (n, nn) = (topo.len(), nodes.n_nodes());
        for count in [0, 1, 3, 7, 20] {
            for chunk in [1, 3, 1 << 20] {
                // Scratch of one window or several, down to one element per member.
                for scratch in [n, n + 1, 3 * n, 1 << 20] {
                    let ctx = format!("{topo:?} count {count} chunk {chunk} scratch {scratch}");
                    let flat_cross = |kind: CollKind, root: usize, in_place: bool| -> usize {
                        flat_cross_node_reads(&nodes, in_place, chunk, |s| match kind {
                            CollKind::Reduce => reduce(s, root, count),
                            _ => reduce_scatter(s, count),
                        })
                    };
                    for in_place in [false, true] {
                        for root in 0..n {
                            let (d, plans) = model_hier_scratch(
                                CollKind::Reduce,
                                &nodes,
                                count,
                                in_place,
                                chunk,
                                root,
                                scratch,
                            );
                            let ctx = format!("{ctx} in_place {in_place} root {root}");
                            for m in 0..n {
                                let want: Vec<i64> = if m == root {
                                    (0..count)
                                        .map(|i| (0..n).map(|p| input(p, i)).sum())
                                        .collect()
                                } else if in_place {
                                    (0..count).map(|i| input(m, i)).collect() // input untouched
                                } else {
                                    vec![-1; count] // poison untouched
                                };
                                assert_eq!(d[m][..count], want[..], "reduce member {m} {ctx}");
                            }
                            let windows = count.div_ceil(scratch);
                            let syncs = if windows == 0 { 2 } else { 3 * windows + 1 };
                            assert!(plans.iter().all(|p| p.syncs() == syncs), "syncs {ctx}");
                            let cross: usize = total_cross_node_reads(&plans, &nodes);
                            assert_eq!(cross, (nn - 1) * count, "reduce crossings {ctx}");
                            // Fewer than flat where another node than the root's has
                            // several members (else both read each other node once).
                            let kr = nodes.node(root);
                            let gain = (0..nn).any(|j| j != kr && nodes.members(j).len() > 1);
                            if count >= 7 {
                                let flat = flat_cross(CollKind::Reduce, root, in_place);
                                assert!(cross <= flat, "reduce {ctx}: {cross} vs flat {flat}");
                                assert_eq!(cross < flat, gain, "reduce {ctx}: {cross} vs {flat}");
                            }
                        }
                    }
                    let (d, plans) = model_hier_scratch(
                        CollKind::ReduceScatter,
                        &nodes,
                        count,
                        false,
                        chunk,
                        0,
                        scratch,
                    );
                    for m in 0..n {
                        let want: Vec<i64> = (0..count)
                            .map(|i| (0..n).map(|p| input(p, m * count + i)).sum())
                            .collect();
                        assert_eq!(d[m][..count], want[..], "reduce_scatter member {m} {ctx}");
                        assert!(d[m][count..].iter().all(|&v| v == -1), "beyond count {ctx}");
                    }
                    let cross: usize = total_cross_node_reads(&plans, &nodes);
                    assert_eq!(
                        cross,
                        n * (nn - 1) * count,
                        "reduce_scatter crossings {ctx}"
                    );
                    if count >= 7 {
                        let flat = flat_cross(CollKind::ReduceScatter, 0, false);
                        assert!(cross < flat, "reduce_scatter {ctx}: {cross} vs flat {flat}");
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_v_in_place_alone_with_shifted_ranges() {
    // A team of one, in place, receive range after (or before) the overlapping send range,
    // copied in chunks: every chunk must read the original data.
    for (src_at, dst_at) in [(0, 2), (2, 0), (1, 1)] {
        for chunk in [1, 3, 1 << 20] {
            let s = Shape {
                n: 1,
                me: 0,
                in_place: true,
                chunk,
            };
            let recv = [VRecv {
                count: 5,
                src_at,
                dst_at,
            }];
            let orig: Vec<i64> = (0..8).map(|i| input(0, i)).collect();
            let mut md = Model {
                n: 1,
                in_place: true,
                src: vec![orig.clone()],
                dst: vec![vec![-1; 8]],
            };
            md.run(&[all_to_all_v(s, &recv)]);
            let mut want = orig.clone();
            want[dst_at..dst_at + 5].copy_from_slice(&orig[src_at..src_at + 5]);
            assert_eq!(
                md.src[0], want,
                "src_at {src_at} dst_at {dst_at} chunk {chunk}"
            );
        }
    }
}

#[test]
fn parts_cover() {
    for n in 1..7 {
        for c in [0, 1, 5, 100] {
            let mut next = 0;
            for k in 0..n {
                let (at, len) = part(k, n, c);
                assert_eq!(at, next);
                next += len;
            }
            assert_eq!(next, c);
        }
    }
}

#[test]
fn chunking_bounds_steps() {
    let p = all_reduce(
        Shape {
            n: 3,
            me: 1,
            in_place: false,
            chunk: 4,
        },
        10,
        Algo::OneShot,
    );
    assert_eq!(p.syncs(), 2);
    assert!(p.steps.iter().all(|s| match s {
        Step::Reduce { len, .. } | Step::ReduceGroup { len, .. } | Step::Copy { len, .. } =>
            *len <= 4,
        Step::Sync => true,
    }));
    assert_eq!(p.temp_len, 0);
    let p = all_reduce(
        Shape {
            n: 3,
            me: 1,
            in_place: true,
            chunk: 4,
        },
        10,
        Algo::OneShot,
    );
    assert_eq!(p.temp_len, 10);
    assert_eq!(p.syncs(), 2);
    let p = all_reduce(
        Shape {
            n: 3,
            me: 1,
            in_place: true,
            chunk: 4,
        },
        10,
        Algo::TwoShot,
    );
    assert_eq!((p.temp_len, p.syncs()), (0, 3));
}
