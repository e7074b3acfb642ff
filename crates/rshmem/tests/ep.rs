//! MoE dispatch / combine end to end on the CPU backend: every PE recomputes every PE's routing
//! from seeds and checks its received rows, handle and combined output exactly.

#[path = "harness/mod.rs"]
mod harness;

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

fn body_all_cases<T: Elem, I: TopkId + FromI64>(pe: &Pe, mode: EpMode) -> Result<()> {
    body_all_cases_in::<T, I>(pe, cfg(pe.n_pes(), mode))
}

fn body_all_cases_in<T: Elem, I: TopkId + FromI64>(pe: &Pe, cfg: EpConfig) -> Result<()> {
    let mut buf = HostBuffer::<T>::new(pe, pe.world_team(), cfg)?;
    // One buffer for every case: stale rows of earlier calls must never show.
    for (i, case) in all_cases().iter().enumerate() {
        run_case::<T, I>(pe, &mut buf, case, i % 2 == 0)?;
    }
    pe.free(buf)
}

fn f32_i64_normal(pe: &Pe) -> Result<()> {
    body_all_cases::<f32, i64>(pe, EpMode::Normal)
}
fn bf16_i32_normal(pe: &Pe) -> Result<()> {
    body_all_cases::<bf16, i32>(pe, EpMode::Normal)
}
fn f32_i32_capturable(pe: &Pe) -> Result<()> {
    body_all_cases::<f32, i32>(pe, EpMode::Capturable { capacity: MAX_T })
}
fn bf16_i64_capturable(pe: &Pe) -> Result<()> {
    body_all_cases::<bf16, i64>(pe, EpMode::Capturable { capacity: MAX_T })
}

mode_test!(
    dispatch_combine_f32_i64_normal,
    [1, 2, 3, 4],
    f32_i64_normal
);
mode_test!(
    dispatch_combine_bf16_i32_normal,
    [1, 2, 3, 4],
    bf16_i32_normal
);
mode_test!(
    dispatch_combine_f32_i32_capturable,
    [1, 2, 3, 4],
    f32_i32_capturable
);
mode_test!(
    dispatch_combine_bf16_i64_capturable,
    [1, 2, 3, 4],
    bf16_i64_capturable
);

fn token_major(n: usize, mode: EpMode) -> EpConfig {
    EpConfig {
        layout: RecvLayout::TokenMajor,
        ..cfg(n, mode)
    }
}
fn f32_i64_normal_tokens(pe: &Pe) -> Result<()> {
    body_all_cases_in::<f32, i64>(pe, token_major(pe.n_pes(), EpMode::Normal))
}
fn bf16_i32_capturable_tokens(pe: &Pe) -> Result<()> {
    body_all_cases_in::<bf16, i32>(
        pe,
        token_major(pe.n_pes(), EpMode::Capturable { capacity: MAX_T }),
    )
}
mode_test!(
    dispatch_combine_token_major_f32_i64_normal,
    [1, 2, 3],
    f32_i64_normal_tokens
);
mode_test!(
    dispatch_combine_token_major_bf16_i32_capturable,
    [1, 2, 3],
    bf16_i32_capturable_tokens
);

/// Identity experts: combine(dispatch(x)) == x * (sum of the token's weights), spelled out.
fn identity_sum_of_weights(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg(n, EpMode::Normal))?;
    let case = Case {
        route: Route::Distinct,
        k: 5,
        seed: 77,
        zero_tokens: false,
    };
    let me = pe.my_pe();
    let (ids, w) = routing(&case, me, n);
    let x: Vec<f32> = hidden(&case, me);
    let d = buf.dispatch(pe, &x, &ids, &w, case.k)?;
    let out = buf.combine(pe, &d.handle, &d.x)?;
    assert_eq!(out.len(), x.len());
    for t in 0..tokens(&case, me) {
        let sw: f32 = (0..case.k)
            .filter(|&j| ids[t * case.k + j] >= 0)
            .map(|j| w[t * case.k + j])
            .sum();
        for c in 0..H {
            assert_eq!(out[t * H + c], x[t * H + c] * sw, "token {t}");
        }
    }
    pe.free(buf)
}
mode_test!(
    identity_combine_is_x_times_weight_sum,
    [1, 2, 3, 4],
    identity_sum_of_weights
);

/// Buffers on split teams (even and odd world PEs): team indices, not world indices, place
/// experts; both teams run at once on disjoint data.
fn split_teams(pe: &Pe) -> Result<()> {
    let color = (pe.my_pe() % 2) as u32;
    let team = pe
        .team_split(pe.world_team(), Some(color), pe.my_pe() as i64)?
        .ok_or_else(|| Error::InvalidArgument("no team".into()))?;
    let n = team.n_pes();
    let me = team.my_pe();
    let mut buf = HostBuffer::<f32>::new(pe, &team, cfg(n, EpMode::Normal))?;
    assert_eq!(buf.n_pes(), n);
    for (i, case) in all_cases().iter().enumerate().step_by(3) {
        let case = Case {
            seed: case.seed + 10_000 * color as u64,
            ..*case
        };
        run_case_in::<f32, i32>(pe, &mut buf, &case, i % 2 == 1, (me, n))?;
    }
    pe.free(buf)?;
    pe.team_destroy(team)
}
mode_test!(split_team_dispatch_combine, [4], split_teams);

fn layout_matches_reference(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    for case in all_cases() {
        let (ids, _) = routing(&case, pe.my_pe(), n);
        let l = Layout::compute(&ids, case.k, n * EPP, n)?;
        for t in 0..tokens(&case, pe.my_pe()) {
            let row = &ids[t * case.k..(t + 1) * case.k];
            let want: Vec<usize> = (0..n)
                .filter(|&p| row.iter().any(|&e| e >= 0 && e as usize / EPP == p))
                .collect();
            assert_eq!(l.token_pes(t).collect::<Vec<_>>(), want);
        }
        for p in 0..n {
            let c = (0..l.num_tokens())
                .filter(|&t| l.is_token_in_pe(t, p))
                .count();
            assert_eq!(l.tokens_per_pe()[p], c);
        }
        let pairs: usize = l.pairs_per_expert().iter().sum();
        assert_eq!(pairs, ids.iter().filter(|&&e| e >= 0).count());
    }
    Ok(())
}
mode_test!(layout_counts, [1, 3], layout_matches_reference);

// ----- bad inputs: every PE returns an error, nothing hangs, the buffer stays usable -----

#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    XLen,
    WeightsLen,
    IdsNotMultiple,
    IdTooLarge,
    IdNegative,
    TopkZero,
    TopkTooLarge,
    TooManyTokens,
    NanWeight,
    TopkDiffers,
    CombineLen,
    CombineForeignHandle,
    CombineWhileOthersDispatch,
    CombineStaleHandle,
    CombineTokensLen,
    CombineTokensWhileOthersCombine,
}

const BADS: [Bad; 16] = [
    Bad::XLen,
    Bad::WeightsLen,
    Bad::IdsNotMultiple,
    Bad::IdTooLarge,
    Bad::IdNegative,
    Bad::TopkZero,
    Bad::TopkTooLarge,
    Bad::TooManyTokens,
    Bad::NanWeight,
    Bad::TopkDiffers,
    Bad::CombineLen,
    Bad::CombineForeignHandle,
    Bad::CombineWhileOthersDispatch,
    Bad::CombineTokensLen,
    Bad::CombineTokensWhileOthersCombine,
    Bad::CombineStaleHandle,
];

fn good_case(seed: u64) -> Case {
    Case {
        route: Route::Random,
        k: 3,
        seed,
        zero_tokens: false,
    }
}

/// One bad call: the last PE misbehaves, the others call correctly. Returns this PE's result.
fn bad_call(pe: &Pe, buf: &mut HostBuffer<f32>, bad: Bad) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let culprit = me == n - 1;
    let case = good_case(5);
    let (ids, mut w) = routing(&case, me, n);
    let mut ids = ids;
    let mut x: Vec<f32> = hidden(&case, me);
    let mut k = case.k;
    let dispatch_bad = !matches!(
        bad,
        Bad::CombineLen
            | Bad::CombineForeignHandle
            | Bad::CombineWhileOthersDispatch
            | Bad::CombineStaleHandle
            | Bad::CombineTokensLen
            | Bad::CombineTokensWhileOthersCombine
    );
    if dispatch_bad {
        if culprit {
            match bad {
                Bad::XLen => x.push(1.0),
                Bad::WeightsLen => w.push(1.0),
                Bad::IdsNotMultiple => {
                    ids.push(0);
                    w.push(0.0);
                }
                Bad::IdTooLarge | Bad::IdNegative => {
                    ids = if bad == Bad::IdTooLarge {
                        vec![(n * EPP) as i64; 3]
                    } else {
                        vec![0, -2, 1]
                    };
                    w = vec![1.0; 3];
                    x = vec![0.0; H];
                }
                Bad::TopkZero => k = 0,
                Bad::TopkTooLarge => {
                    k = MAX_K + 1;
                    ids = vec![0; k];
                    w = vec![1.0; k];
                    x = vec![0.0; H];
                }
                Bad::TooManyTokens => {
                    ids = vec![0; (MAX_T + 1) * k];
                    w = vec![1.0; (MAX_T + 1) * k];
                    x = vec![0.0; (MAX_T + 1) * H];
                }
                Bad::NanWeight => {
                    ids = vec![0, 1, 2];
                    w = vec![1.0, f32::NAN, 1.0];
                    x = vec![0.0; H];
                }
                Bad::TopkDiffers => {
                    k = 1;
                    ids = vec![0];
                    w = vec![1.0];
                    x = vec![0.0; H];
                }
                _ => {}
            }
        }
        return buf.dispatch(pe, &x, &ids, &w, k).map(|_| ());
    }
    // Combine cases: a good dispatch first.
    let d = buf.dispatch(pe, &x, &ids, &w, k)?;
    match bad {
        Bad::CombineLen => {
            let mut y = d.x.clone();
            if culprit {
                y.push(0.0);
            }
            buf.combine(pe, &d.handle, &y).map(|_| ())
        }
        Bad::CombineWhileOthersDispatch => {
            if culprit {
                buf.combine(pe, &d.handle, &d.x).map(|_| ())
            } else {
                buf.dispatch(pe, &x, &ids, &w, k).map(|_| ())
            }
        }
        Bad::CombineStaleHandle => {
            let d2 = buf.dispatch(pe, &x, &ids, &w, k)?;
            let h = if culprit { &d.handle } else { &d2.handle };
            buf.combine(pe, h, &d2.x).map(|_| ())
        }
        Bad::CombineTokensLen => {
            let mut y = vec![0.0; d.handle.num_recv_tokens() * H];
            if culprit {
                y.push(0.0);
            }
            buf.combine_tokens(pe, &d.handle, &y).map(|_| ())
        }
        Bad::CombineTokensWhileOthersCombine => {
            if culprit {
                let y = vec![0.0; d.handle.num_recv_tokens() * H];
                buf.combine_tokens(pe, &d.handle, &y).map(|_| ())
            } else {
                buf.combine(pe, &d.handle, &d.x).map(|_| ())
            }
        }
        _ => unreachable!(),
    }
}

fn bad_inputs(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let me = pe.my_pe();
    let culprit = me == n - 1;
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg(n, EpMode::Normal))?;
    let mut other = HostBuffer::<f32>::new(pe, pe.world_team(), cfg(n, EpMode::Normal))?;
    for (i, &bad) in BADS.iter().enumerate() {
        if n == 1
            && matches!(
                bad,
                Bad::TopkDiffers
                    | Bad::CombineWhileOthersDispatch
                    | Bad::CombineStaleHandle
                    | Bad::CombineTokensWhileOthersCombine
            )
        {
            continue; // these need a peer that behaves differently
        }
        let r = if bad == Bad::CombineForeignHandle {
            // Everyone dispatches on `other` (collective), only the culprit uses its handle.
            let case = good_case(5);
            let (ids, w) = routing(&case, me, n);
            let x: Vec<f32> = hidden(&case, me);
            let d = buf.dispatch(pe, &x, &ids, &w, case.k)?;
            let d2 = other.dispatch(pe, &x, &ids, &w, case.k)?;
            let h = if culprit { &d2.handle } else { &d.handle };
            buf.combine(pe, h, &d.x).map(|_| ())
        } else {
            bad_call(pe, &mut buf, bad)
        };
        let e = match r {
            Ok(()) => panic!("{bad:?}: PE {me} of {n} returned Ok"),
            Err(e) => e,
        };
        // The buffer that is one element too long, named, with both lengths; a mismatch names
        // the first PE that disagrees (PE 0 for the culprit, the culprit for the others).
        let long = |name: &str| {
            matches!(&e, Error::LengthMismatch { what, got, expected }
                if what.starts_with(name) && *got == *expected + 1)
        };
        let first_other = if culprit { 0 } else { n - 1 };
        let specific = match bad {
            Bad::XLen => long("x "),
            Bad::WeightsLen => long("topk_weights"),
            Bad::CombineLen => long("expert outputs"),
            Bad::CombineTokensLen => long("token outputs"),
            Bad::TopkDiffers
            | Bad::CombineWhileOthersDispatch
            | Bad::CombineStaleHandle
            | Bad::CombineTokensWhileOthersCombine => {
                matches!(e, Error::CollectiveMismatch { pe, .. } if pe == first_other)
            }
            _ => matches!(e, Error::InvalidArgument(_)),
        };
        if culprit {
            assert!(specific, "{bad:?}: culprit got {e:?}");
        } else if !matches!(
            bad,
            Bad::TopkDiffers
                | Bad::CombineWhileOthersDispatch
                | Bad::CombineStaleHandle
                | Bad::CombineTokensWhileOthersCombine
        ) {
            assert!(
                matches!(&e, Error::InvalidArgument(m)
                    if m.contains("rejected its input") && m.contains(&format!("PE {} ", n - 1))),
                "{bad:?}: peer got {e:?}"
            );
        } else {
            assert!(specific, "{bad:?}: peer got {e:?}");
        }
        // The buffer is still usable, with exact results.
        run_case::<f32, i64>(pe, &mut buf, &good_case(100 + i as u64), true)?;
    }
    pe.free(other)?;
    pe.free(buf)
}
mode_test!(bad_inputs_fail_on_every_pe, [1, 2, 3], bad_inputs);

fn bad_configs(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let w = pe.world_team();
    let good = cfg(n, EpMode::Normal);
    let bads = [
        EpConfig {
            num_experts: n * EPP + 1,
            ..good
        },
        EpConfig {
            num_experts: 0,
            ..good
        },
        EpConfig { hidden: 0, ..good },
        EpConfig {
            max_tokens: 0,
            ..good
        },
        EpConfig {
            max_topk: 0,
            ..good
        },
        EpConfig {
            max_topk: 65,
            ..good
        },
        EpConfig {
            mode: EpMode::Capturable { capacity: 0 },
            ..good
        },
        EpConfig {
            mode: EpMode::Capturable {
                capacity: MAX_T + 1,
            },
            ..good
        },
        // sizes whose byte count overflows
        EpConfig {
            max_tokens: usize::MAX / 2,
            hidden: 1 << 40,
            ..good
        },
        EpConfig {
            hidden: usize::MAX,
            ..good
        },
    ];
    let used_before = pe.heap_usage().1;
    for c in bads {
        if n == 1 && c.num_experts == EPP + 1 {
            continue; // every count of experts splits over one PE
        }
        let r = HostBuffer::<f32>::new(pe, w, c);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{c:?}: {r:?}");
        assert_eq!(
            pe.heap_usage().1,
            used_before,
            "{c:?}: a refused buffer kept memory"
        );
    }
    if n > 1 {
        // One PE with an invalid configuration, the others valid: every PE errs, nobody waits.
        let culprit = pe.my_pe() == n - 1;
        let c = if culprit {
            EpConfig { hidden: 0, ..good }
        } else {
            good
        };
        match HostBuffer::<f32>::new(pe, w, c) {
            Err(Error::InvalidArgument(_)) if culprit => {}
            Err(Error::CollectiveMismatch { pe: p, .. }) if !culprit && p == n - 1 => {}
            r => panic!("mixed configs on PE {}: {r:?}", pe.my_pe()),
        }
        assert_eq!(pe.heap_usage().1, used_before, "mixed configs kept memory");
        // Same sizes, different modes: the first call finds out, on every PE.
        let c = if culprit {
            EpConfig {
                mode: EpMode::Capturable { capacity: MAX_T },
                ..good
            }
        } else {
            good
        };
        let mut b = HostBuffer::<f32>::new(pe, w, c)?;
        let r = b.dispatch::<i32>(pe, &[], &[], &[], 1);
        assert!(matches!(r, Err(Error::CollectiveMismatch { .. })), "{r:?}");
        pe.free(b)?;
    }
    let r = HostBuffer::<i32>::new(pe, w, good);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "dtype: {r:?}");
    let r = HostBuffer::<f64>::new(pe, w, good);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "dtype: {r:?}");
    // Too big for the heap: an error on every PE, nothing allocated.
    let huge = EpConfig {
        max_tokens: 1 << 20,
        hidden: 4096,
        ..good
    };
    let (_, used0) = pe.heap_usage();
    let r = HostBuffer::<f32>::new(pe, w, huge);
    assert!(matches!(r, Err(Error::HeapExhausted { .. })), "{r:?}");
    assert_eq!(
        pe.heap_usage().1,
        used0,
        "a buffer too big for the heap kept memory"
    );
    // Sizes are reported and match what the heap gave out.
    let b = HostBuffer::<bf16>::new(pe, w, good)?;
    let (_, used1) = pe.heap_usage();
    assert!(b.bytes() > 0);
    assert_eq!(b.bytes(), HostBuffer::<bf16>::bytes_for(&good, n)?);
    assert!(
        used1 - used0 >= b.bytes(),
        "{} < {}",
        used1 - used0,
        b.bytes()
    );
    assert_eq!(b.recv_rows(), n * MAX_T);
    let want = n * MAX_T * H * 2 + n * MAX_T * (1 + 2 * MAX_K) * 4 + MAX_T * MAX_K * H * 2;
    assert!(b.bytes() >= want && b.bytes() < want + 4096);
    pe.free(b)
}
mode_test!(bad_configs_rejected, [1, 2, 3], bad_configs);

// ----- weights of empty slots -----

/// The weight of a `-1` slot is never used: NaN or infinite there is accepted and ignored.
/// Each token has expert `(t % n) * EPP` in slot 0 (weight 0.5) and -1 in slot 1 (NaN or inf).
fn empty_slot_weights(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let mut buf = HostBuffer::<f32>::new(pe, pe.world_team(), cfg(n, EpMode::Normal))?;
    let t_n = 5;
    let x: Vec<f32> = (0..t_n * H)
        .map(|i| (i + 100 * pe.my_pe()) as f32)
        .collect();
    let ids: Vec<i64> = (0..t_n)
        .flat_map(|t| [((t % n) * EPP) as i64, -1])
        .collect();
    let w: Vec<f32> = (0..t_n)
        .flat_map(|t| [0.5, if t % 2 == 0 { f32::NAN } else { f32::INFINITY }])
        .collect();
    let d = buf.dispatch(pe, &x, &ids, &w, 2)?;
    assert!(d.handle.recv_topk_weights().iter().all(|w| w.is_finite()));
    let y = buf.combine(pe, &d.handle, &d.x)?;
    let want: Vec<f32> = x.iter().map(|v| 0.5 * v).collect();
    assert_eq!(y, want);
    pe.free(buf)
}

mode_test!(
    nan_weights_of_empty_slots_are_ignored,
    [1, 3],
    empty_slot_weights
);

// ----- capacity -----

/// PE `s` sends `count` tokens, each to one expert of PE `(s + 1) % n`; its hidden states
/// name it (so rows from the wrong PE, or another PE's combine result, cannot pass).
fn shifted(pe: &Pe, count: usize) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let n = pe.n_pes();
    let dest = (pe.my_pe() + 1) % n;
    let ids = (0..count).map(|t| (dest * EPP + t % EPP) as i64).collect();
    let w = vec![0.5; count];
    (ids, w, shifted_x(pe.my_pe(), count))
}

fn shifted_x(s: usize, count: usize) -> Vec<f32> {
    (0..count * H)
        .map(|i| (i + 1000 * (s + 1)) as f32)
        .collect()
}

fn capacity(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let cap = 3;
    let mut buf = HostBuffer::<f32>::new(
        pe,
        pe.world_team(),
        cfg(n, EpMode::Capturable { capacity: cap }),
    )?;
    assert_eq!(buf.recv_rows(), n * cap);
    for round in 0..2 {
        // At capacity: fine, exact.
        let (ids, w, x) = shifted(pe, cap);
        let d = buf.dispatch(pe, &x, &ids, &w, 1)?;
        assert_eq!(d.handle.num_recv_tokens(), cap);
        let src = (pe.my_pe() + n - 1) % n;
        assert!(d.handle.recv_src_pe().iter().all(|&s| s as usize == src));
        // cap <= EPP tokens, one per expert: expert-major order is the sender's token order
        assert!(cap <= EPP);
        assert_eq!(d.x, shifted_x(src, cap), "rows received from PE {src}");
        let out = buf.combine(pe, &d.handle, &d.x)?;
        assert_eq!(out, x.iter().map(|v| v * 0.5).collect::<Vec<_>>());
        // Over capacity on PE 0 only: an error on every PE naming the pair, no data moved.
        let c = if pe.my_pe() == 0 { cap + 1 + round } else { 1 };
        let (ids, w, x) = shifted(pe, c);
        match buf.dispatch(pe, &x, &ids, &w, 1) {
            Err(Error::Capacity {
                src_pe,
                dst_pe,
                needed,
                capacity,
                ..
            }) => {
                assert_eq!((src_pe, dst_pe), (0, 1 % n));
                assert_eq!((needed, capacity), (cap + 1 + round, cap));
            }
            other => panic!("expected a capacity error, got {other:?}"),
        }
    }
    // Still usable, results exact.
    let (ids, w, x) = shifted(pe, 2);
    let d = buf.dispatch(pe, &x, &ids, &w, 1)?;
    let out = buf.combine(pe, &d.handle, &d.x)?;
    assert_eq!(out, x.iter().map(|v| v * 0.5).collect::<Vec<_>>());
    pe.free(buf)
}
mode_test!(capturable_overflow_is_an_error, [1, 2, 3, 4], capacity);

// ----- a peer that dies mid-step: the others end in an error, they do not hang -----

#[test]
fn peer_lost_during_dispatch_is_an_error() {
    use std::sync::Mutex;
    static SEEN: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
    let n = 3;
    let cfg = harness::config().timeout(std::time::Duration::from_secs(10));
    let r = std::panic::catch_unwind(|| {
        rshmem::Launch::new()
            .config(cfg)
            .threads()
            .run(n, |pe| -> Result<()> {
                let mut buf =
                    HostBuffer::<f32>::new(pe, pe.world_team(), self::cfg(n, EpMode::Normal))?;
                run_case::<f32, i64>(pe, &mut buf, &good_case(1), true)?;
                if pe.my_pe() == n - 1 {
                    panic!("PE {} dies on purpose", pe.my_pe());
                }
                let case = good_case(2);
                let (ids, w) = routing(&case, pe.my_pe(), n);
                let x: Vec<f32> = hidden(&case, pe.my_pe());
                let r = buf.dispatch(pe, &x, &ids, &w, case.k);
                SEEN.lock()
                    .unwrap()
                    .push((pe.my_pe(), format!("{:?}", r.map(|_| ()))));
                Ok(())
            })
            .values()
    });
    let msg = harness::resumed_panic(r);
    assert!(msg.contains("dies on purpose"), "resumed panic: {msg:?}");
    let mut seen = SEEN.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        (0..n - 1).collect::<Vec<_>>(),
        "{seen:?}"
    );
    for (p, e) in seen {
        assert!(
            e.contains(&format!("PeerLost {{ pe: {}", n - 1)),
            "PE {p}: {e}"
        );
    }
}
