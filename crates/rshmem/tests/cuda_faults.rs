//! GPU faults in process mode: a PE killed while the other runs GPU collectives, or enters an
//! MoE dispatch, makes the survivor's device waits end in an error naming the dead PE
//! (`PeerLost`, or a `Timeout` naming it), never a hang or a success. Needs 1 GPU or more
//! (PEs share GPUs round robin).

mod harness;

use rshmem::coll::{CollConfig, ReduceOp};
use rshmem::cuda::{ep::EpTuning, ep::GpuBuffer, CollTuning, CudaPe, GpuColl};
use rshmem::ep::{EpConfig, EpMode, RecvLayout};
use rshmem::launcher::Exit;
use rshmem::{Error, Result};
use std::time::Duration;

const ENV: &[(&str, &str)] = &[
    (harness::CHILD_VAR, "cuda_fault"),
    ("RSHMEM_BACKEND", "cuda"),
    ("RSHMEM_TIMEOUT", "20"),
    ("RSHMEM_HEAP_SIZE", "256M"),
];

fn die() -> ! {
    // SAFETY: plain syscalls on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    std::process::abort()
}

/// Runs `test` as 2 processes; PE 1 must die by SIGKILL, PE 0 exit 0 (it checked its error).
fn expect_pe1_killed(test: &str) {
    let _gpu = harness::gpu_world();
    let out = harness::spawn_self_ignored(test, 2, 1, ENV, Duration::from_secs(60));
    assert_eq!(out.exits[1], Exit::Signal(libc::SIGKILL), "{:?}", out.exits);
    assert_eq!(
        out.exits[0],
        Exit::Code(0),
        "the survivor's check failed: {:?}",
        out.exits
    );
}

fn names_pe1(r: &Result<()>) -> bool {
    matches!(
        r,
        Err(Error::PeerLost { pe: 1, .. }) | Err(Error::Timeout { pe: Some(1), .. })
    )
}

#[test]
#[ignore = "needs a GPU"]
fn pe_killed_during_gpu_collectives() {
    if !harness::is_child() {
        return expect_pe1_killed("pe_killed_during_gpu_collectives");
    }
    let pe = rshmem::init().unwrap();
    let g = CudaPe::new(&pe).unwrap();
    let coll = GpuColl::new(g, CollConfig::default(), CollTuning::from_env().unwrap()).unwrap();
    let s = g.stream().unwrap();
    let x = pe.alloc::<f32>(1 << 20).unwrap();
    let y = pe.alloc::<f32>(1 << 20).unwrap();
    pe.local_fill(&x, 1.0).unwrap();
    pe.barrier_all().unwrap();
    let world = pe.world_team();
    // Both run collectives; PE 1 dies in the middle of its stream of them.
    let mut last: Result<()> = Ok(());
    for i in 0..2000 {
        if pe.my_pe() == 1 && i == 50 {
            die();
        }
        last = coll
            .all_reduce(&s, world, &y, &x, 1 << 20, ReduceOp::Sum)
            .and_then(|_| s.synchronize())
            .and_then(|_| coll.check_errors());
        if last.is_err() {
            break;
        }
        if pe.my_pe() == 0 && i < 50 {
            // Every completed all-reduce has the exact sum.
            assert_eq!(pe.g(&y, 12345, 0).unwrap(), 2.0, "all_reduce {i}");
        }
    }
    assert!(
        names_pe1(&last),
        "PE 0 after PE 1 died mid-collective: {last:?}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn pe_killed_during_moe_dispatch() {
    if !harness::is_child() {
        return expect_pe1_killed("pe_killed_during_moe_dispatch");
    }
    let pe = rshmem::init().unwrap();
    let (t, h, k) = (8, 64, 2);
    let cfg = EpConfig {
        num_experts: 4,
        max_tokens: t,
        hidden: h,
        max_topk: k,
        mode: EpMode::Normal,
        layout: RecvLayout::ExpertMajor,
    };
    let g = CudaPe::new(&pe).unwrap();
    let s = g.stream().unwrap();
    let buf =
        GpuBuffer::<f32>::new(&pe, pe.world_team(), cfg, &EpTuning::from_env().unwrap()).unwrap();
    let x = pe.alloc::<f32>(t * h).unwrap();
    let ids = pe.alloc::<i32>(t * k).unwrap();
    let w = pe.alloc::<f32>(t * k).unwrap();
    pe.local_fill(&x, 1.0).unwrap();
    let id: Vec<i32> = (0..t * k).map(|i| (i % 4) as i32).collect();
    pe.local_write(&ids, 0, &id).unwrap();
    pe.local_fill(&w, 0.5).unwrap();
    pe.barrier_all().unwrap();
    if pe.my_pe() == 1 {
        std::thread::sleep(Duration::from_millis(100));
        die();
    }
    let r = buf
        .dispatch(&pe, &s, &x, &ids.slice(..t * k).unwrap(), &w, k)
        .map(|_| ())
        .and_then(|_| s.synchronize());
    assert!(names_pe1(&r), "PE 0's dispatch after PE 1 died: {r:?}");
}
