//! Low-latency MoE dispatch and combine for decode ([`LowLatencyBuffer`]): DeepEP's
//! `low_latency_dispatch` / `low_latency_combine` semantics on fixed buffers, with no host
//! synchronisation and no CPU work per call beyond the launches, capturable in a CUDA graph.
//!
//! # Outputs (DeepEP's layout)
//! Dispatch fills, per local expert `e` (PE `p` of the team owns experts `p*L .. (p+1)*L`,
//! `L = E/n`), rows `0 .. count[e]` of `recv_x [L, n*M, H]` (`M` = max tokens per PE): the tokens
//! of source PE 0 that name `e` in token order, then those of PE 1, and so on;
//! `recv_src [L, n*M]` gives each row's source as `source_pe * M + source_token`,
//! `recv_layout [L, n, 2]` each (expert, source) pair's first row and row count,
//! `recv_count [L]` the rows of each expert. All stay on the GPU
//! ([`LowLatencyBuffer::recv_x`] and the other views; read them after the receive on the
//! stream). With FP8 ([`LlDispatchOpts::fp8`]) `recv_x` holds e4m3 bytes `[L, n*M, H]` and
//! one `f32` scale per 128 elements `[L, n*M, H/128]` ([`LowLatencyBuffer::recv_x_fp8`]):
//! element `i` is `e4m3[i] * scale[i / 128]`, the scale being the group's absolute maximum
//! (at least `1e-4`) over 448, quantised on the sending GPU.
//!
//! Combine takes the expert outputs `y` in the same layout (`[L, n*M, H]` bf16; `recv_x` itself
//! for identity experts) and the top-k weights, and returns `out [T, H]` bf16 with
//! `out[t] = sum over the slots j of t whose id is not -1 (ascending) of w[t, j] * y(row of
//! (t, id j))` in `f32` (products and sums rounded separately), rounded once.
//!
//! # How a call travels
//! * `ll_dispatch_send` (grid): per token, checks its ids (an id outside `-1, 0..E` is taken
//!   as -1 and latched: [`LowLatencyBuffer::check`] reports it; nothing is corrupted), writes
//!   the token's ids into every PE's metadata and its row **once per destination PE** into that
//!   PE's staging area at (source, token) — no layout kernel, no scan, no counts exchanged
//!   before the rows: the positions are the token indices. FP8 rows are quantised here. The
//!   grid's last block then sets this PE's flag (T + 1) on every PE after a system fence.
//! * `ll_dispatch_recv` (grid): a block per (local expert, source) waits for the flags of the
//!   sources up to its own, counts the earlier sources' tokens for its expert from the
//!   metadata (the first row), and expands each of its source's rows into the expert's slots
//!   (a row that names two local experts is copied twice here, not sent twice).
//! * `ll_combine_send` (grid): each block turns the experts' counts into row offsets, then a
//!   warp per received row sends it back to its source's combine area at (token, first slot
//!   naming the expert); the last block sets a flag on every PE.
//! * `ll_combine_recv` (grid): waits for every PE's flag and sums each token's slots.
//!
//! # Hooks and double buffering
//! [`LowLatencyBuffer::dispatch_send`] / [`LowLatencyBuffer::combine_send`] return once the
//! send kernel is queued; [`LowLatencyBuffer::dispatch_recv`] /
//! [`LowLatencyBuffer::combine_recv`] queue the receive kernel later, on any stream of this
//! PE's GPU: nothing occupies an SM in between (the waits are inside the receive kernels, which
//! only start then; a receive launched before its send has run waits for the send's flag, and
//! waits give up after the device timeout). Every area exists twice; dispatches alternate
//! between the halves (the host flips a parity per dispatch, a combine uses its dispatch's
//! half), so two micro-batches can be in flight: dispatch A, dispatch B, combine A, combine B
//! need no barrier. The rules that make reuse safe without one: **a PE's dispatch `c + 2` is
//! queued after the receive of its combine `c`**, in stream order (at most two dispatches
//! without their combine), and a combine's send is stream-ordered after its dispatch's receive
//! (it reads the counts and sources that the receive writes). A peer writes half
//! `h` of this PE only in a dispatch or combine that follows, on the peer, a receive that
//! waited for this PE's send of the previous call of that half, which this PE issued after it
//! had read that half. Flags are cleared by the receive kernel that read them. A CUDA graph
//! captures the halves of the calls it holds; replays repeat the same sequence (capture an
//! even number of dispatches, or one dispatch with its combine per graph, and do not mix its
//! replays with uncaptured calls in between of a different parity pattern).
//!
//! # Sizing
//! Every area is sized for the worst case, so no routing can overflow: a source's staging
//! holds all `M` tokens, each local expert holds `n*M` rows (every token of every PE to one
//! expert fits), each token's combine rows hold all `k` slots. Bytes per PE
//! ([`LowLatencyBuffer::bytes_for`]): `2 × (n*M*H*2 (staging) + L*n*M*H*2 (recv_x) +
//! M*k*H*2 (combine) + n*M*k*4 + L*n*M*4 + M*k*4 + small)`: about 1 GB at M = 128, H = 7168,
//! E = 256 on 2 PEs (the symmetric heap must hold it: `RSHMEM_HEAP_SIZE`).
//!
//! # Errors
//! Invalid ids latch an error on the device ([`LowLatencyBuffer::check`] turns it into
//! [`Error::InvalidArgument`]); a peer that never sends ends the receives' waits after the
//! device timeout ([`Error::Timeout`] naming it, from `check`). Host-side input errors of a
//! dispatch still send an empty dispatch (peers do not wait in vain) and return the error;
//! those of a combine return before any launch (the peers' combines then time out).

use super::dispatch::need;
use crate::backend::cuda::ffi;
use crate::device::{CudaPe, Kernel, KernelArg, Stream};
use crate::elem::{Elem, ElemKind};
use crate::ep::{pack_areas, TopkId};
use crate::error::{Error, Result};
use crate::sym::{AsSym, Sym, SymView};
use crate::team::Team;
use crate::{bf16, Pe};
use std::cell::Cell;

/// The low-latency kernels' source (after the device header), one program.
pub const LL_KERNELS: &str = concat!(
    include_str!("kernels/ll_dispatch.cu"),
    include_str!("kernels/ll_combine.cu"),
);

/// Threads per block of the LL kernels (`LL_BLOCK`).
const LL_BLOCK: u32 = 256;
/// Most top-k slots (`LL_MAX_TOPK`).
pub const LL_MAX_TOPK: usize = 32;
/// Most experts per PE (`LL_MAX_LOCAL_EXPERTS`).
pub const LL_MAX_LOCAL_EXPERTS: usize = 4096;
const LL_ERR_MINE: u64 = 1;
const PARAM_WORDS: usize = 20;
const CTL_WORDS: usize = 16;

/// The shape a [`LowLatencyBuffer`] is sized for (every PE passes the same).
///
/// ```
/// use rshmem::cuda::ep::LlConfig;
/// let c = LlConfig::new(128, 7168, 256, 8);
/// assert_eq!(c.max_tokens, 128);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlConfig {
    /// Most tokens one PE dispatches per call (`M`, DeepEP's `num_max_dispatch_tokens_per_rank`).
    pub max_tokens: usize,
    /// Elements per token row (`H`; a multiple of 8, of 128 for FP8).
    pub hidden: usize,
    /// Experts of the team (`E`, a multiple of the team size).
    pub num_experts: usize,
    /// Most top-k slots per token (1 ..= [`LL_MAX_TOPK`]).
    pub max_topk: usize,
}

impl LlConfig {
    /// A configuration of `max_tokens` per PE, `hidden`, `num_experts` and `max_topk`.
    pub fn new(max_tokens: usize, hidden: usize, num_experts: usize, max_topk: usize) -> LlConfig {
        LlConfig {
            max_tokens,
            hidden,
            num_experts,
            max_topk,
        }
    }
}

/// Options of a low-latency dispatch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LlDispatchOpts {
    /// Send e4m3 rows with one `f32` scale per 128 elements (the receive area then holds
    /// [`LowLatencyBuffer::recv_x_fp8`]); combine stays bf16.
    pub fp8: bool,
}

/// A dispatch whose send is queued ([`LowLatencyBuffer::dispatch_send`]): hand it to
/// [`LowLatencyBuffer::dispatch_recv`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a sent dispatch must be received (dispatch_recv)"]
pub struct LlDispatchSent(LlDispatch);

impl LlDispatchSent {
    /// The dispatch this send belongs to: which half its outputs will be in (they hold its
    /// rows only after [`LowLatencyBuffer::dispatch_recv`] has run on the stream).
    pub fn dispatch(&self) -> &LlDispatch {
        &self.0
    }
}

/// A dispatch received (or queued to be): which half of the buffer holds its outputs, and what
/// [`LowLatencyBuffer::combine`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlDispatch {
    buffer_id: u64,
    half: usize,
    num_tokens: usize,
    top_k: usize,
    fp8: bool,
}

impl LlDispatch {
    /// Tokens this PE dispatched (the rows combine returns).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    /// The top-k of this PE's dispatch.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Whether the rows travelled as FP8.
    pub fn fp8(&self) -> bool {
        self.fp8
    }
    /// The half of the buffer that holds this dispatch's outputs (0 or 1).
    pub fn half(&self) -> usize {
        self.half
    }
}

/// A combine whose send is queued ([`LowLatencyBuffer::combine_send`]): hand it to
/// [`LowLatencyBuffer::combine_recv`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a sent combine must be received (combine_recv)"]
pub struct LlCombineSent(LlDispatch);

/// Byte offsets of the areas (each `[2][..]`: both halves) in the one symmetric allocation.
#[derive(Debug, Clone, Copy)]
struct LlPlan {
    stage: usize,
    meta: usize,
    dflag: usize,
    recv_x: usize,
    count: usize,
    src: usize,
    layout: usize,
    comb: usize,
    cflag: usize,
    my_ids: usize,
    ctl: usize,
    params: usize,
    total: usize,
}

fn ll_plan(c: &LlConfig, n: usize) -> Result<LlPlan> {
    let bad = |m: String| Err(Error::invalid(format!("ep low latency: {m}")));
    if n == 0 || n > super::MAX_GPU_EP_PES {
        return bad(format!(
            "a team of {n} PEs (1 ..= {})",
            super::MAX_GPU_EP_PES
        ));
    }
    if c.num_experts == 0 || !c.num_experts.is_multiple_of(n) {
        return bad(format!(
            "{} experts are not a positive multiple of the team size {n}",
            c.num_experts
        ));
    }
    if c.max_topk == 0 || c.max_topk > LL_MAX_TOPK {
        return bad(format!(
            "max_topk {} is not in 1..={LL_MAX_TOPK}",
            c.max_topk
        ));
    }
    if c.hidden == 0 || !c.hidden.is_multiple_of(8) {
        return bad(format!(
            "hidden {} is not a positive multiple of 8",
            c.hidden
        ));
    }
    if c.max_tokens == 0 {
        return bad("max_tokens is 0".into());
    }
    let l = c.num_experts / n;
    if l > LL_MAX_LOCAL_EXPERTS {
        return bad(format!(
            "{l} experts per PE (at most {LL_MAX_LOCAL_EXPERTS}: the combine keeps their row \
             offsets in shared memory)"
        ));
    }
    let (m, h, k) = (c.max_tokens, c.hidden, c.max_topk);
    let of = || Error::invalid("ep low latency: buffer size overflows");
    let nm = n.checked_mul(m).ok_or_else(of)?;
    // Row indices and source words are int on the device.
    if l.checked_mul(nm).is_none_or(|v| v > i32::MAX as usize) {
        return Err(of());
    }
    let prod = |v: &[usize]| {
        v.iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or_else(of)
    };
    let sizes = [
        prod(&[2, nm, h, 2])?,
        prod(&[2, nm, k, 4])?,
        2 * n * 8,
        prod(&[2, l, nm, h, 2])?,
        2 * l * 4,
        prod(&[2, l, nm, 4])?,
        prod(&[2, l, n, 2, 4])?,
        prod(&[2, m, k, h, 2])?,
        2 * n * 8,
        prod(&[2, m, k, 4])?,
        CTL_WORDS * 8,
        PARAM_WORDS * 8,
    ];
    let (offs, at) = pack_areas("ep low latency", sizes)?;
    Ok(LlPlan {
        stage: offs[0],
        meta: offs[1],
        dflag: offs[2],
        recv_x: offs[3],
        count: offs[4],
        src: offs[5],
        layout: offs[6],
        comb: offs[7],
        cflag: offs[8],
        my_ids: offs[9],
        ctl: offs[10],
        params: offs[11],
        total: at,
    })
}

/// `p` when it is 16-byte aligned (the kernels move rows in 16-byte vectors).
fn aligned16(what: &str, p: u64) -> Result<u64> {
    if !p.is_multiple_of(16) {
        return Err(Error::invalid(format!(
            "ep low latency: {what} must start on a 16-byte boundary (a view at an offset of \
             a multiple of 16 bytes)"
        )));
    }
    Ok(p)
}

/// A low-latency (decode) expert-parallel buffer for bf16 rows: fixed receive buffers per local
/// expert, no host synchronisation, send/receive hooks, optional FP8 dispatch. Created
/// collectively; every call is collective over its team, in the same order on every PE.
///
/// ```no_run
/// # fn f(pe: &rshmem::Pe) -> rshmem::Result<()> {
/// use rshmem::cuda::{ep::{LowLatencyBuffer, LlConfig, LlDispatchOpts}, CudaPe};
/// let (t, h, k, e) = (128, 7168, 8, 256);
/// let buf = LowLatencyBuffer::new(pe, pe.world_team(), LlConfig::new(t, h, e, k), &[])?;
/// let x = pe.alloc::<rshmem::bf16>(t * h)?;
/// let ids = pe.alloc::<i64>(t * k)?;
/// let w = pe.alloc::<f32>(t * k)?;
/// let out = pe.alloc::<rshmem::bf16>(t * h)?;
/// let s = CudaPe::new(pe)?.stream()?;
/// let d = buf.dispatch(pe, &s, &x, &ids, k, LlDispatchOpts::default())?;
/// // Experts read buf.recv_x(&d)? (rows 0..recv_count[e] of each local expert e) and write
/// // their outputs in the same layout; identity experts pass recv_x itself.
/// buf.combine(pe, &s, &d, &buf.recv_x(&d)?, &w, &out)?;
/// s.synchronize()?;
/// buf.check(pe)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LowLatencyBuffer {
    cfg: LlConfig,
    id: u64,
    n: usize,
    world_me: usize,
    plan: LlPlan,
    area: Sym<u8>,
    send: Kernel,
    recv: Kernel,
    csend: Kernel,
    crecv: Kernel,
    grid: u32,
    parity: Cell<usize>,
}

impl LowLatencyBuffer {
    /// Symmetric bytes per PE a buffer of `cfg` on a team of `n_pes` takes.
    pub fn bytes_for(cfg: &LlConfig, n_pes: usize) -> Result<usize> {
        Ok(ll_plan(cfg, n_pes)?.total)
    }

    /// Symmetric bytes per PE this buffer takes.
    pub fn bytes(&self) -> usize {
        self.plan.total
    }

    /// The configuration.
    pub fn config(&self) -> &LlConfig {
        &self.cfg
    }

    /// Local experts of each PE (`E / n`).
    pub fn local_experts(&self) -> usize {
        self.cfg.num_experts / self.n
    }

    /// Rows per local expert in the receive area (`n * max_tokens`).
    pub fn expert_rows(&self) -> usize {
        self.n * self.cfg.max_tokens
    }

    /// Allocates the buffer for `team` and loads its kernels (collective over the world, as every
    /// symmetric allocation is; every PE passes the same `cfg`). `nvrtc_options`: extra NVRTC
    /// options (e.g. [`EpTuning::nvrtc_options`](super::EpTuning::nvrtc_options)).
    pub fn new(
        pe: &Pe,
        team: &Team,
        cfg: LlConfig,
        nvrtc_options: &[String],
    ) -> Result<LowLatencyBuffer> {
        let g = CudaPe::new(pe)?;
        g.check_one_node(&team.members, "cuda::ep::LowLatencyBuffer")?;
        let n = team.n_pes();
        let prepared = (|| {
            let plan = ll_plan(&cfg, n)?;
            let dt = g.device_team(team)?;
            let o: Vec<&str> = nvrtc_options.iter().map(|s| s.as_str()).collect();
            let k = |name: &str| g.kernel(LL_KERNELS, name, &o);
            let ks = [
                k("ll_dispatch_send")?,
                k("ll_dispatch_recv")?,
                k("ll_combine_send")?,
                k("ll_combine_recv")?,
            ];
            Ok::<_, Error>((plan, dt, ks))
        })();
        let (plan, dt, [send, recv, csend, crecv]) = match prepared {
            Ok(v) => v,
            Err(e) => {
                // Take part in the collective allocation (0 bytes) so peers are not left waiting.
                if let Ok(s) = pe.alloc_aligned::<u8>(0, 256) {
                    pe.free(s)?;
                }
                return Err(e);
            }
        };
        let area = pe.alloc_aligned::<u8>(plan.total, 256)?;
        let buf = LowLatencyBuffer {
            cfg,
            id: super::NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            n,
            world_me: pe.my_pe(),
            plan,
            area,
            send,
            recv,
            csend,
            crecv,
            grid: (g.sm_count() as u32).clamp(1, 1024),
            parity: Cell::new(0),
        };
        let base = g.ptr(&buf.area)?;
        let a = |off: usize| base + off as u64;
        let words: [u64; PARAM_WORDS] = [
            a(plan.stage),
            a(plan.meta),
            a(plan.dflag),
            a(plan.recv_x),
            a(plan.count),
            a(plan.src),
            a(plan.layout),
            a(plan.comb),
            a(plan.cflag),
            a(plan.my_ids),
            a(plan.ctl),
            n as u64,
            dt.my_index as u64,
            dt.start as u64,
            dt.stride as u64,
            cfg.max_tokens as u64,
            cfg.hidden as u64,
            cfg.max_topk as u64,
            (cfg.num_experts / n) as u64,
            cfg.num_experts as u64,
        ];
        pe.local_write(&buf.view::<u64>(plan.params, PARAM_WORDS)?, 0, &words)?;
        pe.local_fill(&buf.view::<u64>(plan.dflag, 2 * n)?, 0)?;
        pe.local_fill(&buf.view::<u64>(plan.cflag, 2 * n)?, 0)?;
        pe.local_fill(&buf.view::<u64>(plan.ctl, CTL_WORDS)?, 0)?;
        pe.local_fill(&buf.view::<i32>(plan.count, 2 * buf.local_experts())?, 0)?;
        pe.team_barrier_as(team, crate::pe::CallKind::EpBufferNew)?;
        Ok(buf)
    }

    fn view<U: Elem>(&self, off: usize, len: usize) -> Result<SymView<'_, U>> {
        self.area.view(off, len)
    }

    fn check_pe(&self, pe: &Pe) -> Result<()> {
        if pe.my_pe() != self.world_me {
            return Err(Error::invalid(format!(
                "ep low latency: buffer of PE {} used by PE {}",
                self.world_me,
                pe.my_pe()
            )));
        }
        Ok(())
    }

    fn check_handle(&self, d: &LlDispatch) -> Result<()> {
        if d.buffer_id != self.id {
            return Err(Error::invalid(
                "ep low latency: dispatch handle of another buffer",
            ));
        }
        Ok(())
    }

    fn params(&self, g: &CudaPe) -> Result<KernelArg> {
        Ok(KernelArg::Ptr(g.ptr(&self.area)? + self.plan.params as u64))
    }

    /// The receive area of dispatch `d` (bf16): `[L, n*M, H]`, local expert `e`'s rows `0 ..
    /// recv_count[e]` valid. An FP8 dispatch's is [`recv_x_fp8`](Self::recv_x_fp8) (an error here).
    pub fn recv_x(&self, d: &LlDispatch) -> Result<SymView<'_, bf16>> {
        self.check_handle(d)?;
        if d.fp8 {
            return Err(Error::invalid(
                "ep low latency: an FP8 dispatch's rows are in recv_x_fp8",
            ));
        }
        let len = self.local_experts() * self.expert_rows() * self.cfg.hidden;
        self.view(self.plan.recv_x + d.half * len * 2, len)
    }

    /// The receive area of FP8 dispatch `d`: e4m3 bytes `[L, n*M, H]` and scales `[L, n*M,
    /// H/128]` (`f32`, one per 128 elements).
    pub fn recv_x_fp8(&self, d: &LlDispatch) -> Result<(SymView<'_, u8>, SymView<'_, f32>)> {
        self.check_handle(d)?;
        if !d.fp8 {
            return Err(Error::invalid(
                "ep low latency: a bf16 dispatch's rows are in recv_x",
            ));
        }
        let rows = self.local_experts() * self.expert_rows();
        let h = self.cfg.hidden;
        let at = self.plan.recv_x + d.half * rows * h * 2;
        Ok((
            self.view(at, rows * h)?,
            self.view(at + rows * h, rows * h / 128)?,
        ))
    }

    /// Rows received per local expert (`[L]`, `i32`, on the device).
    pub fn recv_count(&self, d: &LlDispatch) -> Result<SymView<'_, i32>> {
        self.check_handle(d)?;
        let l = self.local_experts();
        self.view(self.plan.count + d.half * l * 4, l)
    }

    /// Each received row's source, `source_pe * M + source_token` (`[L, n*M]`, `i32`, team
    /// indices; rows beyond `recv_count[e]` are stale).
    pub fn recv_src(&self, d: &LlDispatch) -> Result<SymView<'_, i32>> {
        self.check_handle(d)?;
        let len = self.local_experts() * self.expert_rows();
        self.view(self.plan.src + d.half * len * 4, len)
    }

    /// Per (local expert, source PE): its first row and row count (`[L, n, 2]`, `i32`).
    pub fn recv_layout(&self, d: &LlDispatch) -> Result<SymView<'_, i32>> {
        self.check_handle(d)?;
        let len = self.local_experts() * self.n * 2;
        self.view(self.plan.layout + d.half * len * 4, len)
    }

    /// Dispatches this PE's tokens on stream `s`: [`dispatch_send`](Self::dispatch_send) and
    /// [`dispatch_recv`](Self::dispatch_recv) at once. `topk_ids [T, top_k]` (`i32` or `i64`,
    /// `-1` = none; its length gives `T` ≤ `max_tokens`), `x [T, H]` bf16, symmetric objects of
    /// this PE's heap. Nothing waits on the host. Collective over the team.
    pub fn dispatch<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<bf16> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        top_k: usize,
        opts: LlDispatchOpts,
    ) -> Result<LlDispatch> {
        let sent = self.dispatch_send(pe, s, x, topk_ids, top_k, opts)?;
        self.dispatch_recv(pe, s, sent)
    }

    /// The send half of [`dispatch`](Self::dispatch): queues the send kernel on `s` and returns
    /// (nothing waits for peers). Pass the result to [`dispatch_recv`](Self::dispatch_recv),
    /// later and on any stream of this GPU. On an input error an empty dispatch is still sent
    /// and received on `s` (the peers and the buffer's halves stay in step) and the error
    /// returned.
    pub fn dispatch_send<I: TopkId + Elem>(
        &self,
        pe: &Pe,
        s: &Stream,
        x: &(impl AsSym<bf16> + ?Sized),
        topk_ids: &(impl AsSym<I> + ?Sized),
        top_k: usize,
        opts: LlDispatchOpts,
    ) -> Result<LlDispatchSent> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        let c = &self.cfg;
        let ids64 = match I::KIND {
            ElemKind::I64 => 1,
            ElemKind::I32 => 0,
            k => {
                return Err(Error::invalid(format!(
                    "ep: top-k ids must be i32 or i64, not {}",
                    k.name()
                )))
            }
        };
        let checked = (|| {
            if top_k == 0 || top_k > c.max_topk {
                return Err(Error::invalid(format!(
                    "ep low latency: top_k {top_k} is out of range 1..={}",
                    c.max_topk
                )));
            }
            let len = topk_ids.raw().len;
            if !len.is_multiple_of(top_k) {
                return Err(Error::invalid(format!(
                    "ep low latency: topk_ids has {len} elements, not a whole number of tokens \
                     of top_k {top_k}"
                )));
            }
            let t = len / top_k;
            if t > c.max_tokens {
                return Err(Error::invalid(format!(
                    "ep low latency: {t} tokens exceed max_tokens {}",
                    c.max_tokens
                )));
            }
            if opts.fp8 && !c.hidden.is_multiple_of(128) {
                return Err(Error::invalid(format!(
                    "ep low latency: FP8 needs hidden a multiple of 128, not {}",
                    c.hidden
                )));
            }
            if x.raw().len < t * c.hidden {
                return Err(Error::LengthMismatch {
                    what: "x (tokens * hidden)",
                    got: x.raw().len,
                    expected: t * c.hidden,
                });
            }
            Ok((t, aligned16("x", g.ptr(x)?)?, g.ptr(topk_ids)?))
        })();
        let half = self.parity.get();
        let (t, xp, ip, bad) = match &checked {
            Ok((t, xp, ip)) => (*t, *xp, *ip, 0),
            Err(_) => (0, 0, 0, 1),
        };
        // SAFETY: ll_dispatch_send(const ll_params*, const bf16*, const void*, int, int, int,
        // int, int, int): the params block lies in the buffer; x holds T*H elements and the ids
        // T*top_k (checked above; T = 0 and null pointers when the inputs were refused: none
        // is read); any grid, LL_BLOCK threads.
        let launched = unsafe {
            g.launch(
                &self.send,
                s,
                self.grid.min(t.max(1) as u32),
                LL_BLOCK,
                0,
                &[
                    self.params(&g)?,
                    KernelArg::Ptr(xp),
                    KernelArg::Ptr(ip),
                    KernelArg::I32(ids64),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(top_k.clamp(1, c.max_topk) as i32),
                    KernelArg::I32(half as i32),
                    KernelArg::I32(opts.fp8 as i32),
                    KernelArg::I32(bad),
                ],
            )
        };
        launched?;
        self.parity.set(half ^ 1);
        let sent = LlDispatchSent(LlDispatch {
            buffer_id: self.id,
            half,
            num_tokens: t,
            top_k: top_k.clamp(1, c.max_topk),
            fp8: opts.fp8,
        });
        match checked {
            Ok(_) => Ok(sent),
            Err(e) => {
                self.dispatch_recv(pe, s, sent)?;
                Err(e)
            }
        }
    }

    /// The receive half of a dispatch: queues on `s` (any stream of this PE's GPU) the kernel
    /// that waits for every PE's rows and expands them into the experts' slots.
    pub fn dispatch_recv(&self, pe: &Pe, s: &Stream, sent: LlDispatchSent) -> Result<LlDispatch> {
        self.check_pe(pe)?;
        let d = sent.0;
        self.check_handle(&d)?;
        let g = CudaPe::new(pe)?;
        // SAFETY: ll_dispatch_recv(const ll_params*, int, int): the params block lies in the
        // buffer; any grid, LL_BLOCK threads.
        unsafe {
            g.launch(
                &self.recv,
                s,
                self.grid,
                LL_BLOCK,
                0,
                &[
                    self.params(&g)?,
                    KernelArg::I32(d.half as i32),
                    KernelArg::I32(d.fp8 as i32),
                ],
            )?;
        }
        Ok(d)
    }

    /// Combines the expert outputs `y` (`[L, n*M, H]` bf16, the layout of `recv_x`; at least
    /// that many elements) of dispatch `d` into `out [T, H]` with `topk_weights [T, top_k]`
    /// (`f32`): [`combine_send`](Self::combine_send) then [`combine_recv`](Self::combine_recv).
    /// One combine per dispatch, on every PE (a second one would wait for rows no peer sends,
    /// until the device timeout).
    pub fn combine(
        &self,
        pe: &Pe,
        s: &Stream,
        d: &LlDispatch,
        y: &(impl AsSym<bf16> + ?Sized),
        topk_weights: &(impl AsSym<f32> + ?Sized),
        out: &(impl AsSym<bf16> + ?Sized),
    ) -> Result<()> {
        let sent = self.combine_send(pe, s, d, y)?;
        self.combine_recv(pe, s, sent, topk_weights, out)
    }

    /// The send half of a combine: queues on `s` the kernel that sends every received row of
    /// `y` back to its source, and returns.
    pub fn combine_send(
        &self,
        pe: &Pe,
        s: &Stream,
        d: &LlDispatch,
        y: &(impl AsSym<bf16> + ?Sized),
    ) -> Result<LlCombineSent> {
        self.check_pe(pe)?;
        self.check_handle(d)?;
        let need = self.local_experts() * self.expert_rows() * self.cfg.hidden;
        if y.raw().len < need {
            return Err(Error::LengthMismatch {
                what: "y (local experts * n * max_tokens * hidden)",
                got: y.raw().len,
                expected: need,
            });
        }
        let g = CudaPe::new(pe)?;
        // SAFETY: ll_combine_send(const ll_params*, const bf16*, int): y holds L*n*M*H
        // elements (checked); any grid, LL_BLOCK threads.
        unsafe {
            g.launch(
                &self.csend,
                s,
                self.grid,
                LL_BLOCK,
                0,
                &[
                    self.params(&g)?,
                    KernelArg::Ptr(aligned16("y", g.ptr(y)?)?),
                    KernelArg::I32(d.half as i32),
                ],
            )?;
        }
        Ok(LlCombineSent(d.clone()))
    }

    /// The receive half of a combine: queues on `s` (any stream of this PE's GPU) the kernel
    /// that waits for every PE's rows and writes `out [T, H]` (`topk_weights [T, top_k]`). On
    /// an input error it still receives (writing nothing) and returns the error.
    pub fn combine_recv(
        &self,
        pe: &Pe,
        s: &Stream,
        sent: LlCombineSent,
        topk_weights: &(impl AsSym<f32> + ?Sized),
        out: &(impl AsSym<bf16> + ?Sized),
    ) -> Result<()> {
        self.check_pe(pe)?;
        let d = sent.0;
        self.check_handle(&d)?;
        let (t, k, h) = (d.num_tokens, d.top_k, self.cfg.hidden);
        let g = CudaPe::new(pe)?;
        let checked = (|| {
            need(
                "topk_weights (tokens * top_k)",
                topk_weights.raw().len,
                t * k,
            )?;
            need("out (tokens * hidden)", out.raw().len, t * h)?;
            Ok((g.ptr(topk_weights)?, aligned16("out", g.ptr(out)?)?))
        })();
        // Refused inputs still launch the receive with no tokens: it waits for the peers' rows
        // and clears their flags, so the next combine of this half does not take them for its
        // own.
        let (wp, op, tt) = match &checked {
            Ok((wp, op)) => (*wp, *op, t),
            Err(_) => (0, 0, 0),
        };
        // SAFETY: ll_combine_recv(const ll_params*, const float*, bf16*, int, int, int): the
        // weights hold T*top_k elements and out T*H (checked; T = 0 and null pointers when
        // refused: neither is touched); any grid, LL_BLOCK threads.
        unsafe {
            g.launch(
                &self.crecv,
                s,
                self.grid.min(tt.max(1) as u32),
                LL_BLOCK,
                0,
                &[
                    self.params(&g)?,
                    KernelArg::Ptr(wp),
                    KernelArg::Ptr(op),
                    KernelArg::I32(tt as i32),
                    KernelArg::I32(k as i32),
                    KernelArg::I32(d.half as i32),
                ],
            )?;
        }
        checked.map(|_| ())
    }

    /// Reports errors latched on the device by earlier calls (call after synchronising the
    /// stream): invalid ids in this PE's dispatches ([`Error::InvalidArgument`]), device wait
    /// timeouts ([`Error::Timeout`], naming the PE waited for). Clears them.
    pub fn check(&self, pe: &Pe) -> Result<()> {
        self.check_pe(pe)?;
        let g = CudaPe::new(pe)?;
        let own = g.check_device_errors();
        let ctl = self.view::<u64>(self.plan.ctl, 2)?;
        let v = pe.local_vec(&ctl)?;
        if v[0] != 0 {
            pe.local_write(&ctl, 0, &[0u64, 0u64])?;
        }
        own?;
        if v[0] & LL_ERR_MINE != 0 {
            return Err(Error::invalid(
                "ep low latency dispatch: an expert id is out of range (-1 or 0..E) in this \
                 PE's input (taken as -1), or its inputs were refused",
            ));
        }
        if v[0] != 0 {
            return Err(ffi::err("ep low latency: unknown device error"));
        }
        Ok(())
    }
}

impl crate::pe::sealed::Sealed for LowLatencyBuffer {}
/// `pe.free(buf)` releases the symmetric area (collective over the world).
impl crate::pe::Free for LowLatencyBuffer {
    fn free_with(self, pe: &Pe) -> Result<()> {
        pe.free(self.area)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_areas_are_aligned_disjoint_and_hold_the_worst_case() {
        let c = LlConfig::new(128, 7168, 256, 8);
        let (n, l) = (2, 128);
        let p = ll_plan(&c, n).unwrap();
        let offs = [
            p.stage, p.meta, p.dflag, p.recv_x, p.count, p.src, p.layout, p.comb, p.cflag,
            p.my_ids, p.ctl, p.params, p.total,
        ];
        assert!(offs.windows(2).all(|w| w[0] < w[1]), "{offs:?}");
        assert!(offs.iter().all(|o| o % 256 == 0), "{offs:?}");
        // Each half of the receive area holds every PE's every token for each local expert,
        // and an FP8 half (bytes, then a scale per 128 elements) fits in a bf16 half.
        let rows = l * n * c.max_tokens;
        assert!(p.count - p.recv_x >= 2 * rows * c.hidden * 2);
        assert!(rows * c.hidden + rows * c.hidden / 128 * 4 <= rows * c.hidden * 2);
        assert!(p.comb + 2 * c.max_tokens * c.max_topk * c.hidden * 2 <= p.cflag);
        assert_eq!(LowLatencyBuffer::bytes_for(&c, n).unwrap(), p.total);
    }
}
