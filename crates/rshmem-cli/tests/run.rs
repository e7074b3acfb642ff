//! `rshmem run` as a user runs it: exit codes, prefixes, signals, time limit.

use std::process::Command;
use std::time::{Duration, Instant};

fn rshmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rshmem"))
}

#[test]
fn forwards_first_nonzero_exit_code_and_prefixes_output() {
    let out = rshmem()
        .args(["run", "-n", "3", "--prefix", "--grace", "5", "--"])
        .args(["sh", "-c", "echo rank=$RSHMEM_RANK size=$RSHMEM_WORLD_SIZE; [ $RSHMEM_RANK = 1 ] && exit 7; exit 0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let s = String::from_utf8_lossy(&out.stdout);
    for r in 0..3 {
        assert!(s.contains(&format!("[pe {r}] rank={r} size=3")), "{s}");
    }
    let ok = rshmem()
        .args(["run", "-n", "2", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(ok.code(), Some(0));
}

#[test]
fn mixed_mode_environment() {
    let out = rshmem()
        .args(["run", "-n", "4", "--threads-per-proc", "2", "--"])
        .args([
            "sh",
            "-c",
            "echo $RSHMEM_RANK/$RSHMEM_THREADS/$RSHMEM_LOCAL_RANK",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, vec!["0/2/0", "2/2/1"]);
}

/// Bad `run` arguments: exit code 2, a message naming the problem, and nothing started.
#[test]
fn bad_run_arguments() {
    for (args, names) in [
        (&["-n", "3", "-t", "2"][..], "3 PEs cannot be split"),
        (&["-n", "0"], "0 PEs"),
        (&["-n", "x"], "'x'"),
        (&["-n", "2", "--timeout", "-1"], "--timeout -1"),
        (&["-n", "2", "--grace", "abc"], "'abc'"),
    ] {
        let out = rshmem()
            .arg("run")
            .args(args)
            .args(["--", "sh", "-c", "echo started"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(names),
            "{args:?}: stderr lacks {names:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: a process was started");
    }
    let out = rshmem().args(["run", "-n", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no command");
    assert!(String::from_utf8_lossy(&out.stderr).contains("<COMMAND>"));
    let out = rshmem()
        .args(["run", "-n", "2", "--", "/nonexistent/rshmem-test-cmd"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Refused before anything runs (the launcher's spawn error): exit code 2, as for bad
    // arguments, not some other failure's code.
    assert_eq!(
        out.status.code(),
        Some(2),
        "a command that does not exist: {err}"
    );
    assert!(err.contains("/nonexistent/rshmem-test-cmd"), "{err}");
}

#[test]
fn stops_the_others_when_one_dies() {
    let t0 = Instant::now();
    let st = rshmem()
        .args(["run", "-n", "3", "--grace", "0.2", "--"])
        .args([
            "sh",
            "-c",
            "[ $RSHMEM_RANK = 2 ] && kill -9 $$; exec sleep 30",
        ])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(128 + 9));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn time_limit() {
    let t0 = Instant::now();
    let st = rshmem()
        .args([
            "run",
            "-n",
            "2",
            "--timeout",
            "0.5",
            "--grace",
            "0.2",
            "--",
            "sleep",
            "30",
        ])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(124));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn forwards_sigterm_and_sigint() {
    for (sig, name) in [(libc_sigterm(), "TERM"), (libc_sigint(), "INT")] {
        let dir =
            std::env::temp_dir().join(format!("rshmem-run-sig-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Each process records the signal it got, then exits 0.
        let script = format!(
            "trap 'echo got > {}/$RSHMEM_RANK; exit 0' {name}; touch {}/ready$RSHMEM_RANK; while :; do sleep 0.05; done",
            dir.display(),
            dir.display()
        );
        let mut child = rshmem()
            .args(["run", "-n", "2", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !(dir.join("ready0").exists() && dir.join("ready1").exists()) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "processes never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(0), "signal {name}");
        assert!(
            dir.join("0").exists() && dir.join("1").exists(),
            "signal {name} reached both processes"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn libc_sigterm() -> i32 {
    15
}
fn libc_sigint() -> i32 {
    2
}

#[test]
fn huge_durations_are_errors_not_panics() {
    // Duration::from_secs_f64 panics above u64::MAX seconds: the flags were only checked for
    // being finite and non-negative.
    for flag in ["--timeout", "--grace"] {
        let out = rshmem()
            .args(["run", "-n", "1", flag, "1e30", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(flag) && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn output_held_open_by_a_leftover_process_does_not_hang_the_launcher() {
    // With --prefix the launcher forwards each process's output through a pipe; a process the
    // job left behind (here a background sleep) holds that pipe open after the job's processes
    // ended, and the launcher once waited for it forever. The test kills it afterwards.
    let dir = std::env::temp_dir().join(format!("rshmem-run-orphan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile = dir.join("pid");
    let script = format!("sleep 1000 & echo $! > {}; echo done", pidfile.display());
    let out = rshmem()
        .args(["run", "-n", "1", "--prefix", "--grace", "0.2", "--"])
        .args(["sh", "-c", &script])
        .output()
        .unwrap();
    if let Ok(pid) = std::fs::read_to_string(&pidfile) {
        let _ = Command::new("kill").arg(pid.trim()).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[pe 0] done"),
        "{out:?}"
    );
}
