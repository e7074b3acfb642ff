//! Reduction operations and the element-wise fold that every executor on the host uses.
//!
//! Semantics (the same on every backend; on one node they do not depend on the algorithm):
//! * the result is the left fold `x_0 op x_1 op … op x_{n-1}` over the team's members in team
//!   order, whichever member computes it, so every member gets bit-identical results;
//!   on a team spanning nodes the hierarchical plans fold each node's members in team order,
//!   then the nodes' results ([`plan::hier`](super::plan::hier)): still the same bits on every
//!   member, and the same integers, but float terms grouped by node;
//! * integers: `Sum` and `Prod` wrap (two's complement, like `wrapping_add`/`wrapping_mul`);
//!   `And`, `Or`, `Xor` are bitwise;
//! * floats: `f32` accumulates in `f32`, `f64` in `f64`; `f16` and `bf16` are widened to `f32`,
//!   folded in `f32` and rounded once at the end; `Min`/`Max` are IEEE minNum/maxNum
//!   ([`f32::min`]: a NaN operand is ignored unless both are NaN); bitwise operations on floats
//!   are an error.

use crate::elem::{Elem, ElemKind};
use crate::error::{Error, Result};
use half::{bf16, f16, slice::HalfFloatSliceExt};
use std::any::Any;

/// A reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integers only).
    And,
    /// Bitwise or (integers only).
    Or,
    /// Bitwise xor (integers only).
    Xor,
}

/// A reduce's operation and the member that receives the result
/// ([`Coll::reduce`](crate::coll::Coll::reduce), `cuda::GpuColl::reduce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToRoot {
    /// The fold.
    pub op: ReduceOp,
    /// The receiving member (team index).
    pub root: usize,
}

/// An all_reduce's operation and, where a test or a measurement forces one, its algorithm
/// (`cuda::GpuColl::all_reduce`). A plain [`ReduceOp`] converts into one that lets the
/// library choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// The fold.
    pub op: ReduceOp,
    /// The algorithm, or `None` for the library's choice.
    pub algo: Option<crate::coll::Algo>,
}

impl From<ReduceOp> for Fold {
    fn from(op: ReduceOp) -> Fold {
        Fold { op, algo: None }
    }
}

impl ReduceOp {
    /// Every operation.
    pub const ALL: [ReduceOp; 7] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::And,
        ReduceOp::Or,
        ReduceOp::Xor,
    ];

    /// Name used in messages and reports.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::And => "and",
            ReduceOp::Or => "or",
            ReduceOp::Xor => "xor",
        }
    }

    /// True for the bitwise operations (integers only).
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor)
    }

    /// True when the operation is defined for elements of `kind`.
    pub const fn supports(self, kind: ElemKind) -> bool {
        kind.is_integer() || !self.is_bitwise()
    }

    /// `Ok` when the operation is defined for `kind`, else [`Error::InvalidArgument`].
    pub fn check(self, kind: ElemKind) -> Result<()> {
        if self.supports(kind) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "reduction {} is not defined for {} elements (bitwise operations need integers)",
                self.name(),
                kind.name()
            )))
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// Element types with a fold: one implementation per concrete type, reached from generic code
/// through [`combine`].
trait FoldElem: Copy + 'static {
    /// `out = rows[0] op rows[1] op …`, `rows` holding `k` rows of `out.len()` elements.
    fn fold(op: ReduceOp, k: usize, rows: &[Self], out: &mut [Self]) -> Result<()>;
}

fn zip_rows<T: Copy>(k: usize, rows: &[T], out: &mut [T], f: impl Fn(T, T) -> T) {
    let l = out.len();
    out.copy_from_slice(&rows[..l]);
    for r in 1..k {
        for (o, &x) in out.iter_mut().zip(&rows[r * l..(r + 1) * l]) {
            *o = f(*o, x);
        }
    }
}

macro_rules! fold_int {
    ($($t:ty),*) => {$(
        impl FoldElem for $t {
            fn fold(op: ReduceOp, k: usize, rows: &[Self], out: &mut [Self]) -> Result<()> {
                match op {
                    ReduceOp::Sum => zip_rows(k, rows, out, <$t>::wrapping_add),
                    ReduceOp::Prod => zip_rows(k, rows, out, <$t>::wrapping_mul),
                    ReduceOp::Min => zip_rows(k, rows, out, |a, b| a.min(b)),
                    ReduceOp::Max => zip_rows(k, rows, out, |a, b| a.max(b)),
                    ReduceOp::And => zip_rows(k, rows, out, |a, b| a & b),
                    ReduceOp::Or => zip_rows(k, rows, out, |a, b| a | b),
                    ReduceOp::Xor => zip_rows(k, rows, out, |a, b| a ^ b),
                }
                Ok(())
            }
        }
    )*};
}
fold_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! fold_float {
    ($($t:ty),*) => {$(
        impl FoldElem for $t {
            fn fold(op: ReduceOp, k: usize, rows: &[Self], out: &mut [Self]) -> Result<()> {
                match op {
                    ReduceOp::Sum => zip_rows(k, rows, out, |a, b| a + b),
                    ReduceOp::Prod => zip_rows(k, rows, out, |a, b| a * b),
                    ReduceOp::Min => zip_rows(k, rows, out, <$t>::min),
                    ReduceOp::Max => zip_rows(k, rows, out, <$t>::max),
                    _ => return op.check(<$t as Elem>::KIND),
                }
                Ok(())
            }
        }
    )*};
}
fold_float!(f32, f64);

macro_rules! fold_half {
    ($($t:ty),*) => {$(
        impl FoldElem for $t {
            fn fold(op: ReduceOp, k: usize, rows: &[Self], out: &mut [Self]) -> Result<()> {
                op.check(<$t as Elem>::KIND)?;
                let l = out.len();
                let mut wide = vec![0f32; k * l];
                rows[..k * l].convert_to_f32_slice(&mut wide);
                let mut acc = vec![0f32; l];
                <f32 as FoldElem>::fold(op, k, &wide, &mut acc)?;
                out.convert_from_f32_slice(&acc);
                Ok(())
            }
        }
    )*};
}
fold_half!(f16, bf16);

fn try_fold<U: FoldElem>(
    op: ReduceOp,
    k: usize,
    rows: &dyn Any,
    out: &mut dyn Any,
) -> Option<Result<()>> {
    let rows = rows.downcast_ref::<Vec<U>>()?;
    let out = out.downcast_mut::<Vec<U>>()?;
    Some(U::fold(op, k, rows, out))
}

/// Folds `k` rows of `out.len()` elements (row-major in `rows`) into `out` with `op`.
#[allow(clippy::ptr_arg)] // Vec, not slice: the concrete type is recovered through `Any`.
pub(crate) fn combine<T: Elem>(
    op: ReduceOp,
    k: usize,
    rows: &Vec<T>,
    out: &mut Vec<T>,
) -> Result<()> {
    op.check(T::KIND)?;
    if k == 0 || rows.len() < k * out.len() {
        return Err(Error::invalid(format!(
            "internal: fold of {k} rows of {} elements from {} elements",
            out.len(),
            rows.len()
        )));
    }
    let (r, o): (&dyn Any, &mut dyn Any) = (rows, out);
    try_fold::<i8>(op, k, r, o)
        .or_else(|| try_fold::<i16>(op, k, r, o))
        .or_else(|| try_fold::<i32>(op, k, r, o))
        .or_else(|| try_fold::<i64>(op, k, r, o))
        .or_else(|| try_fold::<u8>(op, k, r, o))
        .or_else(|| try_fold::<u16>(op, k, r, o))
        .or_else(|| try_fold::<u32>(op, k, r, o))
        .or_else(|| try_fold::<u64>(op, k, r, o))
        .or_else(|| try_fold::<f16>(op, k, r, o))
        .or_else(|| try_fold::<bf16>(op, k, r, o))
        .or_else(|| try_fold::<f32>(op, k, r, o))
        .or_else(|| try_fold::<f64>(op, k, r, o))
        .unwrap_or_else(|| Err(Error::invalid("internal: element type without a fold")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_ops_wrap() {
        let rows: Vec<u8> = vec![200, 3, 0xf0, 100, 2, 0x0f];
        let mut out = vec![0u8; 3];
        combine(ReduceOp::Sum, 2, &rows, &mut out).unwrap();
        assert_eq!(out, vec![44, 5, 0xff]);
        combine(ReduceOp::Prod, 2, &rows, &mut out).unwrap();
        assert_eq!(
            out,
            vec![(200u32 * 100 % 256) as u8, 6, 0xf0u8.wrapping_mul(0x0f)]
        );
        combine(ReduceOp::Xor, 2, &rows, &mut out).unwrap();
        assert_eq!(out, vec![200 ^ 100, 1, 0xff]);
        let rows: Vec<i64> = vec![i64::MAX, -1, 1, 5];
        let mut out = vec![0i64; 2];
        combine(ReduceOp::Sum, 2, &rows, &mut out).unwrap();
        assert_eq!(out, vec![i64::MIN, 4]);
        combine(ReduceOp::Min, 2, &rows, &mut out).unwrap();
        assert_eq!(out, vec![1, -1]);
    }

    #[test]
    fn half_rounds_once() {
        // 2048 + 1 + 1 in f16 step by step gives 2048 (ties to even); in f32 then rounded, 2050.
        let rows: Vec<f16> = [2048.0, 1.0, 1.0]
            .iter()
            .map(|&x| f16::from_f32(x))
            .collect();
        let mut out = vec![f16::ZERO; 1];
        combine(ReduceOp::Sum, 3, &rows, &mut out).unwrap();
        assert_eq!(out[0].to_f32(), 2050.0);
        let mut out = vec![bf16::ZERO; 1];
        // 256 + 0.75 + 0.75 step by step stays 256; in f32 it is 257.5, rounded once to 258.
        let rows: Vec<bf16> = [256.0, 0.75, 0.75]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        combine(ReduceOp::Sum, 3, &rows, &mut out).unwrap();
        assert_eq!(out[0].to_f32(), 258.0);
    }

    #[test]
    fn min_max_ignore_nan_unless_all_are() {
        // IEEE minNum/maxNum as documented, the same for every float type: [NaN, 2, 1] folds to
        // 1 (min) and 2 (max); a column of NaNs stays NaN.
        fn check<T: Elem + FoldElem>(f: impl Fn(f32) -> T, back: impl Fn(T) -> f32) {
            let rows: Vec<T> = [f32::NAN, f32::NAN, 2.0, f32::NAN, 1.0, f32::NAN]
                .into_iter()
                .map(&f)
                .collect();
            let mut out = vec![f(0.0); 2];
            combine(ReduceOp::Min, 3, &rows, &mut out).unwrap();
            assert_eq!(back(out[0]), 1.0);
            assert!(back(out[1]).is_nan());
            combine(ReduceOp::Max, 3, &rows, &mut out).unwrap();
            assert_eq!(back(out[0]), 2.0);
            assert!(back(out[1]).is_nan());
            // Sum and Prod propagate NaN
            combine(ReduceOp::Sum, 3, &rows, &mut out).unwrap();
            assert!(back(out[0]).is_nan());
        }
        check(|x| x, |x| x);
        check(|x| x as f64, |x| x as f32);
        check(f16::from_f32, f16::to_f32);
        check(bf16::from_f32, bf16::to_f32);
    }

    #[test]
    fn bitwise_on_floats_is_an_error() {
        let rows = vec![1.0f32, 2.0];
        let mut out = vec![0f32; 1];
        for op in [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor] {
            assert!(matches!(
                combine(op, 2, &rows, &mut out),
                Err(Error::InvalidArgument(_))
            ));
        }
        combine(ReduceOp::Max, 2, &rows, &mut out).unwrap();
        assert_eq!(out, vec![2.0]);
    }
}
