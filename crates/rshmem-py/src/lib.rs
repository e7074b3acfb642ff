//! `rshmem._rshmem`: the native half of the Python package. The Python half (`python/rshmem`)
//! turns numpy arrays and torch tensors into the addresses and buffers these functions take,
//! and builds the public API (torch.distributed-like collectives, DeepEP-like MoE) on them.
//!
//! Every call that can wait for another PE releases the GIL, so thread-PEs of one interpreter
//! make progress while one of them waits.

mod bench;
mod coll;
mod elem;
mod ep;
mod errors;
mod fast;
mod front;
mod gpu;
mod gpu_ep;
mod gpu_ll;
mod ops;
mod registry;
mod world;

use pyo3::prelude::*;

/// The native module; its classes are documented in `_rshmem.pyi`.
#[pymodule]
fn _rshmem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<world::World>()?;
    m.add_class::<world::Hub>()?;
    m.add_class::<registry::Export>()?;
    m.add_class::<ep::HostEp>()?;
    m.add_class::<ep::HostEpHandle>()?;
    m.add_class::<gpu::UserKernel>()?;
    m.add_class::<gpu_ep::GpuEp>()?;
    m.add_class::<gpu_ep::GpuEpHandle>()?;
    m.add_class::<gpu_ep::AreaView>()?;
    m.add_class::<gpu_ll::GpuLlEp>()?;
    m.add_class::<gpu_ll::LlHandle>()?;
    m.add_class::<gpu_ll::LlPending>()?;
    m.add_function(wrap_pyfunction!(world::unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(world::launched, m)?)?;
    m.add_function(wrap_pyfunction!(front::set_world, m)?)?;
    m.add_function(wrap_pyfunction!(front::current_world, m)?)?;
    m.add_function(wrap_pyfunction!(front::put, m)?)?;
    m.add_function(wrap_pyfunction!(front::get, m)?)?;
    m.add_function(wrap_pyfunction!(front::put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(front::wait_until, m)?)?;
    m.add_function(wrap_pyfunction!(front::barrier, m)?)?;
    m.add_function(wrap_pyfunction!(front::quiet, m)?)?;
    m.add_function(wrap_pyfunction!(front::fence, m)?)?;
    m.add_function(wrap_pyfunction!(front::all_reduce, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
