//! TCP bootstrap among processes: a star around rank 0.
//!
//! Rank 0 listens, either on an address given in the environment (`host:port`) or on one
//! encoded in a unique id made by [`unique_id`] in rank 0's process and passed to the other
//! ranks out of band (as `ncclGetUniqueId` does). Every other rank connects and sends a hello
//! with the protocol version, the world size, its rank, a job token and the PEs per rank; rank 0
//! checks them all and answers with a welcome or with an error that names the PE at fault, and
//! forwards any error to every connected rank, so that every rank fails with the same message.
//! Every read, write, accept and connect is bounded by the timeout: nothing waits forever (a
//! timeout too large for an `Instant`, such as `Duration::MAX`, means no deadline).
//!
//! Frames: one kind byte, a little-endian u32 length, the payload.

use super::{Bootstrap, Locality};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Version of the TCP bootstrap wire protocol (checked in the hello).
pub const TCP_PROTOCOL_VERSION: u64 = 1;
const MAGIC: u64 = 0x5253_484d_5443_5031; // "RSHMTCP1"
const UID_PREFIX: &str = "rshmem1:";
const K_DATA: u8 = 0;
const K_ERROR: u8 = 1;
const K_HELLO: u8 = 2;
const K_WELCOME: u8 = 3;
const MAX_FRAME: usize = 1 << 30;
/// Extra time a non-root rank waits for rank 0's answer, so that rank 0's own timeout (and the
/// error it forwards, naming the PE at fault) arrives first.
const LEAF_SLACK: Duration = Duration::from_millis(500);

/// Listeners bound by [`unique_id`] in this process, waiting for rank 0 to take them.
fn pending() -> &'static Mutex<HashMap<String, TcpListener>> {
    static P: OnceLock<Mutex<HashMap<String, TcpListener>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// Creates a unique id for a new job: binds an ephemeral port on 127.0.0.1 (kept open for rank
/// 0, which must run in this process) and returns `rshmem1:127.0.0.1:<port>:<token>`. Pass the
/// string to every rank (out of band) and give it to [`TcpBootstrap::connect`] or put it in
/// `RSHMEM_BOOTSTRAP`.
pub fn unique_id() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Bootstrap {
        pe: Some(0),
        msg: format!("cannot bind an ephemeral port on 127.0.0.1: {e}"),
    })?;
    let addr = l.local_addr().map_err(|e| Error::Bootstrap {
        pe: Some(0),
        msg: format!("local_addr: {e}"),
    })?;
    let token = crate::bootstrap::random_u64() | 1;
    let id = format!("{UID_PREFIX}{addr}:{token:016x}");
    pending()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.clone(), l);
    Ok(id)
}

/// Takes over a listening socket inherited from the launcher (`RSHMEM_BOOTSTRAP_FD`), so that
/// the port chosen by the launcher can never be taken by someone else before rank 0 listens.
/// Only once per process, and only if `fd` is a listening socket bound to `address`'s port.
pub(crate) fn adopt_inherited_listener(address: &str, fd: i32) {
    use std::os::fd::{FromRawFd, IntoRawFd};
    static ADOPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if ADOPTED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let Ok((addr, _)) = parse_address(address) else {
        return;
    };
    let Some(port) = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
    else {
        return;
    };
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt on an arbitrary fd number only reads its state (EBADF/ENOTSOCK if it
    // is not a socket); the out-parameters are valid.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            &mut listening as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    } == 0;
    if !ok || listening == 0 {
        return;
    }
    // SAFETY: fd is a listening socket (checked above) handed to this process to own.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    if l.local_addr().map(|a| a.port()).ok() != Some(port) {
        // Not ours: give the descriptor back untouched.
        let _ = l.into_raw_fd();
        return;
    }
    pending()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(address.to_string(), l);
}

/// Settings of one rank's TCP bootstrap endpoint.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// `host:port` of rank 0, or a unique id from [`unique_id`].
    pub address: String,
    /// This rank (process index).
    pub rank: usize,
    /// Number of ranks (processes).
    pub size: usize,
    /// Bound of every connect, accept and exchange.
    pub timeout: Duration,
    /// PEs per rank (threads per process in mixed mode); every rank must agree. Error messages
    /// name PE `rank * pes_per_rank`.
    pub pes_per_rank: usize,
    /// Job token; every rank must agree (0 when none; a unique id brings its own).
    pub token: u64,
    /// Wire protocol version sent in the hello (tests change it to check the refusal).
    pub protocol_version: u64,
    /// Where this endpoint's PE runs (used when the endpoint is a PE's bootstrap itself).
    pub locality: Locality,
}

impl TcpConfig {
    /// Settings for `rank` of `size` with rank 0 at `address`.
    pub fn new(address: impl Into<String>, rank: usize, size: usize, timeout: Duration) -> Self {
        TcpConfig {
            address: address.into(),
            rank,
            size,
            timeout,
            pes_per_rank: 1,
            token: 0,
            protocol_version: TCP_PROTOCOL_VERSION,
            locality: Locality {
                process: rank,
                thread: 0,
                device: rank,
                job: None,
            },
        }
    }
}

#[derive(Debug)]
enum Links {
    Root(Vec<Option<TcpStream>>),
    Leaf(TcpStream),
}

/// One rank's endpoint of a TCP bootstrap (see the module documentation). Implements
/// [`Bootstrap`] with rank = process rank, so it is a PE's bootstrap in process mode and the
/// inter-process level of the hierarchical bootstrap in mixed mode.
#[derive(Debug)]
pub struct TcpBootstrap {
    rank: usize,
    size: usize,
    timeout: Duration,
    pes_per_rank: usize,
    locality: Locality,
    links: Mutex<Links>,
    failed: Mutex<Option<Error>>,
}

fn be(pe: Option<usize>, msg: impl Into<String>) -> Error {
    Error::Bootstrap {
        pe,
        msg: msg.into(),
    }
}

/// `now + d`, or a point so far ahead that it is never reached when that is not representable
/// (a timeout of `Duration::MAX` means no deadline; `Instant + Duration` would panic).
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u32::MAX as u64)))
        .unwrap_or(now)
}

/// Writes one frame, bounded by `deadline` like every read: a peer that stops reading (its
/// socket buffer full) ends the write with a timeout instead of blocking forever.
fn write_frame(
    s: &mut TcpStream,
    kind: u8,
    payload: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    let mut b = Vec::with_capacity(5 + payload.len());
    b.push(kind);
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b)
}

fn read_frame(s: &mut TcpStream, deadline: Instant) -> std::io::Result<(u8, Vec<u8>)> {
    read_frame_max(s, deadline, MAX_FRAME)
}

fn read_frame_max(
    s: &mut TcpStream,
    deadline: Instant,
    max: usize,
) -> std::io::Result<(u8, Vec<u8>)> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    s.set_read_timeout(Some(left))?;
    let mut h = [0u8; 5];
    s.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if len > max {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "frame too long",
        ));
    }
    let mut p = vec![0u8; len];
    s.read_exact(&mut p)?;
    Ok((h[0], p))
}

fn error_payload(e: &Error) -> Vec<u8> {
    let (pe, msg) = match e {
        Error::Bootstrap { pe, msg } => (*pe, msg.clone()),
        other => (None, other.to_string()),
    };
    let mut b = pe.map_or(u64::MAX, |p| p as u64).to_le_bytes().to_vec();
    b.extend_from_slice(msg.as_bytes());
    b
}

fn error_from_payload(p: &[u8]) -> Error {
    if p.len() < 8 {
        return be(Some(0), "malformed error frame from PE 0");
    }
    let pe = u64::from_le_bytes(p[..8].try_into().unwrap_or([0xff; 8]));
    be(
        (pe != u64::MAX).then_some(pe as usize),
        String::from_utf8_lossy(&p[8..]).into_owned(),
    )
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Encodes a list of blobs (u32 count, then u32 length + bytes each).
pub(crate) fn encode_list(items: &[Vec<u8>]) -> Vec<u8> {
    let mut b = (items.len() as u32).to_le_bytes().to_vec();
    for i in items {
        b.extend_from_slice(&(i.len() as u32).to_le_bytes());
        b.extend_from_slice(i);
    }
    b
}

/// Inverse of [`encode_list`]; `None` when malformed.
pub(crate) fn decode_list(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let rd = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let n = rd(0)?;
    let mut at = 4;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = rd(at)?;
        at += 4;
        out.push(b.get(at..at.checked_add(len)?)?.to_vec());
        at += len;
    }
    (at == b.len()).then_some(out)
}

fn parse_address(a: &str) -> Result<(String, u64)> {
    let a = a.trim();
    if let Some(rest) = a.strip_prefix(UID_PREFIX) {
        let (addr, tok) = rest
            .rsplit_once(':')
            .ok_or_else(|| be(None, format!("malformed unique id {a:?}")))?;
        let token = u64::from_str_radix(tok, 16)
            .map_err(|_| be(None, format!("malformed token in unique id {a:?}")))?;
        Ok((addr.to_string(), token))
    } else {
        Ok((a.to_string(), 0))
    }
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| {
            be(
                None,
                format!("cannot resolve bootstrap address {addr:?}: {e}"),
            )
        })?
        .next()
        .ok_or_else(|| {
            be(
                None,
                format!("bootstrap address {addr:?} resolves to nothing"),
            )
        })
}

impl TcpBootstrap {
    /// The bound of each connect, accept and exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Joins the job as `rank` of `size` with rank 0 at `address` (`host:port` or unique id).
    pub fn connect(address: &str, rank: usize, size: usize, timeout: Duration) -> Result<Self> {
        Self::with_config(TcpConfig::new(address, rank, size, timeout))
    }

    /// Joins the job with explicit settings.
    pub fn with_config(c: TcpConfig) -> Result<Self> {
        if c.size == 0 || c.rank >= c.size {
            return Err(be(
                Some(c.rank),
                format!("rank {} is out of range for world size {}", c.rank, c.size),
            ));
        }
        if c.pes_per_rank == 0 {
            return Err(Error::invalid("pes_per_rank must be at least 1"));
        }
        let (addr, uid_token) = parse_address(&c.address)?;
        let token = if uid_token != 0 { uid_token } else { c.token };
        let deadline = after(Instant::now(), c.timeout);
        let links = if c.rank == 0 {
            Links::Root(Self::serve(&c, &addr, token, deadline)?)
        } else {
            Links::Leaf(Self::join(&c, &addr, token, deadline)?)
        };
        Ok(TcpBootstrap {
            rank: c.rank,
            size: c.size,
            timeout: c.timeout,
            pes_per_rank: c.pes_per_rank,
            locality: c.locality,
            links: Mutex::new(links),
            failed: Mutex::new(None),
        })
    }

    fn pe(c: &TcpConfig, rank: usize) -> usize {
        rank * c.pes_per_rank
    }

    fn serve(
        c: &TcpConfig,
        addr: &str,
        token: u64,
        deadline: Instant,
    ) -> Result<Vec<Option<TcpStream>>> {
        let taken = pending()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&c.address);
        let listener = match taken {
            Some(l) => l,
            None => {
                let sa = resolve(addr)?;
                TcpListener::bind(sa).map_err(|e| {
                    be(
                        Some(0),
                        if e.kind() == ErrorKind::AddrInUse {
                            format!("bootstrap address {sa} is already in use ({e})")
                        } else {
                            format!("cannot listen on bootstrap address {sa}: {e}")
                        },
                    )
                })?
            }
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| be(Some(0), format!("set_nonblocking: {e}")))?;
        let r = Self::gather_ranks(c, &listener, addr, token, deadline);
        if let Err(e) = &r {
            // Ranks that connect after the failure get the error too (not a timeout later):
            // the listener answers their hellos until the deadline (+ slack) has passed.
            let payload = error_payload(e);
            let until = after(deadline.max(Instant::now()), LEAF_SLACK);
            let _ = std::thread::Builder::new()
                .name("rshmem-boot-linger".into())
                .spawn(move || {
                    while Instant::now() < until {
                        match listener.accept() {
                            Ok((mut s, _)) => {
                                let _ = s.set_nonblocking(false);
                                let by =
                                    until.min(after(Instant::now(), Duration::from_millis(200)));
                                let _ = read_frame(&mut s, by);
                                let _ = write_frame(&mut s, K_ERROR, &payload, by);
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(5)),
                        }
                    }
                });
        }
        r
    }

    fn gather_ranks(
        c: &TcpConfig,
        listener: &TcpListener,
        addr: &str,
        token: u64,
        deadline: Instant,
    ) -> Result<Vec<Option<TcpStream>>> {
        let mut links: Vec<Option<TcpStream>> = (0..c.size).map(|_| None).collect();
        let mut joined = 1;
        // Error frames are small, but a write is bounded all the same.
        let soon = || after(Instant::now(), Duration::from_millis(200));
        let fail = |links: &mut Vec<Option<TcpStream>>, e: Error| -> Error {
            let p = error_payload(&e);
            for s in links.iter_mut().flatten() {
                let _ = write_frame(s, K_ERROR, &p, soon());
            }
            tracing::debug!(error = %e, "tcp bootstrap: rank 0 fails the job");
            e
        };
        while joined < c.size {
            let (mut s, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if is_timeout(&e) || e.kind() == ErrorKind::Interrupted => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (1..c.size)
                            .filter(|&r| links[r].is_none())
                            .map(|r| Self::pe(c, r))
                            .collect();
                        let e = be(
                            missing.first().copied(),
                            format!(
                                "PE(s) {missing:?} never connected to the bootstrap at {addr} within {:?}",
                                c.timeout
                            ),
                        );
                        return Err(fail(&mut links, e));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => return Err(fail(&mut links, be(Some(0), format!("accept: {e}")))),
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_nodelay(true);
            // A connection that does not say hello within a second (or the deadline) is a stray.
            let hello_by = deadline.min(after(Instant::now(), Duration::from_secs(1)));
            let h = match read_frame_max(&mut s, hello_by, 64) {
                Ok((K_HELLO, p)) if p.len() == 48 => p,
                _ => {
                    tracing::debug!(%peer, "tcp bootstrap: ignoring a connection without hello");
                    continue;
                }
            };
            let w = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            let (magic, version, size, rank, tok, ppr) = (w(0), w(1), w(2), w(3), w(4), w(5));
            if magic != MAGIC {
                continue;
            }
            // The rank comes from the wire: only a rank in range names a PE (no overflow).
            let rank_u = usize::try_from(rank).unwrap_or(usize::MAX);
            let in_range = rank != 0 && rank_u < c.size;
            let who = in_range.then(|| Self::pe(c, rank_u));
            let which = match who {
                Some(pe) => format!("PE {pe} (process {rank})"),
                None => format!("a process claiming rank {rank}"),
            };
            let problem = if version != c.protocol_version {
                Some(be(
                    who,
                    format!(
                        "{which} speaks bootstrap protocol version {version}, PE 0 speaks {}",
                        c.protocol_version
                    ),
                ))
            } else if size != c.size as u64 {
                Some(be(who, format!("world size mismatch: process {rank} expects {size} processes, PE 0 expects {}", c.size)))
            } else if ppr != c.pes_per_rank as u64 {
                Some(be(
                    who,
                    format!(
                        "PEs per process mismatch: process {rank} has {ppr}, PE 0 has {}",
                        c.pes_per_rank
                    ),
                ))
            } else if tok != token {
                Some(be(who, format!("process {rank} belongs to another job (token {tok:016x}, expected {token:016x})")))
            } else if !in_range {
                Some(be(
                    None,
                    format!("a process claims rank {rank}, out of range 1..{}", c.size),
                ))
            } else if links[rank_u].is_some() {
                Some(be(
                    who,
                    format!("duplicate rank: two processes claim rank {rank}"),
                ))
            } else {
                None
            };
            if let Some(e) = problem {
                let _ = write_frame(&mut s, K_ERROR, &error_payload(&e), soon());
                return Err(fail(&mut links, e));
            }
            links[rank_u] = Some(s);
            joined += 1;
        }
        for r in 1..c.size {
            if let Some(s) = links[r].as_mut() {
                if let Err(e) = write_frame(s, K_WELCOME, &[], after(deadline, LEAF_SLACK)) {
                    let e = be(
                        Some(Self::pe(c, r)),
                        format!("process {r} dropped during the bootstrap handshake: {e}"),
                    );
                    return Err(fail(&mut links, e));
                }
            }
        }
        Ok(links)
    }

    fn join(c: &TcpConfig, addr: &str, token: u64, deadline: Instant) -> Result<TcpStream> {
        let sa = resolve(addr)?;
        let me = Self::pe(c, c.rank);
        let mut s = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(be(
                    Some(0),
                    format!(
                        "PE {me}: PE 0 never listened at {sa} within {:?}",
                        c.timeout
                    ),
                ));
            }
            match TcpStream::connect_timeout(&sa, left.min(Duration::from_millis(500))) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let _ = s.set_nodelay(true);
        let mut h = Vec::with_capacity(48);
        for w in [
            MAGIC,
            c.protocol_version,
            c.size as u64,
            c.rank as u64,
            token,
            c.pes_per_rank as u64,
        ] {
            h.extend_from_slice(&w.to_le_bytes());
        }
        write_frame(&mut s, K_HELLO, &h, deadline)
            .map_err(|e| be(Some(0), format!("PE {me}: sending hello to {sa}: {e}")))?;
        match read_frame(&mut s, after(deadline, LEAF_SLACK)) {
            Ok((K_WELCOME, _)) => Ok(s),
            Ok((K_ERROR, p)) => Err(error_from_payload(&p)),
            Ok((k, _)) => Err(be(Some(0), format!("unexpected frame kind {k} from PE 0"))),
            Err(e) if is_timeout(&e) => Err(be(
                Some(0),
                format!(
                    "PE {me}: no welcome from PE 0 at {sa} within {:?} (some PE never came?)",
                    c.timeout
                ),
            )),
            Err(e) => Err(be(
                Some(0),
                format!("PE {me}: connection to PE 0 at {sa} failed: {e}"),
            )),
        }
    }

    fn check_failed(&self) -> Result<()> {
        match &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn set_failed(&self, e: Error) -> Error {
        *self.failed.lock().unwrap_or_else(|x| x.into_inner()) = Some(e.clone());
        e
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn locality(&self) -> Locality {
        self.locality
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_failed()?;
        let deadline = after(Instant::now(), self.timeout);
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let ppr = self.pes_per_rank;
        match &mut *links {
            Links::Root(peers) => {
                let mut all = vec![data.to_vec()];
                let mut err = None;
                for (r, s) in peers.iter_mut().enumerate().skip(1) {
                    let Some(s) = s.as_mut() else { continue };
                    match read_frame(s, deadline) {
                        Ok((K_DATA, p)) => all.push(p),
                        Ok((K_ERROR, p)) => {
                            err = Some(error_from_payload(&p));
                            break;
                        }
                        Ok((k, _)) => {
                            err = Some(be(
                                Some(r * ppr),
                                format!("unexpected frame kind {k} from process {r}"),
                            ));
                            break;
                        }
                        Err(e) => {
                            err = Some(be(
                                Some(r * ppr),
                                if is_timeout(&e) {
                                    format!("PE {} (process {r}) did not take part in a bootstrap exchange within {:?}", r * ppr, self.timeout)
                                } else {
                                    format!("PE {} (process {r}) was lost during a bootstrap exchange: {e}", r * ppr)
                                },
                            ));
                            break;
                        }
                    }
                }
                let (kind, payload) = match &err {
                    None => (K_DATA, encode_list(&all)),
                    Some(e) => (K_ERROR, error_payload(e)),
                };
                for (r, s) in peers.iter_mut().enumerate().skip(1) {
                    if let Some(s) = s.as_mut() {
                        // An error frame gets a short bound of its own: the deadline may have
                        // passed already (the error may be that timeout).
                        let by = if err.is_none() {
                            deadline
                        } else {
                            after(Instant::now(), Duration::from_millis(200))
                        };
                        if let Err(e) = write_frame(s, kind, &payload, by) {
                            if err.is_none() {
                                err = Some(be(
                                    Some(r * ppr),
                                    if is_timeout(&e) {
                                        format!("PE {} (process {r}) did not take the result of a bootstrap exchange within {:?}", r * ppr, self.timeout)
                                    } else {
                                        format!("PE {} (process {r}) was lost: {e}", r * ppr)
                                    },
                                ));
                            }
                        }
                    }
                }
                match err {
                    Some(e) => Err(self.set_failed(e)),
                    None => Ok(all),
                }
            }
            Links::Leaf(s) => {
                let me = self.rank * ppr;
                if let Err(e) = write_frame(s, K_DATA, data, after(deadline, LEAF_SLACK)) {
                    return Err(self.set_failed(be(
                        Some(0),
                        if is_timeout(&e) {
                            format!("PE {me}: PE 0 did not take this PE's part of a bootstrap exchange within {:?}", self.timeout)
                        } else {
                            format!("PE {me}: PE 0 was lost during a bootstrap exchange: {e}")
                        },
                    )));
                }
                let r = match read_frame(s, after(deadline, LEAF_SLACK)) {
                    Ok((K_DATA, p)) => decode_list(&p)
                        .filter(|l| l.len() == self.size)
                        .ok_or_else(|| be(Some(0), "malformed bootstrap exchange from PE 0")),
                    Ok((K_ERROR, p)) => Err(error_from_payload(&p)),
                    Ok((k, _)) => Err(be(Some(0), format!("unexpected frame kind {k} from PE 0"))),
                    Err(e) if is_timeout(&e) => Err(be(
                        Some(0),
                        format!("PE {me}: bootstrap exchange not completed within {:?} (waiting for PE 0)", self.timeout),
                    )),
                    Err(e) => Err(be(
                        Some(0),
                        format!("PE {me}: PE 0 was lost during a bootstrap exchange: {e}"),
                    )),
                };
                r.map_err(|e| self.set_failed(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn list_roundtrip() {
        let l = vec![vec![1u8, 2], vec![], vec![3; 300]];
        assert_eq!(decode_list(&encode_list(&l)), Some(l));
        assert_eq!(decode_list(&[1, 0, 0, 0, 9, 0, 0, 0]), None);
        assert_eq!(decode_list(&[]), None);
    }
    #[test]
    fn star_allgather_with_unique_id() {
        let id = unique_id().unwrap();
        let t = Duration::from_secs(10);
        std::thread::scope(|s| {
            for r in 0..3 {
                let id = id.clone();
                s.spawn(move || {
                    let b = TcpBootstrap::connect(&id, r, 3, t).unwrap();
                    for round in 0..20u8 {
                        let all = b.allgather(&[r as u8, round]).unwrap();
                        for (i, v) in all.iter().enumerate() {
                            assert_eq!(v, &vec![i as u8, round]);
                        }
                    }
                    assert_eq!(b.broadcast(&[r as u8 + 7], 1).unwrap(), vec![8]);
                    b.barrier().unwrap();
                });
            }
        });
    }

    /// A hand-made rank: connects to the job of unique id `id` and says hello with `words`
    /// (magic, version, size, rank, token, PEs per rank).
    fn raw_rank(id: &str, words: [u64; 6]) -> TcpStream {
        let (addr, _) = parse_address(id).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        let h: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        send(&mut s, K_HELLO, &h);
        s
    }

    fn send(s: &mut TcpStream, kind: u8, payload: &[u8]) {
        write_frame(s, kind, payload, Instant::now() + Duration::from_secs(5)).unwrap();
    }

    fn token_of(id: &str) -> u64 {
        parse_address(id).unwrap().1
    }

    #[test]
    fn huge_timeout_is_no_deadline() {
        // Duration::MAX (or RSHMEM_TIMEOUT=1e19) once overflowed `Instant + timeout` and panicked.
        let id = unique_id().unwrap();
        std::thread::scope(|s| {
            for r in 0..2 {
                let id = id.clone();
                s.spawn(move || {
                    let b = TcpBootstrap::connect(&id, r, 2, Duration::MAX).unwrap();
                    assert_eq!(b.broadcast(&[r as u8 + 1], 0).unwrap(), vec![1]);
                    b.barrier().unwrap();
                });
            }
        });
    }

    #[test]
    fn rank_that_never_reads_cannot_block_rank_0() {
        // Rank 1 contributes to an exchange and then never reads: rank 0's answer does not fit
        // the socket buffers, and its write must end at the timeout naming PE 1 (it once
        // blocked forever: only reads were bounded).
        let id = unique_id().unwrap();
        let t = Duration::from_millis(1500);
        let r = std::thread::scope(|s| {
            let root = s.spawn(|| {
                let b = TcpBootstrap::connect(&id, 0, 2, t)?;
                b.allgather(&vec![7u8; 32 << 20])
            });
            let mut c = raw_rank(&id, [MAGIC, TCP_PROTOCOL_VERSION, 2, 1, token_of(&id), 1]);
            let small: libc::c_int = 4096;
            // SAFETY: setsockopt on our own socket with a valid int option value.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&c),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    &small as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            assert_eq!(read_frame(&mut c, deadline).unwrap().0, K_WELCOME);
            send(&mut c, K_DATA, &[1]);
            let r = root.join().unwrap();
            drop(c);
            r
        });
        match r {
            Err(Error::Bootstrap { pe: Some(1), msg }) => {
                assert!(msg.contains("within"), "{msg}")
            }
            other => panic!(
                "expected an error naming PE 1, got {:?}",
                other.map(|v| v.len())
            ),
        }
    }

    #[test]
    fn hello_with_absurd_rank_is_an_error_not_a_panic() {
        // A version mismatch from a peer claiming rank u64::MAX: the message named PE
        // rank * pes_per_rank, an overflow (a panic in debug builds). No such PE: none named.
        let id = unique_id().unwrap();
        let r = std::thread::scope(|s| {
            let root = s.spawn(|| {
                let mut c = TcpConfig::new(&id, 0, 2, Duration::from_secs(5));
                c.pes_per_rank = 2;
                TcpBootstrap::with_config(c).map(drop)
            });
            let words = [
                MAGIC,
                TCP_PROTOCOL_VERSION + 1,
                2,
                u64::MAX,
                token_of(&id),
                2,
            ];
            let _c = raw_rank(&id, words);
            root.join()
        });
        match r {
            Ok(Err(Error::Bootstrap { pe: None, msg })) => {
                assert!(msg.contains("protocol version"), "{msg}")
            }
            Ok(other) => panic!("expected a version error, got {other:?}"),
            Err(_) => panic!("rank 0 panicked on a peer's hello"),
        }
    }
}
