//! Memory regions that hold a PE's control block and CPU heap: anonymous memory when every PE
//! lives in this process, a POSIX shared-memory segment otherwise.
//!
//! Segments are named `/rshmem-<job>-<pe>`, created with mode 0600, and unlinked by their owner
//! as soon as every peer has mapped them (a mapping outlives its name), so after start-up nothing
//! is left in `/dev/shm` whatever way the job ends. Before that point `Drop` unlinks them, a
//! SIGINT/SIGTERM handler (installed only while some name exists, then restored; never over an
//! ignored signal) unlinks them and re-raises the signal, and the launcher removes
//! `rshmem-<job>-*` after the job.

use crate::error::{Error, Result};
use std::ffi::CString;

/// Prefix of every segment name.
pub const SEGMENT_PREFIX: &str = "rshmem-";

/// The name of PE `pe`'s segment in job `job`.
pub fn segment_name(job: u64, pe: usize) -> String {
    format!("/{SEGMENT_PREFIX}{job:016x}-{pe}")
}

/// The name of PE `pe`'s segment of world `world` in job `job` (a launcher's job may hold
/// several worlds); starts with the job's prefix, so [`remove_job_segments`] finds it.
pub fn world_segment_name(job: u64, world: u64, pe: usize) -> String {
    format!("/{SEGMENT_PREFIX}{job:016x}-{world:016x}-{pe}")
}

/// A mapped region. Unmapped on drop; an owned shm name not yet unlinked is unlinked then too.
#[derive(Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    /// The shm name while it still exists and this region created it.
    owned_name: std::sync::Mutex<Option<CString>>,
    /// Its slot in the table the signal handler unlinks.
    pending: Option<usize>,
}

/// Names created and not yet unlinked, for the SIGINT/SIGTERM handler: NUL-padded bytes in
/// atomics (no locks in a signal handler).
mod pending {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use std::sync::Mutex;

    const SLOTS: usize = 256;
    const WORDS: usize = 12; // 96 bytes, names are shorter
    struct Slot {
        used: AtomicBool,
        name: [AtomicU64; WORDS],
    }
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        used: AtomicBool::new(false),
        name: [const { AtomicU64::new(0) }; WORDS],
    };
    static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
    static LIVE: AtomicUsize = AtomicUsize::new(0);
    const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

    /// The actions that were in place before ours, restored when the last name goes. Written
    /// only under `INSTALL` while our handler is not installed; read by the handler.
    struct Saved(std::cell::UnsafeCell<std::mem::MaybeUninit<[libc::sigaction; 2]>>);
    // SAFETY: see the field's comment: writes happen-before the handler that reads is
    // installed (sigaction is a system call), and never while it is installed.
    unsafe impl Sync for Saved {}
    static SAVED: Saved = Saved(std::cell::UnsafeCell::new(std::mem::MaybeUninit::uninit()));
    static INSTALL: Mutex<()> = Mutex::new(());

    extern "C" fn on_signal(sig: libc::c_int) {
        for slot in &TABLE {
            if !slot.used.load(Ordering::Acquire) {
                continue;
            }
            let mut buf = [0u8; WORDS * 8 + 1];
            for (i, w) in slot.name.iter().enumerate() {
                buf[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            // SAFETY: buf is NUL-terminated; shm_unlink only unlinks a file under /dev/shm.
            unsafe { libc::shm_unlink(buf.as_ptr() as *const libc::c_char) };
        }
        let i = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
        // SAFETY: SAVED was written before this handler was installed (see Saved); sigaction
        // and raise are async-signal-safe: the previous action is put back and the signal is
        // delivered to it once this handler returns.
        unsafe {
            let olds = &*(*SAVED.0.get()).as_ptr();
            libc::sigaction(sig, &olds[i], std::ptr::null_mut());
            libc::raise(sig);
        }
    }

    /// Records `name`; returns its slot (None when the table is full or the name too long).
    pub(super) fn add(name: &[u8]) -> Option<usize> {
        if name.len() > WORDS * 8 {
            return None;
        }
        let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
        let i = TABLE.iter().position(|s| !s.used.load(Ordering::Acquire))?;
        let mut b = [0u8; WORDS * 8];
        b[..name.len()].copy_from_slice(name);
        for (k, w) in TABLE[i].name.iter().enumerate() {
            let mut c = [0u8; 8];
            c.copy_from_slice(&b[k * 8..k * 8 + 8]);
            w.store(u64::from_le_bytes(c), Ordering::Relaxed);
        }
        TABLE[i].used.store(true, Ordering::Release);
        if LIVE.fetch_add(1, Ordering::AcqRel) == 0 {
            // SAFETY: zeroed sigaction structs are valid; the old actions are saved (our
            // handler is not installed, nobody reads SAVED) before ours goes in; the handler
            // only does async-signal-safe work.
            unsafe {
                let mut olds: [libc::sigaction; 2] = std::mem::zeroed();
                for (k, &sig) in SIGNALS.iter().enumerate() {
                    libc::sigaction(sig, std::ptr::null(), &mut olds[k]);
                }
                (*SAVED.0.get()).write(olds);
                for (k, &sig) in SIGNALS.iter().enumerate() {
                    // An ignored signal stays ignored: it ends nothing, so there is nothing
                    // to clean up (and unlinking would break a start-up that goes on).
                    if olds[k].sa_sigaction == libc::SIG_IGN {
                        continue;
                    }
                    let mut act: libc::sigaction = std::mem::zeroed();
                    act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                    libc::sigemptyset(&mut act.sa_mask);
                    libc::sigaction(sig, &act, std::ptr::null_mut());
                }
            }
        }
        Some(i)
    }

    /// Forgets slot `i`; the last one restores the previous signal actions.
    pub(super) fn remove(i: usize) {
        let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
        TABLE[i].used.store(false, Ordering::Release);
        if LIVE.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: SAVED was written when our handler was installed (LIVE went 0 → 1);
            // this restores those actions.
            unsafe {
                let olds = &*(*SAVED.0.get()).as_ptr();
                for (k, &sig) in SIGNALS.iter().enumerate() {
                    libc::sigaction(sig, &olds[k], std::ptr::null_mut());
                }
            }
        }
    }
}

// SAFETY: a Region is a raw mapping owned by this struct; all access to its bytes goes through
// atomics or explicit copies whose synchronisation is the protocol's job, as in any SHMEM.
unsafe impl Send for Region {}
// SAFETY: see Send; the only interior state is behind a Mutex.
unsafe impl Sync for Region {}

fn map(fd: libc::c_int, len: usize) -> Result<*mut u8> {
    let flags = if fd < 0 && cfg!(miri) {
        // Miri models only private anonymous mappings; for thread-PEs they are the same.
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
    } else if fd < 0 {
        libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE
    } else {
        libc::MAP_SHARED
    };
    // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::os("mmap"));
    }
    Ok(p as *mut u8)
}

impl Region {
    /// Zero-filled anonymous memory, private to this process (its threads share it).
    pub fn anonymous(len: usize) -> Result<Region> {
        let ptr = map(-1, len)?;
        Ok(Region {
            ptr,
            len,
            owned_name: std::sync::Mutex::new(None),
            pending: None,
        })
    }

    /// Creates the named segment (exclusively, mode 0600) and maps it.
    pub fn create_shm(name: &str, len: usize) -> Result<Region> {
        let cname = CString::new(name).map_err(|_| Error::invalid("segment name contains NUL"))?;
        // Recorded before the name exists, so that a signal at any point finds it.
        let pending = pending::add(cname.as_bytes());
        let forget = || {
            if let Some(i) = pending {
                pending::remove(i);
            }
        };
        // SAFETY: cname is a valid C string.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            forget();
            return Err(Error::Os {
                op: "shm_open (create)",
                msg: format!("{name}: {}", std::io::Error::last_os_error()),
            });
        }
        let cleanup = |e: Error| {
            // SAFETY: fd is ours; cname valid.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
            forget();
            e
        };
        // SAFETY: fd is a valid shm descriptor.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(cleanup(Error::os("ftruncate")));
        }
        let ptr = match map(fd, len) {
            Ok(p) => p,
            Err(e) => return Err(cleanup(e)),
        };
        // SAFETY: fd no longer needed after mmap.
        unsafe { libc::close(fd) };
        Ok(Region {
            ptr,
            len,
            owned_name: std::sync::Mutex::new(Some(cname)),
            pending,
        })
    }

    /// Maps a peer's segment; its size must be at least `len`.
    pub fn open_shm(name: &str, len: usize) -> Result<Region> {
        let cname = CString::new(name).map_err(|_| Error::invalid("segment name contains NUL"))?;
        // SAFETY: valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(Error::Os {
                op: "shm_open (peer)",
                msg: format!("{name}: {}", std::io::Error::last_os_error()),
            });
        }
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd valid, st valid.
        let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
        if !ok || (st.st_size as usize) < len {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(Error::Os {
                op: "fstat (peer segment)",
                msg: format!("{name} has {} bytes, {len} expected", st.st_size),
            });
        }
        let r = map(fd, len);
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        Ok(Region {
            ptr: r?,
            len,
            owned_name: std::sync::Mutex::new(None),
            pending: None,
        })
    }

    /// Removes the name (peers keep their mappings). Idempotent.
    pub fn unlink(&self) {
        if let Some(n) = self
            .owned_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            // SAFETY: valid C string.
            unsafe { libc::shm_unlink(n.as_ptr()) };
            if let Some(i) = self.pending {
                pending::remove(i);
            }
        }
    }

    /// Base address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: ptr/len come from our own successful mmap and nobody uses them after drop
        // (every user holds an Arc to this region).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Removes every segment of `job` left in /dev/shm (used by the launcher after a job).
/// Returns how many were removed.
pub fn remove_job_segments(job: u64) -> usize {
    let prefix = format!("{SEGMENT_PREFIX}{job:016x}-");
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && std::fs::remove_file(e.path()).is_ok() {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn shm_create_open_unlink() {
        let job = 0xfeed_0000_0000_0001u64 ^ std::process::id() as u64;
        let name = segment_name(job, 3);
        let a = Region::create_shm(&name, 8192).unwrap();
        let os = |r: Result<Region>, want: &str| match r {
            Err(Error::Os { op, msg }) => {
                assert_eq!(op, want, "{msg}");
                assert!(msg.contains(&name), "{msg} lacks the segment name");
            }
            other => panic!("expected an {want} error, got {:?}", other.map(|_| ())),
        };
        os(Region::create_shm(&name, 8192), "shm_open (create)"); // exclusive
        let b = Region::open_shm(&name, 8192).unwrap();
        // SAFETY: both map the same 8192 bytes.
        unsafe {
            a.ptr().add(100).write(42);
            assert_eq!(b.ptr().add(100).read(), 42);
        }
        // the failed exclusive create left the first segment alone
        // SAFETY: a maps 8192 bytes.
        unsafe { assert_eq!(a.ptr().add(100).read(), 42) };
        os(Region::open_shm(&name, 1 << 20), "fstat (peer segment)"); // too short
        assert!(matches!(
            Region::create_shm("/rshmem-bad\0name", 4096).map(|_| ()),
            Err(Error::InvalidArgument(_))
        ));
        a.unlink();
        os(Region::open_shm(&name, 8192), "shm_open (peer)");
        drop(a);
        // SAFETY: b still maps the memory.
        unsafe { assert_eq!(b.ptr().add(100).read(), 42) };
        assert_eq!(remove_job_segments(job), 0);
    }
    #[test]
    fn drop_unlinks() {
        let job = 0xfeed_0000_0000_0002u64 ^ std::process::id() as u64;
        let name = segment_name(job, 0);
        drop(Region::create_shm(&name, 4096).unwrap());
        assert!(Region::open_shm(&name, 4096).is_err());
    }
}
