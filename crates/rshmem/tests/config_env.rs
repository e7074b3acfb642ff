//! Bad configurations are refused before any PE starts; `RSHMEM_HEAP_SIZE` read from the
//! environment: below the minimum is refused naming it, a `T` suffix is accepted. (A test
//! binary of its own: one test sets environment variables, the other reads none.)

#[path = "harness/mod.rs"]
mod harness;

#[path = "common/mod.rs"]
mod common;

use common::{all_ok, expect_err};
use rshmem::{Config, Error};
use std::time::Duration;

fn cfg() -> Config {
    harness::config().timeout(Duration::from_secs(20))
}

#[test]
fn heap_size_from_the_environment() {
    let with = |v: &str| {
        std::env::set_var("RSHMEM_HEAP_SIZE", v);
        let c = Config::from_env();
        std::env::remove_var("RSHMEM_HEAP_SIZE");
        c
    };
    for v in ["1", "0", "4095", "3K"] {
        match with(v) {
            Err(Error::InvalidArgument(m)) => assert!(
                m.starts_with(&format!("RSHMEM_HEAP_SIZE={v:?}"))
                    && m.contains("below the minimum of 4096 bytes (4K)"),
                "{v}: {m}"
            ),
            other => panic!("RSHMEM_HEAP_SIZE={v}: {other:?}"),
        }
    }
    assert_eq!(with("4K").unwrap().heap_size, 4096);
    assert_eq!(with("2T").unwrap().heap_size, 2 << 40);
    assert_eq!(with("1t").unwrap().heap_size, 1 << 40);
    match with("65T") {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("maximum"), "{m}"),
        other => panic!("65T: {other:?}"),
    }
    // The minimum holds for a heap size set in code as well.
    let r = rshmem::Launch::new()
        .config(Config::default().heap_size(1))
        .threads()
        .run(1, |_| ())
        .values();
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("below the minimum")),
        "{r:?}"
    );
}

#[test]
fn bad_configurations() {
    let run = |c: Config, n: usize| {
        rshmem::Launch::new()
            .config(c)
            .threads()
            .run(n, |_| ())
            .values()
            .map(|_| ())
    };
    // Each refused for the setting it gets wrong (the message names it), not for another.
    let names = |what: &'static str| move |e: &Error| matches!(e, Error::InvalidArgument(m) if m.contains(what));
    expect_err(
        "heap 0",
        run(cfg().heap_size(0), 2),
        names("heap size: 0 bytes is below the minimum"),
    );
    expect_err(
        "teams 0",
        run(cfg().max_teams(0), 2),
        names("max_teams 0 is out of range"),
    );
    expect_err(
        "teams 5000",
        run(cfg().max_teams(5000), 1),
        names("max_teams 5000 is out of range"),
    );
    expect_err(
        "timeout 0",
        run(cfg().timeout(Duration::ZERO), 2),
        names("timeout must be positive"),
    );
    expect_err(
        "0 PEs",
        run(cfg(), 0),
        names("a world needs at least one PE"),
    );
    // a heap below the minimum is refused, naming the minimum (not accepted as 0 bytes)
    for tiny in [1, 10, 4095] {
        expect_err(
            "tiny heap",
            run(cfg().heap_size(tiny), 2),
            |e| matches!(e, Error::InvalidArgument(m) if m.contains(&format!("{tiny} bytes is below the minimum of 4096 bytes"))),
        );
    }
    // the smallest heap works, and running out of it is an error naming its size
    let r = all_ok(
        rshmem::Launch::new()
            .config(cfg().heap_size(4096))
            .threads()
            .run(2, |pe| Ok(pe.alloc::<u8>(8192).map(|_| ())))
            .values(),
    );
    for x in r {
        expect_err("exhausted", x, |e| {
            matches!(
                e,
                Error::HeapExhausted {
                    heap_size: 4096,
                    ..
                }
            )
        });
    }
}
