//! Configuration: a builder, filled from `RSHMEM_*` environment variables first.

use crate::error::{Error, Result};
use std::time::Duration;

/// Which backend holds the symmetric heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// CPU memory shared between threads and processes (POSIX shm).
    Shm,
    /// NVIDIA GPU memory through the CUDA driver API.
    Cuda,
}

impl BackendKind {
    /// The name used in `RSHMEM_BACKEND` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Shm => "shm",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// How a GPU heap is allocated (CUDA backend only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapKind {
    /// One `cuMemAlloc` region per PE, shared by CUDA IPC handles.
    Static,
    /// `cuMemCreate`/`cuMemMap` chunks shared by POSIX file descriptors.
    Vmm,
}

/// Runtime configuration. `Config::from_env()` reads the environment; the setters override it.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes of symmetric heap per PE (`RSHMEM_HEAP_SIZE`, e.g. `256M`, `2G`). Default 128 MiB.
    pub heap_size: usize,
    /// How long a wait, barrier or bootstrap step may take (`RSHMEM_TIMEOUT`, seconds). Default 60 s.
    pub timeout: Duration,
    /// Backend (`RSHMEM_BACKEND=shm|cuda`). Default shm.
    pub backend: BackendKind,
    /// GPU heap kind (`RSHMEM_HEAP=static|vmm`). Default static.
    pub heap_kind: HeapKind,
    /// Most teams alive at once, the world included (`RSHMEM_MAX_TEAMS`). Default 64. The CUDA
    /// backend keeps `n_pes × (max_teams + 1) × 16` bytes of barrier counters per PE.
    pub max_teams: usize,
    /// CUDA backend: GPU ordinal of each world rank (`RSHMEM_DEVICES=0,1,...`). Default: each
    /// PE's index among the PEs of its process.
    pub devices: Option<Vec<usize>>,
    /// Entries the completion queue of non-blocking operations holds before a submission
    /// fails with [`Error::QueueFull`] (`RSHMEM_COMPLETION_QUEUE`); 0 records nothing.
    /// Default 65 536 (2 MiB per PE at most).
    pub completion_queue: usize,
    /// Name of the node this PE runs on (`RSHMEM_NODE`). PEs of one node share memory; PEs of
    /// different nodes reach each other over the fabric. Default: the host name.
    pub node: Option<String>,
    /// libfabric provider for PEs on other nodes (`RSHMEM_FABRIC_PROVIDER`, e.g. `tcp`,
    /// `verbs`, `efa`, `cxi`). Default: the first provider `fi_getinfo` offers.
    pub fabric_provider: Option<String>,
    /// libfabric domain, i.e. the interface or device (`RSHMEM_FABRIC_DOMAIN`, e.g. `lo`,
    /// `eth0`, `mlx5_0`). Default: the provider's first.
    pub fabric_domain: Option<String>,
    /// CUDA worlds spanning nodes: register each GPU heap with the fabric (`FI_HMEM_CUDA`)
    /// where the provider takes device memory (verbs, EFA, cxi, shm built with CUDA), so
    /// transfers to and from it move without host staging (`RSHMEM_FABRIC_HMEM=on|off`).
    /// Where the provider does not (tcp), or a registration fails on any PE, GPU heaps are
    /// reached through the proxies' staging either way. Default on.
    pub fabric_hmem: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heap_size: 128 << 20,
            timeout: Duration::from_secs(60),
            backend: BackendKind::Shm,
            heap_kind: HeapKind::Static,
            max_teams: 64,
            devices: None,
            completion_queue: 1 << 16,
            node: None,
            fabric_provider: None,
            fabric_domain: None,
            fabric_hmem: true,
        }
    }
}

/// Every environment variable the library reads, with its meaning (printed by `rshmem info`).
pub const ENV_VARS: &[(&str, &str)] = &[
    (
        "RSHMEM_HEAP_SIZE",
        "symmetric heap bytes per PE (K/M/G/T suffixes, at least 4K), default 128M",
    ),
    (
        "RSHMEM_TIMEOUT",
        "seconds before a wait, barrier or bootstrap step fails, default 60",
    ),
    ("RSHMEM_BACKEND", "shm | cuda, default shm"),
    ("RSHMEM_HEAP", "GPU heap kind: static | vmm, default static"),
    ("RSHMEM_MAX_TEAMS", "most teams alive at once, default 64"),
    (
        "RSHMEM_DEVICES",
        "CUDA: GPU ordinal per world rank, e.g. 0,1 (default: PE index in its process)",
    ),
    (
        "RSHMEM_COMPLETION_QUEUE",
        "entries of the non-blocking completion queue (0 = off), default 65536",
    ),
    (
        "RSHMEM_NODE",
        "node name: PEs of one node share memory, others use the fabric; default the host name",
    ),
    (
        "RSHMEM_FABRIC_PROVIDER",
        "libfabric provider between nodes (tcp, verbs, efa, cxi, ...), default fi_getinfo's first",
    ),
    (
        "RSHMEM_FABRIC_DOMAIN",
        "libfabric domain (interface or device, e.g. lo, eth0, mlx5_0), default the provider's first",
    ),
    (
        "RSHMEM_FABRIC_HMEM",
        "CUDA across nodes: register GPU heaps with the fabric where the provider takes device memory (on | off), default on",
    ),
    (
        "RSHMEM_CACHE_DIR",
        "CUDA: where compiled kernels are cached, default ~/.cache/rshmem",
    ),
    (
        "RSHMEM_RANK",
        "world index of this process's first PE (counts PEs; set by `rshmem run`)",
    ),
    (
        "RSHMEM_WORLD_SIZE",
        "number of PEs in the job (counts PEs, not processes)",
    ),
    ("RSHMEM_LOCAL_RANK", "this process's rank on its node"),
    (
        "RSHMEM_THREADS",
        "PEs (threads) per process in mixed mode, default 1",
    ),
    (
        "RSHMEM_BOOTSTRAP",
        "bootstrap address host:port of rank 0, or a unique-id string",
    ),
    (
        "RSHMEM_BOOTSTRAP_FD",
        "rank 0's listening socket, inherited from `rshmem run` (internal)",
    ),
    (
        "RSHMEM_JOB",
        "job id (hex) chosen by `rshmem run`; names the /dev/shm segments it cleans up",
    ),
    (
        "RSHMEM_LOG",
        "tracing filter for the command-line tool, e.g. rshmem=debug",
    ),
];

/// The smallest symmetric heap: one page.
pub const MIN_HEAP_SIZE: usize = 4096;
/// The largest symmetric heap (64T).
pub const MAX_HEAP_SIZE: usize = 1 << 46;

/// Parses sizes like `4096`, `64K`, `256M`, `2G`, `1T` (binary units).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn bad(name: &str, v: &str, want: &str) -> Error {
    Error::invalid(format!("{name}={v:?}: expected {want}"))
}

impl Config {
    /// Defaults overridden by the `RSHMEM_*` environment variables; a malformed value is an error.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = env("RSHMEM_HEAP_SIZE") {
            c.heap_size =
                parse_size(&v).ok_or_else(|| bad("RSHMEM_HEAP_SIZE", &v, "a size like 256M"))?;
            check_heap_size(c.heap_size)
                .map_err(|why| Error::invalid(format!("RSHMEM_HEAP_SIZE={v:?}: {why}")))?;
        }
        if let Some(v) = env("RSHMEM_TIMEOUT") {
            let s: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad("RSHMEM_TIMEOUT", &v, "seconds"))?;
            if !(s.is_finite() && s > 0.0) {
                return Err(bad("RSHMEM_TIMEOUT", &v, "a positive number of seconds"));
            }
            // try_: a huge value is an error here, not a panic
            c.timeout = Duration::try_from_secs_f64(s)
                .map_err(|_| bad("RSHMEM_TIMEOUT", &v, "a representable number of seconds"))?;
        }
        if let Some(v) = env("RSHMEM_BACKEND") {
            c.backend = match v.trim() {
                "shm" | "cpu" => BackendKind::Shm,
                "cuda" | "gpu" => BackendKind::Cuda,
                _ => return Err(bad("RSHMEM_BACKEND", &v, "shm or cuda")),
            };
        }
        if let Some(v) = env("RSHMEM_HEAP") {
            c.heap_kind = match v.trim() {
                "static" => HeapKind::Static,
                "vmm" => HeapKind::Vmm,
                _ => return Err(bad("RSHMEM_HEAP", &v, "static or vmm")),
            };
        }
        if let Some(v) = env("RSHMEM_MAX_TEAMS") {
            c.max_teams = v
                .trim()
                .parse()
                .map_err(|_| bad("RSHMEM_MAX_TEAMS", &v, "a count"))?;
        }
        if let Some(v) = env("RSHMEM_COMPLETION_QUEUE") {
            c.completion_queue = v
                .trim()
                .parse()
                .map_err(|_| bad("RSHMEM_COMPLETION_QUEUE", &v, "a count (0 = off)"))?;
        }
        if let Some(v) = env("RSHMEM_DEVICES") {
            c.devices = Some(
                parse_devices(&v)
                    .ok_or_else(|| bad("RSHMEM_DEVICES", &v, "GPU ordinals like 0,1,2,3"))?,
            );
        }
        c.node = env("RSHMEM_NODE").map(|v| v.trim().to_string());
        c.fabric_provider = env("RSHMEM_FABRIC_PROVIDER").map(|v| v.trim().to_string());
        c.fabric_domain = env("RSHMEM_FABRIC_DOMAIN").map(|v| v.trim().to_string());
        if let Some(v) = env("RSHMEM_FABRIC_HMEM") {
            c.fabric_hmem = match v.trim() {
                "on" | "1" | "true" => true,
                "off" | "0" | "false" => false,
                _ => return Err(bad("RSHMEM_FABRIC_HMEM", &v, "on or off")),
            };
        }
        c.validate()?;
        Ok(c)
    }

    /// Sets the heap size per PE in bytes.
    pub fn heap_size(mut self, bytes: usize) -> Self {
        self.heap_size = bytes;
        self
    }
    /// Sets the timeout of waits, barriers and bootstrap steps.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Sets the backend.
    pub fn backend(mut self, b: BackendKind) -> Self {
        self.backend = b;
        self
    }
    /// Sets the GPU heap kind.
    pub fn heap_kind(mut self, k: HeapKind) -> Self {
        self.heap_kind = k;
        self
    }
    /// Sets the GPU ordinal of each world rank (CUDA backend).
    pub fn devices(mut self, map: Vec<usize>) -> Self {
        self.devices = Some(map);
        self
    }
    /// Sets the completion queue's capacity in entries (0: record no completions).
    pub fn completion_queue(mut self, entries: usize) -> Self {
        self.completion_queue = entries;
        self
    }
    /// Sets the name of this PE's node (see [`Config::node`]).
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        self
    }
    /// Sets the libfabric provider used between nodes.
    pub fn fabric_provider(mut self, name: impl Into<String>) -> Self {
        self.fabric_provider = Some(name.into());
        self
    }
    /// Sets the libfabric domain (interface or device) used between nodes.
    pub fn fabric_domain(mut self, name: impl Into<String>) -> Self {
        self.fabric_domain = Some(name.into());
        self
    }
    /// Sets whether GPU heaps are registered with the fabric where the provider takes device
    /// memory (see [`Config::fabric_hmem`]).
    pub fn fabric_hmem(mut self, on: bool) -> Self {
        self.fabric_hmem = on;
        self
    }
    /// Sets the most teams alive at once.
    pub fn max_teams(mut self, n: usize) -> Self {
        self.max_teams = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_heap_size(self.heap_size)
            .map_err(|why| Error::invalid(format!("heap size: {why}")))?;
        if self.max_teams == 0 || self.max_teams > 4096 {
            return Err(Error::invalid(format!(
                "max_teams {} is out of range 1..=4096",
                self.max_teams
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid("timeout must be positive"));
        }
        for (what, v) in [
            ("node name", &self.node),
            ("fabric provider", &self.fabric_provider),
            ("fabric domain", &self.fabric_domain),
        ] {
            if let Some(v) = v {
                if v.is_empty() || v.contains('\0') {
                    return Err(Error::invalid(format!(
                        "{what} {v:?} is empty or holds a NUL"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Why `bytes` cannot be a heap size, if it cannot.
fn check_heap_size(bytes: usize) -> std::result::Result<(), String> {
    if bytes < MIN_HEAP_SIZE {
        return Err(format!(
            "{bytes} bytes is below the minimum of {MIN_HEAP_SIZE} bytes (4K)"
        ));
    }
    if bytes > MAX_HEAP_SIZE {
        return Err(format!(
            "{bytes} bytes is above the maximum of {MAX_HEAP_SIZE} bytes (64T)"
        ));
    }
    Ok(())
}

/// A size variable (`64K`, `1M`, bytes); unset or empty: `None`; malformed: an error.
pub(crate) fn env_size(name: &str) -> Result<Option<usize>> {
    size_value(name, env(name).as_deref())
}

/// [`env_size`] on the value `v` of variable `name` (`None` or empty: unset).
pub(crate) fn size_value(name: &str, v: Option<&str>) -> Result<Option<usize>> {
    v.filter(|v| !v.trim().is_empty())
        .map(|v| {
            parse_size(v)
                .ok_or_else(|| Error::invalid(format!("{name}={v:?}: expected a size like 256K")))
        })
        .transpose()
}

/// Parses `RSHMEM_DEVICES` style maps: `0,1,2,3` (rank i → ordinal).
pub(crate) fn parse_devices(s: &str) -> Option<Vec<usize>> {
    s.split(',').map(|x| x.trim().parse().ok()).collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("3T"), Some(3 << 40));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }
    #[test]
    fn fabric_names_are_checked() {
        let ok = Config::default()
            .node("rack3-n7")
            .fabric_provider("tcp")
            .fabric_domain("lo");
        assert!(ok.validate().is_ok());
        for bad in [
            Config::default().node(""),
            Config::default().fabric_provider("tc\0p"),
            Config::default().fabric_domain(""),
        ] {
            assert!(matches!(bad.validate(), Err(Error::InvalidArgument(_))));
        }
    }
    #[test]
    fn huge_timeout_is_an_error_not_a_panic() {
        // The only test of the crate that touches RSHMEM_TIMEOUT.
        std::env::set_var("RSHMEM_TIMEOUT", "1e30");
        let r = Config::from_env();
        std::env::set_var("RSHMEM_TIMEOUT", "2.5");
        let ok = Config::from_env();
        std::env::remove_var("RSHMEM_TIMEOUT");
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        assert_eq!(
            ok.map(|c| c.timeout).ok(),
            Some(Duration::from_millis(2500))
        );
    }

    #[test]
    fn malformed_environment_is_an_error_naming_the_variable() {
        // The only test of the crate that touches these variables (one at a time).
        let bad = [
            ("RSHMEM_HEAP_SIZE", "lots"),
            ("RSHMEM_HEAP_SIZE", "-1M"),
            ("RSHMEM_HEAP_SIZE", "0"),
            ("RSHMEM_BACKEND", "fpga"),
            ("RSHMEM_HEAP", "dynamic"),
            ("RSHMEM_MAX_TEAMS", "many"),
            ("RSHMEM_MAX_TEAMS", "0"),
            ("RSHMEM_COMPLETION_QUEUE", "-3"),
            ("RSHMEM_DEVICES", "0,x"),
            ("RSHMEM_FABRIC_HMEM", "maybe"),
        ];
        for (var, v) in bad {
            std::env::set_var(var, v);
            let r = Config::from_env();
            std::env::remove_var(var);
            match r {
                Err(Error::InvalidArgument(m)) => {
                    assert!(
                        m.contains(var) || v == "0",
                        "{var}={v}: message lacks the name: {m}"
                    )
                }
                other => panic!("{var}={v}: {other:?}"),
            }
        }
        // good values are taken
        std::env::set_var("RSHMEM_HEAP_SIZE", "3M");
        std::env::set_var("RSHMEM_MAX_TEAMS", "5");
        std::env::set_var("RSHMEM_COMPLETION_QUEUE", "0");
        std::env::set_var("RSHMEM_FABRIC_HMEM", "off");
        let c = Config::from_env();
        for var in [
            "RSHMEM_HEAP_SIZE",
            "RSHMEM_MAX_TEAMS",
            "RSHMEM_COMPLETION_QUEUE",
            "RSHMEM_FABRIC_HMEM",
        ] {
            std::env::remove_var(var);
        }
        let c = c.unwrap();
        assert_eq!(
            (c.heap_size, c.max_teams, c.completion_queue, c.fabric_hmem),
            (3 << 20, 5, 0, false)
        );
        assert!(Config::default().fabric_hmem);
    }
}
