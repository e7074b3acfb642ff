//! Combine: the rows back to their tokens' PEs, weighted sums in f32, rounded once.

use super::*;
use crate::pe::CallKind;

impl<T: Elem> HostBuffer<T> {
    // ----- combine -----

    pub(super) fn validate_combine(
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
    pub(super) fn combine_token_counts(&self, handle: &Handle) -> (Vec<usize>, Vec<usize>) {
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
    pub(super) fn combine_counts(&self, handle: &Handle) -> (Vec<usize>, Vec<usize>) {
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
    /// use rshmem::ep::{HostBuffer, EpConfig, EpMode, RecvLayout};
    /// let r = rshmem::Launch::new().threads().run(2, |pe| -> rshmem::Result<Vec<f32>> {
    ///     let cfg = EpConfig { num_experts: 4, max_tokens: 2, hidden: 2, max_topk: 2,
    ///                          mode: EpMode::Normal, layout: RecvLayout::TokenMajor };
    ///     let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg)?;
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
    ///     pe.free(buf)?;
    ///     Ok(out)
    /// }).values().unwrap();
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
    pub(super) fn combine_with(
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
        let recs: Vec<Vec<u64>> = (0..n)
            .map(|d| {
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
            })
            .collect();
        let rec = self.exchange(pe, CallKind::EpCombine, &recs)?;
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
        if self.hier {
            return self.combine_internode(pe, handle, rows, tokens, &rec);
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
    /// A benchmark hook, not part of the supported API.
    // for rshmem-bench: the host MoE benchmark's same-run baseline (it works in this buffer's
    // areas and builds a Handle, so it stays beside them).
    #[doc(hidden)]
    pub fn dispatch_a2av<I: TopkId>(
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
        let m = self.a2av_counts(pe, team, &cnt_rec, CallKind::EpDispatch)?;
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
        pe.team_barrier_as(team, CallKind::EpDispatch)?;
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
    pub(super) fn a2av_counts(
        &self,
        pe: &Pe,
        team: &Team,
        row: &[usize],
        call: CallKind,
    ) -> Result<Vec<Vec<usize>>> {
        // The record area holds 2 * n * mw >= n * (n + 1) words.
        let n = self.n;
        let w = row.len();
        pe.team_barrier_as(team, call)?;
        let r: Vec<u64> = row.iter().map(|&c| c as u64).collect();
        for d in 0..n {
            pe.put(&self.meta()?, self.me * w, &r, self.members[d])?;
        }
        pe.team_barrier_as(team, call)?;
        let mut all = vec![0u64; n * w];
        pe.get(&self.meta()?, 0, &mut all, pe.my_pe())?;
        Ok(all
            .chunks(w)
            .map(|r| r.iter().map(|&c| c as usize).collect())
            .collect())
    }

    /// [`assemble`](Self::assemble) where the records carry no per-expert counts.
    pub(super) fn assemble_unchecked_pairs(
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
    /// Baseline for benchmarks; a benchmark hook, not part of the supported API.
    // for rshmem-bench: as dispatch_a2av.
    #[doc(hidden)]
    pub fn combine_a2av(
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
        let m = self.a2av_counts(pe, team, &send, CallKind::EpCombine)?;
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
        pe.team_barrier_as(team, CallKind::EpCombine)?;
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
pub(super) fn widen<T: Elem>(row: &[T], out: &mut [f32]) {
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
pub(super) fn narrow<T: Elem>(acc: &[f32], out: &mut [T]) {
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
pub(super) fn reduce_tokens<T: Elem>(
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
pub(super) fn reduce<T: Elem>(
    y: &[T],
    slot_pe: &[i32],
    w: &[f32],
    t_n: usize,
    k: usize,
    h: usize,
) -> Vec<T> {
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
