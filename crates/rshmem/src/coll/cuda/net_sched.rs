//! The cross-node schedules of [`GpuColl`](super::GpuColl) on teams spanning nodes: pure data
//! (no PE, no memory), one member's view of one call, run by `net.rs` and checked on host
//! vectors by `net_tests.rs`.
//!
//! A schedule has up to three phases:
//! * `before`: steps inside the node, before the rounds (reductions fold the node's inputs
//!   into the carriers of each part; in-place all_to_all stages its outgoing shares);
//! * `rounds` across nodes: puts with signals through the proxy, chunked;
//! * `after`: copies inside the node.
//!
//! Reductions put a node's partial into the receiver's scratch slot of the sender's node and
//! parity ([`NetTo::Scratch`]): `2 × nodes` slots per PE, whoever the sender. A slot is
//! written again two uses later; the sender of that use must know that the receiver folded the
//! slot's previous contents. Either the sender had a put of the receiver after that fold (the
//! symmetric exchanges of all_reduce: the same sender in the use before, which the receiver
//! answered in the same round), or the receiver acknowledges the fold: at the start of its
//! next round it sets the sender's ack word of it to the number of the slot's folds done
//! ([`Round::acks`]), and the sender's put waits for it ([`NetPut::ack`]).

use crate::coll::plan::{Buf, Step};
use crate::error::{Error, Result};
use crate::team::NodeMap;
use std::collections::{BTreeMap, HashMap};

/// Where a round's put lands at its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetTo {
    /// The target's `dst` at this element.
    Dst(usize),
    /// The target's scratch slot of node `node` (the sender's), half `parity` (reductions).
    Scratch { node: usize, parity: usize },
}

/// One put of a round: `len` elements of this member's input ([`NetSched::input`], from
/// element `from_at`) to member `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NetPut {
    pub to: usize,
    pub from_at: usize,
    pub dst: NetTo,
    /// Before the put, wait until `to` acknowledged this many folds of the slot (0: none).
    pub ack: u32,
}

/// A fold source per node: `None` this member's own `dst`, else its scratch slot of
/// (node, parity).
pub(crate) type FoldSrcs = Vec<Option<(usize, usize)>>;

/// One round of the cross-node phase as this member runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// Number of the round in the call (the same on every member; signal values carry it).
    pub index: u32,
    /// Elements each put moves.
    pub len: usize,
    /// Acknowledgements posted first: (member, folds of its node's slot done).
    pub acks: Vec<(usize, u32)>,
    pub puts: Vec<NetPut>,
    /// Members whose put of this round this member waits for.
    pub waits: Vec<usize>,
    /// Reductions: `dst[at..at+len]` becomes the fold in node order of, per node, this
    /// member's `dst` (`None`, its own node) or its scratch slot of (node, parity).
    pub fold: Option<(usize, FoldSrcs)>,
}

/// The phases of one call for one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetSched {
    /// Members this one exchanges with (a ready arrival each before the first put), ascending.
    pub partners: Vec<usize>,
    /// Steps before the rounds (`peer`: local index on the node). With `before_phase` they
    /// run between two barriers of the node's members (on every member of the node alike);
    /// without, they are copies inside this member's own buffers.
    pub before: Vec<Step>,
    pub before_phase: bool,
    /// What the rounds' puts read.
    pub input: Buf,
    pub rounds: Vec<Round>,
    /// Copies inside the node after the rounds, run between two barriers of the node's
    /// members when `node_phase` (on every member of the node alike, copies or none).
    pub after: Vec<Step>,
    pub node_phase: bool,
    /// Elements of private staging memory (`Buf::Temp`) the phases use.
    pub temp_len: usize,
}

/// Part `q` of `parts` of `count` elements: (first element, length); lengths differ by at
/// most one.
pub(crate) fn part(count: usize, parts: usize, q: usize) -> (usize, usize) {
    let at = |q: usize| (q as u128 * count as u128 / parts as u128) as usize;
    (at(q), at(q + 1) - at(q))
}

/// The chunks of `len` elements from `at`, `chunk` elements at most each.
fn chunks(at: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |c| (at + c * chunk, chunk.min(len - c * chunk)))
}

fn next_round(r: &mut u32) -> Result<u32> {
    let i = *r;
    *r = r
        .checked_add(1)
        .ok_or_else(|| Error::invalid("a collective across nodes of more than 2^32 rounds"))?;
    Ok(i)
}

fn round(index: u32, len: usize) -> Round {
    Round {
        index,
        len,
        acks: Vec::new(),
        puts: Vec::new(),
        waits: Vec::new(),
        fold: None,
    }
}

/// The part at `at` (`len` elements) of `dst` copied from its owner's `dst` (node member
/// `peer`, by local index): a node phase after the part's rounds.
fn from_owner(peer: usize, at: usize, len: usize) -> Step {
    Step::Copy {
        peer,
        from: Buf::Dst,
        from_at: at,
        to: Buf::Dst,
        to_at: at,
        len,
    }
}

/// This member's own `src` at `from_at` into the first `len` elements of its `dst`.
fn own_input(from_at: usize, len: usize) -> Step {
    Step::Copy {
        peer: 0,
        from: Buf::Src,
        from_at,
        to: Buf::Dst,
        to_at: 0,
        len,
    }
}

/// A schedule without a phase before the rounds, reading `input`.
fn finish(
    mut partners: Vec<usize>,
    input: Buf,
    rounds: Vec<Round>,
    after: Vec<Step>,
    node_phase: bool,
) -> NetSched {
    partners.sort_unstable();
    partners.dedup();
    NetSched {
        partners,
        before: Vec::new(),
        before_phase: false,
        input,
        rounds,
        after,
        node_phase,
        temp_len: 0,
    }
}

/// One fold of a reduction, as every member sees it: member `to` folds `len` elements of its
/// `dst` at `at` with one partial per other node `k`, put by `from[k] = Some((sender,
/// from_at))` (`None` on the receiver's node: its own `dst`).
#[derive(Debug, Clone)]
struct FoldSpec {
    index: u32,
    len: usize,
    to: usize,
    at: usize,
    from: Vec<Option<(usize, usize)>>,
}

/// This member's rounds of a reduction's folds (given in round order, on every member
/// alike): puts into the receivers' scratch slots of this member's node, alternating parity
/// per (receiver, node), with the acknowledgements the reuse of a slot needs.
fn fold_rounds(map: &NodeMap, me: usize, folds: &[FoldSpec]) -> Result<(Vec<usize>, Vec<Round>)> {
    let internal = |what: &str| Error::invalid(format!("internal: cross-node schedule: {what}"));
    // Puts of a round: (round index, sender, receiver), for the acknowledgements implied by a
    // symmetric exchange.
    let mut sends: std::collections::HashSet<(u32, usize, usize)> = Default::default();
    for f in folds {
        for &(s, _) in f.from.iter().flatten() {
            sends.insert((f.index, s, f.to));
        }
    }
    // Uses of each (receiver, sender's node) slot pair so far: (round index, sender).
    let mut uses: HashMap<(usize, usize), Vec<(u32, usize)>> = HashMap::new();
    let mut mine: BTreeMap<u32, Round> = BTreeMap::new();
    // Acknowledgements this member posts: (after the round of this index, to, value).
    let mut acks: Vec<(u32, usize, u32)> = Vec::new();
    let mut partners = Vec::new();
    for f in folds {
        let mut srcs = Vec::with_capacity(f.from.len());
        for (k, from) in f.from.iter().enumerate() {
            let Some((s, from_at)) = *from else {
                srcs.push(None);
                continue;
            };
            let u = uses.entry((f.to, k)).or_default();
            let n = u.len();
            let parity = n % 2;
            let mut ack = 0;
            if n >= 1 && u[n - 1].0 >= f.index {
                return Err(internal("two uses of a slot in one round"));
            }
            if n >= 2 {
                let (prev_index, prev) = u[n - 1];
                // The receiver put to this sender in the slot's previous use, after folding
                // the use this one overwrites: nothing to acknowledge.
                let implied = prev == s && sends.contains(&(prev_index, f.to, s));
                if !implied {
                    ack = u32::try_from(n - 1).map_err(|_| internal("too many folds"))?;
                    if f.to == me {
                        acks.push((u[n - 2].0, s, ack));
                    }
                }
            }
            u.push((f.index, s));
            srcs.push(Some((k, parity)));
            if s == me {
                let r = mine.entry(f.index).or_insert_with(|| round(f.index, f.len));
                r.puts.push(NetPut {
                    to: f.to,
                    from_at,
                    dst: NetTo::Scratch {
                        node: map.node(me),
                        parity,
                    },
                    ack,
                });
                partners.push(f.to);
            }
            if f.to == me {
                partners.push(s);
            }
        }
        if f.to == me {
            let r = mine.entry(f.index).or_insert_with(|| round(f.index, f.len));
            if r.fold.is_some() {
                return Err(internal("two folds of one member in one round"));
            }
            r.waits.extend(f.from.iter().flatten().map(|&(s, _)| s));
            r.fold = Some((f.at, srcs));
        }
    }
    // Each acknowledgement goes out at the start of this member's first round after the
    // fold (the fold kernel ran before it on the stream).
    for (after, to, v) in acks {
        let r = mine
            .range_mut(after + 1..)
            .next()
            .map(|(_, r)| r)
            .ok_or_else(|| internal("an acknowledgement without a later round"))?;
        r.acks.push((to, v));
    }
    Ok((partners, mine.into_values().collect()))
}

/// all_reduce, after every member's `dst` holds its node's partial: part `q` of
/// `max_local` parts is folded over the nodes by its owners (one per node), then copied
/// inside each node from its owner.
pub(crate) fn all_reduce_sched(
    map: &NodeMap,
    me: usize,
    count: usize,
    chunk: usize,
) -> Result<NetSched> {
    let (nodes, parts) = (map.n_nodes(), map.max_local());
    let mine = map.node(me);
    let mut after = Vec::new();
    let mut folds = Vec::new();
    let mut r = 0u32;
    for q in 0..parts {
        let (at, len) = part(count, parts, q);
        let owners: Vec<usize> = (0..nodes).map(|k| map.peer(k, q)).collect();
        if owners[mine] != me && len > 0 {
            after.push(from_owner(map.local(owners[mine]), at, len));
        }
        for (a, n) in chunks(at, len, chunk) {
            let index = next_round(&mut r)?;
            for (k, &to) in owners.iter().enumerate() {
                let from = (0..nodes)
                    .map(|j| (j != k).then_some((owners[j], a)))
                    .collect();
                folds.push(FoldSpec {
                    index,
                    len: n,
                    to,
                    at: a,
                    from,
                });
            }
        }
    }
    let (partners, rounds) = fold_rounds(map, me, &folds)?;
    let local = map.members(mine).len();
    Ok(finish(
        partners,
        Buf::Dst,
        rounds,
        after,
        count > 0 && local > 1,
    ))
}

/// reduce to member `root`: on every other node, the owner of part `q` (local index `q % L`)
/// folds the node's inputs of the part into its staging; the root folds its node's inputs
/// into its `dst`, then, chunk by chunk, the other nodes' partials into it, in node order.
/// `dst` of the other members is not written.
pub(crate) fn reduce_sched(
    map: &NodeMap,
    me: usize,
    root: usize,
    count: usize,
    chunk: usize,
    in_place: bool,
) -> Result<NetSched> {
    let (nodes, parts) = (map.n_nodes(), map.max_local());
    let (mine, home) = (map.node(me), map.node(root));
    // Where the owner of part q on node k keeps its partial: staging (Temp) at the sum of
    // its earlier parts, or its own `src` on a node of one.
    let slot = |k: usize, q: usize| -> usize {
        if map.members(k).len() == 1 {
            return part(count, parts, q).0;
        }
        let o = map.peer(k, q);
        (0..q)
            .filter(|&p| map.peer(k, p) == o)
            .map(|p| part(count, parts, p).1)
            .sum()
    };
    let mut folds = Vec::new();
    let mut r = 0u32;
    for q in 0..parts {
        let (at, len) = part(count, parts, q);
        for (a, n) in chunks(at, len, chunk) {
            let index = next_round(&mut r)?;
            let from = (0..nodes)
                .map(|k| (k != home).then(|| (map.peer(k, q), slot(k, q) + a - at)))
                .collect();
            folds.push(FoldSpec {
                index,
                len: n,
                to: root,
                at: a,
                from,
            });
        }
    }
    let (partners, rounds) = fold_rounds(map, me, &folds)?;
    let local = map.members(mine).len();
    let mut s = finish(partners, Buf::Temp, rounds, Vec::new(), false);
    if count == 0 {
        return Ok(s);
    }
    if mine == home {
        s.before_phase = local > 1;
        if me == root && local > 1 {
            s.before.push(Step::Reduce {
                from: Buf::Src,
                from_at: 0,
                to: Buf::Dst,
                to_at: 0,
                len: count,
            });
        } else if me == root && !in_place {
            s.before.push(own_input(0, count));
        }
    } else if local > 1 {
        s.before_phase = true;
        for q in (0..parts).filter(|&q| map.peer(mine, q) == me) {
            let (at, len) = part(count, parts, q);
            let to_at = slot(mine, q);
            s.before.push(Step::Reduce {
                from: Buf::Src,
                from_at: at,
                to: Buf::Temp,
                to_at,
                len,
            });
            s.temp_len = s.temp_len.max(to_at + len);
        }
    } else {
        s.input = Buf::Src;
    }
    Ok(s)
}

/// reduce_scatter: block `j` (member j's result) is folded inside each node by its carrier
/// there (the member of local index `local(j) % L`: member j itself on its own node), then
/// the carriers on other nodes put their node's partial of block j, chunk by chunk, into
/// member j's scratch and member j folds them, in node order, into its result.
pub(crate) fn reduce_scatter_sched(
    map: &NodeMap,
    me: usize,
    count: usize,
    chunk: usize,
    in_place: bool,
) -> Result<NetSched> {
    let (nodes, n) = (map.n_nodes(), map.n_pes());
    let mine = map.node(me);
    let local = map.members(mine).len();
    // Blocks of other nodes' members carried by member c, in member order.
    let carried = |c: usize| -> Vec<usize> {
        let k = map.node(c);
        (0..n)
            .filter(|&j| map.node(j) != k && map.peer(k, map.local(j)) == c)
            .collect()
    };
    // Where carrier c's partial of block j (of another node) is: staging, block after
    // block, out of place; its own `dst` at block j in place; its `src` on a node of one.
    let place = |c: usize, j: usize| -> usize {
        if in_place || map.members(map.node(c)).len() == 1 {
            return j * count;
        }
        let t = carried(c).iter().position(|&x| x == j).unwrap_or(0);
        t * count
    };
    let out = |j: usize| if in_place { j * count } else { 0 };
    let mut folds = Vec::new();
    let mut r = 0u32;
    for (a, len) in chunks(0, count, chunk) {
        let index = next_round(&mut r)?;
        for j in 0..n {
            let from = (0..nodes)
                .map(|k| {
                    (k != map.node(j)).then(|| {
                        let c = map.peer(k, map.local(j));
                        (c, place(c, j) + a)
                    })
                })
                .collect();
            folds.push(FoldSpec {
                index,
                len,
                to: j,
                at: out(j) + a,
                from,
            });
        }
    }
    let (partners, rounds) = fold_rounds(map, me, &folds)?;
    let input = if local == 1 {
        Buf::Src
    } else if in_place {
        Buf::Dst
    } else {
        Buf::Temp
    };
    let mut s = finish(partners, input, rounds, Vec::new(), false);
    if count == 0 {
        return Ok(s);
    }
    let mine_blocks = carried(me);
    if local > 1 {
        s.before_phase = true;
        let fold = |j: usize, to: Buf, to_at: usize| Step::Reduce {
            from: Buf::Src,
            from_at: j * count,
            to,
            to_at,
            len: count,
        };
        s.before.push(fold(me, Buf::Dst, out(me)));
        for &j in &mine_blocks {
            if in_place {
                s.before.push(fold(j, Buf::Dst, j * count));
            } else {
                s.before.push(fold(j, Buf::Temp, place(me, j)));
            }
        }
        if !in_place {
            s.temp_len = mine_blocks.len() * count;
        }
    } else if !in_place {
        s.before.push(own_input(me * count, count));
    }
    Ok(s)
}

/// broadcast from member `root`, after every member of the root's node has the data in `dst`:
/// part `q` goes from its owner on the root's node to its owner on every other node, then
/// inside each node from its owner.
pub(crate) fn broadcast_sched(
    map: &NodeMap,
    me: usize,
    root: usize,
    count: usize,
    chunk: usize,
) -> Result<NetSched> {
    let (nodes, parts) = (map.n_nodes(), map.max_local());
    let (mine, from) = (map.node(me), map.node(root));
    let (mut partners, mut rounds, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let mut r = 0u32;
    for q in 0..parts {
        let (at, len) = part(count, parts, q);
        let sender = map.peer(from, q);
        let owner = map.peer(mine, q);
        if mine != from && owner != me && len > 0 {
            after.push(from_owner(map.local(owner), at, len));
        }
        for (a, n) in chunks(at, len, chunk) {
            let index = next_round(&mut r)?;
            let mut rd = round(index, n);
            if sender == me {
                for k in (0..nodes).filter(|&k| k != from) {
                    let to = map.peer(k, q);
                    rd.puts.push(NetPut {
                        to,
                        from_at: a,
                        dst: NetTo::Dst(a),
                        ack: 0,
                    });
                    partners.push(to);
                }
            } else if mine != from && owner == me {
                rd.waits.push(sender);
                partners.push(sender);
            } else {
                continue;
            }
            rounds.push(rd);
        }
    }
    let local = map.members(mine).len();
    Ok(finish(
        partners,
        Buf::Dst,
        rounds,
        after,
        count > 0 && mine != from && local > 1,
    ))
}

/// all_gather: each member's input goes once to every other node, to the member there of its
/// local index (modulo the node's size), then inside each node from the member that holds it.
/// Puts read `src` from element 0, or in place this member's block of `dst`.
pub(crate) fn all_gather_sched(
    map: &NodeMap,
    me: usize,
    count: usize,
    chunk: usize,
    in_place: bool,
) -> Result<NetSched> {
    let (nodes, n) = (map.n_nodes(), map.n_pes());
    let (mine, l) = (map.node(me), map.local(me));
    let (mut partners, mut rounds, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let from = |j: usize| -> Vec<usize> {
        // Members of other nodes whose blocks this member receives.
        (0..n)
            .filter(|&i| map.node(i) != map.node(j) && map.peer(map.node(j), map.local(i)) == j)
            .collect()
    };
    let senders = from(me);
    if count > 0 {
        for j in 0..n {
            let (src, src_at) = if j == me && in_place {
                continue;
            } else if map.node(j) == mine {
                if in_place {
                    (j, j * count)
                } else {
                    (j, 0)
                }
            } else {
                let holder = map.peer(mine, map.local(j));
                if holder == me {
                    continue;
                }
                (holder, j * count)
            };
            let own_src = map.node(j) == mine && !in_place;
            after.push(Step::Copy {
                peer: map.local(src),
                from: if own_src { Buf::Src } else { Buf::Dst },
                from_at: src_at,
                to: Buf::Dst,
                to_at: j * count,
                len: count,
            });
        }
    }
    let base = if in_place { me * count } else { 0 };
    let mut r = 0u32;
    for (a, len) in chunks(0, count, chunk) {
        let index = next_round(&mut r)?;
        let mut rd = round(index, len);
        rd.waits = senders.clone();
        for k in (0..nodes).filter(|&k| k != mine) {
            let to = map.peer(k, l);
            rd.puts.push(NetPut {
                to,
                from_at: base + a,
                dst: NetTo::Dst(me * count + a),
                ack: 0,
            });
            partners.push(to);
        }
        partners.extend(&senders);
        rounds.push(rd);
    }
    let local = map.members(mine).len();
    let input = if in_place { Buf::Dst } else { Buf::Src };
    Ok(finish(
        partners,
        input,
        rounds,
        after,
        count > 0 && (local > 1 || !in_place),
    ))
}

/// all_to_all: each share for a member of another node goes straight into its `dst`; the
/// shares of the node's members are copied inside the node. In place, the outgoing shares
/// are first staged (the incoming ones land where they were), and the node's shares move in
/// two steps: each member reads its shares from the node's members into staging, then, after
/// a barrier (the others read the same places), writes them into its `dst`.
pub(crate) fn all_to_all_sched(
    map: &NodeMap,
    me: usize,
    count: usize,
    chunk: usize,
    in_place: bool,
) -> Result<NetSched> {
    let n = map.n_pes();
    let mine = map.node(me);
    let far: Vec<usize> = (0..n).filter(|&j| map.node(j) != mine).collect();
    let node = map.members(mine);
    let mut after = Vec::new();
    let mut before = Vec::new();
    let mut temp_len = 0;
    if count > 0 && in_place {
        before.push(Step::Copy {
            peer: map.local(me),
            from: Buf::Dst,
            from_at: 0,
            to: Buf::Temp,
            to_at: 0,
            len: n * count,
        });
        let others: Vec<usize> = node.iter().copied().filter(|&m| m != me).collect();
        for (i, &m) in others.iter().enumerate() {
            after.push(Step::Copy {
                peer: map.local(m),
                from: Buf::Dst,
                from_at: me * count,
                to: Buf::Temp,
                to_at: (n + i) * count,
                len: count,
            });
        }
        if !others.is_empty() {
            after.push(Step::Sync);
        }
        for (i, &m) in others.iter().enumerate() {
            after.push(Step::Copy {
                peer: map.local(me),
                from: Buf::Temp,
                from_at: (n + i) * count,
                to: Buf::Dst,
                to_at: m * count,
                len: count,
            });
        }
        temp_len = (n + others.len()) * count;
    } else if count > 0 {
        for &m in node {
            after.push(Step::Copy {
                peer: map.local(m),
                from: Buf::Src,
                from_at: me * count,
                to: Buf::Dst,
                to_at: m * count,
                len: count,
            });
        }
    }
    let mut rounds = Vec::new();
    let mut r = 0u32;
    for (a, len) in chunks(0, count, chunk) {
        let index = next_round(&mut r)?;
        let mut rd = round(index, len);
        rd.puts = far
            .iter()
            .map(|&j| NetPut {
                to: j,
                from_at: j * count + a,
                dst: NetTo::Dst(me * count + a),
                ack: 0,
            })
            .collect();
        rd.waits = far.clone();
        rounds.push(rd);
    }
    let partners = if count > 0 { far } else { Vec::new() };
    let input = if in_place { Buf::Temp } else { Buf::Src };
    let node_phase = count > 0 && (!in_place || node.len() > 1);
    let mut s = finish(partners, input, rounds, after, node_phase);
    s.before = before;
    s.temp_len = temp_len;
    Ok(s)
}

/// One launch of the round kernel: ranges of a round's acknowledgements, puts and waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    pub acks: std::ops::Range<usize>,
    pub puts: std::ops::Range<usize>,
    pub waits: std::ops::Range<usize>,
}

/// A round's launches of at most `list` entries per list: one when every list fits; else the
/// acknowledgements, then the puts, then the waits, as one launch runs them (a put may wait
/// for an acknowledgement that a member posts only at the start of its round, and every put
/// goes out before any wait).
pub(crate) fn round_launches(r: &Round, list: usize) -> Vec<Launch> {
    let list = list.max(1);
    let (na, np, nw) = (r.acks.len(), r.puts.len(), r.waits.len());
    if na <= list && np <= list && nw <= list {
        return vec![Launch {
            acks: 0..na,
            puts: 0..np,
            waits: 0..nw,
        }];
    }
    let pieces = |n: usize| (0..n.div_ceil(list)).map(move |c| c * list..n.min((c + 1) * list));
    let mut v = Vec::new();
    v.extend(pieces(na).map(|acks| Launch {
        acks,
        puts: 0..0,
        waits: 0..0,
    }));
    v.extend(pieces(np).map(|puts| Launch {
        acks: 0..0,
        puts,
        waits: 0..0,
    }));
    v.extend(pieces(nw).map(|waits| Launch {
        acks: 0..0,
        puts: 0..0,
        waits,
    }));
    v
}

/// One launch of the ready handshake: post this PE's arrivals to the partners in `range`,
/// wait for theirs, and whether the wait adds to the skip flag of an earlier launch of the
/// call (`more`) rather than setting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ready {
    pub post: bool,
    pub wait: bool,
    pub more: bool,
    pub range: std::ops::Range<usize>,
}

/// The ready handshake with `partners` partners in launches of at most `list`: one launch
/// when they fit; else every arrival posted before any is waited for.
pub(crate) fn ready_launches(partners: usize, list: usize) -> Vec<Ready> {
    let list = list.max(1);
    if partners <= list {
        return vec![Ready {
            post: true,
            wait: true,
            more: false,
            range: 0..partners,
        }];
    }
    let pieces: Vec<_> = (0..partners.div_ceil(list))
        .map(|c| c * list..partners.min((c + 1) * list))
        .collect();
    let posts = pieces.iter().map(|r| Ready {
        post: true,
        wait: false,
        more: false,
        range: r.clone(),
    });
    let waits = pieces.iter().enumerate().map(|(i, r)| Ready {
        post: false,
        wait: true,
        more: i > 0,
        range: r.clone(),
    });
    posts.chain(waits).collect()
}

/// all_to_all_v split along the nodes, for one member (arrays indexed by team member, as
/// [`crate::coll::AllToAllV`]): the arrays of the node-local call on this member's node
/// (indexed by local index), and per member of another node, in member order, (member,
/// displacement, count) of what this member expects from it (`meta`: where it lands in `dst`)
/// and of what it sends it (`puts`: where it starts in `src`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct A2avSplit {
    /// send_counts, send_displs, recv_counts, recv_displs of the node's members.
    pub node: [Vec<usize>; 4],
    pub meta: Vec<(usize, usize, usize)>,
    pub puts: Vec<(usize, usize, usize)>,
}

pub(crate) fn all_to_all_v_split(map: &NodeMap, me: usize, v: [&[usize]; 4]) -> A2avSplit {
    let [sc, sd, rc, rd] = v;
    let ms = map.members(map.node(me));
    let pick = |a: &[usize]| ms.iter().map(|&m| a[m]).collect::<Vec<_>>();
    let far: Vec<usize> = (0..map.n_pes())
        .filter(|&j| map.node(j) != map.node(me))
        .collect();
    A2avSplit {
        node: [pick(sc), pick(sd), pick(rc), pick(rd)],
        meta: far.iter().map(|&j| (j, rd[j], rc[j])).collect(),
        puts: far.iter().map(|&j| (j, sd[j], sc[j])).collect(),
    }
}

/// all_to_all_v_device across nodes, for one member: the members of other nodes, ascending.
/// Each is a partner in every phase of every call (its count row goes to each before the ready
/// arrival, then one put, or a bare signal where the count is 0, and one wait): every pair of
/// members of different nodes exchanges a signal in every call, so a partner's next row lands
/// only after this call's was read.
pub(crate) fn all_to_all_v_device_partners(map: &NodeMap, me: usize) -> Vec<usize> {
    (0..map.n_pes())
        .filter(|&j| map.node(j) != map.node(me))
        .collect()
}

/// Which of a pair's two signature rows call number `call` of the pair uses (the round
/// kernel's `(call & 1) ? alt : ck.slots`, mirrored here for the host model): a partner may be
/// one call ahead, never two.
#[cfg(test)]
pub(crate) fn sig_rows(call: u64) -> usize {
    (call & 1) as usize
}
