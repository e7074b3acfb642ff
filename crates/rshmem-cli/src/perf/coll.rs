//! Collectives on the CPU backend (`rshmem_bench::coll`), nccl-tests style: time, algbw and
//! busbw of each collective beside the same-run `memcpy` of the same bytes.

use super::measure::{self, calibrate, median, sample, AlignedBuf, Timing};
use super::record::Record;
use super::suite::{CliResult, MEMCPY_NAME};
use indicatif::ProgressBar;
use rshmem::coll::{Coll, CollConfig, CollKind};
use rshmem::Pe;
use rshmem_bench::coll as bench;

/// The collectives measured, in report order.
pub const KINDS: [CollKind; 5] = [
    CollKind::AllReduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::AllToAll,
    CollKind::Broadcast,
];

/// Name in records.
pub fn name(k: CollKind) -> &'static str {
    match k {
        CollKind::AllReduce => "all_reduce",
        CollKind::AllGather => "all_gather",
        CollKind::ReduceScatter => "reduce_scatter",
        CollKind::AllToAll => "all_to_all",
        CollKind::AllToAllV => "all_to_all_v",
        CollKind::Broadcast => "broadcast",
        CollKind::Reduce => "reduce",
    }
}

/// What to measure.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CollOpts {
    /// Message sizes in bytes (nccl-tests' size: the full vector).
    pub sizes: Vec<usize>,
    /// Samples per figure (the median over PEs' slowest is reported).
    pub samples: usize,
    /// Target time of one sample in seconds.
    pub sample_s: f64,
}

impl CollOpts {
    /// Sizes 4 KiB, 64 KiB, 1 MiB up to `max` (quick) or every factor of 4 from 1 KiB to `max`
    /// (full).
    pub fn new(full: bool, max: usize) -> CollOpts {
        let sizes = if full {
            let mut v = Vec::new();
            let mut s = 1024;
            while s <= max.max(1024) {
                v.push(s);
                s *= 4;
            }
            v
        } else {
            let v: Vec<usize> = [4096, 64 << 10, 1 << 20]
                .into_iter()
                .filter(|&s| s <= max)
                .collect();
            if v.is_empty() {
                vec![max]
            } else {
                v
            }
        };
        CollOpts {
            sizes,
            samples: if full { 11 } else { 5 },
            sample_s: if full { 0.01 } else { 0.002 },
        }
    }

    /// Symmetric heap bytes a PE needs (source and destination of the largest size).
    pub fn heap_bytes(&self) -> usize {
        2 * self
            .sizes
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .next_multiple_of(4096)
            + (1 << 20)
    }

    /// Progress steps.
    pub fn steps(&self) -> u64 {
        (KINDS.len() * self.sizes.len()) as u64
    }
}

/// Runs every collective at every size on the world team; PE 0 returns the records (the
/// slowest PE's mean time per call, median over samples), the others an empty list.
pub fn run(pe: &Pe, mode: &str, o: &CollOpts, pb: Option<&ProgressBar>) -> CliResult<Vec<Record>> {
    let n = pe.n_pes();
    let lead = pe.my_pe() == 0;
    let coll = Coll::new(pe, CollConfig::from_env()?)?;
    let slots = pe.alloc::<u64>(n.max(1))?;
    let ctl = pe.alloc::<u64>(1)?;
    let max_words = o.sizes.iter().copied().max().unwrap_or(8).div_ceil(8);
    let (src, mut tmp) = if lead {
        (
            AlignedBuf::new(max_words, 0x5a5a),
            AlignedBuf::new(max_words, 0),
        )
    } else {
        (AlignedBuf::new(0, 0), AlignedBuf::new(0, 0))
    };
    let t = Timing {
        sample_time: std::time::Duration::from_secs_f64(o.sample_s),
        samples: 1,
        budget: std::time::Duration::from_secs(1),
    };
    let team = pe.world_team();
    let mut out = Vec::new();
    let r = (|| -> CliResult<()> {
        for kind in KINDS {
            for &size in &o.sizes {
                if let Some(pb) = pb.filter(|_| lead) {
                    pb.set_message(format!(
                        "{} {} PEs {}",
                        name(kind),
                        n,
                        super::report::human_bytes(size)
                    ));
                }
                // Pilot (also the warm-up): iterations for one sample, PE 0's choice.
                let pilot = bench::run(&coll, team, kind, size, 1, 2)?;
                if lead {
                    let k = (o.sample_s / pilot.time_s.max(1e-9)).clamp(1.0, 10_000.0) as u64;
                    for p in 0..n {
                        pe.p(&ctl, 0, k, p)?;
                    }
                }
                pe.barrier_all()?;
                let iters = pe.g(&ctl, 0, pe.my_pe())? as usize;
                pe.barrier_all()?;
                let mut bytes = 0;
                let (mut tv, mut bv) = (Vec::new(), Vec::new());
                let mut kb = 0;
                for _ in 0..o.samples {
                    if lead {
                        let w = pilot.bytes.div_ceil(8).min(max_words);
                        let (s, d) = (&src.as_slice()[..w], &mut tmp.as_mut_slice()[..w]);
                        let mut f = |k| {
                            measure::memcpy_k(k, s, d);
                            Ok::<_, ()>(())
                        };
                        if kb == 0 {
                            kb = calibrate(&t, &mut f).map_or(1, |(k, _)| k);
                        }
                        bv.push(sample(kb, &mut f).unwrap_or(f64::NAN));
                    }
                    pe.barrier_all()?;
                    let r = bench::run(&coll, team, kind, size, 0, iters)?;
                    bytes = r.bytes;
                    pe.p(&slots, pe.my_pe(), r.time_s.to_bits(), 0)?;
                    pe.barrier_all()?;
                    if lead {
                        let mut worst = 0f64;
                        for p in 0..n {
                            worst = worst.max(f64::from_bits(pe.g(&slots, p, 0)?));
                        }
                        tv.push(worst * 1e6);
                    }
                    pe.barrier_all()?;
                }
                if lead {
                    let us = median(&mut tv);
                    let base = median(&mut bv);
                    let algbw = bytes as f64 / (us * 1e3);
                    let rec = Record {
                        op: name(kind).into(),
                        api: "host".into(),
                        backend: pe.backend().name().into(),
                        mode: mode.into(),
                        pes: n,
                        bytes,
                        iters: iters as u64 * o.samples as u64,
                        time_us: us,
                        gbps: 0.0,
                        baseline: MEMCPY_NAME.into(),
                        baseline_time_us: base,
                        ratio: 0.0,
                        busbw_gbps: Some(algbw * bench::bus_factor(kind, n)),
                        note: format!(
                            "f32 sum where reducing; slowest PE's mean time per call, median of {} samples of {iters} calls; gbps = algbw; baseline memcpy of the same bytes on PE 0",
                            o.samples
                        ),
                    }
                    .finish();
                    out.push(rec);
                    if let Some(pb) = pb {
                        pb.inc(1);
                    }
                }
            }
        }
        Ok(())
    })();
    let f = pe
        .free(ctl)
        .and_then(|_| pe.free(slots))
        .and_then(|_| pe.free(coll));
    r?;
    f?;
    Ok(out)
}
