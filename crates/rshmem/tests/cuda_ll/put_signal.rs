//! The device put-with-signal whose flag rides in the data (`rshmem_putmem_signal_ll*`,
//! `rshmem_signal_wait_ll*` of the device header).

use rshmem::cuda::{CudaPe, KernelArg};
use rshmem::{Error, Pe, Result};

/// PE 0 sends `count` messages of `bytes` to PE 1 (`area` there), which copies each into
/// `got` and echoes it into PE 0's `echo` area; PE 0 copies the echo into its `got`. Odd
/// messages go by one thread, even ones by the warp. `ok[0]` = 1 when every wait succeeded.
pub const SRC: &str = r#"
extern "C" __global__ void ll_msg_echo(char* area, char* echo, const char* msgs, char* got, int bytes, int count,
                                       int role, int peer, int* ok) {
    if (threadIdx.x >= 32) return;
    const bool one = threadIdx.x == 0;
    bool fine = true;
    for (int i = 1; i <= count && fine; i++) {
        char* g = got + (long long)(i - 1) * bytes;
        const bool warp = i % 2 == 0;
        if (role == 0) {
            if (warp) rshmem_putmem_signal_ll_warp(area, msgs + (long long)(i - 1) * bytes, bytes, (unsigned)i, peer);
            else if (one) rshmem_putmem_signal_ll(area, msgs + (long long)(i - 1) * bytes, bytes, (unsigned)i, peer);
            fine = rshmem_signal_wait_ll_warp(echo, g, bytes, (unsigned)i);
        } else {
            if (warp) {
                fine = rshmem_signal_wait_ll_warp(area, g, bytes, (unsigned)i);
            } else {
                if (one) fine = rshmem_signal_wait_ll(area, g, bytes, (unsigned)i);
                fine = __shfl_sync(0xffffffffu, fine, 0);
                __syncwarp();
            }
            if (fine) rshmem_putmem_signal_ll_warp(echo, g, bytes, (unsigned)i, peer);
        }
    }
    if (one) *ok = fine ? 1 : 0;
}
"#;

fn msgs(bytes: usize, count: usize, seed: u64) -> Vec<u8> {
    (0..bytes * count)
        .map(|i| ((i as u64 * 2_654_435_761 + seed * 97) >> 7) as u8)
        .collect()
}

/// Messages of 8 bytes to 4 KiB, each checked on both PEs.
pub fn echo(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let k = g.kernel(SRC, "ll_msg_echo", &[])?;
    let count = 9;
    let max = 4096;
    let area = pe.alloc_aligned::<u8>(2 * max, 256)?;
    let echo = pe.alloc_aligned::<u8>(2 * max, 256)?;
    let src = pe.alloc_aligned::<u8>(max * count, 256)?;
    let got = pe.alloc_aligned::<u8>(max * count, 256)?;
    let ok = pe.alloc::<i32>(1)?;
    let me = pe.my_pe();
    for (seed, bytes) in [8usize, 16, 40, 1024, 4088, 4096].into_iter().enumerate() {
        let want = msgs(bytes, count, seed as u64);
        pe.local_fill(&area, 0)?;
        pe.local_fill(&echo, 0)?;
        pe.local_fill(&got, 0xee)?;
        pe.local_fill(&ok, -1)?;
        pe.local_write(&src, 0, &want)?;
        pe.barrier_all()?;
        if me < 2 {
            // SAFETY: matches ll_msg_echo(char*, char*, const char*, char*, int, int, int, int,
            // int*); the areas hold 2 * 4096 bytes (the LL lines of the largest message), src
            // and got `count` messages, all symmetric.
            unsafe {
                g.launch(
                    &k,
                    &s,
                    1,
                    32,
                    0,
                    &[
                        g.arg(&area)?,
                        g.arg(&echo)?,
                        g.arg(&src)?,
                        g.arg(&got)?,
                        KernelArg::I32(bytes as i32),
                        KernelArg::I32(count as i32),
                        KernelArg::I32(me as i32),
                        KernelArg::I32(1 - me as i32),
                        g.arg(&ok)?,
                    ],
                )?;
            }
            s.synchronize()?;
            g.check_device_errors()?;
            assert_eq!(pe.local_vec(&ok)?, [1], "PE {me}, {bytes} bytes");
            let got_v = pe.local_vec(&got.slice(..bytes * count)?)?;
            assert!(got_v == want, "PE {me}, {bytes}-byte messages differ");
        }
        pe.barrier_all()?;
    }
    pe.free(ok)?;
    pe.free(got)?;
    pe.free(src)?;
    pe.free(echo)?;
    pe.free(area)
}

/// A message that never comes: the wait gives up after the device timeout (false), and the host
/// reports it.
pub fn never_sent(pe: &Pe) -> Result<()> {
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let k = g.kernel(SRC, "ll_msg_echo", &[])?;
    let area = pe.alloc_aligned::<u8>(64, 256)?;
    let echo = pe.alloc_aligned::<u8>(64, 256)?;
    let got = pe.alloc_aligned::<u8>(32, 256)?;
    let ok = pe.alloc::<i32>(1)?;
    pe.local_fill(&area, 0)?;
    pe.local_fill(&ok, -1)?;
    pe.barrier_all()?;
    if pe.my_pe() == 1 {
        // SAFETY: as in `echo`; role 1 only waits on its own area (32 bytes of lines) and
        // writes `got` (16 bytes) before it would reply.
        unsafe {
            g.launch(
                &k,
                &s,
                1,
                32,
                0,
                &[
                    g.arg(&area)?,
                    g.arg(&echo)?,
                    g.arg(&got)?,
                    g.arg(&got)?,
                    KernelArg::I32(16),
                    KernelArg::I32(1),
                    KernelArg::I32(1),
                    KernelArg::I32(0),
                    g.arg(&ok)?,
                ],
            )?;
        }
        s.synchronize()?;
        assert_eq!(pe.local_vec(&ok)?, [0]);
        let r = g.check_device_errors();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    } else {
        // Host waits time out as device waits do: meet PE 1 after its wait has given up (the
        // 2 s device timeout), well within its host timeout.
        std::thread::sleep(std::time::Duration::from_millis(2600));
    }
    pe.barrier_all()?;
    pe.free(ok)?;
    pe.free(got)?;
    pe.free(echo)?;
    pe.free(area)
}
