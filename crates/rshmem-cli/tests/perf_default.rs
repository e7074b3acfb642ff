//! `rshmem perf` as most people run it: the default groups (MoE included), the line that says
//! what the ratio is, no progress bar in logs, and flags a backend cannot honour refused before
//! anything runs.

use serde_json::Value;
use std::process::Command;

const RATIO_LINE: &str = "ratio = baseline time / rshmem time (above 1: rshmem is faster)";

fn rshmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rshmem"))
}

#[test]
fn default_run_has_every_group_and_says_what_the_ratio_is() {
    let dir = std::env::temp_dir().join(format!("rshmem-cli-default-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("default.json");
    // No group flag: the default groups, at their default sizes (threads only, to stay short).
    let out = rshmem()
        .args([
            "perf",
            "--backend",
            "shm",
            "--mode",
            "threads",
            "--markdown",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("groups p2p,coll,ep"), "{err}");
    // stderr is a pipe here: no progress bar (it redraws its line with \r).
    assert!(!err.contains('\r'), "{err:?}");

    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&RATIO_LINE), "{stdout}");
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.starts_with("op ") && l.ends_with("ratio")),
        "{stdout}"
    );
    // The Markdown table says it too, just above its header.
    let md = lines
        .iter()
        .position(|l| l.starts_with("| op |"))
        .expect("markdown table");
    assert_eq!(lines[md - 2..md], [RATIO_LINE, ""], "{stdout}");
    assert_eq!(stdout.matches(RATIO_LINE).count(), 2, "{stdout}");

    let recs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let has = |op: &str| recs.iter().any(|r| r["op"] == op);
    for op in ["put", "barrier", "all_reduce", "ep_dispatch", "ep_combine"] {
        assert!(has(op), "{op} missing from the default run");
    }
    let ep: Vec<&Value> = recs
        .iter()
        .filter(|r| r["op"].as_str().is_some_and(|o| o.starts_with("ep_")))
        .collect();
    assert_eq!(ep.len(), 4, "dispatch and combine, both layouts");
    for r in ep {
        assert_eq!(
            (&r["backend"], &r["pes"], &r["baseline"]),
            (
                &Value::from("shm"),
                &Value::from(2),
                &Value::from("all_to_all_v")
            ),
            "{r}"
        );
        // The quick suite's MoE shape (shm defaults).
        assert!(
            r["note"].as_str().unwrap().contains("T=64 H=1024 k=4 E=16"),
            "{r}"
        );
        assert!(r["time_us"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// Runs `rshmem perf ARGS`, expects exit status 1 with nothing on stdout, returns stderr.
fn refused(args: &[&str]) -> String {
    let out = rshmem().arg("perf").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "perf {args:?}: {err}");
    assert!(out.stdout.is_empty(), "perf {args:?} printed a table");
    err
}

#[test]
fn cuda_in_processes_mode_is_an_error_before_cuda_is_touched() {
    for mode in ["processes", "mixed", "all"] {
        let err = refused(&["--backend", "cuda", "--mode", mode]);
        assert!(
            err.contains(&format!(
                "--mode {mode}: the cuda backend runs its PEs as threads"
            )),
            "{err}"
        );
        // Refused for the flag, GPU or not: CUDA was not looked for.
        assert!(!err.contains("CUDA backend not available"), "{err}");
    }
    if rshmem::cuda::info().is_ok_and(|i| !i.gpus.is_empty()) {
        return;
    }
    // Thread-PEs are what CUDA runs: that flag passes the check and only the absent GPU stops it.
    let err = refused(&["--backend", "cuda", "--mode", "threads"]);
    assert!(err.contains("CUDA backend not available"), "{err}");
}

#[test]
fn flags_a_backend_cannot_honour_are_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--backend", "cuda", "--ops", "put"],
            "--ops: the cuda backend",
        ),
        (
            &["--backend", "cuda", "--barrier-pes", "3"],
            "--barrier-pes: the cuda backend",
        ),
        (
            &["--backend", "cuda", "--max-size", "1K"],
            "--max-size 1 KiB: the cuda backend",
        ),
        (
            &["--backend", "shm", "--gpus", "2"],
            "--gpus 2: the shm backend",
        ),
        (&["--backend", "shm", "--pairs"], "--pairs: the shm backend"),
        (
            &["--backend", "shm", "--mode", "mixed", "--barrier-pes", "3"],
            "--barrier-pes: the shm backend times the barrier of --mode mixed",
        ),
        // Flags of a group the run leaves out, on any backend.
        (
            &["--backend", "shm", "--coll", "--ep-tokens", "8"],
            "--ep-tokens sets the MoE (ep) group",
        ),
        (
            &["--backend", "cuda", "--suites", "coll", "--ep-hidden", "8"],
            "--ep-hidden sets the MoE (ep) group",
        ),
        (
            &["--backend", "shm", "--coll", "--ops", "put"],
            "--ops sets the p2p group",
        ),
        (
            &["--backend", "cuda", "--ep", "--pairs"],
            "--pairs sets the p2p group",
        ),
        (
            &["--backend", "shm", "--ep", "--max-size", "1M"],
            "--max-size 1 MiB: it sizes the p2p, coll and fabric groups",
        ),
        (
            &["--backend", "shm", "--ops", "put", "--barrier-pes", "3"],
            "--barrier-pes sets the barrier figures, which --ops leaves out",
        ),
        (
            &["--backend", "shm", "--barrier-pes", "0,2"],
            "--barrier-pes 0",
        ),
        (&["--backend", "shm", "--ep-iters", "0"], "--ep-iters 0"),
    ];
    for (args, want) in cases {
        let err = refused(args);
        assert!(err.contains(want), "perf {args:?}: {err}");
        assert!(!err.contains("CUDA backend not available"), "{err}");
    }
    // Where auto falls back to shm, the CUDA-only flags are refused as well.
    if !rshmem::cuda::info().is_ok_and(|i| i.gpus.len() >= 2) {
        let err = refused(&["--gpus", "2"]);
        assert!(
            err.contains("--gpus 2: the shm backend (picked by --backend auto)"),
            "{err}"
        );
    }
}
