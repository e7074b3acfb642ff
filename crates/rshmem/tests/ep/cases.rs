//! Every routing of the seeded cases on every element, id type, mode and layout; identity
//! experts spelled out; buffers on split teams; the layout against a reference.

use super::*;

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
