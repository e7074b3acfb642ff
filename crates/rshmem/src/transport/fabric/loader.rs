//! libfabric loaded at run time: the crate builds and its CPU tests run where libfabric is not
//! installed, and a world that asks for the fabric there gets an error naming the library.
//! Only these six functions are exported by libfabric; everything else is called through the
//! ops tables of the objects they return (`ffi.rs`).

use super::ffi::{fi_fabric_attr, fi_info, fid_fabric};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// The library's file name (the SONAME of libfabric 1.x), loaded at run time.
pub const LIBRARY: &str = "libfabric.so.1";

type GetInfo = unsafe extern "C" fn(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int;
type FreeInfo = unsafe extern "C" fn(info: *mut fi_info);
type DupInfo = unsafe extern "C" fn(info: *const fi_info) -> *mut fi_info;
type Fabric = unsafe extern "C" fn(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int;
type StrError = unsafe extern "C" fn(errnum: c_int) -> *const c_char;
type Version = unsafe extern "C" fn() -> u32;

/// The exported entry points of a loaded libfabric.
#[derive(Debug)]
pub(crate) struct Lib {
    pub getinfo: GetInfo,
    pub freeinfo: FreeInfo,
    pub dupinfo: DupInfo,
    pub fabric: Fabric,
    strerror: StrError,
    pub version: u32,
    /// Keeps the functions above valid for the life of the process.
    _lib: libloading::Library,
}

impl Lib {
    /// The text of a libfabric error number (positive or negative).
    pub fn strerror(&self, err: isize) -> String {
        // SAFETY: fi_strerror returns a static, NUL-terminated string for any number.
        let p = unsafe { (self.strerror)(err.unsigned_abs() as c_int) };
        if p.is_null() {
            return format!("error {err}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn open() -> Result<Lib, String> {
    open_named(LIBRARY)
}

/// Loads the library `name` (a test passes one that does not exist).
fn open_named(name: &str) -> Result<Lib, String> {
    // SAFETY: loading libfabric runs its constructors, which only initialise its own state.
    let lib = unsafe { libloading::Library::new(name) }
        .map_err(|e| format!("{name} could not be loaded ({e}); install libfabric (Debian/Ubuntu: apt-get install libfabric1 or libfabric-dev)"))?;
    macro_rules! sym {
        ($name:literal, $t:ty) => {{
            // SAFETY: the symbol's C signature is the one declared by `$t` (libfabric 1.x ABI,
            // stable across 1.x releases).
            let s: libloading::Symbol<$t> = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{name} lacks {}: {e}", $name))?;
            *s
        }};
    }
    let version_fn = sym!("fi_version", Version);
    let lib_out = Lib {
        getinfo: sym!("fi_getinfo", GetInfo),
        freeinfo: sym!("fi_freeinfo", FreeInfo),
        dupinfo: sym!("fi_dupinfo", DupInfo),
        fabric: sym!("fi_fabric", Fabric),
        strerror: sym!("fi_strerror", StrError),
        // SAFETY: fi_version takes nothing and returns the library's API version.
        version: unsafe { version_fn() },
        _lib: lib,
    };
    Ok(lib_out)
}

/// The process's libfabric, loaded on first use; [`Error::Backend`] naming the library when it
/// is missing or too old.
pub(crate) fn lib() -> Result<&'static Lib> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    let fail = |msg: String| Error::Backend {
        backend: "fabric",
        msg,
    };
    let lib = LIB
        .get_or_init(open)
        .as_ref()
        .map_err(|m| fail(m.clone()))?;
    if lib.version < super::ffi::fi_version(1, 17) {
        return Err(fail(format!(
            "{LIBRARY} has API version {}.{}; rshmem's fabric transport needs 1.17 or newer",
            lib.version >> 16,
            lib.version & 0xffff
        )));
    }
    Ok(lib)
}

/// Whether libfabric can be loaded here (tests skip when it cannot).
#[cfg(test)]
pub(crate) fn available() -> bool {
    lib().is_ok()
}

/// Loads libfabric (once per process) and checks its version: `Ok` when worlds spanning nodes
/// can be formed here, else [`Error::Backend`] naming the library and what is missing.
///
/// ```
/// match rshmem::transport::fabric::probe() {
///     Ok(()) => println!("libfabric is here"),
///     Err(e) => println!("no fabric between nodes: {e}"),
/// }
/// ```
pub fn probe() -> Result<()> {
    lib().map(|_| ())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let e = super::open_named("libfabric-absent.so.1").expect_err("no such library");
        assert!(
            e.contains("libfabric-absent.so.1") && e.contains("install libfabric"),
            "{e}"
        );
        // A library without libfabric's symbols: the missing symbol is named.
        let e = super::open_named("libc.so.6").expect_err("libc is no libfabric");
        assert!(e.contains("lacks fi_version"), "{e}");
    }
}
