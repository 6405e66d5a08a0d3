//! The compute threads' scheduling priority.
//!
//! The process's compute pool (candle's barrier pool) and every engine's decode thread run
//! `compute_nice` steps below the thread that configured them. The threads that accept
//! connections, admit, refuse and stream (the async runtime's) keep the process's priority,
//! so when one wakes it preempts a compute thread at once instead of waiting out the
//! scheduler's slice: on a machine whose cores the compute fills, a burst's refusals and
//! first tokens leave sooner (measured with `ci/overload_bench.py`, see ORCH-CPU-1).
//!
//! Linux's nice value belongs to a thread, and an unprivileged process may only raise it,
//! so a step once taken is kept for the process's life. Linux also weighs nice values only
//! within a scheduling group — a cgroup with the CPU controller (a container, a systemd
//! service that sets CPU limits) or an autogroup (the process's session): the compute yields
//! to our own request threads and to processes of the same group, not to the rest of the
//! machine. Elsewhere than Linux nothing is changed (there a nice value may belong to the
//! whole process).

use std::sync::atomic::{AtomicU8, Ordering};

/// The highest nice value (the lowest priority) a thread can have.
pub const MAX_NICE: u8 = 19;

/// Steps every compute thread started from now on goes below its creator.
static COMPUTE_NICE: AtomicU8 = AtomicU8::new(0);

/// Sets the steps for the compute threads started from now on (clamped to [`MAX_NICE`]).
pub(crate) fn set_compute_nice(steps: u8) {
    COMPUTE_NICE.store(steps.min(MAX_NICE), Ordering::Relaxed);
}

/// Lowers the calling thread by the configured steps; a failure is logged, never fatal (the
/// thread computes at the process's priority). Elsewhere than Linux: nothing.
pub(crate) fn lower_compute_thread() {
    let steps = COMPUTE_NICE.load(Ordering::Relaxed);
    if steps == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = lower_this_thread(steps) {
        tracing::warn!(error = %e, steps, "cannot lower a compute thread's priority");
    }
}

/// Lowers the calling thread by `steps` (another pool of threads than the compute's: the
/// server's request-work threads); a failure is logged, never fatal. Elsewhere than Linux:
/// nothing.
pub fn lower_current_thread(steps: u8) {
    #[cfg(target_os = "linux")]
    if let Err(e) = lower_this_thread(steps) {
        tracing::warn!(error = %e, steps, "cannot lower a thread's priority");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = steps;
}

/// Raises the calling thread's nice value by `steps` (at most to [`MAX_NICE`]); returns the
/// value it has now.
#[cfg(target_os = "linux")]
pub(crate) fn lower_this_thread(steps: u8) -> std::io::Result<i32> {
    let now = this_thread_nice()?;
    let target = (now + i32::from(steps)).min(i32::from(MAX_NICE));
    if target != now {
        // SAFETY: plain syscalls on the calling thread's id.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, thread_id(), target) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(target)
}

/// The calling thread's nice value.
#[cfg(target_os = "linux")]
pub(crate) fn this_thread_nice() -> std::io::Result<i32> {
    // SAFETY: errno is thread-local; getpriority may legitimately return -1, so errno is
    // cleared first and read after.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, thread_id());
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(target_os = "linux")]
fn thread_id() -> libc::id_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as libc::id_t }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn lowering_a_thread_leaves_its_siblings_alone() {
        let before = this_thread_nice().unwrap();
        let lowered = std::thread::spawn(move || {
            let got = lower_this_thread(3).unwrap();
            (got, this_thread_nice().unwrap())
        })
        .join()
        .unwrap();
        let expect = (before + 3).min(i32::from(MAX_NICE));
        assert_eq!(lowered, (expect, expect));
        assert_eq!(
            this_thread_nice().unwrap(),
            before,
            "the caller kept its priority"
        );
    }

    #[test]
    fn a_thread_is_never_lowered_past_the_lowest_priority() {
        let got = std::thread::spawn(|| {
            lower_this_thread(MAX_NICE).unwrap();
            lower_this_thread(5).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, i32::from(MAX_NICE));
    }
}
