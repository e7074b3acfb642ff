//! Run-time compilation with NVRTC, cached in memory and on disk by (source, arch, options).

use super::ffi::{self, check_rtc, rtc};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
/// extra NVRTC `options`; returns a cubin. Cached in memory and on disk; threads of one process
/// asking for the same program at once compile it once (the others wait for its cubin).
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
    if let Some(f) = &file {
        if let Ok(b) = std::fs::read(f) {
            if !b.is_empty() {
                let b = Arc::new(b);
                mem.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, b.clone());
                return Ok(b);
            }
        }
    }
    let cubin = Arc::new(compile_uncached(src, arch, options)?);
    if let Some(f) = &file {
        // A cache that cannot be written is not an error; write then rename so readers never
        // see half a file.
        if let Some(d) = f.parent() {
            let _ = std::fs::create_dir_all(d);
        }
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

/// Compiles several programs (source and options) as [`compile`] does, on scoped threads, at
/// most [`std::thread::available_parallelism`] at once, in the order given (put the slowest
/// first); returns their cubins in that order, or the first program's error (by order) when
/// any fails.
pub fn compile_all(programs: &[(&str, &[&str])], arch: &str) -> Result<Vec<Arc<Vec<u8>>>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(programs.len());
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<Result<Arc<Vec<u8>>>>> = (0..programs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((src, options)) = programs.get(i) else {
                            return done;
                        };
                        done.push((i, compile(src, arch, options)));
                    }
                })
            })
            .collect();
        for h in handles {
            // A worker that panicked leaves its programs unset: reported below.
            if let Ok(done) = h.join() {
                for (i, r) in done {
                    out[i] = Some(r);
                }
            }
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
