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
    /// Flows ending within this part of the time since the run's first start of the next
    /// end, end with it (0: every end is an event of its own).
    pub tolerance: f64,
    n: Vec<u32>,
    left: Vec<f64>,
    touched: Vec<u32>,
    /// Per touched link, where its flows start in `on`, and how many.
    at: Vec<u32>,
    deg: Vec<u32>,
    on: Vec<u32>,
    frozen: Vec<bool>,
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
            tolerance: 0.0,
            n: vec![0; k],
            left: vec![0.0; k],
            touched: Vec::new(),
            at: vec![0; k],
            deg: vec![0; k],
            on: Vec::new(),
            frozen: Vec::new(),
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
        let t0 = t;
        self.frozen.resize(count, false);
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
            let slack = dt * 1e-9 + self.tolerance * (t_next - t0);
            let mut ended = false;
            active.retain(|&f| {
                let fu = f as usize;
                let lb = &mut left_bytes[fu];
                *lb -= rate[fu] * span;
                let done =
                    *lb <= flows.bytes[fu] * 1e-9 || (finishing_all && *lb / rate[fu] <= slack);
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
    /// `touched` holding the links the flows cross. The links wait in a heap by their share
    /// per unfrozen flow; the smallest fixes the rate of its unfrozen flows, which leave every
    /// link they cross. A link's share only grows as flows leave it (they leave at most its
    /// share), so an entry whose share has grown since it was pushed is pushed again. A flow's
    /// own cap is an entry of its own. Each flow is frozen once: the cost is the flows' links
    /// plus a heap operation per link and per change of its share.
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
        // Each touched link's flows, contiguous in `on` from `at[l]`, `deg[l]` of them.
        let mut total = 0u32;
        for &l in &self.touched {
            let li = l as usize;
            self.at[li] = total;
            self.deg[li] = self.n[li];
            total += self.n[li];
        }
        self.on.clear();
        self.on.resize(total as usize, 0);
        for &f in active {
            for &l in flows.path(f as usize) {
                let li = l as usize;
                self.on[self.at[li] as usize] = f;
                self.at[li] += 1;
            }
            self.frozen[f as usize] = false;
        }
        for &l in &self.touched {
            let li = l as usize;
            self.at[li] -= self.deg[li];
        }
        // Min-heap (Pending pops the smallest first): entries below `base` are links, the
        // others flows' caps.
        let base = self.cap.len() as u32;
        let mut heap: BinaryHeap<Pending> = self
            .touched
            .iter()
            .map(|&l| Pending(self.left[l as usize] / self.n[l as usize] as f64, l))
            .collect();
        for &f in active {
            let c = flows.cap[f as usize];
            if c.is_finite() {
                heap.push(Pending(c, base + f));
            }
        }
        let mut unfrozen = active.len();
        while unfrozen > 0 {
            let Some(Pending(share, e)) = heap.pop() else {
                break;
            };
            if e >= base {
                let f = e - base;
                if !self.frozen[f as usize] {
                    self.freeze(flows, f, share, rate);
                    unfrozen -= 1;
                }
                continue;
            }
            let li = e as usize;
            if self.n[li] == 0 {
                continue;
            }
            let now = self.left[li].max(0.0) / self.n[li] as f64;
            if now > share * (1.0 + 1e-12) {
                heap.push(Pending(now, e));
                continue;
            }
            let (a, d) = (self.at[li] as usize, self.deg[li] as usize);
            for k in a..a + d {
                let f = self.on[k];
                if !self.frozen[f as usize] {
                    self.freeze(flows, f, now, rate);
                    unfrozen -= 1;
                }
            }
        }
    }

    fn freeze(&mut self, flows: &Flows, f: u32, m: f64, rate: &mut [f64]) {
        self.frozen[f as usize] = true;
        rate[f as usize] = m;
        for &l in flows.path(f as usize) {
            self.left[l as usize] -= m;
            self.n[l as usize] -= 1;
        }
    }
}
