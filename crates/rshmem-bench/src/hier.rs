//! Hierarchical against flat across nodes, in one world and one run: the host all_reduce,
//! reduce and out-of-place reduce_scatter (`CollConfig::hierarchical` on and off), the team
//! barrier (hierarchical on both: barriers follow the team), and MoE dispatch/combine
//! (`HostBuffer::set_hierarchical`), alternating call by call on the same inputs. Needs a
//! world whose team spans nodes with a node of several PEs (`examples/fabric_hier.rs` starts
//! 2 nodes of 2 processes over loopback tcp).
//!
//! Times are the slowest PE's median per call (each call between barriers); traffic is the
//! mean over PEs of the heap bytes a call moved to or from other nodes
//! ([`Pe::net_traffic`]). Results are checked against each other after each timed loop.

use rshmem::coll::{Coll, CollConfig, ReduceOp, ToRoot};
use rshmem::ep::{EpConfig, HostBuffer};
use rshmem::{bf16, Error, Pe, Result};
use std::time::Instant;

/// One measured (operation, size, path).
#[derive(Debug, Clone, PartialEq)]
pub struct HierRecord {
    /// `barrier`, `all_reduce`, `reduce`, `reduce_scatter`, `dispatch` or `combine`.
    pub op: &'static str,
    /// Collectives: vector bytes (reduce_scatter: the result per PE; barrier: 0); MoE:
    /// hidden-state bytes this PE dispatches (`T·H·2`).
    pub bytes: usize,
    /// `hier` or `flat`.
    pub path: &'static str,
    /// Slowest PE's median time of one call, microseconds.
    pub time_us: f64,
    /// Mean over PEs of the bytes one call moved across nodes.
    pub net_bytes: f64,
    /// Mean over PEs of the messages one call sent across nodes: heap puts and gets, and
    /// control-block operations (barrier arrivals, call-word reads); NaN where not counted
    /// (MoE).
    pub net_msgs: f64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct HierOpts {
    /// all_reduce sizes in bytes (f32 sums).
    pub sizes: Vec<usize>,
    /// MoE shapes: (tokens per PE, hidden), bf16, top-8 of 8 experts per PE.
    pub moe: Vec<(usize, usize)>,
    /// Timed calls per point and path.
    pub iters: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Slowest PE's value and mean over PEs of `(time, bytes)`, through a flat all_reduce.
fn across(pe: &Pe, c: &Coll<'_>, t: f64, b: f64) -> Result<(f64, f64)> {
    let v = pe.alloc::<f64>(2)?;
    pe.local_write(&v, 0, &[t, 0.0])?;
    c.all_reduce(pe.world_team(), &v, &v, 1, ReduceOp::Max)?;
    let tmax = pe.local_vec(&v)?[0];
    pe.local_write(&v, 0, &[b, 0.0])?;
    c.all_reduce(pe.world_team(), &v, &v, 1, ReduceOp::Sum)?;
    let bsum = pe.local_vec(&v)?[0];
    pe.free(v)?;
    Ok((tmax, bsum / pe.n_pes() as f64))
}

/// Times `call(coll, k)` on the hierarchical (`k` = 0) and the flat (`k` = 1) collectives,
/// alternating call by call; returns per path the slowest PE's median time and the mean over
/// PEs of the bytes and messages across nodes of one call.
fn timed(
    pe: &Pe,
    o: &HierOpts,
    colls: [&Coll<'_>; 2],
    mut call: impl FnMut(&Coll<'_>, usize) -> Result<()>,
) -> Result<[(f64, f64, f64); 2]> {
    let mut times = [Vec::new(), Vec::new()];
    let mut net = [(0u64, 0u64); 2];
    for it in 0..o.iters + 1 {
        for (k, c) in colls.into_iter().enumerate() {
            pe.barrier_all()?;
            let b0 = pe.net_traffic();
            let t0 = Instant::now();
            call(c, k)?;
            let dt = t0.elapsed().as_secs_f64() * 1e6;
            let b1 = pe.net_traffic();
            if it > 0 {
                times[k].push(dt);
                net[k].0 += b1.bytes - b0.bytes;
                net[k].1 += b1.ops + b1.ctrl_ops - b0.ops - b0.ctrl_ops;
            }
        }
    }
    let mut out = [(0.0, 0.0, 0.0); 2];
    for k in 0..2 {
        let per = |x: u64| x as f64 / o.iters.max(1) as f64;
        let (t, b) = across(
            pe,
            colls[1],
            median(std::mem::take(&mut times[k])),
            per(net[k].0),
        )?;
        let (_, m) = across(pe, colls[1], 0.0, per(net[k].1))?;
        out[k] = (t, b, m);
    }
    Ok(out)
}

fn record(out: &mut Vec<HierRecord>, op: &'static str, bytes: usize, r: [(f64, f64, f64); 2]) {
    for (k, path) in ["hier", "flat"].into_iter().enumerate() {
        out.push(HierRecord {
            op,
            bytes,
            path,
            time_us: r[k].0,
            net_bytes: r[k].1,
            net_msgs: r[k].2,
        });
    }
}

fn differ(what: &str) -> Error {
    Error::InvalidArgument(format!("hier suite: {what} results differ"))
}

/// Runs the suite (collective over the world); every PE returns the same records.
pub fn bench(pe: &Pe, o: &HierOpts) -> Result<Vec<HierRecord>> {
    let world = pe.world_team();
    if !pe.node_map(world).is_hierarchical() {
        return Err(Error::InvalidArgument(
            "the hierarchical suite needs several nodes, one of them with several PEs".into(),
        ));
    }
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let hier = Coll::new(pe, CollConfig::default().hier_bytes(0))?;
    let flat = Coll::new(pe, CollConfig::default().hierarchical(false))?;
    let colls = [&hier, &flat];
    let mut out = Vec::new();
    // The team barrier: hierarchical on both (barriers follow the team, not the
    // collectives' configuration); its messages across nodes are the leaders'.
    let r = timed(pe, o, colls, |c, _| c.barrier(world))?;
    record(&mut out, "barrier", 0, r);
    for &bytes in &o.sizes {
        let count = (bytes / 4).max(1);
        let x = pe.alloc::<f32>(count * n)?;
        let ys = [pe.alloc::<f32>(count)?, pe.alloc::<f32>(count)?];
        let input: Vec<f32> = (0..count * n)
            .map(|i| ((i * 7 + me * 13) % 64) as f32)
            .collect();
        pe.local_write(&x, 0, &input)?;
        let r = timed(pe, o, colls, |c, k| {
            c.all_reduce(world, &ys[k], &x, count, ReduceOp::Sum)
        })?;
        if pe.local_vec(&ys[0])? != pe.local_vec(&ys[1])? {
            return Err(differ("all_reduce"));
        }
        record(&mut out, "all_reduce", bytes, r);
        // reduce to the last PE (another node than PE 0's).
        let root = n - 1;
        let to = ToRoot {
            op: ReduceOp::Sum,
            root,
        };
        let r = timed(pe, o, colls, |c, k| c.reduce(world, &ys[k], &x, count, to))?;
        if me == root && pe.local_vec(&ys[0])? != pe.local_vec(&ys[1])? {
            return Err(differ("reduce"));
        }
        record(&mut out, "reduce", bytes, r);
        // reduce_scatter out of place: `bytes` of result per PE.
        let r = timed(pe, o, colls, |c, k| {
            c.reduce_scatter(world, &ys[k], &x, count, ReduceOp::Sum)
        })?;
        if pe.local_vec(&ys[0])? != pe.local_vec(&ys[1])? {
            return Err(differ("reduce_scatter"));
        }
        record(&mut out, "reduce_scatter", bytes, r);
        let [y0, y1] = ys;
        pe.free(y0)?;
        pe.free(y1)?;
        pe.free(x)?;
    }
    for &(t, h) in &o.moe {
        let (k, e) = (8usize, 8 * n);
        let cfg = EpConfig::new(e, t, h, k);
        let mut bufs = [
            HostBuffer::<bf16>::new(pe, world, cfg)?,
            HostBuffer::<bf16>::new(pe, world, cfg)?,
        ];
        bufs[1].set_hierarchical(false);
        let x: Vec<bf16> = (0..t * h)
            .map(|i| bf16::from_f32(((i + me) % 17) as f32 / 4.0))
            .collect();
        // Random-looking distinct experts per token, as a router would pick.
        let ids: Vec<i32> = (0..t)
            .flat_map(|tok| {
                let mut s = (tok * 2_654_435_761 + me * 40_503) as u64 | 1;
                let mut chosen: Vec<i32> = Vec::with_capacity(k);
                while chosen.len() < k {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let c = (s % e as u64) as i32;
                    if !chosen.contains(&c) {
                        chosen.push(c);
                    }
                }
                chosen
            })
            .collect();
        let w = vec![1.0f32 / k as f32; t * k];
        let mut times = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        let mut net = [[0u64; 2]; 2];
        let mut results: [Vec<bf16>; 2] = [Vec::new(), Vec::new()];
        for it in 0..o.iters + 1 {
            for (p, buf) in bufs.iter_mut().enumerate() {
                pe.barrier_all()?;
                let b0 = pe.net_traffic().bytes;
                let t0 = Instant::now();
                let d = buf.dispatch(pe, &x, &ids, &w, k)?;
                let t1 = Instant::now();
                let b1 = pe.net_traffic().bytes;
                pe.barrier_all()?;
                let t2 = Instant::now();
                let y = buf.combine(pe, &d.handle, &d.x)?;
                let t3 = Instant::now();
                if it > 0 {
                    times[0][p].push((t1 - t0).as_secs_f64() * 1e6);
                    times[1][p].push((t3 - t2).as_secs_f64() * 1e6);
                    net[0][p] += b1 - b0;
                    net[1][p] += pe.net_traffic().bytes - b1;
                }
                results[p] = y;
            }
        }
        if results[0] != results[1] {
            return Err(Error::InvalidArgument(
                "hier suite: combine results differ".into(),
            ));
        }
        for (i, op) in ["dispatch", "combine"].into_iter().enumerate() {
            for (p, path) in ["hier", "flat"].into_iter().enumerate() {
                let per = net[i][p] as f64 / o.iters.max(1) as f64;
                let (tm, b) = across(pe, &flat, median(std::mem::take(&mut times[i][p])), per)?;
                out.push(HierRecord {
                    op,
                    bytes: t * h * 2,
                    path,
                    time_us: tm,
                    net_bytes: b,
                    net_msgs: f64::NAN,
                });
            }
        }
        let [b0, b1] = bufs;
        pe.free(b0)?;
        pe.free(b1)?;
    }
    pe.free(flat)?;
    pe.free(hier)?;
    Ok(out)
}
