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

#[path = "../harness/mod.rs"]
mod harness;
#[macro_use]
#[path = "../harness/coll_data.rs"]
mod coll_data;
use coll_data::{check, mix, TElem};

mod a2av;
mod mismatch;
mod pull;
mod pull_reduce;
use mismatch::*;
use pull::*;

use rshmem::coll::{Algo, AllToAllV, CollConfig, CollKind, Fold, ReduceOp, ToRoot};
use rshmem::cuda::{self, CollPath, CollTuning, CudaPe, DeviceCounts, GpuColl, PerTeam, Stream};
use rshmem::{bf16, f16, BackendKind, Config, Error, HeapKind, Pe, Result, Team};
use std::time::Duration;

// ---------- CI ----------

/// Every module of `COLL_MODULES` compiles (in parallel, through the kernel cache) and every
/// kernel the executor loads is in exactly one of them (each cubin's symbol table names its
/// kernels), the one whose `kernel_names` lists it. The only CI compile of the collectives.
#[test]
fn coll_kernels_compile_and_export_every_name() {
    let ci = std::env::var_os("CI").is_some();
    let t0 = std::time::Instant::now();
    let cubins = match cuda::compile_coll_modules("sm_90", &[]) {
        Ok(c) => c,
        Err(e) if !ci && format!("{e}").contains("was not found") => {
            eprintln!("NVRTC not found, not checked here (CI requires it): {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    eprintln!(
        "{} collective modules compiled (or found in the kernel cache) in {:?}",
        cubins.len(),
        t0.elapsed()
    );
    assert_eq!(cubins.len(), cuda::COLL_MODULES.len());
    let names = cuda::coll_kernel_names();
    // The fixed kernels (six LL data kernels, two pull kernels and the cross-node round among
    // them), then a reduce, an LL and a pull all_reduce kernel and a cross-node fold per
    // (type, op): 8 integer types × 7 ops, 4 float types × 4.
    assert_eq!(names.len(), 16 + 4 * (8 * 7 + 4 * 4));
    // The NUL-terminated strings of each cubin (its string tables among them).
    let strings: Vec<std::collections::HashSet<&[u8]>> = cubins
        .iter()
        .map(|c| c.split(|&b| b == 0).collect())
        .collect();
    for n in &names {
        let holders: Vec<String> = cuda::COLL_MODULES
            .iter()
            .zip(&strings)
            .filter(|(_, s)| s.contains(n.as_bytes()))
            .map(|(m, _)| m.name())
            .collect();
        assert_eq!(holders.len(), 1, "kernel {n} is in modules {holders:?}");
        let m = cuda::COLL_MODULES.iter().find(|m| m.name() == holders[0]);
        assert!(
            m.is_some_and(|m| m.kernel_names().contains(n)),
            "kernel {n} is in module {} but not in its kernel_names",
            holders[0]
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

// ---------- a world of many PEs ----------

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
