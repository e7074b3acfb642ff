//! Hierarchical bootstrap for mixed mode: P processes × T threads, each thread one PE.
//!
//! PE `p * T + t` is thread `t` of process `p`. An exchange first gathers the T contributions
//! of a process through the in-process hub, then thread 0 exchanges the process's bundle with
//! the other processes over TCP, then thread 0 hands the global result to its threads through
//! the hub. A failure anywhere travels the same way (a status byte on every bundle), so every
//! PE of every process returns it.

use super::tcp::{decode_list, encode_list};
use super::{Bootstrap, InProcEndpoint, Locality, TcpBootstrap};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// One thread-PE's endpoint of the hierarchical bootstrap.
#[derive(Debug)]
pub struct HierEndpoint {
    local: InProcEndpoint,
    tcp: Arc<TcpBootstrap>,
    threads: usize,
    locality: Locality,
}

impl HierEndpoint {
    /// Thread `local.rank()` of process `tcp.rank()`; `local` must be an endpoint of a hub of
    /// `threads` ranks shared by this process's PEs, and `tcp` the process's TCP endpoint.
    pub fn new(local: InProcEndpoint, tcp: Arc<TcpBootstrap>, local_rank: usize) -> Result<Self> {
        let threads = local.size();
        if threads == 0 {
            return Err(Error::invalid("a process needs at least one thread-PE"));
        }
        let locality = Locality {
            process: tcp.rank(),
            thread: local.rank(),
            device: local_rank * threads + local.rank(),
            job: tcp.locality().job,
        };
        Ok(HierEndpoint {
            local,
            tcp,
            threads,
            locality,
        })
    }
}

impl HierEndpoint {
    /// An error of this process's hub names a thread by its local index: the global PE.
    fn global(&self, e: Error) -> Error {
        match e {
            Error::Bootstrap { pe: Some(t), msg } => Error::Bootstrap {
                pe: Some(self.tcp.rank() * self.threads + t),
                msg: format!("process {}: {msg}", self.tcp.rank()),
            },
            other => other,
        }
    }
}

fn ok_bundle(items: &[Vec<u8>]) -> Vec<u8> {
    let mut b = vec![0u8];
    b.extend(encode_list(items));
    b
}

fn err_bundle(e: &Error) -> Vec<u8> {
    let mut b = vec![1u8];
    let (pe, msg) = match e {
        Error::Bootstrap { pe, msg } => (*pe, msg.clone()),
        other => (None, other.to_string()),
    };
    b.extend_from_slice(&pe.map_or(u64::MAX, |p| p as u64).to_le_bytes());
    b.extend_from_slice(msg.as_bytes());
    b
}

fn open_bundle(b: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
    match b.first() {
        Some(0) => decode_list(&b[1..]).ok_or_else(|| Error::Bootstrap {
            pe: None,
            msg: format!("malformed {what}"),
        }),
        Some(1) if b.len() >= 9 => {
            let pe = u64::from_le_bytes(b[1..9].try_into().unwrap_or([0xff; 8]));
            Err(Error::Bootstrap {
                pe: (pe != u64::MAX).then_some(pe as usize),
                msg: String::from_utf8_lossy(&b[9..]).into_owned(),
            })
        }
        _ => Err(Error::Bootstrap {
            pe: None,
            msg: format!("malformed {what}"),
        }),
    }
}

impl Bootstrap for HierEndpoint {
    fn rank(&self) -> usize {
        self.tcp.rank() * self.threads + self.local.rank()
    }
    fn size(&self) -> usize {
        self.tcp.size() * self.threads
    }
    fn locality(&self) -> Locality {
        self.locality
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mine = self.local.allgather(data).map_err(|e| self.global(e));
        // The global result comes from thread 0, which has arrived (the gather above) and is
        // in the TCP exchange: bounded by the timeout, but started later at other processes,
        // and their errors (naming the PE at fault) reach it up to a timeout and a slack
        // later. Waiting for it with the hub's own timeout would end first, naming thread 0.
        let wait = self
            .tcp
            .timeout()
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(2));
        if self.local.rank() != 0 {
            mine?;
            let all = self
                .local
                .allgather_within(&[], wait)
                .map_err(|e| self.global(e))?;
            let global = all.into_iter().next().unwrap_or_default();
            return open_bundle(&global, "global bundle");
        }
        // Thread 0: my process's bundle (or its failure) goes to every process.
        let bundle = match &mine {
            Ok(items) => ok_bundle(items),
            Err(e) => err_bundle(e),
        };
        let global = self.tcp.allgather(&bundle).and_then(|bundles| {
            let mut all = Vec::with_capacity(self.size());
            for (p, b) in bundles.iter().enumerate() {
                let items = open_bundle(b, "process bundle")?;
                if items.len() != self.threads {
                    return Err(Error::Bootstrap {
                        pe: Some(p * self.threads),
                        msg: format!(
                            "process {p} contributed {} PEs, {} expected",
                            items.len(),
                            self.threads
                        ),
                    });
                }
                all.extend(items);
            }
            Ok(all)
        });
        mine?;
        let out = match &global {
            Ok(all) => ok_bundle(all),
            Err(e) => err_bundle(e),
        };
        self.local
            .allgather_within(&out, wait)
            .map_err(|e| self.global(e))?;
        global
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{unique_id, InProcBootstrap, TcpConfig};
    use std::time::Duration;

    /// Two "processes" (thread groups with their own hub and TCP endpoint) of 3 threads each.
    fn run(threads_of: [usize; 2]) -> Vec<Result<Vec<Vec<u8>>>> {
        let id = unique_id().unwrap();
        let t = Duration::from_secs(5);
        std::thread::scope(|s| {
            let mut hs = Vec::new();
            for (p, &threads) in threads_of.iter().enumerate() {
                let id = id.clone();
                let hub = InProcBootstrap::new(threads, t).unwrap();
                let tcp = s.spawn(move || {
                    let mut c = TcpConfig::new(&id, p, 2, t);
                    c.pes_per_rank = threads;
                    TcpBootstrap::with_config(c).map(Arc::new)
                });
                hs.push(s.spawn(move || {
                    let tcp = match tcp.join().unwrap() {
                        Ok(t) => t,
                        Err(e) => return vec![Err(e); threads],
                    };
                    std::thread::scope(|s2| {
                        let ths: Vec<_> = (0..threads)
                            .map(|th| {
                                let ep = HierEndpoint::new(hub.join(th).unwrap(), tcp.clone(), p)
                                    .unwrap();
                                s2.spawn(move || {
                                    let r = ep.rank() as u8;
                                    assert_eq!(ep.locality().thread, th);
                                    let mut last = Ok(Vec::new());
                                    for round in 0..5u8 {
                                        last = ep.allgather(&[r, round]);
                                        if last.is_err() {
                                            break;
                                        }
                                    }
                                    last
                                })
                            })
                            .collect();
                        ths.into_iter()
                            .map(|h| h.join().unwrap())
                            .collect::<Vec<_>>()
                    })
                }));
            }
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn global_ranks_are_process_major() {
        let out = run([3, 3]);
        assert_eq!(out.len(), 6);
        for r in out {
            let all = r.unwrap();
            assert_eq!(all, (0..6u8).map(|pe| vec![pe, 4]).collect::<Vec<_>>());
        }
    }

    /// Process 2 joins the job and then never takes part; rank 0's process starts the exchange
    /// late. Every PE must name PE 4 (process 2's first PE). Once, the threads waiting in the
    /// process's hub for thread 0 (which waited on TCP, bounded by the same timeout but
    /// started later at rank 0) timed out first and named "PE 0", the local index of their own
    /// thread 0, on every PE of the process, thread 0 included.
    #[test]
    fn silent_process_is_named_by_every_thread() {
        let id = unique_id().unwrap();
        let t = Duration::from_millis(1000);
        let threads = 2;
        let cfg = |p: usize| {
            let mut c = TcpConfig::new(&id, p, 3, t);
            c.pes_per_rank = threads;
            c
        };
        let (done, wait_done) = std::sync::mpsc::channel::<()>();
        let results: Vec<Result<Vec<Vec<u8>>>> = std::thread::scope(|s| {
            let c2 = cfg(2);
            s.spawn(move || {
                let b = TcpBootstrap::with_config(c2).unwrap();
                let _ = wait_done.recv();
                drop(b);
            });
            let hs: Vec<_> = (0..2)
                .map(|p| {
                    let c = cfg(p);
                    s.spawn(move || {
                        let tcp = Arc::new(TcpBootstrap::with_config(c).unwrap());
                        let hub = InProcBootstrap::new(threads, t).unwrap();
                        std::thread::scope(|s2| {
                            let hs: Vec<_> = (0..threads)
                                .map(|th| {
                                    let ep =
                                        HierEndpoint::new(hub.join(th).unwrap(), tcp.clone(), p)
                                            .unwrap();
                                    s2.spawn(move || {
                                        if p == 0 {
                                            std::thread::sleep(Duration::from_millis(300));
                                        }
                                        ep.allgather(b"x")
                                    })
                                })
                                .collect();
                            hs.into_iter()
                                .map(|h| h.join().unwrap())
                                .collect::<Vec<_>>()
                        })
                    })
                })
                .collect();
            let r = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            done.send(()).unwrap();
            r
        });
        for (pe, r) in results.iter().enumerate() {
            match r {
                Err(Error::Bootstrap { pe: Some(4), .. }) => {}
                other => panic!("PE {pe}: expected an error naming PE 4, got {other:?}"),
            }
        }
    }

    #[test]
    fn local_timeouts_name_global_pes() {
        // Thread 1 of process 1 never comes: thread 0 names PE 3 (1 * 2 + 1), not "PE 1".
        let id = unique_id().unwrap();
        let t = Duration::from_millis(300);
        let r = std::thread::scope(|s| {
            let id2 = id.clone();
            let other = s.spawn(move || {
                let mut c = TcpConfig::new(&id2, 0, 2, t);
                c.pes_per_rank = 2;
                TcpBootstrap::with_config(c)
            });
            let mut c = TcpConfig::new(&id, 1, 2, t);
            c.pes_per_rank = 2;
            let tcp = Arc::new(TcpBootstrap::with_config(c).unwrap());
            let hub = InProcBootstrap::new(2, t).unwrap();
            let ep = HierEndpoint::new(hub.join(0).unwrap(), tcp, 1).unwrap();
            let r = ep.allgather(b"x");
            drop(other.join().unwrap());
            r
        });
        match r {
            Err(Error::Bootstrap { pe: Some(3), .. }) => {}
            other => panic!("expected an error naming PE 3, got {other:?}"),
        }
    }

    #[test]
    fn mismatched_threads_per_process_fail_everywhere() {
        for r in run([3, 2]) {
            match r {
                Err(Error::Bootstrap { msg, .. }) => {
                    assert!(msg.contains("PEs per process mismatch"), "{msg}")
                }
                other => panic!("expected a bootstrap error, got {other:?}"),
            }
        }
    }
}
