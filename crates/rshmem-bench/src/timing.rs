//! Timing stream work with CUDA events ([`rshmem::cuda::Event`]).

use rshmem::cuda::{CudaPe, Event, Stream};
use rshmem::Result;

/// Times `f` `iters` times on `s` with events, after one untimed call; returns microseconds
/// per call. This PE's context stays current meanwhile (NCCL calls in `f` find it).
pub fn time_stream(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let _ctx = g.make_current()?;
    f()?;
    s.synchronize()?;
    let (a, b) = (Event::new(s)?, Event::new(s)?);
    a.record(s)?;
    let host = std::time::Instant::now();
    for _ in 0..iters {
        f()?;
    }
    // What issuing one call costs the host (when it exceeds the GPU time, back-to-back
    // figures measure the host): RSHMEM_LOG=rshmem_bench=debug.
    tracing::debug!(
        host_us_per_call = host.elapsed().as_secs_f64() * 1e6 / iters as f64,
        "time_stream"
    );
    b.record(s)?;
    b.synchronize()?;
    Ok(a.elapsed_ms(&b)? as f64 * 1e3 / iters as f64)
}

/// As [`time_stream`], but `iters` calls of `f` are captured once into a CUDA graph and the
/// graph is replayed (what a graph-capturing user pays: no host work per call). One warm-up
/// call and one warm-up replay come first.
pub fn time_graph(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    s.synchronize()?;
    s.begin_capture()?;
    let mut r = Ok(());
    for _ in 0..iters {
        r = f();
        if r.is_err() {
            break;
        }
    }
    let graph = s.end_capture()?;
    r?;
    graph.launch(s)?;
    s.synchronize()?;
    let t = time_stream(g, s, 1, || graph.launch(s))?;
    Ok(t / iters as f64)
}

/// Per-stage times (µs, averaged over `iters`) of calls made by `f`, which calls the mark it
/// is given after each kernel launch (an event recorded on `s` between launches).
pub fn stage_times(
    g: &CudaPe<'_>,
    s: &Stream,
    iters: usize,
    mut f: impl FnMut(&mut dyn FnMut() -> Result<()>) -> Result<()>,
) -> Result<Vec<f64>> {
    let _ctx = g.make_current()?;
    let mut sums: Vec<f64> = Vec::new();
    for _ in 0..iters {
        let first = Event::new(s)?;
        first.record(s)?;
        let mut evs = vec![first];
        f(&mut || {
            let e = Event::new(s)?;
            e.record(s)?;
            evs.push(e);
            Ok(())
        })?;
        s.synchronize()?;
        sums.resize(sums.len().max(evs.len() - 1), 0.0);
        for i in 1..evs.len() {
            sums[i - 1] += evs[i - 1].elapsed_ms(&evs[i])? as f64 * 1e3;
        }
    }
    Ok(sums.iter().map(|v| v / iters.max(1) as f64).collect())
}
