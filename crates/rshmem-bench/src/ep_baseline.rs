//! The same-run baseline of [`crate::ep_cuda::ep_bench`] — dispatch and combine done with NCCL
//! all-to-all-v, the path used before symmetric memory (e.g. nvFuser) — and the benchmark's
//! data checks.
//!
//! # What the baseline does (per call, on one stream, bf16, same inputs as rshmem's)
//! * Dispatch: `epb_layout` (one block: each token's position among those sent to each PE, the
//!   counts per PE and per (PE, expert)) → NCCL all-to-all of the counts (`1 + E/n` ints per
//!   pair: grouped `ncclSend`/`ncclRecv`) → the host synchronises the stream and reads the
//!   counts (it needs them to size the receives) → `epb_pack` (grid: each token's row and row
//!   record once per destination PE, packed per destination, own PE included) → grouped
//!   `ncclSend`/`ncclRecv` of rows and row records → `epb_permute` (grid: expert offsets from the
//!   received counts, received rows into expert-major rows, the slot → row table).
//! * Combine (pre-reduced on the expert side, like rshmem's): `epb_csum` (grid: per received
//!   token, the weighted sum of its local slots' expert outputs, rounded once, packed per
//!   source) → grouped `ncclSend`/`ncclRecv` back → `epb_crecv` (grid: sum over PEs ascending,
//!   rounded once). The same arithmetic in the same order as `ep_csend`/`ep_crecv`, so the
//!   outputs are bit-identical and compared exactly.
//!
//! Token rows cross between PEs once per (token, destination PE), as in rshmem's dispatch; the
//! baseline's layout, counts exchange, host synchronisation, packing and permutation are all
//! inside its timed calls. Not capturable (the host sizes the receives).
//!
//! # Data checks
//! Expert-major rows (rshmem's and the baseline's) are checked per local expert: row count and
//! the sum of row checksums (`epb_rowhash` on the GPU, `mix` on the host) against the
//! host's reference from the known inputs; combine outputs per token against the reference's
//! checksums (exact: inputs and weights are small dyadic numbers, every f32 sum is exact, and
//! the reference rounds where the kernels do).

use crate::nccl::{err, DataType, NcclComm, P2p};
use rshmem::cuda::ep::{EP_KERNELS, MAX_GPU_EP_PES, MAX_GPU_EXPERTS};
use rshmem::cuda::{CudaPe, Kernel, KernelArg, Stream};
use rshmem::{bf16, AsSym, ElemKind, Error, Pe, Result, Sym};

const BLOCK: u32 = 512;

/// The baseline's kernels (`epb_*`, `kernels/ep_baseline.cu`). They reuse the MoE kernels'
/// types and helpers (`ep_t`, row loads and stores, the f32 sums: the same arithmetic in the
/// same order), so they are compiled after the library's MoE source ([`kernel_source`]).
pub const EP_BASELINE_KERNELS: &str = include_str!("kernels/ep_baseline.cu");

/// The whole module the baseline loads: the library's MoE kernels ([`EP_KERNELS`]) followed by
/// [`EP_BASELINE_KERNELS`] (compiled with the rshmem device header prepended).
pub fn kernel_source() -> String {
    format!("{EP_KERNELS}{EP_BASELINE_KERNELS}")
}

/// NVRTC options of the baseline's module (bf16 hidden states, `i32` expert ids) with the MoE
/// tuning's `extra` options.
pub fn kernel_options(extra: &[String]) -> Result<Vec<String>> {
    rshmem::cuda::ep::kernel_options(ElemKind::Bf16, ElemKind::I32, extra)
}

/// The baseline's and the checks' kernels.
#[derive(Debug, Clone)]
pub struct Kernels {
    layout: Kernel,
    pack: Kernel,
    permute: Kernel,
    csum: Kernel,
    crecv: Kernel,
    rowhash: Kernel,
}

impl Kernels {
    /// Compiles (or finds in the cache) and loads the module on this PE's GPU; `extra`: the
    /// MoE tuning's NVRTC options.
    pub fn load(g: &CudaPe, extra: &[String]) -> Result<Kernels> {
        let o = kernel_options(extra)?;
        let o: Vec<&str> = o.iter().map(|s| s.as_str()).collect();
        let src = kernel_source();
        let k = |name: &str| g.kernel(&src, name, &o);
        Ok(Kernels {
            layout: k("epb_layout")?,
            pack: k("epb_pack")?,
            permute: k("epb_permute")?,
            csum: k("epb_csum")?,
            crecv: k("epb_crecv")?,
            rowhash: k("epb_rowhash")?,
        })
    }
}

fn mix(b: u64, i: u64) -> u64 {
    let mut z = (b << 32) ^ i;
    z = z.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^= z >> 29;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 32;
    z
}

/// The checksum `epb_rowhash` computes for one row.
#[cfg(test)]
fn row_hash(row: impl Iterator<Item = bf16>) -> u64 {
    row.enumerate().fold(0u64, |acc, (i, v)| {
        acc.wrapping_add(mix(v.to_bits() as u64, i as u64))
    })
}

/// Hidden state `i` (flat index `t * H + h`) of PE `p`'s benchmark input (`reference` relies
/// on its form: an integer in -8..=8 depending on `(7 i + p) mod 17`).
pub(crate) fn x_val(p: usize, i: usize) -> bf16 {
    bf16::from_f64(((i * 7 + p) % 17) as f64 - 8.0)
}

/// What PE `me` must receive and compute, from every PE's routing.
#[derive(Debug, Clone)]
pub(crate) struct Reference {
    /// Rows per local expert.
    pub counts: Vec<usize>,
    /// Sum of the row checksums per local expert.
    pub expert_hash: Vec<u64>,
    /// Combine output checksum per token of `me` (identity experts).
    pub out_hash: Vec<u64>,
}

/// The reference of PE `me` for routings `routes[p] = (ids, weights)`, `t` tokens, hidden `h`,
/// top-k `k`, `e` experts over `n` PEs.
///
/// Combine: PE `d`'s partial sum of a token is `sum_j w_j * x` over its slots (f32, slot order),
/// rounded to bf16; the output is the f32 sum of the partials over PEs, rounded. With the
/// benchmark's inputs (integers in -8..=8, weights m/8, m in 1..=8) every product and sum is
/// exact in f32, so the partial equals `(sum_j w_j) * x`: one value per distinct `x` (17) and
/// PE, computed once per token.
pub(crate) fn reference(
    routes: &[(Vec<i32>, Vec<f32>)],
    me: usize,
    t: usize,
    h: usize,
    k: usize,
    e: usize,
) -> Reference {
    let n = routes.len();
    let epp = e / n;
    let lo = me * epp;
    // x_val(p, i) depends on (7 i + p) mod 17 only.
    let vals: Vec<bf16> = (0..17).map(|r| bf16::from_f64(r as f64 - 8.0)).collect();
    let class = |p: usize, i: usize| (i * 7 + p) % 17;
    let mut counts = vec![0usize; epp];
    let mut expert_hash = vec![0u64; epp];
    for (p, (ids, _)) in routes.iter().enumerate() {
        for tok in 0..t {
            let slots = &ids[tok * k..(tok + 1) * k];
            let mine = |id: i32| id >= 0 && (id as usize) / epp == me;
            if !slots.iter().any(|&id| mine(id)) {
                continue;
            }
            let hx = (0..h).fold(0u64, |acc, c| {
                let b = vals[class(p, tok * h + c)].to_bits() as u64;
                acc.wrapping_add(mix(b, c as u64))
            });
            for &id in slots.iter().filter(|&&id| mine(id)) {
                let at = id as usize - lo;
                counts[at] += 1;
                expert_hash[at] = expert_hash[at].wrapping_add(hx);
            }
        }
    }
    let (ids, w) = &routes[me];
    let mut out_hash = Vec::with_capacity(t);
    for tok in 0..t {
        // Per PE: whether the token goes there and its weight sum there.
        let mut wsum = vec![(false, 0f32); n];
        for j in 0..k {
            let id = ids[tok * k + j];
            if id >= 0 {
                let d = (id as usize) / epp;
                wsum[d].0 = true;
                wsum[d].1 += w[tok * k + j];
            }
        }
        let outs: Vec<u64> = vals
            .iter()
            .map(|xv| {
                let x = xv.to_f32();
                let acc = wsum
                    .iter()
                    .filter(|(on, _)| *on)
                    .fold(0f32, |acc, &(_, ws)| acc + bf16::from_f32(ws * x).to_f32());
                bf16::from_f32(acc).to_bits() as u64
            })
            .collect();
        out_hash.push((0..h).fold(0u64, |acc, c| {
            acc.wrapping_add(mix(outs[class(me, tok * h + c)], c as u64))
        }));
    }
    Reference {
        counts,
        expert_hash,
        out_hash,
    }
}

/// Combine-output checksums of PE `me`'s tokens when every PE the token went to sends back the
/// token's own hidden state (`combine_tokens` with the receive rows as the per-token results):
/// `x * (number of PEs the token went to)`, exact in bf16 for the benchmark's inputs.
pub(crate) fn reference_token_combine(
    routes: &[(Vec<i32>, Vec<f32>)],
    me: usize,
    t: usize,
    h: usize,
    k: usize,
    e: usize,
) -> Vec<u64> {
    let n = routes.len();
    let epp = e / n;
    let ids = &routes[me].0;
    (0..t)
        .map(|tok| {
            let mut pes: Vec<usize> = ids[tok * k..(tok + 1) * k]
                .iter()
                .filter(|&&id| id >= 0)
                .map(|&id| id as usize / epp)
                .collect();
            pes.sort_unstable();
            pes.dedup();
            let c = pes.len() as f32;
            (0..h).fold(0u64, |acc, col| {
                let v = bf16::from_f32(c * x_val(me, tok * h + col).to_f32());
                acc.wrapping_add(mix(v.to_bits() as u64, col as u64))
            })
        })
        .collect()
}

/// Checksums of the first `rows` rows (`h` elements each) of `src` into `hashes` (at least
/// `rows` words), read back after synchronising `s`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_hashes(
    pe: &Pe,
    g: &CudaPe,
    s: &Stream,
    k: &Kernels,
    src: &(impl AsSym<bf16> + ?Sized),
    rows: usize,
    h: usize,
    hashes: &Sym<u64>,
    grid: u32,
) -> Result<Vec<u64>> {
    if rows * h > src.raw().len || rows > hashes.len() {
        return Err(err("ep bench: row checksums of more rows than allocated"));
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: epb_rowhash(const ep_t*, long long, long long, unsigned long long*): `src` holds
    // rows * h elements and `hashes` rows words (checked above).
    unsafe {
        g.launch(
            &k.rowhash,
            s,
            grid,
            BLOCK,
            0,
            &[
                KernelArg::Ptr(g.ptr(src)?),
                KernelArg::I64(rows as i64),
                KernelArg::I64(h as i64),
                KernelArg::Ptr(g.ptr(hashes)?),
            ],
        )?;
    }
    s.synchronize()?;
    pe.local_vec(&hashes.view::<u64>(0, rows)?)
}

/// Checks expert-major rows (checksums `hashes`, expert offsets `off`) against `r`; `Err` with
/// a description of the first difference.
pub(crate) fn check_dispatch(
    what: &str,
    off: &[usize],
    hashes: &[u64],
    r: &Reference,
) -> std::result::Result<(), String> {
    if off.len() != r.counts.len() + 1 {
        return Err(format!("{what}: {} expert offsets", off.len()));
    }
    for (e, (&cnt, &want)) in r.counts.iter().zip(&r.expert_hash).enumerate() {
        let (a, b) = (off[e], off[e + 1]);
        if b < a || b - a != cnt || b > hashes.len() {
            return Err(format!(
                "{what}: local expert {e} has rows {a}..{b}, expected {cnt} rows"
            ));
        }
        let got = hashes[a..b].iter().fold(0u64, |x, &y| x.wrapping_add(y));
        if got != want {
            return Err(format!(
                "{what}: local expert {e}: rows differ from the inputs (checksum {got:#x}, expected {want:#x})"
            ));
        }
    }
    Ok(())
}

/// Checks combine output checksums against `r`.
pub(crate) fn check_combine(
    what: &str,
    hashes: &[u64],
    r: &Reference,
) -> std::result::Result<(), String> {
    match hashes.iter().zip(&r.out_hash).position(|(a, b)| a != b) {
        _ if hashes.len() != r.out_hash.len() => Err(format!(
            "{what}: {} output rows, expected {}",
            hashes.len(),
            r.out_hash.len()
        )),
        Some(t) => Err(format!(
            "{what}: token {t}'s output differs from the reference"
        )),
        None => Ok(()),
    }
}

/// The baseline's buffers for `t` tokens (symmetric objects of every PE's heap, same sizes on
/// every PE; used as plain device memory).
pub(crate) struct NcclBase<'c> {
    comm: &'c NcclComm<'c>,
    k: &'c Kernels,
    t: usize,
    h: usize,
    topk: usize,
    n: usize,
    el: usize,
    me: usize,
    grid: u32,
    rows_cap: usize,
    tok_pos: Sym<i32>,
    scnt: Sym<i32>,
    rcnt: Sym<i32>,
    sx: Sym<bf16>,
    smeta: Sym<u32>,
    rx: Sym<bf16>,
    rmeta: Sym<u32>,
    /// Expert-major output rows.
    pub ex: Sym<bf16>,
    off: Sym<u32>,
    fill: Sym<u32>,
    row_src: Sym<u32>,
    tok_rows: Sym<i32>,
    /// Combine output `[T, H]`.
    pub out: Sym<bf16>,
    /// Tokens sent to / received from each PE by the last dispatch.
    sent: Vec<usize>,
    recv: Vec<usize>,
}

impl std::fmt::Debug for NcclBase<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclBase").field("t", &self.t).finish()
    }
}

/// Symmetric bytes [`NcclBase::new`] allocates per PE (upper bound, before alignment).
pub(crate) fn base_bytes(
    n: usize,
    t: usize,
    h: usize,
    k: usize,
    e: usize,
    rows_cap: usize,
) -> usize {
    let rmw = 1 + 2 * k;
    let el = e / n;
    let rows = n * t;
    rows * h * 2 * 2
        + rows * rmw * 4 * 2
        + rows_cap * h * 2
        + t * h * 2
        + (t * n + 2 * n * (1 + el) + 2 * (el + 1) + rows_cap + rows * k) * 4
        + 16 * 4096
}

impl<'c> NcclBase<'c> {
    /// Allocates the buffers (collective). `rows_cap`: most expert-major rows on any PE.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        pe: &Pe,
        comm: &'c NcclComm<'c>,
        k: &'c Kernels,
        t: usize,
        h: usize,
        topk: usize,
        e: usize,
        rows_cap: usize,
        grid: u32,
    ) -> Result<NcclBase<'c>> {
        let n = pe.n_pes();
        // epb_layout: destinations are bits of a 64-bit mask, pairs per expert in shared memory.
        if n > MAX_GPU_EP_PES || e > MAX_GPU_EXPERTS || !e.is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "ep baseline: {e} experts on {n} PEs (at most {} PEs, {} experts, split evenly)",
                MAX_GPU_EP_PES, MAX_GPU_EXPERTS
            )));
        }
        let el = e / n;
        let rmw = 1 + 2 * topk;
        let rows = n * t;
        let a16 = |len: usize| pe.alloc_aligned::<bf16>(len.max(1), 256);
        Ok(NcclBase {
            comm,
            k,
            t,
            h,
            topk,
            n,
            el,
            me: pe.my_pe(),
            grid,
            rows_cap,
            tok_pos: pe.alloc::<i32>((t * n).max(1))?,
            scnt: pe.alloc::<i32>(n * (1 + el))?,
            rcnt: pe.alloc::<i32>(n * (1 + el))?,
            sx: a16(rows * h)?,
            smeta: pe.alloc_aligned::<u32>((rows * rmw).max(1), 256)?,
            rx: a16(rows * h)?,
            rmeta: pe.alloc_aligned::<u32>((rows * rmw).max(1), 256)?,
            ex: a16(rows_cap * h)?,
            off: pe.alloc::<u32>(el + 1)?,
            fill: pe.alloc::<u32>(el.max(1))?,
            row_src: pe.alloc::<u32>(rows_cap.max(1))?,
            tok_rows: pe.alloc::<i32>((rows * topk).max(1))?,
            out: a16(t * h)?,
            sent: Vec::new(),
            recv: Vec::new(),
        })
    }

    /// Frees the buffers (collective).
    pub(crate) fn free(self, pe: &Pe) -> Result<()> {
        pe.free(self.out)?;
        pe.free(self.tok_rows)?;
        pe.free(self.row_src)?;
        pe.free(self.fill)?;
        pe.free(self.off)?;
        pe.free(self.ex)?;
        pe.free(self.rmeta)?;
        pe.free(self.rx)?;
        pe.free(self.smeta)?;
        pe.free(self.sx)?;
        pe.free(self.rcnt)?;
        pe.free(self.scnt)?;
        pe.free(self.tok_pos)
    }

    /// One dispatch of `x [T, H]`, `ids [T, k]`, `w [T, k]` (this PE's symmetric objects).
    pub(crate) fn dispatch(
        &mut self,
        pe: &Pe,
        g: &CudaPe,
        s: &Stream,
        x: &Sym<bf16>,
        ids: &Sym<i32>,
        w: &Sym<f32>,
    ) -> Result<()> {
        let (t, h, k, n, el) = (self.t, self.h, self.topk, self.n, self.el);
        let rmw = 1 + 2 * k;
        if x.len() < t * h || ids.len() < t * k || w.len() < t * k {
            return Err(Error::InvalidArgument(
                "ep baseline: inputs shorter than T rows".into(),
            ));
        }
        let p = |sym: u64| KernelArg::Ptr(sym);
        let (tp, sc, rc) = (
            g.ptr(&self.tok_pos)?,
            g.ptr(&self.scnt)?,
            g.ptr(&self.rcnt)?,
        );
        let (sx, sm, rx, rm) = (
            g.ptr(&self.sx)?,
            g.ptr(&self.smeta)?,
            g.ptr(&self.rx)?,
            g.ptr(&self.rmeta)?,
        );
        // SAFETY: epb_layout(const ep_id*, int, int, int, int, int*, int*, unsigned*): ids holds
        // T*k ints, tok_pos T*n, scnt n*(1+El), fill El; shared memory n*El words.
        unsafe {
            g.launch(
                &self.k.layout,
                s,
                1,
                1024,
                (n * el * 4) as u32,
                &[
                    p(g.ptr(ids)?),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(k as i32),
                    KernelArg::I32(n as i32),
                    KernelArg::I32(el as i32),
                    p(tp),
                    p(sc),
                    p(g.ptr(&self.fill)?),
                ],
            )?;
        }
        // SAFETY: scnt and rcnt hold n*(1+El) ints of this GPU; the stream is this GPU's.
        unsafe {
            self.comm
                .all_to_all(sc, rc, 1 + el, 4, DataType::I32, n, s.raw())?;
        }
        s.synchronize()?;
        let scv = pe.local_vec(&self.scnt)?;
        let rcv = pe.local_vec(&self.rcnt)?;
        let sent: Vec<usize> = (0..n).map(|q| scv[q * (1 + el)].max(0) as usize).collect();
        let recv: Vec<usize> = (0..n).map(|q| rcv[q * (1 + el)].max(0) as usize).collect();
        let pairs: usize = (0..n)
            .flat_map(|q| (0..el).map(move |e| (q, e)))
            .map(|(q, e)| rcv[q * (1 + el) + 1 + e].max(0) as usize)
            .sum();
        if sent.iter().chain(&recv).any(|&c| c > t) || pairs > self.rows_cap {
            return Err(err(format!(
                "ep baseline: inconsistent counts (sent {sent:?}, received {recv:?}, {pairs} rows for {} allocated)",
                self.rows_cap
            )));
        }
        // SAFETY: epb_pack(const ep_t*, const ep_id*, const float*, const int*, int, int, int,
        // long long, ep_t*, unsigned*): x T*H, ids/w T*k, tok_pos T*n; sx n*T*H, smeta n*T*RMW.
        unsafe {
            g.launch(
                &self.k.pack,
                s,
                self.grid,
                BLOCK,
                0,
                &[
                    p(g.ptr(x)?),
                    p(g.ptr(ids)?),
                    p(g.ptr(w)?),
                    p(tp),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(k as i32),
                    KernelArg::I32(n as i32),
                    KernelArg::I64(h as i64),
                    p(sx),
                    p(sm),
                ],
            )?;
        }
        let (row, rec) = (h * 2, rmw * 4);
        let mut sends = Vec::with_capacity(2 * n);
        let mut recvs = Vec::with_capacity(2 * n);
        for q in 0..n {
            let at = (q * t) as u64;
            sends.push(P2p {
                ptr: sx + at * row as u64,
                bytes: sent[q] * row,
                peer: q,
            });
            sends.push(P2p {
                ptr: sm + at * rec as u64,
                bytes: sent[q] * rec,
                peer: q,
            });
            recvs.push(P2p {
                ptr: rx + at * row as u64,
                bytes: recv[q] * row,
                peer: q,
            });
            recvs.push(P2p {
                ptr: rm + at * rec as u64,
                bytes: recv[q] * rec,
                peer: q,
            });
        }
        // SAFETY: block q of each buffer holds T rows / records; counts are at most T (checked).
        unsafe { self.comm.group_send_recv(&sends, &recvs, s.raw())? };
        // SAFETY: epb_permute(const int*, int, int, int, int, int, long long, const ep_t*,
        // const unsigned*, ep_t*, unsigned*, unsigned*, unsigned*, int*): the received counts
        // index at most rows_cap expert-major rows (checked), the tables are sized for n*T*k
        // slots; shared memory El + 1 words; 512 threads.
        unsafe {
            g.launch(
                &self.k.permute,
                s,
                self.grid,
                BLOCK,
                ((el + 1) * 4) as u32,
                &[
                    p(rc),
                    KernelArg::I32(n as i32),
                    KernelArg::I32(el as i32),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(k as i32),
                    KernelArg::I32(self.me as i32),
                    KernelArg::I64(h as i64),
                    p(rx),
                    p(rm),
                    p(g.ptr(&self.ex)?),
                    p(g.ptr(&self.off)?),
                    p(g.ptr(&self.fill)?),
                    p(g.ptr(&self.row_src)?),
                    p(g.ptr(&self.tok_rows)?),
                ],
            )?;
        }
        self.sent = sent;
        self.recv = recv;
        Ok(())
    }

    /// Expert offsets of the last dispatch (after a synchronisation).
    pub(crate) fn offsets(&self, pe: &Pe) -> Result<Vec<usize>> {
        Ok(pe
            .local_vec(&self.off)?
            .into_iter()
            .map(|v| v as usize)
            .collect())
    }

    /// One combine of the last dispatch's expert-major rows (`ex`, identity experts) into `out`.
    pub(crate) fn combine(&self, g: &CudaPe, s: &Stream) -> Result<()> {
        let (t, h, k, n, el) = (self.t, self.h, self.topk, self.n, self.el);
        if self.sent.len() != n {
            return Err(Error::InvalidArgument(
                "ep baseline: combine before dispatch".into(),
            ));
        }
        let p = |sym: u64| KernelArg::Ptr(sym);
        let (sx, rx) = (g.ptr(&self.sx)?, g.ptr(&self.rx)?);
        // SAFETY: epb_csum(const int*, int, int, int, int, long long, const unsigned*, const
        // int*, const ep_t*, ep_t*): the tables of the last dispatch; ex holds its rows, sx
        // n*T rows.
        unsafe {
            g.launch(
                &self.k.csum,
                s,
                self.grid,
                BLOCK,
                0,
                &[
                    p(g.ptr(&self.rcnt)?),
                    KernelArg::I32(n as i32),
                    KernelArg::I32(el as i32),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(k as i32),
                    KernelArg::I64(h as i64),
                    p(g.ptr(&self.rmeta)?),
                    p(g.ptr(&self.tok_rows)?),
                    p(g.ptr(&self.ex)?),
                    p(sx),
                ],
            )?;
        }
        let row = (h * 2) as u64;
        let mut sends = Vec::with_capacity(n);
        let mut recvs = Vec::with_capacity(n);
        for q in 0..n {
            let at = (q * t) as u64 * row;
            sends.push(P2p {
                ptr: sx + at,
                bytes: self.recv[q] * h * 2,
                peer: q,
            });
            recvs.push(P2p {
                ptr: rx + at,
                bytes: self.sent[q] * h * 2,
                peer: q,
            });
        }
        // SAFETY: block q of sx / rx holds T rows; counts are at most T.
        unsafe { self.comm.group_send_recv(&sends, &recvs, s.raw())? };
        // SAFETY: epb_crecv(const int*, int, int, long long, const ep_t*, ep_t*): tok_pos of
        // the last dispatch, rx n*T rows, out T rows.
        unsafe {
            g.launch(
                &self.k.crecv,
                s,
                self.grid,
                BLOCK,
                0,
                &[
                    p(g.ptr(&self.tok_pos)?),
                    KernelArg::I32(t as i32),
                    KernelArg::I32(n as i32),
                    KernelArg::I64(h as i64),
                    p(rx),
                    p(g.ptr(&self.out)?),
                ],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, parameter list)` of every `extern "C"` kernel of `src`, launch bounds skipped.
    fn kernels(src: &str) -> Vec<(&str, &str)> {
        src.split("extern \"C\" __global__")
            .skip(1)
            .map(|d| {
                let d = d.trim_start().trim_start_matches("void").trim_start();
                let d = match d.strip_prefix("__launch_bounds__(") {
                    Some(r) => r[r.find(')').expect("launch bounds") + 1..].trim_start(),
                    None => d,
                };
                let open = d.find('(').expect("parameter list");
                let close = d.find(')').expect("parameter list");
                (d[..open].trim(), &d[open + 1..close])
            })
            .collect()
    }

    /// Parameter types of a list: pointers as `ptr`, `const` dropped.
    fn param_types(list: &str) -> Vec<String> {
        list.split(',')
            .map(|p| {
                let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                let ty = p.rsplit_once(' ').map_or(p.as_str(), |(t, _)| t);
                if p.contains('*') {
                    "ptr".to_string()
                } else {
                    ty.trim_start_matches("const ").to_string()
                }
            })
            .collect()
    }

    /// Every kernel of the baseline's source takes the parameters its launch site here passes,
    /// in order (the driver reads as many bytes per parameter as the kernel declares):
    /// `KernelArg::Ptr` ↔ pointer, `I32` ↔ `int`, `I64` ↔ `long long`; and the source holds
    /// no other kernel.
    #[test]
    fn launches_match_the_kernel_signatures() {
        let (p, i, l) = ("ptr", "int", "long long");
        let launches: [(&str, Vec<&str>); 6] = [
            ("epb_layout", vec![p, i, i, i, i, p, p, p]),
            ("epb_pack", vec![p, p, p, p, i, i, i, l, p, p]),
            (
                "epb_permute",
                vec![p, i, i, i, i, i, l, p, p, p, p, p, p, p],
            ),
            ("epb_csum", vec![p, i, i, i, i, l, p, p, p, p]),
            ("epb_crecv", vec![p, i, i, l, p, p]),
            ("epb_rowhash", vec![p, l, l, p]),
        ];
        let all = kernels(EP_BASELINE_KERNELS);
        assert_eq!(all.len(), launches.len());
        for (name, want) in &launches {
            let (_, list) = all
                .iter()
                .find(|k| k.0 == *name)
                .unwrap_or_else(|| panic!("kernel {name} not declared"));
            assert_eq!(&param_types(list), want, "{name}");
        }
        // The module the baseline loads is the library's MoE source, then these kernels.
        assert!(kernel_source().starts_with(EP_KERNELS));
        assert!(kernel_source().ends_with(EP_BASELINE_KERNELS));
        assert!(kernels(EP_KERNELS).iter().all(|k| !k.0.starts_with("epb_")));
    }

    #[test]
    fn reference_counts_and_hashes() {
        // 2 PEs, 4 experts, 2 tokens, k = 2: PE 0 sends token 0 to experts 0, 3; token 1 to 1.
        let routes = vec![
            (vec![0, 3, 1, -1], vec![0.5, 0.25, 1.0, 0.0]),
            (vec![2, 1, 3, 2], vec![1.0, 0.5, 0.125, 0.75]),
        ];
        let (t, h, k, e) = (2, 3, 2, 4);
        let r0 = reference(&routes, 0, t, h, k, e);
        // PE 0 owns experts 0, 1: expert 0 ← PE 0 token 0; expert 1 ← PE 0 token 1, PE 1 token 0.
        assert_eq!(r0.counts, vec![1, 2]);
        let hx = |p: usize, tok: usize| row_hash((0..h).map(|c| x_val(p, tok * h + c)));
        assert_eq!(r0.expert_hash[0], hx(0, 0));
        assert_eq!(r0.expert_hash[1], hx(0, 1).wrapping_add(hx(1, 0)));
        // Token 0 of PE 0: 0.5 x (PE 0) + 0.25 x (PE 1), each rounded, then summed and rounded.
        let want: Vec<bf16> = (0..h)
            .map(|c| {
                let xv = x_val(0, c).to_f32();
                bf16::from_f32(
                    bf16::from_f32(0.5 * xv).to_f32() + bf16::from_f32(0.25 * xv).to_f32(),
                )
            })
            .collect();
        assert_eq!(r0.out_hash[0], row_hash(want.into_iter()));
        let off = [0usize, 1, 3];
        let hashes = [hx(0, 0), hx(1, 0), hx(0, 1)];
        assert!(check_dispatch("t", &off, &hashes, &r0).is_ok());
        let bad = [hx(0, 0), hx(1, 0), hx(0, 0)];
        assert!(check_dispatch("t", &off, &bad, &r0).is_err());
        assert!(check_dispatch("t", &[0, 1, 2], &hashes, &r0).is_err());
        assert!(check_combine("t", &r0.out_hash, &r0).is_ok());
        let mut o = r0.out_hash.clone();
        o[1] ^= 1;
        assert!(check_combine("t", &o, &r0).is_err());
        assert!(check_combine("t", &o[..1], &r0).is_err());
    }

    /// The reference against the kernels' arithmetic spelled out (per-slot products summed in
    /// slot order per PE, rounded, summed over PEs ascending, rounded).
    #[test]
    fn reference_matches_the_direct_sums() {
        let (n, t, h, k, e) = (2, 23, 37, 8, 16);
        let routes: Vec<_> = (0..n)
            .map(|p| crate::ep_cuda::bench_routing(p, t, k, e))
            .collect();
        let epp = e / n;
        for me in 0..n {
            let r = reference(&routes, me, t, h, k, e);
            let mut counts = vec![0usize; epp];
            let mut eh = vec![0u64; epp];
            for (p, (ids, _)) in routes.iter().enumerate() {
                for tok in 0..t {
                    for &id in &ids[tok * k..(tok + 1) * k] {
                        if id >= 0 && id as usize / epp == me {
                            let hx = row_hash((0..h).map(|c| x_val(p, tok * h + c)));
                            counts[id as usize % epp] += 1;
                            eh[id as usize % epp] = eh[id as usize % epp].wrapping_add(hx);
                        }
                    }
                }
            }
            assert_eq!((&r.counts, &r.expert_hash), (&counts, &eh));
            let (ids, w) = &routes[me];
            for tok in 0..t {
                let row = (0..h).map(|c| {
                    let x = x_val(me, tok * h + c).to_f32();
                    let mut acc = 0f32;
                    for d in 0..n {
                        let mut part = 0f32;
                        let mut any = false;
                        for j in 0..k {
                            let id = ids[tok * k + j];
                            if id >= 0 && id as usize / epp == d {
                                part += w[tok * k + j] * x;
                                any = true;
                            }
                        }
                        if any {
                            acc += bf16::from_f32(part).to_f32();
                        }
                    }
                    bf16::from_f32(acc)
                });
                assert_eq!(r.out_hash[tok], row_hash(row), "PE {me} token {tok}");
            }
        }
    }
}
