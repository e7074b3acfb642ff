//! [`GpuColl`] on teams spanning nodes: the node's members by the node-local paths, the nodes
//! among each other through the proxy (DeepEP's and NCCL's hierarchy).
//!
//! A call on such a team runs in up to three phases on the stream (its schedule:
//! [`NetSched`], `net_sched.rs`):
//! 1. inside each node, the existing kernels on the node's members of the team (all_reduce:
//!    the node's partial into every member's `dst`; broadcast: the root's node gets the data;
//!    reduce and reduce_scatter: each part's node partial folded by its carrier);
//! 2. across nodes, rounds of puts with signals through the proxy: each member of a node
//!    carries a share (part `q` of the vector is carried by the node's member of local index
//!    `q % L`, as in [`NodeMap::peer`]), chunked through [`CollTuning::net_chunk_bytes`];
//!    reductions put each node's partial into the receiver's scratch slot of the sender's
//!    node and fold the nodes' partials in node order;
//! 3. inside each node, members copy the parts their node peers received (a plan of copies
//!    between two barriers, on the GPU plan executor).
//!
//! The node's members meet on the team's own barrier slot: device barrier counters count per
//! pair of PEs, so a barrier of a subset of the team keeps every pair in step.

use super::net_sched::*;
use super::*;
use crate::team::NodeMap;

/// Entries of a round launch's lists (partners, puts, waits, acknowledgements: longer lists
/// take several launches) and most nodes of a team (the fold kernel's sources), as
/// `RSHMEMI_NET_MAX`.
pub(super) const NET_MAX: usize = 64;
/// `begin` of the round kernel: post the ready arrivals, wait for them, add to the skip flag
/// (a later list of the same call) — `RSHMEMI_NET_POST`, `_WAIT`, `_MORE`.
const NET_POST: u32 = 1;
const NET_WAIT: u32 = 2;
const NET_MORE: u32 = 4;
/// Most members of a team spanning nodes in [`GpuColl::all_to_all_v_device`]: the words of a
/// count row each PE keeps per world PE (besides the GPU's own limit on the count matrix).
pub(super) const A2AVD_MAX_TEAM: usize = 256;

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
    /// Symmetric u64[team slots][3 · n_pes]: data signals, ready arrivals and fold
    /// acknowledgements, per world PE.
    pub sig: Sym<u64>,
    /// Symmetric scratch of reductions: [sender's node][2][chunk bytes].
    pub scratch: Sym<u8>,
    /// Bytes of a scratch half ([`CollTuning::net_chunk_bytes`]).
    pub chunk: usize,
    /// Scratch slots' nodes (the world's nodes).
    pub nodes: usize,
    /// Private u64[team slots][n_pes]: calls this PE has had with each PE on each slot.
    pub exp: DevBuf,
    /// Symmetric u64[n_pes][2]: what each PE expects of this one in all_to_all_v (where its
    /// data lands in that PE's `dst`, and how many elements), written by that PE.
    pub meta: Sym<u64>,
    /// Symmetric u64[team slots][n_pes][SIG_WORDS]: the signature rows of partners of other
    /// nodes for odd calls of the pair (the `GpuColl`'s own rows serve even ones).
    pub sig_alt: Sym<u64>,
    /// Symmetric u64[n_pes][row_stride]: all_to_all_v_device's count rows of the partners
    /// of other nodes, written by them before their ready arrival.
    pub rows: Sym<u64>,
    /// Words of a count row: `n_pes` up to [`A2AVD_MAX_TEAM`].
    pub row_stride: usize,
    /// Private u64[n_pes][3]: this PE's all_to_all_v_device puts to PEs of other nodes
    /// (where they land, where they start, elements), written by the count kernel.
    pub plan: DevBuf,
    pub f_round: Func,
    pub f_a2av: Func,
    pub f_a2avd: Func,
}

#[repr(C)]
struct NetPuts {
    dst: [u64; NET_MAX],
    src: [u64; NET_MAX],
    pe: [i32; NET_MAX],
    ack: [u32; NET_MAX],
}

#[repr(C)]
#[derive(Clone)]
pub(super) struct NetWaits {
    pub pe: [i32; NET_MAX],
}

#[repr(C)]
struct NetAcks {
    pe: [i32; NET_MAX],
    v: [u32; NET_MAX],
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
        (f_round, f_a2av, f_a2avd): (Func, Func, Func),
        chunk: usize,
        slots: usize,
    ) -> Result<Net> {
        let pe = g.pe_ref();
        let n = pe.n_pes();
        let words = mul(mul(slots, 3)?, n)?;
        let sig = pe.alloc::<u64>(words)?;
        let nodes = pe.node_map(pe.world_team()).n_nodes();
        let scratch = pe.alloc_aligned::<u8>(mul(mul(nodes, 2)?, chunk)?, 256)?;
        let exp = DevBuf::zeroed_on(own, mul(slots, n)? * 8)?;
        let meta = pe.alloc::<u64>(mul(n, 2)?)?;
        let alt_words = mul(mul(slots, n)?, SIG_WORDS)?;
        let sig_alt = pe.alloc::<u64>(alt_words)?;
        let row_stride = n.min(A2AVD_MAX_TEAM);
        let rows = pe.alloc::<u64>(mul(n, row_stride)?)?;
        let plan = DevBuf::zeroed_on(own, mul(n, 3)? * 8)?;
        let (sp, ap) = (g.ptr(&sig)?, g.ptr(&sig_alt)?);
        let b = g.backend();
        let _g = b.gpu.bind()?;
        for (p, w) in [(sp, words), (ap, alt_words)] {
            // SAFETY: our own symmetric objects' words, on our own stream, then synchronised;
            // no peer writes them before the constructor's closing barrier.
            ffi::check(
                unsafe { ffi::cu::cuMemsetD8Async(p, 0, w * 8, own.raw) },
                "cuMemsetD8Async",
            )?;
        }
        own.sync()?;
        Ok(Net {
            sig,
            scratch,
            chunk,
            nodes,
            exp,
            meta,
            sig_alt,
            rows,
            row_stride,
            plan,
            f_round,
            f_a2av,
            f_a2avd,
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

    /// The staging memory `sched` uses (0: none); the node phases' plans name the same
    /// (the largest buffer, which serves every size up to its own).
    fn net_temp(&self, s: &Stream, sched: &NetSched, es: usize) -> Result<u64> {
        if sched.temp_len == 0 {
            return Ok(0);
        }
        self.temp_addr(Some(s), mul(sched.temp_len, es)?)
    }

    /// Device addresses of team slot `dt.slot`'s cross-node state: its skip flag in this PE's
    /// error record, its rows of the signal words (data signals, ready arrivals, fold
    /// acknowledgements) and of the expected call counts.
    pub(super) fn net_rows(&self, net: &Net, dt: DeviceTeam) -> Result<(u64, u64, u64)> {
        let (slot, n) = (dt.slot as usize, self.n_pes);
        let skip = self.err.ptr + ((ERR_SKIP + slot) * 8) as u64;
        let sig = self.g.ptr(&net.sig)? + (slot * 3 * n * 8) as u64;
        let exp = net.exp.ptr + (slot * n * 8) as u64;
        Ok((skip, sig, exp))
    }

    /// Runs `sched`'s rounds on the stream: the ready handshake carrying the call's signature
    /// (`sig`, on the whole team), then each round's acknowledgements, puts, waits and fold.
    /// `src`/`dst`: the call's buffers (puts read [`NetSched::input`]; folds and
    /// `NetTo::Dst` write `dst`).
    pub(super) fn net_rounds(
        &self,
        s: &Stream,
        nt: &NetTeam,
        sched: &NetSched,
        (src, dst, es): (u64, u64, usize),
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
        if nt.map.n_nodes() > net.nodes {
            return Err(Error::invalid(
                "internal: a team of more nodes than the world's",
            ));
        }
        let world = |m: usize| nt.members[m];
        // Entries per launch list (NET_MAX; fewer in tests, to split small teams' calls).
        let list = self.net_list.clamp(1, NET_MAX);
        let input = match sched.input {
            Buf::Src => src,
            Buf::Dst => dst,
            Buf::Temp => self.net_temp(s, sched, es)?,
        };
        let ck = self.check(nt.dt, sig.pack()?)?;
        // The slot's skip flag: set by the first launch when a partner's call differs.
        let (skip, sig, exp) = self.net_rows(net, nt.dt)?;
        let n = self.n_pes;
        let scratch = self.g.ptr(&net.scratch)?;
        let slot_of = |node: usize, parity: usize| -> Result<u64> {
            if node >= net.nodes {
                return Err(Error::invalid(
                    "internal: a scratch slot past the world's nodes",
                ));
            }
            Ok(((node * 2 + parity) * net.chunk) as u64)
        };
        let waits = |l: &[usize]| {
            let mut w = NetWaits { pe: [0; NET_MAX] };
            for (i, &m) in l.iter().enumerate() {
                w.pe[i] = world(m) as i32;
            }
            (w, l.len())
        };
        let no_puts = || NetPuts {
            dst: [0; NET_MAX],
            src: [0; NET_MAX],
            pe: [0; NET_MAX],
            ack: [0; NET_MAX],
        };
        let no_acks = || NetAcks {
            pe: [0; NET_MAX],
            v: [0; NET_MAX],
        };
        let launch = |begin: u32, round: u32, bytes: usize, p, w, a| {
            let args = (exp, sig, n, begin, round, bytes as u64);
            self.net_launch(s, net.f_round, args, p, w, a, (ck, skip, 0))
        };
        self.net_ready(s, nt, &sched.partners, ck, skip, false)?;
        for r in &sched.rounds {
            let bytes = r.len * es;
            for l in round_launches(r, list) {
                let mut p = no_puts();
                for (i, put) in r.puts[l.puts.clone()].iter().enumerate() {
                    p.src[i] = input + (put.from_at * es) as u64;
                    p.dst[i] = match put.dst {
                        NetTo::Dst(at) => dst + (at * es) as u64,
                        NetTo::Scratch { node, parity } => scratch + slot_of(node, parity)?,
                    };
                    p.pe[i] = world(put.to) as i32;
                    p.ack[i] = put.ack;
                }
                let mut a = no_acks();
                for (i, &(m, v)) in r.acks[l.acks.clone()].iter().enumerate() {
                    a.pe[i] = world(m) as i32;
                    a.v[i] = v;
                }
                let (np, na) = (l.puts.len(), l.acks.len());
                let w = waits(&r.waits[l.waits]);
                launch(0, r.index, bytes, (p, np), w, (a, na))?;
            }
            if let Some((at, srcs)) = &r.fold {
                let f = fold.ok_or_else(|| Error::invalid("internal: a fold without op"))?;
                let mut list = NetSrcs { p: [0; NET_MAX] };
                for (i, src) in srcs.iter().enumerate() {
                    list.p[i] = match *src {
                        None => 0,
                        Some((node, parity)) => scratch + slot_of(node, parity)?,
                    };
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
                // scratch halves of `net.chunk` bytes holding at least `len` elements (at most
                // NET_MAX: the team's nodes, checked by net_team), `sk` a word of our error
                // record.
                unsafe { gpu::launch(&s.raw, f, blocks, THREADS, 0, &mut a)? };
            }
        }
        Ok(())
    }

    /// The ready handshake of a call with `partners` (members), carrying the call's
    /// signature (`ck`): a partner's memory is written only after its arrival. `add`: a
    /// difference adds to the skip flag that the call's node barrier set, instead of setting it.
    pub(super) fn net_ready(
        &self,
        s: &Stream,
        nt: &NetTeam,
        partners: &[usize],
        ck: Check,
        skip: u64,
        add: bool,
    ) -> Result<()> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| Error::invalid("internal: no cross-node state"))?;
        let n = self.n_pes;
        let (_, sig, exp) = self.net_rows(net, nt.dt)?;
        let list = self.net_list.clamp(1, NET_MAX);
        let alt = self.g.ptr(&net.sig_alt)? + (nt.dt.slot as usize * n * SIG_WORDS * 8) as u64;
        for l in ready_launches(partners.len(), list) {
            let more = l.more || add;
            let flags = [(l.post, NET_POST), (l.wait, NET_WAIT), (more, NET_MORE)];
            let begin = flags.iter().filter(|f| f.0).fold(0, |b, f| b | f.1);
            let mut w = NetWaits { pe: [0; NET_MAX] };
            for (i, &m) in partners[l.range.clone()].iter().enumerate() {
                w.pe[i] = nt.members[m] as i32;
            }
            let puts = NetPuts {
                dst: [0; NET_MAX],
                src: [0; NET_MAX],
                pe: [0; NET_MAX],
                ack: [0; NET_MAX],
            };
            let acks = NetAcks {
                pe: [0; NET_MAX],
                v: [0; NET_MAX],
            };
            let args = (exp, sig, n, begin, 0, 0);
            let w = (w, l.range.len());
            let cs = (ck, skip, alt);
            self.net_launch(s, net.f_round, args, (puts, 0), w, (acks, 0), cs)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn net_launch(
        &self,
        s: &Stream,
        f: Func,
        (exp, sig, n, begin, round, bytes): (u64, u64, usize, u32, u32, u64),
        (mut puts, np): (NetPuts, usize),
        (mut waits, nw): (NetWaits, usize),
        (mut acks, na): (NetAcks, usize),
        (mut ck, mut skip, mut alt): (Check, u64, u64),
    ) -> Result<()> {
        let (mut e, mut sg, mut ni, mut b) = (exp, sig, n as i32, begin as i32);
        let (mut r, mut by, mut npi, mut nwi, mut nai) =
            (round, bytes, np as i32, nw as i32, na as i32);
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
            &mut acks as *mut NetAcks as *mut _,
            &mut nai as *mut i32 as *mut _,
            &mut ck as *mut Check as *mut _,
            &mut skip as *mut u64 as *mut _,
            &mut alt as *mut u64 as *mut _,
        ];
        // SAFETY: matches rshmemi_coll_net_round(u64*, u64*, int, int, unsigned, u64,
        // rshmemi_net_puts, int, rshmemi_net_waits, int, rshmemi_net_acks, int, rshmemi_check,
        // u64*, u64*) (repr(C) lists of NET_MAX); `exp` and `sig` are this slot's rows of the
        // net state, `ck` the slot's signature rows and our error record, `skip` the slot's
        // skip flag in that record, `alt` the slot's second signature rows (as many), every
        // put a checked range of a symmetric object or of our staging (its destination
        // translated by the target's proxy).
        unsafe { gpu::launch(&s.raw, f, 1, 32, 0, &mut a) }
    }

    /// A node phase: `steps` between two barriers of the node's members (`sync`), or, without
    /// them, copies inside this member's own buffers.
    #[allow(clippy::too_many_arguments)]
    fn net_node_phase(
        &self,
        s: &Stream,
        nt: &NetTeam,
        sched: &NetSched,
        (sync, steps): (bool, &[Step]),
        kind: CollKind,
        (src, dst, es): (u64, u64, usize),
        (in_place, reduce): (bool, Option<Func>),
        sig: CallSig,
    ) -> Result<()> {
        if !sync {
            let temp = self.net_temp(s, sched, es)?;
            for st in steps {
                let Step::Copy {
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                    ..
                } = *st
                else {
                    return Err(Error::invalid("internal: a node step without barriers"));
                };
                let at = |b: Buf, i: usize| {
                    (match b {
                        Buf::Src => src,
                        Buf::Dst => dst,
                        Buf::Temp => temp,
                    }) + (i * es) as u64
                };
                let (d, f) = (at(to, to_at), at(from, from_at));
                if len > 0 && d != f {
                    self.g.copy_raw_on_stream(s, d, f, len * es)?;
                }
            }
            return Ok(());
        }
        let mut all = Vec::with_capacity(steps.len() + 2);
        all.push(Step::Sync);
        all.extend(steps.iter().copied());
        all.push(Step::Sync);
        let plan = Plan {
            kind,
            algo: Algo::OneShot,
            shape: Shape {
                in_place,
                ..Self::shape(&nt.node, in_place)
            },
            temp_len: sched.temp_len,
            steps: all,
            groups: Vec::new(),
        };
        // The staging the rounds use, before the plan asks for it (the same buffer).
        self.net_temp(s, sched, es)?;
        self.exec(s, nt.node, &plan, src, dst, es, reduce, sig)
    }

    /// The node phase before the rounds, where the schedule has one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn net_before(
        &self,
        s: &Stream,
        nt: &NetTeam,
        sched: &NetSched,
        kind: CollKind,
        bufs: (u64, u64, usize),
        mode: (bool, Option<Func>),
        sig: CallSig,
    ) -> Result<()> {
        if sched.before.is_empty() && !sched.before_phase {
            return Ok(());
        }
        let steps = (sched.before_phase, &sched.before[..]);
        self.net_node_phase(s, nt, sched, steps, kind, bufs, mode, sig)
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
        bufs: (u64, u64, usize),
        in_place: bool,
        sig: CallSig,
    ) -> Result<()> {
        if !sched.node_phase {
            return Ok(());
        }
        let steps = (true, &sched.after[..]);
        self.net_node_phase(s, nt, sched, steps, kind, bufs, (in_place, None), sig)
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
        self.net_rounds(s, nt, &sched, (sr, d, es), Some(f), whole)?;
        self.net_after(s, nt, &sched, CollKind::AllReduce, (sr, d, es), ip, sig)
    }

    /// [`GpuColl::reduce`] on a team spanning nodes: each part's node partial folded by its
    /// carrier on every node but the root's (into staging), the root's node folded by the
    /// root, then the other nodes' partials folded into the root's `dst` in node order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn net_reduce<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let f = self.net_fold_func::<T>(op)?;
        let r = self.reduce_func::<T>(op)?;
        let (d, sr) = (self.buf(dst, count)?, self.buf(src, count)?);
        let ip = Self::in_place(src, dst)?;
        let es = std::mem::size_of::<T>();
        let chunk = self.net_chunk::<T>();
        let sched = reduce_sched(&nt.map, nt.me, root, count, chunk, ip)?;
        let kind = CollKind::Reduce;
        let (whole, sig) = nt.sigs::<T>(kind, Some(op), None, ip, count, root, src, dst);
        self.net_before(s, nt, &sched, kind, (sr, d, es), (ip, Some(r)), sig)?;
        self.net_rounds(s, nt, &sched, (sr, d, es), Some(f), whole)
    }

    /// [`GpuColl::reduce_scatter`] on a team spanning nodes: each block's node partial folded
    /// by its carrier on every node, then the carriers' partials folded by the block's member
    /// in node order.
    pub(super) fn net_reduce_scatter<T: Elem>(
        &self,
        s: &Stream,
        nt: &NetTeam,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let f = self.net_fold_func::<T>(op)?;
        let r = self.reduce_func::<T>(op)?;
        let n = nt.members.len();
        let ip = Self::in_place(src, dst)?;
        let sr = self.buf(src, mul(n, count)?)?;
        let d = self.buf(dst, if ip { mul(n, count)? } else { count })?;
        let es = std::mem::size_of::<T>();
        let chunk = self.net_chunk::<T>();
        let sched = reduce_scatter_sched(&nt.map, nt.me, count, chunk, ip)?;
        let kind = CollKind::ReduceScatter;
        let (whole, sig) = nt.sigs::<T>(kind, Some(op), None, ip, count, 0, src, dst);
        self.net_before(s, nt, &sched, kind, (sr, d, es), (ip, Some(r)), sig)?;
        self.net_rounds(s, nt, &sched, (sr, d, es), Some(f), whole)
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
        self.net_rounds(s, nt, &sched, (sr, d, es), None, whole)?;
        self.net_after(s, nt, &sched, CollKind::Broadcast, (sr, d, es), ip, sig)
    }

    /// [`GpuColl::all_to_all`] on a team spanning nodes: the shares for other nodes' members
    /// through the proxy (in place: from a staged copy), then the node's own shares inside
    /// the node.
    pub(super) fn net_all_to_all<T: Elem>(
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
        let sr = self.buf(src, mul(n, count)?)?;
        let es = std::mem::size_of::<T>();
        let sched = all_to_all_sched(&nt.map, nt.me, count, self.net_chunk::<T>(), ip)?;
        let kind = CollKind::AllToAll;
        let (whole, sig) = nt.sigs::<T>(kind, None, None, ip, count, 0, src, dst);
        self.net_before(s, nt, &sched, kind, (sr, d, es), (ip, None), sig)?;
        self.net_rounds(s, nt, &sched, (sr, d, es), None, whole)?;
        self.net_after(s, nt, &sched, kind, (sr, d, es), ip, sig)
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
        let sched = all_gather_sched(&nt.map, nt.me, count, self.net_chunk::<T>(), ip)?;
        let (whole, sig) = nt.sigs::<T>(CollKind::AllGather, None, None, ip, count, 0, src, dst);
        self.net_rounds(s, nt, &sched, (sr, d, es), None, whole)?;
        self.net_after(s, nt, &sched, CollKind::AllGather, (sr, d, es), ip, sig)
    }
}
