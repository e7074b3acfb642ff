//! The simulator against closed forms, and its invariants: monotonic in size, conservation,
//! determinism, the shipped topologies, the library's paths.

use rshmem::coll::CollKind;
use rshmem_sim::fluid::{Engine, Flows};
use rshmem_sim::schedule::{build, Op, Program, Setup};
use rshmem_sim::{simulate, Topology};

fn topo_file(name: &str) -> Topology {
    let path = format!("{}/topologies/{name}", env!("CARGO_MANIFEST_DIR"));
    Topology::load(&path).expect("shipped topology")
}

/// A topology of `fabric` whose ports never limit and whose kernels cost nothing.
fn bare(fabric: &str) -> Topology {
    let text = format!(
        r#"
name = "bare"
[gpu]
sms = 132
hbm_gbps = 1e9
copy_engines = 1
ce_gbps = 1e9
local_copy_gbps = 1e9
store_gbps = 1e9
load_gbps = 1e9
[fabric]
{fabric}
[model]
launch_us = 0.0
block_gbps = 1e9
fence_us = 0.0
peer_us = 0.0
ll_efficiency = 1.0
ep_dispatch_us = 0.0
ep_combine_us = 0.0
"#
    );
    Topology::parse(&text).expect("topology")
}

/// The schedule of collective `kind` on `pes` PEs of `topo`, `bytes` a member, default setup.
fn coll_plan(topo: &Topology, kind: CollKind, pes: usize, bytes: usize) -> Program {
    build(topo, &Setup::default(), Op::Coll(kind), pes, bytes).expect("schedule")
}

fn time(topo: &Topology, op: Op, pes: usize, bytes: usize) -> f64 {
    let p = build(topo, &Setup::default(), op, pes, bytes).expect("schedule");
    simulate(topo, &p, &mut |_, _| {})
        .expect("simulate")
        .time_us
}

#[test]
fn one_transfer_is_latency_plus_bytes_over_bandwidth() {
    let t = bare("kind = \"mesh\"\ngpus = 2\nlink = { gbps = 100.0, latency_us = 2.0, per_message_us = 0.5 }");
    for bytes in [1usize << 10, 1 << 20, 1 << 30] {
        let want = 2.0 + 0.5 + bytes as f64 / 100e3;
        let got = time(&t, Op::Put, 2, bytes);
        assert!(
            (got - want).abs() <= want * 1e-6,
            "{bytes}: {got} against {want}"
        );
        assert_eq!(time(&t, Op::Get, 2, bytes), got);
    }
}

#[test]
fn ring_all_reduce_matches_its_closed_form() {
    for n in [2usize, 4, 8] {
        let t = bare(&format!(
            "kind = \"ring\"\ngpus = {n}\nlink = {{ gbps = 50.0, latency_us = 1.5 }}"
        ));
        for bytes in [1usize << 20, 64 << 20] {
            let nf = n as f64;
            let want = 2.0 * (nf - 1.0) / nf * bytes as f64 / 50e3 + 2.0 * (nf - 1.0) * 1.5;
            let got = time(&t, Op::RingAllReduce, n, bytes);
            assert!(
                (got - want).abs() <= want * 0.01,
                "{n} {bytes}: {got} against {want}"
            );
        }
    }
}

#[test]
fn flows_share_links_max_min_fairly() {
    // Link 0 (10 GB/s) carries flows a and b; link 1 (2 GB/s) carries b: b gets 2, a the other
    // 8 until b ends, then all 10.
    let mut e = Engine::new([10.0, 2.0]);
    let mut f = Flows::new();
    f.add(0.0, 80e3, f64::INFINITY, &[0]);
    f.add(0.0, 20e3, f64::INFINITY, &[0, 1]);
    let end = e.run(&f);
    assert_eq!(end[1], 10.0);
    assert!((end[0] - 10.0).abs() < 1e-9, "{}", end[0]);
    // A later start joins at its time and ends when its bytes have drained.
    let mut f = Flows::new();
    f.add(0.0, 100e3, f64::INFINITY, &[0]);
    f.add(5.0, 10e3, f64::INFINITY, &[0]);
    let end = e.run(&f);
    assert!((end[1] - 7.0).abs() < 1e-9, "{}", end[1]);
    assert!((end[0] - 11.0).abs() < 1e-9, "{}", end[0]);
    assert_eq!(e.link_bytes, vec![80e3 + 20e3 + 100e3 + 10e3, 20e3]);
}

#[test]
fn chained_flows_start_after_their_predecessor() {
    // Link 0 at 10 GB/s: a (40 KB) ends at 4 µs; b waits for a, 1 µs, then has the link to
    // itself (20 KB: 2 µs), ending at 7; c waits for b with no delay and shares the link with
    // d, which starts on its own at 7 (both 10 KB at 5 GB/s: 2 µs). An empty flow after d ends
    // when d ends, and e after it shares nothing: 10 KB from 9 + 0.5 at 10 GB/s.
    let mut e = Engine::new([10.0]);
    let mut f = Flows::new();
    let a = f.add(0.0, 40e3, f64::INFINITY, &[0]);
    let b = f.add_after(a, 1.0, 20e3, f64::INFINITY, &[0]);
    let c = f.add_after(b, 0.0, 10e3, f64::INFINITY, &[0]);
    let d = f.add(7.0, 10e3, f64::INFINITY, &[0]);
    let z = f.add_after(d, 0.0, 0.0, f64::INFINITY, &[0]);
    let g = f.add_after(z, 0.5, 10e3, f64::INFINITY, &[0]);
    let end = e.run(&f);
    let want = [4.0, 7.0, 9.0, 9.0, 9.0, 10.5];
    for (i, w) in [a, b, c, d, z, g].into_iter().zip(want) {
        assert!(
            (end[i] - w).abs() < 1e-9,
            "flow {i}: {} against {w}",
            end[i]
        );
    }
    assert_eq!(e.link_bytes, vec![90e3]);
    // The same set again: the same ends, bit for bit.
    assert_eq!(Engine::new([10.0]).run(&f), end);
}

/// Max-min fair rates by the textbook progressive filling: raise every unfrozen flow's rate
/// together until a link (or a flow's cap) is full, freeze the flows there, repeat.
fn reference_rates(caps: &[f64], paths: &[Vec<u32>], flow_cap: &[f64], on: &[usize]) -> Vec<f64> {
    let mut rate = vec![0.0; paths.len()];
    let mut frozen: Vec<bool> = (0..paths.len()).map(|f| !on.contains(&f)).collect();
    let mut left = caps.to_vec();
    while frozen.iter().any(|x| !x) {
        let mut inc = f64::INFINITY;
        for (l, c) in left.iter().enumerate() {
            let n = (0..paths.len())
                .filter(|&f| !frozen[f] && paths[f].contains(&(l as u32)))
                .count();
            if n > 0 {
                inc = inc.min(c / n as f64);
            }
        }
        for f in (0..paths.len()).filter(|&f| !frozen[f]) {
            inc = inc.min(flow_cap[f] - rate[f]);
        }
        for f in (0..paths.len()).filter(|&f| !frozen[f]) {
            rate[f] += inc;
            for &l in &paths[f] {
                left[l as usize] -= inc;
            }
        }
        for f in 0..paths.len() {
            let full = paths[f]
                .iter()
                .any(|&l| left[l as usize] <= caps[l as usize] * 1e-12);
            if !frozen[f] && (full || rate[f] >= flow_cap[f] * (1.0 - 1e-12)) {
                frozen[f] = true;
            }
        }
    }
    rate
}

/// The engine's end times against a plain event loop over [`reference_rates`], on random
/// flows with random starts, sizes, caps and paths.
#[test]
fn engine_matches_textbook_max_min() {
    let mut s = 7u64;
    let mut next = move |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    for _ in 0..20 {
        let links = 1 + next(6) as usize;
        let caps: Vec<f64> = (0..links).map(|_| 1.0 + next(20) as f64).collect();
        let count = 1 + next(25) as usize;
        let mut f = Flows::new();
        let (mut starts, mut bytes, mut flow_cap, mut paths) = (vec![], vec![], vec![], vec![]);
        for _ in 0..count {
            let mut p: Vec<u32> = (0..links as u32).filter(|_| next(2) == 0).collect();
            if p.is_empty() {
                p.push(next(links as u64) as u32);
            }
            let st = next(4) as f64 * 3.0;
            let b = (next(50) * 1000) as f64;
            let c = if next(3) == 0 {
                0.5 + next(10) as f64
            } else {
                f64::INFINITY
            };
            f.add(st, b, c, &p);
            starts.push(st);
            bytes.push(b);
            flow_cap.push(c * 1e3);
            paths.push(p);
        }
        let got = Engine::new(caps.clone()).run(&f);
        // The reference event loop, bytes per µs.
        let caps_us: Vec<f64> = caps.iter().map(|c| c * 1e3).collect();
        let mut left = bytes.clone();
        let mut want = vec![f64::NAN; count];
        let mut t = 0.0f64;
        loop {
            let on: Vec<usize> = (0..count)
                .filter(|&i| want[i].is_nan() && starts[i] <= t && left[i] > 0.0)
                .collect();
            for i in 0..count {
                if want[i].is_nan() && starts[i] <= t && left[i] <= 0.0 {
                    want[i] = starts[i];
                }
            }
            let later = (0..count)
                .filter(|&i| want[i].is_nan() && starts[i] > t)
                .map(|i| starts[i])
                .fold(f64::INFINITY, f64::min);
            if on.is_empty() {
                if later.is_finite() {
                    t = later;
                    continue;
                }
                break;
            }
            let r = reference_rates(&caps_us, &paths, &flow_cap, &on);
            let dt = on
                .iter()
                .map(|&i| left[i] / r[i])
                .fold(f64::INFINITY, f64::min);
            let step = dt.min(later - t);
            for &i in &on {
                left[i] -= r[i] * step;
                if left[i] <= bytes[i] * 1e-9 {
                    want[i] = t + step;
                }
            }
            t += step;
        }
        for i in 0..count {
            assert!(
                (got[i] - want[i]).abs() <= 1e-6 * want[i].max(1.0),
                "flow {i}: {} against {}",
                got[i],
                want[i]
            );
        }
    }
}

/// Ending flows within a tolerance of the next end together (what large phases do): against
/// the exact run, the last end (the phase's time) moves by at most 1.5 times the tolerance and
/// any flow's end by at most 3 times, as parts of their time since the first start. An
/// all-to-all of random sizes among 64 GPUs behind a switch, each pair with its own size.
#[test]
fn end_tolerance_bounds_every_end() {
    let n = 64u32;
    // Links: GPU g's uplink 2g, downlink 2g + 1, at 50 GB/s.
    let caps = vec![50.0; 2 * n as usize];
    let mut s = 11u64;
    let mut f = Flows::new();
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bytes = (1 + (s >> 33) % 40) as f64 * 14336.0;
            f.add(
                ((a + b) % 3) as f64,
                bytes,
                f64::INFINITY,
                &[2 * a, 2 * b + 1],
            );
        }
    }
    let exact = Engine::new(caps.clone()).run(&f);
    let last = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    for tol in [0.002, 0.01] {
        let mut e = Engine::new(caps.clone());
        e.tolerance = tol;
        let got = e.run(&f);
        let mut worst = 0.0f64;
        for (g, x) in got.iter().zip(&exact) {
            worst = worst.max((g - x).abs() / x);
        }
        let phase = (last(&got) - last(&exact)).abs() / last(&exact);
        assert!(
            worst <= 3.0 * tol,
            "tolerance {tol}: an end moved by {worst} of its time"
        );
        assert!(
            phase <= 1.5 * tol,
            "tolerance {tol}: the last end moved by {phase}"
        );
    }
}

/// Time never falls as the size grows on one path. Across a change of path it may (a plan's
/// two-shot past the one-shot limit, `RSHMEM_COLL_TWO_SHOT_BYTES`). On the LL path by at most
/// one late wait: an all_reduce of one block whose verdict warp has lines of its own takes
/// them after the verdict, the larger calls with a control warp beside it
/// (`traffic::ll_late_waits`).
#[test]
fn time_grows_with_size() {
    let cases = [
        ("h200x2.toml", 2),
        ("h200x4.toml", 4),
        ("nvswitch8.toml", 8),
        ("torus8x8.toml", 64),
        ("railfat4096.toml", 64),
    ];
    for (file, pes) in cases {
        let t = topo_file(file);
        for kind in [CollKind::AllReduce, CollKind::AllToAll, CollKind::AllGather] {
            let mut last: std::collections::HashMap<String, f64> = Default::default();
            let (mut first, mut end) = (0.0, 0.0);
            for s in 0..=13 {
                let bytes = (pes * 16) << (2 * s);
                let p = coll_plan(&t, kind, pes, bytes);
                let got = simulate(&t, &p, &mut |_, _| {}).expect("simulate").time_us;
                let before = last.insert(p.path.clone(), got).unwrap_or(0.0);
                let slack = if p.path == "ll" {
                    t.model.late_wait_us
                } else {
                    0.0
                };
                assert!(
                    got + slack >= before,
                    "{file} {kind:?} {bytes} {}: {got} after {before}",
                    p.path
                );
                if s == 0 {
                    first = got;
                }
                end = got;
            }
            assert!(end > 100.0 * first, "{file} {kind:?}: {first} to {end}");
        }
    }
}

#[test]
fn every_link_carries_what_the_schedule_sends() {
    let t = topo_file("railfat4096.toml");
    let setup = Setup::default();
    for (op, bytes) in [
        (Op::Coll(CollKind::AllToAll), 64 << 20),
        (Op::Coll(CollKind::AllReduce), 8 << 20),
    ] {
        let p = build(&t, &setup, op, 32, bytes).expect("schedule");
        let r = simulate(&t, &p, &mut |_, _| {}).expect("simulate");
        let mut want = vec![0.0f64; t.links().len()];
        let mut sent = 0.0;
        for x in p.phases.iter().flat_map(|ph| &ph.xfers) {
            if x.src == x.dst {
                continue;
            }
            sent += x.bytes as f64;
            for l in t.route(x.src as usize, x.dst as usize).expect("route") {
                want[l as usize] += x.bytes as f64;
            }
        }
        let fabric: Vec<f64> = (0..want.len())
            .map(|l| if t.is_port(l) { 0.0 } else { r.link_bytes[l] })
            .collect();
        for (l, (w, g)) in want.iter().zip(&fabric).enumerate() {
            assert!(
                (w - g).abs() <= w * 1e-9,
                "link {}: {g} against {w}",
                t.link_name(l)
            );
        }
        // Conservation at every node: what enters less what leaves is what it receives less
        // what it sends (0 at switches; a GPU forwarding for PXN passes its bytes on).
        let nodes = t
            .links()
            .iter()
            .map(|k| k.from.max(k.to) as usize)
            .max()
            .unwrap_or(0)
            + 1;
        let mut net = vec![0.0f64; nodes];
        for (l, k) in t.links().iter().enumerate().filter(|(l, _)| !t.is_port(*l)) {
            net[k.to as usize] += r.link_bytes[l];
            net[k.from as usize] -= r.link_bytes[l];
        }
        let mut want_net = vec![0.0f64; nodes];
        for x in p
            .phases
            .iter()
            .flat_map(|ph| &ph.xfers)
            .filter(|x| x.src != x.dst)
        {
            want_net[x.dst as usize] += x.bytes as f64;
            want_net[x.src as usize] -= x.bytes as f64;
        }
        for v in 0..nodes {
            let d = (net[v] - want_net[v]).abs();
            assert!(
                d <= sent * 1e-12,
                "node {v}: {} against {}",
                net[v],
                want_net[v]
            );
        }
    }
}

#[test]
fn same_inputs_same_timeline() {
    let t = topo_file("torus8x8.toml");
    let run = || {
        let p = coll_plan(&t, CollKind::AllToAll, 64, 16 << 20);
        simulate(&t, &p, &mut |_, _| {}).expect("simulate")
    };
    let (a, b) = (run(), run());
    assert_eq!(a.time_us.to_bits(), b.time_us.to_bits());
    assert_eq!(a.phases, b.phases);
    assert_eq!(a.link_bytes, b.link_bytes);
    assert_eq!(a.events, b.events);
}

#[test]
fn shipped_topologies_and_routes() {
    for (file, gpus) in [
        ("h200x2.toml", 2),
        ("h200x4.toml", 4),
        ("nvswitch8.toml", 8),
        ("nvl72.toml", 72),
        ("pcie8.toml", 8),
        ("railfat4096.toml", 4096),
        ("torus8x8.toml", 64),
        ("ring8.toml", 8),
    ] {
        assert_eq!(topo_file(file).gpus(), gpus, "{file}");
    }
    let hops = |file: &str, a: usize, b: usize| topo_file(file).route(a, b).expect("route").len();
    assert_eq!(hops("torus8x8.toml", 0, 36), 8);
    assert_eq!(hops("torus8x8.toml", 0, 7), 1);
    assert_eq!(hops("ring8.toml", 1, 6), 3);
    assert_eq!(hops("pcie8.toml", 0, 3), 2);
    assert_eq!(hops("pcie8.toml", 0, 4), 4);
    assert_eq!(hops("nvswitch8.toml", 2, 5), 2);
    // Same node; same rail and leaf; another rail (PXN hop first); another leaf.
    assert_eq!(hops("railfat4096.toml", 0, 7), 2);
    assert_eq!(hops("railfat4096.toml", 0, 8), 2);
    assert_eq!(hops("railfat4096.toml", 0, 9), 4);
    assert_eq!(hops("railfat4096.toml", 0, 8 * 32), 4);
    assert_eq!(hops("railfat4096.toml", 1, 8 * 32 + 2), 6);
    let t = topo_file("railfat4096.toml");
    let r = t.route(1, 8 * 32 + 2).expect("route");
    let names: Vec<String> = r.iter().map(|&l| t.link_name(l as usize)).collect();
    assert_eq!(
        names,
        [
            "gpu1 -> nvswitch0",
            "nvswitch0 -> gpu2",
            "gpu2 -> leaf0.rail2",
            "leaf0.rail2 -> spine.rail2",
            "spine.rail2 -> leaf1.rail2",
            "leaf1.rail2 -> gpu258"
        ]
    );
}

#[test]
fn explicit_links_route_by_fewest_hops() {
    let t = bare(
        r#"kind = "links"
gpus = 3
nodes = ["sw"]
links = [
  { from = "gpu0", to = "sw", gbps = 10.0, latency_us = 1.0, both = true },
  { from = "gpu1", to = "sw", gbps = 10.0, latency_us = 1.0, both = true },
  { from = "gpu2", to = "sw", gbps = 10.0, latency_us = 1.0, both = true },
  { from = "gpu0", to = "gpu1", gbps = 5.0, latency_us = 3.0 },
]"#,
    );
    assert_eq!(t.route(0, 1).expect("route"), vec![6]);
    assert_eq!(t.route(1, 0).expect("route"), vec![2, 1]);
    assert_eq!(t.route(0, 2).expect("route"), vec![0, 5]);
    // Incomplete (no fabric, a GPU of one field): refused as TOML that lacks a field.
    let bad = Topology::parse("name = \"x\"\n[gpu]\nsms = 1");
    assert!(
        matches!(&bad, Err(rshmem_sim::SimError::Toml { source, .. }) if source.to_string().contains("missing field")),
        "{bad:?}"
    );
}

#[test]
fn paths_are_the_librarys() {
    let t = topo_file("h200x2.toml");
    let path = |kind, bytes| coll_plan(&t, kind, 2, bytes).path;
    assert_eq!(path(CollKind::AllReduce, 8), "ll");
    assert_eq!(path(CollKind::AllReduce, 1 << 20), "pull");
    assert_eq!(path(CollKind::AllReduce, 256 << 20), "push");
    assert_eq!(path(CollKind::AllToAll, 16 << 20), "push");
    assert_eq!(path(CollKind::ReduceScatter, 16 << 20), "one_shot");
    let t = topo_file("nvswitch8.toml");
    let p = coll_plan(&t, CollKind::AllReduce, 8, 64 << 20);
    assert_eq!(p.path, "pull_two_shot");
    let t = topo_file("railfat4096.toml");
    let p = coll_plan(&t, CollKind::AllReduce, 64, 64 << 20);
    assert_eq!(p.path, "two_shot");
    // Two-shot plan: barrier, reduce kernel, barrier, a copy kernel (63 copies), barrier.
    let whats: Vec<&str> = p.phases.iter().map(|ph| ph.what).collect();
    assert_eq!(whats, ["barrier", "kernel", "barrier", "kernel", "barrier"]);
    assert_eq!(p.phases[1].xfers.len(), 64 * 64);
    assert_eq!(p.phases[3].xfers.len(), 64 * 63);
}

#[test]
fn moe_traffic_follows_the_routing() {
    let t = topo_file("h200x4.toml");
    let mut setup = Setup::default();
    setup.ep.tokens = 2;
    setup.ep.topk = 2;
    setup.ep.experts = 4;
    setup.ep.hidden = 8;
    // PE p's tokens go to experts (p, p+1) and (2, 3): PEs p and p+1, then PEs 2 and 3.
    setup.ep.routing = Some((0..4).map(|p: i32| vec![p, (p + 1) % 4, 2, 3]).collect());
    let from0 = |setup: &Setup| {
        let p = build(&t, setup, Op::Dispatch, 4, 0).expect("schedule");
        // PE 0 sends token 0 to PE 1 and token 1 to PEs 2 and 3: three rows of 16 bytes.
        assert_eq!(p.bytes, 3 * 16);
        let mut pairs: Vec<(u32, u32, f32)> = p.phases[0]
            .xfers
            .iter()
            .filter(|x| x.src == 0)
            .map(|x| (x.src, x.dst, x.bytes))
            .collect();
        pairs.sort_by_key(|a| a.1);
        pairs
    };
    // Expert-major: no copy of the own row; PE 0's memory carries its 3 rows sent, PE 3's
    // token 0 landing (1), both rows read by the expansion (2) and written to their one slot
    // each (2), the sentinel stored back (1): 9 rows of 16 bytes, at a copy's rate (a read
    // and a write per byte).
    assert_eq!(
        from0(&setup),
        [(0, 0, 72.0), (0, 1, 16.0), (0, 2, 16.0), (0, 3, 16.0)]
    );
    // Token-major: the own row copied.
    setup.ep.token_major = true;
    assert_eq!(
        from0(&setup),
        [(0, 0, 16.0), (0, 1, 16.0), (0, 2, 16.0), (0, 3, 16.0)]
    );
}

/// The pull folds' loads and a pair's steps by stores run in waves of the grid's loads in
/// flight (`PathTraffic::wave`), each after the one before.
#[test]
fn folds_and_push_steps_run_in_waves() {
    use rshmem_sim::schedule::Xfer;
    use rshmem_sim::topology::Port;
    // A pair's pull all_reduce of 16 MiB: 128 blocks of 256 threads, 128 bytes in flight
    // each: 4 MiB waves, 4 per member, each after the last.
    let t = topo_file("h200x2.toml");
    let p = coll_plan(&t, CollKind::AllReduce, 2, 16 << 20);
    let x = &p.phases[0].xfers;
    assert_eq!(x.len(), 8);
    for (i, x) in x.iter().enumerate() {
        assert_eq!((x.port, x.bytes), (Port::Load, (4 << 20) as f32));
        let after = if i % 4 == 0 {
            Xfer::FIRST
        } else {
            i as u32 - 1
        };
        assert_eq!(x.after, after, "transfer {i}");
    }
    // Four members' two-shot of 16 MiB: one wave, each member reading its part (4 MiB) of
    // every member in team order, its own among them; then the stores.
    let t = topo_file("h200x4.toml");
    let p = coll_plan(&t, CollKind::AllReduce, 4, 16 << 20);
    assert_eq!(p.path, "pull_two_shot");
    let loads = &p.phases[0].xfers;
    assert_eq!(loads.len(), 16);
    for (i, x) in loads.iter().enumerate() {
        let (reader, from) = (i / 4, i % 4);
        assert_eq!((x.dst as usize, x.src as usize), (reader, from));
        let port = if reader == from {
            Port::Hbm
        } else {
            Port::Load
        };
        assert_eq!((x.port, x.bytes), (port, (4 << 20) as f32));
        let after = if from == 0 { Xfer::FIRST } else { i as u32 - 1 };
        assert_eq!(x.after, after, "load {i}");
    }
    assert!(p.phases[1].xfers.iter().all(|x| x.port == Port::Store));
    // A pair's 256 MiB by stores: steps of 8192 vectors of 128 blocks (16 MiB) one after the
    // other, then the last step's fold.
    let t = topo_file("h200x2.toml");
    let p = coll_plan(&t, CollKind::AllReduce, 2, 256 << 20);
    assert_eq!(p.path, "push");
    let x: Vec<&Xfer> = p.phases[0].xfers.iter().filter(|x| x.src == 0).collect();
    assert_eq!(x.len(), 17);
    assert!(x[..16]
        .iter()
        .all(|x| x.port == Port::Store && x.bytes == (16 << 20) as f32));
    assert_eq!((x[16].port, x[16].bytes), (Port::Hbm, (24 << 20) as f32));
}
