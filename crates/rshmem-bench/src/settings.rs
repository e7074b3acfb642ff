//! The benchmarks' settings, read from the environment once, at the edge (`rshmem perf` calls
//! [`Settings::from_env`] before it starts a suite). The variables are listed in
//! `docs/tuning.md` ("Benchmark settings").

use rshmem::{Error, Result};

/// What the suites read from `RSHMEM_BENCH_*` and `RSHMEM_EP_BREAKDOWN`. `Default` holds the
/// values of an empty environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `RSHMEM_BENCH_GRAPH=1`: the CUDA collective benchmarks time rshmem and NCCL alike as
    /// replays of a captured CUDA graph instead of calls issued back to back.
    pub graph: bool,
    /// `RSHMEM_BENCH_COLL_OPS`: the CUDA collectives timed (names such as `all_reduce`);
    /// empty: all.
    pub coll_ops: Vec<String>,
    /// `RSHMEM_BENCH_NVRTC_OPTS`: extra NVRTC options of the point-to-point benchmark kernels
    /// (space separated), to measure the device header's compile-time variants.
    pub nvrtc_options: Vec<String>,
    /// `RSHMEM_BENCH_BLOCKS_PER_SM` (default 8): blocks per SM of the device put/get kernels.
    pub blocks_per_sm: usize,
    /// `RSHMEM_BENCH_BULK_BLOCKS_PER_SM` (default 2): the same for the bulk (TMA) copies.
    pub bulk_blocks_per_sm: usize,
    /// `RSHMEM_BENCH_THREADS` (default 512, at most 1024): threads per block of the device
    /// put/get kernels.
    pub threads: usize,
    /// `RSHMEM_BENCH_CHUNK` (default 64 KiB, a multiple of 16; 0: one contiguous share per
    /// block): the device put/get blocks take pieces of this many bytes in turn.
    pub chunk: usize,
    /// `RSHMEM_BENCH_BULK_CHUNK` (default 64 KiB): the same for the bulk copies (a multiple of
    /// the 8 KiB bulk stage).
    pub bulk_chunk: usize,
    /// `RSHMEM_EP_BREAKDOWN` set: the CUDA MoE benchmark also prints per-kernel times (events
    /// between launches) and, with `-DEP_STAMPS=1` MoE kernels, the last replay's clock stamps.
    pub ep_breakdown: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            graph: false,
            coll_ops: Vec::new(),
            nvrtc_options: Vec::new(),
            blocks_per_sm: 8,
            bulk_blocks_per_sm: 2,
            threads: 512,
            chunk: 64 << 10,
            bulk_chunk: 64 << 10,
            ep_breakdown: false,
        }
    }
}

impl Settings {
    /// Reads the variables (unset ones keep the defaults). A malformed piece size is an error
    /// naming the variable; the block and thread counts fall back to their defaults when they
    /// are not positive integers, as they always did.
    pub fn from_env() -> Result<Settings> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        let d = Settings::default();
        let count = |k: &str, def: usize| {
            var(k)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&v| v > 0)
                .unwrap_or(def)
        };
        let chunk = |k: &str, def: usize| -> Result<usize> {
            let v = match var(k).filter(|v| !v.trim().is_empty()) {
                None => def,
                Some(v) => rshmem::config::parse_size(&v).ok_or_else(|| {
                    Error::InvalidArgument(format!("{k}={v:?}: expected a size like 256K"))
                })?,
            };
            if !v.is_multiple_of(16) {
                return Err(Error::InvalidArgument(format!(
                    "{k}={v}: must be a multiple of 16"
                )));
            }
            Ok(v)
        };
        Ok(Settings {
            graph: var("RSHMEM_BENCH_GRAPH").is_some_and(|v| v == "1"),
            coll_ops: var("RSHMEM_BENCH_COLL_OPS")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(str::to_string)
                .collect(),
            nvrtc_options: var("RSHMEM_BENCH_NVRTC_OPTS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            blocks_per_sm: count("RSHMEM_BENCH_BLOCKS_PER_SM", d.blocks_per_sm),
            bulk_blocks_per_sm: count("RSHMEM_BENCH_BULK_BLOCKS_PER_SM", d.bulk_blocks_per_sm),
            threads: count("RSHMEM_BENCH_THREADS", d.threads).min(1024),
            chunk: chunk("RSHMEM_BENCH_CHUNK", d.chunk)?,
            bulk_chunk: chunk("RSHMEM_BENCH_BULK_CHUNK", d.bulk_chunk)?,
            ep_breakdown: var("RSHMEM_EP_BREAKDOWN").is_some(),
        })
    }

    /// Whether the CUDA collective benchmark times collective `name`.
    pub fn times_coll(&self, name: &str) -> bool {
        self.coll_ops.is_empty() || self.coll_ops.iter().any(|o| o == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Settings> {
        Settings::from_vars(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn empty_environment_gives_the_defaults() {
        assert_eq!(from(&[]).unwrap(), Settings::default());
    }

    #[test]
    fn variables_are_read() {
        let s = from(&[
            ("RSHMEM_BENCH_GRAPH", "1"),
            ("RSHMEM_BENCH_COLL_OPS", "all_reduce, broadcast,"),
            ("RSHMEM_BENCH_NVRTC_OPTS", "-DA=1  -DB=2"),
            ("RSHMEM_BENCH_BLOCKS_PER_SM", "4"),
            ("RSHMEM_BENCH_BULK_BLOCKS_PER_SM", "0"),
            ("RSHMEM_BENCH_THREADS", "4096"),
            ("RSHMEM_BENCH_CHUNK", "0"),
            ("RSHMEM_BENCH_BULK_CHUNK", "1M"),
            ("RSHMEM_EP_BREAKDOWN", ""),
        ])
        .unwrap();
        assert!(s.graph && s.ep_breakdown);
        assert_eq!(s.coll_ops, ["all_reduce", "broadcast"]);
        assert!(s.times_coll("broadcast") && !s.times_coll("all_gather"));
        assert_eq!(s.nvrtc_options, ["-DA=1", "-DB=2"]);
        assert_eq!(
            (s.blocks_per_sm, s.bulk_blocks_per_sm, s.threads),
            (4, 2, 1024)
        );
        assert_eq!((s.chunk, s.bulk_chunk), (0, 1 << 20));
        assert!(from(&[("RSHMEM_BENCH_GRAPH", "yes")])
            .unwrap()
            .times_coll("x"));
        assert!(!from(&[("RSHMEM_BENCH_GRAPH", "yes")]).unwrap().graph);
    }

    #[test]
    fn bad_piece_sizes_name_the_variable() {
        let e = from(&[("RSHMEM_BENCH_CHUNK", "100")]).unwrap_err();
        assert!(e.to_string().contains("RSHMEM_BENCH_CHUNK=100"), "{e}");
        let e = from(&[("RSHMEM_BENCH_BULK_CHUNK", "lots")]).unwrap_err();
        assert!(e.to_string().contains("RSHMEM_BENCH_BULK_CHUNK"), "{e}");
    }
}
