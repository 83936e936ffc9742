//! Scheduler-side counters and gauges of the StorageTransferManager (names in
//! `crate::names::metric`). Mirrored values: every owner computes the same numbers, so they
//! must not be summed across TP owners. Snapshots carry no request IDs or object keys and
//! never feed back into decisions.

use super::backup::DropReason;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StmStats {
    pub operation_credits_in_use: u32,
    pub host_credits_in_use: u32,
    pub backup_operation_credits_in_use: u32,
    pub backup_host_credits_in_use: u32,
    /// Tickets not yet settled (Issued, Completed with a Ready hold, Quarantined).
    pub outstanding_tickets: u64,
    /// Requests waiting on QUERY/GET (not counting Ready holds).
    pub waiting_requests: u64,
    pub ready_holds: u64,
    pub quarantined_refs: u64,
    pub soft_timeouts: u64,
    pub ready_expirations: u64,
    pub pressure_bypasses: u64,
    /// Indexed by `DropReason::index()`.
    pub dropped_backup_keys: [u64; 5],
    pub coalesced_backup_keys: u64,
    pub queued_backup_candidates: u64,
    pub negative_entries: u64,
    pub gate_closed: bool,
    /// Agreed time the read admission gate spent closed (the current closure included).
    pub gate_closed_us: u64,
    pub l3_enabled: bool,
    pub last_operation_id: u64,
}

impl StmStats {
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped_backup_keys[reason.index()]
    }
}
