//! Runs a [`Program`] on a [`Topology`]: phase after phase, every transfer a flow over its
//! driving GPU's port and its route, in the [`Engine`].

use crate::fluid::{Engine, Flows};
use crate::schedule::{route_latency, Program, Xfer};
use crate::topology::{Port, Topology};
use crate::Result;

/// Flows in a phase beyond which nearby ends are handled together.
pub const LARGE_PHASE: usize = 10_000;

/// The part of a large phase's elapsed time within which ends come together: the phase's time
/// moves by at most about this part of it, a flow's end by at most about three times
/// ([`Engine::tolerance`]).
pub const TOLERANCE: f64 = 0.002;

/// Flows in a phase beyond which ends within [`HUGE_TOLERANCE`] come together.
pub const HUGE_PHASE: usize = 4_000_000;

/// The part of a huge phase's elapsed time within which ends come together.
pub const HUGE_TOLERANCE: f64 = 0.01;

/// A link's use over a run.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkUse {
    /// The link's index in [`Topology::links`].
    pub link: usize,
    /// Its name.
    pub name: String,
    /// Bytes that crossed it.
    pub bytes: f64,
    /// µs during which it carried a flow.
    pub busy_us: f64,
    /// Bytes over what it could carry in the whole run.
    pub utilisation: f64,
}

/// The outcome of one simulated call.
#[derive(Clone, Debug)]
pub struct SimResult {
    /// The schedule's operation name.
    pub op: &'static str,
    /// PEs.
    pub pes: usize,
    /// nccl-tests' size.
    pub bytes: usize,
    /// The path the library picked.
    pub path: String,
    /// Simulated time of the call, µs.
    pub time_us: f64,
    /// bytes / time, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth (nccl-tests' factor), GB/s.
    pub busbw_gbps: f64,
    /// Phases and their (start, end), µs.
    pub phases: Vec<(&'static str, f64, f64)>,
    /// Events the engine handled.
    pub events: u64,
    /// Flows simulated.
    pub flows: u64,
    /// Most flows in flight at once.
    pub peak_flows: usize,
    /// Bytes that crossed each link of the topology.
    pub link_bytes: Vec<f64>,
    /// µs each link carried a flow.
    pub link_busy_us: Vec<f64>,
}

impl SimResult {
    /// The links that carried bytes, busiest first (most bytes; ties by index), at most `k`,
    /// ports included where `ports`.
    pub fn busiest(&self, topo: &Topology, k: usize, ports: bool) -> Vec<LinkUse> {
        let mut v: Vec<usize> = (0..self.link_bytes.len())
            .filter(|&l| self.link_bytes[l] > 0.0 && (ports || !topo.is_port(l)))
            .collect();
        v.sort_by(|&a, &b| {
            self.link_bytes[b]
                .total_cmp(&self.link_bytes[a])
                .then(a.cmp(&b))
        });
        v.truncate(k);
        v.into_iter()
            .map(|l| LinkUse {
                link: l,
                name: topo.link_name(l),
                bytes: self.link_bytes[l],
                busy_us: self.link_busy_us[l],
                utilisation: self.link_bytes[l]
                    / (topo.links()[l].params.gbps * 1e3 * self.time_us.max(1e-12)),
            })
            .collect()
    }
}

/// Simulates `program` on `topo`; `progress(done, total)` after every phase.
pub fn simulate(
    topo: &Topology,
    program: &Program,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult> {
    let mut engine = Engine::new(topo.links().iter().map(|l| l.params.gbps));
    let mut t = 0.0f64;
    let mut phases = Vec::with_capacity(program.phases.len());
    let mut route = Vec::new();
    let mut flows_n = 0u64;
    for (i, ph) in program.phases.iter().enumerate() {
        let start = t + ph.before_us;
        let mut flows = Flows::new();
        let mut path = Vec::new();
        for x in &ph.xfers {
            route.clear();
            path.clear();
            let (s, d) = (x.src as usize, x.dst as usize);
            let driver = if x.port == Port::Load { d } else { s };
            path.push(topo.port(driver, x.port));
            let mut lat = 0.0;
            if s != d {
                topo.route_into(s, d, &mut route)?;
                lat = route_latency(topo, &route);
                path.extend_from_slice(&route);
            }
            if x.after == Xfer::FIRST {
                flows.add(start + lat, x.bytes as f64, x.cap_gbps as f64, &path);
            } else {
                // Its first byte a route's latency after the last one of the transfer before.
                flows.add_after(
                    x.after as usize,
                    lat,
                    x.bytes as f64,
                    x.cap_gbps as f64,
                    &path,
                );
            }
        }
        flows_n += flows.len() as u64;
        // Past LARGE_PHASE flows, ends within TOLERANCE of the phase's elapsed time come
        // together: a random routing gives every pair its own size, and an event per end
        // would recompute the rates of a million flows a million times.
        engine.tolerance = if flows.len() > HUGE_PHASE {
            HUGE_TOLERANCE
        } else if flows.len() > LARGE_PHASE {
            TOLERANCE
        } else {
            0.0
        };
        let ends = engine.run(&flows);
        let last = ends.iter().copied().fold(start, f64::max);
        let end = last.max(start + ph.beside_us) + ph.after_us;
        phases.push((ph.what, t, end));
        t = end;
        progress(i + 1, program.phases.len());
    }
    let algbw = program.bytes as f64 / (t * 1e3).max(1e-12);
    Ok(SimResult {
        op: program.op.name(),
        pes: program.pes,
        bytes: program.bytes,
        path: program.path.clone(),
        time_us: t,
        algbw_gbps: algbw,
        busbw_gbps: algbw * program.op.bus_factor(program.pes),
        phases,
        events: engine.events,
        flows: flows_n,
        peak_flows: engine.peak_flows,
        link_bytes: engine.link_bytes,
        link_busy_us: engine.link_busy_us,
    })
}
