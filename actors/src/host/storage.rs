//! HostCacheStorage: one shared, page-aligned Host allocation holding L2 pages and L3
//! destinations, addressed by offset. This is one of the two `unsafe` boundaries of the
//! project (the other is FFI). It owns the allocation and bounds-checks every range; it
//! never decides who may touch a range: that ownership belongs to the StorageTransferManager
//! (references) and the CacheCoordinator (blocks). It holds no Device buffers.
//!
//! Once L3 has run, the allocation lives for the process (`retain_for_process`): native I/O
//! that cannot prove its retirement may outlive the executor.

use messages::HostRange;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const HOST_PAGE: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error("host allocation of {0} bytes failed")]
    Alloc(u64),
    #[error("host allocation size must be greater than 0")]
    Empty,
    #[error("host range {offset}+{len} is outside the {size}-byte allocation")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
}

#[derive(Debug)]
pub struct HostCacheStorage {
    ptr: NonNull<u8>,
    layout: Layout,
    retained: AtomicBool,
}

// SAFETY: the allocation is a plain byte buffer owned by this struct for its whole life;
// concurrent access to disjoint ranges is sound, and range ownership is enforced by the
// callers' reference discipline (tested: executor jobs never alias a live range).
unsafe impl Send for HostCacheStorage {}
// SAFETY: as above; shared references only hand out raw ranges through `unsafe` accessors
// whose contract requires exclusive ownership of the range.
unsafe impl Sync for HostCacheStorage {}

impl HostCacheStorage {
    /// A zeroed, page-aligned allocation of `len` bytes (rounded up to whole pages).
    pub fn new(len: u64) -> Result<Arc<Self>, HostError> {
        if len == 0 {
            return Err(HostError::Empty);
        }
        let rounded = len
            .checked_add(HOST_PAGE as u64 - 1)
            .ok_or(HostError::Alloc(len))?
            / HOST_PAGE as u64
            * HOST_PAGE as u64;
        let size = usize::try_from(rounded).map_err(|_| HostError::Alloc(len))?;
        let layout = Layout::from_size_align(size, HOST_PAGE).map_err(|_| HostError::Alloc(len))?;
        // SAFETY: layout has non-zero size (len > 0, rounded up to a page).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(HostError::Alloc(len))?;
        // Pinned Host memory is resident from its allocation (cudaHostAlloc locks its
        // pages): touch every page now, so no copy into it ever pays a first-touch page
        // fault that real pinned memory would not.
        for page in (0..size).step_by(HOST_PAGE) {
            // SAFETY: `page < size`, inside the allocation just made and owned by no one
            // else yet; it writes the zero the page already holds (the zeroed-allocation
            // test checks every byte stays 0).
            unsafe { ptr.as_ptr().add(page).write_volatile(0) };
        }
        Ok(Arc::new(Self {
            ptr,
            layout,
            retained: AtomicBool::new(false),
        }))
    }

    pub fn len(&self) -> u64 {
        self.layout.size() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    /// The base address, for stores that register the allocation (e.g. Mooncake).
    pub fn base_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bounds check of a range.
    pub fn check(&self, r: HostRange) -> Result<(), HostError> {
        if r.offset
            .checked_add(r.len)
            .is_none_or(|end| end > self.len())
        {
            return Err(HostError::OutOfBounds {
                offset: r.offset,
                len: r.len,
                size: self.len(),
            });
        }
        Ok(())
    }

    /// A shared view of a range.
    ///
    /// # Safety
    /// No one may write the range while the returned slice lives (the caller holds a
    /// source reference on every block the range covers).
    pub unsafe fn range(&self, r: HostRange) -> Result<&[u8], HostError> {
        self.check(r)?;
        // SAFETY: in bounds (checked above); no concurrent writer by the caller's contract.
        Ok(unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(r.offset as usize), r.len as usize)
        })
    }

    /// An exclusive view of a range.
    ///
    /// # Safety
    /// The caller owns the range exclusively while the slice lives: no other reader or
    /// writer touches any byte of it (the caller holds a destination reference on it).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, r: HostRange) -> Result<&mut [u8], HostError> {
        self.check(r)?;
        // SAFETY: in bounds (checked above); exclusive by the caller's contract.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(r.offset as usize), r.len as usize)
        })
    }

    /// Copies bytes out of a range (test and verification helper).
    pub fn read(&self, r: HostRange) -> Result<Vec<u8>, HostError> {
        // SAFETY: a copy taken while the caller holds the range; see `range`.
        unsafe { self.range(r) }.map(|s| s.to_vec())
    }

    /// Copies bytes into a range the caller owns.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), HostError> {
        let r = HostRange::new(offset, data.len() as u64);
        // SAFETY: the caller owns the range (the L2 path writes only destinations it allocated).
        let dst = unsafe { self.range_mut(r) }?;
        dst.copy_from_slice(data);
        Ok(())
    }

    /// Keeps the allocation for the rest of the process: native I/O that cannot prove its
    /// retirement may still address it. Drop then leaks it deliberately.
    pub fn retain_for_process(&self) {
        self.retained.store(true, Ordering::SeqCst);
    }

    pub fn is_retained_for_process(&self) -> bool {
        self.retained.load(Ordering::SeqCst)
    }
}

impl Drop for HostCacheStorage {
    fn drop(&mut self) {
        if self.retained.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: ptr was allocated with exactly this layout in `new` and is freed once here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_zeroed_and_bounds_checked() {
        let h = HostCacheStorage::new(10_000).unwrap();
        assert_eq!(h.len(), 3 * 4096);
        assert_eq!(h.base_ptr() as usize % HOST_PAGE, 0);
        assert!(h
            .read(HostRange::new(0, h.len()))
            .unwrap()
            .iter()
            .all(|b| *b == 0));
        h.write(100, &[1, 2, 3]).unwrap();
        assert_eq!(h.read(HostRange::new(99, 5)).unwrap(), vec![0, 1, 2, 3, 0]);
        assert!(matches!(
            h.check(HostRange::new(h.len() - 1, 2)),
            Err(HostError::OutOfBounds { .. })
        ));
        assert!(h.check(HostRange::new(u64::MAX, 2)).is_err());
        assert_eq!(HostCacheStorage::new(0).unwrap_err(), HostError::Empty);
    }
}
