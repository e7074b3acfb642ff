//! Many PEs: no compiled-in limit on PEs or teams.

use super::*;

/// Kernels of the many-PE test (a small module: every PE loads its own copy).
pub(crate) const MANY_PE_KERNELS: &str = r#"
// `rounds` rounds of: put my round-r block of `src` (n u32) into the same block of `dst` at PE
// (me+1)%n_pes with a signal (block scope), wait for my predecessor's signal, world barrier.
extern "C" __global__ void t_many_ring(const unsigned* src, unsigned* dst, unsigned long long n,
                                       unsigned long long* sig, int rounds) {
    int next = (rshmem_my_pe() + 1) % rshmem_n_pes();
    for (int r = 0; r < rounds; r++) {
        rshmem_uint32_put_signal_block(dst + r * n, src + r * n, n, sig, 1, RSHMEM_SIGNAL_ADD, next);
        if (threadIdx.x == 0) rshmem_signal_wait_until(sig, RSHMEM_CMP_GE, (unsigned long long)(r + 1));
        __syncthreads();
        rshmem_barrier_all_block();
    }
}

// Rounds of: write tag + r*1000 + me into every member's slots[me], team barrier, read every
// member's slot of my copy into out[r * size + i], team sync (nobody writes round r+1 early).
extern "C" __global__ void t_many_team(long long* slots, long long* out, int rounds, long long tag,
                                       rshmem_team team) {
    int me = rshmem_my_pe();
    for (int r = 0; r < rounds; r++) {
        for (int i = threadIdx.x; i < team.size; i += blockDim.x)
            rshmem_int64_p(slots + me, tag + (long long)r * 1000 + me, team.start + i * team.stride);
        rshmem_team_barrier_block(team);
        for (int i = threadIdx.x; i < team.size; i += blockDim.x)
            out[r * team.size + i] = ((volatile long long*)slots)[team.start + i * team.stride];
        rshmem_team_sync_block(team);
    }
}

// One team sync and nothing else (also with hand-made, invalid teams).
extern "C" __global__ void t_many_sync(rshmem_team team) { rshmem_team_sync_block(team); }
"#;

/// PEs of the many-PE test: more than the 64 the device state once held (`RSHMEM_TEST_PES`
/// overrides it, e.g. to find where a machine stops coping).
pub(crate) fn many_pes_count() -> usize {
    std::env::var("RSHMEM_TEST_PES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 2)
        .unwrap_or(72)
}
/// Team slots of the many-PE test (a non-default size; every slot gets used).
pub(crate) const MANY_TEAMS: usize = 8;

/// Launches one kernel and waits for it. Kernels that wait for peers are launched after a host
/// barrier, with nothing else unfinished on their stream: with 72 PEs sharing a GPU (144
/// streams over at most 32 hardware queues) a stream's second item, waiting for its first,
/// could hold back a peer's kernel queued behind it.
pub(crate) fn many_launch(
    g: &CudaPe,
    s: &cuda::Stream,
    k: &cuda::Kernel,
    args: &[KernelArg],
) -> Result<()> {
    // SAFETY: every call site passes the argument list of the MANY_PE_KERNELS kernel it names.
    unsafe { g.launch(k, s, 1, 128, 0, args)? };
    s.synchronize()?;
    g.check_device_errors()
}

pub(crate) fn many_pes(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    // n × (max_teams + 1) × 16 B of barrier words, the error line, the base table.
    assert_eq!(
        g.sync_area_bytes(),
        n * (MANY_TEAMS + 1) * 16 + 64 + 8 * n,
        "PE {me}: sync area size"
    );
    let s = g.stream()?;
    // Every module this test uses, loaded before any kernel that waits.
    let k_ring = g.kernel(MANY_PE_KERNELS, "t_many_ring", &[])?;
    let k_team = g.kernel(MANY_PE_KERNELS, "t_many_team", &[])?;
    let k_sync = g.kernel(MANY_PE_KERNELS, "t_many_sync", &[])?;

    // Teams: a strided one (members 1, 4, 7, …: 24 of 72), then full copies of the world until
    // every slot is taken; the device has counters for every one of them, the last included.
    let strided = pe.team_split_strided(pe.world_team(), 1, 3, (n - 2) / 3 + 1)?;
    let mut fill = Vec::new();
    for _ in 2..MANY_TEAMS {
        fill.push(
            pe.team_split_strided(pe.world_team(), 0, 1, n)?
                .expect("every PE is a member"),
        );
    }
    let last = fill
        .iter()
        .map(|t| g.device_team(t))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .find(|t| t.slot as usize == MANY_TEAMS - 1)
        .expect("a team in the last slot");

    // 1. Ring put with signal of seeded data, world barriers in the kernel.
    let (len, rounds) = (4099usize, 4usize);
    let src = pe.alloc::<u32>(len * rounds)?;
    let dst = pe.alloc::<u32>(len * rounds)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_write(&src, 0, &harness::rand_vec::<u32>(me, 72, len * rounds))?;
    pe.local_fill(&dst, 0xdead_beef)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    many_launch(
        &g,
        &s,
        &k_ring,
        &[
            g.arg(&src)?,
            g.arg(&dst)?,
            KernelArg::U64(len as u64),
            g.arg(&sig)?,
            KernelArg::I32(rounds as i32),
        ],
    )?;
    pe.barrier_all()?;
    let prev = (me + n - 1) % n;
    assert!(
        pe.local_vec(&dst)? == harness::rand_vec::<u32>(prev, 72, len * rounds),
        "PE {me}: ring data from PE {prev} wrong"
    );
    assert_eq!(pe.local_vec(&sig)?, vec![rounds as u64], "PE {me}: signal");

    // 2. Device team barriers: the world (slot 0), the strided team, the last slot.
    let slots = pe.alloc::<i64>(n)?;
    let out = pe.alloc::<i64>(rounds * n)?;
    let world = g.device_team(pe.world_team())?;
    assert_eq!((world.slot, world.size, world.stride), (0, n as i32, 1));
    let phases = [
        Some((1_000_000i64, world)),
        strided
            .as_ref()
            .map(|t| g.device_team(t).map(|d| (2_000_000, d)))
            .transpose()?,
        Some((3_000_000, last)),
    ];
    // Every PE runs every phase (non-members of the strided team skip its kernel).
    for (phase, check) in phases.into_iter().enumerate() {
        pe.local_fill(&slots, -1)?;
        pe.local_fill(&out, -1)?;
        pe.barrier_all()?;
        if let Some((tag, dt)) = check {
            many_launch(
                &g,
                &s,
                &k_team,
                &[
                    g.arg(&slots)?,
                    g.arg(&out)?,
                    KernelArg::I32(rounds as i32),
                    KernelArg::I64(tag),
                    KernelArg::Team(dt),
                ],
            )?;
        }
        pe.barrier_all()?;
        if let Some((tag, dt)) = check {
            let size = dt.size as usize;
            let got = pe.local_vec(&out)?;
            for r in 0..rounds {
                for i in 0..size {
                    let member = (dt.start + i as i32 * dt.stride) as i64;
                    assert_eq!(
                        got[r * size + i],
                        tag + r as i64 * 1000 + member,
                        "PE {me}, phase {phase}, round {r}, member {member}"
                    );
                }
            }
            assert!(
                got[rounds * size..].iter().all(|&x| x == -1),
                "PE {me}, phase {phase}: wrote past the team"
            );
        }
    }

    // 3. Stream barrier (the slot after the last team slot): each PE's stream put to the next
    // PE is complete before the next PE passes the barrier.
    let word = pe.alloc::<u64>(1)?;
    let mine = pe.alloc::<u64>(1)?;
    pe.local_fill(&word, u64::MAX)?;
    pe.local_fill(&mine, 5000 + me as u64)?;
    pe.barrier_all()?;
    g.put_on_stream(&s, &word, &mine, (me + 1) % n)?;
    s.synchronize()?;
    g.barrier_on_stream(&s)?;
    s.synchronize()?;
    g.check_device_errors()?;
    assert_eq!(
        pe.local_vec(&word)?,
        vec![5000 + prev as u64],
        "PE {me}: stream barrier"
    );
    pe.barrier_all()?;

    // 4. Hand-made teams outside the job, or without this PE: an error, nothing touched,
    // barriers stay in step (a non-member's arrival would have let the world barrier below pass
    // early on the others and left PE 0 waiting for one more).
    if me == 0 {
        let w = g.device_team(pe.world_team())?;
        for bad in [
            cuda::DeviceTeam {
                slot: MANY_TEAMS as i32 + 1,
                ..w
            },
            cuda::DeviceTeam { slot: -1, ..w },
            cuda::DeviceTeam {
                start: n as i32 - 2,
                size: 5,
                ..w
            },
            cuda::DeviceTeam { stride: 0, ..w },
            // Inside the job, but PE 0 is no member.
            cuda::DeviceTeam {
                start: 1,
                size: n as i32 - 1,
                ..w
            },
            cuda::DeviceTeam {
                start: 1,
                size: 1,
                ..w
            },
            cuda::DeviceTeam {
                start: 2,
                stride: 2,
                size: ((n as i32 - 1) / 2).max(1),
                ..w
            },
        ] {
            // SAFETY: t_many_sync(rshmem_team).
            unsafe { g.launch(&k_sync, &s, 1, 128, 0, &[KernelArg::Team(bad)])? };
            s.synchronize()?;
            match g.check_device_errors() {
                Err(Error::Team(_)) => {}
                other => panic!("bad team {bad:?}: expected a team error, got {other:?}"),
            }
        }
    }
    pe.barrier_all()?;
    many_launch(
        &g,
        &s,
        &k_sync,
        &[KernelArg::Team(g.device_team(pe.world_team())?)],
    )?;
    pe.barrier_all()?;
    for t in fill.into_iter().rev() {
        pe.team_destroy(t)?;
    }
    if let Some(t) = strided {
        pe.team_destroy(t)?;
    }
    pe.barrier_all()
}

/// 72 thread PEs (more than the 64 the device state once held; `RSHMEM_TEST_PES` overrides)
/// with 8 team slots on however many GPUs there are (sharing GPU 0 on a one-GPU machine), 2 MiB
/// heaps: device ring put with signal, device barriers on the world, a strided team and the
/// last team slot, the stream barrier, and hand-made bad teams. Every PE's waiting kernel runs
/// at once: 72 one-block kernels, under the GPU's 128 concurrent kernels.
#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_many_pes_ring_and_barriers() {
    let _gpu = harness::gpu_world();
    // Compile once here, not 72 times at once inside the world's start-up deadline.
    for g in cuda::info().expect("CUDA").gpus {
        let arch = format!("sm_{}{}", g.compute_capability.0, g.compute_capability.1);
        for src in [cuda::nvrtc::INTERNAL_KERNELS, MANY_PE_KERNELS] {
            cuda::nvrtc::compile(&cuda::nvrtc::with_header(src), &arch, &[]).expect("NVRTC");
        }
    }
    let cfg = gpu_config(HeapKind::Static)
        .heap_size(2 << 20)
        .max_teams(MANY_TEAMS);
    let n = many_pes_count();
    let r = rshmem::Launch::new()
        .config(cfg)
        .threads()
        .run(n, many_pes)
        .values()
        .expect("world");
    for (pe, x) in r.into_iter().enumerate() {
        if let Err(e) = x {
            panic!("PE {pe} of {n}: {e}");
        }
    }
}
