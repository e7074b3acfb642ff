//! The host model of DeepEP's internode schedule for the GPU buffer across nodes (the spec the
//! forwarding kernels follow; docs/fabric.md, "GPU MoE across nodes"): a token bound for
//! another node crosses once, to the PE of its source's local index there (the forwarder,
//! [`NodeMap::peer`]), which stores it over NVLink into the receive areas of its node's
//! destinations at the rows the source would have used itself (positions keyed by the
//! original source: `recv_x`, the row records and the handle keep their meaning), and in
//! combine sums its node's partial rows of that token and puts one row per (token, node) back.
//!
//! Every PE runs the phases of several calls as steps with waits; the order of the PEs' steps
//! is drawn from a seed. Each area cell carries the call that wrote it, so a read of a cell
//! that is stale or already overwritten by the next call fails; every signal word is a set of
//! the call number by its one writer, and every wait must be met by exactly one set of its call
//! from the writer it expects (and every set by one wait). Results are compared with the flat
//! path's (every row once per destination PE) on exact data: integer rows, expert outputs and
//! power-of-two weights, so the sums are exact in `f32` whatever their grouping.
//!
//! Against the kernels (`kernels/fwd.cu`): the model's `px` is a PE's idle combine half, its
//! `ncomb` the combine slots of the node's members at the source (node row `p` in member
//! `p / C`'s slot, row `p % C`), and its node sums stay `f32` where the kernels round them to
//! the element type once (the data here is exact either way).

use crate::team::NodeMap;
use std::collections::{BTreeMap, HashMap};

const H: usize = 4;

/// A token of a source: its top-k global expert ids (`-1`: none), weights and row.
#[derive(Clone, Debug)]
struct Tok {
    ids: Vec<i32>,
    w: Vec<f32>,
    x: [f32; H],
}

/// The team, its experts and areas' capacity.
struct Team {
    nm: NodeMap,
    n: usize,
    /// Experts per PE.
    epp: usize,
    kmax: usize,
    /// Rows per (source, destination PE) pair.
    cap: usize,
    max_tokens: usize,
}

/// A row record as the kernels write it: token index, `kmax` ids, `kmax` weights (bits).
fn record(t: usize, tok: &Tok, kmax: usize) -> Vec<u32> {
    let mut r = vec![t as u32];
    r.extend((0..kmax).map(|j| tok.ids.get(j).map_or(u32::MAX, |&i| i as u32)));
    r.extend((0..kmax).map(|j| tok.w.get(j).map_or(0, |w| w.to_bits())));
    r
}

/// The stand-in expert: expert `e` scales its input by `e % 3 + 1`.
fn expert(e: usize, x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * (e % 3 + 1) as f32).collect()
}

impl Team {
    fn new(nodes: &[usize], epp: usize, kmax: usize, cap: usize, max_tokens: usize) -> Team {
        Team {
            nm: NodeMap::from_nodes(nodes),
            n: nodes.len(),
            epp,
            kmax,
            cap,
            max_tokens,
        }
    }

    /// Destination PEs of a token, ascending, each once.
    fn dests(&self, tok: &Tok) -> Vec<usize> {
        let mut d: Vec<usize> = tok
            .ids
            .iter()
            .filter(|&&i| i >= 0)
            .map(|&i| i as usize / self.epp)
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Destination PEs of a token on node `j` (from its record's ids, as the forwarder finds
    /// them), ascending.
    fn dests_on(&self, rec: &[u32], j: usize) -> Vec<usize> {
        let mut d: Vec<usize> = rec[1..1 + self.kmax]
            .iter()
            .filter(|&&i| i != u32::MAX)
            .map(|&i| i as usize / self.epp)
            .filter(|&d| self.nm.node(d) == j)
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Rows per source in a forwarder's node receive area: a source's tokens bound for one node
    /// number at most the sum of its rows to the node's PEs, so whenever every pair fits in
    /// `cap` its node rows fit in `max_local * cap` (and never exceed `max_tokens`).
    fn node_cap(&self) -> usize {
        self.max_tokens.min(self.nm.max_local() * self.cap)
    }

    /// The sources of other nodes PE `f` forwards for (whose local index maps to it).
    fn served(&self, f: usize) -> Vec<usize> {
        let k = self.nm.node(f);
        (0..self.n)
            .filter(|&s| self.nm.node(s) != k && self.nm.peer(k, self.nm.local(s)) == f)
            .collect()
    }

    /// Position of each of source `s`'s tokens in its send to each PE (`-1`: not sent there),
    /// `[t][d]`: the flat path's `tok_pos`, kept unchanged.
    fn positions(&self, toks: &[Tok]) -> Vec<Vec<i64>> {
        let mut next = vec![0i64; self.n];
        toks.iter()
            .map(|tok| {
                let mut p = vec![-1i64; self.n];
                for d in self.dests(tok) {
                    p[d] = next[d];
                    next[d] += 1;
                }
                p
            })
            .collect()
    }

    /// Position of each of source `s`'s tokens in its send to each node (`-1`: not sent there
    /// or the source's own node), `[t][j]`: the row in the forwarder's node receive area.
    fn node_positions(&self, s: usize, toks: &[Tok]) -> Vec<Vec<i64>> {
        let nodes = self.nm.n_nodes();
        let mut next = vec![0i64; nodes];
        toks.iter()
            .map(|tok| {
                let mut p = vec![-1i64; nodes];
                for d in self.dests(tok) {
                    let j = self.nm.node(d);
                    if j != self.nm.node(s) && p[j] < 0 {
                        p[j] = next[j];
                        next[j] += 1;
                    }
                }
                p
            })
            .collect()
    }
}

/// A row in an area, with the call that wrote it.
#[derive(Clone, Debug, PartialEq)]
struct Cell {
    call: u64,
    x: Vec<f32>,
    rec: Vec<u32>,
}

/// A row and its record.
type FlatRow = (Vec<f32>, Vec<u32>);

/// The flat path's result of one call: receive rows per destination (`[d][s * cap + pos]`),
/// counts `[s][d]`, whether every pair fits, each source's combined tokens and the rows that
/// cross nodes (one per (token, destination PE of another node)).
struct Flat {
    recv: Vec<Vec<Option<FlatRow>>>,
    cnt: Vec<Vec<usize>>,
    ok: bool,
    out: Vec<Vec<[f32; H]>>,
    cross_rows: usize,
}

fn flat(tm: &Team, step: &[Vec<Tok>]) -> Flat {
    let n = tm.n;
    let mut recv = vec![vec![None; n * tm.cap]; n];
    let mut cnt = vec![vec![0usize; n]; n];
    let mut cross_rows = 0;
    for (s, toks) in step.iter().enumerate() {
        let pos = tm.positions(toks);
        for (t, tok) in toks.iter().enumerate() {
            for d in tm.dests(tok) {
                cnt[s][d] += 1;
                cross_rows += usize::from(tm.nm.node(d) != tm.nm.node(s));
                let p = pos[t][d] as usize;
                if p < tm.cap {
                    recv[d][s * tm.cap + p] = Some((tok.x.to_vec(), record(t, tok, tm.kmax)));
                }
            }
        }
    }
    let ok = cnt.iter().flatten().all(|&c| c <= tm.cap);
    // Each destination's partial (slot order) per token, summed over destinations ascending.
    let out = step
        .iter()
        .map(|toks| {
            toks.iter()
                .map(|tok| {
                    let mut o = [0f32; H];
                    for d in tm.dests(tok) {
                        let part = partial(tm, d, &tok.ids, &tok.w, &tok.x);
                        for (a, v) in o.iter_mut().zip(part) {
                            *a += v;
                        }
                    }
                    o
                })
                .collect()
        })
        .collect();
    Flat {
        recv,
        cnt,
        ok,
        out,
        cross_rows,
    }
}

/// PE `d`'s partial row of a token: weight × expert output over the slots it serves, in slot
/// order (`ep_csend`'s sum).
fn partial(tm: &Team, d: usize, ids: &[i32], w: &[f32], x: &[f32]) -> Vec<f32> {
    let mut p = vec![0f32; H];
    for (j, &e) in ids.iter().enumerate() {
        if e >= 0 && e as usize / tm.epp == d {
            for (a, v) in p.iter_mut().zip(expert(e as usize, x)) {
                *a += w[j] * v;
            }
        }
    }
    p
}

/// Signal words (each PE has one per (kind, writer index)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Word {
    /// Ready (every PE to every PE, at a dispatch's start).
    Ready,
    /// Count record from a source (every PE to every PE).
    Rec,
    /// A source's node rows are in at its forwarder (index: the source).
    Fwd,
    /// A source's rows are in at a destination (index: the source; set by the source for
    /// its own node, by the source's forwarder otherwise).
    Data,
    /// A node member's partial rows are written (index: the member; at the node's forwarders).
    Parts,
    /// Combine rows are in at a source (index: a PE of its node, or a forwarder of another).
    Comb,
}

/// The memory of one PE: areas of cells and signal words.
#[derive(Default)]
struct Mem {
    recv: HashMap<usize, Cell>,
    nrecv: HashMap<usize, Cell>,
    /// Rows in a source's node send: `(call, count)` per source, written with the rows.
    ncnt: HashMap<usize, (u64, usize)>,
    /// Count records: `(call, count to this PE, the source overflowed some pair)` per source.
    rec: HashMap<usize, (u64, usize, bool)>,
    px: HashMap<usize, Cell>,
    comb: HashMap<usize, Cell>,
    ncomb: HashMap<usize, Cell>,
    words: HashMap<(Word, usize), u64>,
}

/// One PE's step: the words it waits for (word, index, writer), then what it does.
#[derive(Clone, Copy, Debug)]
enum Phase {
    Ready,
    Send,
    Forward(usize),
    DWait,
    CSend,
    CForward,
    CRecv,
}

/// `(owner, word, index, call)` of a set.
type SetKey = (usize, Word, usize, u64);
/// (source, position) pairs.
type Rows = Vec<(usize, usize)>;
/// What a forwarder sent on: `(source, node position) -> [(destination, position)]`.
type Forwarded = BTreeMap<(usize, usize), Rows>;

/// What the PEs share as they run: memories, the set log, the crossing counters.
struct World<'a> {
    tm: &'a Team,
    mem: Vec<Mem>,
    /// Sets of `(owner, word, index, call)`: writers, and whether a wait consumed it.
    sets: BTreeMap<SetKey, (Vec<usize>, bool)>,
    /// Rows put across nodes in dispatch and combine, and row writes of any kind across
    /// nodes that are not node rows (must stay 0).
    xrows: [usize; 2],
    stray: usize,
    /// Per call and PE: what it forwarded, `(source, node position) -> [(dest, position)]`.
    fwd: HashMap<(u64, usize), Forwarded>,
    /// Per call and PE: the received rows (source, position) and the decision.
    got: HashMap<(u64, usize), (Rows, bool)>,
    outs: HashMap<(u64, usize), Vec<[f32; H]>>,
}

impl World<'_> {
    fn set(&mut self, writer: usize, owner: usize, w: Word, idx: usize, call: u64) {
        let e = self.sets.entry((owner, w, idx, call)).or_default();
        e.0.push(writer);
        assert_eq!(
            e.0.len(),
            1,
            "{w:?}[{idx}] at PE {owner}, call {call}: set twice"
        );
        let v = self.mem[owner].words.entry((w, idx)).or_insert(0);
        assert!(
            *v < call,
            "{w:?}[{idx}] at PE {owner}: call {call} after {v}"
        );
        *v = call;
    }

    fn cross(&self, a: usize, b: usize) -> bool {
        self.tm.nm.node(a) != self.tm.nm.node(b)
    }

    /// The waits of a step: (owner, word, index, expected writer).
    fn waits(&self, me: usize, ph: Phase) -> Vec<(Word, usize, usize)> {
        let tm = self.tm;
        let n = tm.n;
        let node = tm.nm.node(me);
        match ph {
            Phase::Ready => vec![],
            Phase::Send => (0..n).map(|q| (Word::Ready, q, q)).collect(),
            Phase::Forward(s) => vec![(Word::Fwd, s, s)],
            Phase::DWait => {
                let mut w: Vec<_> = (0..n).map(|s| (Word::Rec, s, s)).collect();
                for s in 0..n {
                    let writer = match self.cross(s, me) {
                        false => s,
                        true => tm.nm.peer(node, tm.nm.local(s)),
                    };
                    w.push((Word::Data, s, writer));
                }
                w
            }
            Phase::CSend => vec![],
            Phase::CForward => match tm.served(me).is_empty() {
                true => vec![],
                false => tm
                    .nm
                    .members(node)
                    .iter()
                    .map(|&d| (Word::Parts, d, d))
                    .collect(),
            },
            Phase::CRecv => {
                let mut w: Vec<_> = tm
                    .nm
                    .members(node)
                    .iter()
                    .map(|&q| (Word::Comb, q, q))
                    .collect();
                for j in (0..tm.nm.n_nodes()).filter(|&j| j != node) {
                    let f = tm.nm.peer(j, tm.nm.local(me));
                    w.push((Word::Comb, f, f));
                }
                w
            }
        }
    }

    fn ready(&self, me: usize, ws: &[(Word, usize, usize)], call: u64) -> bool {
        ws.iter()
            .all(|&(w, i, _)| self.mem[me].words.get(&(w, i)).copied().unwrap_or(0) >= call)
    }

    /// Consumes the sets a step's waits met: exactly one of this call, by the expected writer.
    fn consume(&mut self, me: usize, ws: &[(Word, usize, usize)], call: u64) {
        for &(w, i, writer) in ws {
            let e = self
                .sets
                .get_mut(&(me, w, i, call))
                .unwrap_or_else(|| panic!("PE {me} passed {w:?}[{i}] of call {call} unset"));
            assert_eq!(
                e.0,
                vec![writer],
                "PE {me}: {w:?}[{i}] of call {call}: writers"
            );
            assert!(!e.1, "PE {me}: {w:?}[{i}] of call {call} waited twice");
            e.1 = true;
        }
    }

    fn run(&mut self, me: usize, ph: Phase, call: u64, step: &[Vec<Tok>], fl: &Flat) {
        let tm = self.tm;
        let (n, cap, ncap) = (tm.n, tm.cap, tm.node_cap());
        let node = tm.nm.node(me);
        let par = (call % 2) as usize;
        match ph {
            Phase::Ready => {
                for q in 0..n {
                    self.set(me, q, Word::Ready, me, call);
                }
            }
            Phase::Send => {
                let toks = &step[me];
                let pos = tm.positions(toks);
                let npos = tm.node_positions(me, toks);
                let over = fl.cnt[me].iter().any(|&c| c > cap);
                for q in 0..n {
                    self.mem[q].rec.insert(me, (call, fl.cnt[me][q], over));
                    self.set(me, q, Word::Rec, me, call);
                }
                let mut ncnt = vec![0usize; tm.nm.n_nodes()];
                for (t, tok) in toks.iter().enumerate() {
                    let rec = record(t, tok, tm.kmax);
                    for d in tm.dests(tok) {
                        let j = tm.nm.node(d);
                        if j == node {
                            let p = pos[t][d] as usize;
                            if p < cap {
                                let c = Cell {
                                    call,
                                    x: tok.x.to_vec(),
                                    rec: rec.clone(),
                                };
                                self.mem[d].recv.insert(me * cap + p, c);
                            }
                        }
                    }
                    for (j, &p) in npos[t].iter().enumerate() {
                        if p < 0 {
                            continue;
                        }
                        ncnt[j] += 1;
                        let f = tm.nm.peer(j, tm.nm.local(me));
                        if (p as usize) < ncap {
                            self.xrows[0] += 1;
                            let c = Cell {
                                call,
                                x: tok.x.to_vec(),
                                rec: rec.clone(),
                            };
                            self.mem[f].nrecv.insert(me * ncap + p as usize, c);
                        }
                    }
                }
                for &d in tm.nm.members(node) {
                    self.set(me, d, Word::Data, me, call);
                }
                for j in (0..tm.nm.n_nodes()).filter(|&j| j != node) {
                    let f = tm.nm.peer(j, tm.nm.local(me));
                    assert!(
                        fl.ok <= (ncnt[j] <= ncap),
                        "node rows beyond the node capacity"
                    );
                    self.mem[f].ncnt.insert(me, (call, ncnt[j]));
                    self.set(me, f, Word::Fwd, me, call);
                }
            }
            Phase::Forward(s) => {
                let (c_call, c) = self.mem[me].ncnt[&s];
                assert_eq!(c_call, call, "PE {me}: node count of PE {s} stale");
                let mut next = vec![0usize; n];
                let mut log = BTreeMap::new();
                for i in 0..c.min(ncap) {
                    let cell = self.mem[me].nrecv.get(&(s * ncap + i)).cloned();
                    let cell =
                        cell.unwrap_or_else(|| panic!("PE {me}: node row {i} of {s} missing"));
                    assert_eq!(cell.call, call, "PE {me}: node row {i} of PE {s} stale");
                    let mut to = Vec::new();
                    let dests = tm.dests_on(&cell.rec, node);
                    assert!(!dests.is_empty(), "a node row for no PE of the node");
                    for d in dests {
                        let p = next[d];
                        next[d] += 1;
                        to.push((d, p));
                        if p < cap {
                            self.stray += usize::from(self.cross(me, d));
                            self.mem[d].recv.insert(s * cap + p, cell.clone());
                        }
                    }
                    log.insert((s, i), to);
                }
                // The forwarded counts are the source's counts to each PE of the node (all
                // node rows fit whenever every pair does).
                for &d in tm.nm.members(node) {
                    if c <= ncap {
                        assert_eq!(next[d], fl.cnt[s][d], "PE {me} forwards {s}'s rows to {d}");
                    }
                    self.set(me, d, Word::Data, s, call);
                }
                self.fwd.entry((call, me)).or_default().extend(log);
            }
            Phase::DWait => {
                let ok = (0..n).all(|s| {
                    let (c, cnt, over) = self.mem[me].rec[&s];
                    assert_eq!(c, call, "PE {me}: record of PE {s} stale");
                    assert_eq!(cnt, fl.cnt[s][me]);
                    !over
                });
                assert_eq!(ok, fl.ok, "PE {me}: decision");
                let mut got = Vec::new();
                if ok {
                    for s in 0..n {
                        for p in 0..fl.cnt[s][me] {
                            let cell = &self.mem[me].recv[&(s * cap + p)];
                            assert_eq!(cell.call, call, "PE {me}: row {p} of PE {s} stale");
                            let want = fl.recv[me][s * cap + p].as_ref().expect("flat row");
                            assert_eq!(
                                (&cell.x, &cell.rec),
                                (&want.0, &want.1),
                                "PE {me} row {s}/{p}"
                            );
                            got.push((s, p));
                        }
                    }
                }
                self.got.insert((call, me), (got, ok));
            }
            Phase::CSend => {
                let (got, ok) = self.got[&(call, me)].clone();
                for &(s, p) in got.iter().filter(|_| ok) {
                    let cell = &self.mem[me].recv[&(s * cap + p)];
                    assert_eq!(cell.call, call, "PE {me}: combine reads a stale row");
                    let ids: Vec<i32> =
                        cell.rec[1..1 + tm.kmax].iter().map(|&v| v as i32).collect();
                    let w: Vec<f32> = cell.rec[1 + tm.kmax..]
                        .iter()
                        .map(|&v| f32::from_bits(v))
                        .collect();
                    let part = partial(tm, me, &ids, &w, &cell.x);
                    let c = Cell {
                        call,
                        x: part,
                        rec: vec![],
                    };
                    if self.cross(s, me) {
                        self.mem[me].px.insert(s * cap + p, c);
                    } else {
                        self.mem[s].comb.insert((par * n + me) * cap + p, c);
                    }
                }
                for &q in tm.nm.members(node) {
                    self.set(me, q, Word::Comb, me, call);
                    if !tm.served(q).is_empty() {
                        self.set(me, q, Word::Parts, me, call);
                    }
                }
            }
            Phase::CForward => {
                let ok = self.got[&(call, me)].1;
                let served = tm.served(me);
                let log = self.fwd.get(&(call, me)).cloned().unwrap_or_default();
                for &s in &served {
                    for (&(_, i), to) in log.range((s, 0)..(s + 1, 0)).filter(|_| ok) {
                        let mut acc = vec![0f32; H];
                        for &(d, p) in to {
                            let c = &self.mem[d].px[&(s * cap + p)];
                            assert_eq!(c.call, call, "PE {me}: partial of PE {d} stale");
                            for (a, v) in acc.iter_mut().zip(&c.x) {
                                *a += v;
                            }
                        }
                        self.xrows[1] += 1;
                        let c = Cell {
                            call,
                            x: acc,
                            rec: vec![],
                        };
                        self.mem[s]
                            .ncomb
                            .insert((par * tm.nm.n_nodes() + node) * ncap + i, c);
                    }
                    self.set(me, s, Word::Comb, me, call);
                }
            }
            Phase::CRecv => {
                let ok = self.got[&(call, me)].1;
                let toks = &step[me];
                let pos = tm.positions(toks);
                let npos = tm.node_positions(me, toks);
                let nodes = tm.nm.n_nodes();
                let mut out = Vec::new();
                for (t, tok) in toks.iter().enumerate().filter(|_| ok) {
                    let mut o = [0f32; H];
                    let mut add = |c: &Cell| {
                        assert_eq!(c.call, call, "PE {me}: combine row of token {t} stale");
                        for (a, v) in o.iter_mut().zip(&c.x) {
                            *a += v;
                        }
                    };
                    for d in tm.dests(tok).into_iter().filter(|&d| !self.cross(d, me)) {
                        add(&self.mem[me].comb[&((par * n + d) * cap + pos[t][d] as usize)]);
                    }
                    for (j, &p) in npos[t].iter().enumerate().filter(|e| *e.1 >= 0) {
                        add(&self.mem[me].ncomb[&((par * nodes + j) * ncap + p as usize)]);
                    }
                    out.push(o);
                }
                self.outs.insert((call, me), out);
            }
        }
    }
}

/// A random routing: each source `0..max_tokens` tokens, `k` slots of random experts (some
/// `-1`, some repeated), weights of 1/4 to 2, rows of small integers.
fn routing(tm: &Team, k: usize, rnd: &mut impl FnMut() -> u64) -> Vec<Vec<Tok>> {
    let e = tm.n * tm.epp;
    (0..tm.n)
        .map(|_| {
            let t = (rnd() % (tm.max_tokens as u64 + 1)) as usize;
            (0..t)
                .map(|_| {
                    let ids = (0..k)
                        .map(|_| match rnd() % 8 {
                            0 => -1,
                            _ => (rnd() % e as u64) as i32,
                        })
                        .collect();
                    let w = (0..k)
                        .map(|_| [0.25f32, 0.5, 1.0, 2.0][(rnd() % 4) as usize])
                        .collect();
                    let mut x = [0f32; H];
                    for v in &mut x {
                        *v = (rnd() % 17) as f32 - 8.0;
                    }
                    Tok { ids, w, x }
                })
                .collect()
        })
        .collect()
}

/// A reproducible stream of random words (xorshift64) for the models and tests.
pub(super) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Runs `calls` dispatch (+ combine) steps of random routings on the team, the PEs' steps in a
/// seeded order; checks every call against the flat path. Returns the rows that crossed nodes
/// (dispatch, combine) and what the flat path would have sent across.
fn run_model(tm: &Team, calls: u64, seed: u64) -> ([usize; 2], usize) {
    let mut rnd = xorshift(seed);
    let steps: Vec<Vec<Vec<Tok>>> = (0..calls).map(|_| routing(tm, tm.kmax, &mut rnd)).collect();
    let flats: Vec<Flat> = steps.iter().map(|s| flat(tm, s)).collect();
    let mut w = World {
        tm,
        mem: (0..tm.n).map(|_| Mem::default()).collect(),
        sets: BTreeMap::new(),
        xrows: [0; 2],
        stray: 0,
        fwd: HashMap::new(),
        got: HashMap::new(),
        outs: HashMap::new(),
    };
    // Each PE's program: per call, ready, send, forward (each served source), wait, combine;
    // every third call (from the second) is a dispatch alone (two dispatches back to back).
    let combined = |call: u64| call % 3 != 2;
    let progs: Vec<Vec<(u64, Phase)>> = (0..tm.n)
        .map(|me| {
            let mut p = Vec::new();
            for call in 1..=calls {
                p.push((call, Phase::Ready));
                p.push((call, Phase::Send));
                p.extend(tm.served(me).into_iter().map(|s| (call, Phase::Forward(s))));
                p.extend(
                    [Phase::DWait, Phase::CSend, Phase::CForward, Phase::CRecv]
                        .map(|ph| (call, ph))
                        .into_iter()
                        .take(if combined(call) { 4 } else { 1 }),
                );
            }
            p
        })
        .collect();
    let mut at = vec![0usize; tm.n];
    loop {
        let runnable: Vec<usize> = (0..tm.n)
            .filter(|&me| {
                progs[me].get(at[me]).is_some_and(|&(call, ph)| {
                    let ws = w.waits(me, ph);
                    w.ready(me, &ws, call)
                })
            })
            .collect();
        if runnable.is_empty() {
            let stuck: Vec<_> = (0..tm.n)
                .filter(|&m| at[m] < progs[m].len())
                .map(|m| (m, progs[m][at[m]]))
                .collect();
            assert!(stuck.is_empty(), "no PE can go on: {stuck:?}");
            break;
        }
        let me = runnable[(rnd() % runnable.len() as u64) as usize];
        let (call, ph) = progs[me][at[me]];
        let step = &steps[call as usize - 1];
        let ws = w.waits(me, ph);
        w.consume(me, &ws, call);
        w.run(me, ph, call, step, &flats[call as usize - 1]);
        at[me] += 1;
    }
    // Every set met exactly one wait.
    for (k, (_, used)) in &w.sets {
        assert!(used, "set {k:?} never waited for");
    }
    assert_eq!(
        w.stray, 0,
        "a row stored across nodes outside the node areas"
    );
    for (c, fl) in flats.iter().enumerate() {
        for me in 0..tm.n {
            let Some(out) = w.outs.get(&(c as u64 + 1, me)) else {
                assert!(!combined(c as u64 + 1));
                continue;
            };
            match fl.ok {
                true => assert_eq!(out, &fl.out[me], "call {} PE {me}: combined tokens", c + 1),
                false => assert!(out.is_empty()),
            }
        }
    }
    // One row per (token, destination node other than its source's), in each direction
    // (dispatch: rows beyond the node capacity stay home; combine: only steps that passed).
    let node_rows = |st: &Vec<Vec<Tok>>, lim: usize| -> usize {
        st.iter()
            .enumerate()
            .map(|(s, toks)| {
                let np = tm.node_positions(s, toks);
                np.iter()
                    .flatten()
                    .filter(|&&p| p >= 0 && (p as usize) < lim)
                    .count()
            })
            .sum()
    };
    let want_d: usize = steps.iter().map(|st| node_rows(st, tm.node_cap())).sum();
    let want_c: usize = steps
        .iter()
        .zip(&flats)
        .enumerate()
        .map(|(c, (st, fl))| match fl.ok && combined(c as u64 + 1) {
            true => node_rows(st, usize::MAX),
            false => 0,
        })
        .sum();
    assert_eq!(
        w.xrows,
        [want_d, want_c],
        "rows across nodes: one per (token, node)"
    );
    let flat_rows = flats.iter().map(|f| f.cross_rows).sum();
    (w.xrows, flat_rows)
}

/// Node layouts: nodes of 1, 2 and 3 PEs, equal and unequal, members interleaved.
const LAYOUTS: [&[usize]; 8] = [
    &[0, 1],
    &[0, 0, 1, 1],
    &[0, 1, 1],
    &[0, 0, 0, 1],
    &[0, 1, 0, 1],
    &[0, 0, 1, 1, 1, 2],
    &[0, 1, 2, 1, 0, 2, 2],
    &[3, 3, 3, 7, 7, 7],
];

/// Normal mode (`cap = max_tokens`): every routing passes; the receivers' rows, records and
/// combined tokens are the flat path's, each wait met by one set, and the rows that cross
/// nodes are one per (token, destination node) in each direction, never more than the flat
/// path's (one per destination PE) and as many where every node has one PE.
#[test]
fn forwarded_schedule_matches_the_flat_path() {
    for (li, nodes) in LAYOUTS.iter().enumerate() {
        for (seed, k) in [(1u64, 1usize), (2, 2), (3, 4), (4, 6)] {
            let tm = Team::new(nodes, 2, k, 9, 9);
            let (x, flat_rows) = run_model(&tm, 4, seed * 1000 + li as u64);
            assert!(
                x[0] <= flat_rows,
                "{nodes:?}: forwarded {} flat {flat_rows}",
                x[0]
            );
            if tm.nm.max_local() == 1 {
                assert_eq!(x[0], flat_rows, "{nodes:?}: one PE per node");
            }
        }
    }
}

/// Capturable mode (`cap < max_tokens`): some steps overflow a pair and move nothing on every
/// PE, those that fit pass exactly as the flat path (their node rows always fit the node area
/// of `min(max_tokens, max_local * cap)` rows per source), and the steps after an overflow reuse
/// the areas and words unharmed.
#[test]
fn forwarded_schedule_overflow_is_the_flat_paths() {
    let mut overflowed = 0;
    let mut passed = 0;
    for (li, nodes) in LAYOUTS.iter().enumerate() {
        for seed in 0..6u64 {
            let tm = Team::new(nodes, 2, 3, 3, 8);
            let mut rnd = xorshift(seed * 77 + li as u64);
            let flats: Vec<bool> = (0..5)
                .map(|_| flat(&tm, &routing(&tm, 3, &mut rnd)).ok)
                .collect();
            overflowed += flats.iter().filter(|ok| !**ok).count();
            passed += flats.iter().filter(|ok| **ok).count();
            run_model(&tm, 5, seed * 77 + li as u64);
        }
    }
    assert!(
        overflowed > 10 && passed > 10,
        "{overflowed} overflowed, {passed} passed"
    );
}

/// The counts and positions the forwarder derives from the node rows alone (their records'
/// ids) are the source's own per-PE positions: spelt out on one routing.
#[test]
fn forwarder_positions_are_the_sources() {
    // Node 0: PEs 0, 1; node 1: PEs 2, 3. Experts: 2 per PE.
    let tm = Team::new(&[0, 0, 1, 1], 2, 2, 8, 8);
    let tok = |a: i32, b: i32| Tok {
        ids: vec![a, b],
        w: vec![1.0, 1.0],
        x: [0.0; H],
    };
    // PE 0's tokens: t0 -> PEs 2, 3; t1 -> PE 0 only; t2 -> PE 3 (twice); t3 -> PEs 1, 2.
    let toks = [tok(4, 6), tok(0, 1), tok(7, 6), tok(2, 5)];
    let pos = tm.positions(&toks);
    let npos = tm.node_positions(0, &toks);
    assert_eq!(npos.iter().map(|p| p[1]).collect::<Vec<_>>(), [0, -1, 1, 2]);
    assert!(
        npos.iter().all(|p| p[0] == -1),
        "no node rows to the own node"
    );
    assert_eq!(pos.iter().map(|p| p[2]).collect::<Vec<_>>(), [0, -1, -1, 1]);
    assert_eq!(pos.iter().map(|p| p[3]).collect::<Vec<_>>(), [0, -1, 1, -1]);
    // PE 0 (local 0) is forwarded by PE 2 on node 1, PE 1 by PE 3.
    assert_eq!((tm.served(2), tm.served(3)), (vec![0], vec![1]));
    // The forwarder's scan over the node rows finds the same positions.
    let mut next = [0usize; 4];
    for (t, tok) in toks.iter().enumerate().filter(|(t, _)| npos[*t][1] >= 0) {
        for d in tm.dests_on(&record(t, tok, 2), 1) {
            assert_eq!(pos[t][d], next[d] as i64);
            next[d] += 1;
        }
    }
    assert_eq!(next, [0, 0, 2, 2]);
    // Unequal nodes: the node of one PE forwards for every PE of the other.
    let tm = Team::new(&[0, 1, 1, 1], 2, 2, 8, 8);
    assert_eq!(tm.served(0), vec![1, 2, 3]);
    assert!(tm.served(1).contains(&0) && tm.served(2).is_empty());
    assert_eq!(tm.node_cap(), 8);
    assert_eq!(Team::new(&[0, 1, 1, 1], 2, 2, 2, 8).node_cap(), 6);
}
