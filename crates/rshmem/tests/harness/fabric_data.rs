//! What the tests of PEs on several "nodes" share (`fabric.rs`, `fabric_hier.rs`,
//! `cuda_fabric.rs`): the libfabric probe, a child's world config, and a MoE dispatch/combine across the nodes with
//! exact results.

#![allow(dead_code)]

use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{Config, Pe, Result};

/// The world of a child: PEs of `pes_per_node` consecutive ranks form one node; loopback tcp.
pub fn config(pes_per_node: usize) -> Config {
    let rank: usize = std::env::var("RSHMEM_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("RSHMEM_RANK from the launcher");
    Config::from_env()
        .expect("config")
        .node(format!("node{}", rank / pes_per_node))
        .fabric_provider("tcp")
        .fabric_domain("lo")
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
