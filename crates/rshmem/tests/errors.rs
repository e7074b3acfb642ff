//! Every misuse returns the crate's error, on every PE that must know, and leaves the world
//! usable: PE out of range, ranges outside the object (overflow included), heap exhausted,
//! bad alignments and misaligned views, wait timeouts, mismatched collectives, handles of
//! another PE, handles of an ended world (bad configurations: `config_env.rs`).

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{all_ok, check_eq, expect_err, poison};
use harness::rand_vec;
use rshmem::coll::{Coll, CollConfig, ReduceOp};
use rshmem::ep::{EpConfig, EpMode, HostBuffer, RecvLayout};
use rshmem::{Cmp, Config, Error, InProcBootstrap, Pe, Result, Signal, Sym, Team};
use std::sync::Mutex;
use std::time::Duration;

fn pe_out_of_range(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let x = pe.alloc::<u64>(4)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_fill(&x, 5)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    for bad in [n, n + 1, usize::MAX] {
        let is = |e: &Error| matches!(e, Error::PeOutOfRange { pe, n_pes, what: "world" } if *pe == bad && *n_pes == n);
        expect_err("put", pe.put(&x, 0, &[1, 2], bad), is);
        expect_err("put empty", pe.put(&x, 0, &[], bad), is);
        let mut buf = [0xdead_u64; 2];
        expect_err("get", pe.get(&x, 0, &mut buf, bad), is);
        assert_eq!(
            buf, [0xdead; 2],
            "get into out-of-range PE wrote the buffer"
        );
        expect_err("p", pe.p(&x, 0, 1, bad), is);
        expect_err("g", pe.g(&x, 0, bad), is);
        expect_err("put_nbi", pe.put_nbi(&x, 0, &[1], bad, 0), is);
        expect_err("get_nbi", pe.get_nbi(&x, 0, &mut buf, bad, 0), is);
        assert_eq!(
            buf, [0xdead; 2],
            "get_nbi from an out-of-range PE wrote the buffer"
        );
        expect_err(
            "put_signal",
            pe.put_signal(&x, 0, &[1], Signal::set(&sig, 0, 1), bad),
            is,
        );
        expect_err(
            "put_signal_nbi",
            pe.put_signal_nbi(&x, 0, &[1], Signal::add(&sig, 0, 1), bad, 0),
            is,
        );
        expect_err("fetch", pe.atomic_fetch(&x, 0, bad), is);
        expect_err("set", pe.atomic_set(&x, 0, 1, bad), is);
        expect_err("swap", pe.atomic_swap(&x, 0, 1, bad), is);
        expect_err("cswap", pe.atomic_compare_swap(&x, 0, 5, 1, bad), is);
        expect_err("fadd", pe.atomic_fetch_add(&x, 0, 1, bad), is);
        expect_err("add", pe.atomic_add(&x, 0, 1, bad), is);
        expect_err("finc", pe.atomic_fetch_inc(&x, 0, bad), is);
        expect_err("inc", pe.atomic_inc(&x, 0, bad), is);
        expect_err("fand", pe.atomic_fetch_and(&x, 0, 1, bad), is);
        expect_err("for", pe.atomic_fetch_or(&x, 0, 1, bad), is);
        expect_err("fxor", pe.atomic_fetch_xor(&x, 0, 1, bad), is);
        expect_err("and", pe.atomic_and(&x, 0, 1, bad), is);
        expect_err("or", pe.atomic_or(&x, 0, 1, bad), is);
        expect_err("xor", pe.atomic_xor(&x, 0, 1, bad), is);
        expect_err("is_same_process", pe.is_same_process(bad), is);
        expect_err("placement", pe.placement(bad), is);
    }
    let mut cq = Vec::new();
    assert_eq!(
        pe.completions(&mut cq),
        0,
        "failed nbi calls queued completions"
    );
    let msg = pe.put(&x, 0, &[1], n).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("PE {n}")) && msg.contains(&format!("{n} PEs")),
        "{msg}"
    );
    pe.barrier_all()?;
    for p in 0..n {
        check_eq(
            "untouched",
            &{
                let mut v = vec![0u64; 4];
                pe.get(&x, 0, &mut v, p)?;
                v
            },
            &[5; 4],
        );
        assert_eq!(pe.g(&sig, 0, p)?, 0);
    }
    pe.barrier_all()?;
    pe.free(sig)?;
    pe.free(x)
}
mode_test!(pe_out_of_range_everywhere, [1, 3], pe_out_of_range);

fn out_of_bounds(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let x = pe.alloc::<u32>(10)?;
    let sig = pe.alloc::<u64>(2)?;
    let pz = poison::<u32>();
    pe.local_fill(&x, pz)?;
    pe.local_fill(&sig, 0)?;
    pe.barrier_all()?;
    let oob = |start: usize, end: usize| move |e: &Error| matches!(e, Error::OutOfBounds { start: s, end: en, len: 10 } if *s == start && *en == end);
    let data = [1u32, 2, 3];
    expect_err("put past end", pe.put(&x, 8, &data, me), oob(8, 11));
    expect_err("put at len", pe.put(&x, 10, &data[..1], me), oob(10, 11));
    expect_err("empty put after len", pe.put(&x, 11, &[], me), oob(11, 11));
    expect_err(
        "put start overflow",
        pe.put(&x, usize::MAX, &data[..1], me),
        oob(usize::MAX, usize::MAX),
    );
    expect_err(
        "put start+len overflow",
        pe.put(&x, usize::MAX - 1, &data, me),
        oob(usize::MAX - 1, usize::MAX),
    );
    let mut big = vec![0u32; 11];
    expect_err("get too long", pe.get(&x, 0, &mut big, me), oob(0, 11));
    assert!(big.iter().all(|&v| v == 0), "failed get wrote");
    expect_err(
        "get overflow",
        pe.get(&x, usize::MAX, &mut big[..2], me),
        oob(usize::MAX, usize::MAX),
    );
    expect_err("p", pe.p(&x, 10, 1, me), oob(10, 11));
    expect_err("g", pe.g(&x, usize::MAX, me), oob(usize::MAX, usize::MAX));
    expect_err("nbi put", pe.put_nbi(&x, 9, &data, me, 0), oob(9, 12));
    expect_err(
        "nbi get",
        pe.get_nbi(&x, 9, &mut big[..2], me, 0),
        oob(9, 11),
    );
    expect_err("atomic", pe.atomic_fetch_add(&x, 10, 1, me), oob(10, 11));
    expect_err(
        "atomic overflow",
        pe.atomic_inc(&x, usize::MAX, me),
        oob(usize::MAX, usize::MAX),
    );
    expect_err("test", pe.test(&x, 10, Cmp::Eq, 0), oob(10, 11));
    expect_err("wait", pe.wait_until(&x, 10, Cmp::Eq, 0), oob(10, 11));
    // put_signal: data outside, or signal outside; neither writes anything
    expect_err(
        "put_signal data",
        pe.put_signal(&x, 8, &data, Signal::set(&sig, 0, 1), me),
        oob(8, 11),
    );
    expect_err(
        "put_signal signal",
        pe.put_signal(&x, 0, &data, Signal::add(&sig, 2, 1), me),
        |e| {
            matches!(
                e,
                Error::OutOfBounds {
                    start: 2,
                    end: 3,
                    len: 2
                }
            )
        },
    );
    expect_err(
        "put_signal_nbi data",
        pe.put_signal_nbi(&x, 9, &data[..2], Signal::set(&sig, 0, 1), me, 0),
        oob(9, 11),
    );
    expect_err(
        "put_signal_nbi signal",
        pe.put_signal_nbi(&x, 0, &data, Signal::add(&sig, usize::MAX, 1), me, 0),
        |e| {
            matches!(
                e,
                Error::OutOfBounds {
                    start: usize::MAX,
                    end: usize::MAX,
                    len: 2
                }
            )
        },
    );
    expect_err("signal_fetch", pe.signal_fetch(&sig, 2), |e| {
        matches!(
            e,
            Error::OutOfBounds {
                start: 2,
                end: 3,
                len: 2
            }
        )
    });
    // local access is checked like remote access
    expect_err("local_write", pe.local_write(&x, 8, &data), oob(8, 11));
    expect_err(
        "local_write overflow",
        pe.local_write(&x, usize::MAX, &data[..1]),
        oob(usize::MAX, usize::MAX),
    );
    // nothing failed was queued, and the nbi get wrote nothing
    assert!(big.iter().all(|&v| v == 0), "failed get_nbi wrote");
    let mut cq = Vec::new();
    assert_eq!(
        pe.completions(&mut cq),
        0,
        "failed nbi calls queued completions"
    );
    // the edges that are fine
    pe.put(&x, 10, &[], me)?;
    pe.get(&x, 10, &mut [], me)?;
    pe.put(&x, 7, &data, me)?;
    let mut want = vec![pz; 10];
    want[7..].copy_from_slice(&data);
    check_eq("after failed calls", &pe.local_vec(&x)?, &want);
    assert_eq!(pe.local_vec(&sig)?, [0, 0]);
    let msg = pe.put(&x, 8, &data, me).unwrap_err().to_string();
    assert!(
        msg.contains("8..11") && msg.contains("10 elements"),
        "{msg}"
    );
    // a zero-length object: every element access is out of bounds, empty ranges are fine
    let z = pe.alloc::<u32>(0)?;
    let empty = |e: &Error| {
        matches!(
            e,
            Error::OutOfBounds {
                start: 0,
                end: 1,
                len: 0
            }
        )
    };
    expect_err("put into empty", pe.put(&z, 0, &[1], me), empty);
    expect_err("g of empty", pe.g(&z, 0, me), empty);
    expect_err("atomic on empty", pe.atomic_fetch(&z, 0, me), empty);
    pe.put(&z, 0, &[], me)?;
    assert!(pe.local_vec(&z)?.is_empty());
    check_eq("neighbour of the empty object", &pe.local_vec(&x)?, &want);
    pe.barrier_all()?;
    pe.free(z)?;
    pe.free(sig)?;
    pe.free(x)
}
mode_test!(out_of_bounds_everywhere, [1, 2], out_of_bounds);

fn views(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let b = pe.alloc::<u8>(32)?;
    pe.local_fill(&b, 0)?;
    pe.barrier_all()?;
    expect_err("u64 view at 4", b.view::<u64>(4, 1), |e| {
        matches!(
            e,
            Error::Misaligned {
                offset: 4,
                align: 8
            }
        )
    });
    expect_err("u32 view at 2", b.view::<u32>(2, 1), |e| {
        matches!(
            e,
            Error::Misaligned {
                offset: 2,
                align: 4
            }
        )
    });
    expect_err("view past end", b.view::<u64>(24, 2), |e| {
        matches!(
            e,
            Error::OutOfBounds {
                start: 24,
                end: 40,
                len: 32
            }
        )
    });
    expect_err("view len overflow", b.view::<u64>(8, usize::MAX), |e| {
        matches!(e, Error::OutOfBounds { .. })
    });
    expect_err(
        "view offset overflow",
        b.view::<u16>(usize::MAX - 1, 2),
        |e| matches!(e, Error::OutOfBounds { .. }),
    );
    let w = b.view::<u32>(28, 1)?;
    expect_err("atomic past view", pe.atomic_add(&w, 1, 1, me), |e| {
        matches!(
            e,
            Error::OutOfBounds {
                start: 1,
                end: 2,
                len: 1
            }
        )
    });
    pe.atomic_add(&w, 0, 0x0102_0304, me)?;
    let w8 = b.view::<u64>(8, 1)?;
    pe.atomic_or(&w8, 0, 0xff, me)?;
    let mut want = vec![0u8; 32];
    want[8] = 0xff;
    want[28..].copy_from_slice(&0x0102_0304u32.to_le_bytes());
    assert_eq!(pe.local_vec(&b)?, want);
    // a view of zero elements at the end is fine, and every access through it is out of bounds
    let e = b.view::<u64>(32, 0)?;
    assert!(e.is_empty());
    expect_err("empty view", pe.atomic_fetch(&e, 0, me), |e| {
        matches!(e, Error::OutOfBounds { .. })
    });
    pe.barrier_all()?;
    pe.free(b)
}
mode_test!(misaligned_and_oob_views, [1, 2], views);

fn heap_exhausted(pe: &Pe) -> Result<()> {
    let (size, used0) = pe.heap_usage();
    let half = size / 2;
    let a = pe.alloc::<u8>(half)?;
    let (_, used) = pe.heap_usage();
    assert_eq!(used, used0 + half);
    let want = size - half + 1;
    match pe.alloc::<u8>(want) {
        Err(Error::HeapExhausted {
            requested,
            largest_free,
            heap_size,
        }) => {
            assert_eq!(requested, want);
            assert_eq!(heap_size, size);
            assert!(largest_free < want, "largest free {largest_free}");
            let msg = pe.alloc::<u8>(want).unwrap_err().to_string();
            for num in [want, largest_free, size] {
                assert!(msg.contains(&num.to_string()), "message lacks {num}: {msg}");
            }
            assert!(msg.contains("RSHMEM_HEAP_SIZE"), "{msg}");
        }
        other => panic!("expected HeapExhausted, got {other:?}"),
    }
    expect_err("bigger than the heap", pe.alloc::<u64>(size), |e| {
        matches!(e, Error::HeapExhausted { .. })
    });
    expect_err("size overflow", pe.alloc::<u64>(usize::MAX / 4), |e| {
        matches!(e, Error::InvalidArgument(_))
    });
    expect_err(
        "alignment overflow",
        pe.alloc_aligned::<u8>(16, 1 << 62),
        |e| matches!(e, Error::HeapExhausted { .. }),
    );
    assert_eq!(
        pe.heap_usage().1,
        used0 + half,
        "failed allocations took nothing"
    );
    // what is left is usable
    let b = pe.alloc::<u8>(size - half)?;
    pe.free(b)?;
    pe.free(a)?;
    assert_eq!(pe.heap_usage().1, used0);
    let c = pe.alloc::<u8>(size)?;
    pe.free(c)
}
mode_test!(heap_exhausted_everywhere, [1, 3], heap_exhausted);

fn bad_alignment(pe: &Pe) -> Result<()> {
    for align in [0, 3, 12, 65, usize::MAX] {
        expect_err(
            &format!("align {align}"),
            pe.alloc_aligned::<u32>(4, align),
            |e| matches!(e, Error::Misaligned { .. }),
        );
    }
    let x = pe.alloc_aligned::<u32>(4, 256)?;
    assert_eq!(x.offset() % 256, 0);
    pe.free(x)
}
mode_test!(bad_alignment_everywhere, [1, 2], bad_alignment);

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

// ----- overlapping calls by two threads of one PE -----

/// A call PE 0's threads race with ([`overlapping_calls`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Alloc,
    Free,
    Split,
    SplitStrided,
    Destroy,
    BarrierAll,
    SyncAll,
    TeamBarrier,
    TeamSync,
}

impl Call {
    /// The name `Error::Busy` gives it.
    fn name(self) -> &'static str {
        match self {
            Call::Alloc => "alloc",
            Call::Free => "free",
            Call::Split => "team_split",
            Call::SplitStrided => "team_split_strided",
            Call::Destroy => "team_destroy",
            Call::BarrierAll => "barrier_all",
            Call::SyncAll => "sync_all",
            Call::TeamBarrier => "team_barrier",
            Call::TeamSync => "team_sync",
        }
    }
}

/// What a call made, for the collective clean-up.
#[derive(Debug)]
enum Made {
    Sym(Sym<u32>),
    Team(Option<Team>),
    Nothing,
}

/// The objects a race's calls work on: a team of every PE (not the world: another slot), and
/// an object and a team of every PE for `Free` and `Destroy` to consume.
struct RaceObjs {
    sub: Team,
    victim_sym: Mutex<Option<Sym<u32>>>,
    victim_team: Mutex<Option<Team>>,
}

fn take<T>(m: &Mutex<Option<T>>) -> Option<T> {
    m.lock().unwrap().take()
}

fn make_call(pe: &Pe, call: Call, o: &RaceObjs) -> Result<Made> {
    Ok(match call {
        Call::Alloc => Made::Sym(pe.alloc::<u32>(100)?),
        Call::Free => {
            pe.free(take(&o.victim_sym).expect("victim object"))?;
            Made::Nothing
        }
        Call::Split => Made::Team(pe.team_split(&o.sub, Some(7), -(pe.my_pe() as i64))?),
        Call::SplitStrided => Made::Team(pe.team_split_strided(pe.world_team(), 0, 1, 1)?),
        Call::Destroy => {
            pe.team_destroy(take(&o.victim_team).expect("victim team"))?;
            Made::Nothing
        }
        Call::BarrierAll => pe.barrier_all().map(|_| Made::Nothing)?,
        Call::SyncAll => pe.sync_all().map(|_| Made::Nothing)?,
        Call::TeamBarrier => pe.team_barrier(&o.sub).map(|_| Made::Nothing)?,
        Call::TeamSync => pe.team_sync(&o.sub).map(|_| Made::Nothing)?,
    })
}

/// Checks what a race's winner made (the same on every PE) and releases it collectively.
fn release_made(pe: &Pe, call: Call, made: Made) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    match (call, made) {
        (Call::Alloc, Made::Sym(x)) => {
            // the object is in step on every PE: each PE writes its block into the next one
            let data: Vec<u32> = rand_vec(me, 77, x.len());
            pe.put(&x, 0, &data, (me + 1) % n)?;
            pe.barrier_all()?;
            let want: Vec<u32> = rand_vec((me + n - 1) % n, 77, x.len());
            check_eq(
                "object allocated by the race's winner",
                &pe.local_vec(&x)?,
                &want,
            );
            pe.barrier_all()?;
            pe.free(x)
        }
        (Call::Split, Made::Team(Some(t))) => {
            // one team of every PE, ordered by descending world index
            assert_eq!(t.members(), (0..n).rev().collect::<Vec<_>>());
            pe.team_sync(&t)?;
            pe.team_destroy(t)
        }
        (Call::SplitStrided, Made::Team(t)) => {
            assert_eq!(
                t.as_ref().map(|t| t.members().to_vec()),
                (me == 0).then(|| vec![0])
            );
            match t {
                Some(t) => pe.team_destroy(t),
                None => Ok(()),
            }
        }
        (Call::Free | Call::Destroy | Call::BarrierAll | Call::SyncAll, Made::Nothing)
        | (Call::TeamBarrier | Call::TeamSync, Made::Nothing) => Ok(()),
        (call, made) => panic!("{call:?} made {made:?}"),
    }
}

/// Each PE writes a seeded block into the next PE's copy of a fresh object, and checks the one
/// it got: a matched alloc, data, a matched free.
fn still_usable(pe: &Pe, stream: u64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x = pe.alloc::<u64>(129)?;
    pe.local_fill(&x, poison())?;
    pe.barrier_all()?;
    pe.put(&x, 0, &rand_vec::<u64>(me, stream, 129), (me + 1) % n)?;
    pe.barrier_all()?;
    let want: Vec<u64> = rand_vec((me + n - 1) % n, stream, 129);
    check_eq("after the race", &pe.local_vec(&x)?, &want);
    pe.barrier_all()?;
    pe.free(x)
}

/// Two threads of PE 0 make calls `a` and `b` at once; the other PEs make one call. Calls that
/// must not overlap: exactly one thread gets `Error::Busy` naming the other's call — determined
/// without timing, since the other PEs join the winner's call only once the loser has its error
/// (PE 0's loser tells them, and which call won, through `flag[race]`), so the winner is still
/// inside its call when the loser enters. Calls that may overlap: both succeed, the other PEs
/// making `a` then `b`. Then the world is in step: what the winner made is checked and
/// released, and a fresh alloc/put/free works on every PE.
fn race(pe: &Pe, flag: &Sym<u64>, race: usize, a: Call, b: Call, conflict: bool) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let w = pe.world_team();
    let objs = RaceObjs {
        sub: pe.team_split_strided(w, 0, 1, n)?.expect("member"),
        victim_sym: Mutex::new(Some(pe.alloc::<u32>(5)?)),
        victim_team: Mutex::new(pe.team_split_strided(w, 0, 1, n)?),
    };
    let calls = [a, b];
    let (winner, made) = if me == 0 {
        let results: Vec<Result<Made>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|i| {
                    let objs = &objs;
                    s.spawn(move || {
                        let r = make_call(pe, calls[i], objs);
                        if let Err(Error::Busy { .. }) = r {
                            for p in 1..n {
                                pe.atomic_set(flag, race, 2 - i as u64, p)
                                    .expect("signalling the winner");
                            }
                        }
                        r
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let what = format!("race {race}: {a:?} against {b:?}");
        let mut results = results.into_iter();
        let (ra, rb) = (results.next().unwrap(), results.next().unwrap());
        if conflict {
            let (winner, made, lost) = match (ra, rb) {
                (Ok(m), Err(e)) => (0, m, e),
                (Err(e), Ok(m)) => (1, m, e),
                other => panic!("{what}: expected one success and one Busy, got {other:?}"),
            };
            let (loser, won) = (calls[1 - winner], calls[winner]);
            assert_eq!(
                lost,
                Error::Busy {
                    op: loser.name(),
                    running: won.name()
                },
                "{what}"
            );
            let msg = lost.to_string();
            assert!(
                msg.contains(loser.name()) && msg.contains(won.name()) && msg.contains("overlap"),
                "{what}: {msg}"
            );
            (Some(winner), vec![made])
        } else {
            let ma = ra.unwrap_or_else(|e| panic!("{what}: {a:?}: {e}"));
            let mb = rb.unwrap_or_else(|e| panic!("{what}: {b:?}: {e}"));
            (None, vec![ma, mb])
        }
    } else if conflict {
        let v = pe.wait_until(flag, race, Cmp::Ne, 0)?;
        let winner = v as usize - 1;
        (Some(winner), vec![make_call(pe, calls[winner], &objs)?])
    } else {
        (
            None,
            vec![make_call(pe, a, &objs)?, make_call(pe, b, &objs)?],
        )
    };
    let made_by: Vec<Call> = winner.map_or(calls.to_vec(), |i| vec![calls[i]]);
    for (call, m) in made_by.into_iter().zip(made) {
        release_made(pe, call, m)?;
    }
    // The loser consumed its handle on PE 0 only: the others drop theirs too (a leak on every
    // PE, still in step); an untouched victim is released collectively.
    let loser = winner.map(|i| calls[1 - i]);
    let sym = objs.victim_sym.into_inner().unwrap();
    let team = objs.victim_team.into_inner().unwrap();
    if loser != Some(Call::Free) {
        if let Some(x) = sym {
            pe.free(x)?;
        }
    }
    if loser != Some(Call::Destroy) {
        if let Some(t) = team {
            pe.team_destroy(t)?;
        }
    }
    pe.team_destroy(objs.sub)?;
    still_usable(pe, 1000 + race as u64)
}

/// Overlapping exchange-area operations (alloc, free, team split/destroy, even on different
/// teams) and barriers of one team, by two threads of one PE: the second is refused with
/// `Error::Busy` and never mixes with the first; barriers of different teams, and an exchange
/// beside another team's barrier, do overlap.
fn overlapping_calls(pe: &Pe) -> Result<()> {
    use Call::*;
    let races = [
        (Alloc, Alloc, true),
        (Alloc, Split, true),
        (Free, SplitStrided, true),
        (Destroy, Alloc, true),
        (Split, Free, true),
        (SyncAll, BarrierAll, true),
        (TeamSync, TeamBarrier, true),
        (Alloc, SyncAll, true),
        (TeamBarrier, Destroy, false),
        (TeamSync, SyncAll, false),
        (Alloc, TeamSync, false),
    ];
    let flag = pe.alloc::<u64>(races.len())?;
    pe.local_fill(&flag, 0)?;
    pe.barrier_all()?;
    for (i, &(a, b, conflict)) in races.iter().enumerate() {
        race(pe, &flag, i, a, b, conflict)?;
    }
    pe.barrier_all()?;
    pe.free(flag)
}
mode_test!(overlapping_calls_are_refused, [2, 4], overlapping_calls);

// ----- thread mode only: these need to hand a value from one PE (or world) to another -----

fn cfg() -> Config {
    harness::config().timeout(Duration::from_secs(20))
}

#[test]
fn handle_of_another_pe() {
    let syms: Mutex<Vec<Option<Sym<u64>>>> = Mutex::new(vec![None, None]);
    let teams: Mutex<Vec<Option<Team>>> = Mutex::new(vec![None, None]);
    all_ok(rshmem::Launch::new().config(cfg()).threads().run(2, |pe| -> Result<()> {
        let me = pe.my_pe();
        let x = pe.alloc::<u64>(2)?;
        let y = pe.alloc::<u64>(2)?;
        pe.local_fill(&x, 7)?;
        let t = pe
            .team_split_strided(pe.world_team(), 0, 1, 2)?
            .expect("team");
        // each PE hands its `y` and its team to the other
        syms.lock().unwrap()[me] = Some(y);
        teams.lock().unwrap()[me] = Some(t);
        pe.barrier_all()?;
        let theirs = syms.lock().unwrap()[1 - me].take().expect("sym");
        let their_team = teams.lock().unwrap()[1 - me].take().expect("team");
        let foreign =
            |e: &Error| matches!(e, Error::InvalidArgument(m) if m.contains("belongs to PE"));
        expect_err("put", pe.put(&theirs, 0, &[1], me), foreign);
        expect_err("get", pe.get(&theirs, 0, &mut [0], 1 - me), foreign);
        expect_err("atomic", pe.atomic_inc(&theirs, 0, me), foreign);
        expect_err("wait", pe.wait_until(&theirs, 0, Cmp::Eq, 0), foreign);
        let v = theirs.view::<u32>(0, 1)?;
        expect_err("view", pe.atomic_fetch(&v, 0, me), foreign);
        expect_err("local_vec", pe.local_vec(&theirs), foreign);
        expect_err("local_write", pe.local_write(&theirs, 0, &[1]), foreign);
        expect_err("local_fill", pe.local_fill(&theirs, 1), foreign);
        // collectives with the other PE's object or team: an error on both, nobody waits
        let coll = Coll::new(pe, CollConfig::default())?;
        let z = pe.alloc::<u64>(2)?;
        pe.local_fill(&z, 9)?;
        expect_err(
            "coll foreign object",
            coll.all_reduce(pe.world_team(), &z, &theirs, 2, ReduceOp::Sum),
            foreign,
        );
        let not_member_coll = |e: &Error| matches!(e, Error::Team(m) if m.contains("not a member"));
        expect_err("coll barrier", coll.barrier(&their_team), not_member_coll);
        expect_err(
            "coll foreign team",
            coll.all_reduce(&their_team, &z, &z, 2, ReduceOp::Sum),
            not_member_coll,
        );
        assert_eq!(pe.local_vec(&z)?, [9, 9], "a failed collective wrote");
        coll.all_reduce(pe.world_team(), &z, &z, 2, ReduceOp::Sum)?;
        assert_eq!(pe.local_vec(&z)?, [18, 18], "collectives work afterwards");
        pe.free(z)?;
        pe.free(coll)?;
        let not_member = |e: &Error| matches!(e, Error::Team(m) if m.contains("not a member"));
        expect_err("team barrier", pe.team_barrier(&their_team), not_member);
        expect_err("team sync", pe.team_sync(&their_team), not_member);
        expect_err("split", pe.team_split(&their_team, Some(0), 0), not_member);
        expect_err("destroy", pe.team_destroy(their_team), not_member);
        // the collective free: the PE passing a foreign handle gets its own error, the other
        // a mismatch; nobody waits for the other
        if me == 0 {
            expect_err("free foreign", pe.free(theirs), foreign);
        } else {
            expect_err("free vs foreign", pe.free(x), |e| {
                matches!(
                    e,
                    Error::CollectiveMismatch {
                        op: "free",
                        pe: 0,
                        ..
                    }
                )
            });
            let _ = theirs; // PE 0's object: a handle this PE cannot free
        }
        pe.barrier_all()?;
        Ok(())
    }).values());
}

#[test]
fn handles_of_an_ended_world() {
    // the first world hands out its objects and teams; the second uses them
    let old = all_ok(
        rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(2, |pe| -> Result<(Sym<u64>, Team)> {
                let x = pe.alloc::<u64>(4)?;
                let t = pe
                    .team_split_strided(pe.world_team(), 0, 1, 2)?
                    .expect("team");
                Ok((x, t))
            })
            .values(),
    );
    let old = Mutex::new(old.into_iter().map(Some).collect::<Vec<_>>());
    all_ok(
        rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(2, |pe| -> Result<()> {
                let me = pe.my_pe();
                let (x, t) = old.lock().unwrap()[me].take().expect("old handles");
                let y = pe.alloc::<u64>(4)?; // possibly the same offset as x
                pe.local_fill(&y, 3)?;
                pe.barrier_all()?;
                let ended = |e: &Error| matches!(e, Error::WorldEnded);
                expect_err("put", pe.put(&x, 0, &[1], 1 - me), ended);
                expect_err("get", pe.get(&x, 0, &mut [0], 1 - me), ended);
                expect_err("p", pe.p(&x, 0, 1, me), ended);
                expect_err("g", pe.g(&x, 0, me), ended);
                expect_err("atomic", pe.atomic_fetch_add(&x, 0, 1, 1 - me), ended);
                expect_err(
                    "signal",
                    pe.put_signal(&y, 0, &[1], Signal::set(&x, 0, 1), 1 - me),
                    ended,
                );
                expect_err("wait", pe.wait_until(&x, 0, Cmp::Eq, 0), ended);
                expect_err("view", pe.atomic_fetch(&x.view::<u64>(8, 1)?, 0, me), ended);
                expect_err("local_vec", pe.local_vec(&x), ended);
                expect_err("local_write", pe.local_write(&x, 0, &[1]), ended);
                expect_err("local_fill", pe.local_fill(&x, 1), ended);
                // collectives with the old world's object or team
                let coll = Coll::new(pe, CollConfig::default())?;
                expect_err(
                    "coll old object",
                    coll.all_reduce(pe.world_team(), &y, &x, 4, ReduceOp::Sum),
                    ended,
                );
                expect_err("coll old team", coll.barrier(&t), ended);
                expect_err(
                    "coll old team all_reduce",
                    coll.all_reduce(&t, &y, &y, 4, ReduceOp::Sum),
                    ended,
                );
                pe.free(coll)?;
                // an expert-parallel buffer for the old team: an error, and no symmetric memory kept
                let used = pe.heap_usage().1;
                let ep = EpConfig {
                    num_experts: 4,
                    max_tokens: 4,
                    hidden: 8,
                    max_topk: 2,
                    mode: EpMode::Normal,
                    layout: RecvLayout::ExpertMajor,
                };
                expect_err(
                    "ep buffer old team",
                    HostBuffer::<f32>::new(pe, &t, ep),
                    ended,
                );
                assert_eq!(
                    pe.heap_usage().1,
                    used,
                    "a failed ep::HostBuffer::new kept memory"
                );
                expect_err("team barrier", pe.team_barrier(&t), ended);
                expect_err("team split", pe.team_split_strided(&t, 0, 1, 1), ended);
                expect_err("team destroy", pe.team_destroy(t), ended);
                expect_err("free", pe.free(x), ended);
                pe.barrier_all()?;
                assert_eq!(
                    pe.local_vec(&y)?,
                    [3; 4],
                    "the new world's object is untouched"
                );
                pe.free(y)
            })
            .values(),
    );
}

#[test]
fn mismatched_configurations_fail_everywhere() {
    // threads the application owns, joining through a shared in-process bootstrap
    let hub = InProcBootstrap::new(3, Duration::from_secs(20)).unwrap();
    let results: Vec<Result<Pe>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let hub = hub.clone();
                s.spawn(move || {
                    let heap = if rank == 2 { 2 << 20 } else { 1 << 20 };
                    Pe::init(cfg().heap_size(heap), Box::new(hub.join(rank)?))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.into_iter().enumerate() {
        expect_err(
            &format!("rank {rank}"),
            r,
            |e| matches!(e, Error::Bootstrap { msg, .. } if msg.contains("heap size")),
        );
    }
    expect_err("join twice", hub.join(1).map(|_| ()), |e| {
        matches!(e, Error::Bootstrap { .. })
    });
    expect_err("join out of range", hub.join(3).map(|_| ()), |e| {
        matches!(
            e,
            Error::PeOutOfRange {
                pe: 3,
                n_pes: 3,
                ..
            }
        )
    });
    expect_err(
        "empty hub",
        InProcBootstrap::new(0, Duration::from_secs(1)).map(|_| ()),
        |e| matches!(e, Error::InvalidArgument(_)),
    );
}

#[test]
fn huge_timeout_does_not_panic() {
    // Duration::MAX: no deadline anywhere (the bootstrap once added it to an Instant and panicked)
    let r = rshmem::Launch::new()
        .config(cfg().timeout(Duration::MAX))
        .threads()
        .run(3, |pe| -> Result<u64> {
            let x = pe.alloc::<u64>(1)?;
            pe.local_fill(&x, 0)?;
            pe.barrier_all()?;
            pe.atomic_inc(&x, 0, 0)?;
            pe.barrier_all()?;
            let v = pe.g(&x, 0, 0)?;
            pe.barrier_all()?;
            pe.free(x)?;
            Ok(v)
        })
        .values();
    assert_eq!(all_ok(r), [3, 3, 3]);
}

/// A full completion queue refuses the next non-blocking operation before it starts (nothing
/// written); draining makes room; capacity 0 records nothing and never refuses.
#[test]
fn completion_queue_is_bounded() {
    let r = rshmem::Launch::new()
        .config(cfg().completion_queue(3))
        .threads()
        .run(2, |pe| -> Result<()> {
            let x = pe.alloc::<u32>(8)?;
            pe.local_fill(&x, 0)?;
            pe.barrier_all()?;
            let peer = 1 - pe.my_pe();
            let vals: Vec<u32> = (0..8).map(|i| 100 * pe.my_pe() as u32 + i + 1).collect();
            for i in 0..3 {
                pe.put_nbi(&x, i, &vals[i..i + 1], peer, i as u64)?.wait()?;
            }
            let full = pe.put_nbi(&x, 3, &vals[3..4], peer, 3);
            assert!(
                matches!(full, Err(Error::QueueFull { capacity: 3 })),
                "{full:?}"
            );
            let mut dst = [7u32; 1];
            let full = pe.get_nbi(&x, 0, &mut dst, peer, 9);
            assert!(matches!(full, Err(Error::QueueFull { .. })), "{full:?}");
            assert_eq!(dst, [7], "a refused get wrote its destination");
            let mut done = Vec::new();
            assert_eq!(pe.completions(&mut done), 3);
            let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
            assert_eq!(tags, [0, 1, 2]);
            pe.put_nbi(&x, 4, &vals[4..5], peer, 4)?.wait()?;
            pe.barrier_all()?;
            let got = pe.local_vec(&x)?;
            let p = 100 * peer as u32;
            assert_eq!(
                got,
                [p + 1, p + 2, p + 3, 0, p + 5, 0, 0, 0],
                "PE {}",
                pe.my_pe()
            );
            Ok(())
        })
        .values();
    all_ok(r);
    let r = rshmem::Launch::new()
        .config(cfg().completion_queue(0))
        .threads()
        .run(1, |pe| -> Result<()> {
            let x = pe.alloc::<u32>(1)?;
            for i in 0..10 {
                pe.put_nbi(&x, 0, &[i], 0, 0)?.wait()?;
            }
            assert_eq!(pe.local_vec(&x)?, [9]);
            let mut done = Vec::new();
            assert_eq!(pe.completions(&mut done), 0);
            Ok(())
        })
        .values();
    all_ok(r);
}
