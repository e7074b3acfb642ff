//! Heaps of ended PEs kept until every PE of their world in this process has ended.
//!
//! Thread PEs of one world reach each other's GPU heaps through direct pointers (over NVLink
//! or PCIe when the peer's GPU differs). A PE that ends first (its finalize barrier timed out
//! because a peer is stuck, or it simply finished earlier) must not free its heap while a
//! peer's kernel may still read or write it: on another GPU that access faults, and the fault
//! is sticky, poisoning every later use of that GPU's context in the process (after barriers
//! time out, the PEs that keep running get `CUDA_ERROR_ILLEGAL_ADDRESS`). So a PE's heap goes
//! here when it ends, and the last PE of the world in this process releases them all, after
//! synchronising every GPU they live on (kernels of timed-out waits drain within the device
//! timeout).

use std::sync::Mutex;

/// Items of ended members, per world, until the last local member ends.
#[derive(Debug)]
pub(crate) struct Graveyard<T> {
    worlds: Mutex<Vec<(u64, usize, Vec<T>)>>,
}

impl<T> Graveyard<T> {
    pub(crate) const fn new() -> Self {
        Graveyard {
            worlds: Mutex::new(Vec::new()),
        }
    }

    /// Keeps `item` of a member of world `key`, whose members in this process are `local`
    /// (the same for every member). Returns every item of the world once its `local`-th member
    /// arrived (the caller releases them), else `None`.
    pub(crate) fn bury(&self, key: u64, local: usize, item: T) -> Option<Vec<T>> {
        if local <= 1 {
            return Some(vec![item]);
        }
        let mut w = self.worlds.lock().unwrap_or_else(|e| e.into_inner());
        let i = match w.iter().position(|(k, _, _)| *k == key) {
            Some(i) => i,
            None => {
                w.push((key, local, Vec::with_capacity(local)));
                w.len() - 1
            }
        };
        w[i].2.push(item);
        w[i].1 -= 1;
        if w[i].1 == 0 {
            Some(w.swap_remove(i).2)
        } else {
            None
        }
    }
}

/// A key every member of one world computes alike from the heap records they all gathered
/// (live allocations differ, so two worlds alive at once get different keys).
pub(crate) fn world_key(records: &[Vec<u8>]) -> u64 {
    // FNV-1a over the records and their lengths.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in records {
        for b in (r.len() as u64).to_le_bytes().iter().chain(r.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_local_member_releases_its_world_only() {
        let g = Graveyard::new();
        assert_eq!(g.bury(1, 3, 10), None);
        assert_eq!(g.bury(2, 2, 20), None);
        assert_eq!(g.bury(1, 3, 11), None);
        let mut a = g.bury(1, 3, 12).expect("third of three");
        a.sort_unstable();
        assert_eq!(a, vec![10, 11, 12]);
        assert_eq!(g.bury(2, 2, 21), Some(vec![20, 21]));
        // A world of one local member releases at once; the table is empty again.
        assert_eq!(g.bury(3, 1, 30), Some(vec![30]));
        assert!(g.worlds.lock().unwrap().is_empty());
    }

    #[test]
    fn keys_follow_the_records() {
        let a = vec![vec![1u8, 2], vec![3]];
        let b = vec![vec![1u8], vec![2, 3]];
        assert_eq!(world_key(&a), world_key(&a.clone()));
        assert_ne!(world_key(&a), world_key(&b));
    }
}
