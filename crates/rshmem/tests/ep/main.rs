//! MoE dispatch / combine end to end on the CPU backend: every PE recomputes every PE's routing
//! from seeds and checks its received rows, handle and combined output exactly. This file holds
//! the seeded cases and the reference; the tests are grouped by subject: routings, types, modes
//! and teams (`cases`), bad inputs and configurations (`bad`), capacity and a lost peer
//! (`limits`).

#[path = "../harness/mod.rs"]
mod harness;

mod bad;
mod cases;
mod limits;

use rshmem::ep::{Dispatched, EpConfig, EpMode, HostBuffer, Layout, RecvLayout, TopkId};
use rshmem::{bf16, Elem, Error, Pe, Result};

const MAX_T: usize = 24;
const MAX_K: usize = 8;
const H: usize = 8;
/// Experts per PE (odd, so expert ranges do not line up with powers of two).
const EPP: usize = 3;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn h4(a: u64, b: u64, c: u64, d: u64) -> u64 {
    mix(mix(mix(mix(a) ^ b) ^ c) ^ d)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    /// Each slot: -1 with probability 1/8, else any expert (duplicates possible).
    Random,
    /// Each slot a distinct expert where possible.
    Distinct,
    /// All of a token's experts on one PE.
    OnePe,
    /// A third of the tokens with no expert at all, the others at most two experts.
    Sparse,
    /// Every token: slot 0 the last expert, others -1.
    OneExpert,
    /// Every slot of every token the same expert (duplicates in the top-k).
    OneExpertAllSlots,
    /// Every id -1.
    AllNone,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    route: Route,
    k: usize,
    seed: u64,
    /// Tokens on every PE forced to 0.
    zero_tokens: bool,
}

/// Tokens of PE `s` in `case` (varies by PE, 0 included).
fn tokens(case: &Case, s: usize) -> usize {
    if case.zero_tokens {
        0
    } else {
        (h4(case.seed, s as u64, 1, 0) % (MAX_T as u64 + 1)) as usize
    }
}

/// Routing of PE `s`: ids `[T, k]` and weights `[T, k]` (multiples of 1/8 in 0..=2).
fn routing(case: &Case, s: usize, n: usize) -> (Vec<i64>, Vec<f32>) {
    let e = (n * EPP) as u64;
    let k = case.k;
    let t_n = tokens(case, s);
    let mut ids = vec![-1i64; t_n * k];
    let mut w = vec![0f32; t_n * k];
    for t in 0..t_n {
        let r = |j: usize, x: u64| h4(case.seed, s as u64, (t * 64 + j) as u64, x);
        for j in 0..k {
            let id = match case.route {
                Route::Random => {
                    if r(j, 2) % 8 == 0 {
                        -1
                    } else {
                        (r(j, 3) % e) as i64
                    }
                }
                Route::Distinct => {
                    let mut c = (r(j, 3) % e) as i64;
                    if (j as u64) < e {
                        while ids[t * k..t * k + j].contains(&c) {
                            c = (c + 1) % e as i64;
                        }
                    }
                    c
                }
                Route::OnePe => {
                    let p = r(0, 4) % n as u64;
                    (p * EPP as u64 + r(j, 3) % EPP as u64) as i64
                }
                Route::Sparse => {
                    if r(0, 5) % 3 == 0 || j >= 2 {
                        -1
                    } else {
                        (r(j, 3) % e) as i64
                    }
                }
                Route::OneExpert => {
                    if j == 0 {
                        e as i64 - 1
                    } else {
                        -1
                    }
                }
                Route::OneExpertAllSlots => 1 % e as i64,
                Route::AllNone => -1,
            };
            ids[t * k + j] = id;
            w[t * k + j] = (r(j, 6) % 17) as f32 / 8.0;
        }
    }
    (ids, w)
}

/// Hidden states of PE `s`: multiples of 1/8 in [-32, 32), exact in bf16.
fn hidden<T: Elem>(case: &Case, s: usize) -> Vec<T> {
    (0..tokens(case, s) * H)
        .map(|i| T::from_f64(((h4(case.seed, s as u64, i as u64, 7) % 512) as f64 - 256.0) / 8.0))
        .collect()
}

fn cast_ids<I: TopkId + FromI64>(ids: &[i64]) -> Vec<I> {
    ids.iter().map(|&v| I::from_i64(v)).collect()
}

trait FromI64 {
    fn from_i64(v: i64) -> Self;
}
impl FromI64 for i32 {
    fn from_i64(v: i64) -> Self {
        v as i32
    }
}
impl FromI64 for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
}

/// Scale an expert applies (a power of two, exact in every type).
fn expert_scale(global_expert: usize) -> f64 {
    (1u32 << (global_expert % 3)) as f64
}

fn cfg(n: usize, mode: EpMode) -> EpConfig {
    EpConfig {
        num_experts: n * EPP,
        max_tokens: MAX_T,
        hidden: H,
        max_topk: MAX_K,
        mode,
        layout: RecvLayout::ExpertMajor,
    }
}

/// Checks a dispatch result against the naive reference computed from every PE's seeds.
fn check_dispatch<T: Elem>(
    (me, n): (usize, usize),
    case: &Case,
    d: &Dispatched<T>,
    layout: RecvLayout,
) {
    let k = case.k;
    let lo = (me * EPP) as i64;
    let mut src_pe = Vec::new();
    let mut src_tok = Vec::new();
    let mut local = Vec::new();
    let mut wts = Vec::new();
    let mut rows_x: Vec<Vec<T>> = Vec::new();
    let mut per_pe = vec![0usize; n];
    for (s, count) in per_pe.iter_mut().enumerate() {
        let (ids, w) = routing(case, s, n);
        let x: Vec<T> = hidden(case, s);
        for t in 0..tokens(case, s) {
            let l: Vec<i32> = (0..k)
                .map(|j| {
                    let id = ids[t * k + j];
                    if id >= lo && id < lo + EPP as i64 {
                        (id - lo) as i32
                    } else {
                        -1
                    }
                })
                .collect();
            if l.iter().all(|&v| v < 0) {
                continue;
            }
            src_pe.push(s as u32);
            src_tok.push(t as u32);
            for j in 0..k {
                wts.push(if l[j] >= 0 { w[t * k + j] } else { 0.0 });
            }
            local.extend(l);
            rows_x.push(x[t * H..(t + 1) * H].to_vec());
            *count += 1;
        }
    }
    let hd = &d.handle;
    assert_eq!(hd.recv_src_pe(), &src_pe[..], "{case:?} src pe");
    assert_eq!(hd.recv_src_token(), &src_tok[..], "{case:?} src token");
    assert_eq!(hd.recv_topk_local(), &local[..], "{case:?} local experts");
    assert_eq!(hd.recv_topk_weights(), &wts[..], "{case:?} weights");
    assert_eq!(hd.recv_tokens_per_pe(), &per_pe[..], "{case:?}");
    assert_eq!(hd.top_k(), k);
    assert_eq!(hd.num_tokens(), tokens(case, me));
    // Expert-major rows.
    let mut want_x: Vec<T> = Vec::new();
    let mut want_tok = Vec::new();
    let mut want_slot = Vec::new();
    let mut offsets = vec![0usize];
    for e in 0..EPP as i32 {
        for i in 0..src_pe.len() {
            for j in 0..k {
                if local[i * k + j] == e {
                    want_x.extend_from_slice(&rows_x[i]);
                    want_tok.push(i as u32);
                    want_slot.push(j as u32);
                }
            }
        }
        offsets.push(want_tok.len());
    }
    assert_eq!(hd.expert_offsets(), &offsets[..], "{case:?} offsets");
    assert_eq!(
        hd.expert_counts(),
        offsets.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    );
    assert_eq!(hd.row_token(), &want_tok[..], "{case:?} row tokens");
    assert_eq!(hd.row_slot(), &want_slot[..], "{case:?} row slots");
    assert_eq!(hd.num_rows(), want_tok.len());
    match layout {
        RecvLayout::ExpertMajor => {
            assert!(d.x == want_x, "{case:?}: dispatched rows differ on PE {me}")
        }
        RecvLayout::TokenMajor => {
            let tokens: Vec<T> = rows_x.concat();
            assert!(d.x == tokens, "{case:?}: received tokens differ on PE {me}")
        }
    }
}

/// Expert outputs (expert-major rows): each row scaled by its global expert's scale (identity
/// when `identity`); a token-major dispatch's rows are gathered through `row_token`.
fn experts<T: Elem>(me: usize, d: &Dispatched<T>, identity: bool, layout: RecvLayout) -> Vec<T> {
    let off = d.handle.expert_offsets();
    let mut y = match layout {
        RecvLayout::ExpertMajor => d.x.clone(),
        RecvLayout::TokenMajor => d
            .handle
            .row_token()
            .iter()
            .flat_map(|&i| d.x[i as usize * H..(i as usize + 1) * H].iter().copied())
            .collect(),
    };
    for e in 0..EPP {
        let s = if identity {
            1.0
        } else {
            expert_scale(me * EPP + e)
        };
        for v in &mut y[off[e] * H..off[e + 1] * H] {
            *v = T::from_f64(v.to_f64() * s);
        }
    }
    y
}

/// The exact expected combine output of this PE, rounded once to `T`.
fn expected_combine<T: Elem>((me, n): (usize, usize), case: &Case, identity: bool) -> Vec<T> {
    let (ids, w) = routing(case, me, n);
    let x: Vec<T> = hidden(case, me);
    let k = case.k;
    let mut out = Vec::new();
    for t in 0..tokens(case, me) {
        let mut f = 0.0f64;
        for j in 0..k {
            let id = ids[t * k + j];
            if id >= 0 {
                let s = if identity {
                    1.0
                } else {
                    expert_scale(id as usize)
                };
                f += w[t * k + j] as f64 * s;
            }
        }
        for c in 0..H {
            out.push(T::from_f64(x[t * H + c].to_f64() * f));
        }
    }
    out
}

fn run_case<T: Elem, I: TopkId + FromI64>(
    pe: &Pe,
    buf: &mut HostBuffer<T>,
    case: &Case,
    identity: bool,
) -> Result<()> {
    run_case_in::<T, I>(pe, buf, case, identity, (pe.my_pe(), pe.n_pes()))
}

/// As `run_case`, for team index `me` of a team of `n`.
fn run_case_in<T: Elem, I: TopkId + FromI64>(
    pe: &Pe,
    buf: &mut HostBuffer<T>,
    case: &Case,
    identity: bool,
    (me, n): (usize, usize),
) -> Result<()> {
    let (ids, w) = routing(case, me, n);
    let ids: Vec<I> = cast_ids(&ids);
    let x: Vec<T> = hidden(case, me);
    let d = buf.dispatch(pe, &x, &ids, &w, case.k)?;
    let layout = buf.config().layout;
    check_dispatch((me, n), case, &d, layout);
    let y = experts(me, &d, identity, layout);
    let out = buf.combine(pe, &d.handle, &y)?;
    let want: Vec<T> = expected_combine((me, n), case, identity);
    assert!(out == want, "{case:?}: combine differs on PE {me}");
    // The same step through combine_tokens: this PE reduces its local slots per received
    // token, the sources sum over PEs.
    let yt = token_outputs::<T>((me, n), case, &d.handle, identity);
    let out = buf.combine_tokens(pe, &d.handle, &yt)?;
    let want: Vec<T> = expected_combine_tokens((me, n), case, identity);
    assert!(out == want, "{case:?}: combine_tokens differs on PE {me}");
    Ok(())
}

/// Weight × scale summed over the slots `js` of a token (exact: multiples of 1/8, small).
fn slot_factor(ids: &[i64], w: &[f32], js: impl Iterator<Item = usize>, identity: bool) -> f32 {
    js.map(|j| {
        let s = if identity {
            1.0
        } else {
            expert_scale(ids[j] as usize) as f32
        };
        w[j] * s
    })
    .sum()
}

/// What a caller of combine_tokens computes on PE `me`: per received token, the weighted sum of
/// its local experts' outputs (rounded to `T`), in receive order.
fn token_outputs<T: Elem>(
    (me, n): (usize, usize),
    case: &Case,
    hd: &rshmem::ep::Handle,
    identity: bool,
) -> Vec<T> {
    let k = case.k;
    let mut y = Vec::new();
    for (&s, &t) in hd.recv_src_pe().iter().zip(hd.recv_src_token()) {
        let (s, t) = (s as usize, t as usize);
        let (ids, w) = routing(case, s, n);
        let x: Vec<T> = hidden(case, s);
        let local = (0..k).filter(|&j| ids[t * k + j] >= 0 && ids[t * k + j] as usize / EPP == me);
        let f = slot_factor(&ids[t * k..], &w[t * k..], local, identity);
        y.extend((0..H).map(|c| T::from_f64((f * x[t * H + c].to_f64() as f32) as f64)));
    }
    y
}

/// combine_tokens' exact output on PE `me`: per token, the sum over the PEs it went to
/// (ascending, f32) of each PE's rounded partial, rounded once.
fn expected_combine_tokens<T: Elem>(
    (me, n): (usize, usize),
    case: &Case,
    identity: bool,
) -> Vec<T> {
    let (ids, w) = routing(case, me, n);
    let x: Vec<T> = hidden(case, me);
    let k = case.k;
    let mut out = Vec::new();
    for t in 0..tokens(case, me) {
        let row = &ids[t * k..(t + 1) * k];
        for c in 0..H {
            let mut acc = 0f32;
            for d in 0..n {
                let js = (0..k).filter(|&j| row[j] >= 0 && row[j] as usize / EPP == d);
                if js.clone().next().is_none() {
                    continue;
                }
                let f = slot_factor(row, &w[t * k..], js, identity);
                acc += T::from_f64((f * x[t * H + c].to_f64() as f32) as f64).to_f64() as f32;
            }
            out.push(T::from_f64(acc as f64));
        }
    }
    out
}

fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let routes = [
        Route::Random,
        Route::Distinct,
        Route::OnePe,
        Route::Sparse,
        Route::OneExpert,
        Route::OneExpertAllSlots,
        Route::AllNone,
    ];
    for (ri, &route) in routes.iter().enumerate() {
        for k in 1..=MAX_K {
            v.push(Case {
                route,
                k,
                seed: (ri * 100 + k) as u64,
                zero_tokens: false,
            });
        }
    }
    v.push(Case {
        route: Route::Random,
        k: 4,
        seed: 999,
        zero_tokens: true,
    });
    v
}

fn good_case(seed: u64) -> Case {
    Case {
        route: Route::Random,
        k: 3,
        seed,
        zero_tokens: false,
    }
}
