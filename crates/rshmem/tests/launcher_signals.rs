//! The launcher's signal forwarding leaves the host process as it found it. Alone in its test
//! binary: it reads process-wide signal dispositions, which another test could change.

use rshmem::launcher::{self, Job};

fn disposition(sig: libc::c_int) -> libc::sighandler_t {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only queries.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

#[test]
fn forwarding_handlers_are_restored_after_the_job() {
    // A library user (forward_signals = true) once kept the launcher's handlers after run():
    // Ctrl-C then no longer ended the program, and a signal caught between two jobs was
    // forwarded to the next one at its start.
    let before = [disposition(libc::SIGINT), disposition(libc::SIGTERM)];
    let mut job = Job::new(1, "true");
    job.forward_signals = true;
    let out = launcher::run(&job).unwrap();
    assert_eq!(out.code, 0);
    assert_eq!(
        [disposition(libc::SIGINT), disposition(libc::SIGTERM)],
        before,
        "SIGINT/SIGTERM actions after the job"
    );
}
