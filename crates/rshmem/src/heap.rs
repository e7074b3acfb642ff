//! The symmetric heap's allocator: deterministic first-fit over one address range.
//!
//! Every PE runs the same sequence of collective allocations and frees on its own copy of this
//! allocator, so every object lands at the same offset everywhere. The allocator is plain data
//! (no memory access), so it is tested directly, also under Miri.

use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Smallest alignment and granule of the heap: a cache line, so that objects never share one and
/// symmetric buffers are 64-byte aligned relative to each other (glibc memcpy is slow otherwise).
pub const MIN_ALIGN: usize = 64;

/// Deterministic first-fit allocator over `0..size`.
#[derive(Debug, Clone)]
pub struct HeapAllocator {
    size: usize,
    /// Free blocks: offset → length, coalesced.
    free: BTreeMap<usize, usize>,
    /// Live blocks: offset → length.
    used: BTreeMap<usize, usize>,
}

fn round_up(v: usize, a: usize) -> Option<usize> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

impl HeapAllocator {
    /// An empty heap of `size` bytes (rounded down to the granule).
    pub fn new(size: usize) -> Self {
        let size = size & !(MIN_ALIGN - 1);
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        HeapAllocator {
            size,
            free,
            used: BTreeMap::new(),
        }
    }

    /// Heap size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes currently allocated.
    pub fn used_bytes(&self) -> usize {
        self.used.values().sum()
    }

    /// Largest free block.
    pub fn largest_free(&self) -> usize {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Allocates `bytes` (0 is allowed and takes one granule) at an alignment that is a power of
    /// two; returns the offset.
    pub fn alloc(&mut self, bytes: usize, align: usize) -> Result<usize> {
        if align == 0 || !align.is_power_of_two() {
            return Err(Error::Misaligned {
                offset: align,
                align: 0,
            });
        }
        let align = align.max(MIN_ALIGN);
        let exhausted = |s: &Self| Error::HeapExhausted {
            requested: bytes,
            largest_free: s.largest_free(),
            heap_size: s.size,
        };
        let len = round_up(bytes.max(1), MIN_ALIGN).ok_or_else(|| exhausted(self))?;
        let mut pick = None;
        for (&off, &flen) in &self.free {
            let Some(start) = round_up(off, align) else {
                continue;
            };
            if start.checked_add(len).is_some_and(|end| end <= off + flen) {
                pick = Some((off, flen, start));
                break;
            }
        }
        let (off, flen, start) = pick.ok_or_else(|| exhausted(self))?;
        self.free.remove(&off);
        if start > off {
            self.free.insert(off, start - off);
        }
        let end = start + len;
        if end < off + flen {
            self.free.insert(end, off + flen - end);
        }
        self.used.insert(start, len);
        Ok(start)
    }

    /// Frees the block at `offset`; an offset that is not a live block is an error.
    pub fn free(&mut self, offset: usize) -> Result<()> {
        let len = self.used.remove(&offset).ok_or_else(|| {
            Error::invalid(format!(
                "free of offset {offset}, which is not a live allocation"
            ))
        })?;
        let mut start = offset;
        let mut end = offset + len;
        if let Some((&poff, &plen)) = self.free.range(..offset).next_back() {
            if poff + plen == offset {
                self.free.remove(&poff);
                start = poff;
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_aligned() {
        let mut a = HeapAllocator::new(1 << 20);
        let mut b = HeapAllocator::new(1 << 20);
        let reqs = [(1, 8), (100, 64), (0, 1), (4096, 4096), (7, 256)];
        for &(n, al) in &reqs {
            let x = a.alloc(n, al).unwrap();
            let y = b.alloc(n, al).unwrap();
            assert_eq!(x, y);
            assert_eq!(x % al.max(MIN_ALIGN), 0);
        }
    }

    #[test]
    fn no_overlap_and_coalesce() {
        let mut a = HeapAllocator::new(64 * 16);
        let offs: Vec<usize> = (0..16).map(|_| a.alloc(64, 64).unwrap()).collect();
        let mut sorted = offs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 16);
        assert!(matches!(a.alloc(1, 1), Err(Error::HeapExhausted { .. })));
        for (i, o) in offs.iter().enumerate() {
            if i % 2 == 0 {
                a.free(*o).unwrap();
            }
        }
        assert_eq!(a.largest_free(), 64);
        for (i, o) in offs.iter().enumerate() {
            if i % 2 == 1 {
                a.free(*o).unwrap();
            }
        }
        assert_eq!(a.largest_free(), 64 * 16);
        assert_eq!(a.used_bytes(), 0);
        assert_eq!(a.alloc(64 * 16, 64).unwrap(), 0);
    }

    #[test]
    fn errors() {
        let mut a = HeapAllocator::new(4096);
        assert!(matches!(
            a.alloc(8, 3),
            Err(Error::Misaligned {
                offset: 3,
                align: 0
            })
        ));
        assert!(matches!(
            a.alloc(8, 0),
            Err(Error::Misaligned {
                offset: 0,
                align: 0
            })
        ));
        assert!(matches!(
            a.alloc(usize::MAX, 8),
            Err(Error::HeapExhausted { .. })
        ));
        assert!(matches!(
            a.alloc(8192, 8),
            Err(Error::HeapExhausted {
                requested: 8192,
                largest_free: 4096,
                heap_size: 4096
            })
        ));
        let not_live = |r: Result<()>, off: usize| match r {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(&format!("offset {off},")), "{m}")
            }
            other => panic!("free({off}): {other:?}"),
        };
        not_live(a.free(64), 64);
        let o = a.alloc(8, 8).unwrap();
        let p = a.alloc(100, 8).unwrap();
        // an offset inside a live block, or past the heap, is not an allocation
        not_live(a.free(p + 8), p + 8);
        not_live(a.free(usize::MAX), usize::MAX);
        a.free(o).unwrap();
        not_live(a.free(o), o); // double free
        assert_eq!(
            a.used_bytes(),
            round_up(100, MIN_ALIGN).unwrap(),
            "failed frees freed nothing"
        );
        a.free(p).unwrap();
    }

    #[test]
    fn random_against_model() {
        // Pseudo-random alloc/free sequence; check live blocks never overlap and stay in range.
        let mut a = HeapAllocator::new(1 << 16);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..if cfg!(miri) { 200 } else { 5000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || live.is_empty() {
                let n = (x >> 8) as usize % 3000;
                let al = 1usize << ((x >> 40) % 10);
                if let Ok(o) = a.alloc(n, al) {
                    assert_eq!(o % al.max(MIN_ALIGN), 0);
                    assert!(o + n <= a.size());
                    for &(lo, ln) in &live {
                        assert!(o + n.max(1) <= lo || lo + ln <= o, "overlap");
                    }
                    live.push((o, n.max(1)));
                }
            } else {
                let i = (x >> 20) as usize % live.len();
                let (o, _) = live.swap_remove(i);
                a.free(o).unwrap();
            }
        }
    }
}
