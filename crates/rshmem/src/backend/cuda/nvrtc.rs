//! Run-time compilation with NVRTC, cached in memory and on disk by (source, arch, options).

use super::ffi::{self, check_rtc, rtc};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The device header, prepended to every program compiled through rshmem.
pub const DEVICE_HEADER: &str = include_str!("kernels/rshmem_device.cuh");
/// rshmem's own kernels (host-API atomics, stream signals and barriers, benchmarks).
pub const INTERNAL_KERNELS: &str = include_str!("kernels/internal.cu");

/// 64-bit FNV-1a (stable across builds, unlike std's hasher).
pub fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where compiled kernels are kept: `RSHMEM_CACHE_DIR`, else `$XDG_CACHE_HOME/rshmem`, else
/// `~/.cache/rshmem`; `None` when none can be named (then only the memory cache is used).
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RSHMEM_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("rshmem"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("rshmem"))
}

type Cache = Mutex<HashMap<u64, Arc<Vec<u8>>>>;

/// The full source rshmem compiles for user code `src`: the header, then the code.
pub fn with_header(src: &str) -> String {
    format!("{DEVICE_HEADER}\n#line 1 \"user.cu\"\n{src}\n")
}

/// Compiles `src` (already including the header if it needs it) for `arch` (e.g. `sm_90`) with
/// extra NVRTC `options`; returns a cubin. Cached in memory and on disk; threads, and processes
/// sharing the cache directory, asking for the same program at once compile it once (the
/// others wait for its cubin).
pub fn compile(src: &str, arch: &str, options: &[&str]) -> Result<Arc<Vec<u8>>> {
    static MEM: OnceLock<Cache> = OnceLock::new();
    static BUSY: OnceLock<Mutex<HashMap<u64, Arc<Mutex<()>>>>> = OnceLock::new();
    let opts_joined = options.join("\u{1}");
    let key = fnv(&[
        src.as_bytes(),
        arch.as_bytes(),
        opts_joined.as_bytes(),
        b"rshmem-nvrtc-1",
    ]);
    let mem = MEM.get_or_init(Default::default);
    if let Some(c) = mem.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let lock = BUSY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone();
    let _compiling = lock.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have compiled it while this one waited.
    if let Some(c) = mem.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let file = cache_dir().map(|d| d.join(format!("{key:016x}-{arch}.cubin")));
    let from_disk = || file.as_deref().and_then(read_cubin);
    // Processes starting together (the PEs of a node) ask for the same programs: one compiles
    // each while the others wait for its cubin.
    let mut _disk_lock = None;
    let hit = from_disk().or_else(|| {
        _disk_lock = file.as_deref().and_then(DiskLock::wait);
        from_disk()
    });
    if let Some(b) = hit {
        let b = Arc::new(b);
        mem.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, b.clone());
        return Ok(b);
    }
    let cubin = Arc::new(compile_uncached(src, arch, options)?);
    if let Some(f) = &file {
        // A cache that cannot be written is not an error; write then rename so readers never
        // see half a file.
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, cubin.as_slice()).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    mem.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, cubin.clone());
    Ok(cubin)
}

/// The cached cubin at `f`, if there is one (a file never holds half a cubin: written, then
/// renamed).
fn read_cubin(f: &Path) -> Option<Vec<u8>> {
    std::fs::read(f).ok().filter(|b| !b.is_empty())
}

/// How long a process waits for another that holds a cubin's lock before it compiles the
/// program itself (the holder compiles; a holder that exits releases the lock at once, so
/// only a stopped or stuck one is waited for this long).
const LOCK_PATIENCE: Duration = Duration::from_secs(300);

/// An exclusive `flock` on `<cubin>.lock` in the cache directory, held while compiling.
struct DiskLock(std::fs::File);

impl DiskLock {
    /// Waits for the lock of cubin `f`. `None` (compile or read without it) once the cubin has
    /// appeared, after [`LOCK_PATIENCE`], or when the lock file cannot be made (a cache that
    /// cannot be written).
    fn wait(f: &Path) -> Option<DiskLock> {
        let d = f.parent()?;
        let _ = std::fs::create_dir_all(d);
        let name = f.file_name()?.to_string_lossy().into_owned() + ".lock";
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(d.join(name))
            .ok()?;
        let t0 = Instant::now();
        loop {
            // SAFETY: flock on a descriptor of a file this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(DiskLock(file));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK)
                || read_cubin(f).is_some()
                || t0.elapsed() > LOCK_PATIENCE
            {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DiskLock {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this value owns (closing it would release it too).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Compiles several programs (source and options) as [`compile`] does, at most
/// [`std::thread::available_parallelism`] at once (the calling thread and scoped threads), in
/// the order given (put the slowest first); returns their cubins in that order, or the first
/// program's error (by order) when any fails.
pub fn compile_all(programs: &[(&str, &[&str])], arch: &str) -> Result<Vec<Arc<Vec<u8>>>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(programs.len());
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((src, options)) = programs.get(i) else {
                return done;
            };
            done.push((i, compile(src, arch, options)));
        }
    };
    let mut out: Vec<Option<Result<Arc<Vec<u8>>>>> = (0..programs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        // A thread that cannot be started leaves its share to the others (this one included).
        let helpers: Vec<_> = (1..workers)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("rshmem-nvrtc".into())
                    .spawn_scoped(s, work)
                    .ok()
            })
            .collect();
        let mut done = work();
        for h in helpers {
            // A helper that panicked leaves its programs unset: reported below.
            done.extend(h.join().unwrap_or_default());
        }
        for (i, r) in done {
            out[i] = Some(r);
        }
    });
    out.into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| Err(ffi::err(format!("NVRTC compile of program {i} panicked"))))
        })
        .collect()
}

/// Compiles without any cache (the CI check uses this).
pub fn compile_uncached(src: &str, arch: &str, options: &[&str]) -> Result<Vec<u8>> {
    ffi::nvrtc()?;
    let csrc = CString::new(src).map_err(|_| ffi::err("kernel source contains NUL"))?;
    let name = CString::new("rshmem.cu").unwrap_or_default();
    let mut all: Vec<CString> = vec![
        CString::new(format!("--gpu-architecture={arch}"))
            .map_err(|_| ffi::err("arch contains NUL"))?,
        CString::new("-std=c++17").unwrap_or_default(),
        CString::new("-default-device").unwrap_or_default(),
    ];
    for o in options {
        all.push(CString::new(*o).map_err(|_| ffi::err("option contains NUL"))?);
    }
    let ptrs: Vec<*const std::ffi::c_char> = all.iter().map(|c| c.as_ptr()).collect();
    let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name; no headers.
    check_rtc(
        unsafe {
            rtc::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    struct Prog(rtc::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { rtc::nvrtcDestroyProgram(&mut self.0) };
        }
    }
    let p = Prog(prog);
    // SAFETY: live program; options are NUL-terminated strings alive for the call.
    let r = unsafe { rtc::nvrtcCompileProgram(p.0, ptrs.len() as i32, ptrs.as_ptr()) };
    let mut log_n = 0usize;
    // SAFETY: live program.
    let _ = unsafe { rtc::nvrtcGetProgramLogSize(p.0, &mut log_n) };
    let mut log = vec![0u8; log_n.max(1)];
    // SAFETY: the buffer holds log_n bytes.
    let _ = unsafe { rtc::nvrtcGetProgramLog(p.0, log.as_mut_ptr() as *mut _) };
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .trim()
        .to_string();
    if r != rtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(ffi::err(format!(
            "NVRTC compilation for {arch} failed ({r:?}):\n{log}"
        )));
    }
    if !log.is_empty() {
        tracing::debug!(%log, "nvrtc log");
    }
    let mut n = 0usize;
    // SAFETY: live, compiled program.
    check_rtc(
        unsafe { rtc::nvrtcGetCUBINSize(p.0, &mut n) },
        "nvrtcGetCUBINSize",
    )?;
    let mut out = vec![0u8; n];
    // SAFETY: the buffer holds n bytes.
    check_rtc(
        unsafe { rtc::nvrtcGetCUBIN(p.0, out.as_mut_ptr() as *mut _) },
        "nvrtcGetCUBIN",
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second waiter for a cubin's lock (another open file, as another process has) waits
    /// while the first holds it: it returns without the lock once the cubin appears, and takes
    /// the lock once the holder lets go without writing one.
    #[test]
    fn disk_lock_waits_for_the_holder() {
        let dir = std::env::temp_dir().join(format!("rshmem-disk-lock-{}", std::process::id()));
        let f = dir.join("0123-sm_90.cubin");
        let held = DiskLock::wait(&f).expect("a free lock");
        let waiter = {
            let f = f.clone();
            std::thread::spawn(move || DiskLock::wait(&f).is_some())
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished(), "the lock is held");
        std::fs::write(&f, b"cubin").unwrap();
        assert!(
            !waiter.join().unwrap(),
            "the cubin appeared: no lock needed"
        );
        std::fs::remove_file(&f).unwrap();
        let waiter = {
            let f = f.clone();
            std::thread::spawn(move || DiskLock::wait(&f).is_some())
        };
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        assert!(waiter.join().unwrap(), "released: the waiter holds it");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An empty cache file is no cubin; a missing directory is no cache.
    #[test]
    fn read_cubin_needs_a_nonempty_file() {
        let dir = std::env::temp_dir().join(format!("rshmem-read-cubin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x-sm_90.cubin");
        std::fs::write(&f, b"").unwrap();
        assert_eq!(read_cubin(&f), None);
        std::fs::write(&f, b"\x7fELF").unwrap();
        assert_eq!(read_cubin(&f), Some(b"\x7fELF".to_vec()));
        assert_eq!(read_cubin(&dir.join("missing/y-sm_90.cubin")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
