//! The dispatch layout: which PEs each token goes to, and the counts. Pure and backend-free.

use super::TopkId;
use crate::error::{Error, Result};

/// Lays areas of `sizes` bytes out one after another in a buffer, each starting on a 256-byte
/// boundary: their offsets and the buffer's size (`what` names the buffer in the overflow
/// error).
pub(crate) fn pack_areas<const N: usize>(
    what: &str,
    sizes: [usize; N],
) -> Result<([usize; N], usize)> {
    let mut offs = [0usize; N];
    let mut at = 0usize;
    for (o, sz) in offs.iter_mut().zip(sizes) {
        *o = at;
        at = at
            .checked_add(sz)
            .and_then(|v| v.checked_next_multiple_of(256))
            .ok_or_else(|| Error::invalid(format!("{what}: buffer size overflows")))?;
    }
    Ok((offs, at))
}

/// Where one PE's tokens go, computed from its top-k expert ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    num_tokens: usize,
    top_k: usize,
    n_pes: usize,
    experts_per_pe: usize,
    /// `[T, k]`: the team PE serving each slot, -1 for `-1` ids.
    slot_pe: Vec<i32>,
    /// `[T, n]`: token `t` goes to PE `p` (once, however many of its experts live there).
    in_pe: Vec<bool>,
    /// `[n]`: tokens sent to each PE.
    tokens_per_pe: Vec<usize>,
    /// `[E]`: (token, slot) pairs routed to each expert.
    pairs_per_expert: Vec<usize>,
}

impl Layout {
    /// Computes the layout of `topk_ids` (`[T, top_k]`, row-major) for `num_experts` experts
    /// split evenly over `n_pes` PEs. Every id must be `-1` or in `0..num_experts`.
    pub fn compute<I: TopkId>(
        topk_ids: &[I],
        top_k: usize,
        num_experts: usize,
        n_pes: usize,
    ) -> Result<Layout> {
        if top_k == 0 {
            return Err(Error::invalid("ep: top_k must be at least 1"));
        }
        if n_pes == 0 || num_experts == 0 || !num_experts.is_multiple_of(n_pes) {
            return Err(Error::invalid(format!(
                "ep: {num_experts} experts cannot be split evenly over {n_pes} PEs"
            )));
        }
        if !topk_ids.len().is_multiple_of(top_k) {
            return Err(Error::invalid(format!(
                "ep: {} top-k ids is not a multiple of top_k {top_k}",
                topk_ids.len()
            )));
        }
        let t_n = topk_ids.len() / top_k;
        let epp = num_experts / n_pes;
        let mut slot_pe = vec![-1i32; topk_ids.len()];
        let mut in_pe = vec![false; t_n * n_pes];
        let mut tokens_per_pe = vec![0usize; n_pes];
        let mut pairs_per_expert = vec![0usize; num_experts];
        for (i, id) in topk_ids.iter().enumerate() {
            let id = id.to_i64();
            if id == -1 {
                continue;
            }
            if id < 0 || id >= num_experts as i64 {
                return Err(Error::invalid(format!(
                    "ep: expert id {id} of token {} slot {} is out of range (-1 or 0..{num_experts})",
                    i / top_k,
                    i % top_k
                )));
            }
            let e = id as usize;
            let p = e / epp;
            slot_pe[i] = p as i32;
            pairs_per_expert[e] += 1;
            let cell = &mut in_pe[(i / top_k) * n_pes + p];
            if !*cell {
                *cell = true;
                tokens_per_pe[p] += 1;
            }
        }
        Ok(Layout {
            num_tokens: t_n,
            top_k,
            n_pes,
            experts_per_pe: epp,
            slot_pe,
            in_pe,
            tokens_per_pe,
            pairs_per_expert,
        })
    }

    /// Number of tokens `T`.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    /// Top-k `k`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Team size.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }
    /// Experts per PE (`E / n`).
    pub fn experts_per_pe(&self) -> usize {
        self.experts_per_pe
    }
    /// Token `t`'s row of `in_pe` (empty when there is no token `t`).
    fn row(&self, t: usize) -> &[bool] {
        let n = self.n_pes;
        if t >= self.num_tokens {
            return &[];
        }
        &self.in_pe[t * n..(t + 1) * n]
    }
    /// True when token `t` goes to PE `pe` (false when there is no such token or PE).
    pub fn is_token_in_pe(&self, t: usize, pe: usize) -> bool {
        self.row(t).get(pe).copied().unwrap_or(false)
    }
    /// The PEs token `t` goes to, ascending, each once (none when there is no token `t`).
    pub fn token_pes(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        let row = self.row(t);
        row.iter().enumerate().filter_map(|(p, &b)| b.then_some(p))
    }
    /// `[T, k]`: the PE serving each slot, -1 where the id is -1.
    pub fn slot_pes(&self) -> &[i32] {
        &self.slot_pe
    }
    /// Tokens sent to each PE (`[n]`).
    pub fn tokens_per_pe(&self) -> &[usize] {
        &self.tokens_per_pe
    }
    /// (token, slot) pairs routed to each expert (`[E]`).
    pub fn pairs_per_expert(&self) -> &[usize] {
        &self.pairs_per_expert
    }
    /// (token, slot) pairs routed to each local expert of PE `pe` (`[E/n]`; empty when `pe`
    /// is not in the team).
    pub fn pairs_per_local_expert(&self, pe: usize) -> &[usize] {
        if pe >= self.n_pes {
            return &[];
        }
        &self.pairs_per_expert[pe * self.experts_per_pe..(pe + 1) * self.experts_per_pe]
    }
    /// (token, slot) pairs served by PE `pe`: the expert rows it computes for this PE.
    pub fn pairs_to_pe(&self, pe: usize) -> usize {
        self.pairs_per_local_expert(pe).iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        // 3 tokens, k = 3, 6 experts on 3 PEs (2 each).
        let ids: [i64; 9] = [0, 1, 4, -1, -1, -1, 5, 5, 2];
        let l = Layout::compute(&ids, 3, 6, 3).unwrap();
        assert_eq!(l.num_tokens(), 3);
        assert_eq!(l.tokens_per_pe(), &[1, 1, 2]);
        assert_eq!(l.pairs_per_expert(), &[1, 1, 1, 0, 1, 2]);
        assert_eq!(l.token_pes(0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(l.token_pes(1).count(), 0);
        assert_eq!(l.token_pes(2).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(l.slot_pes(), &[0, 0, 2, -1, -1, -1, 2, 2, 1]);
        assert_eq!(l.pairs_to_pe(2), 3);
        assert_eq!(l.pairs_per_local_expert(1), &[1, 0]);
    }

    #[test]
    fn out_of_range_queries() {
        // 2 tokens, k = 1, 4 experts on 2 PEs: token 0 -> PE 1, token 1 -> PE 0.
        let l = Layout::compute(&[3i64, 0], 1, 4, 2).unwrap();
        assert!(l.is_token_in_pe(0, 1) && l.is_token_in_pe(1, 0));
        // PE 2 is not in the team (the cell after token 0's row belongs to token 1)
        assert!(!l.is_token_in_pe(0, 2));
        assert!(!l.is_token_in_pe(2, 0));
        assert!(!l.is_token_in_pe(usize::MAX, usize::MAX));
        assert_eq!(l.token_pes(2).count(), 0);
        assert_eq!(l.token_pes(usize::MAX).count(), 0);
        assert!(l.pairs_per_local_expert(2).is_empty());
        assert_eq!(l.pairs_to_pe(usize::MAX), 0);
    }

    #[test]
    fn ids_beyond_i32_are_out_of_range() {
        // never truncated to a small (valid) id
        for id in [1i64 << 32, (1i64 << 32) + 1, i64::MAX, i64::MIN] {
            assert!(
                matches!(
                    Layout::compute(&[id, 0], 2, 4, 2),
                    Err(Error::InvalidArgument(_))
                ),
                "{id}"
            );
        }
    }

    #[test]
    fn bad_ids() {
        // each error names what is wrong (and where)
        let err = |r: Result<Layout>, words: &[&str]| match r {
            Err(Error::InvalidArgument(m)) => {
                for w in words {
                    assert!(m.contains(w), "{m:?} lacks {w:?}");
                }
            }
            other => panic!("expected InvalidArgument with {words:?}, got {other:?}"),
        };
        err(
            Layout::compute(&[0i32, 1, 6], 3, 6, 3),
            &["expert id 6", "token 0 slot 2"],
        );
        err(
            Layout::compute(&[0i32, -1, 1, -2], 2, 6, 3),
            &["expert id -2", "token 1 slot 1"],
        );
        err(
            Layout::compute(&[0i64, 1, 2], 2, 6, 3),
            &["3 top-k ids", "top_k 2"],
        );
        err(Layout::compute(&[0i32], 0, 6, 3), &["top_k"]);
        err(Layout::compute(&[0i32], 1, 7, 3), &["7 experts", "3 PEs"]);
        err(Layout::compute(&[0i32], 1, 0, 3), &["0 experts"]);
        err(Layout::compute(&[0i32], 1, 6, 0), &["0 PEs"]);
        // no tokens at all is fine: nothing to send
        let l = Layout::compute::<i32>(&[], 1, 6, 3).unwrap();
        assert_eq!(l.num_tokens(), 0);
        assert_eq!(l.tokens_per_pe(), &[0, 0, 0]);
        assert_eq!(l.pairs_per_expert(), &[0; 6]);
    }
}
