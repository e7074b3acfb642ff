//! One harness that runs a test body on every mode: threads now; processes and mixed
//! (re-executing this test binary under the launcher's environment) where built.
//!
//! A body is `fn(&Pe) -> Result<()>` that checks its data itself (assert on exact expected
//! values, computed from seeded randomness every PE can reproduce).
#![allow(dead_code)]

use rshmem::{Config, Pe, Result};
use std::time::Duration;

/// The configuration tests use: a small heap, a short timeout.
pub fn config() -> Config {
    Config::default()
        .heap_size(8 << 20)
        .timeout(Duration::from_secs(30))
}

/// Runs `body` on `n` PEs in thread mode; panics (failing the test) on any error.
pub fn threads(n: usize, body: fn(&Pe) -> Result<()>) {
    let r = rshmem::threads_with(config(), n, body).expect("world");
    for (pe, x) in r.into_iter().enumerate() {
        if let Err(e) = x {
            panic!("PE {pe} of {n}: {e}");
        }
    }
}

/// Runs `body` on `n` PEs in every mode built (threads; processes and mixed to come).
pub fn all_modes(_test: &str, n: usize, body: fn(&Pe) -> Result<()>) {
    threads(n, body);
}

/// `mode_test!(name, [n1, n2], body)`: a test running `body` for each PE count on every mode.
#[macro_export]
macro_rules! mode_test {
    ($name:ident, [$($n:expr),+], $body:expr) => {
        #[test]
        fn $name() {
            let path = concat!(module_path!(), "::", stringify!($name));
            let test = path.split_once("::").map_or(path, |(_, t)| t);
            for n in [$($n),+] {
                $crate::harness::all_modes(test, n, $body);
            }
        }
    };
}

/// Deterministic pseudo-random values for PE `pe`, stream `stream`.
pub fn rand_vec<T: rshmem::Elem>(pe: usize, stream: u64, len: usize) -> Vec<T> {
    let mut x =
        0x9e37_79b9_7f4a_7c15u64 ^ ((pe as u64) << 32) ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64(((x >> 11) % 200_000) as f64 / 8.0 - 10_000.0)
        })
        .collect()
}
