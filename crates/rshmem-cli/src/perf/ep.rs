//! MoE dispatch/combine on the CPU backend (`rshmem_bench::ep`) beside the same-run
//! all-to-all-v baseline.

use super::record::Record;
use super::suite::CliResult;
use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{bf16, Pe};
use rshmem_bench::ep::{bench, BenchArgs};

/// What to measure (bf16 hidden states, identity experts, random routing).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct EpOpts {
    /// Tokens per PE `T`.
    pub tokens: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Top-k `k`.
    pub top_k: usize,
    /// Experts `E` (a multiple of the number of PEs).
    pub experts: usize,
    /// Timed calls (medians reported).
    pub iters: usize,
}

impl EpOpts {
    fn args(&self, layout: RecvLayout) -> BenchArgs {
        BenchArgs {
            tokens: self.tokens,
            hidden: self.hidden,
            top_k: self.top_k,
            num_experts: self.experts,
            warmup: 2,
            iters: self.iters.max(1),
            seed: 1,
            mode: EpMode::Normal,
            layout,
        }
    }

    /// Symmetric heap bytes a PE needs in a world of `n` PEs.
    pub fn heap_bytes(&self, n: usize) -> CliResult<usize> {
        let cfg = EpConfig::new(self.experts, self.tokens.max(1), self.hidden, self.top_k);
        Ok(HostBuffer::<bf16>::bytes_for(&cfg, n)?.next_multiple_of(4096) + (1 << 20))
    }

    /// Checks what the library would reject later, with a message naming the flags.
    pub fn check(&self, n: usize) -> CliResult<()> {
        if self.experts == 0 || !self.experts.is_multiple_of(n) {
            return Err(format!(
                "--ep-experts {} must be a positive multiple of the {n} PEs",
                self.experts
            )
            .into());
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(format!(
                "--ep-topk {} must be in 1..=--ep-experts {}",
                self.top_k, self.experts
            )
            .into());
        }
        if self.hidden == 0 {
            return Err("--ep-hidden must be at least 1".into());
        }
        Ok(())
    }
}

/// Runs the benchmark on every PE for both receive layouts; PE 0 returns `ep_dispatch` and
/// `ep_combine` records for each (mode `mode`, then `mode+tokens`: token-major dispatch and
/// `combine_tokens`), slowest PE's median time; bytes: hidden-state bytes sent to other PEs,
/// mean over PEs.
pub fn run(pe: &Pe, mode: &str, o: &EpOpts) -> CliResult<Vec<Record>> {
    let mut out = run_layout(pe, mode, o, RecvLayout::ExpertMajor)?;
    out.extend(run_layout(
        pe,
        &format!("{mode}+tokens"),
        o,
        RecvLayout::TokenMajor,
    )?);
    Ok(out)
}

fn run_layout(pe: &Pe, mode: &str, o: &EpOpts, layout: RecvLayout) -> CliResult<Vec<Record>> {
    let n = pe.n_pes();
    o.check(n)?;
    let r = bench::<bf16>(pe, &o.args(layout))?;
    let vals = [
        r.dispatch_s.to_bits(),
        r.combine_s.to_bits(),
        r.a2av_dispatch_s.to_bits(),
        r.a2av_combine_s.to_bits(),
        r.dispatch_bytes as u64,
        r.combine_bytes as u64,
    ];
    let slots = pe.alloc::<u64>(6 * n)?;
    let gathered = (|| -> CliResult<Option<[f64; 6]>> {
        pe.put(&slots, 6 * pe.my_pe(), &vals, 0)?;
        pe.barrier_all()?;
        if pe.my_pe() != 0 {
            return Ok(None);
        }
        let mut all = vec![0u64; 6 * n];
        pe.get(&slots, 0, &mut all, 0)?;
        let mut m = [0f64; 6];
        for row in all.chunks(6) {
            for i in 0..4 {
                m[i] = m[i].max(f64::from_bits(row[i]));
            }
            m[4] += row[4] as f64 / n as f64;
            m[5] += row[5] as f64 / n as f64;
        }
        Ok(Some(m))
    })();
    pe.barrier_all()?;
    pe.free(slots)?;
    let Some(m) = gathered? else {
        return Ok(Vec::new());
    };
    let rec = |op: &str, t: f64, bytes: f64, base: f64| {
        Record {
            op: op.into(),
            api: "host".into(),
            backend: pe.backend().name().into(),
            mode: mode.into(),
            pes: n,
            bytes: bytes.round() as usize,
            iters: o.iters as u64,
            time_us: t * 1e6,
            gbps: 0.0,
            baseline: "all_to_all_v".into(),
            baseline_time_us: base * 1e6,
            ratio: 0.0,
            busbw_gbps: None,
            note: format!(
                "T={} H={} k={} E={} bf16, random routing, identity experts{}; bytes = hidden-state bytes sent to other PEs per PE (mean), time = slowest PE's median; baseline: the same done as counts exchange + packed all-to-all-v (same run, results compared)",
                o.tokens,
                o.hidden,
                o.top_k,
                o.experts,
                if layout == RecvLayout::TokenMajor {
                    "; token-major: each token once per PE, combine_tokens sends the received rows back"
                } else {
                    ""
                }
            ),
        }
        .finish()
    };
    Ok(vec![
        rec("ep_dispatch", m[0], m[4], m[2]),
        rec("ep_combine", m[1], m[5], m[3]),
    ])
}
