//! The staged transport without a GPU: request words, the serving of requests on a heap in host
//! memory (a stand-in for the GPU heap behind the same `Backend` calls), and whole round trips
//! between thread-PEs over loopback tcp, each serving the other from a thread as the proxy does.

use super::*;
use crate::bootstrap::{Bootstrap, InProcBootstrap};
use crate::config::BackendKind;
use crate::transport::fabric::tests::{loopback, random_bytes, skip};
use std::sync::atomic::AtomicBool;

/// A heap in host memory behind the backend calls the proxy makes on its own GPU heap.
#[derive(Debug)]
pub(crate) struct HostHeap(Mutex<Vec<u8>>);

impl HostHeap {
    fn new(len: usize) -> HostHeap {
        HostHeap(Mutex::new(vec![0xee; len]))
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
    /// Where the heap's bytes lie (they never move: the vector is never resized).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.lock().unwrap().as_mut_ptr()
    }
}

impl Backend for HostHeap {
    fn kind(&self) -> BackendKind {
        BackendKind::Shm
    }
    fn put(&self, _pe: usize, offset: usize, src: &[u8]) -> Result<()> {
        self.0.lock().unwrap()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn get(&self, _pe: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        dst.copy_from_slice(&self.0.lock().unwrap()[offset..offset + dst.len()]);
        Ok(())
    }
    fn atomic(&self, _pe: usize, offset: usize, wide: bool, op: AtomicOp) -> Result<u64> {
        let mut h = self.0.lock().unwrap();
        let n = if wide { 8 } else { 4 };
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&h[offset..offset + n]);
        let old = u64::from_le_bytes(b);
        let mask = if wide { u64::MAX } else { 0xffff_ffff };
        let new = match op {
            AtomicOp::Fetch => old,
            AtomicOp::Set(v) | AtomicOp::Swap(v) => v,
            AtomicOp::CompareSwap { cond, value } => {
                if old == cond & mask {
                    value
                } else {
                    old
                }
            }
            AtomicOp::FetchAdd(v) => old.wrapping_add(v),
            AtomicOp::FetchAnd(v) => old & v,
            AtomicOp::FetchOr(v) => old | v,
            AtomicOp::FetchXor(v) => old ^ v,
        } & mask;
        h[offset..offset + n].copy_from_slice(&new.to_le_bytes()[..n]);
        Ok(if matches!(op, AtomicOp::Set(_)) {
            0
        } else {
            old
        })
    }
    fn fence(&self) {}
    fn quiet(&self) -> Result<()> {
        Ok(())
    }
}

#[test]
fn requests_round_trip_through_header_words() {
    let ops = [
        AtomicOp::Fetch,
        AtomicOp::Set(u64::MAX),
        AtomicOp::Swap(3),
        AtomicOp::CompareSwap {
            cond: 1 << 40,
            value: 9,
        },
        AtomicOp::FetchAdd(7),
        AtomicOp::FetchAnd(0xf0),
        AtomicOp::FetchOr(1),
        AtomicOp::FetchXor(5),
    ];
    let mut reqs = vec![
        Request::Put {
            offset: 4096,
            len: STAGE_BYTES,
        },
        Request::Get {
            offset: usize::MAX >> 1,
            len: 1,
        },
    ];
    for (k, op) in ops.into_iter().enumerate() {
        reqs.push(Request::Atomic {
            offset: 8 * k,
            wide: k % 2 == 0,
            op,
        });
    }
    for r in reqs {
        assert_eq!(Request::decode(&r.encode()), Some(r));
    }
    assert_eq!(Request::decode(&[0, 0, 0, 0, 0, 0]), None, "no kind");
    assert_eq!(
        Request::decode(&[3 | 9 << 8, 0, 1, 0, 0, 0]),
        None,
        "no such atomic"
    );
}

#[test]
fn the_layout_keeps_slots_and_replies_apart() {
    for n in [1, 2, 3, 72] {
        let l = StageLayout::new(n);
        for s in 0..n {
            assert!(l.header(s) > l.slot(s) && l.slot_data(s) >= l.header(s) + 8 * HEADER_WORDS);
            assert_eq!(
                l.slot_data(s) + l.data,
                l.slot(s + 1),
                "slot {s} ends where {s}+1 starts"
            );
            assert_eq!(l.reply(s) % 64, 0);
        }
        assert!(l.reply(n - 1) + REPLY_LINE <= l.bytes());
        assert_eq!(l.bytes() % 4096, 0);
    }
}

#[test]
fn serving_moves_exact_bytes_and_refuses_what_lies_outside() {
    let heap = HostHeap::new(1 << 16);
    let limit = 1 << 16;
    let mut slot = random_bytes(1, 4096);
    let data = slot.clone();
    let ok = Reply {
        value: 0,
        status: STATUS_OK,
    };
    let put = Request::Put {
        offset: 1001,
        len: 3000,
    };
    assert_eq!(serve(&heap, 0, limit, put, &mut slot), ok);
    let h = heap.bytes();
    assert_eq!(&h[1001..4001], &data[..3000]);
    assert!(
        h[..1001].iter().chain(&h[4001..]).all(|&b| b == 0xee),
        "neighbours untouched"
    );
    // A get into a poisoned slot.
    let mut out = vec![0x55u8; 4096];
    let get = Request::Get {
        offset: 1001,
        len: 3000,
    };
    assert_eq!(serve(&heap, 0, limit, get, &mut out), ok);
    assert_eq!(&out[..3000], &data[..3000]);
    assert!(out[3000..].iter().all(|&b| b == 0x55));
    // Atomics, both widths, old values back.
    let at = |offset, wide, op| Request::Atomic { offset, wide, op };
    assert_eq!(
        serve(&heap, 0, limit, at(64, true, AtomicOp::Set(40)), &mut out).status,
        STATUS_OK
    );
    let r = serve(
        &heap,
        0,
        limit,
        at(64, true, AtomicOp::FetchAdd(2)),
        &mut out,
    );
    assert_eq!(
        r,
        Reply {
            value: 40,
            status: STATUS_OK
        }
    );
    let r = serve(&heap, 0, limit, at(68, false, AtomicOp::Fetch), &mut out);
    assert_eq!(r.value, 0, "high half of the 64-bit word");
    let r = serve(&heap, 0, limit, at(64, false, AtomicOp::Swap(9)), &mut out);
    assert_eq!(r.value, 42);
    // Refused: past the limit, longer than the slot, misaligned or overflowing atomics.
    let refused = |req| serve(&heap, 0, limit, req, &mut out.clone()).status == STATUS_REFUSED;
    let before = heap.bytes();
    assert!(refused(Request::Put {
        offset: limit - 10,
        len: 11
    }));
    assert!(refused(Request::Put {
        offset: 0,
        len: 4097
    }));
    assert!(refused(Request::Get {
        offset: usize::MAX - 2,
        len: 8
    }));
    assert!(refused(at(3, true, AtomicOp::Fetch)));
    assert!(refused(at(6, false, AtomicOp::Fetch)));
    assert!(refused(at(limit, true, AtomicOp::Set(1))));
    assert_eq!(heap.bytes(), before, "a refused request changes nothing");
}

/// Bytes of the control-block stand-in before the staging area.
const CTRL: usize = 4096;

/// `n` thread-PEs over loopback tcp, each with a staging area after a control block in its
/// registered segment and a heap of `heap` bytes served by a proxy-like thread (unless the PE
/// is in `silent`); runs `f(me, staged, heaps)`.
pub(crate) fn with_staged(
    n: usize,
    heap: usize,
    silent: &[usize],
    f: impl Fn(usize, &Staged, &[Arc<HostHeap>], &dyn Bootstrap) + Sync,
) {
    let hub = InProcBootstrap::new(n, Duration::from_secs(30)).expect("hub");
    let heaps: Vec<Arc<HostHeap>> = (0..n).map(|_| Arc::new(HostHeap::new(heap))).collect();
    std::thread::scope(|s| {
        for r in 0..n {
            let (hub, f, heaps) = (&hub, &f, &heaps);
            s.spawn(move || {
                let boot = hub.join(r).expect("join");
                let len = CTRL + StageLayout::new(n).bytes();
                let seg = crate::segment::Region::anonymous(len).expect("segment");
                let cfg = loopback(Duration::from_secs(20));
                let remote = (0..n).map(|p| p != r).collect();
                // SAFETY: the segment outlives the Net (dropped at the end of this closure).
                let net = unsafe { Net::open(&cfg, &boot, seg.ptr(), len, CTRL, remote) };
                let net = Arc::new(net.expect("fabric"));
                // SAFETY: the staging area lies after CTRL bytes of the live, page-aligned segment.
                let area = unsafe { Area::new(seg.ptr().add(CTRL), len - CTRL) };
                let staged = Staged::new(net, r, n, area, CTRL, Duration::from_secs(20));
                let stop = AtomicBool::new(false);
                std::thread::scope(|t| {
                    if !silent.contains(&r) {
                        t.spawn(|| {
                            let mut seen = vec![0u64; n];
                            while !stop.load(Ordering::Acquire) {
                                staged.net().progress();
                                if staged.serve_pending(&*heaps[r], heap, &mut seen) == 0 {
                                    std::thread::yield_now();
                                }
                            }
                        });
                    }
                    boot.barrier().expect("barrier");
                    f(r, &staged, heaps, &boot);
                    boot.barrier().expect("barrier");
                    stop.store(true, Ordering::Release);
                });
            });
        }
    });
}

#[test]
fn staged_put_get_and_atomics_reach_the_peers_heap_exactly() {
    if skip() {
        return;
    }
    let n = 3;
    let heap = 4 << 20;
    with_staged(n, heap, &[], |me, st, heaps, boot| {
        // A block spanning several requests, at an odd offset, into every other PE.
        let block = 2 * STAGE_BYTES + 12_345;
        let data = random_bytes(me as u64 + 10, block);
        let at = 7 + me * block;
        for t in (0..n).filter(|&t| t != me) {
            st.put(t, at, &data).expect("staged put");
            // In the target's heap when put returns: no further synchronisation.
            assert_eq!(
                &heaps[t].bytes()[at..at + block],
                &data[..],
                "put {me}->{t}"
            );
            let mut back = vec![0x11u8; block];
            st.get(t, at, &mut back).expect("staged get");
            assert_eq!(back, data, "get {me}<-{t}");
        }
        // Every PE adds into one word of every other PE: the sums come out exact.
        let word = heap - 64;
        for t in (0..n).filter(|&t| t != me) {
            for _ in 0..5 {
                st.atomic(t, word, true, AtomicOp::FetchAdd(1 + me as u64))
                    .expect("fetch-add");
            }
            let old = st
                .atomic(
                    t,
                    heap - 8,
                    false,
                    AtomicOp::CompareSwap {
                        cond: 0xeeee_eeee,
                        value: 1,
                    },
                )
                .expect("compare-swap");
            assert!(old == 0xeeee_eeee || old == 1, "32-bit old value {old:#x}");
        }
        boot.barrier().expect("barrier");
        let sum: u64 = (0..n)
            .filter(|&s| s != me)
            .map(|s| 5 * (1 + s as u64))
            .sum();
        let h = heaps[me].bytes();
        let got = u64::from_le_bytes(h[word..word + 8].try_into().unwrap());
        assert_eq!(
            got,
            0xeeee_eeee_eeee_eeee_u64.wrapping_add(sum),
            "PE {me}: every add landed once"
        );
        assert_eq!(
            &h[heap - 8..heap - 4],
            &1u32.to_le_bytes(),
            "one compare-swap won"
        );
        // Out of range: refused, naming the peer.
        let t = (me + 1) % n;
        let e = st
            .put(t, heap - 3, &[1, 2, 3, 4])
            .expect_err("outside the heap");
        assert!(
            matches!(&e, Error::Fabric { pe: Some(p), msg, .. } if *p == t && msg.contains("refused")),
            "{e}"
        );
    });
}

#[test]
fn a_lost_peer_ends_a_waiting_request_naming_it() {
    if skip() {
        return;
    }
    // PE 1 serves nothing: PE 0's request waits until PE 1 is marked lost.
    with_staged(2, 1 << 16, &[1], |me, st, _, _| {
        if me != 0 {
            return;
        }
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                st.net().mark_lost(1);
            });
            let e = st.put(1, 0, &[7u8; 64]).expect_err("nobody serves");
            assert!(matches!(e, Error::PeerLost { pe: 1, .. }), "{e}");
            // The pair is closed: the next request fails at once, never reusing the slot.
            let e = st
                .atomic(1, 0, true, AtomicOp::Fetch)
                .expect_err("closed pair");
            assert!(matches!(e, Error::PeerLost { pe: 1, .. }), "{e}");
        });
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    });
}

/// Device memory stand-in for the proxy's copies: "device addresses" are host addresses of
/// buffers the test owns.
pub(crate) struct HostCopies;

impl crate::backend::cuda::remote::DeviceCopy for HostCopies {
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the tests post addresses of live buffers at least as long as they post.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: as above; nothing else touches the buffer until the request completed.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
}

#[test]
fn the_proxy_carries_out_ring_requests_in_order_with_the_signal_after_the_data() {
    use crate::backend::cuda::remote::{Ring, RingRequest, RingSignal, RING_WORDS};
    use crate::transport::fabric::proxy::drain_one;
    if skip() {
        return;
    }
    let heap = 4 << 20;
    with_staged(2, heap, &[], |me, st, heaps, boot| {
        let other = 1 - me;
        let mut mem = vec![0u64; RING_WORDS];
        // SAFETY: `mem` holds RING_WORDS words and outlives the ring.
        let ring = unsafe { Ring::new(mem.as_mut_ptr()) };
        let src = random_bytes(me as u64 + 40, 700_001);
        let mut dst = vec![0x33u8; 5000];
        let dst_addr = dst.as_mut_ptr() as u64;
        let failed = Mutex::new(None);
        let signal = |offset, value, add| RingSignal { offset, value, add };
        // A put with a signal, a signal alone, then a get of what the put wrote.
        ring.post(
            0,
            RingRequest::Put {
                pe: other,
                dst: 64,
                src: src.as_ptr() as u64,
                len: src.len(),
                signal: Some(signal(8, 5, true)),
            },
        );
        ring.post(
            1,
            RingRequest::Signal {
                pe: other,
                signal: signal(16, 9, false),
            },
        );
        ring.post(
            2,
            RingRequest::Get {
                pe: other,
                dst: dst_addr,
                src: 64,
                len: 5000,
            },
        );
        // A device `p` of two bytes, carried in the entry, at an odd offset.
        let inline = RingRequest::PutInline {
            pe: other,
            dst: 33,
            value: 0x1234_5678_9abc_def0,
            len: 2,
        };
        ring.post(3, inline);
        while ring.done() < 4 {
            drain_one(&ring, &HostCopies, st, None, &failed);
        }
        assert!(
            failed.lock().unwrap().is_none(),
            "{:?}",
            failed.lock().unwrap()
        );
        assert_eq!(ring.failed(), None);
        assert_eq!(dst, src[..5000], "the get saw the put before it");
        boot.barrier().expect("barrier");
        let h = heaps[me].bytes();
        let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap());
        assert_eq!(
            &h[64..64 + 700_001],
            &random_bytes(other as u64 + 40, 700_001)[..]
        );
        assert_eq!(
            word(8),
            0xeeee_eeee_eeee_eeee_u64.wrapping_add(5),
            "signal add"
        );
        assert_eq!(word(16), 9, "signal set");
        assert!(
            h[..8].iter().all(|&b| b == 0xee),
            "bytes before the put untouched"
        );
        assert_eq!(
            &h[32..36],
            &[0xee, 0xf0, 0xde, 0xee],
            "p: 2 bytes, little-endian"
        );
    });
}

#[test]
fn a_failed_ring_request_fails_the_ring_naming_the_peer_and_drains_the_rest() {
    use crate::backend::cuda::remote::{Ring, RingRequest, RING_WORDS};
    use crate::transport::fabric::proxy::drain_one;
    if skip() {
        return;
    }
    with_staged(2, 1 << 16, &[1], |me, st, _, _| {
        if me != 0 {
            return;
        }
        let mut mem = vec![0u64; RING_WORDS];
        // SAFETY: `mem` holds RING_WORDS words and outlives the ring.
        let ring = unsafe { Ring::new(mem.as_mut_ptr()) };
        let src = [7u8; 256];
        let put = RingRequest::Put {
            pe: 1,
            dst: 0,
            src: src.as_ptr() as u64,
            len: src.len(),
            signal: None,
        };
        ring.post(0, put);
        ring.post(1, put);
        let failed = Mutex::new(None);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                st.net().mark_lost(1);
            });
            while ring.done() < 2 {
                drain_one(&ring, &HostCopies, st, None, &failed);
            }
        });
        assert_eq!(ring.failed(), Some(1), "the ring names the lost PE");
        let e = failed.lock().unwrap().clone();
        assert!(matches!(e, Some(Error::PeerLost { pe: 1, .. })), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    });
}
