//! The data checks of the CUDA MoE benchmark ([`crate::ep_cuda::ep_bench`]), for rshmem's
//! dispatch/combine and the NCCL baseline's alike: the benchmark's inputs, the host's
//! reference, and the row checksums.
//!
//! Expert-major rows are checked per local expert: row count and the sum of row checksums
//! (`epb_rowhash` on the GPU, `mix` on the host) against the host's reference from the known
//! inputs; combine outputs per token against the reference's checksums (exact: inputs and
//! weights are small dyadic numbers, every f32 sum is exact, and the reference rounds where
//! the kernels do).

use crate::ep_baseline::{Kernels, BLOCK};
use crate::nccl::err;
use rshmem::cuda::{CudaPe, KernelArg, Stream};
use rshmem::{bf16, AsSym, Pe, Result, Sym};

/// The checksum of element bits `b` at column `i` (what `epb_rowhash` sums per row).
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

#[cfg(test)]
mod tests {
    use super::*;

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
