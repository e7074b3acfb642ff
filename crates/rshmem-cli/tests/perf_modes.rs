//! `rshmem perf` beyond thread mode: process and mixed worlds (started through the launcher),
//! the collectives, MoE dispatch/combine, and the CUDA backend's absence. Only the records'
//! shape and the consistency of their fields are checked, never timings.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn rshmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rshmem"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rshmem-cli-modes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `rshmem perf ARGS --json FILE` (shm backend) and returns the records.
fn perf(args: &[&str], name: &str) -> Vec<Value> {
    let json = tmp(name);
    let out = rshmem()
        .args(["perf", "--backend", "shm"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perf {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    for r in &recs {
        let (t, b, ratio) = (
            r["time_us"].as_f64().unwrap(),
            r["baseline_time_us"].as_f64().unwrap(),
            r["ratio"].as_f64().unwrap(),
        );
        assert!(t > 0.0 && b > 0.0, "{r}");
        assert!((ratio - b / t).abs() <= 1e-9 * ratio.abs().max(1.0), "{r}");
        assert!(r["iters"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["backend"], "shm");
    }
    recs
}

fn ops(recs: &[Value]) -> Vec<(String, u64, u64)> {
    recs.iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap().to_string(),
                r["pes"].as_u64().unwrap(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn owned(v: &[(&str, u64, u64)]) -> Vec<(String, u64, u64)> {
    v.iter().map(|&(o, p, b)| (o.to_string(), p, b)).collect()
}

#[test]
fn process_mode_records() {
    let recs = perf(
        &[
            "--mode",
            "processes",
            "--suites",
            "p2p",
            "--ops",
            "put,get,put-signal,barrier",
            "--max-size",
            "4K",
            "--barrier-pes",
            "2,1,3",
        ],
        "proc.json",
    );
    assert_eq!(
        ops(&recs),
        owned(&[
            ("put", 2, 8),
            ("put", 2, 64),
            ("put", 2, 512),
            ("put", 2, 4096),
            ("get", 2, 8),
            ("get", 2, 64),
            ("get", 2, 512),
            ("get", 2, 4096),
            ("put_signal", 2, 8),
            ("barrier", 2, 0),
            ("barrier", 1, 0),
            ("barrier", 3, 0),
        ])
    );
    for r in &recs {
        assert_eq!(r["mode"], "processes", "{r}");
        assert_eq!(r["api"], "host");
        let base = if r["op"] == "put" || r["op"] == "get" {
            "memcpy"
        } else {
            "raw_pingpong"
        };
        assert_eq!(r["baseline"], base, "{r}");
        if base == "raw_pingpong" && r["pes"] != 1 {
            // Measured between the two processes over a shared mapping, in the same run.
            assert!(
                r["note"].as_str().unwrap().contains("shared mapping"),
                "{r}"
            );
        }
    }
}

#[test]
fn mixed_mode_records_with_collectives() {
    let recs = perf(
        &[
            "--mode",
            "mixed",
            "--suites",
            "p2p,coll",
            "--ops",
            "put,put-signal,fetch-add,barrier",
            "--max-size",
            "4K",
        ],
        "mixed.json",
    );
    let mut want = vec![
        ("put", 4, 8),
        ("put", 4, 64),
        ("put", 4, 512),
        ("put", 4, 4096),
        ("put_signal", 4, 8),
        ("fetch_add", 4, 8),
        ("barrier", 4, 0),
    ];
    for c in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
    ] {
        want.push((c, 4, 4096));
    }
    assert_eq!(ops(&recs), owned(&want));
    for r in &recs {
        assert_eq!(r["mode"], "mixed", "{r}");
    }
    // PE 0 pairs with the first PE of the other process.
    let ps = recs.iter().find(|r| r["op"] == "put_signal").unwrap();
    assert!(
        ps["note"].as_str().unwrap().contains("PE 0 <-> PE 2"),
        "{ps}"
    );
}

#[test]
fn collectives_have_nccl_tests_figures() {
    let recs = perf(
        &["--mode", "threads", "--coll", "--max-size", "64K"],
        "coll.json",
    );
    let kinds = [
        ("all_reduce", 1.0),
        ("all_gather", 0.5),
        ("reduce_scatter", 0.5),
        ("all_to_all", 0.5),
        ("broadcast", 1.0),
    ];
    let mut want = Vec::new();
    for (k, _) in kinds {
        want.push((k, 2, 4096));
        want.push((k, 2, 65536));
    }
    assert_eq!(ops(&recs), owned(&want));
    for r in &recs {
        assert_eq!(r["mode"], "threads");
        assert_eq!(r["baseline"], "memcpy");
        let (t, b, g, bus) = (
            r["time_us"].as_f64().unwrap(),
            r["bytes"].as_f64().unwrap(),
            r["gbps"].as_f64().unwrap(),
            r["busbw_gbps"].as_f64().unwrap(),
        );
        let f = kinds.iter().find(|(k, _)| r["op"] == *k).unwrap().1;
        assert!((g - b / (t * 1e3)).abs() <= 1e-9 * g, "{r}");
        assert!((bus - g * f).abs() <= 1e-9 * g, "{r}");
    }
}

#[test]
fn ep_rows_and_bad_ep_arguments() {
    let recs = perf(
        &[
            "--mode",
            "threads",
            "--ep",
            "--ep-tokens",
            "32",
            "--ep-hidden",
            "64",
            "--ep-topk",
            "2",
            "--ep-experts",
            "8",
            "--ep-iters",
            "2",
        ],
        "ep.json",
    );
    let rows: Vec<(&str, &str)> = recs
        .iter()
        .map(|r| (r["op"].as_str().unwrap(), r["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rows,
        [
            ("ep_dispatch", "threads"),
            ("ep_combine", "threads"),
            ("ep_dispatch", "threads+tokens"),
            ("ep_combine", "threads+tokens"),
        ]
    );
    for r in &recs {
        assert_eq!(r["pes"].as_u64(), Some(2));
        assert_eq!(r["baseline"], "all_to_all_v");
        // 32 tokens of 64 bf16 with random routing over 2 PEs: some rows cross.
        let b = r["bytes"].as_u64().unwrap();
        assert!(b > 0 && b <= 32 * 2 * 64 * 2, "{r}");
        assert!(r["note"].as_str().unwrap().contains("T=32 H=64 k=2 E=8"));
    }
    let out = rshmem()
        .args(["perf", "--backend", "shm", "--mode", "threads", "--ep"])
        .args(["--ep-experts", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ep-experts 3"));
}

#[test]
fn cuda_backend_absent_is_a_clear_error() {
    if rshmem::cuda::info().is_ok_and(|i| !i.gpus.is_empty()) {
        eprintln!("a GPU is present: nothing to check here");
        return;
    }
    let out = rshmem()
        .args(["perf", "--backend", "cuda"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CUDA backend not available: "), "{err}");
    assert!(out.stdout.is_empty());
    let info = rshmem().arg("info").output().unwrap();
    assert!(info.status.success());
    assert!(String::from_utf8_lossy(&info.stdout).contains("cuda  not available: "));
}

#[test]
fn cuda_ep_flags_and_absent_gpu_are_clear_errors() {
    // Bad MoE flags are reported before looking for a GPU.
    let out = rshmem()
        .args(["perf", "--backend", "cuda", "--ep", "--ep-experts", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ep-experts 3"));
    let out = rshmem()
        .args(["perf", "--backend", "cuda", "--ep", "--ep-tokens", "128,0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ep-tokens"));
    // The shm backend takes one token count.
    let out = rshmem()
        .args(["perf", "--backend", "shm", "--mode", "threads", "--ep"])
        .args(["--ep-tokens", "32,64"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("one token count"));
    if rshmem::cuda::info().is_ok_and(|i| !i.gpus.is_empty()) {
        eprintln!("a GPU is present: the no-GPU error is not checked here");
        return;
    }
    for quick in [&["--quick"][..], &["--full", "--ep-iters", "1"][..]] {
        let out = rshmem()
            .args(["perf", "--backend", "cuda", "--ep"])
            .args(quick)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("CUDA backend not available: "), "{err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn worker_refuses_to_run_by_hand() {
    for spec in ["{}", "not json"] {
        let out = rshmem().args(["perf-worker", spec]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{spec}");
    }
}
