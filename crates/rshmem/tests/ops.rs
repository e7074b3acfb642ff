//! One-sided data movement for every element type: put, get, p, g, the non-blocking forms with
//! their handles and completion queue, put-with-signal (set and add), fence, quiet; random data
//! at sizes 0, 1, odd, unaligned element offsets and 1 MiB; poisoned destinations; 1, 2, 3 and
//! 8 PEs; every PE writing into one PE at once.
//!
//! Every body works when each PE is a separate process: expected values are recomputed from
//! the seeds of the PE that wrote them, and all PEs make the same collective calls in order.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{check_eq, check_range, poison, CASES};
use harness::rand_vec;
use rshmem::{Cmp, Completion, Elem, OpKind, Pe, Result, Signal};

fn ring(pe: &Pe) -> (usize, usize, usize, usize) {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    (me, n, (me + 1) % n, (me + n - 1) % n)
}

/// put into the next PE and get from the previous one, for every size/offset case.
fn put_get<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, next, prev) = ring(pe);
    let pz = poison::<T>();
    for (case, &(len, at)) in CASES.iter().enumerate() {
        let stream = 10 + case as u64;
        let cap = at + len + 5;
        let x = pe.alloc::<T>(cap)?;
        pe.local_fill(&x, pz)?;
        pe.barrier_all()?;
        let data: Vec<T> = rand_vec(me, stream, len);
        pe.put(&x, at, &data, next)?;
        pe.barrier_all()?;
        let from_prev: Vec<T> = rand_vec(prev, stream, len);
        check_range(
            &format!("put len {len} at {at}"),
            &pe.local_vec(&x)?,
            at,
            &from_prev,
            pz,
        );
        // get prev's copy (written by prev-1) into the middle of a poisoned buffer
        let mut buf = vec![pz; len + 2 * at + 3];
        pe.get(&x, at, &mut buf[at + 1..at + 1 + len], prev)?;
        let prev2: Vec<T> = rand_vec((prev + n - 1) % n, stream, len);
        check_range(&format!("get len {len} at {at}"), &buf, at + 1, &prev2, pz);
        // the whole object of the next PE: poison around my data
        let mut all = vec![T::ZERO; cap];
        pe.get(&x, 0, &mut all, next)?;
        check_range("get whole object", &all, at, &data, pz);
        pe.barrier_all()?;
        pe.free(x)?;
    }
    Ok(())
}

/// p and g: every PE writes element `me` of every PE's object, then reads all of them back.
fn p_g<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, _, _) = ring(pe);
    let pz = poison::<T>();
    let x = pe.alloc::<T>(n + 3)?;
    pe.local_fill(&x, pz)?;
    pe.barrier_all()?;
    let value = |writer: usize, target: usize| rand_vec::<T>(writer, 100 + target as u64, 1)[0];
    for t in 0..n {
        pe.p(&x, me + 1, value(me, t), t)?;
    }
    pe.barrier_all()?;
    for t in 0..n {
        assert!(pe.g(&x, 0, t)? == pz, "element 0 of PE {t} was written");
        assert!(
            pe.g(&x, n + 1, t)? == pz,
            "element n+1 of PE {t} was written"
        );
        assert!(
            pe.g(&x, n + 2, t)? == pz,
            "element n+2 of PE {t} was written"
        );
        for w in 0..n {
            let got = pe.g(&x, w + 1, t)?;
            assert!(
                got == value(w, t),
                "g(PE {t}, element of writer {w}) = {got:?}, expected {:?}",
                value(w, t)
            );
        }
    }
    let mut want = vec![pz; n + 3];
    for (w, slot) in want[1..=n].iter_mut().enumerate() {
        *slot = value(w, me);
    }
    check_eq("local copy after p", &pe.local_vec(&x)?, &want);
    pe.barrier_all()?;
    pe.free(x)
}

/// put_nbi / get_nbi / put_signal_nbi: handles, completion queue entries, data.
fn nbi<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, next, prev) = ring(pe);
    let pz = poison::<T>();
    let mut drained = Vec::new();
    assert_eq!(pe.completions(&mut drained), 0, "queue starts empty");
    for (case, &(len, at)) in CASES.iter().enumerate() {
        let stream = 200 + case as u64;
        let x = pe.alloc::<T>(at + len + 2)?;
        let sig = pe.alloc::<u64>(1)?;
        pe.local_fill(&x, pz)?;
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        let data: Vec<T> = rand_vec(me, stream, len);
        let tag = (case as u64) << 32 | me as u64;
        let h = pe.put_nbi(&x, at, &data, next, tag)?;
        let put_id = h.id();
        h.wait()?;
        pe.quiet()?;
        pe.barrier_all()?;
        let mut buf = vec![pz; len + 2];
        let h = pe.get_nbi(&x, at, &mut buf[1..1 + len], prev, tag + 1)?;
        let get_id = h.id();
        pe.quiet()?;
        assert!(h.is_done(), "get handle not done after quiet");
        drop(h);
        let prev2: Vec<T> = rand_vec((prev + n - 1) % n, stream, len);
        check_range("get_nbi", &buf, 1, &prev2, pz);
        let from_prev: Vec<T> = rand_vec(prev, stream, len);
        check_range("put_nbi", &pe.local_vec(&x)?, at, &from_prev, pz);
        pe.barrier_all()?;

        // put_signal_nbi back to the previous PE, which waits for the signal.
        let data2: Vec<T> = rand_vec(me, stream + 1000, len);
        let h = pe.put_signal_nbi(
            &x,
            at,
            &data2,
            Signal::set(&sig, 0, me as u64 + 1),
            prev,
            tag + 2,
        )?;
        let ps_id = h.id();
        pe.quiet()?;
        assert!(h.is_done());
        h.wait()?;
        let from_next_sig = pe.wait_until(&sig, 0, Cmp::Eq, next as u64 + 1)?;
        assert_eq!(from_next_sig, next as u64 + 1);
        let from_next: Vec<T> = rand_vec(next, stream + 1000, len);
        check_range("put_signal_nbi", &pe.local_vec(&x)?, at, &from_next, pz);

        let mut got = Vec::new();
        assert_eq!(pe.completions(&mut got), 3);
        let want = [
            Completion {
                id: put_id,
                kind: OpKind::Put,
                pe: next,
                tag,
            },
            Completion {
                id: get_id,
                kind: OpKind::Get,
                pe: prev,
                tag: tag + 1,
            },
            Completion {
                id: ps_id,
                kind: OpKind::PutSignal,
                pe: prev,
                tag: tag + 2,
            },
        ];
        assert_eq!(got, want, "completion queue of PE {me}");
        assert!(put_id < get_id && get_id < ps_id, "ids increase");
        assert_eq!(pe.completions(&mut got), 0, "drained queue is empty");
        assert_eq!(got.len(), 3, "an empty drain appends nothing");
        drained.extend(got);
        pe.barrier_all()?;
        pe.free(sig)?;
        pe.free(x)?;
    }
    let mut ids: Vec<u64> = drained.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3 * CASES.len(), "ids are unique");
    Ok(())
}

/// put_signal with Set on a ring and with Add from every PE into PE 0; signal_fetch.
fn put_signal<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, next, prev) = ring(pe);
    let pz = poison::<T>();
    for (case, &(len, at)) in CASES.iter().enumerate() {
        let stream = 300 + case as u64;
        // Set: ring, repeated twice with different values on the same signal word.
        let x = pe.alloc::<T>(at + len + 1)?;
        let sig = pe.alloc::<u64>(3)?;
        pe.local_fill(&x, pz)?;
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        for round in 0..2u64 {
            let data: Vec<T> = rand_vec(me, stream + 10 * round, len);
            let v = (me as u64 + 1) << 8 | (round + 1);
            pe.put_signal(&x, at, &data, Signal::set(&sig, 1, v), next)?;
            let want_sig = (prev as u64 + 1) << 8 | (round + 1);
            assert_eq!(pe.wait_until(&sig, 1, Cmp::Eq, want_sig)?, want_sig);
            assert_eq!(pe.signal_fetch(&sig, 1)?, want_sig);
            let from_prev: Vec<T> = rand_vec(prev, stream + 10 * round, len);
            check_range("put_signal set", &pe.local_vec(&x)?, at, &from_prev, pz);
            // nobody touched the neighbouring signal words
            assert_eq!(pe.signal_fetch(&sig, 0)?, 0);
            assert_eq!(pe.signal_fetch(&sig, 2)?, 0);
            pe.barrier_all()?;
        }
        pe.free(sig)?;
        pe.free(x)?;

        // Add: every PE writes its slice of PE 0's object and adds me+1 to one signal.
        let stride = len + 1;
        let y = pe.alloc::<T>(n * stride + at)?;
        let sig = pe.alloc::<u64>(1)?;
        pe.local_fill(&y, pz)?;
        pe.local_fill(&sig, 0)?;
        pe.barrier_all()?;
        let data: Vec<T> = rand_vec(me, stream + 500, len);
        pe.put_signal(
            &y,
            at + me * stride,
            &data,
            Signal::add(&sig, 0, me as u64 + 1),
            0,
        )?;
        if me == 0 {
            let total = (n * (n + 1) / 2) as u64;
            assert_eq!(pe.wait_until(&sig, 0, Cmp::Ge, total)?, total);
            let got = pe.local_vec(&y)?;
            for w in 0..n {
                let d: Vec<T> = rand_vec(w, stream + 500, len);
                check_eq("put_signal add slice", &got[at + w * stride..][..len], &d);
                let gap = at + w * stride + len;
                assert!(got[gap] == pz, "gap after writer {w} overwritten");
            }
            assert!(got[..at].iter().all(|v| *v == pz), "head overwritten");
        }
        pe.barrier_all()?;
        // every PE reads back its own slice and the signal from PE 0, and checks that its
        // own copy (not a target) was left alone
        let mut back = vec![pz; len + 2];
        pe.get(&y, at + me * stride, &mut back[1..=len], 0)?;
        check_range("put_signal add read back", &back, 1, &data, pz);
        let total = (n * (n + 1) / 2) as u64;
        assert_eq!(pe.atomic_fetch(&sig, 0, 0)?, total, "signal of PE 0");
        if me != 0 {
            assert!(
                pe.local_vec(&y)?.iter().all(|v| *v == pz),
                "PE {me} was written"
            );
            assert_eq!(pe.signal_fetch(&sig, 0)?, 0, "PE {me}'s signal was updated");
        }
        pe.barrier_all()?;
        pe.free(sig)?;
        pe.free(y)?;
    }
    Ok(())
}

/// Every PE puts its slice into PE 0 at the same time, then reads the whole of PE 0's copy.
fn many_to_one<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, _, _) = ring(pe);
    let pz = poison::<T>();
    let len = 257;
    let x = pe.alloc::<T>(1 + n * len + 1)?;
    pe.local_fill(&x, pz)?;
    pe.barrier_all()?;
    let data: Vec<T> = rand_vec(me, 400, len);
    pe.put(&x, 1 + me * len, &data, 0)?;
    pe.fence();
    pe.p(&x, 1 + me * len, data[0], 0)?;
    pe.barrier_all()?;
    let mut all = vec![T::ZERO; 1 + n * len + 1];
    pe.get(&x, 0, &mut all, 0)?;
    assert!(all[0] == pz && all[n * len + 1] == pz, "poison around");
    for w in 0..n {
        let d: Vec<T> = rand_vec(w, 400, len);
        check_eq("many to one", &all[1 + w * len..][..len], &d);
    }
    pe.barrier_all()?;
    pe.free(x)
}

/// 1 MiB put and get at an unaligned element offset.
fn large<T: Elem>(pe: &Pe) -> Result<()> {
    let (me, n, next, prev) = ring(pe);
    let pz = poison::<T>();
    let len = (1 << 20) / std::mem::size_of::<T>();
    let x = pe.alloc::<T>(len + 2)?;
    pe.local_fill(&x, pz)?;
    pe.barrier_all()?;
    let data: Vec<T> = rand_vec(me, 500, len);
    pe.put(&x, 1, &data, next)?;
    pe.barrier_all()?;
    let from_prev: Vec<T> = rand_vec(prev, 500, len);
    check_range("1 MiB put", &pe.local_vec(&x)?, 1, &from_prev, pz);
    let mut buf = vec![pz; len + 1];
    pe.get(&x, 1, &mut buf[..len], prev)?;
    let prev2: Vec<T> = rand_vec((prev + n - 1) % n, 500, len);
    check_range("1 MiB get", &buf, 0, &prev2, pz);
    pe.barrier_all()?;
    pe.free(x)
}

macro_rules! per_type {
    ($t:ty, $k:ident) => {
        #[allow(non_snake_case)]
        mod $k {
            crate::mode_test!(put_get, [1, 2, 3, 8], super::put_get::<$t>);
            crate::mode_test!(p_g, [1, 2, 3, 8], super::p_g::<$t>);
            crate::mode_test!(nbi, [1, 2, 3, 8], super::nbi::<$t>);
            crate::mode_test!(put_signal, [1, 2, 3, 8], super::put_signal::<$t>);
            crate::mode_test!(many_to_one, [2, 3, 8], super::many_to_one::<$t>);
            crate::mode_test!(large_1mib, [1, 2], super::large::<$t>);
        }
    };
}
rshmem::for_each_elem!(per_type);

/// fence and quiet on their own: ordering of a data put and a flag put to the same PE.
fn fence_quiet(pe: &Pe) -> Result<()> {
    let (me, _, next, prev) = ring(pe);
    let x = pe.alloc::<u64>(64)?;
    let flag = pe.alloc::<u64>(1)?;
    pe.local_fill(&x, 0)?;
    pe.local_fill(&flag, 0)?;
    pe.barrier_all()?;
    for round in 1..=20u64 {
        let data: Vec<u64> = (0..64).map(|i| round * 1000 + me as u64 * 64 + i).collect();
        pe.put(&x, 0, &data, next)?;
        pe.fence();
        pe.atomic_set(&flag, 0, round, next)?;
        pe.wait_until(&flag, 0, Cmp::Eq, round)?;
        let want: Vec<u64> = (0..64)
            .map(|i| round * 1000 + prev as u64 * 64 + i)
            .collect();
        check_eq("data after fenced flag", &pe.local_vec(&x)?, &want);
        pe.quiet()?;
        pe.sync_all()?;
    }
    pe.barrier_all()?;
    pe.free(flag)?;
    pe.free(x)
}
mode_test!(fence_quiet_ordering, [1, 2, 3, 8], fence_quiet);

/// Signal adds wrap: PE 0's signal starts at u64::MAX and every PE adds 1 with a zero-length
/// put; the result is n - 1.
fn signal_add_wraps(pe: &Pe) -> Result<()> {
    let n = pe.n_pes() as u64;
    let x = pe.alloc::<u8>(1)?;
    let sig = pe.alloc::<u64>(1)?;
    pe.local_fill(&sig, u64::MAX)?;
    pe.barrier_all()?;
    pe.put_signal(&x, 1, &[], Signal::add(&sig, 0, 1), 0)?;
    if pe.my_pe() == 0 {
        assert_eq!(pe.wait_until(&sig, 0, Cmp::Eq, n - 1)?, n - 1);
    }
    pe.barrier_all()?;
    pe.free(sig)?;
    pe.free(x)
}
mode_test!(signal_add_wrapping, [1, 3], signal_add_wraps);
