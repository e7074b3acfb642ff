//! Atomics on i32, u32, i64, u64: every operation against a sequential model with random
//! full-range operands (wrapping included), exact results under contention from every PE,
//! wait_until and test with every comparison, atomics through a `SymView`.

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{rand_atomic, rand_bits, wadd};
use rshmem::{AtomicElem, Cmp, Pe, Result};

/// Each PE runs a random sequence of every atomic operation on its own word of the next PE and
/// checks every returned old value against a model; the owner then checks the final values.
fn model<T: AtomicElem>(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let steps = 200;
    // Word `me` on PE `next` is written only by this PE; words n.. stay untouched.
    let x = pe.alloc::<T>(n + 2)?;
    let guard = T::from_bits(0x5a5a_5a5a_5a5a_5a5a);
    pe.local_fill(&x, guard)?;
    pe.barrier_all()?;
    let run = |who: usize, apply: &mut dyn FnMut(u64, T, T, T) -> Result<T>| -> Result<T> {
        let ops = rand_bits(who, 1, steps);
        let a: Vec<T> = rand_atomic(who, 2, steps);
        let b: Vec<T> = rand_atomic(who, 3, steps);
        let mut cur = guard;
        for i in 0..steps {
            cur = {
                let old = apply(ops[i] % 15, a[i], b[i], cur)?;
                assert!(
                    old == cur,
                    "step {i} op {}: old {old:?}, model {cur:?}",
                    ops[i] % 15
                );
                next_value(ops[i] % 15, a[i], b[i], cur)
            };
        }
        Ok(cur)
    };
    // The real run against PE `next`, returning the old value each operation reports (for ops
    // without a return, a fetch before it, which is exact as nobody else writes this word).
    let mine = run(me, &mut |op, a, b, cur| {
        let old = match op {
            0 => pe.atomic_fetch(&x, me, next)?,
            1 => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_set(&x, me, a, next)?;
                o
            }
            2 => pe.atomic_swap(&x, me, a, next)?,
            // compare_swap that succeeds (cond = current) and one that fails (cond != current)
            3 => pe.atomic_compare_swap(&x, me, cur, a, next)?,
            4 => {
                let cond = if b == cur {
                    wadd(b, T::from_bits(1))
                } else {
                    b
                };
                pe.atomic_compare_swap(&x, me, cond, a, next)?
            }
            5 => pe.atomic_fetch_add(&x, me, a, next)?,
            6 => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_add(&x, me, a, next)?;
                o
            }
            7 => pe.atomic_fetch_and(&x, me, bor(a, b), next)?,
            8 => pe.atomic_fetch_or(&x, me, band(a, b), next)?,
            9 => pe.atomic_fetch_xor(&x, me, a, next)?,
            10 => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_and(&x, me, bor(a, b), next)?;
                o
            }
            11 => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_or(&x, me, band(a, b), next)?;
                o
            }
            12 => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_xor(&x, me, a, next)?;
                o
            }
            13 => pe.atomic_fetch_inc(&x, me, next)?,
            _ => {
                let o = pe.atomic_fetch(&x, me, next)?;
                pe.atomic_inc(&x, me, next)?;
                o
            }
        };
        Ok(old)
    })?;
    assert!(
        pe.atomic_fetch(&x, me, next)? == mine,
        "final value on PE {next}"
    );
    pe.barrier_all()?;
    // The owner recomputes what its previous PE did to word `prev`, from that PE's seeds.
    let theirs = run(prev, &mut |_, _, _, cur| Ok(cur))?;
    let local = pe.local_vec(&x)?;
    assert!(local[prev] == theirs, "word written by PE {prev}");
    for (i, v) in local.iter().enumerate() {
        if i != prev {
            assert!(*v == guard, "word {i} touched: {v:?}");
        }
    }
    pe.barrier_all()?;
    pe.free(x)
}

fn bor<T: AtomicElem>(a: T, b: T) -> T {
    T::from_bits(a.to_bits() | b.to_bits())
}
fn band<T: AtomicElem>(a: T, b: T) -> T {
    T::from_bits(a.to_bits() & b.to_bits())
}

/// The value after operation `op` (as numbered in `model`).
fn next_value<T: AtomicElem>(op: u64, a: T, b: T, cur: T) -> T {
    let bits = |f: fn(u64, u64) -> u64, v: T| T::from_bits(f(cur.to_bits(), v.to_bits()));
    match op {
        0 => cur,
        1..=3 => a,
        4 => cur,
        5 | 6 => wadd(cur, a),
        7 | 10 => bits(|x, y| x & y, bor(a, b)),
        8 | 11 => bits(|x, y| x | y, band(a, b)),
        9 | 12 => bits(|x, y| x ^ y, a),
        _ => wadd(cur, T::from_bits(1)),
    }
}

/// Edge cases of wrapping, with the exact bit patterns.
fn wrapping<T: AtomicElem>(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let x = pe.alloc::<T>(1)?;
    let t = (me + 1) % n;
    let ones = T::from_bits(u64::MAX); // -1 or MAX
    let zero = T::from_bits(0);
    let bits = std::mem::size_of::<T>() * 8;
    let top = T::from_bits(1 << (bits - 1)); // MIN for signed, 2^(bits-1) for unsigned
    let below_top = T::from_bits((1 << (bits - 1)) - 1); // MAX for signed
    pe.barrier_all()?;
    pe.atomic_set(&x, 0, ones, t)?;
    assert!(pe.atomic_fetch_inc(&x, 0, t)? == ones);
    assert!(
        pe.atomic_fetch(&x, 0, t)? == zero,
        "all ones + 1 wraps to 0"
    );
    pe.atomic_add(&x, 0, ones, t)?;
    assert!(
        pe.atomic_fetch(&x, 0, t)? == ones,
        "0 + all ones = all ones"
    );
    pe.atomic_set(&x, 0, below_top, t)?;
    pe.atomic_inc(&x, 0, t)?;
    assert!(
        pe.atomic_fetch(&x, 0, t)? == top,
        "MAX+1 wraps to MIN (signed)"
    );
    assert!(pe.atomic_fetch_add(&x, 0, top, t)? == top);
    assert!(pe.atomic_fetch(&x, 0, t)? == zero, "MIN + MIN = 0");
    // compare_swap failure leaves the value, success replaces it; old value both times
    assert!(pe.atomic_compare_swap(&x, 0, ones, top, t)? == zero);
    assert!(pe.atomic_fetch(&x, 0, t)? == zero);
    assert!(pe.atomic_compare_swap(&x, 0, zero, top, t)? == zero);
    assert!(pe.atomic_fetch(&x, 0, t)? == top);
    assert!(pe.atomic_swap(&x, 0, ones, t)? == top);
    assert!(pe.atomic_fetch_xor(&x, 0, top, t)? == ones);
    assert!(pe.atomic_fetch(&x, 0, t)? == below_top);
    assert!(pe.atomic_fetch_and(&x, 0, zero, t)? == below_top);
    assert!(pe.atomic_fetch_or(&x, 0, top, t)? == zero);
    assert!(pe.atomic_fetch(&x, 0, t)? == top);
    pe.barrier_all()?;
    pe.free(x)
}

/// Every PE hammers PE 0: fetch_add tickets are exactly 0..n*k, add/inc sums are exact,
/// fetch_or/xor bit sets, compare_swap has exactly one winner, a CAS loop counts exactly.
fn contention<T: AtomicElem>(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let k = 64;
    // words: 0 ticket, 1 add sum, 2 inc count, 3 or-bits, 4 xor-bits, 5 cas lock, 6 cas counter
    let c = pe.alloc::<T>(8)?;
    let tickets = pe.alloc::<T>(n * k)?;
    let won = pe.alloc::<T>(n)?;
    pe.local_fill(&c, T::from_bits(0))?;
    // poison: not a ticket, not a win flag
    pe.local_fill(&tickets, T::from_bits(0x7777))?;
    pe.local_fill(&won, T::from_bits(0x7777))?;
    pe.barrier_all()?;
    let mut mine = Vec::with_capacity(k);
    for i in 0..k {
        mine.push(pe.atomic_fetch_add(&c, 0, T::from_bits(1), 0)?);
        pe.atomic_add(&c, 1, T::from_bits((me * 1000 + i) as u64), 0)?;
        pe.atomic_inc(&c, 2, 0)?;
        if i < 2 {
            pe.atomic_fetch_xor(&c, 4, T::from_bits(1 << me), 0)?;
        }
        if i == 0 {
            pe.atomic_fetch_or(&c, 3, T::from_bits(1 << me), 0)?;
        }
        // CAS increment loop
        let mut cur = pe.atomic_fetch(&c, 6, 0)?;
        loop {
            let old = pe.atomic_compare_swap(&c, 6, cur, wadd(cur, T::from_bits(1)), 0)?;
            if old == cur {
                break;
            }
            cur = old;
        }
    }
    let winner = pe.atomic_compare_swap(&c, 5, T::from_bits(0), T::from_bits(me as u64 + 1), 0)?
        == T::from_bits(0);
    pe.put(&tickets, me * k, &mine, 0)?;
    pe.p(&won, me, T::from_bits(winner as u64), 0)?;
    pe.barrier_all()?;
    // every PE checks PE 0's words (read remotely), and that its own copy was not a target
    let remote = |s: &rshmem::Sym<T>| -> Result<Vec<T>> {
        let mut v = vec![T::from_bits(0x5a5a); s.len()];
        pe.get(s, 0, &mut v, 0)?;
        Ok(v)
    };
    {
        let total = (n * k) as u64;
        let mut t: Vec<u64> = remote(&tickets)?.iter().map(|v| v.to_bits()).collect();
        t.sort_unstable();
        assert_eq!(
            t,
            (0..total).collect::<Vec<_>>(),
            "tickets 0..n*k each once"
        );
        let v = remote(&c)?;
        let bits = |x: T| x.to_bits();
        assert_eq!(bits(v[0]), total);
        let sum: u64 = (0..n)
            .flat_map(|p| (0..k).map(move |i| (p * 1000 + i) as u64))
            .sum();
        assert_eq!(bits(v[1]), sum);
        assert_eq!(bits(v[2]), total);
        assert_eq!(bits(v[3]), (1 << n) - 1, "one bit per PE");
        assert_eq!(bits(v[4]), 0, "every bit toggled twice");
        let wins = remote(&won)?;
        assert!(
            wins.iter().all(|&x| bits(x) <= 1),
            "every PE wrote its flag: {wins:?}"
        );
        let winners: Vec<usize> = (0..n).filter(|&p| bits(wins[p]) == 1).collect();
        assert_eq!(winners.len(), 1, "exactly one compare_swap winner");
        assert_eq!(bits(v[5]), winners[0] as u64 + 1);
        assert_eq!(bits(v[6]), total, "CAS loop count");
        assert_eq!(bits(v[7]), 0);
        if me != 0 {
            assert!(
                pe.local_vec(&c)?.iter().all(|&x| bits(x) == 0),
                "PE {me}'s counters were written"
            );
        }
    }
    pe.barrier_all()?;
    pe.free(won)?;
    pe.free(tickets)?;
    pe.free(c)
}

/// wait_until and test with every comparison: the previous PE makes the condition true.
fn waits<T: AtomicElem>(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let next = (me + 1) % n;
    let f = |v: f64| T::from_f64(v);
    let target = f(100.0);
    // (cmp, initial value (false), value written (true))
    let cases = [
        (Cmp::Eq, f(0.0), f(100.0)),
        (Cmp::Ne, f(100.0), f(7.0)),
        (Cmp::Gt, f(100.0), f(101.0)),
        (Cmp::Ge, f(99.0), f(100.0)),
        (Cmp::Lt, f(100.0), f(-3.0)), // -3 for signed types, 0 for unsigned
        (Cmp::Le, f(101.0), f(100.0)),
        // signed: -1 < 100 so Gt is false until 200; unsigned: MAX > 100 would be true, so
        // this case starts from 0 there.
        (Cmp::Gt, f(-1.0), f(200.0)),
    ];
    let x = pe.alloc::<T>(2)?;
    for (i, &(cmp, init, write)) in cases.iter().enumerate() {
        pe.atomic_set(&x, 0, init, me)?;
        pe.atomic_set(&x, 1, init, me)?;
        pe.barrier_all()?;
        assert!(
            !pe.test(&x, 0, cmp, target)?,
            "case {i}: {cmp:?} true too early"
        );
        assert!(!pe.test(&x, 1, cmp, target)?);
        pe.barrier_all()?;
        pe.atomic_set(&x, 0, write, next)?;
        let seen = pe.wait_until(&x, 0, cmp, target)?;
        assert!(seen == write, "case {i}: wait_until saw {seen:?}");
        assert!(pe.test(&x, 0, cmp, target)?);
        assert!(!pe.test(&x, 1, cmp, target)?, "the other word is unchanged");
        // already true: returns at once with the value
        assert!(pe.wait_until(&x, 0, cmp, target)? == write);
        pe.barrier_all()?;
    }
    pe.free(x)
}

/// Atomics and waits through a byte object viewed as words.
fn views<T: AtomicElem>(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let sz = std::mem::size_of::<T>();
    let bytes = pe.alloc::<u8>(4 * sz)?;
    pe.local_fill(&bytes, 0)?;
    pe.barrier_all()?;
    let w = bytes.view::<T>(2 * sz, 2)?;
    assert_eq!(w.len(), 2);
    pe.atomic_add(&w, 1, T::from_bits(me as u64 + 1), 0)?;
    pe.barrier_all()?;
    let total = (n * (n + 1) / 2) as u64;
    if me == 0 {
        assert!(pe.wait_until(&w, 1, Cmp::Eq, T::from_bits(total))? == T::from_bits(total));
    }
    // every PE reads PE 0's bytes; its own stay zero unless it is PE 0
    let mut raw = vec![0xa5u8; 4 * sz];
    pe.get(&bytes, 0, &mut raw, 0)?;
    let mut want = vec![0u8; 4 * sz];
    want[3 * sz..].copy_from_slice(&total.to_le_bytes()[..sz]);
    assert_eq!(raw, want, "only the viewed word changed");
    assert!(pe.atomic_fetch(&w, 1, 0)? == T::from_bits(total));
    if me != 0 {
        assert_eq!(
            pe.local_vec(&bytes)?,
            vec![0u8; 4 * sz],
            "PE {me} was written"
        );
    }
    pe.barrier_all()?;
    pe.free(bytes)
}

macro_rules! per_type {
    ($k:ident, $t:ty) => {
        #[allow(non_snake_case)]
        mod $k {
            crate::mode_test!(model, [1, 2, 3, 8], super::model::<$t>);
            crate::mode_test!(wrapping, [1, 2, 3], super::wrapping::<$t>);
            crate::mode_test!(contention, [1, 2, 3, 8], super::contention::<$t>);
            crate::mode_test!(waits, [1, 2, 3, 8], super::waits::<$t>);
            crate::mode_test!(views, [1, 3], super::views::<$t>);
        }
    };
}
per_type!(I32, i32);
per_type!(U32, u32);
per_type!(I64, i64);
per_type!(U64, u64);
