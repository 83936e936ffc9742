//! Executor counters for observability: plain atomics, read as an `ExecutorStats`
//! snapshot. They never take part in admission, retirement or agreement, and carry no
//! request IDs or object keys. The metrics exporter turns them into Prometheus series.

use messages::StorageOpKind;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cumulative counters of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Commands received (admitted or rejected; Cancel is not counted).
    pub submitted: u64,
    /// Jobs that ran and settled (including failures).
    pub completed: u64,
    /// Of `completed`, jobs that settled with a native failure or an exception (the
    /// `failed` outcome; the rest are the `completed` outcome).
    pub failed: u64,
    /// Commands rejected before running (health, queue, limit, shutdown, quarantine,
    /// invalid). Queued cancellations are counted in `cancelled` only.
    pub rejected: u64,
    /// Queued jobs cancelled before a worker started them.
    pub cancelled: u64,
    pub queue_time_us_total: u64,
    pub backend_time_us_total: u64,
    /// Bytes of successful rows (idempotent PUT hits included).
    pub payload_bytes: u64,
    /// Adapter invocations (a GET with promotion makes two).
    pub backend_calls: u64,
    /// PUT rows that were new writes.
    pub new_writes: u64,
    /// Keys of jobs quarantined by an unretired result.
    pub quarantined_refs: u64,
}

/// Current job counts (gauges), read under the executor's lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobGauges {
    pub queued: u64,
    pub running: u64,
    /// Finished but unretired (quarantined) jobs: native work that never proved retirement.
    pub unretired: u64,
    /// Completions not yet delivered by `poll`.
    pub undelivered: u64,
}

/// A snapshot of the executor's counters, indexed by `StorageOpKind::index()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    pub kinds: [KindStats; 3],
    pub jobs: [JobGauges; 3],
}

impl ExecutorStats {
    pub fn kind(&self, k: StorageOpKind) -> &KindStats {
        &self.kinds[k.index()]
    }
}

#[derive(Debug, Default)]
pub(crate) struct KindCounters {
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    pub queue_time_us_total: AtomicU64,
    pub backend_time_us_total: AtomicU64,
    pub payload_bytes: AtomicU64,
    pub backend_calls: AtomicU64,
    pub new_writes: AtomicU64,
    pub quarantined_refs: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

impl KindCounters {
    fn read(&self) -> KindStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KindStats {
            submitted: r(&self.submitted),
            completed: r(&self.completed),
            failed: r(&self.failed),
            rejected: r(&self.rejected),
            cancelled: r(&self.cancelled),
            queue_time_us_total: r(&self.queue_time_us_total),
            backend_time_us_total: r(&self.backend_time_us_total),
            payload_bytes: r(&self.payload_bytes),
            backend_calls: r(&self.backend_calls),
            new_writes: r(&self.new_writes),
            quarantined_refs: r(&self.quarantined_refs),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    kinds: [KindCounters; 3],
}

impl Counters {
    pub fn kind(&self, k: StorageOpKind) -> &KindCounters {
        &self.kinds[k.index()]
    }
    pub fn read(&self, jobs: [JobGauges; 3]) -> ExecutorStats {
        ExecutorStats {
            kinds: [
                self.kinds[0].read(),
                self.kinds[1].read(),
                self.kinds[2].read(),
            ],
            jobs,
        }
    }
}
