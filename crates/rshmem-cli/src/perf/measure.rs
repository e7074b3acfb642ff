//! Timing helpers, aligned buffers and the raw baselines every figure is compared with.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long to measure one figure.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    /// Target duration of one sample (a batch of operations timed together).
    pub sample_time: Duration,
    /// Most samples per figure; the median is reported.
    pub samples: usize,
    /// Time one figure may take: fewer samples (at least 11) for slow operations.
    pub budget: Duration,
}

impl Timing {
    /// Samples for a figure whose sample takes `sample_s` seconds.
    pub fn samples_for(&self, sample_s: f64) -> usize {
        let fit = (self.budget.as_secs_f64() / sample_s.max(1e-9)) as usize;
        fit.clamp(self.samples.min(11), self.samples.max(1))
    }
}

/// Median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Operations per sample so that a sample of ops taking `per_op_s` each lasts `sample_time`.
pub fn batch_for(t: &Timing, per_op_s: f64) -> u64 {
    let k = t.sample_time.as_secs_f64() / per_op_s.max(1e-10);
    (k as u64).clamp(1, 1 << 32)
}

/// Warms `f(k)` (which runs `k` operations) up while finding `k`: doubles `k` until a batch
/// takes a quarter of a sample, then runs batches for at least 20 samples' time (at least one
/// batch). Returns the `k` of one sample and the time of one operation in seconds.
pub fn calibrate<E>(t: &Timing, f: &mut impl FnMut(u64) -> Result<(), E>) -> Result<(u64, f64), E> {
    let start = Instant::now();
    let mut k = 1u64;
    loop {
        let s = Instant::now();
        f(k)?;
        let el = s.elapsed();
        if el >= t.sample_time / 4 || k >= 1 << 32 {
            break;
        }
        k *= 2;
    }
    let k = loop {
        let s = Instant::now();
        f(k)?;
        let per = s.elapsed().as_secs_f64() / k as f64;
        if start.elapsed() >= t.sample_time * 20 {
            break (batch_for(t, per), per);
        }
    };
    Ok(k)
}

/// Microseconds per operation of one sample of `k` operations.
pub fn sample<E>(k: u64, f: &mut impl FnMut(u64) -> Result<(), E>) -> Result<f64, E> {
    let s = Instant::now();
    f(k)?;
    Ok(s.elapsed().as_secs_f64() * 1e6 / k as f64)
}

/// Times `f(k)`, which runs `k` operations: calibration (warm-up), then the samples.
/// Returns the median time of one operation in microseconds and the number of operations timed.
pub fn time_per_op<E>(
    t: &Timing,
    mut f: impl FnMut(u64) -> Result<(), E>,
) -> Result<(f64, u64), E> {
    let (k, per) = calibrate(t, &mut f)?;
    let n = t.samples_for(k as f64 * per);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(sample(k, &mut f)?);
    }
    Ok((median(&mut v), k * n as u64))
}

/// Times a baseline and an operation with their samples interleaved (baseline, operation,
/// baseline, ...), so that both see the same machine load. Samples are short (a preemption
/// spoils few of them, and the median drops those). Returns the medians of one baseline
/// operation and one operation in microseconds, and the operations timed.
pub fn time_paired<E>(
    t: &Timing,
    mut base: impl FnMut(u64) -> Result<(), E>,
    mut op: impl FnMut(u64) -> Result<(), E>,
) -> Result<(f64, f64, u64), E> {
    let (kb, pb) = calibrate(t, &mut base)?;
    let (ko, po) = calibrate(t, &mut op)?;
    let n = t.samples_for(kb as f64 * pb + ko as f64 * po);
    let (mut vb, mut vo) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        vb.push(sample(kb, &mut base)?);
        vo.push(sample(ko, &mut op)?);
    }
    Ok((median(&mut vb), median(&mut vo), ko * n as u64))
}

/// A buffer of `u64` words whose first word is 64-byte aligned, so that two such buffers (and a
/// symmetric object, which the heap aligns to 64) are aligned alike: glibc `memcpy` is many
/// times slower when destination and source differ by 8 modulo 64.
/// [`at_page_offset`](Self::at_page_offset) also places it at a chosen offset within its page
/// (copies between addresses equal modulo 4096 avoid 4K-aliasing stalls alike).
#[derive(Debug)]
pub struct AlignedBuf {
    v: Vec<u64>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` words, each set to `fill`.
    pub fn new(len: usize, fill: u64) -> Self {
        let v = vec![fill; len + 8];
        let off = (v.as_ptr() as usize).wrapping_neg() % 64 / 8;
        AlignedBuf { v, off, len }
    }

    /// `len` words set to `fill`, the first at byte `page_offset` (rounded down to 64) of a page.
    pub fn at_page_offset(len: usize, fill: u64, page_offset: usize) -> Self {
        let v = vec![fill; len + 512];
        let want = page_offset % 4096 / 64 * 64;
        let off = (want.wrapping_sub(v.as_ptr() as usize)) % 4096 / 8;
        AlignedBuf { v, off, len }
    }
    /// The words.
    pub fn as_slice(&self) -> &[u64] {
        &self.v[self.off..self.off + self.len]
    }
    /// The words, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u64] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// The bandwidth baseline: `k` copies of `src` into `dst` with `memcpy` (what `copy_from_slice`
/// calls), in the calling thread.
pub fn memcpy_k(k: u64, src: &[u64], dst: &mut [u64]) {
    for _ in 0..k {
        dst.copy_from_slice(black_box(src));
        black_box(dst.as_mut_ptr());
    }
}

/// The same-process atomic-flag ping-pong: the latency baseline. Two flags on their own cache
/// lines; the client writes `ping`, the server echoes it into `pong`. Waits spin 128 times,
/// then yield on each poll, as the library's waits do.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct PingPong {
    ping: AtomicU64,
    _pad: [u64; 15],
    pong: AtomicU64,
}

/// Tells the server to stop.
const STOP: u64 = u64::MAX;

/// The waiting policy of the library's waits: 128 spins, then a yield per poll (so that the
/// baseline, like the library, survives more runnable threads than cores).
#[inline]
fn backoff(spins: u32) {
    if spins < 128 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl PingPong {
    /// Clears both flags (before the server starts).
    pub fn reset(&self) {
        self.ping.store(0, Ordering::Relaxed);
        self.pong.store(0, Ordering::Relaxed);
    }

    /// Echoes `ping` into `pong` until told to stop or `limit` passes without news.
    pub fn serve(&self, limit: Duration) {
        let mut last = 0;
        let mut idle: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let v = self.ping.load(Ordering::Acquire);
            if v == STOP {
                return;
            }
            if v != last {
                self.pong.store(v, Ordering::Release);
                last = v;
                idle = None;
                spins = 0;
                continue;
            }
            spins = spins.wrapping_add(1);
            backoff(spins);
            if spins.is_multiple_of(4096) && idle.get_or_insert_with(Instant::now).elapsed() > limit
            {
                return;
            }
        }
    }

    /// Runs `k` round trips from the client side; false if the server stopped answering.
    pub fn round_trips(&self, k: u64, seq: &mut u64, limit: Duration) -> bool {
        for _ in 0..k {
            *seq += 1;
            self.ping.store(*seq, Ordering::Release);
            let mut spins = 0u32;
            let mut start = None;
            while self.pong.load(Ordering::Acquire) != *seq {
                spins = spins.wrapping_add(1);
                backoff(spins);
                if spins.is_multiple_of(4096) {
                    let s = *start.get_or_insert_with(Instant::now);
                    if s.elapsed() > limit {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Tells the server to stop.
    pub fn stop(&self) {
        self.ping.store(STOP, Ordering::Release);
    }
}

/// Flags shared by the PE threads of this process (thread mode) for the in-world baseline.
pub static PING_PONG: PingPong = PingPong {
    ping: AtomicU64::new(0),
    _pad: [0; 15],
    pong: AtomicU64::new(0),
};

/// A [`PingPong`] in an anonymous memory file (`memfd_create`) that several processes map: the
/// latency baseline between PEs of different processes. It has no name in `/dev/shm`, so
/// nothing is left behind whichever way the processes end: the other processes open it through
/// the creator's descriptor (`/proc/<pid>/fd/<fd>`, [`path`](Self::path)) while it lives.
#[derive(Debug)]
pub struct SharedPingPong {
    ptr: std::ptr::NonNull<PingPong>,
    path: std::path::PathBuf,
    _fd: std::os::fd::OwnedFd,
}

// SAFETY: the mapping is only reached through `&PingPong`, whose fields are atomics.
unsafe impl Send for SharedPingPong {}
// SAFETY: as above.
unsafe impl Sync for SharedPingPong {}

const SHARED_LEN: usize = 4096;

impl SharedPingPong {
    /// Creates (zeroed) and maps a new anonymous file for the flags.
    pub fn create() -> std::io::Result<Self> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let raw =
            unsafe { libc::memfd_create(c"rshmem-perf-pingpong".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let f = std::fs::File::from(fd);
        f.set_len(SHARED_LEN as u64)?;
        let ptr = Self::map(&f)?;
        let path = format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd()).into();
        Ok(SharedPingPong {
            ptr,
            path,
            _fd: f.into(),
        })
    }

    /// Maps the file another process created (its [`path`](Self::path)).
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        if f.metadata()?.len() < SHARED_LEN as u64 {
            return Err(std::io::Error::other(format!(
                "{}: shorter than {SHARED_LEN} bytes",
                path.display()
            )));
        }
        Ok(SharedPingPong {
            ptr: Self::map(&f)?,
            path: path.to_path_buf(),
            _fd: f.into(),
        })
    }

    fn map(f: &std::fs::File) -> std::io::Result<std::ptr::NonNull<PingPong>> {
        use std::os::fd::AsRawFd;
        // SAFETY: maps SHARED_LEN bytes of a file at least that long; the kernel picks the
        // address. The result is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHARED_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        std::ptr::NonNull::new(p.cast::<PingPong>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))
    }

    /// The file's path (to pass to the other processes).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The flags.
    pub fn flags(&self) -> &PingPong {
        // SAFETY: the mapping is page aligned (so aligned for PingPong), SHARED_LEN bytes
        // cover it, it lives until drop, and all-zero bytes are valid atomics.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for SharedPingPong {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), SHARED_LEN) };
    }
}

/// One-way latency in microseconds of the raw ping-pong between two new threads (started as
/// PE threads are; the calling thread waits), the baseline measured outside any world.
pub fn raw_ping_pong_us(t: &Timing) -> f64 {
    let pp = PingPong::default();
    let limit = Duration::from_secs(10);
    std::thread::scope(|s| {
        s.spawn(|| pp.serve(limit));
        let client = s.spawn(|| {
            let mut seq = 0;
            let r = time_per_op(t, |k| {
                if pp.round_trips(k, &mut seq, limit) {
                    Ok(())
                } else {
                    Err(())
                }
            });
            pp.stop();
            r.map(|(us, _)| us / 2.0).unwrap_or(f64::NAN)
        });
        client.join().unwrap_or(f64::NAN)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn aligned_buffers() {
        for len in [0, 1, 7, 100] {
            let mut b = AlignedBuf::new(len, 7);
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&w| w == 7));
            b.as_mut_slice().fill(3);
            assert!(b.as_slice().iter().all(|&w| w == 3));
            for po in [0, 64, 4032, 4096 + 128] {
                let b = AlignedBuf::at_page_offset(len, 9, po);
                assert_eq!(b.as_slice().len(), len);
                assert_eq!(b.as_slice().as_ptr() as usize % 4096, po % 4096);
                assert!(b.as_slice().iter().all(|&w| w == 9));
            }
        }
    }

    #[test]
    fn memcpy_copies() {
        // Distinct words (a copy from the wrong place would show), into a poisoned buffer.
        let mut src = AlignedBuf::new(33, 0);
        for (i, w) in src.as_mut_slice().iter_mut().enumerate() {
            *w = 0x5a5a_0000 + i as u64;
        }
        let mut dst = AlignedBuf::new(33, u64::MAX);
        memcpy_k(2, src.as_slice(), dst.as_mut_slice());
        let want: Vec<u64> = (0..33).map(|i| 0x5a5a_0000 + i).collect();
        assert_eq!(dst.as_slice(), &want[..]);
    }

    #[test]
    fn shared_ping_pong_maps_one_page_twice() {
        let a = SharedPingPong::create().unwrap();
        let b = SharedPingPong::open(a.path()).unwrap();
        let limit = Duration::from_secs(10);
        std::thread::scope(|s| {
            s.spawn(|| b.flags().serve(limit));
            let mut seq = 0;
            assert!(a.flags().round_trips(100, &mut seq, limit));
            a.flags().stop();
        });
        // Flags written through one mapping are read through the other (the round trips
        // above); the file is anonymous: no name in /dev/shm to leave behind.
        let target = std::fs::read_link(a.path()).unwrap();
        assert!(
            target
                .to_string_lossy()
                .starts_with("/memfd:rshmem-perf-pingpong"),
            "{target:?}"
        );
        drop(b);
        drop(a);
    }

    #[test]
    fn ping_pong_runs() {
        let t = Timing {
            sample_time: Duration::from_millis(1),
            samples: 3,
            budget: Duration::from_millis(10),
        };
        let us = raw_ping_pong_us(&t);
        assert!(us.is_finite() && us > 0.0);
    }
}
