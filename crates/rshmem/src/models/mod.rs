//! Loom models of the CUDA kernels' cross-PE protocols (no GPU needed):
//! `RUSTFLAGS="--cfg loom" cargo test -p rshmem --release --lib loom_ -- --test-threads 1`.
//!
//! Each PE's kernel sequence on its stream is one loom thread, step by step as the kernels do
//! it; device memory words are loom atomics with the orderings of the PTX (`red.add.release`
//! → `fetch_add(Release)`, `st.release` → `store(Release)`, `ld.acquire` → `load(Acquire)`,
//! volatile and `atomicOr_system` → `Relaxed`, `fence.sc.sys` → `fence(SeqCst)`,
//! `fence.acq_rel.sys` → `fence(AcqRel)`); data written with plain stores (rows, signature
//! slots) are loom `UnsafeCell`s, so loom flags every read or overwrite not ordered after the
//! write by the protocol (besides the value checks, which name the call a word came from).
//!
//! Abstractions, common to the models: a block is one thread (the kernels' block-wide loops
//! run in sequence; `__syncthreads` and the tid-0 fences become program order); the kernel
//! boundaries of one stream are program order (nothing stronger is assumed); a PE's memory
//! that only it touches (barrier expectations, `ctl` words other than the error word, skip
//! flags, the device failure flag) is thread-local state; a 6-word signature or a multi-word
//! record is one word (the words are written together before one release and read after one
//! acquire, so they behave as one). Each model's own abstractions are in its doc comment.
//! Device waits spin with `yield_now` (a hang shows up as loom's branch limit). The signature
//! slots and the rows are volatile or plain stores in the kernels; as `UnsafeCell`s the model
//! is stricter (any unordered access fails, not only one that reads a wrong value).
//!
//! Exploration is bounded by loom's preemption bound, set per model so that all of them run in
//! well under a minute on two cores (switches where a thread waits are never bounded); a
//! deeper run: `LOOM_MAX_PREEMPTIONS=2` (every model; the 3-PE ones then take hours).
//!
//! One file per protocol: `barrier`, `signature`, `ll`, `chain`, `ep`; the shared helpers here.

mod barrier;
mod chain;
mod ep;
mod ll;
mod signature;

use barrier::*;
use signature::*;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;

/// Words written with plain (weak) stores: loom checks that every access is ordered.
pub(super) struct Cells(Vec<UnsafeCell<u64>>);
// SAFETY: every access goes through loom's UnsafeCell checks; the protocols under test are
// what orders them, and loom fails the model when they do not.
unsafe impl Sync for Cells {}
// SAFETY: as above.
unsafe impl Send for Cells {}

impl Cells {
    pub(super) fn new(n: usize) -> Cells {
        Cells((0..n).map(|_| UnsafeCell::new(0)).collect())
    }
    pub(super) fn put(&self, i: usize, v: u64) {
        // SAFETY: loom checks this write against every other access of the word.
        self.0[i].with_mut(|p| unsafe { *p = v });
    }
    pub(super) fn get(&self, i: usize) -> u64 {
        // SAFETY: loom checks this read against every write of the word.
        self.0[i].with(|p| unsafe { *p })
    }
}

pub(super) fn words(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// A device wait (`rshmemi_wait64` without timeout): polls until `ready`.
pub(super) fn spin(ready: impl Fn() -> bool) {
    while !ready() {
        loom::thread::yield_now();
    }
}

pub(super) fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.max_branches = 100_000;
    b
}
