//! The collectives' CUDA source and the NVRTC modules it is compiled as.
//!
//! One source (`kernels/`), compiled as several modules: NVRTC compiles one program on one
//! core, and the reduction kernels instantiated for every element type and operation make
//! a single module slow to compile. [`GpuColl::new`](super::GpuColl::new) compiles the modules
//! on parallel threads and loads them all, so a cold kernel cache costs about the slowest
//! module's compile where there are cores for all of them.

use super::sig::{typed_kernel_names, untyped_kernel_names};
use crate::backend::cuda::nvrtc;
use crate::elem::ElemKind;
use crate::error::Result;
use std::sync::Arc;

/// The collectives' CUDA source: the files of `kernels/` in order, the shared definitions
/// first. Alone it is one module of every kernel; each [`CollModule::source`] puts a prelude
/// before it that chooses its share.
pub(crate) const COLL_SOURCE: &str = concat!(
    include_str!("kernels/common.cuh"),
    include_str!("kernels/barrier.cu"),
    include_str!("kernels/reduce.cu"),
    include_str!("kernels/ll.cuh"),
    include_str!("kernels/all_reduce.cu"),
    include_str!("kernels/move.cu"),
    include_str!("kernels/copy.cu"),
    include_str!("kernels/net.cu"),
);

/// One of the NVRTC modules the collectives are compiled as ([`COLL_MODULES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollModule {
    /// The element types whose reduction kernels (reduce, LL and pull all_reduce, cross-node
    /// fold, one per operation) the module holds; empty for the module of the untyped kernels
    /// (barriers, copies, all_to_all and all_to_all_v, all_gather, broadcast, cross-node
    /// rounds), which no other module holds.
    pub types: &'static [ElemKind],
}

impl CollModule {
    /// `untyped`, or the module's element types' names joined by `+` (`int8`,
    /// `half+bfloat16`).
    pub fn name(&self) -> String {
        if self.types.is_empty() {
            return "untyped".to_string();
        }
        let names: Vec<&str> = self.types.iter().map(|k| k.name()).collect();
        names.join("+")
    }

    /// The module's CUDA source, without the device header ([`nvrtc::with_header`] prepends
    /// it): a prelude that sets the type lists of `kernels/common.cuh` (and, in a typed module,
    /// `RSHMEMI_COLL_TYPED_ONLY`, which leaves out the untyped kernels), then the collectives'
    /// source, its lines numbered from 1 as if it stood alone.
    pub fn source(&self) -> String {
        let list = |int: bool| {
            let t: Vec<String> = self
                .types
                .iter()
                .filter(|k| k.is_integer() == int)
                .map(|k| format!("RSHMEMI_COLL_TYPE_{}(X)", k.name()))
                .collect();
            t.join(" ")
        };
        let typed_only = if self.types.is_empty() {
            ""
        } else {
            "#define RSHMEMI_COLL_TYPED_ONLY\n"
        };
        format!(
            "{typed_only}#define RSHMEMI_COLL_INT_TYPES(X) {}\n\
             #define RSHMEMI_COLL_FLOAT_TYPES(X) {}\n#line 1\n{COLL_SOURCE}",
            list(true),
            list(false)
        )
    }

    /// The kernels the module exports (each kernel of [`super::coll_kernel_names`] is in
    /// exactly one module).
    pub fn kernel_names(&self) -> Vec<String> {
        if self.types.is_empty() {
            untyped_kernel_names()
        } else {
            self.types
                .iter()
                .flat_map(|&k| typed_kernel_names(k))
                .collect()
        }
    }
}

/// The modules the collectives are compiled as, every one loaded by
/// [`GpuColl::new`](super::GpuColl::new): one per integer type (seven operations each), the
/// floating-point types in two pairs (four operations each: a pair takes about as long as the
/// slowest integer type), and the untyped kernels (the fastest). Listed roughly slowest to
/// compile first, the order the compiles start in, so that fewer cores than modules still
/// finish close together.
///
/// ```
/// use rshmem::cuda::{coll_kernel_names, COLL_MODULES};
/// let names: Vec<String> = COLL_MODULES.iter().map(|m| m.name()).collect();
/// assert_eq!(names[0], "int8");
/// assert!(names.contains(&"half+bfloat16".to_string()));
/// // Every collective kernel is in exactly one module.
/// let n: usize = COLL_MODULES.iter().map(|m| m.kernel_names().len()).sum();
/// assert_eq!(n, coll_kernel_names().len());
/// ```
pub const COLL_MODULES: [CollModule; 11] = {
    use ElemKind::*;
    [
        CollModule { types: &[I8] },
        CollModule { types: &[U8] },
        CollModule {
            types: &[F16, Bf16],
        },
        CollModule { types: &[F32, F64] },
        CollModule { types: &[I16] },
        CollModule { types: &[U16] },
        CollModule { types: &[I32] },
        CollModule { types: &[U32] },
        CollModule { types: &[I64] },
        CollModule { types: &[U64] },
        CollModule { types: &[] },
    ]
};

/// Compiles every module of [`COLL_MODULES`] for `arch` (e.g. `sm_90`) with extra NVRTC
/// `options`, through the kernel cache as [`nvrtc::compile`], on parallel threads
/// ([`nvrtc::compile_all`]); the cubins in the order of [`COLL_MODULES`]. Needs NVRTC only,
/// no GPU.
///
/// ```no_run
/// let cubins = rshmem::cuda::compile_coll_modules("sm_90", &[])?;
/// assert_eq!(cubins.len(), rshmem::cuda::COLL_MODULES.len());
/// # Ok::<(), rshmem::Error>(())
/// ```
pub fn compile_coll_modules(arch: &str, options: &[&str]) -> Result<Vec<Arc<Vec<u8>>>> {
    let srcs: Vec<String> = COLL_MODULES
        .iter()
        .map(|m| nvrtc::with_header(&m.source()))
        .collect();
    let programs: Vec<(&str, &[&str])> = srcs.iter().map(|s| (s.as_str(), options)).collect();
    nvrtc::compile_all(&programs, arch)
}
