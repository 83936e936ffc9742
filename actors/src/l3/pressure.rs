//! The executor's pressure: jobs and payload bytes per kind and the age of the oldest job,
//! over the executor's tracked (admitted, unretired) jobs. The `JobTable` keeps them as
//! jobs are admitted and settled, so a poll reads the snapshot in O(1) instead of scanning
//! the outstanding jobs. It never calls storage or a device API, and it is the only place
//! that adds a job to, or removes one from, the tracked set.

use super::job::Job;
use messages::{KindPressure, OperationId, PressureSnapshot, StorageOpKind};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Queued,
    Running,
    /// Finished with an unretired result: quarantined, still native work.
    Unretired,
}

#[derive(Debug)]
pub(crate) struct Tracked {
    pub job: Arc<Job>,
    pub phase: Phase,
    pub since_us: u64,
}

/// The tracked jobs by operation ID, with their pressure kept up to date.
#[derive(Debug, Default)]
pub(crate) struct JobTable {
    jobs: HashMap<OperationId, Tracked>,
    /// Per kind (`StorageOpKind::index()`): tracked jobs and payload bytes.
    queued: [KindPressure; 3],
    /// (admitted at, op) of every tracked job: the first is the oldest.
    since: BTreeSet<(u64, OperationId)>,
}

/// QUERY payload is always 0 in the snapshot.
fn counted_bytes(kind: StorageOpKind, payload_bytes: u64) -> u64 {
    if kind == StorageOpKind::Query {
        0
    } else {
        payload_bytes
    }
}

impl JobTable {
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    pub fn contains_key(&self, op: &OperationId) -> bool {
        self.jobs.contains_key(op)
    }
    pub fn get(&self, op: &OperationId) -> Option<&Tracked> {
        self.jobs.get(op)
    }
    pub fn values(&self) -> impl Iterator<Item = &Tracked> {
        self.jobs.values()
    }

    /// Moves a tracked job to `phase` (its kind, bytes and admission time never change).
    pub fn set_phase(&mut self, op: &OperationId, phase: Phase) {
        if let Some(t) = self.jobs.get_mut(op) {
            t.phase = phase;
        }
    }

    /// Tracks a job admitted at `since_us`; a job already tracked under `op` is replaced.
    pub fn insert(&mut self, op: OperationId, job: Arc<Job>, since_us: u64) {
        let (kind, bytes) = (job.kind, counted_bytes(job.kind, job.payload_bytes));
        let t = Tracked {
            job,
            phase: Phase::Queued,
            since_us,
        };
        self.remove(&op);
        let k = &mut self.queued[kind.index()];
        k.jobs += 1;
        k.payload_bytes += bytes;
        self.since.insert((since_us, op));
        self.jobs.insert(op, t);
    }

    /// Stops tracking a job (settled or never queued).
    pub fn remove(&mut self, op: &OperationId) -> Option<Tracked> {
        let t = self.jobs.remove(op)?;
        let k = &mut self.queued[t.job.kind.index()];
        k.jobs = k.jobs.saturating_sub(1);
        k.payload_bytes = k
            .payload_bytes
            .saturating_sub(counted_bytes(t.job.kind, t.job.payload_bytes));
        self.since.remove(&(t.since_us, *op));
        Some(t)
    }

    /// The pressure of the tracked jobs at `now_us`.
    pub fn snapshot(&self, now_us: u64) -> PressureSnapshot {
        PressureSnapshot {
            queued: self.queued,
            oldest_age_us: self
                .since
                .first()
                .map_or(0, |(since, _)| now_us.saturating_sub(*since)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l3::health::Admission;
    use crate::l3::job::JobSpec;
    use tracing::Span;

    fn job(op: u64, kind: StorageOpKind, payload_bytes: u64) -> Arc<Job> {
        let spec = JobSpec {
            op: OperationId(op),
            kind,
            keys: vec![],
            ranges: vec![],
            payload_bytes,
        };
        let adm = Admission {
            epoch: 0,
            probe: false,
        };
        Arc::new(Job::new(spec, adm, 0, Span::none()))
    }

    /// The snapshot a scan of every tracked job gives (what the table must agree with).
    fn scanned(t: &JobTable, now_us: u64) -> PressureSnapshot {
        let mut s = PressureSnapshot::default();
        for e in t.values() {
            let k = &mut s.queued[e.job.kind.index()];
            k.jobs += 1;
            k.payload_bytes += counted_bytes(e.job.kind, e.job.payload_bytes);
            s.oldest_age_us = s.oldest_age_us.max(now_us.saturating_sub(e.since_us));
        }
        s
    }

    #[test]
    fn counts_bytes_and_the_oldest_age_follow_admissions_and_settlements() {
        let mut t = JobTable::default();
        assert_eq!(t.snapshot(100), PressureSnapshot::default());
        t.insert(OperationId(1), job(1, StorageOpKind::Query, 99), 50);
        t.insert(OperationId(2), job(2, StorageOpKind::Get, 10), 20);
        t.insert(OperationId(3), job(3, StorageOpKind::Get, 5), 70);
        t.insert(OperationId(4), job(4, StorageOpKind::Put, 7), 10);
        let s = t.snapshot(100);
        assert_eq!(
            s.queued[0],
            KindPressure {
                jobs: 1,
                payload_bytes: 0
            },
            "QUERY payload is 0"
        );
        assert_eq!(
            s.queued[1],
            KindPressure {
                jobs: 2,
                payload_bytes: 15
            }
        );
        assert_eq!(
            s.queued[2],
            KindPressure {
                jobs: 1,
                payload_bytes: 7
            }
        );
        assert_eq!(s.oldest_age_us, 90);
        assert_eq!(s, scanned(&t, 100));
        // The oldest settles: the next oldest sets the age.
        assert!(t.remove(&OperationId(4)).is_some());
        let s = t.snapshot(100);
        assert_eq!((s.queued[2].jobs, s.oldest_age_us), (0, 80));
        // A phase change keeps a job's pressure; an unknown op changes nothing.
        t.set_phase(&OperationId(2), Phase::Unretired);
        assert!(t.remove(&OperationId(9)).is_none());
        assert_eq!(t.snapshot(100), scanned(&t, 100));
        // Replacing a tracked op counts it once.
        t.insert(OperationId(2), job(2, StorageOpKind::Put, 3), 90);
        assert_eq!(t.len(), 3);
        assert_eq!(t.snapshot(100), scanned(&t, 100));
        for op in [1, 2, 3] {
            t.remove(&OperationId(op));
        }
        assert_eq!(t.snapshot(100), PressureSnapshot::default());
    }

    #[test]
    fn jobs_admitted_in_the_same_microsecond_are_kept_apart() {
        let mut t = JobTable::default();
        t.insert(OperationId(1), job(1, StorageOpKind::Get, 1), 5);
        t.insert(OperationId(2), job(2, StorageOpKind::Get, 1), 5);
        t.remove(&OperationId(1));
        assert_eq!(t.snapshot(8).oldest_age_us, 3, "the other job still counts");
        assert_eq!(t.snapshot(8).queued[1].jobs, 1);
    }
}
