//! The calling thread's PE, and the entry points of the calls a program makes in its inner
//! loops (`rshmem.put`, `get`, `put_signal`, `wait_until`, `barrier`, `quiet`, `fence`,
//! `all_reduce`): the PE is found and plain operands (and a `stream=` of the PE's GPU) are read
//! here (`fast.rs`), and the call goes straight to the library with no Python code in between.
//! Anything else (another kind of operand or stream, an argument of another type, an operand
//! of another device, no PE) goes to the Python layer's checked function of the same name with
//! the same arguments, which raises the precise error or serves the call. Errors of the call
//! itself (an operand off the symmetric heap, a freed tensor) are the same on both paths: they
//! come from the same native calls.

use crate::fast::{name_of, plain_index, Operand};
use crate::world::World;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyString, PyTuple};
use rshmem::ElemKind;
use std::cell::RefCell;
use std::sync::Mutex;

thread_local! {
    /// The PE of a thread-PE (`rshmem.launch` sets it for each of its threads).
    static THREAD: RefCell<Option<Py<World>>> = const { RefCell::new(None) };
}

/// The process's PE (`rshmem.init`).
static PROCESS: Mutex<Option<Py<World>>> = Mutex::new(None);

/// Sets (or clears, `None`) the calling thread's PE (`thread`) or the process's.
#[pyfunction]
#[pyo3(signature = (world, thread))]
pub(crate) fn set_world(world: Option<Py<World>>, thread: bool) {
    let old = if thread {
        THREAD.with(|c| c.replace(world))
    } else {
        std::mem::replace(
            &mut *PROCESS.lock().unwrap_or_else(|e| e.into_inner()),
            world,
        )
    };
    // Dropped here, after the locks (its last reference may end the PE's state).
    drop(old);
}

/// The calling thread's PE if it has one, else the process's (`thread`: only the thread's,
/// `False`: only the process's); either may have ended.
#[pyfunction]
#[pyo3(signature = (thread=None))]
pub(crate) fn current_world(py: Python<'_>, thread: Option<bool>) -> Option<Py<World>> {
    let of_thread = || THREAD.with(|c| c.borrow().as_ref().map(|w| w.clone_ref(py)));
    let of_process = || {
        PROCESS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|w| w.clone_ref(py))
    };
    match thread {
        Some(true) => of_thread(),
        Some(false) => of_process(),
        None => of_thread().or_else(of_process),
    }
}

/// The calling thread's PE, if it has one that has not ended.
fn live_world(py: Python<'_>) -> Option<Py<World>> {
    current_world(py, None).filter(|w| !w.get().is_ended())
}

/// The Python layer's modules holding the checked functions, imported once.
static OPS: GILOnceCell<Py<PyModule>> = GILOnceCell::new();
static COLL: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// Calls the checked function `name` of `rshmem._ops` (or `rshmem._coll` where `coll`).
fn checked<'py>(
    py: Python<'py>,
    coll: bool,
    name: &str,
    args: impl IntoPyObject<'py, Target = PyTuple>,
    kwargs: &[(&str, Option<&Bound<'py, PyAny>>)],
) -> PyResult<Bound<'py, PyAny>> {
    let (cell, module) = if coll {
        (&COLL, "rshmem._coll")
    } else {
        (&OPS, "rshmem._ops")
    };
    let m = cell.get_or_try_init(py, || py.import(module).map(Bound::unbind))?;
    let kw = PyDict::new(py);
    for &(k, v) in kwargs {
        if let Some(v) = v {
            kw.set_item(k, v)?;
        }
    }
    m.bind(py).getattr(name)?.call(args, Some(&kw))
}

/// The live world's fast path where it takes the call (`fast` returns true), else the checked
/// function `name` of `rshmem._ops` with `args` and `kwargs`.
fn fast_or_checked<'py>(
    py: Python<'py>,
    fast: impl FnOnce(&World) -> PyResult<bool>,
    name: &str,
    args: impl IntoPyObject<'py, Target = PyTuple>,
    kwargs: &[(&str, Option<&Bound<'py, PyAny>>)],
) -> PyResult<()> {
    if let Some(w) = live_world(py) {
        if fast(w.get())? {
            return Ok(());
        }
    }
    checked(py, false, name, args, kwargs).map(drop)
}

/// Where a value is a plain word: `int` extracted as `u64` (negative values wrap, as the
/// checked path's `& 0xFFFF_FFFF_FFFF_FFFF`), else `None`.
fn word(v: &Bound<'_, PyAny>) -> Option<u64> {
    v.extract::<u64>()
        .ok()
        .or_else(|| v.extract::<i64>().ok().map(|x| x as u64))
}

/// The string argument `s` if it is one of `names` (the canonical spelling of each), else
/// `None`.
fn one_of(s: &Bound<'_, PyAny>, names: &[(&str, &'static str)]) -> Option<&'static str> {
    let s = s.downcast::<PyString>().ok()?.to_cow().ok()?;
    names.iter().find(|&&(n, _)| n == s).map(|&(_, c)| c)
}

const CMPS: [(&str, &str); 12] = [
    ("==", "eq"),
    ("!=", "ne"),
    (">", "gt"),
    (">=", "ge"),
    ("<", "lt"),
    ("<=", "le"),
    ("eq", "eq"),
    ("ne", "ne"),
    ("gt", "gt"),
    ("ge", "ge"),
    ("lt", "lt"),
    ("le", "le"),
];

const SIGNAL_OPS: [(&str, &str); 2] = [("set", "set"), ("add", "add")];

const REDUCE_OPS: [(&str, &str); 7] = [
    ("sum", "sum"),
    ("prod", "prod"),
    ("min", "min"),
    ("max", "max"),
    ("band", "band"),
    ("bor", "bor"),
    ("bxor", "bxor"),
];

impl World {
    /// Two operands of the same element type and size, and a plain PE.
    fn plain_pair(
        &self,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
        write_dst: bool,
    ) -> PyResult<Option<(Operand, Operand, usize)>> {
        let Some(pe) = plain_index(pe, self.world_size()) else {
            return Ok(None);
        };
        let (Some(d), Some(s)) = (self.operand(dst, write_dst)?, self.operand(src, false)?) else {
            return Ok(None);
        };
        Ok((d.kind == s.kind && d.nbytes == s.nbytes).then_some((d, s, pe)))
    }

    fn put_plain(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some((d, s, pe)) = self.plain_pair(dst, src, pe, false)? else {
            return Ok(false);
        };
        let Some(stream) = self.stream_of(py, stream)? else {
            return Ok(false);
        };
        if self.is_cuda() {
            self.put_dev(py, d.addr, s.addr, d.nbytes, pe, stream)?;
        } else {
            self.put(py, d.addr, s.addr as usize, s.nbytes, pe)?;
        }
        Ok(true)
    }

    fn get_plain(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some((d, s, pe)) = self.plain_pair(dst, src, pe, true)? else {
            return Ok(false);
        };
        let Some(stream) = self.stream_of(py, stream)? else {
            return Ok(false);
        };
        if self.is_cuda() {
            self.get_dev(py, d.addr, s.addr, d.nbytes, pe, stream)?;
        } else {
            self.get(py, d.addr as usize, d.nbytes, s.addr, pe)?;
        }
        Ok(true)
    }

    #[allow(clippy::too_many_arguments)]
    fn put_signal_plain(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        signal: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        pe: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some((d, s, pe)) = self.plain_pair(dst, src, pe, false)? else {
            return Ok(false);
        };
        let Some(g) = self.operand(signal, false)? else {
            return Ok(false);
        };
        let (Some(v), Some(op)) = (word(value), one_of(op, &SIGNAL_OPS)) else {
            return Ok(false);
        };
        // An empty data part has the checked path's own handling (torch's address 0).
        if !matches!(g.kind, ElemKind::U64 | ElemKind::I64) || g.nbytes < 8 || d.nbytes == 0 {
            return Ok(false);
        }
        let Some(stream) = self.stream_of(py, stream)? else {
            return Ok(false);
        };
        if self.is_cuda() {
            self.put_signal_dev(py, d.addr, s.addr, d.nbytes, g.addr, v, op, pe, stream)?;
        } else {
            self.put_signal(py, d.addr, s.addr as usize, s.nbytes, g.addr, v, op, pe)?;
        }
        Ok(true)
    }

    /// `Some` of what the call returns (the value seen on the host, `None` on the GPU), or
    /// `None` where the call is not plain.
    fn wait_until_plain(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        cmp: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyObject>> {
        let (Some(o), Some(c)) = (self.operand(t, false)?, one_of(cmp, &CMPS)) else {
            return Ok(None);
        };
        let size = match o.kind {
            ElemKind::I32 | ElemKind::U32 => 4,
            ElemKind::I64 | ElemKind::U64 => 8,
            _ => return Ok(None),
        };
        if o.nbytes < size {
            return Ok(None);
        }
        if self.is_cuda() {
            let (Some(v), Some(stream), 8) = (word(value), self.stream_of(py, stream)?, size)
            else {
                return Ok(None);
            };
            self.wait_until_dev(py, o.addr, c, v, stream)?;
            return Ok(Some(py.None()));
        }
        let timeout = match timeout {
            None => None,
            Some(t) => match t.extract::<f64>() {
                Ok(t) => Some(t),
                Err(_) => return Ok(None),
            },
        };
        match self.wait_until(py, o.addr, name_of(o.kind), c, value.clone(), timeout) {
            Ok(v) => Ok(Some(v)),
            // A value the element type cannot hold: nothing ran; the checked path explains.
            Err(e)
                if e.is_instance_of::<PyOverflowError>(py)
                    || e.is_instance_of::<PyTypeError>(py) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn all_reduce_plain(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let (Some(o), Some(op)) = (self.operand(t, true)?, one_of(op, &REDUCE_OPS)) else {
            return Ok(false);
        };
        let Some(stream) = self.stream_of(py, stream)? else {
            return Ok(false);
        };
        let es = o.kind.size();
        let (name, count) = (name_of(o.kind), o.nbytes / es);
        let (a, n) = (o.addr, o.nbytes);
        if self.is_cuda() {
            self.collective_dev(
                py,
                "all_reduce",
                name,
                a,
                n,
                a,
                n,
                count,
                Some(op),
                0,
                stream,
            )?;
        } else {
            self.collective(py, "all_reduce", name, a, n, a, n, count, Some(op), 0)?;
        }
        Ok(true)
    }

    /// The plain form of barrier and quiet: this PE's stream on the CUDA backend.
    fn sync_plain(
        &self,
        py: Python<'_>,
        barrier: bool,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some(stream) = self.stream_of(py, stream)? else {
            return Ok(false);
        };
        match (self.is_cuda(), barrier) {
            (true, true) => self.barrier_dev(py, stream)?,
            (true, false) => self.quiet_dev(py, stream)?,
            (false, true) => self.barrier(py)?,
            (false, false) => self.quiet(py)?,
        }
        Ok(true)
    }
}

/// Copies ``src`` into PE ``pe``'s copy of symmetric ``dst`` (same dtype and size; any
/// contiguous slice of a symmetric tensor). Host: returns when ``src`` may be reused
/// (delivery by ``quiet`` or ``barrier``); GPU: ``src`` must be symmetric too, stream-ordered
/// on ``torch.cuda.current_stream()`` or ``stream``.
#[pyfunction]
#[pyo3(signature = (dst, src, pe, *, stream=None))]
pub(crate) fn put<'py>(
    py: Python<'py>,
    dst: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    pe: &Bound<'py, PyAny>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    fast_or_checked(
        py,
        |w| w.put_plain(py, dst, src, pe, stream),
        "put",
        (dst, src, pe),
        &[("stream", stream)],
    )
}

/// Copies PE ``pe``'s copy of symmetric ``src`` into ``dst`` (host: any contiguous writable
/// array; GPU: symmetric, stream-ordered on the current stream or ``stream``).
#[pyfunction]
#[pyo3(signature = (dst, src, pe, *, stream=None))]
pub(crate) fn get<'py>(
    py: Python<'py>,
    dst: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    pe: &Bound<'py, PyAny>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    fast_or_checked(
        py,
        |w| w.get_plain(py, dst, src, pe, stream),
        "get",
        (dst, src, pe),
        &[("stream", stream)],
    )
}

/// Puts ``src`` into ``dst`` on PE ``pe``, then sets (``op="set"``) or adds (``"add"``)
/// ``value`` to the first word of symmetric ``signal`` (uint64/int64) there: whoever sees the
/// signal sees the data.
#[pyfunction]
#[pyo3(signature = (dst, src, signal, value, pe, *, op=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn put_signal<'py>(
    py: Python<'py>,
    dst: &Bound<'py, PyAny>,
    src: &Bound<'py, PyAny>,
    signal: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    pe: &Bound<'py, PyAny>,
    op: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    let fast = |w: &World| {
        let set = PyString::new(py, "set").into_any();
        w.put_signal_plain(py, dst, src, signal, value, pe, op.unwrap_or(&set), stream)
    };
    let args = (dst, src, signal, value, pe);
    fast_or_checked(
        py,
        fast,
        "put_signal",
        args,
        &[("op", op), ("stream", stream)],
    )
}

/// Waits until this PE's first element of symmetric ``t`` compares true (``cmp`` one of
/// ``== != > >= < <=``) with ``value``. Host: int32/uint32/int64/uint64, returns the value
/// seen, raises ``Timeout`` after ``timeout`` seconds (default the world's) and ``PeerLost``
/// if a peer dies; the GIL is released while waiting. GPU: uint64/int64, stream-ordered
/// (returns None; a device timeout is raised by ``check_errors``).
#[pyfunction]
#[pyo3(signature = (t, cmp, value, *, timeout=None, stream=None))]
pub(crate) fn wait_until<'py>(
    py: Python<'py>,
    t: &Bound<'py, PyAny>,
    cmp: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    timeout: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<PyObject> {
    if let Some(w) = live_world(py) {
        if let Some(v) = w
            .get()
            .wait_until_plain(py, t, cmp, value, timeout, stream)?
        {
            return Ok(v);
        }
    }
    let kw = [("timeout", timeout), ("stream", stream)];
    Ok(checked(py, false, "wait_until", (t, cmp, value), &kw)?.unbind())
}

/// Barrier of every PE after completing this PE's operations (torch.distributed's
/// signature; ``group`` must be None, ``async_op`` False, ``device_ids`` is ignored). Host:
/// blocks (the GIL is released); GPU: stream-ordered on the current or given stream.
#[pyfunction]
#[pyo3(signature = (group=None, async_op=None, device_ids=None, *, stream=None))]
pub(crate) fn barrier<'py>(
    py: Python<'py>,
    group: Option<&Bound<'py, PyAny>>,
    async_op: Option<&Bound<'py, PyAny>>,
    device_ids: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    let sync = async_op.map_or(Ok(true), |a| a.is_truthy().map(|t| !t))?;
    if let (None, true, Some(w)) = (group, sync, live_world(py)) {
        if w.get().sync_plain(py, true, stream)? {
            return Ok(());
        }
    }
    let none = py.None().into_bound(py);
    let args = (group.unwrap_or(&none), !sync, device_ids.unwrap_or(&none));
    checked(py, true, "barrier", args, &[("stream", stream)]).map(drop)
}

/// Completes this PE's outstanding operations (GPU: stream-ordered).
#[pyfunction]
#[pyo3(signature = (*, stream=None))]
pub(crate) fn quiet<'py>(py: Python<'py>, stream: Option<&Bound<'py, PyAny>>) -> PyResult<()> {
    fast_or_checked(
        py,
        |w| w.sync_plain(py, false, stream),
        "quiet",
        (),
        &[("stream", stream)],
    )
}

/// Orders this PE's earlier puts and atomics to each PE before later ones to that PE.
#[pyfunction]
pub(crate) fn fence(py: Python<'_>) -> PyResult<()> {
    match live_world(py) {
        Some(w) => w.get().fence(py),
        None => checked(py, false, "fence", (), &[]).map(drop),
    }
}

/// Folds every PE's ``tensor`` with ``op`` into every PE's ``tensor`` (in place), or into
/// ``out`` (same shape and dtype) when given. ``group`` must be None (the world) and
/// ``async_op`` False (GPU calls are stream-ordered on the current stream or ``stream``).
#[pyfunction]
#[pyo3(signature = (tensor, op=None, group=None, async_op=None, *, out=None, stream=None))]
pub(crate) fn all_reduce<'py>(
    py: Python<'py>,
    tensor: &Bound<'py, PyAny>,
    op: Option<&Bound<'py, PyAny>>,
    group: Option<&Bound<'py, PyAny>>,
    async_op: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    let sync = async_op.map_or(Ok(true), |a| a.is_truthy().map(|t| !t))?;
    if let (None, None, true, Some(w)) = (group, out, sync, live_world(py)) {
        let sum = PyString::new(py, "sum").into_any();
        if w.get()
            .all_reduce_plain(py, tensor, op.unwrap_or(&sum), stream)?
        {
            return Ok(());
        }
    }
    let none = py.None().into_bound(py);
    let sum = PyString::new(py, "sum").into_any();
    let args = (tensor, op.unwrap_or(&sum), group.unwrap_or(&none), !sync);
    checked(
        py,
        true,
        "all_reduce",
        args,
        &[("out", out), ("stream", stream)],
    )
    .map(drop)
}
