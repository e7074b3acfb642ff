//! Hierarchical plans for teams that span nodes ([`NodeMap`]): inside a node members read each
//! other's memory (shared memory), across nodes each local index of a node exchanges with
//! its peer (the same local index, see [`NodeMap::peer`]) on every other node, so every
//! member, and every NIC, carries a share of the cross-node traffic and each element crosses
//! between two nodes once (NCCL's ring-of-rings idea, as pulls).
//!
//! The plans keep the flat plans' conventions (pulls, team syncs between phases, no hazard
//! inside a phase). Reductions fold inside each node in team order, then over the nodes'
//! results in node order ([`NodeMap`]: by lowest member): every member gets the same bits,
//! but floats group the terms by node (integers give the flat plan's result exactly).

use super::{part, Algo, Buf, Builder, CollKind, Plan, Shape};
use crate::team::NodeMap;

/// The parts of a hierarchical all_reduce: `P` = the largest node's member count; member of
/// local index `l` on a node of `L` members owns the parts `q` with `q % L == l`.
fn owned(nodes: &NodeMap, me: usize) -> impl Iterator<Item = usize> + '_ {
    let l = nodes.local(me);
    let ln = nodes.members(nodes.node(me)).len();
    (0..nodes.max_local()).filter(move |q| q % ln == l)
}

/// all_reduce across nodes: (1) each member folds its parts over its node's members into its
/// `Dst`; (2) it folds each of its parts over the part's owners on every node (one per node)
/// into `Temp`; (3) writes that into its `Dst`; (4) copies the other parts from their owners
/// on its node. Cross-node reads per node: `(nodes - 1) · count` elements, against
/// `L · (n - L) · count` for the flat one-shot plan (`L` members per node).
pub fn all_reduce(s: Shape, nodes: &NodeMap, count: usize) -> Plan {
    let mut b = Builder::new(s);
    let me = s.me;
    let k = nodes.node(me);
    let p = nodes.max_local();
    let mine: Vec<usize> = owned(nodes, me).collect();
    for &q in &mine {
        let (at, len) = part(q, p, count);
        // In place, node peers read only their own parts of my Src.
        b.reduce_group(nodes.members(k).to_vec(), Buf::Src, at, Buf::Dst, at, len);
    }
    b.sync();
    let mut t = 0;
    for &q in &mine {
        let (at, len) = part(q, p, count);
        let owners: Vec<usize> = (0..nodes.n_nodes()).map(|j| nodes.peer(j, q)).collect();
        b.reduce_group(owners, Buf::Dst, at, Buf::Temp, t, len);
        t += len;
    }
    b.sync();
    let mut t = 0;
    for &q in &mine {
        let (at, len) = part(q, p, count);
        b.copy(me, Buf::Temp, t, Buf::Dst, at, len);
        t += len;
    }
    b.sync();
    for q in 0..p {
        let owner = nodes.peer(k, q);
        if owner != me {
            let (at, len) = part(q, p, count);
            b.copy(owner, Buf::Dst, at, Buf::Dst, at, len);
        }
    }
    b.done(CollKind::AllReduce, Algo::TwoShot)
}

/// all_gather across nodes: each member fetches the inputs of its peers on other nodes (those
/// whose local index maps to it), then copies every other input from the member of its node
/// that holds it. Each input crosses to each other node once.
pub fn all_gather(s: Shape, nodes: &NodeMap, count: usize) -> Plan {
    let mut b = Builder::new(s);
    let me = s.me;
    let k = nodes.node(me);
    let from = |j: usize| {
        if s.in_place {
            (Buf::Dst, j * count)
        } else {
            (Buf::Src, 0)
        }
    };
    // The member of my node that holds member j's input after the first phase.
    let holder = |j: usize| {
        if nodes.node(j) == k {
            j
        } else {
            nodes.peer(k, nodes.local(j))
        }
    };
    let (f, at) = from(me);
    b.copy(me, f, at, Buf::Dst, me * count, count);
    for j in 0..s.n {
        if j != me && holder(j) == me {
            let (f, at) = from(j);
            b.copy(j, f, at, Buf::Dst, j * count, count);
        }
    }
    b.sync();
    for j in 0..s.n {
        let h = holder(j);
        if h != me {
            b.copy(h, Buf::Dst, j * count, Buf::Dst, j * count, count);
        }
    }
    b.done(CollKind::AllGather, Algo::OneShot)
}

/// broadcast across nodes: members of the root's node copy from the root; on every other node
/// member `l` of `L` fetches part `l` of `L` from the root, then the parts from each other.
/// The vector crosses to each other node once.
pub fn broadcast(s: Shape, nodes: &NodeMap, root: usize, count: usize) -> Plan {
    let mut b = Builder::new(s);
    let me = s.me;
    let k = nodes.node(me);
    let ln = nodes.members(k).len();
    if me == root {
        b.copy(me, Buf::Src, 0, Buf::Dst, 0, count);
    } else if k == nodes.node(root) {
        b.copy(root, Buf::Src, 0, Buf::Dst, 0, count);
    } else {
        let (at, len) = part(nodes.local(me), ln, count);
        b.copy(root, Buf::Src, at, Buf::Dst, at, len);
    }
    b.sync();
    if k != nodes.node(root) {
        for &m in nodes.members(k) {
            if m != me {
                let (at, len) = part(nodes.local(m), ln, count);
                b.copy(m, Buf::Dst, at, Buf::Dst, at, len);
            }
        }
    }
    b.done(CollKind::Broadcast, Algo::OneShot)
}

/// reduce_scatter across nodes, in place (the buffer holds every member's block, so partials
/// can wait in it for readers on other nodes): (1) for each block `x` whose carrier on this
/// node is this member (the member of local index `local(x) % L`, [`NodeMap::peer`]; a member
/// of this node carries its own block), fold block `x` over the node's members into this
/// member's block `x`; (2) fold its own block over its carriers on every node, in node order.
/// Each block crosses to its member once per other node: `(nodes - 1) · count` elements read
/// across nodes per member, against `(n - L) · count` for the flat plan. Out of place the
/// destination holds one block, no room for the partials: the flat plan runs.
pub fn reduce_scatter(s: Shape, nodes: &NodeMap, count: usize) -> Plan {
    debug_assert!(s.in_place, "hierarchical reduce_scatter runs in place only");
    let mut b = Builder::new(s);
    let me = s.me;
    let k = nodes.node(me);
    for x in (0..s.n).filter(|&x| nodes.peer(k, nodes.local(x)) == me) {
        // Only this member reads block x on its node's members (it is x's one carrier here),
        // and it reads all of a step's inputs before it writes.
        b.reduce_group(
            nodes.members(k).to_vec(),
            Buf::Src,
            x * count,
            Buf::Dst,
            x * count,
            count,
        );
    }
    b.sync();
    let carriers: Vec<usize> = (0..nodes.n_nodes())
        .map(|j| nodes.peer(j, nodes.local(me)))
        .collect();
    b.reduce_group(carriers, Buf::Dst, me * count, Buf::Dst, me * count, count);
    b.done(CollKind::ReduceScatter, Algo::OneShot)
}
