//! The engine: transfers as fluid flows sharing links by max-min fairness, driven by a
//! deterministic event queue.
//!
//! A flow starts at its start time (the sender's issue time plus the route's latency and
//! per-message costs), or that long after another flow of the set ends (a kernel's thread
//! that issues its next loads once the last ones are in), and drains its bytes at a rate that changes only at events: a flow
//! starting or a flow ending. At each event the rates are the max-min fair allocation
//! (progressive filling): the link with the smallest share per unfrozen flow fixes the rate of
//! every flow crossing it, which is then taken off every link it crosses, until every flow has
//! a rate. A flow's own cap (a kernel's blocks) acts as a link of its own. Starts are taken in
//! (time, index) order, so ties break the same way on every run and the timeline is a function
//! of the inputs alone.
//!
//! What an event costs: the flows' links are indexed once per run (each link's flows, rebuilt
//! without the ended ones once they outnumber the rest), each link's count of active flows
//! follows the starts and ends, the caps are sorted once and merged with the links' heap, and a
//! bit per flow marks the unfrozen ones. A rate computation then freezes each active flow once
//! (its links updated) plus a heap operation per busy link: no sorting, allocation or index
//! building per event. Phases of many flows may end nearby flows together
//! ([`Engine::tolerance`]); that is the engine's one approximation, bounded and tested
//! (`tests/sim.rs`: `end_tolerance_bounds_every_end`).
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
    /// The flow each one waits for ([`NONE`]: none; its start is then absolute).
    after: Vec<u32>,
}

/// No flow to wait for.
const NONE: u32 = u32::MAX;

impl Flows {
    /// No flows.
    pub fn new() -> Flows {
        Flows::default()
    }

    /// Adds a flow of `bytes` starting at `start_us` over `path` (link indices), at most
    /// `cap_gbps` (infinite: no cap of its own); returns its index.
    pub fn add(&mut self, start_us: f64, bytes: f64, cap_gbps: f64, path: &[u32]) -> usize {
        self.push(NONE, start_us, bytes, cap_gbps, path)
    }

    /// Adds a flow like [`Flows::add`] that starts `delay_us` after flow `pred` (added before
    /// it) ends; returns its index.
    ///
    /// # Panics
    /// If `pred` is not a flow of the set.
    pub fn add_after(
        &mut self,
        pred: usize,
        delay_us: f64,
        bytes: f64,
        cap_gbps: f64,
        path: &[u32],
    ) -> usize {
        assert!(pred < self.len(), "flow {pred} is not in the set");
        self.push(pred as u32, delay_us, bytes, cap_gbps, path)
    }

    fn push(
        &mut self,
        after: u32,
        start_us: f64,
        bytes: f64,
        cap_gbps: f64,
        path: &[u32],
    ) -> usize {
        self.after.push(after);
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
        self.start.capacity() * 8 * 3
            + (self.path_at.capacity() + self.hops.capacity() + self.after.capacity()) * 4
    }
}

/// A link in the rate computation's heap: ordered by share, then by index (smallest first
/// from the max-heap).
#[derive(Clone, Copy, PartialEq)]
struct Entry(f64, u32);

impl Eq for Entry {}

impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

impl PartialOrd for Entry {
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
    /// end, end with it (0: every end is an event of its own). Against the exact run the last
    /// end moves by at most about this part of its time since the first start, any other end
    /// by at most about three times it (`end_tolerance_bounds_every_end`).
    pub tolerance: f64,
    /// Active flows on each link.
    active_on: Vec<u32>,
    /// Unfrozen flows on each link during a rate computation.
    n: Vec<u32>,
    /// Capacity not yet given out on each link during a rate computation.
    left: Vec<f64>,
    /// Links with active flows.
    touched: Vec<u32>,
    /// Each link's flows, not yet ended, contiguous in `on` from `at[l]` to `at[l + 1]`.
    at: Vec<u32>,
    on: Vec<u32>,
    /// During a rate computation, a bit per flow: active and not yet frozen. A bit set rather
    /// than a mark per flow: the link lists visit their flows out of order, and the bits of
    /// millions of flows stay in cache.
    free: Vec<u64>,
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
            active_on: vec![0; k],
            n: vec![0; k],
            left: vec![0.0; k],
            touched: Vec::new(),
            at: vec![0; k + 1],
            on: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Runs `flows` to their ends; returns each one's end time, µs. A flow of no bytes ends
    /// at its start.
    pub fn run(&mut self, flows: &Flows) -> Vec<f64> {
        let count = flows.len();
        let mut end = vec![f64::NAN; count];
        let mut left_bytes = flows.bytes.clone();
        let mut rate = vec![0.0; count];
        // Absolute starts in (time, index) order, so ties break the same way on every run.
        let mut starts: Vec<u32> = (0..count as u32)
            .filter(|&f| flows.after[f as usize] == NONE)
            .collect();
        starts.sort_by(|&a, &b| {
            flows.start[a as usize]
                .total_cmp(&flows.start[b as usize])
                .then(a.cmp(&b))
        });
        // The flows waiting for each flow (a list through `next_waiter`), and the starts they
        // got once it ended, earliest first (ties by index).
        let mut first_waiter = vec![NONE; count];
        let mut next_waiter = vec![NONE; count];
        for f in (0..count).rev() {
            let p = flows.after[f];
            if p != NONE {
                next_waiter[f] = first_waiter[p as usize];
                first_waiter[p as usize] = f as u32;
            }
        }
        let mut due: BinaryHeap<Entry> = BinaryHeap::new();
        let mut start_at = flows.start.clone();
        let release = |f: usize, t: f64, due: &mut BinaryHeap<Entry>, start_at: &mut [f64]| {
            let mut w = first_waiter[f];
            while w != NONE {
                start_at[w as usize] = t + flows.start[w as usize];
                due.push(Entry(start_at[w as usize], w));
                w = next_waiter[w as usize];
            }
        };
        // Flows with a cap of their own, smallest cap first (ties by index).
        let mut capped: Vec<u32> = (0..count as u32)
            .filter(|&f| flows.cap[f as usize].is_finite())
            .collect();
        capped.sort_by(|&a, &b| {
            flows.cap[a as usize]
                .total_cmp(&flows.cap[b as usize])
                .then(a.cmp(&b))
        });
        self.free.clear();
        self.free.resize(count.div_ceil(64), 0);
        self.index(flows, &end);
        let (mut ended_before_index, mut ended_since_index) = (0usize, 0usize);
        let mut next_start = 0usize;
        let mut active: Vec<u32> = Vec::new();
        let mut t = starts.first().map_or(0.0, |&f| flows.start[f as usize]);
        let t0 = t;
        loop {
            // Every start due now joins: the absolute ones, then those released by ends.
            let mut changed = false;
            loop {
                let f =
                    if next_start < starts.len() && flows.start[starts[next_start] as usize] <= t {
                        next_start += 1;
                        starts[next_start - 1]
                    } else if due.peek().is_some_and(|e| e.0 <= t) {
                        due.pop().map_or(NONE, |e| e.1)
                    } else {
                        break;
                    };
                let fu = f as usize;
                if flows.bytes[fu] <= 0.0 {
                    end[fu] = t.max(start_at[fu]);
                    ended_since_index += 1;
                    release(fu, end[fu], &mut due, &mut start_at);
                } else {
                    active.push(f);
                    for &l in flows.path(fu) {
                        self.active_on[l as usize] += 1;
                    }
                    changed = true;
                }
            }
            let next = starts
                .get(next_start)
                .map_or(f64::INFINITY, |&f| flows.start[f as usize])
                .min(due.peek().map_or(f64::INFINITY, |e| e.0));
            if active.is_empty() {
                if next.is_finite() {
                    t = next;
                    continue;
                }
                break;
            }
            if changed {
                self.events += 1;
            }
            self.peak_flows = self.peak_flows.max(active.len());
            self.rates(flows, &active, &capped, &mut rate);
            let mut dt = f64::INFINITY;
            for &f in &active {
                dt = dt.min(left_bytes[f as usize] / rate[f as usize]);
            }
            let t_next = (t + dt).min(next);
            let span = t_next - t;
            for &l in &self.touched {
                self.link_busy_us[l as usize] += span;
            }
            let finishing_all = t + dt <= next;
            let slack = dt * 1e-9 + self.tolerance * (t_next - t0);
            let mut ended = false;
            let active_on = &mut self.active_on;
            let released = &mut Vec::new();
            active.retain(|&f| {
                let fu = f as usize;
                let lb = &mut left_bytes[fu];
                *lb -= rate[fu] * span;
                let done =
                    *lb <= flows.bytes[fu] * 1e-9 || (finishing_all && *lb / rate[fu] <= slack);
                if done {
                    end[fu] = t_next;
                    for &l in flows.path(fu) {
                        active_on[l as usize] -= 1;
                    }
                    ended_since_index += 1;
                    ended = true;
                    if first_waiter[fu] != NONE {
                        released.push(fu);
                    }
                }
                !done
            });
            for &f in released.iter() {
                release(f, t_next, &mut due, &mut start_at);
            }
            if ended {
                self.events += 1;
            }
            // Ended flows stay in the link index until they outnumber the others.
            if ended_since_index > count - ended_before_index - ended_since_index {
                self.index(flows, &end);
                ended_before_index += ended_since_index;
                ended_since_index = 0;
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

    /// Indexes the flows not yet ended by the links they cross (`at`, `on`).
    fn index(&mut self, flows: &Flows, end: &[f64]) {
        let k = self.cap.len();
        self.at.clear();
        self.at.resize(k + 1, 0);
        let live = |f: usize| end[f].is_nan();
        for f in (0..flows.len()).filter(|&f| live(f)) {
            for &l in flows.path(f) {
                self.at[l as usize + 1] += 1;
            }
        }
        for l in 0..k {
            self.at[l + 1] += self.at[l];
        }
        let mut fill = self.at.clone();
        self.on.clear();
        self.on.resize(self.at[k] as usize, 0);
        for f in (0..flows.len()).filter(|&f| live(f)) {
            for &l in flows.path(f) {
                let li = l as usize;
                self.on[fill[li] as usize] = f as u32;
                fill[li] += 1;
            }
        }
    }

    /// Max-min fair rates of the `active` flows into `rate` (progressive filling); leaves
    /// `touched` holding the links the flows cross. The links wait in a heap by their share
    /// per unfrozen flow; the smallest fixes the rate of its unfrozen flows, which leave every
    /// link they cross. A link's share only grows as flows leave it (they leave at most its
    /// share), so an entry whose share has grown since it was pushed is pushed again. The
    /// flows' own caps (`capped`, smallest first) merge with the heap, a link winning a tie.
    /// Each flow is frozen once: the cost is the flows' links plus a heap operation per link
    /// and per change of its share, with no work per flow outside its links.
    fn rates(&mut self, flows: &Flows, active: &[u32], capped: &[u32], rate: &mut [f64]) {
        for &f in active {
            self.free[f as usize / 64] |= 1 << (f % 64);
        }
        self.touched.clear();
        let mut heap: BinaryHeap<Entry> = BinaryHeap::new();
        for l in 0..self.cap.len() {
            let c = self.active_on[l];
            self.n[l] = c;
            if c > 0 {
                self.touched.push(l as u32);
                self.left[l] = self.cap[l];
                heap.push(Entry(self.cap[l] / c as f64, l as u32));
            }
        }
        let mut unfrozen = active.len();
        let mut next_cap = 0usize;
        while unfrozen > 0 {
            while next_cap < capped.len() {
                let f = capped[next_cap] as usize;
                if self.is_free(f) {
                    break;
                }
                next_cap += 1;
            }
            let cap = capped
                .get(next_cap)
                .map_or(f64::INFINITY, |&f| flows.cap[f as usize]);
            let link_first = heap.peek().is_some_and(|p| p.0 <= cap);
            if !link_first {
                if next_cap == capped.len() {
                    break;
                }
                self.freeze(flows, capped[next_cap], cap, rate);
                unfrozen -= 1;
                continue;
            }
            let Some(Entry(share, e)) = heap.pop() else {
                break;
            };
            let li = e as usize;
            if self.n[li] == 0 {
                continue;
            }
            let now = self.left[li].max(0.0) / self.n[li] as f64;
            if now > share * (1.0 + 1e-12) {
                heap.push(Entry(now, e));
                continue;
            }
            for k in self.at[li] as usize..self.at[li + 1] as usize {
                let f = self.on[k];
                let fu = f as usize;
                if self.is_free(fu) {
                    self.freeze(flows, f, now, rate);
                    unfrozen -= 1;
                }
            }
        }
    }

    fn is_free(&self, f: usize) -> bool {
        self.free[f / 64] >> (f % 64) & 1 == 1
    }

    fn freeze(&mut self, flows: &Flows, f: u32, m: f64, rate: &mut [f64]) {
        self.free[f as usize / 64] &= !(1 << (f % 64));
        rate[f as usize] = m;
        for &l in flows.path(f as usize) {
            self.left[l as usize] -= m;
            self.n[l as usize] -= 1;
        }
    }
}
