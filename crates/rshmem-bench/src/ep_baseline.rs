//! The same-run baseline of [`crate::ep_cuda::ep_bench`]: dispatch and combine done with NCCL
//! all-to-all-v, the path used before symmetric memory (e.g. nvFuser). The data checks of
//! both paths are `ep_check.rs`.
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

use crate::nccl::{err, DataType, NcclComm, P2p};
use rshmem::cuda::ep::{EP_KERNELS, MAX_GPU_EP_PES, MAX_GPU_EXPERTS};
use rshmem::cuda::{CudaPe, Kernel, KernelArg, Stream};
use rshmem::{bf16, ElemKind, Error, Pe, Result, Sym};

/// Threads per block of the grid kernels.
pub(crate) const BLOCK: u32 = 512;

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
    pub(crate) rowhash: Kernel,
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
}
