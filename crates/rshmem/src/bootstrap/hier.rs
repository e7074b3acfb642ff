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
        let mine = self.local.allgather(data);
        if self.local.rank() != 0 {
            mine?;
            let global = self.local.broadcast(&[], 0)?;
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
        self.local.broadcast(&out, 0)?;
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
