//! The device team barrier (`rshmem_team_sync_block`).

use super::*;

/// A team as kernels see it (`rshmem_team`): strided world PEs and a barrier slot.
#[derive(Clone, Copy)]
pub(super) struct Team {
    pub(super) slot: usize,
    pub(super) start: usize,
    pub(super) stride: usize,
    pub(super) size: usize,
}

impl Team {
    pub(super) fn member(&self, i: usize) -> usize {
        self.start + i * self.stride
    }
    pub(super) fn has(&self, pe: usize) -> bool {
        (0..self.size).any(|i| self.member(i) == pe)
    }
}

/// Every PE's barrier counters (`sync_bar`): PE `p`, slot `s`, member `q` at `(p*slots+s)*n+q`.
pub(super) struct BarMem {
    pub(super) n: usize,
    pub(super) slots: usize,
    pub(super) ctr: Vec<AtomicU64>,
}

impl BarMem {
    pub(super) fn new(n: usize, slots: usize) -> BarMem {
        BarMem {
            n,
            slots,
            ctr: words(n * slots * n),
        }
    }
    pub(super) fn at(&self, pe: usize, slot: usize, member: usize) -> &AtomicU64 {
        &self.ctr[(pe * self.slots + slot) * self.n + member]
    }
}

/// One PE's side of `rshmem_team_sync_block`: its expectations (`sync_exp`, its own memory).
pub(super) struct BarPe {
    pub(super) me: usize,
    pub(super) exp: Vec<u64>,
}

impl BarPe {
    pub(super) fn new(me: usize, mem: &BarMem) -> BarPe {
        BarPe {
            me,
            exp: vec![0; mem.slots * mem.n],
        }
    }

    /// `rshmem_team_sync_block(team)`, validity checks passed: `fence.sc.sys` (tid 0), then
    /// `red.add.release` of 1 into every member's counter for this PE, then for every member
    /// the expectation `+1` (own memory) and an acquire-polling wait on this PE's counter for
    /// that member. This PE's own counter (its add and its wait, always satisfied at once) is
    /// left out: it only orders the thread with itself.
    pub(super) fn sync(&mut self, mem: &BarMem, t: &Team) {
        fence(Ordering::SeqCst);
        for i in 0..t.size {
            let pe = t.member(i);
            if pe != self.me {
                mem.at(pe, t.slot, self.me).fetch_add(1, Ordering::Release);
            }
        }
        for i in 0..t.size {
            let pe = t.member(i);
            let x = &mut self.exp[t.slot * mem.n + pe];
            *x += 1;
            let e = *x;
            if pe != self.me {
                let c = mem.at(self.me, t.slot, pe);
                spin(|| c.load(Ordering::Acquire) >= e);
            }
        }
    }
}

/// Barrier model, 2 PEs on the world slot: data written before a barrier is read after it
/// (loom flags the read if the barrier let the reader pass before the writer arrived), and
/// overwritten after the next barrier (flags a PE passing barrier 2 while its peer still reads
/// before it); then once more, so a fast PE's arrivals for barrier `k+1` meet a slow one
/// still waiting in `k`.
#[test]
pub(super) fn loom_device_barrier_two_pes() {
    builder(3).check(|| {
        let mem = Arc::new(BarMem::new(2, 1));
        let a = Arc::new(Cells::new(2));
        let world = Team {
            slot: 0,
            start: 0,
            stride: 1,
            size: 2,
        };
        let hs: Vec<_> = (0..2)
            .map(|me| {
                let (mem, a) = (mem.clone(), a.clone());
                loom::thread::spawn(move || {
                    let mut b = BarPe::new(me, &mem);
                    let other = 1 - me;
                    a.put(me, 1);
                    b.sync(&mem, &world);
                    assert_eq!(a.get(other), 1);
                    b.sync(&mem, &world);
                    a.put(me, 2);
                    b.sync(&mem, &world);
                    assert_eq!(a.get(other), 2);
                    b.exp
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), vec![3, 3]);
        }
    });
}

/// Barrier model, 3 PEs: the world (slot 0) and a strided team {0, 2} (slot 1) whose barriers
/// fall between the world's on its members while PE 1 runs ahead into the next world barrier.
/// The same read-after / overwrite-after checks for both teams, and every counter ends at the
/// number of barriers done. Without preemptions (threads switch where they wait): 3 spinning
/// threads with one preemption take minutes.
#[test]
pub(super) fn loom_device_barrier_three_pes_two_slots() {
    builder(0).check(|| {
        let mem = Arc::new(BarMem::new(3, 2));
        let a = Arc::new(Cells::new(3));
        let b = Arc::new(Cells::new(3));
        let world = Team {
            slot: 0,
            start: 0,
            stride: 1,
            size: 3,
        };
        let sub = Team {
            slot: 1,
            start: 0,
            stride: 2,
            size: 2,
        };
        let hs: Vec<_> = (0..3)
            .map(|me| {
                let (mem, a, b) = (mem.clone(), a.clone(), b.clone());
                loom::thread::spawn(move || {
                    let mut bar = BarPe::new(me, &mem);
                    a.put(me, 1);
                    bar.sync(&mem, &world);
                    for p in (0..3).filter(|&p| p != me) {
                        assert_eq!(a.get(p), 1);
                    }
                    if sub.has(me) {
                        b.put(me, 1);
                        bar.sync(&mem, &sub);
                        assert_eq!(b.get(2 - me), 1);
                    }
                    bar.sync(&mem, &world);
                    a.put(me, 2);
                    if sub.has(me) {
                        bar.sync(&mem, &sub);
                        b.put(me, 2);
                    }
                    bar.exp
                })
            })
            .collect();
        let exps: Vec<Vec<u64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for (p, e) in exps.iter().enumerate() {
            for q in 0..3 {
                assert_eq!(e[q], 2, "world expectations");
                let own = |v: u64| if p == q { 0 } else { v };
                assert_eq!(mem.at(p, 0, q).load(Ordering::Relaxed), own(2));
                let s = if sub.has(p) && sub.has(q) { 2 } else { 0 };
                assert_eq!(e[3 + q], s, "team expectations");
                assert_eq!(mem.at(p, 1, q).load(Ordering::Relaxed), own(s));
            }
        }
    });
}
