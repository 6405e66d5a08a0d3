//! The KV cache in pages of its own: mapped fresh from the OS when an engine is made, returned
//! to it the moment the engine is dropped.
//!
//! An engine's cache is the largest thing it holds (default pool: 4 slots × 8,192 positions,
//! 1.5 GiB in f32) and most of it is never written. Taken from a general allocator, a
//! replaced engine's cache stayed in the allocator's keeping after a reload, and the next
//! engine's cache was carved from it and zeroed by hand — every page written, so resident at
//! once, beside the old one (mimalloc: 1.36 GB after a load, 3.25 GB after four reloads;
//! issue 32). Mapped here, a cache costs resident memory only for the positions written, and
//! a reload gives the old one back at once.
//!
//! [`FreshPages`] wraps the process's allocator (`#[global_allocator]`); allocations of at
//! least [`MIN_BYTES`] made inside [`scope`] on the same thread are mapped, everything else
//! goes to the wrapped allocator unchanged (a mapped block per temporary would cost a page
//! fault a page on every use: disallowing mimalloc's arenas for everything made decoding
//! 1.8× slower). Without the wrapper installed, [`scope`] changes nothing.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Smallest allocation mapped inside a [`scope`].
pub const MIN_BYTES: usize = 1 << 20;

/// Mapped blocks alive at once at most (their addresses are kept in a fixed table: an
/// allocator may not allocate); past it, allocations go to the wrapped allocator.
const MAX_BLOCKS: usize = 4096;

const PAGE: usize = 4096;

static BLOCKS: [AtomicUsize; MAX_BLOCKS] = [const { AtomicUsize::new(0) }; MAX_BLOCKS];

thread_local! {
    static IN_SCOPE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's large allocations mapped fresh (see the module).
pub fn scope<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            let was = self.0;
            let _ = IN_SCOPE.try_with(|s| s.set(was));
        }
    }
    let was = IN_SCOPE.with(|s| s.replace(true));
    let _reset = Reset(was);
    f()
}

/// The process allocator `A`, with the KV cache's pages mapped (see the module).
pub struct FreshPages<A>(pub A);

fn wants_pages(layout: &Layout) -> bool {
    layout.size() >= MIN_BYTES
        && layout.align() <= PAGE
        && IN_SCOPE.try_with(Cell::get).unwrap_or(false)
}

fn mapped_len(layout: &Layout) -> usize {
    layout.size().div_ceil(PAGE) * PAGE
}

/// Slots of [`BLOCKS`] ever used: the lookups scan no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

fn recorded() -> &'static [AtomicUsize] {
    &BLOCKS[..HIGH.load(Ordering::Acquire).min(MAX_BLOCKS)]
}

fn is_mapped(ptr: *mut u8, layout: &Layout) -> Option<&'static AtomicUsize> {
    if layout.size() < MIN_BYTES {
        return None;
    }
    recorded()
        .iter()
        .find(|b| b.load(Ordering::Acquire) == ptr as usize)
}

/// Maps zeroed pages for `layout` and records them; null when no record slot or no memory.
fn map(layout: &Layout) -> *mut u8 {
    // SAFETY: an anonymous private mapping of a nonzero length at an address of the kernel's
    // choosing; the result is checked
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped_len(layout),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let addr = p as usize;
    let recorded = BLOCKS.iter().enumerate().find(|(_, b)| {
        b.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    match recorded {
        Some((i, _)) => {
            HIGH.fetch_max(i + 1, Ordering::AcqRel);
            p.cast()
        }
        None => {
            // SAFETY: the mapping made just above, not handed out
            unsafe { libc::munmap(p, mapped_len(layout)) };
            std::ptr::null_mut()
        }
    }
}

/// Fresh pages for `layout` when it wants them and they can be had, else `inner`'s block.
fn mapped_or(layout: &Layout, inner: impl FnOnce() -> *mut u8) -> *mut u8 {
    if wants_pages(layout) {
        let p = map(layout);
        if !p.is_null() {
            return p;
        }
    }
    inner()
}

/// Unmaps `ptr` if it is a mapped block; false if it is the wrapped allocator's.
fn unmap(ptr: *mut u8, layout: &Layout) -> bool {
    let Some(slot) = is_mapped(ptr, layout) else {
        return false;
    };
    // SAFETY: `ptr` is a block `map` made for this layout (its size gives the length), and
    // its owner is done with it
    unsafe { libc::munmap(ptr.cast(), mapped_len(layout)) };
    slot.store(0, Ordering::Release);
    true
}

// SAFETY: every block is either the wrapped allocator's (passed through untouched) or a
// private anonymous mapping of at least the layout's size, page-aligned (so aligned for any
// layout it is used for), zero-filled by the kernel, recorded until it is unmapped
unsafe impl<A: GlobalAlloc> GlobalAlloc for FreshPages<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on
        mapped_or(&layout, || unsafe { self.0.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on
        mapped_or(&layout, || unsafe { self.0.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !unmap(ptr, &layout) {
            // SAFETY: not a mapped block, so the wrapped allocator's
            unsafe { self.0.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if is_mapped(ptr, &layout).is_none() {
            // SAFETY: the wrapped allocator's block, the caller's contract passed on
            return unsafe { self.0.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `layout.align()` is valid (it came with a live block) and `new_size` is
        // nonzero and fits when rounded, by the caller's contract
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a valid layout; the copy covers the smaller of the two blocks
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WRAPPED: FreshPages<std::alloc::System> = FreshPages(std::alloc::System);

    /// ENG-MEM-1: inside a scope a large zeroed block is fresh pages (zero, page-aligned),
    /// unmapped when freed; outside it, and below the size, the wrapped allocator serves.
    #[test]
    fn large_blocks_in_a_scope_are_mapped_and_given_back() {
        let big = Layout::from_size_align(8 << 20, 64).unwrap();
        let p = scope(|| unsafe { WRAPPED.alloc_zeroed(big) });
        assert!(!p.is_null());
        assert_eq!(p as usize % PAGE, 0);
        assert!(BLOCKS
            .iter()
            .any(|b| b.load(Ordering::Relaxed) == p as usize));
        // SAFETY: the block just allocated, of that layout
        unsafe {
            assert!(std::slice::from_raw_parts(p, big.size())
                .iter()
                .all(|b| *b == 0));
            *p.add(big.size() - 1) = 7;
            let grown = WRAPPED.realloc(p, big, big.size() * 2);
            assert_eq!(*grown.add(big.size() - 1), 7);
            let grown_layout = Layout::from_size_align(big.size() * 2, 64).unwrap();
            WRAPPED.dealloc(grown, grown_layout);
            assert!(!BLOCKS
                .iter()
                .any(|b| b.load(Ordering::Relaxed) == grown as usize));
        }
        let outside = unsafe { WRAPPED.alloc_zeroed(big) };
        assert!(!BLOCKS
            .iter()
            .any(|b| b.load(Ordering::Relaxed) == outside as usize));
        // SAFETY: the block just allocated, of that layout
        unsafe { WRAPPED.dealloc(outside, big) };
        assert!(scope(|| IN_SCOPE.with(Cell::get)));
        assert!(!IN_SCOPE.with(Cell::get), "the scope ends with its closure");
    }
}
