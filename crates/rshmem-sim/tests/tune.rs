//! `--tune` on the 2x H200 model, beside what the hardware measurements chose.

use rshmem_sim::schedule::Setup;
use rshmem_sim::tune::{pick, Picks};
use rshmem_sim::Topology;

#[test]
fn picks_on_two_h200() {
    let path = format!("{}/topologies/h200x2.toml", env!("CARGO_MANIFEST_DIR"));
    let topo = Topology::load(&path).expect("topology");
    let p = pick(&topo, &Setup::default(), 2).expect("picks");
    // The hardware chose: LL all_reduce up to 512 KiB (the model: one doubling more; it
    // times the LL all_reduce kernel's largest calls short, BENCHMARKS.md), LL
    // all_to_all up to 1 MiB (one doubling more), a pair's all_reduce pushing from 256 MiB,
    // where stores and loads tied within 0.5 % (the same), and all_to_all pushing at every
    // pull size, from 2 MiB (one doubling more).
    assert_eq!(
        p,
        Picks {
            ll_all_reduce: 1 << 20,
            ll_all_to_all: 2 << 20,
            push_all_reduce: 256 << 20,
            push_all_to_all: 4 << 20,
        }
    );
}
