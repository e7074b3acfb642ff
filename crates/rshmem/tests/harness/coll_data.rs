//! Test data and host references shared by the host (tests/coll.rs) and CUDA
//! (tests/cuda_coll.rs) collective tests: seeded inputs per element type and the exact fold.
#![allow(dead_code)]

use rshmem::coll::ReduceOp;
use rshmem::{bf16, f16, Elem};

/// Test-side knowledge of an element type: data generation and the reference fold.
pub trait TElem: Elem {
    fn gen(pe: usize, stream: u64, len: usize, op: ReduceOp) -> Vec<Self>;
    fn fold(op: ReduceOp, xs: &[Self]) -> Self;
    fn ops() -> &'static [ReduceOp];
    fn poison() -> Self;
}

pub fn mix(x: f64) -> u64 {
    ((x * 8.0) as i64 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TElem for $t {
            fn gen(pe: usize, stream: u64, len: usize, _op: ReduceOp) -> Vec<Self> {
                crate::harness::rand_vec::<f64>(pe, stream, len)
                    .into_iter()
                    .map(|x| mix(x) as $t) // full range: sums and products wrap
                    .collect()
            }
            fn fold(op: ReduceOp, xs: &[Self]) -> Self {
                xs[1..].iter().fold(xs[0], |a, &b| match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::And => a & b,
                    ReduceOp::Or => a | b,
                    ReduceOp::Xor => a ^ b,
                })
            }
            fn ops() -> &'static [ReduceOp] {
                &ReduceOp::ALL
            }
            fn poison() -> Self {
                0x5a5a_5a5a_5a5a_5a5au64 as $t
            }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl TElem for $t {
            fn gen(pe: usize, stream: u64, len: usize, op: ReduceOp) -> Vec<Self> {
                if op == ReduceOp::Prod {
                    const SMALL: [f64; 6] = [-3.0, -2.0, -1.0, 1.0, 2.0, 3.0];
                    crate::harness::rand_vec::<f64>(pe, stream, len)
                        .into_iter()
                        .map(|x| <$t>::from_f64(SMALL[(mix(x) >> 40) as usize % 6]))
                        .collect()
                } else {
                    crate::harness::rand_vec::<$t>(pe, stream, len)
                }
            }
            fn fold(op: ReduceOp, xs: &[Self]) -> Self {
                let v = xs[1..].iter().fold(xs[0].to_f64(), |a, b| {
                    let b = b.to_f64();
                    match op {
                        ReduceOp::Sum => a + b,
                        ReduceOp::Prod => a * b,
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                        _ => unreachable!("bitwise on floats"),
                    }
                });
                <$t>::from_f64(v)
            }
            fn ops() -> &'static [ReduceOp] {
                &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max]
            }
            fn poison() -> Self {
                <$t>::from_f64(f64::NAN)
            }
        }
    )*};
}
float_elem!(f16, bf16, f32, f64);

/// Runs `$f::<T>(args)` for every element type.
macro_rules! each_type {
    ($f:ident($($a:expr),*)) => {{
        $f::<i8>($($a),*)?;
        $f::<i16>($($a),*)?;
        $f::<i32>($($a),*)?;
        $f::<i64>($($a),*)?;
        $f::<u8>($($a),*)?;
        $f::<u16>($($a),*)?;
        $f::<u32>($($a),*)?;
        $f::<u64>($($a),*)?;
        $f::<f16>($($a),*)?;
        $f::<bf16>($($a),*)?;
        $f::<f32>($($a),*)?;
        $f::<f64>($($a),*)?;
    }};
}

/// `got` equals `want` element for element (NaN only where the poison must have stayed: no
/// expected value is NaN).
pub fn check<T: rshmem::Elem>(got: &[T], want: &[T], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        #[allow(clippy::eq_op)]
        let both_nan = g != g && w != w;
        assert!(
            g == w || both_nan,
            "{ctx}: element {i} is {g:?}, expected {w:?}"
        );
    }
}
