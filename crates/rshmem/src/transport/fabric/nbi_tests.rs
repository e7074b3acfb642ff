//! Non-blocking puts and gets over loopback tcp between thread-PEs with their own endpoints:
//! many in flight at once, fence ordering, a peer closed with operations in flight.

use super::nbi::{NbiDir, MAX_STAGED_FOR_TESTS};
use super::tests::{random_bytes, skip, with_peer_closing, with_pes};
use super::*;
use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Odd sizes: single bytes, around the small-slot size, around one chunk, several chunks.
fn sizes() -> Vec<usize> {
    let c = xfer::CHUNK;
    let s = xfer::SMALL;
    vec![
        1,
        7,
        8,
        13,
        s - 1,
        s,
        s + 1,
        c - 3,
        c,
        c + 5,
        3 * c + 77,
        1,
        2,
        99,
    ]
}

/// Places of `sizes()` in a heap, 64 bytes apart so each has poisoned neighbours.
fn places(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut at = Vec::new();
    let mut off = 64 + 3;
    for &n in sizes {
        at.push(off);
        off += n + 64;
    }
    (at, off + 64)
}

const POISON: u8 = 0xA5;

#[test]
fn many_non_blocking_puts_and_gets_in_flight_move_exact_bytes() {
    if skip() {
        return;
    }
    let n = 3;
    let sizes = sizes();
    let (at, len) = places(&sizes);
    with_pes(n, len, |me, ep, mr, heaps, boot| {
        mr.bytes_mut().fill(POISON);
        boot.barrier().expect("barrier");
        // Every PE puts every size into its right neighbour's heap, all in flight, then quiet.
        let to = (me + 1) % n;
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| random_bytes((me * 100 + i) as u64 + 1, s))
            .collect();
        let mut keys = Vec::new();
        for (i, d) in data.iter().enumerate() {
            let k = ep
                .nbi_post(to, &heaps[to], at[i], NbiDir::Put(d))
                .expect("put_nbi");
            keys.push(k);
        }
        // The sources may be reused at once: scribbling over them changes nothing sent.
        drop(data);
        ep.nbi_quiet().expect("quiet");
        for &k in &keys {
            assert_eq!(ep.nbi_status(k, false), Some(Ok(())), "ended after quiet");
            ep.nbi_release(k);
        }
        assert_eq!(ep.nbi_counts(), (0, 0), "nothing in flight or kept");
        boot.barrier().expect("barrier");
        let from = (me + n - 1) % n;
        let mine = mr.bytes();
        for (i, &s) in sizes.iter().enumerate() {
            let want = random_bytes((from * 100 + i) as u64 + 1, s);
            assert!(
                mine[at[i]..at[i] + s] == want[..],
                "size {s} from PE {from}"
            );
            assert_eq!(mine[at[i] - 1], POISON, "byte before size {s}");
            assert_eq!(mine[at[i] + s], POISON, "byte after size {s}");
        }
        boot.barrier().expect("barrier");
        // Gets of every size from the left neighbour, all in flight; each landed exactly.
        let mut outs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0x5Au8; s + 2]).collect();
        let keys: Vec<u64> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let dst = &mut outs[i][1..1 + s];
                ep.nbi_post(from, &heaps[from], at[i], NbiDir::Get(dst))
                    .expect("get_nbi")
            })
            .collect();
        // Half collected by a wait that lands chunks as they arrive, half after quiet.
        for (i, &k) in keys.iter().enumerate().step_by(2) {
            let s = sizes[i];
            ep.nbi_wait_land(k, &mut outs[i][1..1 + s]).expect("wait");
        }
        ep.nbi_quiet().expect("quiet");
        for (i, &k) in keys.iter().enumerate().skip(1).step_by(2) {
            let s = sizes[i];
            ep.nbi_land(k, &mut outs[i][1..1 + s]);
        }
        for (i, &s) in sizes.iter().enumerate() {
            let left = (from + n - 1) % n;
            let want = random_bytes((left * 100 + i) as u64 + 1, s);
            assert!(outs[i][1..1 + s] == want[..], "get of size {s}");
            assert_eq!(
                (outs[i][0], outs[i][s + 1]),
                (0x5A, 0x5A),
                "around size {s}"
            );
        }
        assert_eq!(ep.nbi_counts(), (0, 0), "every get collected");
        boot.barrier().expect("barrier");
    });
}

#[test]
fn a_fenced_flag_is_seen_after_the_data_it_follows() {
    if skip() {
        return;
    }
    let rounds = 40u64;
    let data_len = 3 * xfer::CHUNK + 11;
    let len = 64 + data_len;
    with_pes(2, len, |me, ep, mr, heaps, boot| {
        boot.barrier().expect("barrier");
        if me == 0 {
            for r in 1..=rounds {
                let d = random_bytes(r, data_len);
                let data = ep
                    .nbi_post(1, &heaps[1], 64, NbiDir::Put(&d))
                    .expect("data");
                ep.nbi_fence();
                let flag = r.to_le_bytes();
                // Odd rounds: the flag as a non-blocking put; even: a blocking atomic.
                if r % 2 == 1 {
                    let k = ep
                        .nbi_post(1, &heaps[1], 0, NbiDir::Put(&flag))
                        .expect("flag");
                    ep.nbi_release(k);
                } else {
                    // As `FabricBackend` does before every blocking operation.
                    ep.nbi_fenced(1);
                    ep.atomic(1, &heaps[1], 0, true, crate::backend::AtomicOp::Set(r))
                        .expect("flag");
                }
                // tcp keeps one connection's writes in order by itself; what the fence adds
                // is that the flag left only once the data was delivered.
                assert_eq!(
                    ep.nbi_status(data, false),
                    Some(Ok(())),
                    "round {r}: the fenced flag was posted before the data ended"
                );
                ep.nbi_release(data);
                // The next round overwrites the data only after the reader saw this one.
                boot.barrier().expect("barrier");
            }
            ep.nbi_quiet().expect("quiet");
        } else {
            let base = mr.bytes_mut().as_mut_ptr();
            // SAFETY: the first 8 bytes of the registration, 8-aligned (a boxed slice of u8
            // from the global allocator is at least 8-aligned for this size); written by the
            // peer over the fabric only.
            let flag = unsafe { &*(base as *const AtomicU64) };
            for r in 1..=rounds {
                let t0 = Instant::now();
                while u64::from_le(flag.load(Ordering::Acquire)) != r {
                    ep.progress();
                    assert!(t0.elapsed() < Duration::from_secs(20), "flag of round {r}");
                    std::hint::spin_loop();
                }
                let got = &mr.bytes()[64..64 + data_len];
                assert!(
                    got == &random_bytes(r, data_len)[..],
                    "round {r}: data before flag"
                );
                boot.barrier().expect("barrier");
            }
        }
        boot.barrier().expect("barrier");
    });
}

#[test]
fn a_peer_closed_with_operations_in_flight_ends_them_in_an_error_within_the_deadline() {
    if skip() {
        return;
    }
    let deadline = Duration::from_secs(2);
    let big = 2 * xfer::CHUNK;
    for get in [false, true] {
        with_peer_closing(deadline, big, |ep, remotes| {
            let t = Instant::now();
            let data = random_bytes(9, big);
            let mut back = vec![0u8; big / 2];
            let mut err = None;
            // Windows of 32 operations then quiet, until the closed peer fails one.
            'outer: for _ in 0..10_000 {
                let mut keys = Vec::new();
                for i in 0..32 {
                    let lo = (i * 4099) % (big / 2);
                    let dir = if get {
                        NbiDir::Get(&mut back[..big / 2])
                    } else {
                        NbiDir::Put(&data[..big / 2])
                    };
                    match ep.nbi_post(1, &remotes[1][0], lo, dir) {
                        Ok(k) => keys.push(k),
                        Err(e) => {
                            err = Some(e);
                            break 'outer;
                        }
                    }
                }
                let q = ep.nbi_quiet();
                for k in keys {
                    ep.nbi_release(k);
                }
                if let Err(e) = q {
                    err = Some(e);
                    break;
                }
                if t.elapsed() > Duration::from_secs(20) {
                    break;
                }
            }
            let e = err.expect("operations to a closed peer must fail");
            assert!(
                matches!(
                    e,
                    Error::Fabric { pe: Some(1), .. }
                        | Error::Timeout { pe: Some(1), .. }
                        | Error::PeerLost { pe: 1, .. }
                ),
                "{e}"
            );
            assert!(t.elapsed() < Duration::from_secs(25), "bounded");
            // Everything ended: a quiet now waits for nothing, and a peer taken as
            // lost fails a new operation at once.
            let t1 = Instant::now();
            let _ = ep.nbi_quiet();
            ep.mark_lost(1);
            let r = ep.nbi_post(1, &remotes[1][0], 0, NbiDir::Get(&mut [0u8; 8]));
            assert!(matches!(r, Err(Error::PeerLost { pe: 1, .. })), "{r:?}");
            assert!(t1.elapsed() < deadline * 3, "no wait after the error");
            assert_eq!(ep.nbi_counts().0, 0, "no chunk left in flight");
        });
    }
}

#[test]
fn a_get_past_the_staging_bound_lands_exactly_while_it_posts() {
    if skip() {
        return;
    }
    // More than the staging the endpoint keeps in flight: the post waits for room, landing
    // the chunks that arrived meanwhile, and the handle lands the rest.
    let big = MAX_STAGED_FOR_TESTS + 3 * xfer::CHUNK + 11;
    with_pes(2, big + 128, |me, ep, mr, heaps, boot| {
        let mine = random_bytes(me as u64 + 70, big);
        mr.bytes_mut()[64..64 + big].copy_from_slice(&mine);
        boot.barrier().expect("barrier");
        let other = 1 - me;
        let mut out = vec![0x5Au8; big + 2];
        let k = ep
            .nbi_post(other, &heaps[other], 64, NbiDir::Get(&mut out[1..1 + big]))
            .expect("get_nbi");
        ep.nbi_wait_land(k, &mut out[1..1 + big]).expect("wait");
        assert!(out[1..1 + big] == random_bytes(other as u64 + 70, big)[..]);
        assert_eq!((out[0], out[big + 1]), (0x5A, 0x5A), "neighbours");
        assert_eq!(ep.nbi_counts(), (0, 0), "nothing in flight or held");
        boot.barrier().expect("barrier");
    });
}
