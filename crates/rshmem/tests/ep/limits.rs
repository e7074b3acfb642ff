//! Capacity overflow in capturable mode (an error everywhere, nothing moved), and a peer
//! that dies mid-step (the others end in an error naming it, they do not hang).

use super::*;

// ----- capacity -----

/// PE `s` sends `count` tokens, each to one expert of PE `(s + 1) % n`; its hidden states
/// name it (so rows from the wrong PE, or another PE's combine result, cannot pass).
fn shifted(pe: &Pe, count: usize) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let n = pe.n_pes();
    let dest = (pe.my_pe() + 1) % n;
    let ids = (0..count).map(|t| (dest * EPP + t % EPP) as i64).collect();
    let w = vec![0.5; count];
    (ids, w, shifted_x(pe.my_pe(), count))
}

fn shifted_x(s: usize, count: usize) -> Vec<f32> {
    (0..count * H)
        .map(|i| (i + 1000 * (s + 1)) as f32)
        .collect()
}

fn capacity(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let cap = 3;
    let mut buf = HostBuffer::<f32>::new(
        pe,
        pe.world_team(),
        cfg(n, EpMode::Capturable { capacity: cap }),
    )?;
    assert_eq!(buf.recv_rows(), n * cap);
    for round in 0..2 {
        // At capacity: fine, exact.
        let (ids, w, x) = shifted(pe, cap);
        let d = buf.dispatch(pe, &x, &ids, &w, 1)?;
        assert_eq!(d.handle.num_recv_tokens(), cap);
        let src = (pe.my_pe() + n - 1) % n;
        assert!(d.handle.recv_src_pe().iter().all(|&s| s as usize == src));
        // cap <= EPP tokens, one per expert: expert-major order is the sender's token order
        assert!(cap <= EPP);
        assert_eq!(d.x, shifted_x(src, cap), "rows received from PE {src}");
        let out = buf.combine(pe, &d.handle, &d.x)?;
        assert_eq!(out, x.iter().map(|v| v * 0.5).collect::<Vec<_>>());
        // Over capacity on PE 0 only: an error on every PE naming the pair, no data moved.
        let c = if pe.my_pe() == 0 { cap + 1 + round } else { 1 };
        let (ids, w, x) = shifted(pe, c);
        match buf.dispatch(pe, &x, &ids, &w, 1) {
            Err(Error::Capacity {
                src_pe,
                dst_pe,
                needed,
                capacity,
                ..
            }) => {
                assert_eq!((src_pe, dst_pe), (0, 1 % n));
                assert_eq!((needed, capacity), (cap + 1 + round, cap));
            }
            other => panic!("expected a capacity error, got {other:?}"),
        }
    }
    // Still usable, results exact.
    let (ids, w, x) = shifted(pe, 2);
    let d = buf.dispatch(pe, &x, &ids, &w, 1)?;
    let out = buf.combine(pe, &d.handle, &d.x)?;
    assert_eq!(out, x.iter().map(|v| v * 0.5).collect::<Vec<_>>());
    pe.free(buf)
}
mode_test!(capturable_overflow_is_an_error, [1, 2, 3, 4], capacity);

// ----- a peer that dies mid-step: the others end in an error, they do not hang -----

#[test]
fn peer_lost_during_dispatch_is_an_error() {
    use std::sync::Mutex;
    static SEEN: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
    let n = 3;
    let cfg = harness::config().timeout(std::time::Duration::from_secs(10));
    let r = std::panic::catch_unwind(|| {
        rshmem::Launch::new()
            .config(cfg)
            .threads()
            .run(n, |pe| -> Result<()> {
                let mut buf =
                    HostBuffer::<f32>::new(pe, pe.world_team(), self::cfg(n, EpMode::Normal))?;
                run_case::<f32, i64>(pe, &mut buf, &good_case(1), true)?;
                if pe.my_pe() == n - 1 {
                    panic!("PE {} dies on purpose", pe.my_pe());
                }
                let case = good_case(2);
                let (ids, w) = routing(&case, pe.my_pe(), n);
                let x: Vec<f32> = hidden(&case, pe.my_pe());
                let r = buf.dispatch(pe, &x, &ids, &w, case.k);
                SEEN.lock()
                    .unwrap()
                    .push((pe.my_pe(), format!("{:?}", r.map(|_| ()))));
                Ok(())
            })
            .values()
    });
    let msg = harness::resumed_panic(r);
    assert!(msg.contains("dies on purpose"), "resumed panic: {msg:?}");
    let mut seen = SEEN.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        (0..n - 1).collect::<Vec<_>>(),
        "{seen:?}"
    );
    for (p, e) in seen {
        assert!(
            e.contains(&format!("PeerLost {{ pe: {}", n - 1)),
            "PE {p}: {e}"
        );
    }
}
