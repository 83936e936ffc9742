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

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The alignment mimalloc's plain entry points (`mi_malloc`, `mi_zalloc`, `mi_realloc`)
/// already give every block of at least this size: `MI_MAX_ALIGN_SIZE`, 16 on 64-bit
/// targets, where its small size classes are rounded to double words.
const PLAIN_ALIGN: usize = 16;

/// Whether a block of `size` bytes at `align` can come from the plain entry points. The
/// aligned ones (which `mimalloc::MiMalloc` always calls) send every block over 1 KiB, and
/// any small one whose page's next free block happens to be misaligned, down a generic
/// path that over-allocates by the alignment; std's System allocator makes the same split.
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

pub struct CountingAllocator;

#[inline]
fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method calls mimalloc, which returns blocks of at least the requested size
// or null, and frees any block it returned whatever the entry point: a layout aligned to at
// most `PLAIN_ALIGN` and no larger than its size goes to the plain entry points, which
// align every block of at least 16 bytes to 16 (smaller blocks to their size class, a
// multiple of 8 at least the size, so any power of two up to the size); every other layout
// goes to the aligned entry points with its alignment. The counter touches only atomics
// (no allocation, no reentrancy). The tests below check the alignment, size and contents
// of blocks of every alignment up to 4 KiB and sizes up to 4 MiB, through realloc too.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: plain FFI calls with a size and a power-of-two alignment.
        unsafe {
            if plain(size, align) {
                mi::mi_malloc(size).cast()
            } else {
                mi::mi_malloc_aligned(size, align).cast()
            }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: as in `alloc`.
        unsafe {
            if plain(size, align) {
                mi::mi_zalloc(size).cast()
            } else {
                mi::mi_zalloc_aligned(size, align).cast()
            }
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        let align = layout.align();
        // SAFETY: `ptr` came from this allocator, i.e. from mimalloc (either entry point);
        // the new block keeps the layout's alignment by the same split as `alloc`.
        unsafe {
            if plain(new_size, align) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, align).cast()
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
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

    /// Allocates `layout`, checks its alignment, fills it, grows it with realloc (contents
    /// kept, alignment kept) and frees it.
    fn round_trip(layout: Layout, zeroed: bool) {
        let a = CountingAllocator;
        // SAFETY: the layouts here have a nonzero size; each block is written only within
        // its size and freed once with its layout.
        unsafe {
            let p = if zeroed {
                a.alloc_zeroed(layout)
            } else {
                a.alloc(layout)
            };
            assert!(!p.is_null(), "{layout:?}");
            assert_eq!(p as usize % layout.align(), 0, "{layout:?}");
            let n = layout.size();
            if zeroed {
                assert!(std::slice::from_raw_parts(p, n).iter().all(|b| *b == 0));
            }
            for i in 0..n {
                *p.add(i) = i as u8;
            }
            let grown = n * 2 + 8;
            let q = a.realloc(p, layout, grown);
            assert!(!q.is_null(), "{layout:?}");
            assert_eq!(q as usize % layout.align(), 0, "{layout:?} grown");
            for i in 0..n {
                assert_eq!(*q.add(i), i as u8, "{layout:?} byte {i}");
            }
            *q.add(grown - 1) = 7;
            let layout2 = Layout::from_size_align(grown, layout.align()).unwrap();
            a.dealloc(q, layout2);
        }
    }

    #[test]
    fn every_alignment_and_size_class_is_honoured() {
        let sizes = [
            1usize,
            2,
            7,
            8,
            15,
            16,
            24,
            31,
            32,
            48,
            63,
            64,
            100,
            128,
            1000,
            1024,
            1025,
            1536,
            4096,
            10_000,
            65_536,
            100_000,
            1 << 20,
            4 << 20,
        ];
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for &size in &sizes {
                let size = size.div_ceil(align) * align;
                let layout = Layout::from_size_align(size, align).unwrap();
                round_trip(layout, false);
                round_trip(layout, true);
            }
        }
    }

    #[test]
    fn only_small_alignments_up_to_the_size_take_the_plain_path() {
        assert!(plain(16, 16) && plain(24, 8) && plain(1 << 20, 16) && plain(1, 1));
        assert!(!plain(32, 32) && !plain(8, 16) && !plain(4096, 4096));
    }
}
