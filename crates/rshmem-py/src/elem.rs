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
