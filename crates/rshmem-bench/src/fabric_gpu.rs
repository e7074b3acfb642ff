//! The proxy path's cost: 8-byte puts to a PE on another node issued by a kernel (posted into
//! the device's request ring, carried over the fabric by the PE's proxy thread, staged through
//! host memory into the target's GPU) beside the same puts issued from the host.
//!
//! Two figures, each beside the host's:
//! * `put_latency` / `device`: a kernel's blocking puts back to back, timed by the GPU clock. The
//!   kernel waits on the GPU for each completion; where the target PE shares the GPU from
//!   another process, its copy runs only when the GPU's time slice passes to its context, which
//!   this figure then includes.
//! * `put_pingpong` / `device`: a ping-pong whose ping is a kernel's put-with-signal that
//!   returns at once (the kernel ends, nothing waits on the GPU) and whose pong is a host
//!   put-with-signal; beside the ping-pong of host puts. Half the host round trip is the host's
//!   one-way time; the device round trip minus the host's is what a kernel-issued put adds
//!   (the kernel's launch included).

use crate::p2p::BenchRecord;
use rshmem::cuda::{CudaPe, KernelArg};
use rshmem::{Cmp, Error, Pe, Result, Signal};
use std::time::Instant;

/// The kernels: `iters` blocking 8-byte puts by one thread, their mean time (GPU clock, ns) into
/// `out[0]`; one non-blocking 8-byte put-with-signal (add 1) by one thread.
pub const PROXY_KERNELS: &str = r#"
extern "C" __global__ void rshmem_bench_proxy_put(unsigned long long* dst, const unsigned long long* src, int pe,
                                                  int iters, unsigned long long* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_putmem(dst, src, 8, pe);
    const unsigned long long t0 = rshmemi_now();
    for (int i = 0; i < iters; i++) rshmem_putmem(dst, src, 8, pe);
    out[0] = (rshmemi_now() - t0) / (unsigned long long)iters;
}
extern "C" __global__ void rshmem_bench_proxy_ping(unsigned long long* dst, const unsigned long long* src,
                                                   unsigned long long* sig, int pe) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_putmem_signal_nbi(dst, src, 8, sig, 1, RSHMEM_SIGNAL_ADD, pe);
}
"#;

/// Runs the figures (collective over every PE of a CUDA world whose PEs 0 and 1 are on
/// different nodes; PEs 0 and 1 take part, the others only synchronise). Returns PE 0's
/// records: for each figure the host's, then the device's with the host's as its baseline.
pub fn bench(pe: &Pe, iters: usize) -> Result<Vec<BenchRecord>> {
    if pe.n_pes() < 2 || pe.placement(0)?.node == pe.placement(1)?.node {
        return Err(Error::InvalidArgument(
            "the fabric-gpu suite needs PE 0 and PE 1 on different nodes".into(),
        ));
    }
    let me = pe.my_pe();
    let g = CudaPe::new(pe)?;
    let k_put = g.kernel(PROXY_KERNELS, "rshmem_bench_proxy_put", &[])?;
    let k_ping = g.kernel(PROXY_KERNELS, "rshmem_bench_proxy_ping", &[])?;
    let s = g.stream()?;
    let buf = pe.alloc::<u64>(2)?;
    let out = pe.alloc::<u64>(1)?;
    let flag = pe.alloc::<u64>(2)?;
    let iters = iters.max(1);
    pe.barrier_all()?;
    // Blocking puts: host, then a kernel's.
    let mut blocking = None;
    if me == 0 {
        pe.put(&buf, 0, &[0], 1)?;
        let t0 = Instant::now();
        for i in 0..iters as u64 {
            pe.put(&buf, 0, &[i], 1)?;
        }
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let args = [
            g.arg(&buf)?,
            g.arg(&buf)?,
            KernelArg::I32(1),
            KernelArg::I32(iters as i32),
            g.arg(&out)?,
        ];
        // SAFETY: matches rshmem_bench_proxy_put(u64*, const u64*, int, int, u64*).
        unsafe { g.launch(&k_put, &s, 1, 32, 0, &args)? };
        s.synchronize()?;
        pe.quiet()?;
        blocking = Some((host_us, pe.local_vec(&out)?[0] as f64 / 1e3));
    }
    pe.barrier_all()?;
    // Ping-pongs: PE 0 pings (host put-with-signal, or a kernel's), PE 1 pongs from the host.
    let mut rtt = [0.0f64; 2];
    for (v, t) in rtt.iter_mut().enumerate() {
        pe.local_fill(&flag, 0)?;
        pe.barrier_all()?;
        let t0 = Instant::now();
        for i in 1..=iters as u64 {
            match me {
                0 => {
                    if v == 0 {
                        pe.put_signal(&buf, 0, &[i], Signal::add(&flag, 0, 1), 1)?;
                    } else {
                        let args = [g.arg(&buf)?, g.arg(&buf)?, g.arg(&flag)?, KernelArg::I32(1)];
                        // SAFETY: matches rshmem_bench_proxy_ping(u64*, const u64*, u64*, int).
                        unsafe { g.launch(&k_ping, &s, 1, 32, 0, &args)? };
                    }
                    pe.wait_until(&flag, 1, Cmp::Ge, i)?;
                }
                1 => {
                    pe.wait_until(&flag, 0, Cmp::Ge, i)?;
                    pe.put_signal(&buf, 0, &[i], Signal::add(&flag, 1, 1), 0)?;
                }
                _ => {}
            }
        }
        *t = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        s.synchronize()?;
        pe.quiet()?;
        pe.barrier_all()?;
    }
    pe.free(flag)?;
    pe.free(out)?;
    pe.free(buf)?;
    let Some((host_us, dev_us)) = blocking else {
        return Ok(Vec::new());
    };
    let rec = |op, api, time_us, baseline, baseline_time_us: f64| BenchRecord {
        op,
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
        rec("put_latency", "host", host_us, "", 0.0),
        rec("put_latency", "device", dev_us, "host put", host_us),
        rec("put_pingpong", "host", rtt[0], "", 0.0),
        rec("put_pingpong", "device", rtt[1], "host ping-pong", rtt[0]),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvrtc_compiles_the_proxy_kernels() {
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
