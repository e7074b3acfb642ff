//! Start-up and shutdown of a world: bootstrap exchanges, segments, peer mappings, backend.

use crate::backend::{shm::ShmBackend, Backend};
use crate::bootstrap::{agree, random_u64, Bootstrap};
use crate::config::{BackendKind, Config};
use crate::control::{self, Ctrl, CtrlLayout};
use crate::error::{Error, Result};
use crate::heap::HeapAllocator;
use crate::nbi::CompletionQueue;
use crate::segment::{world_segment_name, Region};
use crate::team::Team;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long the monitor's read of a peer's header over the fabric may take before the peer is
/// taken as lost (at most the configured timeout).
pub(crate) const HEADER_PROBE: Duration = Duration::from_secs(3);

/// Protocol version checked at start-up; PEs of different versions refuse to form a world.
pub const PROTOCOL_VERSION: u64 = 5;

/// How the PEs of a world are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every PE is a thread of one process.
    Threads,
    /// One PE per process.
    Processes,
    /// Several processes with several thread-PEs each.
    Mixed,
}

impl Mode {
    /// Name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Threads => "threads",
            Mode::Processes => "processes",
            Mode::Mixed => "mixed",
        }
    }
}

/// Where a peer lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerInfo {
    pub pid: u32,
    pub same_process: bool,
    /// The peer's pid names it in this PE's PID namespace, so that its liveness can be read
    /// from it (a peer in another container's namespace: only its state word and timeouts).
    pub pid_visible: bool,
}

/// This process's identity in the start-up records: a random number drawn once. Pids are no
/// identity: processes in different PID namespaces (containers sharing /dev/shm) can have the
/// same one, both pid 1 say.
fn process_nonce() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| random_u64() | 1)
}

/// Identity of this process's PID namespace (0 when unknown, and under Miri: thread-PEs only).
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    if cfg!(miri) {
        return 0;
    }
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Each PE's process as seen from PE `me`, and the world's mode, from every PE's pid, process
/// nonce and PID namespace (by world index).
pub(crate) fn process_map(
    me: usize,
    pids: &[u32],
    nonces: &[u64],
    namespaces: &[u64],
) -> (Vec<PeerInfo>, Mode) {
    let peers = (0..pids.len())
        .map(|p| PeerInfo {
            pid: pids[p],
            same_process: nonces[p] == nonces[me],
            pid_visible: namespaces[p] == namespaces[me]
                || namespaces[p] == 0
                || namespaces[me] == 0,
        })
        .collect();
    let mut distinct = nonces.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let mode = if distinct.len() == 1 {
        Mode::Threads
    } else if distinct.len() == pids.len() {
        Mode::Processes
    } else {
        Mode::Mixed
    };
    (peers, mode)
}

/// The node this PE runs on, as a number: a hash of `name` (the configured node name) or of
/// the host name.
fn node_id(name: Option<&str>) -> u64 {
    let name = match name {
        Some(n) => n.to_string(),
        None => hostname(),
    };
    // FNV-1a: stable across processes and builds (std's hasher is seeded per process).
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// This machine's host name (empty when it cannot be read: all PEs then share one node).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it on success.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Two PEs of different processes with the same pid (different PID namespaces), if any: the
/// CUDA backend tells its same-process peers by pid.
fn pid_collision(pids: &[u32], nonces: &[u64]) -> Option<(usize, usize)> {
    (0..pids.len()).find_map(|b| {
        (0..b)
            .find(|&a| pids[a] == pids[b] && nonces[a] != nonces[b])
            .map(|a| (a, b))
    })
}

/// Where a PE of the world runs: an entry of the world's placement map
/// ([`Pe::placement`](crate::Pe::placement)). PE `p * T + t` is thread `t` of process `p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The PE's world index.
    pub pe: usize,
    /// Index of its process in the job (0 in thread mode).
    pub process: usize,
    /// Index of its thread within the process (0 in process mode).
    pub thread: usize,
    /// Node-local PE index, the device ordinal under the one-device-per-PE convention.
    pub device: usize,
    /// Operating-system id of its process.
    pub pid: u32,
    /// Index of its node among the job's nodes, in order of their lowest PE (nodes are told
    /// apart by [`Config::node`](crate::Config::node), the host name by default). PEs of one
    /// node share memory; PEs of different nodes use the fabric.
    pub node: usize,
}

/// The state of one PE: its view of the world.
pub(crate) struct PeInner {
    pub me: usize,
    pub n: usize,
    pub job: u64,
    pub mode: Mode,
    pub config: Config,
    pub layout: CtrlLayout,
    pub ctrls: Vec<Ctrl>,
    pub peers: Vec<PeerInfo>,
    pub backend: Box<dyn Backend>,
    pub heap: Mutex<HeapAllocator>,
    pub world_seq: AtomicU64,
    /// Per team slot: the slot's barrier epoch (above the low `pe::OP_BITS` bits) and, while a
    /// thread of this PE is inside a barrier or exchange of the slot's team, that operation's
    /// code (the low bits; 0: none). Taken and released by `pe::Held`.
    pub team_epochs: Vec<AtomicU64>,
    /// The code of the operation (alloc, free, team split or destroy) a thread of this PE is
    /// running through the exchange area (0: none). Taken and released by `pe::Held`.
    pub exch_busy: AtomicU64,
    pub team_used: Mutex<Vec<bool>>,
    /// Per team slot: advanced when a team gets the slot and when it is destroyed, so a copy
    /// of a destroyed team (`Team::tracked_copy`) is refused ([`Team::generation`]).
    pub team_gens: Vec<AtomicU64>,
    pub cq: CompletionQueue,
    pub next_op: AtomicU64,
    pub finalized: AtomicBool,
    pub bootstrap: Box<dyn Bootstrap>,
    pub world_team: Team,
    pub placements: Vec<Placement>,
    /// Per peer: set (by the monitor, or on a failed state word) once the peer is known lost.
    pub lost: Vec<AtomicBool>,
    /// Set together with any `lost` flag: an O(1) check for quiet.
    pub any_lost: AtomicBool,
    /// 1 + the first PE found lost (0: none yet).
    pub first_lost: AtomicU64,
    /// Set once a barrier or collective of this PE ended in a timeout or a lost peer: the
    /// world cannot complete a barrier any more, so finalize waits only a short grace.
    pub faulted: AtomicBool,
    /// 1 + the PE the latest timeout of this PE named (0: none): the cause this PE publishes
    /// when it ends without having seen a loss.
    pub blamed: AtomicU64,
    /// The fabric, when the world spans nodes: control words of peers on other nodes go
    /// through it (their `ctrls` entry is a local copy of their header, kept by the monitor).
    pub net: Option<Arc<crate::transport::fabric::Net>>,
    _regions: Vec<Arc<Region>>,
}

impl std::fmt::Debug for PeInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pe")
            .field("me", &self.me)
            .field("n", &self.n)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Drop for PeInner {
    fn drop(&mut self) {
        if !self.finalized.load(Ordering::Acquire) {
            // Ending without finalize: peers waiting on this PE learn it is lost.
            self.record_cause();
            self.ctrls[self.me]
                .word(control::W_STATE)
                .store(control::STATE_FAILED, Ordering::Release);
        }
    }
}

/// Liveness of a peer as seen from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    Alive,
    Finalized,
    Lost,
}

fn process_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A zombie (exited, not yet reaped) still answers kill.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => r == 0,
    }
}

impl PeInner {
    /// A fabric failure on a control word of `pe`: the peer is taken as lost, which every
    /// wait reports as [`Error::PeerLost`] naming it.
    fn fabric_failed(&self, pe: usize, e: &Error) {
        tracing::warn!(pe = self.me, peer = pe, %e, "fabric operation on a peer's control block failed");
        // A peer of another node that cannot be reached may have ended because of an earlier
        // loss that its header (read over the fabric, so possibly stale) does not show yet,
        // while a PE of this node, whose header is read directly, already published it: that
        // loss is the root cause, and every PE of this node then names the same PE.
        if self.root_cause(pe) == pe {
            if let Some(r) = self.cause_seen_on_this_node(pe) {
                self.mark_lost(r);
            }
        }
        self.mark_lost(pe);
    }

    /// The root cause (not a timeout, neither `not` nor this PE) that a PE of this node
    /// published, if any.
    fn cause_seen_on_this_node(&self, not: usize) -> Option<usize> {
        let net = self.net.as_deref()?;
        (0..self.n)
            .filter(|&q| q != self.me && !net.is_remote(q))
            .find_map(|q| {
                let w = self.ctrls[q].word(control::W_CAUSE).load(Ordering::Acquire);
                if w == 0 || w & control::CAUSE_TIMEOUT != 0 {
                    return None;
                }
                let (r, timed_out) = self.root_cause_of(q);
                (r != q && r != not && r != self.me && !timed_out).then_some(r)
            })
    }

    /// Whether control words of PE `pe` are reached over the fabric, which is left alone once
    /// a peer is lost: no barrier can complete any more, and a provider may block (in a
    /// connect to a peer that is going away) where this PE must report the loss instead.
    fn via_fabric(&self, pe: usize) -> Option<&crate::transport::fabric::Net> {
        self.net.as_deref().filter(|n| n.is_remote(pe))
    }

    /// Adds `v` to control word `w` of PE `pe` (acquire-release).
    pub fn ctrl_add(&self, pe: usize, w: usize, v: u64) {
        match self.via_fabric(pe) {
            Some(_) if self.any_lost.load(Ordering::Acquire) => {}
            Some(net) => {
                net.count_ctrl();
                if let Err(e) = net.ctrl_atomic(pe, w, crate::backend::AtomicOp::FetchAdd(v)) {
                    self.fabric_failed(pe, &e);
                }
            }
            _ => {
                self.ctrls[pe].word(w).fetch_add(v, Ordering::AcqRel);
            }
        }
    }

    /// Control word `w` of PE `pe` (acquire); 0 when the fabric failed (the peer is then lost).
    pub fn ctrl_load(&self, pe: usize, w: usize) -> u64 {
        match self.via_fabric(pe) {
            Some(_) if self.any_lost.load(Ordering::Acquire) => 0,
            Some(net) => {
                net.count_ctrl();
                match net.ctrl_atomic(pe, w, crate::backend::AtomicOp::Fetch) {
                    Ok(v) => v,
                    Err(e) => {
                        self.fabric_failed(pe, &e);
                        0
                    }
                }
            }
            _ => self.ctrls[pe].word(w).load(Ordering::Acquire),
        }
    }

    /// `n` control words of PE `pe` from `w` on.
    pub fn ctrl_read(&self, pe: usize, w: usize, n: usize) -> Result<Vec<u64>> {
        match self.via_fabric(pe) {
            Some(_) if self.any_lost.load(Ordering::Acquire) => Err(Error::PeerLost {
                pe: self.first_lost().unwrap_or(pe),
                op: "exchange",
            }),
            Some(net) => {
                net.count_ctrl();
                net.ctrl_read(pe, w, n, self.config.timeout)
                    .inspect_err(|e| self.fabric_failed(pe, e))
            }
            _ => Ok((0..n)
                .map(|i| self.ctrls[pe].word(w + i).load(Ordering::Relaxed))
                .collect()),
        }
    }

    /// Copies the header words (state, cause) of every peer on another node into this PE's
    /// local copy of its control block. A peer the fabric cannot reach any more is lost
    /// (unless it had finalized), and so is one whose header read does not complete within
    /// [`HEADER_PROBE`]: a provider may retry a dead peer's connection for ever.
    pub(crate) fn refresh_remote_headers(&self) {
        let Some(net) = &self.net else { return };
        if self.any_lost.load(Ordering::Acquire) {
            return;
        }
        for pe in (0..self.n).filter(|&p| net.is_remote(p)) {
            let shadow = self.ctrls[pe].word(control::W_STATE);
            if self.lost[pe].load(Ordering::Relaxed)
                || shadow.load(Ordering::Acquire) == control::STATE_FINALIZED
            {
                continue;
            }
            match net.ctrl_read(
                pe,
                control::W_STATE,
                2,
                self.config.timeout.min(HEADER_PROBE),
            ) {
                Ok(w) => {
                    self.ctrls[pe]
                        .word(control::W_CAUSE)
                        .store(w[1], Ordering::Release);
                    shadow.store(w[0], Ordering::Release);
                }
                Err(e) => self.fabric_failed(pe, &e),
            }
        }
    }

    pub fn liveness(&self, pe: usize) -> Liveness {
        match self.ctrls[pe]
            .word(control::W_STATE)
            .load(Ordering::Acquire)
        {
            control::STATE_FINALIZED => return Liveness::Finalized,
            control::STATE_FAILED => return Liveness::Lost,
            _ => {}
        }
        if self.lost[pe].load(Ordering::Acquire) {
            return Liveness::Lost;
        }
        Liveness::Alive
    }

    /// The cheap check of blocking operations: `PeerLost` once the monitor marked `pe` lost.
    #[inline]
    pub fn check_peer(&self, pe: usize, op: &'static str) -> Result<()> {
        if self.any_lost.load(Ordering::Relaxed) && self.lost[pe].load(Ordering::Acquire) {
            return Err(Error::PeerLost {
                pe: self.root_cause(pe),
                op,
            });
        }
        Ok(())
    }

    /// Publishes, before this PE ends, the lost peer it had seen (if any; else the peer its
    /// latest timeout named, flagged as such), so that peers blame that PE rather than this one.
    pub fn record_cause(&self) {
        let cause = match self.first_lost.load(Ordering::Acquire) {
            0 => match self.blamed.load(Ordering::Acquire) {
                0 => 0,
                b => b | control::CAUSE_TIMEOUT,
            },
            c => c,
        };
        if cause != 0 {
            self.ctrls[self.me]
                .word(control::W_CAUSE)
                .store(cause, Ordering::Release);
        }
    }

    /// The PE whose loss made `pe` end: follows the causes the ended PEs published, up to a PE
    /// that ended (or died) on its own. The flag is true when the last cause was a timeout
    /// (that PE was missing, not known dead).
    pub fn root_cause_of(&self, pe: usize) -> (usize, bool) {
        let mut p = pe;
        let mut timed_out = false;
        for _ in 0..self.n {
            let w = self.ctrls[p].word(control::W_CAUSE).load(Ordering::Acquire);
            let c = (w & !control::CAUSE_TIMEOUT) as usize;
            if c == 0 || c - 1 == p || c > self.n {
                break;
            }
            timed_out = w & control::CAUSE_TIMEOUT != 0;
            if c - 1 == self.me {
                // It gave up on this PE (late, not dead): `p` is as far as the chain goes.
                break;
            }
            p = c - 1;
        }
        (p, timed_out)
    }

    /// [`PeInner::root_cause_of`] without the flag.
    pub fn root_cause(&self, pe: usize) -> usize {
        self.root_cause_of(pe).0
    }

    /// Notes that a timeout of this PE named `pe` (see [`PeInner::record_cause`]).
    pub fn blame(&self, pe: usize) {
        self.blamed.store(pe as u64 + 1, Ordering::Release);
    }

    /// `PeerLost` naming the first lost peer, if any (quiet).
    pub fn check_all_peers(&self, op: &'static str) -> Result<()> {
        if self.any_lost.load(Ordering::Acquire) {
            if let Some(pe) = self.first_lost() {
                return Err(Error::PeerLost { pe, op });
            }
        }
        Ok(())
    }

    /// A peer in another process that crashed: gone (or a zombie) while its state still says
    /// alive (a PE that ends without finalize marks itself failed on the way out).
    fn find_dead_process(&self) -> Option<usize> {
        (0..self.n).find(|&p| {
            let info = self.peers[p];
            p != self.me
                && !info.same_process
                && info.pid_visible
                && self.ctrls[p].word(control::W_STATE).load(Ordering::Acquire)
                    == control::STATE_ALIVE
                && !process_alive(info.pid)
        })
    }

    /// The first PE this PE found lost, if any.
    pub fn first_lost(&self) -> Option<usize> {
        match self.first_lost.load(Ordering::Acquire) {
            0 => None,
            p => Some(p as usize - 1),
        }
    }

    fn mark_lost(&self, pe: usize) {
        let (root, timed_out) = self.root_cause_of(pe);
        if root != pe
            && root != self.me
            && !timed_out
            && !self.lost[root].swap(true, Ordering::AcqRel)
        {
            tracing::warn!(
                pe = self.me,
                lost = root,
                "peer lost (seen through PE {pe})"
            );
        }
        let _ = self.first_lost.compare_exchange(
            0,
            root as u64 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if let Some(net) = &self.net {
            net.mark_lost(pe);
        }
        if !self.lost[pe].swap(true, Ordering::AcqRel) {
            tracing::warn!(
                pe = self.me,
                lost = pe,
                pid = self.peers[pe].pid,
                "peer lost"
            );
        }
        self.any_lost.store(true, Ordering::Release);
    }

    /// Spins until `cond` holds, backing off to yields; checks the deadline and the liveness of
    /// `watch` (one PE, or every PE when `None`) every few milliseconds. `strict` treats a
    /// finalized peer as lost (it can no longer take part in a barrier).
    pub fn wait_for(
        &self,
        op: &'static str,
        timeout: Duration,
        mut cond: impl FnMut() -> bool,
        mut watch: impl FnMut() -> Option<usize>,
        strict: bool,
    ) -> Result<()> {
        if cond() {
            return Ok(());
        }
        let start = Instant::now();
        let mut next_check = Duration::from_millis(2);
        let mut i: u32 = 0;
        loop {
            if cond() {
                return Ok(());
            }
            // A PE waiting for a peer of another node drives the fabric's progress itself
            // (incoming writes and atomics move only while someone reads the completion
            // queue), rather than waiting for the progress thread's next turn.
            if let Some(net) = &self.net {
                net.progress();
            }
            i = i.wrapping_add(1);
            if i < 128 {
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            if !i.is_multiple_of(64) {
                continue;
            }
            let el = start.elapsed();
            if el < next_check {
                continue;
            }
            next_check = el + Duration::from_millis(5);
            let w = watch();
            let lost = |pe: usize| match self.liveness(pe) {
                Liveness::Lost => true,
                Liveness::Finalized => strict,
                Liveness::Alive => false,
            };
            let any_lost = || {
                (0..self.n)
                    .filter(|&p| p != self.me)
                    .find(|&p| self.liveness(p) == Liveness::Lost)
            };
            // Waiting on one PE that is alive but itself stuck on a lost PE (a barrier round
            // after a failed one) would end in a timeout: any lost PE ends the wait. The PE
            // reported is the first one found lost (peers that end after noticing the loss are
            // lost too, later).
            let first = self.first_lost();
            let mut dead = match w {
                Some(pe) => first.or_else(|| lost(pe).then_some(pe)).or_else(any_lost),
                None => first.or_else(any_lost),
            };
            // A PE that ended without finalize after noticing a crash is not the cause: if the
            // monitor has not flagged anything yet, look for a crashed process directly.
            if let (None, Some(d)) = (first, dead) {
                if self.ctrls[d].word(control::W_STATE).load(Ordering::Acquire)
                    == control::STATE_FAILED
                {
                    dead = self.find_dead_process().or(dead);
                }
            }
            if let Some(pe) = dead {
                if self.liveness(pe) == Liveness::Lost {
                    self.mark_lost(pe);
                }
            }
            if let Some(pe) = dead {
                if cond() {
                    return Ok(());
                }
                self.faulted.store(true, Ordering::Release);
                // A peer that ended after giving up on a missing one (maybe this one, late):
                // that one is at fault, and it was missing, not known dead.
                return Err(match self.root_cause_of(pe) {
                    (root, true) => Error::Timeout {
                        op,
                        pe: Some(root),
                        after: el,
                    },
                    (root, _) => Error::PeerLost { pe: root, op },
                });
            }
            if el >= timeout {
                if strict {
                    self.faulted.store(true, Ordering::Release);
                }
                if let Some(p) = w {
                    self.blame(p);
                }
                return Err(Error::Timeout {
                    op,
                    pe: w,
                    after: el,
                });
            }
        }
    }
}

/// A process-local registry so that peers in the same process find each other's regions
/// (direct pointers, no shared-memory mapping).
type Registry = Mutex<HashMap<(u64, usize), Weak<Region>>>;
fn registry() -> &'static Registry {
    static R: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
}

fn enc(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
fn dec(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

pub(crate) fn init(config: Config, boot: Box<dyn Bootstrap>) -> Result<Arc<PeInner>> {
    let checked = config.validate();
    agree(boot.as_ref(), checked, "configuration")?;
    let me = boot.rank();
    let n = boot.size();
    let pid = std::process::id();
    let loc = boot.locality();
    let job_mine = if me == 0 { random_u64() } else { 0 };
    let backend_id = match config.backend {
        BackendKind::Shm => 1,
        BackendKind::Cuda => 2,
    };
    let rec = [
        PROTOCOL_VERSION,
        config.heap_size as u64,
        config.max_teams as u64,
        backend_id,
        pid as u64,
        job_mine,
        loc.process as u64,
        loc.thread as u64,
        loc.device as u64,
        loc.job.unwrap_or(0),
        process_nonce(),
        pid_namespace(),
        node_id(config.node.as_deref()),
    ];
    let all: Vec<Vec<u64>> = boot.allgather(&enc(&rec))?.iter().map(|b| dec(b)).collect();
    let names = ["protocol version", "heap size", "max teams", "backend"];
    for (pe, r) in all.iter().enumerate() {
        if r.len() != rec.len() {
            return Err(Error::Bootstrap {
                pe: Some(pe),
                msg: "malformed start-up record (version mismatch?)".into(),
            });
        }
        for (k, name) in names.iter().enumerate() {
            if r[k] != all[0][k] {
                return Err(Error::Bootstrap {
                    pe: Some(pe),
                    msg: format!(
                        "{name} differs: PE {pe} has {}, PE 0 has {}",
                        r[k], all[0][k]
                    ),
                });
            }
        }
    }
    let job = all[0][5];
    // Segment names carry the launcher's job id when there is one (so that it can remove what
    // a crash leaves behind), and this world's id (several worlds of a job never collide).
    let seg_job = match all[0][9] {
        0 => job,
        j => j,
    };
    let pids: Vec<u32> = all.iter().map(|r| r[4] as u32).collect();
    let placements: Vec<Placement> = all
        .iter()
        .enumerate()
        .map(|(pe, r)| Placement {
            pe,
            process: r[6] as usize,
            thread: r[7] as usize,
            device: r[8] as usize,
            pid: r[4] as u32,
            node: 0,
        })
        .collect();
    // Nodes in order of their lowest PE.
    let node_ids: Vec<u64> = all.iter().map(|r| r[12]).collect();
    let mut distinct_nodes: Vec<u64> = Vec::new();
    let mut placements = placements;
    for (pe, id) in node_ids.iter().enumerate() {
        let idx = distinct_nodes
            .iter()
            .position(|d| d == id)
            .unwrap_or_else(|| {
                distinct_nodes.push(*id);
                distinct_nodes.len() - 1
            });
        placements[pe].node = idx;
    }
    let remote: Vec<bool> = node_ids.iter().map(|id| *id != node_ids[me]).collect();
    let multi_node = distinct_nodes.len() > 1;
    let nonces: Vec<u64> = all.iter().map(|r| r[10]).collect();
    let namespaces: Vec<u64> = all.iter().map(|r| r[11]).collect();
    let (mut peers, mode) = process_map(me, &pids, &nonces, &namespaces);
    for (p, info) in peers.iter_mut().enumerate() {
        if remote[p] {
            // A pid of another node means nothing here: liveness comes from the fabric.
            info.pid_visible = false;
            info.same_process = false;
        }
    }
    if config.backend == BackendKind::Cuda {
        if let Some((a, b)) = pid_collision(&pids, &nonces) {
            return Err(Error::Bootstrap {
                pe: Some(b),
                msg: format!(
                    "PEs {a} and {b} run in different processes with the same pid {} (different PID namespaces): the CUDA backend needs the processes of a job in one PID namespace (e.g. docker --pid=host)",
                    pids[b]
                ),
            });
        }
    }
    let layout = CtrlLayout::new(n, config.max_teams);
    let ctrl_bytes = layout.bytes();
    let heap_in_segment = config.backend == BackendKind::Shm;
    let seg_len = ctrl_bytes
        + if heap_in_segment {
            config.heap_size.div_ceil(4096) * 4096
        } else if multi_node {
            // GPU heaps of other nodes are reached through this registered staging area.
            crate::transport::fabric::staging_bytes(n)
        } else {
            0
        };

    // My segment: anonymous when the whole world is in this process, POSIX shm otherwise.
    let mine = if mode == Mode::Threads {
        Region::anonymous(seg_len)
    } else {
        Region::create_shm(&world_segment_name(seg_job, job, me), seg_len)
    }
    .map(Arc::new);
    if let Ok(r) = &mine {
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((job, me), Arc::downgrade(r));
    }
    // Leaves the registry on every path out of start-up, errors included.
    struct Unregister(u64, usize);
    impl Drop for Unregister {
        fn drop(&mut self) {
            registry()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(self.0, self.1));
        }
    }
    let unregister = Unregister(job, me);
    let mine_res = mine.as_ref().map(|_| ()).map_err(|e| e.clone());
    agree(boot.as_ref(), mine_res, "creating the heap segment")?;
    let mine = mine?;

    // Map peers: same process → the region itself; other process → its shm segment.
    let mut regions = Vec::with_capacity(n);
    let mut err = Ok(());
    for (pe, info) in peers.iter().enumerate() {
        let r = if pe == me {
            Ok(mine.clone())
        } else if remote[pe] {
            // Another node: a local copy of its control block's header (see `net`).
            Region::anonymous(ctrl_bytes).map(Arc::new)
        } else if info.same_process {
            registry()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(job, pe))
                .and_then(Weak::upgrade)
                .ok_or_else(|| Error::Bootstrap {
                    pe: Some(pe),
                    msg: "same-process peer's region not found".into(),
                })
        } else {
            Region::open_shm(&world_segment_name(seg_job, job, pe), seg_len).map(Arc::new)
        };
        match r {
            Ok(r) => regions.push(r),
            Err(e) => {
                err = Err(e);
                break;
            }
        }
    }
    agree(boot.as_ref(), err, "mapping peer segments")?;
    // Everyone has mapped everything: names are no longer needed.
    mine.unlink();
    drop(unregister);

    // SAFETY: each region is at least ctrl_bytes long, page aligned, and kept alive in `regions`.
    let ctrls: Vec<Ctrl> = regions
        .iter()
        .map(|r| unsafe { Ctrl::new(r.ptr(), layout.words) })
        .collect();
    let c = &ctrls[me];
    c.word(control::W_MAGIC)
        .store(control::MAGIC, Ordering::Relaxed);
    c.word(control::W_PID).store(pid as u64, Ordering::Relaxed);
    c.word(control::W_STATE)
        .store(control::STATE_ALIVE, Ordering::Release);

    let net = if multi_node {
        let fc = crate::transport::fabric::FabricConfig {
            provider: config.fabric_provider.clone(),
            domain: config.fabric_domain.clone(),
            timeout: config.timeout,
            hmem: config.backend == BackendKind::Cuda && config.fabric_hmem,
        };
        // SAFETY: this PE's segment stays mapped as long as `regions` (kept by PeInner, which
        // also holds the Net).
        let net = unsafe {
            crate::transport::fabric::Net::open(
                &fc,
                boot.as_ref(),
                mine.ptr(),
                seg_len,
                ctrl_bytes,
                remote.clone(),
            )
        }?;
        tracing::debug!(
            pe = me,
            provider = net.provider(),
            nodes = distinct_nodes.len(),
            "fabric up"
        );
        Some(Arc::new(net))
    } else {
        None
    };
    let backend: Box<dyn Backend> = match config.backend {
        BackendKind::Shm => {
            // SAFETY: the heap follows the control block inside each region of this node;
            // peers of other nodes are never reached through a base (null here).
            let bases = regions
                .iter()
                .enumerate()
                .map(|(p, r)| {
                    if remote[p] {
                        std::ptr::null_mut()
                    } else {
                        unsafe { r.ptr().add(ctrl_bytes) }
                    }
                })
                .collect();
            let shm = Box::new(ShmBackend::new(bases, regions.clone()));
            match &net {
                Some(net) => Box::new(crate::transport::fabric::FabricBackend::new(
                    shm,
                    net.clone(),
                )),
                None => shm,
            }
        }
        BackendKind::Cuda => {
            let cuda = crate::backend::cuda::CudaBackend::create(
                &config,
                me,
                n,
                &pids,
                &remote,
                boot.as_ref(),
            )?;
            match &net {
                // SAFETY: the staging area follows the control block in this PE's segment,
                // registered with `net` and mapped as long as `regions` (kept by PeInner,
                // which drops the backend first).
                Some(net) => Box::new(unsafe {
                    crate::transport::fabric::gpu_backend(
                        cuda,
                        net.clone(),
                        boot.as_ref(),
                        mine.ptr().add(ctrl_bytes),
                        ctrl_bytes,
                        config.timeout,
                    )
                }?),
                None => Box::new(cuda),
            }
        }
    };
    let mut team_used = vec![false; config.max_teams];
    team_used[0] = true;
    let inner = PeInner {
        me,
        n,
        job,
        mode,
        layout,
        ctrls,
        peers,
        backend,
        heap: Mutex::new(HeapAllocator::new(config.heap_size)),
        world_seq: AtomicU64::new(0),
        team_epochs: (0..config.max_teams).map(|_| AtomicU64::new(0)).collect(),
        exch_busy: AtomicU64::new(0),
        team_used: Mutex::new(team_used),
        team_gens: (0..config.max_teams).map(|_| AtomicU64::new(0)).collect(),
        cq: CompletionQueue::new(config.completion_queue),
        next_op: AtomicU64::new(1),
        finalized: AtomicBool::new(false),
        world_team: Team::world(job, me, n),
        lost: (0..n).map(|_| AtomicBool::new(false)).collect(),
        any_lost: AtomicBool::new(false),
        first_lost: AtomicU64::new(0),
        faulted: AtomicBool::new(false),
        blamed: AtomicU64::new(0),
        net,
        placements,
        config,
        bootstrap: boot,
        _regions: regions,
    };
    // Nobody may touch a peer's control block before it is initialised.
    inner.bootstrap.barrier()?;
    tracing::debug!(
        pe = me,
        n,
        ?mode,
        job = format_args!("{job:016x}"),
        "rshmem world up"
    );
    inner.refresh_remote_headers();
    let inner = Arc::new(inner);
    if mode != Mode::Threads || inner.net.is_some() {
        monitor::watch(&inner);
    }
    Ok(inner)
}

mod monitor;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_told_apart_by_nonce_not_pid() {
        // Two containers, each PE pid 1 of its own PID namespace: two processes.
        let (peers, mode) = process_map(0, &[1, 1], &[11, 23], &[7, 8]);
        assert_eq!(mode, Mode::Processes);
        assert!(peers[0].same_process && !peers[1].same_process);
        assert!(
            !peers[1].pid_visible,
            "a pid of another namespace says nothing here"
        );
        assert_eq!(pid_collision(&[1, 1], &[11, 23]), Some((0, 1)));
        // Mixed mode in one namespace: 2 processes of 2 threads.
        let (peers, mode) = process_map(3, &[5, 5, 9, 9], &[1, 1, 3, 3], &[7; 4]);
        assert_eq!(mode, Mode::Mixed);
        let same: Vec<bool> = peers.iter().map(|p| p.same_process).collect();
        assert_eq!(same, [false, false, true, true]);
        assert!(peers.iter().all(|p| p.pid_visible));
        assert_eq!(pid_collision(&[5, 5, 9, 9], &[1, 1, 3, 3]), None);
        // Threads of one process; an unknown namespace (0) is trusted.
        let (peers, mode) = process_map(1, &[4, 4], &[2, 2], &[0, 7]);
        assert_eq!(mode, Mode::Threads);
        assert!(peers.iter().all(|p| p.same_process && p.pid_visible));
    }
}
