//! What the tests of PEs on several "nodes" share (`fabric.rs`, `fabric_hier.rs`,
//! `cuda_fabric.rs`): the libfabric probe, a child's world config, and a MoE dispatch/combine across the nodes with
//! exact results.

#![allow(dead_code)]

use crate::harness;
use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::launcher::Exit;
use rshmem::{BackendKind, Config, Error, InProcBootstrap, Launch, Pe, Result};
use std::time::{Duration, Instant};

/// The world of a child: PEs of `pes_per_node` consecutive ranks form one node; loopback tcp.
pub fn config(pes_per_node: usize) -> Config {
    config_of(|rank| rank / pes_per_node)
}

/// The world of a child on node `node(rank)`; loopback tcp.
pub fn config_of(node: impl Fn(usize) -> usize) -> Config {
    let rank: usize = std::env::var("RSHMEM_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("RSHMEM_RANK from the launcher");
    Config::from_env()
        .expect("config")
        .node(format!("node{}", node(rank)))
        .fabric_provider("tcp")
        .fabric_domain("lo")
}

/// Runs `body` on `procs` processes of `threads` PEs each, nodes of two consecutive ranks, by
/// re-executing `test` with `env`: in the parent every process must exit 0; in a child, every
/// PE of it runs `body` to an `Ok`.
pub fn two_pe_nodes(
    test: &str,
    env: &[(&str, &str)],
    procs: usize,
    threads: usize,
    body: fn(&Pe) -> Result<()>,
) {
    if !harness::is_child() {
        let out = harness::spawn_self(test, procs * threads, threads, env, Duration::from_secs(5));
        assert_eq!(out.code, 0, "{test}: {:?}", out.exits);
        return;
    }
    if threads == 1 {
        let pe = Launch::new().config(config(2)).init().expect("init");
        body(&pe).expect(test);
        pe.finalize().expect("finalize");
        return;
    }
    let r = Launch::new()
        .config(config(2))
        .run(procs * threads, body)
        .values()
        .expect("world");
    for v in r {
        v.expect(test);
    }
}

/// Runs `test` as two processes, one a node, with the child setting `child` (timeout 30 s,
/// heap 16 MiB): process 1 must die by SIGKILL, process 0 survive it and exit 0.
pub fn second_node_killed(test: &str, child: &str) {
    let env = [
        (harness::CHILD_VAR, child),
        ("RSHMEM_TIMEOUT", "30"),
        ("RSHMEM_HEAP_SIZE", "16M"),
    ];
    let out = harness::spawn_self(test, 2, 1, &env, Duration::from_secs(15));
    assert_eq!(out.exits[1], Exit::Signal(9), "{:?}", out.exits);
    assert_eq!(out.exits[0], Exit::Code(0), "survivor: {:?}", out.exits);
}

/// Kills this process after 300 ms: its node dies while the others are at work.
pub fn die_soon() -> ! {
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain syscall on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    std::process::abort()
}

/// Checks the error that ended transfers to a killed PE 1 (`since`: when they began): the peer
/// lost, or the fabric or a timeout naming it, well before the world's 30 s timeout.
pub fn assert_pe_1_lost(e: &Error, since: Instant) {
    let el = since.elapsed();
    assert!(
        matches!(
            e,
            Error::PeerLost { pe: 1, .. }
                | Error::Fabric { pe: Some(1), .. }
                | Error::Timeout { pe: Some(1), .. }
        ),
        "{e:?}"
    );
    assert!(el < Duration::from_secs(25), "error after {el:?}");
}

/// Runs `body(rank, init)` on `n` thread-PEs of one in-process hub (30 s), `init` the result of
/// `Pe::init` with `config` applied to a config of node `n{node(rank)}` on loopback tcp; returns
/// the bodies' values in rank order.
pub fn thread_nodes<R: Send>(
    n: usize,
    node: impl Fn(usize) -> usize + Sync,
    config: impl Fn(Config) -> Config + Sync,
    body: impl Fn(usize, Result<Pe>) -> R + Sync,
) -> Vec<R> {
    let hub = InProcBootstrap::new(n, Duration::from_secs(30)).expect("hub");
    let (node, config, body) = (&node, &config, &body);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let hub = &hub;
                s.spawn(move || {
                    let c = config(Config::default())
                        .node(format!("n{}", node(r)))
                        .fabric_provider("tcp")
                        .fabric_domain("lo");
                    body(r, Pe::init(c, Box::new(hub.join(r).expect("join"))))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    })
}

/// The provider of the GPU tests across nodes: loopback tcp (GPU heaps staged through host
/// memory), or the one `RSHMEM_TEST_FABRIC_PROVIDER` names (on the GPU machine, `shm` of a
/// libfabric built with CUDA: GPU heaps registered with the fabric, unless
/// `RSHMEM_TEST_FABRIC_HMEM=off`).
pub fn gpu_fabric(c: Config) -> Config {
    // RSHMEM_TEST_FABRIC_HMEM=off: the same provider with GPU heaps staged.
    let c = c.fabric_hmem(std::env::var("RSHMEM_TEST_FABRIC_HMEM").map_or(true, |v| v != "off"));
    match std::env::var("RSHMEM_TEST_FABRIC_PROVIDER") {
        Ok(p) if p != "tcp" => c.fabric_provider(p),
        _ => c.fabric_provider("tcp").fabric_domain("lo"),
    }
}

/// The world of a GPU child of rank `RSHMEM_RANK` (0 outside a launched job) on node
/// `node(rank)`: the GPUs of `pes` PEs from [`gpu_devices`], a 64 MiB heap, `timeout`, the
/// provider of [`gpu_fabric`].
pub fn gpu_config_of(pes: usize, timeout: Duration, node: impl Fn(usize) -> usize) -> Config {
    let rank: usize = std::env::var("RSHMEM_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    gpu_fabric(
        Config::default()
            .heap_size(64 << 20)
            .timeout(timeout)
            .backend(BackendKind::Cuda)
            .devices(gpu_devices(pes))
            .node(format!("node{}", node(rank))),
    )
}

/// The GPU of each of `n` PEs in the GPU tests across nodes: all on GPU 0, or round-robin over
/// the first `RSHMEM_TEST_FABRIC_GPUS` GPUs (a switch of these tests: "nodes" of their own GPU
/// on a machine of several).
pub fn gpu_devices(n: usize) -> Vec<usize> {
    let k = std::env::var("RSHMEM_TEST_FABRIC_GPUS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    (0..n).map(|i| i % k).collect()
}

/// Checks that GPU heaps of the other nodes are reached the way the run expects: registered
/// with the fabric when `RSHMEM_TEST_GPU_HEAPS_ON_FABRIC=1`, staged otherwise.
pub fn check_gpu_path(pe: &Pe) {
    let want = std::env::var("RSHMEM_TEST_GPU_HEAPS_ON_FABRIC").is_ok_and(|v| v == "1");
    assert_eq!(
        pe.gpu_heaps_on_fabric(),
        want,
        "GPU heaps on the fabric (FI_HMEM): expected {want}"
    );
}

/// Whether libfabric is unusable here (then the test says so and passes).
pub fn skip() -> bool {
    if let Err(e) = rshmem::transport::fabric::probe() {
        eprintln!("SKIPPED: libfabric is not usable here ({e})");
        return true;
    }
    false
}

/// MoE through the host buffer on the world team: identity experts, token t of PE s goes to
/// expert (s + t) % E and to none (every third token) or expert (3s + t + 1) % E, with weights
/// 0.5 and 0.25, so combine gives x·(w0 + w1) exactly; every element checked.
pub fn moe_identity(pe: &Pe, tokens: usize, h: usize) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let e = 2 * n;
    let cfg = EpConfig {
        num_experts: e,
        max_tokens: tokens,
        hidden: h,
        max_topk: 2,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    };
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg)?;
    let xs: Vec<f32> = (0..tokens * h)
        .map(|i| ((me * 131 + i * 7) % 64) as f32 / 8.0)
        .collect();
    let mut ids = Vec::new();
    let mut ws = Vec::new();
    for t in 0..tokens {
        ids.push(((me + t) % e) as i32);
        ids.push(if t % 3 == 0 {
            -1
        } else {
            ((me * 3 + t + 1) % e) as i32
        });
        ws.extend([0.5f32, 0.25]);
    }
    let d = buf.dispatch(pe, &xs, &ids, &ws, 2)?;
    let out = buf.combine(pe, &d.handle, &d.x)?;
    for t in 0..tokens {
        let scale: f32 = if t % 3 == 0 { 0.5 } else { 0.75 };
        for j in 0..h {
            assert_eq!(
                out[t * h + j],
                xs[t * h + j] * scale,
                "token {t} element {j}"
            );
        }
    }
    pe.free(buf)
}
