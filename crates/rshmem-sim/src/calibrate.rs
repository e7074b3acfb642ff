//! Calibration and validation against `rshmem perf --json` records of real runs.
//!
//! The records of a size (the same operation, PEs, bytes and MoE layout) count once, at their
//! median time. The fit uses a fixed part of them ([`is_training`]: all_reduce and all_to_all
//! at 8 B or 4 KiB, 64 KiB, 16 MiB and 1 GiB, and the token-major dispatch and combine on 2
//! GPUs); every other record validates: the other sizes, the other collectives, the
//! expert-major MoE calls and MoE on 4 GPUs. It fits six of the [`Model`]'s parameters (the
//! fence cost, an LL call's late wait and the expert-major expansion's tail are measured),
//! shared by every topology, by coordinate descent on the squared log
//! error (multiplicative steps that halve when no step helps): deterministic, and enough for
//! six parameters. A record whose path note differs from the path the current library picks
//! is left out and counted: it times a path the library no longer takes; so is a record of a
//! path whose kernels changed after its file was measured (`FILE!PATH`, [`load_cases`]).

use crate::schedule::{build, EpSpec, Op, Setup};
use crate::sim::simulate;
use crate::topology::{Model, Topology};
use crate::{Result, SimError};
use std::collections::BTreeMap;

/// A measured case: one size of one operation on `pes` GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// Operation name (`all_reduce`, `ep_dispatch`, ...).
    pub op: String,
    /// GPUs.
    pub pes: usize,
    /// The record's bytes.
    pub bytes: usize,
    /// MoE tokens per PE (0: not MoE).
    pub tokens: usize,
    /// MoE hidden size, top-k and experts.
    pub ep: (usize, usize, usize),
    /// MoE token-major layout.
    pub token_major: bool,
    /// Median measured time, µs.
    pub time_us: f64,
    /// The path the run noted (collectives).
    pub note: String,
    /// Records behind the median.
    pub runs: usize,
    /// The path's kernels changed after the measurement (the file's `!` list): left out.
    pub superseded: bool,
}

impl Case {
    /// A short name of the variant (`token_major`, `expert_major`, or the noted path).
    pub fn variant(&self) -> String {
        if self.tokens > 0 {
            let l = if self.token_major {
                "token_major"
            } else {
                "expert_major"
            };
            format!("T={} {l}", self.tokens)
        } else {
            self.note.clone()
        }
    }
}

/// Whether `c` belongs to the fit (the rest validates).
pub fn is_training(c: &Case) -> bool {
    let sizes = [8, 4 << 10, 64 << 10, 16 << 20, 1 << 30];
    (matches!(c.op.as_str(), "all_reduce" | "all_to_all") && sizes.contains(&c.bytes))
        || (c.pes == 2 && c.op.starts_with("ep_") && c.token_major)
}

fn num_after(note: &str, key: &str) -> Option<usize> {
    let i = note.find(key)? + key.len();
    let digits: String = note[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// `rshmem perf`'s GPU MoE case (H, k, E; bf16), what its records without a note ran.
const PERF_EP: (usize, usize, usize) = (7168, 8, 256);

/// The tokens per PE of a note-less MoE record of `bytes` (the hidden-state bytes PE 0 sends to
/// the other PEs) on `pes` PEs: the power of two nearest the rows sent over the rows expected
/// per token (a token goes to a given peer unless none of its k experts lives there). `rshmem
/// perf` runs powers of two, and the routing's spread is far below a factor of 1.4.
pub fn tokens_of(bytes: usize, pes: usize) -> usize {
    let (h, k, e) = PERF_EP;
    if pes < 2 || bytes == 0 {
        return 0;
    }
    let rows = bytes as f64 / (h * 2) as f64;
    let other = (e - e / pes) as f64;
    let none_here: f64 = (0..k)
        .map(|i| (other - i as f64) / (e as f64 - i as f64))
        .product();
    let t = rows / ((pes - 1) as f64 * (1.0 - none_here));
    1usize << t.max(1.0).log2().round() as u32
}

/// Grouping key of a record: operation, GPUs, bytes, MoE tokens, token-major.
type Key = (String, usize, usize, usize, bool);

/// The cases of `rshmem perf --json` files: CUDA records of the collectives and of MoE
/// dispatch/combine (graph replays only, as the collectives' runs are), grouped by size at
/// their median time. MoE records without a note (runs that wrote none) are `rshmem perf`'s GPU
/// case, with the layout and graph replays read from their mode and T from their bytes
/// ([`tokens_of`]). A file named `FILE@A|B` gives only the records of runs whose name
/// starts with `A` or `B`. A size that a later file also measured counts only from the later
/// file (list files oldest first: later runs time the current code). A file named `FILE!P|Q`
/// (after any `@` list) times paths `P` and `Q` (noted collective paths, or the MoE layouts
/// `expert_major`, `token_major`; `OP:P` for one operation only) with kernels the library has
/// since replaced: those records are left out and counted.
pub fn load_cases(paths: &[String]) -> Result<Vec<Case>> {
    let mut groups: BTreeMap<Key, (usize, Vec<Case>)> = BTreeMap::new();
    for (index, spec) in paths.iter().enumerate() {
        let (spec, superseded): (&str, Vec<&str>) = match spec.split_once('!') {
            Some((f, l)) => (f, l.split('|').collect()),
            None => (spec.as_str(), Vec::new()),
        };
        let (path, runs) = match spec.split_once('@') {
            Some((p, r)) => (p.to_string(), r.split('|').map(str::to_string).collect()),
            None => (spec.to_string(), Vec::new()),
        };
        let path = &path;
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.clone(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| SimError::Json {
                path: path.clone(),
                source,
            })?;
        let Some(list) = v.as_array() else {
            return Err(SimError::Invalid(format!("{path}: not a list of records")));
        };
        for r in list {
            let s = |k: &str| r.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
            let u = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0) as usize;
            let op = s("op");
            let note = s("note");
            let coll = [
                "all_reduce",
                "all_to_all",
                "all_gather",
                "reduce_scatter",
                "broadcast",
            ];
            let ep = op.starts_with("ep_");
            if s("backend") != "cuda" || !(coll.contains(&op.as_str()) || ep) {
                continue;
            }
            // MoE records of runs that wrote no note say graph replays and the layout in their
            // mode (`capturable`, `+tokens`).
            let mode = s("mode");
            let noted = !note.is_empty();
            let graph = if noted {
                note.contains("graph replays")
            } else {
                mode.starts_with("capturable")
            };
            if ep && !graph {
                continue;
            }
            let Some(time_us) = r.get("time_us").and_then(|x| x.as_f64()) else {
                continue;
            };
            let run = s("run");
            if !runs.is_empty() && !runs.iter().any(|p: &String| run.starts_with(p.as_str())) {
                continue;
            }
            let pes = u("pes");
            let (tokens, shape) = match (ep, noted) {
                (false, _) => (0, (0, 0, 0)),
                (true, true) => (
                    num_after(&note, "T=").unwrap_or(0),
                    (
                        num_after(&note, "H=").unwrap_or(0),
                        num_after(&note, "k=").unwrap_or(0),
                        num_after(&note, "E=").unwrap_or(0),
                    ),
                ),
                (true, false) => (tokens_of(u("bytes"), pes), PERF_EP),
            };
            let variant = match (
                ep,
                note.contains("token-major") || mode.ends_with("+tokens"),
            ) {
                (false, _) => note.as_str(),
                (true, true) => "token_major",
                (true, false) => "expert_major",
            };
            let superseded = superseded
                .iter()
                .any(|x| *x == variant || *x == format!("{op}:{variant}"));
            let c = Case {
                op: op.clone(),
                pes,
                bytes: u("bytes"),
                tokens,
                ep: shape,
                token_major: note.contains("token-major") || mode.ends_with("+tokens"),
                time_us,
                note: if ep { String::new() } else { note },
                runs: 1,
                superseded,
            };
            let key = (op, c.pes, c.bytes, tokens, c.token_major);
            let g = groups.entry(key).or_insert((index, Vec::new()));
            if g.0 < index {
                *g = (index, Vec::new());
            }
            g.1.push(c);
        }
    }
    Ok(groups
        .into_values()
        .map(|(_, mut g)| {
            g.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
            let mut c = g[g.len() / 2].clone();
            if g.len() % 2 == 0 {
                c.time_us = (g[g.len() / 2 - 1].time_us + g[g.len() / 2].time_us) / 2.0;
            }
            c.runs = g.len();
            c
        })
        .collect())
}

/// A case, simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The case.
    pub case: Case,
    /// Simulated time, µs.
    pub sim_us: f64,
    /// The path the library picks for the case.
    pub path: String,
    /// sim / measured - 1.
    pub error: f64,
    /// In the fit.
    pub train: bool,
    /// The noted path is another than the one the library picks.
    pub stale: bool,
}

/// Simulates every case on the topology of its GPU count (`topos`: (GPUs, topology)) with
/// `model`.
pub fn evaluate(
    topos: &[(usize, Topology)],
    setup: &Setup,
    cases: &[Case],
    model: Model,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for c in cases {
        let Some((_, topo)) = topos.iter().find(|(n, _)| *n == c.pes) else {
            continue;
        };
        let mut topo = topo.clone();
        topo.model = model;
        let mut setup = setup.clone();
        if c.tokens > 0 {
            setup.ep = EpSpec {
                tokens: c.tokens,
                hidden: c.ep.0,
                topk: c.ep.1,
                experts: c.ep.2,
                token_major: c.token_major,
                ..setup.ep.clone()
            };
        }
        let op = Op::parse(&c.op)?;
        let prog = build(&topo, &setup, op, c.pes, c.bytes)?;
        let r = simulate(&topo, &prog, &mut |_, _| {})?;
        let stale = c.superseded || (c.tokens == 0 && !c.note.is_empty() && c.note != r.path);
        rows.push(Row {
            case: c.clone(),
            sim_us: r.time_us,
            path: r.path,
            error: r.time_us / c.time_us - 1.0,
            train: is_training(c),
            stale,
        });
    }
    Ok(rows)
}

fn loss(rows: &[Row]) -> f64 {
    rows.iter()
        .filter(|r| r.train && !r.stale)
        .map(|r| (1.0 + r.error).ln().powi(2))
        .sum()
}

fn params(m: &Model) -> [f64; 6] {
    [
        m.launch_us,
        m.block_gbps,
        m.peer_us,
        m.ll_efficiency,
        m.ep_dispatch_us,
        m.ep_combine_us,
    ]
}

fn with(base: Model, p: [f64; 6]) -> Model {
    Model {
        launch_us: p[0],
        block_gbps: p[1],
        peer_us: p[2],
        ll_efficiency: p[3].min(1.0),
        ep_dispatch_us: p[4],
        ep_combine_us: p[5],
        ..base
    }
}

/// Fits the model's parameters to the training cases, from `start`; returns the model and its
/// rows.
pub fn fit(
    topos: &[(usize, Topology)],
    setup: &Setup,
    cases: &[Case],
    start: Model,
) -> Result<(Model, Vec<Row>)> {
    let train: Vec<Case> = cases.iter().filter(|c| is_training(c)).cloned().collect();
    let mut p = params(&start);
    let mut best = loss(&evaluate(topos, setup, &train, with(start, p))?);
    let mut step = 0.5f64;
    while step > 0.005 {
        let mut improved = false;
        for i in 0..p.len() {
            for f in [1.0 + step, 1.0 / (1.0 + step)] {
                let mut q = p;
                q[i] *= f;
                let l = loss(&evaluate(topos, setup, &train, with(start, q))?);
                if l < best {
                    best = l;
                    p = q;
                    improved = true;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    let model = with(start, p);
    Ok((model, evaluate(topos, setup, cases, model)?))
}

/// The error table: per operation and GPU count, the validation cases' count, median and
/// largest |error|, and the training cases' (markdown).
pub fn table(rows: &[Row]) -> String {
    // Per (op, GPUs): validation and fit |errors|, cases left out.
    type Errors = (Vec<f64>, Vec<f64>, usize);
    let mut groups: BTreeMap<(String, usize), Errors> = BTreeMap::new();
    for r in rows {
        let g = groups.entry((r.case.op.clone(), r.case.pes)).or_default();
        if r.stale {
            g.2 += 1;
        } else if r.train {
            g.1.push(r.error.abs());
        } else {
            g.0.push(r.error.abs());
        }
    }
    let stat = |v: &mut Vec<f64>| -> String {
        if v.is_empty() {
            return "0 | – | –".to_string();
        }
        v.sort_by(f64::total_cmp);
        let med = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        format!(
            "{} | {:.1} % | {:.1} %",
            v.len(),
            med * 100.0,
            v[v.len() - 1] * 100.0
        )
    };
    let mut s = String::from(
        "| op | GPUs | validation cases | median abs. error | max abs. error | fit cases | median | max | left out (path or kernel changed) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for ((op, pes), (mut v, mut t, stale)) in groups {
        s += &format!(
            "| {op} | {pes} | {} | {} | {stale} |\n",
            stat(&mut v),
            stat(&mut t)
        );
    }
    s
}
