//! The executor's pressure snapshot: jobs and payload bytes per kind and the age of the
//! oldest job, computed from the executor's tracked (admitted, unretired) jobs. Pure: it
//! scans at most the operation limit and never calls storage or a device API.

use messages::{PressureSnapshot, StorageOpKind};

/// One tracked job as the snapshot sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PressureEntry {
    pub kind: StorageOpKind,
    pub payload_bytes: u64,
    pub since_us: u64,
}

/// Scans at most `limit` entries. QUERY payload is always 0.
pub(crate) fn snapshot(
    entries: impl Iterator<Item = PressureEntry>,
    now_us: u64,
    limit: usize,
) -> PressureSnapshot {
    let mut s = PressureSnapshot::default();
    for e in entries.take(limit) {
        let k = &mut s.queued[e.kind.index()];
        k.jobs += 1;
        if e.kind != StorageOpKind::Query {
            k.payload_bytes += e.payload_bytes;
        }
        s.oldest_age_us = s.oldest_age_us.max(now_us.saturating_sub(e.since_us));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_bytes_age_and_scan_limit() {
        let e = |kind, payload_bytes, since_us| PressureEntry {
            kind,
            payload_bytes,
            since_us,
        };
        let entries = [
            e(StorageOpKind::Query, 99, 50),
            e(StorageOpKind::Get, 10, 20),
            e(StorageOpKind::Get, 5, 70),
            e(StorageOpKind::Put, 7, 10),
        ];
        let s = snapshot(entries.iter().copied(), 100, 10);
        assert_eq!(s.queued[0].jobs, 1);
        assert_eq!(s.queued[0].payload_bytes, 0);
        assert_eq!(s.queued[1].jobs, 2);
        assert_eq!(s.queued[1].payload_bytes, 15);
        assert_eq!(s.queued[2].payload_bytes, 7);
        assert_eq!(s.oldest_age_us, 90);
        let s = snapshot(entries.iter().copied(), 100, 2);
        assert_eq!(s.observation().queued_jobs, 2, "scans at most the limit");
    }
}
