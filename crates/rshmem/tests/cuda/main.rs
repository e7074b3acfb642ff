//! CUDA backend tests. The first ones run everywhere (CI): NVRTC compiles every kernel and the
//! header for sm_90, and a machine without a driver gets a clean error. The others need GPUs
//! (`--include-ignored` on the GPU machine): thread mode, static and VMM heaps; the host API,
//! stream ops, device API and graph replay also as launched processes and in mixed mode
//! (`harness::gpu_run`: the launcher and TCP bootstrap, all PEs may share one GPU).

#[path = "../harness/mod.rs"]
mod harness;

mod device;
mod many;
use device::*;
use many::MANY_PE_KERNELS;

use rshmem::cuda::{self, CudaPe, KernelArg};
use rshmem::{BackendKind, Cmp, Config, Elem, Error, HeapKind, Pe, Result, Signal, SignalOp};
use std::time::Duration;

/// Kernels the GPU tests launch, compiled with the device header; the CI test compiles them too.
const TEST_KERNELS: &str = r#"
// Every scope and form of put/get for one type. scope 0 thread, 1 warp, 2 block, 3 p/g.
#define TEST_COPY(NAME, T)                                                                      \
extern "C" __global__ void t_copy_##NAME(T* dst, const T* src, unsigned long long n, int pe,    \
                                         int scope, int get, int nbi) {                         \
    unsigned long long parts, part;                                                             \
    unsigned tid = threadIdx.x;                                                                 \
    if (scope == 3) {                                                                           \
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + tid; i < n;   \
             i += (unsigned long long)gridDim.x * blockDim.x) {                                 \
            if (get) dst[i] = rshmem_##NAME##_g(src + i, pe);                                   \
            else rshmem_##NAME##_p(dst + i, src[i], pe);                                        \
        }                                                                                       \
        return;                                                                                 \
    }                                                                                           \
    if (scope == 0) { parts = (unsigned long long)gridDim.x * blockDim.x;                       \
                      part = blockIdx.x * (unsigned long long)blockDim.x + tid; }               \
    else if (scope == 1) { unsigned wpb = (blockDim.x + 31) / 32; parts = gridDim.x * wpb;      \
                           part = blockIdx.x * wpb + tid / 32; }                                \
    else { parts = gridDim.x; part = blockIdx.x; }                                              \
    unsigned long long per = (n + parts - 1) / parts, lo = part * per;                          \
    unsigned long long len = lo < n ? (n - lo < per ? n - lo : per) : 0;                        \
    if (lo > n) lo = n;                                                                         \
    if (scope == 0) {                                                                           \
        if (len == 0) return;                                                                   \
        if (get) { if (nbi) rshmem_##NAME##_get_nbi(dst + lo, src + lo, len, pe);               \
                   else rshmem_##NAME##_get(dst + lo, src + lo, len, pe); }                     \
        else { if (nbi) rshmem_##NAME##_put_nbi(dst + lo, src + lo, len, pe);                   \
               else rshmem_##NAME##_put(dst + lo, src + lo, len, pe); }                         \
    } else if (scope == 1) {                                                                    \
        if (get) { if (nbi) rshmem_##NAME##_get_nbi_warp(dst + lo, src + lo, len, pe);          \
                   else rshmem_##NAME##_get_warp(dst + lo, src + lo, len, pe); }                \
        else { if (nbi) rshmem_##NAME##_put_nbi_warp(dst + lo, src + lo, len, pe);              \
               else rshmem_##NAME##_put_warp(dst + lo, src + lo, len, pe); }                    \
    } else {                                                                                    \
        if (get) { if (nbi) rshmem_##NAME##_get_nbi_block(dst + lo, src + lo, len, pe);         \
                   else rshmem_##NAME##_get_block(dst + lo, src + lo, len, pe); }               \
        else { if (nbi) rshmem_##NAME##_put_nbi_block(dst + lo, src + lo, len, pe);             \
               else rshmem_##NAME##_put_block(dst + lo, src + lo, len, pe); }                   \
    }                                                                                           \
    rshmem_quiet();                                                                             \
}
RSHMEM_FOR_EACH_TYPE(TEST_COPY)

// Atomic sequence on PE `pe`'s x[0] by one thread; old values into out[0..9].
#define TEST_AMO(NAME, T, U)                                                                    \
extern "C" __global__ void t_amo_seq_##NAME(T* x, T* out, int pe) {                             \
    if (threadIdx.x | blockIdx.x) return;                                                       \
    rshmem_##NAME##_atomic_set(x, (T)5, pe);                                                    \
    out[0] = rshmem_##NAME##_atomic_fetch_add(x, (T)3, pe);                                     \
    out[1] = rshmem_##NAME##_atomic_swap(x, (T)10, pe);                                         \
    out[2] = rshmem_##NAME##_atomic_compare_swap(x, (T)10, (T)20, pe);                          \
    out[3] = rshmem_##NAME##_atomic_compare_swap(x, (T)1, (T)30, pe);                           \
    out[4] = rshmem_##NAME##_atomic_fetch_and(x, (T)12, pe);                                    \
    out[5] = rshmem_##NAME##_atomic_fetch_or(x, (T)3, pe);                                      \
    out[6] = rshmem_##NAME##_atomic_fetch_xor(x, (T)5, pe);                                     \
    rshmem_##NAME##_atomic_add(x, (T)-1, pe);                                                   \
    out[7] = rshmem_##NAME##_atomic_fetch(x, pe);                                               \
}                                                                                               \
extern "C" __global__ void t_amo_contend_##NAME(T* x, int pe, int iters) {                      \
    for (int i = 0; i < iters; i++) rshmem_##NAME##_atomic_add(x, (T)1, pe);                    \
}
RSHMEM_FOR_EACH_AMO_TYPE(TEST_AMO)

// PE 0 puts `n` u32 with a signal (block scope) to PE 1; PE 1 waits for it and copies what it
// sees into `out` right after the wait (checks data-before-signal ordering).
extern "C" __global__ void t_signal(unsigned* dst, const unsigned* src, unsigned long long n,
                                   unsigned long long* sig, unsigned* out, int rounds) {
    int me = rshmem_my_pe();
    for (int r = 1; r <= rounds; r++) {
        if (me == 0) {
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = src[i] + r;
            __syncthreads();
            rshmem_uint32_put_signal_block(dst, out, n, sig, 1, RSHMEM_SIGNAL_ADD, 1);
            if (threadIdx.x == 0) rshmem_signal_wait_until(sig + 1, RSHMEM_CMP_GE, (unsigned long long)r);
            __syncthreads();
        } else if (me == 1) {
            if (threadIdx.x == 0) rshmem_signal_wait_until(sig, RSHMEM_CMP_GE, (unsigned long long)r);
            __syncthreads();
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x)
                out[(r - 1) * n + i] = ((volatile unsigned*)dst)[i];
            __syncthreads();
            if (threadIdx.x == 0) rshmem_signal_op(sig + 1, (unsigned long long)r, RSHMEM_SIGNAL_SET, 0);
        }
    }
}

// Rounds of: write my value into every PE's slot, barrier, read every slot, barrier.
extern "C" __global__ void t_barrier(long long* slots, long long* out, int rounds, rshmem_team team) {
    int me = rshmem_my_pe();
    for (int r = 0; r < rounds; r++) {
        for (int i = threadIdx.x; i < team.size; i += blockDim.x)
            rshmem_int64_p(slots + me, (long long)r * 1000 + me, team.start + i * team.stride);
        rshmem_team_barrier_block(team);
        for (int i = threadIdx.x; i < team.size; i += blockDim.x) {
            int pe = team.start + i * team.stride;
            out[r * team.size + i] = ((volatile long long*)slots)[pe];
        }
        rshmem_team_sync_block(team);
    }
}

// Flags device errors for the host to take: `which` bit 0, a barrier of `team` that a peer never
// joins (a timeout naming it); bit 1, a barrier of the hand-made `bad` team (a team error,
// nothing touched); bit 2, a wait for `sig` that nobody sets (a timeout naming no PE).
extern "C" __global__ void t_flag_errors(rshmem_team team, rshmem_team bad,
                                        unsigned long long* sig, int which) {
    if (which & 1) rshmem_team_sync_block(team);
    if (which & 2) rshmem_team_sync_block(bad);
    if ((which & 4) && threadIdx.x == 0) rshmem_signal_wait_until(sig, RSHMEM_CMP_GT, 0);
}

// A kernel that uses every 16-bit conversion helper (compile check).
extern "C" __global__ void t_conv(rshmem_half* h, rshmem_bfloat16* b, float* f) {
    f[0] = rshmem_half_to_float(h[0]) + rshmem_bfloat16_to_float(b[0]);
    h[1] = rshmem_float_to_half(f[1]);
    b[1] = rshmem_float_to_bfloat16(f[1]);
}
"#;

// ---------- CI tests (no GPU needed) ----------

/// The backend's kernels and the device header; the collectives' modules are compiled by
/// `cuda_coll`'s `coll_kernels_compile_and_export_every_name` (once per CI run: they are the
/// slowest to compile).
#[test]
fn nvrtc_compiles_every_kernel() {
    let srcs = [
        (
            "internal kernels",
            cuda::nvrtc::with_header(cuda::nvrtc::INTERNAL_KERNELS),
        ),
        ("test kernels", cuda::nvrtc::with_header(TEST_KERNELS)),
        ("many-PE kernels", cuda::nvrtc::with_header(MANY_PE_KERNELS)),
        ("header alone", cuda::nvrtc::with_header("")),
    ];
    for (what, src) in srcs {
        if !harness::nvrtc_compiled(what, cuda::nvrtc::compile_uncached(&src, "sm_90", &[])) {
            return;
        }
    }
}

/// `nvrtc::compile_all`: every program's cubin in order (the same program twice: one compile,
/// the same cubin), nothing for no programs, and a program that does not compile fails the
/// call with NVRTC's message while the others still compile.
#[test]
fn compile_all_compiles_each_program_once_and_reports_failures() {
    let ci = std::env::var_os("CI").is_some();
    // Sources no earlier run cached (the disk cache is keyed by source).
    let tag: u64 = rand::random();
    let a = format!(
        "extern \"C\" __global__ void t_a(int* p) {{ p[0] = {}; }}\n",
        tag % 1000
    );
    let b = format!("// {tag}\nextern \"C\" __global__ void t_b(int* p) {{ p[0] = 2; }}\n");
    let bad = format!("// {tag}\nextern \"C\" __global__ void t_bad() {{ undeclared(); }}\n");
    let none: &[&str] = &[];
    let ok = cuda::nvrtc::compile_all(&[(&a, none), (&b, none), (&a, none)], "sm_90");
    let cubins = match ok {
        Ok(c) => c,
        Err(e) if !ci && format!("{e}").contains("was not found") => {
            eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(cubins.len(), 3);
    let has = |c: &[u8], n: &str| c.split(|&x| x == 0).any(|s| s == n.as_bytes());
    assert!(has(&cubins[0], "t_a") && !has(&cubins[0], "t_b"));
    assert!(has(&cubins[1], "t_b") && !has(&cubins[1], "t_a"));
    assert!(std::sync::Arc::ptr_eq(&cubins[0], &cubins[2]));
    assert!(cuda::nvrtc::compile_all(&[], "sm_90").unwrap().is_empty());
    let e = cuda::nvrtc::compile_all(&[(&b, none), (&bad, none)], "sm_90").unwrap_err();
    assert!(format!("{e}").contains("undeclared"), "{e}");
}

#[test]
fn cuda_pe_of_a_shm_world_is_an_error() {
    let r = rshmem::Launch::new()
        .config(harness::config())
        .threads()
        .run(2, |pe| match CudaPe::new(pe) {
            Err(Error::Backend {
                backend: "cuda", ..
            }) => Ok(()),
            other => Err(format!("expected a cuda backend error, got {other:?}")),
        })
        .values()
        .unwrap();
    for x in r {
        x.unwrap();
    }
}

fn driver_present() -> bool {
    cuda::info().is_ok()
}

#[test]
fn no_driver_gives_a_backend_error() {
    if driver_present() {
        return; // covered on machines without a GPU
    }
    let e = cuda::info().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Backend {
                backend: "cuda",
                ..
            }
        ),
        "{e}"
    );
    let r = rshmem::Launch::new()
        .config(harness::config().backend(BackendKind::Cuda))
        .threads()
        .run(2, |_| ())
        .values();
    match r {
        Err(Error::Backend {
            backend: "cuda", ..
        })
        | Err(Error::Bootstrap { .. }) => {}
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The GPU harness's machinery (launcher, child selection, done markers) on the CPU backend:
/// the ring body of the GPU tests' host part in every mode.
#[test]
fn gpu_harness_runs_every_mode() {
    fn body(pe: &Pe) -> Result<()> {
        host_typed::<f32>(pe, 5)?;
        host_atomics::<u64>(pe)
    }
    harness::gpu_modes("gpu_harness_runs_every_mode", 4, harness::config, body);
}

// ---------- GPU tests ----------

fn gpu_config(heap: HeapKind) -> Config {
    Config::default()
        .heap_size(256 << 20)
        .timeout(Duration::from_secs(30))
        .backend(BackendKind::Cuda)
        .heap_kind(heap)
}

fn on_gpus(heap: HeapKind, n: usize, body: fn(&Pe) -> Result<()>) {
    harness::gpu_threads(n, gpu_config(heap), body);
}

/// This PE, the next and the previous one in the world (the bodies send around the ring, so
/// they run on any number of PEs: same-process and other-process neighbours in mixed mode).
fn ring(pe: &Pe) -> (usize, usize, usize) {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    (me, (me + 1) % n, (me + n - 1) % n)
}

fn poison<T: Elem>() -> T {
    T::from_f64(-77.0)
}

fn host_typed<T: Elem>(pe: &Pe, stream: u64) -> Result<()> {
    let me = pe.my_pe();
    let n = pe.n_pes();
    let len = 1000 + 3;
    let x = pe.alloc::<T>(len)?;
    pe.local_fill(&x, poison())?;
    pe.barrier_all()?;
    let next = (me + 1) % n;
    let data: Vec<T> = harness::rand_vec(me, stream, len);
    pe.put(&x, 0, &data, next)?;
    pe.barrier_all()?;
    let prev = (me + n - 1) % n;
    let want: Vec<T> = harness::rand_vec(prev, stream, len);
    let got = pe.local_vec(&x)?;
    if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
        panic!(
            "PE {me}: put data wrong for {:?} at {i}: got {:?}, want {:?} (mine {:?})",
            T::KIND,
            got[i].to_f64(),
            want[i].to_f64(),
            data[i].to_f64()
        );
    }
    pe.barrier_all()?; // everyone has checked before the p below changes element 5
    let mut back = vec![poison::<T>(); len - 7];
    pe.get(&x, 7, &mut back, next)?;
    assert!(
        back == data[7..],
        "PE {me}: get data wrong for {:?}",
        T::KIND
    );
    pe.p(&x, 5, T::from_f64(42.0), next)?;
    pe.barrier_all()?;
    assert_eq!(pe.g(&x, 5, me)?.to_f64(), 42.0);
    pe.barrier_all()?;
    pe.free(x)
}

fn host_atomics<T: rshmem::AtomicElem>(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let n = pe.n_pes();
    let c = pe.alloc::<T>(2)?;
    pe.local_fill(&c, T::ZERO)?;
    pe.barrier_all()?;
    for _ in 0..100 {
        pe.atomic_inc(&c, 0, 0)?;
    }
    pe.barrier_all()?;
    assert_eq!(pe.atomic_fetch(&c, 0, 0)?.to_f64(), (100 * n) as f64);
    pe.barrier_all()?;
    if me == 0 {
        let f = |v: f64| T::from_f64(v);
        let t = 1;
        pe.atomic_set(&c, 1, f(5.0), t)?;
        assert_eq!(pe.atomic_fetch_add(&c, 1, f(3.0), t)?.to_f64(), 5.0);
        assert_eq!(pe.atomic_swap(&c, 1, f(10.0), t)?.to_f64(), 8.0);
        assert_eq!(
            pe.atomic_compare_swap(&c, 1, f(10.0), f(20.0), t)?.to_f64(),
            10.0
        );
        assert_eq!(
            pe.atomic_compare_swap(&c, 1, f(1.0), f(30.0), t)?.to_f64(),
            20.0
        );
        assert_eq!(pe.atomic_fetch_and(&c, 1, f(12.0), t)?.to_f64(), 20.0);
        assert_eq!(pe.atomic_fetch_or(&c, 1, f(3.0), t)?.to_f64(), 4.0);
        assert_eq!(pe.atomic_fetch_xor(&c, 1, f(5.0), t)?.to_f64(), 7.0);
        assert_eq!(pe.atomic_fetch(&c, 1, t)?.to_f64(), 2.0);
    }
    pe.barrier_all()?;
    pe.free(c)
}

fn host_api(pe: &Pe) -> Result<()> {
    macro_rules! each {
        ($t:ty, $k:ident) => {
            host_typed::<$t>(pe, rshmem::ElemKind::$k as u64)?;
        };
    }
    rshmem::for_each_elem!(each);
    host_atomics::<i32>(pe)?;
    host_atomics::<u32>(pe)?;
    host_atomics::<i64>(pe)?;
    host_atomics::<u64>(pe)?;
    // wait_until on GPU memory, set by a peer later.
    let f = pe.alloc::<u64>(1)?;
    pe.local_fill(&f, 0)?;
    pe.barrier_all()?;
    if pe.my_pe() == 1 {
        std::thread::sleep(Duration::from_millis(50));
        pe.atomic_set(&f, 0, 7u64, 0)?;
    } else if pe.my_pe() == 0 {
        assert_eq!(pe.wait_until(&f, 0, Cmp::Ge, 7u64)?, 7);
    }
    // put_signal through the host API.
    let d = pe.alloc::<u32>(64)?;
    let s = pe.alloc::<u64>(1)?;
    pe.local_fill(&s, 0)?;
    pe.barrier_all()?;
    if pe.my_pe() == 0 {
        let v: Vec<u32> = (0..64).map(|i| i * 3 + 1).collect();
        pe.put_signal(&d, 0, &v, Signal::add(&s, 0, 1), 1)?;
    } else if pe.my_pe() == 1 {
        pe.wait_until(&s, 0, Cmp::Eq, 1u64)?;
        let got = pe.local_vec(&d)?;
        assert!(got.iter().enumerate().all(|(i, &x)| x == i as u32 * 3 + 1));
    }
    pe.barrier_all()?;
    // Bad inputs are errors.
    assert!(matches!(
        pe.put(&d, 0, &[1u32], 9),
        Err(Error::PeOutOfRange { .. })
    ));
    assert!(matches!(
        pe.put(&d, 60, &[1u32; 8], 0),
        Err(Error::OutOfBounds { .. })
    ));
    let g = CudaPe::new(pe)?;
    let st = g.stream()?;
    assert!(matches!(
        g.put_on_stream(&st, &d.slice(60..)?, &d.slice(..8)?, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        g.get_on_stream(&st, &d.slice(..8)?, &d.slice(60..)?, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        g.put_on_stream(&st, &d, &d.slice(..8)?, 5),
        Err(Error::PeOutOfRange { .. })
    ));
    assert!(matches!(
        g.wait_until_on_stream(&st, &s, 1, Cmp::Eq, 0),
        Err(Error::OutOfBounds { .. })
    ));
    pe.barrier_all()?;
    pe.free(s)?;
    pe.free(d)?;
    pe.free(f)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_host_api_static() {
    on_gpus(HeapKind::Static, 2, host_api);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_host_api_vmm() {
    on_gpus(HeapKind::Vmm, 2, host_api);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_info() {
    let i = cuda::info().unwrap();
    eprintln!("{i:#?}");
    assert!(!i.gpus.is_empty());
    assert_eq!(i.peer_access.len(), i.gpus.len());
}

fn stream_ops(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let (me, next, prev) = ring(pe);
    let len = 4099;
    let src = pe.alloc::<f32>(len)?;
    let dst = pe.alloc::<f32>(len)?;
    let back = pe.alloc::<f32>(len)?;
    let sig = pe.alloc::<u64>(2)?;
    let data: Vec<f32> = harness::rand_vec(me, 11, len);
    pe.local_write(&src, 0, &data)?;
    pe.local_fill(&dst, -1.0)?;
    pe.local_fill(&back, -1.0)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    g.put_signal_on_stream(&s, &dst, &src, Signal::set(&sig, 0, 1), next)?;
    g.wait_until_on_stream(&s, &sig, 0, Cmp::Eq, 1)?;
    g.get_on_stream(&s, &back, &dst, next)?; // my own data back from the next PE
    g.signal_on_stream(&s, &sig, 1, 5, SignalOp::Add, next)?;
    g.wait_until_on_stream(&s, &sig, 1, Cmp::Gt, 4)?; // kernel path
    g.barrier_on_stream(&s)?;
    s.synchronize()?;
    pe.quiet()?;
    let want: Vec<f32> = harness::rand_vec(prev, 11, len);
    assert!(pe.local_vec(&dst)? == want, "PE {me}: stream put wrong");
    assert!(pe.local_vec(&back)? == data, "PE {me}: stream get wrong");
    pe.barrier_all()?;
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_stream_ops_static() {
    on_gpus(HeapKind::Static, 2, stream_ops);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_stream_ops_vmm() {
    on_gpus(HeapKind::Vmm, 2, stream_ops);
}

fn graph_replay(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let (me, next, prev) = ring(pe);
    let len = 1 << 12;
    let src = pe.alloc::<u32>(len)?;
    let dst = pe.alloc::<u32>(len)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    assert!(!s.is_capturing()?);
    s.begin_capture()?;
    assert!(s.is_capturing()?);
    g.barrier_on_stream(&s)?;
    g.put_signal_on_stream(&s, &dst, &src, Signal::set(&sig, 0, 1), next)?;
    g.wait_until_on_stream(&s, &sig, 0, Cmp::Eq, 1)?;
    g.signal_on_stream(&s, &sig, 0, 0, SignalOp::Set, me)?;
    g.barrier_on_stream(&s)?;
    let graph = s.end_capture()?;
    assert!(!s.is_capturing()?);
    for rep in 0..100u64 {
        let data: Vec<u32> = harness::rand_vec(me, 1000 + rep, len);
        pe.local_write(&src, 0, &data)?;
        pe.local_fill(&dst, 0xdead_beef)?;
        pe.barrier_all()?;
        graph.launch(&s)?;
        s.synchronize()?;
        pe.quiet()?;
        let want: Vec<u32> = harness::rand_vec(prev, 1000 + rep, len);
        assert!(pe.local_vec(&dst)? == want, "PE {me}: replay {rep} wrong");
        pe.barrier_all()?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_graph_capture_replay_100() {
    on_gpus(HeapKind::Static, 2, graph_replay);
}

/// Runs `body` on `n` thread-PEs of this test process (bodies that keep handles across worlds,
/// or check one PE's device error state), failing the test on any PE's error.
fn in_this_process(cfg: Config, n: usize, body: impl Fn(&Pe) -> Result<()> + Sync) {
    let _gpu = harness::gpu_world();
    let r = rshmem::Launch::new()
        .config(cfg)
        .threads()
        .run(n, body)
        .values()
        .expect("world");
    harness::expect_all_ok(&format!("{n} PEs"), r);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_device_barrier_timeout_names_the_missing_pe() {
    let cfg = gpu_config(HeapKind::Static).timeout(Duration::from_secs(2));
    in_this_process(cfg, 2, |pe| {
        let g = CudaPe::new(pe)?;
        let s = g.stream()?;
        pe.barrier_all()?;
        if pe.my_pe() == 0 {
            // PE 1 never joins: the stream barrier gives up, naming it.
            g.barrier_on_stream(&s)?;
            s.synchronize()?;
            match pe.quiet() {
                Err(Error::Timeout { pe: Some(1), .. }) => {}
                other => panic!("PE 0: expected a timeout naming PE 1, got {other:?}"),
            }
            pe.quiet()?; // cleared, the name too
        } else {
            // PE 0 reaches the last barrier after its 2 s device timeout; this PE's host
            // barrier would give up 2 s after entering it, so it enters later (a race the
            // test had: it failed once on 2x H200, PE 1 timing out in barrier_all).
            std::thread::sleep(Duration::from_millis(1500));
        }
        pe.barrier_all()
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_device_team_of_an_ended_world_is_refused() {
    let cfg = gpu_config(HeapKind::Static);
    // A team split in a world that then ended...
    let old = {
        let _gpu = harness::gpu_world();
        rshmem::Launch::new()
            .config(cfg.clone())
            .threads()
            .run(1, |pe| pe.team_split_strided(pe.world_team(), 0, 1, 1))
            .values()
            .expect("world")
            .pop()
            .expect("one PE")
            .expect("split")
            .expect("member")
    };
    // ...names a slot whose device counters belong to the next world's teams.
    in_this_process(cfg, 1, |pe| {
        let g = CudaPe::new(pe)?;
        match g.device_team(&old) {
            Err(Error::WorldEnded) => {}
            other => panic!("expected WorldEnded, got {other:?}"),
        }
        // The world's own teams still map.
        let t = g.device_team(pe.world_team())?;
        assert_eq!((t.size, t.my_index), (1, 0));
        Ok(())
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_device_timeout_is_an_error() {
    let cfg = gpu_config(HeapKind::Static).timeout(Duration::from_secs(2));
    in_this_process(cfg, 2, |pe| {
        let g = CudaPe::new(pe)?;
        let s = g.stream()?;
        let sig = pe.alloc::<u64>(1)?;
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        if pe.my_pe() == 0 {
            // Nobody ever sets it: the device wait gives up after the timeout.
            g.wait_until_on_stream(&s, &sig, 0, Cmp::Gt, 0)?;
            s.synchronize()?;
            // A wait on a signal names no PE (anyone may set it).
            assert!(matches!(pe.quiet(), Err(Error::Timeout { pe: None, .. })));
            pe.quiet()?; // cleared
        }
        pe.barrier_all()
    });
}

/// Errors a user kernel flags through the device API are reported exactly once, then cleared
/// with their info word: a barrier timeout naming the PE that never came (checked by four host
/// threads at once: one gets it, three get `Ok`), a hand-made bad team, both at once (one team
/// error, both taken), then an unnamed wait timeout (the earlier name is gone).
#[test]
#[ignore = "needs a GPU"]
fn gpu_device_error_is_taken_once() {
    let cfg = gpu_config(HeapKind::Static).timeout(Duration::from_secs(2));
    in_this_process(cfg, 2, |pe| {
        let g = CudaPe::new(pe)?;
        let k = g.kernel(TEST_KERNELS, "t_flag_errors", &[])?;
        let s = g.stream()?;
        let sig = pe.alloc::<u64>(1)?;
        let done = pe.alloc::<u64>(1)?;
        pe.local_fill(&sig, 0)?;
        pe.local_fill(&done, 0)?;
        pe.barrier_all()?;
        if pe.my_pe() == 1 {
            // Never joins PE 0's device barriers; waits (longer than PE 0's device timeouts)
            // until PE 0 is done.
            pe.wait_until_timeout(&done, 0, Cmp::Eq, 1u64, Duration::from_secs(120))?;
            return pe.barrier_all();
        }
        let world = g.device_team(pe.world_team())?;
        let bad = cuda::DeviceTeam { slot: -1, ..world };
        let flag = |which: i32| -> Result<()> {
            // SAFETY: t_flag_errors(rshmem_team, rshmem_team, unsigned long long*, int).
            unsafe {
                g.launch(
                    &k,
                    &s,
                    1,
                    32,
                    0,
                    &[
                        KernelArg::Team(world),
                        KernelArg::Team(bad),
                        g.arg(&sig)?,
                        KernelArg::I32(which),
                    ],
                )?
            };
            s.synchronize()
        };
        let is_timeout = |e: &Error, named: Option<usize>| matches!(e, Error::Timeout { op: "device-side wait (kernel or stream)", pe, .. } if *pe == named);
        // 1. A barrier timeout, checked by four threads at once.
        flag(1)?;
        let got: Vec<Result<()>> = std::thread::scope(|sc| {
            let t: Vec<_> = (0..4).map(|_| sc.spawn(|| pe.quiet())).collect();
            t.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let errs: Vec<&Error> = got.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(
            errs.len(),
            1,
            "one of four checks reports the error: {got:?}"
        );
        assert!(is_timeout(errs[0], Some(1)), "{:?}", errs[0]);
        pe.quiet()?;
        g.check_device_errors()?;
        // 2. A bad team.
        flag(2)?;
        assert!(matches!(g.check_device_errors(), Err(Error::Team(_))));
        g.check_device_errors()?;
        pe.quiet()?;
        // 3. Both: the team error is reported, and both bits and the name are taken.
        flag(3)?;
        assert!(matches!(pe.quiet(), Err(Error::Team(_))));
        pe.quiet()?;
        // 4. A wait naming no PE: PE 1's name went with the take above.
        flag(4)?;
        match g.check_device_errors() {
            Err(e) if is_timeout(&e, None) => {}
            other => panic!("expected a timeout naming no PE, got {other:?}"),
        }
        g.check_device_errors()?;
        pe.quiet()?;
        pe.atomic_set(&done, 0, 1u64, 1)?;
        pe.barrier_all()
    });
}

// ---------- processes and mixed mode ----------
//
// The bodies above again, as 2 launched processes (TCP bootstrap) and as 2 processes of 2
// thread-PEs each (mixed: same-process and other-process peers in one world), both heaps. The
// thread-mode tests above keep their names: `gpu_host_api_static` matches all three.

gpu_mode_test!(
    gpu_host_api_static,
    gpu_config(HeapKind::Static),
    host_api,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_host_api_vmm,
    gpu_config(HeapKind::Vmm),
    host_api,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_stream_ops_static,
    gpu_config(HeapKind::Static),
    stream_ops,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_stream_ops_vmm,
    gpu_config(HeapKind::Vmm),
    stream_ops,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_device_api_static,
    gpu_config(HeapKind::Static),
    device_api,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_device_api_vmm,
    gpu_config(HeapKind::Vmm),
    device_api,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_graph_capture_replay_100,
    gpu_config(HeapKind::Static),
    graph_replay,
    [processes(2), mixed(4)]
);
gpu_mode_test!(
    gpu_graph_capture_replay_100_vmm,
    gpu_config(HeapKind::Vmm),
    graph_replay,
    [threads(2), processes(2), mixed(4)]
);

// ---------- the calling thread's current context does not matter (seed 000) ----------

fn wrong_context(pe: &Pe) -> Result<()> {
    use cudarc::driver::sys as cu;
    let g = CudaPe::new(pe)?;
    let other = (g.device() + 1) % cuda::info()?.gpus.len();
    let mut dev = 0;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: test-only raw driver calls: the other GPU's primary context is made current on
    // this thread before any rshmem call, as a framework might leave it.
    unsafe {
        assert_eq!(
            cu::cuDeviceGet(&mut dev, other as i32),
            cu::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            cu::CUresult::CUDA_SUCCESS
        );
        assert_eq!(cu::cuCtxSetCurrent(ctx), cu::CUresult::CUDA_SUCCESS);
    }
    host_typed::<f32>(pe, 77)?;
    host_atomics::<u64>(pe)?;
    stream_ops(pe)?;
    let mut now = std::ptr::null_mut();
    // SAFETY: reads the current context.
    unsafe { cu::cuCtxGetCurrent(&mut now) };
    assert_eq!(now, ctx, "rshmem changed the caller's current context");
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_calls_ignore_the_current_context() {
    on_gpus(HeapKind::Static, 2, wrong_context);
}
