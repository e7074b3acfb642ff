//! What dispatch returns: the expert-major rows and the handle combine needs.

/// The result of [`HostBuffer::dispatch`](super::HostBuffer::dispatch) on one PE.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched<T> {
    /// With [`RecvLayout::ExpertMajor`](super::RecvLayout::ExpertMajor): expert-major rows
    /// `[handle.num_rows(), H]`, for local expert 0, 1, …, every (received token, slot) it
    /// serves, in (source PE, source token, slot) order. With
    /// [`RecvLayout::TokenMajor`](super::RecvLayout::TokenMajor): the received tokens
    /// `[handle.num_recv_tokens(), H]` in receive order (by source PE, then source token);
    /// expert-major row `r` is token [`Handle::row_token`]`[r]`.
    pub x: Vec<T>,
    /// The bookkeeping for [`HostBuffer::combine`](super::HostBuffer::combine).
    pub handle: Handle,
}

/// The bookkeeping of one dispatch on one PE: what was received from whom, and where each
/// expert row goes back to. Read-only; combine trusts it, so it cannot be built outside.
#[derive(Debug, Clone, PartialEq)]
pub struct Handle {
    pub(crate) buffer_id: u64,
    /// The dispatch's call number on its buffer (equal on every PE for the same dispatch).
    pub(crate) epoch: u64,
    pub(crate) n_pes: usize,
    pub(crate) experts_per_pe: usize,
    pub(crate) top_k: usize,
    pub(crate) hidden: usize,
    // ----- this PE as a source -----
    pub(crate) num_tokens: usize,
    /// `[T, k]` this PE's weights.
    pub(crate) src_weights: Vec<f32>,
    /// `[T, k]` the team PE serving each slot, -1 for none.
    pub(crate) src_slot_pe: Vec<i32>,
    // ----- this PE as a destination -----
    pub(crate) recv_src_pe: Vec<u32>,
    pub(crate) recv_src_token: Vec<u32>,
    pub(crate) recv_topk_local: Vec<i32>,
    pub(crate) recv_topk_weights: Vec<f32>,
    pub(crate) recv_tokens_per_pe: Vec<usize>,
    pub(crate) expert_offsets: Vec<usize>,
    pub(crate) row_token: Vec<u32>,
    pub(crate) row_slot: Vec<u32>,
    // ----- this PE as a forwarder (internode path) -----
    /// The tokens of other nodes' sources this PE forwarded to PEs of its node, by source,
    /// then token: combine folds their partials here and sends one row back.
    pub(crate) fwd: Vec<Forward>,
}

/// One token a PE forwarded in an internode dispatch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Forward {
    /// Source (team index) and its token index.
    pub src: u32,
    pub token: u32,
    /// (destination team index, the token's rank among those it received from `src`),
    /// destinations ascending.
    pub to: Vec<(u32, u32)>,
}

impl Handle {
    /// True when both handles describe the same routing (ignoring which buffer and call made
    /// them). A benchmark hook, not part of the supported API.
    // for rshmem-bench: checks its all-to-all-v baseline against dispatch.
    #[doc(hidden)]
    pub fn same_routing(&self, o: &Handle) -> bool {
        let mut a = self.clone();
        a.buffer_id = o.buffer_id;
        a.epoch = o.epoch;
        a.fwd.clone_from(&o.fwd);
        a == *o
    }
    /// Team size.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }
    /// Local experts per PE.
    pub fn experts_per_pe(&self) -> usize {
        self.experts_per_pe
    }
    /// The top-k of the dispatch.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Hidden size.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    /// Tokens this PE dispatched (`T`, the rows combine returns).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    /// Tokens received (each once, however many local experts it uses).
    pub fn num_recv_tokens(&self) -> usize {
        self.recv_src_pe.len()
    }
    /// Source PE (team index) of each received token, non-decreasing.
    pub fn recv_src_pe(&self) -> &[u32] {
        &self.recv_src_pe
    }
    /// Source token index of each received token (ascending within a source).
    pub fn recv_src_token(&self) -> &[u32] {
        &self.recv_src_token
    }
    /// `[received, k]`: for each received token and top-k slot, the local expert it serves
    /// here, or -1 when that slot's expert is elsewhere (or the id was -1).
    pub fn recv_topk_local(&self) -> &[i32] {
        &self.recv_topk_local
    }
    /// `[received, k]`: the weight of each slot served here, 0 for the others.
    pub fn recv_topk_weights(&self) -> &[f32] {
        &self.recv_topk_weights
    }
    /// Tokens received from each source PE.
    pub fn recv_tokens_per_pe(&self) -> &[usize] {
        &self.recv_tokens_per_pe
    }
    /// Number of expert-major rows (dispatch output rows, combine input rows).
    pub fn num_rows(&self) -> usize {
        self.row_token.len()
    }
    /// Rows per local expert.
    pub fn expert_counts(&self) -> Vec<usize> {
        self.expert_offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect()
    }
    /// `[E/n + 1]`: local expert `e`'s rows are `expert_offsets[e]..expert_offsets[e+1]`.
    pub fn expert_offsets(&self) -> &[usize] {
        &self.expert_offsets
    }
    /// For each expert-major row, the received token (index into the `recv_*` arrays).
    pub fn row_token(&self) -> &[u32] {
        &self.row_token
    }
    /// For each expert-major row, the top-k slot of its token it serves.
    pub fn row_slot(&self) -> &[u32] {
        &self.row_slot
    }
}
