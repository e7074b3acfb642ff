//! Host collectives over the world (`rshmem::coll::Coll`): every operand a symmetric array.

use crate::elem::{kind, reduce_op, with_elem};
use crate::errors::IntoPy;
use crate::ops::sym;
use crate::world::{Live, World};
use pyo3::prelude::*;
use rshmem::coll::{AllToAllV, ToRoot};
use rshmem::{Elem, Error, SymView};

impl World {
    /// Runs `f` with the live PE and its dependents, the GIL released.
    pub(crate) fn run_live<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Live) -> rshmem::Result<R> + Send,
    ) -> PyResult<R> {
        py.allow_threads(|| {
            let l = self.live()?;
            f(l.get())
        })
        .py()
    }

    /// Runs `f` with the symmetric operands `dst` and `src`, each (address, bytes), as views of
    /// `T`: the output and the input of a collective.
    pub(crate) fn with_io_views<T: Elem, R>(
        &self,
        (dst, dst_bytes): (u64, usize),
        (src, src_bytes): (u64, usize),
        f: impl FnOnce(&SymView<'_, T>, &SymView<'_, T>) -> rshmem::Result<R>,
    ) -> rshmem::Result<R> {
        let es = std::mem::size_of::<T>();
        let h = self.hold(&[(dst, dst_bytes, "output"), (src, src_bytes, "input")])?;
        let g = h.guards();
        let dv = sym(&g[0])?.view::<T>(h.offset(0), elems(dst_bytes, es, "output")?)?;
        let sv = sym(&g[1])?.view::<T>(h.offset(1), elems(src_bytes, es, "input")?)?;
        f(&dv, &sv)
    }
}

/// Element count of `bytes` bytes of elements of `size` bytes (whole elements only).
pub(crate) fn elems(bytes: usize, size: usize, what: &str) -> rshmem::Result<usize> {
    if !bytes.is_multiple_of(size) {
        return Err(Error::InvalidArgument(format!(
            "{what}: {bytes} bytes are not whole elements of {size} bytes"
        )));
    }
    Ok(bytes / size)
}

#[pymethods]
impl World {
    /// One collective over the world on symmetric operands: `kind` one of broadcast, reduce,
    /// all_reduce, all_gather, reduce_scatter, all_to_all; `count` in elements, as
    /// `rshmem::coll::Coll` defines it. The GIL is released.
    #[pyo3(signature = (kind_name, dtype, dst, dst_bytes, src, src_bytes, count, op=None, root=0))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn collective(
        &self,
        py: Python<'_>,
        kind_name: &str,
        dtype: &str,
        dst: u64,
        dst_bytes: usize,
        src: u64,
        src_bytes: usize,
        count: usize,
        op: Option<&str>,
        root: usize,
    ) -> PyResult<()> {
        let k = kind(dtype)?;
        let op = op.map(reduce_op).transpose()?;
        let kind_name = kind_name.to_string();
        with_elem!(k, T => self.run_live(py, move |live| {
            let pe = live.borrow_owner();
            self.with_io_views::<T, _>((dst, dst_bytes), (src, src_bytes), |dv, sv| {
            live.with_dependent(|_, deps| {
            let c = deps.coll.lock().unwrap_or_else(|e| e.into_inner());
            let team = pe.world_team();
            let need_op = || {
                op.ok_or_else(|| Error::InvalidArgument(format!("{kind_name} needs an op")))
            };
            match kind_name.as_str() {
                "broadcast" => c.broadcast(team, dv, sv, count, root),
                "reduce" => c.reduce(team, dv, sv, count, ToRoot { op: need_op()?, root }),
                "all_reduce" => c.all_reduce(team, dv, sv, count, need_op()?),
                "all_gather" => c.all_gather(team, dv, sv, count),
                "reduce_scatter" => c.reduce_scatter(team, dv, sv, count, need_op()?),
                "all_to_all" => c.all_to_all(team, dv, sv, count),
                o => Err(Error::InvalidArgument(format!("unknown collective {o:?}"))),
            }
            })
            })
        }))
    }

    /// all_to_all_v over the world on symmetric operands; counts and displacements in
    /// elements, one per PE. The GIL is released.
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        dtype: &str,
        dst: u64,
        dst_bytes: usize,
        src: u64,
        src_bytes: usize,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
    ) -> PyResult<()> {
        let k = kind(dtype)?;
        with_elem!(k, T => self.run_live(py, move |live| {
            let pe = live.borrow_owner();
            self.with_io_views::<T, _>((dst, dst_bytes), (src, src_bytes), |dv, sv| {
            live.with_dependent(|_, deps| {
            let c = deps.coll.lock().unwrap_or_else(|e| e.into_inner());
            let v = AllToAllV {
                send_counts: &send_counts,
                send_displs: &send_displs,
                recv_counts: &recv_counts,
                recv_displs: &recv_displs,
            };
            c.all_to_all_v(pe.world_team(), dv, sv, &v)
            })
            })
        }))
    }
}
