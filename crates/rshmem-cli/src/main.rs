//! The `rshmem` command.
fn main() {}
