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

/// all_to_all_v_device across nodes in the model: what may be left out of the protocol to see
/// the model catch it.
#[derive(Clone, Copy, Debug)]
pub(super) struct A2avdProtocol {
    /// A pair whose count is 0 still signals (and the receiver waits for it).
    pub bare_signals: bool,
    /// The node's members meet after the puts and waits (they read each other's `src` and
    /// counts until then).
    pub closing_barrier: bool,
}

pub(super) const A2AVD_FULL: A2avdProtocol = A2avdProtocol {
    bare_signals: true,
    closing_barrier: true,
};

/// `rshmemi_coll_a2av_dev`'s verdict and places, mirrored: whether count matrix `m` (`m[j][k]`
/// from member j to member k) exceeds the capacities (a sender's counts or total past
/// `src_cap`, a receiver's past `dst_cap`), and where j's share for k starts in k's `dst` and
/// in j's `src`.
pub(super) fn a2avd_places(
    m: &[Vec<u64>],
    src_cap: u64,
    dst_cap: u64,
) -> (bool, Vec<Vec<(u64, u64)>>) {
    let n = m.len();
    let mut bad = false;
    // As the kernel: element (j, k) and (k, j) side by side.
    #[allow(clippy::needless_range_loop)]
    for j in 0..n {
        let (mut sent, mut got) = (0u64, 0u64);
        for k in 0..n {
            let (a, b) = (m[j][k], m[k][j]);
            if a > src_cap || b > dst_cap {
                bad = true;
            } else {
                sent += a;
                got += b;
            }
        }
        bad |= sent > src_cap || got > dst_cap;
    }
    let places = (0..n)
        .map(|j| {
            (0..n)
                .map(|k| ((0..j).map(|i| m[i][k]).sum(), (0..k).map(|i| m[j][i]).sum()))
                .collect()
        })
        .collect();
    (bad, places)
}

/// A count row in a member's `rows`: (call, row, read yet).
type Row = (usize, Vec<u64>, bool);

/// A member's state in the all_to_all_v_device model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum A2avdAt {
    /// Writes its counts and `src` of the call and poisons `dst` (earlier stream work).
    Start,
    /// The node's barrier that opens the call.
    Open,
    /// Its count row to partner i (through the proxy).
    Row(usize),
    /// Its ready arrival at partner i.
    Arrive(usize),
    /// Waits for partner i's arrival.
    Ready(usize),
    /// The count kernel: the matrix, the verdict, `recv`, the node's copies, the plan.
    Count,
    /// Its put (or bare signal) to partner i.
    Put(usize),
    /// Waits for partner i's signal.
    Wait(usize),
    /// The node's closing barrier.
    Close,
    Done,
}

/// Runs `calls` (one count matrix each) of all_to_all_v_device back to back on every member of
/// `map`, stepping members in an order drawn from `seed`; puts and rows land at once. Panics on
/// a deadlock, a read of another call's counts, row or `src`, a row overwritten before it was
/// read, a put into a `dst` whose owner has not arrived, or a put without its wait. Returns
/// each call's `dst` (length `dst_cap`) and `recv` per member.
pub(super) fn a2avd_model(
    map: &NodeMap,
    calls: &[Vec<Vec<u64>>],
    (src_cap, dst_cap): (usize, usize),
    proto: A2avdProtocol,
    seed: u64,
) -> Vec<Vec<(Vec<u64>, Vec<u64>)>> {
    let n = map.n_pes();
    let partners: Vec<Vec<usize>> = (0..n)
        .map(|m| all_to_all_v_device_partners(map, m))
        .collect();
    let local = |m: usize| map.members(map.node(m)).len() > 1;
    let src_of = |m: usize, c: usize| vals(m * 1000 + c, src_cap);
    // Per member: (call, place); what its objects hold: (call of counts and src, src, dst).
    let mut at = vec![(0usize, A2avdAt::Start); n];
    let mut held: Vec<Option<usize>> = vec![None; n];
    let mut src = vec![Vec::new(); n];
    let mut dst = vec![vec![POISON; dst_cap]; n];
    let mut recv = vec![vec![u64::MAX; n]; n];
    // rows[to][from]: (call, row, read); arrivals and data signals: [to][from] = call + 1.
    let mut rows: Vec<Vec<Option<Row>>> = vec![vec![None; n]; n];
    let mut arrived = vec![vec![0usize; n]; n];
    let mut signalled = vec![vec![0usize; n]; n];
    // Node barriers each member has reached.
    let mut bars = vec![0usize; n];
    let mut plan: Vec<Vec<(u64, u64, u64)>> = vec![vec![(0, 0, 0); n]; n];
    let mut puts: HashMap<(usize, usize, usize), usize> = HashMap::new();
    let mut waits: HashMap<(usize, usize, usize), usize> = HashMap::new();
    let mut out = vec![vec![(Vec::new(), Vec::new()); n]; calls.len()];
    let bad: Vec<bool> = calls
        .iter()
        .map(|cm| a2avd_places(cm, src_cap as u64, dst_cap as u64).0)
        .collect();
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut idle = 0;
    let barrier_done =
        |bars: &[usize], m: usize, b: usize| map.members(map.node(m)).iter().all(|&q| bars[q] >= b);
    while at.iter().any(|a| a.0 < calls.len()) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // One member, drawn from the seed, runs ahead of the others by turns.
        let m = if (rng >> 40).is_multiple_of(3) {
            (seed as usize + rng as usize % 2) % n
        } else {
            (rng % n as u64) as usize
        };
        let (c, place) = at[m];
        if c == calls.len() {
            idle += 1;
            assert!(idle < 1000 * n * n + 1000, "deadlock: {at:?}");
            continue;
        }
        let cm = &calls[c];
        let ps = &partners[m];
        // Barriers a member reaches per call on its node.
        let per_call = 1 + proto.closing_barrier as usize;
        let next = |i: usize, here: fn(usize) -> A2avdAt, then: A2avdAt| {
            if i + 1 < ps.len() {
                here(i + 1)
            } else {
                then
            }
        };
        let first = |here: fn(usize) -> A2avdAt, then: A2avdAt| {
            if ps.is_empty() {
                then
            } else {
                here(0)
            }
        };
        let moved: Option<A2avdAt> = match place {
            A2avdAt::Start => {
                held[m] = Some(c);
                src[m] = src_of(m, c);
                dst[m] = vec![POISON; dst_cap];
                recv[m] = vec![u64::MAX; n];
                Some(if local(m) {
                    A2avdAt::Open
                } else {
                    first(A2avdAt::Row, A2avdAt::Count)
                })
            }
            A2avdAt::Open => {
                if bars[m] < c * per_call + 1 {
                    bars[m] = c * per_call + 1;
                }
                barrier_done(&bars, m, c * per_call + 1)
                    .then(|| first(A2avdAt::Row, A2avdAt::Count))
            }
            A2avdAt::Row(i) => {
                let p = ps[i];
                if let Some((old, _, read)) = &rows[p][m] {
                    assert!(
                        *read,
                        "call {c}: row {m} -> {p} of call {old} overwritten unread"
                    );
                }
                rows[p][m] = Some((c, cm[m].clone(), false));
                Some(next(i, A2avdAt::Row, A2avdAt::Arrive(0)))
            }
            A2avdAt::Arrive(i) => {
                arrived[ps[i]][m] = c + 1;
                Some(next(i, A2avdAt::Arrive, A2avdAt::Ready(0)))
            }
            A2avdAt::Ready(i) => {
                (arrived[m][ps[i]] > c).then(|| next(i, A2avdAt::Ready, A2avdAt::Count))
            }
            A2avdAt::Count => {
                // The matrix: rows of other nodes from `rows`, of this node from the counts.
                let mut mat = vec![Vec::new(); n];
                for (j, row) in mat.iter_mut().enumerate() {
                    if map.node(j) == map.node(m) {
                        assert_eq!(held[j], Some(c), "call {c}: {m} reads {j}'s counts");
                        *row = cm[j].clone();
                    } else {
                        let r = rows[m][j].as_mut().expect("a row");
                        assert_eq!(r.0, c, "call {c}: {m} reads {j}'s row of call {}", r.0);
                        r.2 = true;
                        *row = r.1.clone();
                    }
                }
                let (bad, places) = a2avd_places(&mat, src_cap as u64, dst_cap as u64);
                for j in 0..n {
                    recv[m][j] = mat[j][m];
                }
                for j in 0..n {
                    let (to, from) = places[j][m];
                    let k = mat[j][m] as usize;
                    if bad || map.node(j) != map.node(m) || k == 0 {
                        continue;
                    }
                    assert_eq!(held[j], Some(c), "call {c}: {m} reads {j}'s src");
                    let d = src[j][from as usize..][..k].to_vec();
                    dst[m][to as usize..][..k].copy_from_slice(&d);
                }
                for &k in ps {
                    let (to, from) = places[m][k];
                    plan[m][k] = (to, from, if bad { 0 } else { mat[m][k] });
                }
                Some(first(A2avdAt::Put, A2avdAt::Close))
            }
            A2avdAt::Put(i) => {
                let p = ps[i];
                let (to, from, k) = plan[m][p];
                if k > 0 {
                    let ready = at[p].0 == c && !matches!(at[p].1, A2avdAt::Start);
                    assert!(
                        ready && arrived[m][p] > c,
                        "call {c}: {m} puts into {p}'s dst early"
                    );
                    let d = src[m][from as usize..][..k as usize].to_vec();
                    dst[p][to as usize..][..k as usize].copy_from_slice(&d);
                }
                if k > 0 || proto.bare_signals {
                    signalled[p][m] = c + 1;
                    *puts.entry((c, m, p)).or_default() += 1;
                }
                Some(next(i, A2avdAt::Put, A2avdAt::Wait(0)))
            }
            A2avdAt::Wait(i) => {
                let p = ps[i];
                let expect = proto.bare_signals || (!bad[c] && cm[p][m] > 0);
                if !expect {
                    Some(next(i, A2avdAt::Wait, A2avdAt::Close))
                } else if signalled[m][p] > c {
                    *waits.entry((c, p, m)).or_default() += 1;
                    Some(next(i, A2avdAt::Wait, A2avdAt::Close))
                } else {
                    None
                }
            }
            A2avdAt::Close => {
                if !local(m) || !proto.closing_barrier {
                    Some(A2avdAt::Done)
                } else {
                    let b = c * per_call + 2;
                    bars[m] = bars[m].max(b);
                    barrier_done(&bars, m, b).then_some(A2avdAt::Done)
                }
            }
            A2avdAt::Done => {
                out[c][m] = (dst[m].clone(), recv[m].clone());
                at[m] = (c + 1, A2avdAt::Start);
                idle = 0;
                continue;
            }
        };
        match moved {
            Some(p) => {
                at[m] = (c, p);
                idle = 0;
            }
            None => {
                idle += 1;
                assert!(idle < 1000 * n * n + 1000, "deadlock: {at:?}");
            }
        }
    }
    assert_eq!(
        puts, waits,
        "every put is waited for once, every wait has its put"
    );
    out
}
