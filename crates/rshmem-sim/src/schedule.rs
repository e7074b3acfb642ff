//! The schedule of one call, from rshmem's own code: which path the GPU call takes
//! ([`PathRules::path`]), what a one-kernel path moves ([`path_traffic`]), the steps of a
//! barrier-based plan ([`rshmem::coll::plan`]) as the GPU plan executor launches them
//! ([`copy_grid`], [`reduce_grid`], [`plan_fused`]), and the MoE traffic of a routing
//! ([`Layout`]).
//!
//! A [`Program`] is a list of phases that every PE runs in step: the plan's barriers separate
//! its phases, and a one-kernel path is one phase (its handshake before the data, its fences
//! after). Within a phase the transfers run side by side as flows.

use crate::topology::{Port, Topology};
use crate::{Result, SimError};
use rshmem::coll::plan::{self, Algo, CollKind, Shape, Step};
use rshmem::coll::CollConfig;
use rshmem::cuda::traffic::{ll_late_waits, path_traffic, Mover, PathTraffic};
use rshmem::cuda::{
    copy_grid, plan_fused, reduce_grid, CallFacts, CollPath, CollTuning, PathRules,
    PLAN_COPIES_PER_KERNEL,
};
use rshmem::ep::Layout;

/// An operation the simulator times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A collective, on the path the library picks.
    Coll(CollKind),
    /// MoE dispatch ([`EpSpec`]).
    Dispatch,
    /// MoE combine.
    Combine,
    /// A device put from PE 0 to PE 1 (SM stores).
    Put,
    /// A device get by PE 0 from PE 1 (SM loads).
    Get,
    /// A ring all_reduce (NCCL's algorithm, as a reference): 2(n-1) steps of n/1 parts.
    RingAllReduce,
}

impl Op {
    /// The operation named `s` (`all_reduce`, `all_to_all`, `all_gather`, `reduce_scatter`,
    /// `broadcast`, `reduce`, `dispatch`, `combine`, `put`, `get`, `ring_all_reduce`).
    pub fn parse(s: &str) -> Result<Op> {
        let kinds = [
            CollKind::AllReduce,
            CollKind::AllToAll,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
            CollKind::Reduce,
        ];
        if let Some(k) = kinds.iter().find(|k| k.name() == s) {
            return Ok(Op::Coll(*k));
        }
        Ok(match s {
            "dispatch" | "ep_dispatch" => Op::Dispatch,
            "combine" | "ep_combine" => Op::Combine,
            "put" | "device_put" => Op::Put,
            "get" | "device_get" => Op::Get,
            "ring_all_reduce" => Op::RingAllReduce,
            _ => return Err(SimError::Invalid(format!("unknown operation {s:?}"))),
        })
    }

    /// Its name, as `rshmem perf` records it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Coll(k) => k.name(),
            Op::Dispatch => "ep_dispatch",
            Op::Combine => "ep_combine",
            Op::Put => "device_put",
            Op::Get => "device_get",
            Op::RingAllReduce => "ring_all_reduce",
        }
    }

    /// nccl-tests' bus bandwidth factor on `n` PEs.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Op::Coll(CollKind::AllReduce) | Op::RingAllReduce => 2.0 * (n - 1.0) / n,
            Op::Coll(CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll) => {
                (n - 1.0) / n
            }
            _ => 1.0,
        }
    }
}

/// A MoE call's shape and routing.
#[derive(Clone, Debug, PartialEq)]
pub struct EpSpec {
    /// Tokens per PE.
    pub tokens: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Experts per token.
    pub topk: usize,
    /// Experts in all.
    pub experts: usize,
    /// Bytes per element of a row (bf16: 2).
    pub elem: usize,
    /// Seed of the random routing.
    pub seed: u64,
    /// Token-major receive layout (each token once per PE); else expert-major (each row
    /// expanded into its experts' slots on arrival).
    pub token_major: bool,
    /// Top-k ids of every PE (`[pes][tokens * topk]`) instead of the seeded routing.
    pub routing: Option<Vec<Vec<i32>>>,
}

impl Default for EpSpec {
    /// `rshmem perf`'s GPU MoE case: T = 4096, H = 7168, k = 8, E = 256, bf16.
    fn default() -> Self {
        EpSpec {
            tokens: 4096,
            hidden: 7168,
            topk: 8,
            experts: 256,
            elem: 2,
            seed: 1,
            token_major: false,
            routing: None,
        }
    }
}

/// What decides a call's path and shape besides the call.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The plans' configuration.
    pub config: CollConfig,
    /// The GPU collectives' tuning.
    pub tuning: CollTuning,
    /// Symmetric heap per PE (sizes the LL paths, as [`CollTuning::ll_sizes`]).
    pub heap: usize,
    /// Bytes per element of the collectives (f32: 4).
    pub elem: usize,
    /// The MoE calls.
    pub ep: EpSpec,
}

impl Default for Setup {
    /// The library's defaults with `rshmem perf`'s 2.5 GiB heap and f32 elements.
    fn default() -> Self {
        Setup {
            config: CollConfig::default(),
            tuning: CollTuning::default(),
            heap: 5 << 29,
            elem: 4,
            ep: EpSpec::default(),
        }
    }
}

/// One transfer: `bytes` on the wire from GPU `src` to GPU `dst` (equal: a local copy), on
/// the driving GPU's port, at most `cap_gbps` (a kernel's blocks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Xfer {
    /// Sender.
    pub src: u32,
    /// Receiver.
    pub dst: u32,
    /// Bytes on the wire.
    pub bytes: f32,
    /// Most GB/s of this transfer alone.
    pub cap_gbps: f32,
    /// Whose SMs move it: the sender's stores, the receiver's loads, or a local copy.
    pub port: Port,
    /// The transfer of the same phase (an index into its transfers, before this one) whose end
    /// this one waits for, a route's latency after it ([`Xfer::FIRST`]: none, it starts with
    /// the phase): a thread's next loads, issued once its last ones are in.
    pub after: u32,
}

impl Xfer {
    /// [`Xfer::after`] of a transfer that waits for none.
    pub const FIRST: u32 = u32::MAX;
}

/// One phase: a fixed cost, the transfers side by side, then a fixed cost after them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phase {
    /// What it is (`barrier`, `kernel`, `handshake+data`, ...).
    pub what: &'static str,
    /// µs before the transfers start (launch, handshakes).
    pub before_us: f64,
    /// µs after the last transfer (fences and done flags).
    pub after_us: f64,
    /// Local work that runs beside the transfers (a fold), µs from their start.
    pub beside_us: f64,
    /// The transfers.
    pub xfers: Vec<Xfer>,
}

/// A call's schedule.
#[derive(Clone, Debug)]
pub struct Program {
    /// The operation.
    pub op: Op,
    /// PEs.
    pub pes: usize,
    /// nccl-tests' size of the call (MoE: the bytes PE 0 sends to other PEs).
    pub bytes: usize,
    /// The path's name as `rshmem perf` notes it.
    pub path: String,
    /// The phases, in order.
    pub phases: Vec<Phase>,
}

/// Builds the schedule of `op` of `bytes` on the first `pes` GPUs of `topo`.
pub fn build(topo: &Topology, setup: &Setup, op: Op, pes: usize, bytes: usize) -> Result<Program> {
    if pes < 2 || pes > topo.gpus() {
        return Err(SimError::Invalid(format!(
            "{pes} PEs on a topology of {} GPUs: need 2 to {}",
            topo.gpus(),
            topo.gpus()
        )));
    }
    let b = Builder {
        topo,
        setup,
        n: pes,
        lat: max_latency(topo, pes)?,
    };
    match op {
        Op::Coll(kind) => b.coll(kind, bytes),
        Op::Dispatch | Op::Combine => b.moe(op),
        Op::Put | Op::Get => Ok(b.p2p(op, bytes)),
        Op::RingAllReduce => Ok(b.ring(bytes)),
    }
}

/// The largest latency of a route from GPU 0 to another of the first `pes` (what a barrier
/// or handshake waits for).
fn max_latency(topo: &Topology, pes: usize) -> Result<f64> {
    let mut worst: f64 = 0.0;
    let mut r = Vec::new();
    for d in 1..pes {
        r.clear();
        topo.route_into(0, d, &mut r)?;
        worst = worst.max(route_latency(topo, &r));
    }
    Ok(worst)
}

/// A route's latency: every link's latency and per-message cost.
pub fn route_latency(topo: &Topology, route: &[u32]) -> f64 {
    route
        .iter()
        .map(|&l| {
            let p = topo.links()[l as usize].params;
            p.latency_us + p.per_message_us
        })
        .sum()
}

struct Builder<'a> {
    topo: &'a Topology,
    setup: &'a Setup,
    n: usize,
    lat: f64,
}

impl Builder<'_> {
    fn rules(&self) -> PathRules<'_> {
        PathRules {
            config: &self.setup.config,
            tuning: &self.setup.tuning,
            ll_sizes: self.setup.tuning.ll_sizes(self.setup.heap, self.n),
        }
    }

    fn program(&self, op: Op, bytes: usize, path: String, phases: Vec<Phase>) -> Program {
        Program {
            op,
            pes: self.n,
            bytes,
            path,
            phases,
        }
    }

    /// What a kernel that waits for every other member spends on them beyond the flags'
    /// latency.
    fn peers_us(&self) -> f64 {
        (self.n - 1) as f64 * self.topo.model.peer_us
    }

    fn block_gbps(&self) -> f64 {
        self.topo.model.block_gbps
    }

    fn coll(&self, kind: CollKind, bytes: usize) -> Result<Program> {
        let rules = self.rules();
        let facts = CallFacts::out_of_place(self.n, rules.ll_serves(self.n));
        let path = rules.path(kind, facts, bytes);
        let phases = match path {
            CollPath::Plan(algo) => self.plan(kind, algo, bytes)?,
            _ => self.one_kernel(&rules, facts, path, kind, bytes)?,
        };
        Ok(self.program(Op::Coll(kind), bytes, path.name().to_string(), phases))
    }

    /// A one-kernel path: launch and handshakes, the transfers at the grid's rate, the fold
    /// beside them, then the fences.
    fn one_kernel(
        &self,
        rules: &PathRules<'_>,
        f: CallFacts,
        path: CollPath,
        kind: CollKind,
        bytes: usize,
    ) -> Result<Vec<Phase>> {
        let n = self.n;
        let t = &self.setup.tuning;
        let part = bytes / n;
        let ll = rules.ll_grid(kind, n, bytes, t.ll_ctrl_lines);
        let blocks = match path {
            CollPath::Ll => ll.blocks,
            CollPath::Pull | CollPath::PullTwoShot | CollPath::Push => match kind {
                CollKind::AllReduce => rules
                    .pull_all_reduce(f, bytes, self.setup.config.algo.is_none())
                    .map(|x| x.0),
                CollKind::ReduceScatter => rules.pull_reduce_scatter(f, part),
                CollKind::Broadcast => rules.pull_broadcast(f, bytes).map(|x| x.0),
                _ => rules.pull_all_to_all(f, part),
            }
            .unwrap_or(t.pull_blocks),
            CollPath::Chain => rules
                .pull_broadcast(f, bytes)
                .map_or(t.pull_blocks, |x| x.0),
            CollPath::Plan(_) => 1,
        };
        let traffic = path_traffic(path, kind, n, bytes, 0, blocks).ok_or_else(|| {
            SimError::Invalid(format!("{} has no {} path", kind.name(), path.name()))
        })?;
        let model = &self.topo.model;
        let last = traffic.rounds.len().saturating_sub(1);
        let mut phases = Vec::with_capacity(traffic.rounds.len());
        for (r, moves) in traffic.rounds.iter().enumerate() {
            let mut xfers = Vec::with_capacity(moves.len());
            for m in moves {
                // An LL line carries 8 data bytes in 16, and line stores reach only a part of
                // what bulk stores do.
                let wire = if m.mover == Mover::LlStore {
                    2.0 * m.bytes as f64 / model.ll_efficiency
                } else {
                    m.bytes as f64
                };
                let port = match (m.from == m.to, m.mover) {
                    (true, _) => Port::Hbm,
                    (false, Mover::Load) => Port::Load,
                    (false, _) => Port::Store,
                };
                xfers.push(Xfer {
                    src: m.from as u32,
                    dst: m.to as u32,
                    bytes: wire as f32,
                    cap_gbps: 0.0,
                    port,
                    after: Xfer::FIRST,
                });
            }
            if path == CollPath::Ll {
                // An LL call's threads store all their lines at once (the default grids give
                // every thread one batch of at most four), so no block rate bounds them: the
                // ports and links do.
                for x in &mut xfers {
                    x.cap_gbps = f32::INFINITY;
                }
            } else {
                self.share_grid(&mut xfers, blocks);
            }
            if traffic.wave > 0 {
                xfers = self.waves(&xfers, &traffic, blocks);
            }
            phases.push(Phase {
                what: path.name(),
                // A handshake's header follows a system-scope release fence (the caller's
                // writes before the call reach the members that read them).
                before_us: if r == 0 {
                    model.launch_us
                        + self.peers_us()
                        + traffic.handshakes as f64 * (self.lat + model.fence_us)
                } else {
                    0.0
                },
                // A block's fence stalls its next step; the flags after the fences travel
                // beside the data, and only the last one's latency shows.
                after_us: if r == last && traffic.fences > 0 {
                    traffic.fences as f64 * model.fence_us + self.lat
                } else {
                    0.0
                },
                // An LL call that takes its data only after the header's verdict waits once
                // more from the header's arrival: lines still coming in hide that wait.
                beside_us: if r == 0 {
                    let fold = traffic.fold_bytes as f64 / (self.topo.gpu.hbm_gbps * 1e3);
                    let late = ll_late_waits(kind, &ll, t.ll_threads) as f64;
                    if path == CollPath::Ll && late > 0.0 {
                        fold.max(self.lat + late * model.late_wait_us)
                    } else {
                        fold
                    }
                } else {
                    0.0
                },
                xfers,
            });
        }
        Ok(phases)
    }

    /// A kernel's remote transfers in waves ([`PathTraffic::wave`]): every member moves a
    /// wave's bytes from or to its members (reads in team order, its own input among them,
    /// when [`PathTraffic::ordered`]; else all together), each waiting for the one before it,
    /// and the next wave after the last, until every member's bytes have moved. Its local
    /// copies (none in an ordered fold) stay as they are.
    fn waves(&self, xfers: &[Xfer], traffic: &PathTraffic, blocks: u32) -> Vec<Xfer> {
        let folds = traffic.ordered && xfers.iter().any(|x| x.port == Port::Load);
        let mut out: Vec<Xfer> = xfers
            .iter()
            .filter(|x| x.port == Port::Hbm && !folds)
            .copied()
            .collect();
        let grid = (blocks as f64 * self.block_gbps()) as f32;
        for to in 0..self.n as u32 {
            let mut sources: Vec<Xfer> = xfers
                .iter()
                .filter(|x| match x.port {
                    Port::Load => x.dst == to,
                    Port::Store => x.src == to,
                    Port::Hbm => false,
                })
                .copied()
                .collect();
            let Some(first) = sources.first().copied() else {
                continue;
            };
            let ordered = traffic.ordered && first.port == Port::Load;
            if ordered {
                // One member read at a time, at the whole grid's rate; its own input too.
                for x in &mut sources {
                    x.cap_gbps = grid;
                }
                sources.push(Xfer {
                    src: to,
                    port: Port::Hbm,
                    cap_gbps: f32::INFINITY,
                    ..first
                });
                sources.sort_by_key(|x| x.src);
            }
            let bytes = first.bytes as f64;
            let wave = traffic.wave as f64;
            let mut last = Xfer::FIRST;
            let mut done = 0.0;
            while done < bytes {
                let chunk = wave.min(bytes - done);
                // Only the first wave's threads read in step; later ones have drifted apart,
                // so their reads spread over the members.
                let group = if ordered && done == 0.0 {
                    1
                } else {
                    sources.len()
                };
                // The next wave waits for the last of the group: a remote read, not the
                // member's own.
                if group > 1 {
                    sources.sort_by_key(|x| x.port != Port::Hbm);
                }
                for (i, x) in sources.iter().enumerate() {
                    out.push(Xfer {
                        bytes: chunk as f32,
                        after: last,
                        cap_gbps: if ordered && group > 1 {
                            x.cap_gbps / group as f32
                        } else {
                            x.cap_gbps
                        },
                        ..*x
                    });
                    if (i + 1) % group == 0 {
                        last = (out.len() - 1) as u32;
                    }
                }
                done += chunk;
                if done >= bytes
                    && !traffic.ordered
                    && first.port == Port::Store
                    && traffic.fold_bytes > 0
                {
                    // A pair's stores: the last step's fold (both inputs read, the sum
                    // written: a local copy and a half) follows them.
                    out.push(Xfer {
                        src: to,
                        dst: to,
                        bytes: (1.5 * chunk) as f32,
                        cap_gbps: f32::INFINITY,
                        port: Port::Hbm,
                        after: last,
                    });
                }
            }
        }
        out
    }

    /// Splits a kernel of `blocks` blocks (each at the model's block rate) over the remote
    /// transfers each GPU drives.
    fn share_grid(&self, xfers: &mut [Xfer], blocks: u32) {
        let mut driven = vec![0u32; self.n];
        let driver = |x: &Xfer| if x.port == Port::Load { x.dst } else { x.src } as usize;
        for x in xfers.iter().filter(|x| x.port != Port::Hbm) {
            driven[driver(x)] += 1;
        }
        let total = blocks as f64 * self.block_gbps();
        for x in xfers.iter_mut() {
            x.cap_gbps = if x.port == Port::Hbm {
                f32::INFINITY
            } else {
                (total / driven[driver(x)].max(1) as f64) as f32
            };
        }
    }

    /// A barrier-based plan as the GPU plan executor runs it: a barrier kernel per sync, copy
    /// steps gathered into kernels of [`PLAN_COPIES_PER_KERNEL`], a kernel per reduce step; a
    /// fusable plan as one kernel of one block with both barriers inside. Every member's k-th
    /// kernel after a barrier runs in the same phase.
    fn plan(&self, kind: CollKind, algo: Algo, bytes: usize) -> Result<Vec<Phase>> {
        let n = self.n;
        let es = self.setup.elem;
        let count = match kind {
            CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => bytes / n / es,
            _ => bytes / es,
        };
        let model = self.topo.model;
        let sms = self.topo.gpu.sms;
        let barrier = model.launch_us + self.peers_us() + 2.0 * self.lat;
        // segments[s][k]: the transfers of every member's k-th kernel after barrier s.
        let mut segments: Vec<Vec<Vec<Xfer>>> = Vec::new();
        let mut fused_all = true;
        for me in 0..n {
            let shape = Shape {
                n,
                me,
                in_place: false,
                chunk: usize::MAX,
            };
            let p = match kind {
                CollKind::AllReduce => plan::all_reduce(shape, count, algo),
                CollKind::AllGather => plan::all_gather(shape, count),
                CollKind::ReduceScatter => plan::reduce_scatter(shape, count),
                CollKind::AllToAll => plan::all_to_all(shape, count),
                CollKind::Broadcast => plan::broadcast(shape, 0, count, algo),
                CollKind::Reduce => plan::reduce(shape, 0, count),
                CollKind::AllToAllV => {
                    return Err(SimError::Invalid("all_to_all_v is not simulated".into()))
                }
            };
            let fused = plan_fused(&p, es, &self.setup.tuning);
            fused_all &= fused;
            let mut seg: isize = -1;
            let mut kernel: Vec<Xfer> = Vec::new();
            let mut kernels: Vec<Vec<Xfer>> = Vec::new();
            let close = |kernel: &mut Vec<Xfer>, kernels: &mut Vec<Vec<Xfer>>, reduce: bool| {
                if kernel.is_empty() {
                    return;
                }
                let blocks = if fused {
                    1
                } else if reduce {
                    reduce_grid(kernel[0].bytes as usize, sms)
                } else {
                    let max = kernel.iter().map(|x| x.bytes as u64).max().unwrap_or(0);
                    copy_grid(kernel.len(), max, sms)
                };
                let per = blocks as f64 * self.block_gbps() / kernel.len() as f64;
                for x in kernel.iter_mut() {
                    x.cap_gbps = if x.port == Port::Hbm {
                        f32::INFINITY
                    } else {
                        per as f32
                    };
                }
                kernels.push(std::mem::take(kernel));
            };
            let flush_seg =
                |seg: isize, kernels: &mut Vec<Vec<Xfer>>, segs: &mut Vec<Vec<Vec<Xfer>>>| {
                    if seg < 0 {
                        return;
                    }
                    let s = seg as usize;
                    if segs.len() <= s {
                        segs.resize_with(s + 1, Vec::new);
                    }
                    for (k, x) in kernels.drain(..).enumerate() {
                        if segs[s].len() <= k {
                            segs[s].resize_with(k + 1, Vec::new);
                        }
                        segs[s][k].extend(x);
                    }
                };
            for step in &p.steps {
                match *step {
                    Step::Sync => {
                        close(&mut kernel, &mut kernels, false);
                        flush_seg(seg, &mut kernels, &mut segments);
                        seg += 1;
                    }
                    Step::Copy { peer, len, .. } => {
                        if len > 0 {
                            kernel.push(self.xfer(peer, me, len * es));
                            if kernel.len() == PLAN_COPIES_PER_KERNEL {
                                close(&mut kernel, &mut kernels, false);
                            }
                        }
                    }
                    Step::Reduce { len, .. } => {
                        close(&mut kernel, &mut kernels, false);
                        for j in 0..n {
                            kernel.push(self.xfer(j, me, len * es));
                        }
                        close(&mut kernel, &mut kernels, true);
                    }
                    Step::ReduceGroup { group, len, .. } => {
                        close(&mut kernel, &mut kernels, false);
                        for &j in &p.groups[group] {
                            kernel.push(self.xfer(j, me, len * es));
                        }
                        close(&mut kernel, &mut kernels, true);
                    }
                }
            }
            close(&mut kernel, &mut kernels, false);
            flush_seg(seg, &mut kernels, &mut segments);
        }
        // Every sync is a barrier kernel: the first, then one after each segment's kernels
        // (the segment after the last sync holds none).
        while segments.last().is_some_and(|s| s.is_empty()) {
            segments.pop();
        }
        let mut phases = Vec::new();
        if fused_all {
            let xfers = segments.into_iter().flatten().flatten().collect();
            phases.push(Phase {
                what: "fused plan",
                before_us: model.launch_us + self.peers_us() + 2.0 * self.lat,
                after_us: 2.0 * self.lat,
                beside_us: 0.0,
                xfers,
            });
            return Ok(phases);
        }
        phases.push(Phase {
            what: "barrier",
            before_us: barrier,
            ..Phase::default()
        });
        for seg in segments {
            for xfers in seg {
                phases.push(Phase {
                    what: "kernel",
                    before_us: model.launch_us,
                    xfers,
                    ..Phase::default()
                });
            }
            phases.push(Phase {
                what: "barrier",
                before_us: barrier,
                ..Phase::default()
            });
        }
        Ok(phases)
    }

    /// A plan's copy or reduce input: member `from`'s bytes read by member `to`.
    fn xfer(&self, from: usize, to: usize, bytes: usize) -> Xfer {
        Xfer {
            src: from as u32,
            dst: to as u32,
            bytes: bytes as f32,
            cap_gbps: f32::INFINITY,
            port: if from == to { Port::Hbm } else { Port::Load },
            after: Xfer::FIRST,
        }
    }

    fn p2p(&self, op: Op, bytes: usize) -> Program {
        let port = if op == Op::Put {
            Port::Store
        } else {
            Port::Load
        };
        let (src, dst) = (0, 1);
        let xfers = vec![Xfer {
            src,
            dst,
            bytes: bytes as f32,
            cap_gbps: f32::INFINITY,
            port,
            after: Xfer::FIRST,
        }];
        let phase = Phase {
            what: "copy",
            before_us: self.topo.model.launch_us,
            xfers,
            ..Phase::default()
        };
        self.program(op, bytes, "sm".into(), vec![phase])
    }

    fn ring(&self, bytes: usize) -> Program {
        let n = self.n;
        let part = bytes as f64 / n as f64;
        let phases = (0..2 * (n - 1))
            .map(|_| Phase {
                what: "ring step",
                xfers: (0..n)
                    .map(|i| Xfer {
                        src: i as u32,
                        dst: ((i + 1) % n) as u32,
                        bytes: part as f32,
                        cap_gbps: f32::INFINITY,
                        port: Port::Store,
                        after: Xfer::FIRST,
                    })
                    .collect(),
                ..Phase::default()
            })
            .collect();
        self.program(Op::RingAllReduce, bytes, "ring".into(), phases)
    }

    /// MoE dispatch or combine from the routing's layout: the fixed work (layout kernel and
    /// count exchange), then every PE's rows to the PEs their experts live on, by stores on
    /// every SM, its own rows copied locally; a combine folds what arrives beside the
    /// transfers. An expert-major dispatch copies no own row: `ep_pstream` expands every row
    /// (its own from `x`, the peers' as they land) into its experts' slots while the rows
    /// come in, so the GPU's memory carries the send's reads, the rows landing, the
    /// expansion's reads and writes and the sentinel stored back over the peers' rows beside
    /// the link (one flow on its HBM port), and the step ends the expansion's tail after the
    /// last row is in ([`crate::Model::ep_expand_tail_us`]). An expert-major combine reads
    /// every served slot's expert output to sum a token's partial row before it sends it;
    /// that and the summing of the rows that land are its HBM flow. A token-major combine
    /// past the pulling threshold loads its rows from the peers.
    fn moe(&self, op: Op) -> Result<Program> {
        let n = self.n;
        let ep = &self.setup.ep;
        let row = (ep.hidden * ep.elem) as f64;
        let expands = op == Op::Dispatch && !ep.token_major;
        // An expert-major combine is summed on the expert side first (every slot's row of `y`
        // read there); its rows announce themselves like the dispatch's.
        let presums = op == Op::Combine && !ep.token_major;
        let mut xfers = Vec::new();
        let mut sent0 = 0usize;
        let mut pairs_in = vec![0usize; n];
        let mut rows_in = vec![0usize; n];
        // Rows each PE sends to its peers, and receives from them.
        let mut rows_out = vec![0usize; n];
        let mut peer_rows_in = vec![0usize; n];
        let mut max_pair = 0usize;
        let mut ids = vec![0i32; ep.tokens * ep.topk];
        for me in 0..n {
            match &ep.routing {
                Some(r) => {
                    let mine = r.get(me).ok_or_else(|| {
                        SimError::Invalid(format!("the routing has no ids for PE {me}"))
                    })?;
                    ids.clone_from(mine);
                }
                None => seeded_topk(ep, me, &mut ids),
            }
            let layout = Layout::compute(&ids, ep.topk, ep.experts, n)?;
            for (dst, &tokens) in layout.tokens_per_pe().iter().enumerate() {
                if tokens == 0 {
                    continue;
                }
                let (s, d) = if op == Op::Dispatch {
                    (me, dst)
                } else {
                    (dst, me)
                };
                if me == 0 && dst != 0 {
                    sent0 += tokens * ep.hidden * ep.elem;
                }
                if me != dst {
                    max_pair = max_pair.max(tokens);
                }
                rows_in[d] += tokens;
                if s != d {
                    rows_out[s] += tokens;
                    peer_rows_in[d] += tokens;
                } else if expands || presums {
                    // Read in place by the expansion or the summers (their HBM flow below).
                    continue;
                }
                xfers.push(Xfer {
                    src: s as u32,
                    dst: d as u32,
                    bytes: (tokens as f64 * row) as f32,
                    cap_gbps: f32::INFINITY,
                    port: if s == d { Port::Hbm } else { Port::Store },
                    after: Xfer::FIRST,
                });
            }
            for (p, c) in pairs_in.iter_mut().enumerate() {
                *c += layout.pairs_to_pe(p);
            }
        }
        // A token-major combine (`combine_tokens`) reads its tokens' rows from the peers'
        // `y` where a pair's rows reach the pulling threshold (the benchmark's capacity: the
        // most tokens a PE sends one peer), behind a ready and before a done handshake.
        let pulls = op == Op::Combine
            && ep.token_major
            && max_pair as f64 * row >= rshmem::cuda::ep::PULL_MIN_PAIR_BYTES as f64;
        if pulls {
            for x in xfers.iter_mut().filter(|x| x.port == Port::Store) {
                x.port = Port::Load;
            }
        }
        let blocks = self.topo.gpu.sms;
        self.share_grid(&mut xfers, blocks);
        let model = &self.topo.model;
        if expands || presums {
            for pe in 0..n {
                // Rows read and written; the HBM port's rate is that of a copy (a read and a
                // write per byte). A dispatch: the send's reads, the rows landing, the
                // expansion's reads and writes, the sentinel back. A combine: every served
                // slot's row of `y`, the partial rows landing, read by the summers and the
                // sentinel back, the output.
                let traffic = if expands {
                    rows_out[pe] + peer_rows_in[pe] + rows_in[pe] + pairs_in[pe] + peer_rows_in[pe]
                } else {
                    pairs_in[pe] + 3 * peer_rows_in[pe] + ep.tokens
                };
                xfers.push(Xfer {
                    src: pe as u32,
                    dst: pe as u32,
                    bytes: (traffic as f64 * row / 2.0) as f32,
                    cap_gbps: f32::INFINITY,
                    port: Port::Hbm,
                    after: Xfer::FIRST,
                });
            }
        }
        // A combine folds the returned rows beside the transfers, on the busiest PE.
        let hbm = self.topo.gpu.local_copy_gbps * 1e3;
        let local = if op == Op::Combine && !presums {
            rows_in.iter().max().copied().unwrap_or(0) as f64 * row / hbm
        } else {
            0.0
        };
        let phase = Phase {
            what: if op == Op::Dispatch {
                "dispatch"
            } else {
                "combine"
            },
            before_us: if op == Op::Dispatch {
                model.ep_dispatch_us
            } else {
                model.ep_combine_us
            } + self.peers_us()
                + if pulls { 3.0 } else { 2.0 } * self.lat,
            after_us: model.fence_us
                + if pulls { 2.0 } else { 1.0 } * self.lat
                + if expands {
                    model.ep_expand_tail_us
                } else {
                    0.0
                },
            beside_us: local,
            xfers,
        };
        let layout = if ep.token_major {
            "token_major"
        } else {
            "expert_major"
        };
        Ok(self.program(op, sent0, layout.into(), vec![phase]))
    }
}

/// Seeded top-k routing of PE `pe`: every token picks `topk` distinct experts uniformly
/// (splitmix64 of the seed, the PE and the token), written into `ids`.
pub fn seeded_topk(ep: &EpSpec, pe: usize, ids: &mut [i32]) {
    let mut s = ep.seed ^ (pe as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let k = ep.topk.min(ep.experts);
    for t in 0..ep.tokens {
        let row = &mut ids[t * ep.topk..(t + 1) * ep.topk];
        row.fill(-1);
        let mut got = 0;
        while got < k {
            let e = (next() % ep.experts as u64) as i32;
            if !row[..got].contains(&e) {
                row[got] = e;
                got += 1;
            }
        }
    }
}
