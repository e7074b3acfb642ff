//! `rshmem info`: backends found, defaults, environment variables.

use rshmem::Config;

/// Variables read outside [`rshmem::config::ENV_VARS`]: thread-mode world size, the
/// collectives, and the benchmark knobs of the CUDA suite.
const MORE_VARS: &[(&str, &str)] = &[
    (
        "RSHMEM_PES",
        "PEs of a thread-mode world started by rshmem::launch without a launcher",
    ),
    (
        "RSHMEM_BENCH_NVRTC_OPTS",
        "perf, CUDA: extra NVRTC options of the benchmark kernels",
    ),
    (
        "RSHMEM_BENCH_BLOCKS_PER_SM",
        "perf, CUDA: blocks per SM of the device copies, default 8",
    ),
    (
        "RSHMEM_BENCH_THREADS",
        "perf, CUDA: threads per block of the device copies, default 512",
    ),
    (
        "RSHMEM_BENCH_GRAPH",
        "perf, CUDA collectives: 1 times both sides as replays of a captured graph",
    ),
    (
        "RSHMEM_BENCH_BULK_BLOCKS_PER_SM",
        "perf, CUDA: blocks per SM of the bulk copies, default 2",
    ),
    (
        "RSHMEM_BENCH_CHUNK",
        "perf, CUDA: device put/get in pieces of this many bytes taken by the blocks in turn (a multiple of 16), default 64K (0: a contiguous share per block)",
    ),
    (
        "RSHMEM_BENCH_BULK_CHUNK",
        "perf, CUDA: the same for the bulk copies (a multiple of the 8 KiB bulk stage), default 64K",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_BYTES",
        "CUDA collectives: largest all_reduce and broadcast of the LL paths (no barrier waits), default 512K (less when their area would pass 1/16 of the heap; 0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_FUSED_BYTES",
        "CUDA collectives: largest message of the fused single-kernel path, default 64K",
    ),
    (
        "RSHMEM_CUDA_COLL_NET_CHUNK_BYTES",
        "CUDA collectives on teams spanning nodes: bytes per round across nodes and per scratch half (2 x PEs x this of the heap), default 512K",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_A2A_BYTES",
        "CUDA collectives: largest per-member traffic of the LL all_to_all, all_gather and reduce_scatter, default 1M (less when the LL area would pass 1/16 of the heap; 0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_ALL_REDUCE_BYTES",
        "CUDA collectives: largest out-of-place all_reduce of the pull path (beyond the LL size), default every size on two-member teams, 8M on larger ones (sets both; 0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES",
        "CUDA collectives: smallest pull all_reduce of a two-member team that moves its data by stores (each member into the other's dst), default 256M (0 = never)",
    ),
    (
        "RSHMEM_CUDA_COLL_TWO_SHOT_PULL_BYTES",
        "CUDA collectives: smallest out-of-place all_reduce that runs the pull path two-shot (each member folds one part and stores it into every member's dst), default 1 = every pull size on teams of more than two, never on pairs (sets both; 0 = never)",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_RS_BYTES",
        "CUDA collectives: largest out-of-place reduce_scatter input of the pull path (beyond the LL size; each member folds its part of the members' inputs read in place), default 8M (0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_PUSH_A2A_BYTES",
        "CUDA collectives: smallest pull all_to_all or all_gather (all shares) whose members store their shares into the others' dst instead of reading them, default 1 = every pull size (0 = never)",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_BLOCKS",
        "CUDA collectives: most blocks of the LL all_reduce kernel (measurement knob), default 128",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_A2A_BLOCKS",
        "CUDA collectives: most blocks of the LL data kernel (measurement knob; an all_to_all of more than two lines per thread on them takes up to twice as many), default 64",
    ),
    (
        "RSHMEM_CUDA_COLL_EARLY_LAUNCH",
        "CUDA collectives: 0 = the LL kernels let the next kernel launch only at their end, even where a PE has its GPU to itself (measurement knob), default 1",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_THREADS",
        "CUDA collectives: threads per block of the LL kernels (measurement knob, a multiple of 32 up to what every LL kernel launches with, 384 on H200), default 256",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_CTRL_LINES",
        "CUDA collectives: most lines of an LL all_reduce on several blocks that runs a control warp per block (measurement knob, 0 = never), default 2048",
    ),
    (
        "RSHMEM_CUDA_COLL_LL_THREAD_LINES",
        "CUDA collectives: data lines per thread the LL all_reduce grid is sized for (measurement knob, 1 to 4), default 1",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_BLOCKS",
        "CUDA collectives: most blocks of the pull kernels (measurement knob), default 128",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_BLOCK_BYTES",
        "CUDA collectives: bytes per block of the pull all_to_all and broadcast (measurement knob), default 64K",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_AR_BLOCK_BYTES",
        "CUDA collectives: bytes per block of the pull all_reduce (measurement knob), default 32K",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_BCAST_BYTES",
        "CUDA collectives: largest broadcast of the pull path (beyond the LL size), default every size (0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_CHAIN_BCAST_BYTES",
        "CUDA collectives: pull broadcasts past this size on teams of more than two run along a chain (each member reads from the one before it), default 1M",
    ),
    (
        "RSHMEM_CUDA_COLL_PULL_A2A_BYTES",
        "CUDA collectives: largest out-of-place all_to_all (and all_gather output) of the pull path (beyond the LL size), default every size (0 = off)",
    ),
    (
        "RSHMEM_CUDA_COLL_NVRTC_OPTS",
        "CUDA collectives: extra NVRTC options of their module (measurement switches)",
    ),
    (
        "RSHMEM_EP_COMBINE_TOKENS",
        "CUDA MoE: how combine_tokens moves rows, auto (pull from 8 MiB per PE pair, else push), push or pull; alike on every PE",
    ),
    (
        "RSHMEM_EP_SPLIT_COMBINE",
        "CUDA MoE: 1 (default) = the expert-major combine in one kernel (half the SMs put, half sum as rows arrive) where every PE has its GPU alone; 0 = three kernels; alike on every PE",
    ),
    (
        "RSHMEM_EP_READBACK_SYNC",
        "CUDA MoE (measurement): 1 = normal-mode dispatch synchronises its stream before reading the counts (default 0: waits for the readback kernel's last word)",
    ),
    (
        "RSHMEM_EP_SEND_THREADS",
        "CUDA MoE (measurement): ep_send's threads per block, 64-512 in steps of 32 (default 128 expert-major, 512 token-major)",
    ),
    (
        "RSHMEM_EP_PSTREAM_THREADS",
        "CUDA MoE (measurement): ep_pstream's threads per block, 64-512 in steps of 32 (default 448; where ep_send's x 128 and its x 96 pass 65536 registers it no longer overlaps the send)",
    ),
    (
        "RSHMEM_EP_SEND_BLOCKS",
        "CUDA MoE (measurement): ep_send's blocks, at most the grid (default 0: the grid)",
    ),
    (
        "RSHMEM_EP_PSTREAM_BLOCKS",
        "CUDA MoE (measurement): ep_pstream's blocks (default 0: one fewer than the grid)",
    ),
    (
        "RSHMEM_CUDA_EP_NVRTC_OPTS",
        "CUDA MoE kernels: extra NVRTC options of their module (measurement switches, e.g. -DEP_STAMPS=1)",
    ),
    (
        "RSHMEM_BENCH_COLL_OPS",
        "perf, CUDA collectives: the ones to time, comma separated (default all)",
    ),
    (
        "RSHMEM_BENCH_COLL_SIZES",
        "perf, CUDA collectives: their sizes, comma separated (default 8,4K,64K,1M,16M,64M,256M,1G up to the largest)",
    ),
    (
        "RSHMEM_EP_BREAKDOWN",
        "perf, CUDA: set to also print per-kernel MoE dispatch/combine times",
    ),
];

fn yn(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The CUDA section: GPUs and their capabilities, or why CUDA is not available.
pub fn cuda_report() -> String {
    format_cuda(rshmem::cuda::info().map_err(|e| e.to_string()))
}

fn format_cuda(info: Result<rshmem::cuda::Info, String>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let i = match info {
        Ok(i) => i,
        Err(e) => {
            let _ = writeln!(s, "  cuda  not available: {e}");
            return s;
        }
    };
    if i.gpus.is_empty() {
        let _ = writeln!(
            s,
            "  cuda  not available: driver {}.{} present but no GPU found",
            i.driver_version / 1000,
            (i.driver_version % 1000) / 10
        );
        return s;
    }
    let _ = writeln!(
        s,
        "  cuda  available: driver {}.{}, {} GPU(s), NVRTC {}",
        i.driver_version / 1000,
        (i.driver_version % 1000) / 10,
        i.gpus.len(),
        if i.nvrtc {
            "loadable"
        } else {
            "missing (no device kernels)"
        }
    );
    for g in &i.gpus {
        let _ = writeln!(
            s,
            "        GPU {}: {}, compute {}.{}, {} SMs; VMM {}, POSIX-FD handles {}, 64-bit stream mem ops {}",
            g.ordinal,
            g.name,
            g.compute_capability.0,
            g.compute_capability.1,
            g.sms,
            yn(g.vmm),
            yn(g.posix_fd),
            yn(g.stream_mem_ops_64)
        );
    }
    for (title, m) in [
        ("peer access", &i.peer_access),
        ("native atomics", &i.native_atomics),
    ] {
        let _ = writeln!(s, "        {title} (row: from GPU, column: to GPU):");
        let _ = writeln!(
            s,
            "              {}",
            (0..m.len()).map(|j| format!("{j:>4}")).collect::<String>()
        );
        for (a, row) in m.iter().enumerate() {
            let cells: String = row
                .iter()
                .enumerate()
                .map(|(b, &v)| {
                    if a == b {
                        "   -".to_string()
                    } else {
                        format!("{:>4}", if v { "Y" } else { "N" })
                    }
                })
                .collect();
            let _ = writeln!(s, "          {a:>4}{cells}");
        }
    }
    s
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
    s.push_str(&cuda_report());
    let _ = match rshmem::transport::fabric::probe() {
        Ok(()) => writeln!(
            s,
            "  fabric available ({}: PEs on other nodes, RSHMEM_NODE / RSHMEM_FABRIC_PROVIDER)",
            rshmem::transport::fabric::LIBRARY
        ),
        Err(e) => writeln!(s, "  fabric not available: {e}"),
    };
    if let Ok(ps) = rshmem::transport::fabric::providers() {
        for (i, p) in ps.iter().enumerate() {
            let _ = writeln!(
                s,
                "    {:<16} domain {:<10} device memory (FI_HMEM): {}{}",
                p.name,
                p.domain,
                if p.hmem { "offered" } else { "no" },
                if i == 0 { "  (the default)" } else { "" }
            );
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
    let vars = rshmem::config::ENV_VARS
        .iter()
        .chain(MORE_VARS)
        .chain(rshmem::coll::ENV_VARS);
    for (name, what) in vars {
        let val = match std::env::var(name) {
            Ok(v) => format!("= {v:?}"),
            Err(std::env::VarError::NotPresent) => "(unset)".into(),
            Err(std::env::VarError::NotUnicode(_)) => "(not unicode)".into(),
        };
        let _ = writeln!(s, "  {name:<31} {val:<14} {what}");
    }
    s
}

#[cfg(test)]
mod tests {
    use rshmem::cuda::{GpuInfo, Info};

    #[test]
    fn cuda_section_lists_gpus_and_matrices() {
        let gpu = |ordinal, vmm| GpuInfo {
            ordinal,
            name: format!("GPU model {ordinal}"),
            compute_capability: (9, 0),
            sms: 132,
            vmm,
            posix_fd: true,
            stream_mem_ops_64: false,
        };
        let s = super::format_cuda(Ok(Info {
            driver_version: 13000,
            gpus: vec![gpu(0, true), gpu(1, false)],
            peer_access: vec![vec![false, true], vec![true, false]],
            native_atomics: vec![vec![false, false], vec![true, false]],
            nvrtc: true,
        }));
        assert!(s.contains("cuda  available: driver 13.0, 2 GPU(s), NVRTC loadable"));
        assert!(s.contains(
            "GPU 0: GPU model 0, compute 9.0, 132 SMs; VMM yes, POSIX-FD handles yes, 64-bit stream mem ops no"
        ));
        assert!(s.contains("GPU 1: GPU model 1") && s.contains("VMM no"));
        let lines: Vec<&str> = s.lines().collect();
        let at = |title: &str| lines.iter().position(|l| l.contains(title)).unwrap();
        let (pa, na) = (at("peer access"), at("native atomics"));
        assert_eq!(
            lines[pa + 2].split_whitespace().collect::<Vec<_>>(),
            ["0", "-", "Y"]
        );
        assert_eq!(
            lines[pa + 3].split_whitespace().collect::<Vec<_>>(),
            ["1", "Y", "-"]
        );
        assert_eq!(
            lines[na + 2].split_whitespace().collect::<Vec<_>>(),
            ["0", "-", "N"]
        );
        assert_eq!(
            lines[na + 3].split_whitespace().collect::<Vec<_>>(),
            ["1", "Y", "-"]
        );
        let none = super::format_cuda(Ok(Info {
            driver_version: 12040,
            gpus: vec![],
            peer_access: vec![],
            native_atomics: vec![],
            nvrtc: false,
        }));
        assert!(none.contains("not available: driver 12.4 present but no GPU found"));
        let err = super::format_cuda(Err("no driver".into()));
        assert_eq!(err, "  cuda  not available: no driver\n");
    }

    /// Every `RSHMEM_*` name the two crates' sources spell as a whole string literal (the
    /// variables they read) is listed by `rshmem info` and documented in the README (user
    /// settings) or in docs/tuning.md (tuning and measurement knobs), so neither falls behind
    /// the code.
    #[test]
    fn every_variable_read_is_listed_and_documented() {
        fn sources(dir: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    sources(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(std::fs::read_to_string(&p).unwrap());
                }
            }
        }
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut texts = Vec::new();
        sources(&crates.join("rshmem/src"), &mut texts);
        sources(&crates.join("rshmem-cli/src"), &mut texts);
        // Named by a test as a variable that no longer exists.
        let not_read = ["RSHMEM_MAX_PES"];
        let mut names = std::collections::BTreeSet::new();
        for t in &texts {
            for (i, _) in t.match_indices("\"RSHMEM_") {
                let rest = &t[i + 1..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..end];
                if rest[end..].starts_with('"') && !name.ends_with('_') && !not_read.contains(&name)
                {
                    names.insert(name.to_string());
                }
            }
        }
        assert!(names.len() >= 20, "found only {names:?}");
        let mut docs = std::fs::read_to_string(crates.join("../README.md")).unwrap();
        docs += &std::fs::read_to_string(crates.join("../docs/tuning.md")).unwrap();
        let report = super::report();
        for n in &names {
            assert!(
                report.contains(n.as_str()),
                "`rshmem info` does not list {n}"
            );
            assert!(
                docs.contains(n.as_str()),
                "neither README.md nor docs/tuning.md documents {n}"
            );
        }
    }

    #[test]
    fn lists_backends_defaults_and_every_variable() {
        let r = super::report();
        assert!(r.contains("shm   available"));
        assert!(r.contains("cuda  "));
        assert!(r.contains(&format!(
            "{} bytes per PE",
            rshmem::Config::default().heap_size
        )));
        for (name, _) in rshmem::config::ENV_VARS
            .iter()
            .chain(super::MORE_VARS)
            .chain(rshmem::coll::ENV_VARS)
        {
            assert!(r.contains(name), "{name} missing");
        }
    }
}
