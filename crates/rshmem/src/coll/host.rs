//! The host API and the host executor: argument checks, the argument exchange that turns a bad
//! argument on one member into an error on all, and a plan run with get/put/team_sync.

use super::plan::{self, Algo, Buf, CollKind, Plan, Shape, Step, VRecv};
use super::reduce::{combine, ReduceOp, ToRoot};
use super::CollConfig;
use crate::elem::Elem;
use crate::error::{Error, Result};
use crate::pe::Pe;
use crate::sym::{AsSym, RawSym, Sym};
use crate::team::Team;
use std::marker::PhantomData;

/// Words of the argument record compared across members.
const H_CMP: usize = 12;
/// Word of the record that says whether this member's arguments passed its local checks.
const H_STATUS: usize = 11;
/// Word of the all_to_all_v pairing verdict (not compared).
const H_FLAG: usize = 15;
/// Words before the all_to_all_v arrays.
const H_WORDS: usize = 16;

/// Per-peer counts and displacements (elements) of an all_to_all_v, indexed by team member.
///
/// Member `i` sends `send_counts[j]` elements from `src[send_displs[j]..]` to member `j`, which
/// receives them into `dst[recv_displs[i]..]`; `recv_counts[i]` on member `j` must equal
/// `send_counts[j]` on member `i` (checked: a mismatch is an error on every member). Receive
/// ranges must not overlap each other.
#[derive(Debug, Clone, Copy)]
pub struct AllToAllV<'a> {
    /// Elements sent to each member.
    pub send_counts: &'a [usize],
    /// Where in `src` the elements for each member start.
    pub send_displs: &'a [usize],
    /// Elements received from each member.
    pub recv_counts: &'a [usize],
    /// Where in `dst` the elements from each member go.
    pub recv_displs: &'a [usize],
}

impl AllToAllV<'_> {
    /// Checks that the four arrays have `n` entries and that every (displacement, count) lies
    /// in its object (`src_len` / `dst_len` elements); returns the receive ranges.
    pub(crate) fn check(
        &self,
        n: usize,
        src_len: usize,
        dst_len: usize,
    ) -> Result<Vec<(usize, usize)>> {
        for (what, s) in [
            ("send_counts", self.send_counts),
            ("send_displs", self.send_displs),
            ("recv_counts", self.recv_counts),
            ("recv_displs", self.recv_displs),
        ] {
            if s.len() != n {
                return Err(Error::LengthMismatch {
                    what,
                    got: s.len(),
                    expected: n,
                });
            }
        }
        let range = |at: usize, cnt: usize, len: usize| -> Result<(usize, usize)> {
            match at.checked_add(cnt) {
                Some(end) if end <= len => Ok((at, end)),
                end => Err(Error::OutOfBounds {
                    start: at,
                    end: end.unwrap_or(usize::MAX),
                    len,
                }),
            }
        };
        for j in 0..n {
            range(self.send_displs[j], self.send_counts[j], src_len)?;
        }
        (0..n)
            .map(|j| range(self.recv_displs[j], self.recv_counts[j], dst_len))
            .collect()
    }
}

/// Collectives of one PE: the configuration and the symmetric scratch for argument exchange.
/// See the [module documentation](super) for the contract.
///
/// Every call goes through the one scratch object, so a `Coll` serves one thread at a time: it
/// is `Send` but not `Sync`. Threads of a PE that run collectives concurrently (on different
/// teams) use one `Coll` each.
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<rshmem::coll::Coll<'static>>();
/// ```
#[derive(Debug)]
pub struct Coll<'pe> {
    pe: &'pe Pe,
    scratch: Sym<u64>,
    config: CollConfig,
    /// Not `Sync`: concurrent calls would overwrite each other's argument records.
    _one_thread: PhantomData<std::cell::Cell<()>>,
}

/// A symmetric range named by its raw identity (the executor's view of `src` and `dst`).
struct Raw<T>(RawSym, PhantomData<fn() -> T>);
impl<T: Elem> AsSym<T> for Raw<T> {
    fn raw(&self) -> RawSym {
        self.0
    }
}

/// One collective call as every member describes it.
struct Call<'a> {
    kind: CollKind,
    op: Option<ReduceOp>,
    root: usize,
    count: usize,
    src: RawSym,
    dst: RawSym,
    v: Option<&'a AllToAllV<'a>>,
}

fn need(len: usize, what: usize) -> Result<()> {
    if what > len {
        return Err(Error::OutOfBounds {
            start: 0,
            end: what,
            len,
        });
    }
    Ok(())
}

fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(format!("{a} × {b} elements overflow")))
}

fn team_hash(team: &Team) -> u64 {
    team.members()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &m| {
            (h ^ m as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

impl<'pe> Coll<'pe> {
    /// Sets up the collectives of `pe`: allocates the scratch ([`scratch_bytes`](Self::scratch_bytes)),
    /// a collective over the world like [`Pe::alloc`].
    pub fn new(pe: &'pe Pe, config: CollConfig) -> Result<Coll<'pe>> {
        if config.chunk_bytes == 0 {
            return Err(Error::invalid(
                "collective chunk size must be at least 1 byte",
            ));
        }
        let scratch = pe.alloc::<u64>(H_WORDS + 2 * pe.n_pes())?;
        tracing::debug!(
            pe = pe.my_pe(),
            bytes = scratch.len() * 8,
            ?config,
            "collectives ready"
        );
        Ok(Coll {
            pe,
            scratch,
            config,
            _one_thread: PhantomData,
        })
    }

    /// Bytes of symmetric scratch this object holds on every PE: `8·(16 + 2·n_pes)`.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.len() * 8
    }

    /// The configuration in force.
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// The PE these collectives belong to.
    pub fn pe(&self) -> &'pe Pe {
        self.pe
    }

    /// Barrier of the team's members (after completing this PE's outstanding operations).
    pub fn barrier(&self, team: &Team) -> Result<()> {
        self.pe.team_barrier(team)
    }

    /// Copies `count` elements of member `root`'s `src` into every member's `dst`
    /// (the root's too; in place when `src` and `dst` are the same object).
    pub fn broadcast<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        root: usize,
    ) -> Result<()> {
        self.run::<T>(
            team,
            self.call(CollKind::Broadcast, None, root, count, src, dst),
        )
    }

    /// Folds every member's `src[..count]` with `to.op` into member `to.root`'s
    /// `dst[..count]`; other members' `dst` is not written.
    pub fn reduce<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        to: ToRoot,
    ) -> Result<()> {
        let ToRoot { op, root } = to;
        self.run::<T>(
            team,
            self.call(CollKind::Reduce, Some(op), root, count, src, dst),
        )
    }

    /// Folds every member's `src[..count]` with `op` into every member's `dst[..count]`.
    pub fn all_reduce<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.run::<T>(
            team,
            self.call(CollKind::AllReduce, Some(op), 0, count, src, dst),
        )
    }

    /// Member `i`'s `src[..count]` into every member's `dst[i·count..(i+1)·count]`; in place
    /// member `i`'s input is `dst[i·count..]`.
    pub fn all_gather<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        self.run::<T>(
            team,
            self.call(CollKind::AllGather, None, 0, count, src, dst),
        )
    }

    /// Folds every member's `src[i·count..(i+1)·count]` with `op` into member `i`'s
    /// `dst[..count]` (in place: `dst[i·count..]`).
    pub fn reduce_scatter<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.run::<T>(
            team,
            self.call(CollKind::ReduceScatter, Some(op), 0, count, src, dst),
        )
    }

    /// Member `i`'s `src[j·count..(j+1)·count]` into member `j`'s `dst[i·count..]`.
    pub fn all_to_all<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        count: usize,
    ) -> Result<()> {
        self.run::<T>(
            team,
            self.call(CollKind::AllToAll, None, 0, count, src, dst),
        )
    }

    /// All-to-all with per-pair counts and displacements (see [`AllToAllV`]).
    pub fn all_to_all_v<T: Elem>(
        &self,
        team: &Team,
        dst: &(impl AsSym<T> + ?Sized),
        src: &(impl AsSym<T> + ?Sized),
        v: &AllToAllV<'_>,
    ) -> Result<()> {
        let mut call = self.call(CollKind::AllToAllV, None, 0, 0, src, dst);
        call.v = Some(v);
        self.run::<T>(team, call)
    }

    fn call<'a, T: Elem>(
        &self,
        kind: CollKind,
        op: Option<ReduceOp>,
        root: usize,
        count: usize,
        src: &(impl AsSym<T> + ?Sized),
        dst: &(impl AsSym<T> + ?Sized),
    ) -> Call<'a> {
        Call {
            kind,
            op,
            root,
            count,
            src: src.raw(),
            dst: dst.raw(),
            v: None,
        }
    }

    /// This member's checks of its own arguments; returns "in place".
    fn check_local<T: Elem>(&self, team: &Team, c: &Call<'_>) -> Result<bool> {
        let pe = self.pe;
        for r in [c.src, c.dst] {
            if r.job != pe.inner.job {
                return Err(Error::WorldEnded);
            }
            if r.owner != pe.my_pe() {
                return Err(Error::invalid(format!(
                    "symmetric object handle belongs to PE {}, used by PE {}",
                    r.owner,
                    pe.my_pe()
                )));
            }
        }
        let in_place = c.src.offset == c.dst.offset && c.src.len == c.dst.len;
        if !in_place && c.src.overlaps(&c.dst, std::mem::size_of::<T>()) {
            return Err(Error::invalid(format!(
                "{}: source and destination partially overlap (in place needs the same object)",
                c.kind.name()
            )));
        }
        if let Some(op) = c.op {
            op.check(T::KIND)?;
        }
        let n = team.n_pes();
        if matches!(c.kind, CollKind::Broadcast | CollKind::Reduce) && c.root >= n {
            return Err(Error::PeOutOfRange {
                pe: c.root,
                n_pes: n,
                what: "team",
            });
        }
        let (sl, dl) = (c.src.len, c.dst.len);
        match c.kind {
            CollKind::Broadcast | CollKind::Reduce | CollKind::AllReduce => {
                need(sl, c.count)?;
                need(dl, c.count)?;
            }
            CollKind::AllGather => {
                need(sl, if in_place { 0 } else { c.count })?;
                need(dl, mul(n, c.count)?)?;
            }
            CollKind::ReduceScatter => {
                need(sl, mul(n, c.count)?)?;
                need(dl, if in_place { 0 } else { c.count })?;
            }
            CollKind::AllToAll => {
                need(sl, mul(n, c.count)?)?;
                need(dl, mul(n, c.count)?)?;
            }
            CollKind::AllToAllV => {
                let v =
                    c.v.ok_or_else(|| Error::invalid("internal: all_to_all_v without counts"))?;
                let mut recv = v.check(n, sl, dl)?;
                recv.retain(|(a, b)| a < b);
                recv.sort_unstable();
                if let Some(w) = recv.windows(2).find(|w| w[0].1 > w[1].0) {
                    return Err(Error::invalid(format!(
                        "all_to_all_v: receive ranges {}..{} and {}..{} overlap",
                        w[0].0, w[0].1, w[1].0, w[1].1
                    )));
                }
            }
        }
        Ok(in_place)
    }

    fn record<T: Elem>(
        team: &Team,
        c: &Call<'_>,
        algo: Algo,
        hier: bool,
        ok: bool,
    ) -> [u64; H_CMP] {
        let mut h = [0u64; H_CMP];
        h[0] = c.kind.code();
        h[1] = T::KIND as u64 + 1;
        h[2] = c.op.map_or(0, ReduceOp::code);
        h[3] = c.root as u64;
        h[4] = c.count as u64;
        h[5] = c.src.offset as u64;
        h[6] = c.src.len as u64;
        h[7] = c.dst.offset as u64;
        h[8] = c.dst.len as u64;
        h[9] = algo.code() | u64::from(hier) << 8;
        h[10] = team_hash(team);
        h[H_STATUS] = u64::from(!ok);
        h
    }

    /// Checks, exchanges and compares the arguments, then runs the plan on the host.
    fn run<T: Elem>(&self, team: &Team, c: Call<'_>) -> Result<()> {
        let p = self.prepare::<T>(team, &c)?;
        self.execute::<T>(team, &c, &p)
    }

    /// Everything before data moves, for any executor: this member's checks, the exchange of
    /// every member's arguments (the plan's first sync), the common verdict, the plan.
    fn prepare<T: Elem>(&self, team: &Team, c: &Call<'_>) -> Result<Plan> {
        let pe = self.pe;
        if team.members().get(team.my_pe()) != Some(&pe.my_pe()) {
            return Err(Error::Team(format!(
                "PE {} is not a member of this team",
                pe.my_pe()
            )));
        }
        let (n, me) = (team.n_pes(), team.my_pe());
        let local = self.check_local::<T>(team, c);
        let algo = self
            .config
            .choose(c.kind, c.count.saturating_mul(std::mem::size_of::<T>()));
        let nodes = pe.node_map(team);
        let bytes = c.count.saturating_mul(std::mem::size_of::<T>());
        let hier = self.config.is_hierarchical(c.kind, bytes, &nodes);
        let rec = Self::record::<T>(team, c, algo, hier, local.is_ok());
        pe.quiet()?;
        pe.local_write(&self.scratch, 0, &rec)?;
        if let (Some(v), Ok(_)) = (c.v, &local) {
            let words: Vec<u64> = v
                .send_counts
                .iter()
                .chain(v.send_displs)
                .map(|&x| x as u64)
                .collect();
            pe.local_write(&self.scratch, H_WORDS, &words)?;
        }
        pe.team_sync_as(team, c.kind.call())?; // plan step 0
        let verdict = self.compare(team, c, &rec, local);
        let in_place = match verdict {
            Ok(p) => p,
            Err(e) => {
                // Every member reached the same verdict; wait until all have read the records.
                pe.team_sync_as(team, c.kind.call())?;
                return Err(e);
            }
        };
        let shape = Shape {
            n,
            me,
            in_place,
            chunk: self.config.chunk_elems(std::mem::size_of::<T>()),
        };
        let p = match c.kind {
            CollKind::Broadcast if hier => plan::hier::broadcast(shape, &nodes, c.root, c.count),
            CollKind::AllReduce if hier => plan::hier::all_reduce(shape, &nodes, c.count),
            CollKind::AllGather if hier => plan::hier::all_gather(shape, &nodes, c.count),
            CollKind::ReduceScatter if hier && in_place => {
                plan::hier::reduce_scatter(shape, &nodes, c.count)
            }
            CollKind::Broadcast => plan::broadcast(shape, c.root, c.count, algo),
            CollKind::Reduce => plan::reduce(shape, c.root, c.count),
            CollKind::AllReduce => plan::all_reduce(shape, c.count, algo),
            CollKind::AllGather => plan::all_gather(shape, c.count),
            CollKind::ReduceScatter => plan::reduce_scatter(shape, c.count),
            CollKind::AllToAll => plan::all_to_all(shape, c.count),
            CollKind::AllToAllV => plan::all_to_all_v(shape, &self.pair_v(team, c)?),
        };
        tracing::trace!(
            pe = pe.my_pe(),
            kind = c.kind.name(),
            ?algo,
            hier,
            steps = p.steps.len(),
            "collective"
        );
        Ok(p)
    }

    /// Reads every member's record; the same verdict on every member.
    fn compare(
        &self,
        team: &Team,
        c: &Call<'_>,
        rec: &[u64; H_CMP],
        local: Result<bool>,
    ) -> Result<bool> {
        let pe = self.pe;
        let mut all = vec![[0u64; H_CMP]; team.n_pes()];
        for (i, r) in all.iter_mut().enumerate() {
            pe.get(&self.scratch, 0, r, team.members()[i])?;
        }
        let in_place = local?;
        if let Some(i) = all.iter().position(|r| r[H_STATUS] != 0) {
            return Err(Error::invalid(format!(
                "{}: team member {i} (PE {}) passed invalid arguments",
                c.kind.name(),
                team.members()[i]
            )));
        }
        if let Some(i) = all.iter().position(|r| r != rec) {
            let show = |r: &[u64; H_CMP]| {
                // The element type is stored plus one, so that 0 means no record.
                let elem = r[1]
                    .checked_sub(1)
                    .map_or_else(|| "none".into(), crate::elem::ElemKind::tag_name);
                format!(
                    "kind {} type {elem} op {} root {} count {} src {}+{} dst {}+{} algo {} team {:x}",
                    r[0], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]
                )
            };
            return Err(Error::CollectiveMismatch {
                op: c.kind.name(),
                pe: team.members()[i],
                mine: show(rec),
                theirs: show(&all[i]),
            });
        }
        Ok(in_place)
    }

    /// all_to_all_v: reads what each member sends here, checks it against what this member
    /// expects, and agrees with every member on the verdict (one more sync).
    fn pair_v(&self, team: &Team, c: &Call<'_>) -> Result<Vec<VRecv>> {
        let pe = self.pe;
        let v =
            c.v.ok_or_else(|| Error::invalid("internal: all_to_all_v without counts"))?;
        let (n, me) = (team.n_pes(), team.my_pe());
        let mut recv = Vec::with_capacity(n);
        let mut bad: Option<(usize, usize, usize)> = None;
        for i in 0..n {
            let w = team.members()[i];
            let count = pe.g(&self.scratch, H_WORDS + me, w)? as usize;
            let src_at = pe.g(&self.scratch, H_WORDS + n + me, w)? as usize;
            if count != v.recv_counts[i] && bad.is_none() {
                bad = Some((i, count, v.recv_counts[i]));
            }
            recv.push(VRecv {
                count,
                src_at,
                dst_at: v.recv_displs[i],
            });
        }
        pe.local_write(&self.scratch, H_FLAG, &[u64::from(bad.is_some())])?;
        pe.team_sync_as(team, c.kind.call())?;
        if let Some((i, sent, expected)) = bad {
            return Err(Error::invalid(format!(
                "all_to_all_v: team member {i} (PE {}) sends {sent} elements to member {me}, which expects {expected}",
                team.members()[i]
            )));
        }
        for i in 0..n {
            if pe.g(&self.scratch, H_FLAG, team.members()[i])? != 0 {
                return Err(Error::invalid(format!(
                    "all_to_all_v: team member {i} (PE {}) found counts that do not pair up",
                    team.members()[i]
                )));
            }
        }
        Ok(recv)
    }

    /// The host executor: runs a prepared plan (its first sync is done) with get, put and
    /// team_sync, staging through about two chunks of private memory plus `temp_len`.
    fn execute<T: Elem>(&self, team: &Team, c: &Call<'_>, p: &Plan) -> Result<()> {
        let pe = self.pe;
        let members = team.members();
        let n = members.len();
        let me = pe.my_pe();
        let src = Raw::<T>(c.src, PhantomData);
        let dst = Raw::<T>(c.dst, PhantomData);
        let sym = |b: Buf| if b == Buf::Src { &src } else { &dst };
        let mut temp = vec![T::ZERO; p.temp_len];
        let mut stage: Vec<T> = Vec::new();
        let mut rows: Vec<T> = Vec::new();
        let mut out: Vec<T> = Vec::new();
        let internal = |what: &str| Error::invalid(format!("internal: bad plan step ({what})"));
        for step in p.steps.iter().skip(1) {
            match *step {
                Step::Sync => pe.team_sync_as(team, c.kind.call())?,
                Step::Copy {
                    peer,
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    let w = *members.get(peer).ok_or_else(|| internal("peer"))?;
                    match (from, to) {
                        (Buf::Temp, Buf::Temp) => return Err(internal("temp to temp")),
                        (Buf::Temp, _) => {
                            let s = temp
                                .get(from_at..from_at + len)
                                .ok_or_else(|| internal("temp range"))?;
                            pe.put(sym(to), to_at, s, me)?;
                        }
                        (_, Buf::Temp) => {
                            let d = temp
                                .get_mut(to_at..to_at + len)
                                .ok_or_else(|| internal("temp range"))?;
                            pe.get(sym(from), from_at, d, w)?;
                        }
                        _ => {
                            stage.resize(len, T::ZERO);
                            pe.get(sym(from), from_at, &mut stage, w)?;
                            pe.put(sym(to), to_at, &stage, me)?;
                        }
                    }
                }
                Step::Reduce {
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    let op = c.op.ok_or_else(|| internal("reduce without op"))?;
                    if from == Buf::Temp {
                        return Err(internal("reduce from temp"));
                    }
                    rows.resize(n * len, T::ZERO);
                    // Start at the next member (spreads the load), store in team order.
                    for k in (0..n).map(|i| (team.my_pe() + 1 + i) % n) {
                        pe.get(
                            sym(from),
                            from_at,
                            &mut rows[k * len..(k + 1) * len],
                            members[k],
                        )?;
                    }
                    out.resize(len, T::ZERO);
                    combine(op, n, &rows, &mut out)?;
                    if to == Buf::Temp {
                        temp.get_mut(to_at..to_at + len)
                            .ok_or_else(|| internal("temp range"))?
                            .copy_from_slice(&out);
                    } else {
                        pe.put(sym(to), to_at, &out, me)?;
                    }
                }
                Step::ReduceGroup {
                    group,
                    from,
                    from_at,
                    to,
                    to_at,
                    len,
                } => {
                    let op = c.op.ok_or_else(|| internal("reduce without op"))?;
                    let g = p.groups.get(group).ok_or_else(|| internal("group"))?;
                    if from == Buf::Temp || g.is_empty() {
                        return Err(internal("reduce group"));
                    }
                    rows.resize(g.len() * len, T::ZERO);
                    // Start after this member where it is in the group (spreads the load).
                    let at = g
                        .iter()
                        .position(|&m| m == team.my_pe())
                        .map_or(0, |i| i + 1);
                    for k in (0..g.len()).map(|i| (at + i) % g.len()) {
                        let w = *members.get(g[k]).ok_or_else(|| internal("peer"))?;
                        pe.get(sym(from), from_at, &mut rows[k * len..(k + 1) * len], w)?;
                    }
                    out.resize(len, T::ZERO);
                    combine(op, g.len(), &rows, &mut out)?;
                    if to == Buf::Temp {
                        temp.get_mut(to_at..to_at + len)
                            .ok_or_else(|| internal("temp range"))?
                            .copy_from_slice(&out);
                    } else {
                        pe.put(sym(to), to_at, &out, me)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl crate::pe::sealed::Sealed for Coll<'_> {}
/// `pe.free(coll)` releases the scratch (a collective over the world); `pe` must be the PE
/// the object was made for.
impl crate::pe::Free for Coll<'_> {
    fn free_with(self, pe: &Pe) -> Result<()> {
        if pe.my_pe() != self.pe.my_pe() {
            return Err(Error::invalid(format!(
                "free of the collectives of PE {} by PE {}",
                self.pe.my_pe(),
                pe.my_pe()
            )));
        }
        pe.free(self.scratch)
    }
}
