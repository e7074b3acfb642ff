//! The fabric suite: put and get bandwidth and 8-byte latency between two PEs on different
//! nodes (the world's PE 0 and PE 1 must be on different nodes), beside libfabric's own
//! `fi_pingpong` (Debian's `libfabric-bin`) run in the same process on the same provider and
//! domain, over loopback.
//!
//! `fi_pingpong` is a message ping-pong on an RDM endpoint; its `usec/xfer` (one way, one
//! transfer of the size) is the baseline time of every figure. Fabtests' `fi_rma_bw` (windowed
//! RMA writes or reads, `bench/fabtests-build.sh`), `fi_rma_pingpong` and Open MPI's OpenSHMEM
//! (`bench/openshmem-build.sh`) are further baselines when they are on `PATH`, each record
//! repeated per baseline ([`add_baselines`]). rshmem's latency is half a
//! round trip of 8-byte puts each waited for by its target (`p` then `wait_until`), and its
//! bandwidth that of back-to-back blocking puts (or gets) of one size, and (`put_nbi`,
//! `get_nbi`) of windows of non-blocking ones each ended by quiet, as `fi_rma_bw` keeps a window
//! in flight. Data is checked after each timed loop.

use crate::p2p::BenchRecord;
use rshmem::{Cmp, Error, Pe, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the baseline runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricTarget {
    /// Provider name for `fi_pingpong -p` (e.g. `tcp`).
    pub provider: String,
    /// Domain for `fi_pingpong -d` (e.g. `lo`), when set.
    pub domain: Option<String>,
}

/// One `fi_pingpong` result: microseconds per one-way transfer and MB/s (10^6 B/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPong {
    /// One-way time of one transfer, microseconds.
    pub usec_per_xfer: f64,
    /// Bandwidth as `fi_pingpong` reports it, MB/s.
    pub mb_per_s: f64,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Os {
        op: "bind",
        msg: e.to_string(),
    })?;
    l.local_addr().map(|a| a.port()).map_err(|e| Error::Os {
        op: "local_addr",
        msg: e.to_string(),
    })
}

/// Parses the last line of `fi_pingpong`'s table (`bytes #sent #ack total time MB/sec
/// usec/xfer Mxfers/sec`).
pub fn parse_pingpong(out: &str) -> Option<PingPong> {
    let line = out.lines().rev().find(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 8 && f[5].parse::<f64>().is_ok() && f[6].parse::<f64>().is_ok()
    })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some(PingPong {
        mb_per_s: f[5].parse().ok()?,
        usec_per_xfer: f[6].parse().ok()?,
    })
}

/// Runs `fi_pingpong` (server and client on loopback) for one size; an error naming the tool
/// when it is not installed or fails.
pub fn fi_pingpong(target: &FabricTarget, bytes: usize, iters: usize) -> Result<PingPong> {
    let fail = |msg: String| Error::Backend {
        backend: "fabric",
        msg: format!("fi_pingpong (libfabric-bin): {msg}"),
    };
    let port = free_port()?.to_string();
    let mut common = vec![
        "-p".to_string(),
        target.provider.clone(),
        "-e".into(),
        "rdm".into(),
        "-I".into(),
        iters.to_string(),
        "-S".into(),
        bytes.to_string(),
    ];
    if let Some(d) = &target.domain {
        common.extend(["-d".to_string(), d.clone()]);
    }
    let text = server_and_client("fi_pingpong", &common, &port, &fail)?;
    parse_pingpong(&text).ok_or_else(|| fail(format!("unreadable output: {}", text.trim())))
}

/// Runs the suite (collective over every PE; PE 0 and PE 1 take part, the others only
/// synchronise). Returns PE 0's records, without their baselines ([`add_baselines`]).
pub fn bench(pe: &Pe, sizes: &[usize], latency_iters: usize) -> Result<Vec<BenchRecord>> {
    if pe.n_pes() < 2 || pe.placement(0)?.node == pe.placement(1)?.node {
        return Err(Error::InvalidArgument(
            "the fabric suite needs PE 0 and PE 1 on different nodes".into(),
        ));
    }
    let me = pe.my_pe();
    let max = sizes.iter().copied().max().unwrap_or(8).max(8);
    let buf = pe.alloc_aligned::<u8>(max, 4096)?;
    let flag = pe.alloc::<u64>(1)?;
    let mode = pe.mode().name();
    let mut mine: Vec<(&'static str, usize, usize, f64)> = Vec::new();
    pe.barrier_all()?;
    // Latency: 8-byte ping-pong of puts, each waited for by its target.
    if me < 2 {
        let other = 1 - me;
        let iters = latency_iters.max(1);
        let t0 = Instant::now();
        for i in 1..=iters as u64 {
            if me == 0 {
                pe.p(&flag, 0, i, other)?;
                pe.wait_until(&flag, 0, Cmp::Ge, i)?;
            } else {
                pe.wait_until(&flag, 0, Cmp::Ge, i)?;
                pe.p(&flag, 0, i, other)?;
            }
        }
        let one_way = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
        mine.push(("put_latency", 8, iters, one_way));
    }
    pe.barrier_all()?;
    // Bandwidth: PE 0 puts (then gets) `n` bytes to PE 1 back to back.
    if me == 0 {
        let data: Vec<u8> = (0..max).map(|i| (i * 7 + 3) as u8).collect();
        for &n in sizes {
            let iters = (64usize << 20).div_ceil(n.max(1)).clamp(3, 200);
            pe.put(&buf, 0, &data[..n], 1)?;
            let t0 = Instant::now();
            for _ in 0..iters {
                pe.put(&buf, 0, &data[..n], 1)?;
            }
            pe.quiet()?;
            let t = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            mine.push(("put", n, iters, t));
            let mut back = vec![0u8; n];
            let t0 = Instant::now();
            for _ in 0..iters {
                pe.get(&buf, 0, &mut back, 1)?;
            }
            let t = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            if back[..] != data[..n] {
                return Err(Error::InvalidArgument(format!(
                    "fabric suite: the {n} bytes read back differ from those put"
                )));
            }
            mine.push(("get", n, iters, t));
            let (t, iters) = nbi_bandwidth(pe, &buf, &data[..n])?;
            mine.push(("put_nbi", n, iters, t.0));
            mine.push(("get_nbi", n, iters, t.1));
        }
    }
    pe.barrier_all()?;
    pe.free(flag)?;
    pe.free(buf)?;
    if me != 0 {
        return Ok(Vec::new());
    }
    Ok(mine
        .into_iter()
        .map(|(op, bytes, iters, t)| BenchRecord {
            op,
            api: "host",
            backend: "fabric",
            mode,
            pes: pe.n_pes(),
            bytes: if op == "put_latency" { 0 } else { bytes },
            iters,
            time_us: t,
            gbps: if op == "put_latency" {
                0.0
            } else {
                bytes as f64 / (t * 1e3)
            },
            baseline: "fi_pingpong",
            baseline_time_us: 0.0,
            ratio: 0.0,
        })
        .collect())
}

/// Transfers of one size in flight at once in the non-blocking figures: `fi_rma_bw`'s default
/// window (64), with at most 64 MiB in flight.
pub fn nbi_window(bytes: usize) -> usize {
    (64usize << 20).div_ceil(bytes.max(1)).clamp(1, 64)
}

/// Non-blocking bandwidth from PE 0 to PE 1, as `fi_rma_bw` measures it: windows of
/// [`nbi_window`] `put_nbi` (then `get_nbi`) of `data.len()` bytes, each window ended by quiet.
/// Microseconds per transfer (put, get) and the transfers timed; every get's bytes checked.
fn nbi_bandwidth(pe: &Pe, buf: &rshmem::Sym<u8>, data: &[u8]) -> Result<((f64, f64), usize)> {
    let n = data.len();
    let window = nbi_window(n);
    let rounds = (256usize << 20)
        .div_ceil(n.max(1) * window)
        .clamp(4, (20_000usize).div_ceil(window));
    let put_window = |tag: u64| -> Result<()> {
        for i in 0..window {
            drop(pe.put_nbi(buf, 0, data, 1, tag + i as u64)?);
        }
        pe.quiet()
    };
    put_window(0)?;
    let t0 = Instant::now();
    for r in 0..rounds {
        put_window((r * window) as u64)?;
    }
    let put = t0.elapsed().as_secs_f64() * 1e6 / (rounds * window) as f64;
    let mut backs = vec![vec![0u8; n]; window];
    let get_window = |backs: &mut [Vec<u8>]| -> Result<()> {
        let hs = backs
            .iter_mut()
            .map(|b| pe.get_nbi(buf, 0, b, 1, 0))
            .collect::<Result<Vec<_>>>()?;
        pe.quiet()?;
        hs.into_iter().try_for_each(|h| h.wait())
    };
    get_window(&mut backs)?;
    let t0 = Instant::now();
    for _ in 0..rounds {
        get_window(&mut backs)?;
    }
    let get = t0.elapsed().as_secs_f64() * 1e6 / (rounds * window) as f64;
    if backs.iter().any(|b| b[..] != data[..]) {
        return Err(Error::InvalidArgument(format!(
            "fabric suite: the {n} bytes of a get_nbi differ from those put"
        )));
    }
    // The completion queue holds an entry per operation: drain it.
    let mut done = Vec::new();
    pe.completions(&mut done);
    Ok(((put, get), rounds * window))
}

/// A baseline tool that may be on `PATH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// `fi_pingpong -e rdm` (Debian's `libfabric-bin`): a message ping-pong.
    FiPingpong,
    /// Fabtests' `fi_rma_bw -e rdm -o write|read`: windowed RMA bandwidth.
    FiRmaBw,
    /// Fabtests' `fi_rma_pingpong -e rdm -o write` (libfabric 1.21 on; not in 1.17).
    FiRmaPingpong,
    /// Open MPI's OpenSHMEM (`oshrun` and `rshmem-oshmem-fabric-bench` from
    /// `bench/openshmem-build.sh`), UCX on tcp over loopback.
    OpenShmem,
}

impl Baseline {
    /// Every baseline, in the order they run.
    pub const ALL: [Baseline; 4] = [
        Baseline::FiPingpong,
        Baseline::FiRmaBw,
        Baseline::FiRmaPingpong,
        Baseline::OpenShmem,
    ];

    /// The name in records and tables.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::FiPingpong => "fi_pingpong",
            Baseline::FiRmaBw => "fi_rma_bw",
            Baseline::FiRmaPingpong => "fi_rma_pingpong",
            Baseline::OpenShmem => "openshmem",
        }
    }

    /// The programs it needs.
    fn programs(self) -> &'static [&'static str] {
        match self {
            Baseline::FiPingpong => &["fi_pingpong"],
            Baseline::FiRmaBw => &["fi_rma_bw"],
            Baseline::FiRmaPingpong => &["fi_rma_pingpong"],
            Baseline::OpenShmem => &["oshrun", OSHMEM_BENCH],
        }
    }

    /// Whether it has a figure for `op` (`put_latency`, `put`, `get`, `put_nbi`, `get_nbi`).
    fn covers(self, op: &str) -> bool {
        match self {
            Baseline::FiPingpong => true,
            Baseline::OpenShmem => matches!(op, "put_latency" | "put" | "get"),
            Baseline::FiRmaBw => op != "put_latency",
            Baseline::FiRmaPingpong => matches!(op, "put_latency" | "put"),
        }
    }
}

/// The OpenSHMEM program `bench/openshmem-build.sh` builds.
pub const OSHMEM_BENCH: &str = "rshmem-oshmem-fabric-bench";

/// Whether `prog` is an executable file in a folder of `PATH`.
pub fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(prog);
            std::fs::metadata(&f).is_ok_and(|m| m.is_file())
        })
    })
}

/// Parses the last line of a fabtests table (`bytes iters total time MB/sec usec/xfer
/// Mxfers/sec`).
pub fn parse_fabtests(out: &str) -> Option<PingPong> {
    let line = out.lines().rev().find(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 7 && f[4].parse::<f64>().is_ok() && f[5].parse::<f64>().is_ok()
    })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some(PingPong {
        mb_per_s: f[4].parse().ok()?,
        usec_per_xfer: f[5].parse().ok()?,
    })
}

/// Runs a fabtests RMA tool (server and client on loopback, addresses exchanged out of band)
/// for one operation (`write`, `read`) and size, `window` transfers in flight where the tool
/// takes one (`-W`); the client's figure.
pub fn fabtests_rma(
    tool: &str,
    target: &FabricTarget,
    op: &str,
    bytes: usize,
    iters: usize,
    window: Option<usize>,
) -> Result<PingPong> {
    let fail = |msg: String| Error::Backend {
        backend: "fabric",
        msg: format!("{tool} (fabtests): {msg}"),
    };
    let (oob, port) = (free_port()?.to_string(), free_port()?.to_string());
    let mut common = vec![
        "-p".to_string(),
        target.provider.clone(),
        "-e".into(),
        "rdm".into(),
        "-o".into(),
        op.into(),
        "-I".into(),
        iters.to_string(),
        "-S".into(),
        bytes.to_string(),
        format!("-E={oob}"),
    ];
    if let Some(d) = &target.domain {
        common.extend(["-d".to_string(), d.clone()]);
    }
    if let Some(w) = window {
        common.extend(["-W".to_string(), w.to_string()]);
    }
    let text = server_and_client(tool, &common, &port, &fail)?;
    parse_fabtests(&text).ok_or_else(|| fail(format!("unreadable output: {}", text.trim())))
}

/// Runs `tool` as a server (`-B port`) and as a client against it on loopback with the same
/// `args`, retrying the client while the server is not listening yet (up to 30 s; each client
/// run at most 120 s): the client's output, or an error made by `fail`.
fn server_and_client(
    tool: &str,
    args: &[String],
    port: &str,
    fail: &dyn Fn(String) -> Error,
) -> Result<String> {
    let mut server = Command::new(tool)
        .args(args)
        .args(["-B", port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(format!("cannot start it: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        let out = Command::new("timeout")
            .arg("120")
            .arg(tool)
            .args(args)
            .args(["-P", port, "127.0.0.1"])
            .output()
            .map_err(|e| fail(format!("cannot start the client: {e}")));
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                let _ = server.kill();
                let _ = server.wait();
                return Err(e);
            }
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !text.contains("refused") || Instant::now() > deadline {
            break (out.status.success(), text);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = server.kill();
    let _ = server.wait();
    if !client.0 {
        return Err(fail(format!("client failed: {}", client.1.trim())));
    }
    Ok(client.1)
}

/// Runs the OpenSHMEM program on 2 PEs (UCX on tcp over the loopback interface, as the
/// fabric world runs) for the latency and every size; its lines `op bytes usec`.
pub fn openshmem(latency_iters: usize, sizes: &[usize]) -> Result<Vec<(String, usize, f64)>> {
    let out = Command::new("timeout")
        .args(["600", "oshrun", "-n", "2", "--oversubscribe", OSHMEM_BENCH])
        .arg(latency_iters.to_string())
        .args(sizes.iter().map(|s| s.to_string()))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("UCX_TLS", "tcp,self")
        .env("UCX_NET_DEVICES", "lo")
        .output()
        .map_err(|e| Error::Backend {
            backend: "fabric",
            msg: format!("oshrun: {e}"),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Open MPI 4.1.4's OSHMEM may crash in shmem_finalize after printing every figure: the
    // figures count when all of them are there.
    let figs: Vec<(String, usize, f64)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [op, b, t] => Some((op.to_string(), b.parse().ok()?, t.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    if figs.len() != 1 + 2 * sizes.len() {
        return Err(Error::Backend {
            backend: "fabric",
            msg: format!(
                "oshrun {OSHMEM_BENCH}: {} figures of {} (exit {:?}): {}",
                figs.len(),
                1 + 2 * sizes.len(),
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(figs)
}

/// One copy of `records` per baseline found on `PATH`, each with that baseline's time for the
/// record's operation and size (8 bytes for the latency) and the ratio (baseline time / ours),
/// figures a baseline has none for left out. A baseline that is absent is skipped with a
/// message on stderr; a run of one that fails leaves its figure at 0 (no ratio), saying so. Run it when no PE of the world is left
/// spinning, so that each baseline has the machine to itself as the world had.
pub fn add_baselines(
    records: &[BenchRecord],
    latency_iters: usize,
    target: &FabricTarget,
) -> Vec<BenchRecord> {
    let mut out = Vec::new();
    for b in Baseline::ALL {
        if let Some(p) = b.programs().iter().find(|p| !on_path(p)) {
            eprintln!("rshmem perf: {} skipped ({p} is not on PATH)", b.name());
            continue;
        }
        let shmem = if b == Baseline::OpenShmem {
            let mut sizes: Vec<usize> = records
                .iter()
                .filter(|r| r.op != "put_latency")
                .map(|r| r.bytes)
                .collect();
            sizes.dedup();
            match openshmem(latency_iters, &sizes) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("rshmem perf: openshmem skipped: {e}");
                    continue;
                }
            }
        } else {
            Vec::new()
        };
        for r in records.iter().filter(|r| b.covers(r.op)) {
            let lat = r.op == "put_latency";
            let bytes = if lat { 8 } else { r.bytes };
            let iters = if lat {
                latency_iters.max(10)
            } else {
                (8usize << 20).div_ceil(bytes.max(1)).clamp(5, 100)
            };
            let base = match b {
                Baseline::FiPingpong => fi_pingpong(target, bytes, iters).map(|p| p.usec_per_xfer),
                Baseline::FiRmaBw => {
                    let op = if r.op.starts_with("get") {
                        "read"
                    } else {
                        "write"
                    };
                    // Its default window (64) but at most 256 MiB in flight (each side holds
                    // a window of buffers), and several windows of transfers.
                    let window = (256usize << 20).div_ceil(bytes).clamp(1, 64);
                    let iters = (256usize << 20).div_ceil(bytes).max(4 * window).min(2000);
                    fabtests_rma("fi_rma_bw", target, op, bytes, iters, Some(window))
                        .map(|p| p.usec_per_xfer)
                }
                Baseline::FiRmaPingpong => {
                    fabtests_rma("fi_rma_pingpong", target, "write", bytes, iters, None)
                        .map(|p| p.usec_per_xfer)
                }
                Baseline::OpenShmem => Ok(shmem
                    .iter()
                    .find(|(op, n, _)| op == r.op && (lat || *n == bytes))
                    .map(|f| f.2)
                    .unwrap_or(0.0)),
            };
            // One failed baseline run (a port taken meanwhile, a crash) costs its figure, not
            // the world's figures measured before it.
            let base = base.unwrap_or_else(|e| {
                eprintln!(
                    "rshmem perf: {} for {} of {bytes} B failed: {e}",
                    b.name(),
                    r.op
                );
                0.0
            });
            let mut rec = r.clone();
            rec.baseline = b.name();
            rec.baseline_time_us = base;
            rec.ratio = if r.time_us > 0.0 && base > 0.0 {
                base / r.time_us
            } else {
                0.0
            };
            out.push(rec);
        }
    }
    if out.is_empty() {
        out.extend(records.iter().cloned().map(|mut r| {
            r.baseline = "";
            r
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_table_is_read() {
        let out =
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   8       1k      =1k      15k         0.63s      0.03     314.63       0.00\n";
        assert_eq!(
            parse_pingpong(out),
            Some(PingPong {
                usec_per_xfer: 314.63,
                mb_per_s: 0.03
            })
        );
        assert_eq!(parse_pingpong("error: nothing"), None);
    }

    #[test]
    fn fabtests_table_is_read() {
        let out = "bytes   iters   total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   1m      40      40m         0.02s   2221.09     472.10       0.00\n";
        assert_eq!(
            parse_fabtests(out),
            Some(PingPong {
                usec_per_xfer: 472.10,
                mb_per_s: 2221.09
            })
        );
        assert_eq!(parse_fabtests(out.lines().next().unwrap_or("")), None);
    }

    #[test]
    fn baselines_cover_their_figures() {
        assert!(!Baseline::FiRmaBw.covers("put_latency"));
        assert!(Baseline::FiRmaBw.covers("get"));
        assert!(!Baseline::FiRmaPingpong.covers("get"));
        assert!(Baseline::OpenShmem.covers("put_latency"));
        // The windowed figures go beside the windowed baseline and the message ping-pong.
        assert!(Baseline::FiRmaBw.covers("put_nbi") && Baseline::FiRmaBw.covers("get_nbi"));
        assert!(Baseline::FiPingpong.covers("get_nbi"));
        assert!(!Baseline::OpenShmem.covers("put_nbi"));
        assert!(!Baseline::FiRmaPingpong.covers("get_nbi"));
        assert_eq!(
            (nbi_window(8), nbi_window(4 << 20), nbi_window(64 << 20)),
            (64, 16, 1)
        );
        assert!(!on_path("rshmem-no-such-program"));
    }
}
