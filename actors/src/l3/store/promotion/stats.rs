//! Promotion metrics as atomics. The funnel of admitted attempts is
//! `attempted = committed + failed + expired + cancelled + in_flight`; rejections before
//! admission (capacity gates, missing source, already in MEMORY, joins) are counted apart.
//! Promotion is never counted as a foreground PUT or a GET.

use crate::l3::store::{CapacityReason, PromotionFailure};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why an admitted attempt ended without a commit (besides expiry and cancellation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailReason {
    Failure(PromotionFailure),
    Capacity(CapacityReason),
}

const FAILURES: [PromotionFailure; 6] = [
    PromotionFailure::Busy,
    PromotionFailure::Fenced,
    PromotionFailure::Expired,
    PromotionFailure::SourceChanged,
    PromotionFailure::Io,
    PromotionFailure::Checksum,
];
const CAPACITIES: [CapacityReason; 4] = [
    CapacityReason::Quota,
    CapacityReason::Allocation,
    CapacityReason::Watermark,
    CapacityReason::InFlightCap,
];

fn capacity_index(c: CapacityReason) -> usize {
    CAPACITIES.iter().position(|x| *x == c).unwrap_or(0)
}
fn failure_index(f: PromotionFailure) -> usize {
    FAILURES.iter().position(|x| *x == f).unwrap_or(0)
}

#[derive(Debug, Default)]
pub struct PromotionStats {
    /// Admitted attempts (one per live key, however many triggers joined it).
    pub attempted: AtomicU64,
    pub committed: AtomicU64,
    pub failed: AtomicU64,
    pub expired: AtomicU64,
    pub cancelled: AtomicU64,
    /// Admitted and not yet settled.
    pub in_flight: AtomicU64,
    failed_failure: [AtomicU64; 6],
    failed_capacity: [AtomicU64; 4],
    /// Rejections before admission, by capacity reason.
    rejected: [AtomicU64; 4],
    /// Triggers that joined a live attempt of the same key.
    pub joined: AtomicU64,
    pub already_in_memory: AtomicU64,
    pub missing_source: AtomicU64,
    /// Commits of a stale or unverified attempt that were refused.
    pub stale_commits_rejected: AtomicU64,
    /// Writers that found their target fenced and stopped.
    pub fenced_writers: AtomicU64,
}

impl PromotionStats {
    pub(crate) fn record_failed(&self, r: FailReason) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        match r {
            FailReason::Failure(f) => &self.failed_failure[failure_index(f)],
            FailReason::Capacity(c) => &self.failed_capacity[capacity_index(c)],
        }
        .fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn record_rejected(&self, c: CapacityReason) {
        self.rejected[capacity_index(c)].fetch_add(1, Ordering::Relaxed);
    }
    pub fn failed_by(&self, r: FailReason) -> u64 {
        match r {
            FailReason::Failure(f) => &self.failed_failure[failure_index(f)],
            FailReason::Capacity(c) => &self.failed_capacity[capacity_index(c)],
        }
        .load(Ordering::Relaxed)
    }
    pub fn rejected_by(&self, c: CapacityReason) -> u64 {
        self.rejected[capacity_index(c)].load(Ordering::Relaxed)
    }

    /// A consistent-enough snapshot for quiescent checks.
    pub fn funnel(&self) -> Funnel {
        Funnel {
            attempted: self.attempted.load(Ordering::SeqCst),
            committed: self.committed.load(Ordering::SeqCst),
            failed: self.failed.load(Ordering::SeqCst),
            expired: self.expired.load(Ordering::SeqCst),
            cancelled: self.cancelled.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Funnel {
    pub attempted: u64,
    pub committed: u64,
    pub failed: u64,
    pub expired: u64,
    pub cancelled: u64,
    pub in_flight: u64,
}

impl Funnel {
    /// admitted = committed + failed + expired + cancelled + in_flight.
    pub fn holds(&self) -> bool {
        self.attempted
            == self.committed + self.failed + self.expired + self.cancelled + self.in_flight
    }
}

impl PromotionStats {
    /// Admission's resource step, shared by every promoting store: one in-flight slot under
    /// a hard cap (compare-and-swap, never a racy load) and `bytes` of staging — both or
    /// neither. The caller gives the slot back (`in_flight -= 1`) when it joins another
    /// attempt instead; the staging reservation returns when dropped.
    pub fn admit_resources(
        &self,
        max_in_flight: u64,
        staging: &std::sync::Arc<super::staging::StagingBudget>,
        bytes: u64,
    ) -> Result<super::staging::StagingReservation, CapacityReason> {
        if self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_in_flight).then_some(n + 1)
            })
            .is_err()
        {
            return Err(CapacityReason::InFlightCap);
        }
        staging.try_reserve(bytes).ok_or_else(|| {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            CapacityReason::Quota
        })
    }
}
