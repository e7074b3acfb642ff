//! The lock that serialises a PE's use of its backend stream, handed out in arrival order.
//!
//! A host `wait_until` on a GPU word polls by a kernel and a copy under this lock, back to back.
//! With an unfair lock the poller takes it again before a woken thread gets there, so a proxy
//! thread serving a peer's put-with-signal (a copy and an atomic on the same stream) could wait
//! behind the very poll that waits for that signal until the timeout. Tickets make every
//! waiter's turn come after at most one turn of each thread ahead of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct TicketLock {
    next: AtomicU64,
    serving: AtomicU64,
}

/// Holds a [`TicketLock`]; the next ticket is served when it drops (also while unwinding).
#[derive(Debug)]
pub(crate) struct TicketGuard<'a>(&'a TicketLock);

impl TicketLock {
    /// Waits for this caller's turn: spins briefly, then yields, then sleeps between looks
    /// (a holder may be synchronising a long stream).
    pub fn lock(&self) -> TicketGuard<'_> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let mut i: u32 = 0;
        while self.serving.load(Ordering::Acquire) != ticket {
            i = i.saturating_add(1);
            if i < 64 {
                std::hint::spin_loop();
            } else if i < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        TicketGuard(self)
    }

    /// Tickets taken and not yet served (the holder's included).
    #[cfg(test)]
    fn queued(&self) -> u64 {
        self.next.load(Ordering::Relaxed) - self.serving.load(Ordering::Relaxed)
    }
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        self.0.serving.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::TicketLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    #[test]
    fn exclusive_every_increment_lands_once() {
        let lock = Arc::new(TicketLock::default());
        let count = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (lock, count) = (lock.clone(), count.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let _g = lock.lock();
                        // A non-atomic read-modify-write: only exclusion keeps it exact.
                        let v = count.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        count.store(v + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no thread panics");
        }
        assert_eq!(count.load(Ordering::Relaxed), 8000);
    }

    #[test]
    fn a_thread_taking_the_lock_again_at_once_waits_behind_a_queued_one() {
        let lock = Arc::new(TicketLock::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let g = lock.lock();
        order.lock().unwrap().push("a");
        let b = {
            let (lock, order) = (lock.clone(), order.clone());
            std::thread::spawn(move || {
                let _g = lock.lock();
                order.lock().unwrap().push("b");
            })
        };
        while lock.queued() < 2 {
            std::thread::yield_now();
        }
        drop(g);
        let g = lock.lock();
        order.lock().unwrap().push("a");
        drop(g);
        b.join().expect("b runs");
        assert_eq!(*order.lock().unwrap(), ["a", "b", "a"]);
        assert_eq!(lock.queued(), 0);
    }
}
