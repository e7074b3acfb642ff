//! Topologies: GPUs, the links between them, switches and NICs, read from TOML.
//!
//! A file names the GPU model (`[gpu]`), the fabric (`[fabric]`, one of the generators below
//! or an explicit list of nodes and links) and the model's calibrated parameters (`[model]`).
//! Every link is one direction; a cable is two links. Besides the fabric's links every GPU has
//! three *ports*, links of its own that no route crosses but that its transfers do: the SMs
//! storing into peers (`store`), the SMs loading from peers (`load`) and local copies (`hbm`).
//! A port caps what one GPU moves however many links it spreads over, which is what the
//! measurements show (SM stores into peers stay well below the links' raw bandwidth).

use crate::{Result, SimError};
use serde::Deserialize;
use std::collections::VecDeque;

/// One direction of a link.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct LinkParams {
    /// Bandwidth, GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Latency of a message across it, µs.
    pub latency_us: f64,
    /// Fixed cost of every message that crosses it, µs.
    #[serde(default)]
    pub per_message_us: f64,
}

/// A GPU model.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct GpuSpec {
    /// Streaming multiprocessors.
    pub sms: u32,
    /// HBM bandwidth, GB/s.
    pub hbm_gbps: f64,
    /// Copy engines.
    pub copy_engines: u32,
    /// One copy engine's rate into a peer, GB/s.
    pub ce_gbps: f64,
    /// A device-local copy (read and write), GB/s.
    pub local_copy_gbps: f64,
    /// All of the GPU's SM stores into peers together, GB/s.
    pub store_gbps: f64,
    /// All of the GPU's SM loads from peers together, GB/s.
    pub load_gbps: f64,
}

/// The model's calibrated parameters ([`crate::calibrate`] fits them).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct Model {
    /// A kernel's launch and start on a stream (graph replay), µs.
    pub launch_us: f64,
    /// One block's copy rate into or from a peer, GB/s: a kernel of b blocks moves at most
    /// b times this.
    pub block_gbps: f64,
    /// A system-scope fence and the flag after it, beyond the flag's own latency, µs
    /// (measured, not fitted: data, fence and flag one way less a flag alone).
    pub fence_us: f64,
    /// What an LL call that takes its data lines only after the header's verdict
    /// ([`rshmem::cuda::traffic::ll_late_waits`]) spends on that wait: a block barrier and a
    /// load round trip of its own memory, µs (measured by the LL kernels' clock stamps, not
    /// fitted).
    #[serde(default = "default_late_wait_us")]
    pub late_wait_us: f64,
    /// What a kernel that meets its peers (a barrier, an LL or pull kernel) spends per peer
    /// beyond the flags' latency, µs.
    pub peer_us: f64,
    /// The part of the bulk store rate that LL line stores reach.
    pub ll_efficiency: f64,
    /// The fixed work of a MoE dispatch besides its rows (layout kernel, count exchange,
    /// read-back), µs.
    pub ep_dispatch_us: f64,
    /// The fixed work of a MoE combine besides its rows, µs.
    pub ep_combine_us: f64,
    /// An expert-major dispatch's expansion from the last row's arrival to `ep_pstream`'s
    /// end (a row's ticket, records, slot atomics and chunks, the last block's check), µs
    /// (measured by the MoE kernels' clock stamps, not fitted).
    #[serde(default = "default_ep_expand_tail_us")]
    pub ep_expand_tail_us: f64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            launch_us: 2.0,
            block_gbps: 16.0,
            fence_us: 0.98,
            peer_us: 0.5,
            late_wait_us: default_late_wait_us(),
            ll_efficiency: 1.0,
            ep_dispatch_us: 20.0,
            ep_combine_us: 10.0,
            ep_expand_tail_us: default_ep_expand_tail_us(),
        }
    }
}

/// [`Model::late_wait_us`] of a file that gives none: an H200's, from the LL kernels' clock
/// stamps (BENCHMARKS.md, Simulator).
fn default_late_wait_us() -> f64 {
    0.47
}

/// [`Model::ep_expand_tail_us`] of a file that gives none: 2x H200's, from the MoE kernels'
/// clock stamps (BENCHMARKS.md, Simulator).
fn default_ep_expand_tail_us() -> f64 {
    19.8
}

/// The fabric generators and the explicit form.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FabricSpec {
    /// A link between every ordered pair of GPUs (NVLink mesh).
    Mesh {
        /// GPUs.
        gpus: usize,
        /// Each pair's link.
        link: LinkParams,
    },
    /// Every GPU linked to one switch (an NVSwitch domain).
    Switch {
        /// GPUs.
        gpus: usize,
        /// Each GPU's link to the switch.
        link: LinkParams,
    },
    /// GPU i linked to i - 1 and i + 1; routes take the shorter way.
    Ring {
        /// GPUs.
        gpus: usize,
        /// Each neighbour link.
        link: LinkParams,
    },
    /// An x by y torus; routes go along x, then along y, the shorter way around each.
    Torus2d {
        /// Columns.
        x: usize,
        /// Rows.
        y: usize,
        /// Each neighbour link.
        link: LinkParams,
    },
    /// GPUs under PCIe switches under one root complex.
    PcieTree {
        /// GPUs.
        gpus: usize,
        /// GPUs per PCIe switch.
        gpus_per_switch: usize,
        /// A GPU's link to its switch.
        link: LinkParams,
        /// A switch's link to the root complex.
        up: LinkParams,
    },
    /// Nodes of GPUs on an NVSwitch each, every GPU with a NIC on its rail's leaf switch;
    /// leaves of a rail meet at that rail's spine. A transfer to another rail crosses NVLink
    /// first to the GPU of the destination's rail (PXN), so only rails carry network traffic.
    RailFatTree {
        /// Nodes.
        nodes: usize,
        /// GPUs per node (= rails).
        gpus_per_node: usize,
        /// Nodes per leaf switch.
        nodes_per_leaf: usize,
        /// A GPU's link to its node's NVSwitch.
        nvlink: LinkParams,
        /// A NIC's link to its leaf.
        nic: LinkParams,
        /// A leaf's link to its rail's spine (all its uplinks together).
        spine: LinkParams,
    },
    /// Nodes and links as listed; GPUs are nodes `gpu0`.. `gpu{gpus-1}`, routes are the
    /// fewest hops (the first link listed wins a tie).
    Links {
        /// GPUs.
        gpus: usize,
        /// Other nodes (switches, NICs), by name.
        #[serde(default)]
        nodes: Vec<String>,
        /// The links.
        links: Vec<ExplicitLink>,
    },
}

/// A link of the explicit form.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ExplicitLink {
    /// From node (`gpuN` or a name of `nodes`).
    pub from: String,
    /// To node.
    pub to: String,
    /// Its parameters.
    #[serde(flatten)]
    pub params: LinkParams,
    /// Also the link back, with the same parameters.
    #[serde(default)]
    pub both: bool,
}

#[derive(Deserialize)]
struct File {
    name: String,
    gpu: GpuSpec,
    fabric: FabricSpec,
    #[serde(default)]
    model: Option<Model>,
}

/// A built link (one direction).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// From node.
    pub from: u32,
    /// To node.
    pub to: u32,
    /// Its parameters.
    pub params: LinkParams,
}

/// A GPU's port ([`Topology::port`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// Its SMs storing into peers.
    Store,
    /// Its SMs loading from peers.
    Load,
    /// Its local copies.
    Hbm,
}

/// A topology, built: nodes (GPUs first), links, ports, and the model.
#[derive(Clone, Debug)]
pub struct Topology {
    /// Its name.
    pub name: String,
    /// The GPU model (every GPU alike).
    pub gpu: GpuSpec,
    /// The fabric it was built from.
    pub fabric: FabricSpec,
    /// The calibrated parameters.
    pub model: Model,
    gpus: usize,
    names: Vec<String>,
    links: Vec<Link>,
    ports: usize,
}

impl Topology {
    /// Reads and builds the topology of TOML file `path`.
    pub fn load(path: &str) -> Result<Topology> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.to_string(),
            source,
        })?;
        Topology::parse(&text).map_err(|e| match e {
            SimError::Toml { source, .. } => SimError::Toml {
                path: path.to_string(),
                source,
            },
            e => e,
        })
    }

    /// Builds the topology of TOML text.
    pub fn parse(text: &str) -> Result<Topology> {
        let f: File = toml::from_str(text).map_err(|source| SimError::Toml {
            path: "(text)".to_string(),
            source,
        })?;
        Topology::build(f.name, f.gpu, f.fabric, f.model.unwrap_or_default())
    }

    /// Builds a topology from its parts.
    pub fn build(name: String, gpu: GpuSpec, fabric: FabricSpec, model: Model) -> Result<Topology> {
        let bad = |m: String| Err(SimError::Topology(m));
        let mut names = Vec::new();
        let mut links = Vec::new();
        let add = |links: &mut Vec<Link>, from: usize, to: usize, p: LinkParams| {
            links.push(Link {
                from: from as u32,
                to: to as u32,
                params: p,
            })
        };
        let gpus = match &fabric {
            FabricSpec::Mesh { gpus, link } => {
                for i in 0..*gpus {
                    for j in (0..*gpus).filter(|&j| j != i) {
                        add(&mut links, i, j, *link);
                    }
                }
                *gpus
            }
            FabricSpec::Switch { gpus, link } => {
                for g in 0..*gpus {
                    add(&mut links, g, *gpus, *link);
                    add(&mut links, *gpus, g, *link);
                }
                names.push("nvswitch".to_string());
                *gpus
            }
            FabricSpec::Ring { gpus, link } => {
                for i in 0..*gpus {
                    add(&mut links, i, (i + 1) % gpus, *link);
                }
                for i in 0..*gpus {
                    add(&mut links, i, (i + gpus - 1) % gpus, *link);
                }
                *gpus
            }
            FabricSpec::Torus2d { x, y, link } => {
                let n = x * y;
                for v in 0..n {
                    let (cx, cy) = (v % x, v / x);
                    for (dx, dy) in [(1, 0), (x - 1, 0), (0, 1), (0, y - 1)] {
                        add(&mut links, v, (cx + dx) % x + (cy + dy) % y * x, *link);
                    }
                }
                n
            }
            FabricSpec::PcieTree {
                gpus,
                gpus_per_switch,
                link,
                up,
            } => {
                if *gpus_per_switch == 0 {
                    return bad("gpus_per_switch must be at least 1".into());
                }
                let sw = gpus.div_ceil(*gpus_per_switch);
                for g in 0..*gpus {
                    let s = gpus + g / gpus_per_switch;
                    add(&mut links, g, s, *link);
                    add(&mut links, s, g, *link);
                }
                for s in 0..sw {
                    add(&mut links, gpus + s, gpus + sw, *up);
                    add(&mut links, gpus + sw, gpus + s, *up);
                    names.push(format!("pcie{s}"));
                }
                names.push("root".to_string());
                *gpus
            }
            FabricSpec::RailFatTree {
                nodes,
                gpus_per_node,
                nodes_per_leaf,
                nvlink,
                nic,
                spine,
            } => {
                let (nn, gn, npl) = (*nodes, *gpus_per_node, *nodes_per_leaf);
                if gn == 0 || npl == 0 {
                    return bad("gpus_per_node and nodes_per_leaf must be at least 1".into());
                }
                let n = nn * gn;
                let leaves = nn.div_ceil(npl);
                // Nodes: GPUs, NVSwitches (one per node), leaves (per group, rail), spines
                // (per rail). Links in route order: NVLink up/down per GPU, NIC up/down per
                // GPU, leaf up/down per leaf.
                let nvs = n;
                let leaf0 = nvs + nn;
                let spine0 = leaf0 + leaves * gn;
                for g in 0..n {
                    add(&mut links, g, nvs + g / gn, *nvlink);
                    add(&mut links, nvs + g / gn, g, *nvlink);
                }
                for g in 0..n {
                    let leaf = leaf0 + (g / gn / npl) * gn + g % gn;
                    add(&mut links, g, leaf, *nic);
                    add(&mut links, leaf, g, *nic);
                }
                for l in 0..leaves * gn {
                    add(&mut links, leaf0 + l, spine0 + l % gn, *spine);
                    add(&mut links, spine0 + l % gn, leaf0 + l, *spine);
                }
                names.extend((0..nn).map(|i| format!("nvswitch{i}")));
                names.extend((0..leaves * gn).map(|l| format!("leaf{}.rail{}", l / gn, l % gn)));
                names.extend((0..gn).map(|r| format!("spine.rail{r}")));
                n
            }
            FabricSpec::Links {
                gpus,
                nodes,
                links: list,
            } => {
                let index = |s: &str| -> Option<usize> {
                    if let Some(k) = s.strip_prefix("gpu").and_then(|k| k.parse::<usize>().ok()) {
                        return (k < *gpus).then_some(k);
                    }
                    nodes.iter().position(|m| m == s).map(|p| gpus + p)
                };
                for l in list {
                    let (Some(a), Some(b)) = (index(&l.from), index(&l.to)) else {
                        return bad(format!("link {} -> {}: unknown node", l.from, l.to));
                    };
                    add(&mut links, a, b, l.params);
                    if l.both {
                        add(&mut links, b, a, l.params);
                    }
                }
                names.extend(nodes.iter().cloned());
                *gpus
            }
        };
        if gpus < 1 {
            return bad("a topology needs at least one GPU".into());
        }
        if let Some(l) = links
            .iter()
            .find(|l| !(l.params.gbps > 0.0 && l.params.latency_us >= 0.0))
        {
            return bad(format!(
                "link {} -> {}: bandwidth must be positive and latency not negative",
                l.from, l.to
            ));
        }
        let mut all: Vec<String> = (0..gpus).map(|g| format!("gpu{g}")).collect();
        all.extend(names);
        let ports = links.len();
        let port = |gbps| LinkParams {
            gbps,
            latency_us: 0.0,
            per_message_us: 0.0,
        };
        for g in 0..gpus {
            add(&mut links, g, g, port(gpu.store_gbps));
            add(&mut links, g, g, port(gpu.load_gbps));
            add(&mut links, g, g, port(gpu.local_copy_gbps));
        }
        let t = Topology {
            name,
            gpu,
            fabric,
            model,
            gpus,
            names: all,
            links,
            ports,
        };
        if matches!(t.fabric, FabricSpec::Links { .. }) {
            for d in 1..gpus {
                t.route(0, d)?;
            }
        }
        Ok(t)
    }

    /// GPUs.
    pub fn gpus(&self) -> usize {
        self.gpus
    }

    /// Every link, the ports last.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// Whether link `l` is a GPU's port.
    pub fn is_port(&self, l: usize) -> bool {
        l >= self.ports
    }

    /// Link `l`'s name: `from -> to`, or `gpuN.store` for a port.
    pub fn link_name(&self, l: usize) -> String {
        let k = &self.links[l];
        if self.is_port(l) {
            let what = ["store", "load", "hbm"][(l - self.ports) % 3];
            return format!("{}.{what}", self.names[k.from as usize]);
        }
        format!(
            "{} -> {}",
            self.names[k.from as usize], self.names[k.to as usize]
        )
    }

    /// GPU `g`'s port.
    pub fn port(&self, g: usize, p: Port) -> u32 {
        (self.ports + 3 * g + p as usize) as u32
    }

    /// The links from GPU `src` to GPU `dst`, in order, into `out` (empty for `src == dst`).
    pub fn route_into(&self, src: usize, dst: usize, out: &mut Vec<u32>) -> Result<()> {
        if src >= self.gpus || dst >= self.gpus {
            return Err(SimError::Invalid(format!(
                "route {src} -> {dst}: the topology has {} GPUs",
                self.gpus
            )));
        }
        if src == dst {
            return Ok(());
        }
        let mut push = |l: usize| out.push(l as u32);
        match &self.fabric {
            FabricSpec::Mesh { gpus, .. } => push(src * (gpus - 1) + dst - usize::from(dst > src)),
            FabricSpec::Switch { .. } => {
                push(2 * src);
                push(2 * dst + 1);
            }
            FabricSpec::Ring { gpus, .. } => {
                let n = *gpus;
                let cw = (dst + n - src) % n;
                if cw <= n - cw {
                    (0..cw).for_each(|k| push((src + k) % n));
                } else {
                    (0..n - cw).for_each(|k| push(n + (src + n - k) % n));
                }
            }
            FabricSpec::Torus2d { x, y, .. } => {
                let (mut cx, mut cy) = (src % x, src / x);
                let (tx, ty) = (dst % x, dst / x);
                let step = |c: usize, t: usize, m: usize| -> (usize, bool) {
                    let fwd = (t + m - c) % m;
                    (fwd.min(m - fwd), fwd <= m - fwd)
                };
                let (hx, fx) = step(cx, tx, *x);
                for _ in 0..hx {
                    push((cx + cy * x) * 4 + if fx { 0 } else { 1 });
                    cx = if fx { (cx + 1) % x } else { (cx + x - 1) % x };
                }
                let (hy, fy) = step(cy, ty, *y);
                for _ in 0..hy {
                    push((cx + cy * x) * 4 + if fy { 2 } else { 3 });
                    cy = if fy { (cy + 1) % y } else { (cy + y - 1) % y };
                }
            }
            FabricSpec::PcieTree {
                gpus,
                gpus_per_switch,
                ..
            } => {
                let (a, b) = (src / gpus_per_switch, dst / gpus_per_switch);
                push(2 * src);
                if a != b {
                    push(2 * gpus + 2 * a);
                    push(2 * gpus + 2 * b + 1);
                }
                push(2 * dst + 1);
            }
            FabricSpec::RailFatTree {
                gpus_per_node,
                nodes_per_leaf,
                ..
            } => {
                let gn = *gpus_per_node;
                let n = self.gpus;
                let (na, nb) = (src / gn, dst / gn);
                if na == nb {
                    push(2 * src);
                    push(2 * dst + 1);
                    return Ok(());
                }
                // PXN: to the GPU of the destination's rail in this node first.
                let hop = na * gn + dst % gn;
                if hop != src {
                    push(2 * src);
                    push(2 * hop + 1);
                }
                push(2 * n + 2 * hop);
                let (la, lb) = (na / nodes_per_leaf, nb / nodes_per_leaf);
                if la != lb {
                    push(4 * n + 2 * (la * gn + dst % gn));
                    push(4 * n + 2 * (lb * gn + dst % gn) + 1);
                }
                push(2 * n + 2 * dst + 1);
            }
            FabricSpec::Links { .. } => self.bfs(src, dst, out)?,
        }
        Ok(())
    }

    /// The links from GPU `src` to GPU `dst`.
    pub fn route(&self, src: usize, dst: usize) -> Result<Vec<u32>> {
        let mut v = Vec::new();
        self.route_into(src, dst, &mut v)?;
        Ok(v)
    }

    /// Fewest hops over the fabric's links (ports excluded), the first link listed winning.
    fn bfs(&self, src: usize, dst: usize, out: &mut Vec<u32>) -> Result<()> {
        let nodes = self.names.len();
        let mut via = vec![u32::MAX; nodes];
        let mut seen = vec![false; nodes];
        let mut q = VecDeque::from([src]);
        seen[src] = true;
        while let Some(v) = q.pop_front() {
            if v == dst {
                break;
            }
            for (l, k) in self.links[..self.ports].iter().enumerate() {
                let to = k.to as usize;
                if k.from as usize == v && !seen[to] {
                    seen[to] = true;
                    via[to] = l as u32;
                    q.push_back(to);
                }
            }
        }
        if !seen[dst] {
            return Err(SimError::Topology(format!(
                "no route from gpu{src} to gpu{dst}"
            )));
        }
        let start = out.len();
        let mut v = dst;
        while v != src {
            let l = via[v];
            out.push(l);
            v = self.links[l as usize].from as usize;
        }
        out[start..].reverse();
        Ok(())
    }
}
