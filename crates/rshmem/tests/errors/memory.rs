//! PE indices out of range, ranges outside the object (overflow included), misaligned and
//! out-of-bounds views, heap exhaustion, bad alignments: an error on every PE that must know,
//! and the world usable afterwards.

use super::*;

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
