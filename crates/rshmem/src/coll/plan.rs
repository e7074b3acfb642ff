//! Algorithms as data: a [`Plan`] is the list of steps one member of a team performs for one
//! collective call. Planning is pure (no PE, no memory), so plans are unit-tested on a model
//! that checks data and cross-member hazards, and any executor — the host executor in
//! `coll::exec`, later a stream-ordered GPU one — can run the same plan.
//!
//! Conventions every plan follows:
//! * members are team indices `0..n`; offsets and lengths are in elements;
//! * data moves by *pull*: a member reads peers' symmetric buffers (`Src`, `Dst`) and writes
//!   only its own (`Dst`, `Temp`); `Temp` is private to the member and never read by peers,
//!   except where [`Plan::temp_shared`] says it is symmetric scratch (the hierarchical reduce
//!   and out-of-place reduce_scatter, whose node partials wait there for readers on other
//!   nodes);
//! * the first step is a [`Step::Sync`] (all inputs are ready; the host executor checks the
//!   members' arguments across it) and between two syncs no member writes a range that another
//!   member reads in the same phase; the last sync comes after every read of peer memory, so
//!   when a member returns nobody reads its buffers any more;
//! * in place (`Src` and `Dst` are the same object) is part of the plan: the planner avoids
//!   the hazards, using `Temp` where it must;
//! * `Reduce` folds the members' values in team order `0..n`, so every member computing an
//!   element gets the same bits;
//! * copies are split into chunks of at most `chunk` elements and reductions into chunks of
//!   `chunk / n` (n inputs each), which bounds an executor's staging memory to about two chunks
//!   and gives a GPU executor its pipeline units.

pub mod hier;

/// How a collective moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Every member reads what it needs straight from the members that hold it (for
    /// all_reduce: every member reads every input and reduces all of it).
    OneShot,
    /// Two phases over `n` parts of the vector: all_reduce = reduce-scatter then all-gather;
    /// broadcast = scatter from the root then all-gather. Each member reads about 2·count
    /// elements instead of n·count (all_reduce) and the root serves count instead of
    /// (n-1)·count (broadcast), at the price of one more synchronisation.
    TwoShot,
}

impl Algo {
    /// Name used in `RSHMEM_COLL_ALGO` and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Algo::OneShot => "one_shot",
            Algo::TwoShot => "two_shot",
        }
    }
    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// The collective operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// One root's vector to every member.
    Broadcast,
    /// Element-wise reduction of every member's vector to a root.
    Reduce,
    /// Element-wise reduction of every member's vector to every member.
    AllReduce,
    /// Every member's vector to every member, concatenated in team order.
    AllGather,
    /// Reduction whose result is scattered: member `i` gets part `i`.
    ReduceScatter,
    /// Member `i`'s part `j` goes to member `j`'s part `i` (equal parts).
    AllToAll,
    /// As `AllToAll` with per-pair counts and displacements.
    AllToAllV,
}

impl CollKind {
    /// The kind a team barrier of this collective carries.
    pub(crate) fn call(self) -> crate::pe::CallKind {
        use crate::pe::CallKind as K;
        match self {
            CollKind::Broadcast => K::Broadcast,
            CollKind::Reduce => K::Reduce,
            CollKind::AllReduce => K::AllReduce,
            CollKind::AllGather => K::AllGather,
            CollKind::ReduceScatter => K::ReduceScatter,
            CollKind::AllToAll => K::AllToAll,
            CollKind::AllToAllV => K::AllToAllV,
        }
    }
}

impl CollKind {
    /// Every kind.
    pub const ALL: [CollKind; 7] = [
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::AllToAllV,
    ];
    /// Name used in messages and reports.
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllReduce => "all_reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::AllToAllV => "all_to_all_v",
        }
    }
    /// True when the kind has a [`Algo::TwoShot`] variant.
    pub const fn has_two_shot(self) -> bool {
        matches!(self, CollKind::AllReduce | CollKind::Broadcast)
    }
    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// A buffer as a plan names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The source object (symmetric).
    Src,
    /// The destination object (symmetric; the same memory as `Src` in place).
    Dst,
    /// Staging memory of [`Plan::temp_len`] elements: private (never read by peers), or
    /// symmetric scratch that peers read where [`Plan::temp_shared`] says so.
    Temp,
}

/// One step of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every member of the team reaches this point before any goes on.
    Sync,
    /// Copies `len` elements of member `peer`'s `from` (from element `from_at`) into this
    /// member's `to` at `to_at`. `from` is `Temp` only when `peer` is this member.
    Copy {
        /// Team index read from.
        peer: usize,
        /// Buffer read.
        from: Buf,
        /// First element read.
        from_at: usize,
        /// Buffer written (this member's).
        to: Buf,
        /// First element written.
        to_at: usize,
        /// Elements.
        len: usize,
    },
    /// Folds `len` elements of every member's `from` at `from_at`, in team order, into this
    /// member's `to` at `to_at`. An executor reads all inputs of the step before it writes.
    Reduce {
        /// Buffer read on every member.
        from: Buf,
        /// First element read.
        from_at: usize,
        /// Buffer written (this member's).
        to: Buf,
        /// First element written.
        to_at: usize,
        /// Elements.
        len: usize,
    },
    /// As `Reduce`, over the members of [`Plan::groups`]`[group]` only, folded in that
    /// order (hierarchical plans: the members of one node, or one member per node).
    ReduceGroup {
        /// Index into [`Plan::groups`].
        group: usize,
        /// Buffer read on every member of the group.
        from: Buf,
        /// First element read.
        from_at: usize,
        /// Buffer written (this member's).
        to: Buf,
        /// First element written.
        to_at: usize,
        /// Elements.
        len: usize,
    },
}

/// Who plans: the team size, this member, the buffers' relation, the chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Members in the team.
    pub n: usize,
    /// This member's team index.
    pub me: usize,
    /// `Src` and `Dst` are the same object.
    pub in_place: bool,
    /// Most elements per copy or reduce step (at least 1).
    pub chunk: usize,
}

/// What one member does for one collective call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The collective.
    pub kind: CollKind,
    /// The algorithm.
    pub algo: Algo,
    /// Team size, member, in place, chunk.
    pub shape: Shape,
    /// Elements of staging memory the plan needs.
    pub temp_len: usize,
    /// The steps, starting with a [`Step::Sync`]; every member's plan has as many syncs.
    pub steps: Vec<Step>,
    /// Member lists the [`Step::ReduceGroup`] steps fold over (empty in flat plans).
    pub groups: Vec<Vec<usize>>,
}

impl Plan {
    /// Number of synchronisations.
    pub fn syncs(&self) -> usize {
        self.steps.iter().filter(|s| **s == Step::Sync).count()
    }
    /// True when `Temp` is symmetric scratch, the same range on every member and read by
    /// peers, which the executor provides (the host's `Coll` holds it): in the hierarchical
    /// reduce and out-of-place reduce_scatter ([`hier::reduce`], [`hier::reduce_scatter_out`]),
    /// whose node partials wait there for readers on other nodes. Elsewhere `Temp` is private.
    pub fn temp_shared(&self) -> bool {
        let hier = !self.groups.is_empty();
        hier && match self.kind {
            CollKind::Reduce => true,
            CollKind::ReduceScatter => !self.shape.in_place,
            _ => false,
        }
    }
}

/// One member's receive in an all_to_all_v: `count` elements from the sender's `Src` at
/// `src_at` into this member's `Dst` at `dst_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VRecv {
    /// Elements.
    pub count: usize,
    /// Where they are in the sender's source object.
    pub src_at: usize,
    /// Where they go in the receiver's destination object.
    pub dst_at: usize,
}

/// Part `k` of `count` elements split in `n` near-equal parts: `(start, len)`.
pub fn part(k: usize, n: usize, count: usize) -> (usize, usize) {
    let at = |i: usize| (i as u128 * count as u128 / n.max(1) as u128) as usize;
    (at(k), at(k + 1) - at(k))
}

struct Builder {
    shape: Shape,
    steps: Vec<Step>,
    groups: Vec<Vec<usize>>,
    temp_len: usize,
    /// The steps after the last sync touch only this member's memory: no final sync needed.
    local_tail: bool,
}

impl Builder {
    fn new(shape: Shape) -> Builder {
        Builder {
            shape: Shape {
                chunk: shape.chunk.max(1),
                ..shape
            },
            steps: vec![Step::Sync],
            groups: Vec::new(),
            temp_len: 0,
            local_tail: false,
        }
    }
    fn sync(&mut self) {
        self.steps.push(Step::Sync);
    }
    fn note_temp(&mut self, buf: Buf, end: usize) {
        if buf == Buf::Temp {
            self.temp_len = self.temp_len.max(end);
        }
    }
    fn copy(&mut self, peer: usize, from: Buf, from_at: usize, to: Buf, to_at: usize, len: usize) {
        if peer == self.shape.me && from_at == to_at && self.same(from, to) {
            return;
        }
        self.note_temp(from, from_at + len);
        self.note_temp(to, to_at + len);
        let c = self.shape.chunk;
        for o in (0..len).step_by(c) {
            self.steps.push(Step::Copy {
                peer,
                from,
                from_at: from_at + o,
                to,
                to_at: to_at + o,
                len: c.min(len - o),
            });
        }
    }
    /// Reduce steps hold `chunk / n` elements, so gathering the n inputs of a step stages
    /// about one chunk whatever the team size.
    fn reduce(&mut self, from: Buf, from_at: usize, to: Buf, to_at: usize, len: usize) {
        self.note_temp(to, to_at + len);
        let c = (self.shape.chunk / self.shape.n.max(1)).max(1);
        for o in (0..len).step_by(c) {
            self.steps.push(Step::Reduce {
                from,
                from_at: from_at + o,
                to,
                to_at: to_at + o,
                len: c.min(len - o),
            });
        }
    }
    /// As `reduce` over `members` only (in that order).
    fn reduce_group(
        &mut self,
        members: Vec<usize>,
        from: Buf,
        from_at: usize,
        to: Buf,
        to_at: usize,
        len: usize,
    ) {
        self.note_temp(to, to_at + len);
        let c = (self.shape.chunk / members.len().max(1)).max(1);
        let group = match self.groups.iter().position(|g| *g == members) {
            Some(g) => g,
            None => {
                self.groups.push(members);
                self.groups.len() - 1
            }
        };
        for o in (0..len).step_by(c) {
            self.steps.push(Step::ReduceGroup {
                group,
                from,
                from_at: from_at + o,
                to,
                to_at: to_at + o,
                len: c.min(len - o),
            });
        }
    }
    /// True when the two buffers are the same memory on this member.
    fn same(&self, a: Buf, b: Buf) -> bool {
        a == b || (self.shape.in_place && a != Buf::Temp && b != Buf::Temp)
    }
    /// Peers in the order `me+1, me+2, …` (spreads the load: members start on different peers).
    fn others(&self) -> impl Iterator<Item = usize> {
        let Shape { n, me, .. } = self.shape;
        (1..n).map(move |k| (me + k) % n)
    }
    fn done(mut self, kind: CollKind, algo: Algo) -> Plan {
        if !self.local_tail {
            self.sync();
        }
        Plan {
            kind,
            algo,
            shape: self.shape,
            temp_len: self.temp_len,
            steps: self.steps,
            groups: self.groups,
        }
    }
}

/// broadcast: `count` elements of the root's `Src` into every member's `Dst` (the root's too).
pub fn broadcast(s: Shape, root: usize, count: usize, algo: Algo) -> Plan {
    let mut b = Builder::new(s);
    let me = s.me;
    if me == root {
        b.copy(me, Buf::Src, 0, Buf::Dst, 0, count);
    } else if algo == Algo::OneShot {
        b.copy(root, Buf::Src, 0, Buf::Dst, 0, count);
    } else {
        // Scatter: member k fetches part k from the root; then every member fetches part j
        // from member j (the root's part from the root), reading only parts nobody writes.
        let (at, len) = part(me, s.n, count);
        b.copy(root, Buf::Src, at, Buf::Dst, at, len);
        b.sync();
        for j in b.others().collect::<Vec<_>>() {
            let (at, len) = part(j, s.n, count);
            let from = if j == root { Buf::Src } else { Buf::Dst };
            b.copy(j, from, at, Buf::Dst, at, len);
        }
    }
    if me == root && algo == Algo::TwoShot {
        b.sync(); // the root takes part in the other members' middle sync
    }
    b.done(CollKind::Broadcast, algo)
}

/// reduce: the fold of every member's `Src[..count]` into the root's `Dst[..count]`.
pub fn reduce(s: Shape, root: usize, count: usize) -> Plan {
    let mut b = Builder::new(s);
    if s.me == root {
        // In place the root reads its own chunk before writing it; peers never read the root.
        b.reduce(Buf::Src, 0, Buf::Dst, 0, count);
    }
    b.done(CollKind::Reduce, Algo::OneShot)
}

/// all_reduce: the fold of every member's `Src[..count]` into every member's `Dst[..count]`.
pub fn all_reduce(s: Shape, count: usize, algo: Algo) -> Plan {
    let mut b = Builder::new(s);
    match algo {
        Algo::OneShot if s.in_place && s.n > 1 => {
            // Peers read my Src until the middle sync: reduce into Temp, then overwrite.
            b.reduce(Buf::Src, 0, Buf::Temp, 0, count);
            b.sync();
            b.copy(s.me, Buf::Temp, 0, Buf::Dst, 0, count);
            b.local_tail = true;
        }
        Algo::OneShot => b.reduce(Buf::Src, 0, Buf::Dst, 0, count),
        Algo::TwoShot => {
            // Reduce-scatter: member k folds part k into its own Dst part k (in place, peers
            // read only their own parts of my Src, never part k); all-gather: fetch part j
            // from member j's Dst, writing parts that nobody reads in this phase.
            let (at, len) = part(s.me, s.n, count);
            b.reduce(Buf::Src, at, Buf::Dst, at, len);
            b.sync();
            for j in b.others().collect::<Vec<_>>() {
                let (at, len) = part(j, s.n, count);
                b.copy(j, Buf::Dst, at, Buf::Dst, at, len);
            }
        }
    }
    b.done(CollKind::AllReduce, algo)
}

/// all_gather: member j's `Src[..count]` into every member's `Dst[j·count..]`. In place the
/// input is already at `Dst[me·count..]`.
pub fn all_gather(s: Shape, count: usize) -> Plan {
    let mut b = Builder::new(s);
    let from = |j: usize| {
        if s.in_place {
            (Buf::Dst, j * count)
        } else {
            (Buf::Src, 0)
        }
    };
    let (f, at) = from(s.me);
    b.copy(s.me, f, at, Buf::Dst, s.me * count, count);
    for j in b.others().collect::<Vec<_>>() {
        let (f, at) = from(j);
        b.copy(j, f, at, Buf::Dst, j * count, count);
    }
    b.done(CollKind::AllGather, Algo::OneShot)
}

/// reduce_scatter: the fold of every member's `Src[k·count..]` into member k's `Dst[..count]`;
/// in place into `Dst[k·count..]` (the object holds n·count elements).
pub fn reduce_scatter(s: Shape, count: usize) -> Plan {
    let mut b = Builder::new(s);
    let to_at = if s.in_place { s.me * count } else { 0 };
    b.reduce(Buf::Src, s.me * count, Buf::Dst, to_at, count);
    b.done(CollKind::ReduceScatter, Algo::OneShot)
}

/// all_to_all: member j's `Src[k·count..]` into member k's `Dst[j·count..]`.
pub fn all_to_all(s: Shape, count: usize) -> Plan {
    let recv: Vec<VRecv> = (0..s.n)
        .map(|j| VRecv {
            count,
            src_at: s.me * count,
            dst_at: j * count,
        })
        .collect();
    Plan {
        kind: CollKind::AllToAll,
        ..all_to_all_v(s, &recv)
    }
}

/// all_to_all_v: `recv[j]` says what this member receives from member j.
pub fn all_to_all_v(s: Shape, recv: &[VRecv]) -> Plan {
    let mut b = Builder::new(s);
    let order: Vec<usize> = std::iter::once(s.me).chain(b.others()).collect();
    // Alone, in place, the one receive range may overlap the send range elsewhere: copied in
    // chunks, a later chunk would read what an earlier one wrote. Staging avoids that too.
    let alone_shifted = s.n == 1 && recv.first().is_some_and(|r| r.src_at != r.dst_at);
    if s.in_place && (s.n > 1 || alone_shifted) {
        // Peers read my Src until the middle sync: stage everything, then overwrite.
        let mut t = 0;
        let mut staged = Vec::new();
        for &j in &order {
            let r = recv[j];
            b.copy(j, Buf::Src, r.src_at, Buf::Temp, t, r.count);
            staged.push((t, r));
            t += r.count;
        }
        b.sync();
        for (t, r) in staged {
            b.copy(s.me, Buf::Temp, t, Buf::Dst, r.dst_at, r.count);
        }
        b.local_tail = true;
    } else {
        for &j in &order {
            let r = recv[j];
            b.copy(j, Buf::Src, r.src_at, Buf::Dst, r.dst_at, r.count);
        }
    }
    b.done(CollKind::AllToAllV, Algo::OneShot)
}

#[cfg(test)]
mod tests;
