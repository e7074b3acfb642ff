//! The 11 standard element types (MORI's set) behind one sealed trait, and the atomic subset.
//!
//! Every typed operation in the crate is generic over [`Elem`]; the types are listed once, in
//! [`for_each_elem!`](crate::for_each_elem), which also generates the CUDA typed variants.

use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
}

/// The kind of an element type, for validation, logging and code generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemKind {
    /// `i8`
    I8,
    /// `i16`
    I16,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// `u8`
    U8,
    /// `u16`
    U16,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// `f32`
    F32,
    /// `f64`
    F64,
}

impl ElemKind {
    /// Every kind, in declaration order (`kind as usize` is its index).
    pub const ALL: [ElemKind; 12] = [
        ElemKind::I8,
        ElemKind::I16,
        ElemKind::I32,
        ElemKind::I64,
        ElemKind::U8,
        ElemKind::U16,
        ElemKind::U32,
        ElemKind::U64,
        ElemKind::F16,
        ElemKind::Bf16,
        ElemKind::F32,
        ElemKind::F64,
    ];

    /// The name of the kind whose `kind as u64` is `tag`, as records exchanged between PEs
    /// carry it; `type tag N` for a tag no kind has.
    pub fn tag_name(tag: u64) -> String {
        usize::try_from(tag)
            .ok()
            .and_then(|i| ElemKind::ALL.get(i))
            .map_or_else(|| format!("type tag {tag}"), |k| k.rust_name().to_string())
    }

    /// The Rust type's name (`u32`, `bf16`).
    pub const fn rust_name(self) -> &'static str {
        match self {
            ElemKind::I8 => "i8",
            ElemKind::I16 => "i16",
            ElemKind::I32 => "i32",
            ElemKind::I64 => "i64",
            ElemKind::U8 => "u8",
            ElemKind::U16 => "u16",
            ElemKind::U32 => "u32",
            ElemKind::U64 => "u64",
            ElemKind::F16 => "f16",
            ElemKind::Bf16 => "bf16",
            ElemKind::F32 => "f32",
            ElemKind::F64 => "f64",
        }
    }

    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            ElemKind::I8 | ElemKind::U8 => 1,
            ElemKind::I16 | ElemKind::U16 | ElemKind::F16 | ElemKind::Bf16 => 2,
            ElemKind::I32 | ElemKind::U32 | ElemKind::F32 => 4,
            ElemKind::I64 | ElemKind::U64 | ElemKind::F64 => 8,
        }
    }
    /// True for the integer kinds.
    pub const fn is_integer(self) -> bool {
        !matches!(
            self,
            ElemKind::F16 | ElemKind::Bf16 | ElemKind::F32 | ElemKind::F64
        )
    }
    /// The name used in the device API (`rshmem_<name>_put`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ElemKind::I8 => "int8",
            ElemKind::I16 => "int16",
            ElemKind::I32 => "int32",
            ElemKind::I64 => "int64",
            ElemKind::U8 => "uint8",
            ElemKind::U16 => "uint16",
            ElemKind::U32 => "uint32",
            ElemKind::U64 => "uint64",
            ElemKind::F16 => "half",
            ElemKind::Bf16 => "bfloat16",
            ElemKind::F32 => "float",
            ElemKind::F64 => "double",
        }
    }
}

/// An element type that can live in the symmetric heap: plain old data, any bit pattern valid.
///
/// Sealed: implemented for `i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 f32 f64`.
pub trait Elem:
    sealed::Sealed + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static
{
    /// The kind tag.
    const KIND: ElemKind;
    /// The zero value.
    const ZERO: Self;
    /// Converts to `f64` (exact for all but the 64-bit integers beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from `f64`, rounding and saturating as `as` does.
    fn from_f64(v: f64) -> Self;
}

/// Invokes `$m!(rust_type, Kind)` for each of the standard element types.
#[macro_export]
macro_rules! for_each_elem {
    ($m:ident) => {
        $m!(i8, I8);
        $m!(i16, I16);
        $m!(i32, I32);
        $m!(i64, I64);
        $m!(u8, U8);
        $m!(u16, U16);
        $m!(u32, U32);
        $m!(u64, U64);
        $m!(half::f16, F16);
        $m!(half::bf16, Bf16);
        $m!(f32, F32);
        $m!(f64, F64);
    };
}

macro_rules! impl_prim {
    ($t:ty, $k:ident) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const KIND: ElemKind = ElemKind::$k;
            const ZERO: Self = 0 as $t;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
impl_prim!(i8, I8);
impl_prim!(i16, I16);
impl_prim!(i32, I32);
impl_prim!(i64, I64);
impl_prim!(u8, U8);
impl_prim!(u16, U16);
impl_prim!(u32, U32);
impl_prim!(u64, U64);
impl_prim!(f32, F32);
impl_prim!(f64, F64);

macro_rules! impl_half {
    ($t:ty, $k:ident) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const KIND: ElemKind = ElemKind::$k;
            const ZERO: Self = <$t>::ZERO;
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}
impl_half!(f16, F16);
impl_half!(bf16, Bf16);

/// Integer types with native atomics on the symmetric heap: `i32 u32 i64 u64`.
pub trait AtomicElem: Elem + Eq + PartialOrd {
    /// True for the 64-bit types.
    const WIDE: bool;
    /// The value's bits, zero-extended.
    fn to_bits(self) -> u64;
    /// The value from its bits (truncated to the width).
    fn from_bits(b: u64) -> Self;
}

macro_rules! impl_atomic {
    ($t:ty, $u:ty, $wide:expr) => {
        impl AtomicElem for $t {
            const WIDE: bool = $wide;
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
            fn from_bits(b: u64) -> Self {
                b as $u as $t
            }
        }
    };
}
impl_atomic!(i32, u32, false);
impl_atomic!(u32, u32, false);
impl_atomic!(i64, u64, true);
impl_atomic!(u64, u64, true);

/// Comparison for [`wait_until`](crate::Pe::wait_until) and [`test`](crate::Pe::test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Cmp {
    /// Evaluates `a <cmp> b`.
    pub fn eval<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
        }
    }
}

/// How put-with-signal updates the signal word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// Store the value.
    Set,
    /// Add the value.
    Add,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_the_kinds() {
        for (i, k) in ElemKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(ElemKind::tag_name(i as u64), k.rust_name());
        }
        assert_eq!(ElemKind::tag_name(12), "type tag 12");
        assert_eq!(
            ElemKind::tag_name(u64::MAX),
            format!("type tag {}", u64::MAX)
        );
    }

    #[test]
    fn sizes_match_kinds() {
        macro_rules! check {
            ($t:ty, $k:ident) => {
                assert_eq!(std::mem::size_of::<$t>(), ElemKind::$k.size());
                assert_eq!(<$t as Elem>::KIND, ElemKind::$k);
            };
        }
        for_each_elem!(check);
    }
    #[test]
    fn atomic_bits_roundtrip() {
        assert_eq!(i32::from_bits((-5i32).to_bits()), -5);
        assert_eq!((-1i32).to_bits(), 0xffff_ffff);
        assert_eq!(i64::from_bits((-7i64).to_bits()), -7);
        assert!(Cmp::Ge.eval(3, 3) && !Cmp::Gt.eval(3, 3) && Cmp::Ne.eval(1, 2));
    }
}
