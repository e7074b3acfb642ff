//! Waits that time out (every comparison), and collectives whose members disagree (sizes,
//! types, alignments, order, alloc against free): an error on every PE, nothing allocated or
//! freed, the world in step afterwards.

use super::*;

fn wait_timeout(pe: &Pe) -> Result<()> {
    let x = pe.alloc::<i64>(1)?;
    pe.local_fill(&x, -1)?;
    pe.barrier_all()?;
    let t = Duration::from_millis(30);
    // every comparison, each with a value that makes it false for -1
    let false_for_minus_one = [
        (Cmp::Eq, 0i64),
        (Cmp::Ne, -1),
        (Cmp::Gt, -1),
        (Cmp::Ge, 0),
        (Cmp::Lt, -1),
        (Cmp::Le, -2),
    ];
    for (cmp, v) in false_for_minus_one {
        match pe.wait_until_timeout(&x, 0, cmp, v, t) {
            Err(Error::Timeout {
                op: "wait_until",
                pe: None,
                after,
            }) => {
                assert!(after >= t, "reported {after:?}")
            }
            other => panic!("{cmp:?}: expected a timeout, got {other:?}"),
        }
    }
    let msg = pe
        .wait_until_timeout(&x, 0, Cmp::Eq, 0i64, t)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("timeout") && msg.contains("wait_until"),
        "{msg}"
    );
    // a condition that holds needs no time at all, even with a zero timeout
    assert_eq!(pe.wait_until_timeout(&x, 0, Cmp::Lt, 0i64, t)?, -1);
    assert_eq!(
        pe.wait_until_timeout(&x, 0, Cmp::Ne, 0i64, Duration::ZERO)?,
        -1
    );
    expect_err(
        "zero timeout",
        pe.wait_until_timeout(&x, 0, Cmp::Eq, 0i64, Duration::ZERO),
        |e| {
            matches!(
                e,
                Error::Timeout {
                    op: "wait_until",
                    pe: None,
                    ..
                }
            )
        },
    );
    pe.barrier_all()?;
    pe.free(x)
}
mode_test!(wait_timeout_everywhere, [1, 2], wait_timeout);

/// A mismatch must be an error on every PE, allocate or free nothing, and leave the world usable.
fn mismatched_collectives(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (_, used0) = pe.heap_usage();
    let odd = me == n - 1;
    let first_other = if me == n - 1 { 0 } else { n - 1 };
    let is_mm = |op: &'static str| {
        move |e: &Error| match e {
            Error::CollectiveMismatch { op: o, pe: p, .. } => *o == op && *p != me,
            _ => false,
        }
    };
    // different sizes
    expect_err("sizes", pe.alloc::<u8>(if odd { 10 } else { 20 }), |e| {
        let (mine, theirs) = if odd {
            ("10 bytes", "20 bytes")
        } else {
            ("20 bytes", "10 bytes")
        };
        is_mm("alloc")(e)
            && matches!(e, Error::CollectiveMismatch { pe: p, mine: m, theirs: t, .. }
                if *p == first_other && m.contains(mine) && t.contains(theirs))
    });
    // different types of the same byte size
    let r = if odd {
        pe.alloc::<u32>(4).map(|_| ())
    } else {
        pe.alloc::<f32>(4).map(|_| ())
    };
    expect_err("types", r, is_mm("alloc"));
    // different alignments
    expect_err(
        "align",
        pe.alloc_aligned::<u8>(4, if odd { 128 } else { 64 }),
        is_mm("alloc"),
    );
    // one PE's size overflows
    expect_err(
        "overflow on one PE",
        pe.alloc::<u64>(if odd { usize::MAX } else { 1 }),
        is_mm("alloc"),
    );
    // different order
    let (l1, l2) = if odd { (4, 8) } else { (8, 4) };
    expect_err("order 1", pe.alloc::<u8>(l1), is_mm("alloc"));
    expect_err("order 2", pe.alloc::<u8>(l2), is_mm("alloc"));
    assert_eq!(pe.heap_usage().1, used0, "a mismatched alloc allocated");
    // frees of different objects: nothing is freed (the handle is gone: a leak, not a corruption)
    let a = pe.alloc::<u8>(8)?;
    let b = pe.alloc::<u8>(8)?;
    let used = pe.heap_usage().1;
    expect_err("free", pe.free(if odd { a } else { b }), is_mm("free"));
    assert_eq!(pe.heap_usage().1, used, "a mismatched free freed");
    // alloc against free
    let c = pe.alloc::<u8>(8)?;
    let used = pe.heap_usage().1;
    if odd {
        expect_err("alloc vs free", pe.alloc::<u8>(8), is_mm("alloc"));
    } else {
        expect_err("free vs alloc", pe.free(c), is_mm("free"));
    }
    assert_eq!(pe.heap_usage().1, used);
    // the world is still in step: a matched allocation, data through it, a matched free
    let d = pe.alloc::<u64>(n)?;
    pe.local_fill(&d, 0)?;
    pe.barrier_all()?;
    for t in 0..n {
        pe.p(&d, me, me as u64 + 1, t)?;
    }
    pe.barrier_all()?;
    assert_eq!(pe.local_vec(&d)?, (1..=n as u64).collect::<Vec<_>>());
    pe.barrier_all()?;
    pe.free(d)?;
    assert_eq!(pe.heap_usage().1, used);
    Ok(())
}
mode_test!(
    mismatched_collectives_everywhere,
    [2, 3, 8],
    mismatched_collectives
);
