//! The device API in kernels: every put/get/atomic/signal scope and element type, static and VMM heaps.

use super::*;

pub(crate) fn device_copy<T: Elem>(pe: &Pe, g: &CudaPe, name: &str) -> Result<()> {
    let (me, next, prev) = ring(pe);
    let len = 1000 + 7;
    let src = pe.alloc::<T>(len)?;
    let dst = pe.alloc::<T>(len)?;
    let s = g.stream()?;
    let k = g.kernel(TEST_KERNELS, &format!("t_copy_{name}"), &[])?;
    for scope in 0..4 {
        for get in 0..2 {
            for nbi in 0..2 {
                let tag = (scope * 4 + get * 2 + nbi) as u64 + 100;
                let data: Vec<T> = harness::rand_vec(me, tag, len);
                pe.local_write(&src, 0, &data)?;
                pe.local_fill(&dst, poison())?;
                pe.barrier_all()?;
                let args = [
                    g.arg(&dst)?,
                    g.arg(&src)?,
                    KernelArg::U64(len as u64),
                    KernelArg::I32(next as i32),
                    KernelArg::I32(scope),
                    KernelArg::I32(get),
                    KernelArg::I32(nbi),
                ];
                // SAFETY: matches t_copy_<T>(T*, const T*, u64, int, int, int, int).
                unsafe { g.launch(&k, &s, 5, 77, 0, &args)? };
                s.synchronize()?;
                pe.barrier_all()?;
                let got = pe.local_vec(&dst)?;
                // put: my dst holds the previous PE's data; get: the next PE's src.
                let want: Vec<T> = harness::rand_vec(if get == 1 { next } else { prev }, tag, len);
                assert!(
                    got == want,
                    "PE {me}: {name} scope {scope} get {get} nbi {nbi} wrong"
                );
                pe.barrier_all()?;
            }
        }
    }
    pe.free(dst)?;
    pe.free(src)
}

pub(crate) fn device_api(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let names = [
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "half",
        "bfloat16", "float", "double",
    ];
    macro_rules! each {
        ($t:ty, $k:ident) => {
            device_copy::<$t>(pe, &g, names[rshmem::ElemKind::$k as usize])?;
        };
    }
    rshmem::for_each_elem!(each);
    let (me, next, prev) = ring(pe);
    let n_pes = pe.n_pes();
    let s = g.stream()?;
    // Atomic sequences (each PE on the next PE's word) and contention from every PE.
    macro_rules! amo {
        ($t:ty, $name:expr) => {{
            let x = pe.alloc::<$t>(1)?;
            let out = pe.alloc::<$t>(8)?;
            pe.local_fill(&x, 0 as $t)?;
            pe.local_fill(&out, 99 as $t)?;
            pe.barrier_all()?;
            let k = g.kernel(TEST_KERNELS, concat!("t_amo_seq_", $name), &[])?;
            // SAFETY: t_amo_seq_<T>(T*, T*, int).
            unsafe {
                g.launch(
                    &k,
                    &s,
                    1,
                    32,
                    0,
                    &[g.arg(&x)?, g.arg(&out)?, KernelArg::I32(next as i32)],
                )?
            };
            s.synchronize()?;
            let o = pe.local_vec(&out)?;
            assert_eq!(
                o,
                vec![5 as $t, 8, 10, 20, 20, 4, 7, 1],
                "PE {me} {}",
                $name
            );
            pe.barrier_all()?;
            pe.local_fill(&x, 0 as $t)?;
            pe.barrier_all()?;
            let k = g.kernel(TEST_KERNELS, concat!("t_amo_contend_", $name), &[])?;
            let grid = (2 * g.sm_count()) as u32;
            // SAFETY: t_amo_contend_<T>(T*, int, int).
            unsafe {
                g.launch(
                    &k,
                    &s,
                    grid,
                    128,
                    0,
                    &[g.arg(&x)?, KernelArg::I32(0), KernelArg::I32(10)],
                )?
            };
            s.synchronize()?;
            pe.barrier_all()?;
            if me == 0 {
                let want = (n_pes as u64 * grid as u64 * 128 * 10) as $t;
                assert_eq!(pe.local_vec(&x)?[0], want, "contention {}", $name);
            }
            pe.barrier_all()?;
            pe.free(out)?;
            pe.free(x)?;
        }};
    }
    amo!(i32, "int32");
    amo!(u32, "uint32");
    amo!(i64, "int64");
    amo!(u64, "uint64");
    // put_with_signal ordering: PE 1 copies what it sees right after each signal.
    let n = 3000usize;
    let rounds = 20;
    let dst = pe.alloc::<u32>(n)?;
    let src = pe.alloc::<u32>(n)?;
    let out = pe.alloc::<u32>(n * rounds)?;
    let sig = pe.alloc::<u64>(2)?;
    let data: Vec<u32> = harness::rand_vec(0, 5, n);
    pe.local_write(&src, 0, &data)?;
    pe.local_fill(&sig, 0)?;
    pe.local_fill(&out, 0)?;
    pe.barrier_all()?;
    let k = g.kernel(TEST_KERNELS, "t_signal", &[])?;
    // SAFETY: t_signal(u32*, const u32*, u64, u64*, u32*, int).
    unsafe {
        g.launch(
            &k,
            &s,
            1,
            256,
            0,
            &[
                g.arg(&dst)?,
                g.arg(&src)?,
                KernelArg::U64(n as u64),
                g.arg(&sig)?,
                g.arg(&out)?,
                KernelArg::I32(rounds as i32),
            ],
        )?
    };
    s.synchronize()?;
    pe.quiet()?;
    pe.barrier_all()?;
    if me == 1 {
        let o = pe.local_vec(&out)?;
        for r in 0..rounds {
            let want: Vec<u32> = data.iter().map(|&x| x.wrapping_add(r as u32 + 1)).collect();
            assert!(
                o[r * n..(r + 1) * n] == want,
                "signal round {r}: data not visible"
            );
        }
    }
    // Device barrier, world team and a strided team.
    let slots = pe.alloc::<i64>(pe.n_pes())?;
    let bout = pe.alloc::<i64>(pe.n_pes() * 16)?;
    pe.local_fill(&slots, -1)?;
    pe.barrier_all()?;
    let k = g.kernel(TEST_KERNELS, "t_barrier", &[])?;
    let wt = g.device_team(pe.world_team())?;
    // SAFETY: t_barrier(i64*, i64*, int, rshmem_team).
    unsafe {
        g.launch(
            &k,
            &s,
            1,
            96,
            0,
            &[
                g.arg(&slots)?,
                g.arg(&bout)?,
                KernelArg::I32(16),
                KernelArg::Team(wt),
            ],
        )?
    };
    s.synchronize()?;
    pe.quiet()?;
    let o = pe.local_vec(&bout)?;
    for r in 0..16 {
        for p in 0..pe.n_pes() {
            assert_eq!(
                o[r * pe.n_pes() + p],
                r as i64 * 1000 + p as i64,
                "barrier round {r}"
            );
        }
    }
    pe.barrier_all()?;
    // All SMs putting into the next PE at once (block scope, 64 MiB, every PE at the same time).
    let big = 8usize << 20;
    let bsrc = pe.alloc::<u64>(big)?;
    let bdst = pe.alloc::<u64>(big)?;
    let data: Vec<u64> = (0..big as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9) ^ me as u64)
        .collect();
    pe.local_write(&bsrc, 0, &data)?;
    pe.local_fill(&bdst, 0)?;
    pe.barrier_all()?;
    let k = g.kernel(TEST_KERNELS, "t_copy_uint64", &[])?;
    let grid = (2 * g.sm_count()) as u32;
    // SAFETY: t_copy_uint64 arguments as above.
    unsafe {
        g.launch(
            &k,
            &s,
            grid,
            512,
            0,
            &[
                g.arg(&bdst)?,
                g.arg(&bsrc)?,
                KernelArg::U64(big as u64),
                KernelArg::I32(next as i32),
                KernelArg::I32(2),
                KernelArg::I32(0),
                KernelArg::I32(1),
            ],
        )?
    };
    s.synchronize()?;
    pe.barrier_all()?;
    let got = pe.local_vec(&bdst)?;
    let from = |p: usize| {
        move |(i, &x): (usize, &u64)| x == (i as u64).wrapping_mul(0x9e37_79b9) ^ p as u64
    };
    assert!(
        got.iter().enumerate().all(from(prev)),
        "PE {me}: all-SM put wrong"
    );
    pe.barrier_all()?;
    // Bad inputs on the device side.
    let t3 = pe.team_split(pe.world_team(), Some(0), -(me as i64))?;
    if let Some(t) = t3 {
        // Members reversed by key: strided with stride -1, which is rejected.
        if t.members().len() >= 2 {
            assert!(matches!(g.device_team(&t), Err(Error::Team(_))));
        }
        pe.team_destroy(t)?;
    }
    assert!(g.kernel("this is not C++", "x", &[]).is_err());
    assert!(g.kernel(TEST_KERNELS, "no_such_kernel", &[]).is_err());
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_device_api_static() {
    on_gpus(HeapKind::Static, 2, device_api);
}

#[test]
#[ignore = "needs a GPU"]
pub(crate) fn gpu_device_api_vmm() {
    on_gpus(HeapKind::Vmm, 2, device_api);
}
