//! Dispatch: checks every PE's inputs, agrees on the layout, moves the rows by puts and signals.

use super::*;

impl<T: Elem> HostBuffer<T> {
    // ----- validation -----

    /// Checks one PE's dispatch inputs; returns the layout.
    pub(super) fn validate_dispatch<I: TopkId>(
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
        let rows: Vec<Vec<u64>> = (0..n)
            .map(|d| {
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
            })
            .collect();
        let rec = self.exchange(pe, CallKind::EpDispatch, &rows)?;
        self.decide(OP_DISPATCH, &rec, mine)?;
        self.check_capacity("ep dispatch", &rec)?;
        let layout = layout.ok_or_else(|| Error::invalid("ep: internal: no layout"))?;

        // Move: each token once to each PE it goes to, straight from `x` (internode: once to
        // each other node, which forwards it).
        let h = self.cfg.hidden;
        let rmw = self.rmw;
        let src = Src {
            x,
            layout: &layout,
            ids: topk_ids,
            weights: topk_weights,
            top_k,
        };
        let fwd = if self.hier {
            self.send_internode(pe, &rec, &src)?
        } else {
            for k in 0..n {
                self.send_direct(pe, &rec, &src, (self.me + 1 + k) % n)?;
            }
            Vec::new()
        };
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
        handle.fwd = fwd;
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

    /// Puts this PE's tokens for member `d` (rows, then their records) into `d`'s receive
    /// area, then the signal carrying their number.
    pub(super) fn send_direct<I: TopkId>(
        &self,
        pe: &Pe,
        rec: &Records,
        src: &Src<'_, T, I>,
        d: usize,
    ) -> Result<()> {
        let (h, rmw) = (self.cfg.hidden, self.rmw);
        let wd = self.members[d];
        let base = self.base(rec, self.me, d);
        let mut meta_rows: Vec<u32> = Vec::new();
        let mut r = 0;
        for t in 0..src.layout.num_tokens() {
            if !src.layout.is_token_in_pe(t, d) {
                continue;
            }
            pe.put(
                &self.recv_x()?,
                (base + r) * h,
                &src.x[t * h..(t + 1) * h],
                wd,
            )?;
            src.record(t, rmw, &mut meta_rows);
            r += 1;
        }
        if r > 0 {
            pe.put(&self.recv_meta()?, base * rmw, &meta_rows, wd)?;
        }
        self.signal_done(pe, d, r)
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
            fwd: Vec::new(),
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
}

/// One PE's dispatch inputs, checked.
pub(super) struct Src<'a, T, I> {
    pub x: &'a [T],
    pub layout: &'a Layout,
    pub ids: &'a [I],
    pub weights: &'a [f32],
    pub top_k: usize,
}

impl<T, I: TopkId> Src<'_, T, I> {
    /// Appends token `t`'s row record (token index, k ids, k weights; `rmw` words).
    pub fn record(&self, t: usize, rmw: usize, out: &mut Vec<u32>) {
        let k = self.top_k;
        let at = out.len();
        out.resize(at + rmw, 0);
        let m = &mut out[at..];
        m[0] = t as u32;
        for j in 0..k {
            m[1 + j] = self.ids[t * k + j].to_i64() as i32 as u32;
            m[1 + k + j] = self.weights[t * k + j].to_bits();
        }
    }
}
