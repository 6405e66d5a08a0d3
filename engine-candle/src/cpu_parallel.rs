//! How the CPU kernels spread work over cores: candle's barrier pool (its workers spin for a
//! while after each job, as llama.cpp's threads do, then park), with chunks taken from a
//! shared counter.
//!
//! A decode step is hundreds of small parallel jobs (one per matmul, one per attention)
//! between short serial stretches. A parked worker needs tens of microseconds to wake, about
//! as long as one job: with a rayon pool the helper joined most jobs late (measured: the
//! decode thread did two thirds of the kernel work). One spinning pool for the whole process
//! also keeps candle's own ops (which use the same pool) from competing with ours for cores.
//!
//! The pool is shared by every engine of the process, and a panic that reaches it poisons its
//! call lock: every later job of every engine would panic. So no panic of ours reaches it:
//! each worker's part runs under `catch_unwind`, and the first panic is raised again on the
//! calling (decode) thread after the pool is done and its lock released. That engine's decode
//! thread dies and its pool restarts it; the other engines never notice (decided over a pool
//! per engine, which would put two spinning pools on the same cores).

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::utils::barrier_pool;

thread_local! {
    /// Workers the calling thread's jobs may use (0: all of the pool).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
    /// The calling thread's parallel jobs since it last asked (`take_waits`): time in them,
    /// and time it waited in them for workers after it found no chunk left to take.
    static WAITS: Cell<Waits> = const { Cell::new(Waits { in_jobs: Duration::ZERO, waited: Duration::ZERO }) };
}

/// What the calling thread's parallel jobs cost it: time in them, and the part of it spent
/// waiting for workers that had not finished (or not even started: a worker whose core another
/// process holds keeps every job of the step waiting for the scheduler to give it back).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Waits {
    pub in_jobs: Duration,
    pub waited: Duration,
}

/// The calling thread's waits since it last asked.
pub(crate) fn take_waits() -> Waits {
    WAITS.with(|w| w.replace(Waits::default()))
}

/// Sets the workers the calling thread's jobs may use from now on (0: all of the pool).
pub(crate) fn set_threads(threads: usize) {
    LIMIT.with(|l| l.set(threads));
}

/// Threads in the process's compute pool (the caller included).
pub(crate) fn pool_threads() -> usize {
    barrier_pool().n_workers() + 1
}

/// Runs `f` with at most `threads` workers (0: all) for the jobs this thread starts.
pub(crate) fn with_threads<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    let previous = LIMIT.with(|l| l.replace(threads));
    let out = f();
    LIMIT.with(|l| l.set(previous));
    out
}

/// Workers `par_chunks_mut` spreads over when called from this thread.
pub(crate) fn current_workers() -> usize {
    let all = pool_threads();
    match LIMIT.with(Cell::get) {
        0 => all,
        n => n.min(all),
    }
}

/// A pointer to the start of a slice that chunks are cut from.
struct SlicePtr<T>(*mut T);
// SAFETY: each chunk index is handed to exactly one worker (see `par_chunks_mut`).
unsafe impl<T: Send> Sync for SlicePtr<T> {}

/// Runs `f(i, chunk)` for the `chunk_len`-element chunks of `data` (the last may be
/// shorter), spread over the compute pool. Each chunk is visited once, by one worker.
pub(crate) fn par_chunks_mut<T: Send>(
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk_len = chunk_len.max(1);
    let len = data.len();
    let chunks = len.div_ceil(chunk_len);
    let workers = current_workers();
    if chunks <= 1 || workers <= 1 {
        for (i, c) in data.chunks_mut(chunk_len).enumerate() {
            fault::maybe_panic();
            f(i, c);
        }
        return;
    }
    let pool = barrier_pool();
    let caller = pool.n_workers();
    let next = AtomicUsize::new(0);
    let base = SlicePtr(data.as_mut_ptr());
    let panicked: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
    let started = Instant::now();
    // when the caller found no chunk left (ns after `started`)
    let caller_done = AtomicU64::new(0);
    pool.execute(|tid| {
        // the caller always works; of the pool's workers, the first `workers - 1`
        if tid != caller && tid + 1 >= workers {
            return;
        }
        let base = &base;
        let run = catch_unwind(AssertUnwindSafe(|| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= chunks {
                return;
            }
            let start = i * chunk_len;
            let n = chunk_len.min(len - start);
            // SAFETY: chunk `i` is in bounds and no other worker gets index `i`; `data` is
            // borrowed mutably for the whole call, and `execute` returns after every worker
            // is done.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
            fault::maybe_panic();
            f(i, chunk);
        }));
        if tid == caller {
            caller_done.store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if let Err(payload) = run {
            // the others stop taking chunks; the first panic is raised after the pool is done
            next.store(chunks, Ordering::Relaxed);
            let mut p = panicked.lock().unwrap_or_else(|e| e.into_inner());
            p.get_or_insert(payload);
        }
    });
    let in_job = started.elapsed();
    let waited = in_job.saturating_sub(Duration::from_nanos(caller_done.load(Ordering::Relaxed)));
    WAITS.with(|w| {
        let mut now = w.get();
        now.in_jobs += in_job;
        now.waited += waited;
        w.set(now);
    });
    if let Some(payload) = panicked.into_inner().unwrap_or_else(|e| e.into_inner()) {
        resume_unwind(payload);
    }
}

/// Fault injection for tests: makes the next kernel chunk panic (feature `fault-injection`;
/// without it nothing here exists beyond a no-op).
pub mod fault {
    #[cfg(feature = "fault-injection")]
    static ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// The next kernel chunk any engine runs panics (once).
    #[cfg(feature = "fault-injection")]
    pub fn arm_kernel_panic() {
        ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    #[inline]
    pub(crate) fn maybe_panic() {
        #[cfg(feature = "fault-injection")]
        if ARMED.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected kernel panic");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once() {
        for threads in [0, 1, 2, 3] {
            with_threads(threads, || {
                for len in [0usize, 1, 7, 64, 1000] {
                    let mut v = vec![0u32; len];
                    par_chunks_mut(&mut v, 16, |i, c| {
                        for (j, x) in c.iter_mut().enumerate() {
                            *x += (i * 16 + j) as u32 + 1;
                        }
                    });
                    assert!(v.iter().enumerate().all(|(j, &x)| x == j as u32 + 1));
                }
            });
        }
    }

    #[test]
    fn a_panicking_chunk_reaches_the_caller_and_leaves_the_pool_usable() {
        let caught = std::panic::catch_unwind(|| {
            let mut v = vec![0u32; 256];
            par_chunks_mut(&mut v, 8, |i, _| assert!(i != 5, "chunk 5 fails"));
        });
        assert!(caught.is_err(), "the panic reached the caller");
        // the shared pool still runs jobs (a poisoned pool would panic here)
        let mut v = vec![0u32; 256];
        par_chunks_mut(&mut v, 8, |_, c| c.iter_mut().for_each(|x| *x = 1));
        assert!(v.iter().all(|&x| x == 1));
        candle_core::utils::barrier_pool().execute(|_| {});
    }

    #[test]
    fn the_thread_limit_applies_to_this_thread_only() {
        with_threads(1, || assert_eq!(current_workers(), 1));
        assert_eq!(current_workers(), pool_threads());
    }
}
