//! An immutable L3 job: fixed keys and fixed Host byte ranges, built and bounds-checked at
//! submission. Its only mutable part is the queued -> started | cancelled transition, which
//! makes a cancelled queue item inert without waiting for a busy worker. A job never holds
//! a Host reference of its own: reference ownership stays with the StorageTransferManager.

use super::health::Admission;
use crate::host::storage::HostCacheStorage;
use messages::{HostRange, OperationId, StorageKey, StorageOp, StorageOpKind};
use std::sync::atomic::{AtomicU8, Ordering};
use tracing::Span;

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const CANCELLED: u8 = 2;

#[derive(Debug)]
pub(crate) struct Job {
    pub op: OperationId,
    pub kind: StorageOpKind,
    pub keys: Vec<StorageKey>,
    /// GET destinations or PUT sources, one per key; empty for QUERY.
    pub ranges: Vec<HostRange>,
    pub payload_bytes: u64,
    pub admission: Admission,
    pub queued_us: u64,
    pub span: Span,
    state: AtomicU8,
}

/// The checked parts of a command, before admission.
#[derive(Debug)]
pub(crate) struct JobSpec {
    pub op: OperationId,
    pub kind: StorageOpKind,
    pub keys: Vec<StorageKey>,
    pub ranges: Vec<HostRange>,
    pub payload_bytes: u64,
}

impl JobSpec {
    /// Structural validation plus Host bounds; GET destinations of one job must not overlap
    /// (each is written exclusively). Returns a reason on failure. Cancel is not a job.
    pub fn check(op: StorageOp, host: &HostCacheStorage) -> Result<Self, (StorageOpKind, String)> {
        let kind = op.kind().unwrap_or(StorageOpKind::Query);
        op.validate().map_err(|e| (kind, e.message))?;
        let payload_bytes = op.payload_bytes();
        let (id, keys, ranges) = match op {
            StorageOp::Query(q) => (q.op, q.keys, vec![]),
            StorageOp::Get(g) => (g.op, g.keys, g.destinations),
            StorageOp::Put(p) => (p.op, p.keys, p.sources),
            StorageOp::Cancel(_) => return Err((kind, "cancel is not a job".into())),
        };
        for (i, r) in ranges.iter().enumerate() {
            host.check(*r)
                .map_err(|e| (kind, format!("range {i}: {e}")))?;
        }
        if kind == StorageOpKind::Get {
            let mut sorted = ranges.clone();
            sorted.sort_by_key(|r| r.offset);
            if sorted.windows(2).any(|w| w[0].overlaps(&w[1])) {
                return Err((kind, "overlapping GET destinations".into()));
            }
        }
        Ok(Self {
            op: id,
            kind,
            keys,
            ranges,
            payload_bytes,
        })
    }
}

impl Job {
    pub fn new(spec: JobSpec, admission: Admission, queued_us: u64, span: Span) -> Self {
        Self {
            op: spec.op,
            kind: spec.kind,
            keys: spec.keys,
            ranges: spec.ranges,
            payload_bytes: spec.payload_bytes,
            admission,
            queued_us,
            span,
            state: AtomicU8::new(QUEUED),
        }
    }

    /// A worker claims the job; false when it was cancelled (the item is inert).
    pub fn try_start(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Cancels a still-queued job; false when a worker already started it.
    pub fn try_cancel(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn expected_lengths(&self) -> Vec<u64> {
        self.ranges.iter().map(|r| r.len).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::{StorageGetOp, StoragePutOp};

    fn key(s: &str) -> StorageKey {
        StorageKey::new(s)
    }

    #[test]
    fn check_rejects_out_of_bounds_and_overlapping_destinations() {
        let host = HostCacheStorage::new(8192).unwrap();
        let get = |ranges: Vec<HostRange>| {
            StorageOp::Get(StorageGetOp {
                op: OperationId(1),
                request: None,
                keys: (0..ranges.len()).map(|i| key(&i.to_string())).collect(),
                destinations: ranges,
            })
        };
        assert!(JobSpec::check(get(vec![HostRange::new(8190, 4)]), &host).is_err());
        let e = JobSpec::check(
            get(vec![HostRange::new(0, 10), HostRange::new(5, 10)]),
            &host,
        )
        .unwrap_err();
        assert!(e.1.contains("overlapping"));
        let ok = JobSpec::check(
            get(vec![HostRange::new(10, 5), HostRange::new(0, 10)]),
            &host,
        )
        .unwrap();
        assert_eq!(ok.payload_bytes, 15);
        // PUT sources may overlap: they are only read.
        let put = StorageOp::Put(StoragePutOp {
            op: OperationId(2),
            keys: vec![key("a"), key("b")],
            sources: vec![HostRange::new(0, 10), HostRange::new(5, 10)],
        });
        assert!(JobSpec::check(put, &host).is_ok());
    }

    #[test]
    fn start_and_cancel_are_exclusive() {
        let spec = JobSpec {
            op: OperationId(1),
            kind: StorageOpKind::Query,
            keys: vec![],
            ranges: vec![],
            payload_bytes: 0,
        };
        let adm = Admission {
            epoch: 0,
            probe: false,
        };
        let j = Job::new(spec, adm, 0, Span::none());
        assert!(j.try_cancel());
        assert!(!j.try_start(), "a cancelled item is inert");
        assert!(!j.try_cancel());
    }
}
