//! Soft deadlines and Ready-hold expiry, processed only at agreed ticks. A deadline is an
//! ordered set of (due tick, request); `pop_due(now)` yields every entry due at or before
//! the tick in a deterministic order. This module never reads a clock and never ends
//! native I/O: an expiry is only a scheduling decision.

use messages::settings::StorageConfig;
use messages::RequestId;
use std::collections::BTreeSet;

/// The soft deadline of a read whose QUERY is issued at `issued_us` (queue wait included).
pub fn soft_deadline_us(cfg: &StorageConfig, issued_us: u64) -> u64 {
    issued_us.saturating_add(cfg.soft_deadline_ms.saturating_mul(1000))
}

/// When a Ready hold published at `published_us` expires.
pub fn ready_expiry_us(cfg: &StorageConfig, published_us: u64) -> u64 {
    published_us.saturating_add(cfg.ready_hold_ms.saturating_mul(1000))
}

/// Due times keyed by request, ordered by (due, request).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadlineQueue {
    due: BTreeSet<(u64, RequestId)>,
}

impl DeadlineQueue {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, due_us: u64, request: RequestId) {
        self.due.insert((due_us, request));
    }
    pub fn remove(&mut self, due_us: u64, request: RequestId) -> bool {
        self.due.remove(&(due_us, request))
    }
    /// Every request due at or before `now_us`, earliest first, removed from the queue.
    pub fn pop_due(&mut self, now_us: u64) -> Vec<RequestId> {
        let mut out = Vec::new();
        while let Some(&(due, req)) = self.due.first() {
            if due > now_us {
                break;
            }
            self.due.pop_first();
            out.push(req);
        }
        out
    }
    pub fn len(&self) -> usize {
        self.due.len()
    }
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
    pub fn clear(&mut self) {
        self.due.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage_transfer::tests_support::config;

    #[test]
    fn pops_only_due_entries_in_order() {
        let mut q = DeadlineQueue::new();
        q.insert(30, RequestId(1));
        q.insert(10, RequestId(2));
        q.insert(10, RequestId(0));
        q.insert(31, RequestId(3));
        assert!(q.pop_due(9).is_empty());
        assert_eq!(
            q.pop_due(30),
            vec![RequestId(0), RequestId(2), RequestId(1)]
        );
        assert!(q.remove(31, RequestId(3)));
        assert!(q.is_empty());
    }

    #[test]
    fn deadlines_are_in_microseconds_from_issue() {
        let c = config();
        assert_eq!(soft_deadline_us(&c, 5), 5 + c.soft_deadline_ms * 1000);
        assert_eq!(ready_expiry_us(&c, 7), 7 + c.ready_hold_ms * 1000);
        assert_eq!(soft_deadline_us(&c, u64::MAX), u64::MAX);
    }
}
