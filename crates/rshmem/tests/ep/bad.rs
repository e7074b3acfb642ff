//! Bad inputs and configurations: every PE returns an error, nothing hangs, the buffer stays
//! usable; the weights of empty slots are never read.

use super::*;

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
