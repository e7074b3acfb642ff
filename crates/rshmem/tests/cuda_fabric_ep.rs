//! The GPU MoE buffer (`rshmem::cuda::ep::GpuBuffer`) across nodes: "nodes" are processes of
//! this machine over loopback tcp (`RSHMEM_NODE` from each process's rank), every PE on GPU 0
//! (`RSHMEM_TEST_FABRIC_GPUS=k`: round-robin over k GPUs), PEs of other nodes reached through the proxy. Every
//! check is exact: f32 values that are small integers times multiples of 1/8, so every sum is
//! exact whatever its grouping, outputs poisoned before each step, and a host reference from
//! every PE's seeded inputs. The first test runs everywhere (NVRTC compiles the kernels); the
//! others need a GPU (`--include-ignored`) and libfabric.

#[path = "harness/fabric_data.rs"]
mod fabric_data;
#[path = "harness/mod.rs"]
mod harness;

use harness::GpuMode;
use rshmem::cuda::ep::{self, EpTuning, GpuBuffer, TokensCombine};
use rshmem::cuda::{self, CudaPe, Stream};
use rshmem::ep::{EpConfig, EpMode, RecvLayout};
use rshmem::launcher::Exit;
use rshmem::*;
use std::time::{Duration, Instant};

/// `nodes[rank]` is the node of the process of that rank; GPUs from `fabric_data::gpu_devices`.
/// `RSHMEM_TEST_LOG` (a switch of these tests, e.g. `rshmem=debug`): the library's log on
/// stderr (among it the proxy's warning for each request to another node that failed).
fn config(nodes: &[usize], timeout: Duration) -> Config {
    if let Ok(f) = std::env::var("RSHMEM_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let node = |rank: usize| nodes[rank.min(nodes.len() - 1)];
    fabric_data::gpu_config_of(nodes.len(), timeout, node)
}

/// The buffers' tuning: the defaults, with `RSHMEM_TEST_EP_STAMPS=1` (a switch of these tests)
/// kernels that stamp each phase (`-DEP_STAMPS=1`), which [`diagnose`] prints.
fn tuning() -> EpTuning {
    let mut t = EpTuning::default();
    if std::env::var("RSHMEM_TEST_EP_STAMPS").is_ok_and(|v| v == "1") {
        t.nvrtc_options.push("-DEP_STAMPS=1".into());
    }
    t
}

/// After a step failed with `e`: where this PE's kernels stopped (control and signal words,
/// clock stamps where enabled), the proxy ring's tickets against its completed requests, and
/// the proxy's own error (quiet).
fn diagnose(pe: &Pe, s: &Stream, buf: &GpuBuffer<f32>, e: &Error) {
    let me = pe.my_pe();
    eprintln!("PE {me}: DIAG step failed: {e}");
    if let Err(e) = s.synchronize() {
        eprintln!("PE {me}: DIAG stream: {e}");
    }
    let names = [
        "epoch", "dwait", "cwait", "go", "err", "info", "rows", "tokens", "topk", "gate", "cpush",
        "pgate", "pticket", "rticket", "xabort", "xticket",
    ];
    match buf.control_words(pe) {
        Ok((ctl, sig)) => {
            let ctl: Vec<String> = names
                .iter()
                .zip(&ctl)
                .map(|(n, v)| format!("{n}={v:#x}"))
                .collect();
            eprintln!("PE {me}: DIAG ctl {}", ctl.join(" "));
            let n = pe.n_pes();
            for (g, name) in ["records", "data", "combine", "ready", "cready", "cdone"]
                .iter()
                .enumerate()
            {
                eprintln!(
                    "PE {me}: DIAG sig {name} per source {:?}",
                    &sig[g * n..(g + 1) * n]
                );
            }
        }
        Err(e) => eprintln!("PE {me}: DIAG control words: {e}"),
    }
    match CudaPe::new(pe).and_then(|g| g.proxy_ring_counts()) {
        Ok(c) => eprintln!("PE {me}: DIAG proxy ring (tickets issued, completed) {c:?}"),
        Err(e) => eprintln!("PE {me}: DIAG proxy ring: {e}"),
    }
    eprintln!(
        "PE {me}: DIAG quiet (the proxy's error, if any): {:?}",
        pe.quiet()
    );
    if let Ok(st) = buf.stamps(pe) {
        if st.iter().any(|&v| v != 0) {
            let t0 = st.iter().copied().filter(|&v| v != 0).min().unwrap_or(0);
            let rel: Vec<String> = st
                .iter()
                .enumerate()
                .map(|(k, &v)| match v {
                    0 => format!("{k}:-"),
                    v => format!("{k}:{}us", (v - t0) / 1000),
                })
                .collect();
            eprintln!("PE {me}: DIAG stamps {}", rel.join(" "));
        }
    }
}

/// [`step`], the stream synchronised and the buffer checked; a failure is diagnosed first.
fn checked_step(
    pe: &Pe,
    s: &Stream,
    buf: &GpuBuffer<f32>,
    inp: &Inputs,
    st: &Step,
    tokens: bool,
) -> Result<ep::Dispatch> {
    let r = step(pe, s, buf, inp, st, tokens).and_then(|d| {
        s.synchronize()?;
        buf.check(pe)?;
        Ok(d)
    });
    if let Err(e) = &r {
        diagnose(pe, s, buf, e);
    }
    r
}

#[test]
fn nvrtc_compiles_the_ep_kernels_with_the_proxy_paths() {
    let src = cuda::nvrtc::with_header(ep::EP_KERNELS);
    let opts = ep::kernel_options(ElemKind::F32, ElemKind::I32, &[]).expect("options");
    let o: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
    harness::nvrtc_compiled(
        "MoE kernels",
        cuda::nvrtc::compile_uncached(&src, "sm_90", &o),
    );
}

const X_POISON: f32 = -55.0;
const OUT_POISON: f32 = -77.0;

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    /// Any expert or none (-1) in each slot.
    Random,
    /// Only experts of PEs on the token's own node.
    OwnNode,
    /// Every slot: expert 0 of the last PE.
    LastPe,
}

/// One step: `tokens[p]` tokens on PE `p`, `k` slots each, routed by `route` from `seed`.
#[derive(Debug, Clone)]
struct Step {
    route: Route,
    tokens: Vec<usize>,
    k: usize,
    seed: u64,
}

/// Facts every PE computes alike: the buffer's configuration, experts per PE and the node of
/// each PE.
struct World {
    cfg: EpConfig,
    n: usize,
    el: usize,
    node: Vec<usize>,
    nm: NodeMap,
}

impl World {
    fn of(pe: &Pe, cfg: &EpConfig) -> World {
        let n = pe.n_pes();
        let nm = pe.node_map(pe.world_team());
        World {
            cfg: *cfg,
            n,
            el: cfg.num_experts / n,
            node: (0..n).map(|p| nm.node(p)).collect(),
            nm,
        }
    }
    /// The tokens of source `p` in `st` bound for node `j` (any slot's expert there).
    fn tokens_to_node(&self, p: usize, st: &Step, j: usize) -> usize {
        let (ids, _) = routing(self, p, st);
        ids.chunks(st.k)
            .filter(|t| {
                t.iter()
                    .any(|&id| self.owner(id).is_some_and(|d| self.node[d] == j))
            })
            .count()
    }
    /// The bytes PE `me`'s kernels put across nodes in `st` (DeepEP's internode design): its
    /// tokens once per other node they go to, each a row and its record (dispatch); as a
    /// forwarder, one row per token of each source it serves (combine).
    fn net_bytes(&self, me: usize, st: &Step) -> (u64, u64) {
        let (h, rmw) = (self.cfg.hidden, 1 + 2 * self.cfg.max_topk);
        let k = self.node[me];
        let out: usize = (0..self.nm.n_nodes())
            .filter(|&j| j != k)
            .map(|j| self.tokens_to_node(me, st, j) * (h + rmw) * 4)
            .sum();
        let back: usize = (0..self.n)
            .filter(|&s| self.node[s] != k && self.nm.peer(k, self.nm.local(s)) == me)
            .map(|s| self.tokens_to_node(s, st, k) * h * 4)
            .sum();
        (out as u64, back as u64)
    }
    fn owner(&self, id: i32) -> Option<usize> {
        (id >= 0).then(|| id as usize / self.el)
    }
}

/// PE `p`'s routing of `st`: ids and weights (multiples of 1/8).
fn routing(w: &World, p: usize, st: &Step) -> (Vec<i32>, Vec<f32>) {
    let mut r = xorshift(st.seed * 7919 + p as u64 * 104_729 + 17);
    let e = w.n * w.el;
    let own: Vec<usize> = (0..w.n).filter(|&q| w.node[q] == w.node[p]).collect();
    let (mut ids, mut ws) = (Vec::new(), Vec::new());
    for _ in 0..st.tokens[p] * st.k {
        let id = match st.route {
            Route::Random if r().is_multiple_of(5) => -1,
            Route::Random => (r() % e as u64) as i32,
            Route::OwnNode => {
                let q = own[(r() % own.len() as u64) as usize];
                (q * w.el) as i32 + (r() % w.el as u64) as i32
            }
            Route::LastPe => ((w.n - 1) * w.el) as i32,
        };
        ids.push(id);
        ws.push(((r() % 8) + 1) as f32 / 8.0);
    }
    (ids, ws)
}

fn xval(p: usize, t: usize, h: usize) -> f32 {
    ((p * 131 + t * 7 + h * 3) % 19) as f32 - 9.0
}

struct Inputs {
    x: Sym<f32>,
    ids: Sym<i32>,
    w: Sym<f32>,
    y: Sym<f32>,
    out: Sym<f32>,
    ones: Sym<f32>,
}

fn inputs(pe: &Pe, cfg: &EpConfig, max_rows: usize) -> Result<Inputs> {
    Ok(Inputs {
        x: pe.alloc(cfg.max_tokens * cfg.hidden)?,
        ids: pe.alloc(cfg.max_tokens * cfg.max_topk)?,
        w: pe.alloc(cfg.max_tokens * cfg.max_topk)?,
        y: pe.alloc(max_rows * cfg.hidden)?,
        out: pe.alloc(cfg.max_tokens * cfg.hidden)?,
        ones: pe.alloc(cfg.num_experts / pe.n_pes())?,
    })
}

fn free_inputs(pe: &Pe, i: Inputs) -> Result<()> {
    pe.free(i.ones)?;
    pe.free(i.out)?;
    pe.free(i.y)?;
    pe.free(i.w)?;
    pe.free(i.ids)?;
    pe.free(i.x)
}

/// Writes this PE's inputs of `st` and poisons the outputs.
fn prepare(pe: &Pe, w: &World, buf: &GpuBuffer<f32>, inp: &Inputs, st: &Step) -> Result<()> {
    let (me, cfg) = (pe.my_pe(), &w.cfg);
    let (ids, ws) = routing(w, me, st);
    let h = cfg.hidden;
    let t = st.tokens[me];
    let xs: Vec<f32> = (0..t * h).map(|i| xval(me, i / h, i % h)).collect();
    pe.local_fill(&inp.x, X_POISON)?;
    pe.local_write(&inp.x, 0, &xs)?;
    pe.local_write(&inp.ids, 0, &ids)?;
    pe.local_write(&inp.w, 0, &ws)?;
    pe.local_fill(&inp.ones, 1.0)?;
    pe.local_fill(&inp.out, OUT_POISON)?;
    match cfg.layout {
        RecvLayout::ExpertMajor => pe.local_fill(&buf.expert_x()?, X_POISON)?,
        RecvLayout::TokenMajor => pe.local_fill(&buf.recv_x()?, X_POISON)?,
    }
    pe.barrier_all()
}

/// Dispatch, identity experts and combine (`tokens`: `combine_tokens` with the receive rows as
/// each token's result, token-major buffers only).
fn step(
    pe: &Pe,
    s: &Stream,
    buf: &GpuBuffer<f32>,
    inp: &Inputs,
    st: &Step,
    tokens: bool,
) -> Result<ep::Dispatch> {
    let me = pe.my_pe();
    let t = st.tokens[me];
    let d = buf.dispatch(pe, s, &inp.x, &inp.ids.slice(..t * st.k)?, &inp.w, st.k)?;
    // Progress for logs: where a PE waits when a step does not end.
    eprintln!("PE {me}: dispatch returned ({st:?})");
    match (buf.config().layout, tokens) {
        (RecvLayout::TokenMajor, true) => {
            buf.combine_tokens(pe, s, &d, &buf.recv_x()?, &inp.out)?
        }
        (RecvLayout::TokenMajor, false) => {
            buf.scale_experts(pe, s, &buf.recv_x()?, &inp.y, &inp.ones)?;
            buf.combine(pe, s, &d, &inp.y, &inp.out)?;
        }
        (RecvLayout::ExpertMajor, _) => buf.combine(pe, s, &d, &buf.expert_x()?, &inp.out)?,
    }
    Ok(d)
}

/// The tokens of source `p` that go to PE `me` (any slot's expert there), in token order.
fn tokens_to(
    w: &World,
    all: &[(Vec<i32>, Vec<f32>)],
    st: &Step,
    p: usize,
    me: usize,
) -> Vec<usize> {
    let ids = &all[p].0;
    (0..st.tokens[p])
        .filter(|&t| (0..st.k).any(|j| w.owner(ids[t * st.k + j]) == Some(me)))
        .collect()
}

/// Checks the dispatch (counts, row records, rows, the expert-major index) and the combine
/// output of `st` against the host reference.
fn verify(
    pe: &Pe,
    w: &World,
    buf: &GpuBuffer<f32>,
    inp: &Inputs,
    st: &Step,
    d: &ep::Dispatch,
    tokens: bool,
) -> Result<()> {
    let cfg = &w.cfg;
    let (me, n, h, k, km) = (pe.my_pe(), w.n, cfg.hidden, st.k, cfg.max_topk);
    let cap = buf.pair_capacity();
    let all: Vec<(Vec<i32>, Vec<f32>)> = (0..n).map(|p| routing(w, p, st)).collect();
    let hh = buf.host_handle(pe)?;
    let mut want_rows: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); w.el];
    let recs = pe.local_vec(&buf.recv_records()?)?;
    let rmw = 1 + 2 * km;
    let mut row_of = std::collections::HashMap::new();
    for p in 0..n {
        let toks = tokens_to(w, &all, st, p, me);
        assert_eq!(
            hh.recv_tokens_per_pe[p],
            toks.len(),
            "PE {me}: tokens from PE {p} ({st:?})"
        );
        if let Some(c) = d.recv_tokens_per_pe() {
            assert_eq!(c[p], toks.len(), "PE {me}: normal mode's count from PE {p}");
        }
        let (ids, ws) = &all[p];
        for (i, &t) in toks.iter().enumerate() {
            row_of.insert((p, t), p * cap + i);
            for j in 0..k {
                let id = ids[t * k + j];
                if w.owner(id) == Some(me) {
                    want_rows[id as usize % w.el].push((p, t, j));
                }
            }
            // The row record: token index, top-k ids (-1 beyond k), weights (0 beyond k).
            let r = &recs[(p * cap + i) * rmw..(p * cap + i + 1) * rmw];
            let mut want = vec![t as u32];
            want.extend((0..km).map(|j| {
                if j < k {
                    ids[t * k + j] as u32
                } else {
                    u32::MAX
                }
            }));
            want.extend((0..km).map(|j| if j < k { ws[t * k + j].to_bits() } else { 0 }));
            assert_eq!(r, &want[..], "PE {me}: row record {i} from PE {p} ({st:?})");
        }
    }
    let total: usize = want_rows.iter().map(|v| v.len()).sum();
    assert_eq!(hh.rows.len(), total, "PE {me}: rows ({st:?})");
    if let Some(r) = d.rows() {
        assert_eq!(r, total, "PE {me}: rows reported by normal mode");
    }
    match cfg.layout {
        RecvLayout::TokenMajor => {
            let rx = pe.local_vec(&buf.recv_x()?)?;
            for p in 0..n {
                let toks = tokens_to(w, &all, st, p, me);
                for row in 0..cap {
                    for c in 0..h {
                        let want = toks.get(row).map_or(X_POISON, |&t| xval(p, t, c));
                        let got = rx[(p * cap + row) * h + c];
                        assert!(got == want, "PE {me}: receive row {row} from PE {p} element {c}: {got} != {want} ({st:?})");
                    }
                }
            }
            let src = pe.local_vec(&buf.expert_src()?)?;
            for (e, want) in want_rows.iter().enumerate() {
                let (a, b) = (hh.expert_offsets[e], hh.expert_offsets[e + 1]);
                let mut got = hh.rows[a..b].to_vec();
                got.sort();
                let mut want = want.clone();
                want.sort();
                assert_eq!(got, want, "PE {me}: rows of local expert {e} ({st:?})");
                for (r, &(p, t, j)) in hh.rows[a..b].iter().enumerate() {
                    let v = src[a + r] as usize;
                    assert_eq!(
                        (v / km, v % km),
                        (row_of[&(p, t)], j),
                        "PE {me}: expert-major row {}",
                        a + r
                    );
                }
            }
        }
        RecvLayout::ExpertMajor => {
            let xs = pe.local_vec(&buf.expert_x()?)?;
            for (e, want) in want_rows.iter().enumerate() {
                let (a, b) = (hh.expert_offsets[e], hh.expert_offsets[e + 1]);
                for (r, &(p, t, _)) in hh.rows[a..b].iter().enumerate() {
                    for c in 0..h {
                        let v = xs[(a + r) * h + c];
                        assert!(
                            v == xval(p, t, c),
                            "PE {me}: expert {e} row {} (PE {p} token {t}) element {c}: {v}",
                            a + r
                        );
                    }
                }
                let mut got = hh.rows[a..b].to_vec();
                got.sort();
                let mut want = want.clone();
                want.sort();
                assert_eq!(got, want, "PE {me}: rows of local expert {e} ({st:?})");
            }
            assert!(
                xs[total * h..].iter().all(|&v| v == X_POISON),
                "PE {me}: expert-major area written beyond the rows"
            );
        }
    }
    // Combine: identity experts, so each token gets x times the sum of its weights whose
    // experts exist (combine), or x times the number of PEs it went to (combine_tokens).
    let out = pe.local_vec(&inp.out)?;
    let (ids, ws) = &all[me];
    for t in 0..st.tokens[me] {
        let f: f32 = if tokens {
            let mut dst: Vec<usize> = (0..k).filter_map(|j| w.owner(ids[t * k + j])).collect();
            dst.sort();
            dst.dedup();
            dst.len() as f32
        } else {
            (0..k)
                .filter(|&j| ids[t * k + j] >= 0)
                .map(|j| ws[t * k + j])
                .sum()
        };
        for c in 0..h {
            let (got, want) = (out[t * h + c], xval(me, t, c) * f);
            assert!(
                got == want,
                "PE {me}: combine token {t} element {c}: {got} != {want} ({st:?})"
            );
        }
    }
    assert!(
        out[st.tokens[me] * h..].iter().all(|&v| v == OUT_POISON),
        "PE {me}: combine wrote beyond T rows"
    );
    Ok(())
}

fn cfg(n: usize, hidden: usize, mode: EpMode, layout: RecvLayout) -> EpConfig {
    EpConfig {
        num_experts: 4 * n,
        max_tokens: 24,
        hidden,
        max_topk: 4,
        mode,
        layout,
    }
}

/// The steps of buffer `b`: a random routing, then (by `b`) a PE with no tokens, tokens only
/// for their own node, a single token, or another random routing. Few steps: on one GPU shared
/// by the nodes' processes every request through the proxy waits for a time slice.
fn steps(n: usize, b: usize) -> Vec<Step> {
    let seed = 100 * b as u64 + 1;
    let random = |k: usize, seed: u64| Step {
        route: Route::Random,
        tokens: vec![24; n],
        k,
        seed,
    };
    let mut none = vec![17; n];
    none[0] = 0;
    let mut one = vec![0; n];
    one[n - 1] = 1;
    let special = match b % 4 {
        0 => Step {
            route: Route::Random,
            tokens: none,
            k: 3,
            seed: seed + 1,
        },
        1 => Step {
            route: Route::OwnNode,
            tokens: vec![20; n],
            k: 4,
            seed: seed + 1,
        },
        2 => Step {
            route: Route::Random,
            tokens: one,
            k: 4,
            seed: seed + 1,
        },
        _ => random(2, seed + 1),
    };
    vec![random(4, seed), special]
}

/// Every step of [`steps`] on buffers of both layouts and modes, the vector path (rows of 40
/// f32) and the scalar one (9 f32), combine and combine_tokens; then a capacity overflow
/// towards the last PE's node, an error on every PE with nothing moved, and a good step after.
fn across_nodes(pe: &Pe) -> Result<()> {
    fabric_data::check_gpu_path(pe);
    let bufs = [
        (40, EpMode::Normal, RecvLayout::ExpertMajor),
        (9, EpMode::Normal, RecvLayout::TokenMajor),
        (
            40,
            EpMode::Capturable { capacity: 24 },
            RecvLayout::TokenMajor,
        ),
        (
            9,
            EpMode::Capturable { capacity: 24 },
            RecvLayout::ExpertMajor,
        ),
    ];
    on_buffers(pe, &bufs, usize::MAX)?;
    let g = CudaPe::new(pe)?;
    overflow(pe, &g.stream()?)
}

/// The first random step on an expert-major normal buffer (vector rows) and on a token-major
/// capturable one (scalar rows, combine and combine_tokens): the short check.
fn one_step(pe: &Pe) -> Result<()> {
    let bufs = [
        (40, EpMode::Normal, RecvLayout::ExpertMajor),
        (
            9,
            EpMode::Capturable { capacity: 24 },
            RecvLayout::TokenMajor,
        ),
    ];
    on_buffers(pe, &bufs, 1)
}

/// The first `max_steps` of [`steps`] on a buffer of each of `bufs` (hidden, mode, layout).
fn on_buffers(pe: &Pe, bufs: &[(usize, EpMode, RecvLayout)], max_steps: usize) -> Result<()> {
    let n = pe.n_pes();
    let g = CudaPe::new(pe)?;
    let s = g.stream()?;
    let tuning = tuning();

    for (b, &(hidden, mode, layout)) in bufs.iter().enumerate() {
        let c = cfg(n, hidden, mode, layout);
        let w = World::of(pe, &c);
        assert!(
            w.node.iter().any(|&x| x != w.node[0]),
            "the team spans nodes"
        );
        let buf = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &tuning)?;
        assert!(buf.spans_nodes());
        eprintln!("PE {}: buffer {b} created", pe.my_pe());
        // Pulling reads peers' memory by loads: never taken across nodes.
        buf.set_tokens_combine(TokensCombine::Pull);
        assert!(!buf.tokens_combine_pulls());
        let inp = inputs(pe, &c, buf.max_rows())?;
        for (i, st) in steps(n, b).into_iter().take(max_steps).enumerate() {
            for tokens in [false, true] {
                if tokens && layout == RecvLayout::ExpertMajor {
                    continue;
                }
                let t0 = Instant::now();
                prepare(pe, &w, &buf, &inp, &st)?;
                let before = buf.net_bytes(pe)?;
                let d = checked_step(pe, &s, &buf, &inp, &st, tokens)?;
                verify(pe, &w, &buf, &inp, &st, &d, tokens)?;
                let after = buf.net_bytes(pe)?;
                assert_eq!(
                    (after.0 - before.0, after.1 - before.1),
                    w.net_bytes(pe.my_pe(), &st),
                    "PE {}: bytes across nodes (dispatch, combine), step {i}",
                    pe.my_pe()
                );
                pe.barrier_all()?;
                eprintln!(
                    "PE {}: buffer {b} ({hidden} x {mode:?} {layout:?}) step {i} \
                     (combine_tokens {tokens}) exact after {:?}",
                    pe.my_pe(),
                    t0.elapsed()
                );
            }
        }
        free_inputs(pe, inp)?;
        pe.free(buf)?;
    }
    Ok(())
}

/// Capturable, capacity 5: every PE sends 16 tokens to the last PE (another node for PE 0).
fn overflow(pe: &Pe, s: &Stream) -> Result<()> {
    let n = pe.n_pes();
    let mut c = cfg(
        n,
        40,
        EpMode::Capturable { capacity: 5 },
        RecvLayout::ExpertMajor,
    );
    c.max_tokens = 16;
    let w = World::of(pe, &c);
    let buf = GpuBuffer::<f32>::new(pe, pe.world_team(), c, &tuning())?;
    let inp = inputs(pe, &c, buf.max_rows())?;
    let st = Step {
        route: Route::LastPe,
        tokens: vec![16; n],
        k: 2,
        seed: 7,
    };
    prepare(pe, &w, &buf, &inp, &st)?;
    let d = step(pe, s, &buf, &inp, &st, false)?;
    s.synchronize()?;
    match buf.check(pe) {
        Err(Error::Capacity {
            needed,
            capacity,
            dst_pe,
            ..
        }) => {
            assert_eq!(
                (needed, capacity, dst_pe),
                (16, 5, n - 1),
                "PE {}",
                pe.my_pe()
            )
        }
        other => {
            if let Err(e) = &other {
                diagnose(pe, s, &buf, e);
            }
            panic!(
                "PE {}: expected a capacity error, got {other:?}",
                pe.my_pe()
            )
        }
    }
    drop(d);
    eprintln!("PE {}: capacity overflow reported", pe.my_pe());
    assert!(!buf.last_dispatch_ok(pe)?);
    assert!(
        pe.local_vec(&buf.expert_x()?)?
            .iter()
            .all(|&v| v == X_POISON),
        "rows written despite the overflow"
    );
    assert!(
        pe.local_vec(&inp.out)?.iter().all(|&v| v == OUT_POISON),
        "combine wrote despite the overflow"
    );
    buf.check(pe)?;
    pe.barrier_all()?;
    // Within capacity afterwards: 4 tokens each.
    let st = Step {
        route: Route::Random,
        tokens: vec![4; n],
        k: 3,
        seed: 8,
    };
    prepare(pe, &w, &buf, &inp, &st)?;
    let d = checked_step(pe, s, &buf, &inp, &st, false)?;
    verify(pe, &w, &buf, &inp, &st, &d, false)?;
    pe.barrier_all()?;
    eprintln!("PE {}: a good step after the overflow exact", pe.my_pe());
    free_inputs(pe, inp)?;
    pe.free(buf)
}

/// Runs `body` on a process-PE per entry of `nodes` (its node), skipped where the fabric is
/// not there.
fn on_nodes(test: &str, nodes: &[usize], body: fn(&Pe) -> Result<()>) {
    if fabric_data::skip() {
        return;
    }
    let config = config(nodes, Duration::from_secs(20));
    harness::gpu_run(test, GpuMode::Processes, nodes.len(), config, body);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_across_two_nodes() {
    on_nodes("gpu_moe_across_two_nodes", &[0, 1], across_nodes);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_one_step_across_two_nodes() {
    on_nodes("gpu_moe_one_step_across_two_nodes", &[0, 1], one_step);
}

/// Two nodes of two PEs: a token bound for the other node crosses once, to the PE of its
/// source's local index there, which forwards it to the other PE of its node over NVLink and
/// sums that node's partial rows in combine.
#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_two_nodes_of_two() {
    on_nodes("gpu_moe_two_nodes_of_two", &[0, 0, 1, 1], across_nodes);
}

/// A node of one PE beside a node of two (PEs 1 and 2 reach each other by loads and stores,
/// PE 0 through the proxy; PE 0 forwards for both, PE 1 for PE 0).
#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_one_pe_beside_a_node_of_two() {
    on_nodes(
        "gpu_moe_one_pe_beside_a_node_of_two",
        &[0, 1, 1],
        across_nodes,
    );
}

/// PE 1 (a node) dies before a dispatch: PE 0's dispatch or check ends in an error naming it
/// (lost, or its wait timed out) within the deadline, never a hang.
#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_with_a_killed_node_is_an_error_naming_it() {
    killed_node("gpu_moe_with_a_killed_node_is_an_error_naming_it", &[0, 1]);
}

/// Of two nodes of two PEs, node 1 (PEs 2 and 3) dies before a dispatch: PEs 0 and 1 (PE 0
/// forwarding for PE 2, PE 1 for PE 3) end in an error naming one of them.
#[test]
#[ignore = "needs a GPU"]
fn gpu_moe_with_a_killed_node_of_two_is_an_error_naming_it() {
    killed_node(
        "gpu_moe_with_a_killed_node_of_two_is_an_error_naming_it",
        &[0, 0, 1, 1],
    );
}

/// The PEs of the last node of `nodes` die after a good step, before a dispatch: every other
/// PE's dispatch or check ends in an error naming one of them within the deadline.
fn killed_node(test: &str, nodes: &[usize]) {
    if fabric_data::skip() {
        return;
    }
    let n = nodes.len();
    let last = nodes[n - 1];
    let dead: Vec<usize> = (0..n).filter(|&p| nodes[p] == last).collect();
    if !harness::is_child() {
        let env = [(harness::CHILD_VAR, "kill")];
        let out = harness::spawn_self_ignored(test, n, 1, &env, Duration::from_secs(20));
        for p in 0..n {
            match dead.contains(&p) {
                true => assert_eq!(out.exits[p], Exit::Signal(9), "the killed node's PE {p}"),
                false => assert_eq!(
                    out.exits[p],
                    Exit::Code(0),
                    "PE {p} did not see the loss in time"
                ),
            }
        }
        return;
    }
    let pe = Launch::new()
        .config(config(nodes, Duration::from_secs(10)))
        .init()
        .expect("init");
    let me = pe.my_pe();
    let g = CudaPe::new(&pe).expect("cuda pe");
    let s = g.stream().expect("stream");
    let c = cfg(n, 40, EpMode::Normal, RecvLayout::ExpertMajor);
    let w = World::of(&pe, &c);
    let buf = GpuBuffer::<f32>::new(&pe, pe.world_team(), c, &tuning()).expect("buffer");
    let inp = inputs(&pe, &c, buf.max_rows()).expect("inputs");
    // One good step first.
    let st = Step {
        route: Route::Random,
        tokens: vec![24; n],
        k: 4,
        seed: 5,
    };
    prepare(&pe, &w, &buf, &inp, &st).expect("prepare");
    let d = checked_step(&pe, &s, &buf, &inp, &st, false).expect("step");
    verify(&pe, &w, &buf, &inp, &st, &d, false).expect("verify");
    pe.barrier_all().expect("barrier");
    eprintln!("PE {me}: the first step exact");
    if dead.contains(&me) {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain syscall on this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::process::abort();
    }
    std::thread::sleep(Duration::from_millis(600));
    let t0 = Instant::now();
    let r = buf
        .dispatch(
            &pe,
            &s,
            &inp.x,
            &inp.ids.slice(..24 * 4).expect("ids"),
            &inp.w,
            4,
        )
        .and_then(|_| s.synchronize())
        .and_then(|_| buf.check(&pe));
    let named = |e: &Error| match e {
        Error::PeerLost { pe, .. } => dead.contains(pe),
        Error::Timeout { pe: Some(p), .. } => dead.contains(p),
        _ => false,
    };
    match &r {
        Err(e) if named(e) => eprintln!("PE {me}: {e} after {:?}", t0.elapsed()),
        other => panic!("PE {me}: a dispatch towards a dead node: {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(40), "{:?}", t0.elapsed());
}
