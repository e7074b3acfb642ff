//! The GPU's half of operations to PEs on other nodes: a ring of requests in mapped host
//! memory that kernels post into and this PE's proxy thread drains (the transport, which
//! carries the requests over the fabric, lives in `transport/fabric/proxy.rs`).
//!
//! A PE on another node has base 0 in the device's heap base table, which is how the device
//! header's put, put-with-signal, signal and get functions tell it from a PE reached over
//! NVLink or P2P. For such a PE a thread reserves a ticket (a device atomic on the head word
//! in this PE's sync area), waits for room (the proxy's `done` counter, bounded by the device
//! timeout), writes the entry's fields and then its tag (`ticket + 1`) with release
//! semantics. The proxy takes entries in ticket order, carries each out (completely: the data
//! is in the target's GPU memory) and advances `done`. Device quiet waits until `done` covers
//! every ticket issued; a blocking put waits for its own. When the proxy fails a request (a
//! lost peer, a timeout) it stores `1 + pe` in the ring's error word: device waits then stop
//! and flag a timeout naming that PE, later requests are completed without being carried out,
//! and the host's quiet reports the proxy's error.
//!
//! Ring memory, in 64-bit words (`RSHMEMI_RING_*` in the device header):
//!
//! | words | what |
//! | --- | --- |
//! | 0 | `done`: requests completed (written by the proxy) |
//! | 8 | error: 0, or 1 + the PE a failed request was for |
//! | 16 + 8 k.. | entry k of [`RING_ENTRIES`]: tag, op word, dst, src, len, signal offset, signal value, reserved |

use super::ffi::{self, cu};
use super::gpu::{Gpu, HostBuf, RawStream};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Entries of the ring (`RSHMEMI_RING_ENTRIES`).
pub(crate) const RING_ENTRIES: usize = 256;
/// Word of the `done` counter.
const W_DONE: usize = 0;
/// Word of the error word.
const W_ERR: usize = 8;
/// Word of the first entry.
const W_FIRST: usize = 16;
/// Words of an entry.
const ENTRY_WORDS: usize = 8;
/// Words of the whole ring.
pub(crate) const RING_WORDS: usize = W_FIRST + RING_ENTRIES * ENTRY_WORDS;

/// Word of this PE's sync area error line holding the ring's device address (0: no ring).
pub(crate) const ERR_LINE_RING: usize = 2;
/// Word of the error line holding the head (tickets issued; device atomics only), right after
/// the ring's address (both are set together at start-up).
pub(crate) const ERR_LINE_HEAD: usize = 3;
const _: () = assert!(ERR_LINE_HEAD == ERR_LINE_RING + 1);

/// Request kinds (`RSHMEMI_OP_*`).
pub(crate) const OP_PUT: u64 = 1;
pub(crate) const OP_PUT_SIGNAL: u64 = 2;
pub(crate) const OP_SIGNAL: u64 = 3;
pub(crate) const OP_GET: u64 = 4;
pub(crate) const OP_PUT_INLINE: u64 = 5;

/// A request a kernel posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingRequest {
    /// `len` bytes from device address `src` into PE `pe`'s heap at offset `dst`, then the
    /// signal if there is one.
    Put {
        pe: usize,
        dst: usize,
        src: u64,
        len: usize,
        signal: Option<RingSignal>,
    },
    /// `len` (at most 8) bytes carried in the request (`value`, little-endian) into PE `pe`'s
    /// heap at offset `dst` (device `p`).
    PutInline {
        pe: usize,
        dst: usize,
        value: u64,
        len: usize,
    },
    /// The signal alone.
    Signal { pe: usize, signal: RingSignal },
    /// `len` bytes of PE `pe`'s heap from offset `src` into device address `dst`.
    Get {
        pe: usize,
        dst: u64,
        src: usize,
        len: usize,
    },
    /// An entry no header of this version writes (completed without effect).
    Malformed,
}

/// A signal update: `add` or set `value` at heap offset `offset` (the sync area after the heap
/// included: device barriers' arrivals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingSignal {
    pub offset: usize,
    pub value: u64,
    pub add: bool,
}

impl RingRequest {
    /// The request of entry words `w[1..7]`.
    fn decode(w: &[u64; ENTRY_WORDS]) -> RingRequest {
        let (op, add, pe) = (w[1] & 0xff, (w[1] >> 8) & 1 == 1, (w[1] >> 32) as usize);
        let signal = RingSignal {
            offset: w[5] as usize,
            value: w[6],
            add,
        };
        match op {
            OP_PUT | OP_PUT_SIGNAL => RingRequest::Put {
                pe,
                dst: w[2] as usize,
                src: w[3],
                len: w[4] as usize,
                signal: (op == OP_PUT_SIGNAL).then_some(signal),
            },
            OP_PUT_INLINE if w[4] <= 8 => RingRequest::PutInline {
                pe,
                dst: w[2] as usize,
                value: w[3],
                len: w[4] as usize,
            },
            OP_SIGNAL => RingRequest::Signal { pe, signal },
            OP_GET => RingRequest::Get {
                pe,
                dst: w[2],
                src: w[3] as usize,
                len: w[4] as usize,
            },
            _ => RingRequest::Malformed,
        }
    }

    /// The entry words a kernel writes for `self` (what the header's `rshmemi_proxy_post`
    /// stores; the tag word is left 0).
    pub fn encode(&self) -> [u64; ENTRY_WORDS] {
        let op = |code: u64, add: bool, pe: usize| code | (add as u64) << 8 | (pe as u64) << 32;
        match *self {
            RingRequest::Put {
                pe,
                dst,
                src,
                len,
                signal,
            } => {
                let s = signal.unwrap_or(RingSignal {
                    offset: 0,
                    value: 0,
                    add: false,
                });
                let code = if signal.is_some() {
                    OP_PUT_SIGNAL
                } else {
                    OP_PUT
                };
                [
                    0,
                    op(code, s.add, pe),
                    dst as u64,
                    src,
                    len as u64,
                    s.offset as u64,
                    s.value,
                    0,
                ]
            }
            RingRequest::PutInline {
                pe,
                dst,
                value,
                len,
            } => [
                0,
                op(OP_PUT_INLINE, false, pe),
                dst as u64,
                value,
                len as u64,
                0,
                0,
                0,
            ],
            RingRequest::Signal { pe, signal: s } => [
                0,
                op(OP_SIGNAL, s.add, pe),
                0,
                0,
                0,
                s.offset as u64,
                s.value,
                0,
            ],
            RingRequest::Get { pe, dst, src, len } => [
                0,
                op(OP_GET, false, pe),
                dst,
                src as u64,
                len as u64,
                0,
                0,
                0,
            ],
            RingRequest::Malformed => [0, 0xff, 0, 0, 0, 0, 0, 0],
        }
    }
}

/// The proxy's view of ring memory (`RING_WORDS` words at `words`).
#[derive(Debug)]
pub(crate) struct Ring {
    words: *mut u64,
}

// SAFETY: every access to ring memory is an atomic word access; the memory outlives the ring
// (owned by `DeviceRing`, or by the test that made it).
unsafe impl Send for Ring {}
// SAFETY: as for Send; the proxy is the only writer of `done` and the error word.
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `words` must point at `RING_WORDS` 8-aligned words that stay live while the ring is.
    pub unsafe fn new(words: *mut u64) -> Ring {
        Ring { words }
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        assert!(w < RING_WORDS, "ring word {w}");
        // SAFETY: inside the live ring memory (checked above), aligned; accessed atomically
        // by the host, by single stores and loads on the device.
        unsafe { AtomicU64::from_ptr(self.words.add(w)) }
    }

    /// Requests completed so far.
    pub fn done(&self) -> u64 {
        self.word(W_DONE).load(Ordering::Acquire)
    }

    /// The next request in ticket order once its tag says its fields are in; `None` when the
    /// next ticket has not been posted (yet).
    pub fn next(&self) -> Option<RingRequest> {
        let t = self.done();
        let e = W_FIRST + (t as usize % RING_ENTRIES) * ENTRY_WORDS;
        if self.word(e).load(Ordering::Acquire) != t + 1 {
            return None;
        }
        let mut w = [0u64; ENTRY_WORDS];
        for (k, x) in w.iter_mut().enumerate() {
            *x = self.word(e + k).load(Ordering::Relaxed);
        }
        Some(RingRequest::decode(&w))
    }

    /// Completes the request [`next`](Self::next) returned: its ticket's waiters go on.
    pub fn complete(&self) {
        self.word(W_DONE).fetch_add(1, Ordering::Release);
    }

    /// Records that a request for PE `pe` failed: device waits on the ring stop.
    pub fn fail(&self, pe: usize) {
        let _ = self.word(W_ERR).compare_exchange(
            0,
            pe as u64 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The PE a failed request was for, if any.
    pub fn failed(&self) -> Option<usize> {
        match self.word(W_ERR).load(Ordering::Acquire) {
            0 => None,
            p => Some(p as usize - 1),
        }
    }

    /// What a kernel's `rshmemi_proxy_post` does, for tests: the entry of ticket `t` (the
    /// ring must have room for it).
    #[cfg(test)]
    pub fn post(&self, t: u64, req: RingRequest) {
        let e = W_FIRST + (t as usize % RING_ENTRIES) * ENTRY_WORDS;
        let w = req.encode();
        for (k, x) in w.iter().enumerate().skip(1) {
            self.word(e + k).store(*x, Ordering::Relaxed);
        }
        self.word(e).store(t + 1, Ordering::Release);
    }
}

/// Bytes of the page-locked bounce buffer the proxy's copies go through.
const BOUNCE: usize = 512 << 10;

/// The ring of one PE in mapped host memory, and a stream of its own for the proxy's copies
/// between the GPU and the host, through a page-locked bounce buffer (DMA, rather than the
/// driver's pageable path), both behind one lock.
pub(crate) struct DeviceRing {
    _mem: HostBuf,
    /// The ring's address for kernels.
    pub dev: u64,
    pub ring: Ring,
    gpu: Arc<Gpu>,
    stream: Mutex<(RawStream, HostBuf)>,
}

impl std::fmt::Debug for DeviceRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRing")
            .field("dev", &self.dev)
            .finish()
    }
}

// SAFETY: the host buffer is process memory reached through `ring` (atomic words) only; the
// stream is used under its mutex.
unsafe impl Sync for DeviceRing {}

/// Copies between this PE's GPU and host memory, as the proxy makes them for ring requests (a
/// put's source out of the GPU, a get's data into it).
pub(crate) trait DeviceCopy {
    /// `dst.len()` bytes from device address `src`.
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    /// `src` to device address `dst`.
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()>;
}

impl DeviceRing {
    /// A zeroed ring on `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> Result<DeviceRing> {
        let mem = HostBuf::zeroed(gpu, RING_WORDS * 8)?;
        let dev = mem.device_ptr()?;
        // SAFETY: the buffer holds RING_WORDS zeroed words, page-aligned, owned by the value
        // returned (it outlives `ring`: fields drop after use, and nothing else keeps `ring`).
        let ring = unsafe { Ring::new(mem.host_ptr().cast()) };
        Ok(DeviceRing {
            _mem: mem,
            dev,
            ring,
            gpu: gpu.clone(),
            stream: Mutex::new((RawStream::new(gpu)?, HostBuf::zeroed(gpu, BOUNCE)?)),
        })
    }
}

impl DeviceCopy for DeviceRing {
    /// Copies on the proxy's own stream, which runs beside waiting kernels, a bounce buffer at
    /// a time.
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let guard = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let (s, bounce) = &*guard;
        let _g = self.gpu.bind()?;
        for (k, d) in dst.chunks_mut(BOUNCE).enumerate() {
            let from = src + (k * BOUNCE) as u64;
            // SAFETY: `from` lies in the device range a kernel of this PE posted as the source
            // of its put (valid until the put completes, which waits for this copy); the bounce
            // buffer holds BOUNCE bytes, used only under the lock, until the copy is synchronised.
            ffi::check(
                unsafe { cu::cuMemcpyDtoHAsync_v2(bounce.host_ptr().cast(), from, d.len(), s.raw) },
                "cuMemcpyDtoHAsync (proxy put)",
            )?;
            s.sync()?;
            d.copy_from_slice(&bounce.bytes()[..d.len()]);
        }
        Ok(())
    }

    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        let guard = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let (s, bounce) = &*guard;
        let _g = self.gpu.bind()?;
        for (k, c) in src.chunks(BOUNCE).enumerate() {
            // SAFETY: the bounce buffer holds BOUNCE bytes, written only under the lock while
            // no copy reads it (the previous one was synchronised).
            unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), bounce.host_ptr(), c.len()) };
            let to = dst + (k * BOUNCE) as u64;
            // SAFETY: `to` lies in the device range a kernel of this PE posted as its get's
            // destination (valid until the get completes); the bounce buffer is not written
            // again before this copy is synchronised.
            ffi::check(
                unsafe { cu::cuMemcpyHtoDAsync_v2(to, bounce.host_ptr().cast(), c.len(), s.raw) },
                "cuMemcpyHtoDAsync (proxy get)",
            )?;
            s.sync()?;
        }
        Ok(())
    }
}

impl super::CudaBackend {
    /// Whether PE `pe` runs on another node (reached through the proxy).
    pub(crate) fn is_remote(&self, pe: usize) -> bool {
        self.remote.get(pe).copied().unwrap_or(false)
    }

    /// The ring's tickets issued by kernels (the head word in this PE's sync area) and
    /// requests the proxy completed (`done`); `None` in a world on one node. For diagnostics:
    /// head above done is requests the proxy has not carried out (yet).
    pub(crate) fn ring_counts(&self) -> Result<Option<(u64, u64)>> {
        let Some(ring) = &self.ring else {
            return Ok(None);
        };
        let mut head = [0u8; 8];
        let at = self.heap_size + (self.layout.err() + ERR_LINE_HEAD) * 8;
        crate::backend::Backend::get(self, self.me, at, &mut head)?;
        Ok(Some((u64::from_le_bytes(head), ring.ring.done())))
    }

    /// Enqueues on `stream` `req`, a request to a PE on another node through this PE's proxy,
    /// waited for on the stream: a one-thread kernel posts it and waits for its completion, so
    /// the stream's later work starts after it (a kernel node when captured in a graph).
    pub(crate) fn proxy_on_stream(&self, stream: &RawStream, req: RingRequest) -> Result<()> {
        let w = req.encode();
        let mut op = w[1] & 0xffff_ffff;
        let mut pe = (w[1] >> 32) as i32;
        let [_, _, mut dst, mut src, mut len, mut so, mut sv, _] = w;
        let mut p = [
            &mut op as *mut u64 as *mut std::ffi::c_void,
            &mut pe as *mut i32 as *mut _,
            &mut dst as *mut u64 as *mut _,
            &mut src as *mut u64 as *mut _,
            &mut len as *mut u64 as *mut _,
            &mut so as *mut u64 as *mut _,
            &mut sv as *mut u64 as *mut _,
        ];
        // SAFETY: the parameters match rshmemi_proxy_op(u64, int, u64, u64, u64, u64, u64);
        // the target's proxy checks the range there, and this PE's device addresses are the
        // caller's checked symmetric ranges.
        unsafe { super::gpu::launch(stream, self.f_proxy, 1, 32, 0, &mut p) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_mem() -> Vec<u64> {
        vec![0u64; RING_WORDS]
    }

    #[test]
    fn requests_round_trip_through_entry_words() {
        let reqs = [
            RingRequest::Put {
                pe: 3,
                dst: 4096,
                src: 0x7f00_0000_1000,
                len: 123_457,
                signal: None,
            },
            RingRequest::Put {
                pe: 70_000,
                dst: 8,
                src: 0xdead_beef,
                len: 1,
                signal: Some(RingSignal {
                    offset: 1 << 33,
                    value: u64::MAX,
                    add: true,
                }),
            },
            RingRequest::Signal {
                pe: 0,
                signal: RingSignal {
                    offset: 16,
                    value: 7,
                    add: false,
                },
            },
            RingRequest::PutInline {
                pe: 2,
                dst: 6,
                value: 0xabcd,
                len: 2,
            },
            RingRequest::Get {
                pe: 1,
                dst: 0x1234_5678_9abc,
                src: 72,
                len: 1 << 20,
            },
        ];
        for r in reqs {
            assert_eq!(RingRequest::decode(&r.encode()), r);
        }
        assert_eq!(
            RingRequest::decode(&RingRequest::Malformed.encode()),
            RingRequest::Malformed
        );
        // An inline put longer than its 8-byte carrier is malformed, not a read past it.
        let long = RingRequest::PutInline {
            pe: 0,
            dst: 0,
            value: 0,
            len: 9,
        };
        assert_eq!(RingRequest::decode(&long.encode()), RingRequest::Malformed);
    }

    #[test]
    fn the_proxy_takes_requests_in_ticket_order_and_only_once_tagged() {
        let mut mem = ring_mem();
        // SAFETY: `mem` holds RING_WORDS words and outlives the ring.
        let ring = unsafe { Ring::new(mem.as_mut_ptr()) };
        assert_eq!(ring.next(), None, "empty ring");
        let put = |pe: usize, len: usize| RingRequest::Put {
            pe,
            dst: 64 * pe,
            src: 0x1000,
            len,
            signal: None,
        };
        // Ticket 1 is tagged before ticket 0: nothing is taken until 0 is in.
        ring.post(1, put(1, 20));
        assert_eq!(ring.next(), None, "ticket 0 not posted yet");
        ring.post(0, put(0, 10));
        assert_eq!(ring.next(), Some(put(0, 10)));
        assert_eq!(ring.next(), Some(put(0, 10)), "taken again until completed");
        ring.complete();
        assert_eq!(ring.done(), 1);
        assert_eq!(ring.next(), Some(put(1, 20)));
        ring.complete();
        assert_eq!(ring.next(), None);
        // Around the ring several times: every ticket's entry reused with a new tag, never
        // confused with the tag of the round before.
        for t in 2..(3 * RING_ENTRIES as u64 + 5) {
            ring.post(t, put(t as usize % 5, t as usize));
            assert_eq!(
                ring.next(),
                Some(put(t as usize % 5, t as usize)),
                "ticket {t}"
            );
            ring.complete();
            assert_eq!(ring.next(), None, "after ticket {t}");
        }
        assert_eq!(ring.done(), 3 * RING_ENTRIES as u64 + 5);
    }

    #[test]
    fn a_failure_names_the_first_pe_only() {
        let mut mem = ring_mem();
        // SAFETY: as above.
        let ring = unsafe { Ring::new(mem.as_mut_ptr()) };
        assert_eq!(ring.failed(), None);
        ring.fail(0);
        ring.fail(5);
        assert_eq!(ring.failed(), Some(0), "PE 0 is 1 in the word, not 'none'");
        ring.post(0, RingRequest::Malformed);
        assert_eq!(ring.next(), Some(RingRequest::Malformed));
    }

    #[test]
    fn the_ring_fits_the_layout_the_header_uses() {
        let h = super::super::nvrtc::with_header("");
        for (name, v) in [
            ("RSHMEMI_RING_DONE", W_DONE),
            ("RSHMEMI_RING_ERR", W_ERR),
            ("RSHMEMI_RING_FIRST", W_FIRST),
            ("RSHMEMI_RING_ENTRIES", RING_ENTRIES),
            ("RSHMEMI_RING_ERR_LINE_RING", ERR_LINE_RING),
            ("RSHMEMI_RING_ERR_LINE_HEAD", ERR_LINE_HEAD),
            ("RSHMEMI_OP_PUT", OP_PUT as usize),
            ("RSHMEMI_OP_PUT_SIGNAL", OP_PUT_SIGNAL as usize),
            ("RSHMEMI_OP_SIGNAL", OP_SIGNAL as usize),
            ("RSHMEMI_OP_GET", OP_GET as usize),
            ("RSHMEMI_OP_PUT_INLINE", OP_PUT_INLINE as usize),
        ] {
            let line = format!("#define {name} {v}\n");
            assert!(h.contains(&line), "the header lacks `{}`", line.trim());
        }
    }
}
