//! The symmetric heap through the PE API: deterministic offsets on every PE (compared through a
//! symmetric exchange), alignment requests, many alloc/free cycles without a leak, zero-length
//! objects, objects that never overlap.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{check_eq, rand_bits};
use rshmem::{Pe, Result, Sym};

/// Every PE publishes the offsets of its objects into every PE's table; all tables must agree.
fn check_offsets_agree(pe: &Pe, offsets: &[u64]) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let k = offsets.len();
    let table = pe.alloc::<u64>(n * k)?;
    pe.local_fill(&table, u64::MAX)?;
    pe.barrier_all()?;
    for t in 0..n {
        pe.put(&table, me * k, offsets, t)?;
    }
    pe.barrier_all()?;
    let all = pe.local_vec(&table)?;
    for p in 0..n {
        check_eq(
            &format!("offsets of PE {p} seen on PE {me}"),
            &all[p * k..][..k],
            offsets,
        );
    }
    pe.barrier_all()?;
    pe.free(table)
}

fn offsets_and_alignment(pe: &Pe) -> Result<()> {
    let (_, used0) = pe.heap_usage();
    let aligns = [1usize, 2, 8, 64, 128, 4096, 65536];
    let mut objs: Vec<Sym<u8>> = Vec::new();
    let mut offs = Vec::new();
    for (i, &al) in aligns.iter().enumerate() {
        let len = [0, 1, 3, 100, 4097][i % 5];
        let s = pe.alloc_aligned::<u8>(len, al)?;
        assert_eq!(s.offset() % al.max(64), 0, "align {al}");
        assert_eq!(s.len(), len);
        assert_eq!(s.is_empty(), len == 0);
        offs.push(s.offset() as u64);
        objs.push(s);
    }
    // typed objects are aligned for their type (and to a cache line)
    let a = pe.alloc::<f64>(3)?;
    let b = pe.alloc::<half::f16>(5)?;
    let c = pe.alloc::<i32>(0)?;
    for o in [a.offset(), b.offset(), c.offset()] {
        assert_eq!(o % 64, 0);
        offs.push(o as u64);
    }
    // no two live objects overlap (zero-length ones take a granule too)
    let mut spans: Vec<(usize, usize)> = objs
        .iter()
        .map(|s| (s.offset(), s.len().max(1)))
        .chain([(a.offset(), 24), (b.offset(), 10), (c.offset(), 1)])
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
    }
    check_offsets_agree(pe, &offs)?;
    // zero-length objects: no data, but the handle works with empty ranges
    pe.put(&c, 0, &[], (pe.my_pe() + 1) % pe.n_pes())?;
    assert!(pe.local_vec(&c)?.is_empty());
    pe.free(c)?;
    pe.free(b)?;
    pe.free(a)?;
    for s in objs {
        pe.free(s)?;
    }
    assert_eq!(pe.heap_usage().1, used0, "everything returned");
    Ok(())
}
mode_test!(
    deterministic_offsets_and_alignment,
    [1, 2, 3, 8],
    offsets_and_alignment
);

/// A seeded sequence of allocations and frees (same on every PE): offsets agree, data written
/// through live objects survives the churn of the others, and nothing leaks at the end.
fn churn(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let next = (me + 1) % n;
    let (size, used0) = pe.heap_usage();
    let r = rand_bits(0, 77, 400); // the same for every PE: collectives must match
    let mut live: Vec<(Sym<u64>, u64)> = Vec::new();
    let mut offs = Vec::new();
    for (i, &x) in r.iter().enumerate() {
        if x % 3 != 0 || live.is_empty() {
            let len = (x >> 8) as usize % 300;
            let s = pe.alloc_aligned::<u64>(len, 1 << ((x >> 20) % 9))?;
            offs.push(s.offset() as u64);
            // fill the next PE's copy with a pattern naming the object
            let tag = (i as u64) << 32 | me as u64;
            pe.put(&s, 0, &vec![tag; len], next)?;
            live.push((s, i as u64));
        } else {
            let k = (x >> 30) as usize % live.len();
            let (s, i) = live.swap_remove(k);
            pe.barrier_all()?;
            let prev = (me + n - 1) % n;
            let want = vec![i << 32 | prev as u64; s.len()];
            check_eq("object contents before free", &pe.local_vec(&s)?, &want);
            pe.free(s)?;
        }
    }
    assert!(pe.heap_usage().1 <= size);
    check_offsets_agree(pe, &offs)?;
    pe.barrier_all()?;
    for (s, _) in live {
        pe.free(s)?;
    }
    assert_eq!(pe.heap_usage().1, used0, "alloc/free cycles leaked");
    // after the churn the whole heap is one block again
    let all = pe.alloc::<u8>(size)?;
    pe.free(all)
}
mode_test!(alloc_free_cycles_no_leak, [1, 2, 3, 8], churn);

/// The same allocation repeated many times lands at the same offset every time.
fn same_offset(pe: &Pe) -> Result<()> {
    let first = pe.alloc::<u32>(1000)?;
    let off = first.offset();
    pe.free(first)?;
    for _ in 0..200 {
        let s = pe.alloc::<u32>(1000)?;
        assert_eq!(s.offset(), off);
        pe.free(s)?;
    }
    Ok(())
}
mode_test!(repeated_alloc_same_offset, [1, 3], same_offset);

/// Slices of a symmetric object address its elements: a put into `x.slice(5..9)` lands in
/// `x[5..9]` of the target and nowhere else, a get from a slice reads those elements, slices of
/// slices compose, and ranges past the end or reversed are `OutOfBounds`.
fn slices(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let next = (me + 1) % n;
    let x = pe.alloc::<u32>(16)?;
    pe.local_fill(&x, u32::MAX)?;
    pe.barrier_all()?;
    let part = x.slice(5..9)?;
    assert_eq!((part.len(), part.offset()), (4, x.offset() + 20));
    pe.put(
        &part,
        0,
        &[10, 11, 12, 13].map(|v| v + 100 * me as u32),
        next,
    )?;
    pe.barrier_all()?;
    let prev = (me + n - 1) % n;
    let mut want = vec![u32::MAX; 16];
    for (k, w) in want[5..9].iter_mut().enumerate() {
        *w = 10 + k as u32 + 100 * prev as u32;
    }
    check_eq("x after a put into x[5..9]", &pe.local_vec(&x)?, &want);
    let mut got = [0u32; 2];
    pe.get(&part.slice(1..=2)?, 0, &mut got, me)?;
    check_eq("get from x[6..8]", &got, &want[6..8]);
    for bad in [
        x.slice(10..17).map(|_| ()),
        x.slice(..17).map(|_| ()),
        part.slice(3..5).map(|_| ()),
    ] {
        assert!(
            matches!(bad, Err(rshmem::Error::OutOfBounds { .. })),
            "{bad:?}"
        );
    }
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = x.slice(9..5).map(|_| ());
    assert!(matches!(reversed, Err(rshmem::Error::OutOfBounds { .. })));
    // Three elements into the last two: refused, and nothing written past the slice's end
    // (or into it).
    let over = pe.put(&x.slice(14..)?, 0, &[1, 2, 3], next);
    assert!(
        matches!(over, Err(rshmem::Error::OutOfBounds { .. })),
        "{over:?}"
    );
    pe.barrier_all()?;
    check_eq("x after a refused put", &pe.local_vec(&x)?, &want);
    pe.barrier_all()?;
    pe.free(x)
}
mode_test!(slices_address_their_elements, [1, 3], slices);
