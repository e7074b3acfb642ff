//! `RSHMEM_HEAP_SIZE` read from the environment: below the minimum is refused naming it, a
//! `T` suffix is accepted. (A test binary of its own: it sets environment variables.)

use rshmem::{Config, Error};

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
