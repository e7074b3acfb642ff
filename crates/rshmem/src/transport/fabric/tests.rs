//! The transport over loopback tcp, PEs as threads of this process (each with its own
//! endpoint), addresses exchanged through the in-process bootstrap; and the FFI layout against
//! the installed C headers.

use super::*;
use crate::backend::AtomicOp;
use crate::bootstrap::InProcBootstrap;
use std::time::Duration;

/// Whether libfabric is missing here (the test then says so and passes).
pub(super) fn skip() -> bool {
    if !available() {
        eprintln!("SKIPPED: {LIBRARY} is not installed here (apt-get install libfabric-dev libfabric-bin)");
        return true;
    }
    false
}

/// tcp over loopback with `timeout`.
pub(super) fn loopback(timeout: Duration) -> FabricConfig {
    FabricConfig {
        provider: Some("tcp".into()),
        domain: Some("lo".into()),
        timeout,
        hmem: false,
    }
}

/// xorshift: reproducible random bytes without a dependency in unit tests.
pub(super) fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs `f(rank, endpoint, own registration, every PE's remote)` on `n` thread-PEs.
pub(super) fn with_pes(
    n: usize,
    len: usize,
    f: impl Fn(usize, &Endpoint, &mut MemoryRegion, &[Remote], &dyn Bootstrap) + Sync,
) {
    let hub = InProcBootstrap::new(n, Duration::from_secs(30)).expect("hub");
    std::thread::scope(|s| {
        for r in 0..n {
            let (hub, f) = (&hub, &f);
            s.spawn(move || {
                let boot = hub.join(r).expect("join");
                let ep =
                    Endpoint::open(&loopback(Duration::from_secs(20))).expect("open tcp on lo");
                let mut mr = MemoryRegion::register_owned(&ep, vec![0u8; len].into_boxed_slice())
                    .expect("register");
                let remotes = exchange(&boot, &ep, &[&mr]).expect("exchange");
                let heaps: Vec<Remote> = remotes.iter().map(|r| r[0]).collect();
                boot.barrier().expect("barrier");
                f(r, &ep, &mut mr, &heaps, &boot);
                boot.barrier().expect("barrier");
            });
        }
    });
}

/// Two thread-PEs over loopback (`deadline`), each with a registration of `len` bytes: PE 1
/// closes its endpoint 30 ms in, while PE 0 runs `f(endpoint, every PE's remotes)`.
pub(super) fn with_peer_closing(
    deadline: Duration,
    len: usize,
    f: impl Fn(&Endpoint, &[Vec<Remote>]) + Sync,
) {
    let hub = InProcBootstrap::new(2, Duration::from_secs(30)).expect("hub");
    std::thread::scope(|s| {
        for r in 0..2 {
            let (hub, f) = (&hub, &f);
            s.spawn(move || {
                let boot = hub.join(r).expect("join");
                let ep = Endpoint::open(&loopback(deadline)).expect("open");
                let mr = MemoryRegion::register_owned(&ep, vec![0u8; len].into_boxed_slice())
                    .expect("reg");
                let remotes = exchange(&boot, &ep, &[&mr]).expect("exchange");
                boot.barrier().expect("barrier");
                if r == 1 {
                    // Close while PE 0's transfers are in flight.
                    std::thread::sleep(Duration::from_millis(30));
                    drop(mr);
                    drop(ep);
                    boot.barrier().expect("barrier");
                    return;
                }
                f(&ep, &remotes);
                boot.barrier().expect("barrier");
            });
        }
    });
}

#[test]
fn put_get_move_random_bytes_exactly() {
    if skip() {
        return;
    }
    let n = 3;
    let len = 3 << 20;
    with_pes(n, len, |me, ep, mr, heaps, boot| {
        // Everyone writes a distinct random block into its right neighbour's heap, of a size
        // that spans several messages, at an odd offset.
        let to = (me + 1) % n;
        let data = random_bytes(me as u64 * 7 + 3, (2 << 20) + 13);
        ep.write(to, &heaps[to], 5, &data, false).expect("put");
        ep.nbi_quiet().expect("quiet");
        boot.barrier().expect("barrier");
        let from = (me + n - 1) % n;
        let want = random_bytes(from as u64 * 7 + 3, (2 << 20) + 13);
        assert_eq!(
            &mr.bytes()[5..5 + want.len()],
            &want[..],
            "PE {me}: data from PE {from}"
        );
        assert!(
            mr.bytes()[..5].iter().all(|&b| b == 0),
            "bytes before the put untouched"
        );
        // Read the left neighbour's heap back and compare with what it received.
        let mut got = vec![0xAAu8; want.len() + 10];
        ep.read(from, &heaps[from], 0, &mut got).expect("get");
        let from2 = (from + n - 1) % n;
        let want2 = random_bytes(from2 as u64 * 7 + 3, (2 << 20) + 13);
        assert_eq!(&got[5..5 + want2.len()], &want2[..]);
        // A delivery-complete put is visible at the target as soon as it returns.
        boot.barrier().expect("barrier");
        ep.write(to, &heaps[to], 0, &[me as u8 + 100], true)
            .expect("put dc");
        boot.barrier().expect("barrier");
        assert_eq!(mr.bytes_mut()[0], from as u8 + 100);
        // Empty transfers are no-ops.
        ep.write(to, &heaps[to], 0, &[], false).expect("empty put");
        ep.read(to, &heaps[to], 0, &mut []).expect("empty get");
    });
}

#[test]
fn atomics_of_both_widths_return_old_values() {
    if skip() {
        return;
    }
    let n = 2;
    with_pes(n, 4096, |me, ep, mr, heaps, boot| {
        let peer = 1 - me;
        // Each PE works on its own words of the peer's heap: 8-byte at 64*me, 4-byte at
        // 64*me + 32.
        let w = 64 * me;
        let h = &heaps[peer];
        let seed = random_bytes(me as u64 + 11, 8);
        let x = u64::from_le_bytes(seed.try_into().expect("8"));
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::Set(x)).expect("set"),
            0
        );
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::Fetch).expect("fetch"),
            x
        );
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::FetchAdd(5))
                .expect("add"),
            x
        );
        let x = x.wrapping_add(5);
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::FetchXor(0xff))
                .expect("xor"),
            x
        );
        let x = x ^ 0xff;
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::FetchAnd(!1))
                .expect("and"),
            x
        );
        let x = x & !1;
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::FetchOr(1 << 63))
                .expect("or"),
            x
        );
        let x = x | 1 << 63;
        assert_eq!(
            ep.atomic(peer, h, w, true, AtomicOp::Swap(7))
                .expect("swap"),
            x
        );
        // A failing compare-swap leaves the word; a matching one replaces it.
        assert_eq!(
            ep.atomic(
                peer,
                h,
                w,
                true,
                AtomicOp::CompareSwap { cond: 8, value: 9 }
            )
            .expect("cas"),
            7
        );
        assert_eq!(
            ep.atomic(
                peer,
                h,
                w,
                true,
                AtomicOp::CompareSwap { cond: 7, value: 9 }
            )
            .expect("cas"),
            7
        );
        // 4-byte words: only 4 bytes change.
        let w4 = w + 32;
        assert_eq!(
            ep.atomic(peer, h, w4, false, AtomicOp::Set(0xdead_beef))
                .expect("set32"),
            0
        );
        assert_eq!(
            ep.atomic(peer, h, w4, false, AtomicOp::FetchAdd(2))
                .expect("add32"),
            0xdead_beef
        );
        assert_eq!(
            ep.atomic(
                peer,
                h,
                w4,
                false,
                AtomicOp::CompareSwap {
                    cond: 0xdead_bef1,
                    value: 3
                }
            )
            .expect("cas32"),
            0xdead_bef1
        );
        ep.nbi_quiet().expect("quiet");
        boot.barrier().expect("barrier");
        let mine = mr.bytes();
        let at = 64 * peer;
        assert_eq!(
            u64::from_le_bytes(mine[at..at + 8].try_into().expect("8")),
            9
        );
        assert_eq!(
            u32::from_le_bytes(mine[at + 32..at + 36].try_into().expect("4")),
            3
        );
        assert!(
            mine[at + 36..at + 40].iter().all(|&b| b == 0),
            "a 4-byte atomic wrote past its word"
        );
    });
}

#[test]
fn remote_fetch_adds_and_the_targets_cpu_atomics_sum_exactly() {
    if skip() {
        return;
    }
    // Barrier counters take adds from PEs of the target's node (CPU atomics on the mapping)
    // and from other nodes (fabric atomics) at once: the provider must apply its atomics
    // atomically with respect to the CPU's.
    let n = 3;
    let per = 300;
    with_pes(n, 4096, |me, ep, mr, heaps, boot| {
        if me == 0 {
            let word = mr
                .ptr()
                .cast::<std::sync::atomic::AtomicU64>()
                .wrapping_add(1);
            for _ in 0..per * 20 {
                // SAFETY: word 1 of this PE's own registered, live, 8-byte aligned buffer.
                unsafe { &*word }.fetch_add(1000, std::sync::atomic::Ordering::AcqRel);
            }
        } else {
            for _ in 0..per {
                ep.atomic(0, &heaps[0], 8, true, AtomicOp::FetchAdd(me as u64))
                    .expect("add");
            }
        }
        boot.barrier().expect("barrier");
        if me == 0 {
            let v = u64::from_le_bytes(mr.bytes()[8..16].try_into().expect("8"));
            assert_eq!(v, per as u64 * (1 + 2) + per as u64 * 20 * 1000);
        }
    });
}

#[test]
fn asking_for_device_memory_keeps_the_provider_and_says_whether_it_got_it() {
    if skip() {
        return;
    }
    // tcp does not take device memory: the endpoint opens all the same, on tcp, without it.
    let ep = Endpoint::open(&FabricConfig {
        hmem: true,
        ..loopback(Duration::from_secs(5))
    })
    .expect("open");
    let plain = Endpoint::open(&loopback(Duration::from_secs(5))).expect("open");
    assert!(ep.provider.starts_with("tcp"), "{}", ep.provider);
    assert_eq!((&ep.provider, ep.hmem), (&plain.provider, false));
    assert!(!plain.hmem);
}

#[test]
fn device_memory_is_refused_from_a_provider_that_would_call_cuda_itself() {
    if skip() {
        return;
    }
    // shm moves device memory with CUDA calls of its own: where it offers FI_HMEM with RMA
    // and atomics (1.22 built with CUDA; not Debian's 1.17) it refuses to do without them.
    // Either way the endpoint opens on shm all the same, without device memory.
    let shm = |hmem| FabricConfig {
        provider: Some("shm".into()),
        domain: None,
        timeout: Duration::from_secs(5),
        hmem,
    };
    let Ok(plain) = Endpoint::open(&shm(false)) else {
        eprintln!("SKIPPED: no shm provider here");
        return;
    };
    let ep = Endpoint::open(&shm(true)).expect("open");
    assert_eq!((&ep.provider, ep.hmem), (&plain.provider, false));
}

#[test]
fn bad_inputs_are_errors_naming_what_is_wrong() {
    if skip() {
        return;
    }
    let e = Endpoint::open(&FabricConfig {
        provider: Some("no-such-provider".into()),
        ..loopback(Duration::from_secs(5))
    })
    .expect_err("unknown provider");
    assert!(
        matches!(
            &e,
            Error::Fabric {
                op: "fi_getinfo",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("no-such-provider"), "{e}");
    let e = Endpoint::open(&FabricConfig {
        provider: Some("tc\0p".into()),
        ..loopback(Duration::from_secs(5))
    })
    .expect_err("NUL in name");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // A peer index without an address: an error naming it, not a panic.
    let ep = Endpoint::open(&loopback(Duration::from_secs(5))).expect("open");
    let e = ep
        .write(3, &Remote::default(), 0, &[1, 2], false)
        .expect_err("no peers inserted");
    assert!(matches!(e, Error::Fabric { pe: Some(3), .. }), "{e}");
    // A malformed address is refused.
    let e = ep.insert_peers(&[vec![1, 2, 3]]).expect_err("bad address");
    assert!(matches!(e, Error::Fabric { pe: Some(0), .. }), "{e}");
    // Exchange records that do not parse.
    assert_eq!(Remote::from_bytes(&[0; 23]), None);
    let r = Remote {
        base: 1,
        key: 2,
        len: 3,
    };
    assert_eq!(Remote::from_bytes(&r.to_bytes()), Some(r));
}

#[test]
fn a_write_into_a_range_outside_the_registration_fails_naming_the_peer() {
    if skip() {
        return;
    }
    with_pes(2, 4096, |me, ep, _mr, heaps, _boot| {
        let peer = 1 - me;
        let bad = Remote {
            key: heaps[peer].key ^ 0x5a5a,
            ..heaps[peer]
        };
        let e = ep
            .write(peer, &bad, 0, &[1; 64], true)
            .expect_err("bad key");
        assert!(
            matches!(e, Error::Fabric { pe: Some(p), .. } if p == peer),
            "{e}"
        );
    });
}

#[test]
fn a_peer_that_is_gone_ends_in_an_error_not_a_hang() {
    if skip() {
        return;
    }
    let hub = InProcBootstrap::new(2, Duration::from_secs(30)).expect("hub");
    std::thread::scope(|s| {
        for r in 0..2 {
            let hub = &hub;
            s.spawn(move || {
                let boot = hub.join(r).expect("join");
                let ep = Endpoint::open(&loopback(Duration::from_secs(2))).expect("open");
                let mr = MemoryRegion::register_owned(&ep, vec![0u8; 4096].into_boxed_slice())
                    .expect("reg");
                let remotes = exchange(&boot, &ep, &[&mr]).expect("exchange");
                boot.barrier().expect("barrier");
                if r == 1 {
                    drop(mr);
                    drop(ep);
                    boot.barrier().expect("barrier");
                    return;
                }
                boot.barrier().expect("barrier");
                let t = std::time::Instant::now();
                let e = ep
                    .write(1, &remotes[1][0], 0, &[7; 128], true)
                    .expect_err("peer gone");
                assert!(
                    matches!(
                        e,
                        Error::Fabric { pe: Some(1), .. } | Error::Timeout { pe: Some(1), .. }
                    ),
                    "{e}"
                );
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "bounded by the deadline"
                );
            });
        }
    });
}

#[test]
fn pipelined_puts_and_gets_of_many_windows_and_odd_sizes_move_exact_bytes() {
    if skip() {
        return;
    }
    let window_bytes = xfer::WINDOW * xfer::CHUNK;
    // Past three windows plus a remainder, then sizes around one chunk.
    let big = 3 * window_bytes + 12_345;
    let sizes = [
        big,
        1,
        7,
        xfer::CHUNK - 1,
        xfer::CHUNK,
        xfer::CHUNK + 1,
        2 * xfer::CHUNK + 3,
    ];
    let len = big + 64;
    with_pes(2, len, |me, ep, mr, heaps, boot| {
        let peer = 1 - me;
        // Each size twice: with the completion semantics the provider's ordering allows, then
        // with transmit completion on all but the last chunk (tcp declares no data-placement
        // ordering, but its one stream per peer places writes in order).
        for (i, &n) in sizes.iter().chain(sizes.iter()).enumerate() {
            if i == sizes.len() {
                ep.assume_ordered_writes();
            }
            // The target's heap is poisoned, then PE 0 puts n random bytes at odd offset 3.
            mr.bytes_mut().fill(0xEE);
            boot.barrier().expect("barrier");
            let data = random_bytes(i as u64 * 31 + 5, n);
            if me == 0 {
                ep.write(peer, &heaps[peer], 3, &data, true).expect("put");
            }
            // Delivery-complete: in the target's memory once the put returned.
            boot.barrier().expect("barrier");
            if me == 1 {
                let b = mr.bytes();
                assert!(b[..3].iter().all(|&x| x == 0xEE), "{n} B: before the put");
                assert!(b[3..3 + n] == data[..], "{n} B: the data put");
                assert!(
                    b[3 + n..].iter().all(|&x| x == 0xEE),
                    "{n} B: after the put"
                );
            }
            // PE 1 gets the same bytes back from PE 0's heap, which PE 0 wrote itself.
            if me == 0 {
                mr.bytes_mut()[3..3 + n].copy_from_slice(&data);
            }
            boot.barrier().expect("barrier");
            if me == 1 {
                let mut got = vec![0x55u8; n + 2];
                ep.read(peer, &heaps[peer], 2, &mut got).expect("get");
                assert_eq!(got[0], 0xEE, "{n} B: byte before");
                assert!(got[1..1 + n] == data[..], "{n} B: the data got");
                assert_eq!(got[n + 1], 0xEE, "{n} B: byte after");
            }
            boot.barrier().expect("barrier");
        }
        // Transfers from several threads of one PE at once share the endpoint's window slots.
        let parts = 3;
        let part = window_bytes / 2 + 1001;
        if me == 0 {
            std::thread::scope(|s| {
                for t in 0..parts {
                    s.spawn(move || {
                        let d = random_bytes(100 + t as u64, part);
                        ep.write(peer, &heaps[peer], t * part, &d, true)
                            .expect("threaded put");
                    });
                }
            });
        }
        boot.barrier().expect("barrier");
        if me == 1 {
            for t in 0..parts {
                let d = random_bytes(100 + t as u64, part);
                assert!(mr.bytes()[t * part..(t + 1) * part] == d[..], "thread {t}");
            }
        }
    });
}

#[test]
fn a_peer_closed_mid_window_ends_the_transfer_in_an_error_within_the_deadline() {
    if skip() {
        return;
    }
    let deadline = Duration::from_secs(2);
    let big = 4 * xfer::WINDOW * xfer::CHUNK;
    for get in [false, true] {
        with_peer_closing(deadline, big, |ep, remotes| {
            let t = std::time::Instant::now();
            let data = random_bytes(9, big);
            let mut back = vec![0u8; big];
            let mut err = None;
            // Transfer until the closed peer makes one fail (every one is many
            // windows long, so the close lands in the middle of one).
            for _ in 0..10_000 {
                let res = if get {
                    ep.read(1, &remotes[1][0], 0, &mut back)
                } else {
                    ep.write(1, &remotes[1][0], 0, &data, true)
                };
                if let Err(e) = res {
                    err = Some(e);
                    break;
                }
                if t.elapsed() > Duration::from_secs(20) {
                    break;
                }
            }
            let e = err.expect("a transfer to a closed peer must fail");
            assert!(
                matches!(
                    e,
                    Error::Fabric { pe: Some(1), .. } | Error::Timeout { pe: Some(1), .. }
                ),
                "{e}"
            );
            assert!(t.elapsed() < Duration::from_secs(25), "bounded");
        });
    }
}

/// The libfabric constants the FFI declares, by their C names.
fn abi_constants() -> Vec<(&'static str, i64)> {
    vec![
        ("FI_EP_RDM", ffi::FI_EP_RDM as i64),
        ("FI_AV_TABLE", ffi::FI_AV_TABLE as i64),
        ("FI_THREAD_SAFE", ffi::FI_THREAD_SAFE as i64),
        ("FI_CQ_FORMAT_CONTEXT", ffi::FI_CQ_FORMAT_CONTEXT as i64),
        ("FI_WAIT_NONE", ffi::FI_WAIT_NONE as i64),
        ("FI_ENABLE", ffi::FI_ENABLE as i64),
        ("FI_UINT32", ffi::FI_UINT32 as i64),
        ("FI_UINT64", ffi::FI_UINT64 as i64),
        ("FI_SUM", ffi::FI_SUM as i64),
        ("FI_BOR", ffi::FI_BOR as i64),
        ("FI_BAND", ffi::FI_BAND as i64),
        ("FI_BXOR", ffi::FI_BXOR as i64),
        ("FI_ATOMIC_READ", ffi::FI_ATOMIC_READ as i64),
        ("FI_ATOMIC_WRITE", ffi::FI_ATOMIC_WRITE as i64),
        ("FI_CSWAP", ffi::FI_CSWAP as i64),
        ("FI_EAVAIL", ffi::FI_EAVAIL as i64),
        ("FI_EAGAIN", ffi::FI_EAGAIN as i64),
        ("FI_MR_LOCAL", ffi::FI_MR_LOCAL as i64),
        ("FI_MR_VIRT_ADDR", ffi::FI_MR_VIRT_ADDR as i64),
        ("FI_MR_ALLOCATED", ffi::FI_MR_ALLOCATED as i64),
        ("FI_MR_PROV_KEY", ffi::FI_MR_PROV_KEY as i64),
        ("FI_DELIVERY_COMPLETE", ffi::FI_DELIVERY_COMPLETE as i64),
        ("FI_HMEM", ffi::FI_HMEM as i64),
        ("FI_MR_HMEM", ffi::FI_MR_HMEM as i64),
        ("FI_HMEM_CUDA", ffi::FI_HMEM_CUDA as i64),
        ("FI_OPT_ENDPOINT", ffi::FI_OPT_ENDPOINT as i64),
        ("FI_COMPLETION", ffi::FI_COMPLETION as i64),
        ("FI_REMOTE_WRITE", ffi::FI_REMOTE_WRITE as i64),
        ("FI_ORDER_WAW", ffi::FI_ORDER_WAW as i64),
        ("FI_ORDER_RMA_WAW", ffi::FI_ORDER_RMA_WAW as i64),
        ("FI_MAJOR_VERSION", ffi::FI_MAJOR_VERSION as i64),
    ]
}

#[test]
fn fabric_abi_matches_the_headers() {
    let header = std::path::Path::new("/usr/include/rdma/fabric.h");
    if !header.exists() {
        eprintln!(
            "SKIPPED: {} not installed (libfabric-dev); the FFI layout is not checked",
            header.display()
        );
        return;
    }
    let layouts = ffi::layouts();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/fabric.h>\n#include <rdma/fi_domain.h>\n\
         #include <rdma/fi_endpoint.h>\n#include <rdma/fi_eq.h>\n#include <rdma/fi_cm.h>\n#include <rdma/fi_rma.h>\n\
         #include <rdma/fi_atomic.h>\n#include <rdma/fi_errno.h>\nint main(void){\n",
    );
    for (name, _, fields) in &layouts {
        c += &format!("printf(\"{name} %zu\\n\", sizeof(struct {name}));\n");
        for (f, _) in fields {
            c += &format!("printf(\"{name}.{f} %zu\\n\", offsetof(struct {name}, {f}));\n");
        }
    }
    let consts = abi_constants();
    for (k, _) in &consts {
        c += &format!("printf(\"{k} %lld\\n\", (long long)({k}));\n");
    }
    c += "return 0;}\n";
    let dir = std::env::temp_dir().join(format!("rshmem-fabric-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let (src, exe) = (dir.join("abi.c"), dir.join("abi"));
    std::fs::write(&src, c).expect("write C");
    let cc = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let Ok(cc) = cc else {
        eprintln!("SKIPPED: no C compiler (cc) to check the FFI layout");
        return;
    };
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = std::process::Command::new(&exe).output().expect("run abi");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let c_values: std::collections::HashMap<&str, i64> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k, v.parse().expect("number")))
        .collect();
    let mut wrong = Vec::new();
    for (name, size, fields) in &layouts {
        if c_values[*name] != *size as i64 {
            wrong.push(format!("sizeof {name}: Rust {size}, C {}", c_values[*name]));
        }
        for (f, off) in fields {
            let k = format!("{name}.{f}");
            if c_values[k.as_str()] != *off as i64 {
                wrong.push(format!("{k}: Rust {off}, C {}", c_values[k.as_str()]));
            }
        }
    }
    for (k, v) in consts {
        if c_values[k] != v {
            wrong.push(format!("{k}: Rust {v}, C {}", c_values[k]));
        }
    }
    assert!(
        wrong.is_empty(),
        "FFI differs from the headers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_providers_listed_include_loopback_tcp_once() {
    if skip() {
        return;
    }
    let ps = super::providers().expect("providers");
    assert!(
        ps.iter()
            .any(|p| p.name.starts_with("tcp") && p.domain == "lo"),
        "{ps:?}"
    );
    for (i, p) in ps.iter().enumerate() {
        assert!(
            !ps[..i]
                .iter()
                .any(|q| q.name == p.name && q.domain == p.domain),
            "{p:?} twice"
        );
    }
}
