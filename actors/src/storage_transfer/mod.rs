//! The StorageTransferManager's pure, deterministic core (seed 000: Request state, Read and
//! Write transactions, Controller queues/monitor/bounds, Retirement and maintenance). It
//! owns operation IDs, tickets, credits, the Host references of storage operations, Ready
//! holds, StorageLeases, soft deadlines, the pressure gate, the backup candidate queue,
//! negative metadata and quarantine. It is fed only agreed inputs (tick, MAX-reduced
//! pressure, cancellations, agreed StorageDone records) and the planning calls the Scheduler
//! makes during a plan, so every rank makes the same decisions; it is the one decider of
//! storage admission (`round.rs`), with the rules of `admission.rs`.
//!
//! It must never read a clock, perform I/O, call the store or the GPU, or free a Host
//! reference before the agreed completion proves retirement. Host blocks are modelled as
//! opaque `HostRef` handles supplied by the caller (the CacheCoordinator); the manager only
//! reports which references to publish, release or keep quarantined.

pub mod admission;
pub mod backup;
pub mod bench;
pub mod clear;
pub mod credits;
pub mod deadline;
pub mod effects;
pub mod gate;
pub mod lease;
pub mod manager;
pub mod negative;
pub mod report;
pub mod round;
pub mod stats;
pub mod ticket;
pub mod trace;

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use backup::{BackupCandidate, BackupKey, BackupQueue, BlockPage, DropReason, OfferOutcome};
pub use clear::{ClearKind, ClearRefused};
pub use credits::{CreditClass, Credits};
pub use effects::{PublishRow, QueryResult, RoundEffects, RECYCLED_CAPACITY};
pub use gate::{GateTransition, PressureGate};
pub use lease::{StorageLease, WaitEnd, WaitPhase};
pub use manager::{Refusal, RoundInput, StorageTransferManager};
pub use negative::NegativeMetadata;
pub use report::{BackendTrouble, HandBack, StorageReport};
pub use round::BackupOffers;
pub use stats::StmStats;
pub use ticket::{Ticket, TicketState};

use std::fmt;

/// An opaque handle of one Host block reference, supplied by the cache owner. The manager
/// never dereferences it; it only says when the reference may be published or released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostRef(pub u64);

impl fmt::Display for HostRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host{}", self.0)
    }
}

/// A GET's Host destinations, row by row: the reference the ticket holds and the range the
/// operation writes (two lists, so neither is copied out of the other at issue).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Destinations {
    pub refs: Vec<HostRef>,
    pub ranges: Vec<messages::HostRange>,
}

impl Destinations {
    /// Empty lists with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            refs: Vec::with_capacity(rows),
            ranges: Vec::with_capacity(rows),
        }
    }

    pub fn push(&mut self, host: HostRef, range: messages::HostRange) {
        self.refs.push(host);
        self.ranges.push(range);
    }

    /// Rows (a malformed value whose lists differ in length counts its longer list).
    pub fn len(&self) -> usize {
        self.refs.len().max(self.ranges.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<(HostRef, messages::HostRange)>> for Destinations {
    fn from(rows: Vec<(HostRef, messages::HostRange)>) -> Self {
        let (refs, ranges) = rows.into_iter().unzip();
        Self { refs, ranges }
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::HostRef;
    use messages::settings::{PressureWatermark, StorageConfig};
    use messages::{HostRange, StorageKey};

    /// One millisecond of the agreed tick.
    pub const MS: u64 = 1000;

    pub fn key(s: &str) -> StorageKey {
        StorageKey::new(s)
    }
    pub fn keys(prefix: &str, n: usize) -> Vec<StorageKey> {
        (0..n).map(|i| key(&format!("{prefix}{i}"))).collect()
    }
    /// `n` distinct Host references from `first`, with 16-byte ranges.
    pub fn dests(first: u64, n: usize) -> Vec<(HostRef, HostRange)> {
        (0..n)
            .map(|i| (HostRef(first + i as u64), HostRange::new(i as u64 * 16, 16)))
            .collect()
    }

    /// A small, valid scheduling contract for tests.
    pub fn config() -> StorageConfig {
        let c = StorageConfig {
            operation_credits: 8,
            max_host_blocks: 64,
            max_keys_per_operation: 16,
            lookahead_tokens: 4096,
            negative_metadata_capacity: 16,
            backup_candidate_capacity: 16,
            backup_bytes_in_flight: 1 << 40,
            soft_deadline_ms: 100,
            ready_hold_ms: 50,
            min_extension_tokens: 1,
            pressure_high: PressureWatermark {
                queued_jobs: 10,
                queued_bytes: 1000,
                oldest_age_ms: 100,
            },
            pressure_low: PressureWatermark {
                queued_jobs: 5,
                queued_bytes: 500,
                oldest_age_ms: 50,
            },
        };
        assert!(c.validate("test").is_ok());
        c
    }
}
