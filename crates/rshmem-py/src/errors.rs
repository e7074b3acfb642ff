//! rshmem errors as Python exceptions of the hierarchy in `rshmem/errors.py`, carrying the
//! Rust message unchanged.

use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;
use rshmem::Error;

static MODULE: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The exception class named `name` in `rshmem.errors`.
fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = MODULE.get_or_try_init(py, || {
        PyModule::import(py, "rshmem.errors").map(|m| m.unbind())
    })?;
    Ok(m.bind(py).getattr(name)?.downcast_into::<PyType>()?)
}

/// Which class of `rshmem.errors` an error becomes.
fn class_name(e: &Error) -> &'static str {
    match e {
        Error::PeOutOfRange { .. }
        | Error::OutOfBounds { .. }
        | Error::LengthMismatch { .. }
        | Error::Misaligned { .. }
        | Error::InvalidArgument(_) => "InvalidArgument",
        Error::HeapExhausted { .. } => "HeapExhausted",
        Error::Timeout { .. } => "Timeout",
        Error::QueueFull { .. } => "QueueFull",
        Error::PeerLost { .. } => "PeerLost",
        Error::CollectiveMismatch { .. } => "CollectiveMismatch",
        Error::WorldEnded => "WorldEnded",
        Error::Team(_) => "TeamError",
        Error::Busy { .. } => "Busy",
        Error::Bootstrap { .. } => "BootstrapError",
        Error::Backend { .. } | Error::Fabric { .. } => "BackendError",
        Error::Capacity { .. } => "CapacityError",
        Error::Os { .. } => "OsError",
        _ => "Error",
    }
}

/// The PE an error names, for the exception's `pe` attribute.
fn named_pe(e: &Error) -> Option<usize> {
    match e {
        Error::PeerLost { pe, .. } | Error::CollectiveMismatch { pe, .. } => Some(*pe),
        Error::Timeout { pe, .. } | Error::Bootstrap { pe, .. } | Error::Fabric { pe, .. } => *pe,
        _ => None,
    }
}

/// Converts an rshmem error into the Python exception raised for it.
pub(crate) fn to_py(e: Error) -> PyErr {
    Python::with_gil(|py| {
        let made = class(py, class_name(&e)).and_then(|cls| {
            let exc = cls.call1((e.to_string(),))?;
            exc.setattr("pe", named_pe(&e))?;
            Ok(PyErr::from_value(exc))
        });
        // Without the Python half (a broken install) the message still reaches the caller.
        made.unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
    })
}

/// `?` on rshmem results inside Python-facing functions.
pub(crate) trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for rshmem::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// An `rshmem.InvalidArgument` (also a `ValueError`) with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(Error::InvalidArgument(msg.into()))
}
