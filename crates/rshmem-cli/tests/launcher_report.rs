//! `rshmem run` says who died and how, exits with the first failure's code, and takes its
//! processes with it when it is killed itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn rshmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rshmem"))
}

/// The launcher's report line (its stderr line starting with `rshmem run: `).
fn report(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.starts_with("rshmem run: "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn false_says_which_pe_exited_with_status_1() {
    let out = rshmem()
        .args(["run", "-n", "4", "--", "false"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let r = report(&out.stderr);
    assert!(
        r.starts_with("rshmem run: PE 0 exited with status 1 (first failure); then ")
            && (1..4).all(|p| r.contains(&format!("PE {p} exited with status 1"))),
        "{r:?}"
    );
    assert_eq!(r.lines().count(), 1, "one line: {r:?}");
}

#[test]
fn a_killed_pe_is_named_with_its_signal_and_sets_the_code() {
    // PE 2 is killed; the others exit with 4 as a survivor that saw the loss would. Every run
    // reports the kill, and exits with 128 + 9.
    for _ in 0..3 {
        let out = rshmem()
            .args(["run", "-n", "4", "--", "sh", "-c"])
            .arg("if [ $RSHMEM_RANK = 2 ]; then kill -9 $$; fi; sleep 0.3; exit 4")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(137), "{out:?}");
        let r = report(&out.stderr);
        assert!(
            r.starts_with("rshmem run: PE 2 was killed by SIGKILL (first failure); then ")
                && [0, 1, 3]
                    .iter()
                    .all(|p| r.contains(&format!("PE {p} exited with status 4"))),
            "{r:?}"
        );
    }
    // Mixed mode names the process and its PEs.
    let out = rshmem()
        .args(["run", "-n", "4", "-t", "2", "--", "sh", "-c"])
        .arg("if [ $RSHMEM_RANK = 2 ]; then kill -SEGV $$; fi; exit 0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 11), "{out:?}");
    assert_eq!(
        report(&out.stderr),
        "rshmem run: process 1 (PEs 2-3) was killed by SIGSEGV (first failure)"
    );
    let ok = rshmem()
        .args(["run", "-n", "2", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(report(&ok.stderr), "", "nothing to report");
}

fn alive(pid: i32) -> bool {
    // A zombie (ended, not yet reaped by whoever adopted it) counts as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn read_pids(dir: &Path, n: usize) -> Option<Vec<i32>> {
    (0..n)
        .map(|r| {
            std::fs::read_to_string(dir.join(format!("pid.{r}")))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn pes_that_ignore_sigterm_die_with_a_killed_launcher() {
    let dir: PathBuf = std::env::temp_dir().join(format!("rshmem-orphans-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut launcher = rshmem()
        .args(["run", "-n", "3", "--", "sh", "-c"])
        .arg("trap '' TERM; echo $$ > \"$PIDS/pid.$RSHMEM_RANK.tmp\"; mv \"$PIDS/pid.$RSHMEM_RANK.tmp\" \"$PIDS/pid.$RSHMEM_RANK\"; exec sleep 120")
        .env("PIDS", &dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let pids = loop {
        if let Some(p) = read_pids(&dir, 3) {
            break p;
        }
        assert!(Instant::now() < deadline, "the PEs never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    launcher.kill().unwrap(); // SIGKILL
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        // SAFETY: plain kill of a process this test started (through the launcher).
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "PEs {left:?} outlived their launcher");
}
