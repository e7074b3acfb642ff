//! In-process bootstrap for PEs that are threads of one process.

use super::Bootstrap;
use crate::error::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct State {
    generation: u64,
    slots: Vec<Option<Vec<u8>>>,
    arrived: usize,
    result: Arc<Vec<Vec<u8>>>,
    joined: Vec<bool>,
    failed: Option<Error>,
}

#[derive(Debug)]
struct Hub {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

/// A shared handle through which `size` threads of this process join one world, each with its
/// rank (the case where the application owns the threads, as XLA/JAX do). Clone it to every
/// thread; each calls [`join`](Self::join) with its rank.
#[derive(Debug, Clone)]
pub struct InProcBootstrap {
    hub: Arc<Hub>,
}

/// One thread's endpoint of an [`InProcBootstrap`].
#[derive(Debug)]
pub struct InProcEndpoint {
    hub: Arc<Hub>,
    rank: usize,
}

impl InProcBootstrap {
    /// A hub for `size` threads; exchanges wait at most `timeout` for the slowest thread.
    pub fn new(size: usize, timeout: Duration) -> Result<Self> {
        if size == 0 {
            return Err(Error::invalid("a world needs at least one PE"));
        }
        Ok(InProcBootstrap {
            hub: Arc::new(Hub {
                size,
                timeout,
                state: Mutex::new(State {
                    generation: 0,
                    slots: vec![None; size],
                    arrived: 0,
                    result: Arc::new(Vec::new()),
                    joined: vec![false; size],
                    failed: None,
                }),
                cv: Condvar::new(),
            }),
        })
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.hub.size
    }

    /// Takes rank `rank`'s endpoint; a rank out of range or taken twice is an error.
    pub fn join(&self, rank: usize) -> Result<InProcEndpoint> {
        if rank >= self.hub.size {
            return Err(Error::PeOutOfRange {
                pe: rank,
                n_pes: self.hub.size,
                what: "world",
            });
        }
        let mut st = self.hub.state.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::replace(&mut st.joined[rank], true) {
            return Err(Error::Bootstrap {
                pe: Some(rank),
                msg: "rank joined twice".into(),
            });
        }
        Ok(InProcEndpoint {
            hub: self.hub.clone(),
            rank,
        })
    }
}

impl Bootstrap for InProcEndpoint {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.hub.size
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.allgather_within(data, self.hub.timeout)
    }
}

impl InProcEndpoint {
    /// [`Bootstrap::allgather`] waiting at most `timeout` for the slowest thread (the
    /// hierarchical bootstrap's threads wait longer for their thread 0, itself bounded by TCP).
    pub(crate) fn allgather_within(&self, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let hub = &self.hub;
        let mut st = hub.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let gen = st.generation;
        st.slots[self.rank] = Some(data.to_vec());
        st.arrived += 1;
        if st.arrived == hub.size {
            st.result = Arc::new(
                st.slots
                    .iter_mut()
                    .map(|s| s.take().unwrap_or_default())
                    .collect(),
            );
            st.arrived = 0;
            st.generation += 1;
            hub.cv.notify_all();
            return Ok(st.result.as_ref().clone());
        }
        // A timeout too large for an Instant (Duration::MAX) means no deadline.
        let deadline = Instant::now().checked_add(timeout);
        while st.generation == gen {
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let missing: Vec<usize> =
                    (0..hub.size).filter(|&r| st.slots[r].is_none()).collect();
                let e = Error::Bootstrap {
                    pe: missing.first().copied(),
                    msg: format!("in-process bootstrap timed out after {timeout:?}; ranks {missing:?} never arrived"),
                };
                st.failed = Some(e.clone());
                hub.cv.notify_all();
                return Err(e);
            }
            st = hub
                .cv
                .wait_timeout(
                    st,
                    deadline.map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now)),
                )
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(st.result.as_ref().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn allgather_rounds() {
        let hub = InProcBootstrap::new(4, Duration::from_secs(10)).unwrap();
        std::thread::scope(|s| {
            for r in 0..4 {
                let ep = hub.join(r).unwrap();
                s.spawn(move || {
                    for round in 0..50u8 {
                        let all = ep.allgather(&[r as u8, round]).unwrap();
                        for (i, v) in all.iter().enumerate() {
                            assert_eq!(v, &vec![i as u8, round]);
                        }
                    }
                    assert_eq!(ep.broadcast(&[r as u8 + 10], 2).unwrap(), vec![12]);
                    // a root outside the world: an error on every rank (all took part)
                    match ep.broadcast(&[1], 4) {
                        Err(Error::PeOutOfRange {
                            pe: 4,
                            n_pes: 4,
                            what: "world",
                        }) => {}
                        other => panic!("rank {r}: broadcast from root 4: {other:?}"),
                    }
                    // and the hub still works
                    assert_eq!(ep.broadcast(&[r as u8 + 20], 3).unwrap(), vec![23]);
                });
            }
        });
        assert!(
            matches!(hub.join(1), Err(Error::Bootstrap { pe: Some(1), .. })),
            "double join"
        );
        assert!(
            matches!(
                hub.join(4),
                Err(Error::PeOutOfRange {
                    pe: 4,
                    n_pes: 4,
                    ..
                })
            ),
            "out of range"
        );
    }
    #[test]
    fn missing_rank_times_out_with_name() {
        let hub = InProcBootstrap::new(3, Duration::from_millis(100)).unwrap();
        let ep = hub.join(0).unwrap();
        match ep.allgather(b"x") {
            Err(Error::Bootstrap { pe: Some(1), msg }) => assert!(msg.contains("[1, 2]"), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
