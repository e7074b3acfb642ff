//! The per-process liveness monitor: one thread, started when a world with peers in other
//! processes comes up and ending (within 10 ms) when no such world is left. It waits on a pidfd
//! per peer process (readable the moment the process ends, zombie or reaped; /proc polling
//! where pidfds are missing), checks the peers' state words every 10 ms, and sets the `lost`
//! flags that every wait, barrier, quiet and blocking operation reads. A peer in another PID
//! namespace (its pid means nothing here) is watched through its state word only.

use super::{process_alive, PeInner};
use crate::control;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

const PERIOD: Duration = Duration::from_millis(10);

struct State {
    worlds: Vec<Weak<PeInner>>,
    running: bool,
}
static STATE: Mutex<State> = Mutex::new(State {
    worlds: Vec::new(),
    running: false,
});

pub(super) fn watch(w: &Arc<PeInner>) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    st.worlds.push(Arc::downgrade(w));
    if !st.running {
        let spawned = std::thread::Builder::new()
            .name("rshmem-monitor".into())
            .spawn(run);
        match spawned {
            Ok(_) => st.running = true,
            Err(e) => {
                tracing::warn!(%e, "cannot start the peer monitor; dead peers are found by timeouts only")
            }
        }
    }
}

/// A pidfd for `pid`: `Ok(Some)`, `Ok(None)` when pidfds are not available here (the
/// /proc check is used instead), `Err(())` when the process is already gone.
fn pidfd_open(pid: u32) -> Result<Option<OwnedFd>, ()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd >= 0 {
        // SAFETY: a fresh descriptor that nobody else owns.
        return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Err(()),
        _ => Ok(None),
    }
}

fn upgrade_all() -> Option<Vec<Arc<PeInner>>> {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    st.worlds.retain(|w| w.strong_count() > 0);
    let v: Vec<_> = st.worlds.iter().filter_map(Weak::upgrade).collect();
    if v.is_empty() {
        st.worlds.clear();
        st.running = false;
        return None;
    }
    Some(v)
}

/// Marks lost every watched PE that lives in one of `dead`, and the PEs whose state word
/// says they ended without finalize.
fn mark(worlds: &[Arc<PeInner>], dead: &HashSet<u32>) {
    for w in worlds {
        if w.finalized.load(Ordering::Acquire) {
            continue;
        }
        for pe in (0..w.n).filter(|&p| p != w.me) {
            if w.lost[pe].load(Ordering::Relaxed) {
                continue;
            }
            let lost = match w.ctrls[pe].word(control::W_STATE).load(Ordering::Acquire) {
                control::STATE_FINALIZED => false,
                control::STATE_FAILED => true,
                _ => {
                    let p = w.peers[pe];
                    !p.same_process && p.pid_visible && dead.contains(&p.pid)
                }
            };
            if lost {
                w.mark_lost(pe);
            }
        }
    }
}

/// Waits (at most PERIOD) on a pidfd per peer process: a pidfd becomes readable the moment
/// its process ends, so a death is seen at once. Where pidfds are not available the
/// process is checked through /proc every PERIOD. The worlds are not held while waiting.
fn run() {
    let mut fds: HashMap<u32, Option<OwnedFd>> = HashMap::new();
    // Processes known to have ended: never watched again.
    let mut gone: HashSet<u32> = HashSet::new();
    loop {
        let mut dead = HashSet::new();
        {
            let Some(worlds) = upgrade_all() else { return };
            // Peers on other nodes: their header words, read over the fabric.
            for w in worlds
                .iter()
                .filter(|w| !w.finalized.load(Ordering::Acquire))
            {
                w.refresh_remote_headers();
            }
            let mut want = HashSet::new();
            for w in &worlds {
                if w.finalized.load(Ordering::Acquire) {
                    continue;
                }
                for pe in (0..w.n).filter(|&p| p != w.me) {
                    let p = w.peers[pe];
                    let finalized = w.ctrls[pe].word(control::W_STATE).load(Ordering::Acquire)
                        == control::STATE_FINALIZED;
                    if !p.same_process
                        && p.pid_visible
                        && !finalized
                        && !w.lost[pe].load(Ordering::Relaxed)
                        && !gone.contains(&p.pid)
                    {
                        want.insert(p.pid);
                    }
                }
            }
            fds.retain(|pid, _| want.contains(pid));
            for &pid in &want {
                if let std::collections::hash_map::Entry::Vacant(e) = fds.entry(pid) {
                    match pidfd_open(pid) {
                        Ok(fd) => {
                            e.insert(fd);
                        }
                        Err(()) => {
                            dead.insert(pid);
                        }
                    }
                }
            }
            for (&pid, fd) in &fds {
                if fd.is_none() && !process_alive(pid) {
                    dead.insert(pid);
                }
            }
            mark(&worlds, &dead);
            gone.extend(dead.iter().copied());
        }
        let mut pids = Vec::new();
        let mut polls = Vec::new();
        for (&pid, fd) in &fds {
            if let Some(fd) = fd {
                pids.push(pid);
                polls.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        if polls.is_empty() {
            std::thread::sleep(PERIOD);
            continue;
        }
        // SAFETY: `polls` is a valid array of pollfd of the given length.
        let n = unsafe {
            libc::poll(
                polls.as_mut_ptr(),
                polls.len() as libc::nfds_t,
                PERIOD.as_millis() as libc::c_int,
            )
        };
        if n > 0 {
            dead.clear();
            for (pfd, pid) in polls.iter().zip(&pids) {
                if pfd.revents != 0 {
                    dead.insert(*pid);
                }
            }
            if let Some(worlds) = upgrade_all() {
                mark(&worlds, &dead);
            }
            for pid in &dead {
                fds.remove(pid);
            }
            gone.extend(dead.iter().copied());
        }
    }
}
