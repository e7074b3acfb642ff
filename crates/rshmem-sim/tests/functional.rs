//! Functional mode: real data through the library on CPU thread-PEs, every value checked, the
//! clock the simulated one.

use rshmem::coll::CollKind;
use rshmem_sim::functional::run;
use rshmem_sim::schedule::{build, Op, Setup};
use rshmem_sim::{simulate, Topology};

#[test]
fn collectives_and_dispatch_move_the_right_data() {
    let path = format!("{}/topologies/nvswitch8.toml", env!("CARGO_MANIFEST_DIR"));
    let topo = Topology::load(&path).expect("topology");
    let setup = Setup::default();
    for (op, pes, bytes, values) in [
        (Op::Coll(CollKind::AllReduce), 4, 64 << 10, 4 * 8192),
        (Op::Coll(CollKind::AllGather), 4, 4096, 4 * 512),
        (Op::Coll(CollKind::ReduceScatter), 3, 3 * 1024, 3 * 128),
        (Op::Coll(CollKind::AllToAll), 4, 1 << 20, 4 * (1 << 17)),
        (Op::Coll(CollKind::Broadcast), 2, 800, 2 * 100),
    ] {
        let f = run(&topo, &setup, op, pes, bytes).expect("functional run");
        assert_eq!(f.pes, pes);
        assert_eq!(f.checked, values, "{}", op.name());
        let p = build(&topo, &setup, op, pes, bytes).expect("schedule");
        let t = simulate(&topo, &p, &mut |_, _| {})
            .expect("simulate")
            .time_us;
        assert_eq!(f.time_us, t, "{}", op.name());
    }
    let mut setup = Setup::default();
    setup.ep.tokens = 32;
    setup.ep.hidden = 64;
    setup.ep.topk = 4;
    setup.ep.experts = 16;
    let f = run(&topo, &setup, Op::Dispatch, 4, 0).expect("dispatch");
    // Every (token, slot) of every PE lands once as a row of 64 values: 4 PEs · 32 · 4 · 64.
    assert_eq!(f.checked, 4 * 32 * 4 * 64);
}
