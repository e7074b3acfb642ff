//! The CPU-backend suite. It runs on every PE of a world, given the PE and a mode label, so the
//! same code serves thread mode (`rshmem::Launch::new().threads()`) and process or mixed mode
//! (`rshmem::launch`, started by `rshmem perf` through the launcher). PE 0 measures and returns
//! the records; its peer (PE 1, or in mixed mode the first PE of another process) serves the
//! ping-pongs and is the target of puts and gets; every PE joins the barriers.

use super::measure::{
    self, batch_for, median, sample, time_paired, AlignedBuf, PingPong as RawFlags, Timing,
    PING_PONG,
};
use super::record::Record;
pub use super::record::{BoxError, CliResult};
use indicatif::ProgressBar;
use rshmem::{Cmp, Pe, Signal, Sym};
use std::time::Instant;

/// An operation of the suite.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum Op {
    /// Blocking put from PE 0 to PE 1, sizes swept; baseline memcpy.
    Put,
    /// Blocking get by PE 0 from PE 1, sizes swept; baseline memcpy.
    Get,
    /// 8-byte put-with-signal ping-pong between PE 0 and PE 1, one way.
    #[value(alias = "put_signal")]
    PutSignal,
    /// fetch_add ping-pong between PE 0 and PE 1, one way.
    #[value(alias = "fetch_add")]
    FetchAdd,
    /// barrier_all of every PE of the world.
    Barrier,
}

impl Op {
    /// Every operation, in report order.
    pub const ALL: [Op; 5] = [Op::Put, Op::Get, Op::PutSignal, Op::FetchAdd, Op::Barrier];

    /// Name in records.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::PutSignal => "put_signal",
            Op::FetchAdd => "fetch_add",
            Op::Barrier => "barrier",
        }
    }
    fn needs_pair(self) -> bool {
        self != Op::Barrier
    }
}

/// What to run in one world.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SuiteOpts {
    /// Payload sizes in bytes for put and get (multiples of 8).
    pub sizes: Vec<usize>,
    /// Sample length and count.
    pub timing: Timing,
    /// Operations to run.
    pub ops: Vec<Op>,
}

impl SuiteOpts {
    /// Progress steps this suite takes on a world of `pes` PEs.
    pub fn steps(&self, pes: usize) -> u64 {
        self.ops
            .iter()
            .filter(|o| pes >= 2 || !o.needs_pair())
            .map(|o| match o {
                Op::Put | Op::Get => self.sizes.len() as u64,
                _ => 1,
            })
            .sum()
    }

    /// Symmetric heap bytes a PE needs for this suite.
    pub fn heap_bytes(&self) -> usize {
        self.sizes
            .iter()
            .copied()
            .max()
            .unwrap_or(8)
            .next_multiple_of(4096)
            + (1 << 20)
    }
}

/// Name of the latency baseline.
pub const PING_PONG_NAME: &str = "raw_pingpong";
/// Name of the bandwidth baseline.
pub const MEMCPY_NAME: &str = "memcpy";

/// Value that tells a ping-pong server to stop.
const STOP: u64 = 1 << 62;

struct Ctx<'a> {
    pe: &'a Pe,
    mode: &'a str,
    opts: &'a SuiteOpts,
    pb: Option<&'a ProgressBar>,
    out: Vec<Record>,
    ctl: Sym<u64>,
    /// One-way raw ping-pong latency measured outside the world, microseconds.
    outside_pp_us: f64,
    /// The raw flags PE 0 and its peer ping-pong on, interleaved with each latency figure:
    /// the in-process static (a two-PE world in one process) or a mapping shared by the
    /// processes; `None`: the outside figure is the baseline.
    raw: Option<&'a RawFlags>,
    /// The PE that serves PE 0's ping-pongs and is the target of its puts and gets.
    peer: usize,
}

impl Ctx<'_> {
    fn lead(&self) -> bool {
        self.pe.my_pe() == 0
    }

    fn step(&self, msg: String) {
        if let Some(pb) = self.pb.filter(|_| self.lead()) {
            pb.set_message(msg);
        }
    }
    fn done(&self) {
        if let Some(pb) = self.pb.filter(|_| self.lead()) {
            pb.inc(1);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        op: Op,
        bytes: usize,
        iters: u64,
        time_us: f64,
        baseline: &str,
        baseline_time_us: f64,
        note: String,
    ) {
        self.out.push(
            Record {
                op: op.name().into(),
                api: "host".into(),
                backend: self.pe.backend().name().into(),
                mode: self.mode.into(),
                pes: self.pe.n_pes(),
                bytes,
                iters,
                time_us,
                gbps: 0.0,
                baseline: baseline.into(),
                baseline_time_us,
                ratio: 0.0,
                busbw_gbps: None,
                note,
            }
            .finish(),
        );
    }

    /// PE 0's `v`, on every PE.
    fn agree(&self, v: u64) -> CliResult<u64> {
        let pe = self.pe;
        if self.lead() {
            for p in 0..pe.n_pes() {
                pe.p(&self.ctl, 0, v, p)?;
            }
        }
        pe.barrier_all()?;
        let r = pe.g(&self.ctl, 0, pe.my_pe())?;
        pe.barrier_all()?;
        Ok(r)
    }
}

/// Runs the suite on this PE. PE 0 returns the records, the others an empty list.
///
/// `outside_pp_us` is the raw ping-pong measured outside the world; it is the latency baseline
/// unless the world has exactly two PEs in this process, in which case the two PE threads
/// measure the raw ping-pong themselves just before the latency figures (same threads, same
/// placement, same load).
///
/// `shared` is a raw ping-pong on memory every process of the job maps (process and mixed
/// mode); PE 0 and its peer then measure the raw ping-pong on it in the world, whatever the
/// world size.
pub fn run(
    pe: &Pe,
    mode: &str,
    opts: &SuiteOpts,
    outside_pp_us: f64,
    shared: Option<&RawFlags>,
    pb: Option<&ProgressBar>,
) -> CliResult<Vec<Record>> {
    let n = pe.n_pes();
    let ctl = pe.alloc::<u64>(8)?;
    let peer = peer_of_pe0(pe)?;
    let raw = match shared {
        // A one-PE world has no pair to ping-pong between.
        _ if n < 2 => None,
        Some(s) => Some(s),
        None if n == 2 && pe.is_same_process(1)? => Some(&PING_PONG),
        None => None,
    };
    let mut cx = Ctx {
        pe,
        mode,
        opts,
        pb,
        out: Vec::new(),
        ctl,
        outside_pp_us,
        raw,
        peer,
    };
    let pair = n >= 2;
    for &op in &opts.ops {
        if op.needs_pair() && !pair {
            continue;
        }
        match op {
            Op::Put | Op::Get => bandwidth(&mut cx, op)?,
            Op::PutSignal => put_signal(&mut cx)?,
            Op::FetchAdd => fetch_add(&mut cx)?,
            Op::Barrier => barrier(&mut cx)?,
        }
    }
    let Ctx { out, ctl, .. } = cx;
    pe.free(ctl)?;
    Ok(out)
}

/// PE 0's partner (the same on every PE): the first PE of another process, else PE 1.
pub fn peer_of_pe0(pe: &Pe) -> CliResult<usize> {
    let n = pe.n_pes();
    let p0 = pe.placement(0)?.process;
    for p in 1..n {
        if pe.placement(p)?.process != p0 {
            return Ok(p);
        }
    }
    Ok(1.min(n.saturating_sub(1)))
}

fn bandwidth(cx: &mut Ctx, op: Op) -> CliResult<()> {
    let pe = cx.pe;
    let max = cx.opts.sizes.iter().copied().max().unwrap_or(8);
    let words = max.div_ceil(8);
    let obj = pe.alloc_aligned::<u64>(words, 64)?;
    let peer = cx.peer;
    if op == Op::Get {
        // The peer's copy holds the pattern the gets read back.
        let pat: Vec<u64> = (0..words as u64).map(|i| i ^ 0xabcd).collect();
        pe.local_write(&obj, 0, &pat)?;
    }
    pe.barrier_all()?;
    let t = cx.opts.timing;
    let (src, mut dst, mut scratch) = if cx.lead() {
        // Local buffers sit at the object's offset within a page (the heap is page aligned), so
        // put, get and memcpy all copy between addresses equal modulo 4096.
        let po = obj.offset() % 4096;
        let mut s = AlignedBuf::at_page_offset(words, 0, po);
        for (i, w) in s.as_mut_slice().iter_mut().enumerate() {
            *w = i as u64 ^ 0x5a5a;
        }
        let (d, t) = (
            AlignedBuf::at_page_offset(words, 0, po),
            AlignedBuf::at_page_offset(words, 0, po),
        );
        (s, d, t)
    } else {
        let e = || AlignedBuf::new(0, 0);
        (e(), e(), e())
    };
    for &size in &cx.opts.sizes {
        if cx.lead() {
            cx.step(format!(
                "{} {}",
                op.name(),
                super::report::human_bytes(size)
            ));
            let w = size / 8;
            let (s, d) = (&src.as_slice()[..w], &mut dst.as_mut_slice()[..w]);
            let tmp = &mut scratch.as_mut_slice()[..w];
            let memcpy = |k| {
                measure::memcpy_k(k, s, tmp);
                Ok::<_, BoxError>(())
            };
            let (base_us, us, iters) = match op {
                Op::Put => time_paired(&t, memcpy, |k| {
                    for _ in 0..k {
                        pe.put(&obj, 0, s, peer)?;
                    }
                    pe.quiet()?;
                    Ok(())
                })?,
                _ => time_paired(&t, memcpy, |k| {
                    for _ in 0..k {
                        pe.get(&obj, 0, d, peer)?;
                    }
                    Ok(())
                })?,
            };
            // Check that the data moved.
            if w > 0 {
                let (got, want) = match op {
                    Op::Put => (pe.g(&obj, w - 1, peer)?, src.as_slice()[w - 1]),
                    _ => (dst.as_slice()[w - 1], (w as u64 - 1) ^ 0xabcd),
                };
                if got != want {
                    return Err(format!(
                        "{} of {size} bytes: last word is {got:#x}, expected {want:#x}",
                        op.name()
                    )
                    .into());
                }
            }
            cx.record(
                op,
                size,
                iters,
                us,
                MEMCPY_NAME,
                base_us,
                format!(
                    "PE 0 {} PE {peer}{}; memcpy between two 64-byte-aligned buffers of PE 0, same sizes",
                    if op == Op::Put { "to" } else { "from" },
                    if pe.is_same_process(peer)? { "" } else { " (another process)" }
                ),
            );
            cx.done();
        }
        pe.barrier_all()?;
    }
    drop((src, dst, scratch));
    pe.free(obj)?;
    Ok(())
}

/// A ping-pong between PE 0 (client) and PE 1 (server), run in phases: before a phase every PE
/// resets its flags, PE 0 runs `k` round trips and stops the server, PE 1 serves until stopped.
trait PingPong {
    /// Every PE, before a phase: reset this PE's flags.
    fn reset(&self) -> CliResult<()>;
    /// PE 0: `k` round trips.
    fn client(&self, k: u64) -> CliResult<()>;
    /// PE 1: echo until stopped.
    fn server(&self) -> CliResult<()>;
    /// PE 0: stop the server.
    fn stop(&self) -> CliResult<()>;
}

/// The raw atomic-flag ping-pong between PE 0 and its peer: on a static (PE threads of one
/// process) or on a mapping shared by the processes.
struct Raw<'a>(&'a Pe, &'a RawFlags);

impl PingPong for Raw<'_> {
    fn reset(&self) -> CliResult<()> {
        if self.0.my_pe() == 0 {
            self.1.reset();
        }
        Ok(())
    }
    fn client(&self, k: u64) -> CliResult<()> {
        let mut seq = 0;
        if self.1.round_trips(k, &mut seq, self.0.config().timeout) {
            Ok(())
        } else {
            Err("raw ping-pong: the server stopped answering".into())
        }
    }
    fn server(&self) -> CliResult<()> {
        self.1.serve(self.0.config().timeout);
        Ok(())
    }
    fn stop(&self) -> CliResult<()> {
        self.1.stop();
        Ok(())
    }
}

/// One phase of `k` round trips between PE 0 and its peer; PE 0 gets microseconds per round
/// trip, the others 0.
fn phase(cx: &Ctx, pp: &dyn PingPong, k: u64) -> CliResult<f64> {
    let pe = cx.pe;
    pp.reset()?;
    pe.barrier_all()?;
    let mut us = 0.0;
    match pe.my_pe() {
        0 => {
            let r = sample(k, &mut |k| pp.client(k));
            pp.stop()?;
            us = r?;
        }
        p if p == cx.peer => pp.server()?,
        _ => {}
    }
    pe.barrier_all()?;
    Ok(us)
}

/// Two warm-up phases that find PE 0's `k` for one sample.
fn calibrate_pp(cx: &Ctx, pp: &dyn PingPong) -> CliResult<u64> {
    let t = &cx.opts.timing;
    let per = phase(cx, pp, 16)? * 1e-6;
    let k = (batch_for(t, per) / 4).max(1);
    let per = phase(cx, pp, k)? * 1e-6;
    Ok(batch_for(t, per))
}

/// Samples of a phased figure (every PE computes the same number).
fn phase_samples(t: &Timing) -> usize {
    t.samples_for(2.0 * t.sample_time.as_secs_f64())
}

/// The raw ping-pong interleaved with a measurement: `each(i)` runs sample `i` of the figure
/// after a raw sample (when measured in the world). Returns the raw one-way median (or the
/// outside figure) and a note saying which.
fn with_raw(
    cx: &Ctx,
    mut each: impl FnMut(usize) -> CliResult<()>,
) -> CliResult<(f64, &'static str)> {
    let raw = cx.raw.map(|f| Raw(cx.pe, f));
    let k = match &raw {
        Some(r) => calibrate_pp(cx, r)?,
        None => 0,
    };
    let mut v = Vec::new();
    for i in 0..phase_samples(&cx.opts.timing) {
        if let Some(r) = &raw {
            v.push(phase(cx, r, k)? / 2.0);
        }
        each(i)?;
    }
    let cross = !cx.pe.is_same_process(cx.peer)?;
    Ok(if raw.is_some() {
        (
            median(&mut v),
            if cross {
                "baseline: raw atomic-flag ping-pong between the same two PEs' processes over a shared mapping, samples interleaved"
            } else {
                "baseline: raw ping-pong between the same two PE threads, samples interleaved"
            },
        )
    } else {
        (
            cx.outside_pp_us,
            "baseline: raw ping-pong of two threads measured before the world started",
        )
    })
}

/// Measures a ping-pong figure beside the raw one. Returns (baseline one-way us, note, one-way
/// us, round trips timed), meaningful on PE 0.
fn latency(cx: &Ctx, pp: &dyn PingPong) -> CliResult<(f64, &'static str, f64, u64)> {
    let k = calibrate_pp(cx, pp)?;
    let mut v = Vec::new();
    let (base, note) = with_raw(cx, |_| {
        v.push(phase(cx, pp, k)? / 2.0);
        Ok(())
    })?;
    Ok((base, note, median(&mut v), k * v.len() as u64))
}

struct PutSignalPp<'a> {
    pe: &'a Pe,
    peer: usize,
    data: &'a Sym<u64>,
    sig: &'a Sym<u64>,
}

impl PingPong for PutSignalPp<'_> {
    fn reset(&self) -> CliResult<()> {
        Ok(self.pe.atomic_set(self.sig, 0, 0, self.pe.my_pe())?)
    }
    fn client(&self, k: u64) -> CliResult<()> {
        let pe = self.pe;
        for seq in 1..=k {
            pe.put_signal(
                self.data,
                0,
                &[seq],
                Signal::set(self.sig, 0, seq),
                self.peer,
            )?;
            pe.wait_until(self.sig, 0, Cmp::Eq, seq)?;
        }
        // The last echo carried the last sequence number in its data.
        let d = pe.g(self.data, 0, 0)?;
        if d != k {
            return Err(format!("put_signal ping-pong: data {d} after {k} round trips").into());
        }
        Ok(())
    }
    fn server(&self) -> CliResult<()> {
        let pe = self.pe;
        let mut last = 0;
        loop {
            let v = pe.wait_until(self.sig, 0, Cmp::Ne, last)?;
            if v >= STOP {
                return Ok(());
            }
            pe.put_signal(self.data, 0, &[v], Signal::set(self.sig, 0, v), 0)?;
            last = v;
        }
    }
    fn stop(&self) -> CliResult<()> {
        Ok(self.pe.atomic_set(self.sig, 0, STOP, self.peer)?)
    }
}

fn put_signal(cx: &mut Ctx) -> CliResult<()> {
    let pe = cx.pe;
    cx.step("put_signal 8 B ping-pong".into());
    let data = pe.alloc::<u64>(1)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_write(&data, 0, &[0])?;
    let pp = PutSignalPp {
        pe,
        peer: cx.peer,
        data: &data,
        sig: &sig,
    };
    let (base, note, us, iters) = latency(cx, &pp)?;
    if cx.lead() {
        cx.record(
            Op::PutSignal,
            8,
            iters,
            us,
            PING_PONG_NAME,
            base,
            format!(
                "8-byte put_signal + wait_until ping-pong PE 0 <-> PE {}, round trip / 2; {note}",
                cx.peer
            ),
        );
        cx.done();
    }
    pe.barrier_all()?;
    pe.free(sig)?;
    pe.free(data)?;
    Ok(())
}

struct FetchAddPp<'a> {
    pe: &'a Pe,
    peer: usize,
    cnt: &'a Sym<u64>,
}

impl PingPong for FetchAddPp<'_> {
    fn reset(&self) -> CliResult<()> {
        Ok(self.pe.atomic_set(self.cnt, 0, 0, self.pe.my_pe())?)
    }
    fn client(&self, k: u64) -> CliResult<()> {
        let pe = self.pe;
        for seq in 1..=k {
            let old = pe.atomic_fetch_add(self.cnt, 0, 1u64, self.peer)?;
            if old != seq - 1 {
                return Err(format!("fetch_add returned {old}, expected {}", seq - 1).into());
            }
            pe.wait_until(self.cnt, 0, Cmp::Ge, seq)?;
        }
        Ok(())
    }
    fn server(&self) -> CliResult<()> {
        let pe = self.pe;
        let mut last = 0;
        loop {
            let v = pe.wait_until(self.cnt, 0, Cmp::Gt, last)?;
            if v >= STOP {
                return Ok(());
            }
            pe.atomic_fetch_add(self.cnt, 0, 1u64, 0)?;
            last = v;
        }
    }
    fn stop(&self) -> CliResult<()> {
        Ok(self.pe.atomic_add(self.cnt, 0, STOP, self.peer)?)
    }
}

fn fetch_add(cx: &mut Ctx) -> CliResult<()> {
    let pe = cx.pe;
    cx.step("fetch_add ping-pong".into());
    let cnt = pe.alloc::<u64>(1)?;
    let pp = FetchAddPp {
        pe,
        peer: cx.peer,
        cnt: &cnt,
    };
    let (base, note, us, iters) = latency(cx, &pp)?;
    if cx.lead() {
        cx.record(
            Op::FetchAdd,
            8,
            iters,
            us,
            PING_PONG_NAME,
            base,
            format!(
                "blocking 64-bit fetch_add to the peer + wait_until ping-pong, round trip / 2; {note}"
            ),
        );
        cx.done();
    }
    pe.barrier_all()?;
    pe.free(cnt)?;
    Ok(())
}

fn barrier(cx: &mut Ctx) -> CliResult<()> {
    let pe = cx.pe;
    cx.step(format!("barrier {} PEs", pe.n_pes()));
    let t = cx.opts.timing;
    let pilot = 256u32;
    let s = Instant::now();
    for _ in 0..pilot {
        pe.barrier_all()?;
    }
    let per = s.elapsed().as_secs_f64() / f64::from(pilot);
    let k = cx.agree(batch_for(&t, per))?;
    let mut v = Vec::new();
    let (base, note) = with_raw(cx, |_| {
        let s = Instant::now();
        for _ in 0..k {
            pe.barrier_all()?;
        }
        v.push(s.elapsed().as_secs_f64() * 1e6 / k as f64);
        Ok(())
    })?;
    if cx.lead() {
        let us = median(&mut v);
        cx.record(
            Op::Barrier,
            0,
            k * v.len() as u64,
            us,
            PING_PONG_NAME,
            base,
            format!("barrier_all (quiet + dissemination barrier), time per barrier; {note}"),
        );
        cx.done();
    }
    pe.barrier_all()?;
    Ok(())
}
