//! `rshmem info`: backends found, defaults, environment variables.

use rshmem::Config;

/// Probes the CUDA driver: `Ok(description)` when `libcuda.so.1` loads, else the reason.
pub fn cuda_probe() -> Result<String, String> {
    // SAFETY: loading the driver library runs its initialisers, which is what every CUDA program
    // does; we only read its version below.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| format!("no driver: {e}"))?;
    type GetVersion = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: `cuDriverGetVersion(int*)` has this signature in every CUDA driver API version.
    let f = unsafe { lib.get::<GetVersion>(b"cuDriverGetVersion\0") }
        .map_err(|e| format!("libcuda.so.1 has no cuDriverGetVersion: {e}"))?;
    let mut v = 0i32;
    // SAFETY: a valid pointer to a live i32; the call needs no prior cuInit.
    let rc = unsafe { f(&mut v) };
    if rc != 0 {
        return Err(format!("cuDriverGetVersion failed with CUresult {rc}"));
    }
    Ok(format!(
        "libcuda.so.1 loaded, driver API {}.{}",
        v / 1000,
        (v % 1000) / 10
    ))
}

/// The report printed by `rshmem info`.
pub fn report() -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "rshmem {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(s, "\nBackends:");
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        s,
        "  shm   available (CPU shared memory; {cpus} CPUs available to this process)"
    );
    match cuda_probe() {
        Ok(d) => {
            let _ = writeln!(
                s,
                "  cuda  not built (no CUDA backend in this build); driver: {d}"
            );
        }
        Err(e) => {
            let _ = writeln!(s, "  cuda  not built / {e}");
        }
    }
    let d = Config::default();
    let _ = writeln!(s, "\nDefaults:");
    let _ = writeln!(s, "  heap size   {} bytes per PE", d.heap_size);
    let _ = writeln!(s, "  timeout     {:?}", d.timeout);
    let _ = writeln!(s, "  backend     {}", d.backend.name());
    let _ = writeln!(s, "  GPU heap    {:?}", d.heap_kind);
    let _ = writeln!(s, "  max teams   {}", d.max_teams);
    match Config::from_env() {
        Ok(c) => {
            let _ = writeln!(
                s,
                "  in force    heap {} bytes, timeout {:?}, backend {}, max teams {}",
                c.heap_size,
                c.timeout,
                c.backend.name(),
                c.max_teams
            );
        }
        Err(e) => {
            let _ = writeln!(s, "  in force    error: {e}");
        }
    }
    let _ = writeln!(s, "\nEnvironment:");
    for (name, what) in rshmem::config::ENV_VARS {
        let val = match std::env::var(name) {
            Ok(v) => format!("= {v:?}"),
            Err(std::env::VarError::NotPresent) => "(unset)".into(),
            Err(std::env::VarError::NotUnicode(_)) => "(not unicode)".into(),
        };
        let _ = writeln!(s, "  {name:<18} {val:<14} {what}");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn lists_backends_defaults_and_every_variable() {
        let r = super::report();
        assert!(r.contains("shm   available"));
        assert!(r.contains("cuda  "));
        assert!(r.contains(&format!(
            "{} bytes per PE",
            rshmem::Config::default().heap_size
        )));
        for (name, _) in rshmem::config::ENV_VARS {
            assert!(r.contains(name), "{name} missing");
        }
    }
}
