//! The proxy path's cost: the latency of an 8-byte put to a PE on another node issued by a
//! kernel (posted into the device's request ring, carried over the fabric by the PE's proxy
//! thread, staged through host memory, complete at the target's GPU before the next) beside the
//! same put issued from the host (a staged request, complete at the target's GPU when it
//! returns). The difference is what the ring and the proxy add.

use crate::p2p::BenchRecord;
use rshmem::cuda::{CudaPe, KernelArg};
use rshmem::{Error, Pe, Result};
use std::time::Instant;

/// The kernel: `iters` blocking 8-byte puts by one thread, their mean time (GPU clock, ns)
/// into `out[0]`.
pub const PROXY_KERNELS: &str = r#"
extern "C" __global__ void rshmem_bench_proxy_put(unsigned long long* dst, const unsigned long long* src, int pe,
                                                  int iters, unsigned long long* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_putmem(dst, src, 8, pe);
    const unsigned long long t0 = rshmemi_now();
    for (int i = 0; i < iters; i++) rshmem_putmem(dst, src, 8, pe);
    out[0] = (rshmemi_now() - t0) / (unsigned long long)iters;
}
"#;

/// Runs the figure (collective over every PE of a CUDA world whose PEs 0 and 1 are on
/// different nodes; PE 0 measures, PE 1 serves). Returns PE 0's records: the host put's
/// latency, and the device put's with the host's as its baseline.
pub fn bench(pe: &Pe, iters: usize) -> Result<Vec<BenchRecord>> {
    if pe.n_pes() < 2 || pe.placement(0)?.node == pe.placement(1)?.node {
        return Err(Error::InvalidArgument(
            "the fabric-gpu suite needs PE 0 and PE 1 on different nodes".into(),
        ));
    }
    let g = CudaPe::new(pe)?;
    let k = g.kernel(PROXY_KERNELS, "rshmem_bench_proxy_put", &[])?;
    let buf = pe.alloc::<u64>(2)?;
    let out = pe.alloc::<u64>(1)?;
    let iters = iters.max(1);
    pe.barrier_all()?;
    let mut times = None;
    if pe.my_pe() == 0 {
        pe.put(&buf, 0, &[0], 1)?;
        let t0 = Instant::now();
        for i in 0..iters as u64 {
            pe.put(&buf, 0, &[i], 1)?;
        }
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let s = g.stream()?;
        let args = [
            g.arg(&buf)?,
            g.arg(&buf)?,
            KernelArg::I32(1),
            KernelArg::I32(iters as i32),
            g.arg(&out)?,
        ];
        // SAFETY: matches rshmem_bench_proxy_put(u64*, const u64*, int, int, u64*).
        unsafe { g.launch(&k, &s, 1, 32, 0, &args)? };
        s.synchronize()?;
        pe.quiet()?;
        let dev_us = pe.local_vec(&out)?[0] as f64 / 1e3;
        times = Some((host_us, dev_us));
    }
    pe.barrier_all()?;
    pe.free(out)?;
    pe.free(buf)?;
    let Some((host_us, dev_us)) = times else {
        return Ok(Vec::new());
    };
    let rec = |api, time_us, baseline, baseline_time_us: f64| BenchRecord {
        op: "put_latency",
        api,
        backend: "fabric-cuda",
        mode: pe.mode().name(),
        pes: pe.n_pes(),
        bytes: 8,
        iters,
        time_us,
        gbps: 0.0,
        baseline,
        baseline_time_us,
        ratio: if baseline_time_us > 0.0 {
            baseline_time_us / time_us
        } else {
            0.0
        },
    };
    Ok(vec![
        rec("host", host_us, "", 0.0),
        rec("device", dev_us, "host put", host_us),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_proxy_kernel() {
        use rshmem::cuda::nvrtc;
        let src = nvrtc::with_header(super::PROXY_KERNELS);
        match nvrtc::compile_uncached(&src, "sm_90", &[]) {
            Ok(cubin) => assert!(cubin.len() > 100, "empty cubin"),
            Err(e)
                if format!("{e}").contains("was not found") && std::env::var_os("CI").is_none() =>
            {
                eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
