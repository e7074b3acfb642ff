//! Ping-pong between PE 0 and PE 1: 8-byte put_signal one-way latency, 2-PE barrier time and
//! 1 MiB put bandwidth. Runs in any mode:
//!
//! ```text
//! cargo run --release --example pingpong                       # 2 threads
//! rshmem run -n 2 -- target/release/examples/pingpong          # 2 processes
//! ```
use rshmem::{Cmp, Result, Signal};
use std::time::Instant;

fn main() -> Result<()> {
    let out = rshmem::launch(2, |pe| -> Result<()> {
        let (me, other) = (pe.my_pe(), 1 - pe.my_pe().min(1));
        if pe.n_pes() != 2 {
            return Err(rshmem::Error::InvalidArgument(
                "pingpong needs 2 PEs".into(),
            ));
        }
        let data = pe.alloc::<u64>(1)?;
        let sig = pe.alloc::<u64>(1)?;
        let big = pe.alloc::<u8>(1 << 20)?;
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        let iters = 100_000u64;
        let t0 = Instant::now();
        for i in 1..=iters {
            if me == 0 {
                pe.put_signal(&data, 0, &[i], Signal::set(&sig, 0, i), other)?;
                pe.wait_until(&sig, 0, Cmp::Ge, i)?;
            } else {
                pe.wait_until(&sig, 0, Cmp::Ge, i)?;
                pe.put_signal(&data, 0, &[i], Signal::set(&sig, 0, i), other)?;
            }
        }
        let lat = t0.elapsed().as_secs_f64() / iters as f64 / 2.0;
        if pe.g(&data, 0, me)? != iters {
            return Err(rshmem::Error::InvalidArgument("wrong data".into()));
        }
        pe.barrier_all()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            pe.barrier_all()?;
        }
        let bar = t0.elapsed().as_secs_f64() / iters as f64;
        let src = vec![7u8; 1 << 20];
        let reps = 500;
        pe.barrier_all()?;
        let t0 = Instant::now();
        if me == 0 {
            for _ in 0..reps {
                pe.put(&big, 0, &src, other)?;
            }
            pe.quiet()?;
        }
        let bw = (reps << 20) as f64 / t0.elapsed().as_secs_f64() / 1e9;
        pe.barrier_all()?;
        if me == 0 {
            println!(
                "mode {}: put_signal 8 B one-way {:.3} us, barrier {:.3} us, 1 MiB put {:.1} GB/s",
                pe.mode().name(),
                lat * 1e6,
                bar * 1e6,
                bw
            );
        }
        Ok(())
    })
    .values()?;
    out.into_iter().collect()
}
