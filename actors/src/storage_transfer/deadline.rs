//! Soft deadlines and Ready-hold expiry, processed only at agreed ticks. A queue holds
//! (due tick, request) entries in due order; `pop_due(now)` yields every entry due at or
//! before the tick in a deterministic order (due, then request). This module never reads a
//! clock and never ends native I/O: an expiry is only a scheduling decision.
//!
//! A deadline that ends early (its wait completed, detached or expired) is not searched for
//! and removed: its entry stays until it comes due, and the owner checks each popped entry
//! against its own record (the request still waits, with that very due tick). Due ticks are
//! the agreed tick plus a fixed delay, so entries arrive in due order and an insertion is a
//! push at the back; `retain` drops ended entries when they outnumber the live ones.

use messages::settings::StorageConfig;
use messages::RequestId;
use std::collections::VecDeque;

/// The soft deadline of a read whose QUERY is issued at `issued_us` (queue wait included).
pub fn soft_deadline_us(cfg: &StorageConfig, issued_us: u64) -> u64 {
    issued_us.saturating_add(cfg.soft_deadline_ms.saturating_mul(1000))
}

/// When a Ready hold published at `published_us` expires.
pub fn ready_expiry_us(cfg: &StorageConfig, published_us: u64) -> u64 {
    published_us.saturating_add(cfg.ready_hold_ms.saturating_mul(1000))
}

/// The entries a queue keeps before `retain` is worth a pass: ended entries are dropped
/// when the queue holds more than twice the live deadlines and this many besides.
pub const RETAIN_SLACK: usize = 1024;

/// Due times of requests, in due order (entries of ended deadlines included until they
/// come due or are retained away).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadlineQueue {
    due: VecDeque<(u64, RequestId)>,
}

impl DeadlineQueue {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds `request` due at `due_us`: a push at the back unless an entry is due later
    /// (then it goes in order, after the entries due at the same tick).
    pub fn insert(&mut self, due_us: u64, request: RequestId) {
        match self.due.back() {
            Some(&(last, _)) if last > due_us => {
                let at = self.due.partition_point(|&(d, _)| d <= due_us);
                self.due.insert(at, (due_us, request));
            }
            _ => self.due.push_back((due_us, request)),
        }
    }
    /// Every entry due at or before `now_us`, earliest first (ties by request), removed
    /// from the queue. Entries of deadlines that ended early come back too: the owner
    /// checks each against its record.
    pub fn pop_due(&mut self, now_us: u64) -> Vec<(u64, RequestId)> {
        let mut out = Vec::new();
        self.pop_due_into(now_us, &mut out);
        out
    }

    /// `pop_due` into `out` (emptied first; a caller that keeps one list reuses it).
    pub fn pop_due_into(&mut self, now_us: u64, out: &mut Vec<(u64, RequestId)>) {
        out.clear();
        let n = self.due.partition_point(|&(d, _)| d <= now_us);
        if n == 0 {
            return;
        }
        out.extend(self.due.drain(..n));
        out.sort_unstable();
    }
    /// Keeps only the entries `live` accepts, when the queue holds more than twice `live_count`
    /// entries and `RETAIN_SLACK` besides (so a pass costs at most two entries per ended one).
    pub fn retain_if_stale(
        &mut self,
        live_count: usize,
        mut live: impl FnMut(u64, RequestId) -> bool,
    ) {
        if self.due.len() > live_count.saturating_mul(2).saturating_add(RETAIN_SLACK) {
            self.due.retain(|&(d, r)| live(d, r));
        }
    }
    /// Entries held, ended deadlines included.
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
            vec![(10, RequestId(0)), (10, RequestId(2)), (30, RequestId(1))]
        );
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_due(u64::MAX), vec![(31, RequestId(3))]);
        assert!(q.is_empty());
    }

    #[test]
    fn ended_entries_are_retained_away_only_when_they_outnumber_the_live_ones() {
        let mut q = DeadlineQueue::new();
        let n = RETAIN_SLACK as u64 + 10;
        for i in 0..n {
            q.insert(100 + i, RequestId(i));
        }
        // 1034 entries is not above 2 * 10 + 1024, nor above 2 * 5 + 1024 (exactly at it).
        let live = |_: u64, r: RequestId| r.0.is_multiple_of(100);
        q.retain_if_stale(10, live);
        assert_eq!(q.len() as u64, n);
        q.retain_if_stale(5, live);
        assert_eq!(
            q.len() as u64,
            n,
            "a queue exactly at the threshold is left whole"
        );
        q.retain_if_stale(4, live);
        assert_eq!(q.len(), 11, "only the live entries stay");
        assert_eq!(q.pop_due(100), vec![(100, RequestId(0))]);
    }

    #[test]
    fn deadlines_are_in_microseconds_from_issue() {
        let c = config();
        assert_eq!(soft_deadline_us(&c, 5), 5 + c.soft_deadline_ms * 1000);
        assert_eq!(ready_expiry_us(&c, 7), 7 + c.ready_hold_ms * 1000);
        assert_eq!(soft_deadline_us(&c, u64::MAX), u64::MAX);
    }

    /// The queue against a list of its entries: an insertion in any order, `pop_due`
    /// returns exactly the entries due by the tick, sorted by (due, request), and leaves the
    /// rest; `retain_if_stale` filters only past its threshold.
    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Step {
            Insert(u64, u64),
            Pop(u64),
            Retain(usize, u64),
            Clear,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                6 => (0u64..40, 0u64..6).prop_map(|(d, r)| Step::Insert(d, r)),
                2 => (0u64..45).prop_map(Step::Pop),
                1 => (0usize..4, 1u64..4).prop_map(|(n, m)| Step::Retain(n, m)),
                1 => Just(Step::Clear),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn the_deadline_queue_keeps_every_promise_of_its_model(
                steps in proptest::collection::vec(step(), 1..60),
            ) {
                let mut q = DeadlineQueue::new();
                let mut model: Vec<(u64, RequestId)> = vec![];
                let mut out = vec![(u64::MAX, RequestId(u64::MAX))];
                for st in steps {
                    match st {
                        Step::Insert(d, r) => {
                            q.insert(d, RequestId(r));
                            model.push((d, RequestId(r)));
                        }
                        Step::Pop(now) => {
                            let mut want: Vec<_> =
                                model.iter().copied().filter(|(d, _)| *d <= now).collect();
                            want.sort();
                            model.retain(|(d, _)| *d > now);
                            q.pop_due_into(now, &mut out);
                            prop_assert_eq!(&out, &want, "emptied first, then the due entries");
                        }
                        Step::Retain(live_count, m) => {
                            // Past the threshold only when the queue is large: fill it.
                            let live = |_: u64, r: RequestId| r.0.is_multiple_of(m);
                            let big = model.len() > live_count * 2 + RETAIN_SLACK;
                            q.retain_if_stale(live_count, live);
                            if big {
                                model.retain(|(d, r)| live(*d, *r));
                            }
                        }
                        Step::Clear => {
                            q.clear();
                            model.clear();
                        }
                    }
                    prop_assert_eq!(q.len(), model.len());
                    prop_assert_eq!(q.is_empty(), model.is_empty());
                    let mut all = model.clone();
                    all.sort();
                    prop_assert_eq!(q.pop_due(u64::MAX).len(), all.len());
                    for (d, r) in &model {
                        q.insert(*d, *r);
                    }
                }
            }
        }

        #[test]
        fn past_the_threshold_only_the_live_entries_stay_in_due_order() {
            let mut q = DeadlineQueue::new();
            let n = RETAIN_SLACK as u64 + 3;
            // Inserted out of order: each later due tick goes first.
            for i in (0..n).rev() {
                q.insert(i, RequestId(i));
            }
            q.retain_if_stale(1, |_, r| !r.0.is_multiple_of(2));
            let want: Vec<_> = (0..n)
                .filter(|i| !i.is_multiple_of(2))
                .map(|i| (i, RequestId(i)))
                .collect();
            assert_eq!(q.pop_due(u64::MAX), want);
        }
    }
}
