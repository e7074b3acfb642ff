//! The expert-parallel buffer: symmetric areas, the agreement protocol, dispatch and combine
//! with the CPU data movement (puts from the caller's slices, signals per source).

use super::handle::{Dispatched, Handle};
use super::layout::Layout;
use super::{check_dtype, EpConfig, EpMode, RecvLayout, TopkId};
use crate::elem::{Cmp, Elem, ElemKind};
use crate::error::{Error, Result};
use crate::pe::Pe;
use crate::sym::{Signal, Sym, SymView};
use crate::team::Team;
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
pub struct Buffer<T: Elem> {
    cfg: EpConfig,
    id: u64,
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
    /// `[3n]` of u64: record signals by parity, then data signals.
    sig_off: usize,
    /// `[n]` of u64: rows sent by each source in the current call.
    done_off: usize,
    total: usize,
}

fn plan(cfg: &EpConfig, n: usize, elem: usize) -> Result<Plan> {
    cfg.validate(n)?;
    let per_pair = match cfg.mode {
        EpMode::Normal => cfg.max_tokens,
        EpMode::Capturable { capacity } => capacity,
    };
    let rows = mul(n, per_pair)?;
    let mw = R_FIXED + 2 * n + cfg.num_experts / n;
    let rmw = 1 + 2 * cfg.max_topk;
    let sizes = [
        mul(mul(rows, cfg.hidden)?, elem)?,
        mul(mul(rows, rmw)?, 4)?,
        mul(mul(mul(cfg.max_tokens, cfg.max_topk)?, cfg.hidden)?, elem)?,
        mul(mul(2 * n, mw)?, 8)?,
        mul(3 * n, 8)?,
        mul(n, 8)?,
    ];
    let mut offs = [0usize; 6];
    let mut at = 0usize;
    for (o, sz) in offs.iter_mut().zip(sizes) {
        *o = at;
        at = at
            .checked_add(sz)
            .and_then(|v| v.checked_next_multiple_of(256))
            .ok_or_else(|| Error::invalid("ep: buffer size overflows"))?;
    }
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
        total: at,
    })
}

impl<T: Elem> Buffer<T> {
    /// Allocates the buffer for `team` (collective over the world, as every symmetric
    /// allocation is: every PE calls it, with a team it belongs to — usually the world team —
    /// and the same configuration).
    ///
    /// Errors: a dtype other than `f32`/`bf16`/`f16`, a team of an ended world
    /// ([`Error::WorldEnded`]) or one this PE is not a member of, a configuration that does not
    /// fit the team (`E % n != 0`, zero sizes, capacity out of range), a heap too small
    /// ([`Error::HeapExhausted`]; [`Buffer::bytes_for`] says how much is needed).
    pub fn new(pe: &Pe, team: &Team, cfg: EpConfig) -> Result<Buffer<T>> {
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
                    "PE {} is not a member of the team passed to ep::Buffer::new",
                    pe.my_pe()
                )));
            }
            plan(&cfg, n, std::mem::size_of::<T>())
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
        let buf = Buffer {
            cfg,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            n,
            me,
            members: team.members().to_vec(),
            epp: cfg.num_experts / n,
            rows: plan.rows,
            mw: plan.mw,
            rmw: plan.rmw,
            epoch: 0,
            plan,
            area,
            _t: std::marker::PhantomData,
        };
        // Recycled heap memory may hold old signal values: clear, then make sure nobody signals
        // before everyone cleared.
        pe.local_fill(&buf.sig()?, 0)?;
        pe.local_fill(&buf.done()?, 0)?;
        pe.team_barrier(team)?;
        tracing::debug!(
            pe = pe.my_pe(),
            bytes = buf.bytes(),
            ?cfg,
            n,
            "ep buffer created"
        );
        Ok(buf)
    }

    /// Symmetric bytes per PE a buffer of `cfg` on a team of `n_pes` takes.
    pub fn bytes_for(cfg: &EpConfig, n_pes: usize) -> Result<usize> {
        Ok(plan(cfg, n_pes, std::mem::size_of::<T>())?.total)
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
        self.area.view(self.plan.sig_off, 3 * self.n)
    }
    fn done(&self) -> Result<SymView<'_, u64>> {
        self.area.view(self.plan.done_off, self.n)
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

    /// Releases the symmetric areas (collective over the world, like [`Pe::free`]).
    pub fn free(self, pe: &Pe) -> Result<()> {
        pe.free(self.area)
    }

    fn mode_word(&self) -> u64 {
        match self.cfg.mode {
            EpMode::Normal => 0,
            EpMode::Capturable { capacity } => 1 + capacity as u64,
        }
    }

    // ----- validation -----

    /// Checks one PE's dispatch inputs; returns the layout.
    fn validate_dispatch<I: TopkId>(
        &self,
        pe: &Pe,
        x: &[T],
        topk_ids: &[I],
        topk_weights: &[f32],
        top_k: usize,
    ) -> Result<Layout> {
        if pe.my_pe() != self.members[self.me] {
            return Err(Error::invalid(format!(
                "ep: buffer of PE {} used by PE {}",
                self.members[self.me],
                pe.my_pe()
            )));
        }
        let c = &self.cfg;
        if top_k == 0 || top_k > c.max_topk {
            return Err(Error::invalid(format!(
                "ep: top_k {top_k} is out of range 1..={} (max_topk of the buffer)",
                c.max_topk
            )));
        }
        if !topk_ids.len().is_multiple_of(top_k) {
            return Err(Error::invalid(format!(
                "ep: topk_ids has {} elements, not a multiple of top_k {top_k}",
                topk_ids.len()
            )));
        }
        let t = topk_ids.len() / top_k;
        if t > c.max_tokens {
            return Err(Error::invalid(format!(
                "ep: {t} tokens exceed max_tokens {} of the buffer",
                c.max_tokens
            )));
        }
        if topk_weights.len() != topk_ids.len() {
            return Err(Error::LengthMismatch {
                what: "topk_weights",
                got: topk_weights.len(),
                expected: topk_ids.len(),
            });
        }
        let want = t * c.hidden;
        if x.len() != want {
            return Err(Error::LengthMismatch {
                what: "x (tokens * hidden)",
                got: x.len(),
                expected: want,
            });
        }
        let layout = Layout::compute(topk_ids, top_k, c.num_experts, self.n)?;
        for (i, w) in topk_weights.iter().enumerate() {
            if layout.slot_pes()[i] >= 0 && !w.is_finite() {
                return Err(Error::invalid(format!(
                    "ep: weight {w} of token {} slot {} is not finite",
                    i / top_k,
                    i % top_k
                )));
            }
        }
        Ok(layout)
    }

    // ----- agreement -----

    /// Puts this PE's record to every team PE and collects everyone's.
    fn exchange(&self, pe: &Pe, row: impl Fn(usize) -> Vec<u64>) -> Result<Records> {
        let n = self.n;
        let parity = (self.epoch % 2) as usize;
        for k in 0..n {
            let d = (self.me + k) % n;
            let r = row(d);
            debug_assert_eq!(r.len(), self.mw);
            pe.put_signal(
                &self.meta()?,
                (parity * n + self.me) * self.mw,
                &r,
                Signal::set(&self.sig()?, parity * n + self.me, self.epoch),
                self.members[d],
            )?;
        }
        for s in 0..n {
            pe.wait_until(&self.sig()?, parity * n + s, Cmp::Ge, self.epoch)?;
        }
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
        r[R_EXPERTS] = self.cfg.num_experts as u64 | (self.mode_word() << 32);
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
    fn wait_data(&self, pe: &Pe, rec: &Records, what: &str) -> Result<()> {
        let n = self.n;
        for s in 0..n {
            pe.wait_until(&self.sig()?, 2 * n + s, Cmp::Ge, self.epoch)?;
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
        pe.fence();
        pe.put_signal(
            &self.done()?,
            self.me,
            &[rows as u64],
            Signal::set(&self.sig()?, 2 * self.n + self.me, self.epoch),
            self.members[d],
        )
    }

    // ----- dispatch -----

    /// Dispatches this PE's tokens to the PEs of their experts (collective over the team).
    ///
    /// `x` is `[T, H]`, `topk_ids` and `topk_weights` are `[T, top_k]` (row-major; ids `-1` or
    /// `0..E`); `T = topk_ids.len() / top_k`, at most `max_tokens`, and may differ between PEs;
    /// `top_k` (at most `max_topk`) must be the same on every PE. Weights must be finite in the
    /// slots that have an expert; those of `-1` slots are never used (any value is accepted).
    ///
    /// Returns the rows received here (expert-major, or the received tokens once each: the
    /// buffer's [`RecvLayout`]) and the [`Handle`] for [`combine`](Self::combine). Any invalid
    /// input on any PE, or a capacity overflow in capturable mode, is an error on every PE and
    /// moves no payload.
    pub fn dispatch<I: TopkId>(
        &mut self,
        pe: &Pe,
        x: &[T],
        topk_ids: &[I],
        topk_weights: &[f32],
        top_k: usize,
    ) -> Result<Dispatched<T>> {
        self.epoch += 1;
        let n = self.n;
        let checked = self.validate_dispatch(pe, x, topk_ids, topk_weights, top_k);
        let (status, layout, mine) = match checked {
            Ok(l) => (STATUS_OK, Some(l), None),
            Err(e) => (STATUS_INVALID, None, Some(e)),
        };
        let zeros = vec![0usize; n];
        let cnt = layout.as_ref().map_or(&zeros[..], |l| l.tokens_per_pe());
        let tokens = layout.as_ref().map_or(0, |l| l.num_tokens());
        let rec = self.exchange(pe, |d| {
            self.record(
                OP_DISPATCH,
                status,
                top_k,
                tokens,
                0,
                cnt,
                &zeros,
                layout.as_ref(),
                d,
            )
        })?;
        self.decide(OP_DISPATCH, &rec, mine)?;
        self.check_capacity("ep dispatch", &rec)?;
        let layout = layout.ok_or_else(|| Error::invalid("ep: internal: no layout"))?;

        // Move: each token once to each PE it goes to, straight from `x`.
        let h = self.cfg.hidden;
        let rmw = self.rmw;
        let mut meta_rows: Vec<u32> = Vec::new();
        for k in 0..n {
            let d = (self.me + 1 + k) % n;
            let wd = self.members[d];
            let base = self.base(&rec, self.me, d);
            meta_rows.clear();
            let mut r = 0;
            for t in 0..tokens {
                if !layout.is_token_in_pe(t, d) {
                    continue;
                }
                pe.put(&self.recv_x()?, (base + r) * h, &x[t * h..(t + 1) * h], wd)?;
                let at = meta_rows.len();
                meta_rows.resize(at + rmw, 0);
                let m = &mut meta_rows[at..];
                m[0] = t as u32;
                for j in 0..top_k {
                    m[1 + j] = topk_ids[t * top_k + j].to_i64() as i32 as u32;
                    m[1 + top_k + j] = topk_weights[t * top_k + j].to_bits();
                }
                r += 1;
            }
            if r > 0 {
                pe.put(&self.recv_meta()?, base * rmw, &meta_rows, wd)?;
            }
            self.signal_done(pe, d, r)?;
        }
        self.wait_data(pe, &rec, "ep dispatch")?;

        // Complete: read the row records, group by local expert.
        let mut srcs = Vec::with_capacity(n);
        for s in 0..n {
            let c = rec.cnt(s, self.me);
            let base = self.base(&rec, s, self.me);
            let mut m = vec![0u32; c * rmw];
            pe.get(&self.recv_meta()?, base * rmw, &mut m, pe.my_pe())?;
            srcs.push((base, m));
        }
        let rows_meta: Vec<&[u32]> = srcs.iter().map(|(_, m)| &m[..]).collect();
        let mut handle = self.assemble(&rec, &rows_meta, top_k)?;
        handle.src_weights = topk_weights.to_vec();
        handle.src_slot_pe = layout.slot_pes().to_vec();
        handle.num_tokens = tokens;
        let mut first_of = Vec::with_capacity(n + 1);
        first_of.push(0usize);
        for s in 0..n {
            first_of.push(first_of[s] + rec.cnt(s, self.me));
        }
        // Receive-buffer row of received token i.
        let buf_row = |i: usize| {
            let s = handle.recv_src_pe[i] as usize;
            srcs[s].0 + (i - first_of[s])
        };
        let out = match self.cfg.layout {
            RecvLayout::ExpertMajor => {
                let mut out = vec![T::ZERO; handle.num_rows() * h];
                for (r, row) in out.chunks_mut(h).enumerate() {
                    let i = handle.row_token[r] as usize;
                    pe.get(&self.recv_x()?, buf_row(i) * h, row, pe.my_pe())?;
                }
                out
            }
            RecvLayout::TokenMajor => {
                // Each source's tokens are contiguous in the receive area, in receive order.
                let mut out = vec![T::ZERO; handle.num_recv_tokens() * h];
                for s in 0..n {
                    let rows = &mut out[first_of[s] * h..first_of[s + 1] * h];
                    if !rows.is_empty() {
                        pe.get(&self.recv_x()?, srcs[s].0 * h, rows, pe.my_pe())?;
                    }
                }
                out
            }
        };
        tracing::trace!(
            pe = pe.my_pe(),
            epoch = self.epoch,
            rows = handle.num_rows(),
            "ep dispatch done"
        );
        Ok(Dispatched { x: out, handle })
    }

    /// Builds the receive side of the handle from the row records of each source (`rows[s]` is
    /// `cnt(s, me) * rmw` words, in the sender's token order). Checks them against the records.
    pub(crate) fn assemble(&self, rec: &Records, rows: &[&[u32]], top_k: usize) -> Result<Handle> {
        let n = self.n;
        let epp = self.epp;
        let rmw = self.rmw;
        let lo = (self.me * epp) as i64;
        let total: usize = (0..n).map(|s| rec.cnt(s, self.me)).sum();
        let mut h = Handle {
            buffer_id: self.id,
            epoch: self.epoch,
            n_pes: n,
            experts_per_pe: epp,
            top_k,
            hidden: self.cfg.hidden,
            num_tokens: 0,
            src_weights: Vec::new(),
            src_slot_pe: Vec::new(),
            recv_src_pe: Vec::with_capacity(total),
            recv_src_token: Vec::with_capacity(total),
            recv_topk_local: Vec::with_capacity(total * top_k),
            recv_topk_weights: Vec::with_capacity(total * top_k),
            recv_tokens_per_pe: (0..n).map(|s| rec.cnt(s, self.me)).collect(),
            expert_offsets: vec![0; epp + 1],
            row_token: Vec::new(),
            row_slot: Vec::new(),
        };
        let mut counts = vec![0usize; epp];
        let corrupt = |s: usize, why: &str| {
            Error::invalid(format!(
                "ep dispatch: rows from PE {} are inconsistent ({why})",
                self.members[s]
            ))
        };
        for (s, m) in rows.iter().enumerate() {
            let mut prev: Option<u32> = None;
            let mut from_s = vec![0usize; epp];
            for r in m.chunks(rmw) {
                let t = r[0];
                if t as usize >= rec.tokens(s) || prev.is_some_and(|p| p >= t) {
                    return Err(corrupt(s, "token index"));
                }
                prev = Some(t);
                h.recv_src_pe.push(s as u32);
                h.recv_src_token.push(t);
                let mut any = false;
                for j in 0..top_k {
                    let id = r[1 + j] as i32 as i64;
                    let w = f32::from_bits(r[1 + top_k + j]);
                    if id >= lo && id < lo + epp as i64 {
                        let e = (id - lo) as usize;
                        h.recv_topk_local.push(e as i32);
                        h.recv_topk_weights.push(w);
                        from_s[e] += 1;
                        any = true;
                    } else {
                        h.recv_topk_local.push(-1);
                        h.recv_topk_weights.push(0.0);
                    }
                }
                if !any {
                    return Err(corrupt(s, "a token with no expert here"));
                }
            }
            if from_s
                .iter()
                .zip(rec.local_pairs(s))
                .any(|(a, &b)| *a as u64 != b)
            {
                return Err(corrupt(s, "expert counts"));
            }
            for (c, f) in counts.iter_mut().zip(from_s) {
                *c += f;
            }
        }
        for (e, c) in counts.iter().enumerate() {
            h.expert_offsets[e + 1] = h.expert_offsets[e] + c;
        }
        let nrows = h.expert_offsets[epp];
        h.row_token = vec![0; nrows];
        h.row_slot = vec![0; nrows];
        let mut cursor = h.expert_offsets.clone();
        for i in 0..h.recv_src_pe.len() {
            for j in 0..top_k {
                let e = h.recv_topk_local[i * top_k + j];
                if e >= 0 {
                    let c = &mut cursor[e as usize];
                    h.row_token[*c] = i as u32;
                    h.row_slot[*c] = j as u32;
                    *c += 1;
                }
            }
        }
        Ok(h)
    }

    // ----- combine -----

    fn validate_combine(
        &self,
        pe: &Pe,
        handle: &Handle,
        expert_out: &[T],
        tokens: bool,
    ) -> Result<()> {
        if pe.my_pe() != self.members[self.me] {
            return Err(Error::invalid(format!(
                "ep: buffer of PE {} used by PE {}",
                self.members[self.me],
                pe.my_pe()
            )));
        }
        if handle.buffer_id != self.id {
            return Err(Error::invalid(
                "ep combine: the handle comes from another buffer",
            ));
        }
        let (what, rows) = if tokens {
            (
                "token outputs (received tokens * hidden)",
                handle.num_recv_tokens(),
            )
        } else {
            ("expert outputs (rows * hidden)", handle.num_rows())
        };
        let want = rows * self.cfg.hidden;
        if expert_out.len() != want {
            return Err(Error::LengthMismatch {
                what,
                got: expert_out.len(),
                expected: want,
            });
        }
        Ok(())
    }

    /// Rows combine_tokens sends to each PE (one per token received from it) and expects from
    /// each (one per token of this PE that went there).
    fn combine_token_counts(&self, handle: &Handle) -> (Vec<usize>, Vec<usize>) {
        let k = handle.top_k;
        let mut expect = vec![0usize; self.n];
        for t in 0..handle.num_tokens {
            for (d, e) in expect.iter_mut().enumerate() {
                if handle.src_slot_pe[t * k..(t + 1) * k].contains(&(d as i32)) {
                    *e += 1;
                }
            }
        }
        (handle.recv_tokens_per_pe.clone(), expect)
    }

    /// Rows this PE sends to each source in combine, and expects back from each PE.
    fn combine_counts(&self, handle: &Handle) -> (Vec<usize>, Vec<usize>) {
        let mut send = vec![0usize; self.n];
        for &i in &handle.row_token {
            send[handle.recv_src_pe[i as usize] as usize] += 1;
        }
        let mut expect = vec![0usize; self.n];
        for &p in &handle.src_slot_pe {
            if p >= 0 {
                expect[p as usize] += 1;
            }
        }
        (send, expect)
    }

    /// Sends the expert outputs (`[handle.num_rows(), H]`, in dispatch's expert-major order)
    /// back to their source tokens and returns this PE's `[T, H]`: for each token the sum over
    /// its top-k slots, in slot order, of weight × expert output, accumulated in `f32` and rounded
    /// once; tokens without experts give zeros. Collective over the team; `handle` is the one
    /// this PE's `dispatch` on this buffer returned (the same dispatch on every PE).
    pub fn combine(&mut self, pe: &Pe, handle: &Handle, expert_out: &[T]) -> Result<Vec<T>> {
        self.combine_with(pe, handle, expert_out, false)
    }

    /// Combine for callers that reduce over their local experts themselves (DeepEP's combine):
    /// `token_out` is `[handle.num_recv_tokens(), H]` in receive order (the order of a
    /// [`RecvLayout::TokenMajor`] dispatch's rows), each row already the token's result on
    /// this PE (weights applied by the caller). Each row goes back to its source, which sums a
    /// token's rows over the PEs it went to (ascending PE, `f32`, rounded once) into `[T, H]`;
    /// tokens without experts give zeros. Works after a dispatch of either layout; collective
    /// over the team (every PE calls `combine_tokens` for the same dispatch).
    ///
    /// ```
    /// use rshmem::ep::{Buffer, EpConfig, EpMode, RecvLayout};
    /// let r = rshmem::threads(2, |pe| -> rshmem::Result<Vec<f32>> {
    ///     let cfg = EpConfig { num_experts: 4, max_tokens: 2, hidden: 2, max_topk: 2,
    ///                          mode: EpMode::Normal, layout: RecvLayout::TokenMajor };
    ///     let mut buf = Buffer::<f32>::new(pe, pe.world_team(), cfg)?;
    ///     let x = [1.0, 2.0, 3.0, 4.0];          // 2 tokens, H = 2
    ///     let ids: [i32; 4] = [0, 3, 1, -1];     // token 0 -> experts 0 (PE 0), 3 (PE 1)
    ///     let w = [0.5, 0.25, 1.0, 0.0];
    ///     let d = buf.dispatch(pe, &x, &ids, &w, 2)?;
    ///     // Each received token once; its result here: the weighted sum over the slots this PE
    ///     // serves (identity experts).
    ///     let h = d.handle.clone();
    ///     let k = h.top_k();
    ///     let mut y = d.x.clone();
    ///     for (i, row) in y.chunks_mut(2).enumerate() {
    ///         let f: f32 = (0..k).filter(|&j| h.recv_topk_local()[i * k + j] >= 0)
    ///             .map(|j| h.recv_topk_weights()[i * k + j]).sum();
    ///         row.iter_mut().for_each(|v| *v *= f);
    ///     }
    ///     let out = buf.combine_tokens(pe, &h, &y)?;
    ///     buf.free(pe)?;
    ///     Ok(out)
    /// }).unwrap();
    /// for out in r {
    ///     // token 0: x * (0.5 + 0.25) from two PEs; token 1: x * 1.0 from PE 0
    ///     assert_eq!(out.unwrap(), vec![0.75, 1.5, 3.0, 4.0]);
    /// }
    /// ```
    pub fn combine_tokens(&mut self, pe: &Pe, handle: &Handle, token_out: &[T]) -> Result<Vec<T>> {
        self.combine_with(pe, handle, token_out, true)
    }

    /// combine (`tokens` false: expert-major `rows`) or combine_tokens (`tokens`: one row per
    /// received token).
    fn combine_with(
        &mut self,
        pe: &Pe,
        handle: &Handle,
        rows: &[T],
        tokens: bool,
    ) -> Result<Vec<T>> {
        self.epoch += 1;
        let n = self.n;
        let op = if tokens {
            OP_COMBINE_TOKENS
        } else {
            OP_COMBINE
        };
        let mine = self.validate_combine(pe, handle, rows, tokens).err();
        let status = if mine.is_some() {
            STATUS_INVALID
        } else {
            STATUS_OK
        };
        let (send, expect) = match (&mine, tokens) {
            (Some(_), _) => (vec![0; n], vec![0; n]),
            (None, true) => self.combine_token_counts(handle),
            (None, false) => self.combine_counts(handle),
        };
        let rec = self.exchange(pe, |d| {
            self.record(
                op,
                status,
                handle.top_k,
                handle.num_tokens,
                handle.epoch,
                &send,
                &expect,
                None,
                d,
            )
        })?;
        self.decide(op, &rec, mine)?;
        for s in 0..n {
            for d in 0..n {
                if rec.cnt(s, d) != rec.expect(d, s) {
                    return Err(Error::CollectiveMismatch {
                        op: op_name(op),
                        pe: self.members[s],
                        mine: format!(
                            "PE {} expects {} rows from it",
                            self.members[d],
                            rec.expect(d, s)
                        ),
                        theirs: format!(
                            "{} rows (handles of different dispatches?)",
                            rec.cnt(s, d)
                        ),
                    });
                }
            }
        }
        let h = self.cfg.hidden;
        let k = handle.top_k;
        if tokens {
            // One row per received token, at the source's row of the token's first slot
            // served here (slots are split between PEs, so it is this PE's alone).
            for (i, y) in rows.chunks(h).enumerate() {
                let s = handle.recv_src_pe[i] as usize;
                let t = handle.recv_src_token[i] as usize;
                let j = handle.recv_topk_local[i * k..(i + 1) * k]
                    .iter()
                    .position(|&l| l >= 0)
                    .ok_or_else(|| Error::invalid("ep: internal: received token without slots"))?;
                pe.put(&self.comb()?, (t * k + j) * h, y, self.members[s])?;
            }
        } else {
            for (r, y) in rows.chunks(h).enumerate() {
                let i = handle.row_token[r] as usize;
                let s = handle.recv_src_pe[i] as usize;
                let t = handle.recv_src_token[i] as usize;
                let j = handle.row_slot[r] as usize;
                pe.put(&self.comb()?, (t * k + j) * h, y, self.members[s])?;
            }
        }
        for kk in 0..n {
            let d = (self.me + 1 + kk) % n;
            self.signal_done(pe, d, send[d])?;
        }
        self.wait_data(pe, &rec, "ep combine")?;
        let mut got = vec![T::ZERO; handle.num_tokens * k * h];
        pe.get(&self.comb()?, 0, &mut got, pe.my_pe())?;
        if tokens {
            return Ok(reduce_tokens(
                &got,
                &handle.src_slot_pe,
                n,
                handle.num_tokens,
                k,
                h,
            ));
        }
        Ok(reduce(
            &got,
            &handle.src_slot_pe,
            &handle.src_weights,
            handle.num_tokens,
            k,
            h,
        ))
    }

    // ----- the all-to-all-v baseline (same results, barriers and staging) -----

    /// The same dispatch as [`dispatch`](Self::dispatch), done the all-to-all-v way: counts
    /// exchanged between barriers, payload packed per destination into a staging copy and put in
    /// one piece per destination, a barrier, then local reordering. Inputs must be valid on every
    /// PE (a benchmark baseline: an error here may leave peers waiting until the timeout).
    pub(crate) fn dispatch_a2av<I: TopkId>(
        &mut self,
        pe: &Pe,
        team: &Team,
        x: &[T],
        topk_ids: &[I],
        topk_weights: &[f32],
        top_k: usize,
    ) -> Result<Dispatched<T>> {
        if self.cfg.mode != EpMode::Normal {
            return Err(Error::invalid(
                "ep: the all-to-all-v baseline needs a normal-mode buffer",
            ));
        }
        let layout = self.validate_dispatch(pe, x, topk_ids, topk_weights, top_k)?;
        let n = self.n;
        let h = self.cfg.hidden;
        let rmw = self.rmw;
        let tokens = layout.num_tokens();
        let mut cnt_rec = layout.tokens_per_pe().to_vec();
        cnt_rec.push(tokens);
        // Counts per destination, plus T (needed to check token indices).
        let m = self.a2av_counts(pe, team, &cnt_rec)?;
        let off = |s: usize, d: usize| -> usize { (0..s).map(|q| m[q][d]).sum() };
        let mut stage_x: Vec<T> = Vec::new();
        let mut stage_m: Vec<u32> = Vec::new();
        for d in 0..n {
            stage_x.clear();
            stage_m.clear();
            for t in 0..tokens {
                if !layout.is_token_in_pe(t, d) {
                    continue;
                }
                stage_x.extend_from_slice(&x[t * h..(t + 1) * h]);
                let at = stage_m.len();
                stage_m.resize(at + rmw, 0);
                let mr = &mut stage_m[at..];
                mr[0] = t as u32;
                for j in 0..top_k {
                    mr[1 + j] = topk_ids[t * top_k + j].to_i64() as i32 as u32;
                    mr[1 + top_k + j] = topk_weights[t * top_k + j].to_bits();
                }
            }
            let base = off(self.me, d);
            pe.put(&self.recv_x()?, base * h, &stage_x, self.members[d])?;
            pe.put(&self.recv_meta()?, base * rmw, &stage_m, self.members[d])?;
        }
        pe.team_barrier(team)?;
        let total: usize = (0..n).map(|s| m[s][self.me]).sum();
        let mut all_x = vec![T::ZERO; total * h];
        let mut all_m = vec![0u32; total * rmw];
        pe.get(&self.recv_x()?, 0, &mut all_x, pe.my_pe())?;
        pe.get(&self.recv_meta()?, 0, &mut all_m, pe.my_pe())?;
        // Records equivalent to the signal path's, for the shared assembly and its checks.
        let rec = Records {
            rows: (0..n)
                .map(|s| {
                    let mut r = vec![0u64; self.mw];
                    r[R_TOKENS] = m[s][n] as u64;
                    r[R_FIXED + self.me] = m[s][self.me] as u64;
                    r
                })
                .collect(),
            n,
        };
        let mut parts = Vec::with_capacity(n);
        for s in 0..n {
            let b = off(s, self.me);
            parts.push(&all_m[b * rmw..(b + m[s][self.me]) * rmw]);
        }
        let mut handle = self.assemble_unchecked_pairs(&rec, &parts, top_k)?;
        handle.src_weights = topk_weights.to_vec();
        handle.src_slot_pe = layout.slot_pes().to_vec();
        handle.num_tokens = tokens;
        let out = match self.cfg.layout {
            RecvLayout::ExpertMajor => {
                let mut out = vec![T::ZERO; handle.num_rows() * h];
                for (r, row) in out.chunks_mut(h).enumerate() {
                    let i = handle.row_token[r] as usize;
                    row.copy_from_slice(&all_x[i * h..(i + 1) * h]);
                }
                out
            }
            RecvLayout::TokenMajor => all_x,
        };
        Ok(Dispatched { x: out, handle })
    }

    /// Exchanges one row of counts per PE through the record area, between barriers.
    fn a2av_counts(&self, pe: &Pe, team: &Team, row: &[usize]) -> Result<Vec<Vec<usize>>> {
        // The record area holds 2 * n * mw >= n * (n + 1) words.
        let n = self.n;
        let w = row.len();
        pe.team_barrier(team)?;
        let r: Vec<u64> = row.iter().map(|&c| c as u64).collect();
        for d in 0..n {
            pe.put(&self.meta()?, self.me * w, &r, self.members[d])?;
        }
        pe.team_barrier(team)?;
        let mut all = vec![0u64; n * w];
        pe.get(&self.meta()?, 0, &mut all, pe.my_pe())?;
        Ok(all
            .chunks(w)
            .map(|r| r.iter().map(|&c| c as usize).collect())
            .collect())
    }

    /// [`assemble`](Self::assemble) where the records carry no per-expert counts.
    fn assemble_unchecked_pairs(
        &self,
        rec: &Records,
        rows: &[&[u32]],
        top_k: usize,
    ) -> Result<Handle> {
        // Fill the per-expert counts from the rows themselves, then assemble (which rechecks).
        let lo = (self.me * self.epp) as i64;
        let mut rec2 = Records {
            rows: rec.rows.clone(),
            n: rec.n,
        };
        for (s, m) in rows.iter().enumerate() {
            for r in m.chunks(self.rmw) {
                for j in 0..top_k {
                    let id = r[1 + j] as i32 as i64;
                    if id >= lo && id < lo + self.epp as i64 {
                        rec2.rows[s][R_FIXED + 2 * self.n + (id - lo) as usize] += 1;
                    }
                }
            }
        }
        self.assemble(&rec2, rows, top_k)
    }

    /// The same combine as [`combine`](Self::combine) (or, with `tokens`,
    /// [`combine_tokens`](Self::combine_tokens)), the all-to-all-v way: counts exchanged, the
    /// rows for each source packed (token, slot order; one row per token with `tokens`) and put
    /// in one piece, a barrier, then the source scatters them to their slots and reduces.
    /// Baseline for benchmarks.
    pub(crate) fn combine_a2av(
        &mut self,
        pe: &Pe,
        team: &Team,
        handle: &Handle,
        rows: &[T],
        tokens: bool,
    ) -> Result<Vec<T>> {
        self.validate_combine(pe, handle, rows, tokens)?;
        let n = self.n;
        let h = self.cfg.hidden;
        let k = handle.top_k;
        let (send, expect) = if tokens {
            self.combine_token_counts(handle)
        } else {
            self.combine_counts(handle)
        };
        let m = self.a2av_counts(pe, team, &send)?;
        let off = |s: usize, d: usize| -> usize { (0..s).map(|q| m[q][d]).sum() };
        // Expert row of each (received token, slot).
        let mut row_of = vec![usize::MAX; handle.num_recv_tokens() * k];
        for (r, (&i, &j)) in handle.row_token.iter().zip(&handle.row_slot).enumerate() {
            row_of[i as usize * k + j as usize] = r;
        }
        let mut stage: Vec<T> = Vec::new();
        let mut first = 0usize;
        for s in 0..n {
            let cnt = handle.recv_tokens_per_pe[s];
            stage.clear();
            for i in first..first + cnt {
                if tokens {
                    stage.extend_from_slice(&rows[i * h..(i + 1) * h]);
                    continue;
                }
                for j in 0..k {
                    let r = row_of[i * k + j];
                    if r != usize::MAX {
                        stage.extend_from_slice(&rows[r * h..(r + 1) * h]);
                    }
                }
            }
            first += cnt;
            pe.put(&self.comb()?, off(self.me, s) * h, &stage, self.members[s])?;
        }
        pe.team_barrier(team)?;
        let total: usize = expect.iter().sum();
        let mut got = vec![T::ZERO; total * h];
        pe.get(&self.comb()?, 0, &mut got, pe.my_pe())?;
        // Unpack: from PE d, its rows in (token, slot) order; with `tokens` one per token, to
        // the token's first slot served by d (where combine_tokens' puts land).
        let t_n = handle.num_tokens;
        let mut scattered = vec![T::ZERO; t_n * k * h];
        for d in 0..n {
            let mut r = off(d, self.me);
            for t in 0..t_n {
                for j in 0..k {
                    if handle.src_slot_pe[t * k + j] == d as i32 {
                        let dst = (t * k + j) * h;
                        scattered[dst..dst + h].copy_from_slice(&got[r * h..(r + 1) * h]);
                        r += 1;
                        if tokens {
                            break;
                        }
                    }
                }
            }
        }
        Ok(if tokens {
            reduce_tokens(&scattered, &handle.src_slot_pe, n, t_n, k, h)
        } else {
            reduce(
                &scattered,
                &handle.src_slot_pe,
                &handle.src_weights,
                t_n,
                k,
                h,
            )
        })
    }
}

/// Widens a row of hidden states to `f32` (exact for f32, bf16 and f16).
fn widen<T: Elem>(row: &[T], out: &mut [f32]) {
    let bytes = crate::sym::as_bytes(row);
    match T::KIND {
        ElemKind::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        ElemKind::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_ne_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        _ => {
            for (o, v) in out.iter_mut().zip(row) {
                *o = v.to_f64() as f32;
            }
        }
    }
}

/// Rounds `acc` to `T` into `out`, as `T::from_f64(a as f64)` would (widening an `f32` to
/// `f64` is exact, so rounding from `f32` directly gives the same value) without the slower
/// generic path for f32, bf16 and f16.
fn narrow<T: Elem>(acc: &[f32], out: &mut [T]) {
    match T::KIND {
        ElemKind::F32 | ElemKind::Bf16 | ElemKind::F16 => {
            let bytes = crate::sym::as_bytes_mut(out);
            let w = std::mem::size_of::<T>();
            for (b, a) in bytes.chunks_exact_mut(w).zip(acc) {
                match T::KIND {
                    ElemKind::F32 => b.copy_from_slice(&a.to_ne_bytes()),
                    ElemKind::Bf16 => {
                        b.copy_from_slice(&half::bf16::from_f32(*a).to_bits().to_ne_bytes())
                    }
                    _ => b.copy_from_slice(&half::f16::from_f32(*a).to_bits().to_ne_bytes()),
                }
            }
        }
        _ => {
            for (o, a) in out.iter_mut().zip(acc) {
                *o = T::from_f64(*a as f64);
            }
        }
    }
}

/// combine_tokens' source side: for each token, the sum over the PEs it went to (ascending) of
/// the row that PE put at the token's first slot served there, in `f32`, rounded once.
fn reduce_tokens<T: Elem>(
    y: &[T],
    slot_pe: &[i32],
    n: usize,
    t_n: usize,
    k: usize,
    h: usize,
) -> Vec<T> {
    let mut out = vec![T::ZERO; t_n * h];
    let mut acc = vec![0f32; h];
    let mut wide = vec![0f32; h];
    for t in 0..t_n {
        acc.fill(0.0);
        let slots = &slot_pe[t * k..(t + 1) * k];
        for d in 0..n as i32 {
            let Some(j) = slots.iter().position(|&p| p == d) else {
                continue;
            };
            widen(&y[(t * k + j) * h..(t * k + j + 1) * h], &mut wide);
            for (a, v) in acc.iter_mut().zip(&wide) {
                *a += v;
            }
        }
        narrow(&acc, &mut out[t * h..(t + 1) * h]);
    }
    out
}

/// `out[t] = Σ_j w[t,j] * y[t*k+j]` over the slots with an expert, in slot order, in `f32`,
/// rounded once.
fn reduce<T: Elem>(y: &[T], slot_pe: &[i32], w: &[f32], t_n: usize, k: usize, h: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; t_n * h];
    let mut acc = vec![0f32; h];
    let mut wide = vec![0f32; h];
    for t in 0..t_n {
        acc.fill(0.0);
        for j in 0..k {
            if slot_pe[t * k + j] < 0 {
                continue;
            }
            let wj = w[t * k + j];
            widen(&y[(t * k + j) * h..(t * k + j + 1) * h], &mut wide);
            for (a, v) in acc.iter_mut().zip(&wide) {
                *a += wj * v;
            }
        }
        narrow(&acc, &mut out[t * h..(t + 1) * h]);
    }
    out
}
