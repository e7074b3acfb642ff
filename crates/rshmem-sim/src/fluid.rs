//! The engine: transfers as fluid flows sharing links by max-min fairness, driven by a
//! deterministic event queue.
//!
//! A flow starts at its start time (the sender's issue time plus the route's latency and
//! per-message costs) and drains its bytes at a rate that changes only at events: a flow
//! starting or a flow ending. At each event the rates are the max-min fair allocation
//! (progressive filling): the link with the smallest share per unfrozen flow fixes the rate of
//! every flow crossing it, which is then taken off every link it crosses, until every flow has
//! a rate. A flow's own cap (a kernel's blocks) acts as a link of its own. Pending starts wait
//! in a binary heap ordered by (time, sequence number), so ties break the same way on every
//! run and the timeline is a function of the inputs alone.
//!
//! Why our own queue rather than a simulation crate (nexosim, for example): the model has one
//! kind of process (a flow) and two kinds of event, the rates must be recomputed for all flows
//! at once at each event (which an actor framework would make a message storm), and a 4096-PE
//! all-to-all needs millions of flows in a few hundred bytes each.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A set of flows: each with its start, bytes, cap and the links it crosses.
#[derive(Clone, Debug, Default)]
pub struct Flows {
    start: Vec<f64>,
    bytes: Vec<f64>,
    cap: Vec<f64>,
    path_at: Vec<u32>,
    hops: Vec<u32>,
}

impl Flows {
    /// No flows.
    pub fn new() -> Flows {
        Flows::default()
    }

    /// Adds a flow of `bytes` starting at `start_us` over `path` (link indices), at most
    /// `cap_gbps` (infinite: no cap of its own); returns its index.
    pub fn add(&mut self, start_us: f64, bytes: f64, cap_gbps: f64, path: &[u32]) -> usize {
        if self.path_at.is_empty() {
            self.path_at.push(0);
        }
        self.start.push(start_us);
        self.bytes.push(bytes);
        self.cap.push(cap_gbps * 1e3);
        self.hops.extend_from_slice(path);
        self.path_at.push(self.hops.len() as u32);
        self.start.len() - 1
    }

    /// Flows.
    pub fn len(&self) -> usize {
        self.start.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.start.is_empty()
    }

    /// Flow `f`'s links.
    pub fn path(&self, f: usize) -> &[u32] {
        &self.hops[self.path_at[f] as usize..self.path_at[f + 1] as usize]
    }

    /// Flow `f`'s bytes.
    pub fn bytes(&self, f: usize) -> f64 {
        self.bytes[f]
    }

    /// Bytes of memory the flows hold.
    pub fn footprint(&self) -> usize {
        self.start.capacity() * 8 * 3 + (self.path_at.capacity() + self.hops.capacity()) * 4
    }
}

/// A pending start: ordered by time, then by flow index (earliest first from the max-heap).
#[derive(Clone, Copy, PartialEq)]
struct Pending(f64, u32);

impl Eq for Pending {}

impl Ord for Pending {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The engine over a fixed set of links; link statistics add up over every [`Engine::run`].
#[derive(Clone, Debug)]
pub struct Engine {
    /// Link capacities, bytes per µs.
    cap: Vec<f64>,
    /// Bytes that crossed each link.
    pub link_bytes: Vec<f64>,
    /// µs during which at least one flow crossed each link.
    pub link_busy_us: Vec<f64>,
    /// Events handled (flow starts and ends that changed the rates).
    pub events: u64,
    /// Most flows in flight at once.
    pub peak_flows: usize,
    n: Vec<u32>,
    left: Vec<f64>,
    share: Vec<f64>,
    touched: Vec<u32>,
}

impl Engine {
    /// An engine over links of these bandwidths (GB/s).
    pub fn new(gbps: impl IntoIterator<Item = f64>) -> Engine {
        let cap: Vec<f64> = gbps.into_iter().map(|g| g * 1e3).collect();
        let k = cap.len();
        Engine {
            cap,
            link_bytes: vec![0.0; k],
            link_busy_us: vec![0.0; k],
            events: 0,
            peak_flows: 0,
            n: vec![0; k],
            left: vec![0.0; k],
            share: vec![0.0; k],
            touched: Vec::new(),
        }
    }

    /// Runs `flows` to their ends; returns each one's end time, µs. A flow of no bytes ends
    /// at its start.
    pub fn run(&mut self, flows: &Flows) -> Vec<f64> {
        let count = flows.len();
        let mut end = vec![f64::NAN; count];
        let mut left_bytes = flows.bytes.clone();
        let mut rate = vec![0.0; count];
        let mut heap: BinaryHeap<Pending> = (0..count)
            .map(|f| Pending(flows.start[f], f as u32))
            .collect();
        let mut active: Vec<u32> = Vec::new();
        let mut t = heap.peek().map_or(0.0, |p| p.0);
        loop {
            // Every start due now joins.
            let mut changed = false;
            while heap.peek().is_some_and(|p| p.0 <= t) {
                let Some(Pending(_, f)) = heap.pop() else {
                    break;
                };
                if flows.bytes[f as usize] <= 0.0 {
                    end[f as usize] = t.max(flows.start[f as usize]);
                } else {
                    active.push(f);
                    changed = true;
                }
            }
            if active.is_empty() {
                match heap.peek() {
                    Some(p) => {
                        t = p.0;
                        continue;
                    }
                    None => break,
                }
            }
            if changed {
                self.events += 1;
            }
            self.peak_flows = self.peak_flows.max(active.len());
            self.rates(flows, &active, &mut rate);
            let mut dt = f64::INFINITY;
            for &f in &active {
                dt = dt.min(left_bytes[f as usize] / rate[f as usize]);
            }
            let next = heap.peek().map_or(f64::INFINITY, |p| p.0);
            let t_next = (t + dt).min(next);
            let span = t_next - t;
            for &l in &self.touched {
                self.link_busy_us[l as usize] += span;
            }
            let finishing_all = t + dt <= next;
            let mut ended = false;
            active.retain(|&f| {
                let fu = f as usize;
                let lb = &mut left_bytes[fu];
                *lb -= rate[fu] * span;
                let done =
                    *lb <= flows.bytes[fu] * 1e-9 || (finishing_all && *lb / rate[fu] <= dt * 1e-9);
                if done {
                    end[fu] = t_next;
                    ended = true;
                }
                !done
            });
            if ended {
                self.events += 1;
            }
            t = t_next;
        }
        for f in 0..count {
            for &l in flows.path(f) {
                self.link_bytes[l as usize] += flows.bytes[f];
            }
        }
        end
    }

    /// Max-min fair rates of the `active` flows into `rate` (progressive filling); leaves
    /// `touched` holding the links the flows cross.
    fn rates(&mut self, flows: &Flows, active: &[u32], rate: &mut [f64]) {
        for &l in &self.touched {
            self.n[l as usize] = 0;
        }
        self.touched.clear();
        for &f in active {
            for &l in flows.path(f as usize) {
                let li = l as usize;
                if self.n[li] == 0 {
                    self.touched.push(l);
                    self.left[li] = self.cap[li];
                }
                self.n[li] += 1;
            }
        }
        let mut unfrozen: Vec<u32> = active.to_vec();
        let mut frozen: Vec<u32> = Vec::new();
        while !unfrozen.is_empty() {
            let mut m = f64::INFINITY;
            for &l in &self.touched {
                let li = l as usize;
                self.share[li] = if self.n[li] > 0 {
                    self.left[li].max(0.0) / self.n[li] as f64
                } else {
                    f64::INFINITY
                };
                m = m.min(self.share[li]);
            }
            for &f in &unfrozen {
                m = m.min(flows.cap[f as usize]);
            }
            let limit = m * (1.0 + 1e-12);
            frozen.clear();
            unfrozen.retain(|&f| {
                let fu = f as usize;
                let hit = flows.cap[fu] <= limit
                    || flows
                        .path(fu)
                        .iter()
                        .any(|&l| self.share[l as usize] <= limit);
                if hit {
                    rate[fu] = m;
                    frozen.push(f);
                }
                !hit
            });
            for &f in &frozen {
                for &l in flows.path(f as usize) {
                    self.left[l as usize] -= m;
                    self.n[l as usize] -= 1;
                }
            }
        }
    }
}
