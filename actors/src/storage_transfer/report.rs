//! The round's two storage hand-offs between the StorageTransferManager and the Scheduler,
//! one direction each (DESIGN.md §3):
//! - StorageReport, manager → scheduler, after the agreed round is applied: the effects
//!   (rows to publish, references to release, waits that ended, ...) and the requests whose
//!   read met backend trouble;
//! - HandBack, scheduler → manager: a lease or a wait that a request's state gave up; the
//!   manager applies the plan's hand-backs when the plan ends (`end_plan`), after its new
//!   operations.
//!
//! These are plain data: they decide nothing (every admission decision is the manager's,
//! asked directly during the plan: `round.rs`), perform no I/O and read no clock.

use super::effects::RoundEffects;
use super::lease::StorageLease;
use messages::RequestId;

/// Why an attached read's request falls back because of its backend (not its data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendTrouble {
    /// Rejected as unhealthy, or failed with a backend exception.
    Unhealthy,
    /// Rejected after quarantine, or an unretired result.
    Quarantined,
}

/// Manager → scheduler, once per round, after the agreed round is applied.
#[derive(Debug)]
pub struct StorageReport {
    /// Boxed: the report moves through the round by pointer, and the scheduler hands the
    /// emptied box back (`StorageTransferManager::recycle`).
    pub effects: Box<RoundEffects>,
    /// Requests whose attached read (as of before this round) met backend trouble.
    pub trouble: Vec<(RequestId, BackendTrouble)>,
}

/// Scheduler → manager: what a request's ended state gives back. Applied when the plan
/// ends, so every new operation of the plan is decided on the credits of its start.
#[derive(Debug, PartialEq, Eq)]
pub enum HandBack {
    /// A state that owned a lease ended: the lease comes back.
    Detach(StorageLease),
    /// A request aborted: its wait (if any) is detached.
    Cancel(RequestId),
}
