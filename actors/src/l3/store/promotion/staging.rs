//! Temporary staging: the bounded byte budget that promotion reads DFS sources into before
//! any MEMORY target exists. A reservation is taken by compare-and-swap at admission (a
//! hard cap, never a racy load) and returned exactly once, when its owner drops it, i.e.
//! after the last read or copy of the staged bytes. It must never be released while a
//! reader can still touch the staged buffer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct StagingBudget {
    capacity: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

/// Bytes held against the staging budget; released on drop.
#[derive(Debug)]
pub struct StagingReservation {
    budget: Arc<StagingBudget>,
    bytes: u64,
}

impl StagingReservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl StagingBudget {
    pub fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        })
    }

    /// Reserves `bytes` if they fit under the cap (compare-and-swap).
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<StagingReservation> {
        let prev = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|t| *t <= self.capacity)
            })
            .ok()?;
        self.peak.fetch_max(prev + bytes, Ordering::Relaxed);
        Some(StagingReservation {
            budget: self.clone(),
            bytes,
        })
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Drop for StagingReservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_cap_and_release_on_drop() {
        let b = StagingBudget::new(100);
        let r1 = b.try_reserve(60).unwrap();
        assert!(b.try_reserve(41).is_none());
        let r2 = b.try_reserve(40).unwrap();
        assert_eq!(b.used(), 100);
        drop(r1);
        assert_eq!(b.used(), 40);
        drop(r2);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100);
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_cap() {
        let b = StagingBudget::new(10);
        let held: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| b.try_reserve(3))).collect();
            hs.into_iter().filter_map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(held.len(), 3);
        assert!(b.peak() <= 10);
    }
}
