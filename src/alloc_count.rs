//! The engine-host binary's global allocator: mimalloc, wrapped with an allocation counter
//! that benchmarks switch on (`engine-host bench scheduler`). While counting is off (the
//! default, and always in `serve`/`launch`) each allocation costs one relaxed load of a
//! flag that is never written, so no cache line bounces between threads. It must never
//! allocate, block or panic inside the allocator.
//!
//! Why mimalloc rather than glibc's malloc: the round thread allocates small, short-lived
//! buffers (keys, effect lists, match tables), and under glibc malloc/free were a quarter
//! of a storage round's instructions (`bench scheduler` under callgrind, 2026-12-03:
//! 952k -> 775k instructions per storage-enabled round, 272k -> 229k disabled).

use mimalloc::MiMalloc as Inner;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

pub struct CountingAllocator;

#[inline]
fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to mimalloc (`Inner`) with the caller's arguments unchanged, so the
// GlobalAlloc contract holds exactly as it does for mimalloc; the counter touches only
// atomics (no allocation, no reentrancy). The test below checks counting and forwarding.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { Inner.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { Inner.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from mimalloc.
        unsafe { Inner.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from mimalloc.
        unsafe { Inner.dealloc(ptr, layout) }
    }
}

/// Starts counting allocations (and reallocations) process-wide.
pub fn enable() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Allocations (and reallocations) counted since `enable`, process-wide, all threads.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_allocations_once_enabled() {
        enable();
        let before = allocations();
        let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(16));
        let after = allocations();
        assert!(after > before, "{before} -> {after}");
        assert_eq!(v.capacity(), 16);
    }
}
