//! The cross-node schedules of `net_sched.rs`: exact rounds for small teams, and a model that
//! runs every member's schedule on host vectors for many node layouts, counts and chunks, in
//! many interleavings of the members' progress.

use super::net::node_team;
use super::net_model::*;
use super::net_sched::*;
use crate::coll::plan::{Buf, Step};
use crate::team::NodeMap;

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
    #[allow(clippy::too_many_arguments)]
    let round = |index, len, to, at, node, parity, ack, fold: FoldSrcs| Round {
        index,
        len,
        acks: Vec::new(),
        puts: vec![NetPut {
            to,
            from_at: at,
            dst: NetTo::Scratch { node, parity },
            ack,
        }],
        waits: vec![to],
        fold: Some((at, fold)),
    };
    let s0 = all_reduce_sched(&map, 0, 10, 3).unwrap();
    assert_eq!(s0.partners, [1, 2]);
    // Member 0's slot of node 1 takes member 1's part, then member 2's: member 2 waits for
    // member 0's acknowledgement of the first fold before its first put (its second put
    // follows member 0's put to it, sent after the fold it overwrites).
    let mut r1 = round(1, 2, 1, 3, 0, 1, 0, vec![None, Some((1, 1))]);
    r1.acks = vec![(2, 1)];
    assert_eq!(
        s0.rounds,
        [
            round(0, 3, 1, 0, 0, 0, 0, vec![None, Some((1, 0))]),
            r1,
            round(2, 3, 2, 5, 0, 0, 0, vec![None, Some((1, 0))]),
            round(3, 2, 2, 8, 0, 1, 0, vec![None, Some((1, 1))]),
        ]
    );
    assert!(s0.after.is_empty() && !s0.node_phase && s0.input == Buf::Dst);
    let s1 = all_reduce_sched(&map, 1, 10, 3).unwrap();
    assert_eq!(s1.partners, [0]);
    assert_eq!(
        s1.rounds,
        [
            round(0, 3, 0, 0, 1, 0, 0, vec![Some((0, 0)), None]),
            round(1, 2, 0, 3, 1, 1, 0, vec![Some((0, 1)), None]),
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
        s2.rounds,
        [
            round(2, 3, 0, 5, 1, 0, 1, vec![Some((0, 0)), None]),
            round(3, 2, 0, 8, 1, 1, 0, vec![Some((0, 1)), None]),
        ]
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
fn equal_nodes_all_reduce_without_acknowledgements() {
    // Two nodes of two: each part has the same owner pair in every round; the exchange
    // itself frees the slots.
    let map = NodeMap::from_nodes(&[0, 0, 1, 1]);
    for m in 0..4 {
        let s = all_reduce_sched(&map, m, 40, 3).unwrap();
        assert!(s.rounds.len() > 4);
        assert!(s.rounds.iter().all(|r| r.acks.is_empty()));
        assert!(s.rounds.iter().flat_map(|r| &r.puts).all(|p| p.ack == 0));
    }
}

#[test]
fn reduce_scatter_and_reduce_rounds_of_two_nodes_of_one() {
    let map = NodeMap::from_nodes(&[4, 9]);
    // reduce_scatter of 5 in chunks of 2, out of place: member 1 puts its input's block 0
    // into member 0's slot of node 1, member 0 folds it into dst[0..]; the own block is
    // copied first. The exchange is symmetric: no acknowledgements.
    let s = reduce_scatter_sched(&map, 1, 5, 2, false).unwrap();
    assert_eq!(s.partners, [0]);
    assert_eq!(s.input, Buf::Src);
    assert!(!s.before_phase);
    assert_eq!(
        s.before,
        [Step::Copy {
            peer: 0,
            from: Buf::Src,
            from_at: 5,
            to: Buf::Dst,
            to_at: 0,
            len: 5
        }]
    );
    assert_eq!(s.rounds.len(), 3);
    let r = &s.rounds[2];
    assert_eq!((r.index, r.len, r.waits.clone()), (2, 1, vec![0]));
    assert_eq!(
        r.puts,
        [NetPut {
            to: 0,
            from_at: 4,
            dst: NetTo::Scratch { node: 1, parity: 0 },
            ack: 0
        }]
    );
    assert_eq!(r.fold, Some((4, vec![Some((0, 0)), None])));
    // reduce to member 0 of 5 in chunks of 2: member 1 only puts; from its third put on it
    // waits for member 0's acknowledgements, which member 0 posts a round after each fold.
    let s1 = reduce_sched(&map, 1, 0, 5, 2, false).unwrap();
    assert_eq!(s1.input, Buf::Src);
    let acks: Vec<u32> = s1.rounds.iter().map(|r| r.puts[0].ack).collect();
    assert_eq!(acks, [0, 0, 1]);
    assert!(s1
        .rounds
        .iter()
        .all(|r| r.waits.is_empty() && r.fold.is_none()));
    let s0 = reduce_sched(&map, 0, 0, 5, 2, true).unwrap();
    assert!(
        s0.before.is_empty(),
        "in place on a node of one: nothing to copy"
    );
    let posted: Vec<Vec<(usize, u32)>> = s0.rounds.iter().map(|r| r.acks.clone()).collect();
    assert_eq!(posted, [vec![], vec![(1, 1)], vec![]]);
    assert!(s0
        .rounds
        .iter()
        .all(|r| r.puts.is_empty() && r.waits == [1]));
}

#[test]
fn broadcast_and_all_gather_rounds_of_two_nodes_of_one() {
    let map = NodeMap::from_nodes(&[4, 9]);
    let b0 = broadcast_sched(&map, 0, 0, 5, 2).unwrap();
    let put = |to, at| NetPut {
        to,
        from_at: at,
        dst: NetTo::Dst(at),
        ack: 0,
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
            dst: NetTo::Dst(3 + 2),
            ack: 0
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

#[test]
fn the_model_all_reduces_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in COUNTS {
            for chunk in CHUNKS {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, count)).collect();
                // Node partials first (the node-local all_reduce).
                let dst: Vec<Vec<u64>> = (0..n)
                    .map(|m| {
                        sum(
                            map.members(map.node(m)).iter().map(|&o| src[o].clone()),
                            count,
                        )
                    })
                    .collect();
                let want = sum(src.iter().cloned(), count);
                for seed in 0..3 {
                    let sched = |m| all_reduce_sched(&map, m, count, chunk).unwrap();
                    let got = model(&map, &sched, &src, &dst, false, seed);
                    for (m, d) in got.iter().enumerate() {
                        assert_eq!(d, &want, "{nodes:?} count {count} chunk {chunk} member {m}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_model_reduces_to_every_root_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in COUNTS {
            for chunk in CHUNKS {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, count)).collect();
                let want = sum(src.iter().cloned(), count);
                for root in 0..n {
                    for in_place in [false, true] {
                        let dst = if in_place {
                            src.clone()
                        } else {
                            vec![vec![POISON; count]; n]
                        };
                        let sched =
                            |m| reduce_sched(&map, m, root, count, chunk, in_place).unwrap();
                        let got = model(&map, &sched, &src, &dst, in_place, root as u64);
                        let ctx =
                            format!("{nodes:?} {count}/{chunk} root {root} in place {in_place}");
                        assert_eq!(got[root], want, "{ctx}");
                        for m in (0..n).filter(|&m| m != root) {
                            assert_eq!(got[m], dst[m], "{ctx}: member {m}'s dst untouched");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_model_reduce_scatters_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in COUNTS {
            for chunk in CHUNKS {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, n * count)).collect();
                for in_place in [false, true] {
                    let dst = if in_place {
                        src.clone()
                    } else {
                        vec![vec![POISON; count]; n]
                    };
                    for seed in 0..3 {
                        let sched =
                            |m| reduce_scatter_sched(&map, m, count, chunk, in_place).unwrap();
                        let got = model(&map, &sched, &src, &dst, in_place, seed);
                        for (j, d) in got.iter().enumerate() {
                            let want = sum(
                                src.iter().map(|s| s[j * count..(j + 1) * count].to_vec()),
                                count,
                            );
                            let at = if in_place { j * count } else { 0 };
                            assert_eq!(
                                d[at..at + count],
                                want[..],
                                "{nodes:?} {count}/{chunk} in place {in_place} member {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_model_broadcasts_and_gathers_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in [0, 1, 2, 5, 17] {
            for chunk in CHUNKS {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, count)).collect();
                for root in 0..n {
                    // The root's node holds the data (the node-local broadcast).
                    let dst: Vec<Vec<u64>> = (0..n)
                        .map(|m| {
                            if map.node(m) == map.node(root) {
                                src[root].clone()
                            } else {
                                vec![POISON; count]
                            }
                        })
                        .collect();
                    let sched = |m| broadcast_sched(&map, m, root, count, chunk).unwrap();
                    let got = model(&map, &sched, &src, &dst, false, root as u64);
                    for (m, d) in got.iter().enumerate() {
                        assert_eq!(d, &src[root], "{nodes:?} {count}/{chunk} root {root} m {m}");
                    }
                }
                for in_place in [false, true] {
                    let dst: Vec<Vec<u64>> = (0..n)
                        .map(|m| {
                            let mut d = vec![POISON; n * count];
                            if in_place {
                                d[m * count..(m + 1) * count].copy_from_slice(&src[m]);
                            }
                            d
                        })
                        .collect();
                    // In place the model's `src` is `dst`.
                    let s = if in_place { dst.clone() } else { src.clone() };
                    let sched = |m| all_gather_sched(&map, m, count, chunk, in_place).unwrap();
                    let got = model(&map, &sched, &s, &dst, in_place, 1);
                    let want: Vec<u64> = src.concat();
                    for (m, d) in got.iter().enumerate() {
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
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for count in [0, 1, 2, 5, 17] {
            for chunk in CHUNKS {
                let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, n * count)).collect();
                for in_place in [false, true] {
                    let dst = if in_place {
                        src.clone()
                    } else {
                        vec![vec![POISON; n * count]; n]
                    };
                    for seed in 0..2 {
                        let sched = |m| all_to_all_sched(&map, m, count, chunk, in_place).unwrap();
                        let got = model(&map, &sched, &src, &dst, in_place, seed);
                        for (m, d) in got.iter().enumerate() {
                            let want: Vec<u64> = (0..n)
                                .flat_map(|j| src[j][m * count..(m + 1) * count].to_vec())
                                .collect();
                            assert_eq!(
                                d, &want,
                                "{nodes:?} {count}/{chunk} in place {in_place} member {m}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Two nodes of one: one put per round to the other member, the own share copied.
    let map = NodeMap::from_nodes(&[0, 1]);
    let s = all_to_all_sched(&map, 1, 4, 3, false).unwrap();
    assert_eq!(s.partners, [0]);
    assert_eq!(
        s.rounds[1].puts,
        [NetPut {
            to: 0,
            from_at: 3,
            dst: NetTo::Dst(4 + 3),
            ack: 0
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
    // In place: the outgoing shares staged first; nothing to copy on a node of one.
    let s = all_to_all_sched(&map, 1, 4, 3, true).unwrap();
    assert_eq!((s.input, s.temp_len, s.node_phase), (Buf::Temp, 8, false));
    assert_eq!(s.rounds[1].puts[0].from_at, 3);
}

/// The model itself catches a slot reused without an acknowledgement and a missing put.
#[test]
fn the_model_catches_a_reused_slot_and_a_missing_put() {
    let map = NodeMap::from_nodes(&[0, 1, 1]);
    let src: Vec<Vec<u64>> = (0..3).map(|m| vals(m, 10)).collect();
    let dst = vec![vec![POISON; 10]; 3];
    let no_acks = |m| {
        let mut s = reduce_sched(&map, m, 0, 10, 1, false).unwrap();
        for r in &mut s.rounds {
            r.acks.clear();
            for p in &mut r.puts {
                p.ack = 0;
            }
        }
        s
    };
    let caught = (0..8).any(|seed| {
        std::panic::catch_unwind(|| model(&map, &no_acks, &src, &dst, false, seed)).is_err()
    });
    assert!(
        caught,
        "a slot reused without acknowledgement goes unnoticed"
    );
    let missing = |m| {
        let mut s = reduce_sched(&map, m, 0, 10, 3, false).unwrap();
        if m == 1 {
            s.rounds.pop();
        }
        s
    };
    let r = std::panic::catch_unwind(|| model(&map, &missing, &src, &dst, false, 0));
    assert!(r.is_err(), "a missing put goes unnoticed");
}

#[test]
fn long_lists_split_into_launches_in_the_order_of_one() {
    let put = |to| NetPut {
        to,
        from_at: 0,
        dst: NetTo::Dst(0),
        ack: 0,
    };
    let r = Round {
        index: 3,
        len: 1,
        acks: vec![(1, 1), (2, 1), (3, 2)],
        puts: (0..5).map(put).collect(),
        waits: (0..4).collect(),
        fold: None,
    };
    // Everything fits: one launch.
    let one = round_launches(&r, 5);
    assert_eq!(
        one,
        [Launch {
            acks: 0..3,
            puts: 0..5,
            waits: 0..4
        }]
    );
    // Lists of two: acknowledgements, then puts, then waits, each list covered once.
    let l = round_launches(&r, 2);
    let ranges: Vec<_> = l
        .iter()
        .map(|x| (x.acks.clone(), x.puts.clone(), x.waits.clone()))
        .collect();
    assert_eq!(
        ranges,
        [
            (0..2, 0..0, 0..0),
            (2..3, 0..0, 0..0),
            (0..0, 0..2, 0..0),
            (0..0, 2..4, 0..0),
            (0..0, 4..5, 0..0),
            (0..0, 0..0, 0..2),
            (0..0, 0..0, 2..4),
        ]
    );
    assert!(l
        .iter()
        .all(|x| x.acks.len() <= 2 && x.puts.len() <= 2 && x.waits.len() <= 2));
    // The handshake: all arrivals posted, then waited for; only the first wait sets the
    // skip flag, the later ones add to it.
    let h = ready_launches(5, 2);
    let flags: Vec<_> = h
        .iter()
        .map(|x| (x.post, x.wait, x.more, x.range.clone()))
        .collect();
    assert_eq!(
        flags,
        [
            (true, false, false, 0..2),
            (true, false, false, 2..4),
            (true, false, false, 4..5),
            (false, true, false, 0..2),
            (false, true, true, 2..4),
            (false, true, true, 4..5),
        ]
    );
    let h = ready_launches(3, 64);
    assert_eq!(
        h,
        [Ready {
            post: true,
            wait: true,
            more: false,
            range: 0..3
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

/// all_to_all_v split along the nodes: the node-local calls (on local indices) and the
/// cross-node puts (at the displacements the receivers published) together move exactly what
/// the flat call does, with random counts and displacements with gaps, on every layout.
#[test]
fn the_model_all_to_all_vs_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        for seed in 0..4u64 {
            // counts[i][j]: from i to j; i's send layout and j's receive layout both
            // permuted, with gaps.
            let cnt = |i: usize, j: usize| {
                ((i * 7 + j * 3 + seed as usize * 5) % 6) * (seed != 3) as usize
            };
            let layout = |counts: &[usize], rot: usize| {
                let mut at = vec![0; n];
                let mut next = 1;
                for k in 0..n {
                    let j = (k + rot) % n;
                    at[j] = next;
                    next += counts[j] + 2;
                }
                (at, next)
            };
            let mut v: Vec<[Vec<usize>; 4]> = Vec::new();
            let mut lens = Vec::new();
            for m in 0..n {
                let sc: Vec<usize> = (0..n).map(|j| cnt(m, j)).collect();
                let rc: Vec<usize> = (0..n).map(|i| cnt(i, m)).collect();
                let (sd, sl) = layout(&sc, m);
                let (rd, dl) = layout(&rc, m + 1);
                lens.push((sl, dl));
                v.push([sc, sd, rc, rd]);
            }
            let src: Vec<Vec<u64>> = (0..n).map(|m| vals(m, lens[m].0)).collect();
            let mut dst: Vec<Vec<u64>> = (0..n).map(|m| vec![POISON; lens[m].1]).collect();
            let splits: Vec<A2avSplit> = (0..n)
                .map(|m| {
                    let a = &v[m];
                    all_to_all_v_split(&map, m, [&a[0], &a[1], &a[2], &a[3]])
                })
                .collect();
            for m in 0..n {
                // The node-local call on m's node: member m (local l) receives from local k.
                let ms = map.members(map.node(m));
                let l = map.local(m);
                let [_, _, rc, rd] = &splits[m].node;
                for (k, &o) in ms.iter().enumerate() {
                    let [sc, sd, _, _] = &splits[o].node;
                    assert_eq!(sc[l], rc[k], "node counts pair up");
                    let data = src[o][sd[l]..sd[l] + sc[l]].to_vec();
                    dst[m][rd[k]..rd[k] + rc[k]].copy_from_slice(&data);
                }
                // Far senders: each reads what m published for it.
                for &(j, at, c) in &splits[m].meta {
                    let &(to, from_at, sc) = splits[j]
                        .puts
                        .iter()
                        .find(|p| p.0 == m)
                        .expect("a put to m");
                    assert_eq!((to, sc), (m, c), "the counts pair up");
                    let data = src[j][from_at..from_at + sc].to_vec();
                    dst[m][at..at + c].copy_from_slice(&data);
                }
                assert_eq!(splits[m].meta.len(), n - ms.len());
            }
            for m in 0..n {
                let mut want = vec![POISON; lens[m].1];
                for i in 0..n {
                    let (sd, rd, c) = (v[i][1][m], v[m][3][i], v[m][2][i]);
                    want[rd..rd + c].copy_from_slice(&src[i][sd..sd + c]);
                }
                assert_eq!(dst[m], want, "{nodes:?} seed {seed} member {m}");
            }
        }
    }
}

/// A reduce's sender hears nothing back after the ready arrival, so it can post its next
/// call's signature before the root compared this call's: with rows alternating by the pair's
/// call count the root still reads this call's; with one row it would read the next one's.
#[test]
fn a_partner_one_call_ahead_does_not_overwrite_the_signature_being_compared() {
    let run = |rows: &dyn Fn(u64) -> usize| {
        let mut slot = [0u64; 2];
        let mut seen = Vec::new();
        for call in 1..=6u64 {
            // The sender posts call `call`'s signature (its value: the call) and, having
            // nothing to wait for, the next call's too, before the root compares.
            slot[rows(call)] = call;
            slot[rows(call + 1)] = call + 1;
            seen.push(slot[rows(call)]);
        }
        seen
    };
    assert_eq!(run(&sig_rows), [1, 2, 3, 4, 5, 6]);
    assert_ne!(run(&|_| 0), [1, 2, 3, 4, 5, 6], "one row: a false mismatch");
}

/// Counts of all_to_all_v_device call `c` in the model: random up to 7, a third of them 0;
/// call 1 all 0; call 3 one count past `src` (8 · n elements); call 4 every member sending 9
/// to the last, past its `dst` (8 · n) while every sender stays within its `src`.
fn a2avd_counts(n: usize, seed: u64, c: usize) -> Vec<Vec<u64>> {
    let mut x = (seed + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ c as u64;
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match c {
                        1 => 0,
                        3 if (i, j) == (0, n - 1) => 8 * n as u64 + 1,
                        4 if j == n - 1 => 9,
                        _ if x.is_multiple_of(3) => 0,
                        _ => x % 8,
                    }
                })
                .collect()
        })
        .collect()
}

/// all_to_all_v_device across nodes (count rows through the proxy before the ready arrival,
/// the count kernel's matrix, verdict and plan, puts or bare signals and their waits, the
/// node's barriers) in many interleavings over five calls back to back on every layout:
/// exact `dst` (packed in member order, poison past it) and `recv`, a count past `src` or a
/// receiver's total past `dst` moving nothing on every member; every row read before the next
/// call's overwrites it, no member reading another call's counts or `src`, every put waited for.
#[test]
fn the_model_all_to_all_v_devices_exactly_on_every_layout() {
    for nodes in LAYOUTS {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        let cap = 8 * n;
        for seed in 0..8u64 {
            let calls: Vec<_> = (0..5).map(|c| a2avd_counts(n, seed, c)).collect();
            let got = a2avd_model(&map, &calls, (cap, cap), A2AVD_FULL, seed);
            for (c, m_) in calls.iter().enumerate() {
                let col = |m: usize| (0..n).map(|i| m_[i][m]).collect::<Vec<u64>>();
                let bad = (0..n).any(|j| {
                    m_[j].iter().sum::<u64>() > cap as u64
                        || col(j).iter().sum::<u64>() > cap as u64
                });
                assert_eq!(bad, c >= 3, "{nodes:?} call {c}: the capacity cases");
                for m in 0..n {
                    let mut want = vec![POISON; cap];
                    let mut at = 0;
                    for i in (0..n).filter(|_| !bad) {
                        let k = m_[i][m] as usize;
                        let from = m_[i][..m].iter().sum::<u64>() as usize;
                        want[at..at + k].copy_from_slice(&vals(i * 1000 + c, cap)[from..][..k]);
                        at += k;
                    }
                    let ctx = format!("{nodes:?} seed {seed} call {c} member {m}");
                    assert_eq!(got[c][m].0, want, "{ctx}: dst");
                    assert_eq!(got[c][m].1, col(m), "{ctx}: recv");
                }
            }
        }
    }
}

/// The model catches a protocol without bare signals for empty pairs (a partner's next row
/// overwrites one not yet read, or reads of another call) and one without the node's closing
/// barrier (a member of the node starts its next call while another still reads its counts
/// or `src`).
#[test]
fn the_model_catches_a2avd_without_bare_signals_or_closing_barrier() {
    let fails = |nodes: &[usize], proto: A2avdProtocol| {
        let map = NodeMap::from_nodes(nodes);
        let n = map.n_pes();
        (0..64u64).any(|seed| {
            let calls: Vec<_> = (0..3).map(|c| a2avd_counts(n, seed, c)).collect();
            std::panic::catch_unwind(|| a2avd_model(&map, &calls, (8 * n, 8 * n), proto, seed))
                .is_err()
        })
    };
    let no_bare = A2avdProtocol {
        bare_signals: false,
        ..A2AVD_FULL
    };
    let no_close = A2avdProtocol {
        closing_barrier: false,
        ..A2AVD_FULL
    };
    assert!(fails(&[0, 1], no_bare), "without bare signals");
    assert!(fails(&[0, 0, 1], no_close), "without the closing barrier");
    assert!(!fails(&[0, 0, 1], A2AVD_FULL), "the full protocol");
}
