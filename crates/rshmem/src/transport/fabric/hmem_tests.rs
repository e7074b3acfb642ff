//! Registered heaps without a GPU: heaps in host memory registered as the GPU heaps would be,
//! between thread-PEs over loopback tcp, with the proxy's ring requests carried out on them.
//! What a provider that takes device memory adds (the registration of CUDA memory) is tested on
//! the GPU machine (`tests/cuda_fabric.rs`).

use super::*;
use crate::backend::cuda::remote::{Ring, RingRequest, RingSignal, RING_WORDS};
use crate::backend::Backend;
use crate::transport::fabric::proxy::drain_one;
use crate::transport::fabric::staging::tests::{with_staged, HostCopies, HostHeap};
use crate::transport::fabric::tests::{random_bytes, skip};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Host copies that count how often the proxy went through them.
#[derive(Default)]
struct Counted {
    from: AtomicUsize,
    to: AtomicUsize,
}

impl DeviceCopy for Counted {
    fn copy_from_device(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.from.fetch_add(1, Ordering::Relaxed);
        HostCopies.copy_from_device(src, dst)
    }
    fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.to.fetch_add(1, Ordering::Relaxed);
        HostCopies.copy_to_device(dst, src)
    }
}

/// This PE's heap registered (host memory standing in for its GPU heap), agreed with the rest.
fn registered(net: &Arc<Net>, boot: &dyn Bootstrap, heap: &HostHeap, len: usize) -> Option<Hmem> {
    // SAFETY: the heap's bytes never move and outlive the registration (with_staged drops
    // every PE's Hmem inside its closure, before the heaps).
    let mr = unsafe { MemoryRegion::register(net.endpoint(), heap.ptr(), len) };
    Hmem::agree(net.clone(), boot, mr, heap.ptr() as u64).expect("agree")
}

fn word(h: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(h[at..at + 8].try_into().unwrap())
}

#[test]
fn registered_heaps_take_puts_and_gets_in_place_and_signals_stay_staged() {
    if skip() {
        return;
    }
    let heap = 4 << 20;
    with_staged(2, heap, &[], |me, st, heaps, boot| {
        let other = 1 - me;
        let h = registered(st.net(), boot, &heaps[me], heap).expect("every PE registered");
        // Host API: a put spanning several chunks at an odd offset, in the target's heap on
        // return, and read back.
        let data = random_bytes(me as u64 + 1, 300_001);
        let at = 1001 + me * 400_000;
        h.put(other, at, &data).expect("put");
        assert_eq!(&heaps[other].bytes()[at..at + data.len()], &data[..]);
        let mut back = vec![0x5au8; data.len()];
        h.get(other, at, &mut back).expect("get");
        assert_eq!(back, data);

        // Ring requests: a put from this PE's registered heap (in place) with a signal, a put
        // from memory outside it (through the host copies), a get into the registered heap
        // (in place) and one outside it, and a `p` carried in the entry.
        let own = random_bytes(me as u64 + 7, 200_000);
        heaps[me].put(me, 2_000_000, &own).expect("own heap");
        let outside = random_bytes(me as u64 + 9, 5000);
        let mut outside_back = vec![0x77u8; 5000];
        let base = heaps[me].ptr() as u64;
        let mut mem = vec![0u64; RING_WORDS];
        // SAFETY: `mem` holds RING_WORDS words and outlives the ring.
        let ring = unsafe { Ring::new(mem.as_mut_ptr()) };
        let signal = |offset, value, add| Some(RingSignal { offset, value, add });
        let reqs = [
            RingRequest::Put {
                pe: other,
                dst: 3_000_000,
                src: base + 2_000_000,
                len: own.len(),
                signal: signal(8, 5, true),
            },
            RingRequest::Put {
                pe: other,
                dst: 3_300_000,
                src: outside.as_ptr() as u64,
                len: outside.len(),
                signal: None,
            },
            RingRequest::Get {
                pe: other,
                dst: base + 2_500_000,
                src: 3_000_000,
                len: own.len(),
            },
            RingRequest::Get {
                pe: other,
                dst: outside_back.as_mut_ptr() as u64,
                src: 3_300_000,
                len: outside.len(),
            },
            RingRequest::PutInline {
                pe: other,
                dst: 41,
                value: 0x0102_0304_0506_0708,
                len: 3,
            },
        ];
        for (k, r) in reqs.into_iter().enumerate() {
            ring.post(k as u64, r);
        }
        let copies = Counted::default();
        let failed = Mutex::new(None);
        while ring.done() < reqs.len() as u64 {
            drain_one(&ring, &copies, st, Some(&h), &failed);
        }
        assert!(failed.lock().unwrap().is_none(), "{:?}", failed.lock());
        assert_eq!(ring.failed(), None);
        assert_eq!(
            (copies.from.into_inner(), copies.to.into_inner()),
            (1, 1),
            "only the two requests outside the registered heap go through host copies"
        );
        let mine = heaps[me].bytes();
        assert_eq!(&mine[2_500_000..2_700_000], &own[..], "get in place");
        assert_eq!(outside_back, outside, "get through the host");
        boot.barrier().expect("barrier");
        // What the other PE's requests left in this PE's heap.
        let mine = heaps[me].bytes();
        let theirs = random_bytes(other as u64 + 7, 200_000);
        assert_eq!(&mine[3_000_000..3_200_000], &theirs[..]);
        let theirs = random_bytes(other as u64 + 9, 5000);
        assert_eq!(&mine[3_300_000..3_305_000], &theirs[..]);
        assert_eq!(word(&mine, 8), 0xeeee_eeee_eeee_eeee_u64.wrapping_add(5));
        assert_eq!(&mine[40..45], &[0xee, 0x08, 0x07, 0x06, 0xee], "p: 3 bytes");
        drop(h);
    });
}

#[test]
fn registration_is_all_or_none() {
    if skip() {
        return;
    }
    let heap = 1 << 20;
    with_staged(3, heap, &[], |me, st, heaps, boot| {
        let net = st.net();
        let mr = match me {
            1 => Err(Error::invalid("this PE's provider takes no device memory")),
            // SAFETY: as in `registered`.
            _ => unsafe { MemoryRegion::register(net.endpoint(), heaps[me].ptr(), heap) },
        };
        let h = Hmem::agree(net.clone(), boot, mr, heaps[me].ptr() as u64).expect("agree");
        assert!(h.is_none(), "PE {me} registered although PE 1 could not");
    });
}

#[test]
fn transfers_outside_a_registered_heap_are_errors_naming_it() {
    if skip() {
        return;
    }
    let heap = 1 << 20;
    with_staged(2, heap, &[], |me, st, heaps, boot| {
        let h = registered(st.net(), boot, &heaps[me], heap).expect("registered");
        let other = 1 - me;
        for (pe, at, len) in [(other, heap - 10, 20), (other, usize::MAX, 2), (5, 0, 8)] {
            let e = h.put(pe, at, &vec![1u8; len]).expect_err("outside");
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            let e = h
                .get_to_device(&HostCopies, pe, at, heaps[me].ptr() as u64, len)
                .expect_err("outside");
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
        assert!(heaps[other].bytes()[heap - 10..].iter().all(|&b| b == 0xee));
        boot.barrier().expect("barrier");
        drop(h);
    });
}
