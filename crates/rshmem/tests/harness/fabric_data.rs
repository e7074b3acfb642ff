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
