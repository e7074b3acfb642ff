//! The expert-parallel buffer: symmetric areas, the agreement (records, then one team barrier
//! carrying the call's kind: see [`crate::ep`]), dispatch and combine with the CPU data
//! movement (puts from the caller's slices, signals per source). Dispatch in `dispatch`,
//! combine in `combine`.

mod combine;
mod dispatch;
mod hier;

use super::handle::{Dispatched, Handle};
use super::layout::{pack_areas, Layout};
use super::{check_dtype, EpConfig, EpMode, RecvLayout, TopkId};
use crate::elem::{Cmp, Elem, ElemKind};
use crate::error::{Error, Result};
use crate::pe::{CallKind, Pe};
use crate::sym::{Signal, Sym, SymView};
use crate::team::{NodeMap, Team};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

const OP_DISPATCH: u64 = 1;
const OP_COMBINE: u64 = 2;
const OP_COMBINE_TOKENS: u64 = 3;

// Record words (u64), then cnt[n], expect[n], local expert pairs[El].
const R_EPOCH: usize = 0;
const R_OP: usize = 1;
const R_STATUS: usize = 2;
const R_TOPK: usize = 3;
const R_TOKENS: usize = 4;
const R_HIDDEN: usize = 5;
const R_EXPERTS: usize = 6;
const R_AUX: usize = 7;
const R_FIXED: usize = 8;

const STATUS_OK: u64 = 0;
const STATUS_INVALID: u64 = 1;

fn op_name(op: u64) -> &'static str {
    match op {
        OP_DISPATCH => "ep dispatch",
        OP_COMBINE => "ep combine",
        OP_COMBINE_TOKENS => "ep combine_tokens",
        _ => "ep",
    }
}

/// The agreed records of one call, as this PE received them (row `s` came from PE `s`).
pub(crate) struct Records {
    rows: Vec<Vec<u64>>,
    n: usize,
}

impl Records {
    /// Rows PE `s` sends to PE `d`.
    pub(crate) fn cnt(&self, s: usize, d: usize) -> usize {
        self.rows[s][R_FIXED + d] as usize
    }
    /// Rows PE `s` expects from PE `d`.
    fn expect(&self, s: usize, d: usize) -> usize {
        self.rows[s][R_FIXED + self.n + d] as usize
    }
    /// PE `s`'s (token, slot) pairs for each local expert of this PE.
    fn local_pairs(&self, s: usize) -> &[u64] {
        &self.rows[s][R_FIXED + 2 * self.n..]
    }
    fn tokens(&self, s: usize) -> usize {
        self.rows[s][R_TOKENS] as usize
    }
}

/// A symmetric expert-parallel buffer for hidden states of type `T` (`f32`, `bf16`, `f16`),
/// created collectively and reused by every dispatch and combine of its team.
///
/// All calls are collective over the team, in the same order on every PE.
#[derive(Debug)]
pub struct HostBuffer<T: Elem> {
    cfg: EpConfig,
    id: u64,
    /// The team the buffer was made for; every agreement passes its barrier.
    team: Team,
    n: usize,
    me: usize,
    members: Vec<usize>,
    epp: usize,
    /// Receive rows (`n * max_tokens` or `n * capacity`).
    rows: usize,
    /// Record words.
    mw: usize,
    /// Words per received-row record: token index, k ids, k weights.
    rmw: usize,
    epoch: u64,
    plan: Plan,
    /// The team's nodes.
    nodes: NodeMap,
    /// Calls take the internode path (`hier.rs`): the team spans nodes, a node holds more
    /// than one member, and [`set_hierarchical`](Self::set_hierarchical) did not turn it off.
    hier: bool,
    /// All areas in one symmetric allocation (one collective, nothing half-allocated).
    area: Sym<u8>,
    _t: std::marker::PhantomData<fn() -> T>,
}

fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid("ep: buffer size overflows"))
}

/// Where the areas lie in the buffer's one allocation (byte offsets, 256-aligned).
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Receive rows (`n * max_tokens` or `n * capacity`).
    rows: usize,
    /// Record words.
    mw: usize,
    /// Words per received-row record: token index, k ids, k weights.
    rmw: usize,
    /// `[rows, H]` of T: received hidden states.
    x_off: usize,
    /// `[rows, rmw]` of u32: received row records.
    rm_off: usize,
    /// `[max_tokens * max_topk, H]` of T: expert outputs coming back, by (token, slot).
    comb_off: usize,
    /// `[2, n, mw]` of u64: agreement records by parity.
    rec_off: usize,
    /// `[n]` of u64: data signals, one per source.
    sig_off: usize,
    /// `[n]` of u64: rows sent by each source in the current call.
    done_off: usize,
    /// The internode areas (`hier.rs`), present on teams that span nodes with a node of
    /// several members (else empty, at `total`).
    /// `[n * max_tokens, H]` of 4-byte elements: rows to forward, by source (dispatch, as T);
    /// node partials coming back, by node (combine, as f32).
    fx_off: usize,
    /// `[n * max_tokens, rmw]` of u32: records of the rows to forward, by source.
    fm_off: usize,
    /// `[n * max_tokens, H]` of f32: this PE's partial of each token received, by source.
    px_off: usize,
    /// `[3, n]` of u64: signals and row counts of the forwarding steps, partials-ready flags.
    fsig_off: usize,
    /// Rows of the forwarding areas (`n * max_tokens`, or 0 without them).
    fwd_rows: usize,
    total: usize,
}

fn plan(cfg: &EpConfig, n: usize, elem: usize, internode: bool) -> Result<Plan> {
    cfg.validate(n)?;
    let per_pair = match cfg.mode {
        EpMode::Normal => cfg.max_tokens,
        EpMode::Capturable { capacity } => capacity,
    };
    let rows = mul(n, per_pair)?;
    let mw = R_FIXED + 2 * n + cfg.num_experts / n;
    let rmw = 1 + 2 * cfg.max_topk;
    let fwd_rows = if internode {
        mul(n, cfg.max_tokens)?
    } else {
        0
    };
    let sizes = [
        mul(mul(rows, cfg.hidden)?, elem)?,
        mul(mul(rows, rmw)?, 4)?,
        mul(mul(mul(cfg.max_tokens, cfg.max_topk)?, cfg.hidden)?, elem)?,
        mul(mul(2 * n, mw)?, 8)?,
        mul(n, 8)?,
        mul(n, 8)?,
        mul(mul(fwd_rows, cfg.hidden)?, 4)?,
        mul(mul(fwd_rows, rmw)?, 4)?,
        mul(mul(fwd_rows, cfg.hidden)?, 4)?,
        if internode { mul(3 * n, 8)? } else { 0 },
    ];
    let (offs, at) = pack_areas("ep", sizes)?;
    Ok(Plan {
        rows,
        mw,
        rmw,
        x_off: offs[0],
        rm_off: offs[1],
        comb_off: offs[2],
        rec_off: offs[3],
        sig_off: offs[4],
        done_off: offs[5],
        fx_off: offs[6],
        fm_off: offs[7],
        px_off: offs[8],
        fsig_off: offs[9],
        fwd_rows,
        total: at,
    })
}

impl<T: Elem> HostBuffer<T> {
    /// Allocates the buffer for `team` (collective over the world, as every symmetric
    /// allocation is: every PE calls it, with a team it belongs to — usually the world team —
    /// and the same configuration).
    ///
    /// Errors: a dtype other than `f32`/`bf16`/`f16`, a team of an ended world
    /// ([`Error::WorldEnded`]) or one this PE is not a member of, a configuration that does not
    /// fit the team (`E % n != 0`, zero sizes, capacity out of range), a heap too small
    /// ([`Error::HeapExhausted`]; [`HostBuffer::bytes_for`] says how much is needed).
    pub fn new(pe: &Pe, team: &Team, cfg: EpConfig) -> Result<HostBuffer<T>> {
        let n = team.n_pes();
        let me = team.my_pe();
        let prepared = check_dtype::<T>().and_then(|_| {
            // A team of an ended world would pass the membership check below and fail only
            // in the barrier, after the area was allocated (and then never freed).
            if team.job != pe.inner.job {
                return Err(Error::WorldEnded);
            }
            if team.members().get(me) != Some(&pe.my_pe()) {
                return Err(Error::Team(format!(
                    "PE {} is not a member of the team passed to ep::HostBuffer::new",
                    pe.my_pe()
                )));
            }
            plan(
                &cfg,
                n,
                std::mem::size_of::<T>(),
                pe.node_map(team).is_hierarchical(),
            )
        });
        let plan = match prepared {
            Ok(p) => p,
            Err(e) => {
                // Take part in the collective allocation anyway (with 0 bytes) so that peers
                // whose configuration is valid see a mismatch at once instead of waiting for
                // this PE until the timeout; when every PE is invalid the same way, the empty
                // block is released again.
                if let Ok(s) = pe.alloc_aligned::<u8>(0, 256) {
                    pe.free(s)?;
                }
                return Err(e);
            }
        };
        let area = pe.alloc_aligned::<u8>(plan.total, 256)?;
        let buf = HostBuffer {
            cfg,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            team: team.tracked_copy(),
            n,
            me,
            members: team.members().to_vec(),
            epp: cfg.num_experts / n,
            rows: plan.rows,
            mw: plan.mw,
            rmw: plan.rmw,
            epoch: 0,
            plan,
            nodes: pe.node_map(team),
            hier: plan.fwd_rows > 0,
            area,
            _t: std::marker::PhantomData,
        };
        // Recycled heap memory may hold old signal values: clear, then make sure nobody signals
        // before everyone cleared.
        pe.local_fill(&buf.sig()?, 0)?;
        pe.local_fill(&buf.done()?, 0)?;
        if plan.fwd_rows > 0 {
            pe.local_fill(&buf.fsig()?, 0)?;
        }
        pe.team_barrier_as(team, crate::pe::CallKind::EpBufferNew)?;
        tracing::debug!(
            pe = pe.my_pe(),
            bytes = buf.bytes(),
            ?cfg,
            n,
            "ep buffer created"
        );
        Ok(buf)
    }

    /// Symmetric bytes per PE a buffer of `cfg` on a team of `n_pes` on one node takes. On a
    /// team spanning nodes with a node of several members, the internode areas add
    /// `n_pes · max_tokens · (8·H + 4·(1 + 2·max_topk))` bytes and `24 · n_pes` of signals
    /// ([`bytes_for_nodes`](Self::bytes_for_nodes)).
    pub fn bytes_for(cfg: &EpConfig, n_pes: usize) -> Result<usize> {
        Ok(plan(cfg, n_pes, std::mem::size_of::<T>(), false)?.total)
    }

    /// Symmetric bytes per PE a buffer of `cfg` on a team placed as `nodes`
    /// ([`Pe::node_map`](crate::Pe::node_map)) takes.
    pub fn bytes_for_nodes(cfg: &EpConfig, nodes: &NodeMap) -> Result<usize> {
        let (n, inter) = (nodes.n_pes(), nodes.is_hierarchical());
        Ok(plan(cfg, n, std::mem::size_of::<T>(), inter)?.total)
    }

    /// Takes the internode path (the default where it applies) or the flat one, in which
    /// every token crosses the network once per destination PE: a measurement knob, results
    /// are the same but for the grouping of float additions in combine. Alike on every PE
    /// (checked: a difference is [`Error::CollectiveMismatch`] on every PE at the next call).
    /// Without effect on teams of one node or of one PE per node.
    pub fn set_hierarchical(&mut self, on: bool) {
        self.hier = on && self.plan.fwd_rows > 0;
    }

    /// True when calls take the internode path: a token crosses the network once per
    /// destination node, to the PE of its source's local index there
    /// ([`NodeMap::peer`]), which forwards it to the destination PEs of its node.
    pub fn is_hierarchical(&self) -> bool {
        self.hier
    }

    /// Symmetric bytes per PE this buffer takes.
    pub fn bytes(&self) -> usize {
        self.plan.total
    }

    fn recv_x(&self) -> Result<SymView<'_, T>> {
        self.area
            .view(self.plan.x_off, self.plan.rows * self.cfg.hidden)
    }
    fn recv_meta(&self) -> Result<SymView<'_, u32>> {
        self.area
            .view(self.plan.rm_off, self.plan.rows * self.plan.rmw)
    }
    fn comb(&self) -> Result<SymView<'_, T>> {
        let c = &self.cfg;
        self.area
            .view(self.plan.comb_off, c.max_tokens * c.max_topk * c.hidden)
    }
    fn meta(&self) -> Result<SymView<'_, u64>> {
        self.area.view(self.plan.rec_off, 2 * self.n * self.plan.mw)
    }
    fn sig(&self) -> Result<SymView<'_, u64>> {
        self.area.view(self.plan.sig_off, self.n)
    }
    fn done(&self) -> Result<SymView<'_, u64>> {
        self.area.view(self.plan.done_off, self.n)
    }
    /// The forwarding rows as `U` (T in dispatch, f32 in combine).
    fn fx<U: Elem>(&self) -> Result<SymView<'_, U>> {
        self.area
            .view(self.plan.fx_off, self.plan.fwd_rows * self.cfg.hidden)
    }
    fn fm(&self) -> Result<SymView<'_, u32>> {
        self.area
            .view(self.plan.fm_off, self.plan.fwd_rows * self.plan.rmw)
    }
    fn px(&self) -> Result<SymView<'_, f32>> {
        self.area
            .view(self.plan.px_off, self.plan.fwd_rows * self.cfg.hidden)
    }
    /// `[fsig n | fdone n | psig n]`.
    fn fsig(&self) -> Result<SymView<'_, u64>> {
        self.area.view(self.plan.fsig_off, 3 * self.n)
    }

    /// The configuration.
    pub fn config(&self) -> &EpConfig {
        &self.cfg
    }

    /// The team size.
    pub fn n_pes(&self) -> usize {
        self.n
    }

    /// Rows of the receive area (`n * max_tokens` normal, `n * capacity` capturable).
    pub fn recv_rows(&self) -> usize {
        self.rows
    }

    fn mode_word(&self) -> u64 {
        match self.cfg.mode {
            EpMode::Normal => 0,
            EpMode::Capturable { capacity } => 1 + capacity as u64,
        }
    }

    // ----- agreement -----

    /// Puts this PE's record for each member (`rows[d]` for member `d`) into that member's
    /// record area, passes the team barrier of `call`, and collects everyone's (the
    /// agreement: see the module docs). When the barrier fails, the call did not happen: the
    /// call count goes back, and after a mismatch this PE's records are cleared again.
    fn exchange(&mut self, pe: &Pe, call: CallKind, rows: &[Vec<u64>]) -> Result<Records> {
        let n = self.n;
        let at = ((self.epoch % 2) as usize * n + self.me) * self.mw;
        for k in 0..n {
            let d = (self.me + k) % n;
            debug_assert_eq!(rows[d].len(), self.mw);
            pe.put(&self.meta()?, at, &rows[d], self.members[d])?;
        }
        if let Err(e) = pe.team_barrier_as(&self.team, call) {
            self.epoch -= 1;
            if matches!(e, Error::CollectiveMismatch { .. }) {
                // Every member saw the mismatch and reads no record of this call; a member
                // reads this half again only after a barrier this PE reaches after the clear.
                let zeros = vec![0u64; self.mw];
                for d in 0..n {
                    pe.put(&self.meta()?, at, &zeros, self.members[d])?;
                }
            }
            return Err(e);
        }
        let parity = (self.epoch % 2) as usize;
        let mut all = vec![0u64; n * self.mw];
        pe.get(&self.meta()?, parity * n * self.mw, &mut all, pe.my_pe())?;
        Ok(Records {
            rows: all.chunks(self.mw).map(|c| c.to_vec()).collect(),
            n,
        })
    }

    /// The record of this PE for `op`: header, then `cnt`, `expect` and local pairs per dest.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        op: u64,
        status: u64,
        top_k: usize,
        tokens: usize,
        aux: u64,
        cnt: &[usize],
        expect: &[usize],
        pairs: Option<&Layout>,
        d: usize,
    ) -> Vec<u64> {
        let mut r = vec![0u64; self.mw];
        r[R_EPOCH] = self.epoch;
        r[R_OP] = op;
        r[R_STATUS] = status;
        r[R_TOPK] = top_k as u64;
        r[R_TOKENS] = tokens as u64;
        r[R_HIDDEN] = self.cfg.hidden as u64;
        // Bit 31 (experts fit in 31 bits): the internode path, which every PE must take alike.
        r[R_EXPERTS] =
            self.cfg.num_experts as u64 | u64::from(self.hier) << 31 | (self.mode_word() << 32);
        r[R_AUX] = aux;
        for (i, c) in cnt.iter().enumerate() {
            r[R_FIXED + i] = *c as u64;
        }
        for (i, c) in expect.iter().enumerate() {
            r[R_FIXED + self.n + i] = *c as u64;
        }
        if let Some(l) = pairs {
            for (i, c) in l.pairs_per_local_expert(d).iter().enumerate() {
                r[R_FIXED + 2 * self.n + i] = *c as u64;
            }
        }
        r
    }

    /// The decision every PE reaches from the same records: `Ok` only if all agree.
    fn decide(&self, op: u64, rec: &Records, mine: Option<Error>) -> Result<()> {
        if let Some(e) = mine {
            return Err(e);
        }
        let name = op_name(op);
        let me = &rec.rows[self.me];
        for (s, r) in rec.rows.iter().enumerate() {
            let mismatch = |what: &str, a: u64, b: u64| Error::CollectiveMismatch {
                op: name,
                pe: self.members[s],
                mine: format!("{what} {a}"),
                theirs: format!("{what} {b}"),
            };
            if r[R_EPOCH] != self.epoch {
                return Err(mismatch("call", self.epoch, r[R_EPOCH]));
            }
            if r[R_OP] != op {
                return Err(Error::CollectiveMismatch {
                    op: name,
                    pe: self.members[s],
                    mine: name.into(),
                    theirs: op_name(r[R_OP]).into(),
                });
            }
            if r[R_STATUS] != STATUS_OK {
                return Err(Error::invalid(format!(
                    "{name}: PE {} (team index {s}) rejected its input; nothing was sent",
                    self.members[s]
                )));
            }
            for (w, what) in [
                (R_TOPK, "top_k"),
                (R_HIDDEN, "hidden"),
                (R_EXPERTS, "experts/mode"),
                (R_AUX, "dispatch handle"),
            ] {
                if r[w] != me[w] {
                    return Err(mismatch(what, me[w], r[w]));
                }
            }
        }
        Ok(())
    }

    /// Offset (rows) where source `s`'s rows for destination `d` start in `d`'s receive area.
    fn base(&self, rec: &Records, s: usize, d: usize) -> usize {
        match self.cfg.mode {
            EpMode::Normal => (0..s).map(|q| rec.cnt(q, d)).sum(),
            EpMode::Capturable { capacity } => s * capacity,
        }
    }

    /// Capacity check over the whole agreed matrix (the same on every PE).
    fn check_capacity(&self, op: &'static str, rec: &Records) -> Result<()> {
        let cap = match self.cfg.mode {
            EpMode::Normal => self.cfg.max_tokens,
            EpMode::Capturable { capacity } => capacity,
        };
        for s in 0..self.n {
            for d in 0..self.n {
                if rec.cnt(s, d) > cap {
                    return Err(Error::Capacity {
                        op,
                        src_pe: s,
                        dst_pe: d,
                        needed: rec.cnt(s, d),
                        capacity: cap,
                    });
                }
            }
        }
        Ok(())
    }

    /// Waits for every source's completion signal and checks its row count.
    fn wait_data(&self, pe: &Pe, rec: &Records, what: &'static str) -> Result<()> {
        let n = self.n;
        for s in 0..n {
            let from = self.members[s];
            pe.wait_until_from(&self.sig()?, s, Cmp::Ge, self.epoch, from, what)?;
        }
        let mut done = vec![0u64; n];
        pe.get(&self.done()?, 0, &mut done, pe.my_pe())?;
        for (s, &got) in done.iter().enumerate() {
            if got as usize != rec.cnt(s, self.me) {
                return Err(Error::invalid(format!(
                    "{what}: PE {} sent {got} rows, {} announced",
                    self.members[s],
                    rec.cnt(s, self.me)
                )));
            }
        }
        Ok(())
    }

    fn signal_done(&self, pe: &Pe, d: usize, rows: usize) -> Result<()> {
        self.signal_done_as(pe, self.me, d, rows)
    }

    /// Tells member `d` that the `rows` rows of source `s` (this PE, or a source of another
    /// node whose rows this PE forwarded) are in place.
    fn signal_done_as(&self, pe: &Pe, s: usize, d: usize, rows: usize) -> Result<()> {
        pe.fence();
        pe.put_signal(
            &self.done()?,
            s,
            &[rows as u64],
            Signal::set(&self.sig()?, s, self.epoch),
            self.members[d],
        )
    }

    // ----- dispatch -----
}

impl<T: Elem> crate::pe::sealed::Sealed for HostBuffer<T> {}
/// `pe.free(buf)` releases the symmetric areas (collective over the world).
impl<T: Elem> crate::pe::Free for HostBuffer<T> {
    fn free_with(self, pe: &Pe) -> Result<()> {
        pe.free(self.area)
    }
}
