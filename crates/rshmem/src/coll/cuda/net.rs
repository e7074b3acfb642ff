//! [`GpuColl`] on teams spanning nodes: the node's members by the node-local paths, the nodes
//! among each other through the proxy (DeepEP's and NCCL's hierarchy).
//!
//! A call on such a team runs in up to three phases on the stream:
//! 1. inside each node, the existing kernels on the node's members of the team (all_reduce:
//!    the node's partial into every member's `dst`; broadcast: the root's node gets the data);
//! 2. across nodes, rounds of puts with signals through the proxy ([`NetSched`]): each member
//!    of a node carries a share (part `q` of the vector is carried by the node's member of
//!    local index `q % L`, as in [`NodeMap::peer`]), chunked through [`CollTuning::net_chunk_bytes`];
//!    reductions put each node's partial into scratch at the other owners of the part and fold
//!    the nodes' partials in node order;
//! 3. inside each node, members copy the parts their node peers received (a plan of copies
//!    between two barriers, on the GPU plan executor).
//!
//! The node's members meet on the team's own barrier slot: device barrier counters count per
//! pair of PEs, so a barrier of a subset of the team keeps every pair in step.

use super::*;
use crate::team::NodeMap;

/// Most partners of a PE in one call, and most nodes of a team (the round and fold kernels
/// take their lists as arguments: `RSHMEMI_NET_MAX`).
pub(super) const NET_MAX: usize = 64;

/// Where a round's put lands at its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetTo {
    /// The target's `dst` at this element.
    Dst(usize),
    /// The target's scratch slot of this PE, half `parity` (reductions).
    Scratch(usize),
}

/// One put of a round: `len` elements of this member's input (`dst` for reductions and
/// broadcasts, the member's own block for all_gather) from element `from_at` to member `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NetPut {
    pub to: usize,
    pub from_at: usize,
    pub dst: NetTo,
}

/// A fold source per node: `None` this member's own `dst`, else its scratch slot of
/// (member, parity).
pub(crate) type FoldSrcs = Vec<Option<(usize, usize)>>;

/// One round of the cross-node phase as this member runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// Number of the round in the call (the same on every member; signal values carry it).
    pub index: u32,
    /// Elements each put moves.
    pub len: usize,
    pub puts: Vec<NetPut>,
    /// Members whose put of this round this member waits for.
    pub waits: Vec<usize>,
    /// Reductions: `dst[at..at+len]` becomes the fold in node order of, per node, this
    /// member's `dst` (`None`, its own node) or its scratch slot of (member, parity).
    pub fold: Option<(usize, FoldSrcs)>,
}

/// The cross-node phase and the node phase after it, for one member of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetSched {
    /// Members this one exchanges with (a ready arrival each before the first put), ascending.
    pub partners: Vec<usize>,
    pub rounds: Vec<Round>,
    /// Copies inside the node after the rounds (`peer`: local index on the node), run between
    /// two barriers of the node's members when `node_phase` (on every member of the node
    /// alike, copies or none).
    pub after: Vec<Step>,
    pub node_phase: bool,
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

fn finish(
    mut partners: Vec<usize>,
    rounds: Vec<Round>,
    after: Vec<Step>,
    node_phase: bool,
) -> NetSched {
    partners.sort_unstable();
    partners.dedup();
    NetSched {
        partners,
        rounds,
        after,
        node_phase,
    }
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
    let (mut partners, mut rounds, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let mut pair = vec![0usize; map.n_pes()];
    let mut r = 0u32;
    for q in 0..parts {
        let (at, len) = part(count, parts, q);
        let owners: Vec<usize> = (0..nodes).map(|k| map.peer(k, q)).collect();
        if owners[mine] != me && len > 0 {
            after.push(Step::Copy {
                peer: map.local(owners[mine]),
                from: Buf::Dst,
                from_at: at,
                to: Buf::Dst,
                to_at: at,
                len,
            });
        }
        for (a, n) in chunks(at, len, chunk) {
            let index = next_round(&mut r)?;
            if owners[mine] != me {
                continue;
            }
            let mut round = Round {
                index,
                len: n,
                puts: Vec::new(),
                waits: Vec::new(),
                fold: None,
            };
            let mut fold = Vec::with_capacity(nodes);
            for (k, &o) in owners.iter().enumerate() {
                if k == mine {
                    fold.push(None);
                    continue;
                }
                let parity = pair[o] % 2;
                pair[o] += 1;
                round.puts.push(NetPut {
                    to: o,
                    from_at: a,
                    dst: NetTo::Scratch(parity),
                });
                round.waits.push(o);
                fold.push(Some((o, parity)));
                partners.push(o);
            }
            round.fold = Some((a, fold));
            rounds.push(round);
        }
    }
    let local = map.members(mine).len();
    Ok(finish(partners, rounds, after, count > 0 && local > 1))
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
            after.push(Step::Copy {
                peer: map.local(owner),
                from: Buf::Dst,
                from_at: at,
                to: Buf::Dst,
                to_at: at,
                len,
            });
        }
        for (a, n) in chunks(at, len, chunk) {
            let index = next_round(&mut r)?;
            let mut round = Round {
                index,
                len: n,
                puts: Vec::new(),
                waits: Vec::new(),
                fold: None,
            };
            if sender == me {
                for k in (0..nodes).filter(|&k| k != from) {
                    let to = map.peer(k, q);
                    round.puts.push(NetPut {
                        to,
                        from_at: a,
                        dst: NetTo::Dst(a),
                    });
                    partners.push(to);
                }
            } else if mine != from && owner == me {
                round.waits.push(sender);
                partners.push(sender);
            } else {
                continue;
            }
            rounds.push(round);
        }
    }
    let local = map.members(mine).len();
    Ok(finish(
        partners,
        rounds,
        after,
        count > 0 && mine != from && local > 1,
    ))
}

/// all_gather: each member's input goes once to every other node, to the member there of its
/// local index (modulo the node's size), then inside each node from the member that holds it.
/// `from_at` is relative to the member's input (`src`, or its block of `dst` in place).
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
    let mut r = 0u32;
    for (a, len) in chunks(0, count, chunk) {
        let index = next_round(&mut r)?;
        let mut round = Round {
            index,
            len,
            puts: Vec::new(),
            waits: senders.clone(),
            fold: None,
        };
        for k in (0..nodes).filter(|&k| k != mine) {
            let to = map.peer(k, l);
            round.puts.push(NetPut {
                to,
                from_at: a,
                dst: NetTo::Dst(me * count + a),
            });
            partners.push(to);
        }
        partners.extend(&senders);
        rounds.push(round);
    }
    let local = map.members(mine).len();
    Ok(finish(
        partners,
        rounds,
        after,
        count > 0 && (local > 1 || !in_place),
    ))
}

/// all_to_all, out of place: each share for a member of another node goes straight into its
/// `dst`; the shares of the node's members (this member's own included) are copied inside
/// the node.
pub(crate) fn all_to_all_sched(
    map: &NodeMap,
    me: usize,
    count: usize,
    chunk: usize,
) -> Result<NetSched> {
    let n = map.n_pes();
    let mine = map.node(me);
    let far: Vec<usize> = (0..n).filter(|&j| map.node(j) != mine).collect();
    let mut after = Vec::new();
    if count > 0 {
        for &m in map.members(mine) {
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
        let puts = far
            .iter()
            .map(|&j| NetPut {
                to: j,
                from_at: j * count + a,
                dst: NetTo::Dst(me * count + a),
            })
            .collect();
        rounds.push(Round {
            index,
            len,
            puts,
            waits: far.clone(),
            fold: None,
        });
    }
    let partners = if count > 0 { far } else { Vec::new() };
    Ok(finish(partners, rounds, after, count > 0))
}

/// A team spanning nodes as this PE runs its calls.
#[derive(Debug, Clone)]
pub(super) struct NetTeam {
    /// The whole team (barriers; its slot).
    pub dt: DeviceTeam,
    /// This PE's node's members of the team, on the team's slot.
    pub node: DeviceTeam,
    pub map: NodeMap,
    /// World PE of each member.
    pub members: Vec<usize>,
    pub me: usize,
}

impl NetTeam {
    /// A call's signatures: on the whole team (the cross-node rounds check it, with the
    /// caller's `algo`) and on this node's members (the node phase after the rounds, copies:
    /// no algorithm).
    #[allow(clippy::too_many_arguments)]
    fn sigs<T: Elem>(
        &self,
        kind: CollKind,
        op: Option<ReduceOp>,
        algo: Option<Algo>,
        in_place: bool,
        count: usize,
        aux: usize,
        src: &(impl AsSym<T> + ?Sized),
        dst: &(impl AsSym<T> + ?Sized),
    ) -> (CallSig, CallSig) {
        let sig = |algo, dt| call_sig::<T>(kind, op, algo, in_place, count, aux, src, dst, dt);
        (sig(algo, self.dt), sig(None, self.node))
    }
}

/// The node-local members of `members` (world PEs, team order) on node `k` of `map` as a
/// device team on `slot`, or an error when they are not evenly strided.
pub(super) fn node_team(
    map: &NodeMap,
    members: &[usize],
    me: usize,
    slot: i32,
) -> Result<DeviceTeam> {
    let k = map.node(me);
    let w: Vec<usize> = map.members(k).iter().map(|&i| members[i]).collect();
    let stride = if w.len() > 1 {
        w[1] as i64 - w[0] as i64
    } else {
        1
    };
    if stride <= 0 || w.windows(2).any(|p| p[1] as i64 - p[0] as i64 != stride) {
        return Err(Error::Team(format!(
            "GpuColl across nodes needs each node's members of the team evenly strided; \
             this PE's node holds world PEs {w:?}"
        )));
    }
    Ok(DeviceTeam {
        slot,
        my_index: map.local(me) as i32,
        size: w.len() as i32,
        start: w[0] as i32,
        stride: stride as i32,
    })
}

/// The cross-node state of a [`GpuColl`] whose world spans nodes.
pub(super) struct Net {
    /// Symmetric u64[team slots][2 · n_pes]: data signals, then ready arrivals, per world PE.
    pub sig: Sym<u64>,
    /// Symmetric scratch of reductions: [world PE][2][chunk bytes].
    pub scratch: Sym<u8>,
    /// Bytes of a scratch half ([`CollTuning::net_chunk_bytes`]).
    pub chunk: usize,
    /// Private u64[team slots][n_pes]: calls this PE has had with each PE on each slot.
    pub exp: DevBuf,
    pub f_round: Func,
}

#[repr(C)]
struct NetPuts {
    dst: [u64; NET_MAX],
    src: [u64; NET_MAX],
    pe: [i32; NET_MAX],
}

#[repr(C)]
struct NetWaits {
    pe: [i32; NET_MAX],
}

#[repr(C)]
struct NetSrcs {
    p: [u64; NET_MAX],
}

impl Net {
    /// Allocates the signal words and scratch (collective over the world: every PE calls it
    /// in the same order) and clears them; `slots` team slots, `n_pes` PEs.
    pub(super) fn new(
        g: &CudaPe<'_>,
        own: &RawStream,
        f_round: Func,
        chunk: usize,
        slots: usize,
    ) -> Result<Net> {
        let pe = g.pe_ref();
        let n = pe.n_pes();
        let words = mul(mul(slots, 2)?, n)?;
        let sig = pe.alloc::<u64>(words)?;
        let scratch = pe.alloc_aligned::<u8>(mul(mul(n, 2)?, chunk)?, 256)?;
        let exp = DevBuf::zeroed_on(own, mul(slots, n)? * 8)?;
        let sp = g.ptr(&sig)?;
        let b = g.backend();
        let _g = b.gpu.bind()?;
        // SAFETY: our own symmetric object's words, on our own stream, then synchronised; no
        // peer signals it before the constructor's closing barrier.
        ffi::check(
            unsafe { ffi::cu::cuMemsetD8Async(sp, 0, words * 8, own.raw) },
            "cuMemsetD8Async",
        )?;
        own.sync()?;
        Ok(Net {
            sig,
            scratch,
            chunk,
            exp,
            f_round,
        })
    }
}

impl GpuColl<'_> {
    /// The team as the cross-node paths see it, or `None` when every member is on this PE's
    /// node (the node-local paths).
    pub(super) fn net_team(&self, team: &Team, dt: DeviceTeam) -> Result<Option<NetTeam>> {
        let b = self.g.backend();
        if !team.members().iter().any(|&p| b.is_remote(p)) {
            return Ok(None);
        }
        if self.net.is_none() {
            return Err(Error::invalid(
                "internal: a team spanning nodes in a world without cross-node state",
            ));
        }
        let map = self.g.pe_ref().node_map(team);
        if map.n_nodes() > NET_MAX {
            return Err(ffi::err(format!(
                "GpuColl across nodes serves teams of at most {NET_MAX} nodes; this one spans {}",
                map.n_nodes()
            )));
        }
        let me = team.my_pe();
        let node = node_team(&map, team.members(), me, dt.slot)?;
        Ok(Some(NetTeam {
            dt,
            node,
            map,
            members: team.members().to_vec(),
            me,
        }))
    }

    /// An error for collective `what` on a team spanning nodes, which it does not serve.
    pub(super) fn net_refuse(&self, team: &Team, what: &str) -> Result<()> {
        let b = self.g.backend();
        match team.members().iter().find(|&&p| b.is_remote(p)) {
            Some(p) => Err(ffi::err(format!(
                "GpuColl::{what} is not supported on teams spanning nodes (PE {p} runs on \
                 another node); across nodes GpuColl serves all_reduce, all_gather, broadcast, \
                 all_to_all and barrier"
            ))),
            None => Ok(()),
        }
    }

    /// Elements per round of `T` ([`CollTuning::net_chunk_bytes`]).
    pub(super) fn net_chunk<T: Elem>(&self) -> usize {
        let chunk = self.net.as_ref().map_or(1, |n| n.chunk);
        (chunk / std::mem::size_of::<T>()).max(1)
    }

    /// The net fold kernel of `T` and `op` (checked by [`GpuColl::reduce_func`] first).
    pub(super) fn net_fold_func<T: Elem>(&self, op: ReduceOp) -> Result<Func> {
        self.reduce_func::<T>(op)?;
        self.typed[typed_index(T::KIND, op)][3]
            .ok_or_else(|| Error::invalid("no fold kernel for this type"))
    }

    /// Runs `sched`'s rounds on the stream: the ready handshake carrying the call's signature
    /// (`sig`, on the whole team), then each round's puts, waits and fold. `input`: where puts
    /// read (`from_at` elements on); `dst` the call's output (fold targets, `NetTo::Dst`
    /// offsets).
    pub(super) fn net_rounds(
        &self,
        s: &Stream,
        nt: &NetTeam,
        sched: &NetSched,
        (input, dst, es): (u64, u64, usize),
        fold: Option<Func>,
        sig: CallSig,
    ) -> Result<()> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| Error::invalid("internal: no cross-node state"))?;
        if sched.rounds.is_empty() {
            return Ok(());
        }
        let world = |m: usize| nt.members[m];
        if sched.partners.len() > NET_MAX
            || sched
                .rounds
                .iter()
                .any(|r| r.puts.len() > NET_MAX || r.waits.len() > NET_MAX)
        {
            return Err(ffi::err(format!(
                "GpuColl across nodes: more than {NET_MAX} partners of one PE in one call"
            )));
        }
        let ck = self.check(nt.dt, sig.pack()?)?;
        // The slot's skip flag: set by the first launch when a partner's call differs.
        let skip = self.err.ptr + ((ERR_SKIP + nt.dt.slot as usize) * 8) as u64;
        let n = self.n_pes;
        let sig = self.g.ptr(&net.sig)? + (nt.dt.slot as usize * 2 * n * 8) as u64;
        let exp = net.exp.ptr + (nt.dt.slot as usize * n * 8) as u64;
        let scratch = self.g.ptr(&net.scratch)?;
        let me_world = self.g.pe_ref().my_pe();
        let slot_of = |from: usize, parity: usize| ((from * 2 + parity) * net.chunk) as u64;
        let waits = |list: &[usize]| {
            let mut w = NetWaits { pe: [0; NET_MAX] };
            for (i, &m) in list.iter().enumerate() {
                w.pe[i] = world(m) as i32;
            }
            w
        };
        let no_puts = || NetPuts {
            dst: [0; NET_MAX],
            src: [0; NET_MAX],
            pe: [0; NET_MAX],
        };
        self.net_launch(
            s,
            net.f_round,
            (exp, sig, n, true, 0, 0),
            no_puts(),
            0,
            waits(&sched.partners),
            sched.partners.len(),
            (ck, skip),
        )?;
        for r in &sched.rounds {
            let bytes = r.len * es;
            let mut p = no_puts();
            for (i, put) in r.puts.iter().enumerate() {
                p.src[i] = input + (put.from_at * es) as u64;
                p.dst[i] = match put.dst {
                    NetTo::Dst(at) => dst + (at * es) as u64,
                    NetTo::Scratch(parity) => scratch + slot_of(me_world, parity),
                };
                p.pe[i] = world(put.to) as i32;
            }
            let w = waits(&r.waits);
            let args = (exp, sig, n, false, r.index, bytes as u64);
            let (np, nw) = (r.puts.len(), r.waits.len());
            self.net_launch(s, net.f_round, args, p, np, w, nw, (ck, skip))?;
            if let Some((at, srcs)) = &r.fold {
                let f = fold.ok_or_else(|| Error::invalid("internal: a fold without op"))?;
                let mut list = NetSrcs { p: [0; NET_MAX] };
                for (i, src) in srcs.iter().enumerate() {
                    list.p[i] = src.map_or(0, |(m, parity)| scratch + slot_of(world(m), parity));
                }
                let mut d = dst + (at * es) as u64;
                let (mut k, mut len, mut sk) = (srcs.len() as i32, r.len as u64, skip);
                let mut a = [
                    &mut d as *mut u64 as *mut std::ffi::c_void,
                    &mut list as *mut NetSrcs as *mut _,
                    &mut k as *mut i32 as *mut _,
                    &mut len as *mut u64 as *mut _,
                    &mut sk as *mut u64 as *mut _,
                ];
                let blocks = reduce_grid(bytes * srcs.len(), self.sms);
                // SAFETY: matches rshmemi_coll_net_fold_*(T*, rshmemi_net_srcs, int, u64,
                // const u64*): the range is a checked range of this PE's dst, the sources
                // scratch halves of `net.chunk` bytes holding at least `len` elements, `sk` a
                // word of our error record.
                unsafe { gpu::launch(&s.raw, f, blocks, THREADS, 0, &mut a)? };
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn net_launch(
        &self,
        s: &Stream,
        f: Func,
        (exp, sig, n, begin, round, bytes): (u64, u64, usize, bool, u32, u64),
        mut puts: NetPuts,
        np: usize,
        mut waits: NetWaits,
        nw: usize,
        (mut ck, mut skip): (Check, u64),
    ) -> Result<()> {
        let (mut e, mut sg, mut ni, mut b) = (exp, sig, n as i32, begin as i32);
        let (mut r, mut by, mut npi, mut nwi) = (round, bytes, np as i32, nw as i32);
        let mut a = [
            &mut e as *mut u64 as *mut std::ffi::c_void,
            &mut sg as *mut u64 as *mut _,
            &mut ni as *mut i32 as *mut _,
            &mut b as *mut i32 as *mut _,
            &mut r as *mut u32 as *mut _,
            &mut by as *mut u64 as *mut _,
            &mut puts as *mut NetPuts as *mut _,
            &mut npi as *mut i32 as *mut _,
            &mut waits as *mut NetWaits as *mut _,
            &mut nwi as *mut i32 as *mut _,
            &mut ck as *mut Check as *mut _,
            &mut skip as *mut u64 as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_net_round(u64*, u64*, int, int, unsigned, u64,
        // rshmemi_net_puts, int, rshmemi_net_waits, int, rshmemi_check, u64*) (repr(C) lists
        // of NET_MAX); `exp` and `sig` are this slot's rows of the net state, `ck` the slot's
        // signature row and our error record, `skip` the slot's skip flag in that record,
        // every put a checked range of a symmetric object (its destination translated by the
        // target's proxy).
        unsafe { gpu::launch(&s.raw, f, 1, 32, 0, &mut a) }
    }

    /// The node phase after the rounds: `after`'s copies between two barriers of the node's
    /// members, where the schedule has one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn net_after(
        &self,
        s: &Stream,
        nt: &NetTeam,
        sched: &NetSched,
        kind: CollKind,
        (src, dst, es): (u64, u64, usize),
        in_place: bool,
        sig: CallSig,
    ) -> Result<()> {
        if !sched.node_phase {
            return Ok(());
        }
        let mut steps = Vec::with_capacity(sched.after.len() + 2);
        steps.push(Step::Sync);
        steps.extend(sched.after.iter().copied());
        steps.push(Step::Sync);
        let plan = Plan {
            kind,
            algo: Algo::OneShot,
            shape: Shape {
                in_place,
                ..Self::shape(&nt.node, in_place)
            },
            temp_len: 0,
            steps,
            groups: Vec::new(),
        };
        self.exec(s, nt.node, &plan, src, dst, es, None, sig)
    }
}

impl GpuColl<'_> {
    /// [`GpuColl::all_reduce`] on a team spanning nodes: the node's partial by the node-local
    /// paths, each part folded over the nodes by its owners, then copied inside the node.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn net_all_reduce<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        algo: Option<Algo>,
    ) -> Result<()> {
        let f = self.net_fold_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let es = std::mem::size_of::<T>();
        let sched = all_reduce_sched(&nt.map, nt.me, count, self.net_chunk::<T>())?;
        if nt.node.size > 1 {
            self.all_reduce_on(s, nt.node, dst, src, count, op, algo)?;
        } else if !ip {
            self.g.copy_raw_on_stream(s, d, sr, count * es)?;
        }
        let (whole, sig) =
            nt.sigs::<T>(CollKind::AllReduce, Some(op), algo, ip, count, 0, src, dst);
        self.net_rounds(s, nt, &sched, (d, d, es), Some(f), whole)?;
        self.net_after(s, nt, &sched, CollKind::AllReduce, (sr, d, es), ip, sig)
    }

    /// [`GpuColl::broadcast`] on a team spanning nodes: the root's node by the node-local
    /// paths, then each part to its owner on every other node, then inside those nodes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn net_broadcast<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        root: usize,
    ) -> Result<()> {
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let es = std::mem::size_of::<T>();
        let sched = broadcast_sched(&nt.map, nt.me, root, count, self.net_chunk::<T>())?;
        if nt.map.node(nt.me) == nt.map.node(root) {
            if nt.node.size > 1 {
                let local = nt.map.local(root);
                self.broadcast_on(s, nt.node, dst, src, count, local)?;
            } else if !ip {
                self.g.copy_raw_on_stream(s, d, sr, count * es)?;
            }
        }
        let (whole, sig) = nt.sigs::<T>(CollKind::Broadcast, None, None, ip, count, root, src, dst);
        self.net_rounds(s, nt, &sched, (d, d, es), None, whole)?;
        self.net_after(s, nt, &sched, CollKind::Broadcast, (sr, d, es), ip, sig)
    }

    /// [`GpuColl::all_to_all`] on a team spanning nodes (out of place): the shares for other
    /// nodes' members through the proxy, then the node's own shares inside the node.
    pub(super) fn net_all_to_all<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let n = nt.members.len();
        if Self::in_place(src, dst)? {
            return Err(ffi::err(
                "GpuColl::all_to_all in place is not supported on teams spanning nodes (a \
                 member of another node may write a share before this member sent its own \
                 from the same place); use different src and dst",
            ));
        }
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let es = std::mem::size_of::<T>();
        let sched = all_to_all_sched(&nt.map, nt.me, count, self.net_chunk::<T>())?;
        let (whole, sig) = nt.sigs::<T>(CollKind::AllToAll, None, None, false, count, 0, src, dst);
        self.net_rounds(s, nt, &sched, (sr, d, es), None, whole)?;
        self.net_after(s, nt, &sched, CollKind::AllToAll, (sr, d, es), false, sig)
    }

    /// [`GpuColl::all_gather`] on a team spanning nodes: each input once to every other node,
    /// then inside each node.
    pub(super) fn net_all_gather<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        let n = nt.members.len();
        let ip = Self::in_place(src, dst)?;
        let d = self.buf(dst, mul(n, count)?)?;
        let sr = self.buf(src, if ip { mul(n, count)? } else { count })?;
        let es = std::mem::size_of::<T>();
        let input = if ip {
            d + (nt.me * count * es) as u64
        } else {
            sr
        };
        let sched = all_gather_sched(&nt.map, nt.me, count, self.net_chunk::<T>(), ip)?;
        let (whole, sig) = nt.sigs::<T>(CollKind::AllGather, None, None, ip, count, 0, src, dst);
        self.net_rounds(s, nt, &sched, (input, d, es), None, whole)?;
        self.net_after(s, nt, &sched, CollKind::AllGather, (sr, d, es), ip, sig)
    }
}
