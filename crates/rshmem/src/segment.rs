//! Memory regions that hold a PE's control block and CPU heap: anonymous memory when every PE
//! lives in this process, a POSIX shared-memory segment otherwise.
//!
//! Segments are named `/rshmem-<job>-<pe>`, created with mode 0600, and unlinked by their owner
//! as soon as every peer has mapped them (a mapping outlives its name), so after start-up nothing
//! is left in `/dev/shm` whatever way the job ends. Before that point `Drop` unlinks them, and
//! the launcher removes `rshmem-<job>-*` after the job.

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
}

// SAFETY: a Region is a raw mapping owned by this struct; all access to its bytes goes through
// atomics or explicit copies whose synchronisation is the protocol's job, as in any SHMEM.
unsafe impl Send for Region {}
// SAFETY: see Send; the only interior state is behind a Mutex.
unsafe impl Sync for Region {}

fn map(fd: libc::c_int, len: usize) -> Result<*mut u8> {
    let flags = if fd < 0 {
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
        })
    }

    /// Creates the named segment (exclusively, mode 0600) and maps it.
    pub fn create_shm(name: &str, len: usize) -> Result<Region> {
        let cname = CString::new(name).map_err(|_| Error::invalid("segment name contains NUL"))?;
        // SAFETY: cname is a valid C string.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
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
        assert!(Region::create_shm(&name, 8192).is_err(), "exclusive create");
        let b = Region::open_shm(&name, 8192).unwrap();
        // SAFETY: both map the same 8192 bytes.
        unsafe {
            a.ptr().add(100).write(42);
            assert_eq!(b.ptr().add(100).read(), 42);
        }
        assert!(
            Region::open_shm(&name, 1 << 20).is_err(),
            "short segment is an error"
        );
        a.unlink();
        assert!(Region::open_shm(&name, 8192).is_err());
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
