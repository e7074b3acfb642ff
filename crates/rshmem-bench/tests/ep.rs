//! The host MoE benchmark (`rshmem_bench::ep`) in every mode: tiny sizes; its all-to-all-v
//! baseline must agree with dispatch/combine (the benchmark checks), no timing asserts.

#[path = "../../rshmem/tests/harness/mod.rs"]
mod harness;

use rshmem::ep::{EpMode, RecvLayout};
use rshmem::{bf16, Pe, Result};
use rshmem_bench::ep::{bench, BenchArgs};

fn bench_small(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let modes = [EpMode::Normal, EpMode::Capturable { capacity: 16 }];
    let layouts = [RecvLayout::ExpertMajor, RecvLayout::TokenMajor];
    for (mode, layout) in modes.into_iter().flat_map(|m| layouts.map(|l| (m, l))) {
        let args = BenchArgs {
            tokens: 16,
            hidden: 8,
            top_k: 3,
            num_experts: 2 * n.max(2),
            warmup: 0,
            iters: 2,
            seed: 3,
            mode,
            layout,
        };
        let r = bench::<bf16>(pe, &args)?;
        assert!(r.dispatch_s > 0.0 && r.combine_s > 0.0);
        assert!(r.a2av_dispatch_s > 0.0 && r.a2av_combine_s > 0.0);
        if n == 1 {
            assert_eq!((r.dispatch_bytes, r.combine_bytes), (0, 0));
        } else {
            assert!(r.dispatch_bytes > 0 && r.dispatch_bytes % (8 * 2) == 0);
        }
    }
    Ok(())
}
mode_test!(bench_entry_point_runs, [1, 2, 3], bench_small);
