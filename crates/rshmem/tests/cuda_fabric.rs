//! The CUDA backend across nodes: two "nodes" of one PE each, processes over loopback tcp, both
//! PEs on GPU 0 (`RSHMEM_TEST_FABRIC_GPUS=2`: each on its own GPU). GPU heaps of the other node are staged through
//! registered host memory by each PE's proxy thread; kernels reach the other node through the
//! proxy's request ring. The first test runs everywhere (NVRTC compiles the kernels); the
//! others need a GPU (`--include-ignored`) and libfabric.

#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use harness::GpuMode;
use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::cuda::{self, CudaPe, KernelArg};
use rshmem::launcher::Exit;
use rshmem::*;
use std::time::{Duration, Instant};

/// Kernels of these tests, compiled with the device header.
const KERNELS: &str = r#"
// One put of n words to PE `pe` by thread 0 (scope 0), warp 0 (1) or the whole block (2),
// then quiet.
extern "C" __global__ void f_put(unsigned long long* dst, const unsigned long long* src, unsigned long long n,
                                 int pe, int scope) {
    if (scope == 0) { if (threadIdx.x == 0) rshmem_putmem(dst, src, n * 8, pe); }
    else if (scope == 1) { if (threadIdx.x < 32) rshmem_putmem_warp(dst, src, n * 8, pe); }
    else rshmem_putmem_block(dst, src, n * 8, pe);
    rshmem_quiet();
}
// The first half as a non-blocking put, the second half with a signal add, then quiet.
extern "C" __global__ void f_put_signal(unsigned long long* dst, const unsigned long long* src, unsigned long long n,
                                        unsigned long long* sig, int pe) {
    if (threadIdx.x != 0) return;
    const unsigned long long h = n / 2;
    rshmem_putmem_nbi(dst, src, h * 8, pe);
    rshmem_putmem_signal_nbi(dst + h, src + h, (n - h) * 8, sig, 1, RSHMEM_SIGNAL_ADD, pe);
    rshmem_quiet();
}
// A block-scope put with a signal set.
extern "C" __global__ void f_put_signal_block(unsigned long long* dst, const unsigned long long* src,
                                              unsigned long long n, unsigned long long* sig, unsigned long long v, int pe) {
    rshmem_putmem_signal_block(dst, src, n * 8, sig, v, RSHMEM_SIGNAL_SET, pe);
    rshmem_quiet();
}
// Single elements to PE `pe` from 64 threads at once: u64 words, then u8 bytes after them.
extern "C" __global__ void f_p(unsigned long long* dst, unsigned long long base, int pe) {
    unsigned i = threadIdx.x;
    if (i < 64) {
        rshmem_uint64_p(dst + i, base + i, pe);
        rshmem_uint8_p((unsigned char*)(dst + 64) + i, (unsigned char)(base + 3 * i), pe);
    }
    rshmem_quiet();
}
// Block 0 meets the other node in `rounds` device barriers, each after a `p` to it, while every
// other block of a grid that fills the GPU spins until block 0 is done (bounded): a barrier
// arrival from the other node must land without a kernel at this PE.
extern "C" __global__ void f_wide_barrier(unsigned long long* dst, unsigned long long* seen, unsigned int* done,
                                          int rounds, int pe) {
    if (blockIdx.x == 0) {
        for (int r = 0; r < rounds; r++) {
            if (threadIdx.x == 0) rshmem_uint64_p(dst + r, ((unsigned long long)rshmem_my_pe() << 32) | r, pe);
            rshmem_barrier_all_block();
            if (threadIdx.x == 0) seen[r] = ((volatile unsigned long long*)dst)[r];
        }
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(done, 1u);
        return;
    }
    if (threadIdx.x == 0) {
        const unsigned long long t0 = rshmemi_now();
        while (atomicAdd(done, 0u) == 0u && rshmemi_now() - t0 < 60ull * 1000000000ull) __nanosleep(1000);
    }
    __syncthreads();
}
// A device atomic and a `g` to PE `pe` (on another node: refused, flagged, 0 returned); what
// they returned into out[0..2]; whether rshmem_ptr gave NULL for PE `pe` (out[2]) and `word`
// itself for this PE (out[3]).
extern "C" __global__ void f_remote_amo(unsigned long long* word, unsigned long long* out, int pe) {
    if (threadIdx.x != 0) return;
    out[0] = rshmem_uint64_atomic_fetch_add(word, 5ull, pe);
    out[1] = rshmem_uint64_g(word, pe);
    out[2] = rshmem_ptr(word, pe) == 0;
    out[3] = rshmem_ptr(word, rshmem_my_pe()) == (void*)word;
}
// An LL put-with-signal of the 16 bytes of `src` into PE `pe`'s `area` (by a warp).
extern "C" __global__ void f_remote_ll(void* area, const unsigned long long* src, int pe) {
    if (threadIdx.x < 32) rshmem_putmem_signal_ll_warp(area, src, 16, 1u, pe);
}
// n words of PE `pe`'s src into this PE's dst.
extern "C" __global__ void f_get(unsigned long long* dst, const unsigned long long* src, unsigned long long n, int pe) {
    if (threadIdx.x == 0) rshmem_getmem(dst, src, n * 8, pe);
}
// `iters` blocking 8-byte puts; the mean time of one into out[0] (nanoseconds).
extern "C" __global__ void f_put_latency(unsigned long long* dst, const unsigned long long* src, int pe, int iters,
                                         unsigned long long* out) {
    if (threadIdx.x != 0) return;
    const unsigned long long t0 = rshmemi_now();
    for (int i = 0; i < iters; i++) rshmem_putmem(dst, src, 8, pe);
    out[0] = (rshmemi_now() - t0) / (unsigned long long)iters;
}
"#;

/// Each process its own node (from its rank), both PEs on GPU 0 (or `gpu_devices`), loopback tcp (or the provider
/// `fabric_data::gpu_fabric` names).
fn config() -> Config {
    fabric_data::gpu_config_of(2, Duration::from_secs(30), |rank| rank)
}

fn rand_u64(pe: usize, stream: u64, len: usize) -> Vec<u64> {
    harness::rand_vec::<u64>(pe, stream, len)
}

const POISON: u64 = 0xdead_beef_dead_beef;

#[test]
fn nvrtc_compiles_the_cross_node_kernels() {
    let srcs = [
        ("test kernels", cuda::nvrtc::with_header(KERNELS)),
        (
            "internal kernels",
            cuda::nvrtc::with_header(cuda::nvrtc::INTERNAL_KERNELS),
        ),
    ];
    for (what, src) in srcs {
        if !harness::nvrtc_compiled(what, cuda::nvrtc::compile_uncached(&src, "sm_90", &[])) {
            return;
        }
    }
}

fn other_node(pe: &Pe) -> usize {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    assert_eq!(n, 2);
    let p = pe.placements();
    assert_ne!(p[0].node, p[1].node, "the two PEs are on different nodes");
    1 - me
}

/// Device barriers across nodes from block 0 of a grid whose other blocks occupy every SM.
fn wide_grid_barrier(pe: &Pe) -> Result<()> {
    let other = other_node(pe);
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let k = g.kernel(KERNELS, "f_wide_barrier", &[])?;
    let rounds = 4usize;
    let dst = pe.alloc::<u64>(rounds)?;
    let seen = pe.alloc::<u64>(rounds)?;
    let done = pe.alloc::<u32>(1)?;
    pe.local_fill(&dst, POISON)?;
    pe.local_fill(&seen, POISON)?;
    pe.local_fill(&done, 0)?;
    pe.barrier_all()?;
    let args = [
        g.arg(&dst)?,
        g.arg(&seen)?,
        g.arg(&done)?,
        KernelArg::I32(rounds as i32),
        KernelArg::I32(other as i32),
    ];
    // Two blocks of 1024 threads fill an SM's threads; four per SM leave none free.
    let blocks = 4 * g.sm_count() as u32;
    // SAFETY: matches f_wide_barrier(u64*, u64*, unsigned*, int, int).
    unsafe { g.launch(&k, &s, blocks, 1024, 0, &args)? };
    s.synchronize()?;
    pe.quiet()?;
    let want: Vec<u64> = (0..rounds as u64)
        .map(|r| ((other as u64) << 32) | r)
        .collect();
    assert_eq!(
        pe.local_vec(&seen)?,
        want,
        "what block 0 saw after each barrier"
    );
    assert_eq!(
        pe.local_vec(&dst)?,
        want,
        "the other node's p before each barrier"
    );
    assert_eq!(pe.local_vec(&done)?, vec![1], "block 0 finished");
    pe.barrier_all()?;
    Ok(())
}

/// Host put, get, put-with-signal and atomics, then the stream-ordered forms, across nodes.
fn host_and_stream(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let other = other_node(pe);
    // Several staged requests per transfer, at an odd element offset.
    let len = 200_003;
    let x = pe.alloc::<u64>(len + 8)?;
    let y = pe.alloc::<u64>(len)?;
    let z = pe.alloc::<u64>(len)?;
    let sig = pe.alloc::<u64>(4)?;
    pe.local_fill(&x, POISON)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    let data = rand_u64(me, 1, len);
    pe.put(&x, 3, &data, other)?;
    pe.barrier_all()?;
    let got = pe.local_vec(&x)?;
    assert_eq!(&got[3..3 + len], &rand_u64(other, 1, len)[..], "host put");
    assert!(
        got[..3].iter().chain(&got[3 + len..]).all(|&v| v == POISON),
        "neighbours of the put"
    );
    let mut back = vec![0u64; len];
    pe.get(&x, 3, &mut back, other)?;
    assert_eq!(back, data, "host get of what this PE put");
    pe.barrier_all()?;
    // put_signal: the signal is seen only after the data.
    let blk = rand_u64(me, 2, 70_000);
    pe.put_signal(&x, 0, &blk, Signal::add(&sig, 0, 1), other)?;
    pe.wait_until(&sig, 0, Cmp::Ge, 1)?;
    assert_eq!(
        pe.local_vec(&x)?[..70_000],
        rand_u64(other, 2, 70_000)[..],
        "put_signal data"
    );
    // Atomics on the other node's GPU word, both PEs at once: exact sums.
    let c = pe.alloc::<u64>(2)?;
    pe.local_fill(&c, 0)?;
    pe.barrier_all()?;
    for _ in 0..20 {
        pe.atomic_fetch_add(&c, 0, me as u64 + 1, 0)?;
        pe.atomic_fetch_add(&c, 1, me as u64 + 1, 1)?;
    }
    pe.barrier_all()?;
    assert_eq!(pe.local_vec(&c)?[me], 20 * 3, "every add landed once");
    let old = pe.atomic_compare_swap(&c, 0, 60, 1000 + me as u64, 0)?;
    pe.barrier_all()?;
    assert_eq!(
        pe.g(&c, 0, 0)?,
        1000 + if old == 60 { me as u64 } else { other as u64 }
    );
    pe.quiet()?;

    // Stream-ordered: put, get, put-with-signal, barrier across nodes.
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    pe.local_write(&y, 0, &rand_u64(me, 3, len))?;
    pe.local_fill(&x, POISON)?;
    pe.local_fill(&z, POISON)?;
    pe.barrier_all()?;
    g.put_on_stream(&s, &x.slice(..len)?, &y, other)?;
    g.barrier_on_stream(&s)?;
    g.get_on_stream(&s, &z, &y, other)?;
    s.synchronize()?;
    pe.quiet()?;
    assert_eq!(
        pe.local_vec(&x)?[..len],
        rand_u64(other, 3, len)[..],
        "put_on_stream after barrier_on_stream"
    );
    assert_eq!(pe.local_vec(&z)?, rand_u64(other, 3, len), "get_on_stream");
    pe.barrier_all()?;
    let part = 5000;
    pe.local_write(&y, 0, &rand_u64(me, 4, part))?;
    g.put_signal_on_stream(
        &s,
        &x.slice(8..8 + part)?,
        &y.slice(..part)?,
        Signal::set(&sig, 1, 7),
        other,
    )?;
    g.wait_until_on_stream(&s, &sig, 1, Cmp::Eq, 7)?;
    s.synchronize()?;
    pe.quiet()?;
    assert_eq!(
        pe.local_vec(&x)?[8..8 + part],
        rand_u64(other, 4, part)[..],
        "put_signal_on_stream"
    );
    pe.barrier_all()?;
    // The same requests captured in a graph and replayed: each replay carries the data the
    // source holds then, its signal after it.
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    s.begin_capture()?;
    g.put_signal_on_stream(
        &s,
        &x.slice(..part)?,
        &y.slice(..part)?,
        Signal::add(&sig, 2, 1),
        other,
    )?;
    let graph = s.end_capture()?;
    for k in 0..3u64 {
        pe.local_write(&y, 0, &rand_u64(me, 60 + k, part))?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        pe.wait_until(&sig, 2, Cmp::Ge, k + 1)?;
        assert_eq!(
            pe.local_vec(&x)?[..part],
            rand_u64(other, 60 + k, part)[..],
            "replay {k}"
        );
        s.synchronize()?;
        pe.barrier_all()?;
    }
    pe.quiet()?;
    Ok(())
}

/// Kernels putting to the other node: thread, warp and block scope, put-with-signal, quiet,
/// and a get; the added latency of a device-initiated put over a host one is printed.
fn device_initiated(pe: &Pe) -> Result<()> {
    fabric_data::check_gpu_path(pe);
    let me = pe.my_pe();
    let other = other_node(pe);
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let k_put = g.kernel(KERNELS, "f_put", &[])?;
    let k_sig = g.kernel(KERNELS, "f_put_signal", &[])?;
    let k_sigb = g.kernel(KERNELS, "f_put_signal_block", &[])?;
    let k_get = g.kernel(KERNELS, "f_get", &[])?;
    let k_lat = g.kernel(KERNELS, "f_put_latency", &[])?;
    let k_p = g.kernel(KERNELS, "f_p", &[])?;
    let len = 100_001;
    let src = pe.alloc::<u64>(len)?;
    let dst = pe.alloc::<u64>(len)?;
    let sig = pe.alloc::<u64>(2)?;
    pe.local_fill(&sig, 0)?;
    for scope in 0..3 {
        pe.local_write(&src, 0, &rand_u64(me, 10 + scope as u64, len))?;
        pe.local_fill(&dst, POISON)?;
        pe.barrier_all()?;
        let args = [
            g.arg(&dst)?,
            g.arg(&src)?,
            KernelArg::U64(len as u64),
            KernelArg::I32(other as i32),
            KernelArg::I32(scope),
        ];
        // SAFETY: matches f_put(u64*, const u64*, u64, int, int).
        unsafe { g.launch(&k_put, &s, 1, 128, 0, &args)? };
        s.synchronize()?;
        pe.quiet()?;
        pe.barrier_all()?;
        let want = rand_u64(other, 10 + scope as u64, len);
        assert_eq!(pe.local_vec(&dst)?, want, "device put, scope {scope}");
    }
    // Non-blocking put, put-with-signal, quiet: the target waits for the signal only.
    pe.local_write(&src, 0, &rand_u64(me, 20, len))?;
    pe.local_fill(&dst, POISON)?;
    pe.barrier_all()?;
    let args = [
        g.arg(&dst)?,
        g.arg(&src)?,
        KernelArg::U64(len as u64),
        g.arg(&sig)?,
        KernelArg::I32(other as i32),
    ];
    // SAFETY: matches f_put_signal(u64*, const u64*, u64, u64*, int).
    unsafe { g.launch(&k_sig, &s, 1, 32, 0, &args)? };
    pe.wait_until(&sig, 0, Cmp::Ge, 1)?;
    let got = pe.local_vec(&dst)?;
    let want = rand_u64(other, 20, len);
    assert_eq!(
        got[len / 2..],
        want[len / 2..],
        "put_signal_nbi: the signalled half"
    );
    s.synchronize()?;
    pe.quiet()?;
    pe.barrier_all()?;
    assert_eq!(
        pe.local_vec(&dst)?,
        want,
        "both halves after quiet and a barrier"
    );
    // Block-scope put with a signal set; the target waits on the stream.
    let part = 3001;
    pe.local_write(&src, 0, &rand_u64(me, 21, part))?;
    pe.barrier_all()?;
    let args = [
        g.arg(&dst)?,
        g.arg(&src)?,
        KernelArg::U64(part as u64),
        g.arg(&sig)?,
        KernelArg::U64(99),
        KernelArg::I32(other as i32),
    ];
    // SAFETY: matches f_put_signal_block(u64*, const u64*, u64, u64*, u64, int).
    unsafe { g.launch(&k_sigb, &s, 1, 256, 0, &args)? };
    g.wait_until_on_stream(&s, &sig, 0, Cmp::Eq, 99)?;
    s.synchronize()?;
    pe.quiet()?;
    assert_eq!(
        pe.local_vec(&dst)?[..part],
        rand_u64(other, 21, part)[..],
        "put_signal_block"
    );
    pe.barrier_all()?;
    // Device get of the other PE's source.
    pe.local_fill(&dst, POISON)?;
    let args = [
        g.arg(&dst)?,
        g.arg(&src)?,
        KernelArg::U64(part as u64),
        KernelArg::I32(other as i32),
    ];
    // SAFETY: matches f_get(u64*, const u64*, u64, int).
    unsafe { g.launch(&k_get, &s, 1, 32, 0, &args)? };
    s.synchronize()?;
    pe.quiet()?;
    assert_eq!(
        pe.local_vec(&dst)?[..part],
        rand_u64(other, 21, part)[..],
        "device get"
    );
    pe.barrier_all()?;
    // Device p of u64 and u8 elements from 64 threads.
    pe.local_fill(&dst, POISON)?;
    pe.barrier_all()?;
    let base = 1000 * (me as u64 + 1);
    let args = [
        g.arg(&dst)?,
        KernelArg::U64(base),
        KernelArg::I32(other as i32),
    ];
    // SAFETY: matches f_p(u64*, u64, int).
    unsafe { g.launch(&k_p, &s, 1, 96, 0, &args)? };
    s.synchronize()?;
    pe.quiet()?;
    pe.barrier_all()?;
    let got = pe.local_vec(&dst)?;
    let theirs = 1000 * (other as u64 + 1);
    let words: Vec<u64> = (0..64).map(|i| theirs + i).collect();
    assert_eq!(got[..64], words[..], "device p of u64");
    let bytes: Vec<u8> = got[64..72].iter().flat_map(|w| w.to_le_bytes()).collect();
    let want: Vec<u8> = (0..64u64).map(|i| (theirs + 3 * i) as u8).collect();
    assert_eq!(bytes, want, "device p of u8");
    assert!(got[72..].iter().all(|&v| v == POISON), "past the p range");
    pe.barrier_all()?;
    // A device atomic and `g` to the other node: an error naming it, nothing touched there,
    // and this PE's device operations work after it.
    let k_amo = g.kernel(KERNELS, "f_remote_amo", &[])?;
    let word = pe.alloc::<u64>(1)?;
    let outs = pe.alloc::<u64>(4)?;
    pe.local_write(&word, 0, &[77])?;
    pe.local_fill(&outs, POISON)?;
    pe.barrier_all()?;
    let args = [g.arg(&word)?, g.arg(&outs)?, KernelArg::I32(other as i32)];
    // The kernel's refusal, reported by the next device-error check, naming the other node's PE.
    let refused = |what: &str| match g.check_device_errors() {
        Err(Error::InvalidArgument(m)) => {
            assert!(
                m.contains(&format!("PE {other} on another node")),
                "{what}: {m}"
            )
        }
        r => panic!("{what} to another node: {r:?}"),
    };
    // SAFETY: matches f_remote_amo(u64*, u64*, int).
    unsafe { g.launch(&k_amo, &s, 1, 32, 0, &args)? };
    s.synchronize()?;
    refused("a device atomic");
    assert_eq!(
        pe.local_vec(&outs)?,
        [0, 0, 1, 1],
        "what the refused calls returned, rshmem_ptr NULL for the other node only"
    );
    pe.barrier_all()?;
    assert_eq!(
        pe.local_vec(&word)?,
        [77],
        "the other node's word untouched"
    );
    // The LL put-with-signal (stores into the peer's heap) is refused alike.
    let k_ll = g.kernel(KERNELS, "f_remote_ll", &[])?;
    let area = pe.alloc::<u64>(4)?;
    let src = pe.alloc::<u64>(2)?;
    pe.local_fill(&area, POISON)?;
    pe.local_write(&src, 0, &[11, 12])?;
    pe.barrier_all()?;
    let args = [g.arg(&area)?, g.arg(&src)?, KernelArg::I32(other as i32)];
    // SAFETY: matches f_remote_ll(void*, const u64*, int); `area` holds the 2 x 16 bytes of
    // 16 data bytes in lines.
    unsafe { g.launch(&k_ll, &s, 1, 32, 0, &args)? };
    s.synchronize()?;
    refused("an LL put-with-signal");
    pe.barrier_all()?;
    assert!(
        pe.local_vec(&area)?.iter().all(|&v| v == POISON),
        "the other node's LL area untouched"
    );
    pe.barrier_all()?;
    // Latency: 8-byte blocking puts, device-initiated through the proxy and from the host.
    // Printed for the record (BENCHMARKS.md), never a pass/fail condition.
    let out = pe.alloc::<u64>(1)?;
    pe.barrier_all()?;
    if me == 0 {
        let iters = 200;
        let args = [
            g.arg(&dst)?,
            g.arg(&src)?,
            KernelArg::I32(other as i32),
            KernelArg::I32(iters),
            g.arg(&out)?,
        ];
        // SAFETY: matches f_put_latency(u64*, const u64*, int, int, u64*).
        unsafe { g.launch(&k_lat, &s, 1, 32, 0, &args)? };
        s.synchronize()?;
        pe.quiet()?;
        let dev_ns = pe.local_vec(&out)?[0];
        let t0 = Instant::now();
        for i in 0..iters as u64 {
            pe.put(&dst, 0, &[i], other)?;
        }
        let host_ns = t0.elapsed().as_nanos() as u64 / iters as u64;
        // The kernel waits on the GPU for each put; where the target shares the GPU from
        // another process, its copy waits for the GPU's time slice (`rshmem perf --suites
        // fabric-gpu` also times puts from kernels that do not wait on the GPU).
        eprintln!(
            "8-byte put to the other node: device-initiated (kernel waiting) {dev_ns} ns, host \
             {host_ns} ns, difference {} ns",
            dev_ns as i64 - host_ns as i64
        );
    }
    pe.barrier_all()?;
    Ok(())
}

/// A host all-reduce and a MoE dispatch/combine over the CUDA heaps of both nodes.
fn collective_and_moe(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let _ = other_node(pe);
    let coll = Coll::new(pe, CollConfig::default())?;
    let len = 4099;
    let x = pe.alloc::<u64>(len)?;
    let y = pe.alloc::<u64>(len)?;
    pe.local_write(&x, 0, &rand_u64(me, 50, len))?;
    pe.local_fill(&y, POISON)?;
    coll.all_reduce(pe.world_team(), &y, &x, len, ReduceOp::Sum)?;
    let mut want = vec![0u64; len];
    for s in 0..n {
        for (w, v) in want.iter_mut().zip(rand_u64(s, 50, len)) {
            *w = w.wrapping_add(v);
        }
    }
    assert_eq!(pe.local_vec(&y)?, want, "all_reduce across nodes");
    // GpuColl across nodes: tests/cuda_fabric_coll.rs.
    fabric_data::moe_identity(pe, 9, 16)?;
    pe.barrier_all()?;
    Ok(())
}

/// Runs `body` on two nodes of one process-PE each (skipped where the fabric is not there).
fn two_nodes(test: &str, body: fn(&Pe) -> Result<()>) {
    if fabric_data::skip() {
        return;
    }
    harness::gpu_run(test, GpuMode::Processes, 2, config(), body);
}

#[test]
#[ignore = "needs a GPU"]
fn host_and_stream_operations_across_two_nodes() {
    two_nodes(
        "host_and_stream_operations_across_two_nodes",
        host_and_stream,
    );
}

/// Large transfers between the GPU heaps of two nodes: 24 MiB each way, many staged requests
/// through the page-locked staging area, exact data and untouched neighbours; the non-blocking
/// forms too.
fn large_transfers(pe: &Pe) -> Result<()> {
    fabric_data::check_gpu_path(pe);
    let me = pe.my_pe();
    let other = other_node(pe);
    let len = (3 << 20) + 5;
    let x = pe.alloc::<u64>(len + 2)?;
    pe.local_fill(&x, POISON)?;
    pe.barrier_all()?;
    let data = rand_u64(me, 7, len);
    pe.put(&x, 1, &data, other)?;
    pe.barrier_all()?;
    let got = pe.local_vec(&x)?;
    assert_eq!((got[0], got[len + 1]), (POISON, POISON), "neighbours");
    assert!(got[1..=len] == rand_u64(other, 7, len)[..], "put of 24 MiB");
    let mut back = vec![0u64; len];
    pe.get(&x, 1, &mut back, other)?;
    assert!(back == data, "get of 24 MiB");
    pe.barrier_all()?;
    let again = rand_u64(me, 8, len);
    let h = pe.put_nbi(&x, 1, &again, other, 1)?;
    pe.quiet()?;
    assert!(h.is_done());
    drop(h);
    pe.barrier_all()?;
    let mut back = vec![0u64; len];
    pe.get_nbi(&x, 1, &mut back, other, 2)?.wait()?;
    assert!(back == again, "get_nbi of 24 MiB");
    pe.barrier_all()?;
    pe.free(x)?;
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn large_puts_and_gets_across_two_nodes_on_gpu_heaps() {
    two_nodes(
        "large_puts_and_gets_across_two_nodes_on_gpu_heaps",
        large_transfers,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn device_initiated_puts_through_the_proxy_across_two_nodes() {
    two_nodes(
        "device_initiated_puts_through_the_proxy_across_two_nodes",
        device_initiated,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn device_barriers_across_nodes_from_a_grid_that_fills_the_gpu() {
    two_nodes(
        "device_barriers_across_nodes_from_a_grid_that_fills_the_gpu",
        wide_grid_barrier,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn all_reduce_and_moe_across_two_nodes_on_gpu_heaps() {
    two_nodes(
        "all_reduce_and_moe_across_two_nodes_on_gpu_heaps",
        collective_and_moe,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn a_killed_node_is_peer_lost_for_host_and_device_operations() {
    if fabric_data::skip() {
        return;
    }
    let test = "a_killed_node_is_peer_lost_for_host_and_device_operations";
    if !harness::is_child() {
        let env = [(harness::CHILD_VAR, "kill")];
        let out = harness::spawn_self_ignored(test, 2, 1, &env, Duration::from_secs(20));
        assert_eq!(out.exits[1], Exit::Signal(9), "the killed node");
        assert_eq!(
            out.exits[0],
            Exit::Code(0),
            "the survivor did not see the loss in time"
        );
        return;
    }
    let pe = Launch::new().config(config()).init().expect("init");
    let g = CudaPe::new(&pe).expect("cuda pe");
    let k = g.kernel(KERNELS, "f_put", &[]).expect("kernel");
    let x = pe.alloc::<u64>(1 << 16).expect("alloc");
    pe.barrier_all().expect("first barrier");
    if pe.my_pe() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain syscall on this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::process::abort();
    }
    // The loss is noticed within the monitor's probe (3 s at most), not the timeout (30 s).
    let t0 = Instant::now();
    loop {
        match pe.quiet() {
            Err(Error::PeerLost { pe: 1, .. }) => break,
            Ok(()) if t0.elapsed() < Duration::from_secs(15) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => panic!("quiet while PE 1 dies: {other:?} after {:?}", t0.elapsed()),
        }
    }
    eprintln!("PE 1 lost after {:?}", t0.elapsed());
    // A host put to the dead node: PeerLost naming it at once.
    let r = pe.put(&x, 0, &[1u64; 1 << 16], 1);
    assert!(
        matches!(r, Err(Error::PeerLost { pe: 1, .. })),
        "host put: {r:?}"
    );
    // A kernel's put to it: the proxy fails it, the kernel stops waiting, quiet says PeerLost.
    let s = g.stream().expect("stream");
    let args = [
        g.arg(&x).expect("arg"),
        g.arg(&x).expect("arg"),
        KernelArg::U64(64),
        KernelArg::I32(1),
        KernelArg::I32(0),
    ];
    // SAFETY: matches f_put(u64*, const u64*, u64, int, int).
    unsafe { g.launch(&k, &s, 1, 32, 0, &args).expect("launch") };
    s.synchronize().expect("the kernel ends");
    let r = pe.quiet();
    assert!(
        matches!(r, Err(Error::PeerLost { pe: 1, .. })),
        "quiet after a device put: {r:?}"
    );
    let r = pe.barrier_all();
    assert!(
        matches!(r, Err(Error::PeerLost { pe: 1, .. })),
        "barrier: {r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}
