//! Helpers shared by the core's test files (beside `harness/`): poison values, range checks
//! that report the first wrong element instead of printing megabytes, random atomic operands.
#![allow(dead_code)]

use rshmem::{AtomicElem, Elem, Error, Result};

/// The value destinations are poisoned with; `harness::rand_vec` yields it with probability
/// 1/200000 per element, and the checks are positional, so a coincidence cannot hide a bug
/// except for that one element.
pub fn poison<T: Elem>() -> T {
    T::from_f64(99.0)
}

/// Element sizes × offsets used by the data tests: empty, one element (at an aligned and an
/// unaligned element offset), odd lengths at odd offsets, a few thousand bytes.
pub const CASES: &[(usize, usize)] = &[(0, 0), (0, 3), (1, 0), (1, 5), (7, 3), (33, 1), (1000, 13)];

/// Asserts `got[at..at + want.len()] == want` and that every other element is `poison`.
pub fn check_range<T: Elem>(what: &str, got: &[T], at: usize, want: &[T], poison: T) {
    assert!(
        at + want.len() <= got.len(),
        "{what}: range {at}+{} outside {}",
        want.len(),
        got.len()
    );
    for (i, g) in got.iter().enumerate() {
        let expect = if i >= at && i < at + want.len() {
            want[i - at]
        } else {
            poison
        };
        assert!(
            *g == expect,
            "{what}: element {i} of {} is {g:?}, expected {expect:?} (data range {at}..{})",
            got.len(),
            at + want.len()
        );
    }
}

/// Asserts two slices are equal, reporting the first difference only.
pub fn check_eq<T: Elem>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} of {} is {:?}, expected {:?}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// Deterministic full-width random bits for PE `pe`, stream `stream`.
pub fn rand_bits(pe: usize, stream: u64, len: usize) -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64
        ^ ((pe as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        })
        .collect()
}

/// Random values of an atomic type covering its whole range (negative, huge, wrapping).
pub fn rand_atomic<T: AtomicElem>(pe: usize, stream: u64, len: usize) -> Vec<T> {
    rand_bits(pe, stream, len)
        .into_iter()
        .map(T::from_bits)
        .collect()
}

/// `a + b` wrapping at the type's width.
pub fn wadd<T: AtomicElem>(a: T, b: T) -> T {
    T::from_bits(a.to_bits().wrapping_add(b.to_bits()))
}

/// Asserts that `r` is an error matching `pred`, with a readable message otherwise.
pub fn expect_err<T: std::fmt::Debug>(what: &str, r: Result<T>, pred: impl Fn(&Error) -> bool) {
    match r {
        Err(e) if pred(&e) => {}
        other => panic!("{what}: unexpected {other:?}"),
    }
}

/// Every PE's value of a world's results, panicking with the PE's error otherwise.
pub fn all_ok<R>(r: Result<Vec<Result<R>>>) -> Vec<R> {
    r.expect("world")
        .into_iter()
        .enumerate()
        .map(|(pe, x)| x.unwrap_or_else(|e| panic!("PE {pe}: {e}")))
        .collect()
}
