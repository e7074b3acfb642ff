//! Stream-ordered CUDA collectives (`rshmem::cuda::GpuColl`).
//!
//! CI (no GPU): the collective kernels compile through NVRTC and export every kernel name the
//! executor loads. GPU (`--include-ignored`; several PEs may share one GPU, e.g.
//! `RSHMEM_DEVICES=0,0,0,0`): every collective × element type × operation × team (world of 4,
//! a strided team {1, 3}, a team of 3) × in/out of place × one-shot/two-shot, seeded random
//! data against a host reference (exact: the data make every float result exact, as in
//! tests/coll.rs), poisoned outputs; a graph captured once and replayed with new data 12
//! times, every replay checked; all_to_all_v with device-side counts (exchange, replay,
//! overflow → `Error::Capacity` with nothing written beyond the capacity); bad inputs. A
//! sample of types, the graph replay and the device-count all_to_all_v also run as 4 launched
//! processes and as 2 processes × 2 threads (`harness::gpu_run`).

#[path = "harness/mod.rs"]
mod harness;
#[macro_use]
#[path = "harness/coll_data.rs"]
mod coll_data;
use coll_data::{check, mix, TElem};

use rshmem::coll::{Algo, AllToAllV, CollConfig, CollKind, Fold, ReduceOp, ToRoot};
use rshmem::cuda::{self, CollPath, CollTuning, CudaPe, DeviceCounts, GpuColl, PerTeam, Stream};
use rshmem::{bf16, f16, BackendKind, Config, Error, HeapKind, Pe, Result, Team};
use std::time::Duration;

// ---------- CI ----------

#[test]
fn coll_kernels_compile_and_export_every_name() {
    let ci = std::env::var_os("CI").is_some();
    let src = cuda::nvrtc::with_header(cuda::COLL_KERNELS);
    let cubin = match cuda::nvrtc::compile(&src, "sm_90", &[]) {
        Ok(c) => c,
        Err(e) if !ci && format!("{e}").contains("was not found") => {
            eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let names = cuda::coll_kernel_names();
    // The fixed kernels (six LL data kernels and two pull kernels among them), then a reduce, an LL and a pull
    // all_reduce kernel per (type, op): 8 integer types × 7 ops, 4 float types × 4.
    assert_eq!(names.len(), 13 + 3 * (8 * 7 + 4 * 4));
    for n in names {
        let needle = format!("{n}\0");
        assert!(
            cubin.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "kernel {n} missing from the cubin"
        );
    }
}

// ---------- data and references: harness/coll_data.rs (as tests/coll.rs) ----------

/// What `f` launches on `s`, captured into a graph (capture ends whether `f` fails or not).
fn capture(s: &Stream, f: impl FnOnce() -> Result<()>) -> Result<cuda::Graph> {
    s.begin_capture()?;
    let r = f();
    let g = s.end_capture();
    r?;
    g
}

// ---------- GPU worlds ----------

fn gpu_config() -> Config {
    Config::default()
        .heap_size(64 << 20)
        .timeout(Duration::from_secs(30))
        .backend(BackendKind::Cuda)
        .heap_kind(HeapKind::Static)
}

fn on_gpus(n: usize, body: fn(&Pe) -> Result<()>) {
    on_gpus_cfg(gpu_config(), n, body)
}

fn on_gpus_cfg(cfg: Config, n: usize, body: fn(&Pe) -> Result<()>) {
    harness::gpu_threads(n, cfg, body);
}

/// World (4), a strided team {1, 3}, a team of 3 {0, 1, 2}.
struct Teams {
    strided: Option<Team>,
    tri: Option<Team>,
}

impl Teams {
    fn new(pe: &Pe) -> Result<Teams> {
        let w = pe.world_team();
        let strided = pe.team_split_strided(w, 1, 2, 2)?;
        let tri = pe.team_split_strided(w, 0, 1, 3)?;
        Ok(Teams { strided, tri })
    }
    fn list<'a>(&'a self, pe: &'a Pe) -> Vec<(&'static str, &'a Team)> {
        let mut v = vec![("world", pe.world_team())];
        if let Some(t) = &self.strided {
            v.push(("strided", t));
        }
        if let Some(t) = &self.tri {
            v.push(("tri", t));
        }
        v
    }
}

/// Element counts: odd sizes (vector tails), a two-shot-sized one.
const COUNTS: [usize; 3] = [1, 1003, 70_001];
const MAXC: usize = 4 * 70_001;

struct Ctx<'a> {
    pe: &'a Pe,
    coll: GpuColl<'a>,
    s: Stream,
    teams: Teams,
}

/// LL all_reduce size of the contexts this process makes (0: off; the `*_ll` bodies set it
/// before running a shared body, in every PE of their process alike).
static LL_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The LL size the `*_ll` tests use (the largest one-shot message of `Ctx`).
const LL_TEST_BYTES: usize = 64 << 10;

/// The environment's tuning with the LL all_reduce up to `ll` bytes (0: off) and the LL
/// all_to_all up to twice that.
/// `RSHMEM_TEST_COLL_NVRTC_OPTS` (a test switch) adds compile options, the switches that break
/// the kernels on purpose included (mutation runs: a test that still passes with one cannot
/// see what it guards).
fn ll_tuning(ll: usize) -> Result<CollTuning> {
    let mut t = CollTuning::from_env()?.with_ll(cuda::LlSizes {
        all_reduce: ll,
        all_to_all: 2 * ll,
    });
    if let Ok(v) = std::env::var("RSHMEM_TEST_COLL_NVRTC_OPTS") {
        t.nvrtc_options
            .extend(v.split_whitespace().map(str::to_string));
    }
    Ok(t)
}

fn with_ll(body: fn(&Pe) -> Result<()>, pe: &Pe) -> Result<()> {
    LL_BYTES.store(LL_TEST_BYTES, std::sync::atomic::Ordering::Relaxed);
    body(pe)
}

impl<'a> Ctx<'a> {
    fn new(pe: &'a Pe) -> Result<Ctx<'a>> {
        let g = CudaPe::new(pe)?;
        // Two-shot from 64 KiB, so both algorithms run with the counts above.
        let ll = LL_BYTES.load(std::sync::atomic::Ordering::Relaxed);
        let coll = GpuColl::new(
            g,
            CollConfig::default().two_shot_bytes(64 << 10),
            ll_tuning(ll)?,
        )?;
        assert_eq!(coll.ll_sizes().all_reduce, ll);
        Ok(Ctx {
            pe,
            s: g.stream()?,
            coll,
            teams: Teams::new(pe)?,
        })
    }
    fn done(&self) -> Result<()> {
        self.s.synchronize()?;
        self.coll.check_errors()
    }
    /// Runs `f(team, in_place, count, stream, ctx)` over teams × in place × counts.
    fn cases(
        &self,
        what: &str,
        mut f: impl FnMut(&Team, bool, usize, u64, &str) -> Result<()>,
    ) -> Result<()> {
        // Seeds depend on the case only (members see different team lists).
        for (tn, team) in self.teams.list(self.pe) {
            let ti = ["world", "strided", "tri"]
                .iter()
                .position(|&x| x == tn)
                .unwrap_or(9);
            for in_place in [false, true] {
                for (ci, count) in COUNTS.into_iter().enumerate() {
                    let stream = (ti * 8 + in_place as usize * 4 + ci + 1) as u64;
                    let ctx = format!(
                        "{what} team {tn} {:?} in_place {in_place} count {count} (PE {})",
                        team.members(),
                        self.pe.my_pe()
                    );
                    f(team, in_place, count, stream, &ctx)?;
                }
            }
        }
        Ok(())
    }
}

fn ins<T: TElem>(team: &Team, s: u64, len: usize, op: ReduceOp) -> Vec<Vec<T>> {
    team.members()
        .iter()
        .map(|&w| T::gen(w, s, len, op))
        .collect()
}

fn fold_at<T: TElem>(op: ReduceOp, ins: &[Vec<T>], i: usize) -> T {
    T::fold(op, &ins.iter().map(|v| v[i]).collect::<Vec<_>>())
}

fn reductions_t<T: TElem>(c: &Ctx<'_>) -> Result<()> {
    let pe = c.pe;
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(MAXC)?;
    for &op in T::ops() {
        let what = format!("{} {}", T::KIND.name(), op.name());
        c.cases(&what, |team, ip, count, s, ctx| {
            let (me, n) = (team.my_pe(), team.n_pes());
            let s = s * 16 + op as u64;
            let obj = if ip { &dst } else { &src };
            // all_reduce, both algorithms
            for algo in [Algo::OneShot, Algo::TwoShot] {
                let mine = T::gen(pe.my_pe(), s, count, op);
                pe.local_fill(&dst, T::poison())?;
                pe.local_write(obj, 0, &mine)?;
                c.coll.all_reduce(
                    &c.s,
                    team,
                    &dst,
                    obj,
                    count,
                    Fold {
                        op,
                        algo: Some(algo),
                    },
                )?;
                c.done()?;
                let x = ins::<T>(team, s, count, op);
                let mut want: Vec<T> = (0..count).map(|i| fold_at(op, &x, i)).collect();
                want.resize(MAXC, T::poison());
                check(
                    &pe.local_vec(&dst)?,
                    &want,
                    &format!("all_reduce {algo:?} {ctx}"),
                );
            }
            // reduce to a root that varies
            let root = (s as usize) % n;
            let mine = T::gen(pe.my_pe(), s + 1, count, op);
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(obj, 0, &mine)?;
            c.coll
                .reduce(&c.s, team, &dst, obj, count, ToRoot { op, root })?;
            c.done()?;
            let mut want = if me == root {
                let x = ins::<T>(team, s + 1, count, op);
                (0..count).map(|i| fold_at(op, &x, i)).collect()
            } else if ip {
                mine.clone()
            } else {
                vec![]
            };
            want.resize(MAXC, T::poison());
            check(
                &pe.local_vec(&dst)?,
                &want,
                &format!("reduce root {root} {ctx}"),
            );
            // reduce_scatter (count per member; the object holds n·count)
            let rc = count.min(MAXC / n);
            let mine = T::gen(pe.my_pe(), s + 2, n * rc, op);
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(obj, 0, &mine)?;
            c.coll.reduce_scatter(&c.s, team, &dst, obj, rc, op)?;
            c.done()?;
            let x = ins::<T>(team, s + 2, n * rc, op);
            let mut want: Vec<T> = if ip { mine.clone() } else { vec![] };
            let at = if ip { me * rc } else { 0 };
            want.resize(MAXC.max(at + rc), T::poison());
            for i in 0..rc {
                want[at + i] = fold_at(op, &x, me * rc + i);
            }
            want.truncate(MAXC);
            check(
                &pe.local_vec(&dst)?,
                &want,
                &format!("reduce_scatter {ctx}"),
            );
            Ok(())
        })?;
    }
    pe.free(dst)?;
    pe.free(src)
}

fn movement_t<T: TElem>(c: &Ctx<'_>) -> Result<()> {
    let pe = c.pe;
    let src = pe.alloc::<T>(MAXC)?;
    let dst = pe.alloc::<T>(MAXC)?;
    let what = T::KIND.name().to_string();
    c.cases(&what, |team, ip, count, s, ctx| {
        let (me, n, m) = (team.my_pe(), team.n_pes(), team.members());
        let obj = if ip { &dst } else { &src };
        let op = ReduceOp::Sum;
        // broadcast (one-shot below 64 KiB, two-shot from there: the counts give both)
        let root = (s as usize + 1) % n;
        let mine = T::gen(pe.my_pe(), s, count, op);
        pe.local_fill(&dst, T::poison())?;
        pe.local_write(obj, 0, &mine)?;
        c.coll.broadcast(&c.s, team, &dst, obj, count, root)?;
        c.done()?;
        let mut want = T::gen(m[root], s, count, op);
        want.resize(MAXC, T::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("broadcast root {root} {ctx}"),
        );
        // all_gather
        let gc = count.min(MAXC / n);
        let mine = T::gen(pe.my_pe(), s + 1, gc, op);
        pe.local_fill(&dst, T::poison())?;
        pe.local_write(obj, if ip { me * gc } else { 0 }, &mine)?;
        c.coll.all_gather(&c.s, team, &dst, obj, gc)?;
        c.done()?;
        let mut want: Vec<T> = m.iter().flat_map(|&w| T::gen(w, s + 1, gc, op)).collect();
        want.resize(MAXC, T::poison());
        check(&pe.local_vec(&dst)?, &want, &format!("all_gather {ctx}"));
        // all_to_all
        let mine = T::gen(pe.my_pe(), s + 2, n * gc, op);
        pe.local_fill(&dst, T::poison())?;
        pe.local_write(obj, 0, &mine)?;
        c.coll.all_to_all(&c.s, team, &dst, obj, gc)?;
        c.done()?;
        let mut want: Vec<T> = m
            .iter()
            .flat_map(|&w| T::gen(w, s + 2, n * gc, op)[me * gc..(me + 1) * gc].to_vec())
            .collect();
        want.resize(MAXC, T::poison());
        check(&pe.local_vec(&dst)?, &want, &format!("all_to_all {ctx}"));
        if !ip {
            a2av_host_t::<T>(c, team, &src, &dst, s + 3, ctx)?;
        }
        Ok(())
    })?;
    pe.free(dst)?;
    pe.free(src)
}

/// Counts of all_to_all_v cases: sender i → receiver j.
fn vcnt(i: usize, j: usize, s: u64) -> usize {
    (mix(harness::rand_vec::<f64>(i * 64 + j, s, 1)[0]) >> 33) as usize % 50
}

fn a2av_host_t<T: TElem>(
    c: &Ctx<'_>,
    team: &Team,
    src: &rshmem::Sym<T>,
    dst: &rshmem::Sym<T>,
    s: u64,
    ctx: &str,
) -> Result<()> {
    let pe = c.pe;
    let (me, n, m) = (team.my_pe(), team.n_pes(), team.members());
    let sd = |i: usize| -> Vec<usize> {
        let mut at = 3;
        (0..n)
            .map(|j| {
                let d = at;
                at += vcnt(i, j, s) + 1;
                d
            })
            .collect()
    };
    let sc: Vec<usize> = (0..n).map(|j| vcnt(me, j, s)).collect();
    let rc: Vec<usize> = (0..n).map(|i| vcnt(i, me, s)).collect();
    // receive in reverse member order with gaps
    let mut rd = vec![0; n];
    let mut at = 1;
    for i in (0..n).rev() {
        rd[i] = at;
        at += rc[i] + 2;
    }
    let mine = T::gen(pe.my_pe(), s, 64 * n, ReduceOp::Sum);
    pe.local_fill(dst, T::poison())?;
    pe.local_write(src, 0, &mine)?;
    let sdm = sd(me);
    let v = AllToAllV {
        send_counts: &sc,
        send_displs: &sdm,
        recv_counts: &rc,
        recv_displs: &rd,
    };
    c.coll.all_to_all_v(&c.s, team, dst, src, &v)?;
    c.done()?;
    let mut want = vec![T::poison(); dst.len()];
    for (i, &w) in m.iter().enumerate() {
        let theirs = T::gen(w, s, 64 * n, ReduceOp::Sum);
        let a = sd(i)[me];
        want[rd[i]..rd[i] + rc[i]].copy_from_slice(&theirs[a..a + rc[i]]);
    }
    check(&pe.local_vec(dst)?, &want, &format!("all_to_all_v {ctx}"));
    Ok(())
}

fn everything(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    each_type!(reductions_t(&c));
    each_type!(movement_t(&c));
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_every_collective_type_op_team() {
    on_gpus(4, everything);
}

/// `everything` with the LL all_reduce on (one-shot all_reduce up to 64 KiB, teams of every
/// shape in the first LL slots): every type, op, team, in and out of place against the same
/// host references.
fn everything_ll(pe: &Pe) -> Result<()> {
    with_ll(everything, pe)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_ll_every_type_op_team() {
    on_gpus(4, everything_ll);
}

/// `sample` and `graph_body` (capture once, replay with new data) with the LL all_reduce on.
fn sample_and_graph_ll(pe: &Pe) -> Result<()> {
    with_ll(sample, pe)?;
    with_ll(graph_body, pe)
}

gpu_mode_test!(
    gpu_coll_ll_sample_and_graph,
    gpu_config(),
    sample_and_graph_ll,
    [threads(4), processes(4), mixed(4)]
);

/// A sample of `everything` for the launched modes: bf16 reductions (all_reduce both
/// algorithms, reduce, reduce_scatter; every op) and f32 data movement (broadcast, all_gather,
/// all_to_all, all_to_all_v), every team, in and out of place.
fn sample(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    reductions_t::<bf16>(&c)?;
    movement_t::<f32>(&c)
}

gpu_mode_test!(
    gpu_coll_sample_bf16_f32,
    gpu_config(),
    sample,
    [processes(4), mixed(4)]
);

// ---------- graph capture and replay ----------

fn graph_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let strided = c.teams.strided.as_ref();
    const C1: usize = 1001;
    const C2: usize = 40_000; // two-shot (160 KB of f32)
    let a_src = pe.alloc::<f32>(C1)?;
    let a_dst = pe.alloc::<f32>(C1)?;
    let b = pe.alloc::<bf16>(C2)?; // in place, two-shot... bf16 is 80 KB: two-shot at 64 KiB
    let g_dst = pe.alloc::<i32>(n * C1)?;
    let t_src = pe.alloc::<u16>(n * 300)?;
    let t_dst = pe.alloc::<u16>(n * 300)?;
    let p = pe.alloc::<i64>(C1)?; // in-place one-shot all_reduce on the strided team (staging)
    c.coll.reserve(C1 * 8)?;
    pe.barrier_all()?;
    let s = &c.s;
    let graph = capture(s, || {
        c.coll.all_reduce(s, w, &a_dst, &a_src, C1, ReduceOp::Sum)?;
        c.coll.all_reduce(s, w, &b, &b, C2, ReduceOp::Max)?;
        c.coll
            .all_gather(s, w, &g_dst, &a_src.view::<i32>(0, C1)?, C1)?;
        c.coll.all_to_all(s, w, &t_dst, &t_src, 300)?;
        if let Some(t) = strided {
            c.coll.all_reduce(
                s,
                t,
                &p,
                &p,
                C1,
                Fold {
                    op: ReduceOp::Xor,
                    algo: Some(Algo::OneShot),
                },
            )?;
        }
        Ok(())
    })?;
    pe.barrier_all()?; // every PE has its graph before any launches
    for r in 0..12u64 {
        let st = 1000 + r * 8;
        let f = |pe_: usize| f32::gen(pe_, st, C1, ReduceOp::Sum);
        let bb = |pe_: usize| bf16::gen(pe_, st + 1, C2, ReduceOp::Max);
        let tt = |pe_: usize| u16::gen(pe_, st + 2, n * 300, ReduceOp::Sum);
        let pp = |pe_: usize| i64::gen(pe_, st + 3, C1, ReduceOp::Xor);
        pe.local_fill(&a_dst, f32::poison())?;
        pe.local_fill(&g_dst, i32::poison())?;
        pe.local_fill(&t_dst, u16::poison())?;
        pe.local_write(&a_src, 0, &f(me))?;
        pe.local_write(&b, 0, &bb(me))?;
        pe.local_write(&t_src, 0, &tt(me))?;
        pe.local_write(&p, 0, &pp(me))?;
        graph.launch(s)?;
        c.done()?;
        let ctx = format!("replay {r} PE {me}");
        let fa: Vec<Vec<f32>> = (0..n).map(f).collect();
        let want: Vec<f32> = (0..C1).map(|i| fold_at(ReduceOp::Sum, &fa, i)).collect();
        check(&pe.local_vec(&a_dst)?, &want, &format!("all_reduce {ctx}"));
        let ba: Vec<Vec<bf16>> = (0..n).map(bb).collect();
        let want: Vec<bf16> = (0..C2).map(|i| fold_at(ReduceOp::Max, &ba, i)).collect();
        check(&pe.local_vec(&b)?, &want, &format!("all_reduce bf16 {ctx}"));
        let want: Vec<i32> = (0..n)
            .flat_map(|j| {
                f(j).iter()
                    .map(|x| i32::from_ne_bytes(x.to_ne_bytes()))
                    .collect::<Vec<_>>()
            })
            .collect();
        check(&pe.local_vec(&g_dst)?, &want, &format!("all_gather {ctx}"));
        let want: Vec<u16> = (0..n)
            .flat_map(|j| tt(j)[me * 300..(me + 1) * 300].to_vec())
            .collect();
        check(&pe.local_vec(&t_dst)?, &want, &format!("all_to_all {ctx}"));
        if let Some(t) = strided {
            let pa: Vec<Vec<i64>> = t.members().iter().map(|&w| pp(w)).collect();
            let want: Vec<i64> = (0..C1).map(|i| fold_at(ReduceOp::Xor, &pa, i)).collect();
            check(
                &pe.local_vec(&p)?,
                &want,
                &format!("strided all_reduce {ctx}"),
            );
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_graph_capture_replay_12() {
    on_gpus(4, graph_body);
}

gpu_mode_test!(
    gpu_coll_graph_capture_replay_12,
    gpu_config(),
    graph_body,
    [processes(4), mixed(4)]
);

// ---------- all_to_all_v with device counts ----------

fn dev_counts(i: usize, j: usize, r: u64) -> u64 {
    vcnt(i, j, 7000 + r) as u64 * 3
}

fn a2av_device_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let cap = 150 * n; // every count is below 150
    let src = pe.alloc::<f32>(cap)?;
    let big = pe.alloc::<f32>(cap + 64)?; // dst is the first `cap`: the rest must stay poison
    let dst = big.view::<f32>(0, cap)?;
    let counts = pe.alloc::<u64>(n)?;
    let recv = pe.alloc::<u64>(n)?;
    let s = &c.s;
    let check_round = |r: u64, want_counts: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        let rc = pe.local_vec(&recv)?;
        let got = pe.local_vec(&big)?;
        let mut want = vec![f32::poison(); cap + 64];
        let mut at = 0;
        for (j, &c_got) in rc.iter().enumerate() {
            let c = want_counts(j, me);
            assert_eq!(c_got, c, "round {r} PE {me}: count from {j}");
            let disp: u64 = (0..me).map(|k| want_counts(j, k)).sum();
            let theirs = f32::gen(j, 9000 + r, cap, ReduceOp::Sum);
            want[at..at + c as usize].copy_from_slice(&theirs[disp as usize..(disp + c) as usize]);
            at += c as usize;
        }
        check(&got, &want, &format!("a2av device round {r} PE {me}"));
        Ok(())
    };
    let set = |r: u64, cnt: &dyn Fn(usize, usize) -> u64| -> Result<()> {
        pe.local_fill(&big, f32::poison())?;
        pe.local_fill(&recv, u64::MAX)?;
        pe.local_write(&src, 0, &f32::gen(me, 9000 + r, cap, ReduceOp::Sum))?;
        let mine: Vec<u64> = (0..n).map(|k| cnt(me, k)).collect();
        pe.local_write(&counts, 0, &mine)
    };
    let trace = |what: &str| eprintln!("[a2av_device PE {me}] {what}");
    // Direct calls.
    for r in 0..3 {
        let cnt = |i: usize, j: usize| dev_counts(i, j, r);
        set(r, &cnt)?;
        trace(&format!("round {r} launch"));
        c.coll.all_to_all_v_device(
            s,
            w,
            &dst,
            &src,
            DeviceCounts {
                send: &counts,
                recv: &recv,
            },
        )?;
        c.done()?;
        trace(&format!("round {r} done"));
        check_round(r, &cnt)?;
    }
    trace("capture");
    // Captured once, replayed with new counts and data. Every PE captures and instantiates
    // before any launches (instantiation may wait for kernels running on the GPU).
    pe.barrier_all()?;
    s.begin_capture()?;
    let cap_r = c.coll.all_to_all_v_device(
        s,
        w,
        &dst,
        &src,
        DeviceCounts {
            send: &counts,
            recv: &recv,
        },
    );
    let graph = s.end_capture();
    trace(&format!(
        "captured: {:?} / {:?}",
        cap_r,
        graph.as_ref().err()
    ));
    cap_r?;
    let graph = graph?;
    pe.barrier_all()?;
    for r in 10..22 {
        let cnt = |i: usize, j: usize| dev_counts(i, j, r);
        set(r, &cnt)?;
        graph.launch(s)?;
        c.done()?;
        check_round(r, &cnt)?;
    }
    // Overflow: PE 1 sends everything it has plus one element to PE 0 → capacity error on
    // every PE, nothing written (dst stays poison, also beyond its capacity).
    let over = |i: usize, j: usize| -> u64 {
        if i == 1 && j == 0 {
            cap as u64 + 1
        } else {
            dev_counts(i, j, 99)
        }
    };
    trace("replays checked; overflow");
    set(99, &over)?;
    graph.launch(s)?;
    s.synchronize()?;
    match c.coll.check_errors() {
        Err(Error::Capacity {
            src_pe, capacity, ..
        }) => {
            assert_eq!(src_pe, 1, "PE {me}: offending sender");
            assert_eq!(capacity, cap, "PE {me}");
        }
        other => panic!("PE {me}: expected a capacity error, got {other:?}"),
    }
    let got = pe.local_vec(&big)?;
    assert!(
        got.iter().all(|x| x.is_nan()),
        "PE {me}: data written despite overflow"
    );
    let rc = pe.local_vec(&recv)?;
    assert_eq!(rc[1], over(1, me), "PE {me}: counts seen are reported");
    trace("overflow reported");
    // The flag was cleared and the graph still works.
    let cnt = |i: usize, j: usize| dev_counts(i, j, 100);
    set(100, &cnt)?;
    graph.launch(s)?;
    c.done()?;
    check_round(100, &cnt)?;
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_all_to_all_v_device_counts() {
    // Short waits: a failure shows as an error, not a long hang.
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        a2av_device_body,
    );
}

gpu_mode_test!(
    gpu_coll_all_to_all_v_device_counts,
    gpu_config().timeout(Duration::from_secs(8)),
    a2av_device_body,
    [processes(4), mixed(4)]
);

// ---------- bad inputs ----------

fn bad_body(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let tr = |what: &str| eprintln!("[bad PE {me}] {what}");
    tr("start");
    let c = Ctx::new(pe)?;
    tr("ctx");
    let w = pe.world_team();
    let s = &c.s;
    let n = pe.n_pes();
    let x = pe.alloc::<f32>(100)?;
    let y = pe.alloc::<f32>(100)?;
    let i = pe.alloc::<i32>(100)?;
    let is_err = |r: Result<()>, what: &str| match r {
        Ok(()) => panic!("PE {}: {what} must be an error", pe.my_pe()),
        Err(e) => eprintln!("[bad PE {}] refused: {what}: {e}", pe.my_pe()),
    };
    is_err(
        c.coll.all_reduce(s, w, &y, &x, 101, ReduceOp::Sum),
        "count beyond the object",
    );
    is_err(
        c.coll.all_reduce(s, w, &y, &x, 10, ReduceOp::Xor),
        "xor on floats",
    );
    is_err(
        c.coll.broadcast(s, w, &y, &x, 10, n),
        "root outside the team",
    );
    is_err(
        c.coll.reduce(
            s,
            w,
            &y,
            &x,
            10,
            ToRoot {
                op: ReduceOp::Min,
                root: n + 3,
            },
        ),
        "reduce root outside the team",
    );
    is_err(
        c.coll.all_gather(s, w, &y, &x, 26),
        "all_gather n·count beyond dst",
    );
    is_err(
        c.coll.all_to_all(s, w, &y, &x, 26),
        "all_to_all beyond the objects",
    );
    is_err(
        c.coll.reduce_scatter(s, w, &y, &x, 26, ReduceOp::Sum),
        "reduce_scatter beyond src",
    );
    let part = x.view::<f32>(8, 50)?;
    is_err(
        c.coll.all_reduce(s, w, &x, &part, 10, ReduceOp::Sum),
        "partly overlapping src and dst",
    );
    let z = vec![0usize; n];
    let short = vec![0usize; n - 1];
    let big = vec![200usize; n];
    is_err(
        c.coll.all_to_all_v(
            s,
            w,
            &y,
            &x,
            &AllToAllV {
                send_counts: &short,
                send_displs: &z,
                recv_counts: &z,
                recv_displs: &z,
            },
        ),
        "all_to_all_v arrays of the wrong length",
    );
    is_err(
        c.coll.all_to_all_v(
            s,
            w,
            &y,
            &x,
            &AllToAllV {
                send_counts: &big,
                send_displs: &z,
                recv_counts: &z,
                recv_displs: &z,
            },
        ),
        "all_to_all_v counts beyond src",
    );
    is_err(
        c.coll.all_to_all_v_device(
            s,
            w,
            &y,
            &y,
            DeviceCounts {
                send: &pe.alloc::<u64>(n)?,
                recv: &pe.alloc::<u64>(n)?,
            },
        ),
        "device all_to_all_v in place",
    );
    let small = pe.alloc::<u64>(n - 1)?;
    is_err(
        c.coll.all_to_all_v_device(
            s,
            w,
            &y,
            &x,
            DeviceCounts {
                send: &small,
                recv: &small,
            },
        ),
        "device counts object too small",
    );
    // Nothing was launched: the stream is idle, and a good call still works.
    pe.local_write(&i, 0, &[pe.my_pe() as i32 + 1; 100])?;
    tr("written");
    c.coll.all_reduce(s, w, &i, &i, 100, ReduceOp::Sum)?;
    tr("launched");
    s.synchronize()?;
    tr("synced");
    c.coll.check_errors()?;
    tr("checked");
    let want = (1..=n as i32).sum::<i32>();
    assert!(pe.local_vec(&i)?.iter().all(|&v| v == want));
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_bad_inputs_are_errors() {
    on_gpus_cfg(gpu_config().timeout(Duration::from_secs(8)), 4, bad_body);
}

// ---------- cross-PE argument check: signatures carried by the first barrier ----------

/// The member PE `me` reports as differing when only world member `odd` differs (the first
/// member in team order whose signature is not `me`'s).
fn first_other(me: usize, odd: usize) -> usize {
    match (me == odd, odd) {
        (true, 0) => 1,
        (true, _) => 0,
        (false, _) => odd,
    }
}

/// After a call where only member `odd` differed: the stream completed without a host error,
/// `check_errors` is a mismatch naming the right member, and the descriptions show `odd_has`
/// for the odd member's call and `rest_has` for the others'.
fn expect_mismatch(c: &Ctx<'_>, odd: usize, odd_has: &str, rest_has: &str, ctx: &str) {
    expect_mismatch_with(c, odd, [odd_has, rest_has], [rest_has, odd_has], ctx);
}

/// As [`expect_mismatch`] with what each side's own and reported signatures hold given apart
/// (`[mine, theirs]` of member `odd`, then of the others; a barrier-based member sees no
/// signature of an LL member: "no collective signature").
fn expect_mismatch_with(
    c: &Ctx<'_>,
    odd: usize,
    odd_has: [&str; 2],
    rest_has: [&str; 2],
    ctx: &str,
) {
    let me = c.pe.my_pe();
    c.s.synchronize()
        .unwrap_or_else(|e| panic!("{ctx} PE {me}: {e}"));
    match c.coll.check_errors() {
        Err(Error::CollectiveMismatch {
            pe, mine, theirs, ..
        }) => {
            assert_eq!(pe, first_other(me, odd), "{ctx} PE {me}: differing member");
            let [m, t] = if me == odd { odd_has } else { rest_has };
            assert!(mine.contains(m), "{ctx} PE {me}: mine {mine:?} lacks {m:?}");
            assert!(
                theirs.contains(t),
                "{ctx} PE {me}: theirs {theirs:?} lacks {t:?}"
            );
        }
        other => panic!("{ctx} PE {me}: expected a collective mismatch, got {other:?}"),
    }
    // Reported once: the record is clear now.
    assert!(
        c.coll.check_errors().is_ok(),
        "{ctx} PE {me}: flag not cleared"
    );
}

/// Poisons `dst`, writes this PE's seeded `src[..len]`; returns what `src` holds.
fn arm(pe: &Pe, src: &rshmem::Sym<f32>, dst: &rshmem::Sym<f32>, s: u64) -> Result<Vec<f32>> {
    pe.local_fill(dst, f32::poison())?;
    let v = f32::gen(pe.my_pe(), s, src.len(), ReduceOp::Sum);
    pe.local_write(src, 0, &v)?;
    Ok(v)
}

/// A correct all_reduce after a mismatch: exact data.
fn good_all_reduce(
    c: &Ctx<'_>,
    src: &rshmem::Sym<f32>,
    dst: &rshmem::Sym<f32>,
    s: u64,
    count: usize,
    ctx: &str,
) -> Result<()> {
    let pe = c.pe;
    arm(pe, src, dst, s)?;
    c.coll
        .all_reduce(&c.s, pe.world_team(), dst, src, count, ReduceOp::Sum)?;
    c.done()?;
    let x: Vec<Vec<f32>> = (0..pe.n_pes())
        .map(|w| f32::gen(w, s, src.len(), ReduceOp::Sum))
        .collect();
    let mut want: Vec<f32> = (0..count).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
    want.resize(dst.len(), f32::poison());
    check(
        &pe.local_vec(dst)?,
        &want,
        &format!("good all_reduce after {ctx}"),
    );
    Ok(())
}

fn mismatch_body(pe: &Pe, fused: bool) -> Result<()> {
    let mut c = Ctx::new(pe)?;
    if !fused {
        c.coll.retune(|t| t.fused_bytes = 0)?;
    }
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 20_000; // 80 KB of f32: two-shot all_reduce at the context's 64 KiB
                             // Staging for the in-place case below, allocated now: a cuMemAlloc while the peers'
                             // kernels already wait in a collective may wait for them (PEs sharing one GPU).
    c.coll.reserve(100 * 4)?;
    pe.barrier_all()?;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    let other = pe.alloc::<f32>(N)?;
    let seed = std::cell::Cell::new(500 + fused as u64 * 100);
    let after = |c: &Ctx<'_>, ctx: &str, mine_src: &[f32]| -> Result<()> {
        // Nothing moved on any PE: dst still poison, src untouched.
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); N],
            &format!("{ctx}: dst"),
        );
        check(&pe.local_vec(&src)?, mine_src, &format!("{ctx}: src"));
        seed.set(seed.get() + 1);
        good_all_reduce(c, &src, &dst, seed.get(), 1000, ctx)
    };
    // Different lengths (the same algorithm).
    let ctx = format!("count mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 1 { 99 } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch(&c, 1, "count 99 ", "count 100 ", &ctx);
    after(&c, &ctx, &v)?;
    // Different lengths that choose different algorithms (3 barriers against 2): the members
    // pad to the same barrier count, so nothing hangs and the next call is in step.
    let ctx = format!("algorithm mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 0 { N } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch(
        &c,
        0,
        "algo two_shot barriers 3",
        "algo one_shot barriers 2",
        &ctx,
    );
    after(&c, &ctx, &v)?;
    // Different operations.
    let ctx = format!("op mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let op = if me == 2 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    c.coll.all_reduce(s, w, &dst, &src, 100, op)?;
    expect_mismatch(&c, 2, "float max count", "float sum count", &ctx);
    after(&c, &ctx, &v)?;
    // Different roots: reduce and broadcast.
    let ctx = format!("reduce root mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let root = if me == 3 { 1 } else { 0 };
    c.coll.reduce(
        s,
        w,
        &dst,
        &src,
        100,
        ToRoot {
            op: ReduceOp::Sum,
            root,
        },
    )?;
    expect_mismatch(&c, 3, "root 1 ", "root 0 ", &ctx);
    after(&c, &ctx, &v)?;
    let ctx = format!("broadcast root mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let root = if me == 0 { 2 } else { 3 };
    c.coll.broadcast(s, w, &dst, &src, 100, root)?;
    expect_mismatch(&c, 0, "root 2 ", "root 3 ", &ctx);
    after(&c, &ctx, &v)?;
    // Different collectives.
    let ctx = format!("kind mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 1 {
        c.coll.all_gather(s, w, &dst, &src, 25)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(
        &c,
        1,
        "all_gather float count 25",
        "all_reduce float sum count 100",
        &ctx,
    );
    after(&c, &ctx, &v)?;
    // Different element types (same bytes).
    let ctx = format!("type mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 2 {
        let (d, sr) = (dst.view::<i32>(0, N)?, src.view::<i32>(0, N)?);
        c.coll.all_reduce(s, w, &d, &sr, 100, ReduceOp::Sum)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(&c, 2, "all_reduce int32 sum", "all_reduce float sum", &ctx);
    after(&c, &ctx, &v)?;
    // A different source object.
    let ctx = format!("object mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    let sr = if me == 3 { &other } else { &src };
    c.coll.all_reduce(s, w, &dst, sr, 100, ReduceOp::Sum)?;
    expect_mismatch(&c, 3, "", "", &ctx);
    after(&c, &ctx, &v)?;
    // In place on one member only.
    let ctx = format!("in-place mismatch (fused {fused})");
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 0 {
        c.coll.all_reduce(s, w, &src, &src, 100, ReduceOp::Sum)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch(&c, 0, "in_place true", "in_place false", &ctx);
    after(&c, &ctx, &v)?;
    // On a sub-team (strided {1, 3}): member 1 of the team (PE 3) differs.
    if let Some(t) = c.teams.strided.as_ref() {
        let ctx = format!("strided team mismatch (fused {fused})");
        let v = arm(pe, &src, &dst, seed.get())?;
        let n = if me == 3 { 7 } else { 8 };
        c.coll.all_reduce(s, t, &dst, &src, n, ReduceOp::Sum)?;
        s.synchronize()?;
        match c.coll.check_errors() {
            Err(Error::CollectiveMismatch { pe: p, .. }) => {
                assert_eq!(p, if me == 3 { 1 } else { 3 }, "{ctx} PE {me}")
            }
            other => panic!("{ctx} PE {me}: {other:?}"),
        }
        check(&pe.local_vec(&dst)?, &vec![f32::poison(); N], &ctx);
        check(&pe.local_vec(&src)?, &v, &ctx);
    }
    pe.barrier_all()?;
    good_all_reduce(&c, &src, &dst, seed.get() + 1, N, "everything")
}

/// The LL all_reduce's cross-member check: LL against LL with another count, LL against a
/// barrier-based all_reduce (two-shot beyond the LL size: 3 barriers against the LL's 2) and
/// against another collective. Each is a `CollectiveMismatch` on every member with nothing
/// written, and the next LL and barrier-based calls are in step (exact results).
fn ll_mismatch_body(pe: &Pe) -> Result<()> {
    LL_BYTES.store(LL_TEST_BYTES, std::sync::atomic::Ordering::Relaxed);
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 20_000; // 80 KB of f32: beyond the LL size
    pe.barrier_all()?;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    let seed = std::cell::Cell::new(900);
    let after = |ctx: &str, mine_src: &[f32]| -> Result<()> {
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); N],
            &format!("{ctx}: dst"),
        );
        check(&pe.local_vec(&src)?, mine_src, &format!("{ctx}: src"));
        seed.set(seed.get() + 2);
        good_all_reduce(&c, &src, &dst, seed.get(), 1000, ctx)?;
        good_all_reduce(&c, &src, &dst, seed.get() + 1, N, ctx)
    };
    let ctx = "LL count mismatch";
    let v = arm(pe, &src, &dst, seed.get())?;
    let n = if me == 1 { 99 } else { 100 };
    c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
    expect_mismatch_with(
        &c,
        1,
        ["count 99 ", "count 100 "],
        ["count 100 ", "count 99 "],
        ctx,
    );
    after(ctx, &v)?;
    let ctx = "LL against two-shot";
    let v = arm(pe, &src, &dst, seed.get())?;
    // (Past the LL size an out-of-place all_reduce would run the pull way: forced two-shot.)
    if me == 0 {
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            N,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch_with(
        &c,
        0,
        ["algo two_shot barriers 3", "no collective signature"],
        ["algo ll barriers 2", "algo two_shot barriers 3"],
        ctx,
    );
    after(ctx, &v)?;
    let ctx = "LL against all_gather";
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 3 {
        c.coll
            .all_gather(s, w, &dst, &src.view::<f32>(0, 25)?, 25)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    // (A small all_gather runs the LL way too: each side reads the other's header.)
    expect_mismatch_with(
        &c,
        3,
        ["all_gather", "all_reduce"],
        ["all_reduce", "all_gather"],
        ctx,
    );
    after(ctx, &v)?;
    // An LL broadcast whose members name different roots: nothing is waited for or written.
    let ctx = "LL broadcast with different roots";
    let v = arm(pe, &src, &dst, seed.get())?;
    c.coll
        .broadcast(s, w, &dst, &src, 100, if me == 2 { 1 } else { 0 })?;
    expect_mismatch_with(&c, 2, ["root 1", "root 0"], ["root 0", "root 1"], ctx);
    after(ctx, &v)?;
    // The LL all_to_all (26 f32 = 104 bytes per pair: whole words) shares the LL areas: an
    // LL all_reduce beside it reads its header and reports the difference.
    let ctx = "LL all_to_all against LL all_reduce";
    let v = arm(pe, &src, &dst, seed.get())?;
    if me == 2 {
        c.coll.all_to_all(s, w, &dst, &src, 26)?;
    } else {
        c.coll.all_reduce(s, w, &dst, &src, 100, ReduceOp::Sum)?;
    }
    expect_mismatch_with(
        &c,
        2,
        ["all_to_all", "all_reduce"],
        ["all_reduce", "all_to_all"],
        ctx,
    );
    after(ctx, &v)?;
    // 9001 f32 per pair (144 KB in all) is beyond the LL all_to_all size (128 KiB) and its
    // shares are not whole 16-byte vectors (no pull): the barrier-based all_to_all, against
    // LL ones of 27 f32 per pair (108 bytes: not whole words, which the LL data kernel moves
    // too).
    let ctx = "LL all_to_all against a barrier-based one";
    let v = arm(pe, &src, &dst, seed.get())?;
    let big_src = pe.alloc::<f32>(4 * 9001)?;
    let big_dst = pe.alloc::<f32>(4 * 9001)?;
    pe.local_fill(&big_dst, f32::poison())?;
    let n = if me == 1 { 9001 } else { 27 };
    c.coll.all_to_all(s, w, &big_dst, &big_src, n)?;
    expect_mismatch_with(
        &c,
        1,
        ["count 9001 ", "no collective signature"],
        ["count 27 ", "count 9001 "],
        ctx,
    );
    check(
        &pe.local_vec(&big_dst)?,
        &vec![f32::poison(); 4 * 9001],
        &format!("{ctx}: dst"),
    );
    pe.barrier_all()?;
    pe.free(big_dst)?;
    pe.free(big_src)?;
    after(ctx, &v)?;
    // And a correct LL all_to_all after them, out of place then in place: exact data.
    let ctx = "LL all_to_all after the mismatches";
    const K: usize = 26;
    let n = pe.n_pes();
    let mine: Vec<f32> = (0..n * K).map(|i| (me * 1000 + i) as f32).collect();
    let want: Vec<f32> = (0..n * K)
        .map(|i| ((i / K) * 1000 + me * K + i % K) as f32)
        .collect();
    pe.local_write(&src, 0, &mine)?;
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(s, w, &dst, &src, K)?;
    c.done()?;
    check(&pe.local_vec(&dst)?[..n * K], &want, ctx);
    pe.local_write(&dst, 0, &mine)?;
    pe.barrier_all()?;
    c.coll.all_to_all(s, w, &dst, &dst, K)?;
    c.done()?;
    check(
        &pe.local_vec(&dst)?[..n * K],
        &want,
        &format!("{ctx}, in place"),
    );
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_ll_mismatch_is_an_error_on_every_pe() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        ll_mismatch_body,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_mismatch_fused_is_an_error_on_every_pe() {
    on_gpus_cfg(gpu_config().timeout(Duration::from_secs(8)), 4, |pe| {
        mismatch_body(pe, true)
    });
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_mismatch_unfused_is_an_error_on_every_pe() {
    on_gpus_cfg(gpu_config().timeout(Duration::from_secs(8)), 4, |pe| {
        mismatch_body(pe, false)
    });
}

// ---------- pull all_to_all ----------

/// A context whose LL area is on (all_reduce 64 KiB) with the LL all_to_all up to `ll_a2a`
/// bytes (0: off, so every out-of-place all_to_all of whole 16-byte shares pulls).
fn pull_ctx(pe: &Pe, ll_a2a: usize) -> Result<Ctx<'_>> {
    let g = CudaPe::new(pe)?;
    let sizes = cuda::LlSizes {
        all_reduce: 64 << 10,
        all_to_all: ll_a2a,
    };
    let coll = GpuColl::new(
        g,
        CollConfig::default(),
        CollTuning::from_env()?.with_ll(sizes),
    )?;
    Ok(Ctx {
        pe,
        s: g.stream()?,
        coll,
        teams: Teams::new(pe)?,
    })
}

/// Shares in bytes: one vector, a block's part plus a tail, ten blocks with a short last one,
/// 256 KiB (32 blocks on the world).
const PULL_SHARES: [usize; 4] = [16, 4096 + 16, 3 * 16384 + 48, 256 << 10];

/// What member `me` of `m` receives in an all_to_all of `gc` elements per pair whose inputs
/// are `T::gen(pe, seed, n·gc)`.
fn a2a_want<T: TElem>(m: &[usize], me: usize, seed: u64, gc: usize) -> Vec<T> {
    let n = m.len();
    m.iter()
        .flat_map(|&w| T::gen(w, seed, n * gc, ReduceOp::Sum)[me * gc..(me + 1) * gc].to_vec())
        .collect()
}

/// The pull all_to_all, or with `gather` the pull all_gather (the same kernel, every share a
/// member's whole input; in place too when it stores): every team shape, the pull shares, by
/// loads or by stores, exact.
fn pull_t<T: TElem>(c: &Ctx<'_>, push: bool, gather: bool) -> Result<()> {
    let pe = c.pe;
    let most = 4 * (256 << 10) / std::mem::size_of::<T>();
    let src = pe.alloc::<T>(most)?;
    let dst = pe.alloc::<T>(most)?;
    let name = if gather { "all_gather" } else { "all_to_all" };
    for (tn, team) in c.teams.list(pe) {
        let (me, n, m) = (team.my_pe(), team.n_pes(), team.members());
        for (si, share) in PULL_SHARES.into_iter().enumerate() {
            let gc = share / std::mem::size_of::<T>();
            for ip in [false, true] {
                if ip && !(gather && push) {
                    continue;
                }
                let seed = 7000 + si as u64 * 4 + tn.len() as u64 + 50 * u64::from(ip);
                let ctx = format!(
                    "pull {name} {} team {tn} share {share} B push {push} in place {ip} (PE {})",
                    T::KIND.name(),
                    pe.my_pe()
                );
                if !ip {
                    let (pull, pushes) = if gather {
                        let g = |b| c.coll.path(CollKind::AllGather, team, b).pulls();
                        (
                            g(n * share),
                            c.coll
                                .path(CollKind::AllGather, team, n * share)
                                .eq(&CollPath::Push),
                        )
                    } else {
                        let a = |b| c.coll.path(CollKind::AllToAll, team, b).pulls();
                        (
                            a(n * share),
                            c.coll
                                .path(CollKind::AllToAll, team, n * share)
                                .eq(&CollPath::Push),
                        )
                    };
                    assert!(pull, "{ctx}: not the pull path");
                    assert_eq!(pushes, push, "{ctx}");
                }
                pe.local_fill(&dst, T::poison())?;
                let mut want = if gather {
                    let obj = if ip { &dst } else { &src };
                    let mine = T::gen(pe.my_pe(), seed, gc, ReduceOp::Sum);
                    pe.local_write(obj, if ip { me * gc } else { 0 }, &mine)?;
                    c.coll.all_gather(&c.s, team, &dst, obj, gc)?;
                    m.iter()
                        .flat_map(|&w| T::gen(w, seed, gc, ReduceOp::Sum))
                        .collect()
                } else {
                    pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, n * gc, ReduceOp::Sum))?;
                    c.coll.all_to_all(&c.s, team, &dst, &src, gc)?;
                    a2a_want::<T>(m, me, seed, gc)
                };
                c.done()?;
                want.resize(most, T::poison());
                check(&pe.local_vec(&dst)?, &want, &ctx);
            }
        }
    }
    pe.free(dst)?;
    pe.free(src)
}

/// The pull all_to_all: every team shape, shares from one vector to 256 KiB (1 to 32 blocks),
/// four element types, exact data, no host barrier between the calls, by loads and by stores,
/// and the pull all_gather likewise; then a captured graph (a pull all_to_all, a pull
/// all_gather and an LL all_reduce) replayed with new data, by loads and by stores.
fn pull_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    if std::env::var_os("RSHMEM_CUDA_COLL_PUSH_A2A_BYTES").is_none() {
        assert_eq!(c.coll.tuning().push_all_to_all, cuda::COLL_PUSH_A2A_BYTES);
    }
    c.coll.retune(|t| t.push_all_to_all = 0)?;
    pull_t::<u8>(&c, false, false)?;
    pull_t::<bf16>(&c, false, false)?;
    pull_t::<f32>(&c, false, false)?;
    pull_t::<f64>(&c, false, false)?;
    pull_t::<bf16>(&c, false, true)?;
    pull_t::<f64>(&c, false, true)?;
    // Every member storing its shares, at every size.
    c.coll.retune(|t| t.push_all_to_all = 1)?;
    pull_t::<u8>(&c, true, false)?;
    pull_t::<bf16>(&c, true, false)?;
    pull_t::<f64>(&c, true, false)?;
    pull_t::<u8>(&c, true, true)?;
    pull_t::<f32>(&c, true, true)?;
    for push in [0, 1] {
        c.coll.retune(|t| t.push_all_to_all = push)?;
        pull_graph(pe, &c, push == 1)?;
    }
    Ok(())
}

fn pull_graph(pe: &Pe, c: &Ctx<'_>, push: bool) -> Result<()> {
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    const GC: usize = 16 << 10; // f32 per pair: 64 KiB shares
    let src = pe.alloc::<f32>(n * GC)?;
    let dst = pe.alloc::<f32>(n * GC)?;
    let g_dst = pe.alloc::<f32>(n * GC)?;
    let r_dst = pe.alloc::<f32>(1000)?;
    pe.barrier_all()?;
    let s = &c.s;
    let graph = capture(s, || {
        c.coll.all_to_all(s, w, &dst, &src, GC)?;
        c.coll
            .all_gather(s, w, &g_dst, &src.view::<f32>(0, GC)?, GC)?;
        c.coll.all_reduce(
            s,
            w,
            &r_dst,
            &src.view::<f32>(0, 1000)?,
            1000,
            ReduceOp::Sum,
        )
    })?;
    pe.barrier_all()?;
    let all: Vec<usize> = (0..n).collect();
    for r in 0..4u64 {
        let seed = 8000 + r + 10 * u64::from(push);
        pe.local_fill(&dst, f32::poison())?;
        pe.local_fill(&g_dst, f32::poison())?;
        pe.local_fill(&r_dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * GC, ReduceOp::Sum))?;
        pe.barrier_all()?; // a replay reads the peers' new inputs
        graph.launch(s)?;
        c.done()?;
        let ctx = format!("pull graph replay {r} push {push} PE {me}");
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, GC),
            &ctx,
        );
        let gathered: Vec<f32> = all
            .iter()
            .flat_map(|&p| f32::gen(p, seed, n * GC, ReduceOp::Sum)[..GC].to_vec())
            .collect();
        check(
            &pe.local_vec(&g_dst)?,
            &gathered,
            &format!("{ctx}: all_gather"),
        );
        let x: Vec<Vec<f32>> = all
            .iter()
            .map(|&p| f32::gen(p, seed, n * GC, ReduceOp::Sum)[..1000].to_vec())
            .collect();
        let want: Vec<f32> = (0..1000).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(&pe.local_vec(&r_dst)?, &want, &format!("{ctx}: all_reduce"));
        pe.barrier_all()?; // nobody rewrites its input while a peer's replay may read it
    }
    drop(graph);
    pe.free(r_dst)?;
    pe.free(g_dst)?;
    pe.free(dst)?;
    pe.free(src)
}

/// The LL flag of a pair does not come back: an LL all_to_all of 256 KiB shares, then 32767
/// LL calls of one element per pair (replays of a captured graph), then the large call again
/// with new data, PE 1 entering it 5 ms after PE 0. The former flag (16 bits of the barrier
/// expectation, 15 of the pair's sequence; `-DRSHMEMI_LL_FLAG_15=1` in
/// `RSHMEM_TEST_COLL_NVRTC_OPTS` builds it again) was the same at the 32768th call: PE 0 took
/// the header and lines PE 1 had left from the first large call for this one's, so its dst
/// held the first call's data.
fn ll_flag_body(pe: &Pe) -> Result<()> {
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    let g = CudaPe::new(pe)?;
    let coll = GpuColl::new(g, CollConfig::default(), ll_tuning(256 << 10)?)?;
    let s = g.stream()?;
    const BIG: usize = 64 << 10; // f32 per pair: 256 KiB shares
    let src = pe.alloc::<f32>(n * BIG)?;
    let dst = pe.alloc::<f32>(n * BIG)?;
    let one_src = pe.alloc::<f32>(n)?;
    let one_dst = pe.alloc::<f32>(n)?;
    assert!(coll
        .path(CollKind::AllToAll, w, n * BIG * 4)
        .eq(&CollPath::Ll));
    assert!(coll.path(CollKind::AllToAll, w, n * 4).eq(&CollPath::Ll));
    let all: Vec<usize> = (0..n).collect();
    let big = |seed: u64| -> Result<()> {
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * BIG, ReduceOp::Sum))?;
        pe.barrier_all()?;
        if me == 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
        coll.all_to_all(&s, w, &dst, &src, BIG)?;
        s.synchronize()?;
        coll.check_errors()?;
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, BIG),
            &format!("LL all_to_all of seed {seed} (PE {me})"),
        );
        pe.barrier_all()
    };
    big(70)?;
    pe.local_fill(&one_src, 1.0)?;
    pe.barrier_all()?;
    // 7 replays of 4681 calls: 32767 LL calls of the pair between the two large ones.
    let graph = capture(&s, || {
        for _ in 0..4681 {
            coll.all_to_all(&s, w, &one_dst, &one_src, 1)?;
        }
        Ok(())
    })?;
    for _ in 0..7 {
        graph.launch(&s)?;
    }
    s.synchronize()?;
    coll.check_errors()?;
    check(
        &pe.local_vec(&one_dst)?,
        &vec![1.0f32; n],
        &format!("one-element calls (PE {me})"),
    );
    drop(graph);
    big(71)?;
    pe.free(one_dst)?;
    pe.free(one_src)?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_ll_flag_does_not_come_back() {
    on_gpus(2, ll_flag_body);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_all_to_all() {
    on_gpus(4, pull_body);
}

gpu_mode_test!(
    gpu_coll_pull_all_to_all_modes,
    gpu_config(),
    pull_body,
    [processes(4), mixed(4)]
);

/// A pull all_to_all (by stores, the default) beside other calls: a member on the
/// barrier-based path (pull off there), a member on the LL all_to_all (its LL all_to_all size
/// covers the call), a member loading instead of storing, each reported on every PE with
/// nothing written; a correct pull after each, exact.
fn pull_mismatch_body(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let w = pe.world_team();
    let mut c = pull_ctx(pe, 0)?;
    // The same LL area (region 64 KiB) everywhere; PE 2's LL all_to_all covers 64 KiB inputs.
    let c2 = pull_ctx(pe, if me == 2 { 128 << 10 } else { 0 })?;
    let n = pe.n_pes();
    const GC: usize = 4096; // f32 per pair: 16 KiB shares, 64 KiB in all
    let src = pe.alloc::<f32>(n * GC)?;
    let dst = pe.alloc::<f32>(n * GC)?;
    let all: Vec<usize> = (0..n).collect();
    let good = |c: &Ctx<'_>, seed: u64, ctx: &str| -> Result<()> {
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * GC, ReduceOp::Sum))?;
        pe.barrier_all()?;
        c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
        c.done()?;
        check(
            &pe.local_vec(&dst)?,
            &a2a_want::<f32>(&all, me, seed, GC),
            &format!("good pull after {ctx} (PE {me})"),
        );
        pe.barrier_all()
    };
    let poisoned = |ctx: &str| -> Result<()> {
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); n * GC],
            &format!("{ctx}: dst (PE {me})"),
        );
        Ok(())
    };
    good(&c, 9000, "nothing")?;

    let ctx = "pull against barrier-based all_to_all";
    if me == 1 {
        c.coll.retune(|t| t.pull_all_to_all = 0)?;
    }
    assert_eq!(
        c.coll.path(CollKind::AllToAll, w, n * GC * 4).pulls(),
        me != 1
    );
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
    expect_mismatch_with(
        &c,
        1,
        ["algo -", "no collective signature"],
        ["algo push", "algo -"],
        ctx,
    );
    poisoned(ctx)?;
    c.coll
        .retune(|t| t.pull_all_to_all = cuda::COLL_PULL_A2A_BYTES)?;
    good(&c, 9001, ctx)?;

    let ctx = "pull against LL all_to_all";
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c2.coll.all_to_all(&c2.s, w, &dst, &src, GC)?;
    expect_mismatch_with(
        &c2,
        2,
        ["algo ll", "algo push"],
        ["algo push", "algo ll"],
        ctx,
    );
    poisoned(ctx)?;
    good(&c, 9002, ctx)?;

    // Storing and loading members in one call: each would leave the other's dst short.
    let ctx = "push against pull all_to_all";
    if me == 1 {
        c.coll.retune(|t| t.push_all_to_all = 0)?;
    }
    assert_eq!(
        c.coll
            .path(CollKind::AllToAll, w, n * GC * 4)
            .eq(&CollPath::Push),
        me != 1
    );
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_to_all(&c.s, w, &dst, &src, GC)?;
    expect_mismatch_with(
        &c,
        1,
        ["algo pull", "algo push"],
        ["algo push", "algo pull"],
        ctx,
    );
    poisoned(ctx)?;
    c.coll.retune(|t| t.push_all_to_all = 0)?;
    good(&c, 9003, ctx)?;
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_mismatch_is_an_error_on_every_pe() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_mismatch_body,
    );
}

// ---------- pull all_reduce ----------

/// Counts of the pull all_reduce cases: just past the LL size (3 blocks), 1 MiB (32 blocks),
/// 3 MiB and a vector (96 blocks, several rounds per thread), whole 16-byte vectors each.
fn pull_ar_counts(es: usize) -> [usize; 3] {
    [
        ((64 << 10) + 16) / es,
        (1 << 20) / es,
        ((3 << 20) + 16) / es,
    ]
}

fn pull_ar_t<T: TElem>(c: &Ctx<'_>, op: ReduceOp) -> Result<()> {
    let pe = c.pe;
    // Two-shot at every pull size or never (then one-shot; pairs by stores where set).
    let two = c.coll.tuning().two_shot_pull.of(pe.n_pes()) == 1;
    let es = std::mem::size_of::<T>();
    let counts = pull_ar_counts(es);
    let most = counts[2];
    let src = pe.alloc::<T>(most)?;
    let dst = pe.alloc::<T>(most)?;
    for (tn, team) in c.teams.list(pe) {
        for (ci, &count) in counts.iter().enumerate() {
            let seed = 7500 + ci as u64 * 4 + tn.len() as u64;
            let ctx = format!(
                "pull all_reduce {} {op:?} team {tn} count {count} (PE {})",
                T::KIND.name(),
                pe.my_pe()
            );
            assert!(
                c.coll.path(CollKind::AllReduce, team, count * es).pulls(),
                "{ctx}: not the pull path"
            );
            assert_eq!(
                c.coll
                    .path(CollKind::AllReduce, team, count * es)
                    .eq(&CollPath::PullTwoShot),
                two,
                "{ctx}: two-shot"
            );
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, count, op))?;
            c.coll.all_reduce(&c.s, team, &dst, &src, count, op)?;
            c.done()?;
            let x = ins::<T>(team, seed, count, op);
            let mut want: Vec<T> = (0..count).map(|i| fold_at(op, &x, i)).collect();
            want.resize(most, T::poison());
            check(&pe.local_vec(&dst)?, &want, &ctx);
        }
    }
    // In place is not the pull path (a member's input would change under its peers' reads):
    // the barrier-based plan, exact.
    let count = counts[1];
    let w = pe.world_team();
    pe.local_write(&dst, 0, &T::gen(pe.my_pe(), 7600, count, op))?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &dst, count, op)?;
    c.done()?;
    let x = ins::<T>(w, 7600, count, op);
    let want: Vec<T> = (0..count).map(|i| fold_at(op, &x, i)).collect();
    check(
        &pe.local_vec(&dst)?[..count],
        &want,
        "pull all_reduce in place",
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

/// The pull all_reduce (LL all_reduce to 64 KiB, pull beyond): every team shape, four types
/// and ops, 3 to 128 blocks, exact data, no host barrier between calls; in place on the
/// barrier-based plan; a captured graph replayed with new data; a member with the pull path
/// off (two-shot) reported on every PE, then a correct pull.
fn pull_ar_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    // The defaults: pairs store their data only from 256 MiB.
    if std::env::var_os("RSHMEM_CUDA_COLL_PUSH_ALL_REDUCE_BYTES").is_none() {
        assert_eq!(
            c.coll.tuning().push_all_reduce,
            cuda::COLL_PUSH_ALL_REDUCE_BYTES
        );
    }
    let defaults = (
        c.coll.tuning().two_shot_pull.of(2),
        c.coll.tuning().two_shot_pull.of(3),
    );
    if std::env::var_os("RSHMEM_CUDA_COLL_TWO_SHOT_PULL_BYTES").is_none() {
        assert_eq!(
            defaults,
            (
                cuda::COLL_TWO_SHOT_PULL_PAIR_BYTES,
                cuda::COLL_TWO_SHOT_PULL_BYTES
            )
        );
    }
    c.coll.retune(|t| t.push_all_reduce = 0)?;
    // One-shot on every team, then two-shot on every team (pairs too).
    for two in [0, 1] {
        c.coll.retune(|t| t.two_shot_pull = PerTeam::all(two))?;
        pull_ar_t::<f32>(&c, ReduceOp::Sum)?;
        pull_ar_t::<bf16>(&c, ReduceOp::Max)?;
        pull_ar_t::<i8>(&c, ReduceOp::Xor)?;
        pull_ar_t::<f64>(&c, ReduceOp::Min)?;
    }
    // Pairs by stores at every size (the strided team is a pair; the other teams still load).
    c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    c.coll.retune(|t| t.push_all_reduce = 1)?;
    pull_ar_t::<f32>(&c, ReduceOp::Sum)?;
    pull_ar_t::<bf16>(&c, ReduceOp::Max)?;
    pull_ar_t::<i8>(&c, ReduceOp::Xor)?;
    let (w, me) = (pe.world_team(), pe.my_pe());
    // 12 MiB of f32, past the one-shot limit of larger teams (the 128 blocks go three times
    // round; by stores, two steps per block), exact. Way 0: pairs one-shot by loads, larger
    // teams on the barrier-based plan; 1: pairs by stores; 2: every team two-shot.
    const BIG: usize = 3 << 20;
    let big_src = pe.alloc::<f32>(BIG)?;
    let big_dst = pe.alloc::<f32>(BIG)?;
    for way in [0, 1, 2] {
        c.coll
            .retune(|t| t.push_all_reduce = if way == 1 { 1 } else { 0 })?;
        c.coll
            .retune(|t| t.two_shot_pull = PerTeam::all(if way == 2 { 1 } else { 0 }))?;
        for (tn, team) in c.teams.list(pe) {
            let bytes = BIG * 4;
            let pull = c.coll.path(CollKind::AllReduce, team, bytes).pulls();
            let two = c
                .coll
                .path(CollKind::AllReduce, team, bytes)
                .eq(&CollPath::PullTwoShot);
            assert_eq!(
                (pull, two),
                (team.n_pes() == 2 || way == 2, way == 2),
                "team {tn} of {} members, {bytes} bytes: pull {pull}, two-shot {two}",
                team.n_pes()
            );
            assert_eq!(
                c.coll
                    .path(CollKind::AllReduce, team, bytes)
                    .eq(&CollPath::Push),
                team.n_pes() == 2 && way == 1,
                "team {tn}, {bytes} bytes, way {way}"
            );
            let seed = 7650 + team.n_pes() as u64 + 10 * way as u64;
            pe.local_fill(&big_dst, f32::poison())?;
            pe.local_write(&big_src, 0, &f32::gen(me, seed, BIG, ReduceOp::Sum))?;
            c.coll
                .all_reduce(&c.s, team, &big_dst, &big_src, BIG, ReduceOp::Sum)?;
            c.done()?;
            let x = ins::<f32>(team, seed, BIG, ReduceOp::Sum);
            let want: Vec<f32> = (0..BIG).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
            check(
                &pe.local_vec(&big_dst)?,
                &want,
                &format!("12 MiB all_reduce team {tn} way {way} (PE {me})"),
            );
        }
    }
    c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    // A pair whose members differ (one stores, one loads): a mismatch on both, dst untouched.
    if let Some(pair) = c.teams.list(pe).into_iter().find(|(_, t)| t.n_pes() == 2) {
        let (_, team) = pair;
        let first = team.my_pe() == 0;
        c.coll
            .retune(|t| t.push_all_reduce = if first { 1 } else { 0 })?;
        pe.local_fill(&big_dst, f32::poison())?;
        pe.local_write(&big_src, 0, &f32::gen(me, 7690, BIG, ReduceOp::Sum))?;
        c.coll
            .all_reduce(&c.s, team, &big_dst, &big_src, BIG, ReduceOp::Sum)?;
        c.s.synchronize()?;
        let ctx = format!("pair push against pull (PE {me})");
        match c.coll.check_errors() {
            Err(Error::CollectiveMismatch { mine, theirs, .. }) => {
                let (m, t) = if first {
                    ("algo push", "algo pull")
                } else {
                    ("algo pull", "algo push")
                };
                assert!(mine.contains(m), "{ctx}: mine {mine:?} lacks {m:?}");
                assert!(theirs.contains(t), "{ctx}: theirs {theirs:?} lacks {t:?}");
            }
            other => panic!("{ctx}: expected a collective mismatch, got {other:?}"),
        }
        check(
            &pe.local_vec(&big_dst)?,
            &vec![f32::poison(); BIG],
            &format!("{ctx}: dst"),
        );
    }
    c.coll.retune(|t| t.push_all_reduce = 0)?;
    c.coll
        .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    pe.barrier_all()?;
    pe.barrier_all()?;
    pe.free(big_dst)?;
    pe.free(big_src)?;
    const C: usize = 1 << 18; // f32: 1 MiB
    let src = pe.alloc::<f32>(C)?;
    let dst = pe.alloc::<f32>(C)?;
    pe.barrier_all()?;
    let s = &c.s;
    let graph = capture(s, || c.coll.all_reduce(s, w, &dst, &src, C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    for r in 0..4u64 {
        let seed = 7700 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let x = ins::<f32>(w, seed, C, ReduceOp::Sum);
        let want: Vec<f32> = (0..C).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull all_reduce replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // A member on the one-shot pull where the others run two-shot (on teams of more than
    // two; a pair runs one-shot by default): reported on every PE, nothing written.
    if pe.n_pes() > 2 {
        let ctx = "one-shot pull all_reduce against two-shot pull";
        if me == 1 {
            c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
        }
        pe.local_fill(&dst, f32::poison())?;
        pe.barrier_all()?;
        c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
        let (one, two) = ("algo pull ", "algo pull_two_shot");
        expect_mismatch_with(&c, 1, [one, two], [two, one], ctx);
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); C],
            &format!("{ctx}: dst (PE {me})"),
        );
        c.coll
            .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    }
    let ctx = "pull all_reduce against two-shot";
    if me == 1 {
        c.coll.retune(|t| t.pull_all_reduce = PerTeam::all(0))?;
        c.coll.retune(|t| t.two_shot_pull = PerTeam::all(0))?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    expect_mismatch_with(
        &c,
        1,
        ["algo two_shot", "no collective signature"],
        ["algo pull", "algo two_shot"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); C],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_all_reduce = PerTeam::all(cuda::COLL_PULL_ALL_REDUCE_BYTES))?;
    c.coll
        .retune(|t| t.two_shot_pull = PerTeam::all(defaults.1))?;
    pe.local_write(&src, 0, &f32::gen(me, 7800, C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    c.coll.all_reduce(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 7800, C, ReduceOp::Sum);
    let want: Vec<f32> = (0..C).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
    check(
        &pe.local_vec(&dst)?,
        &want,
        &format!("good pull after {ctx} (PE {me})"),
    );
    pe.barrier_all()
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_all_reduce() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_ar_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_all_reduce_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_ar_body,
    [processes(4), mixed(4)]
);

// ---------- pull reduce_scatter ----------

/// The pull reduce_scatter on every team shape: parts of one vector, a block's worth plus a
/// vector and 1 MiB + 16 B (past 32 blocks), exact data, poisoned outputs, no host barrier
/// between calls.
fn pull_rs_t<T: TElem>(c: &Ctx<'_>, op: ReduceOp) -> Result<()> {
    let pe = c.pe;
    let es = std::mem::size_of::<T>();
    let parts = [16, (32 << 10) + 16, (1 << 20) + 16];
    let most = parts[2] / es;
    let src = pe.alloc::<T>(most * pe.n_pes())?;
    let dst = pe.alloc::<T>(most)?;
    for (tn, team) in c.teams.list(pe) {
        let (n, me) = (team.n_pes(), team.my_pe());
        for (pi, &part) in parts.iter().enumerate() {
            let count = part / es;
            let seed = 8100 + pi as u64 * 4 + tn.len() as u64;
            let ctx = format!(
                "pull reduce_scatter {} {op:?} team {tn} count {count} (PE {})",
                T::KIND.name(),
                pe.my_pe()
            );
            assert!(
                c.coll
                    .path(CollKind::ReduceScatter, team, part * n)
                    .eq(&CollPath::Pull),
                "{ctx}: not the pull path"
            );
            pe.local_fill(&dst, T::poison())?;
            pe.local_write(&src, 0, &T::gen(pe.my_pe(), seed, n * count, op))?;
            c.coll.reduce_scatter(&c.s, team, &dst, &src, count, op)?;
            c.done()?;
            let x = ins::<T>(team, seed, n * count, op);
            let mut want: Vec<T> = (0..count)
                .map(|i| fold_at(op, &x, me * count + i))
                .collect();
            want.resize(most, T::poison());
            check(&pe.local_vec(&dst)?, &want, &ctx);
        }
    }
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

/// The pull reduce_scatter (the LL all_to_all off, so every out-of-place call of whole
/// 16-byte parts pulls): four types and ops on every team shape; in place on the
/// barrier-based plan, exact; a captured graph replayed with new data; a member with the pull
/// reduce_scatter off reported on every PE, then a correct pull.
fn pull_rs_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    assert_eq!(
        c.coll.tuning().pull_reduce_scatter,
        cuda::COLL_PULL_RS_BYTES
    );
    pull_rs_t::<f32>(&c, ReduceOp::Sum)?;
    pull_rs_t::<bf16>(&c, ReduceOp::Min)?;
    pull_rs_t::<i8>(&c, ReduceOp::Xor)?;
    pull_rs_t::<f64>(&c, ReduceOp::Max)?;
    let (w, me, n) = (pe.world_team(), pe.my_pe(), pe.n_pes());
    const C: usize = 1 << 16; // f32 per member: 256 KiB
    let src = pe.alloc::<f32>(n * C)?;
    let dst = pe.alloc::<f32>(n * C)?;
    // In place: not the pull path (the plan), exact.
    let mine = f32::gen(me, 8200, n * C, ReduceOp::Sum);
    pe.local_write(&dst, 0, &mine)?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &dst, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 8200, n * C, ReduceOp::Sum);
    let mut want = mine.clone();
    for i in 0..C {
        want[me * C + i] = fold_at(ReduceOp::Sum, &x, me * C + i);
    }
    check(&pe.local_vec(&dst)?, &want, "pull reduce_scatter in place");
    pe.barrier_all()?;
    // A graph replayed with new data.
    let s = &c.s;
    let graph = capture(s, || {
        c.coll.reduce_scatter(s, w, &dst, &src, C, ReduceOp::Sum)
    })?;
    pe.barrier_all()?;
    for r in 0..3u64 {
        let seed = 8300 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, n * C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let x = ins::<f32>(w, seed, n * C, ReduceOp::Sum);
        let mut want: Vec<f32> = (0..C)
            .map(|i| fold_at(ReduceOp::Sum, &x, me * C + i))
            .collect();
        want.resize(n * C, f32::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull reduce_scatter replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // One member on the barrier-based plan: a mismatch on every PE, nothing written.
    let ctx = "pull reduce_scatter against barrier-based";
    if me == 1 {
        c.coll.retune(|t| t.pull_reduce_scatter = 0)?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    expect_mismatch_with(
        &c,
        1,
        ["reduce_scatter", "no collective signature"],
        ["algo pull", "reduce_scatter"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); n * C],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_reduce_scatter = cuda::COLL_PULL_RS_BYTES)?;
    pe.local_write(&src, 0, &f32::gen(me, 8400, n * C, ReduceOp::Sum))?;
    pe.barrier_all()?;
    c.coll
        .reduce_scatter(&c.s, w, &dst, &src, C, ReduceOp::Sum)?;
    c.done()?;
    let x = ins::<f32>(w, 8400, n * C, ReduceOp::Sum);
    let want: Vec<f32> = (0..C)
        .map(|i| fold_at(ReduceOp::Sum, &x, me * C + i))
        .collect();
    check(
        &pe.local_vec(&dst)?[..C],
        &want,
        &format!("good pull reduce_scatter after {ctx} (PE {me})"),
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_reduce_scatter() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_rs_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_reduce_scatter_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_rs_body,
    [processes(4)]
);

/// The pull broadcast (LL broadcast to 64 KiB, pull beyond; on every size here): every team
/// shape (the chain of 3 and 4 members, a pair), the first and last member as root, in and out
/// of place, 64 KiB + 16 B (one block), 1 MiB + 48 B and 3 MiB (several, 4 steps each on the
/// chains), and 12 MiB + 16 B (the 128 blocks with uneven parts of up to 7 steps), each with every
/// member reading the root and along a chain; exact data, poisoned outputs, inputs left alone;
/// then a captured graph (a chain) replayed with new data, and a member on a chain where the
/// others are not, or with the pull path off, reported on every PE.
fn pull_bcast_body(pe: &Pe) -> Result<()> {
    let mut c = pull_ctx(pe, 0)?;
    c.coll
        .retune(|t| t.pull_broadcast = PerTeam::all(usize::MAX))?;
    let me = pe.my_pe();
    const MOST: usize = (3 << 20) + 4; // f32: 12 MiB + 16 B
    let src = pe.alloc::<f32>(MOST)?;
    let dst = pe.alloc::<f32>(MOST)?;
    for (tn, team) in c.teams.list(pe) {
        // Seeds by team name: a PE outside a team skips it, so a running count would differ.
        let ti = ["world", "strided", "tri"].iter().position(|&t| t == tn);
        let mut seed = 7000 + 300 * ti.unwrap_or(3) as u64;
        let n = team.n_pes();
        let counts = [(64 << 10) / 4 + 4, (1 << 20) / 4 + 12, 3 << 18, MOST];
        for (root, chain) in [(0, false), (n - 1, false), (0, true), (n - 1, true)] {
            // Every size both ways: everyone reading the root, and (teams of three or more)
            // along a chain.
            c.coll
                .retune(|t| t.chain_broadcast = if chain { 0 } else { usize::MAX })?;
            let from = team.members()[root];
            for in_place in [false, true] {
                for &count in &counts {
                    seed += 1;
                    let ctx = format!(
                        "pull broadcast team {tn} root {root} chain {chain} in place {in_place} count {count} (PE {me})"
                    );
                    assert!(
                        c.coll.path(CollKind::Broadcast, team, count * 4).pulls(),
                        "{ctx}: not pull"
                    );
                    assert_eq!(
                        c.coll
                            .path(CollKind::Broadcast, team, count * 4)
                            .eq(&CollPath::Chain),
                        chain && n > 2,
                        "{ctx}: chain"
                    );
                    let mine = f32::gen(me, seed, count, ReduceOp::Sum);
                    pe.local_fill(&dst, f32::poison())?;
                    if in_place {
                        pe.local_write(&dst, 0, &mine)?;
                        c.coll.broadcast(&c.s, team, &dst, &dst, count, root)?;
                    } else {
                        pe.local_write(&src, 0, &mine)?;
                        c.coll.broadcast(&c.s, team, &dst, &src, count, root)?;
                    }
                    c.done()?;
                    let mut want = f32::gen(from, seed, count, ReduceOp::Sum);
                    want.resize(MOST, f32::poison());
                    check(&pe.local_vec(&dst)?, &want, &ctx);
                    if !in_place {
                        check(&pe.local_vec(&src)?[..count], &mine, &format!("{ctx}: src"));
                    }
                }
            }
        }
    }
    // A captured graph replayed with new data (world, root 1, out of place; a chain on
    // more than two PEs).
    let (w, n) = (pe.world_team(), pe.n_pes());
    const C: usize = (1 << 20) / 4 + 12;
    let s = &c.s;
    pe.barrier_all()?;
    let graph = capture(s, || c.coll.broadcast(s, w, &dst, &src, C, 1 % n))?;
    pe.barrier_all()?;
    for r in 0..3u64 {
        let seed = 7990 + r;
        pe.local_fill(&dst, f32::poison())?;
        pe.local_write(&src, 0, &f32::gen(me, seed, C, ReduceOp::Sum))?;
        pe.barrier_all()?;
        graph.launch(s)?;
        c.done()?;
        let mut want = f32::gen(1 % n, seed, C, ReduceOp::Sum);
        want.resize(MOST, f32::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("pull broadcast replay {r} (PE {me})"),
        );
        pe.barrier_all()?;
    }
    drop(graph);
    // A member on a chain where the others read the root (more than two PEs): a mismatch on
    // every PE, nothing written.
    if n > 2 {
        let ctx = "chain broadcast against pull";
        c.coll
            .retune(|t| t.chain_broadcast = if me == 1 { 0 } else { usize::MAX })?;
        pe.local_fill(&dst, f32::poison())?;
        pe.barrier_all()?;
        c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
        expect_mismatch_with(
            &c,
            1,
            ["algo chain", "algo pull"],
            ["algo pull", "algo chain"],
            ctx,
        );
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); MOST],
            &format!("{ctx}: dst (PE {me})"),
        );
        pe.barrier_all()?;
    }
    c.coll.retune(|t| t.chain_broadcast = usize::MAX)?;
    // A member with the pull path off runs the barrier-based plan: a mismatch on every PE,
    // nothing written; then a good pull broadcast.
    let ctx = "pull broadcast against barrier-based";
    if me == 1 {
        c.coll.retune(|t| t.pull_broadcast = PerTeam::all(0))?;
    }
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
    expect_mismatch_with(
        &c,
        1,
        ["broadcast", "no collective signature"],
        ["algo pull", "broadcast"],
        ctx,
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MOST],
        &format!("{ctx}: dst (PE {me})"),
    );
    c.coll
        .retune(|t| t.pull_broadcast = PerTeam::all(usize::MAX))?;
    pe.local_write(&src, 0, &f32::gen(me, 7999, C, ReduceOp::Sum))?;
    pe.local_fill(&dst, f32::poison())?;
    pe.barrier_all()?;
    c.coll.broadcast(&c.s, w, &dst, &src, C, 0)?;
    c.done()?;
    let mut want = f32::gen(0, 7999, C, ReduceOp::Sum);
    want.resize(MOST, f32::poison());
    check(
        &pe.local_vec(&dst)?,
        &want,
        &format!("good pull broadcast after {ctx} (PE {me})"),
    );
    pe.barrier_all()?;
    pe.free(dst)?;
    pe.free(src)
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_pull_broadcast() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        pull_bcast_body,
    );
}

gpu_mode_test!(
    gpu_coll_pull_broadcast_modes,
    gpu_config().timeout(Duration::from_secs(8)),
    pull_bcast_body,
    [processes(4), mixed(4)]
);

/// Captured graphs: one whose calls differ across PEs (every replay reports the mismatch and
/// moves nothing), one that agrees (every replay exact), replayed alternately.
fn mismatch_graph_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let me = pe.my_pe();
    let s = &c.s;
    const N: usize = 1000;
    let src = pe.alloc::<f32>(N)?;
    let dst = pe.alloc::<f32>(N)?;
    pe.barrier_all()?;
    // Fused one-shot, then a two-shot one (separate kernels): PE 1 differs in both.
    let bad = capture(s, || {
        let n = if me == 1 { N - 1 } else { N };
        c.coll.all_reduce(s, w, &dst, &src, n, ReduceOp::Sum)?;
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            n,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )
    })?;
    let good = capture(s, || {
        c.coll.all_reduce(
            s,
            w,
            &dst,
            &src,
            N,
            Fold {
                op: ReduceOp::Sum,
                algo: Some(Algo::TwoShot),
            },
        )
    })?;
    pe.barrier_all()?; // every PE has its graphs before any launches
    for r in 0..4u64 {
        let ctx = format!("graph replay {r}");
        let v = arm(pe, &src, &dst, 800 + r)?;
        bad.launch(s)?;
        expect_mismatch(&c, 1, "count 999 ", "count 1000 ", &ctx);
        check(
            &pe.local_vec(&dst)?,
            &vec![f32::poison(); N],
            &format!("{ctx}: dst"),
        );
        check(&pe.local_vec(&src)?, &v, &format!("{ctx}: src"));
        good.launch(s)?;
        c.done()?;
        let x: Vec<Vec<f32>> = (0..pe.n_pes())
            .map(|w| f32::gen(w, 800 + r, N, ReduceOp::Sum))
            .collect();
        let want: Vec<f32> = (0..N).map(|i| fold_at(ReduceOp::Sum, &x, i)).collect();
        check(&pe.local_vec(&dst)?, &want, &format!("{ctx}: good graph"));
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_mismatch_in_captured_graph() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        mismatch_graph_body,
    );
}

/// all_to_all_v with host counts in several list chunks (3 members per launch, so teams of
/// 4, 3 and 2 take 2, 1 and 1 chunks), exact data; then one member passing a different source
/// object: a mismatch on every member, nothing received; then device counts against a plain
/// all_to_all on one member.
fn a2av_chunks_body(pe: &Pe) -> Result<()> {
    let mut c = Ctx::new(pe)?;
    c.coll.set_a2av_chunk(3)?;
    assert!(c.coll.set_a2av_chunk(0).is_err() && c.coll.set_a2av_chunk(65).is_err());
    let me = pe.my_pe();
    let n = pe.n_pes();
    let src = pe.alloc::<f32>(MAXC)?;
    let dst = pe.alloc::<f32>(MAXC)?;
    let other = pe.alloc::<f32>(MAXC)?;
    for (tn, team) in c.teams.list(pe) {
        for r in 0..3u64 {
            let ctx = format!("a2av chunks team {tn} round {r} (PE {me})");
            a2av_host_t::<f32>(&c, team, &src, &dst, 4000 + r, &ctx)?;
        }
    }
    let w = pe.world_team();
    let z = vec![1usize; n];
    let d: Vec<usize> = (0..n).collect();
    let v = AllToAllV {
        send_counts: &z,
        send_displs: &d,
        recv_counts: &z,
        recv_displs: &d,
    };
    pe.local_fill(&dst, f32::poison())?;
    let sr = if me == 2 { &other } else { &src };
    c.coll.all_to_all_v(&c.s, w, &dst, sr, &v)?;
    expect_mismatch(
        &c,
        2,
        "all_to_all_v float",
        "all_to_all_v float",
        "a2av object",
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MAXC],
        &format!("a2av mismatch PE {me}"),
    );
    // Device counts on PE 3, a plain all_to_all elsewhere.
    let counts = pe.alloc::<u64>(n)?;
    let recv = pe.alloc::<u64>(n)?;
    pe.local_write(&counts, 0, &vec![1u64; n])?;
    pe.local_fill(&recv, u64::MAX)?;
    pe.local_fill(&dst, f32::poison())?;
    if me == 3 {
        c.coll.all_to_all_v_device(
            &c.s,
            w,
            &dst,
            &src,
            DeviceCounts {
                send: &counts,
                recv: &recv,
            },
        )?;
    } else {
        c.coll.all_to_all(&c.s, w, &dst, &src, 1)?;
    }
    expect_mismatch(
        &c,
        3,
        "all_to_all_v_device float",
        "all_to_all float count 1",
        "a2av device",
    );
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); MAXC],
        "a2av device mismatch",
    );
    assert!(
        pe.local_vec(&recv)?.iter().all(|&x| x == u64::MAX),
        "PE {me}: recv counts written despite the mismatch"
    );
    // And in step afterwards.
    a2av_host_t::<f32>(&c, w, &src, &dst, 4100, "a2av after the mismatches")
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_all_to_all_v_chunks_and_mismatch() {
    on_gpus_cfg(
        gpu_config().timeout(Duration::from_secs(8)),
        4,
        a2av_chunks_body,
    );
}

/// A world of 72 PEs (more than the 64 members a launch's all_to_all_v list holds, more
/// copies than one copy launch takes): all_to_all_v with host counts, all_gather, all_reduce,
/// all_to_all_v with device counts, a mismatch. `RSHMEM_TEST_PES` sets another world size (at
/// least 4).
fn big_world_body(pe: &Pe) -> Result<()> {
    let c = Ctx::new(pe)?;
    let w = pe.world_team();
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let src = pe.alloc::<f32>(64 * n)?;
    let dst = pe.alloc::<f32>(64 * n)?;
    a2av_host_t::<f32>(&c, w, &src, &dst, 6000, &format!("{n} PEs a2av (PE {me})"))?;
    // all_gather: n copies per PE, two copy launches.
    let v = arm(pe, &src, &dst, 6001)?;
    c.coll.all_gather(&c.s, w, &dst, &src, 10)?;
    c.done()?;
    let want: Vec<f32> = (0..n)
        .flat_map(|j| f32::gen(j, 6001, 64 * n, ReduceOp::Sum)[..10].to_vec())
        .chain(std::iter::repeat_n(f32::poison(), 64 * n - 10 * n))
        .collect();
    check(
        &pe.local_vec(&dst)?,
        &want,
        &format!("{n} PEs all_gather (PE {me})"),
    );
    check(&pe.local_vec(&src)?, &v, "big world all_gather src");
    good_all_reduce(&c, &src, &dst, 6002, 1003.min(64 * n), &format!("{n} PEs"))?;
    // Device counts: member j sends (j + k) % 3 elements to member k.
    let cnt = |j: usize, k: usize| ((j + k) % 3) as u64;
    let counts = pe.alloc::<u64>(n)?;
    let recv = pe.alloc::<u64>(n)?;
    if n <= c.coll.all_to_all_v_device_max_team() {
        pe.local_write(&counts, 0, &(0..n).map(|k| cnt(me, k)).collect::<Vec<_>>())?;
        arm(pe, &src, &dst, 6003)?;
        c.coll.all_to_all_v_device(
            &c.s,
            w,
            &dst,
            &src,
            DeviceCounts {
                send: &counts,
                recv: &recv,
            },
        )?;
        c.done()?;
        let mut want = Vec::new();
        for j in 0..n {
            let disp: u64 = (0..me).map(|k| cnt(j, k)).sum();
            let theirs = f32::gen(j, 6003, 64 * n, ReduceOp::Sum);
            want.extend_from_slice(&theirs[disp as usize..(disp + cnt(j, me)) as usize]);
        }
        want.resize(64 * n, f32::poison());
        check(
            &pe.local_vec(&dst)?,
            &want,
            &format!("{n} PEs a2av device (PE {me})"),
        );
        let rc: Vec<u64> = (0..n).map(|j| cnt(j, me)).collect();
        assert_eq!(pe.local_vec(&recv)?, rc, "PE {me}: recv counts");
    }
    // A mismatch reaches every PE.
    let v = arm(pe, &src, &dst, 6004)?;
    let odd = n - 2;
    let k = if me == odd { 9 } else { 10 };
    c.coll.all_reduce(&c.s, w, &dst, &src, k, ReduceOp::Sum)?;
    expect_mismatch(&c, odd, "count 9 ", "count 10 ", &format!("{n} PEs"));
    check(&pe.local_vec(&src)?, &v, "big world mismatch src");
    check(
        &pe.local_vec(&dst)?,
        &vec![f32::poison(); 64 * n],
        "big world mismatch dst",
    );
    good_all_reduce(
        &c,
        &src,
        &dst,
        6005,
        64 * n,
        &format!("{n} PEs after the mismatch"),
    )
}

/// The big world as thread-PEs of one process, sharing the GPUs round robin (18 per GPU on a
/// 4-GPU machine). Thread-PEs sharing a GPU share its CUDA context, and there a kernel waiting
/// for a peer can keep that peer's kernel from starting until the device timeout (the `cuda`
/// module docs, "PEs sharing a GPU"), so on machines with few GPUs this test can time out; it
/// never hangs. `RSHMEM_TEST_MODE=processes` (or `mixed`) runs it as processes instead: each
/// has a context of its own, which the GPU time-slices, but 72 processes on one host start
/// slowly: on 4x H200 their start-up (each maps the 71 other heaps through CUDA IPC) had not
/// finished after 100 s.
#[test]
#[ignore = "needs a GPU"]
fn gpu_coll_world_of_72() {
    let n = std::env::var("RSHMEM_TEST_PES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 4)
        .unwrap_or(72);
    let mode = std::env::var("RSHMEM_TEST_MODE").unwrap_or_else(|_| "threads".into());
    harness::gpu_run(
        &harness::test_name(),
        harness::GpuMode::named(&mode),
        n,
        gpu_config()
            .heap_size(16 << 20)
            .timeout(Duration::from_secs(20)),
        big_world_body,
    );
}
