//! The cross-node schedules of `net.rs`: exact rounds for small teams, and a model that runs
//! every member's schedule on host vectors for many node layouts, counts and chunks.

use super::net::*;
use crate::coll::plan::{Buf, Step};
use crate::team::NodeMap;
use std::collections::HashMap;

#[test]
fn parts_cover_the_vector_evenly() {
    let all = |count, parts| {
        (0..parts)
            .map(|q| part(count, parts, q))
            .collect::<Vec<_>>()
    };
    assert_eq!(all(10, 3), [(0, 3), (3, 3), (6, 4)]);
    assert_eq!(all(1, 2), [(0, 0), (0, 1)]);
    assert_eq!(all(0, 2), [(0, 0), (0, 0)]);
    assert_eq!(all(7, 1), [(0, 7)]);
    let big = usize::MAX / 2;
    assert_eq!(part(big, 2, 1).0 + part(big, 2, 1).1, big);
}

#[test]
fn all_reduce_rounds_of_a_node_of_one_beside_a_node_of_two() {
    // Member 0 alone on node 0; members 1 and 2 on node 1. Parts of 5; chunks of 3.
    let map = NodeMap::from_nodes(&[0, 1, 1]);
    let round = |index, len, to, at, parity, fold: Vec<Option<(usize, usize)>>| Round {
        index,
        len,
        puts: vec![NetPut {
            to,
            from_at: at,
            dst: NetTo::Scratch(parity),
        }],
        waits: vec![to],
        fold: Some((at, fold)),
    };
    let s0 = all_reduce_sched(&map, 0, 10, 3).unwrap();
    assert_eq!(s0.partners, [1, 2]);
    assert_eq!(
        s0.rounds,
        [
            round(0, 3, 1, 0, 0, vec![None, Some((1, 0))]),
            round(1, 2, 1, 3, 1, vec![None, Some((1, 1))]),
            round(2, 3, 2, 5, 0, vec![None, Some((2, 0))]),
            round(3, 2, 2, 8, 1, vec![None, Some((2, 1))]),
        ]
    );
    assert!(s0.after.is_empty() && !s0.node_phase);
    let s1 = all_reduce_sched(&map, 1, 10, 3).unwrap();
    assert_eq!(s1.partners, [0]);
    assert_eq!(
        s1.rounds,
        [
            round(0, 3, 0, 0, 0, vec![Some((0, 0)), None]),
            round(1, 2, 0, 3, 1, vec![Some((0, 1)), None]),
        ]
    );
    let copy = |peer, at, len| Step::Copy {
        peer,
        from: Buf::Dst,
        from_at: at,
        to: Buf::Dst,
        to_at: at,
        len,
    };
    assert_eq!(s1.after, [copy(1, 5, 5)]);
    assert!(s1.node_phase);
    let s2 = all_reduce_sched(&map, 2, 10, 3).unwrap();
    assert_eq!(
        s2.rounds.iter().map(|r| r.index).collect::<Vec<_>>(),
        [2, 3]
    );
    assert_eq!(s2.after, [copy(0, 0, 5)]);
    // One element: the second part is empty, yet both members of node 1 meet in the node
    // phase (one copies, the other has nothing to copy).
    let e1 = all_reduce_sched(&map, 1, 1, 3).unwrap();
    let e2 = all_reduce_sched(&map, 2, 1, 3).unwrap();
    assert_eq!((e1.rounds.len(), e2.rounds.len()), (0, 1));
    assert_eq!((e1.after.len(), e2.after.len()), (1, 0));
    assert!(e1.node_phase && e2.node_phase);
    let none = all_reduce_sched(&map, 2, 0, 3).unwrap();
    assert!(none.rounds.is_empty() && none.partners.is_empty() && !none.node_phase);
}

#[test]
fn broadcast_and_all_gather_rounds_of_two_nodes_of_one() {
    let map = NodeMap::from_nodes(&[4, 9]);
    let b0 = broadcast_sched(&map, 0, 0, 5, 2).unwrap();
    let put = |to, at| NetPut {
        to,
        from_at: at,
        dst: NetTo::Dst(at),
    };
    assert_eq!(b0.partners, [1]);
    assert_eq!(
        b0.rounds
            .iter()
            .map(|r| (r.index, r.len, r.puts.clone(), r.waits.clone()))
            .collect::<Vec<_>>(),
        [
            (0, 2, vec![put(1, 0)], vec![]),
            (1, 2, vec![put(1, 2)], vec![]),
            (2, 1, vec![put(1, 4)], vec![])
        ]
    );
    let b1 = broadcast_sched(&map, 1, 0, 5, 2).unwrap();
    assert_eq!(
        b1.rounds
            .iter()
            .map(|r| (r.index, r.puts.len(), r.waits.clone()))
            .collect::<Vec<_>>(),
        [(0, 0, vec![0]), (1, 0, vec![0]), (2, 0, vec![0])]
    );
    assert!(!b0.node_phase && !b1.node_phase);
    let g1 = all_gather_sched(&map, 1, 3, 2, false).unwrap();
    assert_eq!(g1.partners, [0]);
    let r = &g1.rounds;
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[1].index, r[1].len, r[1].waits.clone()),
        (1, 1, vec![0usize])
    );
    assert_eq!(
        r[1].puts,
        [NetPut {
            to: 0,
            from_at: 2,
            dst: NetTo::Dst(3 + 2)
        }]
    );
    // Out of place the own block is copied in the node phase; in place nothing is.
    assert_eq!(
        g1.after,
        [Step::Copy {
            peer: 0,
            from: Buf::Src,
            from_at: 0,
            to: Buf::Dst,
            to_at: 3,
            len: 3
        }]
    );
    let g1 = all_gather_sched(&map, 1, 3, 2, true).unwrap();
    assert!(g1.after.is_empty() && !g1.node_phase);
}

/// Node layouts the model runs: pairs, uneven nodes, interleaved members, three nodes.
const LAYOUTS: [&[usize]; 7] = [
    &[0, 1],
    &[0, 1, 1],
    &[0, 0, 1],
    &[0, 1, 0, 1],
    &[0, 0, 0, 1],
    &[0, 1, 2, 1, 0],
    &[5, 5, 2, 5, 7, 7],
];

/// Checks that every wait of every member's rounds has its put (same round, to it) and every
/// put its wait, and that partners are symmetric.
fn check_pairing(scheds: &[NetSched]) {
    let mut puts: HashMap<(u32, usize, usize), usize> = HashMap::new();
    let mut waits: HashMap<(u32, usize, usize), usize> = HashMap::new();
    for (m, s) in scheds.iter().enumerate() {
        for r in &s.rounds {
            for p in &r.puts {
                *puts.entry((r.index, m, p.to)).or_default() += 1;
                assert!(s.partners.contains(&p.to));
            }
            for &w in &r.waits {
                *waits.entry((r.index, w, m)).or_default() += 1;
                assert!(s.partners.contains(&w));
            }
        }
        for &p in &s.partners {
            assert!(scheds[p].partners.contains(&m), "partners {m} and {p}");
        }
    }
    assert_eq!(
        puts, waits,
        "every put is waited for once, every wait has its put"
    );
    assert!(puts.values().all(|&c| c == 1));
}

/// What member m's puts read, given every member's `dst`.
type Input<'a> = &'a dyn Fn(usize, &[Vec<u64>]) -> Vec<u64>;

/// Runs the rounds of every member in round order, then the node phase, on host vectors.
/// `dst[m]` is member m's output, `input(m)` what its puts read.
fn run_rounds(
    map: &NodeMap,
    scheds: &[NetSched],
    dst: &mut [Vec<u64>],
    input: Input<'_>,
    src: &[Vec<u64>],
) {
    let n = scheds.len();
    let last = scheds
        .iter()
        .flat_map(|s| s.rounds.iter().map(|r| r.index + 1))
        .max()
        .unwrap_or(0);
    // scratch[(receiver, sender, parity)]
    let mut scratch: HashMap<(usize, usize, usize), Vec<u64>> = HashMap::new();
    for idx in 0..last {
        let inputs: Vec<Vec<u64>> = (0..n).map(|m| input(m, dst)).collect();
        for (m, s) in scheds.iter().enumerate() {
            for r in s.rounds.iter().filter(|r| r.index == idx) {
                for p in &r.puts {
                    let data = inputs[m][p.from_at..p.from_at + r.len].to_vec();
                    match p.dst {
                        NetTo::Dst(at) => dst[p.to][at..at + r.len].copy_from_slice(&data),
                        NetTo::Scratch(parity) => {
                            let old = scratch.insert((p.to, m, parity), data);
                            assert!(old.is_none(), "scratch half overwritten before its fold");
                        }
                    }
                }
            }
        }
        for (m, s) in scheds.iter().enumerate() {
            for r in s.rounds.iter().filter(|r| r.index == idx) {
                if let Some((at, srcs)) = &r.fold {
                    assert_eq!(srcs.len(), map.n_nodes());
                    let mut acc = vec![0u64; r.len];
                    for src in srcs {
                        let part = match src {
                            None => dst[m][*at..at + r.len].to_vec(),
                            Some((o, parity)) => {
                                scratch.remove(&(m, *o, *parity)).expect("scratch half")
                            }
                        };
                        assert_eq!(part.len(), r.len);
                        for (a, v) in acc.iter_mut().zip(part) {
                            *a = a.wrapping_add(v);
                        }
                    }
                    dst[m][*at..at + r.len].copy_from_slice(&acc);
                }
            }
        }
    }
    assert!(scratch.is_empty(), "scratch halves never folded");
    // Node phase: copies read the peers' buffers as they were after the rounds.
    let before = dst.to_vec();
    for (m, s) in scheds.iter().enumerate() {
        assert!(s.node_phase || s.after.is_empty());
        let node = map.members(map.node(m));
        for st in &s.after {
            let Step::Copy {
                peer,
                from,
                from_at,
                to: Buf::Dst,
                to_at,
                len,
            } = *st
            else {
                panic!("node phase step {st:?}")
            };
            let p = node[peer];
            let data = match from {
                Buf::Dst => before[p][from_at..from_at + len].to_vec(),
                Buf::Src => src[p][from_at..from_at + len].to_vec(),
                Buf::Temp => panic!("temp"),
            };
            dst[m][to_at..to_at + len].copy_from_slice(&data);
        }
    }
    // Members of one node agree on whether the node phase runs (its barriers).
    for k in 0..map.n_nodes() {
        let ph: Vec<bool> = map
            .members(k)
            .iter()
            .map(|&m| scheds[m].node_phase)
            .collect();
        assert!(ph.iter().all(|&p| p == ph[0]), "node {k}: {ph:?}");
    }
}

fn vals(m: usize, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| ((m as u64 + 1) * 1_000_003) ^ (i as u64 * 0x9e37_79b9))
        .collect()
}

#[test]
fn the_model_all_reduces_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in [0, 1, 2, 5, 17, 64] {
            for chunk in [1, 3, 100] {
                let scheds: Vec<NetSched> = (0..n)
                    .map(|m| all_reduce_sched(&map, m, count, chunk).unwrap())
                    .collect();
                check_pairing(&scheds);
                // Node partials first (the node-local all_reduce).
                let mut dst: Vec<Vec<u64>> = (0..n)
                    .map(|m| {
                        let mut p = vec![0u64; count];
                        for &o in map.members(map.node(m)) {
                            for (a, v) in p.iter_mut().zip(vals(o, count)) {
                                *a = a.wrapping_add(v);
                            }
                        }
                        p
                    })
                    .collect();
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, count)).collect();
                run_rounds(&map, &scheds, &mut dst, &|m, d| d[m].clone(), &src);
                let mut want = vec![0u64; count];
                for s in &src {
                    for (a, v) in want.iter_mut().zip(s) {
                        *a = a.wrapping_add(*v);
                    }
                }
                for (m, d) in dst.iter().enumerate() {
                    assert_eq!(d, &want, "{nodes:?} count {count} chunk {chunk} member {m}");
                }
            }
        }
    }
}

#[test]
fn the_model_broadcasts_and_gathers_exactly_on_every_layout() {
    const POISON: u64 = 0xdead_beef;
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in [0, 1, 2, 5, 17] {
            for chunk in [1, 3, 100] {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, count)).collect();
                for root in 0..n {
                    let scheds: Vec<NetSched> = (0..n)
                        .map(|m| broadcast_sched(&map, m, root, count, chunk).unwrap())
                        .collect();
                    check_pairing(&scheds);
                    // The root's node holds the data (the node-local broadcast).
                    let mut dst: Vec<Vec<u64>> = (0..n)
                        .map(|m| {
                            if map.node(m) == map.node(root) {
                                src[root].clone()
                            } else {
                                vec![POISON; count]
                            }
                        })
                        .collect();
                    run_rounds(&map, &scheds, &mut dst, &|m, d| d[m].clone(), &src);
                    for (m, d) in dst.iter().enumerate() {
                        assert_eq!(d, &src[root], "{nodes:?} {count}/{chunk} root {root} m {m}");
                    }
                }
                for in_place in [false, true] {
                    let scheds: Vec<NetSched> = (0..n)
                        .map(|m| all_gather_sched(&map, m, count, chunk, in_place).unwrap())
                        .collect();
                    check_pairing(&scheds);
                    let mut dst: Vec<Vec<u64>> = (0..n)
                        .map(|m| {
                            let mut d = vec![POISON; n * count];
                            if in_place {
                                d[m * count..(m + 1) * count].copy_from_slice(&src[m]);
                            }
                            d
                        })
                        .collect();
                    let input = |m: usize, d: &[Vec<u64>]| {
                        if in_place {
                            d[m][m * count..(m + 1) * count].to_vec()
                        } else {
                            src[m].clone()
                        }
                    };
                    run_rounds(&map, &scheds, &mut dst, &input, &src);
                    let want: Vec<u64> = src.concat();
                    for (m, d) in dst.iter().enumerate() {
                        assert_eq!(
                            d, &want,
                            "{nodes:?} {count}/{chunk} in place {in_place} m {m}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_model_all_to_alls_exactly_on_every_layout() {
    const POISON: u64 = 0xdead_beef;
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in [0, 1, 2, 5, 17] {
            for chunk in [1, 3, 100] {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, n * count)).collect();
                let scheds: Vec<NetSched> = (0..n)
                    .map(|m| all_to_all_sched(&map, m, count, chunk).unwrap())
                    .collect();
                check_pairing(&scheds);
                let mut dst = vec![vec![POISON; n * count]; n];
                run_rounds(&map, &scheds, &mut dst, &|m, _| src[m].clone(), &src);
                for (m, d) in dst.iter().enumerate() {
                    let want: Vec<u64> = (0..n)
                        .flat_map(|j| src[j][m * count..(m + 1) * count].to_vec())
                        .collect();
                    assert_eq!(d, &want, "{nodes:?} {count}/{chunk} member {m}");
                }
            }
        }
    }
    // Two nodes of one: one put per round to the other member, the own share copied.
    let map = NodeMap::from_nodes(&[0, 1]);
    let s = all_to_all_sched(&map, 1, 4, 3).unwrap();
    assert_eq!(s.partners, [0]);
    assert_eq!(
        s.rounds[1].puts,
        [NetPut {
            to: 0,
            from_at: 3,
            dst: NetTo::Dst(4 + 3)
        }]
    );
    assert_eq!((s.rounds[1].len, s.rounds[1].waits.clone()), (1, vec![0]));
    assert_eq!(
        s.after,
        [Step::Copy {
            peer: 0,
            from: Buf::Src,
            from_at: 4,
            to: Buf::Dst,
            to_at: 4,
            len: 4
        }]
    );
}

#[test]
fn node_teams_are_strided_on_the_teams_slot() {
    // World PEs 0..6 on nodes a b a b a b: node a holds 0, 2, 4 (stride 2).
    let map = NodeMap::from_nodes(&[0, 1, 0, 1, 0, 1]);
    let members: Vec<usize> = (0..6).collect();
    let t = node_team(&map, &members, 4, 7).unwrap();
    assert_eq!(
        (t.slot, t.my_index, t.size, t.start, t.stride),
        (7, 2, 3, 0, 2)
    );
    let t = node_team(&map, &members, 1, 7).unwrap();
    assert_eq!((t.my_index, t.size, t.start, t.stride), (0, 3, 1, 2));
    // Node a holds world PEs 0, 1, 3: not strided.
    let map = NodeMap::from_nodes(&[0, 0, 1, 0]);
    let r = node_team(&map, &[0, 1, 2, 3], 0, 1);
    assert!(matches!(r, Err(crate::Error::Team(_))), "{r:?}");
    // A node of one.
    let t = node_team(&map, &[0, 1, 2, 3], 2, 1).unwrap();
    assert_eq!((t.my_index, t.size, t.start, t.stride), (0, 1, 2, 1));
}
