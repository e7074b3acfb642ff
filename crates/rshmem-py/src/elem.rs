//! Element types by their Python names, and the dispatch from a name to generic code.

use crate::errors::invalid;
use pyo3::PyResult;
use rshmem::coll::ReduceOp;
use rshmem::ElemKind;

/// The kind named `name` (torch's dtype names without the `torch.` prefix).
pub(crate) fn kind(name: &str) -> PyResult<ElemKind> {
    Ok(match name {
        "int8" => ElemKind::I8,
        "int16" => ElemKind::I16,
        "int32" => ElemKind::I32,
        "int64" => ElemKind::I64,
        "uint8" => ElemKind::U8,
        "uint16" => ElemKind::U16,
        "uint32" => ElemKind::U32,
        "uint64" => ElemKind::U64,
        "float16" => ElemKind::F16,
        "bfloat16" => ElemKind::Bf16,
        "float32" => ElemKind::F32,
        "float64" => ElemKind::F64,
        other => return Err(invalid(format!("unsupported element type {other:?}"))),
    })
}

/// The reduction named `name` (torch.distributed's `ReduceOp` names, lower case).
pub(crate) fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "prod" | "product" => ReduceOp::Prod,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        "band" => ReduceOp::And,
        "bor" => ReduceOp::Or,
        "bxor" => ReduceOp::Xor,
        other => return Err(invalid(format!("unsupported reduction {other:?}"))),
    })
}

/// Runs `$body` with `$T` bound to the Rust type of element kind `$kind`.
macro_rules! with_elem {
    ($kind:expr, $T:ident => $body:expr) => {
        match $kind {
            rshmem::ElemKind::I8 => {
                type $T = i8;
                $body
            }
            rshmem::ElemKind::I16 => {
                type $T = i16;
                $body
            }
            rshmem::ElemKind::I32 => {
                type $T = i32;
                $body
            }
            rshmem::ElemKind::I64 => {
                type $T = i64;
                $body
            }
            rshmem::ElemKind::U8 => {
                type $T = u8;
                $body
            }
            rshmem::ElemKind::U16 => {
                type $T = u16;
                $body
            }
            rshmem::ElemKind::U32 => {
                type $T = u32;
                $body
            }
            rshmem::ElemKind::U64 => {
                type $T = u64;
                $body
            }
            rshmem::ElemKind::F16 => {
                type $T = rshmem::f16;
                $body
            }
            rshmem::ElemKind::Bf16 => {
                type $T = rshmem::bf16;
                $body
            }
            rshmem::ElemKind::F32 => {
                type $T = f32;
                $body
            }
            rshmem::ElemKind::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

/// One value of `F`, `B` or `H`: an MoE buffer by the dtype of its hidden states (float32,
/// bfloat16, float16).
pub(crate) enum Hidden<F, B, H> {
    F32(F),
    Bf16(B),
    F16(H),
}

/// Runs `$body` with `$b` bound to the buffer inside a [`Hidden`] and `$T` to its element type.
macro_rules! with_buf {
    ($buf:expr, $b:ident, $T:ident => $body:expr) => {
        match $buf {
            $crate::elem::Hidden::F32($b) => {
                type $T = f32;
                $body
            }
            $crate::elem::Hidden::Bf16($b) => {
                type $T = rshmem::bf16;
                $body
            }
            $crate::elem::Hidden::F16($b) => {
                type $T = rshmem::f16;
                $body
            }
        }
    };
}
pub(crate) use with_buf;

/// The error for hidden states of dtype `d`.
pub(crate) fn bad_hidden(d: &str) -> rshmem::Error {
    rshmem::Error::InvalidArgument(format!(
        "ep: hidden states must be float32, bfloat16 or float16, not {d}"
    ))
}
