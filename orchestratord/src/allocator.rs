//! The process allocator of every binary built on this crate (server, worker, soak, tests):
//! mimalloc without transparent huge pages, with the engines' KV caches in pages of their own
//! (`pool_manager::candle::FreshPages`).
//!
//! - glibc's malloc kept freed memory: a 36-minute soak with a reload every ~12 s grew to
//!   3.0 GB resident while 0.57 GB was in use (`malloc_trim` gave 2 GB back at once); on
//!   mimalloc the same soak stayed at 0.94 GB.
//! - `no_thp`: with transparent huge pages, zeroed KV caches were resident from the start
//!   (1.73 GB idle at 8 × 4096 vs 0.26 GB).
//! - Fresh pages for the KV cache: mimalloc kept a replaced engine's freed cache and handed
//!   it to the next engine zeroed by hand, every page written, so resident at once beside the
//!   old one (default pool, a minute of mixed load then four reloads: 1.36 GB after the load,
//!   1.72 / 2.21 / 3.25 / 3.25 GB after the reloads; issue 32 saw 3.46 GB). Taking every
//!   large block straight from the OS instead (mimalloc without arenas) fixed that but made
//!   decoding 1.8× and prefill 1.6× slower (paired runs): only the cache is mapped.
//!   Figures in ARCHITECTURE.md, "Decisions".

#[global_allocator]
static ALLOCATOR: pool_manager::candle::FreshPages<mimalloc::MiMalloc> =
    pool_manager::candle::FreshPages(mimalloc::MiMalloc);
