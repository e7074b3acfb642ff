//! The host model of the cross-node schedules: every member's phases run on host vectors, in
//! an order of the members' steps drawn from a seed, checking pairing, scratch safety and
//! progress; the tests in `net_tests.rs` compare its results with exact expectations.

use super::net_sched::*;
use crate::coll::plan::{Buf, Step};
use crate::team::NodeMap;
use std::collections::HashMap;

/// Node layouts the model runs: pairs, uneven nodes, interleaved members, three nodes.
pub(super) const LAYOUTS: [&[usize]; 7] = [
    &[0, 1],
    &[0, 1, 1],
    &[0, 0, 1],
    &[0, 1, 0, 1],
    &[0, 0, 0, 1],
    &[0, 1, 2, 1, 0],
    &[5, 5, 2, 5, 7, 7],
];

pub(super) const POISON: u64 = 0xdead_beef;

/// Checks that every wait of every member's rounds has its put (same round, to it) and every
/// put its wait, that partners are symmetric, and that the members of a node agree on their
/// node phases.
pub(super) fn check_pairing(map: &NodeMap, scheds: &[NetSched]) {
    let mut puts: HashMap<(u32, usize, usize), usize> = HashMap::new();
    let mut waits: HashMap<(u32, usize, usize), usize> = HashMap::new();
    for (m, s) in scheds.iter().enumerate() {
        let idx: Vec<u32> = s.rounds.iter().map(|r| r.index).collect();
        assert!(idx.windows(2).all(|w| w[0] < w[1]), "rounds in order");
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
    for k in 0..map.n_nodes() {
        let ms = map.members(k);
        let ph = |m: usize| {
            let s = &scheds[m];
            let syncs = |v: &[Step]| v.iter().filter(|s| **s == Step::Sync).count();
            (
                s.before_phase,
                s.node_phase,
                syncs(&s.before),
                syncs(&s.after),
            )
        };
        assert!(ms.iter().all(|&m| ph(m) == ph(ms[0])), "node {k}");
    }
}

/// A member's buffers in the model (`src` is `dst` in place).
#[derive(Clone, Debug)]
pub(super) struct Mem {
    src: Vec<u64>,
    dst: Vec<u64>,
    temp: Vec<u64>,
}

pub(super) struct Model<'a> {
    map: &'a NodeMap,
    scheds: &'a [NetSched],
    mem: Vec<Mem>,
    in_place: bool,
}

impl Model<'_> {
    fn read(&self, m: usize, b: Buf, at: usize, len: usize) -> Vec<u64> {
        let v = match (b, self.in_place) {
            (Buf::Src, false) => &self.mem[m].src,
            (Buf::Src, true) | (Buf::Dst, _) => &self.mem[m].dst,
            (Buf::Temp, _) => &self.mem[m].temp,
        };
        v[at..at + len].to_vec()
    }

    fn write(&mut self, m: usize, b: Buf, at: usize, data: &[u64]) {
        let v = match (b, self.in_place) {
            (Buf::Src, false) => &mut self.mem[m].src,
            (Buf::Src, true) | (Buf::Dst, _) => &mut self.mem[m].dst,
            (Buf::Temp, _) => &mut self.mem[m].temp,
        };
        v[at..at + data.len()].copy_from_slice(data);
    }

    /// One node phase: each member's steps, split at its syncs; a segment's reads see the
    /// buffers as they were at its start, and no member writes what another reads in it.
    fn phase(&mut self, steps: &dyn Fn(usize) -> (bool, Vec<Step>)) {
        let sym = |b: Buf, ip: bool| if ip && b == Buf::Src { Buf::Dst } else { b };
        for k in 0..self.map.n_nodes() {
            let ms = self.map.members(k).to_vec();
            let segs: Vec<Vec<Vec<Step>>> = ms
                .iter()
                .map(|&m| {
                    let (sync, st) = steps(m);
                    if !sync {
                        // Copies inside the member's own buffers only.
                        for s in &st {
                            match *s {
                                Step::Copy { peer, .. } => assert_eq!(ms[peer], m),
                                _ => panic!("{s:?} without barriers"),
                            }
                        }
                    }
                    st.split(|s| *s == Step::Sync).map(|s| s.to_vec()).collect()
                })
                .collect();
            assert!(segs.iter().all(|s| s.len() == segs[0].len()));
            #[allow(clippy::needless_range_loop)]
            for seg in 0..segs[0].len() {
                let before = Model {
                    map: self.map,
                    scheds: self.scheds,
                    mem: self.mem.clone(),
                    in_place: self.in_place,
                };
                // (reader, owner, buffer, range) and (writer, buffer, range)
                let mut reads = Vec::new();
                let mut writes = Vec::new();
                for (i, &m) in ms.iter().enumerate() {
                    for st in &segs[i][seg] {
                        match *st {
                            Step::Copy {
                                peer,
                                from,
                                from_at,
                                to,
                                to_at,
                                len,
                            } => {
                                let p = ms[peer];
                                assert!(from != Buf::Temp || p == m, "peer staging read");
                                let d = before.read(p, from, from_at, len);
                                reads.push((m, p, sym(from, self.in_place), from_at, len));
                                writes.push((m, sym(to, self.in_place), to_at, len));
                                self.write(m, to, to_at, &d);
                            }
                            Step::Reduce {
                                from,
                                from_at,
                                to,
                                to_at,
                                len,
                            } => {
                                let mut acc = vec![0u64; len];
                                for &p in &ms {
                                    let d = before.read(p, from, from_at, len);
                                    reads.push((m, p, sym(from, self.in_place), from_at, len));
                                    for (a, v) in acc.iter_mut().zip(d) {
                                        *a = a.wrapping_add(v);
                                    }
                                }
                                writes.push((m, sym(to, self.in_place), to_at, len));
                                self.write(m, to, to_at, &acc);
                            }
                            _ => panic!("node phase step {st:?}"),
                        }
                    }
                }
                for &(w, wb, wat, wlen) in &writes {
                    for &(r, owner, rb, rat, rlen) in &reads {
                        let overlap = wat < rat + rlen && rat < wat + wlen;
                        assert!(
                            r == w || owner != w || rb != wb || !overlap || wlen == 0,
                            "member {w} writes {wb:?}[{wat}..+{wlen}] that {r} reads"
                        );
                    }
                }
            }
        }
    }

    /// Runs the rounds of every member, stepping members in an order drawn from `seed`;
    /// puts land at once (the hardest case for the scratch slots). Panics on a deadlock, a
    /// scratch slot written before its fold, or a fold of the wrong round's data.
    fn rounds(&mut self, seed: u64) {
        let n = self.scheds.len();
        // sig[receiver][sender]: last round + 1; ackw[sender][receiver]: folds acknowledged.
        let mut sig = vec![vec![0u32; n]; n];
        let mut ackw = vec![vec![0u32; n]; n];
        // scratch[(receiver, node, parity)] = (round, data)
        let mut scratch: HashMap<(usize, usize, usize), (u32, Vec<u64>)> = HashMap::new();
        // (round, stage, item) per member; stages: 0 acks, 1 puts, 2 waits, 3 fold.
        let mut pc = vec![(0usize, 0u8, 0usize); n];
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut idle = 0;
        while pc
            .iter()
            .zip(self.scheds)
            .any(|(p, s)| p.0 < s.rounds.len())
        {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let m = (rng % n as u64) as usize;
            let (ri, stage, i) = pc[m];
            let s = &self.scheds[m];
            let moved = if ri == s.rounds.len() {
                false
            } else {
                let r = &s.rounds[ri];
                match stage {
                    0 => {
                        for &(to, v) in &r.acks {
                            assert!(ackw[to][m] < v, "acknowledgements grow");
                            ackw[to][m] = v;
                        }
                        pc[m] = (ri, 1, 0);
                        true
                    }
                    1 if i < r.puts.len() => {
                        let p = r.puts[i];
                        if p.ack > 0 && ackw[m][p.to] < p.ack {
                            false
                        } else {
                            let d = self.read(m, s.input, p.from_at, r.len);
                            match p.dst {
                                NetTo::Dst(at) => self.write(p.to, Buf::Dst, at, &d),
                                NetTo::Scratch { node, parity } => {
                                    assert_eq!(node, self.map.node(m));
                                    let old = scratch.insert((p.to, node, parity), (r.index, d));
                                    assert!(
                                        old.is_none(),
                                        "scratch slot overwritten before its fold"
                                    );
                                }
                            }
                            assert!(sig[p.to][m] <= r.index);
                            sig[p.to][m] = r.index + 1;
                            pc[m] = (ri, 1, i + 1);
                            true
                        }
                    }
                    1 => {
                        pc[m] = (ri, 2, 0);
                        true
                    }
                    2 if i < r.waits.len() => {
                        let ok = sig[m][r.waits[i]] > r.index;
                        if ok {
                            pc[m] = (ri, 2, i + 1);
                        }
                        ok
                    }
                    _ => {
                        if let Some((at, srcs)) = &r.fold {
                            assert_eq!(srcs.len(), self.map.n_nodes());
                            let mut acc = vec![0u64; r.len];
                            for src in srcs {
                                let part = match *src {
                                    None => self.read(m, Buf::Dst, *at, r.len),
                                    Some((k, parity)) => {
                                        let (idx, d) =
                                            scratch.remove(&(m, k, parity)).expect("scratch slot");
                                        assert_eq!(idx, r.index, "the fold's own round's data");
                                        d
                                    }
                                };
                                for (a, v) in acc.iter_mut().zip(part) {
                                    *a = a.wrapping_add(v);
                                }
                            }
                            self.write(m, Buf::Dst, *at, &acc);
                        }
                        pc[m] = (ri + 1, 0, 0);
                        true
                    }
                }
            };
            idle = if moved { 0 } else { idle + 1 };
            assert!(idle < 64 * n * n + 1000, "deadlock: {pc:?}");
        }
        assert!(scratch.is_empty(), "scratch slots never folded");
    }

    /// Every phase of every member: before, rounds (in interleavings from `seed`), after.
    fn run(&mut self, seed: u64) {
        check_pairing(self.map, self.scheds);
        let scheds = self.scheds;
        for (m, s) in scheds.iter().enumerate() {
            self.mem[m].temp = vec![POISON; s.temp_len];
        }
        self.phase(&|m| (scheds[m].before_phase, scheds[m].before.clone()));
        self.rounds(seed);
        self.phase(&|m| (scheds[m].node_phase, scheds[m].after.clone()));
        for s in scheds {
            assert!(s.node_phase || s.after.is_empty());
        }
    }
}

pub(super) fn vals(m: usize, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| ((m as u64 + 1) * 1_000_003) ^ (i as u64 * 0x9e37_79b9))
        .collect()
}

/// Runs schedules `sched(map, m)` from `src`/`dst` and returns every member's `dst`.
pub(super) fn model(
    map: &NodeMap,
    sched: &dyn Fn(usize) -> NetSched,
    src: &[Vec<u64>],
    dst: &[Vec<u64>],
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    let n = map.n_pes();
    let scheds: Vec<NetSched> = (0..n).map(sched).collect();
    let mem = (0..n)
        .map(|m| Mem {
            src: src[m].clone(),
            dst: dst[m].clone(),
            temp: Vec::new(),
        })
        .collect();
    let mut md = Model {
        map,
        scheds: &scheds,
        mem,
        in_place,
    };
    md.run(seed);
    md.mem.into_iter().map(|m| m.dst).collect()
}

pub(super) fn sum(vs: impl Iterator<Item = Vec<u64>>, count: usize) -> Vec<u64> {
    let mut want = vec![0u64; count];
    for v in vs {
        for (a, x) in want.iter_mut().zip(v) {
            *a = a.wrapping_add(x);
        }
    }
    want
}

pub(super) const COUNTS: [usize; 7] = [0, 1, 2, 5, 17, 33, 64];
pub(super) const CHUNKS: [usize; 3] = [1, 3, 100];
