//! The host MoE benchmark (CPU backend, `rshmem perf --ep`): dispatch and combine of
//! [`HostBuffer`] against the all-to-all-v path (`HostBuffer::dispatch_a2av`, a hook the
//! library keeps for this benchmark), same run, both paths' results compared.

use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{Elem, Error, Pe, Result};
use std::time::Instant;

/// What to measure (every PE passes the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchArgs {
    /// Tokens per PE `T`.
    pub tokens: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Top-k `k` (distinct experts per token, at most `num_experts`).
    pub top_k: usize,
    /// Experts `E` (a multiple of the number of PEs).
    pub num_experts: usize,
    /// Untimed calls first.
    pub warmup: usize,
    /// Timed calls (the report gives medians).
    pub iters: usize,
    /// Seed of the random routing and data (per PE: `seed ^ pe`).
    pub seed: u64,
    /// Mode of the measured buffer (the baseline always uses a normal-mode buffer).
    pub mode: EpMode,
    /// Receive layout of both buffers. Token-major measures `combine_tokens` (each PE sends back
    /// its received rows as the tokens' results) against the same done the all-to-all-v way.
    pub layout: RecvLayout,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            tokens: 4096,
            hidden: 7168,
            top_k: 8,
            num_experts: 256,
            warmup: 2,
            iters: 10,
            seed: 1,
            mode: EpMode::Normal,
            layout: RecvLayout::ExpertMajor,
        }
    }
}

/// One PE's results (seconds are medians over `iters`, measured on this PE from a barrier to
/// the call's return; a report over PEs takes the maximum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchReport {
    /// Symmetric bytes of the measured buffer.
    pub buffer_bytes: usize,
    /// Dispatch time.
    pub dispatch_s: f64,
    /// Combine time.
    pub combine_s: f64,
    /// Baseline (all-to-all-v) dispatch time.
    pub a2av_dispatch_s: f64,
    /// Baseline combine time.
    pub a2av_combine_s: f64,
    /// Hidden-state bytes this PE's dispatch sends to other PEs (DeepEP's convention: payload
    /// rows only, not the small row records).
    pub dispatch_bytes: usize,
    /// Hidden-state bytes this PE's combine sends to other PEs.
    pub combine_bytes: usize,
}

impl BenchReport {
    /// Dispatch bandwidth, bytes to other PEs / time (GB/s, 1e9).
    pub fn dispatch_gbps(&self) -> f64 {
        self.dispatch_bytes as f64 / self.dispatch_s / 1e9
    }
    /// Combine bandwidth (GB/s).
    pub fn combine_gbps(&self) -> f64 {
        self.combine_bytes as f64 / self.combine_s / 1e9
    }
    /// Baseline dispatch bandwidth (GB/s).
    pub fn a2av_dispatch_gbps(&self) -> f64 {
        self.dispatch_bytes as f64 / self.a2av_dispatch_s / 1e9
    }
    /// Baseline combine bandwidth (GB/s).
    pub fn a2av_combine_gbps(&self) -> f64 {
        self.combine_bytes as f64 / self.a2av_combine_s / 1e9
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random routing of `tokens` tokens: `top_k` distinct experts each, random weights in (0, 1].
fn random_routing(
    seed: u64,
    tokens: usize,
    top_k: usize,
    num_experts: usize,
) -> (Vec<i32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut w = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        let start = ids.len();
        while ids.len() - start < top_k {
            let e = (rng.next() % num_experts as u64) as i32;
            if !ids[start..].contains(&e) {
                ids.push(e);
                w.push(((rng.next() % 64) + 1) as f32 / 64.0);
            }
        }
    }
    (ids, w)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Measures dispatch and combine (identity experts) on the world team, and the same done the
/// all-to-all-v way (counts exchanged first, payload packed per destination into a staging copy
/// and put in one piece, barriers, local reordering). Collective over the world. Also checks
/// that both paths give identical results (an error otherwise).
///
/// Needs a heap of about twice [`HostBuffer::bytes_for`] when `args.mode` is capturable (a second,
/// normal-mode buffer serves the baseline).
pub fn bench<T: Elem>(pe: &Pe, args: &BenchArgs) -> Result<BenchReport> {
    let team = pe.world_team();
    let n = team.n_pes();
    if args.top_k == 0 || args.top_k > args.num_experts {
        return Err(Error::InvalidArgument(format!(
            "ep bench: top_k {} must be in 1..=num_experts {}",
            args.top_k, args.num_experts
        )));
    }
    if args.iters == 0 {
        return Err(Error::InvalidArgument(
            "ep bench: iters must be at least 1".into(),
        ));
    }
    let cfg = EpConfig::new(
        args.num_experts,
        args.tokens.max(1),
        args.hidden,
        args.top_k,
    )
    .with_mode(args.mode)
    .with_layout(args.layout);
    let h = args.hidden;
    let (ids, w) = random_routing(
        args.seed ^ (pe.my_pe() as u64).wrapping_mul(0x2545_f491_4f6c_dd1d),
        args.tokens,
        args.top_k,
        args.num_experts,
    );
    let mut rng = Rng(args.seed.wrapping_add(pe.my_pe() as u64 + 17));
    let x: Vec<T> = (0..args.tokens * h)
        .map(|_| T::from_f64(((rng.next() % 256) as f64 - 128.0) / 16.0))
        .collect();

    let mut buf = HostBuffer::<T>::new(pe, team, cfg)?;
    let mut base = match args.mode {
        EpMode::Normal => None,
        EpMode::Capturable { .. } => Some(HostBuffer::<T>::new(
            pe,
            team,
            EpConfig {
                mode: EpMode::Normal,
                ..cfg
            },
        )?),
    };
    let mut run = || -> Result<BenchReport> {
        let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        let mut sent = (0usize, 0usize);
        for it in 0..args.warmup + args.iters {
            pe.team_barrier(team)?;
            let t0 = Instant::now();
            let d = buf.dispatch(pe, &x, &ids, &w, args.top_k)?;
            let t1 = t0.elapsed().as_secs_f64();
            pe.team_barrier(team)?;
            let t0 = Instant::now();
            let tokens = args.layout == RecvLayout::TokenMajor;
            let y = if tokens {
                buf.combine_tokens(pe, &d.handle, &d.x)?
            } else {
                buf.combine(pe, &d.handle, &d.x)?
            };
            let t2 = t0.elapsed().as_secs_f64();

            let bb = base.as_mut().unwrap_or(&mut buf);
            pe.team_barrier(team)?;
            let t0 = Instant::now();
            let da = bb.dispatch_a2av(pe, team, &x, &ids, &w, args.top_k)?;
            let t3 = t0.elapsed().as_secs_f64();
            pe.team_barrier(team)?;
            let t0 = Instant::now();
            let ya = bb.combine_a2av(pe, team, &da.handle, &da.x, tokens)?;
            let t4 = t0.elapsed().as_secs_f64();

            if it == 0 {
                if da.x != d.x || !da.handle.same_routing(&d.handle) || ya != y {
                    return Err(Error::InvalidArgument(
                        "ep bench: the all-to-all-v baseline and dispatch/combine disagree".into(),
                    ));
                }
                let me = team.my_pe();
                let ts = std::mem::size_of::<T>();
                let to_others: usize = (0..n)
                    .filter(|&p| p != me)
                    .map(|p| {
                        (0..args.tokens)
                            .filter(|&t| {
                                ids[t * args.top_k..(t + 1) * args.top_k]
                                    .iter()
                                    .any(|&e| e as usize / (args.num_experts / n) == p)
                            })
                            .count()
                    })
                    .sum();
                // Rows sent back: one per (token, slot) served, or one per received token.
                let rows_back: usize = if tokens {
                    d.handle
                        .recv_src_pe()
                        .iter()
                        .filter(|&&s| s as usize != me)
                        .count()
                } else {
                    d.handle
                        .row_token()
                        .iter()
                        .filter(|&&i| d.handle.recv_src_pe()[i as usize] as usize != me)
                        .count()
                };
                sent = (to_others * h * ts, rows_back * h * ts);
            }
            if it >= args.warmup {
                for (v, t) in times.iter_mut().zip([t1, t2, t3, t4]) {
                    v.push(t);
                }
            }
        }
        Ok(BenchReport {
            buffer_bytes: buf.bytes(),
            dispatch_s: median(&mut times[0]),
            combine_s: median(&mut times[1]),
            a2av_dispatch_s: median(&mut times[2]),
            a2av_combine_s: median(&mut times[3]),
            dispatch_bytes: sent.0,
            combine_bytes: sent.1,
        })
    };
    let r = run();
    if let Some(b) = base {
        pe.free(b)?;
    }
    pe.free(buf)?;
    r
}
